//! `#[repr(C)]` mirrors of NCCL's profiler plugin interface, versions 5
//! (NCCL 2.28) and 6 (NCCL 2.29 and later, which adds the copy-engine
//! events). Version 6's event descriptor is version 5's with three more
//! members in its union, so one mirror serves both: a version-5 caller
//! never sends the copy-engine types. NVIDIA's wheel ships no profiler
//! headers, so `tests/abi_layout.rs` cannot compare these; the unit test
//! below checks the LP64 sizes and offsets of NCCL's `profiler_v5.h` and
//! `profiler_v6.h`.
#![allow(non_camel_case_types, non_snake_case)]

use std::ffi::{c_char, c_int, c_void};

use crate::net::ncclDebugLogger_t;
use crate::result::ncclResult_t;

/// `ncclProfileGroup`: a group event.
pub const PROFILE_GROUP: u64 = 1 << 0;
/// `ncclProfileColl`: a collective as the engine runs it.
pub const PROFILE_COLL: u64 = 1 << 1;
/// `ncclProfileP2p`: a send or receive as the engine runs it.
pub const PROFILE_P2P: u64 = 1 << 2;
/// `ncclProfileProxyOp`.
pub const PROFILE_PROXY_OP: u64 = 1 << 3;
/// `ncclProfileProxyStep`.
pub const PROFILE_PROXY_STEP: u64 = 1 << 4;
/// `ncclProfileProxyCtrl`.
pub const PROFILE_PROXY_CTRL: u64 = 1 << 5;
/// `ncclProfileKernelCh`.
pub const PROFILE_KERNEL_CH: u64 = 1 << 6;
/// `ncclProfileNetPlugin`.
pub const PROFILE_NET_PLUGIN: u64 = 1 << 7;
/// `ncclProfileGroupApi`.
pub const PROFILE_GROUP_API: u64 = 1 << 8;
/// `ncclProfileCollApi`.
pub const PROFILE_COLL_API: u64 = 1 << 9;
/// `ncclProfileP2pApi`.
pub const PROFILE_P2P_API: u64 = 1 << 10;
/// `ncclProfileKernelLaunch`.
pub const PROFILE_KERNEL_LAUNCH: u64 = 1 << 11;
/// `ncclProfileCeColl` (version 6).
pub const PROFILE_CE_COLL: u64 = 1 << 12;
/// `ncclProfileCeSync` (version 6).
pub const PROFILE_CE_SYNC: u64 = 1 << 13;
/// `ncclProfileCeBatch` (version 6).
pub const PROFILE_CE_BATCH: u64 = 1 << 14;

/// `ncclProfilerEventState_t` (a C enum: an `int`).
pub type ncclProfilerEventState_t = c_int;

/// `groupApi`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct GroupApi {
    /// Captured in a CUDA graph.
    pub graphCaptured: bool,
    /// Nesting depth.
    pub groupDepth: c_int,
}

/// `collApi`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CollApi {
    /// "AllReduce", ...
    pub func: *const c_char,
    /// Element count.
    pub count: usize,
    /// "ncclFloat32", ...
    pub datatype: *const c_char,
    /// Root.
    pub root: c_int,
    /// The stream.
    pub stream: *mut c_void,
    /// Captured in a CUDA graph.
    pub graphCaptured: bool,
}

/// `p2pApi`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct P2pApi {
    /// "Send" or "Recv".
    pub func: *const c_char,
    /// Element count.
    pub count: usize,
    /// Datatype name.
    pub datatype: *const c_char,
    /// The stream.
    pub stream: *mut c_void,
    /// Captured in a CUDA graph.
    pub graphCaptured: bool,
}

/// `kernelLaunch`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct KernelLaunch {
    /// The stream.
    pub stream: *mut c_void,
}

/// `coll`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Coll {
    /// The collective's sequence number on the communicator.
    pub seqNumber: u64,
    /// "AllReduce", ...
    pub func: *const c_char,
    /// Send buffer.
    pub sendBuff: *const c_void,
    /// Receive buffer.
    pub recvBuff: *mut c_void,
    /// Element count.
    pub count: usize,
    /// Root.
    pub root: c_int,
    /// Datatype name.
    pub datatype: *const c_char,
    /// Channels.
    pub nChannels: u8,
    /// Warps.
    pub nWarps: u8,
    /// "RING", ...
    pub algo: *const c_char,
    /// "SIMPLE", ...
    pub proto: *const c_char,
    /// The group (version 4 compatibility).
    pub parentGroup: *mut c_void,
}

/// `p2p`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct P2p {
    /// "Send" or "Recv".
    pub func: *const c_char,
    /// The buffer.
    pub buff: *mut c_void,
    /// Datatype name.
    pub datatype: *const c_char,
    /// Element count.
    pub count: usize,
    /// The peer.
    pub peer: c_int,
    /// Channels.
    pub nChannels: u8,
    /// The group (version 4 compatibility).
    pub parentGroup: *mut c_void,
}

/// `proxyOp`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ProxyOp {
    /// The originating process.
    pub pid: i32,
    /// The channel.
    pub channelId: u8,
    /// The peer.
    pub peer: c_int,
    /// Steps.
    pub nSteps: c_int,
    /// Bytes per step.
    pub chunkSize: c_int,
    /// Non-zero for a send.
    pub isSend: c_int,
}

/// `proxyStep`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ProxyStep {
    /// The step.
    pub step: c_int,
}

/// `kernelCh`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct KernelCh {
    /// The channel.
    pub channelId: u8,
    /// GPU global timer at start.
    pub pTimer: u64,
}

/// `netPlugin`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct NetPlugin {
    /// Plugin type and version (`NCCL_PROFILER_NET_TYPE_*`).
    pub id: i64,
    /// The plugin's own data.
    pub data: *mut c_void,
}

/// `ceColl` (version 6).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CeColl {
    /// Sequence number.
    pub seqNumber: u64,
    /// Function name.
    pub func: *const c_char,
    /// Send buffer.
    pub sendBuff: *const c_void,
    /// Receive buffer.
    pub recvBuff: *mut c_void,
    /// Element count.
    pub count: usize,
    /// Root.
    pub root: c_int,
    /// Datatype name.
    pub datatype: *const c_char,
    /// Synchronisation strategy.
    pub syncStrategy: *const c_char,
    /// Synchronised inside a batch.
    pub intraBatchSync: bool,
    /// Batch size.
    pub batchSize: u32,
    /// Batches.
    pub numBatches: u32,
    /// Copy-engine sequence number.
    pub ceSeqNum: u32,
    /// The stream.
    pub stream: *mut c_void,
}

/// `ceCollSync` (version 6).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CeSync {
    /// Complete.
    pub isComplete: bool,
    /// Ranks.
    pub nRanks: c_int,
}

/// `ceCollBatch` (version 6).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CeBatch {
    /// Operations.
    pub numOps: c_int,
    /// Bytes.
    pub totalBytes: usize,
    /// Intra-batch synchronisation.
    pub useIntraSync: bool,
}

/// The descriptor's union.
#[repr(C)]
#[derive(Clone, Copy)]
pub union DescrBody {
    /// `groupApi`.
    pub groupApi: GroupApi,
    /// `collApi`.
    pub collApi: CollApi,
    /// `p2pApi`.
    pub p2pApi: P2pApi,
    /// `kernelLaunch`.
    pub kernelLaunch: KernelLaunch,
    /// `coll`.
    pub coll: Coll,
    /// `p2p`.
    pub p2p: P2p,
    /// `proxyOp`.
    pub proxyOp: ProxyOp,
    /// `proxyStep`.
    pub proxyStep: ProxyStep,
    /// `kernelCh`.
    pub kernelCh: KernelCh,
    /// `netPlugin`.
    pub netPlugin: NetPlugin,
    /// `ceColl`.
    pub ceColl: CeColl,
    /// `ceCollSync`.
    pub ceCollSync: CeSync,
    /// `ceCollBatch`.
    pub ceCollBatch: CeBatch,
}

/// `ncclProfilerEventDescr_v6_t` (and, without the copy-engine members,
/// `_v5_t`).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ncclProfilerEventDescr_t {
    /// One `PROFILE_*` bit.
    pub type_: u64,
    /// The parent event's handle (a collective's group, a step's proxy op).
    pub parentObj: *mut c_void,
    /// The originating rank.
    pub rank: c_int,
    /// The type's members.
    pub body: DescrBody,
}

/// `ncclProfilerEventStateArgs_v5_t` (= `_v6_t`).
#[repr(C)]
#[derive(Clone, Copy)]
pub union ncclProfilerEventStateArgs_t {
    /// `proxyStep.transSize`.
    pub transSize: usize,
    /// `proxyCtrl.appendedProxyOps`.
    pub appendedProxyOps: c_int,
    /// `netPlugin.data`.
    pub data: *mut c_void,
    /// `kernelCh.pTimer`.
    pub pTimer: u64,
}

/// `init` of versions 5 and 6.
pub type ProfilerInit = unsafe extern "C" fn(
    context: *mut *mut c_void,
    commId: u64,
    eActivationMask: *mut c_int,
    commName: *const c_char,
    nNodes: c_int,
    nranks: c_int,
    rank: c_int,
    logfn: ncclDebugLogger_t,
) -> ncclResult_t;
/// `startEvent`.
pub type ProfilerStartEvent = unsafe extern "C" fn(
    context: *mut c_void,
    eHandle: *mut *mut c_void,
    eDescr: *mut ncclProfilerEventDescr_t,
) -> ncclResult_t;
/// `stopEvent`.
pub type ProfilerStopEvent = unsafe extern "C" fn(eHandle: *mut c_void) -> ncclResult_t;
/// `recordEventState`.
pub type ProfilerRecordEventState = unsafe extern "C" fn(
    eHandle: *mut c_void,
    eState: ncclProfilerEventState_t,
    eStateArgs: *mut ncclProfilerEventStateArgs_t,
) -> ncclResult_t;
/// `finalize`.
pub type ProfilerFinalize = unsafe extern "C" fn(context: *mut c_void) -> ncclResult_t;

/// `ncclProfiler_v5_t` and `ncclProfiler_v6_t` (the same members).
#[repr(C)]
pub struct ncclProfiler_t {
    /// The plugin's name.
    pub name: *const c_char,
    /// `init`.
    pub init: ProfilerInit,
    /// `startEvent`.
    pub startEvent: ProfilerStartEvent,
    /// `stopEvent`.
    pub stopEvent: ProfilerStopEvent,
    /// `recordEventState`.
    pub recordEventState: ProfilerRecordEventState,
    /// `finalize`.
    pub finalize: ProfilerFinalize,
}

// SAFETY: the table holds a pointer to a static C string and function
// pointers; it is never written after it is built.
unsafe impl Sync for ncclProfiler_t {}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    #[test]
    fn layout_matches_nccl_on_lp64() {
        assert_eq!(offset_of!(ncclProfilerEventDescr_t, body), 24);
        assert_eq!(size_of::<Coll>(), 88);
        assert_eq!(offset_of!(Coll, nChannels), 56);
        assert_eq!(offset_of!(Coll, algo), 64);
        assert_eq!(offset_of!(ProxyOp, peer), 8);
        assert_eq!(size_of::<CeColl>(), 88);
        assert_eq!(size_of::<ncclProfilerEventDescr_t>(), 112);
        assert_eq!(size_of::<ncclProfilerEventStateArgs_t>(), 8);
        assert_eq!(size_of::<ncclProfiler_t>(), 48);
    }
}
