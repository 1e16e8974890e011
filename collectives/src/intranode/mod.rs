//! Direct collectives for communicators whose ranks all share one node: each
//! rank reads the other ranks' data where it lies, instead of streaming it
//! through the pipelined rings of the executor.
//!
//! - [`fastbox`]: small operations. Every rank copies its input into its
//!   board slot in the node arena, publishes a sequence number, waits for
//!   everybody's, and computes its output from the slots. One cache line
//!   per rank for an 8-byte allreduce, and no plan, batch or link.
//! - [`bcast`]: small broadcasts. The root posts into a ring of slots on
//!   its board and returns; receivers copy out and report how far they
//!   have read, and the root waits only when its ring is full.
//! - [`copy`]: large operations with one kernel copy
//!   (`process_vm_readv`, "CMA"), or none for buffers a rank can map: ranks
//!   publish their buffer addresses on their board's control line, and the
//!   operation's work items (`work`), claimed by whichever ranks run,
//!   read each other's buffers directly.
//!
//! Both run on the calling thread, outside groups, on blocking
//! communicators, and count as the `Direct` algorithm for `NCCL_ALGO`.
//! [`try_run`] decides from the call's size, so ranks that passed the same
//! call take the same path. Every rank publishes its call's shape and
//! buffer extents, and no rank touches a peer's memory before every rank
//! has checked that all passed the same call: a mismatched call fails with
//! `ncclInvalidUsage` on every rank, also when the ranks' sizes sent them
//! to different direct paths.

pub mod bcast;
pub mod board;
pub mod copy;
mod elect;
pub mod fastbox;
mod ntcopy;
mod peer_map;
pub mod region;
pub(crate) mod shape;
mod wait;
mod work;

pub(crate) use wait::Op as WaitOp;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use self::board::{Board, PROBE_VALUE};
use crate::algo::{AlgoFilter, Algorithm, Collective};
use crate::error::Result;
use crate::exec::Patience;
use crate::launch::Call;
use crate::reduce::ReduceOp;
use crate::transport::arena::Arena;
use crate::transport::doorbell::Doorbell;

/// The word whose address every rank publishes, so that peers can check
/// that they may read this process's memory.
static PROBE: AtomicU64 = AtomicU64::new(PROBE_VALUE);

/// A communicator's view of its node's boards (only for communicators whose
/// ranks are all on this node and joined by shm links).
#[derive(Debug)]
pub struct Node {
    arena: Arc<Arena>,
    /// This rank's index among the node's ranks (its rank: all are local).
    me: usize,
    boards: Vec<Board>,
    bells: Vec<Doorbell>,
    bell: Doorbell,
    stop: Arc<crate::exec::stop::Stop>,
    spin: Duration,
    hang_report: Option<Duration>,
    stall_timeout: Duration,
    /// Full-exchange small operations run so far (the slot sequence;
    /// starts at 1).
    fast_seq: AtomicU64,
    /// Small broadcasts run so far (the broadcast ring's sequence; starts
    /// at 1).
    bc_seq: AtomicU64,
    /// The lowest broadcast every peer had finished when this rank last
    /// looked (a root reads the peers' marks again only when its ring may
    /// be full).
    bc_room: AtomicU64,
    /// Single-copy operations run so far.
    copy_seq: AtomicU64,
    /// Per local rank: its home work items of all single-copy operations
    /// run so far (where its claim counter starts in the next one).
    claim_base: Box<[AtomicU64]>,
    /// Work items of all single-copy operations run so far (the sum of the
    /// done counters when they are all finished).
    done_base: AtomicU64,
    /// `HETCCL_COPY_MIN_BYTES`.
    copy_min: usize,
    /// Where AllGather and ReduceScatter take single copy in place of the
    /// board slots (bytes of the larger buffer; 0: only past the slots).
    gather_copy_min: usize,
    /// How many local ranks run single-copy work items, one per CPU the
    /// ranks were seen on (see `elect`); the others only help when the
    /// workers stall (`HETCCL_COPY_WORKERS`).
    workers: usize,
    /// Single-copy availability: 0 unknown, 1 yes, 2 no (decided by the
    /// first large operation, the same way on every rank).
    copy_state: std::sync::atomic::AtomicU8,
    comm_hash: u64,
    /// The communicator in hang reports.
    label: String,
    /// Peers' `ncclMemAlloc` buffers mapped into this process.
    peer_maps: peer_map::PeerMaps,
    /// This process's id (`getpid` is a system call in glibc).
    pid: u32,
}

/// The collectives this module serves.
const KINDS: [Collective; 5] = [
    Collective::AllReduce,
    Collective::Broadcast,
    Collective::Reduce,
    Collective::AllGather,
    Collective::ReduceScatter,
];

fn kind_index(k: Collective) -> Option<usize> {
    KINDS.iter().position(|&x| x == k)
}

/// What the direct paths take from the communicator's settings.
#[derive(Debug, Clone)]
pub struct Options {
    /// Spin, hang report and stall limit of the board waits.
    pub patience: Patience,
    /// Where the single-copy path starts (bytes of the largest buffer; 0:
    /// off).
    pub copy_min: usize,
    /// Ranks that run single-copy work items.
    pub workers: usize,
    /// Whether every local rank has a CPU of its own (the node is not
    /// oversubscribed).
    pub own_cpus: bool,
    /// The communicator's hash (logs).
    pub comm_hash: u64,
    /// The communicator in hang reports (hash and `commName`).
    pub label: String,
}

impl Node {
    /// Sets up this rank's board. Every rank of the communicator must be a
    /// local rank of `arena`, in rank order. Call before the last init
    /// barrier, so that peers see the control line once init completes.
    pub fn new(
        arena: Arc<Arena>,
        me: usize,
        stop: Arc<crate::exec::stop::Stop>,
        o: Options,
    ) -> Self {
        let Options {
            patience,
            copy_min,
            workers,
            own_cpus,
            comm_hash,
            label,
        } = o;
        let n = arena.nlocal();
        // SAFETY: boards of a live arena, kept alive by the Arc we hold.
        let boards: Vec<Board> = (0..n)
            .map(|i| unsafe { Board::at(arena.board(i)) })
            .collect();
        let bells: Vec<Doorbell> = (0..n).map(|i| arena.bell(i)).collect();
        let pid = std::process::id();
        let ctl = boards[me].control();
        ctl.pid.store(u64::from(pid), Ordering::Relaxed);
        ctl.probe_addr
            .store(PROBE.as_ptr() as u64, Ordering::Relaxed);
        ctl.stage.store(0, Ordering::SeqCst);
        Self {
            bell: bells[me],
            arena,
            me,
            boards,
            bells,
            stop,
            spin: patience.spin,
            hang_report: patience.hang_report,
            stall_timeout: patience.stall_timeout,
            fast_seq: AtomicU64::new(0),
            bc_seq: AtomicU64::new(0),
            bc_room: AtomicU64::new(0),
            copy_min,
            // Single copy moves each byte once where the slots move it
            // twice; it pays from half of HETCCL_COPY_MIN_BYTES when
            // every rank runs on its own CPU (measured: docs/benchmarks.md).
            gather_copy_min: if own_cpus { copy_min / 2 } else { 0 },
            copy_seq: AtomicU64::new(0),
            claim_base: (0..n).map(|_| AtomicU64::new(0)).collect(),
            done_base: AtomicU64::new(0),
            workers: workers.clamp(1, n.max(1)),
            copy_state: std::sync::atomic::AtomicU8::new(0),
            comm_hash,
            label,
            peer_maps: Default::default(),
            pid,
        }
    }

    /// Operations this rank ran through the board slots (the broadcast
    /// ring included).
    pub fn fast_ops(&self) -> u64 {
        self.fast_seq.load(Ordering::Relaxed) + self.bc_seq.load(Ordering::Relaxed)
    }

    /// Broadcasts this rank ran through the broadcast ring.
    pub fn ring_ops(&self) -> u64 {
        self.bc_seq.load(Ordering::Relaxed)
    }

    /// Operations this rank ran through the single-copy path.
    pub fn copy_ops(&self) -> u64 {
        self.copy_seq.load(Ordering::Relaxed)
    }

    /// The number of ranks.
    pub fn nranks(&self) -> usize {
        self.boards.len()
    }

    /// Local rank `k`'s board.
    pub(crate) fn board(&self, k: usize) -> &Board {
        &self.boards[k]
    }

    /// This rank's index among the node's ranks (its rank).
    pub(crate) fn me(&self) -> usize {
        self.me
    }

    /// The node arena.
    pub(crate) fn arena(&self) -> &Arena {
        &self.arena
    }

    /// The direct paths' rows for the selection table (they take precedence
    /// over the table above for blocking calls outside groups), for the
    /// communicator's algorithm `filter`.
    pub fn describe(&self, filter: &AlgoFilter) -> String {
        let names = |f: &dyn Fn(Collective) -> bool| {
            KINDS
                .iter()
                .filter(|&&k| filter.allows(k, Algorithm::Direct) && f(k))
                .map(|k| k.name())
                .collect::<Vec<_>>()
                .join(",")
        };
        let copy = match self.copy_state.load(Ordering::Relaxed) {
            1 => "available",
            2 => "unavailable (process_vm_readv refused)",
            _ => "not probed yet",
        };
        format!(
            "# direct paths (all {} ranks on this node; blocking calls outside groups):\n\
             #   board slots, up to {} B posted per rank: {}\n\
             #   single-copy from {} B (HETCCL_COPY_MIN_BYTES; AllGather, ReduceScatter from {} B), {copy}, work items run by {} of {} ranks: {}\n",
            self.nranks(),
            board::FAST_BYTES,
            names(&|_| true),
            self.copy_min,
            self.gather_copy_min,
            self.workers,
            self.nranks(),
            names(&copy::serves),
        )
    }

    /// The communicator rank of local rank `k` (the same: all are local).
    fn rank_of(&self, k: usize) -> usize {
        k
    }
}

/// Which direct path a call takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Path {
    Fast,
    Copy,
}

/// The direct path of a `kind` call of `count` elements of `elem` bytes on
/// `n` ranks: the board slots when it fits them, single copy from
/// `copy_min` bytes of its larger buffer; AllGather and ReduceScatter take
/// single copy already from `gather_copy_min` (0: never earlier).
fn path_for(
    kind: Collective,
    count: usize,
    elem: usize,
    n: usize,
    copy_min: usize,
    gather_copy_min: usize,
) -> Option<Path> {
    let bytes = count.checked_mul(elem)?;
    let total = match kind {
        Collective::AllGather | Collective::ReduceScatter => bytes.checked_mul(n)?,
        _ => bytes,
    };
    let gathers = matches!(kind, Collective::AllGather | Collective::ReduceScatter);
    if gathers && gather_copy_min > 0 && total >= gather_copy_min && copy::serves(kind) {
        return Some(Path::Copy);
    }
    if fastbox::fits(kind, bytes, n) {
        return Some(Path::Fast);
    }
    (copy_min > 0 && total >= copy_min && copy::serves(kind)).then_some(Path::Copy)
}

/// Runs `a` on a direct path if one applies (blocking communicator, host
/// memory, all ranks on this node, outside a group, allowed by
/// `NCCL_ALGO` or the communicator's `algo` options); `None` when the
/// pipelined executor must run it.
///
/// `called` is when the call was made (`telemetry::clock` ticks), for the
/// metrics and the timeline.
pub fn try_run(a: &Call, called: u64, op: impl FnOnce() -> Result<ReduceOp>) -> Option<Result<()>> {
    let e = a.comm.engine.get()?;
    let node = e.intranode.as_ref()?;
    let allowed = match &a.filter {
        // The call's own algSelection replaces NCCL_ALGO.
        Some(f) => kind_index(a.kind).is_some() && f.allows(a.kind, Algorithm::Direct),
        // The communicator's filter: NCCL_ALGO, or the `algo` options set
        // since (crate::control).
        None => {
            kind_index(a.kind)?;
            e.control.allows_direct(a.kind)
        }
    };
    if !e.config.blocking || !allowed {
        return None;
    }
    let mut path = path_for(
        a.kind,
        a.count,
        a.dtype.size(),
        node.nranks(),
        node.copy_min,
        node.gather_copy_min,
    )?;
    let watch = &e.links.watch;
    if path == Path::Copy {
        let shape = shape::Shape::of(a).encode();
        match node.copy_usable(watch, e.seq.load(Ordering::Relaxed), shape) {
            Ok(true) => {}
            // Every rank decides availability alike, so all fall back alike.
            Ok(false) if fastbox::fits(a.kind, a.count * a.dtype.size(), node.nranks()) => {
                path = Path::Fast;
            }
            Ok(false) => return None,
            Err(err) => {
                // A stalled peer: peers blocked on this rank fail at once.
                // A mismatch: every rank detects it itself, so the links stay
                // up and each reports ncclInvalidUsage.
                if !matches!(err, crate::error::Error::InvalidUsage(_)) {
                    e.links.close_links();
                }
                return Some(Err(err));
            }
        }
    }
    let op = if a.kind.reduces() {
        match op() {
            Ok(op) => op,
            Err(err) => return Some(Err(err)),
        }
    } else {
        ReduceOp::Sum
    };
    let op_name = crate::telemetry::trace::op_name(a.kind, &op);
    let _running = match crate::launch::enter_exec(e, e.settings.patience) {
        Ok(r) => r,
        Err(err) => return Some(Err(err)),
    };
    let seq = e.seq.fetch_add(1, Ordering::Relaxed);
    let trace_seq = if crate::telemetry::trace::on() {
        e.links.metrics.next_coll_seq()
    } else {
        0
    };
    watch.begin_op(seq, a.kind);
    let r = match path {
        Path::Fast if a.kind == Collective::Broadcast => bcast::run(node, a, seq, watch),
        Path::Fast => fastbox::run(node, a, op, seq, watch),
        Path::Copy => copy::run(node, a, op, seq, watch),
    };
    watch.end();
    if r.is_ok() {
        observe(e, a, path, op_name, trace_seq, called);
    }
    if r.is_err() {
        // Peers blocked on this rank fail at once instead of at their own
        // stall limit (the communicator is unusable now anyway). Peers
        // that already have this rank's word for their wait still finish
        // it (see `wait.rs`), so a call the ranks disagree on is reported
        // as that on every rank.
        e.links.close_links();
    }
    Some(r)
}

/// Records a completed direct-path call in the metrics and, when it is
/// on, the timeline. `called` is 0 when its latency is not measured.
fn observe(
    e: &crate::comm::engine::Engine,
    a: &Call,
    path: Path,
    op: &'static str,
    seq: u64,
    called: u64,
) {
    use crate::telemetry::{metrics, trace};
    let m = &e.links.metrics;
    let (algo, name) = match path {
        Path::Fast => (metrics::ALGO_BOARD, "Board"),
        Path::Copy => (metrics::ALGO_COPY, "SingleCopy"),
    };
    let bytes = a.count * a.dtype.size();
    let end = m.complete(a.kind, bytes, algo, called);
    if called != 0 && trace::on() {
        let rooted = matches!(a.kind, Collective::Broadcast | Collective::Reduce);
        trace::record(trace::Event {
            what: trace::What::Call(a.kind),
            start: called,
            end,
            id: trace::TraceId {
                comm_hash: e.comm_hash,
                seq,
                p2p: None,
                device: false,
            },
            rank: a.comm.rank as u32,
            algo: name,
            dtype: a.dtype.name(),
            op,
            peer: if rooted { a.root as i32 } else { -1 },
            chan: -1,
            bytes: bytes as u64,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_by_size() {
        const MIN: usize = 256 << 10;
        assert_eq!(
            path_for(Collective::AllReduce, 2, 4, 2, MIN, MIN / 4),
            Some(Path::Fast)
        );
        assert_eq!(
            path_for(
                Collective::AllReduce,
                board::FAST_BYTES / 4,
                4,
                2,
                MIN,
                MIN / 4
            ),
            Some(Path::Fast)
        );
        assert_eq!(
            path_for(
                Collective::ReduceScatter,
                board::FAST_BYTES / 4,
                4,
                2,
                MIN,
                0
            ),
            None,
            "the whole input must fit a slot"
        );
        assert_eq!(
            path_for(Collective::AllReduce, MIN, 1, 2, MIN, MIN / 4),
            Some(Path::Copy)
        );
        assert_eq!(
            path_for(Collective::AllReduce, MIN, 1, 2, 0, 0),
            None,
            "0 turns it off"
        );
        assert_eq!(path_for(Collective::AlltoAll, 1, 4, 2, MIN, MIN / 4), None);
        assert_eq!(
            path_for(Collective::AllReduce, usize::MAX, 8, 2, MIN, MIN / 4),
            None
        );
        // AllGather and ReduceScatter: single copy from `q` in all, when on.
        let q = 16 << 10;
        // Counts of 4-byte elements per rank on 2 ranks for a total of t.
        let count = |t: usize| t / 8;
        for k in [Collective::AllGather, Collective::ReduceScatter] {
            assert_eq!(
                path_for(k, count(q), 4, 2, MIN, q),
                Some(Path::Copy),
                "{k:?}"
            );
            assert_eq!(
                path_for(k, count(q / 2), 4, 2, MIN, q),
                Some(Path::Fast),
                "{k:?}"
            );
            assert_eq!(
                path_for(k, count(q), 4, 2, MIN, 0),
                Some(Path::Fast),
                "{k:?}: off"
            );
        }
        assert_eq!(
            path_for(Collective::AllReduce, q / 4, 4, 2, MIN, q),
            Some(Path::Fast)
        );
    }
}
