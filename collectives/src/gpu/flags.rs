//! Batch flags: 32-bit words in device-mapped pinned memory that a user's
//! stream waits on (`cuStreamWaitValue32`) until the proxy sets them.
//!
//! CUDA's programming guide says a page-locked host memory allocation
//! keeps commands issued before and after it on different streams from
//! running concurrently: one made while a stream waits on a flag could
//! keep the proxy's later work behind that wait. So flags come from slabs
//! of [`PER_SLAB`], allocated at safe points only ([`super::safe`]) and
//! kept for the life of the process; a flag goes back to its slab's free
//! list when its batch is done. When none is free and no safe point can be
//! had, [`Flag::take`] returns `None` and the caller's thread waits for the
//! batch instead of its stream.

use std::sync::atomic::{AtomicU32, Ordering};

use parking_lot::Mutex;

use super::driver::{self, cu};
use super::safe;
use crate::error::Result;

/// Bytes per flag (a cache line each).
const SLOT: usize = 64;

/// Flags per slab.
pub const PER_SLAB: usize = 256;

/// Free flags: (host address, device address).
static FREE: Mutex<Vec<(usize, u64)>> = Mutex::new(Vec::new());

/// One flag, cleared when taken.
#[derive(Debug)]
pub struct Flag {
    host: usize,
    dev: u64,
}

impl Flag {
    /// A free flag, cleared; a new slab (in the current context) if none is
    /// free and no batch is in flight; `None` otherwise.
    pub fn take() -> Result<Option<Flag>> {
        if FREE.lock().is_empty() {
            match safe::at_safe_point(grow) {
                Some(r) => r?,
                None => return Ok(None),
            }
        }
        let Some((host, dev)) = FREE.lock().pop() else {
            return Ok(None);
        };
        let f = Flag { host, dev };
        f.word().store(0, Ordering::Release);
        Ok(Some(f))
    }

    /// The flag's word.
    pub fn word(&self) -> &AtomicU32 {
        // SAFETY: a SLOT-aligned slot of a slab that is never freed.
        unsafe { &*(self.host as *const AtomicU32) }
    }

    /// The flag's address as the device sees it.
    pub fn device_ptr(&self) -> cu::CUdeviceptr {
        self.dev
    }
}

impl Drop for Flag {
    fn drop(&mut self) {
        FREE.lock().push((self.host, self.dev));
    }
}

/// Allocates one slab and frees its flags. Called at a safe point.
fn grow() -> Result<()> {
    let mut p: *mut std::ffi::c_void = std::ptr::null_mut();
    let flags = cu::CU_MEMHOSTALLOC_PORTABLE | cu::CU_MEMHOSTALLOC_DEVICEMAP;
    driver::check(
        // SAFETY: a writable slot; the size is non-zero.
        unsafe { cu::cuMemHostAlloc(&mut p, SLOT * PER_SLAB, flags) },
        "cuMemHostAlloc (flags)",
    )?;
    let mut d: cu::CUdeviceptr = 0;
    driver::check(
        // SAFETY: the DEVICEMAP allocation just made and a writable slot.
        unsafe { cu::cuMemHostGetDevicePointer_v2(&mut d, p, 0) },
        "cuMemHostGetDevicePointer",
    )?;
    tracing::debug!(target: "hetccl::ALLOC", "{PER_SLAB} batch flags allocated");
    let base = p as usize;
    FREE.lock().extend(
        (0..PER_SLAB)
            .rev()
            .map(|i| (base + i * SLOT, d + (i * SLOT) as u64)),
    );
    Ok(())
}
