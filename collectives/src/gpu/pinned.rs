//! Pinned host staging buffers for the stream path, pooled.
//!
//! Each buffer is `cuMemHostAlloc(PORTABLE | DEVICEMAP)` memory: the GPU
//! copies into and out of it on the user's stream, the host engine reads
//! and writes it like any host buffer, and its first [`HEADER`] bytes hold a
//! 32-bit completion flag that a stream can wait on (`cuStreamWaitValue32`).
//!
//! A dropped buffer always goes back to the pool: `cuMemFreeHost`
//! synchronises with the device, so it is never called while a stream may
//! wait on a flag the proxy has yet to set. The pool is trimmed to
//! [`POOL_MAX`] buffers (the most recently used) at safe points only
//! ([`super::safe`]).

use std::ffi::c_void;
use std::sync::atomic::{AtomicU32, Ordering};

use once_cell::sync::Lazy;
use parking_lot::Mutex;

use super::driver::{self, cu};
use crate::error::Result;

/// Bytes before the payload: the flag, padded to a cache line.
pub const HEADER: usize = 64;

/// The most idle buffers a trim keeps.
pub const POOL_MAX: usize = 32;

/// One pinned buffer: `len` payload bytes after the header.
#[derive(Debug)]
pub struct Pinned {
    base: *mut u8,
    len: usize,
    /// The context current at the allocation (its free is made there).
    ctx: usize,
}

// SAFETY: pinned host memory owned by this value; any thread may use it.
unsafe impl Send for Pinned {}

/// An idle buffer.
struct Idle {
    base: usize,
    len: usize,
    ctx: usize,
}

/// Idle buffers, the most recently returned last.
static POOL: Lazy<Mutex<Vec<Idle>>> = Lazy::new(|| Mutex::new(Vec::new()));

impl Pinned {
    /// A buffer of at least `len` payload bytes, flag cleared: the
    /// smallest idle one that fits, else a new one in the current context
    /// (an allocation does not synchronise).
    pub fn take(len: usize) -> Result<Pinned> {
        let found = {
            let mut pool = POOL.lock();
            let best = pool
                .iter()
                .enumerate()
                .filter(|(_, e)| e.len >= len)
                .min_by_key(|(_, e)| e.len)
                .map(|(i, _)| i);
            best.map(|i| pool.remove(i))
        };
        let s = match found {
            Some(e) => Pinned {
                base: e.base as *mut u8,
                len: e.len,
                ctx: e.ctx,
            },
            None => {
                let ctx = driver::current_context()? as usize;
                let mut p: *mut c_void = std::ptr::null_mut();
                let flags = cu::CU_MEMHOSTALLOC_PORTABLE | cu::CU_MEMHOSTALLOC_DEVICEMAP;
                driver::check(
                    // SAFETY: a writable slot; a context is current (the caller's).
                    unsafe { cu::cuMemHostAlloc(&mut p, HEADER + len.max(1), flags) },
                    "cuMemHostAlloc (staging)",
                )?;
                Pinned {
                    base: p.cast(),
                    len: len.max(1),
                    ctx,
                }
            }
        };
        s.flag().store(0, Ordering::Release);
        Ok(s)
    }

    /// The payload's start.
    pub fn payload(&self) -> *mut u8 {
        // SAFETY: the allocation holds HEADER + len bytes.
        unsafe { self.base.add(HEADER) }
    }

    /// The completion flag.
    pub fn flag(&self) -> &AtomicU32 {
        // SAFETY: the header's first 4 bytes, aligned (page-aligned
        // allocation), live as long as self.
        unsafe { &*(self.base as *const AtomicU32) }
    }

    /// The flag's address as the device sees it.
    pub fn flag_device_ptr(&self) -> Result<cu::CUdeviceptr> {
        let mut d: cu::CUdeviceptr = 0;
        driver::check(
            // SAFETY: a DEVICEMAP allocation and a writable slot.
            unsafe { cu::cuMemHostGetDevicePointer_v2(&mut d, self.base.cast(), 0) },
            "cuMemHostGetDevicePointer",
        )?;
        Ok(d)
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        // Never freed here: see the module's header.
        POOL.lock().push(Idle {
            base: self.base as usize,
            len: self.len,
            ctx: self.ctx,
        });
    }
}

/// How many idle buffers the pool holds.
pub fn pooled() -> usize {
    POOL.lock().len()
}

/// Frees the idle buffers beyond [`POOL_MAX`], the least recently used
/// first. Called at safe points only ([`super::safe`]): `cuMemFreeHost`
/// waits for the device.
pub(super) fn trim() {
    let old: Vec<Idle> = {
        let mut pool = POOL.lock();
        let extra = pool.len().saturating_sub(POOL_MAX);
        pool.drain(..extra).collect()
    };
    if old.is_empty() {
        return;
    }
    tracing::debug!(target: "hetccl::ALLOC", "freeing {} idle pinned staging buffers", old.len());
    let prev = driver::current_context().ok();
    for e in old {
        // SAFETY: the context the buffer was allocated in (retained by its
        // owner while hetccl works on its streams).
        let _ = unsafe { driver::set_current(e.ctx as cu::CUcontext) };
        // SAFETY: allocated by cuMemHostAlloc; idle in the pool, so unused.
        unsafe { cu::cuMemFreeHost(e.base as *mut c_void) };
    }
    if let Some(c) = prev {
        // SAFETY: the context that was current on entry.
        let _ = unsafe { driver::set_current(c) };
    }
}
