//! Transports: how bytes move between two ranks.
//!
//! Every connection is a pair of ordered message streams, one per
//! direction, split into a [`SendLink`] and a [`RecvLink`]. The plans that
//! run over them (see `algo`) are symmetric: both sides know every
//! message's size and order, so a receive always asks for exactly the bytes
//! of the matching send. Byte-stream transports (shm) may deliver a message
//! in pieces; message transports (TCP and verbs through `nccl-net-plugin`)
//! deliver it whole. Links never block: `try_*`
//! calls move what they can and return; the executor waits on the links'
//! [`WaitSource`]s when nothing moves.
//!
//! Which transport joins each pair of ranks is the communicator's choice
//! at init, from the capabilities and costs in `crate::cost` (one
//! [`TransportKind`] per link, typed, never a string).

pub mod arena;
pub mod coalesce;
pub mod doorbell;
pub mod gdr;
pub mod net;
pub mod pack;
pub mod ring;
pub mod shm;
pub mod verbs;
mod window;

pub use crate::cost::TransportKind;
use crate::error::Result;

/// The piece size of the engine's one-step plans
/// (`algo::Chunking::piece_bytes`): the largest message a TCP link sends
/// eagerly, without waiting for the receiver's CTS. Shm links move any
/// message as the receiver's ring has room, and verbs links write larger
/// messages straight into the posted receive, so TCP's limit is the one
/// that matters. A library constant, so every rank cuts its plans alike.
pub const PLAN_PIECE_BYTES: usize = net::EAGER_MAX;

/// What a link's owner waits on when the link cannot move.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitSource {
    /// The rank's doorbell (shm peers ring it).
    Bell,
    /// Nothing to sleep on: the link must be polled (its sockets are driven
    /// by its `try_*` calls).
    Poll,
    /// As `Poll`, but the link names the sockets whose readiness would let
    /// its `try_*` calls move (`wait_fds`), so its owner can wait in
    /// `poll(2)` and wake as soon as the peer's bytes arrive.
    Fds,
}

/// The sending half of a connection: an ordered message stream to one peer.
pub trait SendLink: Send + Sync + std::fmt::Debug {
    /// Moves what it can of the message `src` (the rest of the current
    /// message: the caller passes the unsent remainder, the same range until
    /// it is taken); returns the bytes taken. Byte-stream links may take a
    /// part; message links return 0 until they take it all.
    fn try_send(&self, src: &[u8]) -> Result<usize>;
    /// As [`SendLink::try_send`], for a small message the link may push
    /// to the peer before its receive is posted (a pack of coalesced
    /// messages, [`coalesce`]). The default is `try_send`.
    fn try_send_eager(&self, src: &[u8]) -> Result<usize> {
        self.try_send(src)
    }
    /// Posts `src`, the message after the one `try_send` is moving, so
    /// that the transport can start it before the current one completes;
    /// returns whether it did. Called at most once per message, only
    /// while the current message is in flight and with `src` ready and
    /// unchanged until `try_send` later reports it taken. Links that move
    /// one message at a time (the default) do nothing.
    fn post_ahead(&self, _src: &[u8]) -> Result<bool> {
        Ok(false)
    }
    /// What to wait on when `try_send` takes nothing.
    fn wait_source(&self) -> WaitSource;
    /// For [`WaitSource::Fds`]: appends the sockets to wait on; `false`
    /// when waiting on sockets is not enough now (the owner then naps).
    fn wait_fds(&self, _out: &mut Vec<libc::pollfd>) -> bool {
        false
    }
    /// Marks the link dead (abort); the peer's calls then fail.
    fn close(&self);
    /// Marks the link dead because rank `by` revoked the communicator; the
    /// peer's calls then fail saying so.
    fn revoke(&self, by: usize) {
        let _ = by;
        self.close();
    }
    /// Prepares a graceful close after the last operation: returns once
    /// every byte this link sent is safe from the link being closed, or at
    /// `deadline`. Transports whose close cannot lose data do nothing.
    fn finish(&self, _deadline: std::time::Instant) {}
    /// The link's packer when it coalesces small messages
    /// ([`coalesce`]); `None` for plain links.
    fn packer(&self) -> Option<&coalesce::PackSend> {
        None
    }
}

/// The receiving half of a connection.
pub trait RecvLink: Send + Sync + std::fmt::Debug {
    /// Hands up to `max` received bytes of the current message (`max` is
    /// what remains of it), in whole `elem`-byte elements, to `f` (possibly
    /// in several slices, in order); returns the bytes taken.
    fn try_recv_with(&self, max: usize, elem: usize, f: &mut dyn FnMut(&[u8])) -> Result<usize>;
    /// Moves up to `dst.len()` received bytes of the current message (what
    /// remains of it) into `dst`; returns the bytes taken. The caller
    /// passes the unfilled remainder, the same range until something is
    /// taken, and `dst` stays valid until the operation completes or the
    /// communicator is poisoned. Message links receive straight into it;
    /// the default copies what [`RecvLink::try_recv_with`] hands over.
    fn try_recv_into(&self, dst: &mut [u8]) -> Result<usize> {
        let mut off = 0;
        self.try_recv_with(dst.len(), 1, &mut |s| {
            dst[off..off + s.len()].copy_from_slice(s);
            off += s.len();
        })
    }
    /// Receives a peer's first message of an operation, whose length the
    /// peer chose (it carries a fingerprint, `exec::fingerprint`): into
    /// `dst`, which is the unfilled remainder of a buffer as large as any
    /// first message, of which `expect` bytes are what this rank expects.
    /// Returns the bytes taken and whether they end the message. Message
    /// links override it to take the peer's message whole, whatever its
    /// length up to `dst.len()`; byte streams (the default) take up to
    /// `expect` bytes and leave the count to the caller.
    fn try_recv_first(&self, dst: &mut [u8], expect: usize) -> Result<(usize, bool)> {
        let n = expect.min(dst.len());
        Ok((self.try_recv_into(&mut dst[..n])?, false))
    }
    /// Posts a receive into `dst` for the message after the one being
    /// received (as [`SendLink::post_ahead`]); `try_recv_into` later
    /// completes it. `dst` is free and stays valid until then.
    fn post_ahead(&self, _dst: &mut [u8]) -> Result<bool> {
        Ok(false)
    }
    /// What to wait on when nothing is ready.
    fn wait_source(&self) -> WaitSource;
    /// For [`WaitSource::Fds`]: appends the sockets to wait on; `false`
    /// when waiting on sockets is not enough now (the owner then naps).
    fn wait_fds(&self, _out: &mut Vec<libc::pollfd>) -> bool {
        false
    }
    /// Marks the link dead (abort).
    fn close(&self);
    /// As [`SendLink::revoke`], for the receiving half.
    fn revoke(&self, by: usize) {
        let _ = by;
        self.close();
    }
    /// As [`SendLink::finish`], for the receiving half.
    fn finish(&self, _deadline: std::time::Instant) {}
}

/// Both halves of a connection to one peer.
#[derive(Debug)]
pub struct Conn {
    /// Bytes to the peer.
    pub tx: Box<dyn SendLink>,
    /// Bytes from the peer.
    pub rx: Box<dyn RecvLink>,
    /// Which transport made it.
    pub transport: TransportKind,
}
