//! Time for the executor's wait loops: the current time is passed in, and
//! sleeping on polled links goes through [`Clock`], so timeouts, hang
//! reports and dead-peer checks are tested with a clock the test moves
//! (no real sleeps).
//!
//! [`Stall`] is the sans-IO part of a wait: fed "something moved" or "idle
//! at `now`", it says what the waiter does next (spin, check the peers,
//! report the hang, fail, or sleep until a time).

use std::time::{Duration, Instant};

/// The time source of a wait loop.
pub trait Clock: Sync {
    /// The current time.
    fn now(&self) -> Instant;
    /// Waits for a polled link: `nap` at most, and not past `until`.
    fn nap(&self, nap: Duration, until: Instant);
    /// One turn of a busy wait that lasts until `until` at the latest.
    fn spin(&self, _until: Instant) {
        std::hint::spin_loop();
    }
    /// Waits until one of `fds` is ready for its events, or `until`. The
    /// default naps as for a polled link.
    fn wait_fds(&self, _fds: &mut [libc::pollfd], until: Instant) {
        self.nap(std::time::Duration::from_micros(20), until);
    }
}

/// The real clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Instant {
        Instant::now()
    }
    fn nap(&self, nap: Duration, until: Instant) {
        std::thread::sleep(nap.min(until.saturating_duration_since(Instant::now())));
    }
    /// One turn of the spin phase gives the CPU away (`sched_yield`): with
    /// ranks sharing cores, a pure busy wait holds off the very peer it waits
    /// for until the scheduler's time slice ends (milliseconds); a yield
    /// costs one syscall when the core has nothing else to run.
    fn spin(&self, _until: Instant) {
        std::thread::yield_now();
    }
    fn wait_fds(&self, fds: &mut [libc::pollfd], until: Instant) {
        let d = until.saturating_duration_since(Instant::now());
        let ts = libc::timespec {
            tv_sec: d.as_secs() as libc::time_t,
            tv_nsec: libc::c_long::from(d.subsec_nanos() as i32),
        };
        // SAFETY: `fds` is a valid array of `fds.len()` pollfds and `ts` a
        // valid timeout; no signal mask is passed. Errors (EINTR) just end
        // the wait early: the caller polls its links again.
        unsafe {
            libc::ppoll(
                fds.as_mut_ptr(),
                fds.len() as libc::nfds_t,
                &ts,
                std::ptr::null(),
            )
        };
    }
}

/// A clock that only moves when told to, or when a waiter naps: then it
/// jumps straight to the end of the nap's window (the next thing the
/// waiter could act on).
#[derive(Debug)]
pub struct ManualClock {
    now: parking_lot::Mutex<Instant>,
}

impl Default for ManualClock {
    fn default() -> Self {
        Self {
            now: parking_lot::Mutex::new(Instant::now()),
        }
    }
}

impl ManualClock {
    /// Moves the clock forward.
    pub fn advance(&self, d: Duration) {
        *self.now.lock() += d;
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Instant {
        *self.now.lock()
    }
    fn nap(&self, _nap: Duration, until: Instant) {
        let mut now = self.now.lock();
        if until > *now {
            *now = until;
        }
    }
    fn spin(&self, until: Instant) {
        self.nap(Duration::ZERO, until);
    }
}

/// How long a waiter lets a stall go before acting.
#[derive(Debug, Clone, Copy)]
pub struct Patience {
    /// Spin this long after the last progress before sleeping.
    pub spin: Duration,
    /// Log a hang report (WARN) after this long without progress.
    pub hang_report: Option<Duration>,
    /// Fail with a timeout after this long without progress.
    pub stall_timeout: Duration,
}

/// How long a stall lasts before the board hears of it and local peers'
/// processes are checked (then again at this interval).
pub const WATCH_AFTER: Duration = Duration::from_millis(200);

/// What a waiter does after an idle pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// Keep spinning (poll again at once) until `until` at the latest.
    Spin {
        /// When the spin phase ends.
        until: Instant,
    },
    /// Check the peers' processes (and, when `first`, publish the stall on
    /// the progress board), then ask again.
    Watch {
        /// The first check of this stall.
        first: bool,
    },
    /// Log the hang report, then ask again.
    Report,
    /// Fail: nothing moved for `idle` (at least the stall limit).
    Fail {
        /// How long nothing moved.
        idle: Duration,
    },
    /// Sleep until the link moves or `until` (the next thing to act on).
    Sleep {
        /// When to act next at the latest.
        until: Instant,
    },
}

/// The stall state of one wait.
#[derive(Debug, Clone)]
pub struct Stall {
    patience: Patience,
    since: Option<Instant>,
    watched: Option<Instant>,
    reported: bool,
}

impl Stall {
    /// A wait that has not stalled yet.
    pub fn new(patience: Patience) -> Self {
        Self {
            patience,
            since: None,
            watched: None,
            reported: false,
        }
    }

    /// Something moved: the stall is over. Returns whether the board had
    /// been told of it (so the caller tells it the rank moves again).
    pub fn moved(&mut self) -> bool {
        let was_watched = self.watched.is_some();
        self.since = None;
        self.watched = None;
        self.reported = false;
        was_watched
    }

    /// How long the current stall has lasted at `now`.
    pub fn idle(&self, now: Instant) -> Duration {
        self.since
            .map_or(Duration::ZERO, |s| now.saturating_duration_since(s))
    }

    /// An idle pass at `now`: what to do next. Each of `Watch` and `Report`
    /// is returned once when due; ask again after acting on it.
    pub fn next(&mut self, now: Instant) -> Next {
        let since = *self.since.get_or_insert(now);
        let idle = now.saturating_duration_since(since);
        let p = self.patience;
        if idle < p.spin {
            return Next::Spin {
                until: since + p.spin,
            };
        }
        if idle >= p.stall_timeout {
            return Next::Fail { idle };
        }
        if idle >= WATCH_AFTER && self.watched.is_none_or(|t| now - t >= WATCH_AFTER) {
            let first = self.watched.is_none();
            self.watched = Some(now);
            return Next::Watch { first };
        }
        if !self.reported && p.hang_report.is_some_and(|h| idle >= h) {
            self.reported = true;
            return Next::Report;
        }
        // Sleep until the next thing due: the next peer check, the hang
        // report, or the stall limit.
        let mut until = since + p.stall_timeout;
        let next_watch = match self.watched {
            Some(t) => t + WATCH_AFTER,
            None => since + WATCH_AFTER,
        };
        until = until.min(next_watch);
        if let Some(h) = p.hang_report.filter(|_| !self.reported) {
            until = until.min(since + h);
        }
        Next::Sleep { until }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn patience() -> Patience {
        Patience {
            spin: Duration::from_micros(50),
            hang_report: Some(Duration::from_secs(10)),
            stall_timeout: Duration::from_secs(30),
        }
    }

    /// Drives a stall that never ends with a manual clock: every event comes
    /// exactly when due, and the wait fails at the stall limit.
    #[test]
    fn a_stall_spins_watches_reports_and_fails_on_time() {
        let clock = ManualClock::default();
        let t0 = clock.now();
        let mut s = Stall::new(patience());
        assert_eq!(
            s.next(t0),
            Next::Spin {
                until: t0 + Duration::from_micros(50)
            }
        );
        let mut watches = Vec::new();
        let mut report = None;
        let fail = loop {
            let now = clock.now();
            match s.next(now) {
                Next::Spin { until } => clock.spin(until),
                Next::Watch { first } => watches.push((now - t0, first)),
                Next::Report => report = Some(now - t0),
                Next::Fail { idle } => break (now - t0, idle),
                Next::Sleep { until } => {
                    assert!(until > now);
                    clock.nap(Duration::from_millis(10), until);
                }
            }
        };
        assert_eq!(fail, (Duration::from_secs(30), Duration::from_secs(30)));
        assert_eq!(report, Some(Duration::from_secs(10)));
        assert_eq!(watches[0], (WATCH_AFTER, true));
        assert!(watches[1..].iter().all(|&(_, first)| !first));
        for w in watches.windows(2) {
            assert_eq!(w[1].0 - w[0].0, WATCH_AFTER, "checks every {WATCH_AFTER:?}");
        }
        assert_eq!(watches.len(), 149, "200 ms apart from 0.2 s to 29.8 s");
    }

    #[test]
    fn progress_restarts_the_clock() {
        let clock = ManualClock::default();
        let mut s = Stall::new(patience());
        s.next(clock.now());
        clock.advance(Duration::from_secs(29));
        assert!(matches!(s.next(clock.now()), Next::Watch { first: true }));
        assert!(s.moved(), "the board had been told");
        clock.advance(Duration::from_secs(29));
        assert!(
            matches!(s.next(clock.now()), Next::Spin { .. }),
            "a new stall starts"
        );
        assert_eq!(s.idle(clock.now()), Duration::ZERO);
        clock.advance(Duration::from_secs(30));
        assert_eq!(
            s.next(clock.now()),
            Next::Fail {
                idle: Duration::from_secs(30)
            }
        );
    }

    #[test]
    fn no_hang_report_when_disabled() {
        let clock = ManualClock::default();
        let mut s = Stall::new(Patience {
            hang_report: None,
            ..patience()
        });
        let mut reports = 0;
        loop {
            match s.next(clock.now()) {
                Next::Report => reports += 1,
                Next::Fail { .. } => break,
                Next::Sleep { until } => clock.nap(Duration::ZERO, until),
                _ => clock.advance(Duration::from_millis(1)),
            }
        }
        assert_eq!(reports, 0);
    }
}
