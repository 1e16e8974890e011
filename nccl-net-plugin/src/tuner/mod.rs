//! NVIDIA NCCL's tuner plugin (`ncclTunerPlugin_v3..v6`), exported from
//! `libhetccl.so` next to the net plugin tables.
//!
//! The tuner reads the tuning table named by `HETCCL_TUNING_FILE`
//! ([`table`]) once per process. Each communicator's `init` picks the table's
//! layout for its (nRanks, nNodes); `getCollInfo` then makes the table's
//! (algorithm, protocol) win for the sizes an entry covers ([`cost`]),
//! leaving every pair NCCL marked unusable alone. Without a file, a layout
//! or a covering entry, nothing is changed.
//!
//! The adapter files (`v3.rs` … `v6.rs`) only convert their version's
//! arguments and call these functions. `getCollInfo` and `getChunkSize`
//! always return `ncclSuccess`, because NCCL fails the collective on any
//! error; their problems are logged (WARN once per process and entry point).
#![allow(clippy::missing_safety_doc)]

pub mod cost;
pub mod json;
pub mod table;
pub mod v3;
pub mod v4;
pub mod v5;
pub mod v6;

use std::ffi::{c_int, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

use hetccl_abi::net::ncclDebugLogger_t;
use hetccl_abi::tuner::{ncclFunc_t, NCCL_NUM_FUNCTIONS};
use hetccl_abi::{ncclResult_t, NcclResult};

use cost::Edit;
use table::{Layout, Table};

/// The tuner name NCCL prints (`TUNER/Plugin: Using hetccl`).
pub const TUNER_NAME: &std::ffi::CStr = c"hetccl";

/// Log target (NCCL's TUNING subsystem).
const TARGET: &str = "hetccl::TUNING";

/// The most algorithms or protocols a cost table may have.
const MAX_DIM: usize = 64;

/// The magic of a live [`TunerCtx`].
const MAGIC: u64 = 0x6865_7463_7475_6e65; // "hetctune"

/// One communicator's tuner state.
pub struct TunerCtx {
    magic: u64,
    /// The table's layout for this communicator, if any.
    layout: Option<&'static Layout>,
}

/// The table of this process: loaded on first use, `None` without a usable
/// file (the reason logged once).
fn process_table() -> Option<&'static Table> {
    static TABLE: OnceLock<Option<Table>> = OnceLock::new();
    TABLE
        .get_or_init(|| {
            let cfg = hetccl_core::config::get();
            let Some(path) = cfg.tuning_file.as_deref() else {
                tracing::info!(
                    target: TARGET,
                    "tuner: HETCCL_TUNING_FILE is unset; leaving NCCL's algorithm and protocol choices"
                );
                return None;
            };
            match Table::load(path) {
                Ok(t) => {
                    tracing::info!(
                        target: TARGET,
                        "tuner: loaded {path} ({} layouts)",
                        t.layouts.len()
                    );
                    Some(t)
                }
                Err(e) if e == table::ENGINE_TABLE => {
                    tracing::info!(
                        target: TARGET,
                        "tuner: HETCCL_TUNING_FILE {path} is a table for hetccl's own engine; \
                         not used by the tuner plugin"
                    );
                    None
                }
                Err(e) => {
                    tracing::warn!(
                        target: TARGET,
                        "tuner: ignoring HETCCL_TUNING_FILE: {e}; leaving NCCL's choices"
                    );
                    None
                }
            }
        })
        .as_ref()
}

/// Runs a C entry point: a panic becomes `ncclInternalError`, an error
/// `ncclInvalidArgument`; both are logged at WARN.
fn guard<F: FnOnce() -> Result<(), String>>(name: &'static str, body: F) -> ncclResult_t {
    hetccl_core::obs::ensure_init();
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => NcclResult::Success.raw(),
        Ok(Err(e)) => {
            tracing::warn!(target: TARGET, "tuner {name}: {e}");
            NcclResult::InvalidArgument.raw()
        }
        Err(_) => {
            tracing::error!(target: TARGET, "tuner {name}: internal error (panic)");
            NcclResult::InternalError.raw()
        }
    }
}

/// Like [`guard`], but always `ncclSuccess`: a failed call changes nothing,
/// and its first failure per entry point is logged at WARN.
fn guard_ok<F: FnOnce() -> Result<(), String>>(
    name: &'static str,
    warned: &AtomicBool,
    body: F,
) -> ncclResult_t {
    let why = match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => return NcclResult::Success.raw(),
        Ok(Err(e)) => e,
        Err(_) => "internal error (panic)".to_string(),
    };
    if !warned.swap(true, Ordering::Relaxed) {
        hetccl_core::obs::ensure_init();
        tracing::warn!(target: TARGET, "tuner {name}: {why}; NCCL's choice stands (reported once)");
    }
    NcclResult::Success.raw()
}

/// Validates and borrows a context made by [`init`].
unsafe fn ctx_ref<'a>(ctx: *mut c_void) -> Result<&'a TunerCtx, String> {
    if ctx.is_null() {
        return Err("context is NULL".into());
    }
    // SAFETY: non-NULL; NCCL passes back the pointer init returned, and the
    // magic rejects anything else that is readable.
    let c = unsafe { &*ctx.cast::<TunerCtx>() };
    if c.magic != MAGIC {
        return Err("not a hetccl tuner context".into());
    }
    Ok(c)
}

/// `init`: a context for a communicator of `nranks` ranks on `nnodes` nodes.
pub unsafe fn init(
    ctx: *mut *mut c_void,
    nranks: usize,
    nnodes: usize,
    logger: ncclDebugLogger_t,
) -> ncclResult_t {
    guard("init", || {
        if ctx.is_null() {
            return Err("ctx is NULL".into());
        }
        if let Some(l) = logger {
            hetccl_core::obs::set_external_logger(Some(l));
        }
        let layout = process_table().and_then(|t| t.layout(nranks as u64, nnodes as u64));
        if process_table().is_some() && layout.is_none() {
            tracing::info!(
                target: TARGET,
                "tuner: the table has no layout for nRanks {nranks} nNodes {nnodes}; leaving NCCL's choices"
            );
        }
        let obj = Box::new(TunerCtx {
            magic: MAGIC,
            layout,
        });
        // SAFETY: checked non-NULL.
        unsafe { *ctx = Box::into_raw(obj).cast() };
        Ok(())
    })
}

/// `finalize` / `destroy`: frees a context from [`init`].
pub unsafe fn finalize(ctx: *mut c_void) -> ncclResult_t {
    guard("finalize", || {
        // SAFETY: validated; NCCL finalizes each context once.
        unsafe { ctx_ref(ctx)? };
        // SAFETY: the pointer came from Box::into_raw in init.
        let mut obj = unsafe { Box::from_raw(ctx.cast::<TunerCtx>()) };
        obj.magic = 0;
        drop(obj);
        Ok(())
    })
}

/// `getCollInfo`: edits NCCL's `[num_algo][num_proto]` cost table.
#[allow(clippy::too_many_arguments)]
pub unsafe fn get_coll_info(
    ctx: *mut c_void,
    coll: ncclFunc_t,
    nbytes: usize,
    table: *mut *mut f32,
    num_algo: c_int,
    num_proto: c_int,
    nchannels: *mut c_int,
) -> ncclResult_t {
    static WARNED: AtomicBool = AtomicBool::new(false);
    guard_ok("getCollInfo", &WARNED, || {
        // SAFETY: validated inside.
        let c = unsafe { ctx_ref(ctx)? };
        let Some(layout) = c.layout else {
            return Ok(());
        };
        let Some(e) = usize::try_from(coll)
            .ok()
            .filter(|&f| f < NCCL_NUM_FUNCTIONS)
            .and_then(|f| layout.lookup(f, nbytes as u64))
        else {
            return Ok(());
        };
        let dims = |n: c_int| {
            usize::try_from(n)
                .ok()
                .filter(|n| (1..=MAX_DIM).contains(n))
        };
        let (Some(na), Some(np)) = (dims(num_algo), dims(num_proto)) else {
            return Err(format!("cost table of {num_algo} x {num_proto}"));
        };
        if table.is_null() {
            return Err("collCostTable is NULL".into());
        }
        // SAFETY: NCCL passes a contiguous float[numAlgo][numProto] cast to
        // float** (not an array of row pointers), valid for this call.
        let cells = unsafe { std::slice::from_raw_parts_mut(table.cast::<f32>(), na * np) };
        let edit = cost::prefer(cells, np, e.algo, e.proto);
        tracing::trace!(
            target: TARGET,
            "tuner: coll {coll} {nbytes} B: algo {} proto {}: {edit:?}",
            e.algo,
            e.proto
        );
        if edit != Edit::Unusable {
            if let Some(n) = e.nchannels {
                if !nchannels.is_null() {
                    // SAFETY: non-NULL out pointer NCCL owns for this call.
                    unsafe { *nchannels = n as c_int };
                }
            }
        }
        Ok(())
    })
}

/// `getChunkSize` (v6): the table's chunk size, when the entry covering
/// (`coll`, `nbytes`) gives one for exactly this (`algo`, `proto`).
#[allow(clippy::too_many_arguments)]
pub unsafe fn get_chunk_size(
    ctx: *mut c_void,
    coll: ncclFunc_t,
    nbytes: usize,
    algo: c_int,
    proto: c_int,
    chunk: *mut usize,
) -> ncclResult_t {
    static WARNED: AtomicBool = AtomicBool::new(false);
    guard_ok("getChunkSize", &WARNED, || {
        // SAFETY: validated inside.
        let c = unsafe { ctx_ref(ctx)? };
        let Some(layout) = c.layout else {
            return Ok(());
        };
        let Some(e) = usize::try_from(coll)
            .ok()
            .and_then(|f| layout.lookup(f, nbytes as u64))
        else {
            return Ok(());
        };
        let same = usize::try_from(algo) == Ok(e.algo) && usize::try_from(proto) == Ok(e.proto);
        if let (true, Some(bytes)) = (same, e.chunk_bytes) {
            if chunk.is_null() {
                return Err("chunkSize is NULL".into());
            }
            // SAFETY: non-NULL in/out pointer NCCL owns for this call.
            unsafe { *chunk = usize::try_from(bytes).unwrap_or(usize::MAX) };
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctx_with(layout: Option<Layout>) -> *mut c_void {
        Box::into_raw(Box::new(TunerCtx {
            magic: MAGIC,
            layout: layout.map(|l| &*Box::leak(Box::new(l))),
        }))
        .cast()
    }

    fn layout() -> Layout {
        let t = Table::parse(
            br#"{"format":"hetccl-nccl-tuning","version":1,"layouts":[{"nranks":2,"nnodes":1,"entries":[
                {"collective":"allreduce","max_bytes":1000,"algo":"tree","proto":"ll","nchannels":3,"chunk_bytes":512}]}]}"#,
        )
        .unwrap();
        t.layouts[0].clone()
    }

    #[test]
    fn bad_arguments_change_nothing_and_succeed() {
        let ok = NcclResult::Success.raw();
        let ctx = ctx_with(Some(layout()));
        let mut cells = [5.0_f32, 1.0, 2.0, 3.0];
        let p = cells.as_mut_ptr().cast::<*mut f32>();
        let mut nch = 0;
        // SAFETY: test pointers are valid or NULL on purpose.
        unsafe {
            assert_eq!(
                get_coll_info(std::ptr::null_mut(), 4, 8, p, 2, 2, &mut nch),
                ok
            );
            assert_eq!(
                get_coll_info(ctx, 4, 8, std::ptr::null_mut(), 2, 2, &mut nch),
                ok
            );
            assert_eq!(get_coll_info(ctx, 4, 8, p, 0, 2, &mut nch), ok);
            assert_eq!(get_coll_info(ctx, 4, 8, p, 2, -1, &mut nch), ok);
            assert_eq!(get_coll_info(ctx, 4, 8, p, 2, 65, &mut nch), ok);
            assert_eq!(get_coll_info(ctx, -3, 8, p, 2, 2, &mut nch), ok);
            assert_eq!(get_coll_info(ctx, 99, 8, p, 2, 2, &mut nch), ok);
            assert_eq!(get_coll_info(ctx, 4, 1001, p, 2, 2, &mut nch), ok);
            assert_eq!((cells, nch), ([5.0, 1.0, 2.0, 3.0], 0));
            assert_eq!(get_coll_info(ctx, 4, 8, p, 2, 2, std::ptr::null_mut()), ok);
            assert!(cells[0] < 1.0 && cells[1..] == [1.0, 2.0, 3.0]);
            let mut cells = [5.0_f32, 1.0, 2.0, 3.0];
            let p = cells.as_mut_ptr().cast::<*mut f32>();
            assert_eq!(get_coll_info(ctx, 4, 1000, p, 2, 2, &mut nch), ok);
            assert_eq!((cells[0], nch), (0.5, 3));
            let mut chunk = 64usize;
            assert_eq!(get_chunk_size(ctx, 4, 8, 1, 0, &mut chunk), ok);
            assert_eq!(chunk, 64);
            assert_eq!(get_chunk_size(ctx, 4, 8, 0, 0, &mut chunk), ok);
            assert_eq!(chunk, 512);
            assert_eq!(get_chunk_size(ctx, 4, 8, 0, 0, std::ptr::null_mut()), ok);
            assert_eq!(finalize(ctx), ok);
            assert_eq!(
                finalize(std::ptr::null_mut()),
                NcclResult::InvalidArgument.raw()
            );
            assert_eq!(
                init(std::ptr::null_mut(), 2, 1, None),
                NcclResult::InvalidArgument.raw()
            );
        }
    }

    #[test]
    fn no_layout_changes_nothing() {
        let ctx = ctx_with(None);
        let mut cells = [5.0_f32, 1.0, -1.0, 3.0];
        let mut nch = 0;
        // SAFETY: valid test pointers.
        unsafe {
            get_coll_info(ctx, 4, 8, cells.as_mut_ptr().cast(), 2, 2, &mut nch);
            assert_eq!((cells, nch), ([5.0, 1.0, -1.0, 3.0], 0));
            assert_eq!(finalize(ctx), NcclResult::Success.raw());
        }
    }
}
