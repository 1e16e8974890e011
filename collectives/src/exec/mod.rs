//! The executor: runs per-rank plans (from `algo`) over a communicator's
//! links, on the calling thread.
//!
//! A [`Batch`] holds every operation one communicator issued in one group
//! (or the single operation of a call outside a group). Their steps are
//! flattened in issue order, so messages to the same peer on the same link
//! keep the FIFO order both sides agree on. A step runs when its
//! dependencies are done; a message step additionally waits until it is the
//! head of its link's queue. Nothing blocks: each [`Batch::poll`] moves what
//! it can. [`drive`] polls a set of batches (several communicators driven by
//! one thread, as `ncclCommInitAll` users do) until all are done, spinning
//! briefly and then sleeping on the rank's doorbell or sockets, and gives up
//! at the deadline or when the communicator is aborted.

mod ahead;
mod bufs;
pub mod clock;
mod coalesce;
mod compress;
mod drive;
pub mod fingerprint;
mod mismatch;
pub mod self_p2p;
pub mod single;
mod step;
pub mod stop;
pub mod watch;

use std::collections::VecDeque;

use std::sync::Arc;
use std::time::Instant;

pub use self::bufs::BufPool;
pub use self::clock::Patience;
pub use self::drive::{drive, drive_with};
use crate::algo::{BufId, BufRange, Plan};
use crate::error::{Error, Result};
use crate::transport::doorbell::Doorbell;
use crate::transport::{Conn, WaitSource};
use crate::user_ptr::UserPtr;

/// The link channel reserved for point-to-point operations, so that sends
/// and receives never interleave with a collective's messages.
pub const P2P_CHAN: usize = crate::algo::CHANNELS as usize;
/// Link channels per peer: collective plans use `0..P2P_CHAN`.
pub const NCHAN: usize = P2P_CHAN + 1;

/// Everything a batch needs from its communicator.
#[derive(Debug)]
pub struct Links {
    /// This rank.
    pub rank: usize,
    /// The communicator in log lines and errors: its hash, and its
    /// `commName` when it has one.
    pub label: String,
    /// Connections by peer, then by link channel (None for self and for
    /// peers with no connection).
    pub peers: Vec<Option<Vec<Conn>>>,
    /// This rank's doorbell, if any of its links ring one.
    pub bell: Option<Doorbell>,
    /// Set when the communicator is aborted or revoked: every wait ends
    /// with an error saying which.
    pub stop: Arc<stop::Stop>,
    /// The node's progress board: peer liveness and hang summaries
    /// ([`watch::Watch::none`] when there is none).
    pub watch: watch::Watch,
    /// The communicator's metrics (`crate::telemetry`): the links' counters.
    pub metrics: Arc<crate::telemetry::Metrics>,
    /// By peer: whether it is on another node, so that a plan's messages
    /// to it travel in the plan's wire format ([`crate::algo::Plan::wire`]).
    pub cross_node: Vec<bool>,
    /// The vectors of finished batches, for the next ones.
    pub bufs: BufPool,
}

/// The buffers of one operation.
#[derive(Debug)]
pub struct OpBuffers {
    /// The user's send buffer.
    pub send: UserPtr,
    /// The user's receive buffer.
    pub recv: UserPtr,
    /// Scratch space the plan asked for.
    pub scratch: Vec<u8>,
    /// A private copy of the input when `send` points into it (in-place
    /// all-to-all); empty otherwise.
    pub staged_send: Vec<u8>,
}

/// One operation of a batch.
#[derive(Debug)]
pub struct Job {
    /// Its plan (shared with the communicator's plan cache).
    pub plan: Arc<Plan>,
    /// Its buffers.
    pub bufs: OpBuffers,
    /// Whether it is a point-to-point operation (uses [`P2P_CHAN`]).
    pub p2p: bool,
    /// What hang reports call it (see [`Job::label`]).
    pub trace: Trace,
    /// A send to, or receive from, this rank itself: it has no steps until
    /// `self_p2p::pair` matches it with its counterpart.
    pub self_p2p: bool,
    /// Where the plan's collective fingerprints are (`fingerprint`), when
    /// the plan exchanges them.
    pub fingerprint: Option<fingerprint::Layout>,
}

/// The identity of one operation across ranks: the same on every rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Trace {
    /// The communicator's hash.
    pub comm_hash: u64,
    /// The operation's sequence number on the communicator.
    pub seq: u64,
    /// Its timeline identity (`crate::telemetry::trace`), the same on every rank.
    pub id: crate::telemetry::trace::TraceId,
}

impl Job {
    /// "AllReduce seq 12 trace 0123…:12", for logs and hang reports.
    pub fn label(&self) -> String {
        format!(
            "{} seq {} trace {:016x}:{}",
            self.plan.collective, self.trace.seq, self.trace.comm_hash, self.trace.seq
        )
    }
}

type LinkKey = (usize, usize, bool); // (peer, link channel, is_send)

/// A set of operations of one communicator, run together.
#[derive(Debug)]
pub struct Batch<'a> {
    links: &'a Links,
    jobs: Vec<Job>,
    /// The per-step and per-link vectors, boxed so that a batch moves as
    /// a few words (see [`bufs::Bufs`] for each).
    k: Box<bufs::Bufs>,
    remaining: usize,
    /// Staging buffers of the compressed message steps in progress (step,
    /// buffer), and emptied ones kept for reuse.
    stages: Vec<(u32, Vec<u8>)>,
    spare: Vec<Vec<u8>>,
}

/// Emptied staging buffers a batch keeps for reuse.
const SPARE_STAGES: usize = 8;

impl<'a> Batch<'a> {
    /// Builds a batch; fails if a plan needs a link the communicator lacks.
    pub fn new(links: &'a Links, jobs: Vec<Job>) -> Result<Self> {
        Self::build(links, links.bufs.take(), jobs)
    }

    /// Builds a batch of one job, in a job list kept by the links (no
    /// allocation once the links have run a batch). `moved`: the bytes its
    /// first step moved already ([`single::try_once`]).
    pub fn one(links: &'a Links, job: Job, moved: usize) -> Result<Self> {
        let mut k = links.bufs.take();
        let mut jobs = std::mem::take(&mut k.jobs);
        jobs.clear();
        jobs.push(job);
        let mut b = Self::build(links, k, jobs)?;
        if let Some(m) = b.k.moved.first_mut() {
            *m = moved;
        }
        Ok(b)
    }

    fn build(links: &'a Links, mut k: Box<bufs::Bufs>, jobs: Vec<Job>) -> Result<Self> {
        let total: usize = jobs.iter().map(|j| j.plan.steps.len()).sum();
        k.reset(total, crate::telemetry::trace::on());
        let mut b = Batch {
            links,
            k,
            remaining: total,
            jobs: Vec::new(),
            stages: Vec::new(),
            spare: Vec::new(),
        };
        let mut base = 0u32;
        for (ji, job) in jobs.iter().enumerate() {
            for (si, step) in job.plan.steps.iter().enumerate() {
                let g = base + si as u32;
                b.k.index.push((ji, si));
                b.k.deps_left.push(step.deps.len() as u32);
                for &d in &step.deps {
                    b.k.dependents[(base + d) as usize].push(g);
                }
                if step.deps.is_empty() && step.kind.message().is_none() {
                    b.k.ready.push(g);
                }
                if let Some((peer, chan, is_send)) = step.kind.message() {
                    let lc = if job.p2p { P2P_CHAN } else { chan as usize };
                    if lc >= NCHAN || (!job.p2p && lc >= P2P_CHAN) {
                        return Err(Error::Internal(format!("plan uses channel {chan}").into()));
                    }
                    let peer = peer as usize;
                    if peer == links.rank
                        || links.peers.get(peer).and_then(|p| p.as_ref()).is_none()
                    {
                        return Err(Error::Internal(
                            format!("rank {} has no link to rank {peer}", links.rank).into(),
                        ));
                    }
                    b.queue_mut((peer, lc, is_send)).push_back(g);
                }
            }
            base += job.plan.steps.len() as u32;
        }
        b.jobs = jobs;
        Ok(b)
    }

    fn queue_mut(&mut self, key: LinkKey) -> &mut VecDeque<u32> {
        let i = match self.k.queues.iter().position(|(k, _)| *k == key) {
            Some(i) => i,
            None => {
                let q = self.k.spare_queues.pop().unwrap_or_default();
                self.k.queues.push((key, q));
                self.k.queues.len() - 1
            }
        };
        &mut self.k.queues[i].1
    }

    /// The index in `stages` of step `g`'s staging buffer (made on first use).
    fn stage(&mut self, g: u32) -> usize {
        if let Some(i) = self.stages.iter().position(|(s, _)| *s == g) {
            return i;
        }
        let buf = self.spare.pop().unwrap_or_default();
        self.stages.push((g, buf));
        self.stages.len() - 1
    }

    /// Frees the staging buffer at `at` (its step is complete).
    fn release_stage(&mut self, at: usize) {
        let (_, mut buf) = self.stages.swap_remove(at);
        if self.spare.len() < SPARE_STAGES {
            buf.clear();
            self.spare.push(buf);
        }
    }

    fn queue_head(&self, key: LinkKey) -> Option<u32> {
        self.k
            .queues
            .iter()
            .find(|(k, _)| *k == key)
            .and_then(|(_, q)| q.front().copied())
    }

    /// Whether every step is done.
    pub fn finished(&self) -> bool {
        self.remaining == 0
    }

    /// Hands each job to `f` (for its buffers after completion); the
    /// batch's vectors, its job list included, go back to its links for
    /// the next batch.
    pub fn finish_jobs(self, f: impl FnMut(Job)) {
        let (links, mut jobs, mut k) = self.split();
        jobs.drain(..).for_each(f);
        k.jobs = jobs;
        links.bufs.give(k);
    }

    /// The jobs (for their buffers and plans after completion); the
    /// batch's vectors go back to its links for the next batch.
    pub fn into_jobs(self) -> Vec<Job> {
        let (links, jobs, k) = self.split();
        links.bufs.give(k);
        jobs
    }

    /// The links, the jobs and the batch's vectors.
    fn split(self) -> (&'a Links, Vec<Job>, Box<bufs::Bufs>) {
        let Batch { links, jobs, k, .. } = self;
        (links, jobs, k)
    }

    /// Whether step `g` is a message (run from its link's queue, never
    /// from the ready list).
    fn is_message(&self, g: u32) -> bool {
        let (ji, si) = self.k.index[g as usize];
        self.jobs[ji].plan.steps[si].kind.message().is_some()
    }

    fn complete(&mut self, g: u32) {
        self.k.done[g as usize] = true;
        self.remaining -= 1;
        for i in 0..self.k.dependents[g as usize].len() {
            let d = self.k.dependents[g as usize][i];
            self.k.deps_left[d as usize] -= 1;
            if self.k.deps_left[d as usize] == 0 && !self.is_message(d) {
                self.k.ready.push(d);
            }
        }
    }

    /// Runs every step that can run now; returns whether anything moved.
    ///
    /// Message steps run from their links' queues: each queue's head runs
    /// when its dependencies are done, and a head that completes lets the
    /// next one run in the same pass, so a group of many messages to one
    /// peer costs one visit per message, not one scan of the group. Local
    /// steps (copies, reductions) run from the ready list, at most one per
    /// pass, so that links, which move only when polled, keep moving
    /// during a long run of local work.
    pub fn poll(&mut self) -> Result<bool> {
        let mut progressed = self.poll_links()?;
        if let Some(g) = self.next_local() {
            let (ji, si) = self.k.index[g as usize];
            let kind = self.jobs[ji].plan.steps[si].kind;
            let t0 = if self.k.started.is_empty() {
                0
            } else {
                crate::telemetry::clock::ticks()
            };
            step::run_local(&mut self.jobs[ji], &kind)?;
            if !self.k.started.is_empty() {
                self.k.started[g as usize] = t0;
                self.trace_step(g);
            }
            self.complete(g);
            progressed = true;
            // What the local step fed (a send of the sum) goes now.
            self.poll_links()?;
        }
        Ok(progressed)
    }

    /// Takes the oldest ready local step off the ready list.
    fn next_local(&mut self) -> Option<u32> {
        if self.k.ready.is_empty() {
            None
        } else {
            Some(self.k.ready.remove(0))
        }
    }

    /// Link queue `qi`'s key and head step, when that step is ready to run
    /// (every step it depends on done, itself not).
    fn ready_head(&self, qi: usize) -> Option<(LinkKey, u32)> {
        let (key, q) = &self.k.queues[qi];
        let g = *q.front()?;
        (self.k.deps_left[g as usize] == 0 && !self.k.done[g as usize]).then_some((*key, g))
    }

    /// Runs the ready head of every link queue, and each next head while
    /// they complete; returns whether anything moved.
    fn poll_links(&mut self) -> Result<bool> {
        let mut progressed = false;
        let mut qi = 0;
        while qi < self.k.queues.len() {
            let Some((key, g)) = self.ready_head(qi) else {
                qi += 1;
                continue;
            };
            let (finished, moved) = self.run_head(g, key, qi)?;
            progressed |= moved;
            if finished {
                progressed = true;
                self.k.queues[qi].1.pop_front();
                if !self.k.started.is_empty() {
                    self.trace_step(g);
                }
                self.complete(g);
            } else {
                qi += 1;
            }
        }
        Ok(progressed)
    }

    /// Moves message step `g`, the ready head of link `key`'s queue (queue
    /// number `qi`): (whether it completed, whether bytes moved).
    fn run_head(&mut self, g: u32, key: LinkKey, qi: usize) -> Result<(bool, bool)> {
        let (ji, si) = self.k.index[g as usize];
        let kind = self.jobs[ji].plan.steps[si].kind;
        let (peer, lc, is_send) = key;
        if is_send && self.packable(ji, &kind, peer as u32) {
            return Ok(match self.poll_packed(g, peer)? {
                coalesce::Packed::Pending(moved) => (false, moved),
                coalesce::Packed::Done => (true, true),
            });
        }
        let conn = &self.links.peers[peer].as_ref().expect("checked")[lc];
        let before = self.k.moved[g as usize];
        if !self.k.started.is_empty() && self.k.started[g as usize] == 0 {
            self.k.started[g as usize] = crate::telemetry::clock::ticks();
        }
        let cross = self.links.cross_node.get(peer) == Some(&true);
        let c = compress::format(&self.jobs[ji], &kind, cross);
        let r = if c == hetccl_core::config::Compression::Off {
            step::run_message(
                &mut self.jobs[ji],
                &kind,
                conn,
                &mut self.k.moved[g as usize],
            )
        } else {
            let at = self.stage(g);
            let r = compress::run_message(
                &mut self.jobs[ji],
                &kind,
                conn,
                &mut self.k.moved[g as usize],
                c,
                &mut self.stages[at].1,
            );
            if matches!(r, Ok(true)) {
                self.release_stage(at);
            }
            r
        };
        let moved = self.k.moved[g as usize] - before;
        self.links.count_link(peer, is_send, moved, &r);
        let done = r?;
        if !done
            && matches!(
                conn.transport,
                crate::transport::TransportKind::Verbs | crate::transport::TransportKind::Tcp
            )
        {
            self.post_next(qi)?;
        }
        Ok((done, moved != 0))
    }

    /// Records the timeline slice of step `g`, just completed.
    #[cold]
    fn trace_step(&self, g: u32) {
        let (ji, si) = self.k.index[g as usize];
        let job = &self.jobs[ji];
        let kind = &job.plan.steps[si].kind;
        let (name, bytes) = step::trace_name(kind);
        let (peer, chan) = match kind.message() {
            Some((p, c, _)) => (
                p as i32,
                if job.p2p {
                    P2P_CHAN as i32
                } else {
                    i32::from(c)
                },
            ),
            None => (-1, -1),
        };
        crate::telemetry::trace::record(crate::telemetry::trace::Event {
            what: crate::telemetry::trace::What::Step(name),
            start: self.k.started[g as usize],
            end: crate::telemetry::clock::ticks(),
            id: job.trace.id,
            rank: self.links.rank as u32,
            algo: "",
            dtype: job.plan.dtype.name(),
            op: "",
            peer,
            chan,
            bytes: bytes as u64,
        });
    }

    /// What to wait on: the wait sources of the links at the head of a
    /// queue whose step is ready.
    fn wait_sources(&self, out: &mut Vec<WaitSource>) {
        for qi in 0..self.k.queues.len() {
            if let Some(((peer, lc, is_send), _)) = self.ready_head(qi) {
                let c = &self.links.peers[peer].as_ref().expect("checked")[lc];
                out.push(if is_send {
                    c.tx.wait_source()
                } else {
                    c.rx.wait_source()
                });
            }
        }
    }
}

impl Batch<'_> {
    /// Appends the sockets of the links at the head of a queue whose step
    /// is ready (see [`crate::transport::SendLink::wait_fds`]); `false` if
    /// one of them cannot name its sockets now.
    fn wait_fds(&self, out: &mut Vec<libc::pollfd>) -> bool {
        for qi in 0..self.k.queues.len() {
            if let Some(((peer, lc, is_send), _)) = self.ready_head(qi) {
                let c = &self.links.peers[peer].as_ref().expect("checked")[lc];
                let ok = if is_send {
                    c.tx.wait_fds(out)
                } else {
                    c.rx.wait_fds(out)
                };
                if !ok {
                    return false;
                }
            }
        }
        true
    }
}

impl Links {
    /// Counts a message step's progress on its link to `peer`: the bytes
    /// it moved, one message when it completed, one error when it failed.
    #[inline]
    fn count_link(&self, peer: usize, is_send: bool, moved: usize, r: &Result<bool>) {
        use crate::telemetry::metrics::bump;
        let Some(l) = self.metrics.link(peer) else {
            return;
        };
        let (bytes, msgs) = if is_send {
            (&l.bytes_sent, &l.msgs_sent)
        } else {
            (&l.bytes_recv, &l.msgs_recv)
        };
        if moved != 0 {
            bump(bytes, moved as u64);
        }
        match r {
            Ok(true) => bump(msgs, 1),
            Ok(false) => {}
            Err(_) => bump(&l.errors, 1),
        }
    }

    /// Marks every link dead (abort): this rank's waits end and peers see
    /// the links closed.
    pub fn close_all(&self) {
        self.stop.abort();
        self.close_links();
    }

    /// Closes every link gracefully after the communicator's last
    /// operation (`ncclCommFinalize`): each returns once what this rank
    /// sent cannot be lost by closing it, or at `deadline`.
    ///
    /// Every receive side closes first: this rank's receives are done, and
    /// a verbs send side waits until its peer says so (or its sends are
    /// acknowledged). Closing each peer's receive side after its send side
    /// let two ranks with sends still in flight wait for each other until
    /// the deadline.
    pub fn finish(&self, deadline: Instant) {
        let conns = || self.peers.iter().flatten().flatten();
        for c in conns() {
            c.rx.finish(deadline);
        }
        for c in conns() {
            c.tx.finish(deadline);
        }
    }

    /// Marks every link dead because rank `by` revoked the communicator:
    /// this rank's waits end, and peers learn who revoked it.
    pub fn revoke(&self, by: usize) {
        self.stop.revoke(by);
        for c in self.peers.iter().flatten().flatten() {
            c.tx.revoke(by);
            c.rx.revoke(by);
        }
    }

    /// Marks every link dead without marking the communicator aborted: after
    /// a failed operation, so that shm peers blocked on this rank fail at
    /// once instead of waiting for their own stall limit.
    pub fn close_links(&self) {
        for c in self.peers.iter().flatten().flatten() {
            c.tx.close();
            c.rx.close();
        }
    }
}

/// One blocked message step of a batch.
#[derive(Debug, Clone)]
pub struct Blocked {
    /// What it waits on.
    pub on: watch::WaitOn,
    /// "AllReduce seq 12 trace …: step 3 waits for data from rank 2
    /// (channel 0), 0/65536 bytes moved".
    pub line: String,
}

impl Batch<'_> {
    /// Every blocked message step (the head of each link's queue).
    pub fn blocked(&self) -> Vec<Blocked> {
        let mut out = Vec::new();
        for &((peer, lc, is_send), ref q) in &self.k.queues {
            let Some(&g) = q.front() else { continue };
            if self.k.done[g as usize] {
                continue;
            }
            let (ji, si) = self.k.index[g as usize];
            let job = &self.jobs[ji];
            let len = job.plan.steps[si].kind.message_len().unwrap_or(0);
            let (kind, what) = if self.k.deps_left[g as usize] > 0 {
                (3, "is not ready yet (earlier steps pending) to")
            } else if is_send {
                (2, "waits for room to send to")
            } else {
                (1, "waits for data from")
            };
            out.push(Blocked {
                on: watch::WaitOn {
                    peer,
                    step: si,
                    kind,
                },
                line: format!(
                    "{}: step {si} {what} rank {peer} (channel {lc}), {}/{len} bytes moved",
                    job.label(),
                    self.k.moved[g as usize]
                ),
            });
        }
        out.sort_by(|a, b| (a.on.kind, &a.line).cmp(&(b.on.kind, &b.line)));
        out
    }

    /// One line per blocked message step: what it waits for, from whom.
    pub fn describe_wait(&self) -> Vec<String> {
        let mut v: Vec<String> = self.blocked().into_iter().map(|b| b.line).collect();
        v.sort();
        v
    }

    /// The highest sequence number of the batch's operations (what the
    /// progress board calls the batch).
    fn seq(&self) -> u64 {
        self.jobs.iter().map(|j| j.trace.seq).max().unwrap_or(0)
    }

    /// A peer this batch waits on whose process is gone: only a step that
    /// waits for the peer itself (data from it, room to send to it) over a
    /// link that cannot tell by itself (shm), not a step that is still
    /// waiting for earlier ones. A peer that finished its part and exited
    /// may have left what this rank still has to receive in the ring or the
    /// socket; TCP links report a dead peer themselves, as end of stream.
    fn dead_peer(&self) -> Option<usize> {
        let w = &self.links.watch;
        self.blocked()
            .iter()
            .filter(|b| b.on.kind != 3)
            .map(|b| b.on.peer)
            .filter(|&p| {
                self.links.peers[p]
                    .as_ref()
                    .is_some_and(|c| c[0].transport == crate::cost::TransportKind::Shm)
            })
            .find(|&p| w.peer_state(p) == watch::ProcState::Dead)
    }
}

/// The address of `r`'s first byte in `job`'s buffers.
///
/// # Safety
/// `r` lies inside its buffer: plans only address ranges inside their
/// buffers (checked by `Plan::validate` in debug builds and by the
/// generator's tests), and an [`BufId::Addr`] range is a call's own
/// buffer, checked when the call was made.
unsafe fn at(job: &mut Job, r: &BufRange) -> *mut u8 {
    let base = match r.buf {
        BufId::Send => job.bufs.send.bytes(),
        BufId::Recv => job.bufs.recv.bytes(),
        BufId::Scratch => job.bufs.scratch.as_mut_ptr(),
        // The call's own buffer, by its address: C's memory, with the
        // provenance the call exposed when it queued the address.
        BufId::Addr => return std::ptr::with_exposed_provenance_mut(r.offset),
    };
    // SAFETY: the range is inside the buffer, as the caller guarantees, so
    // the offset stays in the buffer's allocation.
    unsafe { base.add(r.offset) }
}

#[cfg(test)]
mod tests;
