//! `HETCCL_TUNE=init`: measuring the cost model's numbers at communicator
//! init, over the executor's own links.
//!
//! For each link class the communicator has (same process, same node,
//! different nodes) one pair of ranks ([`probes`]) runs a ping-pong of
//! [`PING_BYTES`] messages (latency α) and sends [`BULK_BYTES`] messages
//! answered by a small acknowledgement (inverse bandwidth β). The messages
//! are point-to-point jobs driven by `exec::drive` on the pair's link, as
//! `ncclSend`/`ncclRecv` are, so they include the executor's per-message
//! overhead. Rank 0 also times the host reduction kernel (γ). The initiator
//! of each pair keeps the fastest round of each kind and stops at its share
//! of the budget (at least one round each); [`fold`] turns the times into a
//! [`CostModel`].

use std::sync::Arc;
use std::time::{Duration, Instant};

use hetccl_abi::DataType;

use crate::algo::{self, Algorithm, Chunking, Collective, PlanArgs, Topology};
use crate::cost::{CostModel, LinkClass, LinkCost};
use crate::error::{Error, Result};
use crate::exec::{drive, Batch, Job, Links, OpBuffers, Patience, Trace};
use crate::reduce::ReduceOp;
use crate::user_ptr::UserPtr;

/// The ping-pong message size.
pub const PING_BYTES: usize = 8;
/// The bandwidth probe's message size.
pub const BULK_BYTES: usize = 1 << 20;
/// The most ping-pong rounds per pair.
const MAX_PINGS: usize = 200;
/// The most bulk rounds per pair.
const MAX_BULKS: usize = 8;
/// Bytes per operand of the reduction timing.
const REDUCE_BYTES: usize = 256 << 10;
/// The most reduction rounds.
const MAX_REDUCES: usize = 32;
/// Commands of the initiator (first byte of a ping-sized message).
const CMD_PING: u8 = 1;
const CMD_BULK: u8 = 2;
const CMD_STOP: u8 = 3;
/// The smallest latency and inverse bandwidth a measurement may give (so
/// that a too-fast clock reading never prices a link at zero).
const MIN_ALPHA_US: f64 = 0.05;
const MIN_BETA_US_PER_BYTE: f64 = 1e-7;

/// One link class to measure, and the pair of ranks that measures it
/// (`a` < `b`; `a` initiates).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Probe {
    /// The class.
    pub class: LinkClass,
    /// The initiating rank.
    pub a: usize,
    /// The responding rank.
    pub b: usize,
}

/// The pairs that measure each link class of `topo`: the same on every
/// rank, in [`LinkClass::ALL`] order, linear in the ranks.
pub fn probes(topo: &Topology) -> Vec<Probe> {
    use std::collections::HashMap;
    let n = topo.nranks();
    let mut out = Vec::new();
    // Same process: the first rank whose (node, process) was seen before.
    if topo.process(0).is_some() {
        let mut first: HashMap<(u32, u32), u32> = HashMap::new();
        for r in 0..n {
            let key = (topo.node(r), topo.process(r).unwrap_or(r));
            match first.get(&key) {
                Some(&f) => {
                    out.push((LinkClass::SameProcess, f, r));
                    break;
                }
                None => {
                    first.insert(key, r);
                }
            }
        }
    }
    // Same node, other process: the first rank whose node's first rank is
    // in another process (an earlier such pair would have been found at
    // its later rank).
    let mut first: HashMap<u32, u32> = HashMap::new();
    for r in 0..n {
        match first.get(&topo.node(r)) {
            Some(&f) if !topo.same_process(f, r) => {
                out.push((LinkClass::SameNode, f, r));
                break;
            }
            Some(_) => {}
            None => {
                first.insert(topo.node(r), r);
            }
        }
    }
    if let Some(b) = (1..n).find(|&r| !topo.same_node(0, r)) {
        out.push((LinkClass::CrossNode, 0, b));
    }
    out.sort_by_key(|p| p.0);
    out.into_iter()
        .map(|(class, a, b)| Probe {
            class,
            a: a as usize,
            b: b as usize,
        })
        .collect()
}

/// What the initiator of a probe measured.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LinkTimes {
    /// The link class.
    pub class: LinkClass,
    /// The fastest ping-pong round trip, microseconds.
    pub rtt_us: f64,
    /// The fastest bulk round (command, bulk message, acknowledgement),
    /// microseconds.
    pub bulk_us: f64,
    /// The bulk message's size.
    pub bulk_bytes: u64,
}

/// `base` with the measured classes and reduction cost replaced: α is half
/// the round trip less the model's per-message overhead, β is the bulk
/// round less one and a half round trips (its three messages' latency),
/// per byte. Both are floored at small positive values.
pub fn fold(base: &CostModel, times: &[LinkTimes], reduce_us_per_byte: Option<f64>) -> CostModel {
    let mut m = *base;
    for t in times {
        let alpha = (t.rtt_us / 2.0 - m.msg_overhead_us).max(MIN_ALPHA_US);
        let beta =
            ((t.bulk_us - 1.5 * t.rtt_us) / t.bulk_bytes.max(1) as f64).max(MIN_BETA_US_PER_BYTE);
        let cost = LinkCost {
            alpha_us: alpha,
            beta_us_per_byte: beta,
        };
        match t.class {
            LinkClass::SameProcess => m.same_process = cost,
            LinkClass::SameNode => m.same_node = cost,
            LinkClass::CrossNode => m.cross_node = cost,
        }
    }
    if let Some(g) = reduce_us_per_byte {
        m.reduce_us_per_byte = g.max(MIN_BETA_US_PER_BYTE);
    }
    m
}

/// A pair's end of the probe: plans and buffers for its messages.
struct Pair<'a> {
    links: &'a Links,
    patience: Patience,
    comm_hash: u64,
    send_ping: Arc<algo::Plan>,
    recv_ping: Arc<algo::Plan>,
    send_bulk: Arc<algo::Plan>,
    recv_bulk: Arc<algo::Plan>,
}

impl<'a> Pair<'a> {
    fn new(
        links: &'a Links,
        topo: &Topology,
        peer: usize,
        patience: Patience,
        comm_hash: u64,
    ) -> Result<Self> {
        let me = links.rank as u32;
        let plan = |coll, bytes| -> Result<Arc<algo::Plan>> {
            let mut args = PlanArgs::new(coll, bytes, DataType::Uint8);
            args.root = peer as u32;
            args.op = ReduceOp::Sum;
            algo::generate(&args, Algorithm::Direct, me, topo, &Chunking::default())
                .map(Arc::new)
                .map_err(|e| Error::Internal(format!("tune: probe plan: {e}").into()))
        };
        Ok(Self {
            links,
            patience,
            comm_hash,
            send_ping: plan(Collective::Send, PING_BYTES)?,
            recv_ping: plan(Collective::Recv, PING_BYTES)?,
            send_bulk: plan(Collective::Send, BULK_BYTES)?,
            recv_bulk: plan(Collective::Recv, BULK_BYTES)?,
        })
    }

    /// Runs one point-to-point message of `plan` on `buf` (read for a
    /// send, written for a receive) to completion.
    fn run(&self, plan: &Arc<algo::Plan>, buf: &mut [u8]) -> Result<()> {
        let p = UserPtr::new(buf.as_mut_ptr());
        let job = Job {
            plan: plan.clone(),
            bufs: OpBuffers {
                send: p,
                recv: p,
                scratch: Vec::new(),
                staged_send: Vec::new(),
            },
            p2p: true,
            trace: Trace {
                comm_hash: self.comm_hash,
                seq: 0,
                id: Default::default(),
            },
            self_p2p: false,
            fingerprint: None,
        };
        let mut batch = [Batch::new(self.links, vec![job])?];
        drive(&mut batch, self.patience)
    }

    /// The initiator's side: rounds until `budget` is spent (at least one
    /// of each kind), then the stop command.
    fn initiate(&self, class: LinkClass, budget: Duration) -> Result<LinkTimes> {
        let start = Instant::now();
        let mut cmd = [0u8; PING_BYTES];
        let mut bulk = vec![0x5au8; BULK_BYTES];
        let mut rtt = f64::INFINITY;
        let mut n = 0;
        while n == 0 || (n < MAX_PINGS && start.elapsed() < budget / 2) {
            cmd[0] = CMD_PING;
            let t0 = Instant::now();
            self.run(&self.send_ping, &mut cmd)?;
            self.run(&self.recv_ping, &mut cmd)?;
            rtt = rtt.min(t0.elapsed().as_secs_f64() * 1e6);
            n += 1;
        }
        let mut best = f64::INFINITY;
        let mut m = 0;
        while m == 0 || (m < MAX_BULKS && start.elapsed() < budget) {
            cmd[0] = CMD_BULK;
            let t0 = Instant::now();
            self.run(&self.send_ping, &mut cmd)?;
            self.run(&self.send_bulk, &mut bulk)?;
            self.run(&self.recv_ping, &mut cmd)?;
            best = best.min(t0.elapsed().as_secs_f64() * 1e6);
            m += 1;
        }
        cmd[0] = CMD_STOP;
        self.run(&self.send_ping, &mut cmd)?;
        tracing::debug!(target: "hetccl::TUNING",
            "tune: {class:?} probe: {n} pings, {m} bulk rounds in {:?}", start.elapsed());
        Ok(LinkTimes {
            class,
            rtt_us: rtt,
            bulk_us: best,
            bulk_bytes: BULK_BYTES as u64,
        })
    }

    /// The responder's side: answers commands until the stop command (or
    /// fails on a command it does not know, or on too many rounds).
    fn respond(&self) -> Result<()> {
        let mut cmd = [0u8; PING_BYTES];
        let mut bulk = vec![0u8; BULK_BYTES];
        for _ in 0..=MAX_PINGS + MAX_BULKS {
            self.run(&self.recv_ping, &mut cmd)?;
            match cmd[0] {
                CMD_PING => self.run(&self.send_ping, &mut cmd)?,
                CMD_BULK => {
                    self.run(&self.recv_bulk, &mut bulk)?;
                    self.run(&self.send_ping, &mut cmd)?;
                }
                CMD_STOP => return Ok(()),
                c => {
                    return Err(Error::Remote(
                        format!("tune: probe command {c} from a peer").into(),
                    ))
                }
            }
        }
        Err(Error::Remote(
            "tune: the probe peer sent too many rounds".into(),
        ))
    }
}

/// Runs this rank's part of every probe of `topo` (in order, so that two
/// probes of one rank never overlap) and returns what it measured as an
/// initiator. `budget` is the whole calibration's: the pairs share 7/8 of
/// it equally (the rest is [`reduce_cost`]'s).
pub fn measure(
    links: &Links,
    topo: &Topology,
    budget: Duration,
    patience: Patience,
    comm_hash: u64,
) -> Result<Vec<LinkTimes>> {
    let all = probes(topo);
    let share = (budget - budget / 8) / (all.len().max(1) as u32);
    let me = links.rank;
    let mut out = Vec::new();
    for p in all {
        if p.a == me {
            out.push(Pair::new(links, topo, p.b, patience, comm_hash)?.initiate(p.class, share)?);
        } else if p.b == me {
            Pair::new(links, topo, p.a, patience, comm_hash)?.respond()?;
        }
    }
    Ok(out)
}

/// The host reduction's cost (float32 sum), microseconds per byte: the
/// fastest of rounds run until `budget` is spent (at least one).
pub fn reduce_cost(budget: Duration) -> f64 {
    let mut dst = vec![0u8; REDUCE_BYTES];
    let src: Vec<u8> = (0..REDUCE_BYTES).map(|i| (i % 251) as u8 & 0x3f).collect();
    let start = Instant::now();
    let mut best = f64::INFINITY;
    let mut n = 0;
    while n == 0 || (n < MAX_REDUCES && start.elapsed() < budget) {
        let t0 = Instant::now();
        // Sizes match (both REDUCE_BYTES, a multiple of 4): cannot fail.
        let _ = crate::reduce::reduce_into(&mut dst, &src, DataType::Float32, ReduceOp::Sum);
        best = best.min(t0.elapsed().as_secs_f64() * 1e6);
        n += 1;
    }
    std::hint::black_box(&dst);
    best / REDUCE_BYTES as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn probe(class: LinkClass, a: usize, b: usize) -> Probe {
        Probe { class, a, b }
    }

    #[test]
    fn one_pair_per_class_present() {
        // Two nodes of two processes each.
        let t = Topology::from_nodes(vec![0, 0, 1, 1]).with_processes(vec![0, 1, 2, 3]);
        assert_eq!(
            probes(&t),
            vec![
                probe(LinkClass::SameNode, 0, 1),
                probe(LinkClass::CrossNode, 0, 2)
            ]
        );
        // Rank 0 alone on its node; ranks 1 and 2 share a node.
        let t = Topology::from_nodes(vec![0, 1, 1]).with_processes(vec![0, 1, 2]);
        assert_eq!(
            probes(&t),
            vec![
                probe(LinkClass::SameNode, 1, 2),
                probe(LinkClass::CrossNode, 0, 1)
            ]
        );
        // Interleaved nodes, threads: 0 and 2 share a process on node 0.
        let t = Topology::from_nodes(vec![0, 1, 0, 1, 0]).with_processes(vec![5, 6, 5, 6, 7]);
        assert_eq!(
            probes(&t),
            vec![
                probe(LinkClass::SameProcess, 0, 2),
                probe(LinkClass::SameNode, 0, 4),
                probe(LinkClass::CrossNode, 0, 1)
            ]
        );
        // One process: only the same-process class.
        let t = Topology::flat(3).with_processes(vec![9, 9, 9]);
        assert_eq!(probes(&t), vec![probe(LinkClass::SameProcess, 0, 1)]);
        // No process ids: ranks of a node are other processes.
        assert_eq!(
            probes(&Topology::flat(2)),
            vec![probe(LinkClass::SameNode, 0, 1)]
        );
        assert!(probes(&Topology::flat(1)).is_empty());
        // Every node a single rank: cross node only.
        let t = Topology::from_nodes((0..64).collect()).with_processes((0..64).collect());
        assert_eq!(probes(&t), vec![probe(LinkClass::CrossNode, 0, 1)]);
    }

    #[test]
    fn fold_replaces_the_measured_classes_only() {
        let base = CostModel::default();
        let t = LinkTimes {
            class: LinkClass::CrossNode,
            rtt_us: 101.0,
            bulk_us: 1.5 * 101.0 + 1000.0,
            bulk_bytes: 1_000_000,
        };
        let m = fold(&base, &[t], Some(0.002));
        assert_eq!(m.same_node, base.same_node);
        assert_eq!(m.same_process, base.same_process);
        assert!((m.cross_node.alpha_us - (50.5 - base.msg_overhead_us)).abs() < 1e-9);
        assert!((m.cross_node.beta_us_per_byte - 0.001).abs() < 1e-12);
        assert_eq!(m.reduce_us_per_byte, 0.002);
        assert_eq!(m.msg_overhead_us, base.msg_overhead_us);
        // Faster than the floor: floored, never zero or negative.
        let fast = LinkTimes {
            class: LinkClass::SameNode,
            rtt_us: 0.0,
            bulk_us: 0.0,
            bulk_bytes: 0,
        };
        let m = fold(&base, &[fast], Some(0.0));
        assert!(m.same_node.alpha_us > 0.0 && m.same_node.beta_us_per_byte > 0.0);
        assert!(m.reduce_us_per_byte > 0.0);
        assert_eq!(fold(&base, &[], None), base);
    }

    #[test]
    fn the_reduction_timing_is_positive_and_bounded() {
        let t0 = Instant::now();
        let g = reduce_cost(Duration::from_millis(5));
        assert!(g.is_finite() && g > 0.0, "{g}");
        assert!(t0.elapsed() < Duration::from_secs(5));
    }
}
