//! End-to-end runs of the engine with ranks as threads of this process,
//! through the exported C entry points: init, every collective, groups of
//! point-to-point calls, nonblocking mode, abort.

use std::ffi::CStr;
use std::ptr::null_mut;

use hetccl_abi::{ncclComm_t, ncclConfig_t, ncclUniqueId};
use hetccl_collectives::api::coll::*;
use hetccl_collectives::api::comm_init::*;
use hetccl_collectives::api::comm_life::*;
use hetccl_collectives::api::group::*;
use hetccl_collectives::api::version::ncclGetLastError;

use hetccl_testkit::threads::{check, comms, destroy, on_all, setup, Comm};

const FLOAT: i32 = 7;
const INT32: i32 = 2;
const SUM: i32 = 0;
const MAX: i32 = 2;

#[test]
fn allreduce_sizes_and_ranks() {
    for n in [1usize, 2, 3, 4] {
        let cs = comms(n);
        for count in [0usize, 1, 7, 1021, 300_001] {
            let outs = on_all(&cs, |r, c| {
                let send: Vec<f32> = (0..count).map(|i| (r * 3 + i % 17) as f32).collect();
                let mut recv = vec![-1.0f32; count];
                // SAFETY: every pointer passed is NULL where the API allows it, or memory this
                // test owns for the whole call.
                check(unsafe {
                    ncclAllReduce(
                        send.as_ptr().cast(),
                        recv.as_mut_ptr().cast(),
                        count,
                        FLOAT,
                        SUM,
                        c.0,
                        null_mut(),
                    )
                });
                recv
            });
            for out in outs {
                for (i, v) in out.iter().enumerate() {
                    let want: usize = (0..n).map(|r| r * 3 + i % 17).sum();
                    assert_eq!(*v, want as f32, "n={n} count={count} i={i}");
                }
            }
        }
        destroy(cs);
    }
}

#[test]
fn every_collective_on_three_ranks() {
    let n = 3usize;
    let cs = comms(n);
    let count = 1001usize;
    let results = on_all(&cs, |r, c| {
        let mut errs = Vec::new();
        let send: Vec<i32> = (0..count * n).map(|i| (r * 1000 + i) as i32).collect();
        // Broadcast from root 2.
        let mut b = if r == 2 {
            send[..count].to_vec()
        } else {
            vec![0; count]
        };
        // SAFETY: every pointer passed is NULL where the API allows it, or memory this test owns
        // for the whole call.
        check(unsafe {
            ncclBroadcast(
                b.as_ptr().cast(),
                b.as_mut_ptr().cast(),
                count,
                INT32,
                2,
                c.0,
                null_mut(),
            )
        });
        if b.iter().enumerate().any(|(i, &v)| v != (2000 + i) as i32) {
            errs.push("broadcast");
        }
        // Reduce (max) to root 0.
        let mut red = vec![0i32; count];
        // SAFETY: every pointer passed is NULL where the API allows it, or memory this test owns
        // for the whole call.
        check(unsafe {
            ncclReduce(
                send.as_ptr().cast(),
                red.as_mut_ptr().cast(),
                count,
                INT32,
                MAX,
                0,
                c.0,
                null_mut(),
            )
        });
        if r == 0 && red.iter().enumerate().any(|(i, &v)| v != (2000 + i) as i32) {
            errs.push("reduce");
        }
        // AllGather.
        let mut ag = vec![0i32; count * n];
        // SAFETY: every pointer passed is NULL where the API allows it, or memory this test owns
        // for the whole call.
        check(unsafe {
            ncclAllGather(
                send.as_ptr().cast(),
                ag.as_mut_ptr().cast(),
                count,
                INT32,
                c.0,
                null_mut(),
            )
        });
        if ag
            .iter()
            .enumerate()
            .any(|(i, &v)| v != ((i / count) * 1000 + i % count) as i32)
        {
            errs.push("allgather");
        }
        // ReduceScatter (sum), in place.
        let mut rs = send.clone();
        let base = rs.as_mut_ptr();
        // SAFETY: every pointer passed is NULL where the API allows it, or memory this test owns
        // for the whole call.
        check(unsafe {
            ncclReduceScatter(
                base.cast(),
                base.add(r * count).cast(),
                count,
                INT32,
                SUM,
                c.0,
                null_mut(),
            )
        });
        let want = |i: usize| {
            (0..n)
                .map(|q| (q * 1000 + r * count + i) as i32)
                .sum::<i32>()
        };
        if (0..count).any(|i| rs[r * count + i] != want(i)) {
            errs.push("reducescatter in place");
        }
        // AlltoAll.
        let mut a2a = vec![0i32; count * n];
        // SAFETY: every pointer passed is NULL where the API allows it, or memory this test owns
        // for the whole call.
        check(unsafe {
            ncclAlltoAll(
                send.as_ptr().cast(),
                a2a.as_mut_ptr().cast(),
                count,
                INT32,
                c.0,
                null_mut(),
            )
        });
        if (0..n)
            .any(|p| (0..count).any(|i| a2a[p * count + i] != (p * 1000 + r * count + i) as i32))
        {
            errs.push("alltoall");
        }
        // Gather to root 1, Scatter from root 1.
        let mut g = vec![0i32; count * n];
        // SAFETY: every pointer passed is NULL where the API allows it, or memory this test owns
        // for the whole call.
        check(unsafe {
            ncclGather(
                send.as_ptr().cast(),
                g.as_mut_ptr().cast(),
                count,
                INT32,
                1,
                c.0,
                null_mut(),
            )
        });
        if r == 1
            && g.iter()
                .enumerate()
                .any(|(i, &v)| v != ((i / count) * 1000 + i % count) as i32)
        {
            errs.push("gather");
        }
        let mut sc = vec![0i32; count];
        // SAFETY: every pointer passed is NULL where the API allows it, or memory this test owns
        // for the whole call.
        check(unsafe {
            ncclScatter(
                send.as_ptr().cast(),
                sc.as_mut_ptr().cast(),
                count,
                INT32,
                1,
                c.0,
                null_mut(),
            )
        });
        if sc
            .iter()
            .enumerate()
            .any(|(i, &v)| v != (1000 + r * count + i) as i32)
        {
            errs.push("scatter");
        }
        errs
    });
    for (r, e) in results.iter().enumerate() {
        assert!(e.is_empty(), "rank {r}: {e:?}");
    }
    destroy(cs);
}

#[test]
fn grouped_sendrecv_in_deadlocking_order() {
    let n = 4usize;
    let cs = comms(n);
    let count = 100_000usize;
    let outs = on_all(&cs, |r, c| {
        let send: Vec<i32> = (0..count).map(|i| (r * 7 + i) as i32).collect();
        let mut from_prev = vec![0i32; count];
        let mut from_next = vec![0i32; count];
        let (next, prev) = ((r + 1) % n, (r + n - 1) % n);
        // SAFETY: every pointer passed is NULL where the API allows it, or memory this test owns
        // for the whole call.
        check(unsafe { ncclGroupStart() });
        // Receives first on every rank: deadlocks without group semantics.
        // SAFETY: every pointer passed is NULL where the API allows it, or memory this test owns
        // for the whole call.
        check(unsafe {
            ncclRecv(
                from_prev.as_mut_ptr().cast(),
                count,
                INT32,
                prev as i32,
                c.0,
                null_mut(),
            )
        });
        // SAFETY: every pointer passed is NULL where the API allows it, or memory this test owns
        // for the whole call.
        check(unsafe {
            ncclRecv(
                from_next.as_mut_ptr().cast(),
                count,
                INT32,
                next as i32,
                c.0,
                null_mut(),
            )
        });
        // SAFETY: every pointer passed is NULL where the API allows it, or memory this test owns
        // for the whole call.
        check(unsafe {
            ncclSend(
                send.as_ptr().cast(),
                count,
                INT32,
                next as i32,
                c.0,
                null_mut(),
            )
        });
        // SAFETY: every pointer passed is NULL where the API allows it, or memory this test owns
        // for the whole call.
        check(unsafe {
            ncclSend(
                send.as_ptr().cast(),
                count,
                INT32,
                prev as i32,
                c.0,
                null_mut(),
            )
        });
        // SAFETY: every pointer passed is NULL where the API allows it, or memory this test owns
        // for the whole call.
        check(unsafe { ncclGroupEnd() });
        (from_prev, from_next)
    });
    for (r, (p, x)) in outs.iter().enumerate() {
        let (next, prev) = ((r + 1) % n, (r + n - 1) % n);
        assert!(
            p.iter()
                .enumerate()
                .all(|(i, &v)| v == (prev * 7 + i) as i32),
            "rank {r} from prev"
        );
        assert!(
            x.iter()
                .enumerate()
                .all(|(i, &v)| v == (next * 7 + i) as i32),
            "rank {r} from next"
        );
    }
    destroy(cs);
}

#[test]
fn nonblocking_init_and_allreduce() {
    setup();
    let n = 2usize;
    let mut id = ncclUniqueId::default();
    // SAFETY: every pointer passed is NULL where the API allows it, or memory this test owns for
    // the whole call.
    check(unsafe { ncclGetUniqueId(&mut id) });
    let ok = on_all(&[Comm(null_mut()), Comm(null_mut())], |r, _| {
        let mut cfg = ncclConfig_t {
            blocking: 0,
            ..Default::default()
        };
        let mut c: ncclComm_t = null_mut();
        // SAFETY: every pointer passed is NULL where the API allows it, or memory this test owns
        // for the whole call.
        let rc = unsafe { ncclCommInitRankConfig(&mut c, n as i32, id, r as i32, &mut cfg) };
        assert!(rc == 0 || rc == 7, "init returned {rc}");
        let wait = |c: ncclComm_t| loop {
            let mut st = 7;
            // SAFETY: every pointer passed is NULL where the API allows it, or memory this test
            // owns for the whole call.
            check(unsafe { ncclCommGetAsyncError(c, &mut st) });
            if st != 7 {
                return st;
            }
            std::thread::yield_now();
        };
        assert_eq!(wait(c), 0);
        let send = vec![r as f32 + 1.0; 4096];
        let mut recv = vec![0f32; 4096];
        // SAFETY: every pointer passed is NULL where the API allows it, or memory this test owns
        // for the whole call.
        let rc = unsafe {
            ncclAllReduce(
                send.as_ptr().cast(),
                recv.as_mut_ptr().cast(),
                4096,
                FLOAT,
                SUM,
                c,
                null_mut(),
            )
        };
        assert!(rc == 0 || rc == 7);
        assert_eq!(wait(c), 0);
        let good = recv.iter().all(|&v| v == 3.0);
        // SAFETY: every pointer passed is NULL where the API allows it, or memory this test owns
        // for the whole call.
        check(unsafe { ncclCommDestroy(c) });
        good
    });
    assert!(ok.iter().all(|&g| g));
}

#[test]
fn abort_unblocks_a_pending_call() {
    let cs = comms(2);
    let c0 = cs[0];
    let t = std::time::Instant::now();
    let h = std::thread::spawn(move || {
        let c0 = c0;
        let mut buf = vec![0f32; 16];
        // Rank 1 never joins this allreduce: it can only end by the abort.
        let send = [1f32; 16];
        // SAFETY: every pointer passed is NULL where the API allows it, or memory this test owns
        // for the whole call.
        unsafe {
            ncclAllReduce(
                send.as_ptr().cast(),
                buf.as_mut_ptr().cast(),
                16,
                FLOAT,
                SUM,
                c0.0,
                null_mut(),
            )
        }
    });
    std::thread::sleep(std::time::Duration::from_millis(200));
    // SAFETY: every pointer passed is NULL where the API allows it, or memory this test owns for
    // the whole call.
    check(unsafe { ncclCommAbort(c0.0) });
    let rc = h.join().unwrap();
    assert_ne!(rc, 0, "the blocked call must fail after abort");
    assert!(t.elapsed() < std::time::Duration::from_secs(10));
    // SAFETY: every pointer passed is NULL where the API allows it, or memory this test owns for
    // the whole call.
    check(unsafe { ncclCommDestroy(cs[1].0) });
}

#[test]
fn split_with_nocolor_and_key_order_then_shrink() {
    let n = 4usize;
    let cs = comms(n);
    let res = on_all(&cs, |r, c| {
        // Rank 3 joins no child; ranks 0 and 2 form color 0 ordered by
        // descending rank; rank 1 is alone in color 1.
        let color = match r {
            3 => -1,
            1 => 1,
            _ => 0,
        };
        let mut child: ncclComm_t = null_mut();
        // SAFETY: every pointer passed is NULL where the API allows it, or memory this test owns
        // for the whole call.
        check(unsafe { ncclCommSplit(c.0, color, (n - r) as i32, &mut child, null_mut()) });
        let mut info = (None, None);
        if color >= 0 {
            let (mut cr, mut cn) = (-1, -1);
            // SAFETY: every pointer passed is NULL where the API allows it, or memory this test
            // owns for the whole call.
            check(unsafe { ncclCommUserRank(child, &mut cr) });
            // SAFETY: every pointer passed is NULL where the API allows it, or memory this test
            // owns for the whole call.
            check(unsafe { ncclCommCount(child, &mut cn) });
            let send = [r as i32 + 1; 5];
            let mut recv = [0i32; 5];
            // SAFETY: every pointer passed is NULL where the API allows it, or memory this test
            // owns for the whole call.
            check(unsafe {
                ncclAllReduce(
                    send.as_ptr().cast(),
                    recv.as_mut_ptr().cast(),
                    5,
                    INT32,
                    SUM,
                    child,
                    null_mut(),
                )
            });
            info = (Some((cr, cn)), Some(recv[0]));
            // SAFETY: every pointer passed is NULL where the API allows it, or memory this test
            // owns for the whole call.
            check(unsafe { ncclCommDestroy(child) });
        } else {
            assert!(child.is_null(), "NOCOLOR gives a NULL comm");
        }
        // Shrink without rank 1 (it takes no part).
        let mut shrunk = None;
        if r != 1 {
            let mut ex = [1i32];
            let mut s: ncclComm_t = null_mut();
            // SAFETY: every pointer passed is NULL where the API allows it, or memory this test
            // owns for the whole call.
            check(unsafe { ncclCommShrink(c.0, ex.as_mut_ptr(), 1, &mut s, null_mut(), 0) });
            let (mut sr, mut sn) = (-1, -1);
            // SAFETY: every pointer passed is NULL where the API allows it, or memory this test
            // owns for the whole call.
            check(unsafe { ncclCommUserRank(s, &mut sr) });
            // SAFETY: every pointer passed is NULL where the API allows it, or memory this test
            // owns for the whole call.
            check(unsafe { ncclCommCount(s, &mut sn) });
            let send = [1i32; 3];
            let mut recv = [0i32; 3];
            // SAFETY: every pointer passed is NULL where the API allows it, or memory this test
            // owns for the whole call.
            check(unsafe {
                ncclAllReduce(
                    send.as_ptr().cast(),
                    recv.as_mut_ptr().cast(),
                    3,
                    INT32,
                    SUM,
                    s,
                    null_mut(),
                )
            });
            shrunk = Some((sr, sn, recv[0]));
            // SAFETY: every pointer passed is NULL where the API allows it, or memory this test
            // owns for the whole call.
            check(unsafe { ncclCommDestroy(s) });
        }
        (info, shrunk)
    });
    assert_eq!(
        res[0].0,
        (Some((1, 2)), Some(4)),
        "rank 0: key 4 sorts after rank 2's key 2"
    );
    assert_eq!(res[2].0, (Some((0, 2)), Some(4)));
    assert_eq!(res[1].0, (Some((0, 1)), Some(2)));
    assert_eq!(res[3].0, (None, None));
    assert_eq!(res[0].1, Some((0, 3, 3)));
    assert_eq!(res[2].1, Some((1, 3, 3)));
    assert_eq!(res[3].1, Some((2, 3, 3)));
    destroy(cs);
}

#[test]
fn alltoall_by_grouped_p2p_including_self() {
    // PyTorch's all_to_all_single: a group of sends and receives to every
    // peer, this rank included.
    let n = 3usize;
    let cs = comms(n);
    let count = 1000usize;
    let outs = on_all(&cs, |r, c| {
        let send: Vec<i32> = (0..count * n).map(|i| (r * 100_000 + i) as i32).collect();
        let mut recv = vec![-1i32; count * n];
        // SAFETY: every pointer passed is NULL where the API allows it, or memory this test owns
        // for the whole call.
        check(unsafe { ncclGroupStart() });
        for p in 0..n {
            // SAFETY: every pointer passed is NULL where the API allows it, or memory this test
            // owns for the whole call.
            let s = unsafe { send.as_ptr().add(p * count) };
            // SAFETY: every pointer passed is NULL where the API allows it, or memory this test
            // owns for the whole call.
            let d = unsafe { recv.as_mut_ptr().add(p * count) };
            // SAFETY: every pointer passed is NULL where the API allows it, or memory this test
            // owns for the whole call.
            check(unsafe { ncclSend(s.cast(), count, INT32, p as i32, c.0, null_mut()) });
            // SAFETY: every pointer passed is NULL where the API allows it, or memory this test
            // owns for the whole call.
            check(unsafe { ncclRecv(d.cast(), count, INT32, p as i32, c.0, null_mut()) });
        }
        // SAFETY: every pointer passed is NULL where the API allows it, or memory this test owns
        // for the whole call.
        check(unsafe { ncclGroupEnd() });
        // An unmatched send to self is refused, not hung.
        // SAFETY: every pointer passed is NULL where the API allows it, or memory this test owns
        // for the whole call.
        check(unsafe { ncclGroupStart() });
        // SAFETY: every pointer passed is NULL where the API allows it, or memory this test owns
        // for the whole call.
        check(unsafe { ncclSend(send.as_ptr().cast(), 1, INT32, r as i32, c.0, null_mut()) });
        // SAFETY: every pointer passed is NULL where the API allows it, or memory this test owns
        // for the whole call.
        let rc = unsafe { ncclGroupEnd() };
        (recv, rc)
    });
    for (r, (recv, rc)) in outs.iter().enumerate() {
        for p in 0..n {
            for i in 0..count {
                assert_eq!(
                    recv[p * count + i],
                    (p * 100_000 + r * count + i) as i32,
                    "rank {r} from {p}"
                );
            }
        }
        assert_eq!(*rc, 5, "unmatched self send is ncclInvalidUsage");
    }
    destroy(cs);
}

#[test]
fn in_place_alltoall() {
    let n = 3usize;
    let cs = comms(n);
    let count = 777usize;
    let outs = on_all(&cs, |r, c| {
        let mut buf: Vec<i32> = (0..count * n).map(|i| (r * 100_000 + i) as i32).collect();
        let p = buf.as_mut_ptr();
        // SAFETY: every pointer passed is NULL where the API allows it, or memory this test owns
        // for the whole call.
        check(unsafe { ncclAlltoAll(p.cast(), p.cast(), count, INT32, c.0, null_mut()) });
        buf
    });
    for (r, buf) in outs.iter().enumerate() {
        for p in 0..n {
            for i in 0..count {
                assert_eq!(buf[p * count + i], (p * 100_000 + r * count + i) as i32);
            }
        }
    }
    destroy(cs);
}

#[test]
fn selection_table_and_version_string() {
    use hetccl_collectives::api::ext::*;
    // SAFETY: every pointer passed is NULL where the API allows it, or memory this test owns for
    // the whole call.
    let v = unsafe { CStr::from_ptr(hetcclGetVersionString()) };
    assert!(v.to_str().unwrap().starts_with("hetccl "));
    let cs = comms(2);
    let mut needed = 0usize;
    // SAFETY: every pointer passed is NULL where the API allows it, or memory this test owns for
    // the whole call.
    check(unsafe { hetcclCommSelectionTable(cs[0].0, null_mut(), 0, &mut needed) });
    assert!(needed > 100);
    let mut buf = vec![0 as std::ffi::c_char; needed + 1];
    // SAFETY: every pointer passed is NULL where the API allows it, or memory this test owns for
    // the whole call.
    check(unsafe { hetcclCommSelectionTable(cs[0].0, buf.as_mut_ptr(), buf.len(), null_mut()) });
    // SAFETY: every pointer passed is NULL where the API allows it, or memory this test owns for
    // the whole call.
    let text = unsafe { CStr::from_ptr(buf.as_ptr()) }
        .to_str()
        .unwrap()
        .to_string();
    assert_eq!(text.len(), needed);
    assert!(
        text.contains("allreduce") && text.contains("Ring"),
        "{text}"
    );
    // Truncation keeps the NUL.
    let mut small = [1 as std::ffi::c_char; 8];
    // SAFETY: every pointer passed is NULL where the API allows it, or memory this test owns for
    // the whole call.
    check(unsafe { hetcclCommSelectionTable(cs[0].0, small.as_mut_ptr(), 8, null_mut()) });
    assert_eq!(small[7], 0);
    assert_eq!(
        // SAFETY: every pointer passed is NULL where the API allows it, or memory this test owns
        // for the whole call.
        unsafe { hetcclCommSelectionTable(null_mut(), null_mut(), 0, null_mut()) },
        4
    );
    destroy(cs);
}

#[test]
fn a_failed_operation_poisons_the_communicator() {
    let cs = comms(2);
    let c0 = cs[0];
    let h = std::thread::spawn(move || {
        let c0 = c0;
        let send = [1f32; 1024];
        let mut recv = [0f32; 1024];
        // Rank 1 never joins: it aborts instead, closing its links.
        // SAFETY: every pointer passed is NULL where the API allows it, or memory this test owns
        // for the whole call.
        unsafe {
            ncclAllReduce(
                send.as_ptr().cast(),
                recv.as_mut_ptr().cast(),
                1024,
                FLOAT,
                SUM,
                c0.0,
                null_mut(),
            )
        }
    });
    std::thread::sleep(std::time::Duration::from_millis(200));
    // SAFETY: every pointer passed is NULL where the API allows it, or memory this test owns for
    // the whole call.
    check(unsafe { ncclCommAbort(cs[1].0) });
    let rc = h.join().unwrap();
    assert_eq!(
        rc, 6,
        "the pending call sees the peer's abort as ncclRemoteError"
    );
    // Later calls fail at once instead of reading stray bytes or hanging.
    let t = std::time::Instant::now();
    let send = [1f32; 4];
    let mut recv = [0f32; 4];
    // SAFETY: every pointer passed is NULL where the API allows it, or memory this test owns for
    // the whole call.
    let rc = unsafe {
        ncclAllReduce(
            send.as_ptr().cast(),
            recv.as_mut_ptr().cast(),
            4,
            FLOAT,
            SUM,
            cs[0].0,
            null_mut(),
        )
    };
    assert_eq!(rc, 6);
    assert!(t.elapsed() < std::time::Duration::from_secs(1));
    // SAFETY: every pointer passed is NULL where the API allows it, or memory this test owns for
    // the whole call.
    let msg = unsafe { CStr::from_ptr(ncclGetLastError(null_mut())) }
        .to_string_lossy()
        .into_owned();
    assert!(msg.contains("must be aborted"), "{msg}");
    let mut st = 0;
    // SAFETY: every pointer passed is NULL where the API allows it, or memory this test owns for
    // the whole call.
    check(unsafe { ncclCommGetAsyncError(cs[0].0, &mut st) });
    assert_eq!(st, 6);
    // SAFETY: every pointer passed is NULL where the API allows it, or memory this test owns for
    // the whole call.
    check(unsafe { ncclCommAbort(cs[0].0) });
}

/// Two threads may not use one communicator at once (NCCL forbids it; their
/// operations would be matched with the peers' in an order nobody chose).
/// A second thread entering an operation while the first is inside one,
/// or holds the communicator in an open group, gets ncclInvalidUsage with a
/// message naming the communicator; the first thread's operation is not
/// disturbed and the communicator stays usable.
#[test]
fn a_second_thread_on_a_busy_communicator_is_refused() {
    let cs = comms(2);
    let (c0, c1) = (cs[0], cs[1]);
    let count = 1024usize;
    // An AllReduce of `v` everywhere, optionally alone in a group; `inside`
    // runs after the call was made (before the group ends).
    let allreduce = |c: Comm, v: i32, grouped: bool, inside: &dyn Fn()| -> (i32, Vec<i32>) {
        let send = vec![v; count];
        let mut recv = vec![0i32; count];
        if grouped {
            // SAFETY: every pointer passed is NULL where the API allows it, or memory this test
            // owns for the whole call.
            check(unsafe { ncclGroupStart() });
        }
        // SAFETY: every pointer passed is NULL where the API allows it, or memory this test owns
        // for the whole call.
        let rc = unsafe {
            ncclAllReduce(
                send.as_ptr().cast(),
                recv.as_mut_ptr().cast(),
                count,
                INT32,
                SUM,
                c.0,
                null_mut(),
            )
        };
        inside();
        if grouped {
            // SAFETY: every pointer passed is NULL where the API allows it, or memory this test
            // owns for the whole call.
            check(unsafe { ncclGroupEnd() });
        }
        (rc, recv)
    };
    let last_error = || {
        // SAFETY: every pointer passed is NULL where the API allows it, or memory this test owns
        // for the whole call.
        unsafe { CStr::from_ptr(ncclGetLastError(null_mut())) }
            .to_string_lossy()
            .into_owned()
    };
    for grouped in [false, true] {
        std::thread::scope(|s| {
            let (entered_tx, entered_rx) = std::sync::mpsc::channel();
            let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
            let go_rx = std::sync::Mutex::new(go_rx);
            // Thread X on rank 0: inside an AllReduce that rank 1 has not
            // joined yet, or holding the comm in an open group.
            let x = s.spawn(move || {
                if !grouped {
                    entered_tx.send(()).unwrap();
                }
                allreduce(c0, 1, grouped, &|| {
                    if grouped {
                        entered_tx.send(()).unwrap();
                        go_rx.lock().unwrap().recv().unwrap();
                    }
                })
            });
            entered_rx.recv().unwrap();
            std::thread::sleep(std::time::Duration::from_millis(300));
            // Thread Y on rank 0 meanwhile.
            let (rc, msg) = s
                .spawn(move || {
                    let (rc, _) = allreduce(c0, 100, false, &|| {});
                    (rc, last_error())
                })
                .join()
                .unwrap();
            assert_eq!(
                rc, 5,
                "grouped {grouped}: want ncclInvalidUsage, got {rc}: {msg}"
            );
            assert!(
                msg.contains("in use by another thread") && msg.contains("communicator "),
                "grouped {grouped}: {msg}"
            );
            // Rank 1 joins (grouped like rank 0: a lone collective takes
            // another path inside a group than outside); thread X's
            // operation completes with its own data.
            let r1 = s.spawn(move || allreduce(c1, 2, grouped, &|| {}));
            go_tx.send(()).unwrap();
            for (who, (rc, out)) in [("X", x.join().unwrap()), ("rank 1", r1.join().unwrap())] {
                assert_eq!(rc, 0, "grouped {grouped}: {who}");
                assert!(
                    out.iter().all(|&v| v == 3),
                    "grouped {grouped}: {who}: {:?}",
                    &out[..4]
                );
            }
        });
    }
    // Used one thread at a time again, from any thread, it works.
    let outs = on_all(&cs, |r, c| allreduce(c, r as i32 + 1, false, &|| {}));
    for (rc, out) in outs {
        assert_eq!(rc, 0);
        assert!(out.iter().all(|&v| v == 3));
    }
    destroy(cs);
}
