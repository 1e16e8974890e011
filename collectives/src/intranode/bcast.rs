//! Small broadcasts through a per-root ring: the root posts and returns,
//! receivers copy out and report how far they have read.
//!
//! Broadcasts are numbered by their own counter (`Node::bc_seq`, the same
//! on every rank of a well-formed program), apart from the full-exchange
//! operations of [`super::fastbox`]. Broadcast `b` of root `r`:
//!
//! 1. Every rank publishes its call's shape and raises its broadcast mark
//!    to `b` (its broadcast line).
//! 2. The root also records `b` and the shape in its call entry `b mod K`
//!    (`SeqCst`) and checks the entries its peers recorded for `b`; it
//!    waits until every rank finished broadcast `b - K` (the ring is full
//!    only when the slowest receiver is `K` broadcasts behind), posts the
//!    data with the shape into ring slot `b mod K`, marks `b` finished,
//!    and returns.
//! 3. A receiver waits for the root's slot to hold `b`, checks the root's
//!    shape against its own, copies the data out, and marks `b` finished.
//!
//! `K` is the depth of the ring the broadcast's size selects
//! ([`Ring::for_bytes`]): 32 slots of 16 KiB, or 2048 one-line slots for
//! broadcasts of up to 32 B, so that a root of many tiny broadcasts runs up
//! to 2048 calls ahead. A slot of either ring is reused only by broadcast
//! `b + K` of its own ring, so the argument below holds for each.
//!
//! Nothing here waits in the common case but a receiver for its data: the
//! root reads the receivers' finished marks only when the ring may be
//! full, and a receiver reads the root's call entry only while it waits.
//!
//! Safety argument:
//! - Ring slots: the root rewrites slot `b mod K` only after every rank's
//!   finished mark reached `b - K`; ranks run broadcasts in order and
//!   publish a finished mark (`Release`) after their last read of a slot,
//!   and the root reads those marks with `Acquire` before it writes. So no
//!   slot is written while read. A receiver reads only after seeing `b` in
//!   the slot's sequence word (`Acquire`, stored with `Release` after the
//!   data), and never more than the byte count posted with it.
//! - Full-exchange slots: broadcasts never touch them nor their counter,
//!   so the two-slot argument of [`super::board`] holds unchanged between
//!   any two full-exchange operations. A broadcast followed by an
//!   AllReduce is ordered by program order on each rank: every rank
//!   finishes (root: posts) the broadcast before it posts the AllReduce,
//!   and the two use disjoint memory.
//! - Progress: consider the earliest operation some rank has not finished.
//!   Every rank has posted everything before it; if it is a broadcast, its
//!   root can wait only for broadcast `b - K`, finished already. So one of
//!   the waits always ends, and the others end at the stall limit, on
//!   abort, or when a peer closes its links (as every failing call does).
//! - Mismatches: a receiver compares the root's posted shape with its own
//!   before reading, so a different count, datatype or kind fails with
//!   `ncclInvalidUsage` instead of reading past what was posted. While it
//!   waits, a receiver that finds the root's mark at `b` looks at the
//!   root's call entry: another shape, or none (the root takes itself for
//!   a receiver), fails the call. Two ranks that both take themselves for
//!   the root each record their entry (`SeqCst`) before reading the
//!   other's, so at least one of them sees the other and fails. A root
//!   has nobody to wait for, so a mismatch it did not see goes unreported
//!   on it; its peers fail and close their links, and the root's next
//!   waiting call fails.
//! - Other paths: a peer that ran a full-exchange or single-copy operation
//!   in place of broadcast `b` is seen the way [`super::fastbox`] sees a
//!   peer on single copy: its post (or stage) is past what this rank ran,
//!   checked before and after the slot itself. Those paths see a peer in
//!   the ring through its broadcast mark ([`Node::peer_in_bcast`]).

use std::cell::Cell;
use std::sync::atomic::Ordering;

use super::board::Ring;
use super::shape::{self, Shape};
use super::wait::Op;
use super::Node;
use crate::error::{Error, Result};
use crate::exec::watch::Watch;
use crate::launch::Call;

/// Checks of a waiting receiver that read only the root's slot, before it
/// also looks for mismatches.
const QUIET_SPINS: u32 = 64;

/// Why a receiver stopped waiting before the root posted.
#[derive(Clone, Copy)]
enum Seen {
    /// The root recorded another call for this broadcast, or took itself
    /// for a receiver (its call then).
    OtherCall(usize, [u64; 2]),
    /// The root ran another kind of operation in place of it.
    OtherPath,
}

/// Runs one small broadcast (`fastbox::fits` returned true).
pub fn run(node: &Node, a: &Call, trace: u64, watch: &Watch) -> Result<()> {
    let me = node.me;
    let root = a.root;
    let bytes = a.count * a.dtype.size();
    let shape = Shape::of(a).encode();
    // Only the thread holding the communicator's exec lock counts.
    let b = node.bc_seq.load(Ordering::Relaxed) + 1;
    node.bc_seq.store(b, Ordering::Relaxed);
    let mine = &node.boards[me];
    if root == me {
        // First: its fence then drains no stores to lines peers read.
        mine.record_call(b, shape);
    }
    for (w, v) in mine.bcast_shape().iter().zip(shape) {
        w.store(v, Ordering::Relaxed);
    }
    mine.bcast_mark().store(b, Ordering::Release);
    let what = || {
        format!(
            "Broadcast seq {trace} trace {:016x}-{trace} ({bytes} B, broadcast ring)",
            node.comm_hash
        )
    };
    let wop = Op {
        label: &what,
        watch,
        seq: trace,
    };
    if root == me {
        post_as_root(node, a, b, shape, &wop)?;
        if !std::ptr::eq(
            a.send.get().cast::<u8>(),
            a.recv.get().cast::<u8>().cast_const(),
        ) {
            // SAFETY: validated: `send` and `recv` hold `bytes` bytes each;
            // NCCL's in-place broadcast passes equal pointers (handled above),
            // other overlaps are the caller's error as in NCCL.
            unsafe {
                std::ptr::copy(a.send.get().cast::<u8>(), a.recv.get().cast::<u8>(), bytes);
            }
        }
        return Ok(());
    }
    receive(node, a, b, shape, &wop)
}

/// The root's side of broadcast `b`.
fn post_as_root(node: &Node, a: &Call, b: u64, shape: [u64; 2], wop: &Op<'_>) -> Result<()> {
    let (n, me) = (node.nranks(), node.me);
    if let Some((k, theirs)) = node.other_call(b, shape) {
        return Err(shape::disagree("broadcast ring", k, theirs, me, shape));
    }
    let bytes = a.count * a.dtype.size();
    let ring = Ring::for_bytes(bytes);
    let need = b.saturating_sub(ring.depth());
    if need > node.bc_room.load(Ordering::Relaxed) {
        let done = |k: usize| node.boards[k].bcast_done().load(Ordering::Acquire);
        node.wait(wop, || (0..n).find(|&k| k != me && done(k) < need))?;
        let room = (0..n).filter(|&k| k != me).map(done).min().unwrap_or(b);
        node.bc_room.store(room, Ordering::Relaxed);
    }
    // SAFETY: validated: `send` holds `send_bytes` >= `bytes` bytes.
    let input = unsafe { std::slice::from_raw_parts(a.send.get().cast::<u8>(), bytes) };
    // SAFETY: this rank owns its board; every rank finished broadcast
    // b - K (waited above), the last one that could use this slot; `ring`
    // was chosen to fit `bytes`.
    unsafe { node.boards[me].ring_post(b, ring, shape, input) };
    node.boards[me].bcast_done().store(b, Ordering::Release);
    node.wake_peers();
    Ok(())
}

/// A receiver's side of broadcast `b`.
fn receive(node: &Node, a: &Call, b: u64, shape: [u64; 2], wop: &Op<'_>) -> Result<()> {
    let me = node.me;
    let root = a.root;
    let rb = &node.boards[root];
    let bytes = a.count * a.dtype.size();
    // The root of a matching call posts in the same ring; one that posted
    // another size in the other ring is caught through its call entry.
    let ring = Ring::for_bytes(bytes);
    // A mismatch this rank can see while the root has not posted `b`.
    let mismatch = || {
        if rb.bcast_mark().load(Ordering::Acquire) >= b && !rb.ring_posted(b, ring) {
            // The root is in `b` (or past it without posting: not its
            // root): its call entry says which.
            let theirs = rb.call(b);
            if theirs != Some(shape) {
                let w = theirs.unwrap_or_else(|| Shape::load(rb.bcast_shape()));
                return Some(Seen::OtherCall(root, w));
            }
            // The root waits for room, or failed on another root it saw.
            if let Some((k, w)) = node.other_call(b, shape) {
                return Some(Seen::OtherCall(k, w));
            }
        }
        // Checked in this order: a root posts `b` before it can run a
        // later operation.
        ((node.peer_in_fast_slots(root) || node.peer_in_copy(root)) && !rb.ring_posted(b, ring))
            .then_some(Seen::OtherPath)
    };
    let seen = Cell::new(None);
    let calls = Cell::new(0u32);
    let waited = node.wait(wop, || {
        if rb.ring_posted(b, ring) {
            return None;
        }
        // The first spins read only the slot: the lines `mismatch` reads
        // are ones the root writes in every broadcast.
        calls.set(calls.get().saturating_add(1));
        if calls.get() <= QUIET_SPINS {
            return Some(root);
        }
        seen.set(mismatch());
        seen.get().is_none().then_some(root)
    });
    if let Err(e) = waited {
        // A rank that saw the mismatch first fails and closes its links,
        // which can end this wait before this rank looked: name the
        // mismatch if there is one.
        match mismatch() {
            Some(x) => seen.set(Some(x)),
            None => return Err(e),
        }
    }
    match seen.get() {
        Some(Seen::OtherCall(k, theirs)) => {
            return Err(shape::disagree("broadcast ring", k, theirs, me, shape))
        }
        Some(Seen::OtherPath) => {
            let (path, theirs) = if node.peer_in_fast_slots(root) {
                let s = node.fast_seq.load(Ordering::Relaxed) + 1;
                ("broadcast ring against board slots", rb.posted_shape(s).0)
            } else {
                (
                    "broadcast ring against single copy",
                    Shape::load(&rb.extents().shape),
                )
            };
            return Err(shape::disagree(path, root, theirs, me, shape));
        }
        None => {}
    }
    let (theirs, posted) = rb.ring_shape(b, ring);
    if theirs != shape {
        return Err(shape::disagree("broadcast ring", root, theirs, me, shape));
    }
    // SAFETY: the root posted `b` and cannot rewrite the slot before this
    // rank marks `b` finished (below); at most what was posted is read.
    let Some(data) = (unsafe { rb.ring_data(b, ring, bytes) }) else {
        return Err(Error::Internal(
            format!("broadcast ring: rank {root} posted {posted} B, fewer than the {bytes} B read")
                .into(),
        ));
    };
    // SAFETY: validated: `recv` holds `recv_bytes` >= `bytes` writable
    // bytes, distinct from the ring.
    unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), a.recv.get().cast::<u8>(), bytes) };
    node.boards[me].bcast_done().store(b, Ordering::Release);
    node.wake_peers();
    Ok(())
}

impl Node {
    /// A peer that recorded another call than `shape` for broadcast `b`
    /// (while its entry still holds `b`), and that call.
    fn other_call(&self, b: u64, shape: [u64; 2]) -> Option<(usize, [u64; 2])> {
        (0..self.nranks())
            .filter(|&k| k != self.me)
            .find_map(|k| Some((k, self.boards[k].call(b)?)).filter(|&(_, w)| w != shape))
    }

    /// Whether local rank `k` has entered a broadcast this rank has not
    /// started (its mark is past this rank's broadcasts). A rank in another
    /// small or single-copy operation that sees this of a peer that has not
    /// posted that operation (checked after this) knows the peer ran a
    /// broadcast in its place.
    pub(super) fn peer_in_bcast(&self, k: usize) -> bool {
        self.boards[k].bcast_mark().load(Ordering::Acquire) > self.bc_seq.load(Ordering::Relaxed)
    }

    /// The shape of the broadcast local rank `k` entered in place of
    /// this rank's next operation, if it did.
    pub(super) fn next_bcast_call(&self, k: usize) -> Option<[u64; 2]> {
        self.peer_in_bcast(k)
            .then(|| Shape::load(self.boards[k].bcast_shape()))
    }
}
