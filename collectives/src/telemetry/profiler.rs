//! NCCL's profiler plugin interface, exported from libhetccl.so as
//! `ncclProfiler_v6` (NCCL 2.29 and later look for it first) and
//! `ncclProfiler_v5` (NCCL 2.28): NVIDIA's NCCL run with
//! `NCCL_PROFILER_PLUGIN=<path of libhetccl.so>` writes its own events as a
//! Chrome trace-event file (docs/observability.md).
//!
//! Each `init` (one per communicator) gets a context. An event lives from
//! `startEvent` to `stopEvent`; state changes (`recordEventState`) are kept
//! on it. Stopped events are kept, at most `HETCCL_TRACE_MAX_EVENTS` per
//! context, and `finalize` writes them to `HETCCL_TRACE_FILE` (`%r`: the
//! communicator's rank). Without `HETCCL_TRACE_FILE`, `init` turns every
//! event off. No callback unwinds into NCCL: a panic becomes
//! `ncclInternalError`.

use std::collections::HashSet;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::fmt::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use hetccl_abi::ncclResult_t;
use hetccl_abi::net::ncclDebugLogger_t;
use hetccl_abi::profiler::*;
use parking_lot::Mutex;

use super::clock;
use super::render::json_str;

/// The events `init` turns on: every type of version 5, and for version
/// 6 the copy-engine ones too.
const MASK_V5: c_int = 0xfff;
/// See [`MASK_V5`].
const MASK_V6: c_int = 0x7fff;

/// One communicator's profiler context.
struct Ctx {
    comm_id: u64,
    comm_name: Option<String>,
    rank: c_int,
    nranks: c_int,
    path: PathBuf,
    cap: usize,
    done: Mutex<Vec<Done>>,
    dropped: AtomicU64,
}

/// An event in progress (the handle NCCL holds).
struct Ev {
    ctx: Arc<Ctx>,
    type_: u64,
    name: String,
    /// `"key":value` members of the event's args.
    args: String,
    parent: usize,
    start: u64,
    tid: i64,
    states: Vec<(c_int, u64, Option<u64>)>,
}

/// A stopped event.
struct Done {
    ev: Ev,
    id: usize,
    end: u64,
}

fn text(p: *const c_char) -> String {
    if p.is_null() {
        return String::new();
    }
    // SAFETY: NCCL passes NUL-terminated strings that live during the call.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

fn guarded(f: impl FnOnce() -> ncclResult_t) -> ncclResult_t {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or(3)
}

unsafe extern "C" fn init_v6(
    context: *mut *mut c_void,
    comm_id: u64,
    mask: *mut c_int,
    comm_name: *const c_char,
    n_nodes: c_int,
    nranks: c_int,
    rank: c_int,
    logfn: ncclDebugLogger_t,
) -> ncclResult_t {
    // SAFETY: forwarded under NCCL's contract for `init`.
    unsafe {
        init(
            MASK_V6, context, comm_id, mask, comm_name, n_nodes, nranks, rank, logfn,
        )
    }
}

unsafe extern "C" fn init_v5(
    context: *mut *mut c_void,
    comm_id: u64,
    mask: *mut c_int,
    comm_name: *const c_char,
    n_nodes: c_int,
    nranks: c_int,
    rank: c_int,
    logfn: ncclDebugLogger_t,
) -> ncclResult_t {
    // SAFETY: forwarded under NCCL's contract for `init`.
    unsafe {
        init(
            MASK_V5, context, comm_id, mask, comm_name, n_nodes, nranks, rank, logfn,
        )
    }
}

/// `init`: a context, and the events to send (none without
/// `HETCCL_TRACE_FILE`).
#[allow(clippy::too_many_arguments)]
unsafe fn init(
    all: c_int,
    context: *mut *mut c_void,
    comm_id: u64,
    mask: *mut c_int,
    comm_name: *const c_char,
    _n_nodes: c_int,
    nranks: c_int,
    rank: c_int,
    _logfn: ncclDebugLogger_t,
) -> ncclResult_t {
    guarded(|| {
        if context.is_null() || mask.is_null() {
            return 4;
        }
        let cfg = hetccl_core::config::get();
        clock::init();
        let Some(template) = cfg.trace_file.as_deref() else {
            static ONCE: std::sync::Once = std::sync::Once::new();
            ONCE.call_once(|| {
                tracing::warn!(target: "hetccl::PROFILE",
                    "profiler plugin: HETCCL_TRACE_FILE is not set; no events are recorded");
            });
            // SAFETY: checked non-NULL; NCCL's out pointers.
            unsafe {
                *mask = 0;
                *context = std::ptr::null_mut();
            }
            return 0;
        };
        let name = (!comm_name.is_null())
            .then(|| text(comm_name))
            .filter(|n| !n.is_empty());
        let ctx = Arc::new(Ctx {
            comm_id,
            comm_name: name,
            rank,
            nranks,
            path: unique_path(super::path::expand(template, rank.max(0) as usize), comm_id),
            cap: cfg.trace_max_events,
            done: Mutex::new(Vec::new()),
            dropped: AtomicU64::new(0),
        });
        // SAFETY: checked non-NULL; NCCL's out pointers.
        unsafe {
            *mask = all;
            *context = Arc::into_raw(ctx) as *mut c_void;
        }
        0
    })
}

/// `path`, or `path.<comm id>` when another context of this process
/// writes `path` already.
fn unique_path(path: PathBuf, comm_id: u64) -> PathBuf {
    static TAKEN: Mutex<Option<HashSet<PathBuf>>> = Mutex::new(None);
    let mut g = TAKEN.lock();
    let taken = g.get_or_insert_with(HashSet::new);
    let p = if taken.contains(&path) {
        let mut s = path.into_os_string();
        s.push(format!(".{comm_id:016x}"));
        PathBuf::from(s)
    } else {
        path
    };
    taken.insert(p.clone());
    p
}

/// The event's name and args from its descriptor.
///
/// # Safety
/// `d` is a descriptor NCCL passed to `startEvent`.
unsafe fn describe(ctx: &Ctx, d: &ncclProfilerEventDescr_t) -> (String, String) {
    let mut a = String::new();
    // SAFETY: the member read is the one `type_` selects (NCCL's contract).
    let name = unsafe {
        match d.type_ {
            PROFILE_GROUP => "Group".to_string(),
            PROFILE_COLL => {
                let c = d.body.coll;
                let _ = write!(
                    a,
                    ",\"trace_id\":\"{:016x}:{}\",\"seq\":{},\"count\":{},\"root\":{},\"datatype\":{},\
                     \"algorithm\":{},\"protocol\":{},\"channels\":{},\"warps\":{}",
                    ctx.comm_id,
                    c.seqNumber,
                    c.seqNumber,
                    c.count,
                    c.root,
                    json_str(&text(c.datatype)),
                    json_str(&text(c.algo)),
                    json_str(&text(c.proto)),
                    c.nChannels,
                    c.nWarps
                );
                text(c.func)
            }
            PROFILE_P2P => {
                let p = d.body.p2p;
                let _ = write!(
                    a,
                    ",\"peer\":{},\"count\":{},\"datatype\":{},\"channels\":{}",
                    p.peer,
                    p.count,
                    json_str(&text(p.datatype)),
                    p.nChannels
                );
                text(p.func)
            }
            PROFILE_PROXY_OP => {
                let p = d.body.proxyOp;
                let _ = write!(
                    a,
                    ",\"peer\":{},\"channel\":{},\"steps\":{},\"chunk_bytes\":{},\"pid\":{}",
                    p.peer, p.channelId, p.nSteps, p.chunkSize, p.pid
                );
                if p.isSend != 0 {
                    "ProxyOp send"
                } else {
                    "ProxyOp recv"
                }
                .to_string()
            }
            PROFILE_PROXY_STEP => {
                let _ = write!(a, ",\"step\":{}", d.body.proxyStep.step);
                "ProxyStep".to_string()
            }
            PROFILE_PROXY_CTRL => "ProxyCtrl".to_string(),
            PROFILE_KERNEL_CH => {
                let k = d.body.kernelCh;
                let _ = write!(a, ",\"channel\":{},\"gpu_timer\":{}", k.channelId, k.pTimer);
                "KernelCh".to_string()
            }
            PROFILE_NET_PLUGIN => {
                let _ = write!(a, ",\"net_id\":{}", d.body.netPlugin.id);
                "NetPlugin".to_string()
            }
            PROFILE_GROUP_API => {
                let _ = write!(a, ",\"depth\":{}", d.body.groupApi.groupDepth);
                "GroupApi".to_string()
            }
            PROFILE_COLL_API => {
                let c = d.body.collApi;
                let _ = write!(
                    a,
                    ",\"count\":{},\"root\":{},\"datatype\":{}",
                    c.count,
                    c.root,
                    json_str(&text(c.datatype))
                );
                format!("{} (API)", text(c.func))
            }
            PROFILE_P2P_API => {
                let p = d.body.p2pApi;
                let _ = write!(
                    a,
                    ",\"count\":{},\"datatype\":{}",
                    p.count,
                    json_str(&text(p.datatype))
                );
                format!("{} (API)", text(p.func))
            }
            PROFILE_KERNEL_LAUNCH => "KernelLaunch".to_string(),
            PROFILE_CE_COLL => {
                let c = d.body.ceColl;
                let _ = write!(
                    a,
                    ",\"trace_id\":\"{:016x}:{}\",\"seq\":{},\"count\":{},\"datatype\":{},\"batches\":{}",
                    ctx.comm_id,
                    c.seqNumber,
                    c.seqNumber,
                    c.count,
                    json_str(&text(c.datatype)),
                    c.numBatches
                );
                format!("{} (CE)", text(c.func))
            }
            PROFILE_CE_SYNC => "CeSync".to_string(),
            PROFILE_CE_BATCH => {
                let b = d.body.ceCollBatch;
                let _ = write!(a, ",\"ops\":{},\"bytes\":{}", b.numOps, b.totalBytes);
                "CeBatch".to_string()
            }
            t => format!("event {t:#x}"),
        }
    };
    (name, a)
}

unsafe extern "C" fn start_event(
    context: *mut c_void,
    handle: *mut *mut c_void,
    descr: *mut ncclProfilerEventDescr_t,
) -> ncclResult_t {
    guarded(|| {
        if handle.is_null() {
            return 4;
        }
        // SAFETY: NCCL's out pointer, checked non-NULL.
        unsafe { *handle = std::ptr::null_mut() };
        if context.is_null() || descr.is_null() {
            return 0;
        }
        let ctx = context as *const Ctx;
        // SAFETY: `context` came from `init` (an `Arc<Ctx>` until
        // `finalize`): one more count for the event.
        let ctx = unsafe {
            Arc::increment_strong_count(ctx);
            Arc::from_raw(ctx)
        };
        // SAFETY: NCCL's descriptor, valid during the call.
        let d = unsafe { &*descr };
        // SAFETY: as above.
        let (name, args) = unsafe { describe(&ctx, d) };
        let ev = Box::new(Ev {
            ctx,
            type_: d.type_,
            name,
            args,
            parent: d.parentObj as usize,
            start: clock::ticks(),
            tid: hetccl_core::obs::gettid(),
            states: Vec::new(),
        });
        // SAFETY: as above.
        unsafe { *handle = Box::into_raw(ev).cast() };
        0
    })
}

unsafe extern "C" fn record_event_state(
    handle: *mut c_void,
    state: ncclProfilerEventState_t,
    args: *mut ncclProfilerEventStateArgs_t,
) -> ncclResult_t {
    guarded(|| {
        if handle.is_null() {
            return 0;
        }
        // SAFETY: a handle from `start_event`, not yet stopped (NCCL's
        // contract); NCCL serialises the calls on one event.
        let ev = unsafe { &mut *handle.cast::<Ev>() };
        let arg = if args.is_null() {
            None
        } else {
            // SAFETY: NCCL's args, valid during the call; every member is
            // 8 bytes or less and read as the one its event type uses.
            Some(unsafe {
                match ev.type_ {
                    PROFILE_PROXY_STEP => (*args).transSize as u64,
                    PROFILE_PROXY_CTRL => (*args).appendedProxyOps as u64,
                    PROFILE_KERNEL_CH => (*args).pTimer,
                    _ => (*args).data as u64,
                }
            })
        };
        ev.states.push((state, clock::ticks(), arg));
        0
    })
}

unsafe extern "C" fn stop_event(handle: *mut c_void) -> ncclResult_t {
    guarded(|| {
        if handle.is_null() {
            return 0;
        }
        let id = handle as usize;
        // SAFETY: a handle from `start_event`, stopped once.
        let ev = unsafe { Box::from_raw(handle.cast::<Ev>()) };
        let ctx = ev.ctx.clone();
        let mut done = ctx.done.lock();
        if done.len() >= ctx.cap {
            ctx.dropped.fetch_add(1, Ordering::Relaxed);
        } else {
            done.push(Done {
                ev: *ev,
                id,
                end: clock::ticks(),
            });
        }
        0
    })
}

unsafe extern "C" fn finalize(context: *mut c_void) -> ncclResult_t {
    guarded(|| {
        if context.is_null() {
            return 0;
        }
        // SAFETY: the `Arc<Ctx>` `init` gave out, returned once.
        let ctx = unsafe { Arc::from_raw(context as *const Ctx) };
        clock::calibrate();
        let text = render(&ctx);
        if let Err(e) = super::path::write_atomic(&ctx.path, text.as_bytes()) {
            tracing::warn!(target: "hetccl::PROFILE",
                "profiler plugin: cannot write {}: {e}", ctx.path.display());
            return 2;
        }
        0
    })
}

/// The names of `ncclProfilerEventState_t`.
fn state_name(s: c_int) -> String {
    const NAMES: [&str; 31] = [
        "ProxyOpSendPosted",
        "ProxyOpSendRemFifoWait",
        "ProxyOpSendTransmitted",
        "ProxyOpSendDone",
        "ProxyOpRecvPosted",
        "ProxyOpRecvReceived",
        "ProxyOpRecvTransmitted",
        "ProxyOpRecvDone",
        "ProxyStepSendGPUWait",
        "ProxyStepSendWait",
        "ProxyStepRecvWait",
        "ProxyStepRecvFlushWait",
        "ProxyStepRecvGPUWait",
        "ProxyCtrlIdle",
        "ProxyCtrlActive",
        "ProxyCtrlSleep",
        "ProxyCtrlWakeup",
        "ProxyCtrlAppend",
        "ProxyCtrlAppendEnd",
        "ProxyOpInProgress",
        "ProxyStepSendPeerWait",
        "NetPluginUpdate",
        "KernelChStop",
        "GroupStartApiStop",
        "GroupEndApiStart",
        "CeCollStart",
        "CeCollComplete",
        "CeSyncStart",
        "CeSyncComplete",
        "CeBatchStart",
        "CeBatchComplete",
    ];
    usize::try_from(s)
        .ok()
        .and_then(|i| NAMES.get(i))
        .map_or_else(|| format!("state {s}"), |n| (*n).to_string())
}

/// Microseconds of Unix time since `origin` (ns), with ns precision.
fn us(ticks: u64, origin: u64) -> String {
    let ns = clock::unix_ns(ticks).saturating_sub(origin);
    format!("{}.{:03}", ns / 1000, ns % 1000)
}

fn category(t: u64) -> &'static str {
    match t {
        PROFILE_GROUP => "group",
        PROFILE_COLL => "coll",
        PROFILE_P2P => "p2p",
        PROFILE_PROXY_OP => "proxy_op",
        PROFILE_PROXY_STEP => "proxy_step",
        PROFILE_PROXY_CTRL => "proxy_ctrl",
        PROFILE_KERNEL_CH => "kernel_ch",
        PROFILE_NET_PLUGIN => "net_plugin",
        PROFILE_GROUP_API | PROFILE_COLL_API | PROFILE_P2P_API => "api",
        PROFILE_KERNEL_LAUNCH => "kernel_launch",
        _ => "ce",
    }
}

/// The context's file: Chrome trace-event JSON, like the engine's
/// timeline (`trace_out`), one complete event per stopped event, its state
/// changes as instant events on the same track. Timestamps count from the
/// first event's start (Unix time in `otherData.origin_unix_ns`).
fn render(ctx: &Ctx) -> String {
    let done = ctx.done.lock();
    let origin = done
        .iter()
        .map(|d| clock::unix_ns(d.ev.start))
        .min()
        .unwrap_or_else(clock::now_unix_ns);
    let host = hetccl_core::obs::short_hostname();
    let pid = std::process::id();
    let mut o = String::with_capacity(512 + done.len() * 300);
    let _ =
        write!(
        o,
        "{{\"displayTimeUnit\":\"ns\",\"otherData\":{{\"source\":\"nccl-profiler\",\"host\":{},\
         \"pid\":{pid},\"rank\":{},\"nranks\":{},\"comm\":\"{:016x}\",\"comm_name\":{},\
         \"origin_unix_ns\":{origin},\"dropped_events\":{}}},\n\"traceEvents\":[\n\
         {{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":{},\"tid\":0,\"args\":{{\"name\":{}}}}}",
        json_str(host),
        ctx.rank,
        ctx.nranks,
        ctx.comm_id,
        ctx.comm_name.as_deref().map_or("null".to_string(), json_str),
        ctx.dropped.load(Ordering::Relaxed),
        ctx.rank,
        json_str(&format!("rank {} ({host}, pid {pid})", ctx.rank)),
    );
    for d in done.iter() {
        let e = &d.ev;
        let dur = clock::to_ns(d.end.saturating_sub(e.start));
        let _ = write!(
            o,
            ",\n{{\"name\":{},\"cat\":\"{}\",\"ph\":\"X\",\"pid\":{},\"tid\":{},\"ts\":{},\
             \"dur\":{}.{:03},\"args\":{{\"id\":{},\"parent\":{}{}}}}}",
            json_str(&e.name),
            category(e.type_),
            ctx.rank,
            e.tid,
            us(e.start, origin),
            dur / 1000,
            dur % 1000,
            d.id,
            e.parent,
            e.args
        );
        for (s, at, arg) in &e.states {
            let _ = write!(
                o,
                ",\n{{\"name\":{},\"cat\":\"state\",\"ph\":\"i\",\"s\":\"t\",\"pid\":{},\"tid\":{},\
                 \"ts\":{},\"args\":{{\"event\":{}{}}}}}",
                json_str(&state_name(*s)),
                ctx.rank,
                e.tid,
                us(*at, origin),
                d.id,
                arg.map_or_else(String::new, |v| format!(",\"value\":{v}"))
            );
        }
    }
    o.push_str("\n]}\n");
    o
}

/// The plugin's name in NCCL's logs.
static NAME: &CStr = c"hetccl";

/// NCCL 2.29 and later: the profiler plugin, version 6.
#[no_mangle]
pub static ncclProfiler_v6: ncclProfiler_t = ncclProfiler_t {
    name: NAME.as_ptr(),
    init: init_v6,
    startEvent: start_event,
    stopEvent: stop_event,
    recordEventState: record_event_state,
    finalize,
};

/// NCCL 2.28: the profiler plugin, version 5 (the same callbacks; the
/// copy-engine events stay off).
#[no_mangle]
pub static ncclProfiler_v5: ncclProfiler_t = ncclProfiler_t {
    name: NAME.as_ptr(),
    init: init_v5,
    startEvent: start_event,
    stopEvent: stop_event,
    recordEventState: record_event_state,
    finalize,
};
