//! The node arena: one shared-memory segment per communicator and node that
//! holds every local rank's doorbell, every local rank's board (the
//! direct-access region of `crate::intranode`: small-message slots and the
//! control line of single-copy operations), and a ring for every ordered pair
//! of local ranks.
//!
//! The node's lowest rank creates it under `/dev/shm`, the others map it
//! after a bootstrap barrier, and the creator unlinks it after a second
//! barrier, so that a crash afterwards leaks nothing. Pages are only backed
//! when touched, so unused rings cost address space, not memory.

use std::ffi::CString;
use std::sync::atomic::{AtomicU64, Ordering};

use super::doorbell::{Doorbell, DoorbellCell};
use super::ring::Ring;
use crate::error::{Error, Result};

const MAGIC: u64 = 0x6865_7463_636c_4152; // "hetcclAR"
const HDR: usize = 64;
const BELL: usize = std::mem::size_of::<DoorbellCell>();

/// Bytes of one local rank's board (a multiple of 64; see `crate::intranode::board`).
pub const BOARD: usize =
    320 + 2 * (64 + (16 << 10)) + 16 * 256 + 64 + 2048 * 32 + 32 * (64 + (16 << 10)) + 2048 * 64;

/// Bytes of the device send/receive mailbox of one ordered pair of local
/// ranks (see `crate::gpu::p2p`).
pub const MAILBOX: usize = 256;

/// A mapped arena.
#[derive(Debug)]
pub struct Arena {
    base: *mut u8,
    len: usize,
    nlocal: usize,
    nchan: usize,
    cap: usize,
}

// SAFETY: the mapping is shared memory accessed through atomics and the SPSC
// ring protocol; the struct only holds its address.
unsafe impl Send for Arena {}
// SAFETY: as above.
unsafe impl Sync for Arena {}

fn size_for(nlocal: usize, nchan: usize, cap: usize) -> Option<usize> {
    let rings = nlocal
        .checked_mul(nlocal)?
        .checked_mul(nchan)?
        .checked_mul(Ring::footprint(cap))?;
    let mailboxes = nlocal.checked_mul(nlocal)?.checked_mul(MAILBOX)?;
    HDR.checked_add(nlocal.checked_mul(BELL + BOARD)?)?
        .checked_add(rings)?
        .checked_add(mailboxes)
}

/// The `/dev/shm` name of a communicator's arena on one node.
pub fn name(comm_hash: u64, node: usize, leader_pid: u32) -> String {
    format!("/dev/shm/hetccl-{comm_hash:016x}-n{node}-p{leader_pid}")
}

fn map(fd: i32, len: usize) -> Result<*mut u8> {
    // SAFETY: mapping an open shm file of at least `len` bytes.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(Error::last_os("mmap shm arena"));
    }
    Ok(p.cast())
}

impl Arena {
    /// Creates the arena file and maps it (the node leader).
    pub fn create(path: &str, nlocal: usize, nchan: usize, cap: usize) -> Result<Self> {
        let len =
            size_for(nlocal, nchan, cap).ok_or_else(|| Error::arg("shm arena size overflows"))?;
        let c = CString::new(path).map_err(|_| Error::Internal("shm name".into()))?;
        // SAFETY: a NUL-terminated path.
        let fd = unsafe {
            libc::open(
                c.as_ptr(),
                libc::O_CREAT | libc::O_EXCL | libc::O_RDWR | libc::O_CLOEXEC,
                0o600,
            )
        };
        if fd < 0 {
            return Err(Error::last_os(&format!("create {path}")));
        }
        // SAFETY: fd is open; closed below in every case.
        let r = unsafe { libc::ftruncate(fd, len as libc::off_t) };
        let mapped = if r == 0 {
            map(fd, len)
        } else {
            Err(Error::last_os("ftruncate shm arena"))
        };
        // SAFETY: fd is open.
        unsafe { libc::close(fd) };
        let base = mapped.inspect_err(|_| Self::unlink(path))?;
        let a = Self {
            base,
            len,
            nlocal,
            nchan,
            cap,
        };
        a.prefault_boards();
        a.header()[1].store((nlocal * nchan) as u64, Ordering::Relaxed);
        a.header()[2].store(cap as u64, Ordering::Relaxed);
        a.header()[0].store(MAGIC, Ordering::Release);
        Ok(a)
    }

    /// Maps an arena the leader created, checking its header.
    pub fn open(path: &str, nlocal: usize, nchan: usize, cap: usize) -> Result<Self> {
        let len =
            size_for(nlocal, nchan, cap).ok_or_else(|| Error::arg("shm arena size overflows"))?;
        let c = CString::new(path).map_err(|_| Error::Internal("shm name".into()))?;
        // SAFETY: a NUL-terminated path.
        let fd = unsafe { libc::open(c.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
        if fd < 0 {
            return Err(Error::last_os(&format!("open {path}")));
        }
        // SAFETY: libc::stat is plain data, for which all-zero bytes are a valid value.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: fd is open and `st` is writable.
        let ok = unsafe { libc::fstat(fd, &mut st) } == 0 && st.st_size as usize == len;
        let mapped = if ok {
            map(fd, len)
        } else {
            Err(Error::Internal(format!("{path} has the wrong size").into()))
        };
        // SAFETY: fd is open.
        unsafe { libc::close(fd) };
        let a = Self {
            base: mapped?,
            len,
            nlocal,
            nchan,
            cap,
        };
        let h = a.header();
        if h[0].load(Ordering::Acquire) != MAGIC
            || h[1].load(Ordering::Relaxed) != (nlocal * nchan) as u64
            || h[2].load(Ordering::Relaxed) != cap as u64
        {
            return Err(Error::Internal(
                format!("{path} has an unexpected header").into(),
            ));
        }
        a.prefault_boards();
        Ok(a)
    }

    /// Maps the header, doorbells and boards into this process now (best
    /// effort): the deep broadcast lines are otherwise first touched, one
    /// page fault each, inside a latency-bound loop. The rings stay lazy.
    fn prefault_boards(&self) {
        /// `MADV_POPULATE_WRITE` (Linux 5.14).
        const POPULATE_WRITE: libc::c_int = 23;
        let len = HDR + self.nlocal * (BELL + BOARD);
        // SAFETY: the range is the start of this mapping; populating
        // changes no byte.
        let r = unsafe { libc::madvise(self.base.cast(), len, POPULATE_WRITE) };
        if r != 0 {
            // Older kernels: a read per page maps it.
            for off in (0..len).step_by(4096) {
                // SAFETY: inside the mapping; a plain read of shared memory.
                unsafe { std::ptr::read_volatile(self.base.add(off)) };
            }
        }
    }

    /// Removes the arena's name (the mapping stays valid).
    pub fn unlink(path: &str) {
        if let Ok(c) = CString::new(path) {
            // SAFETY: a NUL-terminated path.
            unsafe { libc::unlink(c.as_ptr()) };
        }
    }

    fn header(&self) -> &[AtomicU64; 3] {
        // SAFETY: the first 64 bytes of the mapping are the header.
        unsafe { &*(self.base as *const [AtomicU64; 3]) }
    }

    /// The doorbell of local rank `i`.
    pub fn bell(&self, i: usize) -> Doorbell {
        assert!(i < self.nlocal);
        // SAFETY: inside the mapping, which outlives every user (they hold an Arc).
        unsafe { Doorbell::new(self.base.add(HDR + i * BELL) as *const DoorbellCell) }
    }

    /// The number of local ranks.
    pub fn nlocal(&self) -> usize {
        self.nlocal
    }

    /// The start of local rank `i`'s board: [`BOARD`] zero-initialised,
    /// 64-byte aligned bytes, shared by every local rank for the arena's
    /// lifetime.
    pub fn board(&self, i: usize) -> *mut u8 {
        assert!(i < self.nlocal);
        // SAFETY: inside the mapping (boards follow the doorbells).
        unsafe { self.base.add(HDR + self.nlocal * BELL + i * BOARD) }
    }

    /// The device send/receive mailbox from local rank `from` to local rank
    /// `to` (`from == to` included): [`MAILBOX`] zero-initialised, 64-byte
    /// aligned bytes after the rings.
    pub fn mailbox(&self, from: usize, to: usize) -> *mut u8 {
        assert!(from < self.nlocal && to < self.nlocal);
        let rings = self.nlocal * self.nlocal * self.nchan * Ring::footprint(self.cap);
        let off = HDR + self.nlocal * (BELL + BOARD) + rings + (from * self.nlocal + to) * MAILBOX;
        // SAFETY: the mailbox region lies inside the mapping.
        unsafe { self.base.add(off) }
    }

    /// The ring carrying bytes from local rank `from` to local rank `to` on
    /// channel `chan`.
    pub fn ring(&self, from: usize, to: usize, chan: usize) -> Ring {
        assert!(from < self.nlocal && to < self.nlocal && from != to && chan < self.nchan);
        let idx = (from * self.nlocal + to) * self.nchan + chan;
        let off = HDR + self.nlocal * (BELL + BOARD) + idx * Ring::footprint(self.cap);
        // SAFETY: the ring region lies inside the mapping; one producer
        // (`from`) and one consumer (`to`) use it.
        unsafe { Ring::at(self.base.add(off), self.cap) }
    }
}

impl Drop for Arena {
    fn drop(&mut self) {
        // SAFETY: unmapping exactly what was mapped.
        unsafe { libc::munmap(self.base.cast(), self.len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn create_open_unlink() {
        let path = name(0x1234_5678, 0, std::process::id());
        let a = Arena::create(&path, 3, 2, 4096).unwrap();
        let b = Arena::open(&path, 3, 2, 4096).unwrap();
        assert!(
            Arena::open(&path, 2, 2, 4096).is_err(),
            "wrong layout is refused"
        );
        Arena::unlink(&path);
        assert!(std::fs::metadata(&path).is_err(), "no name left behind");
        assert_eq!(a.ring(0, 2, 1).try_write(b"abc"), 3);
        assert_eq!(b.ring(0, 2, 0).readable(), 0, "channels are separate rings");
        let mut out = [0u8; 3];
        assert_eq!(b.ring(0, 2, 1).try_read(&mut out), 3);
        assert_eq!(&out, b"abc");
        assert!(Arena::create("/dev/shm/../nonexistent-dir/x", 1, 1, 64).is_err());
    }
}
