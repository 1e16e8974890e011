//! A rank that destroys its communicator right after its last collective
//! returns must not break its peers' same collective.
//!
//! `tests/c/lifecycle_loop.c` loops init → AllReduce → (finalize on odd
//! iterations) → destroy 200 times per launch, with no barrier between a
//! rank's AllReduce and its destroy. Over TCP, closing a socket that still
//! held unread bytes reset the connection and the slower peer's AllReduce
//! failed with "Connection reset by peer" within the first few dozen
//! iterations; the graceful close of `ncclCommFinalize` fixed it. Layouts:
//! TCP with 2 and 4 ranks, 4 ranks as two emulated nodes with the Direct
//! algorithm, and shared memory with 2 and 4 ranks. Every launch must pass
//! every iteration with exact results.

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use hetccl_testkit::{cc, hetccl_so, ranks, tmp_dir};

const ITERS: usize = 200;

fn exe() -> &'static PathBuf {
    static EXE: OnceLock<PathBuf> = OnceLock::new();
    EXE.get_or_init(|| {
        cc::compile_c(
            "tests/c/lifecycle_loop.c",
            "lifecycle_loop",
            &cc::CcOpts {
                link_nvidia_nccl: true,
                extra: vec!["-ldl".into()],
            },
        )
    })
}

/// Runs one launch of `n` ranks; `env(rank)` adds per-rank variables.
fn launch(
    label: &str,
    n: usize,
    counts: &str,
    env: &[(&str, &str)],
    per_rank: fn(usize) -> Vec<(String, String)>,
) {
    // One launch at a time: each is up to four busy processes already.
    static ONE: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = ONE.lock().unwrap_or_else(|e| e.into_inner());
    let so = hetccl_so();
    let dir = tmp_dir().join(format!("shutdown_loop_{label}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("id dir");
    let cmds: Vec<Command> = (0..n)
        .map(|rank| {
            let mut c = Command::new(exe());
            ranks::clean_env(&mut c);
            c.env("LD_PRELOAD", &so)
                .env("HETCCL_SOCKET_IFNAME", "lo")
                .env("HETCCL_TIMEOUT_S", "30")
                .env("NCCL_DEBUG", "WARN");
            for (k, v) in env {
                c.env(k, v);
            }
            for (k, v) in per_rank(rank) {
                c.env(k, v);
            }
            c.args(["--rank", &rank.to_string(), "--nranks", &n.to_string()])
                .arg("--id")
                .arg(dir.join("id"))
                .args(["--iters", &ITERS.to_string(), "--counts", counts]);
            c
        })
        .collect();
    let t0 = std::time::Instant::now();
    let outs = ranks::run_ranks(cmds, Duration::from_secs(240));
    let _ = std::fs::remove_dir_all(&dir);
    let bad: Vec<String> = outs
        .iter()
        .filter(|o| {
            !o.ok()
                || o.get("done").as_deref() != Some("1")
                || o.get("lifecycle.iters") != Some(ITERS.to_string())
                || !o.get("origin").is_some_and(|v| ranks::same_file(&v, &so))
                || o.get("origin.all_same").as_deref() != Some("1")
        })
        .map(|o| format!("rank {}: {}", o.rank, o.how()))
        .collect();
    assert!(
        bad.is_empty(),
        "{label}: {} of {n} ranks failed ({}):\n{}",
        bad.len(),
        bad.join("; "),
        ranks::report(&outs, 4000)
    );
    eprintln!(
        "[shutdown_loop] {label}: {ITERS} iterations in {:.1}s",
        t0.elapsed().as_secs_f64()
    );
}

fn none(_: usize) -> Vec<(String, String)> {
    Vec::new()
}

/// Ranks 0,1 on one emulated node, 2,3 on another.
fn two_nodes(rank: usize) -> Vec<(String, String)> {
    vec![("HETCCL_HOST_ID".into(), format!("node{}", rank / 2))]
}

#[test]
fn tcp_2_ranks() {
    launch(
        "tcp_2",
        2,
        "65536,262144",
        &[("NCCL_SHM_DISABLE", "1")],
        none,
    );
}

#[test]
fn tcp_4_ranks() {
    launch(
        "tcp_4",
        4,
        "65536,262144",
        &[("NCCL_SHM_DISABLE", "1")],
        none,
    );
}

#[test]
fn two_nodes_direct_4_ranks() {
    launch(
        "nodes_direct_4",
        4,
        "16384",
        &[("NCCL_ALGO", "Direct")],
        two_nodes,
    );
}

#[test]
fn shm_2_ranks() {
    launch("shm_2", 2, "65536,262144", &[], none);
}

#[test]
fn shm_4_ranks() {
    launch("shm_4", 4, "65536,262144", &[], none);
}
