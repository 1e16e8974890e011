//! `ncclNetPlugin_v10`: one process-wide context; init takes the profiler
//! callback and connect a per-connection config.

use std::ffi::{c_int, c_void};

use hetccl_abi::ncclResult_t;
use hetccl_abi::net::v10::{ncclNetProperties_v10_t, ncclNetVDeviceProps_v10_t, ncclNet_v10_t};
use hetccl_abi::net::{
    ncclDebugLogger_t, ncclNetCommConfig_t, ncclNetDeviceHandle_t, ncclProfilerCallback_t,
};

use super::common as c;
use super::{get_properties, guard, CtxArg, DevProps, PLUGIN_NAME};

pub(super) fn fill(p: &DevProps) -> ncclNetProperties_v10_t {
    let mut v = ncclNetVDeviceProps_v10_t {
        ndevs: 1,
        ..Default::default()
    };
    v.devs[0] = p.dev;
    ncclNetProperties_v10_t {
        name: p.name,
        pciPath: p.pci_path,
        guid: p.guid,
        ptrSupport: p.ptr_support,
        regIsGlobal: 0,
        forceFlush: 0,
        speed: p.speed,
        port: p.port,
        latency: p.latency,
        maxComms: p.max_comms,
        maxRecvs: p.max_recvs,
        netDeviceType: p.net_device_type,
        netDeviceVersion: p.net_device_version,
        vProps: v,
        maxP2pBytes: p.max_p2p_bytes,
        maxCollBytes: p.max_coll_bytes,
    }
}

unsafe extern "C" fn init(
    logger: ncclDebugLogger_t,
    _prof: ncclProfilerCallback_t,
) -> ncclResult_t {
    guard("init", || super::init_legacy(logger))
}

unsafe extern "C" fn get_props(dev: c_int, props: *mut ncclNetProperties_v10_t) -> ncclResult_t {
    // SAFETY: pointer checked inside.
    guard("getProperties", || unsafe {
        get_properties(dev, props, fill)
    })
}

unsafe extern "C" fn connect(
    dev: c_int,
    _config: *mut ncclNetCommConfig_t,
    handle: *mut c_void,
    send_comm: *mut *mut c_void,
    _dev_comm: *mut *mut ncclNetDeviceHandle_t,
) -> ncclResult_t {
    // SAFETY: pointers checked inside.
    guard("connect", || unsafe {
        super::connect(CtxArg::Legacy, dev, handle, send_comm)
    })
}

/// The v10 table.
#[no_mangle]
pub static ncclNetPlugin_v10: ncclNet_v10_t = ncclNet_v10_t {
    name: PLUGIN_NAME.as_ptr(),
    init: Some(init),
    devices: Some(c::devices),
    getProperties: Some(get_props),
    listen: Some(c::listen_legacy),
    connect: Some(connect),
    accept: Some(c::accept),
    regMr: Some(c::reg_mr),
    regMrDmaBuf: Some(c::reg_mr_dmabuf),
    deregMr: Some(c::dereg_mr),
    isend: Some(c::isend_ph),
    irecv: Some(c::irecv_ph),
    iflush: Some(c::iflush),
    test: Some(c::test),
    closeSend: Some(c::close_send),
    closeRecv: Some(c::close_recv),
    closeListen: Some(c::close_listen),
    getDeviceMr: Some(c::get_device_mr),
    irecvConsumed: Some(c::irecv_consumed),
    makeVDevice: None,
};
