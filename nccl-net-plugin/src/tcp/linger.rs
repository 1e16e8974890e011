//! Closing a comm's sockets without losing bytes the peer has not read yet.
//!
//! Closing a TCP socket whose receive queue still holds bytes makes the
//! kernel send a reset instead of a FIN, and a reset throws away whatever
//! this side had not yet transmitted, and makes the peer's next read fail.
//! The control socket peeks its frames and drops them from the kernel's
//! queue one pass later (see `ctrl.rs`), so after a comm's last operation
//! its final frame is still queued: a plain close there broke the peer's
//! last receive.
//!
//! [`linger`] closes gracefully instead: it half-closes every socket (a FIN
//! after all queued data), drops whatever the peer still sends, and waits
//! until the peer's kernel has acknowledged every byte and the FIN
//! (`SIOCOUTQ` is 0) or the peer closed too, bounded by a deadline. After
//! that no byte of this side can be lost, whatever the peer does next. It
//! waits for the peer's kernel, not for its application: a peer that keeps
//! computing, or is stopped, still acknowledges at once.

use std::net::{Shutdown, TcpStream};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

/// What [`linger`] saw.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Lingered {
    /// Bytes that arrived after the last operation and were dropped.
    pub discarded: usize,
    /// Sockets whose bytes were not all acknowledged by the deadline.
    pub unacked: usize,
}

/// Bytes this side sent that the peer has not acknowledged yet (with the
/// FIN after a half-close); `None` if the kernel cannot tell.
fn unacked(s: &TcpStream) -> Option<usize> {
    let mut n: libc::c_int = 0;
    // SAFETY: TIOCOUTQ (SIOCOUTQ) writes one int through the valid pointer;
    // the descriptor is open for the duration of the call.
    let rc = unsafe { libc::ioctl(s.as_raw_fd(), libc::TIOCOUTQ, &mut n as *mut libc::c_int) };
    (rc == 0).then_some(n.max(0) as usize)
}

/// Reads and drops what is queued. `true` once the socket is finished:
/// the peer closed it or it failed (nothing more can be delivered either
/// way).
fn drain(s: &TcpStream, scratch: &mut [u8], discarded: &mut usize) -> bool {
    loop {
        // SAFETY: `scratch` is valid for writes of its length.
        let n = unsafe {
            libc::recv(
                s.as_raw_fd(),
                scratch.as_mut_ptr().cast(),
                scratch.len(),
                libc::MSG_DONTWAIT,
            )
        };
        match n {
            0 => return true,
            n if n > 0 => *discarded += n as usize,
            _ => {
                let e = std::io::Error::last_os_error();
                return match e.kind() {
                    std::io::ErrorKind::WouldBlock => false,
                    std::io::ErrorKind::Interrupted => continue,
                    _ => true,
                };
            }
        }
    }
}

/// Half-closes `socks` and waits, until `deadline` at the latest, until
/// each has had every byte it sent acknowledged or was closed by its peer.
/// Incoming bytes are dropped meanwhile. The caller closes the sockets
/// afterwards (by dropping them).
pub fn linger(socks: &[&TcpStream], deadline: Instant) -> Lingered {
    let mut out = Lingered::default();
    for s in socks {
        // A FIN after everything queued; fails harmlessly on a dead socket.
        let _ = s.shutdown(Shutdown::Write);
    }
    let mut open: Vec<&TcpStream> = socks.to_vec();
    let mut scratch = [0u8; 4096];
    let mut nap = Duration::from_micros(20);
    loop {
        open.retain(|s| {
            let finished = drain(s, &mut scratch, &mut out.discarded);
            !(finished || unacked(s).is_none_or(|n| n == 0))
        });
        if open.is_empty() {
            return out;
        }
        let now = Instant::now();
        if now >= deadline {
            out.unacked = open.len();
            return out;
        }
        std::thread::sleep(nap.min(deadline - now));
        nap = (nap * 2).min(Duration::from_millis(2));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::TcpListener;

    fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (b, _) = l.accept().unwrap();
        (a, b)
    }

    /// The failure this module prevents: a side that closes with unread
    /// bytes resets the connection, and the peer loses data it had not read.
    #[test]
    fn a_plain_close_with_unread_bytes_loses_the_peers_data() {
        let (mut a, mut b) = pair();
        b.write_all(b"unread").unwrap();
        std::thread::sleep(Duration::from_millis(20));
        a.write_all(&[7u8; 1 << 16]).unwrap();
        drop(a);
        std::thread::sleep(Duration::from_millis(20));
        let mut got = Vec::new();
        let r = b.read_to_end(&mut got);
        assert!(
            r.is_err() || got.len() < 1 << 16,
            "expected a reset or lost bytes, got {} bytes: {r:?}",
            got.len()
        );
    }

    #[test]
    fn linger_delivers_everything_although_bytes_were_unread() {
        let (mut a, mut b) = pair();
        b.write_all(b"unread").unwrap();
        std::thread::sleep(Duration::from_millis(20));
        a.write_all(&[7u8; 1 << 16]).unwrap();
        let r = linger(&[&a], Instant::now() + Duration::from_secs(10));
        assert_eq!(
            r,
            Lingered {
                discarded: 6,
                unacked: 0
            }
        );
        // The peer has not read a byte yet; it still gets all of them.
        drop(a);
        let mut got = Vec::new();
        b.read_to_end(&mut got).unwrap();
        assert_eq!(got.len(), 1 << 16);
        assert!(got.iter().all(|&x| x == 7));
    }

    #[test]
    fn linger_ends_at_the_deadline_when_the_peer_never_acknowledges() {
        let (a, b) = pair();
        // Fill the peer's receive window: the rest stays unacknowledged.
        a.set_nonblocking(true).unwrap();
        let chunk = [1u8; 1 << 16];
        let mut w = &a;
        while w.write(&chunk).is_ok() {}
        let t0 = Instant::now();
        let r = linger(&[&a], t0 + Duration::from_millis(200));
        assert_eq!(r.unacked, 1);
        assert!(t0.elapsed() >= Duration::from_millis(200));
        assert!(t0.elapsed() < Duration::from_secs(5));
        drop(b);
    }

    #[test]
    fn linger_returns_at_once_when_the_peer_is_gone() {
        let (a, b) = pair();
        drop(b);
        let t0 = Instant::now();
        let r = linger(&[&a], t0 + Duration::from_secs(10));
        assert_eq!(r.unacked, 0);
        assert!(t0.elapsed() < Duration::from_secs(2));
    }
}
