//! Small collectives through the board slots: post, wait for every rank's
//! post, compute the output from the slots. Broadcasts take their own ring
//! instead (see [`super::bcast`]).
//!
//! Every rank posts and waits in every operation, even a reduce's
//! non-roots: that full exchange is what makes the two alternating slots
//! safe (see [`super::board`]). Every rank folds the
//! inputs in rank order, so all ranks compute bit-identical results.
//!
//! Each post carries the call's shape and the bytes posted. Once every rank
//! has posted, every rank compares all shapes before it reads a slot, so a
//! mismatched call fails with `ncclInvalidUsage` on every rank, and no slot
//! is read beyond what its owner posted. A peer that took the single-copy
//! path for the same operation (a larger call) never posts; the wait sees
//! it in a single-copy operation (or a broadcast) this rank has not
//! started and fails the same way (see [`Node::peer_in_copy`]).

use std::cell::{Cell, RefCell};
use std::sync::atomic::Ordering;

use super::board::FAST_BYTES;
use super::shape::{self, Shape};
use super::wait::Op;
use super::Node;
use crate::algo::Collective;
use crate::error::{Error, Result};
use crate::exec::watch::Watch;
use crate::launch::Call;
use crate::reduce::{self, ReduceError, ReduceOp};

/// Whether a `kind` call of `bytes` per rank (NCCL's count times the element
/// size) fits the slots on `n` ranks.
pub fn fits(kind: Collective, bytes: usize, n: usize) -> bool {
    let posted = match kind {
        Collective::AllReduce
        | Collective::Reduce
        | Collective::AllGather
        | Collective::Broadcast => Some(bytes),
        Collective::ReduceScatter => bytes.checked_mul(n),
        _ => None,
    };
    bytes > 0 && matches!(posted, Some(p) if p <= FAST_BYTES)
}

thread_local! {
    /// Scratch for pre-multiplied inputs (Avg on floats, PreMulSum).
    static TMP: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

fn kernel(e: ReduceError) -> Error {
    Error::Internal(format!("reduction kernel: {e}").into())
}

/// `out = op(inputs...)` folded in rank order, then the op's post-operation
/// (the pre-operation, whose scalar may differ per rank, was applied by each
/// input's owner before it posted).
fn fold(out: &mut [u8], inputs: &[&[u8]], a: &Call, op: ReduceOp) -> Result<()> {
    let (dt, n) = (a.dtype, inputs.len() as u32);
    if inputs.len() >= 2 {
        reduce::reduce3(out, inputs[0], inputs[1], dt, op).map_err(kernel)?;
        for x in &inputs[2..] {
            reduce::reduce_into(out, x, dt, op).map_err(kernel)?;
        }
    } else {
        out.copy_from_slice(inputs[0]);
    }
    reduce::post_op(out, dt, op, n).map_err(kernel)
}

/// Calls `f` with the `n` slices `get(0..n)`, on the stack for up to 8.
fn with_inputs<'a, R>(
    n: usize,
    get: impl Fn(usize) -> &'a [u8],
    f: impl FnOnce(&[&'a [u8]]) -> R,
) -> R {
    if n <= 8 {
        let mut v: [&[u8]; 8] = [&[]; 8];
        for (k, x) in v.iter_mut().enumerate().take(n) {
            *x = get(k);
        }
        f(&v[..n])
    } else {
        let v: Vec<&[u8]> = (0..n).map(get).collect();
        f(&v)
    }
}

/// Runs one small collective (`fits` returned true) other than a broadcast
/// (those take [`super::bcast`]'s ring).
pub fn run(node: &Node, a: &Call, op: ReduceOp, trace: u64, watch: &Watch) -> Result<()> {
    if a.kind == Collective::Broadcast {
        return Err(Error::Internal(
            "broadcasts take the ring, not the fastbox".into(),
        ));
    }
    let n = node.nranks();
    let me = node.me;
    let bytes = a.count * a.dtype.size();
    let shape = Shape::of(a).encode();
    // Only the thread holding the communicator's exec gate counts: a load
    // and a store, no read-modify-write.
    let s = node.fast_seq.load(std::sync::atomic::Ordering::Relaxed) + 1;
    node.fast_seq.store(s, std::sync::atomic::Ordering::Relaxed);
    let posted = match a.kind {
        Collective::ReduceScatter => bytes * n,
        _ => bytes,
    };
    let input: &[u8] = if posted == 0 {
        &[]
    } else {
        // SAFETY: validated: `send` holds `send_bytes` >= `posted` bytes.
        unsafe { std::slice::from_raw_parts(a.send.get().cast::<u8>(), posted) }
    };
    if a.kind.reduces() && op.has_pre_op(a.dtype) {
        // PreMulSum scalars may differ per rank: each rank posts its own
        // input already multiplied.
        TMP.with(|t| {
            let mut t = t.borrow_mut();
            t.resize(input.len(), 0);
            reduce::pre_op(&mut t, input, a.dtype, op, n as u32).map_err(kernel)?;
            // SAFETY: as below.
            unsafe { node.boards[me].post(s, shape, &t) };
            Ok::<_, Error>(())
        })?;
    } else {
        // SAFETY: this rank owns its board, and every rank finished
        // operation s - 1 before this one (its own wait below in the
        // previous call).
        unsafe { node.boards[me].post(s, shape, input) };
    }
    node.wake_peers();
    let what = || {
        format!(
            "{} seq {trace} trace {:016x}-{trace} ({bytes} B, fastbox)",
            a.kind, node.comm_hash
        )
    };
    let wop = Op {
        label: &what,
        watch,
        seq: trace,
    };
    let other_path = Cell::new(None);
    node.wait(&wop, || {
        for k in (0..n).filter(|&k| k != me) {
            if node.boards[k].posted(s) {
                continue;
            }
            // Checked in this order: a peer posts `s` before it can enter
            // a later single-copy operation or broadcast.
            if (node.peer_in_copy(k) || node.peer_in_bcast(k)) && !node.boards[k].posted(s) {
                other_path.set(Some(k));
                return None;
            }
            return Some(k);
        }
        None
    })?;
    if let Some(k) = other_path.get() {
        if let Some(theirs) = node.next_bcast_call(k) {
            return Err(shape::disagree(
                "board slots against broadcast ring",
                k,
                theirs,
                me,
                shape,
            ));
        }
        let theirs = Shape::load(&node.boards[k].extents().shape);
        return Err(shape::disagree(
            "board slots against single copy",
            k,
            theirs,
            me,
            shape,
        ));
    }
    if let Some(e) = shape::check_all("board slots", n, |k| node.boards[k].posted_shape(s).0) {
        return Err(e);
    }
    let out_len = match a.kind {
        Collective::AllGather => bytes * n,
        Collective::Reduce if a.root != me => 0,
        _ => bytes,
    };
    if out_len == 0 {
        return Ok(());
    }
    // SAFETY: validated: `recv` holds `recv_bytes` >= `out_len` writable
    // bytes; the slots hold copies, so `recv` may alias `send`.
    let out = unsafe { std::slice::from_raw_parts_mut(a.recv.get().cast::<u8>(), out_len) };
    // Every slot read below stays within what its owner posted (equal
    // shapes post equal lengths; checked again here).
    let read = match a.kind {
        Collective::ReduceScatter => me * bytes..(me + 1) * bytes,
        _ => 0..bytes,
    };
    let need = read.end;
    for k in 0..n {
        let (_, posted) = node.boards[k].posted_shape(s);
        if posted < need {
            return Err(Error::Internal(
                format!(
                    "{}: rank {k} posted {posted} B, fewer than the {need} B read",
                    what()
                )
                .into(),
            ));
        }
    }
    // SAFETY: (every `data` below) all ranks posted `s`, and this rank has
    // not posted `s + 1`; the lengths were checked above.
    let slot = |k: usize, len: usize| unsafe { node.boards[k].data(s, len) }.unwrap_or(&[]);
    match a.kind {
        Collective::AllReduce | Collective::Reduce => {
            with_inputs(n, |k| slot(k, bytes), |inputs| fold(out, inputs, a, op))
        }
        Collective::ReduceScatter => with_inputs(
            n,
            |k| &slot(k, read.end)[read.start..],
            |inputs| fold(out, inputs, a, op),
        ),
        Collective::AllGather => {
            for (k, chunk) in out.chunks_exact_mut(bytes).enumerate() {
                chunk.copy_from_slice(slot(k, bytes));
            }
            Ok(())
        }
        other => Err(Error::Internal(
            format!("fastbox cannot run {other}").into(),
        )),
    }
}

impl Node {
    /// Whether local rank `k` has entered a single-copy operation this rank
    /// has not started: its control line is past this rank's single-copy
    /// operations, or it has probed the single-copy path, which this rank
    /// has not. A rank in small operation `s` that sees this of a peer that
    /// has not posted `s` (checked after this) knows the peer took the
    /// single-copy path for the same operation: a peer enters a later one
    /// only after posting `s`.
    pub(super) fn peer_in_copy(&self, k: usize) -> bool {
        let c = self.copy_seq.load(Ordering::Relaxed);
        let ctl = self.boards[k].control();
        ctl.stage.load(Ordering::Acquire) >= (c + 1) << 8
            || (c == 0
                && self.copy_state.load(Ordering::Relaxed) == 0
                && ctl.probe_ok.load(Ordering::Acquire) != 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_fits() {
        assert!(fits(Collective::AllReduce, 8, 2));
        assert!(fits(Collective::AllReduce, FAST_BYTES, 8));
        assert!(!fits(Collective::AllReduce, FAST_BYTES + 1, 2));
        assert!(
            !fits(Collective::AllReduce, 0, 2),
            "empty calls take the plain path"
        );
        assert!(fits(Collective::ReduceScatter, FAST_BYTES / 4, 4));
        assert!(!fits(Collective::ReduceScatter, FAST_BYTES / 4 + 1, 4));
        assert!(!fits(Collective::ReduceScatter, usize::MAX, 2));
        assert!(!fits(Collective::AlltoAll, 8, 2));
        assert!(!fits(Collective::Gather, 8, 2));
    }
}
