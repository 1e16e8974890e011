//! The stall limit holds: when a peer never joins an operation, the others
//! fail with `ncclRemoteError` within `HETCCL_TIMEOUT_S` plus 1 s, on every
//! path that can wait for it.
//!
//! `tests/c/stall_check.c`: the last rank joins the communicator and the
//! warm-up calls, then never joins the next AllReduce; the others time that
//! call. The first large AllReduce on one node used to wait twice the limit:
//! once in the single-copy probe, then again on the rings it fell back to.

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use hetccl_testkit::{cc, hetccl_so, ranks, tmp_dir};

/// `HETCCL_TIMEOUT_S` of the children.
const LIMIT_S: f64 = 2.0;

fn exe() -> &'static PathBuf {
    static EXE: OnceLock<PathBuf> = OnceLock::new();
    EXE.get_or_init(|| {
        cc::compile_c(
            "tests/c/stall_check.c",
            "stall_check",
            &cc::CcOpts {
                link_nvidia_nccl: true,
                extra: vec!["-ldl".into()],
            },
        )
    })
}

/// Runs one case; returns every survivor's (rc, ms).
fn case(
    label: &str,
    n: usize,
    count: usize,
    warmup: usize,
    env: &[(&str, &str)],
) -> Vec<(i32, f64)> {
    let so = hetccl_so();
    let dir = tmp_dir().join(format!("stall_{label}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("id dir");
    let idle = (LIMIT_S as u64 + 4).to_string();
    let cmds: Vec<Command> = (0..n)
        .map(|rank| {
            let mut c = Command::new(exe());
            ranks::clean_env(&mut c);
            c.env("LD_PRELOAD", &so)
                .env("HETCCL_SOCKET_IFNAME", "lo")
                .env("HETCCL_TIMEOUT_S", LIMIT_S.to_string())
                .env("NCCL_DEBUG", "WARN");
            for (k, v) in env {
                c.env(k, v);
            }
            c.args(["--rank", &rank.to_string(), "--nranks", &n.to_string()])
                .arg("--id")
                .arg(dir.join("id"))
                .args(["--count", &count.to_string()])
                .args(["--warmup", &warmup.to_string(), "--idle", &idle]);
            c
        })
        .collect();
    let outs = ranks::run_ranks(cmds, Duration::from_secs(60));
    let _ = std::fs::remove_dir_all(&dir);
    let report = || ranks::report(&outs, 3000);
    let mut got = Vec::new();
    for o in &outs {
        assert!(
            o.ok() && o.get("done").as_deref() == Some("1"),
            "{label}: rank {} {}\n{}",
            o.rank,
            o.how(),
            report()
        );
        if o.rank == n - 1 {
            continue;
        }
        let rc: i32 = o
            .get("stall.rc")
            .and_then(|v| v.parse().ok())
            .expect("stall.rc");
        let ms: f64 = o
            .get("stall.ms")
            .and_then(|v| v.parse().ok())
            .expect("stall.ms");
        got.push((rc, ms));
    }
    for (r, &(rc, ms)) in got.iter().enumerate() {
        assert_eq!(
            rc,
            6,
            "{label}: rank {r} returned {rc}, want ncclRemoteError\n{}",
            report()
        );
        assert!(
            ms <= (LIMIT_S + 1.0) * 1e3,
            "{label}: rank {r} failed after {ms} ms, beyond the {LIMIT_S} s limit + 1 s\n{}",
            report()
        );
    }
    eprintln!("[stall_limit] {label}: {got:?}");
    got
}

#[test]
fn a_missing_peer_fails_the_others_within_the_limit() {
    // One node: the board slots, the single-copy path on its first call
    // (its probe waits too) and after a warm-up, and the executor's rings.
    case("board", 2, 16, 0, &[]);
    case("copy_first", 2, 1 << 20, 0, &[]);
    case("copy_first_3", 3, 1 << 20, 0, &[]);
    case("copy_warm", 2, 1 << 20, 1, &[]);
    case("rings", 2, 1 << 20, 0, &[("NCCL_ALGO", "Ring")]);
    // TCP: small (inline) and large (CTS, data sockets) messages.
    case("tcp_small", 2, 16, 0, &[("NCCL_SHM_DISABLE", "1")]);
    case("tcp_large", 2, 1 << 20, 0, &[("NCCL_SHM_DISABLE", "1")]);
}
