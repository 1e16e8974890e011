//! A timed replay of plans: how long would all ranks' plans take on links
//! with latency α and inverse bandwidth β?
//!
//! Each rank has one egress port (its sends are serialised) and one CPU
//! (its local steps and the reductions of its receives are serialised).
//! A message of `m` bytes that starts at `t` arrives at `t + α + m·β` and
//! occupies the sender's port until `t + m·β`; the send is complete on
//! arrival. A step starts when its dependencies are complete and, for
//! messages, when the previous message of its lane has started (sends) or
//! been received (receives). Among the steps that could start, the earliest
//! goes first, and on a tie the one earlier in its plan (list scheduling:
//! plan order is priority order, as it should be in an executor). The result shows whether a schedule
//! pipelines (makespan ≈ `(steps + chunks - 1)` chunk times rather than
//! `steps × chunks`) and lets the cost model be checked against the
//! schedules it describes. No data moves; [`super::sim`] checks the bytes.

use std::collections::HashMap;

use super::plan::{Plan, StepKind};

/// The link model: α and β of the link between two ranks, and the local
/// cost per byte of copies and reductions.
pub trait Links {
    /// `(alpha_us, beta_us_per_byte)` from `from` to `to`.
    fn link(&self, from: u32, to: u32) -> (f64, f64);
    /// Microseconds per byte of a local copy or reduction.
    fn local_us_per_byte(&self) -> f64;
}

/// The same link everywhere.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Uniform {
    /// Latency, microseconds.
    pub alpha_us: f64,
    /// Microseconds per byte.
    pub beta_us_per_byte: f64,
    /// Microseconds per byte of local work.
    pub local_us_per_byte: f64,
}

impl Links for Uniform {
    fn link(&self, _from: u32, _to: u32) -> (f64, f64) {
        (self.alpha_us, self.beta_us_per_byte)
    }
    fn local_us_per_byte(&self) -> f64 {
        self.local_us_per_byte
    }
}

/// Why a replay stopped.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TimingError {
    /// Steps remain but none can start (a plan error; [`super::sim`] says
    /// more).
    #[error("no step can start: {0} steps left")]
    Stuck(usize),
    /// Plans and ranks do not line up.
    #[error("plan {0} is not for rank {0} of the plan count")]
    Setup(usize),
}

struct RankState<'a> {
    plan: &'a Plan,
    missing: Vec<u32>,
    dependents: Vec<Vec<u32>>,
    ready_at: Vec<f64>,
    candidates: Vec<u32>,
    /// Per step: (global lane, position in the lane, is a send), or `None`
    /// for local steps.
    lane_of: Vec<Option<(usize, usize, bool)>>,
    port_free: f64,
    cpu_free: f64,
}

/// One (sender, receiver, channel): messages in flight (arrival times) and
/// ordering state.
#[derive(Default)]
struct Lane {
    arrivals: std::collections::VecDeque<f64>,
    sent: usize,
    received: usize,
    last_send_start: f64,
    last_recv_done: f64,
}

/// The time in microseconds until every rank's plan is complete.
pub fn makespan(plans: &[Plan], links: &dyn Links) -> Result<f64, TimingError> {
    let n = plans.len();
    let mut ranks: Vec<RankState> = Vec::with_capacity(n);
    let mut lane_ids: HashMap<(u32, u32, u8), usize> = HashMap::new();
    for (r, p) in plans.iter().enumerate() {
        if p.rank as usize != r || p.nranks as usize != n {
            return Err(TimingError::Setup(r));
        }
        let k = p.steps.len();
        let mut dependents = vec![Vec::new(); k];
        let mut missing = vec![0u32; k];
        let mut candidates = Vec::new();
        let mut counts: HashMap<usize, usize> = HashMap::new();
        let mut lane_of = Vec::with_capacity(k);
        for (i, s) in p.steps.iter().enumerate() {
            missing[i] = s.deps.len() as u32;
            for &d in &s.deps {
                dependents[d as usize].push(i as u32);
            }
            if s.deps.is_empty() {
                candidates.push(i as u32);
            }
            lane_of.push(s.kind.message().map(|(peer, chan, send)| {
                let key = if send {
                    (p.rank, peer, chan)
                } else {
                    (peer, p.rank, chan)
                };
                let next = lane_ids.len();
                let id = *lane_ids.entry(key).or_insert(next);
                let c = counts.entry(id).or_insert(0);
                *c += 1;
                (id, *c - 1, send)
            }));
        }
        ranks.push(RankState {
            plan: p,
            missing,
            dependents,
            ready_at: vec![0.0; k],
            candidates,
            lane_of,
            port_free: 0.0,
            cpu_free: 0.0,
        });
    }
    let mut lanes: Vec<Lane> = (0..lane_ids.len()).map(|_| Lane::default()).collect();
    let local = links.local_us_per_byte();
    let mut left: usize = plans.iter().map(|p| p.steps.len()).sum();
    let mut end = 0.0f64;
    while left > 0 {
        // The candidate that can start earliest.
        let mut best: Option<(f64, usize, usize)> = None;
        for (r, rk) in ranks.iter().enumerate() {
            for (ci, &s) in rk.candidates.iter().enumerate() {
                let s = s as usize;
                let t = match rk.lane_of[s] {
                    None => rk.ready_at[s].max(rk.cpu_free),
                    Some((l, pos, true)) => {
                        let l = &lanes[l];
                        if l.sent != pos {
                            continue;
                        }
                        rk.ready_at[s].max(rk.port_free).max(l.last_send_start)
                    }
                    Some((l, pos, false)) => {
                        let l = &lanes[l];
                        let Some(&arr) = l.arrivals.front() else {
                            continue;
                        };
                        if l.received != pos {
                            continue;
                        }
                        rk.ready_at[s].max(arr).max(l.last_recv_done)
                    }
                };
                // Ties go to the earlier step: plan order is priority order.
                let better = match best {
                    None => true,
                    Some((bt, br, bci)) => {
                        t < bt || (t == bt && r == br && s < ranks[br].candidates[bci] as usize)
                    }
                };
                if better {
                    best = Some((t, r, ci));
                }
            }
        }
        let Some((t, r, ci)) = best else {
            return Err(TimingError::Stuck(left));
        };
        let me = r as u32;
        let s = ranks[r].candidates.swap_remove(ci) as usize;
        let kind = ranks[r].plan.steps[s].kind;
        let lane = ranks[r].lane_of[s];
        let done = match (kind, lane) {
            (StepKind::Send { peer, src, .. }, Some((l, _, _))) => {
                let (a, b) = links.link(me, peer);
                let l = &mut lanes[l];
                let arrive = t + a + src.len as f64 * b;
                l.arrivals.push_back(arrive);
                l.last_send_start = t;
                l.sent += 1;
                ranks[r].port_free = t + src.len as f64 * b;
                arrive
            }
            (StepKind::Recv { .. } | StepKind::RecvReduce { .. }, Some((l, _, _))) => {
                let l = &mut lanes[l];
                l.arrivals.pop_front();
                l.received += 1;
                let work = match kind {
                    StepKind::RecvReduce { dst, .. } => dst.len as f64 * local,
                    _ => 0.0,
                };
                let d = if work > 0.0 {
                    let d = t.max(ranks[r].cpu_free) + work;
                    ranks[r].cpu_free = d;
                    d
                } else {
                    t
                };
                l.last_recv_done = d;
                d
            }
            (other, _) => {
                let len = other.writes().map_or(0, |w| w.len) as f64;
                let d = t + len * local;
                ranks[r].cpu_free = d;
                d
            }
        };
        let rk = &mut ranks[r];
        end = end.max(done);
        left -= 1;
        for i in 0..rk.dependents[s].len() {
            let d = rk.dependents[s][i] as usize;
            rk.ready_at[d] = rk.ready_at[d].max(done);
            rk.missing[d] -= 1;
            if rk.missing[d] == 0 {
                rk.candidates.push(d as u32);
            }
        }
    }
    Ok(end)
}
