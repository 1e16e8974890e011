//! A doorbell: a 32-bit futex word a rank sleeps on when none of its links
//! can make progress. Peers ring it after they publish data or free space.
//!
//! The doorbell lives in memory both sides map (a shm arena, or the heap for
//! tests); the futex is therefore a shared (non-private) one. Ringing costs a
//! syscall only when the owner is actually asleep.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

/// The shared part of a doorbell: the sequence word and the sleeper count.
#[repr(C, align(64))]
#[derive(Debug, Default)]
pub struct DoorbellCell {
    seq: AtomicU32,
    sleepers: AtomicU32,
}

/// A handle to a [`DoorbellCell`] in memory that outlives the handle.
#[derive(Debug, Clone, Copy)]
pub struct Doorbell {
    cell: *const DoorbellCell,
}

// SAFETY: the cell is only accessed through atomics; the owner of the mapping
// keeps it alive for as long as any handle is used.
unsafe impl Send for Doorbell {}
// SAFETY: as above.
unsafe impl Sync for Doorbell {}

impl Doorbell {
    /// Wraps a cell.
    ///
    /// # Safety
    /// `cell` must point to a `DoorbellCell` valid for the handle's lifetime.
    pub unsafe fn new(cell: *const DoorbellCell) -> Self {
        Self { cell }
    }

    fn cell(&self) -> &DoorbellCell {
        // SAFETY: per `new`'s contract.
        unsafe { &*self.cell }
    }

    /// Wakes the owner if it sleeps (or makes its next sleep return at once).
    pub fn ring(&self) {
        let c = self.cell();
        c.seq.fetch_add(1, Ordering::SeqCst);
        if c.sleepers.load(Ordering::SeqCst) > 0 {
            futex_wake(&c.seq);
        }
    }

    /// Wakes the owner only if it announced a sleep: one read of the shared
    /// line when nobody sleeps. The caller must have published its data with
    /// a `SeqCst` store or fence before calling this, so that an owner that
    /// announces its sleep after this check sees the data when it re-checks.
    pub fn ring_if_sleeping(&self) {
        if self.cell().sleepers.load(Ordering::SeqCst) > 0 {
            self.ring();
        }
    }

    /// Announces that the owner is about to sleep and returns the sequence
    /// value to pass to [`Doorbell::sleep`]. The caller must re-check its
    /// links between `prepare` and `sleep`, and call [`Doorbell::done`] after.
    pub fn prepare(&self) -> u32 {
        let c = self.cell();
        c.sleepers.fetch_add(1, Ordering::SeqCst);
        c.seq.load(Ordering::SeqCst)
    }

    /// Sleeps until rung (after `prepare` returned `seq`) or `timeout` passes.
    pub fn sleep(&self, seq: u32, timeout: Duration) {
        futex_wait(&self.cell().seq, seq, timeout);
    }

    /// Ends a `prepare`/`sleep` pair.
    pub fn done(&self) {
        self.cell().sleepers.fetch_sub(1, Ordering::SeqCst);
    }
}

fn futex_wait(word: &AtomicU32, expected: u32, timeout: Duration) {
    let ts = libc::timespec {
        tv_sec: timeout.as_secs().min(i64::MAX as u64) as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: a FUTEX_WAIT on a live 32-bit atomic with a relative timeout;
    // spurious returns (EAGAIN, EINTR, ETIMEDOUT) are all fine for callers.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT,
            expected,
            &ts as *const libc::timespec,
        );
    }
}

fn futex_wake(word: &AtomicU32) {
    // SAFETY: FUTEX_WAKE on a live 32-bit atomic.
    unsafe {
        libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAKE, i32::MAX);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Instant;

    #[test]
    fn ring_wakes_sleeper_and_timeout_bounds_sleep() {
        let cell = Arc::new(DoorbellCell::default());
        // SAFETY: the cell is kept alive by its Arc for as long as the bell is used.
        let bell = unsafe { Doorbell::new(&*cell) };
        // Nobody rings: the sleep ends at the timeout.
        let t = Instant::now();
        let s = bell.prepare();
        bell.sleep(s, Duration::from_millis(20));
        bell.done();
        assert!(t.elapsed() >= Duration::from_millis(15));
        // A ring between prepare and sleep makes the sleep return at once.
        let s = bell.prepare();
        bell.ring();
        let t = Instant::now();
        bell.sleep(s, Duration::from_secs(10));
        bell.done();
        assert!(t.elapsed() < Duration::from_secs(5));
        // A ring from another thread wakes a sleeper.
        let c2 = cell.clone();
        let h = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(30));
            // SAFETY: the cell is kept alive by its Arc for as long as the bell is used.
            unsafe { Doorbell::new(&*c2) }.ring();
        });
        let t = Instant::now();
        let s = bell.prepare();
        bell.sleep(s, Duration::from_secs(10));
        bell.done();
        h.join().unwrap();
        assert!(t.elapsed() < Duration::from_secs(5));
    }
}
