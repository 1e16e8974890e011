//! The engine's verbs links over `nccl-net-plugin`'s verbs transport (the
//! code that also serves NVIDIA's NCCL through the plugin tables): RC QPs,
//! eager messages into pre-posted slots, rendezvous writes with immediate
//! data, credits.
//!
//! Which pairs use it: [`fabrics`] gathers every rank's RDMA fabric through
//! the bootstrap; two ranks on different nodes whose ports share a fabric
//! get verbs, the others TCP. As on TCP links, one send comm and one
//! receive comm join each ordered pair, the channels are told apart by tag,
//! and every message is whole. The listeners' handles (address and nonce of
//! the setup socket) travel through the authenticated bootstrap.

use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use nccl_net_plugin::ib::pci::{self, PciDevice, Place};
use nccl_net_plugin::ib::qp::RegBuf;
use nccl_net_plugin::ib::{DiscoverOpts, IbNet, IbOptions, IbPort, IbRecvComm, IbSendComm};
use nccl_net_plugin::tcp::{RecvBuf, RecvRequest, SendRequest};
use nccl_net_plugin::NetError;
use parking_lot::Mutex;

use super::window::Window;
use super::{Conn, RecvLink, SendLink, WaitSource};
use crate::error::{Error, Result};

/// What verbs links take from the communicator's settings.
#[derive(Debug, Clone)]
pub struct VerbsParams {
    /// The transport's options.
    pub ib: IbOptions,
    /// Which ports.
    pub ports: DiscoverOpts,
    /// Where setup sockets listen (the bootstrap address).
    pub ip: IpAddr,
}

/// Every rank's fabric (`None`: no usable RDMA port), and whether each
/// receives device memory in place.
pub type Fabrics = (Vec<Option<[u8; 9]>>, Vec<bool>);

/// Bytes each rank contributes to the fabric exchange.
const FABRIC_BYTES: usize = 16;

/// This rank's ports (empty when verbs is off or unavailable).
pub fn local_ports(enabled: bool, params: &VerbsParams) -> Vec<IbPort> {
    if !enabled {
        return Vec::new();
    }
    nccl_net_plugin::ib::usable_ports(&params.ports)
}

/// Every rank's fabric (`None`: no usable RDMA port) and whether it
/// receives device memory in place (`crate::transport::gdr::receives_in_place`:
/// its peers then send to it by rendezvous only), through a bootstrap
/// all-gather that every rank runs.
pub fn fabrics(
    bs: &mut crate::bootstrap::Bootstrap,
    ports: &[IbPort],
    recv_in_place: bool,
) -> Result<Fabrics> {
    let mut mine = [0u8; FABRIC_BYTES];
    if let Some(p) = ports.first() {
        mine[0] = 1;
        mine[1..10].copy_from_slice(&p.fabric());
        mine[10] = u8::from(recv_in_place);
    }
    let all = bs.allgather(&mine, FABRIC_BYTES)?;
    let ok = |b: &Vec<u8>| b.len() == FABRIC_BYTES && b[0] == 1;
    Ok((
        all.iter()
            .map(|b| ok(b).then(|| b[1..10].try_into().expect("9 bytes")))
            .collect(),
        all.iter().map(|b| ok(b) && b[10] == 1).collect(),
    ))
}

fn verbs_err(e: NetError) -> Error {
    match e {
        NetError::Revoked(by) => Error::Revoked(by as usize),
        NetError::Timeout(m) => Error::Timeout(format!("verbs: {m}").into()),
        NetError::InvalidUsage(m) if m.contains("is larger than the") => Error::usage(format!(
            "verbs: {m}: the ranks' calls are mismatched (every rank must pass the same kind, \
             count, datatype, op and root)"
        )),
        NetError::InvalidArgument(m) | NetError::InvalidUsage(m) | NetError::Internal(m) => {
            Error::Internal(format!("verbs: {m}").into())
        }
        other => Error::Remote(format!("verbs: {other}").into()),
    }
}

fn closed() -> Error {
    Error::Remote("verbs link closed (abort)".into())
}

struct VSend {
    comm: Arc<IbSendComm>,
    closed: Arc<AtomicBool>,
    tag: i32,
    /// Posted sends: the current one and one posted ahead.
    inflight: Mutex<Window<SendRequest>>,
}

struct VRecv {
    comm: Arc<IbRecvComm>,
    closed: Arc<AtomicBool>,
    tag: i32,
    st: Mutex<RState>,
}

#[derive(Default)]
struct RState {
    /// Posted receives: the current one and one posted ahead.
    reqs: Window<RecvRequest>,
    stage: Stage,
}

/// Where a receive that the caller consumes from (a reduction's input)
/// lands: registered memory when the device allows, so that the peer's
/// writes go straight into it rather than through a bounce chunk and a
/// copy.
#[derive(Default)]
enum Stage {
    #[default]
    None,
    Registered(RegBuf),
    Plain(Vec<u8>),
}

impl Stage {
    fn len(&self) -> usize {
        match self {
            Stage::None => 0,
            Stage::Registered(r) => r.buf.len(),
            Stage::Plain(v) => v.len(),
        }
    }

    fn ptr(&mut self) -> *mut u8 {
        match self {
            Stage::None => std::ptr::NonNull::dangling().as_ptr(),
            Stage::Registered(r) => r.buf.ptr(),
            Stage::Plain(v) => v.as_mut_ptr(),
        }
    }

    fn mr(&self) -> Option<Arc<nccl_net_plugin::ib::mr::Mr>> {
        match self {
            Stage::Registered(r) => Some(r.mr.clone()),
            _ => None,
        }
    }

    /// At least `len` bytes (only called with no receive in flight).
    fn grow(&mut self, port: &IbPort, len: usize) {
        if self.len() >= len {
            return;
        }
        *self = match RegBuf::new(port, len, true) {
            Ok(r) => Stage::Registered(r),
            Err(e) => {
                tracing::debug!(target: "hetccl::NET", "verbs: unregistered staging: {e}");
                Stage::Plain(vec![0; len])
            }
        };
    }
}

impl std::fmt::Debug for VSend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "VerbsSend(tag {}, {:?})", self.tag, self.comm)
    }
}

impl std::fmt::Debug for VRecv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "VerbsRecv(tag {}, {:?})", self.tag, self.comm)
    }
}

impl VSend {
    /// Posts `src` as the next message; `None` when the transport has no
    /// room now.
    fn start(&self, q: &mut Window<SendRequest>, src: &[u8]) -> Result<Option<SendRequest>> {
        // Memory from ncclMemAlloc / ncclCommRegister goes in place.
        let mr = nccl_net_plugin::ib::find_registered(
            self.comm.port(),
            src.as_ptr() as usize,
            src.len(),
        );
        // SAFETY: the executor keeps the range unchanged and alive until the
        // send is reported taken (a message posted ahead is its next step,
        // whose inputs are ready); the user's buffer outlives the operation.
        let r =
            unsafe { self.comm.isend(src.as_ptr(), src.len(), self.tag, mr) }.map_err(verbs_err)?;
        if let Some(r) = r {
            q.push(src.as_ptr() as usize, src.len(), r);
        }
        Ok(r)
    }
}

impl SendLink for VSend {
    fn try_send(&self, src: &[u8]) -> Result<usize> {
        if self.closed.load(Ordering::Acquire) {
            return Err(closed());
        }
        if src.is_empty() {
            return Ok(0);
        }
        let mut q = self.inflight.lock();
        let r = match q.head("verbs: a send", src.as_ptr() as usize, src.len())? {
            Some(r) => r,
            None => match self.start(&mut q, src)? {
                Some(r) => r,
                None => return Ok(0),
            },
        };
        if self.comm.test(r).map_err(verbs_err)?.is_none() {
            return Ok(0);
        }
        q.pop();
        Ok(src.len())
    }
    fn post_ahead(&self, src: &[u8]) -> Result<bool> {
        if self.closed.load(Ordering::Acquire) {
            return Err(closed());
        }
        let mut q = self.inflight.lock();
        if src.is_empty() || !q.room_ahead() {
            return Ok(false);
        }
        Ok(self.start(&mut q, src)?.is_some())
    }
    fn wait_source(&self) -> WaitSource {
        WaitSource::Poll
    }
    fn close(&self) {
        self.closed.store(true, Ordering::Release);
    }
    fn revoke(&self, by: usize) {
        // The revoke frame on the setup socket names `by` to the peer.
        self.comm.revoke(u32::try_from(by).unwrap_or(u32::MAX));
        self.closed.store(true, Ordering::Release);
    }
    fn finish(&self, deadline: std::time::Instant) {
        self.comm.finish(deadline);
    }
}

impl VRecv {
    /// The oldest posted receive, which must be into `ptr..ptr+len`; posts
    /// it when none is. `None`: the transport has no room now.
    fn post(
        &self,
        st: &mut RState,
        ptr: *mut u8,
        len: usize,
        mr: Option<Arc<nccl_net_plugin::ib::mr::Mr>>,
    ) -> Result<Option<RecvRequest>> {
        match st.reqs.head("verbs: a receive", ptr as usize, len)? {
            Some(req) => Ok(Some(req)),
            None => self.start(&mut st.reqs, ptr, len, mr),
        }
    }

    /// Posts a receive into `ptr..ptr+len` after those in flight.
    fn start(
        &self,
        reqs: &mut Window<RecvRequest>,
        ptr: *mut u8,
        len: usize,
        mr: Option<Arc<nccl_net_plugin::ib::mr::Mr>>,
    ) -> Result<Option<RecvRequest>> {
        let buf = RecvBuf {
            ptr,
            cap: len,
            tag: self.tag,
        };
        let mr = mr
            .or_else(|| nccl_net_plugin::ib::find_registered(self.comm.port(), ptr as usize, len));
        // SAFETY: the staging buffer is not resized while a receive is in
        // flight; a caller's range stays valid until the operation ends.
        Ok(
            match unsafe { self.comm.irecv(&[buf], &[mr]) }.map_err(verbs_err)? {
                Some(r) => {
                    reqs.push(ptr as usize, len, r);
                    Some(r)
                }
                None => None,
            },
        )
    }

    fn done(
        &self,
        st: &mut RState,
        req: RecvRequest,
        want: usize,
        elem: usize,
    ) -> Result<Option<usize>> {
        let Some(sizes) = self.comm.test(req).map_err(verbs_err)? else {
            return Ok(None);
        };
        st.reqs.pop();
        let n = sizes.first().copied().unwrap_or(0);
        if n != want || n % elem != 0 {
            return Err(Error::usage(format!(
                "verbs: received a message of {n} bytes where {want} were expected: the ranks' \
                 calls are mismatched"
            )));
        }
        Ok(Some(n))
    }
}

impl RecvLink for VRecv {
    fn try_recv_with(&self, max: usize, elem: usize, f: &mut dyn FnMut(&[u8])) -> Result<usize> {
        if self.closed.load(Ordering::Acquire) {
            return Err(closed());
        }
        if max == 0 {
            return Ok(0);
        }
        let mut st = self.st.lock();
        let st = &mut *st;
        if st.reqs.is_empty() {
            st.stage.grow(self.comm.port(), max);
        }
        let stage = st.stage.ptr();
        let mr = st.stage.mr();
        let Some(req) = self.post(st, stage, max, mr)? else {
            return Ok(0);
        };
        let Some(n) = self.done(st, req, max, elem)? else {
            return Ok(0);
        };
        // SAFETY: the receive of `n` <= max <= stage length bytes into the
        // stage completed; nothing else writes it until the next post.
        f(unsafe { std::slice::from_raw_parts(st.stage.ptr(), n) });
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
        let Some(req) = self.post(st, dst.as_mut_ptr(), dst.len(), None)? else {
            return Ok(0);
        };
        Ok(self.done(st, req, dst.len(), 1)?.unwrap_or(0))
    }
    fn try_recv_first(&self, dst: &mut [u8], _expect: usize) -> Result<(usize, bool)> {
        // A message link: post the whole slot and take the peer's message
        // at whatever length it has, for the fingerprint check to judge.
        if self.closed.load(Ordering::Acquire) {
            return Err(closed());
        }
        let mut st = self.st.lock();
        let st = &mut *st;
        let Some(req) = self.post(st, dst.as_mut_ptr(), dst.len(), None)? else {
            return Ok((0, false));
        };
        let Some(sizes) = self.comm.test(req).map_err(verbs_err)? else {
            return Ok((0, false));
        };
        st.reqs.pop();
        Ok((sizes.first().copied().unwrap_or(0), true))
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
            .start(&mut st.reqs, dst.as_mut_ptr(), dst.len(), None)?
            .is_some())
    }
    fn wait_source(&self) -> WaitSource {
        WaitSource::Poll
    }
    fn close(&self) {
        self.closed.store(true, Ordering::Release);
    }
    fn revoke(&self, by: usize) {
        // The revoke frame on the setup socket names `by` to the peer.
        self.comm.revoke(u32::try_from(by).unwrap_or(u32::MAX));
        self.closed.store(true, Ordering::Release);
    }
    fn finish(&self, deadline: std::time::Instant) {
        self.comm.finish(deadline);
    }
}

/// The `nchan` channels of one peer connection.
pub fn connect(send: IbSendComm, recv: IbRecvComm, nchan: usize) -> Vec<Conn> {
    let (s, r) = (Arc::new(send), Arc::new(recv));
    let closed = Arc::new(AtomicBool::new(false));
    (0..nchan)
        .map(|c| Conn {
            tx: Box::new(VSend {
                comm: s.clone(),
                closed: closed.clone(),
                tag: c as i32,
                inflight: Mutex::new(Window::default()),
            }),
            rx: Box::new(VRecv {
                comm: r.clone(),
                closed: closed.clone(),
                tag: c as i32,
                st: Mutex::new(RState::default()),
            }),
            transport: super::TransportKind::Verbs,
        })
        .collect()
}

/// Where this rank's buffers live, for choosing its NIC: the GPU of the
/// calling thread's current CUDA context when there is one (probed only
/// when the driver is already loaded), else the NUMA node it runs on.
pub fn local_place() -> Place {
    if crate::gpu::driver::loaded() {
        if let Some(g) =
            crate::gpu::driver::current_device().and_then(nccl_net_plugin::ib::gdr::gpu_location)
        {
            return Place::Gpu(g);
        }
    }
    Place::Cpu(pci::current_numa_node())
}

/// The local port of each peer: the ports nearest to `place`
/// ([`pci::nearest`]: same PCI switch, then root complex, then NUMA node),
/// spread by peer rank among equals; all ports, spread, when the topology
/// is unknown.
pub fn ports_for_peers(place: &Place, nics: &[Option<PciDevice>], peers: &[usize]) -> Vec<usize> {
    let near = pci::nearest(place, nics);
    if near.is_empty() {
        return vec![0; peers.len()];
    }
    peers.iter().map(|&p| near[p % near.len()]).collect()
}

/// Sets up verbs links to `peers` over `ports` (each peer on one of the
/// ports nearest this rank, [`ports_for_peers`]): listeners' handles travel
/// through the bootstrap, then connects and accepts are polled until all
/// are up. Sends to a rank whose `rendezvous_to` entry is set go by
/// rendezvous only. Every rank calls this (it runs a bootstrap
/// all-gather), with or without peers. Returns each peer's channels and
/// port.
pub fn setup(
    bs: &mut crate::bootstrap::Bootstrap,
    peers: &[usize],
    ports: &[IbPort],
    nchan: usize,
    params: &VerbsParams,
    rendezvous_to: &[bool],
) -> Result<Vec<(usize, Vec<Conn>, IbPort)>> {
    use nccl_net_plugin::ib::IbListenComm;
    use nccl_net_plugin::wire::HANDLE_BYTES;
    let n = bs.nranks();
    let rank = bs.rank;
    let mut listens: Vec<Option<IbListenComm>> = (0..n).map(|_| None).collect();
    let mut blob = vec![0u8; n * HANDLE_BYTES];
    let net = (!peers.is_empty() && !ports.is_empty())
        .then(|| IbNet::new(ports.to_vec(), params.ip, params.ib.clone()));
    let devs = if ports.len() > 1 {
        let place = local_place();
        let nics: Vec<_> = ports.iter().map(|p| p.pci.clone()).collect();
        let d = ports_for_peers(&place, &nics, peers);
        let from = match &place {
            Place::Gpu(g) => format!("GPU at {}", g.chain.last().map_or("?", String::as_str)),
            Place::Cpu(Some(n)) => format!("NUMA node {n}"),
            Place::Cpu(None) => "an unknown place".into(),
        };
        tracing::info!(target: "hetccl::INIT", "rank {rank}: verbs port of each peer, nearest to {from}: {d:?}");
        d
    } else {
        vec![0; peers.len()]
    };
    let dev_of = |p: usize| peers.iter().position(|&q| q == p).map_or(0, |i| devs[i]);
    if let Some(net) = &net {
        for &p in peers {
            let (l, h) = net.listen(dev_of(p)).map_err(verbs_err)?;
            blob[p * HANDLE_BYTES..(p + 1) * HANDLE_BYTES].copy_from_slice(&h);
            listens[p] = Some(l);
        }
    }
    let all = bs.allgather(&blob, n * HANDLE_BYTES)?;
    let Some(net) = net else {
        return if peers.is_empty() {
            Ok(Vec::new())
        } else {
            Err(Error::System(
                "verbs links asked for without an RDMA port".into(),
            ))
        };
    };
    let mut handles: Vec<[u8; HANDLE_BYTES]> = Vec::with_capacity(peers.len());
    for &p in peers {
        let theirs = all[p]
            .get(rank * HANDLE_BYTES..(rank + 1) * HANDLE_BYTES)
            .ok_or_else(|| Error::Remote(format!("rank {p} sent no verbs handles").into()))?;
        handles.push(theirs.try_into().expect("sized"));
    }
    let mut sends: Vec<Option<IbSendComm>> = peers.iter().map(|_| None).collect();
    let mut recvs: Vec<Option<IbRecvComm>> = peers.iter().map(|_| None).collect();
    let deadline = bs.params().deadline();
    loop {
        let mut pending = false;
        for (i, &p) in peers.iter().enumerate() {
            if sends[i].is_none() {
                sends[i] = net.connect(dev_of(p), &mut handles[i]).map_err(verbs_err)?;
                pending |= sends[i].is_none();
            }
            if recvs[i].is_none() {
                let l = listens[p].as_mut().expect("listening");
                recvs[i] = net.accept(l).map_err(verbs_err)?;
                pending |= recvs[i].is_none();
            }
        }
        if !pending {
            break;
        }
        if std::time::Instant::now() >= deadline {
            return Err(Error::Timeout(
                "verbs links were not all connected in time".into(),
            ));
        }
        std::thread::sleep(std::time::Duration::from_micros(200));
    }
    Ok(peers
        .iter()
        .zip(sends.into_iter().zip(recvs))
        .map(|(&p, (s, r))| {
            let (mut s, r) = (s.expect("connected"), r.expect("accepted"));
            let rdv = rendezvous_to.get(p).copied().unwrap_or(false);
            if rdv {
                s.rendezvous_only();
            }
            tracing::info!(target: "hetccl::INIT",
                "rank {rank} -> rank {p} via NET/IB/{} (send {}, receive {}{})",
                dev_of(p), s.describe(), r.describe(),
                if rdv { "; it receives GPU memory in place: rendezvous only" } else { "" });
            let port = s.port().clone();
            (p, connect(s, r, nchan), port)
        })
        .collect())
}

/// Two connected ends of `nchan` channels on this machine's first RDMA
/// port (tests and benchmarks); `Ok(None)` when there is none.
pub fn loopback_pair(nchan: usize) -> Result<Option<(Vec<Conn>, Vec<Conn>)>> {
    let ports = nccl_net_plugin::ib::usable_ports(&DiscoverOpts::default());
    let Some(port) = ports.first() else {
        return Ok(None);
    };
    let ip = IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);
    let net = IbNet::new(vec![port.clone()], ip, IbOptions::default());
    let (mut la, mut ha) = net.listen(0).map_err(verbs_err)?;
    let (mut lb, mut hb) = net.listen(0).map_err(verbs_err)?;
    let (mut sa, mut ra, mut sb, mut rb) = (None, None, None, None);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while sa.is_none() || ra.is_none() || sb.is_none() || rb.is_none() {
        if sa.is_none() {
            sa = net.connect(0, &mut hb).map_err(verbs_err)?;
        }
        if sb.is_none() {
            sb = net.connect(0, &mut ha).map_err(verbs_err)?;
        }
        if ra.is_none() {
            ra = net.accept(&mut la).map_err(verbs_err)?;
        }
        if rb.is_none() {
            rb = net.accept(&mut lb).map_err(verbs_err)?;
        }
        if std::time::Instant::now() > deadline {
            return Err(Error::Timeout("verbs loopback pair".into()));
        }
    }
    Ok(Some((
        connect(sa.expect("set"), ra.expect("set"), nchan),
        connect(sb.expect("set"), rb.expect("set"), nchan),
    )))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn dev(path: &str, numa: i32) -> Option<PciDevice> {
        PciDevice::from_path(Path::new(path), Some(numa))
    }

    #[test]
    fn each_peer_gets_a_nearest_port_spread_among_equals() {
        // Two NICs on one switch with the GPU, one on another root port,
        // one on the other socket.
        let nics = vec![
            dev(
                "/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:10.0/0000:04:00.0",
                0,
            ),
            dev("/sys/devices/pci0000:00/0000:00:02.0/0000:08:00.0", 0),
            dev(
                "/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:18.0/0000:05:00.0",
                0,
            ),
            dev("/sys/devices/pci0000:80/0000:80:01.0/0000:81:00.0", 1),
        ];
        let gpu = dev(
            "/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:08.0/0000:03:00.0",
            0,
        )
        .unwrap();
        let peers = [1, 2, 3, 4, 5];
        assert_eq!(
            ports_for_peers(&Place::Gpu(gpu), &nics, &peers),
            vec![2, 0, 2, 0, 2]
        );
        assert_eq!(
            ports_for_peers(&Place::Cpu(Some(1)), &nics, &peers),
            vec![3; 5]
        );
        assert_eq!(
            ports_for_peers(&Place::Cpu(Some(0)), &nics, &peers),
            vec![1, 2, 0, 1, 2]
        );
        // Unknown topology (rxe has no PCI location): spread as p mod ports.
        let virt = vec![None, None, None];
        assert_eq!(
            ports_for_peers(&Place::Cpu(Some(0)), &virt, &peers),
            vec![1, 2, 0, 1, 2]
        );
        assert!(ports_for_peers(&Place::Cpu(None), &[], &peers)
            .iter()
            .all(|&d| d == 0));
    }
}
