//! The direct paths (`collectives/src/direct`): board slots for small
//! operations and single-copy reads for large ones, on 2–4 ranks as threads,
//! every kind they serve, in and out of place, several ops, with exact
//! results, and a check that each path really ran.

use std::ffi::CStr;
use std::ptr::null_mut;

use hetccl_collectives::api::coll::*;
use hetccl_collectives::api::comm_life::*;
use hetccl_collectives::api::redop::ncclRedOpCreatePreMulSum;

const INT32: i32 = 2;
const FLOAT: i32 = 7;
const SUM: i32 = 0;
const PROD: i32 = 1;
const MAX: i32 = 2;
const AVG: i32 = 4;

use hetccl_testkit::threads::{check, comms, on_all, Comm};

/// Rank `r`'s input element `i` (small integers: every sum is exact).
fn val(r: usize, i: usize) -> i32 {
    ((r + 1) * (i % 13)) as i32 - 6
}

/// Element counts: fastbox (1 .. 4096 four-byte elements), plain executor
/// in between, single-copy from 256 KiB.
const COUNTS: [usize; 6] = [1, 3, 1000, 4096, 65536, 100_003];

fn allreduce_family(n: usize, cs: &[Comm]) {
    // 1 Mi elements: the outputs of every rank add up to at least 8 MiB, so
    // single-copy writes them with non-temporal stores.
    for &count in COUNTS.iter().chain(&[1 << 20]) {
        for in_place in [false, true] {
            for (op, name) in [(SUM, "sum"), (MAX, "max"), (PROD, "prod"), (AVG, "avg")] {
                if count == 1 << 20 && op != SUM {
                    continue;
                }
                let errs = on_all(cs, |r, c| {
                    let send: Vec<i32> = (0..count).map(|i| val(r, i)).collect();
                    let mut recv = if in_place {
                        send.clone()
                    } else {
                        vec![0x5a5a; count]
                    };
                    let sp = if in_place {
                        recv.as_ptr()
                    } else {
                        send.as_ptr()
                    };
                    // SAFETY: every pointer passed is NULL where the API allows it, or memory
                    // this test owns for the whole call.
                    check(unsafe {
                        ncclAllReduce(
                            sp.cast(),
                            recv.as_mut_ptr().cast(),
                            count,
                            INT32,
                            op,
                            c.0,
                            null_mut(),
                        )
                    });
                    (0..count).find(|&i| {
                        let xs = (0..n).map(|k| val(k, i) as i64);
                        let want = match op {
                            SUM => xs.sum::<i64>(),
                            MAX => xs.max().unwrap(),
                            PROD => xs.fold(1i64, |a, x| a.wrapping_mul(x)) as i32 as i64,
                            _ => xs.sum::<i64>() / n as i64,
                        };
                        recv[i] as i64 != want
                    })
                });
                assert!(
                    errs.iter().all(Option::is_none),
                    "allreduce n={n} count={count} in_place={in_place} {name}: first bad index per rank {errs:?}"
                );
            }
        }
    }
}

fn scatter_gather_family(n: usize, cs: &[Comm]) {
    // 1 Mi elements: large enough for the non-temporal (streamed) outputs.
    for &count in COUNTS.iter().chain(&[1 << 20]) {
        for in_place in [false, true] {
            let errs = on_all(cs, |r, c| {
                let mut bad = Vec::new();
                // ReduceScatter.
                let send: Vec<i32> = (0..count * n).map(|i| val(r, i)).collect();
                let mut buf = send.clone();
                let mut out = vec![0x5a5a; count];
                let (sp, rp) = if in_place {
                    // SAFETY: every pointer passed is NULL where the API allows it, or memory
                    // this test owns for the whole call.
                    (buf.as_ptr(), unsafe { buf.as_mut_ptr().add(r * count) })
                } else {
                    (send.as_ptr(), out.as_mut_ptr())
                };
                // SAFETY: every pointer passed is NULL where the API allows it, or memory this
                // test owns for the whole call.
                check(unsafe {
                    ncclReduceScatter(sp.cast(), rp.cast(), count, INT32, SUM, c.0, null_mut())
                });
                let got = if in_place {
                    &buf[r * count..(r + 1) * count]
                } else {
                    &out[..]
                };
                if (0..count).any(|i| {
                    got[i] as i64 != (0..n).map(|k| val(k, r * count + i) as i64).sum::<i64>()
                }) {
                    bad.push("reducescatter");
                }
                // AllGather.
                let mine: Vec<i32> = (0..count).map(|i| val(r, i)).collect();
                let mut all = vec![0x5a5a; count * n];
                let sp = if in_place {
                    all[r * count..(r + 1) * count].copy_from_slice(&mine);
                    // SAFETY: every pointer passed is NULL where the API allows it, or memory
                    // this test owns for the whole call.
                    unsafe { all.as_ptr().add(r * count) }
                } else {
                    mine.as_ptr()
                };
                // SAFETY: every pointer passed is NULL where the API allows it, or memory this
                // test owns for the whole call.
                check(unsafe {
                    ncclAllGather(
                        sp.cast(),
                        all.as_mut_ptr().cast(),
                        count,
                        INT32,
                        c.0,
                        null_mut(),
                    )
                });
                if (0..count * n).any(|i| all[i] != val(i / count, i % count)) {
                    bad.push("allgather");
                }
                // Broadcast from the last rank.
                let root = n - 1;
                let src: Vec<i32> = (0..count).map(|i| val(root, i)).collect();
                let mut b = if in_place && r == root {
                    src.clone()
                } else {
                    vec![0x5a5a; count]
                };
                let sp = if in_place { b.as_ptr() } else { src.as_ptr() };
                // SAFETY: every pointer passed is NULL where the API allows it, or memory this
                // test owns for the whole call.
                check(unsafe {
                    ncclBroadcast(
                        sp.cast(),
                        b.as_mut_ptr().cast(),
                        count,
                        INT32,
                        root as i32,
                        c.0,
                        null_mut(),
                    )
                });
                if b != src {
                    bad.push("broadcast");
                }
                // Reduce (max) to rank 0.
                let mut red = vec![0x5a5a; count];
                // SAFETY: every pointer passed is NULL where the API allows it, or memory this
                // test owns for the whole call.
                check(unsafe {
                    ncclReduce(
                        mine.as_ptr().cast(),
                        red.as_mut_ptr().cast(),
                        count,
                        INT32,
                        MAX,
                        0,
                        c.0,
                        null_mut(),
                    )
                });
                if r == 0 && (0..count).any(|i| red[i] != (0..n).map(|k| val(k, i)).max().unwrap())
                {
                    bad.push("reduce");
                }
                bad
            });
            for (r, e) in errs.iter().enumerate() {
                assert!(
                    e.is_empty(),
                    "n={n} count={count} in_place={in_place} rank {r}: {e:?}"
                );
            }
        }
    }
}

fn premulsum_float(n: usize, cs: &[Comm]) {
    // 1 Mi elements: the streamed fold, with each rank's own scalar.
    for &count in &[5usize, 70_000, 1 << 20] {
        let errs = on_all(cs, |r, c| {
            let mut op = 0i32;
            // Scalars differ per rank, as NCCL allows: each rank's input is
            // multiplied by its own.
            let scalar = (r + 1) as f32;
            // SAFETY: every pointer passed is NULL where the API allows it, or memory this test
            // owns for the whole call.
            check(unsafe {
                ncclRedOpCreatePreMulSum(
                    &mut op,
                    (&scalar as *const f32).cast_mut().cast(),
                    FLOAT,
                    0,
                    c.0,
                )
            });
            let send: Vec<f32> = (0..count).map(|i| val(r, i) as f32).collect();
            let mut recv = vec![0f32; count];
            // SAFETY: every pointer passed is NULL where the API allows it, or memory this test
            // owns for the whole call.
            check(unsafe {
                ncclAllReduce(
                    send.as_ptr().cast(),
                    recv.as_mut_ptr().cast(),
                    count,
                    FLOAT,
                    op,
                    c.0,
                    null_mut(),
                )
            });
            (0..count).find(|&i| {
                recv[i]
                    != (0..n)
                        .map(|k| (k + 1) as f32 * val(k, i) as f32)
                        .sum::<f32>()
            })
        });
        assert!(
            errs.iter().all(Option::is_none),
            "premulsum n={n} count={count}: {errs:?}"
        );
    }
}

#[test]
fn direct_paths_give_exact_results_on_2_3_and_4_ranks() {
    for n in [2usize, 3, 4] {
        let cs = comms(n);
        allreduce_family(n, &cs);
        scatter_gather_family(n, &cs);
        premulsum_float(n, &cs);
        // How often each path ran on rank 0.
        let comm = hetccl_collectives::comm::handle::lookup(cs[0].0).unwrap();
        let node = comm
            .engine()
            .unwrap()
            .intranode
            .as_ref()
            .expect("direct paths");
        let (fast, copy) = (node.fast_ops(), node.copy_ops());
        assert!(fast > 50, "n={n}: the board path ran {fast} times");
        assert!(copy > 20, "n={n}: the single-copy path ran {copy} times");
        drop(comm);
        for c in cs {
            // SAFETY: every pointer passed is NULL where the API allows it, or memory this test
            // owns for the whole call.
            check(unsafe { ncclCommDestroy(c.0) });
        }
    }
}

#[test]
fn the_selection_table_lists_the_direct_paths() {
    let cs = comms(2);
    on_all(&cs, |_, c| {
        let send = vec![1f32; 1 << 17];
        let mut recv = vec![0f32; 1 << 17];
        // SAFETY: every pointer passed is NULL where the API allows it, or memory this test owns
        // for the whole call.
        check(unsafe {
            ncclAllReduce(
                send.as_ptr().cast(),
                recv.as_mut_ptr().cast(),
                1 << 17,
                FLOAT,
                SUM,
                c.0,
                null_mut(),
            )
        });
        assert!(recv.iter().all(|&v| v == 2.0));
    });
    let mut buf = vec![0 as std::ffi::c_char; 1 << 16];
    // SAFETY: every pointer passed is NULL where the API allows it, or memory this test owns for
    // the whole call.
    check(unsafe {
        hetccl_collectives::api::ext::hetcclCommSelectionTable(
            cs[0].0,
            buf.as_mut_ptr(),
            buf.len(),
            null_mut(),
        )
    });
    // SAFETY: every pointer passed is NULL where the API allows it, or memory this test owns for
    // the whole call.
    let text = unsafe { CStr::from_ptr(buf.as_ptr()) }
        .to_string_lossy()
        .into_owned();
    assert!(text.contains("board slots"), "{text}");
    assert!(
        text.contains(
            "single-copy from 32768 B (HETCCL_COPY_MIN_BYTES; AllGather, ReduceScatter from "
        ),
        "{text}"
    );
    assert!(text.contains(" B), available"), "{text}");
    for c in cs {
        // SAFETY: every pointer passed is NULL where the API allows it, or memory this test owns
        // for the whole call.
        check(unsafe { ncclCommDestroy(c.0) });
    }
}

/// A call's own `algSelection` (ncclCollConfig_t) replaces NCCL_ALGO for
/// that call: "ring" keeps a small AllReduce off the board slots, and the
/// result is still exact; an unknown name is ignored (the call runs).
#[test]
fn a_calls_alg_selection_is_honoured() {
    let cs = comms(2);
    let node_ops = |c: Comm| {
        let comm = hetccl_collectives::comm::handle::lookup(c.0).unwrap();
        let ops = comm
            .engine()
            .unwrap()
            .intranode
            .as_ref()
            .unwrap()
            .fast_ops();
        ops
    };
    let mut before = node_ops(cs[0]);
    for (sel, via_board) in [(c"ring", false), (c"no-such-algo", true), (c"nvls", true)] {
        on_all(&cs, |r, c| {
            let cfg = hetccl_abi::ncclCollConfig_t {
                size: std::mem::size_of::<hetccl_abi::ncclCollConfig_t>(),
                magic: hetccl_abi::NCCL_API_MAGIC,
                version: 23203,
                ext: null_mut(),
                minCTAs: hetccl_abi::NCCL_CONFIG_UNDEF_INT,
                maxCTAs: hetccl_abi::NCCL_CONFIG_UNDEF_INT,
                nvlsCTAs: hetccl_abi::NCCL_CONFIG_UNDEF_INT,
                cgaClusterSize: hetccl_abi::NCCL_CONFIG_UNDEF_INT,
                algSelection: sel.as_ptr(),
                forceAlgSelection: 1,
                CTAPolicy: hetccl_abi::NCCL_CONFIG_UNDEF_INT,
                userProfilerTag: 0,
                launchCompletionEvent: null_mut(),
            };
            let send = vec![r as i32 + 1; 64];
            let mut recv = vec![0i32; 64];
            // SAFETY: every pointer passed is NULL where the API allows it, or memory this test
            // owns for the whole call.
            check(unsafe {
                ncclAllReduceConfig(
                    send.as_ptr().cast(),
                    recv.as_mut_ptr().cast(),
                    64,
                    INT32,
                    SUM,
                    c.0,
                    null_mut(),
                    &cfg,
                )
            });
            assert!(recv.iter().all(|&v| v == 3), "{sel:?}");
        });
        let after = node_ops(cs[0]);
        assert_eq!(
            after > before,
            via_board,
            "{sel:?}: board ops {before} -> {after}"
        );
        before = after;
    }
    for c in cs {
        // SAFETY: every pointer passed is NULL where the API allows it, or memory this test owns
        // for the whole call.
        check(unsafe { ncclCommDestroy(c.0) });
    }
}

/// Byte `i` of broadcast `op`'s data (from its root).
fn bcast_byte(op: usize, i: usize) -> u8 {
    (op * 31 + i * 7 + 1) as u8
}

/// Many broadcasts back to back, with roots and sizes that change (runs of
/// more than the ring's slots from one root among them, so the roots wait
/// for full rings), in place and not, interleaved with allreduces: every
/// byte of every output is checked, on 2, 3 and 4 ranks.
#[test]
fn back_to_back_broadcasts_interleave_with_allreduces() {
    use hetccl_collectives::intranode::board::RING_SLOTS;
    const OPS: usize = 400;
    // Bytes: 1 up to the slot size (16 KiB).
    const SIZES: [usize; 7] = [1, 8, 13, 256, 1000, 4099, 16 << 10];
    for n in [2usize, 3, 4] {
        let cs = comms(n);
        let errs = on_all(&cs, |r, c| {
            let mut bad = Vec::new();
            let mut buf = vec![0u8; 16 << 10];
            let mut src = vec![0u8; 16 << 10];
            for op in 0..OPS {
                let allreduce = if op < OPS / 2 {
                    op % 5 == 4
                } else {
                    op % 100 == 99
                };
                if allreduce {
                    // An allreduce of 3 int32 between the broadcasts.
                    let x: Vec<i32> = (0..3).map(|i| val(r, i + op)).collect();
                    let mut y = [0i32; 3];
                    // SAFETY: buffers of 3 elements this test owns.
                    check(unsafe {
                        ncclAllReduce(
                            x.as_ptr().cast(),
                            y.as_mut_ptr().cast(),
                            3,
                            INT32,
                            SUM,
                            c.0,
                            null_mut(),
                        )
                    });
                    let want: Vec<i32> = (0..3)
                        .map(|i| (0..n).map(|k| val(k, i + op)).sum())
                        .collect();
                    if y[..] != want[..] {
                        bad.push(format!("op {op}: allreduce {y:?} != {want:?}"));
                    }
                    continue;
                }
                // Roots change every op in the first half; the second half
                // runs more broadcasts from one root than its ring holds,
                // then the next root.
                let root = if op < OPS / 2 {
                    (op * 7 / 3) % n
                } else {
                    (op / (RING_SLOTS + 8)) % n
                };
                let len = SIZES[(op * 5) % SIZES.len()];
                let in_place = op % 3 == 0;
                for (i, b) in src[..len].iter_mut().enumerate() {
                    *b = bcast_byte(op, i);
                }
                buf.fill(0xa5);
                if r != root && op % 7 == r {
                    // A receiver falls behind now and then, in the second
                    // half by more than the root's ring holds.
                    let us = if op < OPS / 2 { 300 } else { 5000 };
                    std::thread::sleep(std::time::Duration::from_micros(us));
                }
                let sp = if r == root && in_place {
                    buf[..len].copy_from_slice(&src[..len]);
                    buf.as_ptr()
                } else if r == root {
                    src.as_ptr()
                } else {
                    // Receivers' send buffers are not read.
                    buf.as_ptr()
                };
                // SAFETY: buffers of at least `len` bytes this test owns.
                check(unsafe {
                    ncclBroadcast(
                        sp.cast(),
                        buf.as_mut_ptr().cast(),
                        len,
                        0, // int8
                        root as i32,
                        c.0,
                        null_mut(),
                    )
                });
                if let Some(i) = (0..len).find(|&i| buf[i] != bcast_byte(op, i)) {
                    bad.push(format!("op {op} root {root} len {len}: byte {i} wrong"));
                }
                if buf[len..].iter().any(|&b| b != 0xa5) {
                    bad.push(format!("op {op} root {root} len {len}: wrote past the end"));
                }
            }
            bad
        });
        for (r, e) in errs.iter().enumerate() {
            assert!(e.is_empty(), "n={n} rank {r}: {e:?}");
        }
        let comm = hetccl_collectives::comm::handle::lookup(cs[0].0).unwrap();
        let node = comm
            .engine()
            .unwrap()
            .intranode
            .as_ref()
            .expect("direct paths");
        let ring = node.ring_ops();
        let allreduces = OPS / 2 / 5 + OPS / 2 / 100;
        assert_eq!(
            ring,
            (OPS - allreduces) as u64,
            "n={n}: broadcasts on the ring"
        );
        drop(comm);
        for c in cs {
            // SAFETY: a communicator from `comms`, destroyed once.
            check(unsafe { ncclCommDestroy(c.0) });
        }
    }
}
