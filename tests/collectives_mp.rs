//! Multi-process collectives: N processes, one rank each, run
//! `tests/c/coll_check.c` (compiled against NVIDIA's real `nccl.h`, linked to
//! NVIDIA's `libnccl.so.2`) with `LD_PRELOAD=libhetccl.so`, and every result
//! must be exact.
//!
//! Layouts: N = 2, 3, 4 and 8 ranks
//! - over shared memory (the default on one host),
//! - over TCP on loopback (`NCCL_SHM_DISABLE=1`),
//! - as several "nodes" on one host (`HETCCL_HOST_ID` differs between
//!   ranks): 2×2, 2×4, uneven 2+1 and interleaved (node = rank % 2); the 2×2
//!   run must choose the hierarchical AllReduce;
//! - with nonblocking communicators (`config.blocking = 0`);
//! - with every algorithm forced in turn through `NCCL_ALGO`.
//!
//! Each feature (mode) is a separate launch, so a failure names it; every
//! launch has a hard deadline, and on failure the test prints every rank's
//! stdout and stderr. With `--nocapture` each launch prints one line.
//! Children get `HETCCL_SOCKET_IFNAME=lo` and `HETCCL_TIMEOUT_S=60`, and no
//! inherited `NCCL_*`/`HETCCL_*` variables. See docs/testing.md.

use std::path::Path;

use hetccl_testkit::coll::{allreduce_algos, Job};
use hetccl_testkit::modes::{ALGOS, MODES, NONBLOCKING_MODES};
use hetccl_testkit::{cc, coll, hetccl_so, ranks};

fn exe() -> &'static Path {
    coll::program("coll_check_mp")
}

/// `(1 << 20) + 3` elements: large, odd, not a multiple of any chunk size.
const BIG: &str = "1048579";
const SMALL_COUNTS: &str = "0,1,1021";

/// The datatypes that also run the big count, per mode (the others run only
/// the small counts, and coll_check runs big counts only with ncclSum and
/// root N-1, which keeps the suite fast on two cores).
fn big_dtypes(mode: &str) -> &'static str {
    match mode {
        "allreduce" => "int8,float32,bfloat16",
        _ => "float32",
    }
}

/// One job per mode for an N-rank layout.
fn jobs(
    label: &str,
    n: usize,
    big: bool,
    env: &[(&str, &str)],
    rank_env: fn(usize, usize) -> Vec<(String, String)>,
    modes: &[&str],
    extra: &[&str],
) -> Vec<Job> {
    modes
        .iter()
        .map(|m| {
            let counts = if big {
                format!("{SMALL_COUNTS},{BIG}")
            } else {
                SMALL_COUNTS.to_string()
            };
            let mut j = Job::new(format!("{label} {m}"), n, *m).args([
                "--counts".to_string(),
                counts,
                "--big-dtypes".to_string(),
                big_dtypes(m).to_string(),
            ]);
            j = j.args(extra.iter().copied());
            for (k, v) in env {
                j = j.env(k, v);
            }
            j.rank_env(rank_env)
        })
        .collect()
}

fn no_env(_: usize, _: usize) -> Vec<(String, String)> {
    Vec::new()
}

/// Runs every mode on one layout; `big` adds the big count (to keep the
/// file under a few minutes on two cores, only some layouts do).
fn suite(
    label: &str,
    n: usize,
    big: bool,
    env: &[(&str, &str)],
    rank_env: fn(usize, usize) -> Vec<(String, String)>,
) {
    let so = hetccl_so();
    coll::run_all(
        label,
        exe(),
        &so,
        jobs(label, n, big, env, rank_env, MODES, &[]),
    );
}

// ---------------------------------------------------------------- shm

#[test]
fn shm_2() {
    suite("shm_2", 2, false, &[], no_env);
}

#[test]
fn shm_3() {
    suite("shm_3", 3, true, &[], no_env);
}

#[test]
fn shm_4() {
    suite("shm_4", 4, false, &[], no_env);
}

#[test]
fn shm_8() {
    suite("shm_8", 8, false, &[], no_env);
}

// ---------------------------------------------------------------- tcp

const TCP: &[(&str, &str)] = &[("NCCL_SHM_DISABLE", "1")];

#[test]
fn tcp_2() {
    suite("tcp_2", 2, false, TCP, no_env);
}

#[test]
fn tcp_3() {
    suite("tcp_3", 3, false, TCP, no_env);
}

#[test]
fn tcp_4() {
    suite("tcp_4", 4, true, TCP, no_env);
}

#[test]
fn tcp_8() {
    suite("tcp_8", 8, false, TCP, no_env);
}

// ------------------------------------------------------- several nodes

fn host_id(id: String) -> Vec<(String, String)> {
    vec![("HETCCL_HOST_ID".to_string(), id)]
}

/// Two ranks per node: node0 = {0,1}, node1 = {2,3}, ...
fn nodes_of_2(rank: usize, _n: usize) -> Vec<(String, String)> {
    host_id(format!("node{}", rank / 2))
}

/// Four ranks per node.
fn nodes_of_4(rank: usize, _n: usize) -> Vec<(String, String)> {
    host_id(format!("node{}", rank / 4))
}

/// node = rank % 2: the ranks of a node are not contiguous.
fn nodes_interleaved(rank: usize, _n: usize) -> Vec<(String, String)> {
    host_id(format!("node{}", rank % 2))
}

/// 2×2 as rank/2, plus rank 0 logging the algorithm choice (INFO, TUNING).
fn nodes_of_2_rank0_tuning(rank: usize, n: usize) -> Vec<(String, String)> {
    let mut v = nodes_of_2(rank, n);
    if rank == 0 {
        v.push(("NCCL_DEBUG".into(), "INFO".into()));
        v.push(("NCCL_DEBUG_SUBSYS".into(), "TUNING".into()));
    }
    v
}

#[test]
fn hosts_2x2() {
    let so = hetccl_so();
    let mut js = jobs("hosts_2x2", 4, true, &[], nodes_of_2, MODES, &[]);
    let mut tuning = Job::new("hosts_2x2 hierarchical choice", 4, "allreduce").args([
        "--counts",
        "1021,1048579",
        "--dtypes",
        "float32",
        "--big-dtypes",
        "float32",
    ]);
    tuning = tuning.rank_env(nodes_of_2_rank0_tuning);
    js.push(tuning);
    let outs = coll::run_all("hosts_2x2", exe(), &so, js);
    let log = &outs.last().expect("the tuning job ran").outs[0].stdout;
    let lines = allreduce_algos(log);
    assert!(
        !lines.is_empty(),
        "rank 0 logged no `algo=` line for AllReduce at NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=TUNING:\n{}",
        ranks::tail(log, 4000)
    );
    assert!(
        lines.iter().any(|l| l.contains("algo=Hierarchical")),
        "2 nodes x 2 ranks: no AllReduce chose the hierarchical algorithm:\n{}",
        lines.join("\n")
    );
}

#[test]
fn hosts_2x4() {
    suite("hosts_2x4", 8, false, &[], nodes_of_4);
}

#[test]
fn hosts_uneven_2_1() {
    suite("hosts_uneven_2_1", 3, false, &[], nodes_of_2);
}

#[test]
fn hosts_interleaved_2x2() {
    suite("hosts_interleaved_2x2", 4, false, &[], nodes_interleaved);
}

// --------------------------------------------------------- nonblocking

#[test]
fn nonblocking_shm_3() {
    let so = hetccl_so();
    let js = jobs(
        "nonblocking_shm_3",
        3,
        false,
        &[],
        no_env,
        NONBLOCKING_MODES,
        &["--nonblocking"],
    );
    coll::run_all("nonblocking_shm_3", exe(), &so, js);
}

#[test]
fn nonblocking_tcp_2() {
    let so = hetccl_so();
    let js = jobs(
        "nonblocking_tcp_2",
        2,
        false,
        TCP,
        no_env,
        NONBLOCKING_MODES,
        &["--nonblocking"],
    );
    coll::run_all("nonblocking_tcp_2", exe(), &so, js);
}

// ------------------------------------------------ every algorithm forced

fn algo_jobs(
    label: &str,
    n: usize,
    rank_env: fn(usize, usize) -> Vec<(String, String)>,
) -> Vec<Job> {
    let mut v = Vec::new();
    for (mode, func, algos) in ALGOS {
        for a in *algos {
            let j = Job::new(format!("{label} {mode} NCCL_ALGO={func}:{a}"), n, *mode)
                .args([
                    "--counts",
                    "0,1,1021,1048579",
                    "--dtypes",
                    "int8,int32,float32,bfloat16,f8e4m3",
                    "--big-dtypes",
                    "float32",
                ])
                .env("NCCL_ALGO", &format!("{func}:{a}"));
            v.push(j.rank_env(rank_env));
        }
    }
    v
}

#[test]
fn algos_shm_3() {
    let so = hetccl_so();
    coll::run_all(
        "algos_shm_3",
        exe(),
        &so,
        algo_jobs("algos_shm_3", 3, no_env),
    );
}

#[test]
fn algos_hosts_2x2() {
    let so = hetccl_so();
    coll::run_all(
        "algos_hosts_2x2",
        exe(),
        &so,
        algo_jobs("algos_hosts_2x2", 4, nodes_of_2),
    );
}

// ------------------------------------------------------------ the checker

/// coll_check's own float encoders and expectations (no NCCL involved):
/// every expected value is exact in its datatype.
#[test]
fn coll_check_selftest() {
    let out = cc::run_ok(std::process::Command::new(exe()).arg("--selftest"));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("selftest.bad 0"), "{text}");
}
