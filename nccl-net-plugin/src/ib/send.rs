//! The sending end of a verbs connection.
//!
//! Messages up to `eager_max` are copied into a registered send slot and
//! SENT with a header into one of the receiver's pre-posted slots. Larger
//! ones SEND only a header (RTS); the receiver RDMA-writes CTS entries into
//! this side's control area, each naming a piece of the message and where
//! it goes, and this side RDMA-writes the piece there with immediate data
//! (the CTS number), from the caller's buffer when it is registered, else
//! through a registered bounce chunk. Every SEND and write-with-immediate
//! consumes a receive slot of the peer's QP, so each needs a credit; the
//! receiver returns credits by writing its per-QP counters into the
//! control area.

use std::collections::{HashMap, VecDeque};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::Instant;

use parking_lot::Mutex;

use super::ffi;
use super::mr::Mr;
use super::proto::{
    self, Hdr, Kind, CTRL_BYTES, CTRL_CREDITS_OFF, CTRL_CTS_OFF, CTS_BYTES, CTS_REJECT, HDR_BYTES,
    NCTS,
};
use super::qp::{Endpoint, IbOptions, RegBuf};
use super::send_check;
use super::wr;
use crate::error::{NetError, Result};
use crate::tcp::SendRequest;

struct Req {
    ptr: usize,
    size: usize,
    tag: i32,
    mr: Option<Arc<Mr>>,
    /// Posted on the wire (eager copy or RTS sent).
    posted: bool,
    /// Bytes for which CTS entries came.
    covered: u64,
    /// Bytes whose writes completed.
    landed: u64,
    done: bool,
    error: Option<NetError>,
}

/// A write (part of a CTS piece) waiting for a credit or queue space.
struct Part {
    cts: u64,
    qp: usize,
    msg: u64,
    /// Source: address and lkey (bounce or the caller's registered buffer).
    src: usize,
    lkey: u32,
    len: u64,
    remote: u64,
    rkey: u32,
}

/// A CTS piece whose writes are in flight.
struct Piece {
    msg: u64,
    len: u64,
    parts_left: usize,
    bounce: Option<usize>,
}

struct St {
    reqs: HashMap<u64, Req>,
    /// Messages to post, in order.
    queue: VecDeque<u64>,
    next_seq: u64,
    next_cts: u64,
    parts: VecDeque<Part>,
    pieces: HashMap<u64, Piece>,
    /// Credits used and returned, per QP.
    used: [u64; proto::MAX_QPS],
    returned: [u64; proto::MAX_QPS],
    sq_out: [usize; proto::MAX_QPS],
    free_slots: Vec<usize>,
    free_bounce: Vec<usize>,
    bounce: Vec<RegBuf>,
    /// Unsignaled work requests posted on QP 0 since its last signaled one.
    unsig: u64,
    /// For each signaled request in flight on each QP, in order: how many
    /// requests its completion retires (itself and the unsignaled ones
    /// before it).
    retire: [VecDeque<u64>; proto::MAX_QPS],
    failed: Option<NetError>,
    watch: wr::PeerWatch,
    last_move: Instant,
    idle_polls: u32,
}

/// Largest inline SEND (header and payload) this side builds.
const INLINE_MAX: usize = 256;

/// At most this many unsignaled sends in a row on QP 0.
const SIGNAL_EVERY: u64 = 16;

/// The sending end of a verbs connection (`isend`/`test`).
pub struct IbSendComm {
    pub(crate) ep: Endpoint,
    ctrl: RegBuf,
    slots: RegBuf,
    opts: IbOptions,
    remote_slots: u64,
    sock: Mutex<Option<TcpStream>>,
    peer: String,
    st: Mutex<St>,
    /// Every message goes by rendezvous ([`IbSendComm::rendezvous_only`]).
    no_eager: bool,
}

impl std::fmt::Debug for IbSendComm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "IbSendComm({} QP {:?} -> {})",
            self.ep.port.label(),
            self.ep.qpns,
            self.peer
        )
    }
}

impl IbSendComm {
    /// The send resources before connecting: the control area the receiver
    /// writes into and the eager slots.
    pub(crate) fn prepare(ep: &Endpoint, opts: &IbOptions) -> Result<(RegBuf, RegBuf)> {
        let ctrl = RegBuf::new(&ep.port, CTRL_BYTES, false)?;
        let slots = RegBuf::new(&ep.port, opts.slots * opts.slot_bytes(), opts.relaxed)?;
        Ok((ctrl, slots))
    }

    /// A connected comm.
    pub(crate) fn new(
        ep: Endpoint,
        (ctrl, slots): (RegBuf, RegBuf),
        opts: IbOptions,
        remote_slots: u32,
        sock: TcpStream,
        peer: String,
    ) -> Self {
        let n = opts.slots;
        Self {
            ep,
            ctrl,
            slots,
            remote_slots: u64::from(remote_slots),
            sock: Mutex::new(Some(sock)),
            peer,
            st: Mutex::new(St {
                reqs: HashMap::new(),
                queue: VecDeque::new(),
                next_seq: 0,
                next_cts: 0,
                parts: VecDeque::new(),
                pieces: HashMap::new(),
                used: [0; proto::MAX_QPS],
                returned: [0; proto::MAX_QPS],
                sq_out: [0; proto::MAX_QPS],
                free_slots: (0..n).rev().collect(),
                free_bounce: Vec::new(),
                bounce: Vec::new(),
                unsig: 0,
                retire: Default::default(),
                failed: None,
                watch: wr::PeerWatch::default(),
                last_move: Instant::now(),
                idle_polls: 0,
            }),
            no_eager: false,
            opts,
        }
    }

    /// The control area's address and rkey (for the connection info).
    pub(crate) fn ctrl_of(ctrl: &RegBuf) -> (u64, u32) {
        (ctrl.buf.addr() as u64, ctrl.mr.rkey)
    }

    /// Posts a send of `size` bytes at `ptr` with `tag`; `mr` is the
    /// caller's registration of the buffer, if any. `Ok(None)`: retry.
    ///
    /// # Safety
    /// `ptr..ptr+size` stays readable until the request completes or the
    /// comm closes.
    pub unsafe fn isend(
        &self,
        ptr: *const u8,
        size: usize,
        tag: i32,
        mr: Option<Arc<Mr>>,
    ) -> Result<Option<SendRequest>> {
        if ptr.is_null() && size > 0 {
            return Err(NetError::InvalidArgument(format!(
                "isend of {size} bytes from NULL"
            )));
        }
        let mut st = self.st.lock();
        if let Some(e) = &st.failed {
            return Err(e.clone());
        }
        if st.reqs.len() >= crate::tcp::MAX_REQUESTS {
            drop(st);
            self.progress()?;
            return Ok(None);
        }
        let seq = st.next_seq;
        st.next_seq += 1;
        let mr = mr.filter(|m| m.covers(ptr as usize, size));
        st.reqs.insert(
            seq,
            Req {
                ptr: ptr as usize,
                size,
                tag,
                mr,
                posted: false,
                covered: 0,
                landed: 0,
                done: false,
                error: None,
            },
        );
        st.queue.push_back(seq);
        self.drive(&mut st)?;
        Ok(Some(SendRequest(seq)))
    }

    /// `Ok(Some(size))` once the send is done.
    pub fn test(&self, req: SendRequest) -> Result<Option<usize>> {
        let mut st = self.st.lock();
        let r = self.drive(&mut st);
        let Some(q) = st.reqs.get(&req.0) else {
            return Err(NetError::InvalidArgument(format!(
                "unknown send request {}",
                req.0
            )));
        };
        if let Some(e) = &q.error {
            let e = e.clone();
            st.reqs.remove(&req.0);
            return Err(e);
        }
        if q.done {
            let n = q.size;
            st.reqs.remove(&req.0);
            return Ok(Some(n));
        }
        if let Some(e) = st.failed.clone() {
            st.reqs.remove(&req.0);
            return Err(e);
        }
        r.map(|_| None)
    }

    fn progress(&self) -> Result<()> {
        let mut st = self.st.lock();
        self.drive(&mut st)
    }

    /// One pass: completions, credits, CTS entries, then posts.
    fn drive(&self, st: &mut St) -> Result<()> {
        if let Some(e) = &st.failed {
            return Err(e.clone());
        }
        let r = self.drive_inner(st);
        if let Err(e) = &r {
            self.fail(st, e.clone());
        }
        r
    }

    fn fail(&self, st: &mut St, e: NetError) {
        tracing::warn!(target: "hetccl::NET", "NET/IB: send comm {} to {} failed: {e}", self.ep.port.label(), self.peer);
        st.failed = Some(e.clone());
        for q in st.reqs.values_mut() {
            if !q.done && q.error.is_none() {
                q.error = Some(e.clone());
            }
        }
    }

    fn drive_inner(&self, st: &mut St) -> Result<()> {
        let mut moved = self.poll_cq(st)?;
        moved |= self.read_credits(st)?;
        moved |= self.read_cts(st)?;
        moved |= self.post_queue(st)?;
        moved |= self.post_parts(st)?;
        let pending = st.reqs.values().any(|q| !q.done && q.error.is_none());
        if moved || !pending {
            st.last_move = Instant::now();
            return Ok(());
        }
        st.idle_polls = st.idle_polls.wrapping_add(1);
        if st.idle_polls % wr::IDLE_CHECK_EVERY != 0 {
            return Ok(());
        }
        if let Some(e) = self.ep.async_failure() {
            return Err(e);
        }
        st.watch.check(&self.sock, &self.peer)?;
        if st.last_move.elapsed() > self.opts.timeout {
            return Err(NetError::Timeout(format!(
                "NET/IB: send to {} on {} made no progress for {:?}",
                self.peer,
                self.ep.port.label(),
                self.opts.timeout
            )));
        }
        Ok(())
    }

    fn poll_cq(&self, st: &mut St) -> Result<bool> {
        let mut wcs = [ffi::ibv_wc::default(); 32];
        let mut moved = false;
        loop {
            let n = self.ep.poll(&mut wcs);
            for wc in &wcs[..n] {
                moved = true;
                let (kind, q, idx) = wr::split(wc.wr_id);
                if wc.status != ffi::IBV_WC_SUCCESS {
                    return Err(self.ep.wc_error(wc, &self.peer));
                }
                let n = st.retire[q].pop_front().unwrap_or(1);
                st.sq_out[q] = st.sq_out[q].saturating_sub(n as usize);
                match kind {
                    wr::EAGER => st.free_slots.push(idx as usize),
                    wr::RTS | wr::INLINE => {}
                    wr::PART => self.part_done(st, idx)?,
                    _ => return Err(NetError::Internal(format!("send completion kind {kind}"))),
                }
            }
            if n < wcs.len() {
                return Ok(moved);
            }
        }
    }

    fn part_done(&self, st: &mut St, cts: u64) -> Result<()> {
        let p = st
            .pieces
            .get_mut(&cts)
            .ok_or_else(|| NetError::Internal(format!("completion of unknown piece {cts}")))?;
        p.parts_left -= 1;
        if p.parts_left > 0 {
            return Ok(());
        }
        let p = st.pieces.remove(&cts).expect("present");
        if let Some(b) = p.bounce {
            st.free_bounce.push(b);
        }
        if let Some(q) = st.reqs.get_mut(&p.msg) {
            q.landed += p.len;
            if q.landed == q.size as u64 && q.covered == q.size as u64 {
                q.done = true;
            }
        }
        Ok(())
    }

    fn read_credits(&self, st: &mut St) -> Result<bool> {
        let mut moved = false;
        for q in 0..self.ep.qps.len() {
            let p = (self.ctrl.buf.addr() + CTRL_CREDITS_OFF + 8 * q) as *const u64;
            // SAFETY: inside the control area, 8-aligned; the peer's NIC
            // writes it, so it is read volatile (twice, for a stable value).
            let (a, b) = unsafe { (p.read_volatile(), p.read_volatile()) };
            let Some(a) = send_check::credits(q, a, b, st.returned[q], st.used[q])? else {
                continue;
            };
            st.returned[q] = a;
            moved = true;
        }
        Ok(moved)
    }

    fn credit(&self, st: &St, q: usize) -> bool {
        st.used[q] - st.returned[q] < self.remote_slots && st.sq_out[q] < self.ep.sq_depth
    }

    fn read_cts(&self, st: &mut St) -> Result<bool> {
        let mut moved = false;
        loop {
            let slot = (st.next_cts % NCTS as u64) as usize;
            let p =
                (self.ctrl.buf.addr() + CTRL_CTS_OFF + slot * CTS_BYTES) as *const [u8; CTS_BYTES];
            // SAFETY: inside the control area; written by the peer's NIC.
            let raw = unsafe { p.read_volatile() };
            let Some(c) = send_check::cts(&raw, st.next_cts, self.opts.chunk, |m| {
                st.reqs.get(&m).map(|q| send_check::MsgState {
                    size: q.size as u64,
                    rendezvous: !self.is_eager(q.size, q.mr.as_ref()),
                    posted: q.posted,
                    finished: q.done || q.error.is_some(),
                    covered: q.covered,
                    registered: q.mr.is_some(),
                })
            })?
            else {
                return Ok(moved);
            };
            let q = &st.reqs[&c.msg];
            let size = q.size as u64;
            let reject = c.flags & CTS_REJECT != 0;
            // A piece from memory the caller did not register needs a bounce chunk.
            let mut bounce = None;
            let (src, lkey) = if reject {
                (0, 0)
            } else if let Some(m) = &q.mr {
                (q.ptr + c.offset as usize, m.lkey)
            } else {
                let Some(b) = self.take_bounce(st)? else {
                    return Ok(moved);
                };
                let q = &st.reqs[&c.msg];
                // SAFETY: the caller keeps its buffer readable (isend's
                // contract); the bounce chunk holds `chunk` bytes.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        (q.ptr + c.offset as usize) as *const u8,
                        st.bounce[b].buf.ptr(),
                        c.len as usize,
                    )
                };
                bounce = Some(b);
                (st.bounce[b].buf.addr(), st.bounce[b].mr.lkey)
            };
            let q = st.reqs.get_mut(&c.msg).expect("present");
            let len = if reject {
                q.error = Some(NetError::InvalidUsage(format!(
                    "the message of {size} bytes is larger than the receive buffer (the receiver rejected it)"
                )));
                0
            } else {
                q.covered += c.len;
                c.len
            };
            let parts = proto::parts(c.seq, len, self.ep.qps.len(), self.opts.split);
            st.pieces.insert(
                c.seq,
                Piece {
                    msg: c.msg,
                    len,
                    parts_left: parts.len(),
                    bounce,
                },
            );
            for (qp, off, l) in parts {
                st.parts.push_back(Part {
                    cts: c.seq,
                    qp,
                    msg: c.msg,
                    src: src + off as usize,
                    lkey,
                    len: l,
                    remote: c.addr + off,
                    rkey: c.rkey,
                });
            }
            st.next_cts += 1;
            moved = true;
        }
    }

    fn take_bounce(&self, st: &mut St) -> Result<Option<usize>> {
        if let Some(b) = st.free_bounce.pop() {
            return Ok(Some(b));
        }
        if st.bounce.len() < self.opts.nchunks {
            st.bounce.push(RegBuf::new(
                &self.ep.port,
                self.opts.chunk,
                self.opts.relaxed,
            )?);
            return Ok(Some(st.bounce.len() - 1));
        }
        Ok(None)
    }

    fn post_queue(&self, st: &mut St) -> Result<bool> {
        let mut moved = false;
        while let Some(&seq) = st.queue.front() {
            if !self.credit(st, 0) {
                break;
            }
            let q = &st.reqs[&seq];
            // GPU memory is never read by the CPU: whatever its size it
            // goes by rendezvous, RDMA-written from its registration.
            let eager = self.is_eager(q.size, q.mr.as_ref());
            let hdr = Hdr {
                kind: if eager { Kind::Eager } else { Kind::Rts },
                tag: q.tag,
                size: q.size as u64,
                seq,
                whole: q.mr.is_some(),
            }
            .encode();
            let inline = eager && HDR_BYTES + q.size <= self.ep.max_inline.min(INLINE_MAX);
            if inline {
                let mut b = [0u8; INLINE_MAX];
                b[..HDR_BYTES].copy_from_slice(&hdr);
                if q.size > 0 {
                    // SAFETY: the caller's buffer is readable (isend's
                    // contract); it fits (checked above).
                    unsafe {
                        std::ptr::copy_nonoverlapping(
                            q.ptr as *const u8,
                            b[HDR_BYTES..].as_mut_ptr(),
                            q.size,
                        )
                    };
                }
                let sge = ffi::ibv_sge {
                    addr: b.as_ptr() as u64,
                    length: (HDR_BYTES + q.size) as u32,
                    lkey: 0,
                };
                // SAFETY: inline: copied at post time.
                unsafe {
                    self.post_unsignaled(st, wr::id(wr::INLINE, 0, seq), ffi::IBV_WR_SEND, sge)?
                };
            } else if eager {
                let Some(slot) = st.free_slots.pop() else {
                    break;
                };
                let base = self.slots.buf.addr() + slot * self.opts.slot_bytes();
                // SAFETY: the slot holds a header and eager_max bytes; the
                // caller's buffer is readable (isend's contract).
                unsafe {
                    std::ptr::copy_nonoverlapping(hdr.as_ptr(), base as *mut u8, HDR_BYTES);
                    if q.size > 0 {
                        std::ptr::copy_nonoverlapping(
                            q.ptr as *const u8,
                            (base + HDR_BYTES) as *mut u8,
                            q.size,
                        );
                    }
                }
                let sge = ffi::ibv_sge {
                    addr: base as u64,
                    length: (HDR_BYTES + q.size) as u32,
                    lkey: self.slots.mr.lkey,
                };
                // SAFETY: the slot stays ours until its completion.
                unsafe {
                    self.ep.post_send(
                        0,
                        wr::id(wr::EAGER, 0, slot as u64),
                        ffi::IBV_WR_SEND,
                        Some(sge),
                        false,
                        (0, 0),
                        0,
                    )?
                };
                Self::signaled(st, 0);
            } else {
                let sge = ffi::ibv_sge {
                    addr: hdr.as_ptr() as u64,
                    length: HDR_BYTES as u32,
                    lkey: 0,
                };
                // SAFETY: inline: the header is copied at post time.
                unsafe {
                    self.post_unsignaled(st, wr::id(wr::RTS, 0, seq), ffi::IBV_WR_SEND, sge)?
                };
            }
            st.used[0] += 1;
            let q = st.reqs.get_mut(&seq).expect("present");
            q.posted = true;
            if eager {
                q.done = true;
            }
            st.queue.pop_front();
            moved = true;
        }
        Ok(moved)
    }

    /// Counts a signaled request just posted on QP `q`.
    fn signaled(st: &mut St, q: usize) {
        st.sq_out[q] += 1;
        let n = if q == 0 {
            std::mem::take(&mut st.unsig)
        } else {
            0
        };
        st.retire[q].push_back(n + 1);
    }

    /// Posts an inline SEND on QP 0 that holds no resource, signaled only
    /// every [`SIGNAL_EVERY`] requests.
    ///
    /// # Safety
    /// `sge` is inline data, valid until this returns.
    unsafe fn post_unsignaled(
        &self,
        st: &mut St,
        wr_id: u64,
        opcode: u32,
        sge: ffi::ibv_sge,
    ) -> Result<()> {
        let signal = st.unsig + 1 >= SIGNAL_EVERY;
        // SAFETY: inline: copied at post time.
        unsafe {
            self.ep
                .post_send_opt(0, wr_id, opcode, Some(sge), true, (0, 0), 0, signal)?
        };
        if signal {
            Self::signaled(st, 0);
        } else {
            st.sq_out[0] += 1;
            st.unsig += 1;
        }
        Ok(())
    }

    /// When only unsignaled requests are in flight on QP 0, posts an empty
    /// signaled SEND (the receiver takes it as a no-op) so that their
    /// completion is seen; false when it needs a credit it does not have.
    fn flush_unsignaled(&self, st: &mut St) -> Result<bool> {
        if st.unsig == 0 || !st.retire[0].is_empty() {
            return Ok(true);
        }
        if !self.credit(st, 0) {
            return Ok(false);
        }
        // SAFETY: no memory: an empty SEND.
        unsafe {
            self.ep.post_send(
                0,
                wr::id(wr::INLINE, 0, 0),
                ffi::IBV_WR_SEND,
                None,
                false,
                (0, 0),
                0,
            )?
        };
        st.used[0] += 1;
        Self::signaled(st, 0);
        Ok(true)
    }

    fn post_parts(&self, st: &mut St) -> Result<bool> {
        let mut moved = false;
        while let Some(p) = st.parts.front() {
            if !self.credit(st, p.qp) {
                break;
            }
            let sge = (p.len > 0).then_some(ffi::ibv_sge {
                addr: p.src as u64,
                length: p.len as u32,
                lkey: p.lkey,
            });
            // SAFETY: the source is a bounce chunk held until the piece
            // completes, or the caller's registered buffer (isend's contract).
            unsafe {
                self.ep.post_send(
                    p.qp,
                    wr::id(wr::PART, p.qp, p.cts),
                    ffi::IBV_WR_RDMA_WRITE_WITH_IMM,
                    sge,
                    false,
                    (p.remote, p.rkey),
                    p.cts as u32,
                )?
            };
            let _ = p.msg;
            st.used[p.qp] += 1;
            Self::signaled(st, p.qp);
            st.parts.pop_front();
            moved = true;
        }
        Ok(moved)
    }

    /// Ends the comm because rank `by` of the engine's communicator revoked
    /// it: the revoke frame on the setup socket tells the peer why (best
    /// effort, never blocking), and every later call fails. Idempotent.
    pub fn revoke(&self, by: u32) {
        super::setup_frame::revoke_once(&mut self.st.lock().failed, &self.sock, by);
    }

    /// Waits (up to `deadline`) until every posted work request has
    /// completed, so that nothing sent is lost when the QPs are destroyed.
    ///
    /// It stops waiting when the peer closes its end of the setup socket:
    /// the peer closes it once its receives are done (or it died), so what
    /// is left are acknowledgements of bytes it already has. Waiting for
    /// them would last until this QP's retries ran out, since the peer's
    /// QP may be gone.
    ///
    /// Idempotent: the first call decides, and later ones return at once.
    /// The engine calls it once per channel of a connection, and after a
    /// first call that stopped on the peer's close, the work still in
    /// flight would otherwise be waited for until `deadline`, with no
    /// socket left to see that the peer is gone.
    pub fn finish(&self, deadline: Instant) {
        if self.sock.lock().is_none() {
            return;
        }
        let mut polls = 0u32;
        loop {
            let mut st = self.st.lock();
            let _ = self.drive(&mut st);
            if st.failed.is_none() {
                if let Err(e) = self.flush_unsignaled(&mut st) {
                    self.fail(&mut st, e);
                }
            }
            let busy =
                st.sq_out.iter().any(|&n| n > 0) || !st.queue.is_empty() || !st.parts.is_empty();
            if st.failed.is_some() || !busy || Instant::now() >= deadline {
                break;
            }
            drop(st);
            polls = polls.wrapping_add(1);
            if polls % wr::IDLE_CHECK_EVERY == 0 {
                if let Err(e) = wr::check_peer(&self.sock, &self.peer) {
                    tracing::debug!(target: "hetccl::NET",
                        "NET/IB: send comm to {} closes with work in flight: {e}", self.peer);
                    break;
                }
            }
            std::thread::yield_now();
        }
        let bye = self.st.lock().failed.is_none();
        if let Some(mut s) = self.sock.lock().take() {
            super::setup_frame::close_setup(&mut s, bye, std::net::Shutdown::Write);
        }
    }

    /// Says BYE and half-closes the setup socket, as a peer that finished
    /// does, and leaves the QPs up: tests of a close seen before the last
    /// completions.
    #[cfg(test)]
    pub(crate) fn shut_setup_socket(&self) {
        if let Some(s) = self.sock.lock().as_mut() {
            super::setup_frame::close_setup(s, true, std::net::Shutdown::Write);
        }
    }

    /// Closes the setup socket without a BYE, as the kernel does for a
    /// peer that died, and leaves the QPs up.
    #[cfg(test)]
    pub(crate) fn drop_setup_socket(&self) {
        if let Some(mut s) = self.sock.lock().take() {
            super::setup_frame::close_setup(&mut s, false, std::net::Shutdown::Both);
        }
    }

    /// Closes gracefully (bounded by the timeout), then frees everything.
    pub fn close(self) {
        self.finish(Instant::now() + self.opts.timeout.min(std::time::Duration::from_secs(10)));
    }

    /// Sends every message by rendezvous, whatever its size: for a peer
    /// that receives into GPU memory (GPUDirect RDMA), which an eager
    /// message could only reach through the CPU. Called before any send.
    pub fn rendezvous_only(&mut self) {
        self.no_eager = true;
    }

    /// Whether a message of `size` bytes from `mr` goes eager: small, and
    /// neither GPU memory (never read by the CPU) nor to a peer that takes
    /// every message by rendezvous.
    fn is_eager(&self, size: usize, mr: Option<&Arc<Mr>>) -> bool {
        size <= self.opts.eager_max && !self.no_eager && !mr.is_some_and(|m| m.is_device())
    }

    /// The port the comm's QPs are on.
    pub fn port(&self) -> &super::IbPort {
        &self.ep.port
    }

    /// The port and QPs (for logs).
    pub fn describe(&self) -> String {
        format!("{} QP {:?}", self.ep.port.label(), self.ep.qpns)
    }
}
