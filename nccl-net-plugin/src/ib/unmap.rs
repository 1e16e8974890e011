//! Address ranges the process unmapped, for the registration caches.
//!
//! `libhetccl.so` exports `munmap` and `mremap` (the root crate's
//! `unmap_hook`); when it is preloaded they take the place of libc's for
//! every caller that goes through the dynamic linker. They make the real
//! system call and then [`record`] the range here: a fixed ring of
//! [`SLOTS`] ranges and a count of every range ever recorded (the epoch).
//! [`record`] is lock-free, allocation-free and async-signal-safe (it only
//! touches atomics), so it is safe from signal handlers and from inside an
//! allocator.
//!
//! A cache keeps the epoch it last saw. On each lookup it compares it with
//! [`epoch`] (one atomic load) and, when they differ, reads what was
//! recorded since with [`Reader::since`]: the ranges, or
//! [`Since::Lost`] when more were recorded than the ring holds (or a slot
//! could not be read consistently), and then the cache drops everything.
//!
//! Each slot is a small sequence lock: the writer that claimed record `i`
//! clears the slot's stamp, stores the range, then stores `i + 1` as the
//! stamp; a reader takes the range only when the stamp is `i + 1` before
//! and after reading it.

use std::sync::atomic::{fence, AtomicU64, AtomicUsize, Ordering};

/// Ranges the ring holds.
pub const SLOTS: usize = 256;

struct Slot {
    stamp: AtomicU64,
    start: AtomicUsize,
    end: AtomicUsize,
}

/// Records claimed so far (the epoch).
static HEAD: AtomicU64 = AtomicU64::new(0);

#[allow(clippy::declare_interior_mutable_const)]
const EMPTY: Slot = Slot {
    stamp: AtomicU64::new(0),
    start: AtomicUsize::new(0),
    end: AtomicUsize::new(0),
};
static RING: [Slot; SLOTS] = [EMPTY; SLOTS];

/// Records that `addr..addr+len` is no longer mapped as it was.
///
/// Async-signal-safe and re-entrant: atomics only, no lock, no allocation.
pub fn record(addr: usize, len: usize) {
    if len == 0 {
        return;
    }
    let i = HEAD.fetch_add(1, Ordering::AcqRel);
    let s = &RING[(i % SLOTS as u64) as usize];
    s.stamp.store(0, Ordering::Relaxed);
    fence(Ordering::Release);
    s.start.store(addr, Ordering::Relaxed);
    s.end.store(addr.saturating_add(len), Ordering::Relaxed);
    s.stamp.store(i + 1, Ordering::Release);
}

/// How many ranges were ever recorded (changes on every [`record`]).
pub fn epoch() -> u64 {
    HEAD.load(Ordering::Acquire)
}

/// What was recorded since a reader last looked.
#[derive(Debug, PartialEq, Eq)]
pub enum Since {
    /// These `(start, end)` ranges (possibly none).
    Ranges(Vec<(usize, usize)>),
    /// Records were overwritten before they were read (or one is still
    /// being written): the reader must assume anything may be unmapped.
    Lost,
}

/// One consumer's position in the ring.
#[derive(Debug, Clone)]
pub struct Reader {
    seen: u64,
}

impl Reader {
    /// A reader that ignores what was recorded before now.
    pub fn new() -> Self {
        Self { seen: epoch() }
    }

    /// Whether anything was recorded since the last [`Reader::since`]
    /// (one atomic load).
    pub fn behind(&self) -> bool {
        epoch() != self.seen
    }

    /// The ranges recorded since the last call; moves the reader to now.
    pub fn since(&mut self) -> Since {
        let head = epoch();
        let from = std::mem::replace(&mut self.seen, head);
        if head == from {
            return Since::Ranges(Vec::new());
        }
        if head - from > SLOTS as u64 {
            return Since::Lost;
        }
        let mut out = Vec::with_capacity((head - from) as usize);
        for i in from..head {
            let s = &RING[(i % SLOTS as u64) as usize];
            if s.stamp.load(Ordering::Acquire) != i + 1 {
                // Overwritten, or its writer (perhaps interrupted, on
                // another thread) has not finished it.
                return Since::Lost;
            }
            let r = (
                s.start.load(Ordering::Relaxed),
                s.end.load(Ordering::Relaxed),
            );
            fence(Ordering::Acquire);
            if s.stamp.load(Ordering::Relaxed) != i + 1 {
                return Since::Lost;
            }
            out.push(r);
        }
        Since::Ranges(out)
    }
}

impl Default for Reader {
    fn default() -> Self {
        Self::new()
    }
}

/// Serialises the unit tests that record (the ring is process-wide).
#[cfg(test)]
pub(crate) static TEST_LOCK: parking_lot::Mutex<()> = parking_lot::Mutex::new(());

#[cfg(test)]
mod tests {
    use super::*;

    // Each test looks only for its own ranges (addresses no other test
    // uses), in case something else in the process unmaps memory.
    fn mine(s: &Since, lo: usize, hi: usize) -> Vec<(usize, usize)> {
        match s {
            Since::Ranges(v) => v
                .iter()
                .copied()
                .filter(|&(a, _)| (lo..hi).contains(&a))
                .collect(),
            Since::Lost => panic!("lost"),
        }
    }

    #[test]
    fn records_are_read_once_in_order() {
        let base = 0x7000_0000_0000;
        let _g = TEST_LOCK.lock();
        let mut r = Reader::new();
        assert!(!r.behind());
        record(base, 4096);
        record(base + 8192, 100);
        record(base + 16384, 0);
        assert!(r.behind());
        let s = r.since();
        assert_eq!(
            mine(&s, base, base + (1 << 20)),
            vec![(base, base + 4096), (base + 8192, base + 8292)],
            "the zero-length range is not recorded"
        );
        record(base + 4096, 1);
        assert_eq!(
            mine(&r.since(), base, base + (1 << 20)),
            vec![(base + 4096, base + 4097)]
        );
    }

    #[test]
    fn an_overrun_reader_is_told_it_lost_records() {
        let base = 0x7100_0000_0000;
        let _g = TEST_LOCK.lock();
        let mut r = Reader::new();
        for i in 0..SLOTS + 1 {
            record(base + i * 4096, 4096);
        }
        assert_eq!(r.since(), Since::Lost);
        // Afterwards it is current again.
        record(base, 1);
        assert_eq!(mine(&r.since(), base, base + 1), vec![(base, base + 1)]);
    }

    #[test]
    fn concurrent_writers_are_all_seen() {
        let base = 0x7200_0000_0000;
        let _g = TEST_LOCK.lock();
        let mut r = Reader::new();
        let threads: Vec<_> = (0..4)
            .map(|t| {
                std::thread::spawn(move || {
                    for i in 0..16 {
                        record(base + (t * 16 + i) * 4096, 4096);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let mut got = mine(&r.since(), base, base + (1 << 30));
        got.sort();
        let want: Vec<_> = (0..64)
            .map(|k| (base + k * 4096, base + k * 4096 + 4096))
            .collect();
        assert_eq!(got, want);
    }
}
