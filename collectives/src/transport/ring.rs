//! A single-producer single-consumer byte ring over shared memory: the data
//! path of the shm (and in-process) transport.
//!
//! `head` counts bytes ever written, `tail` bytes ever read; both only grow.
//! The producer owns `head`, the consumer owns `tail`; each publishes with
//! Release and reads the other's with Acquire. The consumer can hand out
//! readable bytes in place ([`Ring::try_read_with`]), so a reduction can read
//! straight from the shared segment without a bounce copy.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// The shared header of one ring, followed in memory by its data area.
#[repr(C, align(64))]
#[derive(Debug, Default)]
pub struct RingHeader {
    head: AtomicU64,
    _pad0: [u64; 7],
    tail: AtomicU64,
    _pad1: [u64; 7],
    closed: AtomicU32,
    _pad2: [u32; 15],
}

/// A view of one ring: its header and `cap` data bytes (a power of two).
#[derive(Debug, Clone, Copy)]
pub struct Ring {
    hdr: *const RingHeader,
    data: *mut u8,
    cap: usize,
}

// SAFETY: shared state is only touched through atomics or through byte ranges
// that the SPSC protocol hands exclusively to one side at a time.
unsafe impl Send for Ring {}
// SAFETY: as above.
unsafe impl Sync for Ring {}

impl Ring {
    /// Bytes one ring with `cap` data bytes occupies (header + data).
    pub const fn footprint(cap: usize) -> usize {
        std::mem::size_of::<RingHeader>() + cap
    }

    /// Views the ring at `base` (a zeroed or previously initialised region of
    /// [`Ring::footprint`] bytes, 64-byte aligned).
    ///
    /// # Safety
    /// `base` must be valid for `footprint(cap)` bytes for the view's
    /// lifetime, and at most one producer and one consumer may use it.
    pub unsafe fn at(base: *mut u8, cap: usize) -> Self {
        assert!(cap.is_power_of_two() && cap >= 64, "ring capacity {cap}");
        Self {
            hdr: base as *const RingHeader,
            // SAFETY: inside the region, per the contract.
            data: unsafe { base.add(std::mem::size_of::<RingHeader>()) },
            cap,
        }
    }

    fn hdr(&self) -> &RingHeader {
        // SAFETY: per `at`'s contract.
        unsafe { &*self.hdr }
    }

    /// The data capacity in bytes.
    pub fn capacity(&self) -> usize {
        self.cap
    }

    /// Marks the ring closed (either side; e.g. on abort).
    pub fn close(&self) {
        let _ = self
            .hdr()
            .closed
            .compare_exchange(0, 1, Ordering::AcqRel, Ordering::Acquire);
    }

    /// Marks the ring closed because rank `by` revoked the communicator.
    pub fn close_revoked(&self, by: usize) {
        let code = u32::try_from(by).map_or(1, |b| b.saturating_add(2));
        let _ = self
            .hdr()
            .closed
            .compare_exchange(0, code, Ordering::AcqRel, Ordering::Acquire);
    }

    /// Whether either side closed the ring.
    pub fn is_closed(&self) -> bool {
        self.hdr().closed.load(Ordering::Acquire) != 0
    }

    /// The rank that revoked the communicator, if that is why the ring was
    /// closed (the value comes from shared memory: any rank number is
    /// possible, the caller bounds it).
    pub fn revoked_by(&self) -> Option<usize> {
        match self.hdr().closed.load(Ordering::Acquire) {
            0 | 1 => None,
            c => Some((c - 2) as usize),
        }
    }

    /// Producer: copies as much of `src` as fits; returns the bytes written.
    pub fn try_write(&self, src: &[u8]) -> usize {
        let h = self.hdr();
        let head = h.head.load(Ordering::Relaxed);
        let tail = h.tail.load(Ordering::Acquire);
        let used = head.wrapping_sub(tail) as usize;
        let n = src.len().min(self.cap.saturating_sub(used));
        if n == 0 {
            return 0;
        }
        let pos = head as usize & (self.cap - 1);
        let first = n.min(self.cap - pos);
        // SAFETY: [pos, pos+first) and [0, n-first) are free space owned by
        // the producer until `head` is published; `src` does not overlap the ring.
        unsafe {
            std::ptr::copy_nonoverlapping(src.as_ptr(), self.data.add(pos), first);
            std::ptr::copy_nonoverlapping(src.as_ptr().add(first), self.data, n - first);
        }
        h.head.store(head + n as u64, Ordering::Release);
        n
    }

    /// Bytes ready to read.
    pub fn readable(&self) -> usize {
        let h = self.hdr();
        h.head
            .load(Ordering::Acquire)
            .wrapping_sub(h.tail.load(Ordering::Relaxed)) as usize
    }

    /// Consumer: hands up to `max` readable bytes, in whole `elem`-byte
    /// elements, to `f` in place (one to three slices, in order), then frees
    /// them. Returns the bytes consumed.
    pub fn try_read_with(&self, max: usize, elem: usize, f: &mut dyn FnMut(&[u8])) -> usize {
        debug_assert!(elem > 0 && elem <= 16);
        let h = self.hdr();
        let tail = h.tail.load(Ordering::Relaxed);
        let head = h.head.load(Ordering::Acquire);
        let avail = (head.wrapping_sub(tail) as usize).min(max);
        let n = avail - avail % elem;
        if n == 0 {
            return 0;
        }
        let pos = tail as usize & (self.cap - 1);
        let first = n.min(self.cap - pos);
        // SAFETY: [tail, tail+n) was published by the producer (Acquire above)
        // and stays untouched by it until `tail` advances.
        unsafe {
            let whole = first - first % elem;
            if whole > 0 {
                f(std::slice::from_raw_parts(self.data.add(pos), whole));
            }
            let mut done = whole;
            if first % elem != 0 {
                // One element straddles the wrap: gather it.
                let mut tmp = [0u8; 16];
                let a = first - whole;
                std::ptr::copy_nonoverlapping(self.data.add(pos + whole), tmp.as_mut_ptr(), a);
                std::ptr::copy_nonoverlapping(self.data, tmp.as_mut_ptr().add(a), elem - a);
                f(&tmp[..elem]);
                done += elem;
            }
            if n > done {
                let start = done - first; // bytes already taken from the ring's start
                f(std::slice::from_raw_parts(self.data.add(start), n - done));
            }
        }
        h.tail.store(tail + n as u64, Ordering::Release);
        n
    }

    /// Consumer: copies up to `dst.len()` bytes out; returns the bytes read.
    pub fn try_read(&self, dst: &mut [u8]) -> usize {
        let mut off = 0;
        self.try_read_with(dst.len(), 1, &mut |s| {
            dst[off..off + s.len()].copy_from_slice(s);
            off += s.len();
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[repr(C, align(64))]
    struct Region([u8; 64 * 3 + 256]);

    #[test]
    fn wraps_and_straddles() {
        let mut region = Box::new(Region([0; 64 * 3 + 256]));
        // SAFETY: `region` is 64-aligned, holds the header and 256 data bytes, and outlives `r`.
        let r = unsafe { Ring::at(region.0.as_mut_ptr(), 256) };
        // Misalign by 3 bytes, then push 4-byte elements across the wrap.
        assert_eq!(r.try_write(&[9, 9, 9]), 3);
        assert_eq!(r.try_read(&mut [0; 3]), 3);
        let mut next = 0u32;
        let mut expect = 0u32;
        for _ in 0..50 {
            let vals: Vec<u8> = (0..20)
                .flat_map(|_| {
                    next += 1;
                    next.to_le_bytes()
                })
                .collect();
            let mut off = 0;
            while off < vals.len() {
                off += r.try_write(&vals[off..]);
                r.try_read_with(usize::MAX, 4, &mut |s| {
                    assert_eq!(s.len() % 4, 0);
                    for c in s.chunks_exact(4) {
                        expect += 1;
                        assert_eq!(u32::from_le_bytes(c.try_into().unwrap()), expect);
                    }
                });
            }
        }
        while r.readable() > 0 {
            r.try_read_with(usize::MAX, 4, &mut |s| {
                for c in s.chunks_exact(4) {
                    expect += 1;
                    assert_eq!(u32::from_le_bytes(c.try_into().unwrap()), expect);
                }
            });
        }
        assert_eq!(expect, next);
    }

    #[test]
    fn full_ring_refuses_and_threads_agree() {
        let mut region = Box::new(Region([0; 64 * 3 + 256]));
        // SAFETY: `region` is 64-aligned, holds the header and 256 data bytes, and outlives `r`.
        let r = unsafe { Ring::at(region.0.as_mut_ptr(), 256) };
        assert_eq!(r.try_write(&[1; 300]), 256);
        assert_eq!(r.try_write(&[1; 1]), 0);
        assert_eq!(r.try_read(&mut [0; 1000]), 256);
        let total: usize = 1 << 20;
        std::thread::scope(|s| {
            s.spawn(|| {
                let data: Vec<u8> = (0..total).map(|i| (i % 251) as u8).collect();
                let mut off = 0;
                while off < total {
                    off += r.try_write(&data[off..(off + 100).min(total)]);
                }
            });
            let mut got = 0;
            while got < total {
                let mut buf = [0u8; 77];
                let n = r.try_read(&mut buf);
                for (k, b) in buf[..n].iter().enumerate() {
                    assert_eq!(*b, ((got + k) % 251) as u8);
                }
                got += n;
            }
        });
    }
}
