//! Pinned host staging buffers for the stream path, pooled.
//!
//! Each buffer is `cuMemHostAlloc(PORTABLE | DEVICEMAP)` memory: the GPU
//! copies into and out of it on the user's stream, the host engine reads
//! and writes it like any host buffer, and its first [`HEADER`] bytes hold a
//! 32-bit completion flag that a stream can wait on (`cuStreamWaitValue32`).

use std::ffi::c_void;
use std::sync::atomic::{AtomicU32, Ordering};

use once_cell::sync::Lazy;
use parking_lot::Mutex;

use super::driver::{self, cu};
use crate::error::Result;

/// Bytes before the payload: the flag, padded to a cache line.
pub const HEADER: usize = 64;

/// The most idle buffers kept for reuse.
const POOL_MAX: usize = 32;

/// One pinned buffer: `len` payload bytes after the header.
#[derive(Debug)]
pub struct Pinned {
    base: *mut u8,
    len: usize,
}

// SAFETY: pinned host memory owned by this value; any thread may use it.
unsafe impl Send for Pinned {}

/// Idle buffers: (address, payload length).
static POOL: Lazy<Mutex<Vec<(usize, usize)>>> = Lazy::new(|| Mutex::new(Vec::new()));

impl Pinned {
    /// A buffer of at least `len` payload bytes, flag cleared.
    pub fn take(len: usize) -> Result<Pinned> {
        let found = {
            let mut pool = POOL.lock();
            pool.iter()
                .enumerate()
                .filter(|(_, &(_, l))| l >= len)
                .min_by_key(|(_, &(_, l))| l)
                .map(|(i, _)| i)
                .map(|i| pool.swap_remove(i))
        };
        let s = match found {
            Some((base, len)) => Pinned {
                base: base as *mut u8,
                len,
            },
            None => {
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
        let mut pool = POOL.lock();
        if pool.len() < POOL_MAX {
            pool.push((self.base as usize, self.len));
        } else {
            drop(pool);
            // SAFETY: allocated by cuMemHostAlloc and no longer used.
            unsafe { cu::cuMemFreeHost(self.base.cast()) };
        }
    }
}
