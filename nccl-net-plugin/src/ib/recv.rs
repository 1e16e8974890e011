//! The receiving end of a verbs connection: pre-posted receive slots on
//! every QP, tag matching (per-tag FIFO, as the TCP transport), CTS entries
//! RDMA-written into the sender's control area, pieces landing straight in
//! registered buffers or in bounce chunks, and credits returned by writing
//! per-QP counters. Everything the peer sends is checked before use.

use std::collections::{HashMap, VecDeque};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::Instant;

use parking_lot::Mutex;

use super::ffi;
use super::mr::Mr;
use super::proto::{
    self, ConnInfo, Cts, Hdr, Kind, CTRL_CREDITS_OFF, CTRL_CTS_OFF, CTS_BYTES, CTS_REJECT,
    HDR_BYTES, NCTS,
};
use super::qp::{Endpoint, IbOptions, RegBuf};
use super::wr;
use crate::error::{NetError, Result};
use crate::tcp::{RecvBuf, RecvRequest, RecvSizes, MAX_RECVS};

/// Most announced messages waiting for a receive, and their eager bytes.
const MAX_UNEXPECTED: usize = 512;
const MAX_UNEXPECTED_BYTES: usize = 16 << 20;

enum BufSt {
    Open,
    Matched,
    Done(usize),
    Failed(NetError),
}

struct Req {
    bufs: Vec<(RecvBuf, Option<Arc<Mr>>)>,
    st: Vec<BufSt>,
}

struct Msg {
    tag: i32,
    size: u64,
    kind: Kind,
    /// Eager payload, kept while unmatched.
    data: Option<Vec<u8>>,
    /// (request, buffer).
    to: Option<(u64, usize)>,
    /// Bytes asked for by CTS entries.
    asked: u64,
    landed: u64,
    reject: bool,
    /// The sender's buffer is registered (a piece may be the whole message).
    whole: bool,
}

struct Out {
    msg: u64,
    offset: u64,
    len: u64,
    /// Parts still to land, by QP.
    parts: Vec<(usize, u64)>,
    bounce: Option<usize>,
}

struct St {
    expect: u64,
    msgs: HashMap<u64, Msg>,
    unexpected: VecDeque<u64>,
    unexpected_bytes: usize,
    reqs: HashMap<u64, Req>,
    order: VecDeque<u64>,
    next_req: u64,
    /// Matched rendezvous messages that need (more) CTS entries.
    want_cts: VecDeque<u64>,
    next_cts: u64,
    outs: HashMap<u32, Out>,
    returned: [u64; proto::MAX_QPS],
    reported: [u64; proto::MAX_QPS],
    sq_out: usize,
    bounce: Vec<RegBuf>,
    free_bounce: Vec<usize>,
    failed: Option<NetError>,
    peer_gone: Option<NetError>,
    watch: wr::PeerWatch,
    last_move: Instant,
    idle_polls: u32,
}

/// The receiving end of a verbs connection (`irecv`/`test`).
pub struct IbRecvComm {
    pub(crate) ep: Endpoint,
    slots: RegBuf,
    /// The credit counters written to the sender (inline, from here).
    opts: IbOptions,
    pub(crate) remote: ConnInfo,
    sock: Mutex<Option<TcpStream>>,
    peer: String,
    st: Mutex<St>,
}

impl std::fmt::Debug for IbRecvComm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "IbRecvComm({} QP {:?} <- {})",
            self.ep.port.label(),
            self.ep.qpns,
            self.peer
        )
    }
}

impl IbRecvComm {
    /// Registers the slots and posts them on every QP (before the QPs are
    /// connected, so nothing the sender sends finds no slot).
    pub(crate) fn prepare(ep: &Endpoint, opts: &IbOptions) -> Result<RegBuf> {
        let sb = opts.slot_bytes();
        let slots = RegBuf::new(&ep.port, ep.qps.len() * opts.slots * sb, opts.relaxed)?;
        for q in 0..ep.qps.len() {
            for s in 0..opts.slots {
                let i = q * opts.slots + s;
                ep.post_recv(
                    q,
                    wr::id(wr::SLOT, q, i as u64),
                    slots.buf.addr() + i * sb,
                    sb as u32,
                    slots.mr.lkey,
                )?;
            }
        }
        Ok(slots)
    }

    /// A connected comm facing the sender's `remote` info.
    pub(crate) fn new(
        ep: Endpoint,
        slots: RegBuf,
        opts: IbOptions,
        remote: ConnInfo,
        sock: TcpStream,
        peer: String,
    ) -> Self {
        Self {
            ep,
            slots,
            remote,
            sock: Mutex::new(Some(sock)),
            peer,
            st: Mutex::new(St {
                expect: 0,
                msgs: HashMap::new(),
                unexpected: VecDeque::new(),
                unexpected_bytes: 0,
                reqs: HashMap::new(),
                order: VecDeque::new(),
                next_req: 0,
                want_cts: VecDeque::new(),
                next_cts: 0,
                outs: HashMap::new(),
                returned: [0; proto::MAX_QPS],
                reported: [0; proto::MAX_QPS],
                sq_out: 0,
                bounce: Vec::new(),
                free_bounce: Vec::new(),
                failed: None,
                peer_gone: None,
                watch: wr::PeerWatch::default(),
                last_move: Instant::now(),
                idle_polls: 0,
            }),
            opts,
        }
    }

    /// Posts a grouped receive; `mrs[i]` is the caller's registration of
    /// buffer `i`, if any. `Ok(None)`: retry.
    ///
    /// # Safety
    /// Each buffer stays writable until the request completes or the comm
    /// closes.
    pub unsafe fn irecv(
        &self,
        bufs: &[RecvBuf],
        mrs: &[Option<Arc<Mr>>],
    ) -> Result<Option<RecvRequest>> {
        if bufs.is_empty() || bufs.len() > MAX_RECVS {
            return Err(NetError::InvalidArgument(format!(
                "irecv of {} buffers",
                bufs.len()
            )));
        }
        if let Some(b) = bufs.iter().find(|b| b.ptr.is_null() && b.cap > 0) {
            return Err(NetError::InvalidArgument(format!(
                "irecv of {} bytes into NULL",
                b.cap
            )));
        }
        let mut st = self.st.lock();
        if let Some(e) = &st.failed {
            return Err(e.clone());
        }
        if st.reqs.len() >= crate::tcp::MAX_REQUESTS / MAX_RECVS {
            let _ = self.drive(&mut st);
            return Ok(None);
        }
        let id = st.next_req;
        st.next_req += 1;
        let bufs: Vec<(RecvBuf, Option<Arc<Mr>>)> = bufs
            .iter()
            .enumerate()
            .map(|(i, b)| {
                (
                    *b,
                    mrs.get(i)
                        .cloned()
                        .flatten()
                        .filter(|m| m.covers(b.ptr as usize, b.cap)),
                )
            })
            .collect();
        let n = bufs.len();
        st.reqs.insert(
            id,
            Req {
                bufs,
                st: (0..n).map(|_| BufSt::Open).collect(),
            },
        );
        st.order.push_back(id);
        // Buffers take the oldest waiting message of their tag.
        for i in 0..n {
            let tag = st.reqs[&id].bufs[i].0.tag;
            if let Some(pos) = st.unexpected.iter().position(|s| st.msgs[s].tag == tag) {
                let seq = st.unexpected.remove(pos).expect("present");
                self.matched(&mut st, seq, id, i);
            }
        }
        let _ = self.drive(&mut st);
        Ok(Some(RecvRequest(id)))
    }

    /// `Ok(Some(sizes))` once every buffer of the receive is filled.
    pub fn test(&self, req: RecvRequest) -> Result<Option<RecvSizes>> {
        let mut st = self.st.lock();
        let r = self.drive(&mut st);
        let Some(q) = st.reqs.get(&req.0) else {
            return Err(NetError::InvalidArgument(format!(
                "unknown receive request {}",
                req.0
            )));
        };
        if let Some(e) = q.st.iter().find_map(|s| match s {
            BufSt::Failed(e) => Some(e.clone()),
            _ => None,
        }) {
            self.forget(&mut st, req.0);
            return Err(e);
        }
        if q.st.iter().all(|s| matches!(s, BufSt::Done(_))) {
            let sizes: Vec<usize> =
                q.st.iter()
                    .map(|s| if let BufSt::Done(n) = s { *n } else { 0 })
                    .collect();
            self.forget(&mut st, req.0);
            return Ok(Some(RecvSizes::from_slice(&sizes)));
        }
        if let Some(e) = st.failed.clone().or(st.peer_gone.clone()) {
            self.forget(&mut st, req.0);
            return Err(e);
        }
        r.map(|_| None)
    }

    fn forget(&self, st: &mut St, id: u64) {
        st.reqs.remove(&id);
        st.order.retain(|&r| r != id);
    }

    fn drive(&self, st: &mut St) -> Result<()> {
        if let Some(e) = &st.failed {
            return Err(e.clone());
        }
        let r = self.drive_inner(st);
        if let Err(e) = &r {
            tracing::warn!(target: "hetccl::NET", "NET/IB: receive comm {} from {} failed: {e}", self.ep.port.label(), self.peer);
            st.failed = Some(e.clone());
        }
        r
    }

    fn drive_inner(&self, st: &mut St) -> Result<()> {
        let mut moved = self.poll_cq(st)?;
        moved |= self.send_cts(st)?;
        moved |= self.return_credits(st, false)?;
        // Pending: a matched message whose bytes have not all landed.
        let pending = st.msgs.values().any(|m| m.to.is_some());
        let open = st
            .reqs
            .values()
            .any(|q| q.st.iter().any(|s| !matches!(s, BufSt::Done(_))));
        if moved || !pending {
            st.last_move = Instant::now();
        }
        if moved {
            return Ok(());
        }
        st.idle_polls = st.idle_polls.wrapping_add(1);
        if st.idle_polls % wr::IDLE_CHECK_EVERY != 0 {
            return Ok(());
        }
        if let Some(e) = self.ep.async_failure() {
            return Err(e);
        }
        if open && st.peer_gone.is_none() {
            if let Err(e) = st.watch.check(&self.sock, &self.peer) {
                // Drain what arrived before the close, then fail the rest.
                self.poll_cq(st)?;
                st.peer_gone = Some(e.clone());
                return Err(e);
            }
        }
        if pending && st.last_move.elapsed() > self.opts.timeout {
            return Err(NetError::Timeout(format!(
                "NET/IB: receive from {} on {} made no progress for {:?}",
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
                match kind {
                    wr::CTRL => st.sq_out = st.sq_out.saturating_sub(1),
                    wr::SLOT => {
                        self.on_slot(st, wc, q, idx as usize)?;
                        let sb = self.opts.slot_bytes();
                        self.ep.post_recv(
                            q,
                            wc.wr_id,
                            self.slots.buf.addr() + idx as usize * sb,
                            sb as u32,
                            self.slots.mr.lkey,
                        )?;
                        st.returned[q] += 1;
                    }
                    _ => {
                        return Err(NetError::Internal(format!(
                            "receive completion kind {kind}"
                        )))
                    }
                }
            }
            if n < wcs.len() {
                return Ok(moved);
            }
        }
    }

    fn on_slot(&self, st: &mut St, wc: &ffi::ibv_wc, q: usize, idx: usize) -> Result<()> {
        let len = wc.byte_len as usize;
        if wc.opcode == ffi::IBV_WC_RECV_RDMA_WITH_IMM {
            return self.on_imm(st, u32::from_be(wc.imm_data), q, len);
        }
        if wc.opcode != ffi::IBV_WC_RECV || q != 0 {
            return Err(NetError::proto(format!(
                "completion opcode {} on QP {q}",
                wc.opcode
            )));
        }
        if len == 0 {
            // The sender's flush of its unsignaled SENDs: nothing to do
            // beyond reposting the slot.
            return Ok(());
        }
        let sb = self.opts.slot_bytes();
        if len > sb {
            return Err(NetError::proto(format!(
                "SEND of {len} bytes into a {sb}-byte slot"
            )));
        }
        // SAFETY: the slot is ours again (its receive completed) and holds `len` bytes.
        let bytes = unsafe {
            std::slice::from_raw_parts((self.slots.buf.addr() + idx * sb) as *const u8, len)
        };
        let h = Hdr::decode(bytes, len, st.expect)?;
        st.expect += 1;
        if h.kind == Kind::Eager && h.size as usize > self.opts.eager_max {
            return Err(NetError::proto(format!(
                "eager message of {} bytes",
                h.size
            )));
        }
        let payload = &bytes[HDR_BYTES..];
        let seq = h.seq;
        st.msgs.insert(
            seq,
            Msg {
                tag: h.tag,
                size: h.size,
                kind: h.kind,
                data: None,
                to: None,
                asked: 0,
                landed: 0,
                reject: false,
                whole: h.whole,
            },
        );
        // The first open buffer with this tag in the oldest receive that has one.
        let target = st.order.iter().find_map(|&r| {
            st.reqs[&r]
                .bufs
                .iter()
                .enumerate()
                .position(|(i, (b, _))| b.tag == h.tag && matches!(st.reqs[&r].st[i], BufSt::Open))
                .map(|i| (r, i))
        });
        match target {
            Some((r, i)) => {
                let (buf, mr) = &st.reqs[&r].bufs[i];
                let (buf, device) = (*buf, mr.as_ref().is_some_and(|m| m.is_device()));
                if h.kind == Kind::Eager && payload.len() <= buf.cap && !device {
                    // Straight into the posted buffer.
                    if !payload.is_empty() {
                        // SAFETY: the buffer holds `cap` bytes (irecv's
                        // contract); the slot holds the payload.
                        unsafe {
                            std::ptr::copy_nonoverlapping(payload.as_ptr(), buf.ptr, payload.len())
                        };
                    }
                    st.reqs.get_mut(&r).expect("posted").st[i] = BufSt::Done(payload.len());
                    st.msgs.remove(&seq);
                    return Ok(());
                }
                if h.kind == Kind::Eager {
                    st.msgs.get_mut(&seq).expect("inserted").data = Some(payload.to_vec());
                }
                self.matched(st, seq, r, i);
            }
            None => {
                if st.unexpected.len() >= MAX_UNEXPECTED
                    || st.unexpected_bytes + payload.len() > MAX_UNEXPECTED_BYTES
                {
                    return Err(NetError::proto("too many unexpected messages"));
                }
                if h.kind == Kind::Eager {
                    st.unexpected_bytes += payload.len();
                    st.msgs.get_mut(&seq).expect("inserted").data = Some(payload.to_vec());
                }
                st.unexpected.push_back(seq);
            }
        }
        Ok(())
    }

    /// Message `seq` goes to buffer `i` of request `r`.
    fn matched(&self, st: &mut St, seq: u64, r: u64, i: usize) {
        let m = st.msgs.get_mut(&seq).expect("announced");
        let (buf, _) = st.reqs[&r].bufs[i];
        if m.size > buf.cap as u64 {
            let e = NetError::InvalidUsage(format!(
                "the message of {} bytes is larger than the receive buffer of {} bytes (tag {})",
                m.size, buf.cap, m.tag
            ));
            st.reqs.get_mut(&r).expect("posted").st[i] = BufSt::Failed(e);
            if m.kind == Kind::Rts {
                m.reject = true;
                m.to = Some((r, i));
                st.want_cts.push_back(seq);
            } else {
                if let Some(d) = m.data.take() {
                    st.unexpected_bytes = st.unexpected_bytes.saturating_sub(d.len());
                }
                st.msgs.remove(&seq);
            }
            return;
        }
        m.to = Some((r, i));
        let device = st.reqs[&r].bufs[i]
            .1
            .as_ref()
            .is_some_and(|m| m.is_device());
        if m.kind == Kind::Eager && device && m.size > 0 {
            // The CPU never writes GPU memory: only a rendezvous (the
            // sender's RDMA write) may fill it.
            let e = NetError::InvalidUsage(format!(
                "an eager message of {} bytes (tag {}) for a receive into GPU memory: \
                 the sender must send it by rendezvous",
                m.size, m.tag
            ));
            if let Some(d) = m.data.take() {
                st.unexpected_bytes = st.unexpected_bytes.saturating_sub(d.len());
            }
            st.msgs.remove(&seq);
            st.reqs.get_mut(&r).expect("posted").st[i] = BufSt::Failed(e);
            return;
        }
        if m.kind == Kind::Eager {
            let d = m.data.take().unwrap_or_default();
            if !d.is_empty() {
                // SAFETY: the buffer holds `cap` >= size bytes (irecv's contract).
                unsafe { std::ptr::copy_nonoverlapping(d.as_ptr(), buf.ptr, d.len()) };
            }
            st.unexpected_bytes = st.unexpected_bytes.saturating_sub(d.len());
            st.reqs.get_mut(&r).expect("posted").st[i] = BufSt::Done(d.len());
            st.msgs.remove(&seq);
        } else {
            st.reqs.get_mut(&r).expect("posted").st[i] = BufSt::Matched;
            st.want_cts.push_back(seq);
        }
    }

    fn send_cts(&self, st: &mut St) -> Result<bool> {
        let mut moved = false;
        while let Some(&seq) = st.want_cts.front() {
            if st.outs.len() >= NCTS || st.sq_out + 2 > self.ep.sq_depth {
                break;
            }
            let m = &st.msgs[&seq];
            let (r, i) = m.to.expect("matched");
            let (cts, bounce) = if m.reject {
                (
                    Cts {
                        seq: st.next_cts,
                        msg: seq,
                        flags: CTS_REJECT,
                        ..Default::default()
                    },
                    None,
                )
            } else {
                let (buf, mr) = &st.reqs[&r].bufs[i];
                let left = m.size - m.asked;
                match mr {
                    Some(mr) => {
                        // One piece, unless the sender goes through bounce chunks.
                        let max = if m.whole {
                            1 << 30
                        } else {
                            self.opts.chunk as u64
                        };
                        let len = left.min(max);
                        (
                            Cts {
                                seq: st.next_cts,
                                msg: seq,
                                offset: m.asked,
                                len,
                                addr: buf.ptr as u64 + m.asked,
                                rkey: mr.rkey,
                                flags: 0,
                            },
                            None,
                        )
                    }
                    None => {
                        let Some(b) = self.take_bounce(st)? else {
                            break;
                        };
                        let len = left.min(self.opts.chunk as u64);
                        let m = &st.msgs[&seq];
                        (
                            Cts {
                                seq: st.next_cts,
                                msg: seq,
                                offset: m.asked,
                                len,
                                addr: st.bounce[b].buf.addr() as u64,
                                rkey: st.bounce[b].mr.rkey,
                                flags: 0,
                            },
                            Some(b),
                        )
                    }
                }
            };
            let raw = cts.encode();
            let sge = ffi::ibv_sge {
                addr: raw.as_ptr() as u64,
                length: CTS_BYTES as u32,
                lkey: 0,
            };
            let remote = self.remote.ctrl_addr
                + (CTRL_CTS_OFF + (cts.seq % NCTS as u64) as usize * CTS_BYTES) as u64;
            // SAFETY: inline: the entry is copied at post time.
            unsafe {
                self.ep.post_send(
                    0,
                    wr::id(wr::CTRL, 0, 0),
                    ffi::IBV_WR_RDMA_WRITE,
                    Some(sge),
                    true,
                    (remote, self.remote.ctrl_rkey),
                    0,
                )?
            };
            st.sq_out += 1;
            let parts = proto::parts(cts.seq, cts.len, self.ep.qps.len(), self.opts.split);
            st.outs.insert(
                cts.seq as u32,
                Out {
                    msg: seq,
                    offset: cts.offset,
                    len: cts.len,
                    parts: parts.iter().map(|&(q, _, l)| (q, l)).collect(),
                    bounce,
                },
            );
            st.next_cts += 1;
            let m = st.msgs.get_mut(&seq).expect("present");
            m.asked += cts.len;
            if m.reject || m.asked == m.size {
                st.want_cts.pop_front();
            }
            moved = true;
        }
        Ok(moved)
    }

    fn on_imm(&self, st: &mut St, imm: u32, q: usize, len: usize) -> Result<()> {
        let Some(o) = st.outs.get_mut(&imm) else {
            return Err(NetError::proto(format!(
                "write with immediate {imm} for no CTS"
            )));
        };
        let Some(pos) = o.parts.iter().position(|&(pq, _)| pq == q) else {
            return Err(NetError::proto(format!("write for CTS {imm} on QP {q}")));
        };
        if o.parts[pos].1 != len as u64 {
            return Err(NetError::proto(format!(
                "write of {len} bytes for a part of {}",
                o.parts[pos].1
            )));
        }
        o.parts.swap_remove(pos);
        if !o.parts.is_empty() {
            return Ok(());
        }
        let o = st.outs.remove(&imm).expect("present");
        let Some(m) = st.msgs.get_mut(&o.msg) else {
            return Err(NetError::Internal(format!(
                "piece of unknown message {}",
                o.msg
            )));
        };
        let (r, i) = m.to.expect("matched");
        if m.reject {
            st.msgs.remove(&o.msg);
            return Ok(());
        }
        if let Some(b) = o.bounce {
            let dst = st.reqs[&r].bufs[i].0.ptr;
            // SAFETY: the piece lies inside the buffer (offset + len <= size <= cap);
            // the bounce chunk holds it.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    st.bounce[b].buf.ptr(),
                    dst.add(o.offset as usize),
                    o.len as usize,
                )
            };
            st.free_bounce.push(b);
        }
        let m = st.msgs.get_mut(&o.msg).expect("present");
        m.landed += o.len;
        if m.landed == m.size {
            let size = m.size as usize;
            st.msgs.remove(&o.msg);
            if let Some(q) = st.reqs.get_mut(&r) {
                q.st[i] = BufSt::Done(size);
            }
        }
        Ok(())
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

    /// Writes the credit counters to the sender when half its credits on a
    /// QP came back (or, with `force`, any).
    fn return_credits(&self, st: &mut St, force: bool) -> Result<bool> {
        let n = self.ep.qps.len();
        let due =
            (0..n).any(|q| st.returned[q] - st.reported[q] >= (self.opts.slots as u64 / 2).max(1));
        if !(due || force && st.returned[..n] != st.reported[..n])
            || st.sq_out + 1 > self.ep.sq_depth
        {
            return Ok(false);
        }
        let mut raw = [0u8; 64];
        for q in 0..n {
            raw[8 * q..8 * q + 8].copy_from_slice(&st.returned[q].to_le_bytes());
        }
        let sge = ffi::ibv_sge {
            addr: raw.as_ptr() as u64,
            length: (8 * n) as u32,
            lkey: 0,
        };
        let remote = self.remote.ctrl_addr + CTRL_CREDITS_OFF as u64;
        // SAFETY: inline: the counters are copied at post time.
        unsafe {
            self.ep.post_send(
                0,
                wr::id(wr::CTRL, 0, 0),
                ffi::IBV_WR_RDMA_WRITE,
                Some(sge),
                true,
                (remote, self.remote.ctrl_rkey),
                0,
            )?
        };
        st.sq_out += 1;
        st.reported = st.returned;
        Ok(true)
    }

    /// Ends the comm because rank `by` of the engine's communicator revoked
    /// it: the revoke frame on the setup socket tells the peer why (best
    /// effort, never blocking), and every later call fails. Idempotent.
    pub fn revoke(&self, by: u32) {
        super::setup_frame::revoke_once(&mut self.st.lock().failed, &self.sock, by);
    }

    /// Stops using the comm (the QPs are destroyed on drop), saying BYE
    /// unless it was revoked.
    pub fn finish(&self, _deadline: Instant) {
        let bye = self.st.lock().failed.is_none();
        if let Some(mut s) = self.sock.lock().take() {
            super::setup_frame::close_setup(&mut s, bye, std::net::Shutdown::Both);
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

    /// Frees everything.
    pub fn close(self) {
        self.finish(Instant::now());
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
