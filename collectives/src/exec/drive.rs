//! Driving batches to completion: the poll loop, its stall and abort
//! handling, and the waits between polls (doorbell, sockets, naps).

use std::time::{Duration, Instant};

use super::clock::{Clock, Next, Patience, Stall, SystemClock};
use super::{Batch, Blocked};
use crate::error::{Error, Result};
use crate::transport::WaitSource;

/// Drives `batches` to completion; fails once nothing moved for
/// `patience.stall_timeout` (`ncclRemoteError`, naming the peers and steps
/// waited on), when a peer's process on this node is gone, or on abort.
/// After a failure the links of every unfinished batch are closed, so that
/// peers blocked on this rank fail too instead of waiting for their own
/// stall limit (the communicator is unusable anyway).
pub fn drive(batches: &mut [Batch<'_>], patience: Patience) -> Result<()> {
    drive_with(batches, patience, &SystemClock)
}

/// [`drive`] on a given clock.
pub fn drive_with(batches: &mut [Batch<'_>], patience: Patience, clock: &dyn Clock) -> Result<()> {
    for b in batches.iter() {
        let kind = b
            .jobs
            .last()
            .map_or(crate::algo::Collective::Send, |j| j.plan.collective);
        b.links.watch.begin_op(b.seq(), kind);
    }
    let r = drive_loop(batches, patience, clock).map_err(as_remote);
    for b in batches.iter() {
        b.links.watch.end();
        if r.is_err() && !b.finished() {
            b.links.close_links();
        }
    }
    r
}

/// An operation's failure as the caller sees it: transport-level stalls
/// are peer failures too (ncclTimeout is kept for bootstrap deadlines).
pub(super) fn as_remote(e: Error) -> Error {
    match e {
        Error::Timeout(m) => Error::Remote(m),
        e => e,
    }
}

fn drive_loop(batches: &mut [Batch<'_>], patience: Patience, clock: &dyn Clock) -> Result<()> {
    let mut stall = Stall::new(patience);
    let mut sources = Vec::new();
    loop {
        let mut progressed = false;
        for b in batches.iter_mut() {
            if !b.finished() {
                // A link that fails because this communicator was stopped
                // (its own links closed) reports why it was stopped.
                match b.poll() {
                    Ok(moved) => progressed |= moved,
                    Err(e) => {
                        return Err(match b.links.stop.error() {
                            Some(stopped) => stopped,
                            None => b.explain_failure(e),
                        })
                    }
                }
            }
        }
        if batches.iter().all(Batch::finished) {
            return Ok(());
        }
        if let Some(e) = batches.iter().find_map(|b| b.links.stop.error()) {
            return Err(e);
        }
        if progressed {
            if stall.moved() {
                for b in batches.iter() {
                    b.links.watch.moving();
                }
            }
            continue;
        }
        let now = clock.now();
        match stall.next(now) {
            Next::Spin { until } => clock.spin(until),
            Next::Watch { first } => {
                for b in batches.iter().filter(|b| !b.finished()) {
                    if first {
                        b.links
                            .watch
                            .stalled(stall.idle(now), b.blocked().first().map(|x| x.on));
                    }
                    if let Some(p) = b.dead_peer() {
                        let pid = b.links.watch.pid(p).unwrap_or(0);
                        return Err(Error::Remote(
                            format!(
                                "rank {p} (pid {pid}) died: its process is gone; {}",
                                b.describe_wait().join("; ")
                            )
                            .into(),
                        ));
                    }
                }
            }
            Next::Report => hang_report(
                batches,
                stall.idle(now),
                patience.hang_report.unwrap_or_default(),
            ),
            Next::Fail { idle } => return Err(stall_error(batches, idle)),
            Next::Sleep { until } => {
                sources.clear();
                for b in batches.iter() {
                    b.wait_sources(&mut sources);
                }
                wait(batches, &sources, until, clock)?;
            }
        }
    }
}

/// The error of an operation that made no progress for `idle`.
fn stall_error(batches: &[Batch<'_>], idle: Duration) -> Error {
    let blocked: Vec<Blocked> = batches
        .iter()
        .filter(|b| !b.finished())
        .flat_map(|b| b.blocked())
        .collect();
    // Blame the peers the operation waits for, not those of steps that
    // wait for earlier steps.
    let waiting = blocked.iter().any(|b| b.on.kind != 3);
    let mut peers: Vec<usize> = blocked
        .iter()
        .filter(|b| !waiting || b.on.kind != 3)
        .map(|b| b.on.peer)
        .collect();
    peers.sort_unstable();
    peers.dedup();
    let peers: Vec<String> = peers.iter().map(usize::to_string).collect();
    let mut lines: Vec<String> = blocked.into_iter().map(|b| b.line).collect();
    lines.sort();
    let label = batches.first().map_or("", |b| b.links.label.as_str());
    Error::Remote(
        format!(
            "{label}: no progress from rank(s) {} for {:.1} s (HETCCL_TIMEOUT_S): {}",
            peers.join(", "),
            idle.as_secs_f64(),
            lines.join("; ")
        )
        .into(),
    )
}

/// Logs this rank's hang report lines, from one rank per node the node's
/// hang summary (see `watch`), and with the status service on, its view of
/// every rank (`telemetry::status`).
fn hang_report(batches: &[Batch<'_>], idle: Duration, after: Duration) {
    for b in batches.iter().filter(|b| !b.finished()) {
        for line in b.describe_wait() {
            tracing::warn!(target: "hetccl::COLL",
                "hang report: {} rank {} idle for {:.1} s: {line}",
                b.links.label, b.links.rank, idle.as_secs_f64());
        }
        b.links
            .watch
            .stalled(idle, b.blocked().first().map(|x| x.on));
        if let Some(lines) = b.links.watch.summary(b.seq(), after) {
            for line in lines {
                tracing::warn!(target: "hetccl::COLL", "{line}");
            }
        }
    }
    crate::telemetry::status::log_view();
}

/// The longest wait in `poll(2)` on the blocked links' sockets: a readiness
/// the links did not announce costs at most this.
const FD_WAIT_MAX: Duration = Duration::from_millis(1);

/// Sleeps until a link may have moved, or `until`: on the doorbell when
/// every blocked link rings one (shm); in `poll(2)` on their sockets when
/// every blocked link names them (TCP driven from this thread), waking as
/// soon as the peer's bytes arrive, for at most [`FD_WAIT_MAX`]; else
/// briefly through the clock. Each sleep is bounded by 10 ms, so aborts
/// are noticed within ~10 ms.
fn wait(
    batches: &mut [Batch<'_>],
    sources: &[WaitSource],
    until: Instant,
    clock: &dyn Clock,
) -> Result<()> {
    let max = until
        .saturating_duration_since(clock.now())
        .min(Duration::from_millis(10));
    let bell = batches.iter().find_map(|b| b.links.bell);
    let polled = sources.iter().any(|s| *s != WaitSource::Bell);
    let Some(bell) = bell.filter(|_| !polled) else {
        let mut fds = Vec::new();
        let on_fds = !sources.is_empty()
            && sources.iter().all(|s| *s == WaitSource::Fds)
            && batches
                .iter()
                .filter(|b| !b.finished())
                .all(|b| b.wait_fds(&mut fds));
        if on_fds {
            clock.wait_fds(&mut fds, until.min(clock.now() + FD_WAIT_MAX));
        } else {
            clock.nap(Duration::from_micros(20), until);
        }
        return Ok(());
    };
    // Announce the sleep, then poll once more: a peer that publishes after
    // `prepare` changes the sequence, so the sleep cannot miss it.
    let seq = bell.prepare();
    let mut moved = Ok(false);
    for b in batches.iter_mut() {
        if !b.finished() {
            match b.poll() {
                Ok(m) => moved = moved.map(|x| x | m),
                Err(e) => moved = Err(b.links.stop.error().unwrap_or(e)),
            }
        }
    }
    if matches!(moved, Ok(false)) {
        bell.sleep(seq, max);
    }
    bell.done();
    moved.map(drop)
}
