//! Coalescing: small point-to-point messages to one peer travel as one wire
//! message, a pack (`transport::pack`), on links where each message has a
//! fixed cost (TCP).
//!
//! The rule both ends follow, agreed at init (`HETCCL_COALESCE_BYTES` on
//! every rank's card, [`agree`]): on a coalescing link, every message of
//! 1 to [`Limits::max_part`] bytes travels inside a pack, alone or with the
//! messages queued behind it; larger messages travel plain. Message sizes
//! are symmetric (a receive asks for exactly the bytes of the matching
//! send), so the receiver knows from the size it expects whether the next
//! wire message is a pack, and the pack's header says how the sender
//! grouped what follows.
//!
//! - [`PackSend`] wraps a link's sending half. The executor
//!   (`exec::coalesce`) hands it the messages ready at the head of the
//!   link's queue; the pack buffer is the link's own, so it outlives a
//!   send in flight whatever happens to the operation.
//! - [`PackRecv`] wraps the receiving half and needs nothing from the
//!   executor: it receives a pack into its own buffer, checks it whole, and
//!   hands its sub-messages to the following receives one by one, each
//!   checked against the size that receive expects. Sub-messages left over
//!   wait for the next receives, in a later group if need be.

use std::ops::Range;

use parking_lot::Mutex;

use super::pack::{self, PackError};
use super::{Conn, RecvLink, SendLink, TransportKind, WaitSource};
use crate::bootstrap::card::Card;
use crate::error::{Error, Result};

/// Packs up to this size go out eagerly (`SendLink::try_send_eager`: over
/// TCP inline, without waiting for the receiver's CTS); larger ones wait for
/// it. At 32 KiB, the TCP receiver's bound on unexpected messages (512)
/// trips before its bound on their bytes (16 MiB), as it does for plain
/// inline messages, however far a sender runs ahead.
pub const EAGER_MAX: usize = 32 << 10;

/// The sizes that govern coalescing on a link.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// The largest pack, header included (`HETCCL_COALESCE_BYTES`).
    pub max_pack: usize,
    /// The largest message that is packed: an eighth of `max_pack`.
    pub max_part: usize,
}

impl Limits {
    /// The limits for `HETCCL_COALESCE_BYTES = bytes`; `None` for 0 (off).
    pub fn from_bytes(bytes: usize) -> Option<Self> {
        (bytes > 0).then_some(Self {
            max_pack: bytes,
            max_part: bytes / 8,
        })
    }

    /// Whether a message of `len` bytes travels in a pack.
    pub fn packs(&self, len: usize) -> bool {
        len > 0 && len <= self.max_part
    }
}

/// The coalescing limits every rank of a communicator uses, from the ranks'
/// cards: `None` (off everywhere) when `HETCCL_COALESCE_BYTES` is 0 on any
/// rank or differs between them. Rank 0 warns once when they differ.
pub fn agree(cards: &[Card], mine: u32, rank: usize) -> Option<Limits> {
    if cards.iter().any(|c| c.coalesce != mine) {
        if rank == 0 {
            let all: Vec<String> = cards.iter().map(|c| c.coalesce.to_string()).collect();
            tracing::warn!(target: "hetccl::INIT",
                "HETCCL_COALESCE_BYTES differs between the ranks of this communicator ({}): \
                 coalescing is off on every rank", all.join(","));
        }
        return None;
    }
    Limits::from_bytes(mine as usize)
}

/// Whether links of transport `t` coalesce: those with a fixed cost per
/// message (TCP). Shm rings are byte streams with nothing to save.
pub fn applies(t: TransportKind) -> bool {
    t == TransportKind::Tcp
}

/// `conn`, coalescing (both halves) under `limits`; `peer` names the other
/// end in errors.
pub fn wrap(conn: Conn, peer: usize, limits: Limits) -> Conn {
    Conn {
        tx: Box::new(PackSend {
            inner: conn.tx,
            limits,
            st: Mutex::new(SendState::default()),
        }),
        rx: Box::new(PackRecv {
            inner: conn.rx,
            limits,
            peer,
            st: Mutex::new(RecvState::default()),
        }),
        transport: conn.transport,
    }
}

/// The sending half of a coalescing link.
#[derive(Debug)]
pub struct PackSend {
    inner: Box<dyn SendLink>,
    limits: Limits,
    st: Mutex<SendState>,
}

#[derive(Debug, Default)]
struct SendState {
    /// The pack in flight (its bytes stay here until the link took them).
    buf: Vec<u8>,
    /// Bytes of `buf` the link took.
    sent: usize,
    /// Sub-messages of the pack in flight; 0 when idle.
    parts: usize,
}

impl PackSend {
    /// The link's limits.
    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// Whether a pack is in flight.
    pub fn busy(&self) -> bool {
        self.st.lock().parts > 0
    }

    /// Starts a pack of `parts` (each packable, together within the
    /// limit); fails if one is in flight.
    pub fn start(&self, parts: &[&[u8]]) -> Result<()> {
        let mut st = self.st.lock();
        let payload: usize = parts.iter().map(|p| p.len()).sum();
        if st.parts > 0
            || parts.is_empty()
            || !parts.iter().all(|p| self.limits.packs(p.len()))
            || pack::encoded_len(parts.len(), payload) > self.limits.max_pack
        {
            return Err(Error::Internal(
                format!(
                    "coalescing: cannot start a pack of {} messages, {payload} bytes",
                    parts.len()
                )
                .into(),
            ));
        }
        pack::encode(parts, &mut st.buf);
        st.sent = 0;
        st.parts = parts.len();
        Ok(())
    }

    /// Moves the pack in flight: whether bytes moved, and the number of
    /// its sub-messages once the link took all of it.
    pub fn poll(&self) -> Result<(bool, Option<usize>)> {
        let mut st = self.st.lock();
        let st = &mut *st;
        if st.parts == 0 {
            return Err(Error::Internal("coalescing: no pack in flight".into()));
        }
        let mut moved = false;
        while st.sent < st.buf.len() {
            // The unsent remainder, the same range until the link takes
            // some of it (message links take all of it or nothing).
            let rest = &st.buf[st.sent..];
            let n = if st.buf.len() <= EAGER_MAX {
                self.inner.try_send_eager(rest)?
            } else {
                self.inner.try_send(rest)?
            };
            if n == 0 {
                break;
            }
            moved = true;
            st.sent += n;
        }
        if st.sent < st.buf.len() {
            return Ok((moved, None));
        }
        let parts = std::mem::take(&mut st.parts);
        Ok((true, Some(parts)))
    }
}

impl SendLink for PackSend {
    fn try_send(&self, src: &[u8]) -> Result<usize> {
        // A plain message (larger than `max_part`; the caller passes what
        // remains of it, which may be less), never while a pack is out.
        if self.busy() {
            return Err(Error::Internal(
                "coalescing: a plain message while a pack is in flight".into(),
            ));
        }
        self.inner.try_send(src)
    }
    fn wait_source(&self) -> WaitSource {
        self.inner.wait_source()
    }
    fn wait_fds(&self, out: &mut Vec<libc::pollfd>) -> bool {
        // A pack or a plain message in flight is the inner link's.
        self.inner.wait_fds(out)
    }
    fn close(&self) {
        self.inner.close();
    }
    fn revoke(&self, by: usize) {
        self.inner.revoke(by);
    }
    fn finish(&self, deadline: std::time::Instant) {
        self.inner.finish(deadline);
    }
    fn packer(&self) -> Option<&PackSend> {
        Some(self)
    }
}

/// The receiving half of a coalescing link.
#[derive(Debug)]
pub struct PackRecv {
    inner: Box<dyn RecvLink>,
    limits: Limits,
    peer: usize,
    st: Mutex<RecvState>,
}

#[derive(Debug, Default)]
struct RecvState {
    /// Where packs land: `max_pack` bytes, allocated once, never moved
    /// (a message link's receive may be in flight into it).
    stage: Vec<u8>,
    /// Bytes of the pack being received (byte streams).
    got: usize,
    /// The sub-messages of the pack received, and the next one to hand out.
    parts: Vec<Range<usize>>,
    next: usize,
    /// Bytes still to come of a plain message that a byte stream delivers
    /// in pieces (the caller then passes what remains of it, which may look
    /// small enough to be packed).
    plain_left: usize,
}

impl RecvState {
    fn pending(&self) -> usize {
        self.parts.len() - self.next
    }
}

impl PackRecv {
    fn malformed(&self, e: PackError) -> Error {
        Error::Remote(
            format!(
                "rank {} sent a malformed pack of coalesced messages: {e}",
                self.peer
            )
            .into(),
        )
    }

    fn mismatched(&self, sent: usize, want: usize) -> Error {
        Error::usage(format!(
            "rank {} sent a message of {sent} bytes (coalesced) where {want} were expected: \
             the ranks' sends and receives are mismatched",
            self.peer
        ))
    }

    /// Receives what it can of the next pack; true once one is in whole and
    /// checked.
    fn fill(&self, st: &mut RecvState, want: usize) -> Result<bool> {
        let max = self.limits.max_pack;
        if st.stage.is_empty() {
            st.stage = vec![0; max];
        }
        loop {
            if st.got < pack::HEADER {
                // Message links take the whole pack at once (whatever its
                // length up to `max`); byte streams the header first.
                let (n, whole) = self
                    .inner
                    .try_recv_first(&mut st.stage[st.got..max], pack::HEADER - st.got)?;
                st.got += n;
                if whole {
                    break;
                }
                if n == 0 {
                    return Ok(false);
                }
                continue;
            }
            let total =
                pack::stated_len(&st.stage[..st.got], max).map_err(|e| self.malformed(e))?;
            if st.got >= total {
                break;
            }
            let n = self.inner.try_recv_into(&mut st.stage[st.got..total])?;
            if n == 0 {
                return Ok(false);
            }
            st.got += n;
        }
        let got = std::mem::take(&mut st.got);
        st.parts = pack::decode(&st.stage[..got], max, self.limits.max_part).map_err(|e| {
            if e == PackError::Magic || matches!(e, PackError::Truncated(_)) {
                // A plain message where the sizes say a pack: the sender
                // sent a message of another size.
                self.mismatched(got, want)
            } else {
                self.malformed(e)
            }
        })?;
        st.next = 0;
        Ok(true)
    }

    /// The next sub-message, which must be `want` bytes, once it is here.
    fn take(&self, st: &mut RecvState, want: usize) -> Result<Option<Range<usize>>> {
        if st.pending() == 0 && !self.fill(st, want)? {
            return Ok(None);
        }
        let r = st.parts[st.next].clone();
        if r.len() != want {
            return Err(self.mismatched(r.len(), want));
        }
        st.next += 1;
        if st.pending() == 0 {
            st.parts.clear();
            st.next = 0;
        }
        Ok(Some(r))
    }

    /// Whether a receive of `want` bytes (what remains of the current
    /// message) is plain; refuses one while sub-messages are left over.
    fn plain(&self, st: &RecvState, want: usize) -> Result<bool> {
        if st.plain_left > 0 {
            if want != st.plain_left {
                return Err(Error::Internal(
                    format!(
                        "coalescing: {want} bytes asked where {} remain of a message",
                        st.plain_left
                    )
                    .into(),
                ));
            }
            return Ok(true);
        }
        if self.limits.packs(want) {
            return Ok(false);
        }
        match st.parts.get(st.next) {
            Some(r) => Err(self.mismatched(r.len(), want)),
            None => Ok(true),
        }
    }
}

impl RecvLink for PackRecv {
    fn try_recv_with(&self, max: usize, elem: usize, f: &mut dyn FnMut(&[u8])) -> Result<usize> {
        if max == 0 {
            return Ok(0);
        }
        let mut st = self.st.lock();
        if self.plain(&st, max)? {
            let n = self.inner.try_recv_with(max, elem, f)?;
            st.plain_left = max - n;
            return Ok(n);
        }
        Ok(match self.take(&mut st, max)? {
            Some(r) => {
                f(&st.stage[r]);
                max
            }
            None => 0,
        })
    }
    fn try_recv_into(&self, dst: &mut [u8]) -> Result<usize> {
        if dst.is_empty() {
            return Ok(0);
        }
        let mut st = self.st.lock();
        if self.plain(&st, dst.len())? {
            let n = self.inner.try_recv_into(dst)?;
            st.plain_left = dst.len() - n;
            return Ok(n);
        }
        Ok(match self.take(&mut st, dst.len())? {
            Some(r) => {
                dst.copy_from_slice(&st.stage[r]);
                dst.len()
            }
            None => 0,
        })
    }
    fn try_recv_first(&self, dst: &mut [u8], expect: usize) -> Result<(usize, bool)> {
        // Collective fingerprints never travel on a coalescing channel.
        let st = self.st.lock();
        if st.pending() > 0 || st.plain_left > 0 {
            return Err(Error::Internal(
                "coalescing: a first message on a coalescing channel".into(),
            ));
        }
        self.inner.try_recv_first(dst, expect)
    }
    fn wait_source(&self) -> WaitSource {
        // Sub-messages left over are ready at once: the executor polls.
        self.inner.wait_source()
    }
    fn wait_fds(&self, out: &mut Vec<libc::pollfd>) -> bool {
        // With sub-messages left over nothing is awaited on the socket
        // (the owner naps and polls again); otherwise the next pack or
        // plain message comes through the inner link.
        self.st.lock().pending() == 0 && self.inner.wait_fds(out)
    }
    fn close(&self) {
        self.inner.close();
    }
    fn revoke(&self, by: usize) {
        self.inner.revoke(by);
    }
    fn finish(&self, deadline: std::time::Instant) {
        self.inner.finish(deadline);
    }
}

#[cfg(test)]
mod tests;
