//! The shortcut for an operation whose plan is one plain message (the
//! root's send or a receiver's receive of a 2-rank broadcast, a lone send
//! or receive): the message is tried once before any batch is built. An
//! eager send the socket takes whole, or a receive whose message already
//! arrived, completes there, without the batch's lists and poll loop. A
//! message that is not done goes on in a batch that starts from the bytes
//! it moved ([`super::Batch::one`]), so the link sees one message either
//! way.
//!
//! The message may be followed by copies that depend on no step (an
//! out-of-place broadcast root's own copy): they run once the message is
//! done, or in the batch with everything else.
//!
//! Not taken: other plans of several steps, collective fingerprints, compressed
//! messages, sends a coalescing link packs, sends to oneself, and any
//! operation while the timeline records steps (its step slices come from
//! the batch).

use hetccl_core::config::Compression;

use super::{compress, drive, step, Job, Links, NCHAN, P2P_CHAN};
use crate::algo::StepKind;
use crate::error::Result;

/// What [`try_once`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Once {
    /// The message is complete.
    Done,
    /// The message moved this many bytes and goes on in a batch.
    Started(usize),
    /// The operation is not one the shortcut takes; nothing moved.
    Unfit,
}

/// Tries `job`'s only message once (see the module docs). An error is
/// the operation's failure, reported as `drive` reports it: the reason
/// the communicator was stopped when it was, a stall as a remote error,
/// and the links closed so that peers waiting on this rank fail too.
pub fn try_once(links: &Links, job: &mut Job) -> Result<Once> {
    let Some((_, rest)) = job.plan.steps.split_first() else {
        return Ok(Once::Unfit);
    };
    // Copies that wait for nothing (a broadcast root's own copy) may follow.
    let copies_only = rest
        .iter()
        .all(|s| s.deps.is_empty() && matches!(s.kind, StepKind::Copy { .. }));
    if !copies_only || job.fingerprint.is_some() || job.self_p2p {
        return Ok(Once::Unfit);
    }
    if crate::telemetry::trace::on() {
        return Ok(Once::Unfit);
    }
    let kind = job.plan.steps[0].kind;
    if !matches!(kind, StepKind::Send { .. } | StepKind::Recv { .. }) {
        return Ok(Once::Unfit);
    }
    let Some((peer, chan, is_send)) = kind.message() else {
        return Ok(Once::Unfit);
    };
    let peer = peer as usize;
    let lc = if job.p2p { P2P_CHAN } else { chan as usize };
    if peer == links.rank || lc >= NCHAN {
        return Ok(Once::Unfit);
    }
    let Some(conn) = links
        .peers
        .get(peer)
        .and_then(Option::as_ref)
        .and_then(|c| c.get(lc))
    else {
        return Ok(Once::Unfit);
    };
    let cross = links.cross_node.get(peer) == Some(&true);
    if compress::format(job, &kind, cross) != Compression::Off {
        return Ok(Once::Unfit);
    }
    if let StepKind::Send { src, .. } = kind {
        if job.p2p && conn.tx.packer().is_some_and(|p| p.limits().packs(src.len)) {
            return Ok(Once::Unfit);
        }
    }
    let mut moved = 0;
    let r = step::run_message(job, &kind, conn, &mut moved);
    links.count_link(peer, is_send, moved, &r);
    match r {
        Ok(true) => {
            for i in 1..job.plan.steps.len() {
                let kind = job.plan.steps[i].kind;
                step::run_local(job, &kind)?;
            }
            Ok(Once::Done)
        }
        Ok(false) => Ok(Once::Started(moved)),
        Err(e) => {
            let e = links.stop.error().unwrap_or(e);
            links.close_links();
            Err(drive::as_remote(e))
        }
    }
}
