//! GPUDirect RDMA: whether a NIC can reach a GPU's memory, and so which
//! pointer types the verbs plugin advertises and whether the engine sends
//! device buffers in place.
//!
//! What the machine can do ([`GdrCaps`]):
//! - peer memory, when the `nvidia-peermem` (or legacy `nv_peer_mem`)
//!   kernel module is loaded (`<sysfs>/module/…`): `ibv_reg_mr` then
//!   accepts device addresses (`NCCL_PTR_CUDA`);
//! - DMA-BUF, when `NCCL_DMABUF_ENABLE` is on, libibverbs has
//!   `ibv_reg_dmabuf_mr` and the CUDA driver has
//!   `cuMemGetHandleForAddressRange` (`NCCL_PTR_DMABUF`).
//!
//! Whether a GPU/NIC pair may use it: their PCI distance ([`super::pci`])
//! is at most `NCCL_NET_GDR_LEVEL` (NCCL's names or old numbers; default
//! `PXB`, as NCCL's). A NIC without a PCI location counts as `PHB` (it
//! hangs off the CPU). `LOC` (or 0) turns GPUDirect off. None of this has
//! run on a GPU with a real NIC; see docs/rdma.md.

use std::ffi::{c_char, c_int};
use std::path::Path;

use hetccl_abi::net::{NCCL_PTR_CUDA, NCCL_PTR_DMABUF, NCCL_PTR_HOST};
use once_cell::sync::OnceCell;
use parking_lot::Mutex;

use super::pci::{self, PathType, PciDevice};
use super::IbPort;

/// What this machine offers for GPUDirect RDMA.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct GdrCaps {
    /// A peer-memory kernel module is loaded.
    pub peermem: bool,
    /// DMA-BUF registration is possible and enabled.
    pub dmabuf: bool,
}

/// How the engine moves a device buffer over a verbs link.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GdrMode {
    /// Registered with `ibv_reg_dmabuf_mr` on a DMA-BUF fd from
    /// `cuMemGetHandleForAddressRange`.
    DmaBuf,
    /// Registered with `ibv_reg_mr` on the device address (peer memory).
    PeerMem,
    /// Staged through pinned host memory, for the reason given.
    Staged(String),
}

/// The default level (NCCL's): at most several PCI switches, never
/// through the host bridge.
pub const DEFAULT_LEVEL: PathType = PathType::Pxb;

/// Whether a peer-memory kernel module is loaded, per the sysfs at `root`.
pub fn peermem_loaded(root: &Path) -> bool {
    [
        "module/nvidia_peermem",
        "module/nv_peer_mem",
        "kernel/mm/memory_peers/nv_mem/version",
    ]
    .iter()
    .any(|p| root.join(p).exists())
}

/// `NCCL_NET_GDR_LEVEL`, parsed (unset or not a level: [`DEFAULT_LEVEL`],
/// the latter with one WARN line).
pub fn level() -> PathType {
    static L: OnceCell<PathType> = OnceCell::new();
    *L.get_or_init(
        || match hetccl_core::config::get().net_gdr_level.as_deref() {
            None => DEFAULT_LEVEL,
            Some(s) => PathType::parse_level(s).unwrap_or_else(|| {
                tracing::warn!(target: "hetccl::NET",
                "NCCL_NET_GDR_LEVEL={s} is not a level (LOC, PIX, PXB, PHB, SYS or 0..5); using {}",
                DEFAULT_LEVEL.name());
                DEFAULT_LEVEL
            }),
        },
    )
}

/// The engine's choice for a device buffer: GPUDirect when the link is
/// verbs, the level allows the distance (`None`: the NIC has no PCI
/// location, counted as `PHB`) and the machine can register device memory
/// (DMA-BUF first, as NCCL prefers it); else staging, with the reason.
pub fn choose(caps: GdrCaps, level: PathType, distance: Option<PathType>) -> GdrMode {
    if level == PathType::Loc {
        return GdrMode::Staged("NCCL_NET_GDR_LEVEL=LOC".into());
    }
    let d = distance.unwrap_or(PathType::Phb);
    if d > level {
        return GdrMode::Staged(format!(
            "GPU-NIC distance {} is beyond NCCL_NET_GDR_LEVEL {}",
            d.name(),
            level.name()
        ));
    }
    if caps.dmabuf {
        GdrMode::DmaBuf
    } else if caps.peermem {
        GdrMode::PeerMem
    } else {
        GdrMode::Staged("neither nvidia-peermem nor DMA-BUF is available".into())
    }
}

/// The `ptrSupport` of a NIC: host memory always; `NCCL_PTR_CUDA` and
/// `NCCL_PTR_DMABUF` as the machine offers them, unless the level is `LOC`
/// or the caller's GPU is known (`distance` is `Some`) and beyond the
/// level. Without a known GPU the level is left to NCCL, which compares it
/// with its own topology.
pub fn decide_ptr_support(caps: GdrCaps, level: PathType, distance: Option<PathType>) -> i32 {
    let mut p = NCCL_PTR_HOST;
    if level == PathType::Loc || distance.is_some_and(|d| d > level) {
        return p;
    }
    if caps.peermem {
        p |= NCCL_PTR_CUDA;
    }
    if caps.dmabuf {
        p |= NCCL_PTR_DMABUF;
    }
    p
}

/// The CUDA driver, opened once (`HETCCL_CUDA_LIB`, else `libcuda.so.1`);
/// never linked.
fn cuda() -> Option<&'static libloading::Library> {
    static LIB: OnceCell<Option<libloading::Library>> = OnceCell::new();
    LIB.get_or_init(|| {
        let name = std::env::var("HETCCL_CUDA_LIB").unwrap_or_else(|_| "libcuda.so.1".into());
        // SAFETY: the driver's initialisers do not run user code.
        unsafe { libloading::Library::new(&name) }.ok()
    })
    .as_ref()
}

/// Whether the CUDA driver can export DMA-BUF handles.
pub fn cuda_dmabuf() -> bool {
    // SAFETY: only checks that the symbol exists.
    cuda()
        .is_some_and(|l| unsafe { l.get::<*const u8>(b"cuMemGetHandleForAddressRange\0") }.is_ok())
}

/// The machine's capabilities, probed once.
pub fn caps() -> GdrCaps {
    static C: OnceCell<GdrCaps> = OnceCell::new();
    *C.get_or_init(|| {
        let cfg = hetccl_core::config::get();
        let verbs_dmabuf = super::ffi::verbs().is_ok_and(|v| v.reg_dmabuf_mr.is_some());
        let c = GdrCaps {
            peermem: peermem_loaded(&pci::sysfs_root()),
            dmabuf: cfg.dmabuf_enable && verbs_dmabuf && cuda_dmabuf(),
        };
        tracing::info!(target: "hetccl::NET",
            "NET/IB: GPUDirect RDMA: peermem {}, dmabuf {}, NCCL_NET_GDR_LEVEL {}",
            c.peermem, c.dmabuf, level().name());
        c
    })
}

/// The PCI location of CUDA device `dev` (`cuDeviceGetPCIBusId`).
pub fn gpu_location(dev: c_int) -> Option<PciDevice> {
    let lib = cuda()?;
    type BusId = unsafe extern "C" fn(*mut c_char, c_int, c_int) -> c_int;
    // SAFETY: the driver API's signature of cuDeviceGetPCIBusId.
    let f = unsafe { lib.get::<BusId>(b"cuDeviceGetPCIBusId\0") }.ok()?;
    let mut buf = [0 as c_char; 32];
    // SAFETY: a writable buffer of the given length.
    if unsafe { f(buf.as_mut_ptr(), buf.len() as c_int, dev) } != 0 {
        return None;
    }
    // SAFETY: the driver wrote a NUL-terminated string into the buffer.
    let id = unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) }.to_string_lossy();
    pci::device_by_bus_id(&pci::sysfs_root(), &id)
}

/// The PCI location of the calling thread's current GPU, if a CUDA
/// context is current.
pub fn caller_gpu() -> Option<PciDevice> {
    let lib = cuda()?;
    type CtxDev = unsafe extern "C" fn(*mut c_int) -> c_int;
    // SAFETY: the driver API's signature of cuCtxGetDevice.
    let f = unsafe { lib.get::<CtxDev>(b"cuCtxGetDevice\0") }.ok()?;
    let mut d: c_int = -1;
    // SAFETY: a writable slot; without a current context the call fails.
    (unsafe { f(&mut d) } == 0).then_some(())?;
    gpu_location(d)
}

/// The `ptrSupport` of `port` for the calling thread (its current GPU,
/// when there is one, against `NCCL_NET_GDR_LEVEL`). Each distinct answer
/// per port is logged once at INFO.
pub fn ptr_support(port: &IbPort) -> i32 {
    let gpu = caller_gpu();
    let distance = gpu.as_ref().map(|g| {
        port.pci
            .as_ref()
            .map_or(PathType::Phb, |n| pci::distance(g, n))
    });
    let p = decide_ptr_support(caps(), level(), distance);
    static SEEN: Mutex<Vec<(String, i32)>> = Mutex::new(Vec::new());
    let key = (port.label(), p);
    let mut seen = SEEN.lock();
    if !seen.contains(&key) {
        tracing::info!(target: "hetccl::NET",
            "NET/IB: {}: ptrSupport {p:#x} (GPU distance {})",
            port.label(), distance.map_or("unknown", PathType::name));
        seen.push(key);
    }
    p
}

/// Registers device memory `base..base+size` on `port`'s device, for
/// GPUDirect: with a DMA-BUF fd, `ibv_reg_dmabuf_mr` (offset 0, iova
/// `base`); without, `ibv_reg_mr` on the device address (peer memory).
/// A range the device's registration cache covers already is shared; a
/// new one is added to the cache. The fd stays the caller's to close.
pub fn register_device(
    port: &IbPort,
    base: usize,
    size: usize,
    dmabuf_fd: Option<c_int>,
) -> crate::error::Result<std::sync::Arc<super::mr::Mr>> {
    let dev = &port.dev;
    if let Some(m) = dev.regs.lock().find(base, size) {
        return Ok(m);
    }
    match dmabuf_fd {
        Some(fd) => {
            // SAFETY: the device's live PD; the kernel checks fd and range.
            let mr = unsafe {
                super::mr::Mr::register_dmabuf(
                    dev.pd,
                    0,
                    size,
                    base as u64,
                    fd,
                    super::mr::access(false),
                )?
            };
            let mr = std::sync::Arc::new(mr);
            mr.mark_device();
            dev.regs.lock().insert(mr.clone());
            Ok(mr)
        }
        None => {
            // SAFETY: device memory the caller owns; with peer memory the
            // kernel pins it through the GPU driver, else registration fails.
            let mr = unsafe { dev.regs.lock().get(dev.pd, base, size, false) }?;
            mr.mark_device();
            Ok(mr)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BOTH: GdrCaps = GdrCaps {
        peermem: true,
        dmabuf: true,
    };
    const PEER: GdrCaps = GdrCaps {
        peermem: true,
        dmabuf: false,
    };

    #[test]
    fn ptr_support_follows_caps_and_level() {
        use PathType::*;
        let (h, c, d) = (NCCL_PTR_HOST, NCCL_PTR_CUDA, NCCL_PTR_DMABUF);
        assert_eq!(decide_ptr_support(GdrCaps::default(), Sys, Some(Loc)), h);
        assert_eq!(decide_ptr_support(PEER, Pxb, None), h | c);
        assert_eq!(decide_ptr_support(BOTH, Pxb, None), h | c | d);
        assert_eq!(decide_ptr_support(BOTH, Loc, None), h, "LOC turns it off");
        assert_eq!(decide_ptr_support(BOTH, Pxb, Some(Pix)), h | c | d);
        assert_eq!(decide_ptr_support(BOTH, Pxb, Some(Pxb)), h | c | d);
        assert_eq!(decide_ptr_support(BOTH, Pxb, Some(Phb)), h);
        assert_eq!(decide_ptr_support(BOTH, Phb, Some(Phb)), h | c | d);
        assert_eq!(decide_ptr_support(BOTH, Phb, Some(Sys)), h);
        assert_eq!(decide_ptr_support(BOTH, Sys, Some(Sys)), h | c | d);
    }

    #[test]
    fn engine_prefers_dmabuf_then_peermem_within_the_level() {
        use PathType::*;
        assert_eq!(choose(BOTH, Pxb, Some(Pix)), GdrMode::DmaBuf);
        assert_eq!(choose(PEER, Pxb, Some(Pxb)), GdrMode::PeerMem);
        assert!(
            matches!(choose(GdrCaps::default(), Sys, Some(Pix)), GdrMode::Staged(r) if r.contains("neither"))
        );
        assert!(
            matches!(choose(BOTH, Pxb, Some(Sys)), GdrMode::Staged(r) if r.contains("SYS") && r.contains("PXB"))
        );
        assert!(matches!(choose(BOTH, Loc, Some(Loc)), GdrMode::Staged(r) if r.contains("LOC")));
        // A NIC without a PCI location hangs off the CPU: PHB.
        assert!(matches!(choose(BOTH, Pxb, None), GdrMode::Staged(_)));
        assert_eq!(choose(BOTH, Phb, None), GdrMode::DmaBuf);
    }

    #[test]
    fn peermem_is_read_under_the_sysfs_root() {
        let root = std::env::temp_dir().join(format!("hetccl-peermem-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(root.join("module/ib_core")).unwrap();
        assert!(!peermem_loaded(&root));
        std::fs::create_dir_all(root.join("module/nvidia_peermem")).unwrap();
        assert!(peermem_loaded(&root));
        std::fs::remove_dir_all(root.join("module/nvidia_peermem")).unwrap();
        std::fs::create_dir_all(root.join("kernel/mm/memory_peers/nv_mem")).unwrap();
        std::fs::write(root.join("kernel/mm/memory_peers/nv_mem/version"), "1.0").unwrap();
        assert!(peermem_loaded(&root));
        let _ = std::fs::remove_dir_all(&root);
    }
}
