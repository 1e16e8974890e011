//! Pinned host staging buffers for the stream path, pooled.
//!
//! Each buffer is `cuMemHostAlloc(PORTABLE | DEVICEMAP)` memory: the GPU
//! copies into and out of it on the proxy's stream and the host engine
//! reads and writes it like any host buffer; the payload starts after a
//! [`HEADER`].
//!
//! Neither allocation nor free is made while a stream may wait on a flag
//! the proxy has yet to set: `cuMemFreeHost` waits for the device, and
//! CUDA's programming guide says a page-locked allocation keeps commands
//! issued before and after it on different streams from running
//! concurrently. So a dropped buffer always goes back to the pool, and a
//! buffer is allocated only at a safe point ([`super::safe`]). A
//! [`Pinned::take`] that finds no idle buffer while batches are in flight
//! gets ordinary (pageable) host memory, which the copies also take,
//! synchronously, and the size is remembered: the next safe point
//! allocates a pinned buffer for it. At safe points the pool is also
//! trimmed to [`POOL_MAX`] buffers (the most recently used).

use std::alloc::{self, Layout};
use std::ffi::c_void;

use once_cell::sync::Lazy;
use parking_lot::Mutex;

use super::driver::{self, cu};
use super::safe;
use crate::error::{Error, Result};

/// Bytes before the payload (a cache line).
pub const HEADER: usize = 64;

/// The most idle buffers a trim keeps.
pub const POOL_MAX: usize = 32;

/// One staging buffer: `len` payload bytes after the header.
#[derive(Debug)]
pub struct Pinned {
    base: *mut u8,
    len: usize,
    /// The context current at the allocation (its free is made there);
    /// 0 for pageable memory from the heap.
    ctx: usize,
}

// SAFETY: host memory owned by this value; any thread may use it.
unsafe impl Send for Pinned {}

/// An idle buffer.
struct Idle {
    base: usize,
    len: usize,
    ctx: usize,
}

/// Idle buffers, the most recently returned last.
static POOL: Lazy<Mutex<Vec<Idle>>> = Lazy::new(|| Mutex::new(Vec::new()));

/// Sizes that got pageable memory, with the context current then: the next
/// safe point allocates pinned buffers for them.
static MISSED: Mutex<Vec<(usize, usize)>> = Mutex::new(Vec::new());

/// The heap layout of a pageable buffer of `len` payload bytes.
fn heap_layout(len: usize) -> Layout {
    Layout::from_size_align(HEADER + len, HEADER).expect("staging buffer layout")
}

/// A new pinned buffer in the current context. Call at a safe point.
fn alloc_pinned(len: usize) -> Result<Pinned> {
    let ctx = driver::current_context()? as usize;
    if ctx == 0 {
        return Err(Error::Internal(
            "no CUDA context for a staging buffer".into(),
        ));
    }
    let mut p: *mut c_void = std::ptr::null_mut();
    let flags = cu::CU_MEMHOSTALLOC_PORTABLE | cu::CU_MEMHOSTALLOC_DEVICEMAP;
    driver::check(
        // SAFETY: a writable slot; a context is current (the caller's).
        unsafe { cu::cuMemHostAlloc(&mut p, HEADER + len, flags) },
        "cuMemHostAlloc (staging)",
    )?;
    Ok(Pinned {
        base: p.cast(),
        len,
        ctx,
    })
}

impl Pinned {
    /// A buffer of at least `len` payload bytes: the smallest idle one that
    /// fits, else a new pinned one at a safe point, else pageable memory.
    pub fn take(len: usize) -> Result<Pinned> {
        let len = len.max(1);
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
        if let Some(e) = found {
            return Ok(Pinned {
                base: e.base as *mut u8,
                len: e.len,
                ctx: e.ctx,
            });
        }
        if let Some(r) = safe::at_safe_point(|| alloc_pinned(len)) {
            return r;
        }
        let ctx = driver::current_context()? as usize;
        MISSED.lock().push((len, ctx));
        // SAFETY: a non-zero size.
        let p = unsafe { alloc::alloc(heap_layout(len)) };
        if p.is_null() {
            return Err(Error::System(
                format!("out of memory for a {len}-byte staging buffer").into(),
            ));
        }
        Ok(Pinned {
            base: p,
            len,
            ctx: 0,
        })
    }

    /// The payload's start.
    pub fn payload(&self) -> *mut u8 {
        // SAFETY: the allocation holds HEADER + len bytes.
        unsafe { self.base.add(HEADER) }
    }

    /// Whether this is pinned memory (not a pageable fallback).
    pub fn is_pinned(&self) -> bool {
        self.ctx != 0
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        if !self.is_pinned() {
            // SAFETY: allocated in take with this layout; no copy uses it
            // (the proxy synchronises its stream before dropping it).
            unsafe { alloc::dealloc(self.base, heap_layout(self.len)) };
            return;
        }
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

/// Makes `ctx` current (NULL: leaves it), for a call at a safe point.
fn switch(ctx: usize) {
    if ctx != 0 {
        // SAFETY: the context a buffer was allocated in, or was current at
        // a take (retained by its owner while hetccl works on its streams).
        let _ = unsafe { driver::set_current(ctx as cu::CUcontext) };
    }
}

/// Allocates pinned buffers for the sizes that got pageable memory (the
/// largest [`POOL_MAX`]), then frees the idle buffers beyond [`POOL_MAX`],
/// the least recently used first. Called at safe points only
/// ([`super::safe`]).
pub(super) fn trim() {
    let mut missed = std::mem::take(&mut *MISSED.lock());
    let old: Vec<Idle> = {
        let mut pool = POOL.lock();
        let have = pool.len();
        let extra = (have + missed.len().min(POOL_MAX)).saturating_sub(POOL_MAX);
        pool.drain(..extra.min(have)).collect()
    };
    if old.is_empty() && missed.is_empty() {
        return;
    }
    let prev = driver::current_context().ok();
    if !old.is_empty() {
        tracing::debug!(target: "hetccl::ALLOC", "freeing {} idle pinned staging buffers", old.len());
    }
    for e in old {
        switch(e.ctx);
        // SAFETY: allocated by cuMemHostAlloc; idle in the pool, so unused.
        unsafe { cu::cuMemFreeHost(e.base as *mut c_void) };
    }
    missed.sort_unstable_by_key(|m| std::cmp::Reverse(m.0));
    missed.truncate(POOL_MAX);
    if !missed.is_empty() {
        tracing::debug!(target: "hetccl::ALLOC", "pinning {} staging buffers that were pageable", missed.len());
    }
    for (len, ctx) in missed {
        switch(ctx);
        if let Ok(b) = alloc_pinned(len) {
            let b = std::mem::ManuallyDrop::new(b);
            POOL.lock().push(Idle {
                base: b.base as usize,
                len: b.len,
                ctx: b.ctx,
            });
        }
    }
    if let Some(c) = prev {
        // SAFETY: the context that was current on entry.
        let _ = unsafe { driver::set_current(c) };
    }
}
