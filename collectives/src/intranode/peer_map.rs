//! Direct views of peers' buffers for the single-copy path: a peer in this
//! process is addressed as it is; a peer process's buffer from
//! `ncclMemAlloc` (a `memfd`, see [`super::region`]) is mapped here once,
//! through `/proc/<pid>/fd/<fd>`, and kept in a small cache keyed by the
//! allocation's random id. Anything else goes through
//! `process_vm_readv`/`writev` (the caller's fallback).

use std::sync::atomic::Ordering;

use parking_lot::Mutex;

use super::board::Control;
use super::copy::Side;
use super::Node;
use crate::error::Result;

/// The most peer allocations one rank keeps mapped.
const MAX_MAPS: usize = 32;

/// One mapped (or unmappable) peer allocation.
#[derive(Debug)]
struct Mapped {
    rank: usize,
    id: u64,
    /// Local address of the mapping (null: mapping failed, don't retry).
    local: *mut u8,
    len: usize,
}

/// A rank's cache of mapped peer allocations.
#[derive(Debug, Default)]
pub struct PeerMaps {
    maps: Mutex<Vec<Mapped>>,
}

// SAFETY: the raw pointers are mappings this cache owns; access is guarded
// by the mutex and the single-copy protocol.
unsafe impl Send for PeerMaps {}
// SAFETY: as above.
unsafe impl Sync for PeerMaps {}

impl Drop for PeerMaps {
    fn drop(&mut self) {
        for m in self.maps.get_mut().drain(..) {
            if !m.local.is_null() {
                // SAFETY: a mapping made by `map_peer`, unmapped once.
                unsafe { libc::munmap(m.local.cast(), m.len) };
            }
        }
    }
}

/// Maps the whole file behind `/proc/<pid>/fd/<fd>` if it is `len` bytes.
fn map_peer(pid: u32, fd: i32, len: usize) -> *mut u8 {
    let Ok(path) = std::ffi::CString::new(format!("/proc/{pid}/fd/{fd}")) else {
        return std::ptr::null_mut();
    };
    // SAFETY: a NUL-terminated path.
    let f = unsafe { libc::open(path.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
    if f < 0 {
        return std::ptr::null_mut();
    }
    // SAFETY: a zeroed stat is valid output space.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: f is open, st writable.
    let ok = unsafe { libc::fstat(f, &mut st) } == 0 && st.st_size as usize == len;
    let p = if ok {
        // SAFETY: mapping an open file of `len` bytes.
        unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                f,
                0,
            )
        }
    } else {
        libc::MAP_FAILED
    };
    // SAFETY: f is open.
    unsafe { libc::close(f) };
    if p == libc::MAP_FAILED {
        return std::ptr::null_mut();
    }
    // SAFETY: the shared mapping just made.
    unsafe { super::region::prefault(p, len) };
    p.cast()
}

impl Node {
    /// A pointer through which this rank can access `len` bytes at `addr` in
    /// local rank `k`'s address space directly, if it can: `k` is in this
    /// process, or the bytes lie in an allocation `k` published for its
    /// current single-copy operation and this rank could map it. `Err`
    /// (before anything is accessed) unless the bytes lie inside the `side`
    /// buffer `k` published for the operation ([`Node::within`]).
    pub(super) fn peer_view(
        &self,
        k: usize,
        side: Side,
        addr: u64,
        len: usize,
    ) -> Result<Option<*mut u8>> {
        self.within(k, side, addr, len)?;
        Ok(self.view(k, addr, len))
    }

    /// [`Node::peer_view`] without the extent check.
    fn view(&self, k: usize, addr: u64, len: usize) -> Option<*mut u8> {
        let ctl = self.boards[k].control();
        let pid = ctl.pid.load(Ordering::Relaxed) as u32;
        if pid == self.pid {
            return Some(addr as *mut u8);
        }
        let addr = addr as usize;
        let (id, fd, base, rlen) = [&ctl.send_region, &ctl.recv_region]
            .into_iter()
            .filter_map(Control::region)
            .find(|&(_, _, base, rlen)| {
                addr >= base && addr.checked_add(len).is_some_and(|e| e <= base + rlen)
            })?;
        let mut maps = self.peer_maps.maps.lock();
        let local = match maps.iter().find(|m| m.rank == k && m.id == id) {
            Some(m) => m.local,
            None => {
                let local = map_peer(pid, fd, rlen);
                if maps.len() >= MAX_MAPS {
                    let old = maps.remove(0);
                    if !old.local.is_null() {
                        // SAFETY: a mapping made by `map_peer`; nothing
                        // borrows it between operations.
                        unsafe { libc::munmap(old.local.cast(), old.len) };
                    }
                }
                tracing::debug!(target: "hetccl::COLL",
                    "rank {}: mapping rank {k}'s allocation {id:016x} ({rlen} B): {}",
                    self.me, if local.is_null() { "failed" } else { "ok" });
                maps.push(Mapped {
                    rank: k,
                    id,
                    local,
                    len: rlen,
                });
                local
            }
        };
        // SAFETY: inside the mapping of the allocation that holds the range.
        (!local.is_null()).then(|| unsafe { local.add(addr - base) })
    }
}
