//! hetccl-perf's observability tools end to end. The timeline: `hetccl-perf all_reduce -np 2 -b 8 -e 1M` with
//! `HETCCL_TRACE_FILE=<dir>/t.%r.json` writes one valid JSON file per rank
//! in which every collective slice has a trace id, the ranks' trace ids are
//! the same, and `hetccl-perf trace-merge` makes one file that parses. A
//! run over TCP (`NCCL_SHM_DISABLE=1`, the executor's links) also has step
//! slices (send, recv, ...) with peer and bytes. Then `--link-stats` and
//! `hetccl-perf status`.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use hetccl_testkit::perf::{perf_bin, run_env};
use serde_json::Value;

fn parse_file(p: &Path) -> Value {
    let text = std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// Every call slice of one file: trace id -> (name, bytes), checked to be
/// complete events with the documented arguments.
fn calls(v: &Value, rank: usize) -> BTreeMap<String, (String, u64)> {
    let mut out = BTreeMap::new();
    for e in v["traceEvents"].as_array().expect("traceEvents") {
        assert!(e["ph"].is_string() && e["pid"].is_number(), "{e}");
        if e["cat"] != "call" {
            continue;
        }
        assert_eq!(e["ph"], "X", "{e}");
        assert_eq!(e["pid"], rank, "{e}");
        assert!(
            e["ts"].is_number() && e["dur"].as_f64().unwrap() >= 0.0,
            "{e}"
        );
        let a = &e["args"];
        for k in ["algorithm", "dtype", "op", "comm"] {
            assert!(a[k].is_string(), "{k}: {e}");
        }
        assert!(a["peer"].is_number() && a["seq"].is_number(), "{e}");
        let id = a["trace_id"].as_str().expect("trace_id").to_string();
        assert!(
            id.starts_with(a["comm"].as_str().unwrap()),
            "the trace id starts with the comm hash: {e}"
        );
        let name = e["name"].as_str().unwrap().to_string();
        let prev = out.insert(id.clone(), (name, a["bytes"].as_u64().unwrap()));
        assert!(prev.is_none(), "trace id {id} twice on rank {rank}");
    }
    out
}

fn steps(v: &Value) -> Vec<&Value> {
    v["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["cat"] == "step")
        .collect()
}

fn run_traced(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> (Value, Value) {
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir).unwrap();
    let tmpl = dir.join("t.%r.json").display().to_string();
    let mut all_env = vec![
        ("HETCCL_TRACE_FILE", tmpl.as_str()),
        ("HETCCL_SOCKET_IFNAME", "lo"),
    ];
    all_env.extend_from_slice(env);
    let o = run_env(args, &all_env);
    assert!(
        o.status.success(),
        "hetccl-perf {args:?}: {}\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    let files: Vec<_> = std::fs::read_dir(dir).unwrap().flatten().collect();
    assert_eq!(files.len(), 2, "one file per rank: {files:?}");
    (
        parse_file(&dir.join("t.0.json")),
        parse_file(&dir.join("t.1.json")),
    )
}

#[test]
fn all_reduce_timelines_share_trace_ids_and_merge() {
    let dir = std::env::temp_dir().join(format!("hetccl-perf-trace-{}", std::process::id()));
    let (t0, t1) = run_traced(
        &dir,
        &["all_reduce", "-np", "2", "-b", "8", "-e", "1M"],
        &[],
    );
    let (c0, c1) = (calls(&t0, 0), calls(&t1, 1));
    assert!(c0.len() >= 20, "{} call slices", c0.len());
    assert_eq!(c0, c1, "the ranks' call slices carry the same trace ids");
    assert!(c0.values().all(|(n, _)| n == "allreduce"));
    assert_eq!(c0.values().map(|(_, b)| *b).max(), Some(1 << 20));
    assert_eq!(t0["otherData"]["rank"], 0);
    assert_eq!(t0["otherData"]["clock_offset_ns"], 0);
    assert!(t1["otherData"]["clock_offset_ns"].is_number());

    let o = Command::new(perf_bin())
        .arg("trace-merge")
        .arg(dir.join("t.0.json"))
        .arg(dir.join("t.1.json"))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let merged: Value = serde_json::from_slice(&o.stdout).expect("the merged file parses");
    let n = |v: &Value| v["traceEvents"].as_array().unwrap().len();
    assert_eq!(n(&merged), n(&t0) + n(&t1));
    let pids: std::collections::BTreeSet<i64> = merged["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["pid"].as_i64())
        .collect();
    assert_eq!(pids.into_iter().collect::<Vec<_>>(), vec![0, 1]);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn tcp_timelines_have_step_slices() {
    let dir = std::env::temp_dir().join(format!("hetccl-perf-trace-tcp-{}", std::process::id()));
    let (t0, t1) = run_traced(
        &dir,
        &[
            "all_reduce",
            "-np",
            "2",
            "-b",
            "8",
            "-e",
            "64K",
            "-n",
            "3",
            "-w",
            "1",
        ],
        &[("NCCL_SHM_DISABLE", "1")],
    );
    assert_eq!(calls(&t0, 0), calls(&t1, 1));
    for (rank, t) in [(0, &t0), (1, &t1)] {
        let s = steps(t);
        assert!(!s.is_empty(), "rank {rank}: no step slices");
        let sends: Vec<_> = s.iter().filter(|e| e["name"] == "send").collect();
        assert!(!sends.is_empty(), "rank {rank}: no send steps");
        for e in sends {
            assert_eq!(e["args"]["peer"], 1 - rank, "{e}");
            assert!(e["args"]["bytes"].as_u64().unwrap() > 0, "{e}");
            assert!(e["args"]["channel"].is_number(), "{e}");
            assert!(e["args"]["trace_id"].is_string(), "{e}");
        }
    }
    // Each step belongs to a call of its rank's timeline.
    let ids = calls(&t0, 0);
    for e in steps(&t0) {
        assert!(
            ids.contains_key(e["args"]["trace_id"].as_str().unwrap()),
            "{e}"
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `--link-stats` prints one line per link of every rank after the footer;
/// what a rank sent is what its peer received.
#[test]
fn link_stats_summarise_every_link() {
    let o = run_env(
        &[
            "sendrecv",
            "-np",
            "2",
            "-b",
            "4K",
            "-e",
            "4K",
            "-n",
            "3",
            "-w",
            "1",
            "--link-stats",
        ],
        &[("HETCCL_SOCKET_IFNAME", "lo")],
    );
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "{out}\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let after = out
        .split("# Link stats")
        .nth(1)
        .unwrap_or_else(|| panic!("no summary:\n{out}"));
    assert!(out.find("# Link stats") > out.find("# Avg bus bandwidth"));
    // rank, peer, transport, sent, msgs, received, msgs, errors
    let rows: Vec<Vec<&str>> = after
        .lines()
        .map(|l| {
            l.trim_start_matches('#')
                .split_whitespace()
                .collect::<Vec<_>>()
        })
        .filter(|f| f.len() == 8 && f[0].parse::<u32>().is_ok())
        .collect();
    assert_eq!(rows.len(), 2, "{after}");
    let n = |s: &str| s.parse::<u64>().unwrap();
    for (r, row) in rows.iter().enumerate() {
        assert_eq!(n(row[0]), r as u64);
        assert_eq!(n(row[1]), 1 - r as u64);
        assert_eq!(row[2], "shm");
        assert!(n(row[3]) >= 4 * 4096, "{after}");
        assert_eq!(
            n(row[3]),
            n(rows[1 - r][5]),
            "sent = the peer's received: {after}"
        );
        assert_eq!(n(row[7]), 0);
    }
    assert!(after.contains("send: "), "{after}");
}

/// `hetccl-perf status --pid PID` finds the service's port in the file the
/// library writes and prints the service's answer; without a service it
/// says so and exits 2.
#[test]
fn status_asks_the_service_of_a_pid() {
    use std::io::{Read, Write};
    let dir = std::env::temp_dir().join(format!("hetccl-perf-status-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let fake_pid = 3_999_999u32;
    std::fs::write(
        dir.join(format!("hetccl-status-{fake_pid}.port")),
        format!("{port}\n"),
    )
    .unwrap();
    let server = std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        let mut req = [0u8; 7];
        s.read_exact(&mut req).unwrap();
        assert_eq!(&req, b"status\n");
        s.write_all(b"comm x: table\nblocking: none\n").unwrap();
    });
    let o = Command::new(perf_bin())
        .args(["status", "--pid", &fake_pid.to_string()])
        .env("TMPDIR", &dir)
        .output()
        .unwrap();
    server.join().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(
        String::from_utf8_lossy(&o.stdout),
        "comm x: table\nblocking: none\n"
    );
    let o = Command::new(perf_bin())
        .args(["status", "--pid", "3999998"])
        .env("TMPDIR", &dir)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("no status service for pid 3999998"));
    std::fs::remove_dir_all(&dir).unwrap();
}
