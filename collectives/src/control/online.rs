//! Online adaptation of the algorithm choice (`HETCCL_TUNE=online`, or the
//! option `tune=online`).
//!
//! Per (collective, size class, allowed algorithms) — a size class is a
//! power-of-two bucket of the call's bytes — a [`Bucket`] holds the current
//! choice (first the model's, `launch::job::choose`) and the runner-up (the
//! next cheapest by the cost model that the filter allows). Calls are
//! counted per bucket. In every window of [`WINDOW`] calls, the calls whose
//! index within the window is `EXPLORE_EVERY - 1` modulo [`EXPLORE_EVERY`]
//! run the runner-up; the others run the current choice. Each rank times its
//! calls (the first call of each algorithm, which builds the plan, is not
//! counted). At the first call of each new window, the ranks exchange their
//! means over the bootstrap ring and take the slowest rank's mean for each
//! algorithm; when the runner-up's is lower than the current's by more than
//! [`MARGIN`], the two swap from that call on, and the switch is logged at
//! INFO under `hetccl::TUNING`.
//!
//! Every decision is a function of the call count and of the exchanged
//! numbers, which are the same on every rank, so every rank runs the same
//! algorithm on the same call. Only blocking calls outside groups are
//! counted and timed; calls inside a group run the bucket's current choice
//! (every rank must group its calls the same way, as NCCL requires of
//! collectives anyway). Single-node calls that take the direct paths
//! (`crate::intranode`) never reach the choice.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use hetccl_core::config::TuneMode;

use crate::algo::{estimate_us, supported, AlgoFilter, Algorithm, Collective};
use crate::comm::engine::Engine;
use crate::comm::Comm;
use crate::error::{Error, Result};

/// Calls per window.
pub const WINDOW: u64 = 64;
/// One call in this many runs the runner-up (8 of every 64).
pub const EXPLORE_EVERY: u64 = 8;
/// How much faster the runner-up must be to take over (10 %).
pub const MARGIN: f64 = 0.10;

/// The most buckets kept per communicator; all are dropped when a new one
/// would exceed it (the same call on every rank, so they stay in step).
pub const MAX_BUCKETS: usize = 1024;

/// Bytes of one rank's window report.
const REPORT: usize = 24;

/// Which calls share a bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BucketKey {
    /// The collective.
    pub coll: Collective,
    /// `k` for calls of `2^(k-1)` to `2^k - 1` bytes (0 for 0 bytes).
    pub class: u32,
    /// The algorithms the filter allows (`AlgoFilter::mask`).
    pub mask: u8,
}

/// Time spent in calls of one algorithm during a window.
#[derive(Debug, Clone, Copy, Default)]
struct Stat {
    sum_us: f64,
    n: u32,
}

impl Stat {
    fn mean(self) -> f64 {
        if self.n == 0 {
            0.0
        } else {
            self.sum_us / f64::from(self.n)
        }
    }
}

/// The state of one bucket.
#[derive(Debug, Clone)]
pub struct Bucket {
    /// What most calls run.
    pub current: Algorithm,
    /// What exploration calls run (`None`: nothing else is allowed).
    pub runner: Option<Algorithm>,
    /// Calls counted so far.
    pub calls: u64,
    /// Switches made so far.
    pub switches: u32,
    cur: Stat,
    run: Stat,
    /// Algorithms that ran once already (their first call builds a plan).
    seen: Vec<Algorithm>,
}

/// A communicator's adaptation state.
#[derive(Debug, Default)]
pub struct Online {
    buckets: HashMap<BucketKey, Bucket>,
    /// The call being run: its bucket and algorithm, timed by [`finished`].
    pending: Option<(BucketKey, Algorithm)>,
}

impl Online {
    /// A bucket's state, if it has one.
    pub fn bucket(&self, k: &BucketKey) -> Option<&Bucket> {
        self.buckets.get(k)
    }
}

/// The size class of `bytes`.
pub fn class(bytes: usize) -> u32 {
    usize::BITS - bytes.leading_zeros()
}

/// The cheapest algorithm by the model, other than `current`, that `filter`
/// allows for `coll`.
fn runner_up(
    e: &Engine,
    coll: Collective,
    bytes: usize,
    filter: &AlgoFilter,
    current: Algorithm,
) -> Option<Algorithm> {
    supported(coll)
        .iter()
        .copied()
        .filter(|&a| a != current && filter.allows(coll, a))
        .filter_map(|a| estimate_us(coll, a, bytes, &e.topo, &e.costs).map(|t| (t, a)))
        .min_by(|x, y| x.0.total_cmp(&y.0))
        .map(|(_, a)| a)
}

/// The algorithm online adaptation runs for this call, or `None` when it is
/// off (then the caller chooses as usual). `counted`: the call is a
/// blocking call outside a group (it is counted and timed). `model` is the
/// usual choice, asked once per bucket.
pub fn pick(
    e: &Engine,
    comm: &Arc<Comm>,
    coll: Collective,
    bytes: usize,
    filter: &AlgoFilter,
    counted: bool,
    model: impl FnOnce() -> Result<Algorithm>,
) -> Result<Option<Algorithm>> {
    if e.control.tune() != TuneMode::Online || matches!(coll, Collective::Send | Collective::Recv) {
        return Ok(None);
    }
    let key = BucketKey {
        coll,
        class: class(bytes),
        mask: filter.mask(coll),
    };
    let mut st = e.control.online.lock();
    st.pending = None;
    if st.buckets.len() >= MAX_BUCKETS && !st.buckets.contains_key(&key) {
        st.buckets.clear();
    }
    let b = match st.buckets.entry(key) {
        std::collections::hash_map::Entry::Occupied(o) => o.into_mut(),
        std::collections::hash_map::Entry::Vacant(v) => {
            let current = model()?;
            v.insert(Bucket {
                current,
                runner: runner_up(e, coll, bytes, filter, current),
                calls: 0,
                switches: 0,
                cur: Stat::default(),
                run: Stat::default(),
                seen: Vec::new(),
            })
        }
    };
    if !counted {
        return Ok(Some(b.current));
    }
    let i = b.calls;
    b.calls += 1;
    if i > 0 && i % WINDOW == 0 {
        if let Err(err) = window_end(e, comm.rank, key, b, i) {
            // The bootstrap ring may hold part of the exchange: nothing
            // more may run on this communicator.
            crate::launch::poison(comm, &err);
            return Err(err);
        }
    }
    let explore = i % EXPLORE_EVERY == EXPLORE_EVERY - 1;
    let algo = match b.runner {
        Some(r) if explore => r,
        _ => b.current,
    };
    st.pending = Some((key, algo));
    Ok(Some(algo))
}

/// Records the time of the call [`pick`] chose last (`None` when it
/// failed or was not counted).
pub fn finished(e: &Engine, took: Option<Duration>) {
    let mut st = e.control.online.lock();
    let Some((key, algo)) = st.pending.take() else {
        return;
    };
    let (Some(took), Some(b)) = (took, st.buckets.get_mut(&key)) else {
        return;
    };
    if !b.seen.contains(&algo) {
        b.seen.push(algo);
        return;
    }
    let us = took.as_secs_f64() * 1e6;
    let s = if algo == b.current {
        &mut b.cur
    } else if Some(algo) == b.runner {
        &mut b.run
    } else {
        return;
    };
    s.sum_us += us;
    s.n += 1;
}

fn encode(b: &Bucket) -> [u8; REPORT] {
    let mut out = [0u8; REPORT];
    out[..8].copy_from_slice(&b.cur.mean().to_le_bytes());
    out[8..12].copy_from_slice(&b.cur.n.to_le_bytes());
    out[12..20].copy_from_slice(&b.run.mean().to_le_bytes());
    out[20..24].copy_from_slice(&b.run.n.to_le_bytes());
    out
}

/// One rank's (current mean, n, runner-up mean, n), checked.
fn decode(b: &[u8]) -> Option<(f64, u32, f64, u32)> {
    if b.len() != REPORT {
        return None;
    }
    let f = |r: std::ops::Range<usize>| f64::from_le_bytes(b[r].try_into().unwrap_or([0; 8]));
    let n = |r: std::ops::Range<usize>| u32::from_le_bytes(b[r].try_into().unwrap_or([0; 4]));
    let out = (f(0..8), n(8..12), f(12..20), n(20..24));
    (out.0.is_finite() && out.0 >= 0.0 && out.2.is_finite() && out.2 >= 0.0).then_some(out)
}

/// The combined verdict of every rank's report: `Some((current, runner))`
/// (the slowest rank's means) when every rank timed both algorithms.
fn combine(reports: &[(f64, u32, f64, u32)]) -> Option<(f64, f64)> {
    if reports.is_empty() || reports.iter().any(|r| r.1 == 0 || r.3 == 0) {
        return None;
    }
    let cur = reports.iter().map(|r| r.0).fold(0.0, f64::max);
    let run = reports.iter().map(|r| r.2).fold(0.0, f64::max);
    Some((cur, run))
}

/// Whether the runner-up takes over.
fn switches(cur_us: f64, run_us: f64) -> bool {
    run_us < cur_us * (1.0 - MARGIN)
}

/// The exchange at the start of a window: call `i` of bucket `key`.
fn window_end(e: &Engine, rank: usize, key: BucketKey, b: &mut Bucket, i: u64) -> Result<()> {
    let all = e.bootstrap.lock().allgather(&encode(b), REPORT)?;
    let reports = all
        .iter()
        .enumerate()
        .map(|(r, x)| {
            decode(x).ok_or_else(|| {
                Error::Internal(format!("malformed tuning report from rank {r}").into())
            })
        })
        .collect::<Result<Vec<_>>>()?;
    b.cur = Stat::default();
    b.run = Stat::default();
    let (Some((cur, run)), Some(runner)) = (combine(&reports), b.runner) else {
        return Ok(());
    };
    if switches(cur, run) {
        tracing::info!(target: "hetccl::TUNING",
            "{} rank {rank}: online: {} class {} ({} B and up): switch {} -> {} from call {i} \
             (window means {cur:.0} us vs {run:.0} us)",
            e.settings.label(e.comm_hash), key.coll, key.class,
            if key.class == 0 { 0 } else { 1usize << (key.class - 1) },
            b.current.name(), runner.name());
        b.runner = Some(b.current);
        b.current = runner;
        b.switches += 1;
    } else {
        tracing::debug!(target: "hetccl::TUNING",
            "rank {rank}: online: {} class {}: keep {} ({cur:.0} us vs {} {run:.0} us)",
            key.coll, key.class, b.current.name(), runner.name());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_round_trip_and_combine() {
        let b = Bucket {
            current: Algorithm::Ring,
            runner: Some(Algorithm::Tree),
            calls: 0,
            switches: 0,
            cur: Stat {
                sum_us: 300.0,
                n: 3,
            },
            run: Stat { sum_us: 50.0, n: 1 },
            seen: Vec::new(),
        };
        let r = decode(&encode(&b)).unwrap();
        assert_eq!(r, (100.0, 3, 50.0, 1));
        assert_eq!(decode(&[0; 23]), None);
        let mut nan = encode(&b);
        nan[..8].copy_from_slice(&f64::NAN.to_le_bytes());
        assert_eq!(decode(&nan), None);
        // The slowest rank counts; a rank without samples blocks a verdict.
        assert_eq!(
            combine(&[(100.0, 3, 50.0, 1), (120.0, 3, 95.0, 1)]),
            Some((120.0, 95.0))
        );
        assert_eq!(combine(&[(100.0, 3, 50.0, 1), (120.0, 3, 0.0, 0)]), None);
        assert!(switches(120.0, 95.0));
        assert!(!switches(100.0, 91.0));
        assert_eq!(class(0), 0);
        assert_eq!(class(1), 1);
        assert_eq!(class(4096), 13);
        assert_eq!(class(8191), 13);
    }
}
