//! `ncclMemAlloc` / `ncclMemFree`.
//!
//! With the CUDA driver present (see [`crate::gpu::driver`]), `ncclMemAlloc`
//! returns device memory from `cuMemAlloc` in the caller's current context,
//! as NCCL does. Without it, allocations are page-aligned host pages of a
//! `memfd` mapped shared (`crate::intranode::region`), which the other ranks of
//! a single-node communicator can map to reduce from in place. Both kinds are
//! recorded in registries, so that `ncclMemFree` rejects pointers it did not
//! hand out instead of corrupting the heap.

use std::collections::HashMap;
use std::ffi::c_void;

use hetccl_abi::ncclResult_t;
use once_cell::sync::Lazy;
use parking_lot::Mutex;

use super::check;
use super::guard::guard;
use crate::error::{Error, Result};
use crate::export;

/// The largest single allocation accepted (1 TiB): bigger is surely garbage.
const MAX_ALLOC: usize = 1 << 40;

/// Live device allocations: address -> length.
static DEVICE_ALLOCS: Lazy<Mutex<HashMap<usize, usize>>> = Lazy::new(|| Mutex::new(HashMap::new()));

/// Device memory from `cuMemAlloc` (CUDA present), recorded for [`free_any`].
pub fn alloc_device(size: usize) -> Result<*mut c_void> {
    if size == 0 || size > MAX_ALLOC {
        return Err(Error::arg(format!(
            "size {size} is not in (0, {MAX_ALLOC}]"
        )));
    }
    let p = crate::gpu::driver::mem_alloc(size)?;
    DEVICE_ALLOCS.lock().insert(p as usize, size);
    tracing::debug!(target: "hetccl::ALLOC", "ncclMemAlloc {size} device bytes at {p:p}");
    Ok(p)
}

/// Frees memory from [`alloc_device`] or [`alloc_host`].
///
/// # Safety
/// Nothing may use the memory at `p` afterwards.
pub unsafe fn free_any(p: *mut c_void) -> Result<()> {
    let device = DEVICE_ALLOCS.lock().remove(&(p as usize)).is_some();
    let r = if device {
        // SAFETY: from cuMemAlloc, removed from the registry above.
        unsafe { crate::gpu::driver::mem_free(p) }
    } else {
        // SAFETY: per the contract.
        unsafe { free_host(p) }
    };
    // The addresses may come back as another kind of memory.
    crate::gpu::memory::forget_all();
    r
}

/// Allocates `size` bytes of zeroed, page-aligned host memory.
pub fn alloc_host(size: usize) -> Result<*mut c_void> {
    if size == 0 || size > MAX_ALLOC {
        return Err(Error::arg(format!(
            "size {size} is not in (0, {MAX_ALLOC}]"
        )));
    }
    let p = crate::intranode::region::alloc(size)?;
    tracing::debug!(target: "hetccl::ALLOC", "ncclMemAlloc {size} bytes at {p:p}");
    // Registered once for verbs links (when verbs is in use).
    nccl_net_plugin::ib::register_user(p as usize, size);
    Ok(p)
}

/// Frees memory from [`alloc_host`]. Unknown pointers are an error.
///
/// # Safety
/// Nothing may use the memory at `p` afterwards.
pub unsafe fn free_host(p: *mut c_void) -> Result<()> {
    if let Some(size) = allocation_size(p) {
        nccl_net_plugin::ib::unregister_user(p as usize, size);
    }
    // SAFETY: per the contract.
    unsafe { crate::intranode::region::free(p) }
}

/// The size of the live allocation starting at `p`, if any.
pub fn allocation_size(p: *const c_void) -> Option<usize> {
    crate::intranode::region::size_of(p)
}

export! {
    /// Allocates `size` bytes for use as communication buffers: device
    /// memory when the CUDA driver is present, else host memory.
    fn ncclMemAlloc / pncclMemAlloc(ptr: *mut *mut c_void, size: usize) -> ncclResult_t {
        guard("ncclMemAlloc", || {
            check::non_null(ptr, "ptr")?;
            let p = if crate::gpu::driver::available() {
                alloc_device(size)?
            } else {
                alloc_host(size)?
            };
            // SAFETY: checked non-NULL; the caller passes a writable pointer slot.
            unsafe { *ptr = p };
            Ok(())
        })
    }
}

export! {
    /// Frees memory from `ncclMemAlloc`. NULL is a no-op, as with `free`.
    fn ncclMemFree / pncclMemFree(ptr: *mut c_void) -> ncclResult_t {
        guard("ncclMemFree", || {
            if ptr.is_null() {
                return Ok(());
            }
            // SAFETY: the caller gives the memory back.
            unsafe { free_any(ptr) }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alloc_free_and_misuse() {
        let mut p: *mut c_void = std::ptr::null_mut();
        // SAFETY: a writable pointer slot.
        assert_eq!(unsafe { ncclMemAlloc(&mut p, 10_000) }, 0);
        assert!(!p.is_null());
        assert_eq!(p as usize % 4096, 0);
        assert_eq!(allocation_size(p), Some(10_000));
        // SAFETY: 10_000 writable bytes were just allocated.
        unsafe { std::ptr::write_bytes(p as *mut u8, 7, 10_000) };
        // SAFETY: a writable pointer slot.
        assert_eq!(unsafe { ncclMemAlloc(&mut p, 0) }, 4);
        // SAFETY: NULL, which the function refuses (or, for ncclMemFree, accepts as NCCL does).
        assert_eq!(unsafe { ncclMemAlloc(std::ptr::null_mut(), 8) }, 4);
        // SAFETY: `p` came from ncclMemAlloc (the second free is refused).
        assert_eq!(unsafe { ncclMemFree(p) }, 0);
        // SAFETY: `p` came from ncclMemAlloc (the second free is refused).
        assert_eq!(unsafe { ncclMemFree(p) }, 4, "double free is refused");
        let mut x = 0u64;
        // SAFETY: a pointer hetccl never handed out, which the function must refuse without
        // freeing.
        assert_eq!(unsafe { ncclMemFree(&mut x as *mut u64 as *mut c_void) }, 4);
        // SAFETY: NULL, which the function refuses (or, for ncclMemFree, accepts as NCCL does).
        assert_eq!(unsafe { ncclMemFree(std::ptr::null_mut()) }, 0);
    }
}
