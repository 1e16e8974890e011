//! Recovery end to end: four ranks loop AllReduce, rank 3 is killed with
//! SIGKILL in the middle, the survivors shrink with `NCCL_SHRINK_ABORT`, a
//! fresh process joins through `ncclCommGrow`, and the loop resumes with
//! exact results (`tests/c/recovery.c`). The time from the kill to the
//! first correct AllReduce on the grown communicator must stay under
//! 2 × HETCCL_TIMEOUT_S + 1 s; `bench-scripts/recovery` reports its median
//! over ten runs.

use std::process::Command;
use std::time::Duration;

use hetccl_testkit::{cc, hetccl_so, ranks, tmp_dir};

const TIMEOUT_S: f64 = 5.0;

/// Runs one recovery over `env` and returns the survivors' outputs.
pub fn recover(label: &str, env: &[(&str, &str)]) -> Vec<ranks::RankOutput> {
    // Compiled once: tests running in parallel must not run the file while
    // another compiles it ("Text file busy").
    static EXE: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
    let exe = EXE.get_or_init(|| {
        cc::compile_c(
            "tests/c/recovery.c",
            "recovery",
            &cc::CcOpts {
                link_nvidia_nccl: true,
                extra: vec!["-ldl".into()],
            },
        )
    });
    let so = hetccl_so();
    let dir = tmp_dir().join(format!("recovery_{label}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let mut cmds = Vec::new();
    for who in 0..5 {
        let mut c = Command::new(exe);
        ranks::clean_env(&mut c);
        c.env("LD_PRELOAD", &so)
            .env("HETCCL_SOCKET_IFNAME", "lo")
            .env("HETCCL_TIMEOUT_S", TIMEOUT_S.to_string())
            .env("NCCL_DEBUG", "WARN");
        for (k, v) in env {
            c.env(k, v);
        }
        if who < 4 {
            c.args(["--rank", &who.to_string()]);
        } else {
            c.arg("--joiner");
        }
        c.args(["--nranks", "4", "--iters", "30", "--kill-at", "10", "--id"])
            .arg(dir.join("id"));
        cmds.push(c);
    }
    let outs = ranks::run_ranks(cmds, Duration::from_secs(120));
    let _ = std::fs::remove_dir_all(&dir);
    let report = ranks::report(&outs, 3000);
    for o in &outs {
        if o.rank == 3 {
            assert!(!o.ok(), "{label}: rank 3 must die\n{report}");
            continue;
        }
        assert!(
            o.ok() && o.get("recovery.done").as_deref() == Some("1"),
            "{label}: {} {}\n{report}",
            o.rank,
            o.how()
        );
    }
    outs.into_iter().filter(|o| o.rank < 3).collect()
}

fn check(label: &str, env: &[(&str, &str)]) {
    let survivors = recover(label, env);
    for o in &survivors {
        let ms = |k: &str| -> f64 { o.get(k).and_then(|v| v.parse().ok()).unwrap_or(f64::MAX) };
        let total = ms("recovery.total_ms");
        eprintln!(
            "[recovery] {label} rank {}: detect {} ms, shrink {} ms, grow {} ms, total {total} ms",
            o.rank,
            ms("recovery.detect_ms"),
            ms("recovery.shrink_ms"),
            ms("recovery.grow_ms")
        );
        assert!(
            total < (2.0 * TIMEOUT_S + 1.0) * 1e3,
            "{label}: rank {}: {total} ms",
            o.rank
        );
    }
}

#[test]
fn a_killed_rank_is_replaced_by_shrink_and_grow_over_shm() {
    check("shm", &[]);
}

#[test]
fn a_killed_rank_is_replaced_by_shrink_and_grow_over_tcp() {
    check("tcp", &[("NCCL_SHM_DISABLE", "1")]);
}
