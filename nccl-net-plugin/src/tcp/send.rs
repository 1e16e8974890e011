//! The sending end of a TCP comm.
//!
//! `isend` queues a MSG frame at once (the payload too when it is at most
//! `inline_max` bytes). A larger payload waits for the receiver's CTS, which
//! says whether to stream it on the control socket or in tasks over the data
//! sockets. All control-socket I/O happens in the caller's thread, inside
//! `isend` and `test`.

use std::sync::Arc;
use std::time::Instant;

use parking_lot::Mutex;

use super::ctrl::{Ctrl, InEvent, MAX_INLINE};
use super::lanes::{Lanes, Progress};
use super::linger::{linger, Lingered};
use super::{TcpOptions, MAX_EAGER, MAX_REQUESTS};
use crate::error::{NetError, Result};
use crate::fasthash::IntMap;
use crate::wire::{DataMode, Frame};

/// A posted send: the message's sequence number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SendRequest(pub(crate) u64);

/// What [`TcpSendComm::isend_eager_now`] did with a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EagerSend {
    /// Written whole into the socket at once: complete, nothing to test.
    Sent,
    /// Posted like [`TcpSendComm::isend_eager`]: test the request.
    Posted(SendRequest),
}

enum St {
    /// Copied into the output queue; done once the queue drains.
    Queued,
    Done,
    AwaitCts,
    Streaming,
    Lanes(Arc<Progress>),
    /// The receiver rejected it (larger than the posted buffer).
    Failed(NetError),
}

struct Msg {
    ptr: usize,
    size: usize,
    st: St,
}

struct State {
    ctrl: Ctrl,
    next_seq: u64,
    msgs: IntMap<u64, Msg>,
    failed: Option<NetError>,
    done: Vec<u64>,
    /// Messages in `AwaitCts`: only then is there anything to read.
    awaiting: usize,
    /// When the receiver last answered (CTS or REJECT), or when `awaiting`
    /// last became nonzero: the start of the receiver-silence clock.
    cts_since: Instant,
}

/// The sending end of a comm. Thread-safe; every call takes the comm lock.
pub struct TcpSendComm {
    st: Mutex<State>,
    lanes: Option<Lanes>,
    opts: TcpOptions,
}

impl std::fmt::Debug for TcpSendComm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TcpSendComm")
            .field("lanes", &self.lanes.as_ref().map(Lanes::len))
            .finish()
    }
}

impl TcpSendComm {
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
            next_seq: 0,
            msgs: IntMap::default(),
            failed: None,
            done: Vec::new(),
            awaiting: 0,
            cts_since: Instant::now(),
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

    /// Posts a send of `size` bytes at `ptr` with `tag`. `Ok(None)` means
    /// "retry later" (too many requests outstanding).
    ///
    /// # Safety
    /// `ptr..ptr+size` must stay readable until `test` reports the request
    /// done or the comm is closed.
    pub unsafe fn isend(
        &self,
        ptr: *const u8,
        size: usize,
        tag: i32,
    ) -> Result<Option<SendRequest>> {
        // SAFETY: the caller's contract, passed on.
        unsafe { self.isend_upto(ptr, size, tag, self.opts.inline_max) }
    }

    /// As [`TcpSendComm::isend`], but a payload of up to [`MAX_EAGER`]
    /// bytes travels inline whatever `inline_max` says (receivers accept
    /// that much inline): for small messages that gain more from skipping
    /// the CTS round trip than they lose to the copy.
    ///
    /// # Safety
    /// As for [`TcpSendComm::isend`].
    pub unsafe fn isend_eager(
        &self,
        ptr: *const u8,
        size: usize,
        tag: i32,
    ) -> Result<Option<SendRequest>> {
        let max = self.opts.inline_max.max(MAX_EAGER);
        // SAFETY: the caller's contract, passed on.
        unsafe { self.isend_upto(ptr, size, tag, max) }
    }

    /// As [`TcpSendComm::isend_eager`], but a message that goes into the
    /// socket whole at once (inline, with the control socket idle) is
    /// reported [`EagerSend::Sent`]: it has no request, and the comm is not
    /// driven further in this call. The engine's small collective steps
    /// take this path, one `sendmsg` and no request bookkeeping each.
    ///
    /// # Safety
    /// As for [`TcpSendComm::isend`] (for a message reported `Posted`).
    pub unsafe fn isend_eager_now(
        &self,
        ptr: *const u8,
        size: usize,
        tag: i32,
    ) -> Result<Option<EagerSend>> {
        let max = self.opts.inline_max.max(MAX_EAGER);
        // SAFETY: the caller's contract, passed on.
        unsafe { self.post(ptr, size, tag, max, true) }
    }

    /// `isend` with payloads up to `inline_max` bytes inline.
    ///
    /// # Safety
    /// As for [`TcpSendComm::isend`].
    unsafe fn isend_upto(
        &self,
        ptr: *const u8,
        size: usize,
        tag: i32,
        inline_max: usize,
    ) -> Result<Option<SendRequest>> {
        // SAFETY: the caller's contract, passed on.
        let r = unsafe { self.post(ptr, size, tag, inline_max, false) }?;
        Ok(r.map(|p| match p {
            EagerSend::Posted(q) => q,
            EagerSend::Sent => unreachable!("post keeps every request when asked to"),
        }))
    }

    /// Posts a message with payloads up to `inline_max` bytes inline; with
    /// `done_now`, one written whole at once is reported `Sent` and kept
    /// nowhere (see [`TcpSendComm::isend_eager_now`]).
    ///
    /// # Safety
    /// As for [`TcpSendComm::isend`].
    unsafe fn post(
        &self,
        ptr: *const u8,
        size: usize,
        tag: i32,
        inline_max: usize,
        done_now: bool,
    ) -> Result<Option<EagerSend>> {
        if ptr.is_null() && size > 0 {
            return Err(NetError::InvalidArgument("isend of a NULL buffer".into()));
        }
        let mut st = self.st.lock();
        if let Some(e) = &st.failed {
            return Err(e.clone());
        }
        if st.msgs.len() >= MAX_REQUESTS {
            self.progress(&mut st)?;
            if st.msgs.len() >= MAX_REQUESTS {
                return Ok(None);
            }
        }
        let seq = st.next_seq;
        st.next_seq += 1;
        let inline = size <= inline_max.min(MAX_INLINE);
        let frame = Frame::Msg {
            tag,
            seq,
            size: size as u64,
            inline,
        };
        let state = if inline {
            let payload = if size == 0 {
                &[][..]
            } else {
                // SAFETY: the caller guarantees `size` readable bytes.
                unsafe { std::slice::from_raw_parts(ptr, size) }
            };
            // Written at once from the caller's buffer when the socket is idle.
            match st.ctrl.send_frame(&frame, payload) {
                // Complete: the sequence number is spent, nothing to track.
                Ok(true) if done_now => return Ok(Some(EagerSend::Sent)),
                Ok(true) => St::Done,
                Ok(false) => St::Queued,
                Err(e) => {
                    tracing::warn!(target: "hetccl::NET", "send comm failed: {e}");
                    st.failed = Some(e.clone());
                    return Err(e);
                }
            }
        } else {
            st.ctrl.push_frame(&frame, &[]);
            if st.awaiting == 0 {
                st.cts_since = Instant::now();
            }
            st.awaiting += 1;
            St::AwaitCts
        };
        st.msgs.insert(
            seq,
            Msg {
                ptr: ptr as usize,
                size,
                st: state,
            },
        );
        self.progress(&mut st)?;
        Ok(Some(EagerSend::Posted(SendRequest(seq))))
    }

    /// Tests a send: `Ok(Some(size))` once done (the request is then gone),
    /// `Ok(None)` while in flight.
    pub fn test(&self, req: SendRequest) -> Result<Option<usize>> {
        let mut st = self.st.lock();
        let prog = self.progress(&mut st);
        let Some(m) = st.msgs.get_mut(&req.0) else {
            return Err(NetError::InvalidArgument(format!(
                "unknown send request {}",
                req.0
            )));
        };
        if let St::Lanes(p) = &m.st {
            match p.poll() {
                Ok(true) => m.st = St::Done,
                Ok(false) => {}
                Err(e) => {
                    st.msgs.remove(&req.0);
                    return Err(e);
                }
            }
        }
        if let St::Failed(e) = &m.st {
            let e = e.clone();
            st.msgs.remove(&req.0);
            return Err(e);
        }
        if matches!(m.st, St::Done) {
            let size = m.size;
            st.msgs.remove(&req.0);
            return Ok(Some(size));
        }
        prog?;
        Ok(None)
    }

    /// Drives the control socket; marks the comm failed on error.
    fn progress(&self, st: &mut State) -> Result<()> {
        if let Some(e) = &st.failed {
            return Err(e.clone());
        }
        match self.progress_inner(st) {
            Ok(()) => Ok(()),
            Err(e) => {
                tracing::warn!(target: "hetccl::NET", "send comm failed: {e}");
                st.failed = Some(e.clone());
                Err(e)
            }
        }
    }

    fn progress_inner(&self, st: &mut State) -> Result<()> {
        // The receiver only speaks (CTS, REJECT) about messages awaiting a
        // CTS; skipping the read otherwise saves a syscall per test. A dead
        // peer still shows up as a write error or, while messages await
        // CTS, as end of stream.
        st.ctrl.start_pass()?;
        let reads = if st.awaiting > 0 { 256 } else { 0 };
        for _ in 0..reads {
            let Some(ev) = st.ctrl.next_event(MAX_INLINE)? else {
                break;
            };
            st.cts_since = Instant::now();
            match ev {
                InEvent::Frame(Frame::Cts { seq, mode }) => self.on_cts(st, seq, mode)?,
                InEvent::Frame(Frame::Reject { seq }) => {
                    let m = st
                        .msgs
                        .get_mut(&seq)
                        .filter(|m| matches!(m.st, St::AwaitCts));
                    let Some(m) = m else {
                        return Err(NetError::proto(format!("REJECT for message {seq}")));
                    };
                    m.st = St::Failed(NetError::InvalidUsage(format!(
                        "message {seq} of {} bytes is larger than the receiver's posted buffer",
                        m.size
                    )));
                    st.awaiting -= 1;
                }
                InEvent::Frame(Frame::Close { by }) => return Err(NetError::Revoked(by)),
                other => {
                    return Err(NetError::proto(format!(
                        "unexpected {other:?} on a send comm"
                    )))
                }
            }
        }
        let mut done = std::mem::take(&mut st.done);
        st.ctrl.flush(&mut done)?;
        for seq in done.drain(..) {
            if let Some(m) = st.msgs.get_mut(&seq) {
                m.st = St::Done;
            }
        }
        st.done = done;
        if !st.ctrl.has_output() {
            for m in st.msgs.values_mut() {
                if matches!(m.st, St::Queued) {
                    m.st = St::Done;
                }
            }
        }
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
        if st.awaiting > 0 && st.cts_since.elapsed() > self.opts.timeout {
            self.check_receiver_silence(st)?;
        }
        Ok(())
    }

    /// A message awaits its CTS and the receiver has said nothing for the
    /// timeout. That is a stall (a stopped or vanished receiver, or one that
    /// left the operation) unless something else of this comm moved in that
    /// time: its control-socket output or its data sockets.
    fn check_receiver_silence(&self, st: &mut State) -> Result<()> {
        let mut last = st.cts_since.max(st.ctrl.last_out());
        if let Some(l) = &self.lanes {
            last = last.max(l.last_moved());
        }
        if last.elapsed() > self.opts.timeout {
            return Err(NetError::Timeout(format!(
                "{} message(s) await the receiver's CTS and nothing moved for {:?}",
                st.awaiting, self.opts.timeout
            )));
        }
        // Something moved: restart the clock from then.
        st.cts_since = last;
        Ok(())
    }

    fn on_cts(&self, st: &mut State, seq: u64, mode: DataMode) -> Result<()> {
        let Some(m) = st
            .msgs
            .get_mut(&seq)
            .filter(|m| matches!(m.st, St::AwaitCts))
        else {
            return Err(NetError::proto(format!(
                "CTS for message {seq}, which does not await one"
            )));
        };
        let (ptr, size) = (m.ptr, m.size);
        st.awaiting -= 1;
        match mode {
            _ if size == 0 => m.st = St::Done,
            DataMode::Ctrl => {
                m.st = St::Streaming;
                st.ctrl.push_frame(
                    &Frame::Data {
                        seq,
                        len: size as u64,
                    },
                    &[],
                );
                // SAFETY: isend's contract keeps the buffer readable.
                unsafe { st.ctrl.push_borrowed(ptr as *const u8, size, seq) };
            }
            DataMode::Lanes(task) => {
                let Some(lanes) = &self.lanes else {
                    return Err(NetError::proto(
                        "CTS asks for data sockets the comm does not have",
                    ));
                };
                let task = usize::try_from(task).unwrap_or(usize::MAX);
                if size.div_ceil(task) > 1 << 16 {
                    return Err(NetError::proto(format!(
                        "CTS task size {task} for {size} bytes"
                    )));
                }
                // SAFETY: isend's contract keeps the buffer readable.
                m.st = St::Lanes(unsafe { lanes.submit(ptr as *mut u8, size, task) });
            }
        }
        Ok(())
    }

    /// Appends the sockets whose readiness would let this comm's progress
    /// move (the control socket for a CTS or queued output, the data
    /// sockets with tasks queued), for a caller that waits in `poll(2)`
    /// instead of napping. `false` when waiting on them is not enough
    /// (helper threads are moving data sockets).
    pub fn poll_fds(&self, out: &mut Vec<libc::pollfd>) -> bool {
        let st = self.st.lock();
        // Reading also shows a peer that closed the connection.
        out.push(st.ctrl.pollfd(true));
        self.lanes
            .as_ref()
            .is_none_or(|l| l.poll_fds(libc::POLLOUT, out))
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
    /// socket and waits, until `deadline` at the latest, until the receiver's
    /// kernel has acknowledged every byte (see `linger`), so that closing
    /// cannot reset the connection under bytes the peer has not read. With
    /// requests in flight, or after a failure, it only marks the comm
    /// closed: closing then abandons them. Later calls fail. Idempotent.
    pub fn finish(&self, deadline: Instant) -> Lingered {
        let mut st = self.st.lock();
        let graceful = st.failed.is_none() && st.msgs.is_empty();
        let mut r = Lingered::default();
        if graceful && st.ctrl.settle(deadline).is_ok() {
            let mut socks = vec![st.ctrl.sock()];
            if let Some(l) = &self.lanes {
                socks.extend(l.quiesce(deadline));
            }
            r = linger(&socks, deadline);
            super::log_linger("send", &r);
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
