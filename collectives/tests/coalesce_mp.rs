//! Coalescing conformance (`HETCCL_COALESCE_BYTES`): three ranks, one
//! process each (this test binary run again as each rank), exchange groups
//! of point-to-point messages of many sizes (0 B, 1 B, odd sizes, sizes at
//! and around the per-message limit, large ones that travel alone), to the
//! same and to other peers, interleaved, and every byte must arrive at the
//! receive posted for it, in order. Also: a receiver that takes one
//! sender's group in two groups, and the other way round (sub-messages of
//! a pack wait for the next group).
//!
//! Layouts: over TCP (each rank its own `HETCCL_HOST_ID`) and over shm,
//! with coalescing off (`0`), small (`1K`: messages of up to 128 B are
//! packed, into packs of at most 1 KiB) and at its default (64 KiB). The
//! ranks' metrics (`hetcclCommGetStats`) must show packs exactly where
//! they are expected: a group of 64 sends of 64 B to one peer travels as
//! one pack over TCP with the default, and nothing is packed over shm or
//! with coalescing off. Ranks whose settings differ turn it off, with a
//! warning, and still exchange every message exactly.

use std::ffi::c_char;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::ptr::null_mut;
use std::time::{Duration, Instant};

use hetccl_abi::ncclComm_t;
use hetccl_collectives::api::coll::{ncclRecv, ncclSend};
use hetccl_collectives::api::comm_init::ncclCommInitRank;
use hetccl_collectives::api::comm_life::ncclCommDestroy;
use hetccl_collectives::api::ext::hetcclCommGetStats;
use hetccl_collectives::api::group::{ncclGroupEnd, ncclGroupStart};
use hetccl_testkit::{ranks, threads::check};

const ROLE: &str = "COALESCE_TEST_RANK";
const DIR: &str = "COALESCE_TEST_DIR";
/// What the rank expects of the packs: `none`, `small` (1K) or `default`.
const EXPECT: &str = "COALESCE_TEST_EXPECT";
const TEST: &str = "coalesced_messages_keep_boundaries_order_and_bytes";
const NRANKS: usize = 3;
const INT8: i32 = 0;

/// The sizes of the messages every rank sends to every peer, in order.
const SIZES: [usize; 24] = [
    0, 1, 3, 64, 127, 128, 129, 0, 1000, 1021, 5, 8191, 8192, 8193, 1, 70_001, 7, 61, 61, 61, 61,
    200, 0, 2,
];

/// Byte `k` of message `i` from `from` to `to`.
fn byte(from: usize, to: usize, i: usize, k: usize) -> u8 {
    (k as u8)
        .wrapping_mul(13)
        .wrapping_add((from * 7 + to * 3 + i * 11) as u8)
}

fn message(from: usize, to: usize, i: usize, len: usize) -> Vec<u8> {
    (0..len).map(|k| byte(from, to, i, k)).collect()
}

fn stats(c: ncclComm_t) -> serde_json::Value {
    let mut needed = 0usize;
    // SAFETY: a live communicator; NULL buffer with length 0 asks the size.
    check(unsafe { hetcclCommGetStats(c, null_mut(), 0, &mut needed) });
    let mut buf = vec![0 as c_char; needed + 1];
    // SAFETY: `buf` holds `buf.len()` writable bytes.
    check(unsafe { hetcclCommGetStats(c, buf.as_mut_ptr(), buf.len(), null_mut()) });
    let bytes: Vec<u8> = buf[..needed].iter().map(|&b| b as u8).collect();
    serde_json::from_slice(&bytes).expect("hetcclCommGetStats returns JSON")
}

/// `(packs_sent, messages_sent)` on the link to `peer`.
fn link(c: ncclComm_t, peer: usize) -> (u64, u64) {
    let j = stats(c);
    let l = j["links"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["peer"] == peer)
        .unwrap_or_else(|| panic!("no link to {peer}: {j}"))
        .clone();
    (
        l["packs_sent"].as_u64().unwrap(),
        l["messages_sent"].as_u64().unwrap(),
    )
}

/// One send or receive of a group.
enum Op<'a> {
    Send(&'a [u8], usize),
    Recv(&'a mut [u8], usize),
}

fn group(c: ncclComm_t, ops: Vec<Op<'_>>) {
    // SAFETY: buffers this rank owns for the whole group; host memory.
    unsafe {
        check(ncclGroupStart());
        for op in ops {
            match op {
                Op::Send(b, to) => check(ncclSend(
                    b.as_ptr().cast(),
                    b.len(),
                    INT8,
                    to as i32,
                    c,
                    null_mut(),
                )),
                Op::Recv(b, from) => check(ncclRecv(
                    b.as_mut_ptr().cast(),
                    b.len(),
                    INT8,
                    from as i32,
                    c,
                    null_mut(),
                )),
            }
        }
        check(ncclGroupEnd());
    }
}

/// Every message to and from every peer in one group, sends and receives
/// interleaved and the peers in a rank-dependent order.
fn all_sizes(c: ncclComm_t, me: usize) {
    let peers: Vec<usize> = (1..NRANKS).map(|d| (me + d) % NRANKS).collect();
    let out: Vec<Vec<Vec<u8>>> = (0..NRANKS)
        .map(|to| {
            SIZES
                .iter()
                .enumerate()
                .map(|(i, &n)| message(me, to, i, n))
                .collect()
        })
        .collect();
    let mut inb: Vec<Vec<Vec<u8>>> = (0..NRANKS)
        .map(|_| SIZES.iter().map(|&n| vec![0u8; n]).collect())
        .collect();
    let mut ops = Vec::new();
    let mut slots: Vec<std::slice::IterMut<'_, Vec<u8>>> =
        inb.iter_mut().map(|v| v.iter_mut()).collect();
    for i in 0..SIZES.len() {
        for (k, &p) in peers.iter().enumerate() {
            let recv = Op::Recv(slots[p].next().unwrap(), p);
            let send = Op::Send(out[p].get(i).expect("one per size"), p);
            if (i + k + me) % 2 == 0 {
                ops.extend([send, recv]);
            } else {
                ops.extend([recv, send]);
            }
        }
    }
    group(c, ops);
    for &p in &peers {
        for (i, &n) in SIZES.iter().enumerate() {
            assert!(
                inb[p][i] == message(p, me, i, n),
                "rank {me}: message {i} ({n} B) from rank {p} is wrong"
            );
        }
    }
}

/// Ten small messages from rank 0 to rank 1: sent in one group and
/// received in two, then sent in two and received in one.
fn regrouped(c: ncclComm_t, me: usize) {
    let n = |i: usize| 10 + 7 * i;
    for round in 0..2 {
        let split_sender = round == 1;
        match me {
            0 => {
                let msgs: Vec<Vec<u8>> = (0..10).map(|i| message(0, 1, 100 + i, n(i))).collect();
                let ops = |r: std::ops::Range<usize>| {
                    r.map(|i| Op::Send(&msgs[i], 1)).collect::<Vec<_>>()
                };
                if split_sender {
                    group(c, ops(0..5));
                    group(c, ops(5..10));
                } else {
                    group(c, ops(0..10));
                }
            }
            1 => {
                let mut bufs: Vec<Vec<u8>> = (0..10).map(|i| vec![0u8; n(i)]).collect();
                if split_sender {
                    group(c, bufs.iter_mut().map(|b| Op::Recv(b, 0)).collect());
                } else {
                    let (a, b) = bufs.split_at_mut(5);
                    group(c, a.iter_mut().map(|b| Op::Recv(b, 0)).collect());
                    group(c, b.iter_mut().map(|b| Op::Recv(b, 0)).collect());
                }
                for (i, b) in bufs.iter().enumerate() {
                    assert!(*b == message(0, 1, 100 + i, n(i)), "regrouped message {i}");
                }
            }
            _ => {}
        }
    }
}

/// 64 sends of 64 B from rank 0 to rank 1 in one group; the packs rank 0
/// sent for them.
fn burst(c: ncclComm_t, me: usize) -> Option<u64> {
    match me {
        0 => {
            let msgs: Vec<Vec<u8>> = (0..64).map(|i| message(0, 1, 200 + i, 64)).collect();
            let before = link(c, 1);
            group(c, msgs.iter().map(|m| Op::Send(m, 1)).collect());
            let after = link(c, 1);
            assert_eq!(after.1 - before.1, 64, "messages counted per send");
            Some(after.0 - before.0)
        }
        1 => {
            let mut bufs = vec![vec![0u8; 64]; 64];
            group(c, bufs.iter_mut().map(|b| Op::Recv(b, 0)).collect());
            for (i, b) in bufs.iter().enumerate() {
                assert!(*b == message(0, 1, 200 + i, 64), "burst message {i}");
            }
            None
        }
        _ => None,
    }
}

/// One rank's part.
fn child(me: usize, dir: &Path, expect: &str) {
    let id = hetccl_testkit::ranks::shared_unique_id(dir, me);
    let mut c: ncclComm_t = null_mut();
    // SAFETY: a valid out pointer; rank and size in range.
    check(unsafe { ncclCommInitRank(&mut c, NRANKS as i32, id, me as i32) });
    all_sizes(c, me);
    regrouped(c, me);
    all_sizes(c, me);
    let packs = burst(c, me);
    let total: u64 = (0..NRANKS).filter(|&p| p != me).map(|p| link(c, p).0).sum();
    match expect {
        "none" => assert_eq!(total, 0, "rank {me}: packs sent with coalescing off"),
        _ => assert!(total > 0, "rank {me}: no packs sent"),
    }
    if let Some(packs) = packs {
        let want = match expect {
            "none" => 0,
            // 64 × 64 B fit one 64 KiB pack; at 1K, 14 fit one (12 + 14 × 68).
            "small" => 5,
            _ => 1,
        };
        assert_eq!(packs, want, "packs for 64 sends of 64 B ({expect})");
    }
    // SAFETY: a live communicator, destroyed once.
    check(unsafe { ncclCommDestroy(c) });
    println!("rank {me} ok");
}

/// Runs the three ranks with `env` (per rank) and what they must expect.
fn run(label: &str, env: &dyn Fn(usize) -> Vec<(&'static str, String)>, expect: &str) {
    let dir = std::env::temp_dir().join(format!("hetccl-coalesce-{label}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let exe = std::env::current_exe().unwrap();
    let cmds: Vec<Command> = (0..NRANKS)
        .map(|r| {
            let mut c = Command::new(&exe);
            ranks::clean_env(&mut c);
            c.args(["--exact", TEST, "--nocapture", "--test-threads=1"])
                .env(ROLE, r.to_string())
                .env(DIR, &dir)
                .env(EXPECT, expect)
                .env("NCCL_DEBUG", "WARN")
                .env("HETCCL_SOCKET_IFNAME", "lo")
                .env("HETCCL_TIMEOUT_S", "60");
            for (k, v) in env(r) {
                c.env(k, v);
            }
            c
        })
        .collect();
    let t0 = Instant::now();
    let outs = ranks::run_ranks(cmds, Duration::from_secs(120));
    assert!(
        outs.iter().all(|o| o.ok()),
        "{label}:\n{}",
        ranks::report(&outs, 4000)
    );
    // hetccl logs to stdout, as NCCL does.
    let warning = "HETCCL_COALESCE_BYTES differs between the ranks";
    let warned = outs[0].stdout.contains(warning) || outs[0].stderr.contains(warning);
    assert_eq!(warned, label.contains("mixed"), "{label}: warning");
    eprintln!("[coalesce] {label}: ok in {:?}", t0.elapsed());
    std::fs::remove_dir_all(&dir).unwrap();
}

fn tcp(r: usize) -> Vec<(&'static str, String)> {
    vec![("HETCCL_HOST_ID", format!("node{r}"))]
}

#[test]
fn coalesced_messages_keep_boundaries_order_and_bytes() {
    if let Ok(r) = std::env::var(ROLE) {
        let dir = PathBuf::from(std::env::var(DIR).unwrap());
        return child(r.parse().unwrap(), &dir, &std::env::var(EXPECT).unwrap());
    }
    let with = |base: fn(usize) -> Vec<(&'static str, String)>, bytes: Option<&'static str>| {
        move |r: usize| {
            let mut e = base(r);
            if let Some(b) = bytes {
                e.push(("HETCCL_COALESCE_BYTES", b.to_string()));
            }
            e
        }
    };
    run("tcp default", &with(tcp, None), "default");
    run("tcp 1K", &with(tcp, Some("1K")), "small");
    run("tcp off", &with(tcp, Some("0")), "none");
    run("shm default", &with(|_| Vec::new(), None), "none");
    run("shm off", &with(|_| Vec::new(), Some("0")), "none");
    // Rank 0 says 1K, the others the default: off on every rank.
    run(
        "tcp mixed",
        &|r| {
            let mut e = tcp(r);
            if r == 0 {
                e.push(("HETCCL_COALESCE_BYTES", "1K".to_string()));
            }
            e
        },
        "none",
    );
}
