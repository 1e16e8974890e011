//! What a batch does when an operation fails near its fingerprints, so
//! that every rank whose call differs reports the mismatch, not only the
//! first to find it.
//!
//! The rank that finds a mismatch stops, and its peers then see its links
//! close. Two things keep them from reporting only that: the finder first
//! pushes out its own fingerprints that are ready to go (its peers check
//! them), for a bounded time; and a rank that sees a link close first
//! looks at the fingerprints already waiting on its links, and reports a
//! mismatch among them instead.

use std::time::{Duration, Instant};

use super::{step, Batch};
use crate::algo::{BufId, StepKind};
use crate::error::Error;

/// How long the finder keeps pushing its fingerprints out.
const FLUSH: Duration = Duration::from_millis(100);

impl Batch<'_> {
    /// The error to report for `e`, which ended this batch.
    pub(super) fn explain_failure(&mut self, e: Error) -> Error {
        match e {
            Error::InvalidUsage(_) => {
                self.flush_fingerprints(Instant::now() + FLUSH);
                e
            }
            Error::Remote(_) | Error::Revoked(_) => match self.probe_fingerprints() {
                Some(m) => {
                    self.flush_fingerprints(Instant::now() + FLUSH);
                    m
                }
                None => e,
            },
            e => e,
        }
    }

    /// Whether step `g` moves a fingerprint: a send or receive of a slot,
    /// or the copy that fills a send slot.
    fn is_fingerprint_step(&self, g: u32) -> bool {
        let (ji, si) = self.k.index[g as usize];
        let job = &self.jobs[ji];
        let Some(l) = job.fingerprint else {
            return false;
        };
        match job.plan.steps[si].kind {
            StepKind::Send { src, .. } => l.is_out(&src),
            StepKind::Copy { dst, .. } => {
                dst.buf == BufId::Scratch && (l.out..l.inbox).contains(&dst.offset)
            }
            StepKind::Recv { dst, .. } => l.is_inbox(&dst),
            _ => false,
        }
    }

    /// Runs the ready fingerprint sends (and the copies that fill them)
    /// until none is left or `deadline`, ignoring errors: the batch has
    /// failed already.
    fn flush_fingerprints(&mut self, deadline: Instant) {
        loop {
            let mut left = false;
            // The copies that fill send slots (local steps: the ready list).
            let mut i = 0;
            while i < self.k.ready.len() {
                let g = self.k.ready[i];
                let (ji, si) = self.k.index[g as usize];
                let kind = self.jobs[ji].plan.steps[si].kind;
                if !self.is_fingerprint_step(g) {
                    i += 1;
                    continue;
                }
                self.k.ready.swap_remove(i);
                if step::run_local(&mut self.jobs[ji], &kind).is_ok() {
                    self.complete(g);
                }
            }
            // The sends: each send queue's ready head while it is one.
            let mut qi = 0;
            while qi < self.k.queues.len() {
                let Some(((peer, lc, true), g)) = self.ready_head(qi) else {
                    qi += 1;
                    continue;
                };
                if !self.is_fingerprint_step(g) {
                    qi += 1;
                    continue;
                }
                let (ji, si) = self.k.index[g as usize];
                let kind = self.jobs[ji].plan.steps[si].kind;
                let conn = &self.links.peers[peer].as_ref().expect("checked")[lc];
                let moved = &mut self.k.moved[g as usize];
                match step::run_message(&mut self.jobs[ji], &kind, conn, moved) {
                    Ok(true) => {
                        self.k.queues[qi].1.pop_front();
                        self.complete(g);
                    }
                    Ok(false) => {
                        left = true;
                        qi += 1;
                    }
                    Err(_) => qi += 1,
                }
            }
            if !left || Instant::now() >= deadline {
                return;
            }
            std::thread::yield_now();
        }
    }

    /// A mismatch among the fingerprints already waiting on this batch's
    /// links: each unfinished fingerprint receive at the head of its link
    /// takes what has arrived, whatever its dependencies (its slot is
    /// private scratch), and is checked.
    fn probe_fingerprints(&mut self) -> Option<Error> {
        for g in 0..self.k.index.len() as u32 {
            if self.k.done[g as usize] || !self.is_fingerprint_step(g) {
                continue;
            }
            let (ji, si) = self.k.index[g as usize];
            let kind = self.jobs[ji].plan.steps[si].kind;
            let Some((peer, chan, false)) = kind.message() else {
                continue;
            };
            let key = (peer as usize, chan as usize, false);
            if self.queue_head(key) != Some(g) {
                continue;
            }
            let conn = &self.links.peers[peer as usize].as_ref().expect("checked")[chan as usize];
            let moved = &mut self.k.moved[g as usize];
            if let Err(e @ Error::InvalidUsage(_)) =
                step::run_message(&mut self.jobs[ji], &kind, conn, moved)
            {
                return Some(e);
            }
        }
        None
    }
}
