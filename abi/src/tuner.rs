//! The `ncclTuner_vN` plugin ABI (versions 3 to 6) of NCCL's
//! `src/include/plugin/nccl_tuner.h` and `tuner/tuner_vN.h`.
//!
//! - v6 (NCCL 2.30+): v5 plus the optional `getChunkSize`.
//! - v5 (2.28): `init(ctx, commId, nRanks, nNodes, logger, nvlDomainInfo,
//!   constants)` and `finalize`.
//! - v4: `init(nRanks, nNodes, logger, ctx)`, `getCollInfo` with `regBuff`,
//!   `destroy`.
//! - v3: as v4 without `regBuff`.
//!
//! The cost table NCCL passes to `getCollInfo` is a contiguous row-major
//! `float[numAlgo][numProto]` cast to `float**`; an entry of
//! [`NCCL_ALGO_PROTO_IGNORE`] (-1.0) marks an unusable pair. Layouts are for
//! x86-64 LP64; the tests below pin them to the headers' values.
#![allow(non_camel_case_types, non_snake_case, non_upper_case_globals)]

use core::ffi::{c_char, c_int, c_void};

use crate::net::ncclDebugLogger_t;
use crate::result::ncclResult_t;

/// `ncclFunc_t`, as the raw C enum (4 bytes).
pub type ncclFunc_t = c_int;
/// `ncclFuncBroadcast`.
pub const ncclFuncBroadcast: ncclFunc_t = 0;
/// `ncclFuncReduce`.
pub const ncclFuncReduce: ncclFunc_t = 1;
/// `ncclFuncAllGather`.
pub const ncclFuncAllGather: ncclFunc_t = 2;
/// `ncclFuncReduceScatter`.
pub const ncclFuncReduceScatter: ncclFunc_t = 3;
/// `ncclFuncAllReduce`.
pub const ncclFuncAllReduce: ncclFunc_t = 4;
/// `NCCL_NUM_FUNCTIONS`: the collectives a tuner is asked about (0..5).
pub const NCCL_NUM_FUNCTIONS: usize = 5;

/// `NCCL_NUM_ALGORITHMS_V5`: Tree, Ring, CollNetDirect, CollNetChain, NVLS,
/// NVLSTree, PAT.
pub const NCCL_NUM_ALGORITHMS_V5: usize = 7;
/// `NCCL_NUM_PROTOCOLS_V5`: LL, LL128, Simple.
pub const NCCL_NUM_PROTOCOLS_V5: usize = 3;
/// `NCCL_NUM_HW_LINKS_V5`: NVLink, PCI, NET.
pub const NCCL_NUM_HW_LINKS_V5: usize = 3;
/// `NCCL_NUM_COMPCAPS_V5`: Volta, Ampere, Hopper, Blackwell.
pub const NCCL_NUM_COMPCAPS_V5: usize = 4;
/// `NCCL_NUM_TUNING_SCALES_V5`: 1, 2 and 4 nodes.
pub const NCCL_NUM_TUNING_SCALES_V5: usize = 3;

/// `NCCL_ALGO_TREE`.
pub const NCCL_ALGO_TREE: c_int = 0;
/// `NCCL_ALGO_RING`.
pub const NCCL_ALGO_RING: c_int = 1;
/// `NCCL_ALGO_COLLNET_DIRECT`.
pub const NCCL_ALGO_COLLNET_DIRECT: c_int = 2;
/// `NCCL_ALGO_COLLNET_CHAIN`.
pub const NCCL_ALGO_COLLNET_CHAIN: c_int = 3;
/// `NCCL_ALGO_NVLS`.
pub const NCCL_ALGO_NVLS: c_int = 4;
/// `NCCL_ALGO_NVLS_TREE`.
pub const NCCL_ALGO_NVLS_TREE: c_int = 5;
/// `NCCL_ALGO_PAT`.
pub const NCCL_ALGO_PAT: c_int = 6;
/// `NCCL_PROTO_LL`.
pub const NCCL_PROTO_LL: c_int = 0;
/// `NCCL_PROTO_LL128`.
pub const NCCL_PROTO_LL128: c_int = 1;
/// `NCCL_PROTO_SIMPLE`.
pub const NCCL_PROTO_SIMPLE: c_int = 2;
/// `NCCL_ALGO_PROTO_IGNORE`: the cost of a pair NCCL will not use.
pub const NCCL_ALGO_PROTO_IGNORE: f32 = -1.0;

/// `ncclNvlDomainInfo_v5_t` (12 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct ncclNvlDomainInfo_v5_t {
    /// Number of NVLink domains.
    pub nNvlDomains: c_int,
    /// Fewest ranks in one NVLink domain.
    pub minRanksPerNvlDomain: c_int,
    /// Most ranks in one NVLink domain.
    pub maxRanksPerNvlDomain: c_int,
}

/// `ncclNvlDomainInfo_v6_t`: the same as v5.
pub type ncclNvlDomainInfo_v6_t = ncclNvlDomainInfo_v5_t;

/// A `[compute capability][tuning scale]` table of bandwidths.
pub type BwTable = [[f64; NCCL_NUM_TUNING_SCALES_V5]; NCCL_NUM_COMPCAPS_V5];

/// `ncclTunerConstants_v5_t` (1152 bytes): NCCL's model constants, which
/// `init` may edit.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ncclTunerConstants_v5_t {
    /// `[algo][proto]` base latencies (µs).
    pub baseLatencies: [[f64; NCCL_NUM_PROTOCOLS_V5]; NCCL_NUM_ALGORITHMS_V5],
    /// `[link][algo][proto]` hardware latencies (µs).
    pub hwLatencies: [[[f64; NCCL_NUM_PROTOCOLS_V5]; NCCL_NUM_ALGORITHMS_V5]; NCCL_NUM_HW_LINKS_V5],
    /// LL bandwidth caps.
    pub llMaxBws: BwTable,
    /// Per-channel Ring/LL128 bandwidth caps.
    pub perChMaxRingLL128Bws: BwTable,
    /// Per-channel Tree/LL128 bandwidth caps.
    pub perChMaxTreeLL128Bws: BwTable,
    /// Per-channel Tree bandwidth caps.
    pub perChMaxTreeBws: BwTable,
    /// Per-channel NVLSTree bandwidth caps.
    pub perChMaxNVLSTreeBws: BwTable,
}

/// `ncclTunerConstants_v6_t`: the same as v5.
pub type ncclTunerConstants_v6_t = ncclTunerConstants_v5_t;

/// `getCollInfo` of v4, v5 and v6.
pub type GetCollInfoFn = unsafe extern "C" fn(
    context: *mut c_void,
    collType: ncclFunc_t,
    nBytes: usize,
    numPipeOps: c_int,
    collCostTable: *mut *mut f32,
    numAlgo: c_int,
    numProto: c_int,
    regBuff: c_int,
    nChannels: *mut c_int,
) -> ncclResult_t;

/// `init` of v5 and v6.
pub type InitV5Fn = unsafe extern "C" fn(
    ctx: *mut *mut c_void,
    commId: u64,
    nRanks: usize,
    nNodes: usize,
    logFunction: ncclDebugLogger_t,
    nvlDomainInfo: *mut ncclNvlDomainInfo_v5_t,
    constants: *mut ncclTunerConstants_v5_t,
) -> ncclResult_t;

/// `init` of v3 and v4.
pub type InitV3Fn = unsafe extern "C" fn(
    nRanks: usize,
    nNodes: usize,
    logFunction: ncclDebugLogger_t,
    context: *mut *mut c_void,
) -> ncclResult_t;

/// `finalize` (v5, v6) or `destroy` (v3, v4).
pub type FinalizeFn = unsafe extern "C" fn(context: *mut c_void) -> ncclResult_t;

/// The `ncclTunerPlugin_v6` table (40 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ncclTuner_v6_t {
    /// The tuner's name.
    pub name: *const c_char,
    /// Makes a context per communicator.
    pub init: Option<InitV5Fn>,
    /// Edits the cost table of one collective call.
    pub getCollInfo: Option<GetCollInfoFn>,
    /// Frees a context.
    pub finalize: Option<FinalizeFn>,
    /// Optional: overrides NCCL's chunk size.
    pub getChunkSize: Option<
        unsafe extern "C" fn(
            context: *mut c_void,
            collType: ncclFunc_t,
            nBytes: usize,
            algo: c_int,
            proto: c_int,
            nChannels: c_int,
            chunkSize: *mut usize,
        ) -> ncclResult_t,
    >,
}

/// The `ncclTunerPlugin_v5` table (32 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ncclTuner_v5_t {
    /// The tuner's name.
    pub name: *const c_char,
    /// Makes a context per communicator.
    pub init: Option<InitV5Fn>,
    /// Edits the cost table of one collective call.
    pub getCollInfo: Option<GetCollInfoFn>,
    /// Frees a context.
    pub finalize: Option<FinalizeFn>,
}

/// The `ncclTunerPlugin_v4` table (32 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ncclTuner_v4_t {
    /// The tuner's name.
    pub name: *const c_char,
    /// Makes a context per communicator.
    pub init: Option<InitV3Fn>,
    /// Edits the cost table of one collective call.
    pub getCollInfo: Option<GetCollInfoFn>,
    /// Frees a context.
    pub destroy: Option<FinalizeFn>,
}

/// The `ncclTunerPlugin_v3` table (32 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ncclTuner_v3_t {
    /// The tuner's name.
    pub name: *const c_char,
    /// Makes a context per communicator.
    pub init: Option<InitV3Fn>,
    /// Edits the cost table of one collective call (no `regBuff`).
    pub getCollInfo: Option<
        unsafe extern "C" fn(
            context: *mut c_void,
            collType: ncclFunc_t,
            nBytes: usize,
            numPipeOps: c_int,
            collCostTable: *mut *mut f32,
            numAlgo: c_int,
            numProto: c_int,
            nChannels: *mut c_int,
        ) -> ncclResult_t,
    >,
    /// Frees a context.
    pub destroy: Option<FinalizeFn>,
}

// SAFETY: the tables are immutable statics; `name` points at a static C string.
unsafe impl Sync for ncclTuner_v6_t {}
// SAFETY: as above.
unsafe impl Sync for ncclTuner_v5_t {}
// SAFETY: as above.
unsafe impl Sync for ncclTuner_v4_t {}
// SAFETY: as above.
unsafe impl Sync for ncclTuner_v3_t {}

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::{align_of, offset_of, size_of};

    /// Sizes and offsets derived from `tuner_v5.h` / `tuner_v6.h`: three
    /// ints; 21 + 63 + 5 × 12 doubles.
    #[test]
    fn constants_and_domain_layouts() {
        type D = ncclNvlDomainInfo_v6_t;
        assert_eq!((size_of::<D>(), align_of::<D>()), (12, 4));
        assert_eq!(offset_of!(D, minRanksPerNvlDomain), 4);
        assert_eq!(offset_of!(D, maxRanksPerNvlDomain), 8);
        type C = ncclTunerConstants_v6_t;
        assert_eq!((size_of::<C>(), align_of::<C>()), (1152, 8));
        assert_eq!(offset_of!(C, baseLatencies), 0);
        assert_eq!(offset_of!(C, hwLatencies), 168);
        assert_eq!(offset_of!(C, llMaxBws), 672);
        assert_eq!(offset_of!(C, perChMaxRingLL128Bws), 768);
        assert_eq!(offset_of!(C, perChMaxTreeLL128Bws), 864);
        assert_eq!(offset_of!(C, perChMaxTreeBws), 960);
        assert_eq!(offset_of!(C, perChMaxNVLSTreeBws), 1056);
    }

    #[test]
    fn vtable_layouts() {
        assert_eq!(size_of::<ncclTuner_v6_t>(), 40);
        assert_eq!(offset_of!(ncclTuner_v6_t, init), 8);
        assert_eq!(offset_of!(ncclTuner_v6_t, getCollInfo), 16);
        assert_eq!(offset_of!(ncclTuner_v6_t, finalize), 24);
        assert_eq!(offset_of!(ncclTuner_v6_t, getChunkSize), 32);
        assert_eq!(size_of::<ncclTuner_v5_t>(), 32);
        assert_eq!(offset_of!(ncclTuner_v5_t, finalize), 24);
        assert_eq!(size_of::<ncclTuner_v4_t>(), 32);
        assert_eq!(offset_of!(ncclTuner_v4_t, destroy), 24);
        assert_eq!(size_of::<ncclTuner_v3_t>(), 32);
        assert_eq!(offset_of!(ncclTuner_v3_t, getCollInfo), 16);
        assert_eq!(size_of::<ncclFunc_t>(), 4);
        assert_eq!(size_of::<Option<InitV5Fn>>(), 8);
    }

    #[test]
    fn indices_match_the_header() {
        assert_eq!(
            [
                NCCL_ALGO_TREE,
                NCCL_ALGO_RING,
                NCCL_ALGO_COLLNET_DIRECT,
                NCCL_ALGO_COLLNET_CHAIN,
                NCCL_ALGO_NVLS,
                NCCL_ALGO_NVLS_TREE,
                NCCL_ALGO_PAT
            ],
            [0, 1, 2, 3, 4, 5, 6]
        );
        assert_eq!(
            [NCCL_PROTO_LL, NCCL_PROTO_LL128, NCCL_PROTO_SIMPLE],
            [0, 1, 2]
        );
        assert_eq!(
            [
                ncclFuncBroadcast,
                ncclFuncReduce,
                ncclFuncAllGather,
                ncclFuncReduceScatter,
                ncclFuncAllReduce
            ],
            [0, 1, 2, 3, 4]
        );
        assert_eq!(NCCL_ALGO_PROTO_IGNORE, -1.0);
    }
}
