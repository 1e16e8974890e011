//! The stream-ordered path for calls on CUDA memory: the user's thread
//! records an event on the user's stream, makes the stream wait for a flag,
//! and returns at once; a proxy thread runs the call and sets the flag.
//!
//! Per call, on the user's stream (in stream order after the user's work):
//! 1. an event ("ready"): the inputs are complete once it has passed;
//! 2. a wait on the batch's flag in pinned, device-mapped memory
//!    (`cuStreamWaitValue32`);
//! 3. an event ("done"): the stream is past the call.
//!
//! Where stream memory operations are unavailable, the stream does not
//! wait: the caller's thread waits until the proxy has finished the batch
//! (no host function waits, and none calls CUDA).
//!
//! Every event and stream operation is made in the context that owns the
//! call's stream (`cuStreamGetCtx`; the default stream's is the caller's
//! current context, else the primary context of the buffers' device), so a
//! thread that drives several GPUs in one group, or a group end on a
//! thread whose current context is another, works; the caller's current
//! context is restored afterwards.
//!
//! Nothing that waits for the device (a free, an IPC close, a module load)
//! is done while a batch is in flight: [`super::safe`] counts batches from
//! before their first stream wait to after their flag is set, and such
//! calls wait for a safe point. The reduction kernels are loaded on the
//! caller's thread before its batch begins ([`super::module::prepare`]).
//!
//! The proxy thread (one per communicator, ended when idle) waits for the
//! "ready" events, then runs the batch on a stream of its own, on a
//! communicator whose ranks all share this node:
//! - collectives (alone, or grouped without sends or receives) one by one,
//!   each through CUDA IPC when every rank can ([`super::peer`]: peers'
//!   device buffers are read where they lie), else staged alone;
//! - sends and receives through a mailbox per pair of ranks ([`super::p2p`]),
//!   CUDA IPC or staged per message;
//!
//! and anything else (other nodes, other memory) staged ([`super::stage`]):
//! the inputs are copied into pinned host buffers, the host engine
//! ([`crate::launch::submit`]) runs the calls (one host group for a
//! batch of several), and the outputs are copied back.
//!
//! The proxy synchronises its stream, then sets the flag, so later work on
//! the user's stream sees the results, and the user's thread never waits
//! for the collective. Calls inside `ncclGroupStart/End` are handed over
//! when the outermost group ends and run as one batch, so grouped sends and
//! receives cannot deadlock. A failed batch still releases the stream (so
//! it never hangs), logs a warning and marks the communicator failed: its
//! next call returns `ncclRemoteError`.
//!
//! CUDA graph capture is refused with `ncclInvalidUsage` (checked with
//! `cuStreamIsCapturing`): host-side progress cannot be captured.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hetccl_abi::RedOp;
use once_cell::sync::Lazy;
use parking_lot::{Condvar, Mutex};

use super::driver::{self, cu};
use super::flags::Flag;
use super::gdr;
use super::memory;
use super::module;
use super::p2p;
use super::peer::{self, PeerState};
use super::safe;
use super::stage::{self, Event};
use crate::algo::Collective;
use crate::comm::redop_table::Scalar;
use crate::error::{Error, Result};
use crate::launch::Call;
use crate::launch::{self, group};

/// A proxy thread with nothing to do for this long ends.
const PROXY_IDLE: Duration = Duration::from_secs(10);

/// One call on CUDA memory, waiting for the proxy.
struct PendingOp {
    /// The call as validated (device pointers, the user's stream).
    args: Call,
    /// The context that owns the call's stream.
    ctx: usize,
    /// Recorded on the user's stream at the call: the inputs are ready.
    ready: Event,
    /// Recorded on the user's stream after its wait: the stream is past it.
    done: Event,
    /// When the call was enqueued (`telemetry::clock` ticks).
    enqueued: u64,
}

/// Set by the proxy once a batch's flag is set, for a caller's thread that
/// waits for it (no stream waits where stream memory operations are
/// unavailable).
#[derive(Default)]
struct Released {
    done: Mutex<bool>,
    cv: Condvar,
}

impl Released {
    fn set(&self) {
        *self.done.lock() = true;
        self.cv.notify_all();
    }

    /// Waits until [`Released::set`], at most `limit`.
    fn wait(&self, limit: Duration) -> Result<()> {
        let end = Instant::now() + limit;
        let mut done = self.done.lock();
        while !*done {
            if self.cv.wait_until(&mut done, end).timed_out() {
                return Err(Error::Timeout(
                    format!("a device-buffer operation did not finish within {limit:?}").into(),
                ));
            }
        }
        Ok(())
    }
}

/// A batch: the calls of one group (or one call), released by one flag.
struct Batch {
    ops: Vec<PendingOp>,
    /// What the streams wait on; `None` when no flag was free (the caller's
    /// thread waits instead).
    flag: Option<Flag>,
    /// The caller's thread waits for this batch (see [`Released`]).
    caller_waits: Option<Arc<Released>>,
}

// SAFETY: the raw pointers are CUDA contexts, which the driver lets any
// thread make current; the calls' buffers and streams are `UserPtr`s and
// the flag is the batch's own slot of a flag slab.
unsafe impl Send for Batch {}

/// Runs (or, inside a group, queues) one call on CUDA memory.
pub fn submit(a: Call) -> Result<()> {
    driver::require("device buffers")?;
    let stream = a.stream.get() as cu::CUstream;
    // SAFETY: NCCL's contract: the caller passes its live stream (or NULL).
    if unsafe { driver::is_capturing(stream)? } {
        return Err(Error::usage(
            "the stream is being captured into a CUDA graph; hetccl does not support \
             graph capture of collectives (docs/gpu.md): run them outside the capture",
        ));
    }
    if let RedOp::Dynamic(raw) = a.op {
        if let Scalar::Pointer(p) = a.comm.redops.lock().get(raw)?.scalar {
            let pl = memory::classify(p as *const c_void, a.dtype.size(), "PreMulSum scalar")?;
            if pl.is_device() {
                return Err(Error::usage(
                    "PreMulSum with a scalar in CUDA memory (ncclScalarDevice) is not \
                     supported on hetccl's GPU path yet (docs/gpu.md)",
                ));
            }
        }
    }
    if group::depth() == 0 {
        return enqueue(vec![a]);
    }
    // Staged with the rest of the group when its outermost end runs.
    group::push_device(a);
    Ok(())
}

/// Whether `s` is one of the default stream handles (NULL,
/// `CU_STREAM_LEGACY` = 1, `CU_STREAM_PER_THREAD` = 2).
fn is_default_stream(s: cu::CUstream) -> bool {
    (s as usize) <= 2
}

/// The context that owns `a`'s stream: the stream's own; for a default
/// stream, the calling thread's current context, else the primary context
/// of the buffers' device (device 0 when unknown).
fn context_of(a: &Call) -> Result<cu::CUcontext> {
    let s = a.stream.get() as cu::CUstream;
    if !is_default_stream(s) {
        let mut c: cu::CUcontext = std::ptr::null_mut();
        // SAFETY: the caller's live stream and a writable slot.
        driver::check(unsafe { cu::cuStreamGetCtx(s, &mut c) }, "cuStreamGetCtx")?;
        return Ok(c);
    }
    let c = driver::current_context()?;
    if !c.is_null() {
        return Ok(c);
    }
    driver::primary_context(a.placement.device().unwrap_or(0))
}

/// Switches the calling thread's current context as needed, and restores
/// the one it had when dropped.
struct Contexts {
    entry: cu::CUcontext,
    now: cu::CUcontext,
}

impl Contexts {
    fn new() -> Result<Contexts> {
        let c = driver::current_context()?;
        Ok(Contexts { entry: c, now: c })
    }

    /// Makes `c` current.
    fn switch(&mut self, c: cu::CUcontext) -> Result<()> {
        if c != self.now {
            // SAFETY: a context from the driver that owns a live stream
            // (or a retained primary context).
            unsafe { driver::set_current(c)? };
            self.now = c;
        }
        Ok(())
    }
}

impl Drop for Contexts {
    fn drop(&mut self) {
        if self.now != self.entry {
            // SAFETY: the context that was current on entry (NULL is allowed).
            let _ = unsafe { driver::set_current(self.entry) };
        }
    }
}

/// Loads the reduction kernels, at a safe point before the batch begins,
/// in each call's context that may run one on the GPU (a reduction on
/// device memory, on a single-node communicator with P2P on).
fn prepare_kernels(ops: &[Call], ctxs: &[cu::CUcontext], cx: &mut Contexts) -> Result<()> {
    let mut done: Vec<cu::CUcontext> = Vec::new();
    for (a, &ctx) in ops.iter().zip(ctxs) {
        let Ok(e) = a.comm.engine() else { continue };
        let wanted = a.kind.reduces()
            && matches!(a.placement, memory::Placement::Device(_))
            && e.intranode.is_some()
            && !e.settings.p2p_disable;
        if !wanted || done.contains(&ctx) {
            continue;
        }
        done.push(ctx);
        cx.switch(ctx)?;
        module::prepare(e.settings.nvrtc_lib.as_deref().map(std::path::Path::new));
    }
    Ok(())
}

/// Records each call's "ready" event, makes its stream wait for the
/// batch's flag, and hands the batch to the proxy. Without stream memory
/// operations the calling thread waits for the batch instead.
pub(crate) fn enqueue(ops: Vec<Call>) -> Result<()> {
    if ops.is_empty() {
        return Ok(());
    }
    let mut cx = Contexts::new()?;
    let ctxs = ops.iter().map(context_of).collect::<Result<Vec<_>>>()?;
    prepare_kernels(&ops, &ctxs, &mut cx)?;
    cx.switch(ctxs[0])?;
    let flag = Flag::take()?;
    if flag.is_none() && !NO_FLAG.swap(true, Ordering::Relaxed) {
        tracing::info!(target: "hetccl::COLL", "no free stream flag while batches are in flight: this call returns once done (more flags are allocated when none is in flight)");
    }
    let flag_dev = flag.as_ref().map(Flag::device_ptr);
    let mut pending = Vec::with_capacity(ops.len());
    for (a, ctx) in ops.into_iter().zip(ctxs) {
        cx.switch(ctx)?;
        let ready = Event::new()?;
        ready.record(a.stream.get() as cu::CUstream)?;
        pending.push(PendingOp {
            args: a,
            ctx: ctx as usize,
            ready,
            done: Event::new()?,
            enqueued: crate::telemetry::clock::ticks(),
        });
    }
    safe::begin();
    let mut caller_waits = false;
    let mut tail = || -> Result<()> {
        for p in &pending {
            cx.switch(p.ctx as cu::CUcontext)?;
            let stream = p.args.stream.get() as cu::CUstream;
            caller_waits |= match flag_dev {
                Some(d) => !wait_flag(stream, d)?,
                None => true,
            };
            p.done.record(stream)?;
        }
        Ok(())
    };
    if let Err(e) = tail() {
        // Streams already told to wait must not hang: release them, and
        // leak the flag (a stream may still read it).
        if let Some(f) = flag {
            f.word().store(1, Ordering::Release);
            std::mem::forget(f);
        }
        safe::end(|| ());
        return Err(e);
    }
    drop(cx);
    let released = caller_waits.then(|| Arc::new(Released::default()));
    let limit = wait_limit(&pending[0].args);
    let comm_key = Arc::as_ptr(&pending[0].args.comm) as usize;
    send_to_proxy(
        comm_key,
        Batch {
            ops: pending,
            flag,
            caller_waits: released.clone(),
        },
    );
    match released {
        Some(r) => r.wait(limit),
        None => Ok(()),
    }
}

/// How long a caller's thread waits for its batch: the proxy always ends
/// one within its stall limit, plus slack.
fn wait_limit(a: &Call) -> Duration {
    let stall = a
        .comm
        .engine()
        .map(|e| e.settings.patience.stall_timeout)
        .unwrap_or(Duration::from_secs(300));
    stall * 2 + Duration::from_secs(60)
}

/// Logged once: a batch found no free flag.
static NO_FLAG: AtomicBool = AtomicBool::new(false);

/// Logged once: stream memory operations are unavailable.
static NO_MEMOPS: AtomicBool = AtomicBool::new(false);

/// Makes `stream` wait until the flag is set; `false` when stream memory
/// operations are not supported (the caller's thread must wait instead).
fn wait_flag(stream: cu::CUstream, flag_dev: cu::CUdeviceptr) -> Result<bool> {
    let geq = cu::CUstreamWaitValue_flags::CU_STREAM_WAIT_VALUE_GEQ as u32;
    // SAFETY: a device-mapped flag that outlives the wait.
    let r = unsafe { cu::cuStreamWaitValue32_v2(stream, flag_dev, 1, geq) };
    match r {
        cu::CUresult::CUDA_SUCCESS => Ok(true),
        cu::CUresult::CUDA_ERROR_NOT_SUPPORTED => {
            if !NO_MEMOPS.swap(true, Ordering::Relaxed) {
                tracing::info!(target: "hetccl::INIT", "cuStreamWaitValue32 is not supported: calls on device buffers return once they have run");
            }
            Ok(false)
        }
        r => driver::check(r, "cuStreamWaitValue32").map(|()| true),
    }
}

/// Proxies by communicator.
static PROXIES: Lazy<Mutex<HashMap<usize, Sender<Batch>>>> =
    Lazy::new(|| Mutex::new(HashMap::new()));

fn send_to_proxy(key: usize, batch: Batch) {
    let mut proxies = PROXIES.lock();
    let batch = match proxies.get(&key) {
        Some(tx) => match tx.send(batch) {
            Ok(()) => return,
            Err(mpsc::SendError(b)) => b,
        },
        None => batch,
    };
    let (tx, rx) = mpsc::channel();
    match std::thread::Builder::new()
        .name("hetccl-gpu-proxy".into())
        .spawn(move || proxy(key, rx))
    {
        Ok(_) => {
            let _ = tx.send(batch);
            proxies.insert(key, tx);
        }
        Err(e) => {
            drop(proxies);
            let e = Error::System(format!("spawning the GPU proxy thread: {e}").into());
            tracing::warn!(target: "hetccl::COLL", "device-buffer operation failed: {e}");
            for op in &batch.ops {
                launch::poison(&op.args.comm, &e);
            }
            release(&batch);
            safe::end(|| ());
            // Its streams may still read the flag.
            std::mem::forget(batch);
        }
    }
}

/// Releases the streams and the caller of `b`.
fn release(b: &Batch) {
    if let Some(f) = &b.flag {
        f.word().store(1, Ordering::Release);
    }
    if let Some(r) = &b.caller_waits {
        r.set();
    }
}

/// What a proxy thread keeps between batches.
#[derive(Default)]
struct ProxyState {
    /// The device-collective protocol's state of the proxy's communicator.
    peer: PeerState,
    /// One stream per CUDA context, for the proxy's own copies and kernels.
    streams: HashMap<usize, usize>,
}

impl ProxyState {
    /// The proxy's stream in `ctx` (current on this thread).
    fn stream(&mut self, ctx: cu::CUcontext) -> Result<cu::CUstream> {
        if let Some(&s) = self.streams.get(&(ctx as usize)) {
            return Ok(s as cu::CUstream);
        }
        let mut s: cu::CUstream = std::ptr::null_mut();
        let flags = cu::CUstream_flags::CU_STREAM_NON_BLOCKING as u32;
        driver::check(
            // SAFETY: a writable slot; `ctx` is current.
            unsafe { cu::cuStreamCreate(&mut s, flags) },
            "cuStreamCreate",
        )?;
        self.streams.insert(ctx as usize, s as usize);
        Ok(s)
    }
}

impl Drop for ProxyState {
    fn drop(&mut self) {
        for &s in self.streams.values() {
            // SAFETY: created by `stream`; synchronised after every batch.
            unsafe { cu::cuStreamDestroy_v2(s as cu::CUstream) };
        }
    }
}

/// The proxy loop: one batch at a time, in submission order. Senders hold
/// the [`PROXIES`] lock while sending, so a proxy that finds its queue empty
/// under that lock can leave safely.
fn proxy(key: usize, rx: Receiver<Batch>) {
    let mut retiring: Vec<Batch> = Vec::new();
    let mut state = ProxyState::default();
    loop {
        let b = match rx.recv_timeout(PROXY_IDLE) {
            Ok(b) => b,
            Err(RecvTimeoutError::Timeout) => {
                let mut proxies = PROXIES.lock();
                match rx.try_recv() {
                    Ok(b) => b,
                    Err(_) => {
                        proxies.remove(&key);
                        break;
                    }
                }
            }
            Err(RecvTimeoutError::Disconnected) => break,
        };
        retiring.retain(|old| !finished(old));
        let mut started = Vec::with_capacity(b.ops.len());
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            run_batch(key, &b, &mut state, &mut started)
        }));
        observe(&b, &started);
        let r = r.unwrap_or_else(|_| Err(Error::Internal("panic in the GPU proxy".into())));
        // A failure is recorded before the stream is released, so that work
        // after the call (ncclCommGetAsyncError, the next call) sees it.
        if let Err(e) = r {
            tracing::warn!(target: "hetccl::COLL", "device-buffer operation failed: {e}");
            for op in &b.ops {
                launch::poison(&op.args.comm, &e);
            }
        }
        // Release the stream whatever happened, so it never hangs. The
        // last batch in flight makes a safe point: evicted IPC mappings are
        // closed then.
        release(&b);
        safe::end(|| state.peer.imports.close_evicted());
        retiring.push(b);
    }
    for b in &retiring {
        for op in &b.ops {
            let _ = op.done.wait();
        }
    }
    // The streams are drained: the state's IPC mappings are closed at the
    // next safe point (another communicator's batch may be in flight).
    drop(state);
}

/// Records the batch's calls that started (`started`, in op order) in
/// their communicators' metrics (enqueue-to-start) and, when it is on, on
/// this proxy thread's timeline track: `queued` from the call to the start,
/// `run` from the start to now.
fn observe(b: &Batch, started: &[u64]) {
    use crate::telemetry::{clock, trace};
    let end = clock::ticks();
    for (op, &start) in b.ops.iter().zip(started) {
        let Some(e) = op.args.comm.engine.get() else {
            continue;
        };
        let m = &e.links.metrics;
        m.device_queue_wait
            .record(clock::to_ns(start.saturating_sub(op.enqueued)));
        // A batch may hold another communicator's calls, whose own proxy
        // may count at the same time: an atomic add, not the hot path's
        // single-writer store.
        let seq = m.device_seq.fetch_add(1, Ordering::Relaxed);
        if !trace::on() {
            continue;
        }
        let a = &op.args;
        let id = trace::TraceId {
            comm_hash: e.comm_hash,
            seq,
            p2p: None,
            device: true,
        };
        let op_name = if a.kind.reduces() {
            match a.op {
                hetccl_abi::RedOp::Sum => "sum",
                hetccl_abi::RedOp::Prod => "prod",
                hetccl_abi::RedOp::Max => "max",
                hetccl_abi::RedOp::Min => "min",
                hetccl_abi::RedOp::Avg => "avg",
                hetccl_abi::RedOp::Dynamic(_) => "premulsum",
            }
        } else {
            "none"
        };
        let peer = if a.kind.rooted() || matches!(a.kind, Collective::Send | Collective::Recv) {
            a.root as i32
        } else {
            -1
        };
        for (phase, from, to) in [("queued", op.enqueued, start), ("run", start, end)] {
            trace::record(trace::Event {
                what: trace::What::Device(a.kind, phase),
                start: from,
                end: to,
                id,
                rank: m.rank as u32,
                algo: "",
                dtype: a.dtype.name(),
                op: op_name,
                peer,
                chan: -1,
                bytes: (a.count * a.dtype.size()) as u64,
            });
        }
    }
}

/// Whether every "done" event of `b` has passed (its flag may be reused).
fn finished(b: &Batch) -> bool {
    b.ops.iter().all(|op| {
        // SAFETY: a live event.
        let r = unsafe { cu::cuEventQuery(op.done.0) };
        r != cu::CUresult::CUDA_ERROR_NOT_READY
    })
}

/// Logs the path a call took (`NCCL_DEBUG_SUBSYS=COLL`).
fn log_path(a: &Call, path: &str) {
    tracing::info!(target: "hetccl::COLL", "{} count {} {:?}: {path}", a.kind, a.count, a.dtype);
}

/// Waits for the inputs, then runs the batch. On a communicator whose ranks
/// share this node, a batch of collectives (one call, or a group without
/// sends, receives or other communicators) runs call by call in issue
/// order, each in its stream's context, through CUDA IPC when every rank
/// can ([`peer::try_run`]) or else staged alone; any other batch is staged
/// as one host group on the first call's context (copies reach every
/// device's memory through unified addressing), so that its sends and
/// receives cannot deadlock (its collectives post "no").
fn run_batch(key: usize, b: &Batch, st: &mut ProxyState, started: &mut Vec<u64>) -> Result<()> {
    for op in &b.ops {
        op.ready.wait()?;
        started.push(crate::telemetry::clock::ticks());
    }
    let is_p2p = |a: &Call| matches!(a.kind, Collective::Send | Collective::Recv);
    let ours = |a: &Call| Arc::as_ptr(&a.comm) as usize == key;
    let engine = b.ops[0].args.comm.engine.get();
    if let Some((node, e)) = engine.and_then(|e| e.intranode.as_ref().map(|n| (n, e))) {
        if b.ops.iter().all(|op| ours(&op.args) && !is_p2p(&op.args)) {
            for op in &b.ops {
                let a = &op.args;
                let ctx = op.ctx as cu::CUcontext;
                // SAFETY: the context that owns the call's stream.
                unsafe { driver::set_current(ctx)? };
                let stream = st.stream(ctx)?;
                let ipc = peer::try_run(node, &e.links.watch, &mut st.peer, a, stream);
                if ipc.is_err() {
                    // Peers blocked on this rank fail at once instead of at
                    // their own stall limit.
                    e.links.close_links();
                }
                if ipc? {
                    log_path(a, "CUDA IPC");
                } else {
                    log_path(a, "staged through host memory");
                    stage::run(&[a], &[], stream)?;
                }
            }
            return Ok(());
        }
    }
    // Every device collective of the batch posts "no" on its own
    // communicator's board, so that each keeps its slot sequence in step.
    for op in &b.ops {
        let a = &op.args;
        if let Some(node) = a.comm.engine.get().and_then(|e| e.intranode.as_ref()) {
            if !is_p2p(a) {
                peer::post_no(node, &a.comm);
            }
        }
    }
    let ctx = b.ops[0].ctx as cu::CUcontext;
    // SAFETY: the context that owns the first call's stream.
    unsafe { driver::set_current(ctx)? };
    let stream = st.stream(ctx)?;
    let calls: Vec<&Call> = b.ops.iter().map(|op| &op.args).collect();
    if calls.iter().any(|a| p2p::uses_mailbox(a)) {
        // Sends and receives inside a node (CUDA IPC or staged, decided per
        // message); the rest of the batch stages with the staged ones.
        for a in calls.iter().filter(|a| !p2p::uses_mailbox(a)) {
            log_path(a, "staged through host memory");
        }
        p2p::run(&calls, &mut st.peer, stream)?;
        return Ok(());
    }
    // Sends and receives between nodes over verbs may go in place.
    let chosen: Vec<gdr::InPlace> = calls.iter().map(|a| gdr::choose(a)).collect();
    for (a, ip) in calls.iter().zip(&chosen) {
        let path = if ip.send || ip.recv {
            "in place over GPUDirect RDMA"
        } else {
            "staged through host memory"
        };
        log_path(a, path);
    }
    stage::run(&calls, &chosen, stream)
}
