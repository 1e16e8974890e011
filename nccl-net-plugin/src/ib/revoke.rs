//! The revoke frame of a verbs connection: when the engine revokes its
//! communicator (`ncclCommRevoke`), each of its verbs comms writes
//! `REVOKE by=<rank>` on the setup socket it keeps open, so that the peer
//! learns which rank revoked, as TCP links tell it with a CLOSE frame.
//!
//! The socket carries nothing else after setup, and only the two ends of
//! the connection (the acceptor checked the connector's nonce) can write
//! on it, so the frame needs no other authentication. It is 8 bytes: the
//! magic `HRVK` and the rank, little-endian. The peer's idle peer check
//! peeks at the socket: a whole, valid frame fails the comm with
//! [`NetError::Revoked`]; a valid prefix waits for the rest; any other
//! byte fails the comm as a protocol violation. NCCL's net plugin face
//! never writes it (only the engine's revoke does).

use std::net::TcpStream;

use parking_lot::Mutex;

use crate::error::{NetError, Result};

/// The frame's first four bytes.
const MAGIC: [u8; 4] = *b"HRVK";
/// Bytes of a frame.
pub const FRAME_BYTES: usize = 8;
/// Ranks a frame may name: `0..MAX_RANKS`.
pub const MAX_RANKS: u32 = 1 << 24;

/// The frame saying that rank `by` revoked the communicator.
pub fn encode(by: u32) -> [u8; FRAME_BYTES] {
    let mut f = [0u8; FRAME_BYTES];
    f[..4].copy_from_slice(&MAGIC);
    f[4..].copy_from_slice(&by.to_le_bytes());
    f
}

/// Decodes what was peeked on a setup socket: `Ok(Some(rank))` for a whole
/// frame, `Ok(None)` for a valid prefix (the rest is on its way), and an
/// error for anything else (bytes past the frame included).
pub fn decode(b: &[u8]) -> Result<Option<u32>> {
    let head = b.len().min(MAGIC.len());
    if b[..head] != MAGIC[..head] {
        return Err(NetError::proto(
            "unexpected bytes on the verbs setup socket",
        ));
    }
    if b.len() < FRAME_BYTES {
        return Ok(None);
    }
    if b.len() > FRAME_BYTES {
        return Err(NetError::proto(
            "bytes after the revoke frame on the verbs setup socket",
        ));
    }
    let by = u32::from_le_bytes(b[4..8].try_into().expect("4 bytes"));
    if by >= MAX_RANKS {
        return Err(NetError::proto(format!(
            "revoke frame names rank {by} (at most {})",
            MAX_RANKS - 1
        )));
    }
    Ok(Some(by))
}

/// Revokes a comm whose state is `failed`: the frame goes out on `sock`
/// (best effort) and the comm fails with [`NetError::Revoked`]; nothing
/// happens if it already failed (idempotent).
pub fn revoke_once(failed: &mut Option<NetError>, sock: &Mutex<Option<TcpStream>>, by: u32) {
    if failed.is_none() {
        send(sock, by);
        *failed = Some(NetError::Revoked(by));
    }
}

/// Writes the frame for rank `by` on `sock`, best effort and without
/// blocking (8 bytes on a socket that carries nothing else fit its
/// buffer; a failure means the peer is gone, which it learns anyway).
pub fn send(sock: &Mutex<Option<TcpStream>>, by: u32) {
    let mut g = sock.lock();
    let Some(s) = g.as_mut() else {
        return;
    };
    let f = encode(by);
    match crate::sock::try_write(s, &f) {
        Ok(Some(FRAME_BYTES)) => {}
        other => tracing::debug!(target: "hetccl::NET",
            "NET/IB: revoke frame not written whole: {other:?}"),
    }
}

/// Reads the peer's revoke from what [`crate::sock::try_peek`] returned on
/// a setup socket (`peeked`: the bytes, or `None` when none wait).
pub fn check_peeked(peeked: Option<&[u8]>, peer: &str) -> Result<()> {
    let Some(b) = peeked.filter(|b| !b.is_empty()) else {
        return Ok(());
    };
    match decode(b) {
        Ok(Some(by)) => {
            tracing::info!(target: "hetccl::NET", "NET/IB: peer {peer}: rank {by} revoked the communicator");
            Err(NetError::Revoked(by))
        }
        Ok(None) => Ok(()),
        Err(e) => Err(NetError::Remote(format!("NET/IB: peer {peer}: {e}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_frame_round_trips_and_its_prefixes_wait() {
        for by in [0u32, 2, 1000, MAX_RANKS - 1] {
            let f = encode(by);
            assert_eq!(decode(&f).unwrap(), Some(by));
            for n in 1..FRAME_BYTES {
                assert_eq!(decode(&f[..n]).unwrap(), None, "prefix of {n} bytes");
            }
        }
        assert_eq!(&encode(3)[..4], b"HRVK");
    }

    #[test]
    fn anything_else_fails() {
        let mut f = encode(5);
        f[1] = b'X';
        assert!(decode(&f).is_err(), "bad magic");
        assert!(decode(&f[..2]).is_err(), "bad magic in a prefix");
        assert!(decode(b"G").is_err(), "one stray byte");
        let big = encode(MAX_RANKS);
        assert!(decode(&big).is_err(), "rank out of range");
        assert!(decode(&encode(u32::MAX)).is_err(), "rank out of range");
        let mut long = encode(1).to_vec();
        long.push(0);
        assert!(decode(&long).is_err(), "bytes after the frame");
    }

    #[test]
    fn the_peer_check_reports_the_revoking_rank() {
        let f = encode(7);
        assert!(check_peeked(None, "p").is_ok());
        assert!(check_peeked(Some(&f[..5]), "p").is_ok());
        match check_peeked(Some(&f), "p") {
            Err(NetError::Revoked(7)) => {}
            other => panic!("{other:?}"),
        }
        let e = check_peeked(Some(b"xyz"), "p").unwrap_err();
        assert!(e.to_string().contains("protocol violation"), "{e}");
    }

    #[test]
    fn a_frame_crosses_a_socket_pair_and_the_check_sees_it() {
        use std::net::{TcpListener, TcpStream};
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (b, _) = l.accept().unwrap();
        b.set_nonblocking(true).unwrap();
        let b = Mutex::new(Some(b));
        // Nothing written yet: the check passes.
        assert!(crate::ib::wr::check_peer(&b, "a").is_ok());
        send(&Mutex::new(Some(a)), 11);
        let t0 = std::time::Instant::now();
        loop {
            match crate::ib::wr::check_peer(&b, "a") {
                Err(NetError::Revoked(11)) => break,
                Ok(()) if t0.elapsed() < std::time::Duration::from_secs(5) => {
                    std::thread::sleep(std::time::Duration::from_millis(1))
                }
                other => panic!("{other:?}"),
            }
        }
    }
}
