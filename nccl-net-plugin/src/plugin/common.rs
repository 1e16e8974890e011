//! C entry points whose signature is the same in several ABI versions. The
//! adapter files put them in their tables next to their own functions.

use std::ffi::{c_int, c_void};

use hetccl_abi::ncclResult_t;

use super::guard;

/// `devices(int* ndev)`.
pub unsafe extern "C" fn devices(ndev: *mut c_int) -> ncclResult_t {
    // SAFETY: pointer checked inside.
    guard("devices", || unsafe { super::get_devices(ndev) })
}

/// `regMr(comm, data, size_t size, type, mhandle)` (v8+).
pub unsafe extern "C" fn reg_mr(
    comm: *mut c_void,
    data: *mut c_void,
    size: usize,
    type_: c_int,
    mhandle: *mut *mut c_void,
) -> ncclResult_t {
    // SAFETY: pointers checked inside.
    guard("regMr", || unsafe {
        super::reg_mr(comm, data, size, type_, mhandle)
    })
}

/// `regMr(comm, data, int size, type, mhandle)` (v6, v7).
pub unsafe extern "C" fn reg_mr_int(
    comm: *mut c_void,
    data: *mut c_void,
    size: c_int,
    type_: c_int,
    mhandle: *mut *mut c_void,
) -> ncclResult_t {
    guard("regMr", || {
        let size = usize::try_from(size)
            .map_err(|_| crate::NetError::InvalidArgument(format!("regMr size {size}")))?;
        // SAFETY: pointers checked inside.
        unsafe { super::reg_mr(comm, data, size, type_, mhandle) }
    })
}

/// `regMrDmaBuf(comm, data, size, type, offset, fd, mhandle)`.
pub unsafe extern "C" fn reg_mr_dmabuf(
    comm: *mut c_void,
    data: *mut c_void,
    size: usize,
    type_: c_int,
    offset: u64,
    fd: c_int,
    mhandle: *mut *mut c_void,
) -> ncclResult_t {
    // SAFETY: pointers checked inside.
    guard("regMrDmaBuf", || unsafe {
        super::reg_mr_dmabuf(comm, data, size, type_, offset, fd, mhandle)
    })
}

/// `deregMr(comm, mhandle)`.
pub unsafe extern "C" fn dereg_mr(comm: *mut c_void, mhandle: *mut c_void) -> ncclResult_t {
    // SAFETY: pointers checked inside.
    guard("deregMr", || unsafe { super::dereg_mr(comm, mhandle) })
}

/// `iflush(recvComm, n, data, int* sizes, mhandles, request)`.
pub unsafe extern "C" fn iflush(
    recv_comm: *mut c_void,
    n: c_int,
    data: *mut *mut c_void,
    sizes: *mut c_int,
    mhandles: *mut *mut c_void,
    request: *mut *mut c_void,
) -> ncclResult_t {
    // SAFETY: pointers checked inside.
    guard("iflush", || unsafe {
        super::iflush(recv_comm, n, data, sizes, mhandles, request)
    })
}

/// `test(request, done, sizes)`.
pub unsafe extern "C" fn test(
    request: *mut c_void,
    done: *mut c_int,
    sizes: *mut c_int,
) -> ncclResult_t {
    // SAFETY: pointers checked inside.
    guard("test", || unsafe { super::test(request, done, sizes) })
}

/// `closeSend(sendComm)`.
pub unsafe extern "C" fn close_send(comm: *mut c_void) -> ncclResult_t {
    // SAFETY: pointer checked inside.
    guard("closeSend", || unsafe { super::close_send(comm) })
}

/// `closeRecv(recvComm)`.
pub unsafe extern "C" fn close_recv(comm: *mut c_void) -> ncclResult_t {
    // SAFETY: pointer checked inside.
    guard("closeRecv", || unsafe { super::close_recv(comm) })
}

/// `closeListen(listenComm)`.
pub unsafe extern "C" fn close_listen(comm: *mut c_void) -> ncclResult_t {
    // SAFETY: pointer checked inside.
    guard("closeListen", || unsafe { super::close_listen(comm) })
}

/// `getDeviceMr(comm, mhandle, dptr_mhandle)`: no device handle.
pub unsafe extern "C" fn get_device_mr(
    _comm: *mut c_void,
    _mhandle: *mut c_void,
    dptr: *mut *mut c_void,
) -> ncclResult_t {
    // SAFETY: pointer checked inside.
    guard("getDeviceMr", || unsafe { super::get_device_mr(dptr) })
}

/// `irecvConsumed(recvComm, n, request)`.
pub unsafe extern "C" fn irecv_consumed(
    _comm: *mut c_void,
    _n: c_int,
    _request: *mut c_void,
) -> ncclResult_t {
    guard("irecvConsumed", super::irecv_consumed)
}

/// `accept(listenComm, recvComm, recvDevComm)` (v7+); host plugin: `*recvDevComm` untouched.
pub unsafe extern "C" fn accept(
    listen: *mut c_void,
    recv_comm: *mut *mut c_void,
    _dev: *mut *mut hetccl_abi::net::ncclNetDeviceHandle_t,
) -> ncclResult_t {
    // SAFETY: pointers checked inside.
    guard("accept", || unsafe { super::accept(listen, recv_comm) })
}

/// `isend` with a `size_t` size (v9+).
pub unsafe extern "C" fn isend(
    send_comm: *mut c_void,
    data: *mut c_void,
    size: usize,
    tag: c_int,
    mhandle: *mut c_void,
    request: *mut *mut c_void,
) -> ncclResult_t {
    // SAFETY: pointers checked inside.
    guard("isend", || unsafe {
        super::isend(send_comm, data, size, tag, mhandle, request)
    })
}

/// `isend` with an `int` size (v6–v8).
pub unsafe extern "C" fn isend_int(
    send_comm: *mut c_void,
    data: *mut c_void,
    size: c_int,
    tag: c_int,
    mhandle: *mut c_void,
    request: *mut *mut c_void,
) -> ncclResult_t {
    guard("isend", || {
        let size = usize::try_from(size)
            .map_err(|_| crate::NetError::InvalidArgument(format!("isend size {size}")))?;
        // SAFETY: pointers checked inside.
        unsafe { super::isend(send_comm, data, size, tag, mhandle, request) }
    })
}

/// `irecv` with `int` sizes (v6–v8).
pub unsafe extern "C" fn irecv_int(
    recv_comm: *mut c_void,
    n: c_int,
    data: *mut *mut c_void,
    sizes: *mut c_int,
    tags: *mut c_int,
    mhandles: *mut *mut c_void,
    request: *mut *mut c_void,
) -> ncclResult_t {
    // SAFETY: pointers checked inside.
    guard("irecv", || unsafe {
        super::irecv(
            recv_comm,
            n,
            data,
            super::SizesIn::Int(sizes),
            tags,
            mhandles,
            request,
        )
    })
}

/// `irecv` with `size_t` sizes (v9).
pub unsafe extern "C" fn irecv(
    recv_comm: *mut c_void,
    n: c_int,
    data: *mut *mut c_void,
    sizes: *mut usize,
    tags: *mut c_int,
    mhandles: *mut *mut c_void,
    request: *mut *mut c_void,
) -> ncclResult_t {
    // SAFETY: pointers checked inside.
    guard("irecv", || unsafe {
        super::irecv(
            recv_comm,
            n,
            data,
            super::SizesIn::Size(sizes),
            tags,
            mhandles,
            request,
        )
    })
}

/// `isend` with a profiler handle (v10+).
pub unsafe extern "C" fn isend_ph(
    send_comm: *mut c_void,
    data: *mut c_void,
    size: usize,
    tag: c_int,
    mhandle: *mut c_void,
    _phandle: *mut c_void,
    request: *mut *mut c_void,
) -> ncclResult_t {
    // SAFETY: forwarded.
    unsafe { isend(send_comm, data, size, tag, mhandle, request) }
}

/// `irecv` with profiler handles (v10+).
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn irecv_ph(
    recv_comm: *mut c_void,
    n: c_int,
    data: *mut *mut c_void,
    sizes: *mut usize,
    tags: *mut c_int,
    mhandles: *mut *mut c_void,
    _phandles: *mut *mut c_void,
    request: *mut *mut c_void,
) -> ncclResult_t {
    // SAFETY: forwarded.
    unsafe { irecv(recv_comm, n, data, sizes, tags, mhandles, request) }
}

/// `init(logger)` of v6–v9.
pub unsafe extern "C" fn init_legacy(logger: hetccl_abi::net::ncclDebugLogger_t) -> ncclResult_t {
    guard("init", || super::init_legacy(logger))
}

/// `listen(dev, handle, listenComm)` of v6–v10.
pub unsafe extern "C" fn listen_legacy(
    dev: c_int,
    handle: *mut c_void,
    listen_comm: *mut *mut c_void,
) -> ncclResult_t {
    // SAFETY: pointers checked inside.
    guard("listen", || unsafe {
        super::listen(super::CtxArg::Legacy, dev, handle, listen_comm)
    })
}

/// `connect(dev, handle, sendComm, sendDevComm)` of v7–v9.
pub unsafe extern "C" fn connect_legacy(
    dev: c_int,
    handle: *mut c_void,
    send_comm: *mut *mut c_void,
    _dev_comm: *mut *mut hetccl_abi::net::ncclNetDeviceHandle_t,
) -> ncclResult_t {
    // SAFETY: pointers checked inside.
    guard("connect", || unsafe {
        super::connect(super::CtxArg::Legacy, dev, handle, send_comm)
    })
}

/// `init(ctx, commId, config, logger, profiler)` of v11/v12.
pub unsafe extern "C" fn init_ctx(
    ctx: *mut *mut c_void,
    comm_id: u64,
    _config: *mut hetccl_abi::net::ncclNetCommConfig_t,
    logger: hetccl_abi::net::ncclDebugLogger_t,
    _prof: hetccl_abi::net::ncclProfilerCallback_t,
) -> ncclResult_t {
    // SAFETY: pointer checked inside.
    guard("init", || unsafe { super::init_ctx(ctx, comm_id, logger) })
}

/// `listen(ctx, dev, handle, listenComm)` of v11/v12.
pub unsafe extern "C" fn listen_ctx(
    ctx: *mut c_void,
    dev: c_int,
    handle: *mut c_void,
    listen_comm: *mut *mut c_void,
) -> ncclResult_t {
    // SAFETY: pointers checked inside.
    guard("listen", || unsafe {
        super::listen(super::CtxArg::Ptr(ctx), dev, handle, listen_comm)
    })
}

/// `connect(ctx, dev, handle, sendComm, sendDevComm)` of v11/v12.
pub unsafe extern "C" fn connect_ctx(
    ctx: *mut c_void,
    dev: c_int,
    handle: *mut c_void,
    send_comm: *mut *mut c_void,
    _dev_comm: *mut *mut hetccl_abi::net::ncclNetDeviceHandle_t,
) -> ncclResult_t {
    // SAFETY: pointers checked inside.
    guard("connect", || unsafe {
        super::connect(super::CtxArg::Ptr(ctx), dev, handle, send_comm)
    })
}

/// `finalize(ctx)` of v11/v12.
pub unsafe extern "C" fn finalize(ctx: *mut c_void) -> ncclResult_t {
    // SAFETY: pointer checked inside.
    guard("finalize", || unsafe { super::finalize(ctx) })
}

/// `setNetAttr(ctx, attr)` of v11/v12.
pub unsafe extern "C" fn set_net_attr(
    ctx: *mut c_void,
    _attr: *mut hetccl_abi::net::ncclNetAttr_t,
) -> ncclResult_t {
    // SAFETY: pointer checked inside.
    guard("setNetAttr", || unsafe { super::set_net_attr(ctx) })
}
