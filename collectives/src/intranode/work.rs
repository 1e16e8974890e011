//! The work of one single-copy operation, cut into items that any local rank
//! may run, so that ranks the scheduler keeps off a CPU (4 ranks on 2 cores)
//! do not hold the others up.
//!
//! Items are numbered `0..items`; rank `r`'s home items are the `r`-th
//! contiguous share. A rank first claims its home items, in order, then
//! steals the rest of the other ranks' shares. Claiming advances the home
//! rank's claim counter with compare-and-swap; each counter only grows over
//! the communicator's life, every rank derives the same per-operation bases
//! from the operations' shapes, and a rank finished with an item adds one to
//! its own done counter. Every item is therefore run exactly once, and the
//! sum of the done counters tells every rank when the operation is over.
//!
//! What an item is:
//! - AllReduce: one chunk of the result. The claimer folds every rank's
//!   input in rank order (so the result does not depend on who ran it) and
//!   writes the chunk, still in cache, into every rank's output.
//! - ReduceScatter: one chunk of one rank's output, folded the same way.
//! - AllGather: one chunk of one rank's block, read once and written into
//!   every rank's output.
//! - Broadcast: one chunk of one rank's output.
//!
//! The home items of Broadcast and ReduceScatter are the rank's own output,
//! and those of AllGather its own input, so when every rank runs, each
//! block is read once.
//!
//! Large out-of-place reductions fold a tile at a time
//! ([`reduce::fold_tiles`]) and stream each tile into the outputs with
//! non-temporal stores, so that loads and stores overlap and the result
//! never passes through L2.

use std::cell::RefCell;
use std::sync::atomic::Ordering;

use super::copy::Side;
use super::ntcopy;
use super::Node;
use crate::algo::Collective;
use crate::error::{Error, Result};
use crate::launch::Call;
use crate::reduce::{self, Combine, ReduceError, ReduceOp, Scalar};

/// The largest item: its reduction runs from L2.
const MAX_CHUNK: usize = 128 << 10;
/// The smallest item (claiming costs two shared cache lines).
const MIN_CHUNK: usize = 16 << 10;
/// Items per rank the chunk size aims at, so that a fast rank can take
/// over part of a slow one's share.
const ITEMS_PER_RANK: usize = 4;

thread_local! {
    /// Chunk buffers: two for peers' data read by system call (or
    /// pre-multiplied), one for the reduced chunk.
    static BUFS: RefCell<Bufs> = const { RefCell::new(Bufs { a: Vec::new(), b: Vec::new(), acc: Vec::new() }) };
}

struct Bufs {
    a: Vec<u8>,
    b: Vec<u8>,
    acc: Vec<u8>,
}

fn kernel(e: ReduceError) -> Error {
    Error::Internal(format!("reduction kernel: {e}").into())
}

/// The shape of one operation, the same on every rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct ItemPlan {
    kind: Collective,
    n: usize,
    /// Bytes of one block: the buffer (AllReduce, Broadcast) or one rank's
    /// share (ReduceScatter, AllGather).
    bytes: usize,
    /// Bytes per item (a multiple of 4096, so of every element size).
    chunk: usize,
    /// Items per block.
    per_block: usize,
    /// Blocks: 1 for AllReduce, else one per output rank.
    blocks: usize,
}

impl ItemPlan {
    /// The plan of a `kind` call of `bytes` (count times element size) on
    /// `n` ranks.
    pub fn new(kind: Collective, n: usize, bytes: usize) -> Self {
        let blocks = if kind == Collective::AllReduce { 1 } else { n };
        let total = bytes.saturating_mul(blocks);
        let chunk = (total / (ITEMS_PER_RANK * n.max(1)))
            .clamp(MIN_CHUNK, MAX_CHUNK)
            .next_multiple_of(4096);
        Self {
            kind,
            n,
            bytes,
            chunk,
            per_block: bytes.div_ceil(chunk),
            blocks,
        }
    }

    /// The number of items.
    pub fn items(&self) -> u64 {
        (self.blocks * self.per_block) as u64
    }

    /// Rank `r`'s home items: `[lo, hi)`.
    pub fn home(&self, r: usize) -> (u64, u64) {
        let items = self.items();
        let n = self.n as u64;
        (r as u64 * items / n, (r as u64 + 1) * items / n)
    }

    /// Item `t`'s block and byte range inside the block.
    fn item(&self, t: u64) -> (usize, usize, usize) {
        let t = t as usize;
        let (b, j) = (t / self.per_block, t % self.per_block);
        let lo = j * self.chunk;
        (b, lo, (lo + self.chunk).min(self.bytes))
    }

    /// Bytes rank `k`'s buffers must hold `(send, recv)` (a Broadcast
    /// reads only the root's send buffer).
    fn needs(&self, k: usize, root: usize) -> (usize, usize) {
        match self.buffer_bytes() {
            (_, r) if self.kind == Collective::Broadcast && k != root => (0, r),
            b => b,
        }
    }

    /// Bytes of rank buffers `(send, recv)`.
    fn buffer_bytes(&self) -> (usize, usize) {
        match self.kind {
            Collective::ReduceScatter => (self.bytes * self.n, self.bytes),
            Collective::AllGather => (self.bytes, self.bytes * self.n),
            _ => (self.bytes, self.bytes),
        }
    }
}

/// Where a reduction item builds its result.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Acc {
    /// The thread's chunk buffer.
    Buffer,
    /// This rank's output, distinct from every input.
    Output,
    /// This rank's output, which is its own input of the item (in place).
    OwnInput,
}

/// Copies `src` to `dst`, with non-temporal stores when `nt`.
///
/// # Safety
/// `dst` must be valid for `src.len()` bytes of writes, disjoint from `src`.
unsafe fn put_bytes(dst: *mut u8, src: &[u8], nt: bool) {
    if nt {
        // SAFETY: per the contract.
        unsafe { ntcopy::copy(dst, src) }
    } else {
        // SAFETY: per the contract.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst, src.len()) }
    }
}

/// `op` as rank `k` runs it: with `k`'s published scalar for PreMulSum.
fn peer_op(node: &Node, k: usize, op: ReduceOp, dt: hetccl_abi::DataType) -> ReduceOp {
    match op {
        ReduceOp::PreMulSum(_) => {
            let raw = node.boards[k].control().scalar.load(Ordering::Relaxed);
            Scalar::from_bytes(dt, &raw.to_le_bytes()).map_or(op, ReduceOp::PreMulSum)
        }
        other => other,
    }
}

/// One operation as this rank sees it: the plan and every rank's buffers.
pub(super) struct Job<'a> {
    node: &'a Node,
    a: &'a Call,
    op: ReduceOp,
    plan: ItemPlan,
    /// Whether outputs go out with non-temporal stores (large operations).
    nt: bool,
}

impl<'a> Job<'a> {
    /// The job of `a` on `node` (every rank has published its buffers).
    pub fn new(node: &'a Node, a: &'a Call, op: ReduceOp) -> Self {
        let plan = ItemPlan::new(a.kind, node.nranks(), a.count * a.dtype.size());
        let (s, r) = plan.buffer_bytes();
        let volume = s.max(r);
        // Reductions: by the bytes all ranks' outputs span together (4
        // ranks at 2 MiB stream as much as 2 ranks at 4 MiB); copies: by
        // this rank's buffer.
        let nt = if a.kind.reduces() {
            volume.saturating_mul(node.nranks()) >= ntcopy::NT_MIN_BYTES
        } else {
            volume >= ntcopy::NT_MIN_BYTES / 2
        };
        Self {
            node,
            a,
            op,
            plan,
            nt,
        }
    }

    fn send(&self, k: usize) -> u64 {
        self.node.boards[k].control().send.load(Ordering::Relaxed)
    }

    fn recv(&self, k: usize) -> u64 {
        self.node.boards[k].control().recv.load(Ordering::Relaxed)
    }

    /// Whether rank `k`'s send and receive buffers overlap (in place).
    fn in_place(&self, k: usize) -> bool {
        let (sb, rb) = self.plan.buffer_bytes();
        let (s, r) = (self.send(k), self.recv(k));
        s < r.saturating_add(rb as u64) && r < s.saturating_add(sb as u64)
    }

    /// Whether writes into rank `k`'s output use non-temporal stores: large
    /// operations, not in place (there the output lines were just read, and
    /// a non-temporal store to a cached line costs more than it saves).
    fn nt_for(&self, k: usize) -> bool {
        self.nt && !self.in_place(k)
    }

    /// The error when a rank's published buffers cannot hold what this
    /// operation reads or writes there (`None` when all can). Equal shapes
    /// give equal extents, so this only fails on a broken invariant.
    pub fn check_extents(&self) -> Option<Error> {
        (0..self.plan.n).find_map(|k| {
            let (need_s, need_r) = self.plan.needs(k, self.a.root);
            let x = self.node.boards[k].extents();
            let (s, r) = (
                x.send_len.load(Ordering::Acquire),
                x.recv_len.load(Ordering::Acquire),
            );
            (s < need_s as u64 || r < need_r as u64).then(|| {
                Error::Internal(
                    format!(
                        "single copy: rank {k} published buffers of {s} B (send) and {r} B \
                     (receive); this {} needs {need_s} B and {need_r} B",
                        self.a.kind
                    )
                    .into(),
                )
            })
        })
    }

    /// The sum of the done counters once every item of this operation (and
    /// of all before it) is finished.
    pub fn target(&self) -> u64 {
        self.node.done_base.load(Ordering::Relaxed) + self.plan.items()
    }

    /// The sum of every rank's done counter now.
    pub fn done(&self) -> u64 {
        self.node
            .boards
            .iter()
            .map(|b| b.done().load(Ordering::Acquire))
            .sum()
    }

    /// Claims and runs items until none is left: this rank's home items
    /// first, then the other ranks'.
    pub fn run(&self) -> Result<()> {
        let (n, me) = (self.plan.n, self.node.me);
        for r in (0..n).map(|i| (me + i) % n) {
            let (lo, hi) = self.plan.home(r);
            let base = self.node.claim_base[r].load(Ordering::Relaxed);
            while let Some(idx) = claim(self.node.boards[r].claim(), base, base + (hi - lo)) {
                self.run_item(lo + idx)?;
                let done = self.node.boards[me].done();
                done.store(done.load(Ordering::Relaxed) + 1, Ordering::Release);
            }
        }
        Ok(())
    }

    /// Moves the counters' bases past this operation (once [`Job::done`]
    /// reached [`Job::target`]), where every rank moves them alike.
    pub fn finish(&self) {
        for (r, b) in self.node.claim_base.iter().enumerate() {
            let (lo, hi) = self.plan.home(r);
            b.store(b.load(Ordering::Relaxed) + (hi - lo), Ordering::Relaxed);
        }
        self.node.done_base.store(self.target(), Ordering::Relaxed);
    }

    fn run_item(&self, t: u64) -> Result<()> {
        let (b, lo, hi) = self.plan.item(t);
        let len = hi - lo;
        let n = self.plan.n;
        BUFS.with(|bufs| {
            let bufs = &mut *bufs.borrow_mut();
            match self.plan.kind {
                Collective::AllReduce => self.reduce_item(lo, len, 0..n, lo, bufs),
                Collective::ReduceScatter => {
                    self.reduce_item(b * self.plan.bytes + lo, len, b..b + 1, lo, bufs)
                }
                Collective::AllGather => {
                    // Block b is rank b's input: read once (then from
                    // cache), written into every output, rank b's first.
                    let src = self.send(b) + lo as u64;
                    for d in (0..n).map(|i| (b + i) % n) {
                        let dst = self.recv(d) + (b * self.plan.bytes + lo) as u64;
                        if !(d == b && src == dst) {
                            self.transfer(b, src, d, dst, len, &mut bufs.a)?;
                        }
                    }
                    Ok(())
                }
                Collective::Broadcast => {
                    let root = self.a.root;
                    let src = self.send(root) + lo as u64;
                    let dst = self.recv(b) + lo as u64;
                    if b == root && src == dst {
                        return Ok(());
                    }
                    self.transfer(root, src, b, dst, len, &mut bufs.a)
                }
                other => Err(Error::Internal(
                    format!("single-copy cannot run {other}").into(),
                )),
            }
        })
    }

    /// Rank `k`'s `len` bytes at `addr`: in place when this rank can see
    /// them, else read into `tmp`.
    fn source<'t>(
        &self,
        k: usize,
        addr: u64,
        len: usize,
        tmp: &'t mut Vec<u8>,
    ) -> Result<&'t [u8]> {
        if let Some(p) = self.node.peer_view(k, Side::Send, addr, len)? {
            // SAFETY: rank k's buffer (inside its published send buffer,
            // checked by `peer_view`), which nobody writes while this item
            // runs (only this item's claimer writes this range, and inputs
            // are only rewritten in place by the item that read them).
            return Ok(unsafe { std::slice::from_raw_parts(p.cast_const(), len) });
        }
        tmp.resize(len, 0);
        self.node.read(k, addr, tmp)?;
        Ok(tmp)
    }

    /// Writes `data` to `addr` in rank `k`'s address space.
    fn put(&self, k: usize, addr: u64, data: &[u8]) -> Result<()> {
        match self.node.peer_view(k, Side::Recv, addr, data.len())? {
            Some(d) if d.cast_const() == data.as_ptr() => Ok(()),
            // SAFETY: rank k's output range of this item (inside its
            // published receive buffer, checked by `peer_view`), which only
            // this rank writes now; `data` is a separate buffer.
            Some(d) => unsafe {
                put_bytes(d, data, self.nt_for(k));
                Ok(())
            },
            None => self.node.write(k, addr, data),
        }
    }

    /// Copies `len` bytes from rank `src_k`'s `src` to rank `dst_k`'s `dst`
    /// with one copy when this rank can see either side.
    fn transfer(
        &self,
        src_k: usize,
        src: u64,
        dst_k: usize,
        dst: u64,
        len: usize,
        tmp: &mut Vec<u8>,
    ) -> Result<()> {
        if let Some(d) = self.node.peer_view(dst_k, Side::Recv, dst, len)? {
            return match self.node.peer_view(src_k, Side::Send, src, len)? {
                // SAFETY: rank dst_k's output range of this item, which only
                // this rank writes now, and a distinct source range (the
                // caller skips in-place copies).
                Some(s) => unsafe {
                    let data = std::slice::from_raw_parts(s.cast_const(), len);
                    put_bytes(d, data, self.nt_for(dst_k));
                    Ok(())
                },
                None => {
                    // SAFETY: as above.
                    let out = unsafe { std::slice::from_raw_parts_mut(d, len) };
                    self.node.read(src_k, src, out)
                }
            };
        }
        let data = self.source(src_k, src, len, tmp)?;
        self.node.write(dst_k, dst, data)
    }

    /// Folds every rank's `len` input bytes at offset `in_off` in rank order
    /// and writes the result to offset `out_off` of the outputs of `dests`.
    fn reduce_item(
        &self,
        in_off: usize,
        len: usize,
        dests: std::ops::Range<usize>,
        out_off: usize,
        bufs: &mut Bufs,
    ) -> Result<()> {
        if self.nt
            && dests.clone().all(|d| self.nt_for(d))
            && self.reduce_streamed(in_off, len, dests.clone(), out_off)?
        {
            return Ok(());
        }
        let (node, dt, op) = (self.node, self.a.dtype, self.op);
        let (n, me) = (self.plan.n, node.me);
        let nr = n as u32;
        let pre = op.has_pre_op(dt);
        let Bufs { a: ta, b: tb, acc } = bufs;
        let mine = dests.contains(&me);
        let own_out = self.recv(me) + out_off as u64;
        // Where the result is built:
        // - out of place: straight in this rank's own output (if it is one
        //   of the outputs and takes ordinary stores);
        // - in place on rank 0 or 1: in its own output too, which holds its
        //   input: it starts the fold with the first pair, and swapping a
        //   pair's operands gives identical results for these combines;
        // - otherwise in a cached buffer.
        let swap_ok = matches!(op.combine(), Combine::Sum | Combine::Prod) || !dt.is_float();
        let mode = if !mine || self.nt_for(me) {
            Acc::Buffer
        } else if !self.in_place(me) {
            Acc::Output
        } else if me < 2 && n >= 2 && !pre && swap_ok && own_out == self.send(me) + in_off as u64 {
            Acc::OwnInput
        } else {
            Acc::Buffer
        };
        let acc: &mut [u8] = if mode == Acc::Buffer {
            acc.resize(len, 0);
            acc
        } else {
            node.within(me, Side::Recv, own_out, len)?;
            // SAFETY: this rank's output range of the item, which only this
            // rank writes now. Out of place no input overlaps it; in place
            // it is this rank's own input of the item, read only through
            // this slice.
            unsafe {
                std::slice::from_raw_parts_mut(self.a.recv.get().cast::<u8>().add(out_off), len)
            }
        };
        let at = |k: usize| self.send(k) + in_off as u64;
        let mut k = 0;
        if mode == Acc::OwnInput {
            // acc = input[me]; fold input[1 - me], then the rest in order.
            let other = 1 - me;
            let s = self.source(other, at(other), len, ta)?;
            reduce::reduce_into(acc, s, dt, op).map_err(kernel)?;
            k = 2;
        }
        while k < n {
            if pre {
                let s = self.source(k, at(k), len, ta)?;
                let pk = peer_op(node, k, op, dt);
                if k == 0 {
                    reduce::pre_op(acc, s, dt, pk, nr).map_err(kernel)?;
                } else {
                    tb.resize(len, 0);
                    reduce::pre_op(tb, s, dt, pk, nr).map_err(kernel)?;
                    reduce::reduce_into(acc, tb, dt, op).map_err(kernel)?;
                }
                k += 1;
            } else if k == 0 && n >= 2 {
                let s0 = self.source(0, at(0), len, ta)?;
                let s1 = self.source(1, at(1), len, tb)?;
                reduce::reduce3(acc, s0, s1, dt, op).map_err(kernel)?;
                k = 2;
            } else {
                let s = self.source(k, at(k), len, ta)?;
                if k == 0 {
                    acc.copy_from_slice(s);
                } else {
                    reduce::reduce_into(acc, s, dt, op).map_err(kernel)?;
                }
                k += 1;
            }
        }
        reduce::post_op(acc, dt, op, nr).map_err(kernel)?;
        for d in dests {
            if !(mode != Acc::Buffer && d == me) {
                self.put(d, self.recv(d) + out_off as u64, acc)?;
            }
        }
        Ok(())
    }
}

impl Job<'_> {
    /// [`Job::reduce_item`] in one pass, when every input and output is
    /// mapped here and no output overlaps an input (the caller checks the
    /// latter): folds tile by tile and streams each tile into every output.
    /// `Ok(false)`, having written nothing, when some buffer is not mapped.
    fn reduce_streamed(
        &self,
        in_off: usize,
        len: usize,
        dests: std::ops::Range<usize>,
        out_off: usize,
    ) -> Result<bool> {
        let (node, dt, op, n) = (self.node, self.a.dtype, self.op, self.plan.n);
        let mut inputs = Vec::with_capacity(n);
        for k in 0..n {
            let Some(p) = node.peer_view(k, Side::Send, self.send(k) + in_off as u64, len)? else {
                return Ok(false);
            };
            // SAFETY: rank k's input range of this item (inside its
            // published send buffer, checked by `peer_view`), which nobody
            // writes while this item runs: no output overlaps it.
            inputs.push(unsafe { std::slice::from_raw_parts(p.cast_const(), len) });
        }
        let mut outs = Vec::with_capacity(dests.len());
        for d in dests {
            match node.peer_view(d, Side::Recv, self.recv(d) + out_off as u64, len)? {
                Some(p) => outs.push(p),
                None => return Ok(false),
            }
        }
        let pre: Option<Vec<ReduceOp>> = op
            .has_pre_op(dt)
            .then(|| (0..n).map(|k| peer_op(node, k, op, dt)).collect());
        reduce::fold_tiles(&inputs, pre.as_deref(), dt, op, n as u32, |off, tile| {
            for &p in &outs {
                // SAFETY: `tile` is the result's bytes `off..off + tile.len()` of
                // this item; each output range holds `len` bytes (checked
                // by `peer_view`), only this rank writes it now, and it
                // overlaps no input (nor the tile, a local buffer).
                unsafe { ntcopy::stream(p.add(off), tile) };
            }
        })
        .map_err(kernel)?;
        ntcopy::fence();
        Ok(true)
    }
}

/// Claims the next item of a home range whose counter runs from `base` to
/// `end` in this operation: its index in the range, or `None` when all are
/// taken.
fn claim(counter: &std::sync::atomic::AtomicU64, base: u64, end: u64) -> Option<u64> {
    let mut cur = counter.load(Ordering::Acquire);
    loop {
        if cur >= end {
            return None;
        }
        debug_assert!(cur >= base, "claim counter {cur} behind its base {base}");
        match counter.compare_exchange_weak(cur, cur + 1, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => return Some(cur - base),
            Err(now) => cur = now,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;

    #[test]
    fn homes_split_every_item_once() {
        for (kind, n, bytes) in [
            (Collective::AllReduce, 2, 1 << 20),
            (Collective::AllReduce, 4, 1 << 20),
            (Collective::AllReduce, 3, 40_000),
            (Collective::ReduceScatter, 4, 100_000),
            (Collective::AllGather, 2, 12),
            (Collective::Broadcast, 7, 64 << 20),
        ] {
            let p = ItemPlan::new(kind, n, bytes);
            assert_eq!(p.chunk % 4096, 0);
            assert!((MIN_CHUNK..=MAX_CHUNK).contains(&p.chunk));
            let mut next = 0;
            for r in 0..n {
                let (lo, hi) = p.home(r);
                assert_eq!(lo, next);
                next = hi;
            }
            assert_eq!(next, p.items());
            // Every block's bytes are covered once, in order.
            let mut covered = vec![0usize; p.blocks];
            for t in 0..p.items() {
                let (b, lo, hi) = p.item(t);
                assert_eq!(lo, covered[b], "{kind:?} item {t}");
                assert!(hi > lo);
                covered[b] = hi;
            }
            assert!(covered.iter().all(|&c| c == bytes));
        }
        let p = ItemPlan::new(Collective::AllReduce, 4, 1 << 20);
        assert_eq!((p.chunk, p.items()), (64 << 10, 16), "4 items per rank");
        let p = ItemPlan::new(Collective::ReduceScatter, 4, 1 << 20);
        assert_eq!(p.home(2), (2 * p.per_block as u64, 3 * p.per_block as u64));
    }

    #[test]
    fn claims_hand_out_each_index_once_across_threads() {
        let counter = AtomicU64::new(100);
        let got: Vec<Vec<u64>> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..4)
                .map(|_| {
                    s.spawn(|| {
                        let mut mine = Vec::new();
                        while let Some(i) = claim(&counter, 100, 1100) {
                            mine.push(i);
                        }
                        mine
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let mut all: Vec<u64> = got.concat();
        all.sort_unstable();
        assert_eq!(all, (0..1000).collect::<Vec<_>>());
        assert_eq!(counter.load(Ordering::Relaxed), 1100);
        assert_eq!(claim(&counter, 1100, 1100), None, "an empty range");
    }
}
