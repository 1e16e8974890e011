//! A group's point-to-point calls, queued without a job each.
//!
//! Inside a group, consecutive `ncclSend`s and `ncclRecv`s on one
//! communicator form a run: each call adds a few words to it, and the run
//! becomes one job when the group ends or when another kind of call on the
//! same communicator is queued after it. Its plan has the steps the calls'
//! own plans would have had, in call order, each addressing its call's
//! buffer by address ([`BufId::Addr`]). So each link carries the same
//! messages in the same order as with a job per call, and a peer that
//! makes a job per call matches it.
//!
//! A call joins a run unless it is a send to or receive from the calling
//! rank (paired by `exec::self_p2p`) or the timeline is on (it names every
//! call's job).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use hetccl_abi::DataType;

use super::run::{Info, Pending};
use super::P2p;
use crate::algo::{Algorithm, BufId, BufRange, Collective, Plan, Step, StepKind};
use crate::comm::engine::Engine;
use crate::comm::Comm;
use crate::error::Result;
use crate::exec::{Job, OpBuffers, Trace};
use crate::reduce::ReduceOp;
use crate::telemetry::trace::TraceId;
use crate::user_ptr::UserPtr;

/// One call of a run.
#[derive(Debug, Clone, Copy)]
pub(super) struct RunCall {
    /// `Send` or `Recv`.
    pub kind: Collective,
    /// The peer.
    pub peer: u32,
    /// The buffer's address (its provenance exposed).
    pub addr: usize,
    /// Its bytes.
    pub bytes: usize,
    /// The largest message it is split into: the communicator's chunk
    /// size in whole elements, as `algo::builder` splits a call's plan.
    pub piece: usize,
    /// When it was called (`telemetry::clock` ticks; 0 when not sampled).
    pub called: u64,
}

impl RunCall {
    /// What the metrics record of the call.
    pub fn info(&self) -> Info {
        Info {
            called: self.called,
            bytes: self.bytes,
            peer: self.peer as i32,
        }
    }
}

/// Consecutive point-to-point calls of a group on one communicator.
#[derive(Debug)]
pub(super) struct Run {
    /// The communicator.
    pub comm: Arc<Comm>,
    /// The C handle its first call named it by (0 inside the library).
    pub handle: usize,
    /// The calls, in call order.
    calls: Vec<RunCall>,
    /// The sequence number of the first call (`Engine::seq`).
    seq: u64,
}

/// Whether a run takes `p`, a call of rank `me` inside a group: a send or
/// receive on host memory to another rank, while the timeline is off.
pub(super) fn takes(p: &P2p, me: usize) -> bool {
    matches!(p.kind, Collective::Send | Collective::Recv)
        && p.peer != me
        && !p.placement.is_device()
        && !crate::telemetry::trace::on()
}

impl Run {
    /// A run that starts with `p` (see [`takes`]), a call on `comm` by C
    /// handle `handle` (0 inside the library), called at tick `called`.
    pub fn start(
        comm: &Arc<Comm>,
        handle: usize,
        p: &P2p,
        called: u64,
        capacity: usize,
    ) -> Result<Self> {
        let mut run = Self {
            comm: comm.clone(),
            handle,
            calls: Vec::with_capacity(capacity.max(1)),
            seq: 0, // the first call's, set when it is recorded
        };
        run.push(p, called)?;
        Ok(run)
    }

    /// Adds `p`, a call on this run's communicator (see [`takes`]) called
    /// at tick `called` (0 when not sampled).
    pub fn push(&mut self, p: &P2p, called: u64) -> Result<()> {
        let e = self.comm.engine()?;
        record(&mut self.calls, &mut self.seq, e, p, called);
        Ok(())
    }

    /// Adds `p` as [`Run::push`] does, counting it as issued first (a call
    /// that did not pass through `launch::submit`).
    pub fn add(&mut self, p: &P2p) -> Result<()> {
        let e = self.comm.engine()?;
        let called = e.links.metrics.issue(p.kind);
        record(&mut self.calls, &mut self.seq, e, p, called);
        Ok(())
    }

    /// Its calls.
    pub fn calls(&self) -> &[RunCall] {
        &self.calls
    }

    /// The run as one queued job.
    pub fn into_pending(self) -> Result<Pending> {
        let comm_hash = self.comm.engine()?.comm_hash;
        let mut steps = Vec::with_capacity(self.calls.len());
        for c in &self.calls {
            // The pieces `algo::builder` splits a message into.
            let cb = c.piece;
            for i in 0..c.bytes.div_ceil(cb) {
                let (off, len) = (i * cb, cb.min(c.bytes - i * cb));
                let range = BufRange::new(BufId::Addr, c.addr + off, len);
                let kind = if c.kind == Collective::Send {
                    StepKind::Send {
                        peer: c.peer,
                        chan: 0,
                        src: range,
                    }
                } else {
                    StepKind::Recv {
                        peer: c.peer,
                        chan: 0,
                        dst: range,
                    }
                };
                steps.push(Step {
                    kind,
                    deps: Vec::new(),
                });
            }
        }
        let plan = Plan {
            collective: self.calls[0].kind,
            algorithm: Algorithm::Direct,
            rank: self.comm.rank as u32,
            nranks: self.comm.nranks as u32,
            dtype: DataType::Uint8,
            op: ReduceOp::Sum,
            send_bytes: 0,
            recv_bytes: 0,
            scratch_bytes: 0,
            steps,
            wire: Default::default(),
        };
        debug_assert_eq!(plan.validate(), Ok(()));
        let first = self.calls[0].info();
        Ok(Pending {
            comm: self.comm,
            job: Job {
                plan: Arc::new(plan),
                bufs: OpBuffers {
                    send: UserPtr::NULL,
                    recv: UserPtr::NULL,
                    scratch: Vec::new(),
                    staged_send: Vec::new(),
                },
                p2p: true,
                trace: Trace {
                    comm_hash,
                    seq: self.seq,
                    id: TraceId::default(),
                },
                self_p2p: false,
                fingerprint: None,
            },
            info: first,
            run: self.calls,
        })
    }
}

/// Appends `p` to a run's `calls`, taking its sequence number from `e`
/// (the run's `seq` is its first call's).
fn record(calls: &mut Vec<RunCall>, seq: &mut u64, e: &Engine, p: &P2p, called: u64) {
    let n = e.seq.fetch_add(1, Ordering::Relaxed);
    if calls.is_empty() {
        *seq = n;
    }
    let esize = p.dtype.size();
    calls.push(RunCall {
        kind: p.kind,
        peer: p.peer as u32,
        addr: p.buf.bytes().expose_provenance(),
        bytes: p.bytes,
        // The chunk size in whole elements, as `algo::builder` splits a
        // call's plan.
        piece: (e.control.chunk_bytes() / esize).max(1) * esize,
        called,
    });
}
