//! The engine's TCP links over `nccl-net-plugin`'s transport (the same code that
//! serves NVIDIA's NCCL as `ncclNetPlugin_v*`): several data sockets per
//! connection for large messages, messages up to 64 KiB inline with their
//! header (eager), nonce-checked accepts, and a bounded timeout.
//!
//! One send comm and one receive comm join each ordered pair of ranks; the
//! three link channels are told apart by tag (the transport matches a
//! message with the oldest receive of its tag). Messages are whole: a send
//! posts the step's entire range, and a receive posts a staging buffer of the
//! step's length, which it hands to the executor once filled. Each direction
//! has up to two messages in flight: the executor's current one and the
//! next, posted ahead (`exec::ahead`), so that the next message's header and
//! the receiver's CTS cross while the current one streams. Messages of up
//! to [`EAGER_MAX`] bytes (collective steps and packs of coalesced
//! point-to-point messages, `transport::coalesce`) go out eagerly, inline,
//! without waiting for the receiver's CTS.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use nccl_net_plugin::tcp::{
    EagerSend, RecvBuf, RecvPosted, RecvRequest, TcpNet, TcpRecvComm, TcpSendComm,
};
use nccl_net_plugin::NetError;
use parking_lot::Mutex;

use super::window::Window;
use super::{Conn, RecvLink, SendLink, WaitSource};
use crate::error::{Error, Result};

fn closed() -> Error {
    Error::Remote("tcp link closed (abort)".into())
}

/// What the transport's size-mismatch errors say (`tcp/recv.rs`: a message
/// larger than the posted receive; `tcp/send.rs`: a message the receiver
/// rejected for that reason). Both are `NetError::InvalidUsage`.
const TOO_LARGE: &str = "is larger than the";

/// A message whose size differs from the one the plan expects: the ranks
/// called different operations (`ncclInvalidUsage`). Plans are symmetric,
/// so ranks that pass the same call exchange messages of the same sizes.
fn mismatched(what: String) -> Error {
    Error::usage(format!(
        "{what}: the ranks' calls are mismatched (every rank must pass the same kind, count, \
         datatype, op and root)"
    ))
}

fn net_err(e: NetError) -> Error {
    match e {
        NetError::Revoked(by) => Error::Revoked(by as usize),
        NetError::Timeout(m) => Error::Timeout(format!("tcp: {m}").into()),
        NetError::InvalidUsage(m) if m.contains(TOO_LARGE) => mismatched(format!("tcp: {m}")),
        NetError::InvalidArgument(m) | NetError::InvalidUsage(m) | NetError::Internal(m) => {
            Error::Internal(format!("tcp: {m}").into())
        }
        other => Error::Remote(format!("tcp: {other}").into()),
    }
}

/// A message of `n` bytes where the plan expects `want`, in `elem`-byte
/// elements: a different size means the ranks' calls differ.
fn check_size(n: usize, want: usize, elem: usize) -> Result<usize> {
    if n != want || n % elem != 0 {
        return Err(mismatched(format!(
            "tcp: received a message of {n} bytes where {want} were expected"
        )));
    }
    Ok(n)
}

/// A posted receive: in flight, or complete at once with its size.
#[derive(Debug, Clone, Copy)]
enum Got {
    InFlight(RecvRequest),
    Done(usize),
}

/// The sending half of one channel.
struct NetSend {
    comm: Arc<TcpSendComm>,
    /// The transport context; its data lanes live as long as it does.
    _net: Arc<TcpNet>,
    closed: Arc<AtomicBool>,
    tag: i32,
    /// Posted sends: the current one and one posted ahead, so that the
    /// next message's MSG frame and CTS cross while the current one
    /// streams. [`EagerSend::Sent`]: written whole at once, complete when
    /// the executor comes to it.
    inflight: Mutex<Window<EagerSend>>,
}

/// The receiving half of one channel.
struct NetRecv {
    comm: Arc<TcpRecvComm>,
    _net: Arc<TcpNet>,
    closed: Arc<AtomicBool>,
    tag: i32,
    /// The receive in flight and its staging buffer.
    st: Mutex<RecvState>,
}

#[derive(Default)]
struct RecvState {
    /// Posted receives, into the staging buffer or the caller's range.
    reqs: Window<Got>,
    stage: Vec<u8>,
}

impl NetRecv {
    /// The oldest posted receive, which must be into `ptr`/`len`
    /// ([`Window::head`]); posts it when none is. `None`: the transport
    /// cannot take one now.
    fn post(&self, st: &mut RecvState, ptr: *mut u8, len: usize) -> Result<Option<Got>> {
        match st.reqs.head("tcp: a receive", ptr as usize, len)? {
            Some(got) => Ok(Some(got)),
            None => self.start(&mut st.reqs, ptr, len),
        }
    }

    /// Posts a receive of `len` bytes into `ptr` behind those in flight.
    fn start(&self, reqs: &mut Window<Got>, ptr: *mut u8, len: usize) -> Result<Option<Got>> {
        let buf = RecvBuf {
            ptr,
            cap: len,
            tag: self.tag,
        };
        // SAFETY: `ptr` is the link's staging buffer, neither moved nor
        // resized while a receive is in flight, or the caller's range,
        // which stays valid until the operation completes (see
        // `RecvLink::try_recv_into` and `RecvLink::post_ahead`); the
        // sockets are driven only from this link's calls.
        let got = match unsafe { self.comm.irecv_now(&[buf]) }.map_err(net_err)? {
            Some(RecvPosted::Posted(req)) => Got::InFlight(req),
            Some(RecvPosted::Done(sizes)) => Got::Done(sizes.first().copied().unwrap_or(0)),
            None => return Ok(None),
        };
        reqs.push(ptr as usize, len, got);
        Ok(Some(got))
    }

    /// The size of the message `got` (the oldest posted receive) brought,
    /// once it is done: checked against the `want` bytes the plan expects,
    /// in `elem`-byte elements.
    fn complete(
        &self,
        st: &mut RecvState,
        got: Got,
        want: usize,
        elem: usize,
    ) -> Result<Option<usize>> {
        let Some(n) = self.arrived(st, got)? else {
            return Ok(None);
        };
        check_size(n, want, elem).map(Some)
    }

    /// The received length of `got`, the oldest posted receive, once it
    /// is done (it then leaves the queue).
    fn arrived(&self, st: &mut RecvState, got: Got) -> Result<Option<usize>> {
        let n = match got {
            Got::Done(n) => n,
            Got::InFlight(req) => match self.comm.test(req).map_err(net_err)? {
                Some(sizes) => sizes.first().copied().unwrap_or(0),
                None => return Ok(None),
            },
        };
        st.reqs.pop();
        Ok(Some(n))
    }
}

impl std::fmt::Debug for NetSend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "NetSend(tag {})", self.tag)
    }
}

impl std::fmt::Debug for NetRecv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "NetRecv(tag {})", self.tag)
    }
}

impl NetSend {
    /// Posts `src` behind the sends in flight, eagerly (inline up to the
    /// transport's `MAX_EAGER`) or not; `None` when the transport cannot
    /// take it now.
    fn start(
        &self,
        q: &mut Window<EagerSend>,
        src: &[u8],
        eager: bool,
    ) -> Result<Option<EagerSend>> {
        // SAFETY: the executor passes the same unfinished range on every
        // call until the whole of it is reported sent (a range posted
        // ahead is ready and unchanged until then), and the user's buffer
        // stays valid until the operation completes.
        let r = unsafe {
            if eager {
                self.comm.isend_eager_now(src.as_ptr(), src.len(), self.tag)
            } else {
                self.comm
                    .isend(src.as_ptr(), src.len(), self.tag)
                    .map(|q| q.map(EagerSend::Posted))
            }
        };
        let sent = r.map_err(net_err)?;
        if let Some(sent) = sent {
            q.push(src.as_ptr() as usize, src.len(), sent);
        }
        Ok(sent)
    }

    /// `try_send`, eagerly or not (see [`NetSend::start`]).
    fn send(&self, src: &[u8], eager: bool) -> Result<usize> {
        if self.closed.load(Ordering::Acquire) {
            return Err(closed());
        }
        if src.is_empty() {
            return Ok(0);
        }
        let mut q = self.inflight.lock();
        let sent = match q.head("tcp: a send", src.as_ptr() as usize, src.len())? {
            Some(sent) => sent,
            None => match self.start(&mut q, src, eager)? {
                Some(sent) => sent,
                None => return Ok(0),
            },
        };
        if let EagerSend::Posted(req) = sent {
            if self.comm.test(req).map_err(net_err)?.is_none() {
                return Ok(0);
            }
        }
        q.pop();
        Ok(src.len())
    }
}

/// Collective messages up to this size go eagerly, inline with their header
/// (the transport's largest inline payload, OpenMPI's TCP eager limit too):
/// one write and no CTS round trip, for a copy on the receiver. Larger ones
/// wait for the receiver's CTS and go on the data sockets. A receiver holds a
/// sender that runs ahead back through TCP flow control (`tcp/recv.rs`).
pub(crate) const EAGER_MAX: usize = nccl_net_plugin::tcp::MAX_EAGER;

impl SendLink for NetSend {
    fn try_send(&self, src: &[u8]) -> Result<usize> {
        self.send(src, src.len() <= EAGER_MAX)
    }
    fn try_send_eager(&self, src: &[u8]) -> Result<usize> {
        self.send(src, true)
    }
    fn post_ahead(&self, src: &[u8]) -> Result<bool> {
        if self.closed.load(Ordering::Acquire) {
            return Err(closed());
        }
        let mut q = self.inflight.lock();
        if src.is_empty() || !q.room_ahead() {
            return Ok(false);
        }
        Ok(self.start(&mut q, src, src.len() <= EAGER_MAX)?.is_some())
    }
    fn wait_source(&self) -> WaitSource {
        WaitSource::Fds
    }
    fn wait_fds(&self, out: &mut Vec<libc::pollfd>) -> bool {
        // Nothing in flight: the transport refused the send for now (too
        // many requests), which no socket event announces.
        !self.inflight.lock().is_empty() && self.comm.poll_fds(out)
    }
    fn close(&self) {
        // The peer sees the sockets close when the connection is dropped.
        self.closed.store(true, Ordering::Release);
    }
    fn finish(&self, deadline: std::time::Instant) {
        // Every channel of the pair shares the comm; the first call closes
        // it gracefully, the others find it closed.
        self.comm.finish(deadline);
    }
    fn revoke(&self, by: usize) {
        self.comm.revoke(u32::try_from(by).unwrap_or(u32::MAX));
        self.closed.store(true, Ordering::Release);
    }
}

impl RecvLink for NetRecv {
    fn try_recv_with(&self, max: usize, elem: usize, f: &mut dyn FnMut(&[u8])) -> Result<usize> {
        if self.closed.load(Ordering::Acquire) {
            return Err(closed());
        }
        if max == 0 {
            return Ok(0);
        }
        let mut st = self.st.lock();
        let st = &mut *st;
        if st.reqs.is_empty() && st.stage.len() < max {
            st.stage.resize(max, 0);
        }
        let stage = st.stage.as_mut_ptr();
        let Some(got) = self.post(st, stage, max)? else {
            return Ok(0);
        };
        let Some(n) = self.complete(st, got, max, elem)? else {
            return Ok(0);
        };
        f(&st.stage[..n]);
        Ok(n)
    }
    fn try_recv_into(&self, dst: &mut [u8]) -> Result<usize> {
        if self.closed.load(Ordering::Acquire) {
            return Err(closed());
        }
        if dst.is_empty() {
            return Ok(0);
        }
        let mut st = self.st.lock();
        let st = &mut *st;
        let Some(got) = self.post(st, dst.as_mut_ptr(), dst.len())? else {
            return Ok(0);
        };
        Ok(self.complete(st, got, dst.len(), 1)?.unwrap_or(0))
    }
    fn try_recv_first(&self, dst: &mut [u8], _expect: usize) -> Result<(usize, bool)> {
        if self.closed.load(Ordering::Acquire) {
            return Err(closed());
        }
        let mut st = self.st.lock();
        let st = &mut *st;
        let Some(got) = self.post(st, dst.as_mut_ptr(), dst.len())? else {
            return Ok((0, false));
        };
        Ok(self.arrived(st, got)?.map_or((0, false), |n| (n, true)))
    }
    fn post_ahead(&self, dst: &mut [u8]) -> Result<bool> {
        if self.closed.load(Ordering::Acquire) {
            return Err(closed());
        }
        let mut st = self.st.lock();
        if dst.is_empty() || !st.reqs.room_ahead() {
            return Ok(false);
        }
        Ok(self
            .start(&mut st.reqs, dst.as_mut_ptr(), dst.len())?
            .is_some())
    }
    fn wait_source(&self) -> WaitSource {
        WaitSource::Fds
    }
    fn wait_fds(&self, out: &mut Vec<libc::pollfd>) -> bool {
        !self.st.lock().reqs.is_empty() && self.comm.poll_fds(out)
    }
    fn close(&self) {
        // The peer sees the sockets close when the connection is dropped.
        self.closed.store(true, Ordering::Release);
    }
    fn finish(&self, deadline: std::time::Instant) {
        self.comm.finish(deadline);
    }
    fn revoke(&self, by: usize) {
        self.comm.revoke(u32::try_from(by).unwrap_or(u32::MAX));
        self.closed.store(true, Ordering::Release);
    }
}

/// What TCP links take from the communicator's settings.
#[derive(Debug, Clone)]
pub struct NetParams {
    /// The interface filter (`HETCCL_`/`NCCL_SOCKET_IFNAME`).
    pub ifname: Option<String>,
    /// `NCCL_SOCKET_FAMILY`.
    pub family: Option<hetccl_core::config::AddrFamily>,
    /// The transport's options, as `comm::settings` chose them: the
    /// engine drives the sockets from the calling thread, so they name no
    /// helper threads (ranks may outnumber cores).
    pub tcp: nccl_net_plugin::tcp::TcpOptions,
}

/// The `nchan` channels of one peer connection, over one send comm and one
/// receive comm of `net`.
pub fn connect(net: &Arc<TcpNet>, send: TcpSendComm, recv: TcpRecvComm, nchan: usize) -> Vec<Conn> {
    let (s, r) = (Arc::new(send), Arc::new(recv));
    let closed = Arc::new(AtomicBool::new(false));
    (0..nchan)
        .map(|c| Conn {
            tx: Box::new(NetSend {
                comm: s.clone(),
                _net: net.clone(),
                closed: closed.clone(),
                tag: c as i32,
                inflight: Mutex::new(Window::default()),
            }),
            rx: Box::new(NetRecv {
                comm: r.clone(),
                _net: net.clone(),
                closed: closed.clone(),
                tag: c as i32,
                st: Mutex::new(RecvState::default()),
            }),
            transport: super::TransportKind::Tcp,
        })
        .collect()
}

/// Sets up TCP links to `peers` (ranks on other nodes, or every rank when shm
/// is off): each rank listens once per peer, the 128-byte handles travel
/// through the authenticated bootstrap, then connects and accepts are polled
/// from this thread until all are up. Every rank must call this (it runs a
/// bootstrap all-gather), with or without peers.
pub fn setup(
    bs: &mut crate::bootstrap::Bootstrap,
    peers: &[usize],
    nchan: usize,
    params: &NetParams,
) -> Result<Vec<(usize, Vec<Conn>)>> {
    use nccl_net_plugin::wire::HANDLE_BYTES;
    let n = bs.nranks();
    let rank = bs.rank;
    let mut listens: Vec<Option<nccl_net_plugin::tcp::TcpListenComm>> =
        (0..n).map(|_| None).collect();
    let mut blob = vec![0u8; n * HANDLE_BYTES];
    let net = if peers.is_empty() {
        None
    } else {
        let devs = nccl_net_plugin::iface::discover(params.ifname.as_deref(), params.family);
        if devs.is_empty() {
            return Err(Error::System(
                "no usable network interface for TCP links".into(),
            ));
        }
        let net = Arc::new(TcpNet::new(Arc::new(devs), params.tcp.clone()));
        for &p in peers {
            let (l, h) = net.listen(0).map_err(net_err)?;
            blob[p * HANDLE_BYTES..(p + 1) * HANDLE_BYTES].copy_from_slice(&h);
            listens[p] = Some(l);
        }
        Some(net)
    };
    let all = bs.allgather(&blob, n * HANDLE_BYTES)?;
    let Some(net) = net else {
        return Ok(Vec::new());
    };
    let mut handles: Vec<[u8; HANDLE_BYTES]> = Vec::with_capacity(peers.len());
    for &p in peers {
        let theirs = all[p]
            .get(rank * HANDLE_BYTES..(rank + 1) * HANDLE_BYTES)
            .ok_or_else(|| Error::Remote(format!("rank {p} sent no TCP handles").into()))?;
        handles.push(theirs.try_into().expect("sized"));
    }
    let mut sends: Vec<Option<TcpSendComm>> = peers.iter().map(|_| None).collect();
    let mut recvs: Vec<Option<TcpRecvComm>> = peers.iter().map(|_| None).collect();
    let deadline = bs.params().deadline();
    loop {
        let mut pending = false;
        for (i, &p) in peers.iter().enumerate() {
            if sends[i].is_none() {
                sends[i] = net.connect(0, &mut handles[i]).map_err(net_err)?;
                pending |= sends[i].is_none();
            }
            if recvs[i].is_none() {
                let l = listens[p].as_mut().expect("listening");
                recvs[i] = net.accept(l).map_err(net_err)?;
                pending |= recvs[i].is_none();
            }
        }
        if !pending {
            break;
        }
        if std::time::Instant::now() >= deadline {
            return Err(Error::Timeout(
                "TCP links were not all connected in time".into(),
            ));
        }
        std::thread::sleep(std::time::Duration::from_micros(200));
    }
    Ok(peers
        .iter()
        .zip(sends.into_iter().zip(recvs))
        .map(|(&p, (s, r))| {
            (
                p,
                connect(&net, s.expect("connected"), r.expect("accepted"), nchan),
            )
        })
        .collect())
}

/// Two connected ends of `nchan` channels over loopback (tests and
/// benchmarks).
pub fn loopback_pair(nchan: usize) -> Result<(Vec<Conn>, Vec<Conn>)> {
    use nccl_net_plugin::iface::NetDevice;
    use nccl_net_plugin::tcp::TcpOptions;
    let dev = NetDevice {
        name: "lo".into(),
        addr: std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST),
        speed_mbps: 10_000,
        pci_path: None,
        loopback: true,
    };
    // The transport's defaults, driven from the calling thread.
    let opts = TcpOptions {
        nthreads: 0,
        ..TcpOptions::default()
    };
    let net = Arc::new(TcpNet::new(Arc::new(vec![dev]), opts));
    let (mut la, mut ha) = net.listen(0).map_err(net_err)?;
    let (mut lb, mut hb) = net.listen(0).map_err(net_err)?;
    let (mut sa, mut ra, mut sb, mut rb) = (None, None, None, None);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while sa.is_none() || ra.is_none() || sb.is_none() || rb.is_none() {
        if sa.is_none() {
            sa = net.connect(0, &mut hb).map_err(net_err)?;
        }
        if sb.is_none() {
            sb = net.connect(0, &mut ha).map_err(net_err)?;
        }
        if ra.is_none() {
            ra = net.accept(&mut la).map_err(net_err)?;
        }
        if rb.is_none() {
            rb = net.accept(&mut lb).map_err(net_err)?;
        }
        if std::time::Instant::now() > deadline {
            return Err(Error::Timeout("loopback pair".into()));
        }
    }
    Ok((
        connect(&net, sa.expect("set"), ra.expect("set"), nchan),
        connect(&net, sb.expect("set"), rb.expect("set"), nchan),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    /// Drives a send of `send` bytes from `a` and a receive of `want` bytes
    /// at `b` until both ended; the receive's and the send's results.
    fn exchange(a: &Conn, b: &Conn, send: usize, want: usize) -> (Result<()>, Result<()>) {
        let msg = vec![7u8; send];
        let mut dst = vec![0u8; want];
        let (mut sent, mut got) = (None, None);
        let deadline = Instant::now() + Duration::from_secs(30);
        while sent.is_none() || got.is_none() {
            if sent.is_none() {
                match a.tx.try_send(&msg) {
                    Ok(n) if n == send => sent = Some(Ok(())),
                    Ok(_) => {}
                    Err(e) => sent = Some(Err(e)),
                }
            }
            if got.is_none() {
                match b.rx.try_recv_into(&mut dst) {
                    Ok(n) if n == want => got = Some(Ok(())),
                    Ok(_) => {}
                    Err(e) => got = Some(Err(e)),
                }
            }
            assert!(Instant::now() < deadline, "the exchange hung");
        }
        (got.expect("set"), sent.expect("set"))
    }

    /// Whenever a transfer can move, one of the sockets that the blocked
    /// ends name in `wait_fds` is ready: a rank waiting in `poll(2)` on them
    /// never sleeps through its peer's bytes, a CTS, or room to write.
    #[test]
    fn waits_on_the_named_sockets_never_miss_progress() {
        for len in [8, 60 << 10, 4 << 20] {
            let (mut a, mut b) = loopback_pair(1).unwrap();
            let (a, b) = (a.remove(0), b.remove(0));
            assert_eq!(a.tx.wait_source(), WaitSource::Fds);
            let msg: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
            let mut dst = vec![0u8; len];
            let (mut sent, mut got) = (false, false);
            let deadline = Instant::now() + Duration::from_secs(30);
            let mut waits = 0;
            loop {
                if !got {
                    got = b.rx.try_recv_into(&mut dst).unwrap() == len;
                }
                if !sent {
                    sent = a.tx.try_send(&msg).unwrap() == len;
                }
                if sent && got {
                    break;
                }
                let mut fds = Vec::new();
                assert!(
                    sent || a.tx.wait_fds(&mut fds),
                    "{len} B: send names no sockets"
                );
                assert!(
                    got || b.rx.wait_fds(&mut fds),
                    "{len} B: receive names no sockets"
                );
                let ts = libc::timespec {
                    tv_sec: 5,
                    tv_nsec: 0,
                };
                // SAFETY: a valid pollfd array and timeout.
                let n = unsafe {
                    libc::ppoll(
                        fds.as_mut_ptr(),
                        fds.len() as libc::nfds_t,
                        &ts,
                        std::ptr::null(),
                    )
                };
                assert!(
                    n > 0,
                    "{len} B: no named socket became ready ({sent} {got})"
                );
                waits += 1;
                assert!(Instant::now() < deadline, "{len} B: the exchange hung");
            }
            assert!(dst == msg, "{len} B arrived wrong");
            assert!(waits > 0 || len <= 64 << 10, "{len} B never waited");
        }
    }

    #[test]
    fn size_mismatches_are_invalid_usage_naming_mismatched_calls() {
        let usage = |r: &Result<()>| matches!(r, Err(Error::InvalidUsage(m)) if m.contains("calls are mismatched"));
        // A short message inline, a long one through the CTS handshake
        // (rejected, so the sender learns it too).
        for (send, want) in [(100, 50), (4 << 20, 1 << 20)] {
            let (mut a, mut b) = loopback_pair(1).unwrap();
            let (a, b) = (a.remove(0), b.remove(0));
            let (recv, sent) = exchange(&a, &b, send, want);
            assert!(usage(&recv), "{send} B into {want} B: receive {recv:?}");
            if send > 1 << 20 {
                assert!(usage(&sent), "{send} B into {want} B: send {sent:?}");
            }
        }
        // A message shorter than the receive.
        let (mut a, mut b) = loopback_pair(1).unwrap();
        let (a, b) = (a.remove(0), b.remove(0));
        let (recv, sent) = exchange(&a, &b, 50, 100);
        assert!(usage(&recv), "50 B into 100 B: receive {recv:?}");
        assert!(sent.is_ok(), "{sent:?}");
    }
}
