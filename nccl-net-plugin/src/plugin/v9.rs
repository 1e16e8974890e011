//! `ncclNetPlugin_v9`: one process-wide context; `size_t` sizes in isend
//! and irecv; the first version that advertises grouped receives.

use std::ffi::c_int;

use hetccl_abi::ncclResult_t;
use hetccl_abi::net::v9::{ncclNetProperties_v9_t, ncclNetVDeviceProps_v9_t, ncclNet_v9_t};

use super::common as c;
use super::{get_properties, guard, DevProps, PLUGIN_NAME};

fn fill(p: &DevProps) -> ncclNetProperties_v9_t {
    let v10 = super::v10::fill(p);
    ncclNetProperties_v9_t {
        name: v10.name,
        pciPath: v10.pciPath,
        guid: v10.guid,
        ptrSupport: v10.ptrSupport,
        regIsGlobal: v10.regIsGlobal,
        forceFlush: v10.forceFlush,
        speed: v10.speed,
        port: v10.port,
        latency: v10.latency,
        maxComms: v10.maxComms,
        maxRecvs: v10.maxRecvs,
        netDeviceType: v10.netDeviceType,
        netDeviceVersion: v10.netDeviceVersion,
        vProps: ncclNetVDeviceProps_v9_t {
            ndevs: v10.vProps.ndevs,
            devs: v10.vProps.devs,
        },
        maxP2pBytes: v10.maxP2pBytes,
        maxCollBytes: v10.maxCollBytes,
    }
}

unsafe extern "C" fn get_props(dev: c_int, props: *mut ncclNetProperties_v9_t) -> ncclResult_t {
    // SAFETY: pointer checked inside.
    guard("getProperties", || unsafe {
        get_properties(dev, props, fill)
    })
}

/// The v9 table.
#[no_mangle]
pub static ncclNetPlugin_v9: ncclNet_v9_t = ncclNet_v9_t {
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
    isend: Some(c::isend),
    irecv: Some(c::irecv),
    iflush: Some(c::iflush),
    test: Some(c::test),
    closeSend: Some(c::close_send),
    closeRecv: Some(c::close_recv),
    closeListen: Some(c::close_listen),
    getDeviceMr: Some(c::get_device_mr),
    irecvConsumed: Some(c::irecv_consumed),
    makeVDevice: None,
};
