//! Length-prefixed frames over a TCP stream, with a deadline on every read
//! and write and a bound on every length: the bootstrap's wire format.
//!
//! A frame is a 4-byte big-endian length followed by that many bytes. A
//! length above the caller's bound closes the connection with an error
//! before anything is allocated.

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use crate::error::{Error, Result};

/// The largest bootstrap frame anyone may send (64 MiB).
pub const MAX_FRAME: usize = 64 << 20;

fn remaining(deadline: Instant, what: &str) -> Result<Duration> {
    let now = Instant::now();
    if now >= deadline {
        return Err(Error::Timeout(format!("bootstrap {what} timed out").into()));
    }
    Ok((deadline - now).max(Duration::from_millis(1)))
}

/// Writes all of `buf` before `deadline`.
pub fn write_all(s: &mut TcpStream, buf: &[u8], deadline: Instant) -> Result<()> {
    let mut off = 0;
    while off < buf.len() {
        s.set_write_timeout(Some(remaining(deadline, "write")?))?;
        match s.write(&buf[off..]) {
            Ok(0) => return Err(Error::Remote("bootstrap peer closed the connection".into())),
            Ok(n) => off += n,
            Err(e)
                if matches!(
                    e.kind(),
                    ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted
                ) => {}
            Err(e) => return Err(Error::Remote(format!("bootstrap write: {e}").into())),
        }
    }
    Ok(())
}

/// Fills `buf` before `deadline`.
pub fn read_exact(s: &mut TcpStream, buf: &mut [u8], deadline: Instant) -> Result<()> {
    let mut off = 0;
    while off < buf.len() {
        s.set_read_timeout(Some(remaining(deadline, "read")?))?;
        match s.read(&mut buf[off..]) {
            Ok(0) => return Err(Error::Remote("bootstrap peer closed the connection".into())),
            Ok(n) => off += n,
            Err(e)
                if matches!(
                    e.kind(),
                    ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted
                ) => {}
            Err(e) => return Err(Error::Remote(format!("bootstrap read: {e}").into())),
        }
    }
    Ok(())
}

/// Sends one frame.
pub fn send(s: &mut TcpStream, payload: &[u8], deadline: Instant) -> Result<()> {
    let len = u32::try_from(payload.len())
        .ok()
        .filter(|&l| l as usize <= MAX_FRAME)
        .ok_or_else(|| {
            Error::Internal(format!("bootstrap frame of {} bytes", payload.len()).into())
        })?;
    let mut msg = Vec::with_capacity(4 + payload.len());
    msg.extend_from_slice(&len.to_be_bytes());
    msg.extend_from_slice(payload);
    write_all(s, &msg, deadline)
}

/// Receives one frame of at most `max` bytes.
pub fn recv(s: &mut TcpStream, max: usize, deadline: Instant) -> Result<Vec<u8>> {
    let mut len = [0u8; 4];
    read_exact(s, &mut len, deadline)?;
    let len = u32::from_be_bytes(len) as usize;
    if len > max.min(MAX_FRAME) {
        return Err(Error::Remote(
            format!("bootstrap frame of {len} bytes exceeds the bound {max}").into(),
        ));
    }
    let mut buf = vec![0u8; len];
    read_exact(s, &mut buf, deadline)?;
    Ok(buf)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    #[test]
    fn frames_bounds_and_timeouts() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (mut b, _) = l.accept().unwrap();
        let dl = Instant::now() + Duration::from_secs(5);
        send(&mut a, b"hello", dl).unwrap();
        assert_eq!(recv(&mut b, 16, dl).unwrap(), b"hello");
        send(&mut a, &[0u8; 100], dl).unwrap();
        assert!(recv(&mut b, 16, dl).is_err(), "over the bound");
        // Nothing arrives: the read ends at the deadline.
        let t = Instant::now();
        let e = recv(&mut a, 16, Instant::now() + Duration::from_millis(100)).unwrap_err();
        assert!(matches!(e, Error::Timeout(_)), "{e}");
        assert!(t.elapsed() < Duration::from_secs(3));
        drop(b);
        assert!(recv(&mut a, 16, dl).is_err(), "peer closed");
    }
}
