//! The timeline (`HETCCL_TRACE_FILE`): events go into a bounded ring per
//! thread (`HETCCL_TRACE_MAX_EVENTS`, the oldest dropped first), and the
//! rings are written as Chrome trace-event JSON at finalize, destroy, abort
//! and process exit (`trace_out`).
//!
//! Off, the cost is one relaxed load and a predictable branch ([`on`]).
//! Tracing is process-wide: the first communicator initialised with
//! `HETCCL_TRACE_FILE` set starts it, and its rank names the file (`%r`)
//! and the process track. Clocks are aligned to that communicator's rank 0
//! (offset estimated over the bootstrap at init).

use std::cell::RefCell;
use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use once_cell::sync::OnceCell;
use parking_lot::Mutex;

use crate::algo::Collective;
use crate::reduce::ReduceOp;

/// Whether events are being recorded.
static ON: AtomicBool = AtomicBool::new(false);

/// Whether the timeline is on: check before building an event.
#[inline]
pub fn on() -> bool {
    ON.load(Ordering::Relaxed)
}

/// The identity of a call across ranks: the communicator's hash and a
/// sequence number that is the same on every rank. Collectives count per
/// communicator; point-to-point calls count per (sender, receiver) pair, so
/// that the k-th send from a to b and the k-th receive at b from a share it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TraceId {
    /// The communicator's hash.
    pub comm_hash: u64,
    /// The sequence number.
    pub seq: u64,
    /// (sender, receiver) of a point-to-point call.
    pub p2p: Option<(u32, u32)>,
    /// A device-buffer call (numbered apart from the host calls).
    pub device: bool,
}

impl std::fmt::Display for TraceId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.p2p {
            None if self.device => write!(f, "{:016x}:dev:{}", self.comm_hash, self.seq),
            None => write!(f, "{:016x}:{}", self.comm_hash, self.seq),
            Some((s, r)) => write!(f, "{:016x}:p2p:{s}>{r}:{}", self.comm_hash, self.seq),
        }
    }
}

/// What a slice is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum What {
    /// A collective or point-to-point call.
    Call(Collective),
    /// One step of a call's plan: `send`, `recv`, `recv_reduce`, `copy`,
    /// `reduce`, `pre_op`, `post_op`.
    Step(&'static str),
    /// A device-buffer call on the GPU proxy's track: `queued` (enqueued
    /// on its stream until the stream reached it) or `run` (the proxy's
    /// work on it).
    Device(Collective, &'static str),
}

/// One timeline slice.
#[derive(Debug, Clone, Copy)]
pub struct Event {
    /// What it is.
    pub what: What,
    /// Start and end, in `clock` ticks.
    pub start: u64,
    /// End, in ticks.
    pub end: u64,
    /// The call it belongs to.
    pub id: TraceId,
    /// The rank of the event's communicator.
    pub rank: u32,
    /// The algorithm (calls), or "" (steps).
    pub algo: &'static str,
    /// The datatype name.
    pub dtype: &'static str,
    /// The reduction (`none` for kinds that do not reduce).
    pub op: &'static str,
    /// The peer (steps, point-to-point calls) or root (rooted
    /// collectives); -1 where there is none.
    pub peer: i32,
    /// The link channel of a message step; -1 otherwise.
    pub chan: i32,
    /// Bytes: of the call (count × datatype size), or moved by the step.
    pub bytes: u64,
}

/// One thread's ring.
pub(super) struct Ring {
    /// The OS thread id.
    pub tid: i64,
    /// The thread's name.
    pub name: String,
    /// The events kept, oldest first.
    pub events: VecDeque<Event>,
    /// Events dropped because the ring was full.
    pub dropped: u64,
}

/// The process's tracer.
pub(super) struct Tracer {
    /// The file.
    pub path: PathBuf,
    /// The events kept per thread.
    pub cap: usize,
    /// The rank that names the file and the process track.
    pub rank: usize,
    /// Its communicator's hash.
    pub comm_hash: u64,
    /// Add to this host's Unix time (ns) to get rank 0's.
    pub offset_ns: i64,
    /// Rank 0's Unix time (ns) at the clock probe: timestamps count from it.
    pub origin_ns: u64,
    /// Every thread's ring.
    pub rings: Mutex<Vec<Arc<Mutex<Ring>>>>,
}

static TRACER: OnceCell<Tracer> = OnceCell::new();

thread_local! {
    static RING: RefCell<Option<Arc<Mutex<Ring>>>> = const { RefCell::new(None) };
}

/// How a communicator's clock relates to its rank 0's (from the bootstrap
/// probe, `bootstrap::clock_sync`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ClockSync {
    /// Add to this host's Unix time (ns) to get rank 0's.
    pub offset_ns: i64,
    /// Rank 0's Unix time (ns) at the probe.
    pub origin_ns: u64,
}

/// Starts the timeline (once per process; later calls do nothing) writing
/// to `template` expanded for `rank`.
pub fn start(template: &str, rank: usize, comm_hash: u64, cap: usize, sync: ClockSync) {
    let mut fresh = false;
    TRACER.get_or_init(|| {
        fresh = true;
        Tracer {
            path: super::path::expand(template, rank),
            cap: cap.max(1),
            rank,
            comm_hash,
            offset_ns: sync.offset_ns,
            origin_ns: sync.origin_ns,
            rings: Mutex::new(Vec::new()),
        }
    });
    if fresh {
        ON.store(true, Ordering::Release);
        // SAFETY: `at_exit` is a plain extern "C" function that never
        // unwinds (it catches panics).
        unsafe { libc::atexit(at_exit) };
        tracing::info!(target: "hetccl::INIT",
            "timeline: writing {} (clock offset to rank 0: {} ns)",
            TRACER.get().map_or_else(String::new, |t| t.path.display().to_string()),
            sync.offset_ns);
    }
}

extern "C" fn at_exit() {
    let _ = std::panic::catch_unwind(flush);
}

/// Records one event in this thread's ring.
pub fn record(ev: Event) {
    let Some(t) = TRACER.get() else { return };
    let _ = RING.try_with(|r| {
        let mut slot = r.borrow_mut();
        let ring = slot.get_or_insert_with(|| {
            let ring = Arc::new(Mutex::new(Ring {
                tid: hetccl_core::obs::gettid(),
                name: std::thread::current().name().map_or_else(
                    || format!("thread {}", hetccl_core::obs::gettid()),
                    str::to_string,
                ),
                events: VecDeque::new(),
                dropped: 0,
            }));
            t.rings.lock().push(ring.clone());
            ring
        });
        let mut g = ring.lock();
        if g.events.len() >= t.cap {
            g.events.pop_front();
            g.dropped += 1;
        }
        g.events.push_back(ev);
    });
}

/// Writes the timeline file now (everything the rings hold), replacing
/// the previous one. Does nothing when the timeline is off.
pub fn flush() {
    let Some(t) = TRACER.get() else { return };
    super::clock::calibrate();
    let rings: Vec<Arc<Mutex<Ring>>> = match t.rings.try_lock_for(Duration::from_millis(100)) {
        Some(g) => g.clone(),
        None => return,
    };
    let mut held = Vec::with_capacity(rings.len());
    for r in &rings {
        // A thread stopped while holding its ring (inside `record`) is
        // skipped rather than waited for.
        if let Some(g) = r.try_lock_for(Duration::from_millis(100)) {
            held.push(g);
        }
    }
    let text = super::trace_out::render(t, &held);
    drop(held);
    if let Err(e) = super::path::write_atomic(&t.path, text.as_bytes()) {
        tracing::warn!(target: "hetccl::INIT",
            "timeline: cannot write {}: {e}", t.path.display());
    }
}

/// The name of a reduction in timeline events.
pub fn op_name(kind: Collective, op: &ReduceOp) -> &'static str {
    if !kind.reduces() {
        return "none";
    }
    match op {
        ReduceOp::Sum => "sum",
        ReduceOp::Prod => "prod",
        ReduceOp::Max => "max",
        ReduceOp::Min => "min",
        ReduceOp::Avg => "avg",
        ReduceOp::PreMulSum(_) => "premulsum",
    }
}
