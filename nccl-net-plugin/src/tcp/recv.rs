//! The receiving end of a TCP comm, and tag matching.
//!
//! Matching rule (what NCCL expects): an arriving message takes the first
//! open entry with its tag in the **oldest** posted receive that has one;
//! otherwise it waits, in arrival order, in a bounded unexpected queue, and a
//! newly posted receive takes the oldest waiting message of each entry's tag.
//! Messages with the same tag therefore complete in order (per-tag FIFO).

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

use parking_lot::Mutex;

use super::ctrl::{Ctrl, InEvent, MAX_INLINE};
use super::lanes::{Lanes, Progress};
use super::linger::{linger, Lingered};
use super::{TcpOptions, MAX_RECVS, MAX_REQUESTS};
use crate::error::{NetError, Result};
use crate::wire::{DataMode, Frame};

/// Most messages kept unexpected (the sender can have at most MAX_REQUESTS in flight).
const MAX_UNEXPECTED: usize = 2 * MAX_REQUESTS;
/// Most inline bytes kept unexpected.
const MAX_UNEXPECTED_BYTES: usize = 16 << 20;

/// A posted receive.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RecvRequest(pub(crate) u64);

/// The sizes a completed receive reports, one per buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecvSizes {
    n: usize,
    sizes: [usize; MAX_RECVS],
}

impl RecvSizes {
    /// The sizes of a receive of `s.len()` (at most `MAX_RECVS`) buffers.
    pub(crate) fn from_slice(s: &[usize]) -> Self {
        let mut sizes = [0; MAX_RECVS];
        let n = s.len().min(MAX_RECVS);
        sizes[..n].copy_from_slice(&s[..n]);
        Self { n, sizes }
    }
}

impl std::ops::Deref for RecvSizes {
    type Target = [usize];
    fn deref(&self) -> &[usize] {
        &self.sizes[..self.n]
    }
}

/// What [`TcpRecvComm::irecv_now`] did with a receive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecvPosted {
    /// Complete at once: the size of each buffer's message.
    Done(RecvSizes),
    /// Posted like [`TcpRecvComm::irecv`]: test the request.
    Posted(RecvRequest),
}

/// The sizes a completed (or, for `optional`, fully matched) receive reports.
fn sizes_of(r: &Req) -> RecvSizes {
    let mut sizes = RecvSizes {
        n: r.entries.len(),
        sizes: [0; MAX_RECVS],
    };
    for (i, e) in r.entries.iter().enumerate() {
        if let EntrySt::Done(s) | EntrySt::Matched(s, _) = e.st {
            sizes.sizes[i] = s;
        }
    }
    sizes
}

/// One buffer of a grouped receive.
#[derive(Debug, Clone, Copy)]
pub struct RecvBuf {
    /// Where the message goes.
    pub ptr: *mut u8,
    /// Capacity: the largest message accepted.
    pub cap: usize,
    /// The tag to match.
    pub tag: i32,
}

// SAFETY: a RecvBuf only names memory; irecv's contract makes the caller keep
// it valid while any thread of the comm may write it.
unsafe impl Send for RecvBuf {}
// SAFETY: as above; it is never dereferenced through a shared reference.
unsafe impl Sync for RecvBuf {}

enum EntrySt {
    Open,
    /// Matched; data arriving by lanes (`Some`) or on the control socket (`None`).
    Matched(usize, Option<Arc<Progress>>),
    Done(usize),
    Failed(NetError),
}

struct Entry {
    buf: RecvBuf,
    st: EntrySt,
}

struct Req {
    id: u64,
    entries: Vec<Entry>,
    optional: bool,
}

struct Unexpected {
    seq: u64,
    tag: i32,
    size: u64,
    inline: Option<Vec<u8>>,
}

/// A payload expected as a DATA frame on the control socket.
struct CtrlData {
    seq: u64,
    ptr: usize,
    len: usize,
    req: u64,
    idx: usize,
}

struct State {
    ctrl: Ctrl,
    expect_seq: u64,
    reqs: VecDeque<Req>,
    next_id: u64,
    unexpected: VecDeque<Unexpected>,
    unexpected_bytes: usize,
    ctrl_data: VecDeque<CtrlData>,
    failed: Option<NetError>,
    /// The peer closed the control socket: nothing more will be matched, but
    /// payloads already on the data sockets may still complete.
    closed: Option<NetError>,
    /// Emptied buffers of small unexpected inline payloads, for the next.
    spare_inline: Vec<Vec<u8>>,
    /// The same for payloads above [`SPARE_INLINE_BYTES`].
    spare_large: Vec<Vec<u8>>,
    /// Emptied entry lists of finished requests, for the next.
    spare_entries: Vec<Vec<Entry>>,
}

/// Most emptied unexpected-payload buffers a comm keeps, and the largest
/// one kept: small eager messages (a root's broadcasts running ahead) then
/// queue without an allocation each.
const SPARE_INLINE: usize = 64;
const SPARE_INLINE_BYTES: usize = 4096;
/// Most emptied buffers of larger unexpected payloads (up to the largest
/// inline message) a comm keeps: a root's 64 KiB broadcasts running ahead
/// queue without an allocation each, for at most 256 KiB kept.
const SPARE_LARGE: usize = 4;
/// Most emptied entry lists a comm keeps.
const SPARE_ENTRIES: usize = 8;

/// Keeps the buffer of a matched unexpected payload for a later one, when
/// small and room is left.
fn keep_inline(st: &mut State, v: Vec<u8>) {
    if v.capacity() <= SPARE_INLINE_BYTES {
        if st.spare_inline.len() < SPARE_INLINE {
            st.spare_inline.push(v);
        }
    } else if v.capacity() <= MAX_INLINE && st.spare_large.len() < SPARE_LARGE {
        st.spare_large.push(v);
    }
}

/// Keeps the emptied entry list of a finished request `r` for a later one.
fn keep_entries(st: &mut State, r: Req) {
    let mut e = r.entries;
    if st.spare_entries.len() < SPARE_ENTRIES {
        e.clear();
        st.spare_entries.push(e);
    }
}

/// The receiving end of a comm. Thread-safe; every call takes the comm lock.
pub struct TcpRecvComm {
    st: Mutex<State>,
    lanes: Option<Lanes>,
    opts: TcpOptions,
}

impl std::fmt::Debug for TcpRecvComm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TcpRecvComm")
            .field("lanes", &self.lanes.as_ref().map(Lanes::len))
            .finish()
    }
}

impl TcpRecvComm {
    /// The control and data sockets' descriptors (tests).
    #[cfg(test)]
    pub(crate) fn fds(&self) -> Vec<std::os::fd::RawFd> {
        let mut v = vec![self.st.lock().ctrl.pollfd(true).fd];
        v.extend(self.lanes.iter().flat_map(|l| l.fds()));
        v
    }

    pub(crate) fn new(ctrl: Ctrl, lanes: Option<Lanes>, opts: TcpOptions) -> Self {
        let st = State {
            ctrl,
            expect_seq: 0,
            reqs: VecDeque::new(),
            next_id: 0,
            unexpected: VecDeque::new(),
            unexpected_bytes: 0,
            ctrl_data: VecDeque::new(),
            failed: None,
            closed: None,
            spare_inline: Vec::new(),
            spare_large: Vec::new(),
            spare_entries: Vec::new(),
        };
        Self {
            st: Mutex::new(st),
            lanes,
            opts,
        }
    }

    /// Number of data sockets.
    pub fn nsocks(&self) -> usize {
        self.lanes.as_ref().map_or(0, Lanes::len)
    }

    /// Posts a grouped receive of 1..=8 buffers. `optional` (NCCL's 0x1
    /// hint) lets the request complete once every message is matched and its
    /// payload is being written by the helper threads, before it has fully
    /// landed. `Ok(None)` means "retry later".
    ///
    /// # Safety
    /// Each buffer must stay writable for `cap` bytes until the request is
    /// reported done (for `optional`, until the comm is closed).
    pub unsafe fn irecv(&self, bufs: &[RecvBuf], optional: bool) -> Result<Option<RecvRequest>> {
        // SAFETY: the caller's contract, passed on.
        let r = unsafe { self.post(bufs, optional, false) }?;
        Ok(r.map(|p| match p {
            RecvPosted::Posted(q) => q,
            RecvPosted::Done(_) => unreachable!("post keeps every request when asked to"),
        }))
    }

    /// As [`TcpRecvComm::irecv`], but a receive that every buffer of
    /// completes at once, from messages that arrived inline before it was
    /// posted, is reported [`RecvPosted::Done`] with its sizes: it has no
    /// request, and the comm is not driven further in this call. A
    /// receiver behind its sender (back-to-back broadcasts) then takes one
    /// queued message per call without touching the socket.
    ///
    /// # Safety
    /// As for [`TcpRecvComm::irecv`] (for a receive reported `Posted`).
    pub unsafe fn irecv_now(&self, bufs: &[RecvBuf]) -> Result<Option<RecvPosted>> {
        // SAFETY: the caller's contract, passed on.
        unsafe { self.post(bufs, false, true) }
    }

    /// Posts a receive; with `done_now`, one that completes at once is
    /// reported `Done` and kept nowhere (see [`TcpRecvComm::irecv_now`]).
    ///
    /// # Safety
    /// As for [`TcpRecvComm::irecv`].
    unsafe fn post(
        &self,
        bufs: &[RecvBuf],
        optional: bool,
        done_now: bool,
    ) -> Result<Option<RecvPosted>> {
        if bufs.is_empty() || bufs.len() > MAX_RECVS {
            return Err(NetError::InvalidArgument(format!(
                "irecv of {} buffers (1..={MAX_RECVS})",
                bufs.len()
            )));
        }
        if bufs.iter().any(|b| b.ptr.is_null() && b.cap > 0) {
            return Err(NetError::InvalidArgument("irecv into a NULL buffer".into()));
        }
        let mut st = self.st.lock();
        if let Some(e) = &st.failed {
            return Err(e.clone());
        }
        if st.reqs.len() >= MAX_REQUESTS {
            return Ok(None);
        }
        let id = st.next_id;
        st.next_id += 1;
        let mut entries = st.spare_entries.pop().unwrap_or_default();
        entries.extend(bufs.iter().map(|&buf| Entry {
            buf,
            st: EntrySt::Open,
        }));
        st.reqs.push_back(Req {
            id,
            entries,
            optional,
        });
        let ri = st.reqs.len() - 1;
        for (idx, b) in bufs.iter().enumerate() {
            let tag = b.tag;
            if let Some(pos) = st.unexpected.iter().position(|u| u.tag == tag) {
                let u = st.unexpected.remove(pos).expect("position is valid");
                st.unexpected_bytes -= u.inline.as_ref().map_or(0, Vec::len);
                self.match_entry(&mut st, ri, idx, u.seq, u.size, u.inline.as_deref());
                if let Some(v) = u.inline {
                    keep_inline(&mut st, v);
                }
            }
        }
        if let Some(c) = st.closed.clone() {
            let r = st.reqs.back().expect("just pushed");
            if r.entries.iter().any(|e| matches!(e.st, EntrySt::Open)) {
                let r = st.reqs.pop_back().expect("just pushed");
                keep_entries(&mut st, r);
                return Err(c);
            }
        }
        // No read here (test does that); just send any CTS this produced.
        if st.ctrl.has_output() {
            if let Err(e) = st.ctrl.flush(&mut Vec::new()) {
                st.failed = Some(e);
            }
        }
        let r = st.reqs.back().expect("just pushed");
        if done_now && r.entries.iter().all(|e| matches!(e.st, EntrySt::Done(_))) {
            // What an earlier pass peeked leaves the kernel's queue now, as
            // a progress pass would do first: a receiver that takes queued
            // messages this way keeps the sender's window open.
            if let Err(e) = st.ctrl.release() {
                st.failed = Some(e);
            }
            let r = st.reqs.pop_back().expect("just pushed");
            let sizes = sizes_of(&r);
            keep_entries(&mut st, r);
            return Ok(Some(RecvPosted::Done(sizes)));
        }
        Ok(Some(RecvPosted::Posted(RecvRequest(id))))
    }

    /// Tests a receive: `Ok(Some(sizes))` once done (the request is then
    /// gone), `Ok(None)` while in flight.
    pub fn test(&self, req: RecvRequest) -> Result<Option<RecvSizes>> {
        let mut st = self.st.lock();
        let prog = self.progress(&mut st);
        let Some(pos) = st.reqs.iter().position(|r| r.id == req.0) else {
            return Err(NetError::InvalidArgument(format!(
                "unknown receive request {}",
                req.0
            )));
        };
        let closed = st.closed.clone();
        let r = &mut st.reqs[pos];
        let helpers = self.lanes.as_ref().is_some_and(|l| !l.is_inline());
        let mut complete = true;
        let mut error = None;
        for e in &mut r.entries {
            if let EntrySt::Matched(size, Some(p)) = &e.st {
                match p.poll() {
                    Ok(true) => e.st = EntrySt::Done(*size),
                    Ok(false) => {}
                    Err(err) => e.st = EntrySt::Failed(err),
                }
            }
            match &e.st {
                EntrySt::Done(_) => {}
                // Lanes finish on their own; control-socket data needs our polling.
                EntrySt::Matched(_, Some(_)) if r.optional && helpers => {}
                EntrySt::Failed(err) => error = error.or(Some(err.clone())),
                _ => complete = false,
            }
        }
        if error.is_none() && !complete {
            if let Some(c) = &closed {
                let needs_ctrl = r
                    .entries
                    .iter()
                    .any(|e| matches!(e.st, EntrySt::Open | EntrySt::Matched(_, None)));
                if needs_ctrl {
                    error = Some(c.clone());
                }
            }
        }
        if let Some(err) = error {
            let r = st.reqs.remove(pos).expect("position is valid");
            keep_entries(&mut st, r);
            return Err(err);
        }
        if complete {
            let r = st.reqs.remove(pos).expect("position is valid");
            let sizes = sizes_of(&r);
            keep_entries(&mut st, r);
            return Ok(Some(sizes));
        }
        prog?;
        Ok(None)
    }

    /// Matches message `seq` to entry `idx` of request number `ri`.
    fn match_entry(
        &self,
        st: &mut State,
        ri: usize,
        idx: usize,
        seq: u64,
        size: u64,
        inline: Option<&[u8]>,
    ) {
        let req_id = st.reqs[ri].id;
        let buf = st.reqs[ri].entries[idx].buf;
        let size = usize::try_from(size).unwrap_or(usize::MAX);
        let new = if size > buf.cap {
            if inline.is_none() {
                st.ctrl.push_frame(&Frame::Reject { seq }, &[]);
            }
            EntrySt::Failed(NetError::InvalidUsage(format!(
                "message of {size} bytes (tag {}) is larger than the posted buffer of {} bytes",
                buf.tag, buf.cap
            )))
        } else if let Some(data) = inline {
            if !data.is_empty() {
                // SAFETY: irecv's contract: `cap >= size` writable bytes.
                unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), buf.ptr, data.len()) };
            }
            EntrySt::Done(size)
        } else if size == 0 {
            st.ctrl.push_frame(
                &Frame::Cts {
                    seq,
                    mode: DataMode::Ctrl,
                },
                &[],
            );
            EntrySt::Done(0)
        } else if let Some(lanes) = self
            .lanes
            .as_ref()
            .filter(|_| size >= self.opts.min_task_size)
        {
            let task = self
                .opts
                .min_task_size
                .max(size.div_ceil(lanes.len()))
                .max(size.div_ceil(1 << 16));
            st.ctrl.push_frame(
                &Frame::Cts {
                    seq,
                    mode: DataMode::Lanes(task as u64),
                },
                &[],
            );
            // SAFETY: irecv's contract keeps the buffer writable.
            EntrySt::Matched(size, Some(unsafe { lanes.submit(buf.ptr, size, task) }))
        } else {
            st.ctrl.push_frame(
                &Frame::Cts {
                    seq,
                    mode: DataMode::Ctrl,
                },
                &[],
            );
            st.ctrl_data.push_back(CtrlData {
                seq,
                ptr: buf.ptr as usize,
                len: size,
                req: req_id,
                idx,
            });
            EntrySt::Matched(size, None)
        };
        st.reqs[ri].entries[idx].st = new;
    }

    fn on_msg(
        &self,
        st: &mut State,
        tag: i32,
        seq: u64,
        size: u64,
        inline: Option<&[u8]>,
    ) -> Result<()> {
        if seq != st.expect_seq {
            return Err(NetError::proto(format!(
                "message {seq} where {} was due",
                st.expect_seq
            )));
        }
        st.expect_seq += 1;
        let hit = st.reqs.iter().enumerate().find_map(|(ri, r)| {
            r.entries
                .iter()
                .position(|e| matches!(e.st, EntrySt::Open) && e.buf.tag == tag)
                .map(|i| (ri, i))
        });
        if let Some((ri, idx)) = hit {
            self.match_entry(st, ri, idx, seq, size, inline);
            return Ok(());
        }
        let bytes = inline.map_or(0, <[u8]>::len);
        if st.unexpected.len() >= MAX_UNEXPECTED
            || st.unexpected_bytes + bytes > MAX_UNEXPECTED_BYTES
        {
            return Err(NetError::proto("too many unexpected messages"));
        }
        st.unexpected_bytes += bytes;
        let inline = inline.map(|data| {
            let spares = if data.len() > SPARE_INLINE_BYTES {
                &mut st.spare_large
            } else {
                &mut st.spare_inline
            };
            let mut v = spares.pop().unwrap_or_default();
            v.clear();
            v.extend_from_slice(data);
            v
        });
        st.unexpected.push_back(Unexpected {
            seq,
            tag,
            size,
            inline,
        });
        Ok(())
    }

    /// Whether the unexpected queue can take one more message of any size
    /// a sender may send inline; reading stops while it cannot.
    fn room_for_unexpected(st: &State) -> bool {
        st.unexpected.len() < MAX_UNEXPECTED
            && st.unexpected_bytes + MAX_INLINE <= MAX_UNEXPECTED_BYTES
    }

    fn progress(&self, st: &mut State) -> Result<()> {
        if let Some(e) = &st.failed {
            return Err(e.clone());
        }
        let r = if st.closed.is_some() {
            self.poll_lanes()
        } else {
            self.progress_inner(st)
        };
        match r {
            Ok(()) => Ok(()),
            Err(e) if e.is_peer_closed() && st.closed.is_none() => {
                tracing::debug!(target: "hetccl::NET", "receive comm: peer closed the connection");
                st.closed = Some(e);
                self.poll_lanes()
            }
            Err(e) => {
                tracing::warn!(target: "hetccl::NET", "receive comm failed: {e}");
                st.failed = Some(e.clone());
                Err(e)
            }
        }
    }

    fn poll_lanes(&self) -> Result<()> {
        if let Some(l) = &self.lanes {
            l.poll()?;
            if let Some(e) = l.failure() {
                return Err(e);
            }
        }
        Ok(())
    }

    fn progress_inner(&self, st: &mut State) -> Result<()> {
        // What the last pass peeked leaves the kernel's queue now, after the
        // caller has acted on it (see ctrl.rs).
        st.ctrl.start_pass()?;
        for _ in 0..256 {
            if !Self::room_for_unexpected(st) {
                // Back-pressure: leave the rest in the kernel's queue until
                // a posted receive takes a waiting message. A sender that
                // runs ahead (back-to-back broadcasts from the root, eager
                // messages) then blocks in its own socket instead of
                // overrunning this queue.
                break;
            }
            let ev = st.ctrl.next_event(MAX_INLINE);
            // The payload is handled where it was read: nothing in
            // `on_event` reads the control socket.
            let lent = st.ctrl.lend_payload();
            let r = ev.and_then(|ev| self.on_event(st, ev, lent.payload()));
            st.ctrl.restore(lent);
            if !r? {
                break;
            }
        }
        st.ctrl.flush(&mut Vec::new())?;
        if st.ctrl.stalled(self.opts.timeout) {
            return Err(NetError::Timeout(format!(
                "control socket stalled for {:?}",
                self.opts.timeout
            )));
        }
        if let Some(l) = &self.lanes {
            l.poll()?;
        }
        if let Some(e) = self.lanes.as_ref().and_then(Lanes::failure) {
            return Err(e);
        }
        Ok(())
    }

    /// Handles one event; `Ok(false)` when there was none.
    fn on_event(&self, st: &mut State, ev: Option<InEvent>, payload: &[u8]) -> Result<bool> {
        let Some(ev) = ev else {
            return Ok(false);
        };
        {
            match ev {
                InEvent::Frame(Frame::Msg {
                    tag,
                    seq,
                    size,
                    inline,
                }) => self.on_msg(st, tag, seq, size, inline.then_some(payload))?,
                InEvent::Frame(Frame::Data { seq, len }) => {
                    let ok = st
                        .ctrl_data
                        .front()
                        .is_some_and(|d| d.seq == seq && d.len as u64 == len);
                    if !ok {
                        return Err(NetError::proto(format!(
                            "DATA for message {seq} ({len} bytes) out of order"
                        )));
                    }
                    let d = st.ctrl_data.front().expect("checked");
                    let (ptr, len) = (d.ptr as *mut u8, d.len);
                    // SAFETY: irecv's contract keeps the matched buffer writable.
                    unsafe { st.ctrl.set_sink(ptr, len, seq) };
                }
                InEvent::DataDone(seq) => {
                    let d = st.ctrl_data.pop_front().filter(|d| d.seq == seq);
                    let Some(d) = d else {
                        return Err(NetError::Internal("DATA bookkeeping".into()));
                    };
                    if let Some(r) = st.reqs.iter_mut().find(|r| r.id == d.req) {
                        r.entries[d.idx].st = EntrySt::Done(d.len);
                    }
                }
                InEvent::Frame(Frame::Close { by }) => return Err(NetError::Revoked(by)),
                InEvent::Frame(other) => {
                    return Err(NetError::proto(format!(
                        "unexpected {other:?} on a receive comm"
                    )))
                }
            }
        }
        Ok(true)
    }

    /// Appends the sockets whose readiness would let this comm's progress
    /// move (the control socket, the data sockets with tasks queued), for a
    /// caller that waits in `poll(2)` instead of napping. `false` when
    /// waiting on them is not enough (helper threads are moving data
    /// sockets).
    pub fn poll_fds(&self, out: &mut Vec<libc::pollfd>) -> bool {
        let st = self.st.lock();
        out.push(st.ctrl.pollfd(true));
        self.lanes
            .as_ref()
            .is_none_or(|l| l.poll_fds(libc::POLLIN, out))
    }

    /// Ends the comm because rank `by` of the engine's communicator revoked
    /// it: a CLOSE frame tells the peer why (best effort, never blocking),
    /// and every later call fails. Idempotent.
    pub fn revoke(&self, by: u32) {
        let mut st = self.st.lock();
        if st.failed.is_some() {
            return;
        }
        let _ = st.ctrl.send_frame(&Frame::Close { by }, &[]);
        let _ = st.ctrl.flush(&mut Vec::new());
        st.failed = Some(NetError::Revoked(by));
    }

    /// Closes gracefully once every request is done: drops what the
    /// control socket peeked, writes what is queued, half-closes every
    /// socket and waits, until `deadline` at the latest, until the sender's
    /// kernel has acknowledged every byte (see `linger`), so that closing
    /// cannot reset the connection under bytes the peer has not read. With
    /// requests in flight, or after a failure, it only marks the comm
    /// closed: closing then abandons them. Later calls fail. Idempotent.
    pub fn finish(&self, deadline: Instant) -> Lingered {
        let mut st = self.st.lock();
        let graceful = st.failed.is_none() && st.reqs.is_empty();
        let mut r = Lingered::default();
        if graceful && st.ctrl.settle(deadline).is_ok() {
            let mut socks = vec![st.ctrl.sock()];
            if let Some(l) = &self.lanes {
                socks.extend(l.quiesce(deadline));
            }
            r = linger(&socks, deadline);
            super::log_linger("recv", &r);
        }
        st.failed
            .get_or_insert_with(|| NetError::InvalidUsage("comm closed".into()));
        r
    }

    /// Closes the comm: gracefully ([`Self::finish`], bounded by the comm's
    /// timeout) when every request is done, else at once, abandoning the
    /// requests in flight. Stops the helper threads.
    pub fn close(self) {
        self.finish(Instant::now() + self.opts.timeout);
        if let Some(l) = &self.lanes {
            l.stop();
        }
        self.st.lock().ctrl.shutdown();
    }
}
