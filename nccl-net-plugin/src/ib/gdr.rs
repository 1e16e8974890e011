//! GPUDirect RDMA: whether the NIC can reach GPU memory, and so which
//! pointer types the verbs plugin advertises.
//!
//! - `NCCL_PTR_CUDA` when the `nvidia-peermem` (or legacy `nv_peer_mem`)
//!   kernel module is loaded: `ibv_reg_mr` then accepts device addresses.
//! - `NCCL_PTR_DMABUF` when `NCCL_DMABUF_ENABLE` is on, libibverbs has
//!   `ibv_reg_dmabuf_mr` and the CUDA driver has
//!   `cuMemGetHandleForAddressRange` (NCCL exports the fd, the plugin
//!   registers it in `regMrDmaBuf`).
//!
//! `NCCL_NET_GDR_LEVEL=LOC` (or 0) turns both off. None of this has run on
//! a GPU with a real NIC; see docs/rdma.md.

use hetccl_abi::net::{NCCL_PTR_CUDA, NCCL_PTR_DMABUF, NCCL_PTR_HOST};
use once_cell::sync::OnceCell;

/// Whether a peer-memory kernel module is loaded.
pub fn peermem_loaded() -> bool {
    [
        "/sys/module/nvidia_peermem",
        "/sys/module/nv_peer_mem",
        "/sys/kernel/mm/memory_peers/nv_mem/version",
    ]
    .iter()
    .any(|p| std::path::Path::new(p).exists())
}

/// Whether the CUDA driver (loaded at run time, never linked) can export
/// DMA-BUF handles.
pub fn cuda_dmabuf() -> bool {
    let name = std::env::var("HETCCL_CUDA_LIB").unwrap_or_else(|_| "libcuda.so.1".into());
    // SAFETY: the driver's initialisers do not run user code.
    let Ok(lib) = (unsafe { libloading::Library::new(&name) }) else {
        return false;
    };
    // SAFETY: only checks that the symbol exists.
    unsafe { lib.get::<*const u8>(b"cuMemGetHandleForAddressRange\0") }.is_ok()
}

/// The `ptrSupport` of a verbs device.
pub fn ptr_support() -> i32 {
    static P: OnceCell<i32> = OnceCell::new();
    *P.get_or_init(|| {
        let cfg = hetccl_core::config::get();
        let off = cfg
            .net_gdr_level
            .as_deref()
            .is_some_and(|l| l.eq_ignore_ascii_case("LOC") || l == "0");
        let mut p = NCCL_PTR_HOST;
        if off {
            return p;
        }
        if peermem_loaded() {
            p |= NCCL_PTR_CUDA;
        }
        let dmabuf = super::ffi::verbs().is_ok_and(|v| v.reg_dmabuf_mr.is_some());
        if cfg.dmabuf_enable && dmabuf && cuda_dmabuf() {
            p |= NCCL_PTR_DMABUF;
        }
        tracing::info!(target: "hetccl::NET", "NET/IB: GPUDirect RDMA: ptrSupport {p:#x} (peermem {}, dmabuf {})",
            peermem_loaded(), p & NCCL_PTR_DMABUF != 0);
        p
    })
}
