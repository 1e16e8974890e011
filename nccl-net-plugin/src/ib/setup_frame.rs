//! The frames a verbs comm writes on the setup socket it keeps open after
//! setup, for its peer's idle peer check (`wr.rs`):
//!
//! - `REVOKE by=<rank>`: the engine revoked its communicator
//!   (`ncclCommRevoke`); the peer learns which rank revoked, as TCP links
//!   tell it with a CLOSE frame. NCCL's net plugin face never writes it.
//! - `BYE`: the comm is closing gracefully (its finish), right before it
//!   closes the socket. A socket that closes without it belongs to a peer
//!   that died (or was torn down without a finish), which the check fails
//!   at once; after a BYE it waits for the close grace.
//!
//! The socket carries nothing else after setup, and only the two ends of
//! the connection (the acceptor checked the connector's nonce) can write
//! on it, so the frames need no other authentication. Each is 8 bytes: a
//! magic (`HRVK`, `HBYE`) and a little-endian word (the rank; 0 for BYE).
//! The peer check peeks at the socket: a whole, valid frame is acted on;
//! a valid prefix waits for the rest; any other byte fails the comm as a
//! protocol violation.

use std::net::TcpStream;

use parking_lot::Mutex;

use crate::error::{NetError, Result};

/// A revoke frame's first four bytes.
const MAGIC: [u8; 4] = *b"HRVK";
/// A BYE frame's first four bytes.
const BYE_MAGIC: [u8; 4] = *b"HBYE";
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

/// The BYE frame.
pub fn encode_bye() -> [u8; FRAME_BYTES] {
    let mut f = [0u8; FRAME_BYTES];
    f[..4].copy_from_slice(&BYE_MAGIC);
    f
}

/// A whole frame read from a setup socket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SetupFrame {
    /// Rank `by` revoked the communicator.
    Revoke(u32),
    /// The peer is closing gracefully.
    Bye,
}

/// Decodes what was peeked on a setup socket: `Ok(Some(frame))` for a
/// whole frame, `Ok(None)` for a valid prefix (the rest is on its way),
/// and an error for anything else (bytes past the frame included).
pub fn decode(b: &[u8]) -> Result<Option<SetupFrame>> {
    let head = b.len().min(MAGIC.len());
    let bye = b[..head] == BYE_MAGIC[..head];
    if b[..head] != MAGIC[..head] && !bye {
        return Err(NetError::proto(
            "unexpected bytes on the verbs setup socket",
        ));
    }
    if b.len() < FRAME_BYTES {
        return Ok(None);
    }
    if b.len() > FRAME_BYTES {
        return Err(NetError::proto(
            "bytes after a frame on the verbs setup socket",
        ));
    }
    let word = u32::from_le_bytes(b[4..8].try_into().expect("4 bytes"));
    if bye {
        if word != 0 {
            return Err(NetError::proto(format!("BYE frame carries {word}")));
        }
        return Ok(Some(SetupFrame::Bye));
    }
    if word >= MAX_RANKS {
        return Err(NetError::proto(format!(
            "revoke frame names rank {word} (at most {})",
            MAX_RANKS - 1
        )));
    }
    Ok(Some(SetupFrame::Revoke(word)))
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
    if let Some(s) = sock.lock().as_mut() {
        write_frame(s, &encode(by), "revoke");
    }
}

/// Writes the BYE frame on `s` (best effort, as [`send`]).
pub fn send_bye(s: &mut TcpStream) {
    write_frame(s, &encode_bye(), "BYE");
}

/// Ends this side's use of a setup socket: a BYE first when `bye` (a
/// graceful close; a revoked comm said why already, and nothing may
/// follow that), then `shutdown(how)`.
pub fn close_setup(s: &mut TcpStream, bye: bool, how: std::net::Shutdown) {
    if bye {
        send_bye(s);
    }
    let _ = s.shutdown(how);
}

fn write_frame(s: &mut TcpStream, f: &[u8; FRAME_BYTES], what: &str) {
    match crate::sock::try_write(s, f) {
        Ok(Some(FRAME_BYTES)) => {}
        other => tracing::debug!(target: "hetccl::NET",
            "NET/IB: {what} frame not written whole: {other:?}"),
    }
}

/// Reads the peer's frame from what [`crate::sock::try_peek`] returned on
/// a setup socket (`peeked`: the bytes, or `None` when none wait):
/// `Ok(true)` for a whole BYE (the caller consumes it), `Ok(false)` for
/// nothing or a prefix, [`NetError::Revoked`] for a revoke.
pub fn check_peeked(peeked: Option<&[u8]>, peer: &str) -> Result<bool> {
    let Some(b) = peeked.filter(|b| !b.is_empty()) else {
        return Ok(false);
    };
    match decode(b) {
        Ok(Some(SetupFrame::Revoke(by))) => {
            tracing::info!(target: "hetccl::NET", "NET/IB: peer {peer}: rank {by} revoked the communicator");
            Err(NetError::Revoked(by))
        }
        Ok(Some(SetupFrame::Bye)) => Ok(true),
        Ok(None) => Ok(false),
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
            assert_eq!(decode(&f).unwrap(), Some(SetupFrame::Revoke(by)));
            for n in 1..FRAME_BYTES {
                assert_eq!(decode(&f[..n]).unwrap(), None, "prefix of {n} bytes");
            }
        }
        assert_eq!(&encode(3)[..4], b"HRVK");
        let b = encode_bye();
        assert_eq!(decode(&b).unwrap(), Some(SetupFrame::Bye));
        for n in 1..FRAME_BYTES {
            assert_eq!(decode(&b[..n]).unwrap(), None, "BYE prefix of {n} bytes");
        }
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
        let mut bye = encode_bye();
        bye[7] = 1;
        assert!(decode(&bye).is_err(), "a BYE with a word");
        let mut long = encode_bye().to_vec();
        long.push(b'H');
        assert!(decode(&long).is_err(), "bytes after a BYE");
        assert!(decode(b"HB").is_ok() && decode(b"HX").is_err(), "prefixes");
    }

    #[test]
    fn the_peer_check_reports_the_revoking_rank() {
        let f = encode(7);
        assert!(!check_peeked(None, "p").unwrap());
        assert!(!check_peeked(Some(&f[..5]), "p").unwrap());
        assert!(check_peeked(Some(&encode_bye()), "p").unwrap());
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
