//! The `#[repr(C)]` mirrors in `hetccl-abi` against NVIDIA's real `nccl.h`.
//!
//! `tests/c/layout_probe.c`, compiled against NCCL 2.32.3's `nccl.h`, prints
//! `key value` lines: sizes, alignments, field offsets and field sizes of the
//! structs, every enumerator, the constants, the `*_INITIALIZER` values and
//! `NCCL_VERSION()`. This test computes the same keys from `hetccl_abi` and
//! fails on any difference, including a key that only one side has, so that
//! nothing the probe prints goes unchecked.

use std::collections::BTreeMap;
use std::fmt::Display;
use std::mem::{align_of, offset_of, size_of};
use std::process::Command;

use hetccl_testkit::cc;

use hetccl_abi::config::ncclConfigExt_t;
use hetccl_abi::datatype::NCCL_NUM_TYPES;
use hetccl_abi::redop::{NCCL_MAX_RED_OP, NCCL_NUM_OPS};
use hetccl_abi::result::NCCL_NUM_RESULTS;
use hetccl_abi::{
    cudaStream_t, ncclCollConfig_t, ncclComm_t, ncclConfig_t, ncclDataType_t, ncclRedOp_t,
    ncclResult_t, ncclSimInfo_t, ncclUniqueId, ncclWaitSignalDesc_t, ncclWindow_t, CommMemStat,
    DataType, NcclResult, RedOp, ScalarResidence,
};

/// The `NCCL_VERSION(X,Y,Z)` arguments the probe evaluates.
const VERSIONS: [(i32, i32, i32); 7] = [
    (2, 8, 4),
    (2, 9, 0),
    (2, 19, 3),
    (2, 28, 0),
    (2, 32, 3),
    (3, 0, 0),
    (1, 8, 9),
];

/// Keys computed on the Rust side; inserting one twice is a bug in this test.
#[derive(Default)]
struct Keys(BTreeMap<String, String>);

impl Keys {
    fn put(&mut self, key: impl Into<String>, value: impl Display) {
        let key = key.into();
        let value = value.to_string();
        if let Some(old) = self.0.insert(key.clone(), value.clone()) {
            panic!("test bug: key {key} computed twice ({old}, {value})");
        }
    }
}

/// `size_of` the field a projection closure borrows.
fn field_size<T, F>(_: impl Fn(&T) -> &F) -> usize {
    size_of::<F>()
}

macro_rules! ty {
    ($k:expr, $T:ty, $cname:expr) => {
        $k.put(format!("sizeof.{}", $cname), size_of::<$T>());
        $k.put(format!("alignof.{}", $cname), align_of::<$T>());
    };
    ($k:expr, $T:ident) => {
        ty!($k, $T, stringify!($T))
    };
}

macro_rules! field {
    // A field whose C path differs from the Rust name (nested struct member).
    ($k:expr, $T:ident, $f:ident, $cpath:expr) => {
        $k.put(
            format!("offsetof.{}.{}", stringify!($T), $cpath),
            offset_of!($T, $f),
        );
        $k.put(
            format!("fieldsize.{}.{}", stringify!($T), $cpath),
            field_size(|s: &$T| &s.$f),
        );
    };
    ($k:expr, $T:ident, $($f:ident),+ $(,)?) => {
        $( field!($k, $T, $f, stringify!($f)); )+
    };
}

/// Pointers print as 1 (non-NULL) or 0 (NULL), ints as decimal.
macro_rules! init {
    ($k:expr, $T:ident, $v:expr, ints: [$($i:ident),* $(,)?], ptrs: [$($p:ident),* $(,)?]) => {
        $( $k.put(format!("init.{}.{}", stringify!($T), stringify!($i)), $v.$i); )*
        $( $k.put(format!("init.{}.{}", stringify!($T), stringify!($p)), u8::from(!$v.$p.is_null())); )*
    };
}

fn result_name(r: NcclResult) -> &'static str {
    match r {
        NcclResult::Success => "ncclSuccess",
        NcclResult::UnhandledCudaError => "ncclUnhandledCudaError",
        NcclResult::SystemError => "ncclSystemError",
        NcclResult::InternalError => "ncclInternalError",
        NcclResult::InvalidArgument => "ncclInvalidArgument",
        NcclResult::InvalidUsage => "ncclInvalidUsage",
        NcclResult::RemoteError => "ncclRemoteError",
        NcclResult::InProgress => "ncclInProgress",
        NcclResult::Timeout => "ncclTimeout",
    }
}

/// Every `nccl.h` name of a type, aliases included.
fn datatype_names(t: DataType) -> &'static [&'static str] {
    match t {
        DataType::Int8 => &["ncclInt8", "ncclChar"],
        DataType::Uint8 => &["ncclUint8"],
        DataType::Int32 => &["ncclInt32", "ncclInt"],
        DataType::Uint32 => &["ncclUint32"],
        DataType::Int64 => &["ncclInt64"],
        DataType::Uint64 => &["ncclUint64"],
        DataType::Float16 => &["ncclFloat16", "ncclHalf"],
        DataType::Float32 => &["ncclFloat32", "ncclFloat"],
        DataType::Float64 => &["ncclFloat64", "ncclDouble"],
        DataType::Bfloat16 => &["ncclBfloat16"],
        DataType::Float8e4m3 => &["ncclFloat8e4m3"],
        DataType::Float8e5m2 => &["ncclFloat8e5m2"],
    }
}

fn redop_name(op: RedOp) -> &'static str {
    match op {
        RedOp::Sum => "ncclSum",
        RedOp::Prod => "ncclProd",
        RedOp::Max => "ncclMax",
        RedOp::Min => "ncclMin",
        RedOp::Avg => "ncclAvg",
        RedOp::Dynamic(_) => panic!("not a built-in op"),
    }
}

/// All values of `ScalarResidence` (the crate has no `ALL`; the exhaustive
/// match in `residence_name` breaks the build when a variant is added).
const RESIDENCES: [ScalarResidence; 2] = [ScalarResidence::Device, ScalarResidence::HostImmediate];

fn residence_name(r: ScalarResidence) -> &'static str {
    match r {
        ScalarResidence::Device => "ncclScalarDevice",
        ScalarResidence::HostImmediate => "ncclScalarHostImmediate",
    }
}

const MEM_STATS: [CommMemStat; 4] = [
    CommMemStat::GpuMemSuspend,
    CommMemStat::GpuMemSuspended,
    CommMemStat::GpuMemPersist,
    CommMemStat::GpuMemTotal,
];

fn mem_stat_name(s: CommMemStat) -> &'static str {
    match s {
        CommMemStat::GpuMemSuspend => "ncclStatGpuMemSuspend",
        CommMemStat::GpuMemSuspended => "ncclStatGpuMemSuspended",
        CommMemStat::GpuMemPersist => "ncclStatGpuMemPersist",
        CommMemStat::GpuMemTotal => "ncclStatGpuMemTotal",
    }
}

/// The Rust side of every key the probe prints.
fn rust_keys() -> BTreeMap<String, String> {
    let mut k = Keys::default();

    // Handles.
    ty!(k, ncclComm_t);
    ty!(k, ncclWindow_t);
    ty!(k, cudaStream_t);

    // ncclUniqueId.
    ty!(k, ncclUniqueId);
    field!(k, ncclUniqueId, internal);

    // ncclConfig_t.
    ty!(k, ncclConfig_t);
    field!(
        k,
        ncclConfig_t,
        size,
        magic,
        version,
        blocking,
        cgaClusterSize,
        minCTAs,
        maxCTAs,
        netName,
        splitShare,
        trafficClass,
        commName,
        collnetEnable,
        CTAPolicy,
        shrinkShare,
        nvlsCTAs,
        nChannelsPerNetPeer,
        nvlinkCentricSched,
        graphUsageMode,
        numRmaCtx,
        maxP2pPeers,
        graphStreamOrdering,
        launchOrderImplicit,
        numRmaSig,
        rmaEagerInit,
        hostCftMode,
        nvlsHostMode,
    );
    let c = ncclConfig_t::default();
    init!(k, ncclConfig_t, c,
        ints: [
            size, magic, version, blocking, cgaClusterSize, minCTAs, maxCTAs, splitShare,
            trafficClass, collnetEnable, CTAPolicy, shrinkShare, nvlsCTAs, nChannelsPerNetPeer,
            nvlinkCentricSched, graphUsageMode, numRmaCtx, maxP2pPeers, graphStreamOrdering,
            launchOrderImplicit, numRmaSig, rmaEagerInit, hostCftMode, nvlsHostMode,
        ],
        ptrs: [netName, commName]);

    // ncclConfigExt_t: C nests `key {vendorId, optionId}` and a pointer-sized
    // union `val`; the mirror flattens them.
    ty!(k, ncclConfigExt_t);
    field!(k, ncclConfigExt_t, next, "next");
    field!(k, ncclConfigExt_t, vendorId, "key.vendorId");
    field!(k, ncclConfigExt_t, optionId, "key.optionId");
    field!(k, ncclConfigExt_t, val, "val");

    // ncclCollConfig_t.
    ty!(k, ncclCollConfig_t);
    field!(
        k,
        ncclCollConfig_t,
        size,
        magic,
        version,
        ext,
        minCTAs,
        maxCTAs,
        nvlsCTAs,
        cgaClusterSize,
        algSelection,
        forceAlgSelection,
        CTAPolicy,
        userProfilerTag,
        launchCompletionEvent,
    );

    // ncclSimInfo_t and NCCL_SIM_INFO_INITIALIZER.
    ty!(k, ncclSimInfo_t);
    field!(k, ncclSimInfo_t, size, magic, version, estimatedTime);
    k.put("init.ncclSimInfo_t.magic", hetccl_abi::NCCL_SIM_INFO_MAGIC);
    k.put(
        "init.ncclSimInfo_t.estimatedTime.bits",
        format!("{:#010x}", hetccl_abi::NCCL_UNDEF_FLOAT.to_bits()),
    );

    // ncclWaitSignalDesc_t.
    ty!(k, ncclWaitSignalDesc_t);
    field!(k, ncclWaitSignalDesc_t, opCnt, peer, sigIdx, ctx);

    // ncclResult_t.
    ty!(k, ncclResult_t);
    for r in NcclResult::ALL {
        k.put(format!("enum.ncclResult_t.{}", result_name(r)), r.raw());
    }
    k.put("enum.ncclResult_t.ncclNumResults", NCCL_NUM_RESULTS);

    // ncclDataType_t.
    ty!(k, ncclDataType_t);
    for t in DataType::ALL {
        for name in datatype_names(t) {
            k.put(format!("enum.ncclDataType_t.{name}"), t as i32);
        }
    }
    k.put("enum.ncclDataType_t.ncclNumTypes", NCCL_NUM_TYPES);

    // ncclRedOp_t.
    ty!(k, ncclRedOp_t);
    for op in RedOp::BUILTIN {
        k.put(format!("enum.ncclRedOp_t.{}", redop_name(op)), op.raw());
    }
    k.put("enum.ncclRedOp_t.ncclNumOps", NCCL_NUM_OPS);
    k.put("enum.ncclRedOp_t.ncclMaxRedOp", NCCL_MAX_RED_OP);

    // ncclScalarResidence_t, ncclCommMemStat_t: the Rust enums are what
    // crosses the ABI (as i32), so their size is what must match.
    ty!(k, ScalarResidence, "ncclScalarResidence_t");
    for r in RESIDENCES {
        k.put(
            format!("enum.ncclScalarResidence_t.{}", residence_name(r)),
            r as i32,
        );
    }
    ty!(k, CommMemStat, "ncclCommMemStat_t");
    for s in MEM_STATS {
        k.put(
            format!("enum.ncclCommMemStat_t.{}", mem_stat_name(s)),
            s as i32,
        );
    }

    // Constants.
    k.put(
        "const.NCCL_UNIQUE_ID_BYTES",
        hetccl_abi::NCCL_UNIQUE_ID_BYTES,
    );
    k.put("const.NCCL_API_MAGIC", hetccl_abi::NCCL_API_MAGIC);
    k.put(
        "const.NCCL_CONFIG_UNDEF_INT",
        hetccl_abi::NCCL_CONFIG_UNDEF_INT,
    );
    k.put("const.NCCL_SPLIT_NOCOLOR", hetccl_abi::NCCL_SPLIT_NOCOLOR);
    k.put(
        "const.NCCL_UNDEF_FLOAT.bits",
        format!("{:#010x}", hetccl_abi::NCCL_UNDEF_FLOAT.to_bits()),
    );
    k.put("const.NCCL_SHRINK_DEFAULT", hetccl_abi::NCCL_SHRINK_DEFAULT);
    k.put("const.NCCL_SHRINK_ABORT", hetccl_abi::NCCL_SHRINK_ABORT);
    k.put(
        "const.NCCL_WIN_REQUIRED_ALIGNMENT",
        hetccl_abi::NCCL_WIN_REQUIRED_ALIGNMENT,
    );

    for (x, y, z) in VERSIONS {
        k.put(
            format!("version.{x}.{y}.{z}"),
            hetccl_abi::nccl_version_code(x, y, z),
        );
    }
    k.0
}

/// Differences between the two key sets, one line each; empty when equal.
fn diff(c: &BTreeMap<String, String>, rust: &BTreeMap<String, String>) -> Vec<String> {
    let mut out = Vec::new();
    for (key, cv) in c {
        match rust.get(key) {
            None => out.push(format!(
                "  only in nccl.h (not checked on the Rust side): {key} = {cv}"
            )),
            Some(rv) if rv != cv => out.push(format!(
                "  MISMATCH {key}: nccl.h = {cv}, hetccl-abi = {rv}"
            )),
            Some(_) => {}
        }
    }
    for (key, rv) in rust {
        if !c.contains_key(key) {
            out.push(format!(
                "  only in hetccl-abi (the probe does not print it): {key} = {rv}"
            ));
        }
    }
    out
}

#[test]
fn layout_matches_nvidia_nccl_h() {
    let probe = cc::compile_c(
        "tests/c/layout_probe.c",
        "layout_probe",
        &cc::CcOpts::default(),
    );
    let out = cc::run_ok(&mut Command::new(&probe));
    let c = cc::parse_kv(&String::from_utf8(out.stdout).expect("probe prints UTF-8"));
    let rust = rust_keys();
    let d = diff(&c, &rust);
    assert!(
        d.is_empty(),
        "hetccl-abi differs from NVIDIA nccl.h {} ({} of {} keys):\n{}",
        cc::nvidia().version,
        d.len(),
        c.len(),
        d.join("\n")
    );
    // A sanity floor, so an empty or truncated probe output cannot pass.
    assert!(c.len() > 200, "the probe printed only {} keys", c.len());
}

/// The `ALL`/`BUILTIN` arrays are complete and in value order, and agree with
/// the `ncclNum*` counts (which the probe checks against nccl.h).
#[test]
fn all_arrays_are_dense_and_ordered() {
    assert_eq!(NcclResult::ALL.len() as i32, NCCL_NUM_RESULTS);
    for (i, r) in NcclResult::ALL.iter().enumerate() {
        assert_eq!(r.raw(), i as i32, "{r:?}");
    }
    assert_eq!(DataType::ALL.len() as i32, NCCL_NUM_TYPES);
    for (i, t) in DataType::ALL.iter().enumerate() {
        assert_eq!(*t as i32, i as i32, "{t:?}");
    }
    assert_eq!(RedOp::BUILTIN.len() as i32, NCCL_NUM_OPS);
    for (i, op) in RedOp::BUILTIN.iter().enumerate() {
        assert_eq!(op.raw(), i as i32, "{op:?}");
    }
}

#[test]
fn diff_reports_every_kind_of_difference() {
    let m = |kv: &[(&str, &str)]| -> BTreeMap<String, String> {
        kv.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    let c = m(&[("a", "1"), ("b", "2"), ("c", "3")]);
    let r = m(&[("a", "1"), ("b", "5"), ("d", "4")]);
    let d = diff(&c, &r);
    assert_eq!(d.len(), 3, "{d:?}");
    assert!(d[0].contains("MISMATCH b"));
    assert!(d[1].contains("only in nccl.h") && d[1].contains(" c "));
    assert!(d[2].contains("only in hetccl-abi") && d[2].contains(" d "));
    assert!(diff(&c, &c).is_empty());
}
