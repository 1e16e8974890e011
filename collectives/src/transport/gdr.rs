//! The engine's GPUDirect RDMA over verbs links: whether a device buffer
//! may be read and written by the NIC in place, its registration, and the
//! flush after a receive into device memory.
//!
//! - [`decide`]: `nccl_net_plugin::ib::gdr::choose` over the machine's
//!   capabilities, `NCCL_NET_GDR_LEVEL` and the PCI distance between the
//!   buffer's GPU and the port (DMA-BUF first, then peer memory, else
//!   staging through pinned host memory, with the reason).
//! - [`register`]: the whole CUDA allocation holding a buffer, through a
//!   DMA-BUF fd from `cuMemGetHandleForAddressRange` and
//!   `ibv_reg_dmabuf_mr`, or `ibv_reg_mr` on the device address with
//!   nvidia-peermem; kept in the device's registration cache.
//! - [`register_user`]: `ncclCommRegister` of device memory registers it
//!   so on every opened device whose decision allows it.
//! - [`GdrFlush`]: after the NIC wrote into device memory, an RDMA read
//!   on a loopback QP orders the data before the GPU reads it.
//!
//! - [`Paths`]: per communicator, which peers' verbs links take device
//!   buffers in place (the stream path's sends and receives between
//!   nodes, `gpu/gdr.rs`), their registrations checked against the CUDA
//!   allocation's buffer id, and the flushes.
//!
//! A rank receives device memory in place only when every peer sends to it
//! by rendezvous ([`receives_in_place`] travels with its fabric), since an
//! eager message could only reach GPU memory through the CPU.

use std::collections::HashMap;
use std::ffi::{c_int, c_void};
use std::sync::Arc;
use std::time::Instant;

use nccl_net_plugin::ib::flush::Flusher;
use nccl_net_plugin::ib::gdr::{self, GdrMode};
use nccl_net_plugin::ib::mr::Mr;
use nccl_net_plugin::ib::{pci, IbOptions, IbPort};
use once_cell::sync::OnceCell;
use parking_lot::Mutex;

use crate::error::{Error, Result};
use crate::gpu::driver::{self, cu};

/// How device buffers of CUDA device `device` cross `port`.
pub fn decide(port: &IbPort, device: i32) -> GdrMode {
    let distance = match (gdr::gpu_location(device), &port.pci) {
        (Some(g), Some(n)) => Some(pci::distance(&g, n)),
        _ => None,
    };
    gdr::choose(gdr::caps(), gdr::level(), distance)
}

/// Whether this rank may receive device buffers in place on its `ports`:
/// a CUDA context is current at init (the CUDA driver already loaded by
/// the caller) and every port allows GPUDirect for its GPU. Its peers then
/// send every message to it by rendezvous.
pub fn receives_in_place(ports: &[IbPort]) -> bool {
    if ports.is_empty() || !driver::loaded() {
        return false;
    }
    let Some(d) = driver::current_device() else {
        return false;
    };
    ports
        .iter()
        .all(|p| !matches!(decide(p, d), GdrMode::Staged(_)))
}

/// The CUDA allocation holding `ptr` (`cuMemGetAddressRange`), its size
/// rounded up to whole pages (registrations cover pages).
fn allocation(ptr: usize, len: usize) -> Result<(usize, usize)> {
    driver::require("GPUDirect registration")?;
    let (mut base, mut size): (cu::CUdeviceptr, usize) = (0, 0);
    driver::check(
        // SAFETY: two writable slots; the driver checks the address.
        unsafe { cu::cuMemGetAddressRange_v2(&mut base, &mut size, ptr as cu::CUdeviceptr) },
        "cuMemGetAddressRange",
    )?;
    let base = base as usize;
    if ptr.saturating_add(len) > base + size {
        return Err(Error::arg(format!(
            "device range {ptr:#x}+{len} runs past its allocation {base:#x}+{size}"
        )));
    }
    // SAFETY: sysconf has no memory arguments.
    let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) })
        .unwrap_or(4096)
        .max(1);
    Ok((base, size.div_ceil(page) * page))
}

/// Registers the allocation holding `ptr..ptr+len` on `port`'s device as
/// `mode` says (a cached registration is reused).
pub fn register(port: &IbPort, mode: &GdrMode, ptr: usize, len: usize) -> Result<Arc<Mr>> {
    let (base, size) = allocation(ptr, len)?;
    let net = |e| Error::System(format!("GPUDirect registration on {}: {e}", port.label()).into());
    match mode {
        GdrMode::DmaBuf => {
            let mut fd: c_int = -1;
            driver::check(
                // SAFETY: a writable int for the fd; `caps().dmabuf` saw
                // the symbol; the range is one allocation.
                unsafe {
                    cu::cuMemGetHandleForAddressRange(
                        (&mut fd as *mut c_int).cast::<c_void>(),
                        base as cu::CUdeviceptr,
                        size,
                        cu::CUmemRangeHandleType::CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD,
                        0,
                    )
                },
                "cuMemGetHandleForAddressRange",
            )?;
            let r = gdr::register_device(port, base, size, Some(fd));
            // SAFETY: the fd the driver just gave us; the registration
            // holds its own reference to the buffer.
            unsafe { libc::close(fd) };
            r.map_err(net)
        }
        GdrMode::PeerMem => gdr::register_device(port, base, size, None).map_err(net),
        GdrMode::Staged(why) => Err(Error::Internal(
            format!("device memory on {} is staged: {why}", port.label()).into(),
        )),
    }
}

/// `ncclCommRegister` of device memory of CUDA device `device`: registers
/// it on every opened RDMA device whose decision allows GPUDirect, held
/// until `ncclCommDeregister`. Failures are logged: the memory is then
/// staged, as without GPUDirect.
pub fn register_user(ptr: usize, len: usize, device: i32) {
    let mut held = Vec::new();
    let mut seen = Vec::new();
    for p in nccl_net_plugin::ib::dev::discovered() {
        if seen.contains(&Arc::as_ptr(&p.dev)) {
            continue;
        }
        seen.push(Arc::as_ptr(&p.dev));
        let mode = decide(p, device);
        match register(p, &mode, ptr, len) {
            Ok(m) => {
                tracing::info!(target: "hetccl::NET",
                    "NET/IB: {}: device memory {ptr:#x}+{len} of GPU {device} registered ({mode:?})",
                    p.label());
                held.push(m);
            }
            Err(e) => {
                tracing::info!(target: "hetccl::NET", "NET/IB: {}: {e}", p.label())
            }
        }
    }
    if !held.is_empty() {
        nccl_net_plugin::ib::hold_user(ptr, len, held);
    }
}

/// The flush of receives into device memory on one port: a loopback QP
/// made at the first flush.
pub struct GdrFlush {
    port: IbPort,
    opts: IbOptions,
    f: OnceCell<Flusher>,
}

impl std::fmt::Debug for GdrFlush {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "GdrFlush({})", self.port.label())
    }
}

impl GdrFlush {
    /// Flushes for receives on `port`.
    pub fn new(port: IbPort, opts: IbOptions) -> Self {
        Self {
            port,
            opts,
            f: OnceCell::new(),
        }
    }

    /// Posts the flush of a receive that ended at `addr`, in memory
    /// registered as `mr`; returns its id for [`GdrFlush::done`].
    pub fn post(&self, mr: &Mr, addr: usize) -> Result<u64> {
        if !mr.covers(addr, 1) {
            return Err(Error::Internal(
                format!(
                    "flush of {addr:#x} outside its registration {:#x}+{}",
                    mr.addr, mr.len
                )
                .into(),
            ));
        }
        let f = self
            .f
            .get_or_try_init(|| Flusher::new(&self.port, &self.opts))
            .map_err(|e| Error::System(format!("GPUDirect flush QP: {e}").into()))?;
        f.post(addr as u64, mr.rkey)
            .map_err(|e| Error::Remote(format!("GPUDirect flush: {e}").into()))
    }

    /// Whether flush `id` has completed.
    pub fn done(&self, id: u64) -> Result<bool> {
        let f = self
            .f
            .get()
            .ok_or_else(|| Error::Internal("no flush was posted".into()))?;
        f.test(id)
            .map_err(|e| Error::Remote(format!("GPUDirect flush: {e}").into()))
    }
}

/// The most registrations [`Paths`] tracks by buffer id before it forgets
/// them all (each stays in its device's bounded cache).
const MAX_TRACKED: usize = 4096;

/// One communicator's GPUDirect paths: by peer, the port of its verbs
/// link; whether this rank receives device memory in place; the buffer id
/// each registered allocation had; the flushes by port.
pub struct Paths {
    ports: Vec<Option<IbPort>>,
    recv_in_place: bool,
    opts: IbOptions,
    ids: Mutex<HashMap<(usize, usize), u64>>,
    flushes: Mutex<HashMap<String, Arc<GdrFlush>>>,
    logged: Mutex<Vec<(String, i32)>>,
}

impl std::fmt::Debug for Paths {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let n = self.ports.iter().filter(|p| p.is_some()).count();
        write!(
            f,
            "gdr::Paths({n} verbs peers, recv in place {})",
            self.recv_in_place
        )
    }
}

impl Paths {
    /// No peer over verbs: every device buffer is staged.
    pub fn none() -> Self {
        Self::new(Vec::new(), false, IbOptions::default())
    }

    /// `ports`: by peer, its verbs link's port; `recv_in_place`: this rank
    /// published [`receives_in_place`] and so its peers send to it by
    /// rendezvous only.
    pub fn new(ports: Vec<Option<IbPort>>, recv_in_place: bool, opts: IbOptions) -> Self {
        Self {
            ports,
            recv_in_place,
            opts,
            ids: Mutex::new(HashMap::new()),
            flushes: Mutex::new(HashMap::new()),
            logged: Mutex::new(Vec::new()),
        }
    }

    /// The registration through which the NIC reads `ptr..ptr+len` (memory
    /// of CUDA device `device`) in place for a send to `peer`; `None`: stage.
    pub fn send_mr(&self, peer: usize, device: i32, ptr: usize, len: usize) -> Option<Arc<Mr>> {
        self.mr(peer, device, ptr, len)
    }

    /// As [`Paths::send_mr`], for a receive from `peer` written in place.
    pub fn recv_mr(&self, peer: usize, device: i32, ptr: usize, len: usize) -> Option<Arc<Mr>> {
        if !self.recv_in_place {
            return None;
        }
        self.mr(peer, device, ptr, len)
    }

    fn mr(&self, peer: usize, device: i32, ptr: usize, len: usize) -> Option<Arc<Mr>> {
        let port = self.ports.get(peer)?.as_ref()?;
        let mode = decide(port, device);
        if let GdrMode::Staged(why) = &mode {
            self.log_once(port, device, &format!("GPU {device} is staged: {why}"));
            return None;
        }
        match self.register_current(port, &mode, ptr, len) {
            Ok(m) => {
                self.log_once(port, device, &format!("GPU {device} in place ({mode:?})"));
                Some(m)
            }
            Err(e) => {
                self.log_once(port, device, &format!("GPU {device} is staged: {e}"));
                None
            }
        }
    }

    /// [`register`], after dropping a registration of an earlier
    /// allocation at the same address (freed with `cuMemFree`, which no
    /// hook sees): the allocation's buffer id must be the one registered.
    fn register_current(
        &self,
        port: &IbPort,
        mode: &GdrMode,
        ptr: usize,
        len: usize,
    ) -> Result<Arc<Mr>> {
        let (base, size) = allocation(ptr, len)?;
        let id = buffer_id(base)?;
        let key = (Arc::as_ptr(&port.dev) as usize, base);
        {
            let mut ids = self.ids.lock();
            if ids.get(&key) != Some(&id) {
                nccl_net_plugin::ib::invalidate(port, base, size);
                if ids.len() >= MAX_TRACKED {
                    ids.clear();
                }
                ids.insert(key, id);
            }
        }
        register(port, mode, ptr, len)
    }

    fn log_once(&self, port: &IbPort, device: i32, what: &str) {
        let key = (port.label(), device);
        let mut seen = self.logged.lock();
        if !seen.contains(&key) {
            tracing::info!(target: "hetccl::NET", "NET/IB: {}: device buffers of {what}", port.label());
            seen.push(key);
        }
    }

    /// Flushes the receives from `peer` that ended in `mr` (the last byte
    /// written at `addr`): returns once the GPU sees their data, or fails
    /// at `deadline`.
    pub fn flush(&self, peer: usize, mr: &Mr, addr: usize, deadline: Instant) -> Result<()> {
        let port = self
            .ports
            .get(peer)
            .and_then(Option::as_ref)
            .ok_or_else(|| {
                Error::Internal(format!("flush for rank {peer}, not a verbs peer").into())
            })?;
        let f = self
            .flushes
            .lock()
            .entry(port.label())
            .or_insert_with(|| Arc::new(GdrFlush::new(port.clone(), self.opts.clone())))
            .clone();
        let id = f.post(mr, addr)?;
        while !f.done(id)? {
            if Instant::now() >= deadline {
                return Err(Error::Timeout(
                    format!("GPUDirect flush on {} did not complete", port.label()).into(),
                ));
            }
            std::thread::yield_now();
        }
        Ok(())
    }
}

/// The CUDA allocation's buffer id (`CU_POINTER_ATTRIBUTE_BUFFER_ID`,
/// unique for the process's life).
fn buffer_id(ptr: usize) -> Result<u64> {
    let mut id = 0u64;
    driver::check(
        // SAFETY: a writable 8-byte slot; the driver checks the address.
        unsafe {
            cu::cuPointerGetAttribute(
                (&mut id as *mut u64).cast(),
                cu::CUpointer_attribute::CU_POINTER_ATTRIBUTE_BUFFER_ID,
                ptr as cu::CUdeviceptr,
            )
        },
        "cuPointerGetAttribute(BUFFER_ID)",
    )?;
    Ok(id)
}
