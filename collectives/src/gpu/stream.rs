//! The stream-ordered path for calls on CUDA memory: the user's thread
//! records an event on the user's stream, makes the stream wait for a flag,
//! and returns at once; a proxy thread runs the call and sets the flag.
//!
//! Per call, on the user's stream (in stream order after the user's work):
//! 1. an event ("ready"): the inputs are complete once it has passed;
//! 2. a wait on the batch's flag in pinned, device-mapped memory
//!    (`cuStreamWaitValue32`, or a host function that waits on the flag
//!    where stream memory operations are unavailable);
//! 3. an event ("done"): the stream is past the call.
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
use std::sync::atomic::Ordering;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::time::Duration;

use hetccl_abi::RedOp;
use once_cell::sync::Lazy;
use parking_lot::Mutex;

use super::driver::{self, cu};
use super::memory;
use super::p2p;
use super::peer::{self, PeerState};
use super::pinned::Pinned;
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
    /// Recorded on the user's stream at the call: the inputs are ready.
    ready: Event,
    /// Recorded on the user's stream after its wait: the stream is past it.
    done: Event,
}

/// A batch: the calls of one group (or one call), released by one flag.
struct Batch {
    ctx: cu::CUcontext,
    ops: Vec<PendingOp>,
    flag: Pinned,
}

// SAFETY: the raw pointer is a CUDA context, which the driver lets any
// thread make current; the calls' buffers and streams are `UserPtr`s and
// the flag is the batch's own pinned memory.
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

/// Records each call's "ready" event, makes its stream wait for the
/// batch's flag, and hands the batch to the proxy.
pub(crate) fn enqueue(ops: Vec<Call>) -> Result<()> {
    if ops.is_empty() {
        return Ok(());
    }
    let ctx = driver::ensure_context()?;
    let flag = Pinned::take(0)?;
    let flag_dev = flag.flag_device_ptr()?;
    let mut pending = Vec::with_capacity(ops.len());
    for a in ops {
        let ready = Event::new()?;
        ready.record(a.stream.get() as cu::CUstream)?;
        pending.push(PendingOp {
            args: a,
            ready,
            done: Event::new()?,
        });
    }
    let enqueue_tail = || -> Result<()> {
        for p in &pending {
            let stream = p.args.stream.get() as cu::CUstream;
            wait_flag(stream, flag_dev, &flag)?;
            p.done.record(stream)?;
        }
        Ok(())
    };
    if let Err(e) = enqueue_tail() {
        // Streams already told to wait must not hang: release them, and
        // leak the flag (a stream may still read it).
        flag.flag().store(1, Ordering::Release);
        std::mem::forget(flag);
        return Err(e);
    }
    let comm_key = Arc::as_ptr(&pending[0].args.comm) as usize;
    send_to_proxy(
        comm_key,
        Batch {
            ctx,
            ops: pending,
            flag,
        },
    );
    Ok(())
}

/// Host function fallback: blocks the stream's callback until the flag is set.
unsafe extern "C" fn wait_flag_host(user: *mut c_void) {
    // SAFETY: `user` is the batch flag, kept alive until "done" has passed.
    let flag = unsafe { &*(user as *const std::sync::atomic::AtomicU32) };
    while flag.load(Ordering::Acquire) == 0 {
        std::thread::sleep(Duration::from_micros(20));
    }
}

/// Makes `stream` wait until the flag is set.
fn wait_flag(stream: cu::CUstream, flag_dev: cu::CUdeviceptr, flag: &Pinned) -> Result<()> {
    let geq = cu::CUstreamWaitValue_flags::CU_STREAM_WAIT_VALUE_GEQ as u32;
    // SAFETY: a device-mapped flag that outlives the wait.
    let r = unsafe { cu::cuStreamWaitValue32_v2(stream, flag_dev, 1, geq) };
    if r == cu::CUresult::CUDA_SUCCESS {
        return Ok(());
    }
    tracing::debug!(target: "hetccl::INIT", "cuStreamWaitValue32 unavailable ({}); using a host function", driver::name(r));
    let user = flag.flag() as *const _ as *mut c_void;
    // SAFETY: as above; the function only reads the flag.
    driver::check(
        unsafe { cu::cuLaunchHostFunc(stream, Some(wait_flag_host), user) },
        "cuLaunchHostFunc",
    )
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
    let _ = tx.send(batch);
    proxies.insert(key, tx);
    std::thread::Builder::new()
        .name("hetccl-gpu-proxy".into())
        .spawn(move || proxy(key, rx))
        .expect("spawning the GPU proxy thread");
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
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            run_batch(key, &b, &mut state)
        }));
        let r = r.unwrap_or_else(|_| Err(Error::Internal("panic in the GPU proxy".into())));
        // A failure is recorded before the stream is released, so that work
        // after the call (ncclCommGetAsyncError, the next call) sees it.
        if let Err(e) = r {
            tracing::warn!(target: "hetccl::COLL", "device-buffer operation failed: {e}");
            for op in &b.ops {
                launch::poison(&op.args.comm, &e);
            }
        }
        // Release the stream whatever happened, so it never hangs.
        b.flag.flag().store(1, Ordering::Release);
        retiring.push(b);
    }
    for b in &retiring {
        // SAFETY: the context of the user's calls, alive while they run.
        let _ = unsafe { driver::set_current(b.ctx) };
        for op in &b.ops {
            let _ = op.done.wait();
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
/// order, each through CUDA IPC when every rank can ([`peer::try_run`]) or
/// else staged alone; any other batch is staged as one host group, so that
/// its sends and receives cannot deadlock (its collectives post "no").
fn run_batch(key: usize, b: &Batch, st: &mut ProxyState) -> Result<()> {
    // SAFETY: as above.
    unsafe { driver::set_current(b.ctx)? };
    let stream = st.stream(b.ctx)?;
    for op in &b.ops {
        op.ready.wait()?;
    }
    let engine = b.ops[0].args.comm.engine.get();
    if let Some((node, e)) = engine.and_then(|e| e.intranode.as_ref().map(|n| (n, e))) {
        let is_p2p = |a: &Call| matches!(a.kind, Collective::Send | Collective::Recv);
        let ours = |a: &Call| Arc::as_ptr(&a.comm) as usize == key;
        if b.ops.iter().all(|op| ours(&op.args) && !is_p2p(&op.args)) {
            for op in &b.ops {
                let a = &op.args;
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
                    stage::run(&[a], stream)?;
                }
            }
            return Ok(());
        }
        for op in &b.ops {
            if ours(&op.args) && !is_p2p(&op.args) {
                peer::post_no(node, &op.args.comm);
            }
        }
    }
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
    for op in &b.ops {
        log_path(&op.args, "staged through host memory");
    }
    stage::run(&calls, stream)
}
