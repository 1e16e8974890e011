//! Metrics across processes: two ranks, one process each (this test binary
//! run again as each rank), over shared memory and over TCP. Each rank
//! sends and receives a known number of bytes, and (over shm) runs
//! allreduces on the direct paths, which use no link. Then:
//! - `HETCCL_METRICS_FILE` (`%r` expanded) parses as the Prometheus text
//!   format (a strict parser, `hetccl_testkit::prom`), is rewritten every
//!   `HETCCL_METRICS_INTERVAL_S` while the ranks run, and its byte counters
//!   equal the bytes moved;
//! - `hetcclCommGetStats` returns JSON (parsed with serde_json) with the
//!   same numbers.

use std::ffi::c_char;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::ptr::null_mut;
use std::time::{Duration, Instant};

use hetccl_abi::ncclComm_t;
use hetccl_collectives::api::coll::{ncclAllReduce, ncclRecv, ncclSend};
use hetccl_collectives::api::comm_init::ncclCommInitRank;
use hetccl_collectives::api::comm_life::ncclCommDestroy;
use hetccl_collectives::api::ext::hetcclCommGetStats;
use hetccl_collectives::api::group::{ncclGroupEnd, ncclGroupStart};
use hetccl_testkit::{prom, ranks, threads::check};

const ROLE: &str = "TELEMETRY_TEST_RANK";
const DIR: &str = "TELEMETRY_TEST_DIR";
const TEST: &str = "metrics_count_the_bytes_moved";
const INT8: i32 = 0;
const FLOAT: i32 = 7;
const SUM: i32 = 0;

/// The messages rank 0 sends to rank 1 (bytes), and rank 1 to rank 0.
const TO_1: [usize; 4] = [1, 4096, 1 << 20, 333_333];
const TO_0: [usize; 3] = [8, 65_536, 3];
/// AllReduce counts (floats).
const ALLREDUCES: [usize; 3] = [2, 1000, 70_000];

fn stats(c: ncclComm_t) -> serde_json::Value {
    let mut needed = 0usize;
    // SAFETY: a live communicator; NULL buffer with length 0 asks the size.
    check(unsafe { hetcclCommGetStats(c, null_mut(), 0, &mut needed) });
    let mut buf = vec![0 as c_char; needed + 1];
    // SAFETY: `buf` holds `buf.len()` writable bytes.
    check(unsafe { hetcclCommGetStats(c, buf.as_mut_ptr(), buf.len(), null_mut()) });
    let bytes: Vec<u8> = buf[..needed].iter().map(|&b| b as u8).collect();
    assert_eq!(buf[needed], 0);
    serde_json::from_slice(&bytes).expect("hetcclCommGetStats returns JSON")
}

/// One rank's part.
fn child(rank: usize, dir: &Path, allreduce: bool) {
    let id = hetccl_testkit::ranks::shared_unique_id(dir, rank);
    let mut c: ncclComm_t = null_mut();
    // SAFETY: a valid out pointer; rank and size in range.
    check(unsafe { ncclCommInitRank(&mut c, 2, id, rank as i32) });
    let (mine, theirs): (&[usize], &[usize]) = if rank == 0 {
        (&TO_1, &TO_0)
    } else {
        (&TO_0, &TO_1)
    };
    let peer = 1 - rank as i32;
    for i in 0..mine.len().max(theirs.len()) {
        let send = vec![7u8; mine.get(i).copied().unwrap_or(0)];
        let mut recv = vec![0u8; theirs.get(i).copied().unwrap_or(0)];
        // SAFETY: buffers this rank owns for the whole group; host memory.
        unsafe {
            check(ncclGroupStart());
            if i < mine.len() {
                check(ncclSend(
                    send.as_ptr().cast(),
                    send.len(),
                    INT8,
                    peer,
                    c,
                    null_mut(),
                ));
            }
            if i < theirs.len() {
                check(ncclRecv(
                    recv.as_mut_ptr().cast(),
                    recv.len(),
                    INT8,
                    peer,
                    c,
                    null_mut(),
                ));
            }
            check(ncclGroupEnd());
        }
        assert!(recv.iter().all(|&b| b == 7));
    }
    if allreduce {
        for n in ALLREDUCES {
            let send = vec![1.0f32; n];
            let mut recv = vec![0.0f32; n];
            // SAFETY: buffers of `n` floats this rank owns; host memory.
            check(unsafe {
                ncclAllReduce(
                    send.as_ptr().cast(),
                    recv.as_mut_ptr().cast(),
                    n,
                    FLOAT,
                    SUM,
                    c,
                    null_mut(),
                )
            });
            assert!(recv.iter().all(|&v| v == 2.0));
        }
    }
    // The file is rewritten while the communicator lives.
    let file = dir.join(format!("m.{rank}.prom"));
    let until = Instant::now() + Duration::from_secs(10);
    let want = mine.iter().sum::<usize>() as f64;
    loop {
        let text = std::fs::read_to_string(&file).unwrap_or_default();
        let e = prom::parse(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
        let sent = e.value(
            "hetccl_link_sent_bytes_total",
            &[("peer", &peer.to_string())],
        );
        if sent == Ok(want) {
            break;
        }
        assert!(
            Instant::now() < until,
            "the metrics file was not rewritten: {sent:?}\n{text}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let j = stats(c);
    std::fs::write(dir.join(format!("stats.{rank}.json")), j.to_string()).unwrap();
    // SAFETY: a live communicator, destroyed once.
    check(unsafe { ncclCommDestroy(c) });
}

/// How many of `n` calls of one kind have their latency measured (one in
/// 8, the first included).
fn sampled(n: usize) -> f64 {
    n.div_ceil(8) as f64
}

fn run(label: &str, env: &[(&str, &str)], allreduce: bool) {
    let dir = std::env::temp_dir().join(format!("hetccl-telemetry-{label}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let exe = std::env::current_exe().unwrap();
    let cmds: Vec<Command> = (0..2)
        .map(|r| {
            let mut c = Command::new(&exe);
            ranks::clean_env(&mut c);
            c.args(["--exact", TEST, "--nocapture", "--test-threads=1"])
                .env(ROLE, r.to_string())
                .env(DIR, &dir)
                .env(
                    "TELEMETRY_TEST_ALLREDUCE",
                    if allreduce { "1" } else { "0" },
                )
                .env("HETCCL_SOCKET_IFNAME", "lo")
                .env("HETCCL_TIMEOUT_S", "60")
                .env("HETCCL_METRICS_FILE", dir.join("m.%r.prom"))
                .env("HETCCL_METRICS_INTERVAL_S", "0.1");
            for (k, v) in env {
                c.env(k, v);
            }
            c
        })
        .collect();
    let outs = ranks::run_ranks(cmds, Duration::from_secs(120));
    assert!(
        outs.iter().all(|o| o.ok()),
        "{label}:\n{}",
        ranks::report(&outs, 4000)
    );
    for rank in 0..2usize {
        let peer = (1 - rank).to_string();
        let (mine, theirs): (&[usize], &[usize]) = if rank == 0 {
            (&TO_1, &TO_0)
        } else {
            (&TO_0, &TO_1)
        };
        let (sent, received) = (
            mine.iter().sum::<usize>() as f64,
            theirs.iter().sum::<usize>() as f64,
        );
        let path: PathBuf = dir.join(format!("m.{rank}.prom"));
        let text = std::fs::read_to_string(&path).unwrap();
        let e = prom::parse(&text).unwrap_or_else(|e| panic!("{label} rank {rank}: {e}\n{text}"));
        let transport = if label == "tcp" { "tcp" } else { "shm" };
        let link = [
            ("peer", peer.as_str()),
            ("transport", transport),
            ("rank", &rank.to_string()),
        ];
        let v = |name: &str, l: &[(&str, &str)]| {
            e.value(name, l)
                .unwrap_or_else(|m| panic!("{label}: {m}\n{text}"))
        };
        assert_eq!(
            v("hetccl_link_sent_bytes_total", &link),
            sent,
            "{label} rank {rank}"
        );
        assert_eq!(
            v("hetccl_link_received_bytes_total", &link),
            received,
            "{label} rank {rank}"
        );
        assert!(v("hetccl_link_sent_messages_total", &link) >= mine.len() as f64);
        assert!(v("hetccl_link_received_messages_total", &link) >= theirs.len() as f64);
        assert_eq!(v("hetccl_link_errors_total", &link), 0.0);
        assert_eq!(
            v("hetccl_calls_total", &[("kind", "send")]),
            mine.len() as f64
        );
        assert_eq!(
            v("hetccl_calls_total", &[("kind", "recv")]),
            theirs.len() as f64
        );
        assert_eq!(v("hetccl_call_bytes_total", &[("kind", "send")]), sent);
        assert_eq!(v("hetccl_call_bytes_total", &[("kind", "recv")]), received);
        assert_eq!(
            v("hetccl_call_latency_seconds_count", &[("kind", "send")]),
            sampled(mine.len())
        );
        assert_eq!(v("hetccl_comm_ranks", &[]), 2.0);
        let ar_bytes = ALLREDUCES.iter().sum::<usize>() as f64 * 4.0;
        if allreduce {
            assert_eq!(v("hetccl_calls_total", &[("kind", "allreduce")]), 3.0);
            assert_eq!(
                v("hetccl_call_bytes_total", &[("kind", "allreduce")]),
                ar_bytes
            );
            let algos: f64 = e
                .find("hetccl_call_algorithm_total", &[("kind", "allreduce")])
                .iter()
                .map(|s| s.value)
                .sum();
            assert_eq!(algos, 3.0, "{text}");
        }
        // The JSON of hetcclCommGetStats, taken before destroy.
        let j: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(dir.join(format!("stats.{rank}.json"))).unwrap(),
        )
        .unwrap();
        assert_eq!(j["rank"], rank);
        assert_eq!(j["nranks"], 2);
        let links = j["links"].as_array().unwrap();
        assert_eq!(links.len(), 1, "{j}");
        assert_eq!(links[0]["peer"], 1 - rank);
        assert_eq!(links[0]["transport"], transport);
        assert_eq!(links[0]["bytes_sent"].as_f64(), Some(sent));
        assert_eq!(links[0]["bytes_received"].as_f64(), Some(received));
        let kinds = j["collectives"].as_array().unwrap();
        let kind = |k: &str| {
            kinds
                .iter()
                .find(|c| c["kind"] == k)
                .unwrap_or_else(|| panic!("{k}: {j}"))
        };
        assert_eq!(kind("send")["bytes"].as_f64(), Some(sent));
        assert_eq!(
            kind("send")["latency_ns"]["count"].as_u64(),
            Some(sampled(mine.len()) as u64)
        );
        assert!(kind("send")["latency_ns"]["p50"].as_u64().unwrap() > 0);
        if allreduce {
            assert_eq!(kind("allreduce")["calls"], 3);
            assert_eq!(kind("allreduce")["bytes"].as_f64(), Some(ar_bytes));
        }
        assert_eq!(
            j["queue_wait_ns"]["count"].as_u64(),
            Some((sampled(mine.len()) + sampled(theirs.len())) as u64)
        );
        assert_eq!(j["latency_sample_every"], 8);
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn metrics_count_the_bytes_moved() {
    if let Ok(r) = std::env::var(ROLE) {
        let dir = PathBuf::from(std::env::var(DIR).unwrap());
        let allreduce = std::env::var("TELEMETRY_TEST_ALLREDUCE").as_deref() == Ok("1");
        return child(r.parse().unwrap(), &dir, allreduce);
    }
    run("shm", &[], true);
    run("tcp", &[("NCCL_SHM_DISABLE", "1")], false);
}
