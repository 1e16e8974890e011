//! The gate an operation holds while it runs on a communicator.
//!
//! One operation runs on a communicator at a time: the caller's, a
//! nonblocking communicator's helper thread, or the GPU proxy. Finalize,
//! shrink and revoke wait at the gate until the running one ends.
//!
//! Entering is one compare-and-swap; leaving is one `Release` store, not a
//! second read-modify-write as a parking mutex needs to find sleepers.
//! That store comes right after a small operation's last write to memory
//! its peers read, and a locked instruction there would wait for those
//! writes to reach the peers (docs/benchmarks.md). The price is paid by a
//! waiter instead: it polls, spinning briefly, then yielding, then
//! sleeping at most [`MAX_NAP`] between looks. Waiting happens only when
//! two threads use one communicator at once (the GPU proxy beside a host
//! call) or in the lifecycle calls above.
//!
//! A waiter that has not got in after its brief spin claims the turn: one
//! waiter at a time holds it, and while it is held nobody else enters,
//! not even a thread that left the gate and comes straight back. The gate
//! then opens only to the turn's holder, which looks at least every
//! [`TURN_NAP`]. So a thread that leaves and re-enters in a loop (a
//! host-buffer loop beside the GPU proxy on one communicator) cannot keep
//! a waiter out; it waits at most one such look.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::bootstrap::retry::Backoff;

/// Looks at a held gate before a waiter starts yielding.
const SPINS: u32 = 128;
/// How long a waiter yields before it sleeps.
const YIELD_FOR: Duration = Duration::from_micros(50);
/// The first sleep between looks; it doubles (jittered, [`Backoff`]) up
/// to [`MAX_NAP`].
const FIRST_NAP: Duration = Duration::from_micros(20);
/// The longest sleep between looks.
const MAX_NAP: Duration = Duration::from_millis(1);
/// The longest sleep between looks of the waiter holding the turn, which
/// every other entrant waits for.
const TURN_NAP: Duration = Duration::from_micros(100);

/// Numbers the waits that may claim the turn (0: no one holds it).
static NEXT_WAIT: AtomicU64 = AtomicU64::new(1);

/// Held while an operation runs on a communicator.
#[derive(Debug, Default)]
pub struct ExecGate {
    held: AtomicBool,
    /// The wait that holds the turn, or 0.
    turn: AtomicU64,
}

/// An entered [`ExecGate`]; dropping it lets the next operation in.
#[derive(Debug)]
#[must_use = "the gate is left when this is dropped"]
pub struct Running<'a> {
    gate: &'a ExecGate,
}

impl ExecGate {
    /// Enters the gate if no operation holds it and no waiter holds the
    /// turn.
    #[inline]
    pub fn try_enter(&self) -> Option<Running<'_>> {
        if self.turn.load(Ordering::Relaxed) != 0 {
            return None;
        }
        self.take()
    }

    /// Enters the gate if no operation holds it, turn or not.
    #[inline]
    fn take(&self) -> Option<Running<'_>> {
        self.held
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .ok()
            .map(|_| Running { gate: self })
    }

    /// Enters the gate, waiting up to `wait` for the operation holding it.
    #[inline]
    pub fn enter_for(&self, wait: Duration) -> Option<Running<'_>> {
        self.try_enter()
            .or_else(|| self.enter_until(Instant::now() + wait))
    }

    /// Enters the gate, waiting until `deadline` for the operation holding
    /// it; `None` if it is still held then.
    #[inline(never)]
    pub fn enter_until(&self, deadline: Instant) -> Option<Running<'_>> {
        for _ in 0..SPINS {
            if let Some(r) = self.try_enter() {
                return Some(r);
            }
            std::hint::spin_loop();
        }
        let me = NEXT_WAIT.fetch_add(1, Ordering::Relaxed);
        let mine = || self.turn.load(Ordering::Relaxed) == me;
        let yield_until = Instant::now() + YIELD_FOR;
        let mut naps = Backoff::new(FIRST_NAP, MAX_NAP);
        let entered = loop {
            if !mine()
                && self
                    .turn
                    .compare_exchange(0, me, Ordering::Relaxed, Ordering::Relaxed)
                    .is_ok()
            {
                naps = Backoff::new(FIRST_NAP, TURN_NAP);
            }
            if let Some(r) = if mine() {
                self.take()
            } else {
                self.try_enter()
            } {
                break Some(r);
            }
            if Instant::now() < yield_until.min(deadline) {
                std::thread::yield_now();
            } else if !naps.sleep(deadline) {
                break None;
            }
        };
        // Entered or given up: either way the turn is passed on.
        let _ = self
            .turn
            .compare_exchange(me, 0, Ordering::Relaxed, Ordering::Relaxed);
        entered
    }
}

impl Drop for Running<'_> {
    #[inline]
    fn drop(&mut self) {
        self.gate.held.store(false, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU32;

    #[test]
    fn one_operation_at_a_time() {
        let g = ExecGate::default();
        let r = g.try_enter().expect("a free gate opens");
        assert!(g.try_enter().is_none(), "a held gate stays shut");
        let t0 = Instant::now();
        assert!(g.enter_for(Duration::from_millis(30)).is_none());
        assert!(
            t0.elapsed() >= Duration::from_millis(30),
            "waited the whole time"
        );
        drop(r);
        assert!(g.try_enter().is_some(), "open again once left");
    }

    #[test]
    fn a_waiter_enters_when_the_holder_leaves() {
        let g = ExecGate::default();
        let inside = AtomicU32::new(0);
        let r = g.try_enter().unwrap();
        std::thread::scope(|s| {
            let waiter = s.spawn(|| {
                let r = g.enter_for(Duration::from_secs(10));
                assert!(r.is_some());
                inside.fetch_add(1, Ordering::SeqCst);
            });
            std::thread::sleep(Duration::from_millis(20));
            assert_eq!(inside.load(Ordering::SeqCst), 0, "shut while held");
            drop(r);
            waiter.join().unwrap();
        });
        assert_eq!(inside.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn a_thread_that_reenters_at_once_cannot_keep_a_waiter_out() {
        let g = ExecGate::default();
        let waiter_in = AtomicBool::new(false);
        let looping = AtomicBool::new(false);
        std::thread::scope(|s| {
            s.spawn(|| {
                // Leaves and re-enters with no pause, as a host-buffer
                // loop does, until the waiter got in (or 5 s passed).
                let end = Instant::now() + Duration::from_secs(5);
                while !waiter_in.load(Ordering::SeqCst) && Instant::now() < end {
                    let _r = g.enter_for(Duration::from_secs(5)).unwrap();
                    looping.store(true, Ordering::SeqCst);
                    let t = Instant::now();
                    while t.elapsed() < Duration::from_micros(300) {
                        std::hint::spin_loop();
                    }
                }
            });
            while !looping.load(Ordering::SeqCst) {
                std::thread::yield_now();
            }
            let r = g.enter_for(Duration::from_secs(1));
            assert!(r.is_some(), "the waiter got in while the other looped");
            waiter_in.store(true, Ordering::SeqCst);
        });
    }

    #[test]
    fn threads_never_overlap() {
        let g = ExecGate::default();
        let inside = AtomicU32::new(0);
        let total = AtomicU32::new(0);
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    for _ in 0..2000 {
                        let _r = g.enter_for(Duration::from_secs(10)).unwrap();
                        assert_eq!(inside.fetch_add(1, Ordering::SeqCst), 0);
                        total.fetch_add(1, Ordering::Relaxed);
                        inside.fetch_sub(1, Ordering::SeqCst);
                    }
                });
            }
        });
        assert_eq!(total.load(Ordering::Relaxed), 8000);
    }
}
