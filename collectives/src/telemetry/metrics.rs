//! A communicator's metrics: relaxed atomic counters, always on.
//!
//! One thread at a time runs a communicator's operations (the caller's
//! claim, `comm::owner`, and the engine's exec gate), so the counters have
//! one writer at a time, and [`bump`] adds with a plain load and store
//! instead of a locked read-modify-write. A call costs a few such adds and
//! no allocation, lock or system call. Latency is measured on one call in
//! [`LATENCY_SAMPLE`] of each kind (two time-stamp counter reads), and on
//! every call while the timeline is on. Readers (`hetcclCommGetStats`, the
//! metrics file) take a [`Snapshot`]; counters read at slightly different
//! moments may disagree by the operation in flight.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use crate::algo::{Algorithm, Collective};
use crate::cost::TransportKind;

/// Histogram buckets: upper bounds 2^10 ns (≈1 µs) to 2^36 ns (≈69 s),
/// doubling, then +Inf.
pub const BUCKETS: usize = 28;
/// The exponent of the first bucket's upper bound (2^10 ns).
const FIRST_EXP: u32 = 10;

/// What a collective kind's calls ran as: the executor's algorithms, then
/// the two direct paths of single-node communicators.
pub const ALGO_NAMES: [&str; 8] = [
    "Ring",
    "Tree",
    "Direct",
    "HalvingDoubling",
    "Hierarchical",
    "Pairwise",
    "Board",
    "SingleCopy",
];
/// [`ALGO_NAMES`] index of the board path.
pub const ALGO_BOARD: usize = 6;
/// [`ALGO_NAMES`] index of the single-copy path.
pub const ALGO_COPY: usize = 7;

/// The [`ALGO_NAMES`] index of an executor algorithm.
pub fn algo_index(a: Algorithm) -> usize {
    Algorithm::ALL.iter().position(|&x| x == a).unwrap_or(0)
}

/// The upper bound of bucket `i` in nanoseconds; `None` for the last (+Inf).
pub fn bucket_upper_ns(i: usize) -> Option<u64> {
    (i + 1 < BUCKETS).then(|| 1u64 << (FIRST_EXP + i as u32))
}

/// The bucket of a duration: the first whose upper bound is >= `ns`.
#[inline]
pub fn bucket_of(ns: u64) -> usize {
    if ns <= 1 << FIRST_EXP {
        return 0;
    }
    let bits = 64 - (ns - 1).leading_zeros();
    ((bits - FIRST_EXP) as usize).min(BUCKETS - 1)
}

/// Latency is measured on one call in this many of each kind (the first,
/// the ninth, ...), and on every call while the timeline is on.
pub const LATENCY_SAMPLE: u64 = 8;

/// Adds `n` to a counter that one thread at a time writes (see the module
/// header): a relaxed load and store, no locked instruction. Readers on
/// other threads see a value that was current at some point.
#[inline]
pub fn bump(c: &AtomicU64, n: u64) {
    c.store(c.load(Relaxed).wrapping_add(n), Relaxed);
}

/// A log-spaced histogram of durations.
#[derive(Debug, Default)]
pub struct Histogram {
    counts: [AtomicU64; BUCKETS],
    sum_ns: AtomicU64,
}

impl Histogram {
    /// Counts one duration.
    #[inline]
    pub fn record(&self, ns: u64) {
        bump(&self.counts[bucket_of(ns)], 1);
        bump(&self.sum_ns, ns);
    }

    /// The current counts.
    pub fn snapshot(&self) -> HistSnapshot {
        HistSnapshot {
            counts: std::array::from_fn(|i| self.counts[i].load(Relaxed)),
            sum_ns: self.sum_ns.load(Relaxed),
        }
    }
}

/// A histogram's counts at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HistSnapshot {
    /// Per bucket (not cumulative).
    pub counts: [u64; BUCKETS],
    /// Sum of the durations, ns.
    pub sum_ns: u64,
}

impl HistSnapshot {
    /// Number of durations counted.
    pub fn count(&self) -> u64 {
        self.counts.iter().sum()
    }

    /// The upper bound (ns) of the bucket holding quantile `q` (0..=1);
    /// `None` when empty or in the +Inf bucket.
    pub fn quantile_upper_ns(&self, q: f64) -> Option<u64> {
        let n = self.count();
        if n == 0 {
            return None;
        }
        let want = ((q * n as f64).ceil() as u64).clamp(1, n);
        let mut seen = 0;
        for (i, c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= want {
                return bucket_upper_ns(i);
            }
        }
        None
    }
}

/// One peer link's counters (the executor's links; the direct paths of
/// single-node communicators are counted per collective only).
#[derive(Debug, Default)]
pub struct LinkStats {
    /// The transport to the peer (`None` for self and unconnected peers).
    pub transport: Option<TransportKind>,
    /// Bytes sent to the peer.
    pub bytes_sent: AtomicU64,
    /// Messages (plan steps) sent to the peer, completed.
    pub msgs_sent: AtomicU64,
    /// Bytes received from the peer.
    pub bytes_recv: AtomicU64,
    /// Messages received from the peer, completed.
    pub msgs_recv: AtomicU64,
    /// Message steps to or from the peer that failed.
    pub errors: AtomicU64,
    /// Packs sent to the peer: wire messages that carried coalesced
    /// point-to-point messages (`transport::coalesce`).
    pub packs_sent: AtomicU64,
    /// `ncclSend` calls to the peer while the timeline is on (the sequence
    /// of point-to-point trace ids).
    pub send_seq: AtomicU64,
    /// `ncclRecv` calls from the peer while the timeline is on.
    pub recv_seq: AtomicU64,
}

/// One collective kind's counters.
#[derive(Debug, Default)]
pub struct CollStats {
    /// Calls issued (picks the calls whose latency is measured).
    pub issued: AtomicU64,
    /// Calls completed.
    pub calls: AtomicU64,
    /// Bytes of the calls (count × datatype size, as NCCL's tests count).
    pub bytes: AtomicU64,
    /// Calls per algorithm ([`ALGO_NAMES`]).
    pub algos: [AtomicU64; ALGO_NAMES.len()],
    /// Call-to-completion latency, of the measured calls.
    pub latency: Histogram,
}

/// A communicator's metrics.
#[derive(Debug)]
pub struct Metrics {
    /// This rank.
    pub rank: usize,
    /// Per peer, by rank.
    pub links: Box<[LinkStats]>,
    /// Per collective kind, by `Collective as usize`.
    pub colls: [CollStats; Collective::ALL.len()],
    /// Call to start of the executor (queued in a group, waiting for the
    /// communicator).
    pub queue_wait: Histogram,
    /// Device-buffer calls: from the call (enqueued on its stream) to the
    /// GPU proxy starting it (the stream reached it). Written by the
    /// communicator's proxy thread only.
    pub device_queue_wait: Histogram,
    /// Device-buffer calls the proxy ran so far (the sequence of their
    /// trace ids: the same on every rank, which issue them in one order).
    pub device_seq: AtomicU64,
    /// Collective calls so far (the sequence of collective trace ids: the
    /// same on every rank, whatever path the calls took).
    pub coll_seq: AtomicU64,
}

impl Metrics {
    /// Zeroed metrics of `rank` with one transport (or none) per peer.
    pub fn new(rank: usize, transports: &[Option<TransportKind>]) -> Self {
        Self {
            rank,
            links: transports
                .iter()
                .map(|&t| LinkStats {
                    transport: t,
                    ..LinkStats::default()
                })
                .collect(),
            colls: Default::default(),
            queue_wait: Histogram::default(),
            device_queue_wait: Histogram::default(),
            device_seq: AtomicU64::new(0),
            coll_seq: AtomicU64::new(0),
        }
    }

    /// The stats of a peer link, if the peer exists.
    #[inline]
    pub fn link(&self, peer: usize) -> Option<&LinkStats> {
        self.links.get(peer)
    }

    /// Counts a call as it is made; returns when (in `clock` ticks) if its
    /// latency is to be measured, else 0.
    #[inline]
    pub fn issue(&self, kind: Collective) -> u64 {
        let c = &self.colls[kind as usize];
        let n = c.issued.load(Relaxed);
        c.issued.store(n.wrapping_add(1), Relaxed);
        if n % LATENCY_SAMPLE == 0 || super::trace::on() {
            super::clock::ticks()
        } else {
            0
        }
    }

    /// Counts one completed call, with its latency if `called` (from
    /// [`Metrics::issue`]) is not 0. Returns the end tick (0 if not read).
    #[inline]
    pub fn complete(&self, kind: Collective, bytes: usize, algo: usize, called: u64) -> u64 {
        let c = &self.colls[kind as usize];
        bump(&c.calls, 1);
        bump(&c.bytes, bytes as u64);
        bump(&c.algos[algo], 1);
        if called == 0 {
            return 0;
        }
        let end = super::clock::ticks();
        c.latency
            .record(super::clock::to_ns(end.saturating_sub(called)));
        end
    }

    /// The next collective trace sequence number.
    #[inline]
    pub fn next_coll_seq(&self) -> u64 {
        self.coll_seq.fetch_add(1, Relaxed)
    }

    /// The next point-to-point sequence number for a send to (or receive
    /// from) `peer`: the k-th send from a to b matches the k-th receive at b
    /// from a.
    #[inline]
    pub fn next_p2p_seq(&self, peer: usize, send: bool) -> u64 {
        match self.links.get(peer) {
            Some(l) if send => l.send_seq.fetch_add(1, Relaxed),
            Some(l) => l.recv_seq.fetch_add(1, Relaxed),
            None => 0,
        }
    }

    /// Every counter at one moment.
    pub fn snapshot(&self) -> Snapshot {
        Snapshot {
            rank: self.rank,
            links: self
                .links
                .iter()
                .enumerate()
                .filter_map(|(peer, l)| {
                    Some(LinkSnapshot {
                        peer,
                        transport: l.transport?,
                        bytes_sent: l.bytes_sent.load(Relaxed),
                        msgs_sent: l.msgs_sent.load(Relaxed),
                        bytes_recv: l.bytes_recv.load(Relaxed),
                        msgs_recv: l.msgs_recv.load(Relaxed),
                        errors: l.errors.load(Relaxed),
                        packs_sent: l.packs_sent.load(Relaxed),
                    })
                })
                .collect(),
            colls: Collective::ALL
                .iter()
                .map(|&k| {
                    let c = &self.colls[k as usize];
                    CollSnapshot {
                        kind: k,
                        calls: c.calls.load(Relaxed),
                        bytes: c.bytes.load(Relaxed),
                        algos: std::array::from_fn(|i| c.algos[i].load(Relaxed)),
                        latency: c.latency.snapshot(),
                    }
                })
                .collect(),
            queue_wait: self.queue_wait.snapshot(),
            device_queue_wait: self.device_queue_wait.snapshot(),
        }
    }
}

/// A link's counters at one moment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkSnapshot {
    /// The peer's rank.
    pub peer: usize,
    /// Its transport.
    pub transport: TransportKind,
    /// Bytes sent.
    pub bytes_sent: u64,
    /// Messages sent.
    pub msgs_sent: u64,
    /// Bytes received.
    pub bytes_recv: u64,
    /// Messages received.
    pub msgs_recv: u64,
    /// Failed message steps.
    pub errors: u64,
    /// Packs of coalesced messages sent.
    pub packs_sent: u64,
}

/// A collective kind's counters at one moment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CollSnapshot {
    /// The kind.
    pub kind: Collective,
    /// Calls.
    pub calls: u64,
    /// Bytes.
    pub bytes: u64,
    /// Calls per algorithm ([`ALGO_NAMES`]).
    pub algos: [u64; ALGO_NAMES.len()],
    /// Latency.
    pub latency: HistSnapshot,
}

/// Every counter of a communicator at one moment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    /// This rank.
    pub rank: usize,
    /// The connected peers' links, by rank.
    pub links: Vec<LinkSnapshot>,
    /// Every collective kind, in `Collective::ALL` order.
    pub colls: Vec<CollSnapshot>,
    /// Queue wait.
    pub queue_wait: HistSnapshot,
    /// Device-buffer calls' enqueue-to-start wait.
    pub device_queue_wait: HistSnapshot,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_log_spaced_and_bound_their_values() {
        assert_eq!(bucket_of(0), 0);
        assert_eq!(bucket_of(1024), 0);
        assert_eq!(bucket_of(1025), 1);
        assert_eq!(bucket_of(2048), 1);
        assert_eq!(bucket_of(2049), 2);
        assert_eq!(bucket_of(u64::MAX), BUCKETS - 1);
        for ns in [1u64, 999, 1500, 70_000, 3_000_000_000, 1 << 36] {
            let b = bucket_of(ns);
            assert!(ns <= bucket_upper_ns(b).unwrap(), "{ns}");
            if b > 0 {
                assert!(ns > bucket_upper_ns(b - 1).unwrap(), "{ns}");
            }
        }
        assert_eq!(bucket_upper_ns(BUCKETS - 1), None);
        assert_eq!(bucket_of((1 << 36) + 1), BUCKETS - 1);
    }

    #[test]
    fn quantiles_come_from_the_buckets() {
        let h = Histogram::default();
        for _ in 0..98 {
            h.record(1500);
        }
        h.record(100_000);
        h.record(100_000);
        let s = h.snapshot();
        assert_eq!(s.count(), 100);
        assert_eq!(s.sum_ns, 98 * 1500 + 200_000);
        assert_eq!(s.quantile_upper_ns(0.5), Some(2048));
        assert_eq!(s.quantile_upper_ns(0.99), Some(131_072));
        assert_eq!(
            HistSnapshot {
                counts: [0; BUCKETS],
                sum_ns: 0
            }
            .quantile_upper_ns(0.5),
            None
        );
    }

    #[test]
    fn calls_and_links_are_counted() {
        let m = Metrics::new(0, &[None, Some(TransportKind::Tcp)]);
        let called = m.issue(Collective::AllReduce);
        assert_ne!(called, 0, "the first call is measured");
        m.complete(Collective::AllReduce, 64, ALGO_BOARD, called);
        assert_eq!(m.issue(Collective::AllReduce), 0, "the second is not");
        m.complete(Collective::AllReduce, 64, ALGO_BOARD, 0);
        m.link(1).unwrap().bytes_sent.fetch_add(64, Relaxed);
        assert_eq!(m.next_p2p_seq(1, true), 0);
        assert_eq!(m.next_p2p_seq(1, true), 1);
        assert_eq!(m.next_p2p_seq(1, false), 0);
        let s = m.snapshot();
        assert_eq!(s.links.len(), 1);
        assert_eq!(s.links[0].bytes_sent, 64);
        assert_eq!(m.links[1].send_seq.load(Relaxed), 2);
        let ar = &s.colls[0];
        assert_eq!(
            (ar.kind, ar.calls, ar.bytes),
            (Collective::AllReduce, 2, 128)
        );
        assert_eq!(ar.algos[ALGO_BOARD], 2);
        assert_eq!(ar.latency.count(), 1);
    }
}
