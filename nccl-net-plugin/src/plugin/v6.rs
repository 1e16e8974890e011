//! `ncclNetPlugin_v6`: no device handles in connect/accept, no getDeviceMr
//! or irecvConsumed, and the 48-byte properties.

use std::ffi::{c_int, c_void};

use hetccl_abi::ncclResult_t;
use hetccl_abi::net::v6::{ncclNetProperties_v6_t, ncclNet_v6_t};

use super::common as c;
use super::{get_properties, guard, CtxArg, DevProps, PLUGIN_NAME};

fn fill(p: &DevProps) -> ncclNetProperties_v6_t {
    ncclNetProperties_v6_t {
        name: p.name,
        pciPath: p.pci_path,
        guid: p.guid,
        ptrSupport: p.ptr_support,
        speed: p.speed,
        port: p.port,
        latency: p.latency,
        maxComms: p.max_comms,
        maxRecvs: 1,
    }
}

unsafe extern "C" fn get_props(dev: c_int, props: *mut ncclNetProperties_v6_t) -> ncclResult_t {
    // SAFETY: pointer checked inside.
    guard("getProperties", || unsafe {
        get_properties(dev, props, fill)
    })
}

unsafe extern "C" fn connect(
    dev: c_int,
    handle: *mut c_void,
    send_comm: *mut *mut c_void,
) -> ncclResult_t {
    // SAFETY: pointers checked inside.
    guard("connect", || unsafe {
        super::connect(CtxArg::Legacy, dev, handle, send_comm)
    })
}

unsafe extern "C" fn accept(listen: *mut c_void, recv_comm: *mut *mut c_void) -> ncclResult_t {
    // SAFETY: pointers checked inside.
    guard("accept", || unsafe { super::accept(listen, recv_comm) })
}

/// The v6 table.
#[no_mangle]
pub static ncclNetPlugin_v6: ncclNet_v6_t = ncclNet_v6_t {
    name: PLUGIN_NAME.as_ptr(),
    init: Some(c::init_legacy),
    devices: Some(c::devices),
    getProperties: Some(get_props),
    listen: Some(c::listen_legacy),
    connect: Some(connect),
    accept: Some(accept),
    regMr: Some(c::reg_mr_int),
    regMrDmaBuf: Some(c::reg_mr_dmabuf),
    deregMr: Some(c::dereg_mr),
    isend: Some(c::isend_int),
    irecv: Some(c::irecv_int),
    iflush: Some(c::iflush),
    test: Some(c::test),
    closeSend: Some(c::close_send),
    closeRecv: Some(c::close_recv),
    closeListen: Some(c::close_listen),
};
