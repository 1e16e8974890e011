//! NCCL's profiler plugin (`ncclProfiler_v6`, `ncclProfiler_v5` of
//! libhetccl.so), driven by `tests/c/profiler_harness.c` the way NCCL does:
//! the activation masks, and the Chrome trace-event files with every event,
//! its parent, its arguments and its state changes.

use std::process::Command;

use hetccl_testkit::{cc, hetccl_so};
use serde_json::Value;

/// The harness, compiled once for both tests.
fn harness() -> &'static std::path::Path {
    static EXE: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
    EXE.get_or_init(|| {
        cc::compile_c(
            "tests/c/profiler_harness.c",
            "profiler_harness",
            &cc::CcOpts {
                extra: vec!["-ldl".into()],
                ..Default::default()
            },
        )
    })
}

fn run(env: &[(&str, &str)]) -> std::collections::BTreeMap<String, String> {
    let mut cmd = Command::new(harness());
    cmd.arg(hetccl_so()).env_remove("HETCCL_TRACE_FILE");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cc::run_ok(&mut cmd);
    let kv = cc::parse_kv(&String::from_utf8_lossy(&out.stdout));
    assert_eq!(kv.get("result").map(String::as_str), Some("ok"), "{kv:?}");
    kv
}

fn events(v: &Value) -> Vec<&Value> {
    v["traceEvents"].as_array().unwrap().iter().collect()
}

fn by_name<'a>(v: &'a Value, name: &str) -> &'a Value {
    events(v)
        .into_iter()
        .find(|e| e["name"] == name && e["ph"] == "X")
        .unwrap_or_else(|| panic!("no {name} event: {v}"))
}

#[test]
fn the_harness_gets_a_timeline_per_communicator() {
    let dir = std::env::temp_dir().join(format!("hetccl-profiler-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let tmpl = dir.join("p.%r.json").display().to_string();
    let kv = run(&[("HETCCL_TRACE_FILE", &tmpl)]);
    assert_eq!(kv["name"], "hetccl");
    assert_eq!(kv["mask_v6"], (0x7fff).to_string());
    assert_eq!(kv["mask_v5"], (0xfff).to_string());
    for (rank, comm, ce) in [
        (0, "0000000000001234", true),
        (1, "0000000000005678", false),
    ] {
        let p = dir.join(format!("p.{rank}.json"));
        let v: Value = serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
        assert_eq!(v["otherData"]["comm"], comm);
        assert_eq!(v["otherData"]["comm_name"], "harness");
        assert_eq!(v["otherData"]["rank"], rank);
        let group = by_name(&v, "Group");
        let coll = by_name(&v, "AllReduce");
        let op = by_name(&v, "ProxyOp send");
        let step = by_name(&v, "ProxyStep");
        let send = by_name(&v, "Send");
        assert_eq!(coll["args"]["parent"], group["args"]["id"]);
        assert_eq!(op["args"]["parent"], coll["args"]["id"]);
        assert_eq!(step["args"]["parent"], op["args"]["id"]);
        assert_eq!(send["args"]["parent"], group["args"]["id"]);
        assert_eq!(coll["args"]["trace_id"], format!("{comm}:7"));
        assert_eq!(coll["args"]["algorithm"], "RING");
        assert_eq!(coll["args"]["count"], 1024);
        assert_eq!(coll["cat"], "coll");
        assert_eq!(op["args"]["peer"], 1 - rank);
        assert_eq!(op["args"]["chunk_bytes"], 4096);
        assert_eq!(send["args"]["peer"], 1 - rank);
        assert!(step["dur"].as_f64().unwrap() >= 1000.0, "{step}");
        assert!(group["dur"].as_f64() >= coll["dur"].as_f64());
        let state = events(&v)
            .into_iter()
            .find(|e| e["ph"] == "i")
            .expect("a state change");
        assert_eq!(state["name"], "ProxyStepSendWait");
        assert_eq!(state["args"]["event"], step["args"]["id"]);
        assert_eq!(state["args"]["value"], 4096);
        let ce_ev = events(&v)
            .into_iter()
            .any(|e| e["name"] == "AllGather (CE)");
        assert_eq!(ce_ev, ce, "copy-engine events only through version 6");
        for e in events(&v).into_iter().filter(|e| e["ph"] == "X") {
            assert_eq!(e["pid"], rank, "{e}");
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn without_a_trace_file_every_event_is_off() {
    let kv = run(&[]);
    assert_eq!(kv["mask_v6"], "0");
    assert_eq!(kv["mask_v5"], "0");
}
