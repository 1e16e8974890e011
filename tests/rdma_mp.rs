//! Multi-process collectives and a dead peer over verbs: the ranks of
//! `tests/c/coll_check.c` (under `LD_PRELOAD=libhetccl.so`) as two "nodes"
//! (`HETCCL_HOST_ID`) on one RDMA port, so every cross-node pair takes the
//! verbs transport. `scripts/rdma-vm.sh` runs these on Soft-RoCE inside a
//! VM with `HETCCL_REQUIRE_RDMA=1`; on a machine without an active RDMA
//! port they say so and pass (the VM run is where they count).
//!
//! - 2 ranks on 2 hosts and 4 ranks on 2 hosts (2 × 2), every collective
//!   and point-to-point mode, exact results (and on 2 ranks the
//!   communicator modes that make and end comms); rank 0 logs at INFO and
//!   must show `via NET/IB` for each of its cross-node peers and no TCP link;
//! - `NCCL_IB_DISABLE=1`: the same pair takes TCP;
//! - kill -9 of a rank in the middle of an AllReduce loop (4 ranks, 2 × 2):
//!   every survivor fails within `HETCCL_TIMEOUT_S` plus a margin, as on TCP.

use std::path::Path;

use hetccl_testkit::coll::{self, Job};
use hetccl_testkit::faults::{self, Fault};
use hetccl_testkit::hetccl_so;
use hetccl_testkit::modes::NONBLOCKING_MODES;
use hetccl_testkit::rdma::have_rdma;

fn host_env(per_node: usize) -> impl Fn(usize, usize) -> Vec<(String, String)> {
    move |rank, _| {
        let mut v = vec![
            (
                "HETCCL_HOST_ID".to_string(),
                format!("node{}", rank / per_node),
            ),
            ("HETCCL_NET".to_string(), "ib".to_string()),
        ];
        if rank == 0 {
            v.push(("NCCL_DEBUG".into(), "INFO".into()));
            v.push(("NCCL_DEBUG_SUBSYS".into(), "INIT".into()));
        }
        v
    }
}

/// One launch runs every collective and point-to-point mode
/// ([`NONBLOCKING_MODES`]) on one dtype of each size, at counts that take both
/// the eager path (up to 8 KiB) and the rendezvous path; a second one runs
/// an AllReduce of 262,147 float32 elements (1 MiB and 3 more; two
/// chunks per rank on 2 ranks) of every op. The transport moves bytes, so the
/// other dtypes (their arithmetic is the same on every transport) are left
/// to the TCP and shm suites; one launch per mode would not fit the time
/// an emulated VM has. `comm_modes`: communicator modes, one launch each.
fn suite(label: &str, n: usize, per_node: usize, comm_modes: &[&str]) {
    // Compiled before the check: the host's run fills the C program cache
    // that the VM's run reads (gcc under emulation is slow).
    let exe: &Path = coll::program("coll_check_rdma");
    if !have_rdma() {
        return;
    }
    let so = hetccl_so();
    let dtypes = ["--dtypes", "int8,bfloat16,float32,float64"];
    let mut jobs = vec![
        Job::new(
            format!("{label} collectives"),
            n,
            NONBLOCKING_MODES.join(","),
        )
        .args(dtypes)
        .args(["--counts", "0,1,1021,5003"])
        .rank_env(host_env(per_node)),
        Job::new(format!("{label} allreduce 1 MiB"), n, "allreduce")
            .args(["--dtypes", "float32", "--big-dtypes", "float32"])
            .args(["--counts", "262147"])
            // Collective fingerprints on the verbs links (message-based).
            .env("HETCCL_CHECK", "1")
            .rank_env(host_env(per_node)),
    ];
    for m in comm_modes {
        jobs.push(
            Job::new(format!("{label} {m}"), n, *m)
                .args(dtypes)
                .args(["--counts", "1,1021"])
                .rank_env(host_env(per_node)),
        );
    }
    let outs = coll::run_all(label, exe, &so, jobs);
    // Rank 0's first communicator: one verbs line per cross-node peer.
    let log = &outs[0].outs[0].stdout;
    let remote: Vec<usize> = (per_node..n).collect();
    for p in &remote {
        let want = format!("rank 0 -> rank {p} via NET/IB/");
        assert!(
            log.contains(&want),
            "{label}: rank 0 logged no `{want}` line:\n{}",
            hetccl_testkit::ranks::tail(log, 4000)
        );
    }
    assert!(
        log.contains("links [") && !log.contains("\"tcp\""),
        "{label}: a pair took TCP, or the links line is missing:\n{}",
        hetccl_testkit::ranks::tail(log, 4000)
    );
}

#[test]
fn verbs_2_ranks_on_2_hosts() {
    suite("verbs_2x1", 2, 1, &["split", "shrink", "abort"]);
}

#[test]
fn verbs_4_ranks_on_2_hosts() {
    suite("verbs_2x2", 4, 2, &[]);
}

/// `NCCL_IB_DISABLE=1` with an RDMA port present: the cross-node pair
/// takes TCP, still exact, and no verbs line is logged.
#[test]
fn ib_disable_forces_tcp_between_nodes() {
    let exe: &Path = coll::program("coll_check_rdma_off");
    if !have_rdma() {
        return;
    }
    let job = Job::new("verbs_off allreduce", 2, "allreduce")
        .args(["--counts", "1,1021"])
        .env("NCCL_IB_DISABLE", "1")
        .rank_env(|rank, _| {
            let mut v = vec![("HETCCL_HOST_ID".to_string(), format!("node{rank}"))];
            if rank == 0 {
                v.push(("NCCL_DEBUG".into(), "INFO".into()));
                v.push(("NCCL_DEBUG_SUBSYS".into(), "INIT".into()));
            }
            v
        });
    let outs = coll::run_all("verbs_off", exe, &hetccl_so(), vec![job]);
    let log = &outs[0].outs[0].stdout;
    assert!(
        log.contains("links [\"self\", \"tcp\"]") && !log.contains("via NET/IB"),
        "NCCL_IB_DISABLE=1: the cross-node pair did not take TCP:\n{}",
        hetccl_testkit::ranks::tail(log, 4000)
    );
}

#[test]
fn kill_9_over_verbs() {
    let exe = coll::program("coll_check_rdma_faults");
    if !have_rdma() {
        return;
    }
    const TIMEOUT_S: f64 = 5.0;
    // Slack for two emulated CPUs (TCG) on top of HETCCL_TIMEOUT_S.
    const MARGIN_S: f64 = 10.0;
    let so = hetccl_so();
    // 2 × 2 is symmetric: one victim; its node peer sees it through shm,
    // the other node's ranks through verbs.
    let victim = 3usize;
    let job = Job::new(format!("kill9_verbs_{victim}"), 4, "peer_fault")
        .env("HETCCL_TIMEOUT_S", &TIMEOUT_S.to_string())
        .env("NCCL_DEBUG", "WARN")
        .rank_env(|rank, _| {
            vec![
                ("HETCCL_HOST_ID".to_string(), format!("node{}", rank / 2)),
                ("HETCCL_NET".to_string(), "ib".to_string()),
            ]
        });
    let v = faults::trial(exe, &so, &job, victim, Fault::Kill, TIMEOUT_S, MARGIN_S, 20);
    eprintln!(
        "STRESS kill9_verbs victim {victim}: hang {} crash {} wrong {} detect_ms {:.0} abort_ms {:.0}",
        v.hang, v.crash, v.wrong, v.detect_ms, v.abort_ms
    );
    assert!(
        v.ok() && v.bad.is_empty(),
        "kill -9 of rank {victim} over verbs:\n{}",
        v.report
    );
    // A dead peer's setup sockets close without a BYE: its verbs peers
    // fail at once, not after the close grace a graceful close gets.
    let grace_ms = nccl_net_plugin::ib::CLOSE_GRACE.as_secs_f64() * 1e3;
    assert!(
        v.detect_ms < grace_ms,
        "kill -9 of rank {victim} over verbs took {:.0} ms to detect, past the {grace_ms:.0} ms close grace:\n{}",
        v.detect_ms,
        v.report
    );
}

/// hetccl-perf's AllReduce between 2 ranks on 2 host ids, results checked
/// (`-c 1`: a wrong element makes it exit 1), from `ncclMemAlloc` buffers
/// (registered once, written straight from and into: the INFO line says
/// so) and from plain host buffers (bounce chunks, no such line).
#[test]
fn allreduce_from_registered_and_plain_memory_over_verbs() {
    if !have_rdma() {
        return;
    }
    let bin = hetccl_testkit::perf::perf_bin();
    for alloc in ["nccl", "host"] {
        let id =
            hetccl_testkit::tmp_dir().join(format!("rdma_perf_{alloc}.{}.id", std::process::id()));
        let _ = std::fs::remove_file(&id);
        let kids: Vec<_> = (0..2)
            .map(|r| {
                std::process::Command::new(&bin)
                    .args([
                        "all_reduce",
                        "-b",
                        "8",
                        "-e",
                        "4M",
                        "-f",
                        "8",
                        "-n",
                        "3",
                        "-w",
                        "1",
                        "-c",
                        "1",
                    ])
                    .args(["--alloc", alloc, "--id-file"])
                    .arg(&id)
                    .env("HETCCL_PERF_LIB", hetccl_so())
                    .env("HETCCL_PERF_RANK", r.to_string())
                    .env("HETCCL_PERF_NRANKS", "2")
                    .env("HETCCL_HOST_ID", format!("node{r}"))
                    .env("HETCCL_NET", "ib")
                    .env("HETCCL_SOCKET_IFNAME", "=lo")
                    .env("HETCCL_TIMEOUT_S", "60")
                    .env("NCCL_DEBUG", "INFO")
                    .env("NCCL_DEBUG_SUBSYS", "NET")
                    .stdout(std::process::Stdio::piped())
                    .stderr(std::process::Stdio::piped())
                    .spawn()
                    .expect("spawn hetccl-perf")
            })
            .collect();
        for (r, k) in kids.into_iter().enumerate() {
            let o = k.wait_with_output().expect("hetccl-perf ran");
            assert!(
                o.status.success(),
                "alloc {alloc}, rank {r}: {}\n{}\n{}",
                o.status,
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            );
            let log = format!(
                "{}{}",
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            );
            assert_eq!(
                log.contains("registered memory is sent and received in place"),
                alloc == "nccl",
                "alloc {alloc}, rank {r}: registered memory used in place only for \
                 ncclMemAlloc buffers:\n{}",
                hetccl_testkit::ranks::tail(&log, 3000)
            );
        }
    }
}
