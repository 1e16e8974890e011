//! The verbs (InfiniBand / RoCE) transport: RC queue pairs over the RDMA
//! ports of this machine, with libibverbs loaded at run time.
//!
//! Setup: `listen` opens a TCP socket on the port's companion interface and
//! writes its address and a random nonce into the 128-byte handle (the TCP
//! transport's handle format, marked as verbs). `connect` and `accept`
//! never block: the connector writes its connection info (nonce, QPs, GID,
//! LID, PSN, MTU, its control area and rkey), the acceptor checks the nonce,
//! posts its receive slots, connects its QPs and answers with its own info.
//! The socket then stays open, so that a dead peer is noticed at once and
//! an engine's revoke and a graceful close's BYE reach the peer
//! (`setup_frame.rs`).
//! Data path and flow control: `send.rs` and `recv.rs`; wire formats:
//! `proto.rs`. See docs/rdma.md.

pub mod dev;
mod events;
pub mod ffi;
pub mod flush;
pub mod gdr;
pub mod mr;
pub mod pci;
pub mod proto;
pub mod qp;
pub mod recv;
pub mod send;
pub mod send_check;
pub mod setup_frame;
pub mod unmap;
mod wr;

use std::collections::HashMap;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::Instant;

use parking_lot::Mutex;

pub use dev::{DiscoverOpts, IbPort};
pub use qp::IbOptions;
pub use recv::IbRecvComm;
pub use send::IbSendComm;
pub use wr::CLOSE_GRACE;

use crate::error::{NetError, Result};
use crate::sock::{connect_done, random_u64, start_connect, try_read, try_write};
use crate::wire::{
    decode_handle, encode_handle, handle_token, set_handle_token, ListenInfo, HANDLE_BYTES,
};
use proto::{ConnInfo, INFO_BYTES};
use qp::{Endpoint, RegBuf};

/// Byte of the handle that marks it as a verbs handle.
const KIND_OFF: usize = 100;
const KIND_IB: u8 = b'I';
/// Most sockets waiting for their info on one listener.
const MAX_PENDING: usize = 256;

/// A listening endpoint: a TCP socket for connection setup.
pub struct IbListenComm {
    l: TcpListener,
    dev: usize,
    nonce: u64,
    pending: Vec<Incoming>,
}

struct Incoming {
    sock: TcpStream,
    buf: [u8; INFO_BYTES],
    got: usize,
    since: Instant,
    /// Once the info is read: the comm and the reply still to write.
    ready: Option<(IbRecvComm, [u8; INFO_BYTES], usize)>,
}

struct Connecting {
    sock: TcpStream,
    connected: bool,
    ep: Endpoint,
    res: (RegBuf, RegBuf),
    out: [u8; INFO_BYTES],
    sent: usize,
    reply: [u8; INFO_BYTES],
    got: usize,
    nonce: u64,
    started: Instant,
}

/// The verbs transport over a set of ports. One instance per plugin context.
pub struct IbNet {
    ports: Vec<IbPort>,
    /// The address each listener binds (the interface hetccl's TCP would use).
    ip: std::net::IpAddr,
    opts: IbOptions,
    connecting: Mutex<HashMap<u64, Connecting>>,
}

impl std::fmt::Debug for IbNet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ports: Vec<String> = self.ports.iter().map(IbPort::label).collect();
        f.debug_struct("IbNet")
            .field("ports", &ports)
            .field("opts", &self.opts)
            .finish()
    }
}

impl IbNet {
    /// A transport over `ports`, with setup sockets on `ip`.
    pub fn new(ports: Vec<IbPort>, ip: std::net::IpAddr, opts: IbOptions) -> Self {
        Self {
            ports,
            ip,
            opts,
            connecting: Mutex::new(HashMap::new()),
        }
    }

    /// The ports.
    pub fn ports(&self) -> &[IbPort] {
        &self.ports
    }

    /// The options.
    pub fn options(&self) -> &IbOptions {
        &self.opts
    }

    fn port(&self, dev: usize) -> Result<&IbPort> {
        self.ports.get(dev).ok_or_else(|| {
            NetError::InvalidArgument(format!("device {dev} (have {})", self.ports.len()))
        })
    }

    /// Listens on port `dev`; returns the listener and the handle.
    pub fn listen(&self, dev: usize) -> Result<(IbListenComm, [u8; HANDLE_BYTES])> {
        self.port(dev)?;
        let l = TcpListener::bind(SocketAddr::new(self.ip, 0))
            .map_err(|e| NetError::io(&format!("bind on {}", self.ip), &e))?;
        l.set_nonblocking(true)
            .map_err(|e| NetError::io("O_NONBLOCK", &e))?;
        let addr = l
            .local_addr()
            .map_err(|e| NetError::io("getsockname", &e))?;
        let nonce = random_u64()?;
        let mut h = [0u8; HANDLE_BYTES];
        encode_handle(&ListenInfo { addr, nonce }, &mut h);
        h[KIND_OFF] = KIND_IB;
        Ok((
            IbListenComm {
                l,
                dev,
                nonce,
                pending: Vec::new(),
            },
            h,
        ))
    }

    /// Connects to the listener of `handle` without blocking; `Ok(None)`:
    /// call again with the same handle.
    pub fn connect(
        &self,
        dev: usize,
        handle: &mut [u8; HANDLE_BYTES],
    ) -> Result<Option<IbSendComm>> {
        let port = self.port(dev)?.clone();
        if handle[KIND_OFF] != KIND_IB {
            return Err(NetError::InvalidArgument(
                "not a verbs connect handle (the peer uses another transport)".into(),
            ));
        }
        let info = decode_handle(handle)?;
        let token = handle_token(handle);
        let mut reg = self.connecting.lock();
        let mut c = match (token != 0).then(|| reg.remove(&token)).flatten() {
            Some(c) => c,
            None => {
                let ep = Endpoint::new(&port, &self.opts)?;
                let res = IbSendComm::prepare(&ep, &self.opts)?;
                let (ctrl_addr, ctrl_rkey) = IbSendComm::ctrl_of(&res.0);
                let mine = ConnInfo {
                    ctrl_addr,
                    ctrl_rkey,
                    slots: self.opts.slots as u32,
                    ..ep.info(info.nonce)
                };
                Connecting {
                    sock: start_connect(&info.addr)?,
                    connected: false,
                    ep,
                    res,
                    out: mine.encode(),
                    sent: 0,
                    reply: [0; INFO_BYTES],
                    got: 0,
                    nonce: info.nonce,
                    started: Instant::now(),
                }
            }
        };
        match self.step_connect(&mut c) {
            Ok(Some(remote)) => {
                set_handle_token(handle, 0);
                drop(reg);
                c.ep.connect(&remote, &self.opts)?;
                crate::sock::set_liveness(&c.sock, self.opts.timeout)?;
                let peer = c
                    .sock
                    .peer_addr()
                    .map(|a| a.to_string())
                    .unwrap_or_default();
                tracing::debug!(target: "hetccl::NET", "NET/IB: connected {} QP {:?} to {peer} QP {:?}", port.label(), c.ep.qpns, &remote.qpn[..remote.nqps as usize]);
                Ok(Some(IbSendComm::new(
                    c.ep,
                    c.res,
                    self.opts.clone(),
                    remote.slots,
                    c.sock,
                    peer,
                )))
            }
            Ok(None) => {
                if c.started.elapsed() > self.opts.timeout {
                    set_handle_token(handle, 0);
                    return Err(NetError::Timeout("NET/IB: connect did not complete".into()));
                }
                let t = if token != 0 && !reg.contains_key(&token) {
                    token
                } else {
                    nonzero()?
                };
                reg.insert(t, c);
                set_handle_token(handle, t);
                Ok(None)
            }
            Err(e) => {
                set_handle_token(handle, 0);
                Err(e)
            }
        }
    }

    fn step_connect(&self, c: &mut Connecting) -> Result<Option<ConnInfo>> {
        if !c.connected {
            if !connect_done(&c.sock)? {
                return Ok(None);
            }
            c.connected = true;
        }
        while c.sent < INFO_BYTES {
            match try_write(&mut c.sock, &c.out[c.sent..])? {
                Some(n) => c.sent += n,
                None => return Ok(None),
            }
        }
        while c.got < INFO_BYTES {
            match try_read(&mut c.sock, &mut c.reply[c.got..])? {
                Some(n) => c.got += n,
                None => return Ok(None),
            }
        }
        let remote = ConnInfo::decode(&c.reply)?;
        if remote.nonce != c.nonce {
            return Err(NetError::proto("verbs accept reply with the wrong nonce"));
        }
        Ok(Some(remote))
    }

    /// Accepts one connection without blocking; `Ok(None)`: call again.
    pub fn accept(&self, l: &mut IbListenComm) -> Result<Option<IbRecvComm>> {
        let port = self.port(l.dev)?.clone();
        loop {
            match l.l.accept() {
                Ok((s, _)) => {
                    s.set_nonblocking(true)
                        .map_err(|e| NetError::io("O_NONBLOCK", &e))?;
                    if l.pending.len() >= MAX_PENDING {
                        l.pending.remove(0);
                    }
                    l.pending.push(Incoming {
                        sock: s,
                        buf: [0; INFO_BYTES],
                        got: 0,
                        since: Instant::now(),
                        ready: None,
                    });
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(NetError::io("accept", &e)),
            }
        }
        let mut i = 0;
        while i < l.pending.len() {
            match self.step_accept(&port, l.nonce, &mut l.pending[i]) {
                Ok(true) => {
                    let inc = l.pending.remove(i);
                    let (comm, _, _) = inc.ready.expect("ready");
                    return Ok(Some(comm));
                }
                Ok(false) if l.pending[i].since.elapsed() <= self.opts.timeout => i += 1,
                Ok(false) => {
                    l.pending.remove(i);
                }
                Err(e) => {
                    tracing::debug!(target: "hetccl::NET", "NET/IB: dropped an incoming setup connection: {e}");
                    l.pending.remove(i);
                }
            }
        }
        Ok(None)
    }

    fn step_accept(&self, port: &IbPort, nonce: u64, inc: &mut Incoming) -> Result<bool> {
        if inc.ready.is_none() {
            while inc.got < INFO_BYTES {
                match try_read(&mut inc.sock, &mut inc.buf[inc.got..])? {
                    Some(n) => inc.got += n,
                    None => return Ok(false),
                }
            }
            let remote = ConnInfo::decode(&inc.buf)?;
            if remote.nonce != nonce {
                return Err(NetError::proto(
                    "verbs connection info with the wrong nonce",
                ));
            }
            if remote.ctrl_addr == 0 {
                return Err(NetError::proto(
                    "verbs connection info without a control area",
                ));
            }
            let opts = IbOptions {
                qps: remote.nqps as usize,
                ..self.opts.clone()
            };
            let ep = Endpoint::new(port, &opts)?;
            let slots = IbRecvComm::prepare(&ep, &opts)?;
            ep.connect(&remote, &opts)?;
            let reply = ConnInfo {
                slots: opts.slots as u32,
                ..ep.info(nonce)
            }
            .encode();
            crate::sock::set_liveness(&inc.sock, opts.timeout)?;
            let peer = inc
                .sock
                .peer_addr()
                .map(|a| a.to_string())
                .unwrap_or_default();
            let sock = inc.sock.try_clone().map_err(|e| NetError::io("dup", &e))?;
            inc.ready = Some((
                IbRecvComm::new(ep, slots, opts, remote, sock, peer),
                reply,
                0,
            ));
        }
        let (_, reply, sent) = inc.ready.as_mut().expect("set");
        while *sent < INFO_BYTES {
            match try_write(&mut inc.sock, &reply[*sent..])? {
                Some(n) => *sent += n,
                None => return Ok(false),
            }
        }
        Ok(true)
    }

    /// Drops pending connects.
    pub fn shutdown(&self) {
        self.connecting.lock().clear();
    }
}

#[cfg(test)]
mod close_tests;
#[cfg(test)]
mod tests;

fn nonzero() -> Result<u64> {
    loop {
        let t = random_u64()?;
        if t != 0 {
            return Ok(t);
        }
    }
}

/// Memory the application registered (`ncclCommRegister`, `ncclMemAlloc`):
/// held registered on every opened device until [`unregister_user`].
static USER: Mutex<Vec<UserRange>> = Mutex::new(Vec::new());
/// Start, length, and the registrations held for it.
type UserRange = (usize, usize, Vec<std::sync::Arc<mr::Mr>>);

/// Registers host memory the application hands over for communication on
/// every device opened so far (none: nothing to do; verbs then takes such
/// buffers through bounce chunks). Errors are logged, never returned: the
/// memory still works unregistered.
pub fn register_user(addr: usize, len: usize) {
    let ports = dev::discovered();
    if ports.is_empty() || len == 0 {
        return;
    }
    let mut held = Vec::new();
    let mut seen: Vec<*const dev::DevCtx> = Vec::new();
    for p in ports {
        let d = std::sync::Arc::as_ptr(&p.dev);
        if seen.contains(&d) {
            continue;
        }
        seen.push(d);
        // SAFETY: the application passes memory it owns and keeps mapped
        // until it deregisters or frees it.
        match unsafe { p.dev.regs.lock().get(p.dev.pd, addr, len, true) } {
            Ok(m) => held.push(m),
            Err(e) => {
                tracing::info!(target: "hetccl::NET", "NET/IB: cannot register {addr:#x}+{len} on {}: {e}", p.dev.name)
            }
        }
    }
    USER.lock().push((addr, len, held));
}

/// Holds registrations made elsewhere for `addr..addr+len` (the engine's
/// GPUDirect registrations of device memory) until [`unregister_user`].
pub fn hold_user(addr: usize, len: usize, mrs: Vec<std::sync::Arc<mr::Mr>>) {
    USER.lock().push((addr, len, mrs));
}

/// Drops what [`register_user`] held for `addr..addr+len` and removes the
/// range from every cache (the memory is about to be freed).
pub fn unregister_user(addr: usize, len: usize) {
    USER.lock().retain(|(a, l, _)| !(*a == addr && *l == len));
    for p in dev::discovered() {
        p.dev.regs.lock().invalidate(addr, len);
    }
}

/// The registration of `addr..addr+len` on `port`'s device, if the range
/// is in its cache (the engine's links look up every buffer; the first hit
/// of a process is logged at INFO). Registrations someone holds are never
/// evicted ([`mr::RegCache`]), so a range in use is always found.
pub fn find_registered(port: &IbPort, addr: usize, len: usize) -> Option<std::sync::Arc<mr::Mr>> {
    let m = port.dev.regs.lock().find(addr, len)?;
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        tracing::info!(target: "hetccl::NET",
            "NET/IB: {}: registered memory is sent and received in place", port.label())
    });
    Some(m)
}

/// Drops `port`'s device's cached registrations overlapping
/// `addr..addr+len` (the memory there is no longer what they registered);
/// returns how many.
pub fn invalidate(port: &IbPort, addr: usize, len: usize) -> usize {
    port.dev.regs.lock().invalidate(addr, len)
}

/// The ports this process may use: none when libibverbs is missing (one
/// INFO line says so) or when no port is active.
pub fn usable_ports(opts: &DiscoverOpts) -> Vec<IbPort> {
    match dev::ports(opts) {
        Ok(p) => p.to_vec(),
        Err(e) => {
            static ONCE: std::sync::Once = std::sync::Once::new();
            ONCE.call_once(
                || tracing::info!(target: "hetccl::NET", "NET/IB: not using verbs: {e}"),
            );
            Vec::new()
        }
    }
}
