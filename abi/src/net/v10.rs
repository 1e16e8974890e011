//! `ncclNet_v10_t` (`net_v10.h`): 20 slots; init takes the profiler callback; connect takes a per-connection config; isend/irecv carry profiler handles.
#![allow(non_camel_case_types, non_snake_case)]

use core::ffi::{c_char, c_int, c_void};

use super::{
    ncclDebugLogger_t, ncclNetCommConfig_t, ncclNetDeviceHandle_t, ncclNetDeviceType,
    ncclProfilerCallback_t,
};
use crate::result::ncclResult_t;

/// `ncclNetVDeviceProps_v10_t`: the children of a fused NIC (at most 4).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct ncclNetVDeviceProps_v10_t {
    /// Number of children.
    pub ndevs: c_int,
    /// Children's device indices.
    pub devs: [c_int; 4],
}

/// `ncclNetProperties_v10_t` (104 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ncclNetProperties_v10_t {
    /// Device name.
    pub name: *mut c_char,
    /// `/sys` device path, or NULL.
    pub pciPath: *mut c_char,
    /// Equal GUIDs mean one physical port.
    pub guid: u64,
    /// Bitmask of `NCCL_PTR_*`.
    pub ptrSupport: c_int,
    /// Whether a repeated regMr is cheap.
    pub regIsGlobal: c_int,
    /// Whether iflush is always needed.
    pub forceFlush: c_int,
    /// Link speed in Mbps.
    pub speed: c_int,
    /// Port number.
    pub port: c_int,
    /// Latency in µs.
    pub latency: f32,
    /// Most comms.
    pub maxComms: c_int,
    /// Most buffers in one grouped irecv.
    pub maxRecvs: c_int,
    /// `ncclNetDeviceType`.
    pub netDeviceType: ncclNetDeviceType,
    /// Device-code version.
    pub netDeviceVersion: c_int,
    /// Children of a virtual device.
    pub vProps: ncclNetVDeviceProps_v10_t,
    /// Largest point-to-point message.
    pub maxP2pBytes: usize,
    /// Largest collective message.
    pub maxCollBytes: usize,
}

/// The `ncclNetPlugin_v10` table.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ncclNet_v10_t {
    /// Plugin name (matched against `NCCL_NET`).
    pub name: *const c_char,
    /// Initialises the plugin (once while any comm lives).
    pub init: Option<
        unsafe extern "C" fn(
            logFunction: ncclDebugLogger_t,
            profFunction: ncclProfilerCallback_t,
        ) -> ncclResult_t,
    >,
    /// Number of devices.
    pub devices: Option<unsafe extern "C" fn(ndev: *mut c_int) -> ncclResult_t>,
    /// Properties of a device.
    pub getProperties: Option<
        unsafe extern "C" fn(dev: c_int, props: *mut ncclNetProperties_v10_t) -> ncclResult_t,
    >,
    /// Creates a listening comm and fills the handle.
    pub listen: Option<
        unsafe extern "C" fn(
            dev: c_int,
            handle: *mut c_void,
            listenComm: *mut *mut c_void,
        ) -> ncclResult_t,
    >,
    /// Non-blocking connect.
    pub connect: Option<
        unsafe extern "C" fn(
            dev: c_int,
            config: *mut ncclNetCommConfig_t,
            handle: *mut c_void,
            sendComm: *mut *mut c_void,
            sendDevComm: *mut *mut ncclNetDeviceHandle_t,
        ) -> ncclResult_t,
    >,
    /// Non-blocking accept.
    pub accept: Option<
        unsafe extern "C" fn(
            listenComm: *mut c_void,
            recvComm: *mut *mut c_void,
            recvDevComm: *mut *mut ncclNetDeviceHandle_t,
        ) -> ncclResult_t,
    >,
    /// Registers memory.
    pub regMr: Option<
        unsafe extern "C" fn(
            comm: *mut c_void,
            data: *mut c_void,
            size: usize,
            type_: c_int,
            mhandle: *mut *mut c_void,
        ) -> ncclResult_t,
    >,
    /// Registers a DMA-BUF.
    pub regMrDmaBuf: Option<
        unsafe extern "C" fn(
            comm: *mut c_void,
            data: *mut c_void,
            size: usize,
            type_: c_int,
            offset: u64,
            fd: c_int,
            mhandle: *mut *mut c_void,
        ) -> ncclResult_t,
    >,
    /// Deregisters memory.
    pub deregMr:
        Option<unsafe extern "C" fn(comm: *mut c_void, mhandle: *mut c_void) -> ncclResult_t>,
    /// Posts a send.
    pub isend: Option<
        unsafe extern "C" fn(
            sendComm: *mut c_void,
            data: *mut c_void,
            size: usize,
            tag: c_int,
            mhandle: *mut c_void,
            phandle: *mut c_void,
            request: *mut *mut c_void,
        ) -> ncclResult_t,
    >,
    /// Posts a grouped receive.
    pub irecv: Option<
        unsafe extern "C" fn(
            recvComm: *mut c_void,
            n: c_int,
            data: *mut *mut c_void,
            sizes: *mut usize,
            tags: *mut c_int,
            mhandles: *mut *mut c_void,
            phandles: *mut *mut c_void,
            request: *mut *mut c_void,
        ) -> ncclResult_t,
    >,
    /// Flushes received data to the GPU.
    pub iflush: Option<
        unsafe extern "C" fn(
            recvComm: *mut c_void,
            n: c_int,
            data: *mut *mut c_void,
            sizes: *mut c_int,
            mhandles: *mut *mut c_void,
            request: *mut *mut c_void,
        ) -> ncclResult_t,
    >,
    /// Tests a request.
    pub test: Option<
        unsafe extern "C" fn(
            request: *mut c_void,
            done: *mut c_int,
            sizes: *mut c_int,
        ) -> ncclResult_t,
    >,
    /// Closes a send comm.
    pub closeSend: Option<unsafe extern "C" fn(sendComm: *mut c_void) -> ncclResult_t>,
    /// Closes a receive comm.
    pub closeRecv: Option<unsafe extern "C" fn(recvComm: *mut c_void) -> ncclResult_t>,
    /// Closes a listening comm.
    pub closeListen: Option<unsafe extern "C" fn(listenComm: *mut c_void) -> ncclResult_t>,
    /// Device-side memory handle.
    pub getDeviceMr: Option<
        unsafe extern "C" fn(
            comm: *mut c_void,
            mhandle: *mut c_void,
            dptr_mhandle: *mut *mut c_void,
        ) -> ncclResult_t,
    >,
    /// The GPU consumed a completed receive.
    pub irecvConsumed: Option<
        unsafe extern "C" fn(recvComm: *mut c_void, n: c_int, request: *mut c_void) -> ncclResult_t,
    >,
    /// Fuses NICs into a virtual device.
    pub makeVDevice: Option<
        unsafe extern "C" fn(d: *mut c_int, props: *mut ncclNetVDeviceProps_v10_t) -> ncclResult_t,
    >,
}

// SAFETY: the table is immutable data (a name literal and function pointers).
unsafe impl Sync for ncclNet_v10_t {}
