//! Ranks as threads of the test process, through the exported C entry
//! points: shared by the engine tests that need a few initialised
//! communicators (`collectives/tests/engine_threads.rs`, `direct_paths.rs`,
//! `direct_bounds.rs`).
//!
//! The functions are called through `hetccl_collectives`' Rust paths, so a
//! test binary that links the engine drives the same statics as these
//! helpers.

use std::ffi::CStr;
use std::ptr::null_mut;

use hetccl_abi::{ncclComm_t, ncclUniqueId};
use hetccl_collectives::api::comm_init::{ncclCommInitRank, ncclGetUniqueId};
use hetccl_collectives::api::comm_life::ncclCommDestroy;
use hetccl_collectives::api::version::ncclGetLastError;

/// Loopback bootstrap and a 60 s stall limit for every test of the binary.
pub fn setup() {
    std::env::set_var("HETCCL_SOCKET_IFNAME", "lo");
    std::env::set_var("HETCCL_TIMEOUT_S", "60");
}

/// Panics with `ncclGetLastError`'s text unless `r` is `ncclSuccess`.
pub fn check(r: i32) {
    if r != 0 {
        // SAFETY: ncclGetLastError accepts NULL and returns a NUL-terminated
        // string that stays valid until the next call on this thread.
        let msg = unsafe { CStr::from_ptr(ncclGetLastError(null_mut())) };
        panic!("nccl call failed: {r}: {}", msg.to_string_lossy());
    }
}

/// `ncclGetLastError`'s text on this thread.
pub fn last_error() -> String {
    // SAFETY: ncclGetLastError accepts NULL and returns a NUL-terminated
    // string that stays valid until the next call on this thread.
    unsafe { CStr::from_ptr(ncclGetLastError(null_mut())) }
        .to_string_lossy()
        .into_owned()
}

/// A communicator handle that may cross threads.
#[derive(Clone, Copy)]
pub struct Comm(pub ncclComm_t);
// SAFETY: a handle is an opaque token; the library serialises what each
// call does with the communicator behind it.
unsafe impl Send for Comm {}

/// `n` ranks initialised concurrently, one thread each.
pub fn comms(n: usize) -> Vec<Comm> {
    setup();
    let mut id = ncclUniqueId::default();
    // SAFETY: a valid out pointer.
    check(unsafe { ncclGetUniqueId(&mut id) });
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..n)
            .map(|r| {
                s.spawn(move || {
                    let mut c: ncclComm_t = null_mut();
                    // SAFETY: a valid out pointer; rank and size in range.
                    check(unsafe { ncclCommInitRank(&mut c, n as i32, id, r as i32) });
                    Comm(c)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// Runs `f(rank, comm)` on every rank at once, one thread each.
pub fn on_all<T: Send>(cs: &[Comm], f: impl Fn(usize, Comm) -> T + Sync) -> Vec<T> {
    std::thread::scope(|s| {
        let f = &f;
        let hs: Vec<_> = cs
            .iter()
            .enumerate()
            .map(|(r, &c)| s.spawn(move || f(r, c)))
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// Destroys every communicator.
pub fn destroy(cs: Vec<Comm>) {
    for c in cs {
        // SAFETY: a communicator from `comms`, destroyed once.
        check(unsafe { ncclCommDestroy(c.0) });
    }
}
