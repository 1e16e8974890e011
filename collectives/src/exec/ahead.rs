//! Posting a link's next message while its current one is in flight
//! ([`crate::transport::SendLink::post_ahead`] and the receive side), so
//! that a transport with rendezvous (verbs, TCP) can exchange the next
//! message's handshake during the current transfer instead of after it.
//!
//! Only the step right behind a link's head is posted, once, and only when
//! it is ready (every step it depends on is done: plans carry all buffer
//! hazards as dependencies, `algo::builder`), so its bytes are final and
//! its destination free, exactly as if it ran now. Plain sends and
//! receives only: not receives reduced on receipt (posting those ahead
//! into a second staging buffer was measured slower on rxe),
//! fingerprinted first receives, compressed messages or coalesced packs.

use hetccl_core::config::Compression;

use super::{compress, step, Batch};
use crate::algo::StepKind;
use crate::error::Result;

impl Batch<'_> {
    /// Called while the head of link queue `qi` is in flight: posts the
    /// step behind it when it can go ahead.
    pub(super) fn post_next(&mut self, qi: usize) -> Result<()> {
        let (key, q) = &self.k.queues[qi];
        let key = *key;
        let Some(g) = q.get(1).copied() else {
            return Ok(());
        };
        let gi = g as usize;
        if self.k.ahead[gi] || self.k.deps_left[gi] != 0 || self.k.done[gi] || self.k.moved[gi] != 0
        {
            return Ok(());
        }
        let (ji, si) = self.k.index[gi];
        let kind = self.jobs[ji].plan.steps[si].kind;
        let (peer, lc, _) = key;
        let cross = self.links.cross_node.get(peer) == Some(&true);
        if compress::format(&self.jobs[ji], &kind, cross) != Compression::Off {
            return Ok(());
        }
        let links = self.links;
        let Some(conn) = links.peers[peer].as_ref().and_then(|c| c.get(lc)) else {
            return Ok(());
        };
        let job = &mut self.jobs[ji];
        let posted = match kind {
            StepKind::Send { src, .. } => conn.tx.post_ahead(step::slice(job, &src))?,
            StepKind::Recv { dst, .. } if !job.fingerprint.is_some_and(|l| l.is_inbox(&dst)) => {
                conn.rx.post_ahead(step::slice_mut(job, &dst))?
            }
            _ => false,
        };
        self.k.ahead[gi] = posted;
        Ok(())
    }
}
