//! Host memory that other local processes can map: `ncclMemAlloc` without
//! CUDA returns pages of a `memfd`, mapped shared. A single-node
//! communicator's peers open the file through `/proc/<pid>/fd/<fd>` (the same
//! permission `process_vm_readv` needs), map it once, and then read and
//! write the buffer with plain loads and stores: reductions read the peer's
//! input in place, with no system call and no intermediate copy.
//!
//! Each allocation has a random id, so that a peer never confuses a freed
//! and reallocated buffer (which may reuse the address and the descriptor
//! number) with the one it mapped before.

use std::collections::BTreeMap;
use std::ffi::c_void;

use once_cell::sync::Lazy;
use parking_lot::Mutex;

use crate::error::{Error, Result};

/// One live allocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Region {
    /// Start address in this process.
    pub base: usize,
    /// Length in bytes (the mapping's length).
    pub len: usize,
    /// The memfd backing it (-1: private memory no peer can map).
    pub fd: i32,
    /// A random id, unique per allocation.
    pub id: u64,
}

static REGIONS: Lazy<Mutex<BTreeMap<usize, Region>>> = Lazy::new(|| Mutex::new(BTreeMap::new()));

fn random_id() -> u64 {
    let mut b = [0u8; 8];
    if getrandom::getrandom(&mut b).is_err() {
        // Uniqueness within the process is what matters; time and address
        // are a fine fallback.
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        return t | 1;
    }
    u64::from_ne_bytes(b).max(1)
}

/// Maps `len` zeroed bytes: a shared `memfd` mapping when the kernel allows
/// it, else a private anonymous one. The caller checked `len`.
pub fn alloc(len: usize) -> Result<*mut c_void> {
    // SAFETY: a NUL-terminated name and valid flags.
    let fd = unsafe { libc::memfd_create(c"hetccl-buf".as_ptr(), libc::MFD_CLOEXEC) };
    // SAFETY: fd is open when >= 0.
    let fd = if fd >= 0 && unsafe { libc::ftruncate(fd, len as libc::off_t) } != 0 {
        // SAFETY: fd is open.
        unsafe { libc::close(fd) };
        -1
    } else {
        fd
    };
    let (flags, map_fd) = if fd >= 0 {
        (libc::MAP_SHARED, fd)
    } else {
        (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1)
    };
    // SAFETY: a new mapping with no address hint.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            flags,
            map_fd,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        let e = Error::last_os(&format!("mmap of {len} bytes"));
        if fd >= 0 {
            // SAFETY: fd is open.
            unsafe { libc::close(fd) };
        }
        return Err(e);
    }
    if fd >= 0 {
        // SAFETY: the shared mapping just made.
        unsafe { prefault(p, len) };
    }
    let r = Region {
        base: p as usize,
        len,
        fd,
        id: random_id(),
    };
    REGIONS.lock().insert(r.base, r);
    Ok(p)
}

/// Fills the page tables of the shared mapping `[p, p + len)` for writing
/// now (`MADV_POPULATE_WRITE`, Linux 5.14; older kernels fault lazily).
/// Peers reach these buffers through mappings of their own: without this,
/// every process takes a page fault per 4 KiB page the first time an
/// operation touches it, which at 1 MiB costs more than the copy itself
/// (ranks rotate through windows of large buffers, as nccl-tests does).
///
/// # Safety
/// `[p, p + len)` must be a shared mapping of this process; the advice
/// changes no contents (the pages are file pages, zero or already written).
pub unsafe fn prefault(p: *mut c_void, len: usize) {
    // SAFETY: see the function's contract.
    let rc = unsafe { libc::madvise(p, len, libc::MADV_POPULATE_WRITE) };
    if rc != 0 {
        tracing::debug!(target: "hetccl::ALLOC",
            "MADV_POPULATE_WRITE of {len} B: {}", std::io::Error::last_os_error());
    }
}

/// Unmaps an allocation made by [`alloc`] that starts at `p`.
///
/// # Safety
/// Nothing may use the memory afterwards.
pub unsafe fn free(p: *mut c_void) -> Result<()> {
    let r = REGIONS
        .lock()
        .remove(&(p as usize))
        .ok_or_else(|| Error::arg(format!("{p:p} was not allocated by ncclMemAlloc")))?;
    // SAFETY: exactly the mapping made by `alloc`, removed from the registry
    // above so it cannot be unmapped twice.
    let rc = unsafe { libc::munmap(p, r.len) };
    if r.fd >= 0 {
        // SAFETY: the descriptor `alloc` kept open.
        unsafe { libc::close(r.fd) };
    }
    if rc != 0 {
        return Err(Error::last_os("munmap"));
    }
    Ok(())
}

/// The allocation that holds all of `[addr, addr + len)`, if any.
pub fn find(addr: usize, len: usize) -> Option<Region> {
    let regions = REGIONS.lock();
    let (_, r) = regions.range(..=addr).next_back()?;
    (addr.checked_add(len)? <= r.base + r.len).then_some(*r)
}

/// The length of the allocation that starts at `p`, if any.
pub fn size_of(p: *const c_void) -> Option<usize> {
    REGIONS.lock().get(&(p as usize)).map(|r| r.len)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn regions_are_found_by_any_inner_range_and_freed_once() {
        let p = alloc(3 * 4096).unwrap();
        let base = p as usize;
        let r = find(base + 100, 4096).unwrap();
        assert_eq!((r.base, r.len), (base, 3 * 4096));
        assert!(r.fd >= 0, "memfd available on this kernel");
        assert!(find(base + 2 * 4096, 4097).is_none(), "runs past the end");
        assert_eq!(size_of(p), Some(3 * 4096));
        let q = alloc(4096).unwrap();
        assert_ne!(find(q as usize, 1).unwrap().id, r.id);
        // SAFETY: allocated above, not used afterwards.
        unsafe {
            free(p).unwrap();
            assert!(free(p).is_err());
            free(q).unwrap();
        }
        assert!(find(base, 1).is_none());
    }

    /// The resident size in KiB of the mapping that starts at `base`, from
    /// /proc/self/smaps (pages this process has page-table entries for).
    fn rss_kib(base: usize) -> usize {
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let mut lines = smaps.lines();
        let head = format!("{base:x}-");
        lines
            .find(|l| l.starts_with(&head))
            .expect("mapping listed");
        let rss = lines.find(|l| l.starts_with("Rss:")).unwrap();
        rss.split_whitespace().nth(1).unwrap().parse().unwrap()
    }

    #[test]
    fn allocations_are_prefaulted() {
        let len = 1 << 20;
        let p = alloc(len).unwrap();
        assert_eq!(rss_kib(p as usize), len >> 10, "every page mapped at once");
        // SAFETY: allocated above, not used afterwards.
        unsafe { free(p).unwrap() };
    }
}
