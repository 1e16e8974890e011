//! Safe points for synchronising CUDA calls.
//!
//! Frees (`cuMemFreeHost`, `cuMemFree`), IPC closes, module loads and
//! context destruction wait until the device is idle. While a user stream
//! waits on a batch's flag that the proxy has yet to set, the device is
//! never idle: such a call made by the proxy (or by any thread the proxy
//! waits for) would never return. Pinned allocations keep later work on
//! other streams from overlapping earlier work (CUDA's implicit
//! synchronisation), so one would leave the proxy's copies behind the
//! waiting stream. So all these are made only at a safe point:
//! no batch is in flight in the process, that is, no stream can be waiting
//! on a flag of ours.
//!
//! A batch is in flight from [`begin`] (before its first stream wait is
//! enqueued) to [`end`] (after its flag is set). Work that needs a safe
//! point is either deferred ([`defer`]: it runs when the count next drops
//! to zero) or attempted ([`at_safe_point`]: it runs now if the count is
//! zero, else not at all). Both run with the count held at zero: [`begin`]
//! waits meanwhile, so no new stream wait can appear under a free.

use parking_lot::Mutex;

/// A synchronising call put off to the next safe point.
pub type Deferred = Box<dyn FnOnce() + Send>;

struct State {
    /// Batches between [`begin`] and [`end`].
    in_flight: usize,
    /// Calls waiting for a safe point, oldest first.
    deferred: Vec<Deferred>,
}

static STATE: Mutex<State> = Mutex::new(State {
    in_flight: 0,
    deferred: Vec::new(),
});

/// Marks a batch in flight; call before any stream is told to wait for
/// its flag. Waits while a safe point's work runs.
pub fn begin() {
    STATE.lock().in_flight += 1;
}

/// Marks a batch done (its flag is set, so its streams move on). When no
/// batch is left in flight, runs `also`, every deferred call and the
/// pinned pool's trim, with new batches held back until they are done.
pub fn end(also: impl FnOnce()) {
    let mut st = STATE.lock();
    st.in_flight = st.in_flight.saturating_sub(1);
    if st.in_flight == 0 {
        run_safe_point(&mut st);
        also();
    }
}

/// Runs `f` now if no batch is in flight (with new ones held back until it
/// returns), else returns `None` without running it.
pub fn at_safe_point<R>(f: impl FnOnce() -> R) -> Option<R> {
    let mut st = STATE.lock();
    if st.in_flight != 0 {
        return None;
    }
    run_safe_point(&mut st);
    Some(f())
}

/// Runs `f` at the next safe point: now if no batch is in flight, else
/// when the last one in flight ends.
pub fn defer(f: Deferred) {
    let mut st = STATE.lock();
    st.deferred.push(f);
    if st.in_flight == 0 {
        run_safe_point(&mut st);
    }
}

/// How many calls wait for a safe point.
pub fn pending() -> usize {
    STATE.lock().deferred.len()
}

/// The deferred calls and the pool trim; the lock is held (count zero).
fn run_safe_point(st: &mut State) {
    for f in std::mem::take(&mut st.deferred) {
        f();
    }
    super::pinned::trim();
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    /// The state is process-wide; the tests of this module run one at a time.
    static SERIAL: Mutex<()> = Mutex::new(());

    #[test]
    fn deferred_calls_wait_for_the_last_batch_in_flight() {
        let _g = SERIAL.lock();
        let ran = Arc::new(AtomicUsize::new(0));
        begin();
        begin();
        let r = ran.clone();
        defer(Box::new(move || {
            r.fetch_add(1, Ordering::SeqCst);
        }));
        assert_eq!(
            ran.load(Ordering::SeqCst),
            0,
            "ran while two batches are in flight"
        );
        assert!(at_safe_point(|| ()).is_none());
        let also = AtomicUsize::new(0);
        end(|| {
            also.fetch_add(1, Ordering::SeqCst);
        });
        assert_eq!(
            ran.load(Ordering::SeqCst),
            0,
            "ran while one batch is in flight"
        );
        assert_eq!(also.load(Ordering::SeqCst), 0);
        end(|| {
            also.fetch_add(1, Ordering::SeqCst);
        });
        assert_eq!(ran.load(Ordering::SeqCst), 1);
        assert_eq!(also.load(Ordering::SeqCst), 1);
        assert_eq!(pending(), 0);
    }

    #[test]
    fn idle_runs_at_once_and_holds_new_batches_back() {
        let _g = SERIAL.lock();
        let ran = Arc::new(AtomicUsize::new(0));
        let r = ran.clone();
        defer(Box::new(move || {
            r.fetch_add(1, Ordering::SeqCst);
        }));
        assert_eq!(ran.load(Ordering::SeqCst), 1, "nothing in flight: at once");
        // While a safe point's work runs, `begin` on another thread waits.
        let started = Arc::new(AtomicUsize::new(0));
        let out = at_safe_point(|| {
            let s = started.clone();
            let h = std::thread::spawn(move || {
                begin();
                s.fetch_add(1, Ordering::SeqCst);
                end(|| ());
            });
            std::thread::sleep(std::time::Duration::from_millis(50));
            let seen = started.load(Ordering::SeqCst);
            (h, seen)
        });
        let (h, seen) = out.expect("nothing in flight");
        assert_eq!(seen, 0, "a batch began during the safe point's work");
        h.join().unwrap();
        assert_eq!(started.load(Ordering::SeqCst), 1);
    }
}
