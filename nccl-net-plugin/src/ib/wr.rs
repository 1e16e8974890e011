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

/// Fails if the peer closed the setup socket, said BYE or died, or wrote
/// anything else on it: its revoke frame fails with
/// [`NetError::Revoked`], anything else as a protocol violation
/// (`setup_frame.rs`).
pub fn check_peer(sock: &Mutex<Option<TcpStream>>, peer: &str) -> Result<()> {
    match peer_state(sock, peer)? {
        None => Ok(()),
        Some((closed, _)) => Err(closed),
    }
}

/// How a peer left.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Left {
    /// It said BYE: it is closing gracefully.
    Bye,
    /// The socket closed without a BYE: the process died, or tore the comm
    /// down without a graceful finish.
    Gone,
}

/// `Ok(None)` while the peer is there, `Ok(Some((error, how)))` once it
/// said BYE (the frame is consumed) or closed the setup socket, `Err` for
/// a revoke frame or anything else it wrote.
fn peer_state(sock: &Mutex<Option<TcpStream>>, peer: &str) -> Result<Option<(NetError, Left)>> {
    let g = sock.lock();
    let Some(s) = g.as_ref() else {
        return Ok(None);
    };
    // One byte more than a frame, to see bytes after it.
    let mut b = [0u8; super::setup_frame::FRAME_BYTES + 1];
    match crate::sock::try_peek(s, &mut b) {
        Ok(n) => {
            if !super::setup_frame::check_peeked(n.map(|n| &b[..n]), peer)? {
                return Ok(None);
            }
            // A whole BYE and nothing after it: take it off the socket, so
            // that the close behind it can be seen.
            let mut frame = [0u8; super::setup_frame::FRAME_BYTES];
            let got = crate::sock::discard(s, &mut frame)?;
            if got != frame.len() {
                return Err(NetError::Internal(format!(
                    "NET/IB: took {got} bytes of a peeked BYE frame"
                )));
            }
            Ok(Some((
                NetError::Remote(format!("NET/IB: connection closed by peer {peer}")),
                Left::Bye,
            )))
        }
        Err(e) if e.is_peer_closed() => Ok(Some((
            NetError::Remote(format!(
                "NET/IB: peer {peer} closed its connection without a BYE (died?)"
            )),
            Left::Gone,
        ))),
        Err(e) => Err(NetError::Remote(format!("NET/IB: peer {peer}: {e}"))),
    }
}

/// How long a comm whose peer said BYE goes on polling before it fails
/// what is still in flight.
///
/// The peer closes once what it sent was acknowledged (or once its
/// receives are done), so the work completions of its last messages, or
/// of the acknowledgements of ours, may still be on their way into this
/// side's CQ when the close is seen: the NIC (Soft-RoCE: kernel work on a
/// busy CPU) writes them later. Failing at once lost them now and then.
/// A peer that closes without a BYE is gone, and fails the comm at once.
pub const CLOSE_GRACE: Duration = Duration::from_secs(1);

/// The peer check of a comm's idle polls, with [`CLOSE_GRACE`] after the
/// peer said BYE: a revoke, a protocol violation or a close without a BYE
/// fails at once, a graceful close only once the grace has passed.
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
        match peer_state(sock, peer)? {
            None => Ok(()),
            Some((e, Left::Gone)) => Err(e),
            Some((e, Left::Bye)) => {
                self.closed = Some((e, Instant::now()));
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A connected pair: the peer's end and this side's (non-blocking).
    fn pair() -> (TcpStream, Mutex<Option<TcpStream>>) {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (b, _) = l.accept().unwrap();
        b.set_nonblocking(true).unwrap();
        (a, Mutex::new(Some(b)))
    }

    /// Checks until the check fails or `limit` passes; returns the result
    /// and when the first check that saw the peer leave ran.
    fn watch_until(
        w: &mut PeerWatch,
        sock: &Mutex<Option<TcpStream>>,
        limit: Duration,
    ) -> (Result<()>, Option<Instant>) {
        let t0 = Instant::now();
        let mut seen = None;
        loop {
            let r = w.check(sock, "peer");
            if seen.is_none() && (r.is_err() || w.closed.is_some()) {
                seen = Some(Instant::now());
            }
            if r.is_err() || t0.elapsed() > limit {
                return (r, seen);
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    #[test]
    fn a_peer_gone_without_a_bye_fails_the_watch_at_once() {
        let (a, b) = pair();
        let mut w = PeerWatch::default();
        assert!(w.check(&b, "peer").is_ok());
        drop(a);
        let (r, seen) = watch_until(&mut w, &b, Duration::from_secs(5));
        let e = r.unwrap_err();
        assert!(e.to_string().contains("without a BYE"), "{e}");
        assert!(w.closed.is_none(), "no grace for a peer that is gone");
        assert!(seen.is_some());
    }

    #[test]
    fn a_peer_that_says_bye_gets_the_close_grace() {
        let (mut a, b) = pair();
        let mut w = PeerWatch::default();
        super::super::setup_frame::send_bye(&mut a);
        a.shutdown(std::net::Shutdown::Write).unwrap();
        let (r, seen) = watch_until(&mut w, &b, CLOSE_GRACE * 5);
        let (e, seen) = (r.unwrap_err(), seen.unwrap());
        let failed = Instant::now();
        assert!(e.to_string().contains("closed by peer"), "{e}");
        assert!(
            failed - seen >= CLOSE_GRACE,
            "failed {:?} after the BYE, before the grace",
            failed - seen
        );
        // check_peer, without a watch, fails on the BYE itself.
        let (mut a, b) = pair();
        super::super::setup_frame::send_bye(&mut a);
        let t0 = Instant::now();
        while check_peer(&b, "peer").is_ok() {
            assert!(t0.elapsed() < Duration::from_secs(5), "BYE not seen");
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    #[test]
    fn ids_round_trip() {
        for (k, q, i) in [(SLOT, 0, 0), (PART, 7, (1 << 56) - 1), (EAGER, 3, 12345)] {
            assert_eq!(split(id(k, q, i)), (k, q, i));
        }
    }
}
