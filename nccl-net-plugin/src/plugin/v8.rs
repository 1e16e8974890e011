//! `ncclNetPlugin_v8`: one process-wide context; `int` sizes in isend and
//! irecv; maxRecvs 1 (as aws-ofi-nccl: grouped receives only from v9).

use std::ffi::c_int;

use hetccl_abi::ncclResult_t;
use hetccl_abi::net::v8::{ncclNetProperties_v8_t, ncclNet_v8_t};

use super::common as c;
use super::{get_properties, guard, DevProps, PLUGIN_NAME};

pub(super) fn fill(p: &DevProps) -> ncclNetProperties_v8_t {
    ncclNetProperties_v8_t {
        name: p.name,
        pciPath: p.pci_path,
        guid: p.guid,
        ptrSupport: p.ptr_support,
        regIsGlobal: 0,
        speed: p.speed,
        port: p.port,
        latency: p.latency,
        maxComms: p.max_comms,
        maxRecvs: 1,
        netDeviceType: p.net_device_type,
        netDeviceVersion: p.net_device_version,
    }
}

unsafe extern "C" fn get_props(dev: c_int, props: *mut ncclNetProperties_v8_t) -> ncclResult_t {
    // SAFETY: pointer checked inside.
    guard("getProperties", || unsafe {
        get_properties(dev, props, fill)
    })
}

/// The v8 table.
#[no_mangle]
pub static ncclNetPlugin_v8: ncclNet_v8_t = ncclNet_v8_t {
    name: PLUGIN_NAME.as_ptr(),
    init: Some(c::init_legacy),
    devices: Some(c::devices),
    getProperties: Some(get_props),
    listen: Some(c::listen_legacy),
    connect: Some(c::connect_legacy),
    accept: Some(c::accept),
    regMr: Some(c::reg_mr),
    regMrDmaBuf: Some(c::reg_mr_dmabuf),
    deregMr: Some(c::dereg_mr),
    isend: Some(c::isend_int),
    irecv: Some(c::irecv_int),
    iflush: Some(c::iflush),
    test: Some(c::test),
    closeSend: Some(c::close_send),
    closeRecv: Some(c::close_recv),
    closeListen: Some(c::close_listen),
    getDeviceMr: Some(c::get_device_mr),
    irecvConsumed: Some(c::irecv_consumed),
};
