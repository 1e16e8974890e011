//! Waiting for the other local ranks' board words: spin, then yield, then
//! sleep on this rank's doorbell, checking along the way the abort flag, the
//! peer's links (closed by its `ncclCommAbort`), whether the peer's process
//! still exists, the hang-report threshold and the stall limit.

use std::time::{Duration, Instant};

use super::Node;
use crate::error::{Error, Result};
use crate::exec::watch::{ProcState, WaitOn, Watch};

/// The operation a wait belongs to: its description for reports and
/// errors, and the node's progress board it reports on (hang summary).
pub(crate) struct Op<'a> {
    /// Describes the operation (kind, sequence number, trace id, size).
    pub label: &'a dyn Fn() -> String,
    /// The communicator's progress board.
    pub watch: &'a Watch,
    /// The operation's sequence number (trace id).
    pub seq: u64,
}

/// After this long without progress, a waiter publishes its stall on the
/// progress board.
const WATCH_AFTER: Duration = Duration::from_millis(200);

/// How long a waiting rank yields its CPU (after spinning) before it sleeps
/// on its doorbell. Yielding lets an oversubscribed peer run at once; a
/// futex wake-up costs about 20 µs on a VM.
const YIELD_FOR: Duration = Duration::from_millis(2);
/// The longest sleep between checks.
const MAX_SLEEP: Duration = Duration::from_millis(5);
/// How often a waiter checks that the peer's process still exists.
const LIVENESS_EVERY: Duration = Duration::from_millis(100);

#[derive(Clone, Copy, PartialEq, Eq)]
enum Phase {
    Spin,
    Yield,
    Sleep,
}

impl Node {
    /// Waits until `missing` returns `None`. `missing` names the first local
    /// rank the caller still waits for; `op` describes the operation for
    /// hang reports and errors.
    pub(crate) fn wait(&self, op: &Op<'_>, missing: impl FnMut() -> Option<usize>) -> Result<()> {
        self.wait_spinning(op, self.spin, missing)
    }

    /// [`Node::wait`], spinning for `spin` before it yields (zero: yield
    /// at once, for a rank that would only take CPU time from the rank it
    /// waits for). Never inlined: `bench-scripts/call-cost` tells the wait
    /// from the rest of a call by this function's name.
    #[inline(never)]
    pub(crate) fn wait_spinning(
        &self,
        op: &Op<'_>,
        spin: Duration,
        mut missing: impl FnMut() -> Option<usize>,
    ) -> Result<()> {
        let what = op.label;
        let Some(mut waiting_for) = missing() else {
            return Ok(());
        };
        let mut phase = Phase::Spin;
        // The clock is read only once the wait lasts (most end within a few
        // spins), so idle times start at the first check, up to 128 spins
        // late.
        let mut last: Option<Instant> = None;
        let mut next_liveness: Option<Instant> = None;
        let mut reported = false;
        let mut published = false;
        let mut iter: u32 = 0;
        loop {
            if let Some(e) = self.stop.error() {
                return Err(e);
            }
            match missing() {
                None => return Ok(()),
                Some(k) if k != waiting_for => {
                    waiting_for = k;
                    phase = Phase::Spin;
                    last = None;
                    reported = false;
                    if published {
                        published = false;
                        op.watch.moving();
                    }
                    continue;
                }
                Some(_) => {}
            }
            iter = iter.wrapping_add(1);
            match phase {
                Phase::Spin => {
                    std::hint::spin_loop();
                    if iter % 128 != 0 && !spin.is_zero() {
                        continue;
                    }
                }
                Phase::Yield => {
                    // SAFETY: sched_yield has no arguments and cannot fail.
                    unsafe { libc::sched_yield() };
                    if iter % 16 != 0 {
                        continue;
                    }
                }
                Phase::Sleep => {}
            }
            let now = Instant::now();
            let idle = now.duration_since(*last.get_or_insert(now));
            let next_liveness = next_liveness.get_or_insert(now + LIVENESS_EVERY);
            phase = if idle < spin {
                Phase::Spin
            } else if idle < spin + YIELD_FOR {
                Phase::Yield
            } else {
                Phase::Sleep
            };
            if phase == Phase::Spin {
                continue;
            }
            if let Err(e) = self.check_peer(op.watch, waiting_for, now, next_liveness) {
                // A peer publishes its word before it closes its links (or
                // exits): one that did so just now is waited for no more.
                match missing() {
                    None => return Ok(()),
                    Some(k) if k != waiting_for => continue,
                    Some(_) => return Err(e),
                }
            }
            let on = WaitOn {
                peer: self.rank_of(waiting_for),
                step: 0,
                kind: 1,
            };
            if idle >= WATCH_AFTER && !published {
                published = true;
                op.watch.stalled(idle, Some(on));
            }
            if let Some(h) = self.hang_report {
                if idle >= h && !reported {
                    reported = true;
                    tracing::warn!(target: "hetccl::COLL",
                        "hang report: {} rank {} idle for {:.1} s: {}: waits for rank {} (board)",
                        self.label, self.rank_of(self.me), idle.as_secs_f64(), what(), self.rank_of(waiting_for));
                    op.watch.stalled(idle, Some(on));
                    for line in op.watch.summary(op.seq, h).unwrap_or_default() {
                        tracing::warn!(target: "hetccl::COLL", "{line}");
                    }
                    crate::telemetry::status::log_view();
                }
            }
            if idle >= self.stall_timeout {
                return Err(Error::Remote(format!(
                    "{}: no word from rank {} for {:.0} s (HETCCL_TIMEOUT_S): the peer is stuck or gone",
                    what(),
                    self.rank_of(waiting_for),
                    idle.as_secs_f64()
                ).into()));
            }
            if phase == Phase::Sleep {
                let seq = self.bell.prepare();
                if missing() != Some(waiting_for) {
                    self.bell.done();
                    continue;
                }
                self.bell.sleep(seq, MAX_SLEEP);
                self.bell.done();
            }
        }
    }

    /// Fails if local rank `k` closed its links or its process is gone (as
    /// the progress board sees it: same pid namespace, another process).
    fn check_peer(
        &self,
        watch: &Watch,
        k: usize,
        now: Instant,
        next_liveness: &mut Instant,
    ) -> Result<()> {
        let ring = self.arena.ring(k, self.me, 0);
        if ring.is_closed() {
            if let Some(by) = ring.revoked_by().filter(|&r| r < self.nranks()) {
                return Err(Error::Revoked(by));
            }
            return Err(Error::Remote(
                format!("rank {} closed its links (aborted)", self.rank_of(k)).into(),
            ));
        }
        if now >= *next_liveness {
            *next_liveness = now + LIVENESS_EVERY;
            if watch.peer_state(self.rank_of(k)) == ProcState::Dead {
                let pid = watch.pid(self.rank_of(k)).unwrap_or(0);
                return Err(Error::Remote(
                    format!(
                        "rank {} (pid {pid}) died: its process is gone",
                        self.rank_of(k)
                    )
                    .into(),
                ));
            }
        }
        Ok(())
    }

    /// Rings the doorbell of every other local rank that sleeps. After a
    /// `SeqCst` store the wake-up is guaranteed; after a `Release` store (the
    /// board slots) a sleeper that announced its sleep at the same instant
    /// wakes at its timeout instead.
    pub(crate) fn wake_peers(&self) {
        for (k, b) in self.bells.iter().enumerate() {
            if k != self.me {
                b.ring_if_sleeping();
            }
        }
    }
}
