//! The shm transport: links over a node [`Arena`]'s rings.

use std::sync::Arc;

use super::arena::Arena;
use super::doorbell::Doorbell;
use super::ring::Ring;
use super::{Conn, RecvLink, SendLink, WaitSource};
use crate::error::{Error, Result};

/// Sends into the ring `me -> peer` and rings the peer.
#[derive(Debug)]
struct ShmSend {
    ring: Ring,
    peer_bell: Doorbell,
    _arena: Arc<Arena>,
}

/// Receives from the ring `peer -> me` and rings the peer when space frees.
#[derive(Debug)]
struct ShmRecv {
    ring: Ring,
    peer_bell: Doorbell,
    _arena: Arc<Arena>,
}

fn closed(ring: &Ring) -> Error {
    match ring.revoked_by() {
        Some(by) => Error::Revoked(by),
        None => Error::Remote("shm link closed by the peer (abort)".into()),
    }
}

impl SendLink for ShmSend {
    fn try_send(&self, src: &[u8]) -> Result<usize> {
        if self.ring.is_closed() {
            return Err(closed(&self.ring));
        }
        let n = self.ring.try_write(src);
        if n > 0 {
            self.peer_bell.ring();
        }
        Ok(n)
    }
    fn wait_source(&self) -> WaitSource {
        WaitSource::Bell
    }
    fn close(&self) {
        self.ring.close();
        self.peer_bell.ring();
    }
    fn revoke(&self, by: usize) {
        self.ring.close_revoked(by);
        self.peer_bell.ring();
    }
}

impl RecvLink for ShmRecv {
    fn try_recv_with(&self, max: usize, elem: usize, f: &mut dyn FnMut(&[u8])) -> Result<usize> {
        let n = self.ring.try_read_with(max, elem, f);
        if n > 0 {
            self.peer_bell.ring();
        } else if self.ring.is_closed() {
            return Err(closed(&self.ring));
        }
        Ok(n)
    }
    fn wait_source(&self) -> WaitSource {
        WaitSource::Bell
    }
    fn close(&self) {
        self.ring.close();
        self.peer_bell.ring();
    }
    fn revoke(&self, by: usize) {
        self.ring.close_revoked(by);
        self.peer_bell.ring();
    }
}

/// Builds channel `chan` of the connection between local ranks `me` and
/// `peer` of `arena`.
pub fn connect(arena: &Arc<Arena>, me: usize, peer: usize, chan: usize) -> Conn {
    Conn {
        tx: Box::new(ShmSend {
            ring: arena.ring(me, peer, chan),
            peer_bell: arena.bell(peer),
            _arena: arena.clone(),
        }),
        rx: Box::new(ShmRecv {
            ring: arena.ring(peer, me, chan),
            peer_bell: arena.bell(peer),
            _arena: arena.clone(),
        }),
        transport: super::TransportKind::Shm,
    }
}
