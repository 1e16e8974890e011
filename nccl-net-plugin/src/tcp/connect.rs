//! Non-blocking connection setup.
//!
//! The connect side opens the control socket and the data sockets at once and
//! writes a hello on each; its state lives in a registry keyed by a random
//! token stored in the caller's handle, so every retry with the same handle
//! resumes it. The accept side reads hellos from incoming sockets, checks the
//! nonce, and groups sockets by comm id until a comm is complete. Nothing
//! here ever blocks.

use std::collections::HashMap;
use std::io::ErrorKind;
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

use super::ctrl::Ctrl;
use super::lanes::{Dir, LaneWatch, Lanes};
use super::recv::TcpRecvComm;
use super::send::TcpSendComm;
use super::TcpOptions;
use crate::error::{NetError, Result};
use crate::sock::{connect_done, random_u64, start_connect, try_read, try_write};
use crate::wire::{decode_hello, encode_hello, Hello, ListenInfo, SockRole, HELLO_BYTES};

/// Most sockets waiting for their hello on one listener; beyond that the
/// oldest is dropped (as `collectives/src/bootstrap/gate.rs` does), so a
/// flood of silent connections cannot crowd out a real peer's sockets.
const MAX_PENDING: usize = 1024;

struct OutSock {
    sock: TcpStream,
    connected: bool,
    hello: [u8; HELLO_BYTES],
    sent: usize,
}

/// A connect in progress (index 0 is the control socket).
pub(crate) struct Connecting {
    socks: Vec<OutSock>,
    started: Instant,
}

impl Connecting {
    /// Starts connecting `1 + nsocks` sockets to `info`.
    pub(crate) fn start(info: &ListenInfo, nsocks: usize) -> Result<Self> {
        let comm_id = random_u64()?;
        let mut socks = Vec::with_capacity(nsocks + 1);
        for i in 0..=nsocks {
            let role = if i == 0 {
                SockRole::Ctrl
            } else {
                SockRole::Data((i - 1) as u16)
            };
            let hello = encode_hello(&Hello {
                nonce: info.nonce,
                comm_id,
                role,
                nsocks: nsocks as u16,
            });
            socks.push(OutSock {
                sock: start_connect(&info.addr)?,
                connected: false,
                hello,
                sent: 0,
            });
        }
        Ok(Self {
            socks,
            started: Instant::now(),
        })
    }

    /// Advances; `Ok(true)` once every socket is connected and has sent its hello.
    pub(crate) fn step(&mut self, timeout: Duration) -> Result<bool> {
        let mut all = true;
        for s in &mut self.socks {
            if !s.connected {
                s.connected = connect_done(&s.sock)?;
            }
            if s.connected && s.sent < HELLO_BYTES {
                if let Some(n) = try_write(&mut s.sock, &s.hello[s.sent..])? {
                    s.sent += n;
                }
            }
            all &= s.sent == HELLO_BYTES;
        }
        if !all && self.started.elapsed() > timeout {
            return Err(NetError::Timeout(format!(
                "connect not finished after {timeout:?}"
            )));
        }
        Ok(all)
    }

    /// Turns the finished connection into a send comm.
    pub(crate) fn finish(
        self,
        opts: &TcpOptions,
        watches: &mut Vec<LaneWatch>,
    ) -> Result<TcpSendComm> {
        let mut it = self.socks.into_iter().map(|s| s.sock);
        let ctrl = Ctrl::new(
            it.next()
                .ok_or_else(|| NetError::Internal("no control socket".into()))?,
            opts.timeout,
        )?;
        let data: Vec<TcpStream> = it.collect();
        let lanes = start_lanes(data, opts, Dir::Send, watches)?;
        Ok(TcpSendComm::new(ctrl, lanes, opts.clone()))
    }
}

fn start_lanes(
    data: Vec<TcpStream>,
    opts: &TcpOptions,
    dir: Dir,
    watches: &mut Vec<LaneWatch>,
) -> Result<Option<Lanes>> {
    if data.is_empty() {
        return Ok(None);
    }
    // Bulk payloads only: the control socket's small frames keep the
    // host's default (docs/benchmarks.md).
    for s in &data {
        crate::sock::set_congestion(s, opts.congestion.as_deref());
    }
    let lanes = Lanes::start(data, opts.nthreads, dir, opts.timeout)?;
    watches.retain(|w| !w.is_dead());
    watches.push(lanes.watch());
    Ok(Some(lanes))
}

struct Pending {
    sock: TcpStream,
    buf: [u8; HELLO_BYTES],
    got: usize,
    since: Instant,
}

struct Group {
    ctrl: Option<TcpStream>,
    data: Vec<Option<TcpStream>>,
    since: Instant,
}

/// A listening endpoint. `accept` may be called any number of times.
pub struct TcpListenComm {
    listener: TcpListener,
    info: ListenInfo,
    pending: Vec<Pending>,
    groups: HashMap<u64, Group>,
    opts: TcpOptions,
    /// [`MAX_PENDING`]; smaller in tests.
    pub(crate) max_pending: usize,
}

impl std::fmt::Debug for TcpListenComm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TcpListenComm")
            .field("addr", &self.info.addr)
            .finish()
    }
}

impl TcpListenComm {
    pub(crate) fn new(listener: TcpListener, info: ListenInfo, opts: TcpOptions) -> Self {
        Self {
            listener,
            info,
            pending: Vec::new(),
            groups: HashMap::new(),
            opts,
            max_pending: MAX_PENDING,
        }
    }

    /// Sockets waiting for their hello.
    #[cfg(test)]
    pub(crate) fn pending_len(&self) -> usize {
        self.pending.len()
    }

    /// The address and nonce this listener publishes.
    pub fn info(&self) -> ListenInfo {
        self.info
    }

    /// Accepts what has arrived; `Ok(Some)` once a whole comm is here.
    pub(crate) fn accept(&mut self, watches: &mut Vec<LaneWatch>) -> Result<Option<TcpRecvComm>> {
        loop {
            match self.listener.accept() {
                Ok((sock, peer)) => {
                    if self.pending.len() >= self.max_pending.max(1) {
                        let oldest = (0..self.pending.len())
                            .min_by_key(|&i| self.pending[i].since)
                            .expect("pending is full");
                        let old = self.pending.swap_remove(oldest);
                        tracing::warn!(target: "hetccl::NET",
                            "too many connections without a hello: dropping the oldest, from {:?} (new one from {peer})",
                            old.sock.peer_addr());
                    }
                    sock.set_nonblocking(true)
                        .map_err(|e| NetError::io("O_NONBLOCK", &e))?;
                    self.pending.push(Pending {
                        sock,
                        buf: [0; HELLO_BYTES],
                        got: 0,
                        since: Instant::now(),
                    });
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e)
                    if e.kind() == ErrorKind::Interrupted
                        || e.kind() == ErrorKind::ConnectionAborted => {}
                Err(e) => return Err(NetError::io("accept", &e)),
            }
        }
        let timeout = self.opts.timeout;
        let mut i = 0;
        while i < self.pending.len() {
            let p = &mut self.pending[i];
            let r = try_read(&mut p.sock, &mut p.buf[p.got..]);
            match r {
                Ok(Some(n)) => p.got += n,
                Ok(None) if p.since.elapsed() <= timeout => {}
                Ok(None) | Err(_) => {
                    self.pending.swap_remove(i);
                    continue;
                }
            }
            if p.got < HELLO_BYTES {
                i += 1;
                continue;
            }
            let p = self.pending.swap_remove(i);
            if let Err(e) = self.admit(p) {
                tracing::warn!(target: "hetccl::NET", "rejected an incoming connection: {e}");
            }
        }
        self.groups.retain(|_, g| g.since.elapsed() <= timeout);
        let done = self
            .groups
            .iter()
            .find(|(_, g)| g.ctrl.is_some() && g.data.iter().all(Option::is_some));
        let Some(&id) = done.map(|(id, _)| id) else {
            return Ok(None);
        };
        let g = self.groups.remove(&id).expect("found above");
        let ctrl = Ctrl::new(g.ctrl.expect("complete"), self.opts.timeout)?;
        let data = g.data.into_iter().map(|s| s.expect("complete")).collect();
        let lanes = start_lanes(data, &self.opts, Dir::Recv, watches)?;
        Ok(Some(TcpRecvComm::new(ctrl, lanes, self.opts.clone())))
    }

    /// Checks a hello and files the socket under its comm.
    fn admit(&mut self, p: Pending) -> Result<()> {
        let h = decode_hello(&p.buf)?;
        // Constant-time comparison of the nonce.
        if (h.nonce ^ self.info.nonce) != 0 {
            return Err(NetError::proto("wrong nonce"));
        }
        let nsocks = usize::from(h.nsocks);
        let g = self.groups.entry(h.comm_id).or_insert_with(|| Group {
            ctrl: None,
            data: (0..nsocks).map(|_| None).collect(),
            since: Instant::now(),
        });
        if g.data.len() != nsocks {
            return Err(NetError::proto("inconsistent socket count"));
        }
        let slot = match h.role {
            SockRole::Ctrl => &mut g.ctrl,
            SockRole::Data(i) => &mut g.data[usize::from(i)],
        };
        if slot.is_some() {
            return Err(NetError::proto("duplicate socket"));
        }
        *slot = Some(p.sock);
        Ok(())
    }
}
