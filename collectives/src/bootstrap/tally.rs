//! A listener's count of the connections it dropped before they
//! authenticated, logged as one WARN summary at most once a second (a flood
//! would otherwise write a line per connection); each drop is logged at
//! DEBUG with its peer and reason.

use std::fmt::Display;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// How often the summary may be logged.
pub const EVERY: Duration = Duration::from_secs(1);

/// Why a connection was dropped before it authenticated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Why {
    /// Closed or reset by the peer before its answer was complete.
    Closed,
    /// Broke the protocol (an oversized answer frame).
    Garbage,
    /// Answered, but the answer failed the check.
    Denied,
    /// Did not answer within its authentication deadline.
    TimedOut,
    /// Idle while the pending set was full: dropped to make room.
    Evicted,
    /// `accept` itself failed (out of descriptors or memory).
    AcceptFailed,
}

const KINDS: [(Why, &str); 6] = [
    (Why::Closed, "closed or reset early"),
    (Why::Garbage, "broke the protocol"),
    (Why::Denied, "failed authentication"),
    (Why::TimedOut, "timed out"),
    (Why::Evicted, "evicted to make room"),
    (Why::AcceptFailed, "failed accepts"),
];

fn show(a: Option<SocketAddr>) -> String {
    a.map_or_else(|| "?".into(), |a| a.to_string())
}

/// The counts since the last summary.
#[derive(Debug)]
pub struct Tally {
    counts: [u64; KINDS.len()],
    /// When the last summary was logged (`None`: never).
    logged: Option<Instant>,
    last: String,
    /// The listener, for the summary.
    pub at: Option<SocketAddr>,
}

impl Default for Tally {
    fn default() -> Self {
        Self {
            counts: [0; KINDS.len()],
            logged: None,
            last: String::new(),
            at: None,
        }
    }
}

impl Tally {
    /// Counts one drop, logs it at DEBUG, and logs the summary if one is due.
    pub fn note(&mut self, why: Why, peer: Option<SocketAddr>, detail: &dyn Display) {
        self.note_at(Instant::now(), why, peer, detail);
    }

    fn note_at(&mut self, now: Instant, why: Why, peer: Option<SocketAddr>, detail: &dyn Display) {
        tracing::debug!(target: "hetccl::BOOTSTRAP",
            "listener {}: dropped a connection from {} ({why:?}): {detail}", show(self.at), show(peer));
        let i = KINDS
            .iter()
            .position(|(w, _)| *w == why)
            .expect("every kind listed");
        self.counts[i] += 1;
        self.last = format!("{}: {detail}", show(peer));
        self.flush(now, false);
    }

    /// Logs the summary if anything was counted and (unless `force`) the
    /// last one is at least [`EVERY`] old.
    pub fn flush(&mut self, now: Instant, force: bool) {
        let total: u64 = self.counts.iter().sum();
        if total == 0 || (!force && self.logged.is_some_and(|t| now < t + EVERY)) {
            return;
        }
        let parts: Vec<String> = KINDS
            .iter()
            .zip(self.counts)
            .filter(|(_, n)| *n > 0)
            .map(|((_, what), n)| format!("{n} {what}"))
            .collect();
        let since = self.logged.map_or(String::new(), |t| {
            format!(" in the last {:.1} s", (now - t).as_secs_f64())
        });
        tracing::warn!(target: "hetccl::BOOTSTRAP",
            "listener {:?}: dropped {total} connection(s) that did not authenticate{since}: {} \
             (last: {})", show(self.at), parts.join(", "), self.last);
        self.counts = [0; KINDS.len()];
        self.logged = Some(now);
    }

    /// How many drops wait for the next summary.
    pub fn unlogged(&self) -> u64 {
        self.counts.iter().sum()
    }
}

impl Drop for Tally {
    fn drop(&mut self) {
        self.flush(Instant::now(), true);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summarises_at_most_once_per_interval() {
        let mut t = Tally::default();
        let now = Instant::now();
        // The first drop is logged at once.
        t.note_at(now, Why::Closed, None, &"gone");
        assert_eq!(t.unlogged(), 0);
        // Later ones within the interval wait for the summary.
        for _ in 0..1000 {
            t.note_at(now, Why::Evicted, None, &"full");
        }
        t.note_at(now, Why::Denied, None, &"bad");
        assert_eq!(t.unlogged(), 1001);
        t.flush(now + EVERY / 2, false);
        assert_eq!(t.unlogged(), 1001, "too early");
        t.flush(now + EVERY, false);
        assert_eq!(t.unlogged(), 0);
        t.note(Why::TimedOut, None, &"slow");
        t.flush(Instant::now(), true);
        assert_eq!(t.unlogged(), 0);
    }
}
