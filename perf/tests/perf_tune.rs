//! `hetccl-perf tune` end to end: a sweep of two of hetccl's algorithms on
//! 4 ranks over 2 emulated nodes writes a `hetccl-tuning` table with one
//! entry per algorithm and measured points; a second sweep of another
//! layout is merged into the same file; an algorithm the collective lacks
//! is skipped with the library's reason; `--hosts` gives each block of
//! ranks its own host identity.

use hetccl_testkit::perf::run_env;
use serde_json::Value;

fn table(p: &std::path::Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(p).expect("table written")).expect("JSON")
}

#[test]
fn tune_writes_and_merges_a_hetccl_table() {
    let dir = std::env::temp_dir().join(format!("hetccl-perf-tune-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join("t.json");
    let o = out.to_str().unwrap();
    let env = [("HETCCL_SOCKET_IFNAME", "lo"), ("NCCL_DEBUG", "WARN")];
    let r = run_env(
        &[
            "tune",
            "--rounds",
            "2",
            "--out",
            o,
            "--colls",
            "all_reduce,broadcast",
            "--algos",
            "Ring,Tree,HalvingDoubling",
            "-np",
            "4",
            "--hosts",
            "2",
            "-b",
            "8",
            "-e",
            "4K",
            "-f",
            "8",
            "-n",
            "2",
            "-w",
            "1",
        ],
        &env,
    );
    let err = String::from_utf8_lossy(&r.stderr);
    assert!(r.status.success(), "{err}");
    assert!(
        err.contains("broadcast HalvingDoubling: skipped") && err.contains("leaves no algorithm"),
        "{err}"
    );
    let t = table(&out);
    assert_eq!(t["format"], "hetccl-tuning");
    assert_eq!(t["version"], 1);
    let l = &t["layouts"][0];
    assert_eq!(
        (l["nranks"].as_u64(), l["nnodes"].as_u64()),
        (Some(4), Some(2))
    );
    assert_eq!(l["transports"], serde_json::json!(["shm", "tcp"]));
    let entries = l["entries"].as_array().unwrap();
    let names: Vec<String> = entries
        .iter()
        .map(|e| {
            format!(
                "{}/{}",
                e["collective"].as_str().unwrap(),
                e["algo"].as_str().unwrap()
            )
        })
        .collect();
    assert_eq!(
        names,
        [
            "allreduce/ring",
            "allreduce/tree",
            "allreduce/halvingdoubling",
            "broadcast/ring",
            "broadcast/tree"
        ],
    );
    for e in entries {
        let pts = e["points"].as_array().unwrap();
        let bytes: Vec<u64> = pts.iter().map(|p| p[0].as_u64().unwrap()).collect();
        assert_eq!(bytes, [8, 64, 512, 4096], "{e}");
        assert!(pts.iter().all(|p| p[1].as_f64().unwrap() > 0.0), "{e}");
    }
    // Another layout goes into the same file.
    let r = run_env(
        &[
            "tune",
            "--out",
            o,
            "--colls",
            "all_reduce",
            "--algos",
            "Ring",
            "-np",
            "2",
            "--hosts",
            "2",
            "-b",
            "8",
            "-e",
            "8",
            "-n",
            "1",
            "-w",
            "0",
        ],
        &env,
    );
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    let t = table(&out);
    let layouts = t["layouts"].as_array().unwrap();
    assert_eq!(layouts.len(), 2);
    assert_eq!(layouts[1]["transports"], serde_json::json!(["tcp"]));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn hosts_needs_np_and_is_checked() {
    let r = run_env(&["all_reduce", "--hosts", "2", "-b", "8", "-e", "8"], &[]);
    assert_eq!(
        r.status.code(),
        Some(64),
        "{}",
        String::from_utf8_lossy(&r.stderr)
    );
    let r = run_env(
        &[
            "all_reduce",
            "-np",
            "2",
            "--hosts",
            "3",
            "-b",
            "8",
            "-e",
            "8",
        ],
        &[],
    );
    assert_eq!(r.status.code(), Some(64));
}
