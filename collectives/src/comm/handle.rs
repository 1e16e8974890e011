//! The registry that maps C `ncclComm_t` handles to live [`Comm`]s.
//!
//! A handle is a pointer to a small heap cell holding a magic number and a
//! comm id. Destroying the comm removes the id from the registry and marks the
//! cell dead, but the 16-byte cell itself is never freed, so a stale handle
//! can never alias a newer comm: using a comm after `ncclCommDestroy`, or
//! destroying it twice, is reliably reported as `ncclInvalidArgument`.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use hetccl_abi::ncclComm_t;
use once_cell::sync::Lazy;
use parking_lot::Mutex;

use super::Comm;
use crate::error::{Error, Result};

const LIVE: u64 = 0x6865_7463_636c_434d; // "hetcclCM"
const DEAD: u64 = 0x6465_6164_636f_6d6d; // "deadcomm"

/// The cell a handle points to.
#[repr(C)]
struct Cell {
    magic: AtomicU64,
    id: u64,
    /// The comm's rank and size, which never change: [`rank_and_size`]
    /// answers from here, without touching the comm's reference count.
    rank: usize,
    nranks: usize,
}

static NEXT_ID: AtomicU64 = AtomicU64::new(1);
static LIVE_COMMS: Lazy<Mutex<HashMap<u64, Arc<Comm>>>> = Lazy::new(|| Mutex::new(HashMap::new()));
/// Addresses of every cell ever handed out, so that a pointer we never made is
/// rejected without being dereferenced.
static CELLS: Lazy<Mutex<HashMap<usize, u64>>> = Lazy::new(|| Mutex::new(HashMap::new()));

/// Registers `comm` and returns its new C handle.
pub fn register(comm: Arc<Comm>) -> ncclComm_t {
    let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
    let cell = Box::into_raw(Box::new(Cell {
        magic: AtomicU64::new(LIVE),
        id,
        rank: comm.rank,
        nranks: comm.nranks,
    }));
    CELLS.lock().insert(cell as usize, id);
    LIVE_COMMS.lock().insert(id, comm);
    cell.cast()
}

fn cell_id(handle: ncclComm_t) -> Result<u64> {
    if handle.is_null() {
        return Err(Error::arg("comm is NULL"));
    }
    let id = CELLS
        .lock()
        .get(&(handle as usize))
        .copied()
        .ok_or_else(|| Error::arg(format!("comm {handle:p} is not a communicator handle")))?;
    Ok(id)
}

thread_local! {
    /// The handle this thread looked up last, and its comm: a hit skips both
    /// registry locks (the per-call cost of a training loop's collectives).
    static LAST: RefCell<Option<(usize, Weak<Comm>)>> = const { RefCell::new(None) };
}

/// Whether `handle`, which [`lookup`] resolved before, still names a live
/// communicator (not destroyed since).
///
/// # Safety
/// [`lookup`] resolved `handle` earlier: it points to a cell made by
/// [`register`], which is never freed.
pub unsafe fn still_live(handle: usize) -> bool {
    // SAFETY: see the contract: a cell that is never freed.
    unsafe { (*(handle as *const Cell)).magic.load(Ordering::Acquire) == LIVE }
}

/// The live comm behind `handle`.
pub fn lookup(handle: ncclComm_t) -> Result<Arc<Comm>> {
    let key = handle as usize;
    let hit = LAST.with(|l| match &*l.borrow() {
        Some((h, w)) if *h == key => w.upgrade(),
        _ => None,
    });
    if let Some(comm) = hit {
        // SAFETY: `handle` was in CELLS when it was cached, so it points to
        // a Cell made by `register`, which is never freed.
        if unsafe { (*(handle as *const Cell)).magic.load(Ordering::Acquire) } == LIVE {
            return Ok(comm);
        }
    }
    let id = cell_id(handle)?;
    let comm = LIVE_COMMS
        .lock()
        .get(&id)
        .cloned()
        .ok_or_else(|| Error::arg(format!("comm {handle:p} was already destroyed")))?;
    LAST.with(|l| *l.borrow_mut() = Some((key, Arc::downgrade(&comm))));
    Ok(comm)
}

/// The rank and the size of the live comm behind `handle`. A handle this
/// thread looked up last is answered from its cell alone: no lock and no
/// reference count (`ncclCommCount` and `ncclCommUserRank`, which
/// nccl-tests calls around every send and receive).
pub fn rank_and_size(handle: ncclComm_t) -> Result<(usize, usize)> {
    let key = handle as usize;
    let cached = LAST.with(|l| matches!(&*l.borrow(), Some((h, _)) if *h == key));
    // SAFETY: a cached `handle` was in CELLS when it was cached, so it
    // points to a Cell made by `register`, which is never freed.
    if cached && unsafe { still_live(key) } {
        // SAFETY: as above; `rank` and `nranks` are never written after
        // `register`.
        let cell = unsafe { &*(handle as *const Cell) };
        return Ok((cell.rank, cell.nranks));
    }
    let comm = lookup(handle)?;
    Ok((comm.rank, comm.nranks))
}

/// Removes the comm behind `handle` from the registry and returns it.
pub fn unregister(handle: ncclComm_t) -> Result<Arc<Comm>> {
    let id = cell_id(handle)?;
    let comm = LIVE_COMMS
        .lock()
        .remove(&id)
        .ok_or_else(|| Error::arg(format!("comm {handle:p} was already destroyed")))?;
    // SAFETY: `handle` is in CELLS, so it points to a Cell made by `register`,
    // which is never freed.
    unsafe {
        (*(handle as *const Cell))
            .magic
            .store(DEAD, Ordering::Release)
    };
    Ok(comm)
}

/// The number of live communicators in this process.
pub fn live_count() -> usize {
    LIVE_COMMS.lock().len()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lifecycle_and_stale_handles() {
        let h = register(Arc::new(Comm::new(4, 1)));
        assert_eq!(rank_and_size(h).unwrap(), (1, 4), "first, the full lookup");
        assert_eq!(lookup(h).unwrap().rank, 1);
        assert_eq!(rank_and_size(h).unwrap(), (1, 4), "then, from the cell");
        assert!(unregister(h).is_ok());
        let e = lookup(h).unwrap_err().to_string();
        assert!(e.contains("already destroyed"), "{e}");
        let e = rank_and_size(h).unwrap_err().to_string();
        assert!(e.contains("already destroyed"), "{e}");
        assert!(unregister(h).is_err(), "double destroy is refused");
        let mut x = 0u64;
        assert!(lookup(&mut x as *mut u64 as ncclComm_t).is_err());
        assert!(lookup(std::ptr::null_mut()).is_err());
        let h2 = register(Arc::new(Comm::new(1, 0)));
        assert_ne!(h, h2, "a new comm never reuses a stale handle");
        unregister(h2).unwrap();
    }
}
