//! Ring schedules: all-reduce (reduce-scatter then all-gather), all-gather,
//! reduce-scatter, and the chains used for broadcast and reduce.
//!
//! Group index `i` sends to `i+1` and receives from `i-1`. Every transfer is
//! split into chunk-sized messages, emitted ring-step-major (all chunks of
//! step `s` before step `s+1`), so a rank can forward chunk `c` of step `s+1`
//! as soon as chunk `c` of step `s` has arrived: the ring is pipelined.

use super::builder::Builder;
use super::generate::Group;
use super::plan::{BufRange, Rank};

/// Ring all-reduce of `input` into `output` (same length) over `g`.
/// `output` is split into `n` shards; shard `k` is reduced while it travels
/// once around the ring, ends fully reduced on group rank `k-1`, is
/// finished there (post-op), then travels once more to be copied
/// everywhere. `input` may equal `output`.
pub(crate) fn allreduce(
    b: &mut Builder,
    g: &Group,
    input: BufRange,
    output: BufRange,
    chan: u8,
    post: bool,
) {
    let n = g.n();
    if n == 1 {
        b.copy(input, output);
        b.post(post, output);
        return;
    }
    let (next, prev) = (g.at(g.rel(1)), g.at(g.rel(-1)));
    let shard = |b: &Builder, r: BufRange, k: usize| b.part(r, n, k);
    // Reduce-scatter: at step s send shard me-s, receive shard me-s-1.
    for s in 0..n - 1 {
        let k_send = g.rel(-(s as isize));
        let src = if s == 0 { input } else { output };
        let src = shard(b, src, k_send);
        b.send(next, chan, src);
        let k_recv = g.rel(-(s as isize) - 1);
        let (local, dst) = (shard(b, input, k_recv), shard(b, output, k_recv));
        b.recv_reduce(prev, chan, local, dst);
    }
    let mine = shard(b, output, g.rel(1));
    b.post(post, mine);
    // All-gather: at step s send shard me+1-s, receive shard me-s.
    for s in 0..n - 1 {
        let k_send = g.rel(1 - s as isize);
        b.send(next, chan, shard(b, output, k_send));
        let k_recv = g.rel(-(s as isize));
        b.recv(prev, chan, shard(b, output, k_recv));
    }
}

/// Ring reduce-scatter: `input` holds `n` equal blocks; block `k` ends,
/// reduced, in `output` on group rank `k`. Partial sums travel through two
/// block-sized scratch slots. `output` may be block `me` of `input` (in
/// place).
pub(crate) fn reduce_scatter(
    b: &mut Builder,
    g: &Group,
    input: BufRange,
    output: BufRange,
    post: bool,
) {
    let n = g.n();
    let block = |k: usize| input.sub(k * output.len, output.len);
    if n == 1 {
        b.copy(block(0), output);
        b.post(post, output);
        return;
    }
    let (next, prev) = (g.at(g.rel(1)), g.at(g.rel(-1)));
    // Partials alternate between two block-sized scratch slots: the block
    // received at step s is forwarded at step s+1, and the slot is reused
    // at step s+2 once that send is complete.
    let blk = output.len;
    let partial = b.scratch(blk * 2.min(n - 2));
    let staged = |s: usize| partial.sub((s % 2) * blk, blk);
    // At step s send block me-s-1 and receive block me-s-2; the last
    // receive (s = n-2) is block me itself.
    for s in 0..n - 1 {
        let k_send = g.rel(-(s as isize) - 1);
        let src = if s == 0 { block(k_send) } else { staged(s - 1) };
        b.send(next, 0, src);
        let k_recv = g.rel(-(s as isize) - 2);
        let dst = if s == n - 2 { output } else { staged(s) };
        b.recv_reduce(prev, 0, block(k_recv), dst);
    }
    b.post(post, output);
}

/// Ring all-gather: `input` is this rank's block; `output` holds `n`
/// blocks, block `k` from group rank `k`. `input` may be block `me` of
/// `output` (in place).
pub(crate) fn allgather(b: &mut Builder, g: &Group, input: BufRange, output: BufRange, chan: u8) {
    let n = g.n();
    let block = |k: usize| output.sub(k * input.len, input.len);
    b.copy(input, block(g.me));
    if n == 1 {
        return;
    }
    let (next, prev) = (g.at(g.rel(1)), g.at(g.rel(-1)));
    for s in 0..n - 1 {
        let k_send = g.rel(-(s as isize));
        let src = if s == 0 { input } else { block(k_send) };
        b.send(next, chan, src);
        b.recv(prev, chan, block(g.rel(-(s as isize) - 1)));
    }
}

/// Chain broadcast from `root` along the ring: each chunk is received from
/// the predecessor and forwarded to the successor.
pub(crate) fn broadcast(b: &mut Builder, g: &Group, root: Rank, input: BufRange, output: BufRange) {
    let n = g.n();
    let pos = (g.me + n - root as usize) % n;
    let (next, prev) = (g.at(g.rel(1)), g.at(g.rel(-1)));
    for (o, l) in b.pieces(output.len).collect::<Vec<_>>() {
        let chunk = output.sub(o, l);
        if pos > 0 {
            b.recv(prev, 0, chunk);
        }
        if pos + 1 < n {
            let src = if pos == 0 { input.sub(o, l) } else { chunk };
            b.send(next, 0, src);
        }
    }
    // The root's own copy after its sends: the data leaves first, and a
    // one-message plan plus a copy takes the executor's shortcut.
    if pos == 0 {
        b.copy(input, output);
    }
}

/// Chain reduce to `root`: the chain starts at `root+1` and ends at `root`;
/// each rank adds its input to the partial result flowing past, chunk by
/// chunk. Non-roots pass partials through rotating scratch slots.
pub(crate) fn reduce(
    b: &mut Builder,
    g: &Group,
    root: Rank,
    input: BufRange,
    output: BufRange,
    post: bool,
) {
    let n = g.n();
    let q = (g.me + 2 * n - root as usize - 1) % n; // 0 = head, n-1 = root
    let (next, prev) = (g.at(g.rel(1)), g.at(g.rel(-1)));
    if n == 1 {
        b.copy(input, output);
        b.post(post, output);
        return;
    }
    let root_here = q == n - 1;
    let slots = b.slots(if root_here || q == 0 { 0 } else { input.len });
    for (c, (o, l)) in b.pieces(input.len).enumerate().collect::<Vec<_>>() {
        if q == 0 {
            b.send(next, 0, input.sub(o, l));
            continue;
        }
        let acc = if root_here {
            output.sub(o, l)
        } else {
            slots.get(c, l)
        };
        b.recv_reduce(prev, 0, input.sub(o, l), acc);
        if !root_here {
            b.send(next, 0, acc);
        }
    }
    if q == n - 1 {
        b.post(post, output);
    }
}
