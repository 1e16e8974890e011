//! The executor's side of coalescing (`transport::coalesce`): a small
//! point-to-point send at the head of a coalescing link's queue goes out in
//! a pack together with the small sends ready behind it, up to the link's
//! limit. The sends of a pack complete together once the link took it: the
//! head at once, the others as they reach the head (their bytes are then
//! already sent). Receives need nothing here: the link unpacks.

use crate::algo::StepKind;
use crate::error::Result;
use crate::transport::pack;

use super::{at, Batch, P2P_CHAN};

/// What [`Batch::poll_packed`] did with a step.
pub(super) enum Packed {
    /// Its pack is in flight (bytes moved, or not).
    Pending(bool),
    /// The step is complete.
    Done,
}

impl Batch<'_> {
    /// Whether step `kind` of job `ji`, a message to `peer`, goes through
    /// [`Batch::poll_packed`]: a point-to-point send small enough to pack
    /// on a link that coalesces.
    pub(super) fn packable(&self, ji: usize, kind: &StepKind, peer: u32) -> bool {
        let StepKind::Send { src, .. } = *kind else {
            return false;
        };
        self.jobs[ji].p2p
            && self
                .links
                .peers
                .get(peer as usize)
                .and_then(Option::as_ref)
                .and_then(|c| c.get(P2P_CHAN))
                .and_then(|c| c.tx.packer())
                .is_some_and(|p| p.limits().packs(src.len))
    }

    /// The source bytes of send step `h`, when it can join a pack now: it
    /// is ready, not started, and small enough. The slice is the user's
    /// memory, valid while the operation runs (as in `step::slice`).
    fn pack_part<'b>(&mut self, h: u32, max_part: usize) -> Option<&'b [u8]> {
        if self.k.done[h as usize]
            || self.k.deps_left[h as usize] != 0
            || self.k.moved[h as usize] != 0
        {
            return None;
        }
        let (ji, si) = self.k.index[h as usize];
        let job = &mut self.jobs[ji];
        let StepKind::Send { src, .. } = job.plan.steps[si].kind else {
            return None;
        };
        if !job.p2p || src.len == 0 || src.len > max_part {
            return None;
        }
        // SAFETY: plans address ranges inside their buffers (see
        // `step::ptr`), and the user's buffers stay valid and unchanged
        // until the operation completes, which outlasts this pack: the
        // bytes are copied into the pack before this call returns to
        // `poll_packed`'s caller.
        Some(unsafe { std::slice::from_raw_parts(at(job, &src), src.len) })
    }

    /// The first `n` steps of link `key`'s queue, in the batch's reused
    /// id list (the caller puts the list back in `k.ids`).
    fn queued_ids(&mut self, key: super::LinkKey, n: usize) -> Vec<u32> {
        let mut ids = std::mem::take(&mut self.k.ids);
        ids.clear();
        if let Some((_, q)) = self.k.queues.iter().find(|(k, _)| *k == key) {
            ids.extend(q.iter().take(n).copied());
        }
        ids
    }

    /// Runs send step `g`, the ready head of its link's queue, to `peer`
    /// through the link's packer (see [`Batch::packable`]). The caller
    /// takes a completed step off the queue.
    pub(super) fn poll_packed(&mut self, g: u32, peer: usize) -> Result<Packed> {
        let key = (peer, P2P_CHAN, true);
        let (ji, si) = self.k.index[g as usize];
        let len = self.jobs[ji].plan.steps[si].kind.message_len().unwrap_or(0);
        if !self.k.started.is_empty() && self.k.started[g as usize] == 0 {
            self.k.started[g as usize] = crate::telemetry::clock::ticks();
        }
        if self.k.moved[g as usize] == len {
            // Sent in the pack of an earlier head; its bytes were counted then.
            self.links.count_link(peer, true, 0, &Ok(true));
            return Ok(Packed::Done);
        }
        let links = self.links;
        let p = links.peers[peer].as_ref().expect("checked")[P2P_CHAN]
            .tx
            .packer()
            .expect("checked by packable");
        if !p.busy() {
            let limits = p.limits();
            // No more sub-messages than 1-byte ones could fill the pack.
            let most = limits.max_pack.saturating_sub(pack::HEADER) / 5;
            let queued = self.queued_ids(key, most);
            let (mut parts, mut payload) = (Vec::with_capacity(queued.len()), 0usize);
            for &h in &queued {
                let Some(s) = self.pack_part(h, limits.max_part) else {
                    break;
                };
                if pack::encoded_len(parts.len() + 1, payload + s.len()) > limits.max_pack {
                    break;
                }
                payload += s.len();
                parts.push(s);
            }
            self.k.ids = queued;
            p.start(&parts)?;
        }
        let (moved, sent) = p.poll().inspect_err(|_| {
            if let Some(l) = links.metrics.link(peer) {
                crate::telemetry::metrics::bump(&l.errors, 1);
            }
        })?;
        let Some(n) = sent else {
            return Ok(Packed::Pending(moved));
        };
        // The first `n` steps of the queue went out whole.
        let mut bytes = 0;
        let sent = self.queued_ids(key, n);
        for &h in &sent {
            let (hj, hs) = self.k.index[h as usize];
            let l = self.jobs[hj].plan.steps[hs].kind.message_len().unwrap_or(0);
            self.k.moved[h as usize] = l;
            bytes += l;
        }
        self.k.ids = sent;
        self.links.count_link(peer, true, bytes, &Ok(true));
        if let Some(l) = self.links.metrics.link(peer) {
            crate::telemetry::metrics::bump(&l.packs_sent, 1);
        }
        Ok(Packed::Done)
    }
}
