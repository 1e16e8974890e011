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
use super::{Call, P2p};
use crate::algo::{Algorithm, BufId, BufRange, Collective, Plan, Step, StepKind};
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

/// Whether `a` (a host call inside a group) may join a run.
pub(super) fn fits(a: &Call) -> bool {
    matches!(a.kind, Collective::Send | Collective::Recv)
        && a.root != a.comm.rank
        && !crate::telemetry::trace::on()
}

impl Run {
    /// A run that starts with `a` (see [`fits`]), called at tick `called`.
    pub fn start(a: &Call, called: u64, capacity: usize) -> Result<Self> {
        let mut run = Self {
            comm: a.comm.clone(),
            handle: a.handle,
            calls: Vec::with_capacity(capacity.max(1)),
            seq: 0, // the first call's, set when it is recorded
        };
        run.push(a, called)?;
        Ok(run)
    }

    /// Adds `a`, a call on this run's communicator (see [`fits`]), called
    /// at tick `called`.
    pub fn push(&mut self, a: &Call, called: u64) -> Result<()> {
        self.record(&P2p::of(a), called)
    }

    /// Adds `p`, a call checked against this run's communicator, to
    /// another rank, on host memory; counts it as issued.
    pub fn add(&mut self, p: &P2p) -> Result<()> {
        let called = self.comm.engine()?.links.metrics.issue(p.kind);
        self.record(p, called)
    }

    fn record(&mut self, p: &P2p, called: u64) -> Result<()> {
        let e = self.comm.engine()?;
        let seq = e.seq.fetch_add(1, Ordering::Relaxed);
        if self.calls.is_empty() {
            self.seq = seq;
        }
        let esize = p.dtype.size();
        self.calls.push(RunCall {
            kind: p.kind,
            peer: p.peer as u32,
            addr: p.buf.bytes().expose_provenance(),
            bytes: p.bytes,
            // The chunk size in whole elements, as `algo::builder` splits
            // a call's plan.
            piece: (e.control.chunk_bytes() / esize).max(1) * esize,
            called,
        });
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
