//! The revoke scenario shared by the shm and TCP revoke tests
//! (`collectives/tests/revoke*.rs`): ranks as threads, two of them blocked
//! in an AllReduce that the third never joins; the third revokes.

use std::ptr::null_mut;
use std::time::{Duration, Instant};

use hetccl_collectives::api::coll::ncclAllReduce;
use hetccl_collectives::api::comm_life::{
    ncclCommDestroy, ncclCommFinalize, ncclCommGetAsyncError, ncclCommRevoke,
};

use crate::threads::{check, comms, last_error, Comm};

/// What a blocked rank saw.
#[derive(Debug)]
pub struct Blocked {
    /// The AllReduce's return code.
    pub rc: i32,
    /// Its message.
    pub msg: String,
    /// How long after the revoke it returned.
    pub after_revoke: Duration,
}

/// A blocking sum AllReduce of `count` int32 ones on `c`; its return code.
pub fn allreduce(c: Comm, count: usize) -> i32 {
    let send = vec![1i32; count];
    let mut recv = vec![0i32; count];
    // SAFETY: both buffers hold `count` int32 for the whole call.
    unsafe {
        ncclAllReduce(
            send.as_ptr().cast(),
            recv.as_mut_ptr().cast(),
            count,
            2,
            0,
            c.0,
            null_mut(),
        )
    }
}

/// The asynchronous state of `c`.
pub fn async_error(c: Comm) -> i32 {
    let mut st = 0;
    // SAFETY: a live handle and a writable slot.
    check(unsafe { ncclCommGetAsyncError(c.0, &mut st) });
    st
}

/// Waits until `c`'s asynchronous state leaves ncclInProgress (7).
pub fn settle(c: Comm) -> i32 {
    let t0 = Instant::now();
    loop {
        let st = async_error(c);
        if st != 7 || t0.elapsed() > Duration::from_secs(30) {
            return st;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Three ranks; ranks 0 and 1 block in an AllReduce of `count` int32 that
/// rank 2 never joins; after 300 ms rank 2 revokes. Returns what the two
/// blocked ranks saw, and checks the revoking rank's side: the async state
/// goes from in progress to success, finalize is refused, destroy works.
pub fn revoke_reaches_blocked_peers(count: usize) -> Vec<Blocked> {
    let cs = comms(3);
    let revoked_at = std::sync::OnceLock::<Instant>::new();
    let seen: Vec<Blocked> = std::thread::scope(|s| {
        let hs: Vec<_> = [cs[0], cs[1]]
            .into_iter()
            .map(|c| {
                let revoked_at = &revoked_at;
                s.spawn(move || {
                    let c: Comm = c;
                    let rc = allreduce(c, count);
                    let msg = last_error();
                    let after = revoked_at.get().map_or(Duration::ZERO, |t| t.elapsed());
                    Blocked {
                        rc,
                        msg,
                        after_revoke: after,
                    }
                })
            })
            .collect();
        std::thread::sleep(Duration::from_millis(300));
        revoked_at.set(Instant::now()).unwrap();
        // SAFETY: a live handle.
        check(unsafe { ncclCommRevoke(cs[2].0, 0) });
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(settle(cs[2]), 0, "the revoking rank becomes quiescent");
    assert_eq!(
        // SAFETY: a live handle.
        unsafe { ncclCommFinalize(cs[2].0) },
        5,
        "finalize after revoke"
    );
    assert!(
        last_error().contains("after ncclCommRevoke"),
        "{}",
        last_error()
    );
    // The blocked ranks treat their communicator as revoked too.
    for &c in &cs[..2] {
        assert_eq!(settle(c), 0);
        assert_ne!(allreduce(c, 1), 0, "no new operation on a revoked comm");
    }
    for c in cs {
        // SAFETY: live handles, destroyed once.
        check(unsafe { ncclCommDestroy(c.0) });
    }
    seen
}

/// Checks what [`revoke_reaches_blocked_peers`] returned.
pub fn assert_told(seen: &[Blocked], within: Duration) {
    for (r, b) in seen.iter().enumerate() {
        eprintln!(
            "[revoke] peer rank {r}: returned {:?} after the revoke",
            b.after_revoke
        );
        assert_eq!(b.rc, 6, "rank {r}: {b:?}");
        assert!(
            b.msg.contains("rank 2 revoked the communicator"),
            "rank {r}: {b:?}"
        );
        assert!(b.after_revoke < within, "rank {r}: {b:?}");
    }
}

/// Two ranks; rank 0 blocks in an AllReduce of `count` int32 that rank 1
/// never joins, and another thread of rank 0 revokes the communicator.
/// Returns how long the blocked call took to return after the revoke, and
/// its code and message.
pub fn revoke_ends_own_operation(count: usize) -> (Duration, i32, String) {
    let cs = comms(2);
    let revoked_at = std::sync::OnceLock::<Instant>::new();
    let out = std::thread::scope(|s| {
        let revoked_at = &revoked_at;
        let c0 = cs[0];
        let h = s.spawn(move || {
            let c: Comm = c0;
            let rc = allreduce(c, count);
            (
                revoked_at.get().map_or(Duration::ZERO, |t| t.elapsed()),
                rc,
                last_error(),
            )
        });
        std::thread::sleep(Duration::from_millis(300));
        revoked_at.set(Instant::now()).unwrap();
        // SAFETY: a live handle.
        check(unsafe { ncclCommRevoke(cs[0].0, 0) });
        h.join().unwrap()
    });
    assert_eq!(settle(cs[0]), 0);
    assert_eq!(settle(cs[1]), 0, "rank 1 learns of the revoke");
    for c in cs {
        // SAFETY: live handles, destroyed once.
        check(unsafe { ncclCommDestroy(c.0) });
    }
    out
}
