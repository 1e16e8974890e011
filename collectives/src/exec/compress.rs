//! Message steps on a compressed wire: a plan's messages to a rank on
//! another node when the plan's wire format is on ([`crate::algo::Plan::wire`],
//! `reduce::wire`).
//!
//! A send encodes its whole range into a staging buffer when it starts and
//! then moves the encoded bytes. A bf16 receive decodes into its
//! destination (`Recv`), or adds in float32 to its local operand
//! (`RecvReduce`), as the bytes arrive; an fp8 receive, whose message
//! starts with its scale, takes the whole message into a staging buffer
//! first and checks it. The fingerprint messages of `exec::fingerprint` travel
//! as they are.

use hetccl_core::config::Compression;

use super::step::{slice, slice_mut};
use super::Job;
use crate::algo::{BufRange, StepKind};
use crate::error::{Error, Result};
use crate::reduce::wire;
use crate::transport::Conn;

/// The wire format of a message step of `job`: the plan's when its peer is
/// on another node (`cross_node`), except for point-to-point operations and
/// fingerprint messages.
pub(super) fn format(job: &Job, kind: &StepKind, cross_node: bool) -> Compression {
    let c = job.plan.wire;
    if c == Compression::Off || !cross_node || job.p2p {
        return Compression::Off;
    }
    let slot = match (kind, job.fingerprint) {
        (StepKind::Send { src, .. }, Some(l)) => l.is_out(src),
        (StepKind::Recv { dst, .. }, Some(l)) => l.is_inbox(dst),
        _ => false,
    };
    if slot {
        Compression::Off
    } else {
        c
    }
}

/// Moves what it can of a message step in wire format `c` (not `Off`);
/// returns whether it is complete. `stage` is the step's own staging
/// buffer (empty when the step starts, kept in place until it completes);
/// `moved` counts wire bytes.
pub(super) fn run_message(
    job: &mut Job,
    kind: &StepKind,
    conn: &Conn,
    moved: &mut usize,
    c: Compression,
    stage: &mut Vec<u8>,
) -> Result<bool> {
    let dt = job.plan.dtype;
    match *kind {
        StepKind::Send { src, .. } => {
            if stage.is_empty() {
                wire::encode(c, dt, slice(job, &src), stage)
                    .map_err(|e| Error::Internal(format!("compressing a message: {e}").into()))?;
            }
            while *moved < stage.len() {
                let n = conn.tx.try_send(&stage[*moved..])?;
                if n == 0 {
                    break;
                }
                *moved += n;
            }
            Ok(*moved == stage.len())
        }
        StepKind::Recv { peer, dst, .. } | StepKind::RecvReduce { peer, dst, .. }
            if c == Compression::Bf16 =>
        {
            recv_bf16(job, kind, peer, dst, conn, moved)
        }
        StepKind::Recv { peer, dst, .. } | StepKind::RecvReduce { peer, dst, .. } => {
            let want = wire::wire_len(c, dt, dst.len);
            if stage.len() != want {
                stage.resize(want, 0);
            }
            while *moved < want {
                let n = conn.rx.try_recv_into(&mut stage[*moved..])?;
                if n == 0 {
                    break;
                }
                *moved += n;
            }
            if *moved < want {
                return Ok(false);
            }
            let bad = |e: wire::WireError| {
                Error::Remote(format!("rank {peer} sent a bad compressed message: {e}").into())
            };
            let out = slice_mut(job, &dst);
            match *kind {
                StepKind::RecvReduce { local, .. } if local != dst => {
                    let l = slice(job, &local);
                    wire::decode_reduce(c, dt, stage, Some(l), out).map_err(bad)?;
                }
                StepKind::RecvReduce { .. } => {
                    wire::decode_reduce(c, dt, stage, None, out).map_err(bad)?
                }
                _ => wire::decode(c, dt, stage, out).map_err(bad)?,
            }
            Ok(true)
        }
        _ => Err(Error::Internal("local step run as message".into())),
    }
}

/// A bf16 receive, decoded (and added) as its bytes arrive, straight from
/// the link's buffers: bf16 messages have no header.
fn recv_bf16(
    job: &mut Job,
    kind: &StepKind,
    peer: u32,
    dst: BufRange,
    conn: &Conn,
    moved: &mut usize,
) -> Result<bool> {
    let dt = job.plan.dtype;
    let esize = dt.size();
    let want = wire::wire_len(Compression::Bf16, dt, dst.len);
    let (local, add) = match *kind {
        StepKind::RecvReduce { local, .. } if local != dst => (Some(slice(job, &local)), true),
        StepKind::RecvReduce { .. } => (None, true),
        _ => (None, false),
    };
    let out = slice_mut(job, &dst);
    let mut err = None;
    while *moved < want {
        let mut off = *moved;
        let n = conn.rx.try_recv_with(want - *moved, 2, &mut |s| {
            let (e0, e1) = (off / 2, off / 2 + s.len() / 2);
            let d = &mut out[e0 * esize..e1 * esize];
            let l = local.map(|l| &l[e0 * esize..e1 * esize]);
            if let Err(e) = wire::bf16_part(dt, s, l, d, add) {
                err = Some(e);
            }
            off += s.len();
        })?;
        if let Some(e) = err {
            return Err(Error::Remote(
                format!("rank {peer} sent a bad compressed message: {e}").into(),
            ));
        }
        if n == 0 {
            break;
        }
        *moved += n;
    }
    Ok(*moved == want)
}
