//! Small socket helpers over `std::net` and `libc`: non-blocking connect,
//! readiness checks, and I/O calls that report "would block" as `None`.

use std::io::{ErrorKind, Read};
use std::net::{SocketAddr, TcpStream};
use std::os::fd::{AsRawFd, FromRawFd};

use crate::error::{NetError, Result};

/// Starts a non-blocking connect to `addr`. The returned stream is
/// non-blocking and may still be connecting; see [`connect_done`].
pub fn start_connect(addr: &SocketAddr) -> Result<TcpStream> {
    let (family, storage, len) = to_sockaddr(addr);
    // SAFETY: plain socket(2) call.
    let fd = unsafe {
        libc::socket(
            family,
            libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            0,
        )
    };
    if fd < 0 {
        return Err(NetError::io("socket", &std::io::Error::last_os_error()));
    }
    // SAFETY: `fd` is a fresh socket we own; the stream closes it on drop.
    let stream = unsafe { TcpStream::from_raw_fd(fd) };
    // SAFETY: `storage` holds a valid sockaddr of `len` bytes.
    let rc = unsafe { libc::connect(fd, &storage as *const _ as *const libc::sockaddr, len) };
    if rc != 0 {
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EINPROGRESS) {
            return Err(NetError::io(&format!("connect to {addr}"), &e));
        }
    }
    stream
        .set_nodelay(true)
        .map_err(|e| NetError::io("TCP_NODELAY", &e))?;
    Ok(stream)
}

/// Whether a connect started by [`start_connect`] has finished: `Ok(true)`
/// when connected, `Ok(false)` while in progress.
pub fn connect_done(s: &TcpStream) -> Result<bool> {
    let mut p = libc::pollfd {
        fd: s.as_raw_fd(),
        events: libc::POLLOUT,
        revents: 0,
    };
    // SAFETY: one valid pollfd, zero timeout.
    let rc = unsafe { libc::poll(&mut p, 1, 0) };
    if rc < 0 {
        return Err(NetError::io("poll", &std::io::Error::last_os_error()));
    }
    if rc == 0 {
        return Ok(false);
    }
    if let Some(e) = s.take_error().map_err(|e| NetError::io("SO_ERROR", &e))? {
        return Err(NetError::io("connect", &e));
    }
    Ok(p.revents & libc::POLLOUT != 0)
}

fn to_sockaddr(addr: &SocketAddr) -> (i32, libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: all-zero is a valid sockaddr_storage.
    let mut st: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    match addr {
        SocketAddr::V4(a) => {
            // SAFETY: sockaddr_storage is large enough and aligned for sockaddr_in.
            let sin = unsafe { &mut *(&mut st as *mut _ as *mut libc::sockaddr_in) };
            sin.sin_family = libc::AF_INET as libc::sa_family_t;
            sin.sin_port = a.port().to_be();
            sin.sin_addr.s_addr = u32::from(*a.ip()).to_be();
            (
                libc::AF_INET,
                st,
                std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
            )
        }
        SocketAddr::V6(a) => {
            // SAFETY: as above, for sockaddr_in6.
            let sin6 = unsafe { &mut *(&mut st as *mut _ as *mut libc::sockaddr_in6) };
            sin6.sin6_family = libc::AF_INET6 as libc::sa_family_t;
            sin6.sin6_port = a.port().to_be();
            sin6.sin6_addr.s6_addr = a.ip().octets();
            sin6.sin6_scope_id = a.scope_id();
            (
                libc::AF_INET6,
                st,
                std::mem::size_of::<libc::sockaddr_in6>() as libc::socklen_t,
            )
        }
    }
}

/// `send(2)` of `buf` with `MSG_NOSIGNAL`: a peer that is gone makes the
/// call fail with `EPIPE` instead of raising `SIGPIPE`, which would kill a
/// host process (a C program, Python) that keeps SIGPIPE's default action.
pub fn send_nosignal(s: &TcpStream, buf: &[u8]) -> std::io::Result<usize> {
    // SAFETY: `buf` is valid for `buf.len()` bytes; the fd is open.
    let n = unsafe {
        libc::send(
            s.as_raw_fd(),
            buf.as_ptr().cast(),
            buf.len(),
            libc::MSG_NOSIGNAL,
        )
    };
    if n < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

/// `sendmsg(2)` of `a` then `b` with `MSG_NOSIGNAL` (see [`send_nosignal`]).
fn send2_nosignal(s: &TcpStream, a: &[u8], b: &[u8]) -> std::io::Result<usize> {
    let mut iov = [
        libc::iovec {
            iov_base: a.as_ptr() as *mut libc::c_void,
            iov_len: a.len(),
        },
        libc::iovec {
            iov_base: b.as_ptr() as *mut libc::c_void,
            iov_len: b.len(),
        },
    ];
    // SAFETY: an all-zero msghdr is valid (no name, no control data).
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = iov.as_mut_ptr();
    msg.msg_iovlen = iov.len() as _;
    // SAFETY: `msg` points at two iovecs over live slices; the fd is open.
    let n = unsafe { libc::sendmsg(s.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
    if n < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

/// Non-blocking write: `Ok(None)` if the socket buffer is full.
pub fn try_write(s: &mut TcpStream, buf: &[u8]) -> Result<Option<usize>> {
    loop {
        match send_nosignal(s, buf) {
            Ok(n) => return Ok(Some(n)),
            Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(None),
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) => return Err(NetError::Remote(format!("send failed: {e}"))),
        }
    }
}

/// Non-blocking gathering write of `a` then `b` (one `writev`): `Ok(None)`
/// if the socket buffer is full, else how many bytes were taken.
pub fn try_write2(s: &mut TcpStream, a: &[u8], b: &[u8]) -> Result<Option<usize>> {
    loop {
        match send2_nosignal(s, a, b) {
            Ok(n) => return Ok(Some(n)),
            Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(None),
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) => return Err(NetError::Remote(format!("send failed: {e}"))),
        }
    }
}

/// Non-blocking read: `Ok(None)` if nothing is available; end of stream is
/// an error (the peer closed or died).
pub fn try_read(s: &mut TcpStream, buf: &mut [u8]) -> Result<Option<usize>> {
    loop {
        match s.read(buf) {
            Ok(0) if !buf.is_empty() => return Err(NetError::peer_closed()),
            Ok(n) => return Ok(Some(n)),
            Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(None),
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) => return Err(NetError::Remote(format!("recv failed: {e}"))),
        }
    }
}

/// Non-blocking `MSG_PEEK` read: copies what has arrived into `buf` but
/// leaves it queued in the kernel (see [`discard`]). `Ok(None)` if nothing
/// is available; end of stream is an error.
pub fn try_peek(s: &TcpStream, buf: &mut [u8]) -> Result<Option<usize>> {
    recv_flags(s, buf, libc::MSG_PEEK, "recv")
}

/// Drops the first `buf.len()` queued bytes, which the caller has already
/// peeked into `buf` (`MSG_TRUNC`: TCP discards them without copying; were
/// a kernel to copy anyway, it would write the same bytes). Returns how many
/// were dropped.
pub fn discard(s: &TcpStream, buf: &mut [u8]) -> Result<usize> {
    Ok(recv_flags(s, buf, libc::MSG_TRUNC, "discard")?.unwrap_or(0))
}

fn recv_flags(s: &TcpStream, buf: &mut [u8], flags: i32, what: &str) -> Result<Option<usize>> {
    loop {
        // SAFETY: `buf` is valid for writes of `buf.len()` bytes.
        let n = unsafe {
            libc::recv(
                s.as_raw_fd(),
                buf.as_mut_ptr().cast(),
                buf.len(),
                flags | libc::MSG_DONTWAIT,
            )
        };
        if n > 0 || (n == 0 && buf.is_empty()) {
            return Ok(Some(n as usize));
        }
        if n == 0 {
            return Err(NetError::peer_closed());
        }
        let e = std::io::Error::last_os_error();
        match e.kind() {
            ErrorKind::WouldBlock => return Ok(None),
            ErrorKind::Interrupted => continue,
            _ => return Err(NetError::Remote(format!("{what} failed: {e}"))),
        }
    }
}

/// A random u64 from the OS.
pub fn random_u64() -> Result<u64> {
    let mut b = [0u8; 8];
    getrandom::getrandom(&mut b).map_err(|e| NetError::System(format!("getrandom: {e}")))?;
    Ok(u64::from_le_bytes(b))
}

fn setopt(s: &TcpStream, level: i32, name: i32, val: i32) -> Result<()> {
    // SAFETY: setsockopt with a valid int option value.
    let rc = unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            level,
            name,
            &val as *const i32 as *const libc::c_void,
            std::mem::size_of::<i32>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(NetError::io("setsockopt", &std::io::Error::last_os_error()));
    }
    Ok(())
}

/// Sets the TCP congestion control of `s` to `cc` (`TCP_CONGESTION`), or
/// leaves the host's default when `cc` is `None`. A name the kernel
/// refuses (not built, or not in `tcp_allowed_congestion_control`) is
/// warned once per process; the socket keeps the default.
pub fn set_congestion(s: &TcpStream, cc: Option<&str>) {
    static WARNED: std::sync::Once = std::sync::Once::new();
    let Some(cc) = cc else { return };
    // SAFETY: setsockopt reads `cc.len()` bytes of the name, which lives
    // for the call.
    let rc = unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_CONGESTION,
            cc.as_ptr().cast(),
            cc.len() as libc::socklen_t,
        )
    };
    if rc != 0 {
        let e = std::io::Error::last_os_error();
        WARNED.call_once(|| {
            tracing::warn!(target: "hetccl::NET",
                "HETCCL_SOCKET_CC={cc} is ignored: the kernel refused it ({e}); \
                 the host's default congestion control stays")
        });
    }
}

/// The TCP congestion control of socket `fd` (`TCP_CONGESTION`; tests).
#[cfg(test)]
pub(crate) fn congestion(fd: std::os::fd::RawFd) -> Result<String> {
    let mut b = [0u8; 16];
    let mut len = b.len() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `b`.
    let rc = unsafe {
        libc::getsockopt(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_CONGESTION,
            b.as_mut_ptr().cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(NetError::io("getsockopt", &std::io::Error::last_os_error()));
    }
    let n = b[..(len as usize).min(b.len())]
        .iter()
        .position(|&c| c == 0)
        .unwrap_or(len as usize);
    Ok(String::from_utf8_lossy(&b[..n]).into_owned())
}

/// Makes a silently vanished peer show up as a socket error within about
/// `timeout`: keepalive probes on idle connections, and `TCP_USER_TIMEOUT`
/// for data the peer never acknowledges.
pub fn set_liveness(s: &TcpStream, timeout: std::time::Duration) -> Result<()> {
    let secs = timeout.as_secs().clamp(4, 3600) as i32;
    setopt(s, libc::SOL_SOCKET, libc::SO_KEEPALIVE, 1)?;
    setopt(s, libc::IPPROTO_TCP, libc::TCP_KEEPIDLE, (secs / 2).max(1))?;
    setopt(s, libc::IPPROTO_TCP, libc::TCP_KEEPINTVL, (secs / 8).max(1))?;
    setopt(s, libc::IPPROTO_TCP, libc::TCP_KEEPCNT, 4)?;
    let ms = i32::try_from(timeout.as_millis()).unwrap_or(i32::MAX);
    setopt(s, libc::IPPROTO_TCP, libc::TCP_USER_TIMEOUT, ms.max(1000))
}

/// The connection's maximum segment size (`TCP_MAXSEG`), or `None` if the
/// kernel does not say.
pub fn mss(s: &TcpStream) -> Option<usize> {
    let mut v: i32 = 0;
    let mut len = std::mem::size_of::<i32>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into the int `v`.
    let rc = unsafe {
        libc::getsockopt(
            s.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_MAXSEG,
            (&mut v as *mut i32).cast(),
            &mut len,
        )
    };
    (rc == 0 && v > 0).then_some(v as usize)
}

/// Clears `TCP_QUICKACK` (best effort): ACKs wait to be merged until the
/// kernel turns quick ACKs back on.
pub fn delay_acks(s: &TcpStream) {
    let _ = setopt(s, libc::IPPROTO_TCP, libc::TCP_QUICKACK, 0);
}
