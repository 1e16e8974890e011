//! The timeline file of a process that never destroys its communicator is
//! written at exit, and each thread keeps at most `HETCCL_TRACE_MAX_EVENTS`
//! events (the oldest dropped, and counted). The ranks are this test binary
//! run again as a child process.

use std::path::Path;
use std::process::Command;
use std::ptr::null_mut;

use hetccl_abi::{ncclComm_t, ncclUniqueId};
use hetccl_collectives::api::coll::ncclAllReduce;
use hetccl_collectives::api::comm_init::{ncclCommInitRank, ncclGetUniqueId};
use hetccl_testkit::{ranks, threads::check};

const ROLE: &str = "TELEMETRY_TRACE_CHILD";
const TEST: &str = "the_timeline_is_written_at_exit_and_bounded";
const CALLS: usize = 5;

/// One rank of its own communicator: `CALLS` allreduces, then exit without
/// destroying anything.
fn child() -> ! {
    let mut id = ncclUniqueId::default();
    // SAFETY: a valid out pointer.
    check(unsafe { ncclGetUniqueId(&mut id) });
    let mut c: ncclComm_t = null_mut();
    // SAFETY: a valid out pointer; one rank.
    check(unsafe { ncclCommInitRank(&mut c, 1, id, 0) });
    for _ in 0..CALLS {
        let send = [1.0f32; 4];
        let mut recv = [0.0f32; 4];
        // SAFETY: host buffers of 4 floats owned by this frame.
        check(unsafe {
            ncclAllReduce(
                send.as_ptr().cast(),
                recv.as_mut_ptr().cast(),
                4,
                7,
                0,
                c,
                null_mut(),
            )
        });
    }
    std::process::exit(0)
}

fn traced(dir: &Path, max: Option<&str>) -> serde_json::Value {
    let file = dir.join(format!("t.{}.%r.json", max.unwrap_or("all")));
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    ranks::clean_env(&mut cmd);
    cmd.args(["--exact", TEST, "--nocapture", "--test-threads=1"])
        .env(ROLE, "1")
        .env("HETCCL_SOCKET_IFNAME", "lo")
        .env("HETCCL_TRACE_FILE", &file);
    if let Some(m) = max {
        cmd.env("HETCCL_TRACE_MAX_EVENTS", m);
    }
    let outs = ranks::run_ranks(vec![cmd], std::time::Duration::from_secs(60));
    assert!(outs[0].ok(), "{}", ranks::report(&outs, 4000));
    let path = dir.join(format!("t.{}.0.json", max.unwrap_or("all")));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"))
}

fn slices(v: &serde_json::Value) -> Vec<&serde_json::Value> {
    v["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["ph"] == "X")
        .collect()
}

fn calls(v: &serde_json::Value) -> Vec<&serde_json::Value> {
    v["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["cat"] == "call")
        .collect()
}

#[test]
fn the_timeline_is_written_at_exit_and_bounded() {
    if std::env::var_os(ROLE).is_some() {
        child();
    }
    let dir = std::env::temp_dir().join(format!("hetccl-trace-exit-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let all = traced(&dir, None);
    let c = calls(&all);
    assert_eq!(c.len(), CALLS, "{all}");
    let seqs: Vec<u64> = c
        .iter()
        .map(|e| e["args"]["seq"].as_u64().unwrap())
        .collect();
    assert_eq!(seqs, (0..CALLS as u64).collect::<Vec<_>>());
    assert_eq!(all["otherData"]["dropped_events"], 0);

    let total = slices(&all).len() as u64;
    assert!(total > CALLS as u64, "call and step slices: {all}");
    let two = traced(&dir, Some("2"));
    let kept = slices(&two);
    assert_eq!(kept.len(), 2, "{two}");
    assert_eq!(kept[1]["cat"], "call", "the newest are kept");
    assert_eq!(
        kept[1]["args"]["seq"],
        CALLS as u64 - 1,
        "the newest are kept"
    );
    assert_eq!(two["otherData"]["dropped_events"], total - 2);
    std::fs::remove_dir_all(&dir).unwrap();
}
