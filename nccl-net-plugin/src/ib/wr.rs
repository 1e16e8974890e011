//! Work-request ids (what a completion is for) and the peer check on the
//! setup socket that each comm keeps open: the kernel closes it when the
//! peer process exits or dies, which RC QPs alone would notice only after
//! their retries run out, or never on an idle receive.

use std::net::TcpStream;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::error::{NetError, Result};

/// A receive slot (index = slot).
pub const SLOT: u8 = 1;
/// An eager SEND (index = send slot).
pub const EAGER: u8 = 2;
/// An RTS SEND (index = message).
pub const RTS: u8 = 3;
/// A write-with-immediate of a piece (index = CTS number).
pub const PART: u8 = 4;
/// A CTS or credit write of the receiver (index unused).
pub const CTRL: u8 = 5;
/// A send that holds nothing: an inline eager SEND or the empty SEND that
/// flushes unsignaled ones (index = message, or unused).
pub const INLINE: u8 = 6;

/// A comm that made no progress makes its system calls (the async-event
/// fd and the setup socket) on one idle poll in this many; the others only
/// read the CQ and memory. Not fewer: on Soft-RoCE the "NIC" is kernel work
/// on the same CPUs, and those calls are where the kernel runs it (a
/// process that polls only memory leaves it to the next timer tick).
pub const IDLE_CHECK_EVERY: u32 = 4;

/// Packs a kind, a QP index and an index.
pub fn id(kind: u8, qp: usize, idx: u64) -> u64 {
    (u64::from(kind) << 60) | ((qp as u64 & 0xf) << 56) | (idx & ((1 << 56) - 1))
}

/// Unpacks [`id`].
pub fn split(wr_id: u64) -> (u8, usize, u64) {
    (
        (wr_id >> 60) as u8,
        ((wr_id >> 56) & 0xf) as usize,
        wr_id & ((1 << 56) - 1),
    )
}

/// Fails if the peer closed the setup socket or died, or wrote on it: its
/// revoke frame fails with [`NetError::Revoked`], anything else as a
/// protocol violation (`revoke.rs`).
pub fn check_peer(sock: &Mutex<Option<TcpStream>>, peer: &str) -> Result<()> {
    match peer_state(sock, peer)? {
        None => Ok(()),
        Some(closed) => Err(closed),
    }
}

/// `Ok(None)` while the peer is there, `Ok(Some(error))` once it closed the
/// setup socket (or died), `Err` for a revoke frame or anything else it
/// wrote.
fn peer_state(sock: &Mutex<Option<TcpStream>>, peer: &str) -> Result<Option<NetError>> {
    let g = sock.lock();
    let Some(s) = g.as_ref() else {
        return Ok(None);
    };
    // One byte more than a frame, to see bytes after it.
    let mut b = [0u8; super::revoke::FRAME_BYTES + 1];
    match crate::sock::try_peek(s, &mut b) {
        Ok(n) => super::revoke::check_peeked(n.map(|n| &b[..n]), peer).map(|()| None),
        Err(e) if e.is_peer_closed() => Ok(Some(NetError::Remote(format!(
            "NET/IB: connection closed by peer {peer}"
        )))),
        Err(e) => Err(NetError::Remote(format!("NET/IB: peer {peer}: {e}"))),
    }
}

/// How long a comm that saw its peer close the setup socket goes on
/// polling before it fails what is still in flight.
///
/// The peer closes once what it sent was acknowledged (or once its
/// receives are done), so the work completions of its last messages, or
/// of the acknowledgements of ours, may still be on their way into this
/// side's CQ when the close is seen: the NIC (Soft-RoCE: kernel work on a
/// busy CPU) writes them later. Failing at once lost them now and then.
pub const CLOSE_GRACE: Duration = Duration::from_secs(1);

/// The peer check of a comm's idle polls, with [`CLOSE_GRACE`] after the
/// peer closed: a revoke or a protocol violation fails at once, a close
/// only once the grace has passed.
#[derive(Debug, Default)]
pub struct PeerWatch {
    closed: Option<(NetError, Instant)>,
}

impl PeerWatch {
    /// Checks the peer; `Err` when the comm must fail now.
    pub fn check(&mut self, sock: &Mutex<Option<TcpStream>>, peer: &str) -> Result<()> {
        if let Some((e, at)) = &self.closed {
            return if at.elapsed() >= CLOSE_GRACE {
                Err(e.clone())
            } else {
                Ok(())
            };
        }
        if let Some(e) = peer_state(sock, peer)? {
            self.closed = Some((e, Instant::now()));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip() {
        for (k, q, i) in [(SLOT, 0, 0), (PART, 7, (1 << 56) - 1), (EAGER, 3, 12345)] {
            assert_eq!(split(id(k, q, i)), (k, q, i));
        }
    }
}
