//! A group's sends and receives queue as runs (one job per run of
//! consecutive point-to-point calls on a communicator), ranks as threads:
//!
//! - runs split messages into the same pieces as a job per call, so a
//!   peer that calls outside any group (a job per call) matches them, at a
//!   chunk size that splits them (`chunk_bytes` 4 KiB);
//! - a collective queued between point-to-point calls on the same
//!   communicator closes the run before it, and every byte of both lands;
//! - `ncclGroupSimulateEnd` estimates every call of a run, not the run once;
//! - the metrics count every call of a run;
//! - a call that joins an open run without a lookup of its own is
//!   checked like any other (same codes and messages), and a send to the
//!   calling rank itself still pairs with its receive.
//!
//! The ranks talk over TCP (`NCCL_SHM_DISABLE=1` for this binary): TCP
//! messages keep their boundaries, so a piece of another size fails,
//! where shared memory's byte stream would let it pass.

use std::ffi::CString;
use std::ptr::null_mut;

use hetccl_abi::{ncclSimInfo_t, NCCL_SIM_INFO_MAGIC};
use hetccl_collectives::api::coll::{ncclAllReduce, ncclRecv, ncclSend};
use hetccl_collectives::api::ext::hetcclCommGetStats;
use hetccl_collectives::api::ext::options::hetcclCommSetOption;
use hetccl_collectives::api::group::{ncclGroupEnd, ncclGroupSimulateEnd, ncclGroupStart};
use hetccl_testkit::threads::{check, comms, destroy, on_all, Comm};

const INT8: i32 = 0;
const FLOAT: i32 = 7;
const SUM: i32 = 0;

/// TCP between the ranks (read when the first communicator is made).
fn tcp() {
    std::env::set_var("NCCL_SHM_DISABLE", "1");
}

fn bytes(seed: usize, n: usize) -> Vec<u8> {
    (0..n)
        .map(|k| (k as u8).wrapping_mul(7).wrapping_add(seed as u8))
        .collect()
}

fn set_chunk(c: Comm, v: &str) {
    let (k, v) = (
        CString::new("chunk_bytes").unwrap(),
        CString::new(v).unwrap(),
    );
    // SAFETY: a live communicator and NUL-terminated strings.
    check(unsafe { hetcclCommSetOption(c.0, k.as_ptr(), v.as_ptr()) });
}

fn send(buf: &[u8], peer: usize, c: Comm) {
    // SAFETY: `buf` outlives the call (blocking, or its group's end).
    check(unsafe {
        ncclSend(
            buf.as_ptr().cast(),
            buf.len(),
            INT8,
            peer as i32,
            c.0,
            null_mut(),
        )
    });
}

fn recv(buf: &mut [u8], peer: usize, c: Comm) {
    // SAFETY: `buf` outlives the call (blocking, or its group's end).
    check(unsafe {
        ncclRecv(
            buf.as_mut_ptr().cast(),
            buf.len(),
            INT8,
            peer as i32,
            c.0,
            null_mut(),
        )
    });
}

fn allreduce(x: &mut [f32], c: Comm) {
    let p = x.as_mut_ptr();
    // SAFETY: in place; `x` outlives the call.
    check(unsafe { ncclAllReduce(p.cast(), p.cast(), x.len(), FLOAT, SUM, c.0, null_mut()) });
}

/// Sizes around the 4 KiB pieces: 0, under, at, over, several pieces.
const SIZES: [usize; 6] = [0, 100, 4096, 4097, 10_000, 3];

#[test]
fn runs_match_a_job_per_call_and_yield_to_collectives() {
    tcp();
    let cs = comms(3);
    // A collective call: every rank at once.
    on_all(&cs, |_, c| set_chunk(c, "4K"));
    let outs = on_all(&cs, |r, c| {
        let mut x = vec![r as f32 + 1.0; 1000];
        let mine: Vec<Vec<u8>> = SIZES
            .iter()
            .enumerate()
            .map(|(i, &n)| bytes(r * 10 + i, n))
            .collect();
        let mut got: Vec<Vec<u8>> = SIZES.iter().map(|&n| vec![0xEE; n]).collect();
        let mut from2 = vec![0xEE; 9000];
        match r {
            0 => {
                // One group: half the sends, the AllReduce, the other half,
                // and a receive from rank 2.
                // SAFETY: no arguments.
                check(unsafe { ncclGroupStart() });
                for m in &mine[..3] {
                    send(m, 1, c);
                }
                allreduce(&mut x, c);
                for m in &mine[3..] {
                    send(m, 1, c);
                }
                recv(&mut from2, 2, c);
                // SAFETY: no arguments.
                check(unsafe { ncclGroupEnd() });
            }
            1 => {
                // Outside any group: a job per call, in the same order. (The
                // AllReduce in a group of its own: a single-node collective
                // outside a group takes the direct path, the others' plan.)
                for g in &mut got[..3] {
                    recv(g, 0, c);
                }
                // SAFETY: no arguments.
                check(unsafe { ncclGroupStart() });
                allreduce(&mut x, c);
                // SAFETY: no arguments.
                check(unsafe { ncclGroupEnd() });
                for g in &mut got[3..] {
                    recv(g, 0, c);
                }
            }
            _ => {
                let out = bytes(99, 9000);
                // SAFETY: no arguments.
                check(unsafe { ncclGroupStart() });
                allreduce(&mut x, c);
                send(&out, 0, c);
                // SAFETY: no arguments.
                check(unsafe { ncclGroupEnd() });
            }
        }
        (x, got, from2)
    });
    for (r, (x, got, from2)) in outs.iter().enumerate() {
        assert!(x.iter().all(|&v| v == 6.0), "rank {r}: AllReduce result");
        if r == 1 {
            for (i, g) in got.iter().enumerate() {
                assert_eq!(
                    *g,
                    bytes(i, SIZES[i]),
                    "message {i} ({} B) from rank 0",
                    SIZES[i]
                );
            }
        }
        if r == 0 {
            assert_eq!(*from2, bytes(99, 9000), "rank 2's message to rank 0");
        }
    }
    // Every call of rank 0's run is counted once.
    let sends = stats_calls(cs[0], "send");
    assert_eq!(sends, SIZES.len() as u64, "rank 0's counted sends");
    destroy(cs);
}

/// The calls of kind `kind` (`send`, `allreduce`) in `c`'s metrics.
fn stats_calls(c: Comm, kind: &str) -> u64 {
    let mut needed = 0usize;
    // SAFETY: a live communicator; a NULL buffer with length 0 asks the size.
    unsafe { hetcclCommGetStats(c.0, null_mut(), 0, &mut needed) };
    let mut buf = vec![0u8; needed + 1];
    // SAFETY: `buf` holds `needed + 1` bytes.
    check(unsafe { hetcclCommGetStats(c.0, buf.as_mut_ptr().cast(), buf.len(), &mut needed) });
    let text = std::str::from_utf8(&buf).unwrap().trim_end_matches('\0');
    let v: serde_json::Value = serde_json::from_str(text).unwrap();
    v["collectives"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["kind"] == kind)
        .and_then(|c| c["calls"].as_u64())
        .unwrap_or_else(|| panic!("no {kind} calls in {v}"))
}

#[test]
fn the_simulated_time_counts_every_call_of_a_run() {
    tcp();
    let cs = comms(2);
    let out = vec![1u8; 1 << 16];
    let sim = |n: usize| {
        let mut si = ncclSimInfo_t {
            size: std::mem::size_of::<ncclSimInfo_t>(),
            magic: NCCL_SIM_INFO_MAGIC,
            version: 23203,
            estimatedTime: -1.0,
        };
        // SAFETY: no arguments.
        check(unsafe { ncclGroupStart() });
        for _ in 0..n {
            send(&out, 1, cs[0]);
        }
        // SAFETY: `si` is a valid, initialised ncclSimInfo_t.
        check(unsafe { ncclGroupSimulateEnd(&mut si) });
        si.estimatedTime
    };
    let (one, three) = (sim(1), sim(3));
    assert!(one > 0.0, "one send: {one}");
    assert!(
        (three - 3.0 * one).abs() <= 1e-3 * three,
        "three sends {three} µs, one {one} µs"
    );
    destroy(cs);
}

/// `ncclSend` on `c` of `count` elements of `buf` (NULL when `None`);
/// its result and the last error.
fn raw_send(buf: Option<&[u8]>, count: usize, dtype: i32, peer: i32, c: Comm) -> (i32, String) {
    let p = buf.map_or(std::ptr::null(), |b| b.as_ptr());
    // SAFETY: a live communicator; `buf` is NULL or holds `count` bytes
    // until the group ends.
    let rc = unsafe { ncclSend(p.cast(), count, dtype, peer, c.0, null_mut()) };
    (rc, hetccl_testkit::threads::last_error())
}

#[test]
fn a_call_that_joins_a_run_is_checked_like_any_other() {
    tcp();
    let cs = comms(2);
    let good = bytes(5, 100);
    let bad: [(Option<&[u8]>, usize, i32, i32); 3] = [
        (Some(&good), 100, INT8, 7), // peer out of range
        (Some(&good), 100, 99, 1),   // no such datatype
        (None, 100, INT8, 1),        // NULL buffer with bytes to send
    ];
    // Each bad call on its own (no run open), then the same calls after a
    // send opened rank 0's run: the same codes and messages.
    let alone: Vec<(i32, String)> = bad
        .iter()
        .map(|&(b, n, d, p)| raw_send(b, n, d, p, cs[0]))
        .collect();
    let outs = on_all(&cs, |r, c| {
        let mut got = vec![0u8; 100];
        let mut mine = vec![0u8; 100];
        let mut errors = Vec::new();
        // SAFETY: no arguments.
        check(unsafe { ncclGroupStart() });
        if r == 0 {
            send(&good, 1, c);
            for &(b, n, d, p) in &bad {
                errors.push(raw_send(b, n, d, p, c));
            }
            // To itself: not a run's call, paired with its receive.
            send(&good, 0, c);
            recv(&mut mine, 0, c);
        } else {
            recv(&mut got, 0, c);
        }
        // SAFETY: no arguments.
        check(unsafe { ncclGroupEnd() });
        (got, mine, errors)
    });
    assert_eq!(outs[0].2, alone, "errors inside a run and alone");
    for (rc, msg) in &alone {
        assert_eq!(*rc, 4, "ncclInvalidArgument: {msg}");
    }
    assert_eq!(outs[1].0, good, "the run's message");
    assert_eq!(outs[0].1, good, "the send to itself");
    destroy(cs);
}
