//! `ncclCommGetUniqueId` + `ncclCommGrow` with ranks as threads: two
//! existing ranks grow to four (blocking and nonblocking), the grown
//! communicator runs exact collectives on fresh links, and wrong uses get
//! clear errors.

use std::ffi::CStr;
use std::ptr::{null, null_mut};

use hetccl_abi::{ncclComm_t, ncclConfig_t, ncclUniqueId};
use hetccl_collectives::api::coll::ncclAllReduce;
use hetccl_collectives::api::comm_init::{ncclCommGetUniqueId, ncclCommGrow};
use hetccl_collectives::api::comm_life::{ncclCommDestroy, ncclCommGetAsyncError};
use hetccl_collectives::api::version::ncclGetLastError;
use hetccl_testkit::threads::{check, comms, destroy, Comm};

const INT32: i32 = 2;
const SUM: i32 = 0;
const IN_PROGRESS: i32 = 7;

fn last_error() -> String {
    // SAFETY: ncclGetLastError accepts NULL and returns a NUL-terminated
    // string valid until this thread's next call.
    unsafe { CStr::from_ptr(ncclGetLastError(null_mut())) }
        .to_string_lossy()
        .into_owned()
}

/// Waits for a nonblocking communicator to leave ncclInProgress.
fn settle(c: ncclComm_t) {
    let t0 = std::time::Instant::now();
    loop {
        let mut st = IN_PROGRESS;
        // SAFETY: a live handle and a writable result slot.
        check(unsafe { ncclCommGetAsyncError(c, &mut st) });
        if st != IN_PROGRESS {
            check(st);
            return;
        }
        assert!(t0.elapsed().as_secs() < 60, "grow did not finish");
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

/// An AllReduce of `rank + 1` on every rank of `c`; returns the result.
fn allreduce(c: Comm, rank: usize) -> i32 {
    let send = vec![rank as i32 + 1; 300];
    let mut recv = vec![0i32; 300];
    // SAFETY: both buffers hold 300 int32 for the whole call.
    let rc = unsafe {
        ncclAllReduce(
            send.as_ptr().cast(),
            recv.as_mut_ptr().cast(),
            300,
            INT32,
            SUM,
            c.0,
            null_mut(),
        )
    };
    if rc == IN_PROGRESS {
        // A nonblocking communicator finishes the call on its own.
        settle(c.0);
    } else {
        check(rc);
    }
    assert!(recv.iter().all(|&v| v == recv[0]));
    recv[0]
}

/// Grows two existing ranks to four, with `cfg` (NULL: blocking).
fn grow_two_to_four(nonblocking: bool) {
    let old = comms(2);
    let mut id = ncclUniqueId::default();
    // SAFETY: a live handle and a writable id.
    check(unsafe { ncclCommGetUniqueId(old[0].0, &mut id) });
    // A second id before the grow is refused.
    let mut again = ncclUniqueId::default();
    // SAFETY: as above.
    assert_eq!(unsafe { ncclCommGetUniqueId(old[0].0, &mut again) }, 5);
    assert!(
        last_error().contains("has not been consumed"),
        "{}",
        last_error()
    );
    let grown: Vec<Comm> = std::thread::scope(|s| {
        let id = &id;
        let hs: Vec<_> = (0..4)
            .map(|r| {
                let parent = old.get(r).copied();
                s.spawn(move || {
                    let mut cfg = ncclConfig_t {
                        blocking: i32::from(!nonblocking),
                        ..Default::default()
                    };
                    let mut out: ncclComm_t = null_mut();
                    // SAFETY: the id, config and output slot live on this
                    // stack for the whole call; parents are live handles.
                    let rc = unsafe {
                        match parent {
                            Some(p) if r == 0 => ncclCommGrow(p.0, 4, id, -1, &mut out, &mut cfg),
                            Some(p) => ncclCommGrow(p.0, 4, null(), -1, &mut out, &mut cfg),
                            None => ncclCommGrow(null_mut(), 4, id, r as i32, &mut out, &mut cfg),
                        }
                    };
                    if nonblocking {
                        assert!(rc == 0 || rc == IN_PROGRESS, "rank {r}: {rc}");
                        settle(out);
                    } else {
                        check(rc);
                    }
                    Comm(out)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    // Exact on the grown communicator, and the parents still work.
    let sums: Vec<i32> = std::thread::scope(|s| {
        let hs: Vec<_> = grown
            .iter()
            .enumerate()
            .map(|(r, &c)| s.spawn(move || allreduce(c, r)))
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(sums, vec![10; 4]);
    let sums: Vec<i32> = std::thread::scope(|s| {
        let hs: Vec<_> = old
            .iter()
            .enumerate()
            .map(|(r, &c)| s.spawn(move || allreduce(c, r)))
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(sums, vec![3; 2]);
    // The id was consumed: a grow with it again is refused on the root, and
    // the other existing rank, which takes part, learns that no rank passed
    // an id.
    let codes: Vec<(i32, String)> = std::thread::scope(|s| {
        let id = &id;
        let hs: Vec<_> = old
            .iter()
            .enumerate()
            .map(|(r, &c)| {
                s.spawn(move || {
                    let c: Comm = c;
                    let mut out: ncclComm_t = null_mut();
                    let uid = if r == 0 { id as *const _ } else { null() };
                    // SAFETY: live handle, id and output slot.
                    let rc = unsafe { ncclCommGrow(c.0, 4, uid, -1, &mut out, null_mut()) };
                    (rc, last_error())
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(codes[0].0, 5, "{codes:?}");
    assert!(codes[0].1.contains("already consumed"), "{codes:?}");
    assert_eq!(codes[1].0, 5, "{codes:?}");
    destroy(grown);
    destroy(old);
}

#[test]
fn two_ranks_grow_to_four_blocking() {
    grow_two_to_four(false);
}

#[test]
fn two_ranks_grow_to_four_nonblocking() {
    grow_two_to_four(true);
}

#[test]
fn wrong_uses_are_refused() {
    let old = comms(2);
    let mut out: ncclComm_t = null_mut();
    let id = ncclUniqueId::default();
    // An existing rank passing its rank number.
    assert_eq!(
        // SAFETY: live handle and slots; the call must refuse before using them.
        unsafe { ncclCommGrow(old[0].0, 4, null(), 0, &mut out, null_mut()) },
        4
    );
    assert!(last_error().contains("passes rank -1"), "{}", last_error());
    // A new rank without an id.
    assert_eq!(
        // SAFETY: as above.
        unsafe { ncclCommGrow(null_mut(), 4, null(), 2, &mut out, null_mut()) },
        4
    );
    assert!(last_error().contains("uniqueId"), "{}", last_error());
    // A root id that was never issued here: refused on the root, and the
    // other existing rank learns that nobody passed an id.
    let mut foreign = ncclUniqueId::default();
    // SAFETY: a live handle and a writable id.
    check(unsafe { ncclCommGetUniqueId(old[1].0, &mut foreign) });
    let codes: Vec<(i32, String)> = std::thread::scope(|s| {
        let foreign = &foreign;
        let hs: Vec<_> = old
            .iter()
            .enumerate()
            .map(|(r, &c)| {
                s.spawn(move || {
                    let c: Comm = c;
                    let mut out: ncclComm_t = null_mut();
                    let uid = if r == 0 { foreign as *const _ } else { null() };
                    // SAFETY: live handle, id and slot.
                    let rc = unsafe { ncclCommGrow(c.0, 4, uid, -1, &mut out, null_mut()) };
                    (rc, last_error())
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(codes[0].0, 5, "{codes:?}");
    assert!(codes[0].1.contains("not issued"), "{codes:?}");
    assert_eq!(codes[1].0, 5, "{codes:?}");
    assert!(codes[1].1.contains("no existing rank passed"), "{codes:?}");
    // Too few ranks.
    let mut id2 = ncclUniqueId::default();
    // SAFETY: as above.
    assert_eq!(unsafe { ncclCommGetUniqueId(old[0].0, &mut id2) }, 0);
    assert_eq!(
        // SAFETY: as above.
        unsafe { ncclCommGrow(old[0].0, 2, &id2, -1, &mut out, null_mut()) },
        4
    );
    let _ = id;
    for c in old {
        // SAFETY: live handles, destroyed once.
        check(unsafe { ncclCommDestroy(c.0) });
    }
}
