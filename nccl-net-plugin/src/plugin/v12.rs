//! `ncclNetPlugin_v12`: NCCL uses this table directly. Contexts per
//! communicator; properties with 8-device vProps, rail and plane ids.

use std::ffi::c_int;

use hetccl_abi::ncclResult_t;
use hetccl_abi::net::v12::{ncclNetProperties_v12_t, ncclNetVDeviceProps_v12_t, ncclNet_v12_t};

use super::common as c;
use super::{get_properties, guard, DevProps, PLUGIN_NAME};

fn fill(p: &DevProps) -> ncclNetProperties_v12_t {
    let mut v = ncclNetVDeviceProps_v12_t {
        ndevs: 1,
        ..Default::default()
    };
    v.devs[0] = p.dev;
    ncclNetProperties_v12_t {
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
        maxMultiRequestSize: 1,
        railId: -1,
        planeId: -1,
    }
}

unsafe extern "C" fn get_props(dev: c_int, props: *mut ncclNetProperties_v12_t) -> ncclResult_t {
    // SAFETY: pointer checked inside.
    guard("getProperties", || unsafe {
        get_properties(dev, props, fill)
    })
}

/// The v12 table.
#[no_mangle]
pub static ncclNetPlugin_v12: ncclNet_v12_t = ncclNet_v12_t {
    name: PLUGIN_NAME.as_ptr(),
    init: Some(c::init_ctx),
    devices: Some(c::devices),
    getProperties: Some(get_props),
    listen: Some(c::listen_ctx),
    connect: Some(c::connect_ctx),
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
    finalize: Some(c::finalize),
    setNetAttr: Some(c::set_net_attr),
};
