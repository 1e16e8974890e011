//! An in-process simulator: runs every rank's plan over real buffers and
//! enforces the matching contract.
//!
//! The simulator executes one step at a time, chosen at random (seeded)
//! among the steps that may run: their dependencies are complete, and for
//! messages, they are next in their (sender, receiver, channel) order and,
//! for receives, the message has arrived. By default sends are rendezvous:
//! a send completes only when its receiver has consumed it, so plans that
//! rely on transport buffering deadlock here. It fails on a length mismatch
//! between a send and its receive, on a send whose source was changed while
//! in flight, on a deadlock (no rank can progress; the error holds a dump of
//! what each rank waits for), and on messages left unreceived.

use std::collections::{HashMap, VecDeque};
use std::fmt::Write;

use hetccl_core::config::Compression;

use super::generate::Topology;
use super::plan::{BufId, BufRange, Plan, PlanCheckError, StepKind};
use crate::reduce::{self, wire};

/// One rank's user buffers.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RankBuffers {
    /// The send buffer.
    pub send: Vec<u8>,
    /// The receive buffer.
    pub recv: Vec<u8>,
}

/// How to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SimOptions {
    /// Seed of the step-order randomisation.
    pub seed: u64,
    /// Sends complete only when received (the strict model).
    pub rendezvous: bool,
}

impl Default for SimOptions {
    fn default() -> Self {
        Self {
            seed: 1,
            rendezvous: true,
        }
    }
}

/// What a run did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SimReport {
    /// Steps executed, all ranks.
    pub steps: usize,
    /// Messages delivered.
    pub messages: usize,
    /// Bytes delivered.
    pub bytes: usize,
}

/// Why a run failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SimError {
    /// Plans and buffers do not line up with ranks.
    #[error("setup: {0}")]
    Setup(String),
    /// A plan failed its static checks.
    #[error("rank {rank}: {err}")]
    Invalid {
        /// The rank.
        rank: u32,
        /// The check that failed.
        err: PlanCheckError,
    },
    /// A receive's length differs from its message's.
    #[error(
        "message {from}->{to} chan {chan} #{seq}: sent {sent} bytes, receive expects {expected}"
    )]
    SizeMismatch {
        /// Sender.
        from: u32,
        /// Receiver.
        to: u32,
        /// Channel.
        chan: u8,
        /// Sequence number on the channel.
        seq: usize,
        /// Bytes sent.
        sent: usize,
        /// Bytes the receive step expects.
        expected: usize,
    },
    /// A send's source changed before the send completed.
    #[error("rank {rank} step {step}: send source modified while in flight")]
    SourceModified {
        /// The rank.
        rank: u32,
        /// The send step.
        step: u32,
    },
    /// No rank can make progress.
    #[error("deadlock:\n{0}")]
    Deadlock(String),
    /// Messages nobody received.
    #[error("unreceived messages: {0}")]
    Unreceived(String),
    /// A kernel refused its operands.
    #[error("rank {rank} step {step}: {err}")]
    Kernel {
        /// The rank.
        rank: u32,
        /// The step.
        step: u32,
        /// The kernel error.
        err: reduce::ReduceError,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum St {
    Waiting,
    Ready,
    InFlight,
    Done,
}

struct Msg {
    data: Vec<u8>,
    step: u32,
}

type Key = (u32, u32, u8); // (from, to, chan)

/// The ordered message steps of one (peer, channel, direction).
struct Lane {
    steps: Vec<u32>,
    next: usize,
    queue: usize,
    send: bool,
}

struct Rank<'a> {
    plan: &'a Plan,
    scratch: Vec<u8>,
    st: Vec<St>,
    missing: Vec<u32>,
    dependents: Vec<Vec<u32>>,
    /// Local steps whose dependencies are complete.
    ready: Vec<u32>,
    /// For message steps: their lane, and position in it.
    lane_of: Vec<(u32, usize)>,
    lanes: Vec<Lane>,
    done: usize,
}

fn xorshift(s: &mut u64) -> u64 {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    *s
}

fn buffer<'b>(bufs: &'b mut RankBuffers, scratch: &'b mut Vec<u8>, id: BufId) -> &'b mut Vec<u8> {
    match id {
        BufId::Send => &mut bufs.send,
        BufId::Recv => &mut bufs.recv,
        BufId::Scratch => scratch,
        BufId::Addr => unreachable!("generated plans never address memory by address"),
    }
}

fn read(bufs: &mut RankBuffers, scratch: &mut Vec<u8>, r: BufRange) -> Vec<u8> {
    buffer(bufs, scratch, r.buf)[r.offset..r.end()].to_vec()
}

fn write(bufs: &mut RankBuffers, scratch: &mut Vec<u8>, r: BufRange, data: &[u8]) {
    buffer(bufs, scratch, r.buf)[r.offset..r.end()].copy_from_slice(data);
}

impl<'a> Rank<'a> {
    fn new(plan: &'a Plan, queues: &mut HashMap<Key, usize>) -> Self {
        let n = plan.steps.len();
        let me = plan.rank;
        let mut dependents = vec![Vec::new(); n];
        let mut missing = vec![0u32; n];
        let mut lane_of = vec![(u32::MAX, 0usize); n];
        let mut lanes: Vec<Lane> = Vec::new();
        let mut index: HashMap<(u32, u8, bool), u32> = HashMap::new();
        for (i, s) in plan.steps.iter().enumerate() {
            missing[i] = s.deps.len() as u32;
            for &d in &s.deps {
                dependents[d as usize].push(i as u32);
            }
            if let Some((peer, chan, send)) = s.kind.message() {
                let l = *index.entry((peer, chan, send)).or_insert_with(|| {
                    let key = if send {
                        (me, peer, chan)
                    } else {
                        (peer, me, chan)
                    };
                    let next = queues.len();
                    let queue = *queues.entry(key).or_insert(next);
                    lanes.push(Lane {
                        steps: Vec::new(),
                        next: 0,
                        queue,
                        send,
                    });
                    (lanes.len() - 1) as u32
                });
                lane_of[i] = (l, lanes[l as usize].steps.len());
                lanes[l as usize].steps.push(i as u32);
            }
        }
        let mut st = vec![St::Waiting; n];
        let mut ready = Vec::new();
        for i in 0..n {
            if missing[i] == 0 {
                st[i] = St::Ready;
                if lane_of[i].0 == u32::MAX {
                    ready.push(i as u32);
                }
            }
        }
        Self {
            plan,
            scratch: vec![0xa5; plan.scratch_bytes],
            st,
            missing,
            dependents,
            ready,
            lane_of,
            lanes,
            done: 0,
        }
    }

    fn complete(&mut self, step: u32) {
        self.st[step as usize] = St::Done;
        self.done += 1;
        for i in 0..self.dependents[step as usize].len() {
            let d = self.dependents[step as usize][i] as usize;
            self.missing[d] -= 1;
            if self.missing[d] == 0 {
                self.st[d] = St::Ready;
                if self.lane_of[d].0 == u32::MAX {
                    self.ready.push(d as u32);
                }
            }
        }
    }

    /// The runnable message steps: lane heads that are ready and, for
    /// receives, have a message waiting.
    fn runnable_lanes(&self, queues: &[VecDeque<Msg>], out: &mut Vec<usize>) {
        for (l, lane) in self.lanes.iter().enumerate() {
            if let Some(&head) = lane.steps.get(lane.next) {
                if self.st[head as usize] == St::Ready
                    && (lane.send || !queues[lane.queue].is_empty())
                {
                    out.push(l);
                }
            }
        }
    }
}

/// Runs `plans[r]` on `bufs[r]` for every rank `r`. Plans must be for ranks
/// `0..n` in order; buffers must be at least as large as the plans say.
/// Every message travels as it is (see [`run_on`]).
pub fn run(
    plans: &[Plan],
    bufs: &mut [RankBuffers],
    opts: &SimOptions,
) -> Result<SimReport, SimError> {
    run_inner(plans, bufs, opts, None)
}

/// [`run`] with the ranks placed on `topo`'s nodes: a plan's messages to a
/// rank on another node travel in the plan's wire format
/// ([`Plan::wire`], `reduce::wire`), as the executor sends them.
pub fn run_on(
    plans: &[Plan],
    bufs: &mut [RankBuffers],
    opts: &SimOptions,
    topo: &Topology,
) -> Result<SimReport, SimError> {
    if topo.nranks() as usize != plans.len() {
        return Err(SimError::Setup(format!(
            "topology of {} ranks for {} plans",
            topo.nranks(),
            plans.len()
        )));
    }
    run_inner(plans, bufs, opts, Some(topo))
}

fn run_inner(
    plans: &[Plan],
    bufs: &mut [RankBuffers],
    opts: &SimOptions,
    topo: Option<&Topology>,
) -> Result<SimReport, SimError> {
    let n = plans.len();
    if bufs.len() != n {
        return Err(SimError::Setup(format!(
            "{} plans but {} buffer sets",
            n,
            bufs.len()
        )));
    }
    for (r, (p, b)) in plans.iter().zip(bufs.iter()).enumerate() {
        if p.rank as usize != r || p.nranks as usize != n {
            return Err(SimError::Setup(format!(
                "plan {r} is for rank {} of {}",
                p.rank, p.nranks
            )));
        }
        p.validate().map_err(|err| SimError::Invalid {
            rank: r as u32,
            err,
        })?;
        if b.send.len() < p.send_bytes || b.recv.len() < p.recv_bytes {
            return Err(SimError::Setup(format!(
                "rank {r}: buffers {}/{} bytes, plan needs {}/{}",
                b.send.len(),
                b.recv.len(),
                p.send_bytes,
                p.recv_bytes
            )));
        }
    }
    let mut keys: HashMap<Key, usize> = HashMap::new();
    let mut ranks: Vec<Rank> = plans.iter().map(|p| Rank::new(p, &mut keys)).collect();
    let mut queues: Vec<VecDeque<Msg>> = (0..keys.len()).map(|_| VecDeque::new()).collect();
    let mut rng = opts.seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut report = SimReport::default();
    let total: usize = plans.iter().map(|p| p.steps.len()).sum();
    let mut lanes = Vec::new();
    while report.steps < total {
        let start = (xorshift(&mut rng) % n as u64) as usize;
        let mut picked = None;
        for k in 0..n {
            let r = (start + k) % n;
            lanes.clear();
            ranks[r].runnable_lanes(&queues, &mut lanes);
            let local = ranks[r].ready.len();
            let choices = local + lanes.len();
            if choices == 0 {
                continue;
            }
            let c = (xorshift(&mut rng) % choices as u64) as usize;
            picked = Some(if c < local {
                (r, ranks[r].ready.swap_remove(c))
            } else {
                let lane = &ranks[r].lanes[lanes[c - local]];
                (r, lane.steps[lane.next])
            });
            break;
        }
        let Some((r, step)) = picked else {
            return Err(SimError::Deadlock(dump(&ranks, &queues)));
        };
        execute(
            &mut ranks,
            bufs,
            &mut queues,
            (r, step),
            opts,
            topo,
            &mut report,
        )?;
    }
    let left: Vec<String> = keys
        .iter()
        .filter(|(_, &q)| !queues[q].is_empty())
        .map(|((f, t, c), &q)| format!("{f}->{t} chan {c}: {}", queues[q].len()))
        .collect();
    if !left.is_empty() {
        return Err(SimError::Unreceived(left.join(", ")));
    }
    Ok(report)
}

/// The wire format of a message of `plan` between ranks `a` and `b`.
fn wire_of(plan: &Plan, topo: Option<&Topology>, a: u32, b: u32) -> Compression {
    match topo {
        Some(t) if !t.same_node(a, b) => plan.wire,
        _ => Compression::Off,
    }
}

fn encode(c: Compression, plan: &Plan, raw: Vec<u8>) -> Vec<u8> {
    if c == Compression::Off {
        return raw;
    }
    let mut out = Vec::new();
    // The plan's dtype is eligible (a plan has a wire only then).
    wire::encode(c, plan.dtype, &raw, &mut out).expect("wire-eligible dtype");
    out
}

fn execute(
    ranks: &mut [Rank],
    bufs: &mut [RankBuffers],
    queues: &mut [VecDeque<Msg>],
    (r, step): (usize, u32),
    opts: &SimOptions,
    topo: Option<&Topology>,
    report: &mut SimReport,
) -> Result<(), SimError> {
    let me = r as u32;
    let plan = ranks[r].plan;
    let kind = plan.steps[step as usize].kind;
    let (dt, op, nranks) = (plan.dtype, plan.op, plan.nranks);
    let wire_err = |e: wire::WireError| SimError::Setup(format!("rank {me} step {step}: {e}"));
    let kerr = |err| SimError::Kernel {
        rank: me,
        step,
        err,
    };
    let rk = &mut ranks[r];
    let b = &mut bufs[r];
    let (lane, seq) = rk.lane_of[step as usize];
    match kind {
        StepKind::Send { src, peer, .. } => {
            let data = encode(
                wire_of(plan, topo, me, peer),
                plan,
                read(b, &mut rk.scratch, src),
            );
            let l = &mut rk.lanes[lane as usize];
            queues[l.queue].push_back(Msg { data, step });
            l.next += 1;
            rk.st[step as usize] = St::InFlight;
            if !opts.rendezvous {
                rk.complete(step);
            }
            report.steps += 1;
            return Ok(());
        }
        StepKind::Recv { peer, chan, dst }
        | StepKind::RecvReduce {
            peer, chan, dst, ..
        } => {
            let l = &mut rk.lanes[lane as usize];
            let Some(msg) = queues[l.queue].pop_front() else {
                return Err(SimError::Setup("receive ran without a message".into()));
            };
            l.next += 1;
            let c = wire_of(plan, topo, me, peer);
            let expected = wire::wire_len(c, dt, dst.len);
            if msg.data.len() != expected {
                return Err(SimError::SizeMismatch {
                    from: peer,
                    to: me,
                    chan,
                    seq,
                    sent: msg.data.len(),
                    expected,
                });
            }
            let out = match kind {
                StepKind::RecvReduce { local, .. } if c != Compression::Off => {
                    let mut acc = read(b, &mut rk.scratch, local);
                    wire::decode_reduce(c, dt, &msg.data, None, &mut acc).map_err(wire_err)?;
                    acc
                }
                StepKind::RecvReduce { local, .. } => {
                    let mut acc = read(b, &mut rk.scratch, local);
                    reduce::reduce_into(&mut acc, &msg.data, dt, op).map_err(kerr)?;
                    acc
                }
                _ if c != Compression::Off => {
                    let mut out = vec![0u8; dst.len];
                    wire::decode(c, dt, &msg.data, &mut out).map_err(wire_err)?;
                    out
                }
                _ => msg.data.clone(),
            };
            write(b, &mut rk.scratch, dst, &out);
            rk.complete(step);
            report.messages += 1;
            report.bytes += msg.data.len();
            // The matching send is complete now: check its source first.
            let sender = &mut ranks[peer as usize];
            if let StepKind::Send { src, .. } = sender.plan.steps[msg.step as usize].kind {
                let now = read(&mut bufs[peer as usize], &mut sender.scratch, src);
                if encode(c, sender.plan, now) != msg.data {
                    return Err(SimError::SourceModified {
                        rank: peer,
                        step: msg.step,
                    });
                }
            }
            if opts.rendezvous {
                sender.complete(msg.step);
            }
        }
        StepKind::Copy { src, dst } => {
            let data = read(b, &mut rk.scratch, src);
            write(b, &mut rk.scratch, dst, &data);
            rk.complete(step);
        }
        StepKind::Reduce { a, b: rb, dst } => {
            let x = read(b, &mut rk.scratch, a);
            let y = read(b, &mut rk.scratch, rb);
            let mut out = vec![0u8; x.len()];
            reduce::reduce3(&mut out, &x, &y, dt, op).map_err(kerr)?;
            write(b, &mut rk.scratch, dst, &out);
            rk.complete(step);
        }
        StepKind::PreOp { src, dst } => {
            let x = read(b, &mut rk.scratch, src);
            let mut out = vec![0u8; x.len()];
            reduce::pre_op(&mut out, &x, dt, op, nranks).map_err(kerr)?;
            write(b, &mut rk.scratch, dst, &out);
            rk.complete(step);
        }
        StepKind::PostOp { buf } => {
            let mut x = read(b, &mut rk.scratch, buf);
            reduce::post_op(&mut x, dt, op, nranks).map_err(kerr)?;
            wire::round(plan.wire, dt, &mut x).map_err(wire_err)?;
            write(b, &mut rk.scratch, buf, &x);
            rk.complete(step);
        }
    }
    report.steps += 1;
    Ok(())
}

/// What every rank waits for, for the deadlock report.
fn dump(ranks: &[Rank], queues: &[VecDeque<Msg>]) -> String {
    let mut out = String::new();
    for (r, rk) in ranks.iter().enumerate() {
        let pending: Vec<usize> = (0..rk.st.len()).filter(|&i| rk.st[i] != St::Done).collect();
        if pending.is_empty() {
            continue;
        }
        let _ = writeln!(out, "rank {r}: {}/{} steps done", rk.done, rk.st.len());
        for &i in pending.iter().take(6) {
            let s = &rk.plan.steps[i];
            let (lane, seq) = rk.lane_of[i];
            let why = match (rk.st[i], s.kind.message()) {
                (St::Waiting, _) => {
                    let deps: Vec<u32> = s
                        .deps
                        .iter()
                        .copied()
                        .filter(|&d| rk.st[d as usize] != St::Done)
                        .collect();
                    format!("waits for steps {deps:?}")
                }
                (St::InFlight, _) => "sent, not yet received".to_string(),
                (_, Some((peer, chan, send))) => {
                    let l = &rk.lanes[lane as usize];
                    let dir = if send { "send to" } else { "receive from" };
                    format!(
                        "{dir} {peer} chan {chan} #{seq}; lane is at #{}, {} message(s) queued",
                        l.next,
                        queues[l.queue].len()
                    )
                }
                _ => "ready".to_string(),
            };
            let _ = writeln!(out, "  step {i} {:?}: {why}", s.kind);
        }
    }
    out
}
