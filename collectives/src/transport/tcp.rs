//! The TCP transport: links over an authenticated, nonblocking socket.
//!
//! Connections are made and authenticated by the bootstrap (the unique id's
//! secret); this file only moves bytes. Received bytes are staged so that
//! bytes of the next message are never handed to the current one.

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::os::fd::AsRawFd;

use parking_lot::Mutex;

use super::{Conn, RecvLink, SendLink, WaitSource};
use crate::error::{Error, Result};

/// Staging buffer size per receiving link.
const STAGE: usize = 256 << 10;

#[derive(Debug)]
struct TcpSend {
    s: TcpStream,
}

#[derive(Debug)]
struct Stage {
    buf: Vec<u8>,
    start: usize,
    end: usize,
}

#[derive(Debug)]
struct TcpRecv {
    s: TcpStream,
    stage: Mutex<Stage>,
}

fn io_err(e: std::io::Error) -> Error {
    Error::Remote(format!("tcp link: {e}"))
}

impl SendLink for TcpSend {
    fn try_send(&self, src: &[u8]) -> Result<usize> {
        if src.is_empty() {
            return Ok(0);
        }
        match (&self.s).write(src) {
            Ok(n) => Ok(n),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::Interrupted) => Ok(0),
            Err(e) => Err(io_err(e)),
        }
    }
    fn wait_source(&self) -> WaitSource {
        WaitSource::Fd(self.s.as_raw_fd(), libc::POLLOUT)
    }
    fn close(&self) {
        let _ = self.s.shutdown(std::net::Shutdown::Both);
    }
}

impl RecvLink for TcpRecv {
    fn try_recv_with(&self, max: usize, elem: usize, f: &mut dyn FnMut(&[u8])) -> Result<usize> {
        let mut st = self.stage.lock();
        let Stage { buf, start, end } = &mut *st;
        if *end - *start < max.min(STAGE) {
            if *start > 0 {
                buf.copy_within(*start..*end, 0);
                *end -= *start;
                *start = 0;
            }
            match (&self.s).read(&mut buf[*end..]) {
                Ok(0) => {
                    if *end == *start {
                        return Err(Error::Remote(
                            "tcp link: the peer closed the connection".into(),
                        ));
                    }
                }
                Ok(n) => *end += n,
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::Interrupted) => {}
                Err(e) => return Err(io_err(e)),
            }
        }
        let have = (*end - *start).min(max);
        let n = have - have % elem;
        if n > 0 {
            f(&buf[*start..*start + n]);
            *start += n;
        }
        Ok(n)
    }
    fn wait_source(&self) -> WaitSource {
        WaitSource::Fd(self.s.as_raw_fd(), libc::POLLIN)
    }
    fn close(&self) {
        let _ = self.s.shutdown(std::net::Shutdown::Both);
    }
}

/// Wraps an authenticated stream as a connection.
pub fn connect(s: TcpStream) -> Result<Conn> {
    s.set_nonblocking(true)?;
    s.set_nodelay(true)?;
    let r = s.try_clone()?;
    Ok(Conn {
        tx: Box::new(TcpSend { s }),
        rx: Box::new(TcpRecv {
            s: r,
            stage: Mutex::new(Stage {
                buf: vec![0; STAGE],
                start: 0,
                end: 0,
            }),
        }),
        transport: "tcp",
    })
}
