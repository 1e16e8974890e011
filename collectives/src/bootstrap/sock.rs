//! Socket helpers for the bootstrap: choosing the interface, listening,
//! accepting and connecting with deadlines.

use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use super::retry::Backoff;
use crate::error::{Error, Result};

/// The accept backlog of bootstrap listeners (the kernel caps it at
/// `net.core.somaxconn`): room for a burst of connections to wait their
/// turn at the gate rather than have their SYNs dropped.
pub const BACKLOG: i32 = 1024;

/// Binds a listener on `ip`, any port, with a [`BACKLOG`] of connections.
pub fn listen(ip: IpAddr) -> Result<TcpListener> {
    let l = TcpListener::bind(SocketAddr::new(ip, 0))
        .map_err(|e| Error::System(format!("bind {ip}: {e}").into()))?;
    l.set_nonblocking(true)?;
    widen_backlog(&l);
    Ok(l)
}

/// Raises the accept backlog of a listening socket to [`BACKLOG`] (`listen`
/// again on a listening socket only changes its backlog); best effort.
pub fn widen_backlog(l: &TcpListener) {
    // SAFETY: `l` is a valid listening socket for the duration of the call.
    let rc = unsafe { libc::listen(l.as_raw_fd(), BACKLOG) };
    if rc != 0 {
        tracing::debug!(target: "hetccl::BOOTSTRAP",
            "listen backlog {BACKLOG}: {}", std::io::Error::last_os_error());
    }
}

/// A listening socket's accept queue: (connections waiting, capacity), from
/// `TCP_INFO`; `None` where the kernel does not say.
pub fn accept_queue(l: &TcpListener) -> Option<(u32, u32)> {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: an all-zero `tcp_info` is a valid value of the type.
        let mut ti: libc::tcp_info = unsafe { std::mem::zeroed() };
        let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
        // SAFETY: `ti` is writable for `len` bytes, `len` is a valid
        // in-out length, and `l` is an open socket.
        let rc = unsafe {
            libc::getsockopt(
                l.as_raw_fd(),
                libc::IPPROTO_TCP,
                libc::TCP_INFO,
                (&mut ti as *mut libc::tcp_info).cast(),
                &mut len,
            )
        };
        // On a listener, the kernel reports the queue in these two fields.
        (rc == 0 && ti.tcpi_sacked > 0).then_some((ti.tcpi_unacked, ti.tcpi_sacked))
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = l;
        None
    }
}

/// Accepts one connection before `deadline`.
pub fn accept(l: &TcpListener, deadline: Instant) -> Result<TcpStream> {
    loop {
        match l.accept() {
            Ok((s, _)) => {
                s.set_nonblocking(false)?;
                s.set_nodelay(true)?;
                return Ok(s);
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(Error::System(format!("accept: {e}").into())),
        }
        let now = Instant::now();
        if now >= deadline {
            return Err(Error::Timeout(
                "bootstrap: no peer connected in time".into(),
            ));
        }
        let ms = (deadline - now).as_millis().clamp(1, 100) as i32;
        let mut pfd = libc::pollfd {
            fd: l.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        unsafe { libc::poll(&mut pfd, 1, ms) };
    }
}

/// The first wait for one connect's handshake; it doubles on each attempt
/// up to [`CONNECT_WAIT_MAX`]. A listener whose accept queue is full drops
/// the SYN, and the kernel would resend it only after a second: a new
/// attempt sooner gets through sooner.
pub const CONNECT_WAIT_FIRST: Duration = Duration::from_millis(250);
/// The longest wait for one connect's handshake.
pub const CONNECT_WAIT_MAX: Duration = Duration::from_secs(5);

/// Connects to `addr`, retrying failed connects (the peer may not listen
/// yet, or its accept queue may be full) with a jittered backoff of 1 to
/// 100 ms, until `deadline`.
pub fn connect(addr: SocketAddr, deadline: Instant) -> Result<TcpStream> {
    let mut backoff = Backoff::new(Duration::from_millis(1), Duration::from_millis(100));
    let mut wait = CONNECT_WAIT_FIRST;
    loop {
        let now = Instant::now();
        if now >= deadline {
            return Err(Error::Timeout(
                format!("bootstrap: could not connect to {addr}").into(),
            ));
        }
        match TcpStream::connect_timeout(&addr, (deadline - now).min(wait)) {
            Ok(s) => {
                s.set_nodelay(true)?;
                return Ok(s);
            }
            Err(e) => {
                tracing::trace!(target: "hetccl::BOOTSTRAP", "connect {addr}: {e}; retrying");
                if e.kind() == std::io::ErrorKind::TimedOut {
                    wait = (wait * 2).min(CONNECT_WAIT_MAX);
                }
                backoff.sleep(deadline);
            }
        }
    }
}
