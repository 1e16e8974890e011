//! From a validated call to a job: the reduction, the in-place layout, the
//! algorithm (the communicator's `NCCL_ALGO` filter or `algo` options,
//! online adaptation, the tuning table and the cost model) and the plan
//! (cached per communicator).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use hetccl_abi::RedOp;

use super::scratch::take_scratch;
use super::Call;
use crate::algo::{self, AlgoFilter, Chunking, Collective};
use crate::comm::engine::Engine;
use crate::comm::plan_cache::PlanKey;
use crate::comm::redop_table::Scalar as OpScalar;
use crate::error::{Error, Result};
use crate::exec::fingerprint::{self, Fingerprint};
use crate::exec::{self_p2p, Job, OpBuffers, Trace};
use crate::reduce::{ReduceOp, Scalar};
use crate::telemetry::trace::TraceId;
use crate::user_ptr::UserPtr;

/// Whether the call uses NCCL's in-place layout for its kind.
fn in_place(a: &Call) -> bool {
    let (s, r) = (a.send.addr(), a.recv.addr());
    let block = a.count * a.dtype.size();
    let is_root = a.root == a.comm.rank;
    match a.kind {
        Collective::AllReduce | Collective::Broadcast => s == r,
        Collective::Reduce => is_root && s == r,
        Collective::AllGather => s == r + a.comm.rank * block,
        Collective::Gather => is_root && s == r + a.comm.rank * block,
        Collective::ReduceScatter => r == s + a.comm.rank * block,
        Collective::Scatter => is_root && r == s + a.comm.rank * block,
        Collective::AlltoAll | Collective::Send | Collective::Recv => false,
    }
}

/// The reduction of a validated call (built-in, or a live PreMulSum op).
pub fn reduce_op(a: &Call) -> Result<ReduceOp> {
    let op = match a.op {
        RedOp::Dynamic(raw) => {
            let pm = a.comm.redops.lock().get(raw)?;
            let scalar = match pm.scalar {
                OpScalar::Immediate(b) => Scalar::from_bytes(a.dtype, &b),
                OpScalar::Pointer(p) => {
                    // SAFETY: the caller keeps a device-resident scalar valid
                    // while operations use it; on host-memory runs it is host
                    // memory of one element.
                    let b = unsafe { std::slice::from_raw_parts(p as *const u8, a.dtype.size()) };
                    Scalar::from_bytes(a.dtype, b)
                }
            };
            ReduceOp::from_redop(a.op, scalar)
        }
        op => ReduceOp::from_redop(op, None),
    };
    op.ok_or_else(|| Error::arg(format!("reduction op {:?} is not supported", a.op)))
}

/// Builds the job (plan and buffers) for one validated call.
pub fn make_job(a: &Call) -> Result<Job> {
    let engine = a.comm.engine()?;
    let coll = a.kind;
    let inp = in_place(a);
    // In-place all-to-all: NCCL accepts it (nccl-tests calls it), and no
    // schedule can overwrite blocks it still has to send, so the input is
    // snapshotted and the out-of-place plan runs from the copy.
    let staged_send = if a.kind == Collective::AlltoAll && a.send_bytes > 0 && a.send == a.recv {
        // SAFETY: validated: `send` holds send_bytes readable bytes.
        unsafe { std::slice::from_raw_parts(a.send.bytes().cast_const(), a.send_bytes) }.to_vec()
    } else {
        Vec::new()
    };
    let op = if a.kind.reduces() {
        reduce_op(a)?
    } else {
        ReduceOp::Sum
    };
    let bytes = a.count * a.dtype.size();
    let p2p = matches!(coll, Collective::Send | Collective::Recv);
    // Point-to-point plans depend on neither NCCL_ALGO nor tuning: a group
    // of many sends skips the filter's lock, as does every call on a
    // communicator whose filter restricts nothing.
    let comm_filter = if p2p {
        None
    } else {
        engine.control.restricted_filter()
    };
    let unrestricted = AlgoFilter::default();
    let filter = if p2p {
        &unrestricted
    } else {
        a.filter(comm_filter.as_deref().unwrap_or(&unrestricted))
    };
    let forced = if p2p {
        None
    } else {
        let counted = super::group::depth() == 0 && engine.config.blocking;
        crate::control::online::pick(engine, &a.comm, coll, bytes, filter, counted, || {
            choose(engine, coll, bytes, filter)
        })?
    };
    let key = PlanKey {
        collective: coll,
        count: a.count,
        dtype: a.dtype,
        op,
        root: a.root as u32,
        in_place: inp,
        allowed: if p2p { 0 } else { filter.mask(coll) },
        checked: engine.settings.check && !p2p,
        forced,
        chunk_bytes: engine.control.chunk_bytes(),
        compress: engine.compression(),
    };
    let self_p2p = p2p && a.root == a.comm.rank;
    if self_p2p {
        let seq = engine.seq.fetch_add(1, Ordering::Relaxed);
        let id = trace_id(engine, a);
        return Ok(Job {
            plan: Arc::new(self_p2p::half(
                coll,
                a.comm.rank,
                a.comm.nranks,
                a.dtype,
                bytes,
            )),
            bufs: OpBuffers {
                send: a.send,
                recv: a.recv,
                scratch: Vec::new(),
                staged_send: Vec::new(),
            },
            p2p: true,
            trace: Trace {
                comm_hash: engine.comm_hash,
                seq,
                id,
            },
            self_p2p: true,
            fingerprint: None,
        });
    }
    let (algorithm, plan, fp) = engine.plans.lock().get_or_try_insert(key, || {
        let algorithm = match key.forced {
            Some(x) => x,
            None => choose(engine, coll, bytes, filter)?,
        };
        let args = algo::PlanArgs {
            collective: key.collective,
            count: key.count,
            dtype: key.dtype,
            op: key.op,
            root: key.root,
            in_place: key.in_place,
            compress: key.compress,
        };
        let plan = algo::generate(
            &args,
            algorithm,
            a.comm.rank as u32,
            &engine.topo,
            &Chunking {
                chunk_bytes: key.chunk_bytes,
                piece_bytes: crate::transport::PLAN_PIECE_BYTES,
            },
        )
        .map_err(|e| Error::Internal(format!("plan for {coll}: {e}").into()))?;
        if key.checked {
            let (plan, layout) = fingerprint::add(&plan);
            return Ok::<_, Error>((algorithm, plan, Some(layout)));
        }
        Ok::<_, Error>((algorithm, plan, None))
    })?;
    let seq = engine.seq.fetch_add(1, Ordering::Relaxed);
    let id = trace_id(engine, a);
    let coll_seq = if p2p {
        0
    } else {
        engine.coll_seq.fetch_add(1, Ordering::Relaxed)
    };
    tracing::info!(target: "hetccl::TUNING",
        "comm {:016x} seq {seq} rank {}: {coll} count {} {} bytes {bytes} algo={}",
        engine.comm_hash, a.comm.rank, a.count, a.dtype.name(), algorithm.name());
    let mut scratch = take_scratch(engine, plan.scratch_bytes);
    if let Some(l) = fp {
        let mine = Fingerprint::new(coll, a.count, a.dtype, op, a.root as u32, coll_seq)
            .with_wire(plan.wire);
        let mine = mine.encode();
        for at in l.out_slots() {
            scratch[at..at + fingerprint::BYTES].copy_from_slice(&mine);
        }
    }
    Ok(Job {
        plan,
        bufs: OpBuffers {
            send: if staged_send.is_empty() {
                a.send
            } else {
                // The job's own snapshot, which lives as long as the job.
                UserPtr::new(staged_send.as_ptr())
            },
            recv: a.recv,
            scratch,
            staged_send,
        },
        p2p,
        trace: Trace {
            comm_hash: engine.comm_hash,
            seq,
            id,
        },
        self_p2p: false,
        fingerprint: fp,
    })
}

/// The timeline identity of a call (`telemetry::trace::TraceId`), taken when its
/// job is made: collectives count per communicator, sends and receives per
/// pair of ranks. Counted only while the timeline is on (it is on from a
/// process's first communicator, so the counts match across ranks).
fn trace_id(engine: &Engine, a: &Call) -> TraceId {
    if !crate::telemetry::trace::on() {
        return TraceId::default();
    }
    let m = &engine.links.metrics;
    let (me, peer) = (a.comm.rank, a.root);
    let (seq, p2p) = match a.kind {
        Collective::Send => (m.next_p2p_seq(peer, true), Some((me as u32, peer as u32))),
        Collective::Recv => (m.next_p2p_seq(peer, false), Some((peer as u32, me as u32))),
        _ => (m.next_coll_seq(), None),
    };
    TraceId {
        comm_hash: engine.comm_hash,
        seq,
        p2p,
        device: false,
    }
}

/// The algorithm for a collective of `bytes`: `filter` (the call's
/// `algSelection`, else `NCCL_ALGO`) restricts; the tuning table, else the
/// cost model, picks (`crate::tune::choose`).
fn choose(
    engine: &Engine,
    coll: Collective,
    bytes: usize,
    filter: &AlgoFilter,
) -> Result<algo::Algorithm> {
    if matches!(coll, Collective::Send | Collective::Recv) {
        return Ok(algo::Algorithm::Direct);
    }
    crate::tune::choose::choose(
        coll,
        bytes,
        &engine.topo,
        &engine.costs,
        filter,
        &engine.tuning,
    )
    .map(|c| c.algo)
    .map_err(|e| Error::usage(e.to_string()))
}
