//! The `ncclNet_vN` plugin ABI (versions 6 to 12), one file per version under
//! `net/`, plus the types and constants the versions share.
//!
//! Every vtable slot is an `Option` of an `unsafe extern "C"` function
//! pointer, so a NULL slot coming from (or going to) C is `None`. Layouts are
//! for x86-64 LP64; the tests below pin every size and offset to the values
//! of NCCL's `net_vN.h` headers.
#![allow(non_camel_case_types, non_snake_case)]

use core::ffi::{c_char, c_int, c_void};

use crate::result::ncclResult_t;

pub mod v10;
pub mod v11;
pub mod v12;
pub mod v6;
pub mod v7;
pub mod v8;
pub mod v9;

/// `NCCL_NET_HANDLE_MAXSIZE`: the bytes of the connect handle NCCL ships to the peer.
pub const NCCL_NET_HANDLE_MAXSIZE: usize = 128;
/// `NCCL_PTR_HOST`.
pub const NCCL_PTR_HOST: c_int = 0x1;
/// `NCCL_PTR_CUDA`.
pub const NCCL_PTR_CUDA: c_int = 0x2;
/// `NCCL_PTR_DMABUF`.
pub const NCCL_PTR_DMABUF: c_int = 0x4;
/// `NCCL_NET_MAX_REQUESTS`: outstanding requests per comm (times maxRecvs for a sendComm).
pub const NCCL_NET_MAX_REQUESTS: usize = 32;
/// `NCCL_NET_OPTIONAL_RECV_COMPLETION`: the irecv `*request` input hint.
pub const NCCL_NET_OPTIONAL_RECV_COMPLETION: usize = 0x1;
/// `NCCL_MAX_NET_SIZE_BYTES`: upper bound of maxP2pBytes / maxCollBytes (1 TiB).
pub const NCCL_MAX_NET_SIZE_BYTES: usize = 1 << 40;
/// `MAX_NET_SIZE`: what NCCL assumes for plugins of v8 and older (1 GiB).
pub const MAX_NET_SIZE: usize = 1 << 30;
/// `MAX_COLLNET_SIZE` (512 MiB).
pub const MAX_COLLNET_SIZE: usize = 512 << 20;
/// `NCCL_NET_DEVICE_INVALID_VERSION`.
pub const NCCL_NET_DEVICE_INVALID_VERSION: c_int = 0;
/// `NCCL_NET_DEVICE_UNPACK_VERSION`.
pub const NCCL_NET_DEVICE_UNPACK_VERSION: c_int = 0x7;
/// `NCCL_NET_MAX_DEVS_PER_NIC` of v12.
pub const NCCL_NET_MAX_DEVS_PER_NIC_V12: usize = 8;
/// `NCCL_NET_MAX_DEVS_PER_NIC_V11` (also v9 and v10).
pub const NCCL_NET_MAX_DEVS_PER_NIC_V11: usize = 4;

/// `ncclNetDeviceType`, as the raw C enum (4 bytes).
pub type ncclNetDeviceType = c_int;
/// `NCCL_NET_DEVICE_HOST`.
pub const NCCL_NET_DEVICE_HOST: ncclNetDeviceType = 0;
/// `NCCL_NET_DEVICE_UNPACK`.
pub const NCCL_NET_DEVICE_UNPACK: ncclNetDeviceType = 1;

/// `ncclDebugLogLevel`: NONE 0, VERSION 1, WARN 2, INFO 3, ABORT 4, TRACE 5.
pub type ncclDebugLogLevel = c_int;
/// `NCCL_LOG_WARN`.
pub const NCCL_LOG_WARN: ncclDebugLogLevel = 2;
/// `NCCL_LOG_INFO`.
pub const NCCL_LOG_INFO: ncclDebugLogLevel = 3;
/// `NCCL_LOG_TRACE`.
pub const NCCL_LOG_TRACE: ncclDebugLogLevel = 5;
/// The `NCCL_NET` subsystem flag of log lines.
pub const NCCL_NET: u64 = 0x10;
/// The `NCCL_INIT` subsystem flag of log lines.
pub const NCCL_INIT: u64 = 0x1;

/// `ncclDebugLogger_t`: NCCL's printf-style logger.
pub type ncclDebugLogger_t = Option<
    unsafe extern "C" fn(
        level: ncclDebugLogLevel,
        flags: u64,
        file: *const c_char,
        line: c_int,
        fmt: *const c_char,
        ...
    ),
>;

/// `ncclProfilerCallback_t` (v10+).
pub type ncclProfilerCallback_t = Option<
    unsafe extern "C" fn(
        eHandle: *mut *mut c_void,
        type_: c_int,
        pHandle: *mut c_void,
        pluginId: i64,
        extData: *mut c_void,
    ) -> ncclResult_t,
>;

/// `ncclNetDeviceHandle_vN` (identical for v7..v12): a device-side offload handle.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ncclNetDeviceHandle_t {
    /// The device type (`ncclNetDeviceType`).
    pub netDeviceType: ncclNetDeviceType,
    /// The device-code version.
    pub netDeviceVersion: c_int,
    /// The plugin's device handle.
    pub handle: *mut c_void,
    /// Bytes of `handle`.
    pub size: usize,
    /// Whether the proxy must keep progressing this comm.
    pub needsProxyProgress: c_int,
}

/// `ncclNetCommConfig_vN` (v10+): per-connection settings.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ncclNetCommConfig_t {
    /// The traffic class, or -1 (`NCCL_NET_TRAFFIC_CLASS_UNDEF`).
    pub trafficClass: c_int,
}

/// `ncclNetCommAttr` (v11+): flow hints for one direction.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ncclNetCommAttr_t {
    /// Most peers talked to at once, or -1.
    pub maxConcurrentPeers: i32,
    /// Fewest peers talked to at once, or -1.
    pub minConcurrentPeers: i32,
    /// Most flows per peer, or -1.
    pub maxFlowsPerPeer: i32,
    /// Fewest flows per peer, or -1.
    pub minFlowsPerPeer: i32,
}

/// `ncclNetAttr_vN` (v11+): the `setNetAttr` argument.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ncclNetAttr_t {
    /// Send-side hints.
    pub sendCommAttr: ncclNetCommAttr_t,
    /// Receive-side hints.
    pub recvCommAttr: ncclNetCommAttr_t,
    /// Bitmask of `1 << ncclFunc_t`, or all ones.
    pub op: u32,
    /// Bitmask of algorithms, or all ones.
    pub algo: u32,
    /// Bitmask of protocols, or all ones.
    pub proto: u32,
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::{align_of, offset_of, size_of};

    #[test]
    fn shared_layouts() {
        assert_eq!(size_of::<ncclNetDeviceHandle_t>(), 32);
        assert_eq!(offset_of!(ncclNetDeviceHandle_t, handle), 8);
        assert_eq!(offset_of!(ncclNetDeviceHandle_t, size), 16);
        assert_eq!(offset_of!(ncclNetDeviceHandle_t, needsProxyProgress), 24);
        assert_eq!(size_of::<ncclNetAttr_t>(), 44);
        assert_eq!(align_of::<ncclNetAttr_t>(), 4);
        assert_eq!(offset_of!(ncclNetAttr_t, op), 32);
        assert_eq!(size_of::<ncclNetCommConfig_t>(), 4);
        assert_eq!(size_of::<ncclDebugLogger_t>(), 8);
    }

    #[test]
    fn vtable_sizes() {
        assert_eq!(size_of::<v12::ncclNet_v12_t>(), 176);
        assert_eq!(size_of::<v11::ncclNet_v11_t>(), 176);
        assert_eq!(size_of::<v10::ncclNet_v10_t>(), 160);
        assert_eq!(size_of::<v9::ncclNet_v9_t>(), 160);
        assert_eq!(size_of::<v8::ncclNet_v8_t>(), 152);
        assert_eq!(size_of::<v7::ncclNet_v7_t>(), 152);
        assert_eq!(size_of::<v6::ncclNet_v6_t>(), 136);
        assert_eq!(offset_of!(v12::ncclNet_v12_t, finalize), 160);
        assert_eq!(offset_of!(v12::ncclNet_v12_t, test), 104);
        assert_eq!(offset_of!(v10::ncclNet_v10_t, makeVDevice), 152);
        assert_eq!(offset_of!(v8::ncclNet_v8_t, irecvConsumed), 144);
        assert_eq!(offset_of!(v6::ncclNet_v6_t, closeListen), 128);
    }

    #[test]
    fn properties_layouts() {
        use v12::ncclNetProperties_v12_t as P12;
        assert_eq!(size_of::<P12>(), 128);
        assert_eq!(offset_of!(P12, guid), 16);
        assert_eq!(offset_of!(P12, speed), 36);
        assert_eq!(offset_of!(P12, latency), 44);
        assert_eq!(offset_of!(P12, netDeviceType), 56);
        assert_eq!(offset_of!(P12, vProps), 64);
        assert_eq!(offset_of!(P12, maxP2pBytes), 104);
        assert_eq!(offset_of!(P12, maxCollBytes), 112);
        assert_eq!(offset_of!(P12, maxMultiRequestSize), 120);
        assert_eq!(offset_of!(P12, railId), 124);
        assert_eq!(offset_of!(P12, planeId), 126);
        use v11::ncclNetProperties_v11_t as P11;
        assert_eq!(size_of::<P11>(), 112);
        assert_eq!(offset_of!(P11, maxP2pBytes), 88);
        assert_eq!(offset_of!(P11, maxCollBytes), 96);
        assert_eq!(offset_of!(P11, maxMultiRequestSize), 104);
        assert_eq!(size_of::<v10::ncclNetProperties_v10_t>(), 104);
        assert_eq!(size_of::<v9::ncclNetProperties_v9_t>(), 104);
        assert_eq!(offset_of!(v9::ncclNetProperties_v9_t, maxCollBytes), 96);
        use v8::ncclNetProperties_v8_t as P8;
        assert_eq!(size_of::<P8>(), 64);
        assert_eq!(offset_of!(P8, regIsGlobal), 28);
        assert_eq!(offset_of!(P8, netDeviceVersion), 56);
        use v7::ncclNetProperties_v7_t as P7;
        assert_eq!(size_of::<P7>(), 56);
        assert_eq!(offset_of!(P7, speed), 28);
        assert_eq!(offset_of!(P7, netDeviceVersion), 52);
        use v6::ncclNetProperties_v6_t as P6;
        assert_eq!(size_of::<P6>(), 48);
        assert_eq!(offset_of!(P6, maxRecvs), 44);
    }
}
