//! `munmap` and `mremap`, exported so that a preloaded `libhetccl.so`
//! sees memory leaving the address space and the verbs registration
//! caches drop it (`nccl_net_plugin::ib::unmap`).
//!
//! Each makes the real system call with `syscall(2)` (no `dlsym`, so no
//! allocation or lock, and no recursion) and, when it succeeded, records
//! the old range: atomics only, so the hooks are async-signal-safe and
//! re-entrant, and cost a process that never uses verbs one atomic add per
//! unmap. Errors come back as libc's: -1 (or `MAP_FAILED`) and `errno`.
//!
//! Scope: callers that bind `munmap`/`mremap` through the dynamic linker
//! reach these when the library is preloaded (or linked first). glibc's
//! own internal calls (`free` of a large chunk) do not, and when the
//! library is `dlopen`ed as a plugin (`RTLD_LOCAL`) libc's definitions
//! come first in the global scope, so the hooks are never called and the
//! caches behave as without them. Defined only on Linux x86-64 and
//! AArch64, where the variadic `mremap` is called with its arguments in
//! the same registers as a fixed-argument function.

use std::ffi::{c_int, c_void};

use nccl_net_plugin::ib::unmap;

/// `munmap(2)`: unmaps, then records the range for the registration caches.
///
/// # Safety
/// As `munmap(2)`: the caller no longer uses the range.
#[no_mangle]
pub unsafe extern "C" fn munmap(addr: *mut c_void, len: usize) -> c_int {
    // SAFETY: the caller's arguments, passed on unchanged.
    let rc = unsafe { libc::syscall(libc::SYS_munmap, addr, len) };
    if rc == 0 {
        unmap::record(addr as usize, len);
    }
    rc as c_int
}

/// `mremap(2)`: remaps, then records the old range (its pages moved or
/// shrank; a cached registration of it no longer describes the mapping).
/// `new_addr` is read only with `MREMAP_FIXED`, as the kernel does.
///
/// # Safety
/// As `mremap(2)`.
#[no_mangle]
pub unsafe extern "C" fn mremap(
    old: *mut c_void,
    old_len: usize,
    new_len: usize,
    flags: c_int,
    new_addr: *mut c_void,
) -> *mut c_void {
    let target = if flags & libc::MREMAP_FIXED != 0 {
        new_addr
    } else {
        std::ptr::null_mut()
    };
    // SAFETY: the caller's arguments, passed on unchanged.
    let rc = unsafe { libc::syscall(libc::SYS_mremap, old, old_len, new_len, flags, target) };
    if rc == -1 {
        return libc::MAP_FAILED;
    }
    if rc as usize != old as usize || new_len < old_len {
        unmap::record(old as usize, old_len);
    }
    if flags & libc::MREMAP_FIXED != 0 {
        // Whatever was mapped at the target was replaced.
        unmap::record(rc as usize, new_len);
    }
    rc as *mut c_void
}
