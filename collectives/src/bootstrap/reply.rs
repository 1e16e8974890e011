//! The accepting side's reply once it has checked a connection's answer,
//! and the connecting side's reader of it. A reply is one frame:
//!
//! - `DENY`: the answer failed the check (a wrong secret); the gate sends it
//!   without waiting, then closes.
//! - `RFSD` and a UTF-8 reason: authenticated, but refused (a rank claimed
//!   twice, a size mismatch, an unexpected purpose).
//! - `OKAY`: admitted (connections between ranks).
//! - anything else: what the connection was for (the root's card table,
//!   which starts with rank 0's big-endian rank, four zero bytes, so it is
//!   never one of the tags).
//!
//! The connecting side retries a connection lost before its reply; a
//! denial or a refusal ends its attempts.

use std::io::Write;
use std::net::TcpStream;
use std::time::{Duration, Instant};

use super::frame;
use super::retry::Fail;
use crate::error::Error;

/// The answer failed the check.
pub const DENIED: &[u8; 4] = b"DENY";
/// Authenticated but refused; a reason follows.
pub const REFUSED: &[u8; 4] = b"RFSD";
/// Admitted.
pub const ADMITTED: &[u8; 4] = b"OKAY";
/// The longest refusal reason sent, in bytes.
pub const MAX_REASON: usize = 200;

/// Writes the denial to a nonblocking connection, without waiting (a peer
/// that does not read it just does not get it).
pub fn deny(s: &mut TcpStream) {
    let mut f = [0u8; 8];
    f[..4].copy_from_slice(&4u32.to_be_bytes());
    f[4..].copy_from_slice(DENIED);
    let _ = s.write(&f);
}

/// Sends a refusal with `why` to a blocking connection, within 1 s (and
/// `deadline`); failures are ignored, the connection is dropped anyway.
pub fn refuse(s: &mut TcpStream, why: &str, deadline: Instant) {
    let mut end = why.len().min(MAX_REASON);
    while !why.is_char_boundary(end) {
        end -= 1;
    }
    let mut p = REFUSED.to_vec();
    p.extend_from_slice(&why.as_bytes()[..end]);
    let _ = frame::send(s, &p, deadline.min(Instant::now() + Duration::from_secs(1)));
}

/// Connecting side: reads the reply, whose payload may be up to `max`
/// bytes. A lost connection is [`Fail::Retry`]; a denial, a refusal or an
/// oversized frame is [`Fail::Fatal`].
pub fn recv(s: &mut TcpStream, max: usize, deadline: Instant) -> Result<Vec<u8>, Fail> {
    let mut len = [0u8; 4];
    frame::read_exact(s, &mut len, deadline).map_err(|e| Fail::io(e, deadline))?;
    let len = u32::from_be_bytes(len) as usize;
    let bound = max.clamp(4 + MAX_REASON, frame::MAX_FRAME);
    if len > bound {
        return Err(Fail::Fatal(Error::Remote(
            format!("bootstrap reply of {len} bytes exceeds the bound {bound}").into(),
        )));
    }
    let mut p = vec![0u8; len];
    frame::read_exact(s, &mut p, deadline).map_err(|e| Fail::io(e, deadline))?;
    if p.as_slice() == DENIED {
        return Err(Fail::Fatal(Error::Remote(
            "the peer denied this connection: its answer failed the check (a unique id \
             with a different secret, from another run?)"
                .into(),
        )));
    }
    if let Some(why) = p.strip_prefix(REFUSED) {
        return Err(Fail::Fatal(Error::Remote(
            format!(
                "the peer refused this connection: {}",
                String::from_utf8_lossy(why)
            )
            .into(),
        )));
    }
    Ok(p)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    #[test]
    fn replies_round_trip() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (mut b, _) = l.accept().unwrap();
        let dl = Instant::now() + Duration::from_secs(5);
        deny(&mut b);
        let e = recv(&mut a, 4, dl).unwrap_err();
        assert!(
            matches!(&e, Fail::Fatal(Error::Remote(m)) if m.contains("denied")),
            "{e:?}"
        );
        refuse(&mut b, &"é".repeat(MAX_REASON), dl);
        let e = recv(&mut a, 4, dl).unwrap_err();
        assert!(
            matches!(&e, Fail::Fatal(Error::Remote(m)) if m.contains("éé")),
            "{e:?}"
        );
        frame::send(&mut b, ADMITTED, dl).unwrap();
        assert_eq!(recv(&mut a, 4, dl).unwrap(), ADMITTED);
        frame::send(&mut b, &[0u8; 4 + MAX_REASON + 1], dl).unwrap();
        assert!(matches!(recv(&mut a, 4, dl), Err(Fail::Fatal(_))));
        // A lost connection is retried.
        drop(b);
        let mut rest = Vec::new();
        let _ = std::io::Read::read_to_end(&mut a, &mut rest);
        assert!(matches!(recv(&mut a, 4, dl), Err(Fail::Retry(_))));
    }
}
