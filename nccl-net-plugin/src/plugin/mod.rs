//! The one internal API behind every `ncclNetPlugin_vN` table.
//!
//! Each adapter file (`v6.rs` … `v12.rs`) only converts its version's
//! argument types and calls these functions inside [`guard`]. Here C pointers
//! become Rust values: every pointer is checked for NULL, every size and
//! count is bounded, and every object handed to C (contexts, comms, memory
//! handles, requests) is a `Box` with a magic number that is checked when it
//! comes back.
#![allow(clippy::missing_safety_doc)]

pub mod v10;
pub mod v11;
pub mod v12;
pub mod v6;
pub mod v7;
pub mod v8;
pub mod v9;

pub mod backend;
mod common;
mod objects;
mod props;

use std::ffi::{c_int, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use hetccl_abi::net::{
    ncclDebugLogger_t, NCCL_NET_OPTIONAL_RECV_COMPLETION, NCCL_PTR_CUDA, NCCL_PTR_HOST,
};
use hetccl_abi::{ncclResult_t, NcclResult};
use parking_lot::Mutex;

use crate::error::{NetError, Result};
use crate::tcp::{RecvBuf, TcpNet, TcpOptions, MAX_RECVS};
use crate::wire::HANDLE_BYTES;
use backend::{Backend, Net};
use objects::{Ctx, ListenObj, MrObj, RecvObj, ReqObj, SendObj};
pub use props::{device_props, devices, DevProps};

/// The plugin name NCCL matches against `NCCL_NET`.
pub const PLUGIN_NAME: &std::ffi::CStr = c"hetccl";

/// Runs `body` for the C entry point `name`: a panic becomes
/// `ncclInternalError`, an error its code; both are logged at WARN.
pub fn guard<F: FnOnce() -> Result<()>>(name: &'static str, body: F) -> ncclResult_t {
    hetccl_core::obs::ensure_init();
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => NcclResult::Success.raw(),
        Ok(Err(e)) => {
            tracing::warn!(target: "hetccl::NET", "{name}: {e}");
            e.code().raw()
        }
        Err(p) => {
            let what = p
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            tracing::error!(target: "hetccl::NET", "{name}: internal error (panic: {what})");
            NcclResult::InternalError.raw()
        }
    }
}

fn nonnull<T>(p: *mut T, what: &str) -> Result<*mut T> {
    if p.is_null() {
        Err(NetError::InvalidArgument(format!("{what} is NULL")))
    } else {
        Ok(p)
    }
}

/// Where a call's context comes from.
#[derive(Debug, Clone, Copy)]
pub enum CtxArg {
    /// v6–v10: the process-wide context made by `init`.
    Legacy,
    /// v11/v12: the pointer `init` returned.
    Ptr(*mut c_void),
}

/// The process-wide context of the v6–v10 tables.
static LEGACY: Mutex<Option<Arc<Net>>> = Mutex::new(None);

fn net_of(ctx: CtxArg) -> Result<Arc<Net>> {
    match ctx {
        CtxArg::Legacy => LEGACY
            .lock()
            .clone()
            .ok_or_else(|| NetError::InvalidUsage("init was not called".into())),
        // SAFETY: validated by magic; the pointer came from init_ctx.
        CtxArg::Ptr(p) => Ok(unsafe { Ctx::from_ptr(p)? }.net.clone()),
    }
}

fn new_net() -> Result<Arc<Net>> {
    let cfg = hetccl_core::config::get();
    Ok(Arc::new(match backend::backend() {
        Backend::Tcp => Net::Tcp(TcpNet::new(
            props::device_list()?,
            TcpOptions::from_config(cfg),
        )),
        Backend::Ib(ports) => Net::Ib(crate::ib::IbNet::new(
            // (devices() logs the device table, as device_list does for TCP.)
            props::devices().map(|_| ports.clone())?,
            props::setup_ip(),
            crate::ib::IbOptions::from_config(cfg),
        )),
    }))
}

fn install_logger(logger: ncclDebugLogger_t) {
    if let Some(l) = logger {
        hetccl_core::obs::set_external_logger(Some(l));
    }
}

/// `init` of v6–v10: makes the process-wide context (once).
pub fn init_legacy(logger: ncclDebugLogger_t) -> Result<()> {
    install_logger(logger);
    let mut g = LEGACY.lock();
    if g.is_none() {
        *g = Some(new_net()?);
    }
    Ok(())
}

/// `init` of v11/v12: a new context per communicator.
pub unsafe fn init_ctx(
    ctx: *mut *mut c_void,
    comm_id: u64,
    logger: ncclDebugLogger_t,
) -> Result<()> {
    let ctx = nonnull(ctx, "ctx")?;
    install_logger(logger);
    let obj = Ctx::new(new_net()?);
    tracing::debug!(target: "hetccl::NET", "init: context for comm {comm_id:#x}");
    // SAFETY: checked non-NULL.
    unsafe { *ctx = Box::into_raw(obj).cast() };
    Ok(())
}

/// `finalize` of v11/v12: stops and joins every helper thread of the
/// context's comms, then frees it.
pub unsafe fn finalize(ctx: *mut c_void) -> Result<()> {
    // SAFETY: validated by magic; NCCL passes each ctx to finalize once.
    let obj = unsafe { Ctx::take(ctx)? };
    obj.net.shutdown();
    drop(obj);
    Ok(())
}

/// `listen`: fills the 128-byte handle and returns a listen comm.
pub unsafe fn listen(
    ctx: CtxArg,
    dev: c_int,
    handle: *mut c_void,
    listen_comm: *mut *mut c_void,
) -> Result<()> {
    let handle = nonnull(handle, "handle")?.cast::<[u8; HANDLE_BYTES]>();
    let out = nonnull(listen_comm, "listenComm")?;
    let net = net_of(ctx)?;
    let dev =
        usize::try_from(dev).map_err(|_| NetError::InvalidArgument(format!("device {dev}")))?;
    let (l, h) = net.listen(dev)?;
    // SAFETY: NCCL's handle buffer is NCCL_NET_HANDLE_MAXSIZE bytes; out is non-NULL.
    unsafe {
        handle.write_unaligned(h);
        *out = ListenObj::boxed(l, net);
    }
    Ok(())
}

/// `connect`: non-blocking; leaves `*send_comm` NULL until connected.
pub unsafe fn connect(
    ctx: CtxArg,
    dev: c_int,
    handle: *mut c_void,
    send_comm: *mut *mut c_void,
) -> Result<()> {
    let out = nonnull(send_comm, "sendComm")?;
    // SAFETY: non-NULL out pointer.
    unsafe { *out = std::ptr::null_mut() };
    let handle = nonnull(handle, "handle")?.cast::<[u8; HANDLE_BYTES]>();
    let net = net_of(ctx)?;
    let dev =
        usize::try_from(dev).map_err(|_| NetError::InvalidArgument(format!("device {dev}")))?;
    // SAFETY: NCCL's handle buffer is 128 bytes and ours for this call.
    let mut h = unsafe { handle.read_unaligned() };
    let r = net.connect(dev, &mut h);
    // SAFETY: as above.
    unsafe { handle.write_unaligned(h) };
    if let Some(c) = r? {
        // SAFETY: non-NULL out pointer.
        unsafe { *out = SendObj::boxed(c) };
    }
    Ok(())
}

/// `accept`: non-blocking; leaves `*recv_comm` NULL until a comm arrives.
pub unsafe fn accept(listen_comm: *mut c_void, recv_comm: *mut *mut c_void) -> Result<()> {
    let out = nonnull(recv_comm, "recvComm")?;
    // SAFETY: non-NULL out pointer.
    unsafe { *out = std::ptr::null_mut() };
    // SAFETY: validated by magic.
    let l = unsafe { ListenObj::from_ptr(listen_comm)? };
    let mut g = l.listen.lock();
    if let Some(c) = l.net.accept(&mut g)? {
        // SAFETY: non-NULL out pointer.
        unsafe { *out = RecvObj::boxed(c) };
    }
    Ok(())
}

/// `regMr`: host memory, and GPU memory (`NCCL_PTR_CUDA`) on a verbs comm
/// when GPUDirect RDMA is possible (`ib/gdr.rs`).
pub unsafe fn reg_mr(
    comm: *mut c_void,
    data: *mut c_void,
    size: usize,
    type_: c_int,
    mhandle: *mut *mut c_void,
) -> Result<()> {
    let out = nonnull(mhandle, "mhandle")?;
    let port = objects::check_comm(comm)?;
    let gdr = port
        .as_ref()
        .is_some_and(|p| crate::ib::gdr::ptr_support(p) & NCCL_PTR_CUDA != 0);
    if type_ != NCCL_PTR_HOST && !(type_ == NCCL_PTR_CUDA && gdr) {
        return Err(NetError::Internal(format!(
            "regMr of memory type {type_}: only host memory is supported{}",
            if port.is_some() {
                " (no GPUDirect RDMA: nvidia-peermem is not loaded, or the GPU is beyond NCCL_NET_GDR_LEVEL)"
            } else {
                ""
            }
        )));
    }
    if data.is_null() && size > 0 {
        return Err(NetError::InvalidArgument("regMr of a NULL buffer".into()));
    }
    let mr = match &port {
        // SAFETY: NCCL registers memory it owns; the kernel checks the range.
        Some(p) if size > 0 => Some(unsafe {
            p.dev.regs.lock().get(
                p.dev.pd,
                data as usize,
                size,
                crate::ib::IbOptions::from_config(hetccl_core::config::get()).relaxed,
            )?
        }),
        _ => None,
    };
    if type_ == NCCL_PTR_CUDA {
        if let Some(m) = &mr {
            m.mark_device();
        }
    }
    // SAFETY: non-NULL out pointer.
    unsafe { *out = MrObj::boxed(data as usize, size, mr, type_ == NCCL_PTR_CUDA) };
    Ok(())
}

/// `regMrDmaBuf`: host memory as `regMr`; device memory through
/// `ibv_reg_dmabuf_mr` on a verbs comm (TCP has no DMA-BUF support).
pub unsafe fn reg_mr_dmabuf(
    comm: *mut c_void,
    data: *mut c_void,
    size: usize,
    type_: c_int,
    offset: u64,
    fd: c_int,
    mhandle: *mut *mut c_void,
) -> Result<()> {
    if type_ == NCCL_PTR_HOST {
        // SAFETY: forwarded contract.
        return unsafe { reg_mr(comm, data, size, type_, mhandle) };
    }
    let out = nonnull(mhandle, "mhandle")?;
    let Some(p) = objects::check_comm(comm)? else {
        return Err(NetError::Internal(
            "regMrDmaBuf: DMA-BUF memory needs a verbs comm".into(),
        ));
    };
    if fd < 0 {
        return Err(NetError::InvalidArgument(format!("regMrDmaBuf: fd {fd}")));
    }
    // SAFETY: the device's live PD; the kernel checks the fd and range.
    let mr = unsafe {
        crate::ib::mr::Mr::register_dmabuf(
            p.dev.pd,
            offset,
            size,
            data as u64,
            fd,
            crate::ib::mr::access(false),
        )?
    };
    mr.mark_device();
    // SAFETY: non-NULL out pointer.
    unsafe { *out = MrObj::boxed(data as usize, size, Some(Arc::new(mr)), true) };
    Ok(())
}

/// `deregMr`: frees a handle from `regMr`. On verbs the range also leaves
/// the registration cache (NCCL deregisters memory it is about to free);
/// other handles of the range keep their registration until they go.
pub unsafe fn dereg_mr(comm: *mut c_void, mhandle: *mut c_void) -> Result<()> {
    let port = objects::check_comm(comm)?;
    // SAFETY: validated by magic.
    let (addr, size) = unsafe { MrObj::free(mhandle)? };
    if let Some(p) = port {
        p.dev.regs.lock().invalidate(addr, size);
    }
    Ok(())
}

/// `isend`: `*request` stays NULL when NCCL should retry.
pub unsafe fn isend(
    send_comm: *mut c_void,
    data: *mut c_void,
    size: usize,
    tag: c_int,
    mhandle: *mut c_void,
    request: *mut *mut c_void,
) -> Result<()> {
    let out = nonnull(request, "request")?;
    // SAFETY: non-NULL out pointer.
    unsafe { *out = std::ptr::null_mut() };
    // SAFETY: validated by magic.
    let s = unsafe { SendObj::from_ptr(send_comm)? };
    if size > props::MAX_P2P_BYTES {
        return Err(NetError::InvalidArgument(format!(
            "isend of {size} bytes (max {})",
            props::MAX_P2P_BYTES
        )));
    }
    // SAFETY: validated by magic (NULL: no registration).
    let mr = unsafe { MrObj::mr_of(mhandle)? };
    // SAFETY: NCCL keeps the buffer valid until the request completes.
    if let Some(r) = unsafe { s.comm.isend(data as *const u8, size, tag, mr)? } {
        // SAFETY: non-NULL out pointer.
        unsafe { *out = ReqObj::send(s, r) };
    }
    Ok(())
}

/// The receive sizes of an irecv call, as the version declares them.
#[derive(Debug, Clone, Copy)]
pub enum SizesIn {
    /// `int*` (v6–v8).
    Int(*const c_int),
    /// `size_t*` (v9+).
    Size(*const usize),
}

/// `irecv`: `n` buffers share one request; `*request == 0x1` on input is
/// NCCL's optional-completion hint.
pub unsafe fn irecv(
    recv_comm: *mut c_void,
    n: c_int,
    data: *mut *mut c_void,
    sizes: SizesIn,
    tags: *mut c_int,
    mhandles: *mut *mut c_void,
    request: *mut *mut c_void,
) -> Result<()> {
    let out = nonnull(request, "request")?;
    // SAFETY: non-NULL in/out pointer.
    let hint = unsafe { *out } as usize == NCCL_NET_OPTIONAL_RECV_COMPLETION;
    // SAFETY: as above.
    unsafe { *out = std::ptr::null_mut() };
    // SAFETY: validated by magic.
    let r = unsafe { RecvObj::from_ptr(recv_comm)? };
    let n = usize::try_from(n)
        .ok()
        .filter(|&n| (1..=MAX_RECVS).contains(&n));
    let n = n.ok_or_else(|| {
        NetError::InvalidArgument(format!("irecv of {n:?} buffers (1..={MAX_RECVS})"))
    })?;
    let data = nonnull(data, "data")?;
    let tags = nonnull(tags, "tags")?;
    let mut bufs = [RecvBuf {
        ptr: std::ptr::null_mut(),
        cap: 0,
        tag: 0,
    }; MAX_RECVS];
    for (i, b) in bufs.iter_mut().enumerate().take(n) {
        // SAFETY: NCCL passes arrays of n entries.
        let cap = unsafe {
            match sizes {
                SizesIn::Int(p) => usize::try_from(*nonnull(p.cast_mut(), "sizes")?.add(i))
                    .map_err(|_| NetError::InvalidArgument("negative receive size".into()))?,
                SizesIn::Size(p) => *nonnull(p.cast_mut(), "sizes")?.add(i),
            }
        };
        // SAFETY: as above.
        *b = unsafe {
            RecvBuf {
                ptr: (*data.add(i)).cast(),
                cap,
                tag: *tags.add(i),
            }
        };
    }
    let mut mrs: [Option<Arc<crate::ib::mr::Mr>>; MAX_RECVS] = Default::default();
    if !mhandles.is_null() {
        for (i, m) in mrs.iter_mut().enumerate().take(n) {
            // SAFETY: NCCL passes n handles (each NULL or from regMr).
            *m = unsafe { MrObj::mr_of(*mhandles.add(i))? };
        }
    }
    // SAFETY: NCCL keeps the buffers valid until the request completes.
    if let Some(q) = unsafe { r.comm.irecv(&bufs[..n], &mrs[..n], hint && n == 1)? } {
        // SAFETY: non-NULL out pointer.
        unsafe { *out = ReqObj::recv(r, q) };
    }
    Ok(())
}

/// `iflush`: on a verbs comm, when the last non-empty buffer of a
/// receive is GPU memory (registered as `NCCL_PTR_CUDA` or DMA-BUF), an
/// RDMA read of it on a loopback QP (`ib/flush.rs`), whose request `test`
/// completes. Host memory needs no flush: the request is NULL.
pub unsafe fn iflush(
    recv_comm: *mut c_void,
    n: c_int,
    data: *mut *mut c_void,
    sizes: *mut c_int,
    mhandles: *mut *mut c_void,
    request: *mut *mut c_void,
) -> Result<()> {
    let out = nonnull(request, "request")?;
    // SAFETY: non-NULL out pointer.
    unsafe { *out = std::ptr::null_mut() };
    // SAFETY: validated by magic.
    let r = unsafe { RecvObj::from_ptr(recv_comm)? };
    let Some(port) = r.comm.ib_port() else {
        return Ok(());
    };
    let n = usize::try_from(n)
        .ok()
        .filter(|&n| n <= MAX_RECVS)
        .ok_or_else(|| NetError::InvalidArgument(format!("iflush of {n} buffers")))?;
    if n == 0 || mhandles.is_null() {
        return Ok(());
    }
    let data = nonnull(data, "data")?;
    let sizes = nonnull(sizes, "sizes")?;
    for i in (0..n).rev() {
        // SAFETY: NCCL passes n entries in each array.
        let (ptr, size, mh) = unsafe { (*data.add(i), *sizes.add(i), *mhandles.add(i)) };
        if size <= 0 {
            continue;
        }
        // SAFETY: each handle is NULL or from regMr (checked by magic).
        let Some(rkey) = (unsafe { MrObj::device_rkey(mh)? }) else {
            return Ok(());
        };
        let f = r.flusher(port)?;
        let id = f.post(ptr as u64, rkey)?;
        // SAFETY: non-NULL out pointer.
        unsafe { *out = ReqObj::flush(r, id) };
        return Ok(());
    }
    Ok(())
}

/// `test`: sets `*done`; when done, writes the sizes (if `sizes` is
/// non-NULL) and frees the request.
pub unsafe fn test(request: *mut c_void, done: *mut c_int, sizes: *mut c_int) -> Result<()> {
    let done = nonnull(done, "done")?;
    // SAFETY: non-NULL out pointer.
    unsafe { *done = 0 };
    // SAFETY: validated by magic; NCCL tests a request until done.
    unsafe { objects::test_request(request, done, sizes) }
}

/// `closeSend`.
pub unsafe fn close_send(comm: *mut c_void) -> Result<()> {
    // SAFETY: validated by magic.
    unsafe { SendObj::close(comm) }
}

/// `closeRecv`.
pub unsafe fn close_recv(comm: *mut c_void) -> Result<()> {
    // SAFETY: validated by magic.
    unsafe { RecvObj::close(comm) }
}

/// `closeListen`.
pub unsafe fn close_listen(comm: *mut c_void) -> Result<()> {
    // SAFETY: validated by magic.
    unsafe { ListenObj::close(comm) }
}

/// `getDeviceMr`: host plugin, so no device handle.
pub unsafe fn get_device_mr(dptr_mhandle: *mut *mut c_void) -> Result<()> {
    let out = nonnull(dptr_mhandle, "dptr_mhandle")?;
    // SAFETY: non-NULL out pointer.
    unsafe { *out = std::ptr::null_mut() };
    Ok(())
}

/// `irecvConsumed`: nothing to do for host memory.
pub fn irecv_consumed() -> Result<()> {
    Ok(())
}

/// `setNetAttr`: the hints are accepted and ignored.
pub unsafe fn set_net_attr(ctx: *mut c_void) -> Result<()> {
    // SAFETY: validated by magic.
    unsafe { Ctx::from_ptr(ctx)? };
    Ok(())
}

/// Writes properties: validates `dev` and the output pointer, then lets the
/// adapter fill its own struct from [`DevProps`].
pub unsafe fn get_properties<T>(
    dev: c_int,
    out: *mut T,
    fill: impl FnOnce(&DevProps) -> T,
) -> Result<()> {
    let out = nonnull(out, "props")?;
    let p = device_props(dev)?;
    // SAFETY: non-NULL, and NCCL passes a struct of this version's type.
    unsafe { out.write(fill(&p)) };
    Ok(())
}

/// `devices`.
pub unsafe fn get_devices(ndev: *mut c_int) -> Result<()> {
    let out = nonnull(ndev, "ndev")?;
    let n = devices()?;
    // SAFETY: non-NULL out pointer.
    unsafe { *out = n };
    Ok(())
}
