//! The versioned config structs: `ncclConfig_t`, `ncclCollConfig_t`,
//! `ncclSimInfo_t`, each headed by `size`, `magic` and `version`.
//!
//! These mirror NCCL 2.32's layouts. Older headers pass shorter structs (a
//! prefix of these); newer ones may pass longer. The engine reads only the
//! fields that fit inside the `size` the caller declared.

use core::ffi::{c_char, c_void};

/// `ncclConfig_t` (`struct ncclConfig_v23100`), as in NCCL 2.32.
#[allow(non_camel_case_types, non_snake_case)]
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ncclConfig_t {
    /// `sizeof` the struct in the caller's header.
    pub size: usize,
    /// Must be [`crate::NCCL_API_MAGIC`].
    pub magic: u32,
    /// `NCCL_VERSION_CODE` of the caller's header.
    pub version: u32,
    /// 0 = nonblocking (calls may return `ncclInProgress`), 1 = blocking.
    pub blocking: i32,
    /// CUDA thread-block-cluster size.
    pub cgaClusterSize: i32,
    /// Lower bound on channels.
    pub minCTAs: i32,
    /// Upper bound on channels.
    pub maxCTAs: i32,
    /// Net plugin name to use.
    pub netName: *const c_char,
    /// Share resources with the parent on split.
    pub splitShare: i32,
    /// Network traffic class.
    pub trafficClass: i32,
    /// The communicator's name, for logs.
    pub commName: *const c_char,
    /// CollNet enable.
    pub collnetEnable: i32,
    /// `NCCL_CTA_POLICY_*`.
    pub CTAPolicy: i32,
    /// Share resources with the parent on shrink.
    pub shrinkShare: i32,
    /// NVLS channel count.
    pub nvlsCTAs: i32,
    /// Channels per net peer.
    pub nChannelsPerNetPeer: i32,
    /// NVLink-centric scheduling.
    pub nvlinkCentricSched: i32,
    /// CUDA graph usage mode.
    pub graphUsageMode: i32,
    /// Number of RMA contexts.
    pub numRmaCtx: i32,
    /// Maximum P2P peers.
    pub maxP2pPeers: i32,
    /// Graph stream ordering.
    pub graphStreamOrdering: i32,
    /// Implicit launch order.
    pub launchOrderImplicit: i32,
    /// Number of RMA signals.
    pub numRmaSig: i32,
    /// Eager RMA init.
    pub rmaEagerInit: i32,
    /// `ncclHostCftMode_t`.
    pub hostCftMode: i32,
    /// `ncclNvlsHostMode_t`.
    pub nvlsHostMode: i32,
}

impl Default for ncclConfig_t {
    /// `NCCL_CONFIG_INITIALIZER` for the 2.32 layout.
    fn default() -> Self {
        let u = crate::NCCL_CONFIG_UNDEF_INT;
        Self {
            size: core::mem::size_of::<Self>(),
            magic: crate::NCCL_API_MAGIC,
            version: 23203,
            blocking: u,
            cgaClusterSize: u,
            minCTAs: u,
            maxCTAs: u,
            netName: core::ptr::null(),
            splitShare: u,
            trafficClass: u,
            commName: core::ptr::null(),
            collnetEnable: u,
            CTAPolicy: u,
            shrinkShare: u,
            nvlsCTAs: u,
            nChannelsPerNetPeer: u,
            nvlinkCentricSched: u,
            graphUsageMode: u,
            numRmaCtx: u,
            maxP2pPeers: u,
            graphStreamOrdering: u,
            launchOrderImplicit: u,
            numRmaSig: u,
            rmaEagerInit: u,
            hostCftMode: u,
            nvlsHostMode: u,
        }
    }
}

/// `ncclConfigExt_t`: one vendor extension option in a linked list.
#[allow(non_camel_case_types, non_snake_case)]
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ncclConfigExt_t {
    /// The next option, or NULL.
    pub next: *mut ncclConfigExt_t,
    /// Vendor id.
    pub vendorId: i32,
    /// Option id within the vendor.
    pub optionId: i32,
    /// The value (`int`, `const char*` or `void*`), pointer-sized.
    pub val: *mut c_void,
}

/// `ncclCollConfig_t` (`struct ncclCollConfig_v23200`).
#[allow(non_camel_case_types, non_snake_case)]
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ncclCollConfig_t {
    /// `sizeof` the struct in the caller's header.
    pub size: usize,
    /// Must be [`crate::NCCL_API_MAGIC`].
    pub magic: u32,
    /// `NCCL_VERSION_CODE` of the caller's header.
    pub version: u32,
    /// Vendor extension list, or NULL.
    pub ext: *mut ncclConfigExt_t,
    /// Lower bound on channels.
    pub minCTAs: i32,
    /// Upper bound on channels.
    pub maxCTAs: i32,
    /// NVLS channel cap.
    pub nvlsCTAs: i32,
    /// Cluster size.
    pub cgaClusterSize: i32,
    /// Algorithm selection string, NULL for automatic.
    pub algSelection: *const c_char,
    /// Whether an unsatisfiable selection is an error.
    pub forceAlgSelection: i32,
    /// `NCCL_CTA_POLICY_*`.
    pub CTAPolicy: i32,
    /// Opaque profiler tag.
    pub userProfilerTag: u64,
    /// `cudaEvent_t` recorded at launch completion, or NULL.
    pub launchCompletionEvent: *mut c_void,
}

/// `ncclSimInfo_t` (`struct ncclSimInfo_v22200`).
#[allow(non_camel_case_types, non_snake_case)]
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ncclSimInfo_t {
    /// `sizeof` the struct in the caller's header.
    pub size: usize,
    /// Must be [`crate::NCCL_SIM_INFO_MAGIC`].
    pub magic: u32,
    /// `NCCL_VERSION_CODE` of the caller's header.
    pub version: u32,
    /// Out: the estimated time of the group, in microseconds.
    pub estimatedTime: f32,
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::{offset_of, size_of};

    #[test]
    fn sizes_on_lp64() {
        assert_eq!(size_of::<ncclConfig_t>(), 120);
        assert_eq!(offset_of!(ncclConfig_t, netName), 32);
        assert_eq!(offset_of!(ncclConfig_t, commName), 48);
        assert_eq!(size_of::<ncclCollConfig_t>(), 72);
        assert_eq!(size_of::<ncclSimInfo_t>(), 24);
    }
}
