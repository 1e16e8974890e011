//! Running one step: local steps (copy, reduce, pre/post-op) all at once,
//! message steps as far as their link lets them.
//!
//! Buffers are the user's raw memory. Plans guarantee that the ranges of one
//! step are either identical or disjoint (see `algo::plan`), which is what
//! makes the slices built here sound.

use crate::algo::{BufId, BufRange, StepKind};
use crate::error::{Error, Result};
use crate::reduce;
use crate::transport::Conn;

use super::{at, fingerprint, Job};

fn ptr(job: &mut Job, r: &BufRange) -> *mut u8 {
    // SAFETY: plans only address ranges inside their buffers (see `at`).
    unsafe { at(job, r) }
}

pub(super) fn slice<'a>(job: &mut Job, r: &BufRange) -> &'a [u8] {
    if r.len == 0 {
        return &[];
    }
    // SAFETY: see `ptr`; the range is valid for reads for the step's duration.
    unsafe { std::slice::from_raw_parts(ptr(job, r), r.len) }
}

pub(super) fn slice_mut<'a>(job: &mut Job, r: &BufRange) -> &'a mut [u8] {
    if r.len == 0 {
        return &mut [];
    }
    // SAFETY: see `ptr`; no other slice of this step aliases it.
    unsafe { std::slice::from_raw_parts_mut(ptr(job, r), r.len) }
}

fn red(e: reduce::ReduceError) -> Error {
    Error::Internal(format!("reduction: {e}").into())
}

/// Runs a non-message step to completion.
pub(super) fn run_local(job: &mut Job, kind: &StepKind) -> Result<()> {
    let (dt, op, n) = (job.plan.dtype, job.plan.op, job.plan.nranks);
    match *kind {
        StepKind::Copy { src, dst } => {
            if src.len > 0 {
                let (s, d) = (ptr(job, &src), ptr(job, &dst));
                // SAFETY: both ranges are valid; `copy` tolerates overlap.
                unsafe { std::ptr::copy(s, d, src.len) };
            }
        }
        StepKind::Reduce { a, b, dst } => {
            if dst == a {
                reduce::reduce_into(slice_mut(job, &dst), slice(job, &b), dt, op).map_err(red)?;
            } else if dst == b {
                reduce::reduce_into(slice_mut(job, &dst), slice(job, &a), dt, op).map_err(red)?;
            } else {
                reduce::reduce3(slice_mut(job, &dst), slice(job, &a), slice(job, &b), dt, op)
                    .map_err(red)?;
            }
        }
        StepKind::PreOp { src, dst } => {
            reduce::pre_op(slice_mut(job, &dst), slice(job, &src), dt, op, n).map_err(red)?;
        }
        StepKind::PostOp { buf } => {
            reduce::post_op(slice_mut(job, &buf), dt, op, n).map_err(red)?;
            let wire = job.plan.wire;
            reduce::wire::round(wire, dt, slice_mut(job, &buf))
                .map_err(|e| Error::Internal(format!("rounding to the wire: {e}").into()))?;
        }
        StepKind::Send { .. } | StepKind::Recv { .. } | StepKind::RecvReduce { .. } => {
            return Err(Error::Internal("message step run as local".into()));
        }
    }
    Ok(())
}

/// Moves what it can of a peer's first message on a link (a receive into
/// a fingerprint slot, `fingerprint::Layout`), checking the fingerprint at
/// its head against this rank's as soon as it is in. Returns whether the
/// message is complete.
fn run_first_recv(
    job: &mut Job,
    l: fingerprint::Layout,
    dst: BufRange,
    conn: &Conn,
    moved: &mut usize,
    from: usize,
) -> Result<bool> {
    let mine = slice(
        job,
        &BufRange::new(BufId::Scratch, l.out, fingerprint::BYTES),
    );
    let slot = slice_mut(job, &dst.sub(0, fingerprint::SLOT));
    let me = job.plan.rank as usize;
    let check = |slot: &[u8]| fingerprint::check(mine, &slot[..fingerprint::BYTES], me, from);
    while *moved < dst.len {
        let before = *moved;
        let (n, whole) = conn
            .rx
            .try_recv_first(&mut slot[*moved..], dst.len - *moved)?;
        *moved += n;
        if whole {
            if *moved < fingerprint::BYTES {
                return Err(Error::usage(format!(
                    "rank {from} sent a first message of {} bytes, too short for the \
                     fingerprint of a collective, to rank {me}: the ranks' calls are \
                     mismatched (or HETCCL_CHECK differs between them)",
                    *moved
                )));
            }
            check(slot)?;
            if *moved != dst.len {
                return Err(Error::usage(format!(
                    "rank {from} sent a first message of {} bytes where rank {me} expected \
                     {} for the same call",
                    *moved, dst.len
                )));
            }
            return Ok(true);
        }
        if before < fingerprint::BYTES && *moved >= fingerprint::BYTES {
            check(slot)?;
        }
        if n == 0 {
            break;
        }
    }
    Ok(*moved == dst.len)
}

/// Moves what it can of a message step; returns whether it is complete.
/// `moved` is the step's progress in bytes, kept by the caller.
pub(super) fn run_message(
    job: &mut Job,
    kind: &StepKind,
    conn: &Conn,
    moved: &mut usize,
) -> Result<bool> {
    let (dt, op) = (job.plan.dtype, job.plan.op);
    let elem = dt.size();
    match *kind {
        StepKind::Send { src, .. } => {
            while *moved < src.len {
                let s = slice(job, &src.sub(*moved, src.len - *moved));
                let n = conn.tx.try_send(s)?;
                if n == 0 {
                    break;
                }
                *moved += n;
            }
            Ok(*moved == src.len)
        }
        StepKind::Recv { peer, dst, .. } => {
            if let Some(l) = job.fingerprint.filter(|l| l.is_inbox(&dst)) {
                return run_first_recv(job, l, dst, conn, moved, peer as usize);
            }
            let d = slice_mut(job, &dst);
            while *moved < dst.len {
                let n = conn.rx.try_recv_into(&mut d[*moved..])?;
                if n == 0 {
                    break;
                }
                *moved += n;
            }
            Ok(*moved == dst.len)
        }
        StepKind::RecvReduce { local, dst, .. } => {
            let same = local == dst;
            let d = slice_mut(job, &dst);
            let l = if same { &[][..] } else { slice(job, &local) };
            let mut err = None;
            while *moved < dst.len {
                let mut off = *moved;
                let n = conn.rx.try_recv_with(dst.len - *moved, elem, &mut |s| {
                    let out = &mut d[off..off + s.len()];
                    let r = if same {
                        reduce::reduce_into(out, s, dt, op)
                    } else {
                        reduce::reduce3(out, &l[off..off + s.len()], s, dt, op)
                    };
                    if let Err(e) = r {
                        err = Some(e);
                    }
                    off += s.len();
                })?;
                if let Some(e) = err {
                    return Err(red(e));
                }
                if n == 0 {
                    break;
                }
                *moved += n;
            }
            Ok(*moved == dst.len)
        }
        _ => Err(Error::Internal("local step run as message".into())),
    }
}

/// A step's name in the timeline, and the bytes it moves or touches.
pub(super) fn trace_name(kind: &StepKind) -> (&'static str, usize) {
    match *kind {
        StepKind::Send { src, .. } => ("send", src.len),
        StepKind::Recv { dst, .. } => ("recv", dst.len),
        StepKind::RecvReduce { dst, .. } => ("recv_reduce", dst.len),
        StepKind::Copy { src, .. } => ("copy", src.len),
        StepKind::Reduce { dst, .. } => ("reduce", dst.len),
        StepKind::PreOp { src, .. } => ("pre_op", src.len),
        StepKind::PostOp { buf } => ("post_op", buf.len),
    }
}
