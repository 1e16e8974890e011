//! The TCP transport: a control socket plus N data sockets per comm.
//!
//! See `docs/net-plugin.md` for the wire protocol and the measurements
//! behind the defaults.

mod connect;
mod ctrl;
mod lanes;
mod linger;
mod recv;
mod send;

use std::collections::HashMap;
use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;

pub use connect::TcpListenComm;
pub use linger::Lingered;
pub use recv::{RecvBuf, RecvPosted, RecvRequest, RecvSizes, TcpRecvComm};
pub use send::{EagerSend, SendRequest, TcpSendComm};

use crate::error::{NetError, Result};
use crate::iface::NetDevice;
use crate::sock::random_u64;
use crate::wire::{
    decode_handle, encode_handle, handle_token, set_handle_token, ListenInfo, HANDLE_BYTES,
    MAX_SOCKS,
};
use connect::Connecting;
use lanes::LaneWatch;

/// Most buffers in one grouped receive (`maxRecvs`).
pub const MAX_RECVS: usize = 8;
/// Most requests outstanding per comm: `NCCL_NET_MAX_REQUESTS` × `maxRecvs`.
pub const MAX_REQUESTS: usize = 32 * MAX_RECVS;
/// The largest payload [`TcpSendComm::isend_eager`] sends inline.
pub const MAX_EAGER: usize = ctrl::MAX_INLINE;
/// Helper threads per comm when `NCCL_SOCKET_NTHREADS` is unset (see docs/net-plugin.md).
pub const AUTO_NTHREADS: usize = 4;
/// Sockets per helper thread when `NCCL_NSOCKS_PERTHREAD` is unset.
pub const AUTO_NSOCKS_PERTHREAD: usize = 1;

/// Tuning of the TCP transport.
#[derive(Debug, Clone, PartialEq)]
pub struct TcpOptions {
    /// Data sockets per comm (0: payloads go on the control socket).
    pub nsocks: usize,
    /// Helper threads per comm serving the data sockets.
    pub nthreads: usize,
    /// Payloads up to this size travel inline with their header.
    pub inline_max: usize,
    /// Smallest task on a data socket; smaller payloads use the control socket.
    pub min_task_size: usize,
    /// How long a transfer may make no progress before it fails.
    pub timeout: Duration,
    /// The data sockets' TCP congestion control (`HETCCL_SOCKET_CC`);
    /// `None` keeps the host's default, which control sockets always do.
    pub congestion: Option<String>,
}

impl Default for TcpOptions {
    fn default() -> Self {
        Self {
            nsocks: AUTO_NTHREADS * AUTO_NSOCKS_PERTHREAD,
            nthreads: AUTO_NTHREADS,
            inline_max: 128,
            min_task_size: 64 << 10,
            timeout: Duration::from_secs(300),
            congestion: Some(hetccl_core::config::DEFAULT_SOCKET_CC.to_string()),
        }
    }
}

impl TcpOptions {
    /// The options a configuration asks for (`NCCL_SOCKET_NTHREADS`,
    /// `NCCL_NSOCKS_PERTHREAD`, `NCCL_SOCKET_INLINE`,
    /// `NCCL_SOCKET_MIN_TASKSIZE`, `HETCCL_SOCKET_CC`, `HETCCL_TIMEOUT_S`).
    ///
    /// With `NCCL_SOCKET_NTHREADS` ≥ 1 a comm has threads × sockets-per-thread
    /// data sockets served by that many helper threads (as NCCL's Socket
    /// transport). With 0 threads the caller's thread drives
    /// `NCCL_NSOCKS_PERTHREAD` data sockets itself (0: everything on the
    /// control socket). Unset values take the measured defaults
    /// [`AUTO_NTHREADS`] and [`AUTO_NSOCKS_PERTHREAD`].
    pub fn from_config(s: &hetccl_core::config::Config) -> Self {
        Self::from_config_or(s, AUTO_NTHREADS, AUTO_NSOCKS_PERTHREAD)
    }

    /// As [`TcpOptions::from_config`], with `nthreads` and `per_thread`
    /// standing for unset values (a user of the transport that has its
    /// own measured defaults).
    pub fn from_config_or(
        s: &hetccl_core::config::Config,
        nthreads: usize,
        per_thread: usize,
    ) -> Self {
        let nthreads = s
            .socket_nthreads
            .filter(|&n| n >= 0)
            .map_or(nthreads, |n| n as usize)
            .min(16);
        let per = s
            .nsocks_perthread
            .filter(|&n| n >= 0)
            .map_or(per_thread, |n| n as usize);
        let nsocks = if nthreads == 0 { per } else { nthreads * per }.min(MAX_SOCKS);
        Self {
            nsocks,
            nthreads: nthreads.min(nsocks),
            inline_max: s.socket_inline.min(ctrl::MAX_INLINE),
            min_task_size: s.socket_min_task_size.max(4096),
            timeout: Duration::from_secs_f64(s.timeout_s.clamp(0.001, 1e9)),
            congestion: s.socket_cc.clone(),
        }
    }
}

/// The TCP transport over a set of devices. One instance per plugin context.
pub struct TcpNet {
    devices: Arc<Vec<NetDevice>>,
    opts: TcpOptions,
    connecting: Mutex<HashMap<u64, Connecting>>,
    watches: Mutex<Vec<LaneWatch>>,
}

impl std::fmt::Debug for TcpNet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TcpNet")
            .field("devices", &self.devices)
            .field("opts", &self.opts)
            .finish()
    }
}

impl TcpNet {
    /// A transport over `devices` with `opts`.
    pub fn new(devices: Arc<Vec<NetDevice>>, opts: TcpOptions) -> Self {
        Self {
            devices,
            opts,
            connecting: Mutex::new(HashMap::new()),
            watches: Mutex::new(Vec::new()),
        }
    }

    /// The devices.
    pub fn devices(&self) -> &[NetDevice] {
        &self.devices
    }

    /// The options.
    pub fn options(&self) -> &TcpOptions {
        &self.opts
    }

    fn device(&self, dev: usize) -> Result<&NetDevice> {
        self.devices.get(dev).ok_or_else(|| {
            NetError::InvalidArgument(format!("device {dev} (have {})", self.devices.len()))
        })
    }

    /// Listens on device `dev`; returns the listener and the handle for the peer.
    pub fn listen(&self, dev: usize) -> Result<(TcpListenComm, [u8; HANDLE_BYTES])> {
        let d = self.device(dev)?;
        let l = TcpListener::bind(SocketAddr::new(d.addr, 0))
            .map_err(|e| NetError::io(&format!("bind on {} ({})", d.name, d.addr), &e))?;
        l.set_nonblocking(true)
            .map_err(|e| NetError::io("O_NONBLOCK", &e))?;
        let addr = l
            .local_addr()
            .map_err(|e| NetError::io("getsockname", &e))?;
        let info = ListenInfo {
            addr,
            nonce: random_u64()?,
        };
        let mut handle = [0u8; HANDLE_BYTES];
        encode_handle(&info, &mut handle);
        tracing::debug!(target: "hetccl::NET", "listening on {addr} ({})", d.name);
        Ok((TcpListenComm::new(l, info, self.opts.clone()), handle))
    }

    /// Connects to the listener described by `handle`, without blocking:
    /// `Ok(None)` means "call again with the same handle".
    pub fn connect(
        &self,
        dev: usize,
        handle: &mut [u8; HANDLE_BYTES],
    ) -> Result<Option<TcpSendComm>> {
        self.device(dev)?;
        let info = decode_handle(handle)?;
        let token = handle_token(handle);
        let mut reg = self.connecting.lock();
        let resumed = if token != 0 { reg.remove(&token) } else { None };
        let mut c = match resumed {
            Some(c) => c,
            None => Connecting::start(&info, self.opts.nsocks)?,
        };
        match c.step(self.opts.timeout) {
            Ok(true) => {
                set_handle_token(handle, 0);
                drop(reg);
                let comm = c.finish(&self.opts, &mut self.watches.lock())?;
                tracing::debug!(target: "hetccl::NET", "connected to {} with {} data sockets", info.addr, comm.nsocks());
                Ok(Some(comm))
            }
            Ok(false) => {
                let token = if token != 0 && !reg.contains_key(&token) {
                    token
                } else {
                    nonzero_random()?
                };
                reg.insert(token, c);
                set_handle_token(handle, token);
                Ok(None)
            }
            Err(e) => {
                set_handle_token(handle, 0);
                Err(e)
            }
        }
    }

    /// Accepts on `listen`, without blocking: `Ok(None)` means "call again".
    pub fn accept(&self, listen: &mut TcpListenComm) -> Result<Option<TcpRecvComm>> {
        listen.accept(&mut self.watches.lock())
    }

    /// Drops pending connects and stops the helper threads of every comm
    /// made through this transport that is still open. Those comms then fail.
    pub fn shutdown(&self) {
        self.connecting.lock().clear();
        let watches = std::mem::take(&mut *self.watches.lock());
        for w in watches {
            w.stop();
        }
    }
}

impl Drop for TcpNet {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Logs what a graceful close saw.
fn log_linger(side: &str, r: &Lingered) {
    if r.unacked > 0 {
        tracing::warn!(target: "hetccl::NET",
            "{side} comm closed with {} socket(s) holding unacknowledged bytes at the deadline", r.unacked);
    }
    if r.discarded > 0 {
        tracing::debug!(target: "hetccl::NET",
            "{side} comm: dropped {} bytes that arrived after the last request", r.discarded);
    }
}

fn nonzero_random() -> Result<u64> {
    loop {
        let t = random_u64()?;
        if t != 0 {
            return Ok(t);
        }
    }
}

#[cfg(test)]
mod tests;
