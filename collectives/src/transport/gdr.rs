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
//! The executor does not use these yet: device buffers between nodes are
//! staged through pinned host memory (`gpu/stage.rs`); see docs/rdma.md.

use std::ffi::{c_int, c_void};
use std::sync::Arc;

use nccl_net_plugin::ib::flush::Flusher;
use nccl_net_plugin::ib::gdr::{self, GdrMode};
use nccl_net_plugin::ib::mr::Mr;
use nccl_net_plugin::ib::{pci, IbOptions, IbPort};
use once_cell::sync::OnceCell;

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
    let net = |e| Error::System(format!("GPUDirect registration on {}: {e}", port.label()));
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
        GdrMode::Staged(why) => Err(Error::Internal(format!(
            "device memory on {} is staged: {why}",
            port.label()
        ))),
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
            return Err(Error::Internal(format!(
                "flush of {addr:#x} outside its registration {:#x}+{}",
                mr.addr, mr.len
            )));
        }
        let f = self
            .f
            .get_or_try_init(|| Flusher::new(&self.port, &self.opts))
            .map_err(|e| Error::System(format!("GPUDirect flush QP: {e}")))?;
        f.post(addr as u64, mr.rkey)
            .map_err(|e| Error::Remote(format!("GPUDirect flush: {e}")))
    }

    /// Whether flush `id` has completed.
    pub fn done(&self, id: u64) -> Result<bool> {
        let f = self
            .f
            .get()
            .ok_or_else(|| Error::Internal("no flush was posted".into()))?;
        f.test(id)
            .map_err(|e| Error::Remote(format!("GPUDirect flush: {e}")))
    }
}
