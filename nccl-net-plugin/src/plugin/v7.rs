//! `ncclNetPlugin_v7`: v8 with an `int` regMr size and no regIsGlobal property.

use std::ffi::c_int;

use hetccl_abi::ncclResult_t;
use hetccl_abi::net::v7::{ncclNetProperties_v7_t, ncclNet_v7_t};

use super::common as c;
use super::{get_properties, guard, DevProps, PLUGIN_NAME};

pub(super) fn fill(p: &DevProps) -> ncclNetProperties_v7_t {
    ncclNetProperties_v7_t {
        name: p.name,
        pciPath: p.pci_path,
        guid: p.guid,
        ptrSupport: p.ptr_support,
        speed: p.speed,
        port: p.port,
        latency: p.latency,
        maxComms: p.max_comms,
        maxRecvs: 1,
        netDeviceType: p.net_device_type,
        netDeviceVersion: p.net_device_version,
    }
}

unsafe extern "C" fn get_props(dev: c_int, props: *mut ncclNetProperties_v7_t) -> ncclResult_t {
    // SAFETY: pointer checked inside.
    guard("getProperties", || unsafe {
        get_properties(dev, props, fill)
    })
}

/// The v7 table.
#[no_mangle]
pub static ncclNetPlugin_v7: ncclNet_v7_t = ncclNet_v7_t {
    name: PLUGIN_NAME.as_ptr(),
    init: Some(c::init_legacy),
    devices: Some(c::devices),
    getProperties: Some(get_props),
    listen: Some(c::listen_legacy),
    connect: Some(c::connect_legacy),
    accept: Some(c::accept),
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
    getDeviceMr: Some(c::get_device_mr),
    irecvConsumed: Some(c::irecv_consumed),
};
