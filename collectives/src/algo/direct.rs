//! One-step schedules: every rank talks to every other rank (or to the root)
//! directly, and pairwise exchange for all-to-all.
//!
//! Where several ranks each compute the same reduction (direct all-reduce),
//! they all combine the inputs in rank order `0, 1, …, n-1`, so that every
//! rank gets bit-identical results even for floats. Where one rank computes
//! a result (reduce, reduce-scatter), it starts from its own input and
//! combines the others in rank order.

use super::builder::Builder;
use super::generate::Group;
use super::plan::{BufRange, Rank};

/// Direct all-reduce: everybody sends its input to everybody, and reduces
/// all `n` inputs in rank order, [`Builder::piece_bytes`] at a time (a
/// message the links send without waiting for the receiver, so that each
/// piece's reduction overlaps the next one's transfer). In place, the
/// input is first staged in scratch since the accumulation overwrites it.
///
/// With a compressed wire ([`Builder::round`]) each rank rounds a copy of
/// its input to the wire's precision first and sends and adds that copy,
/// so that every rank adds the same values and gets the same result.
pub(crate) fn allreduce(b: &mut Builder, g: &Group, input: BufRange, output: BufRange, post: bool) {
    let n = g.n();
    let round = std::mem::take(&mut b.round) && n > 1;
    let input = if (input.overlaps(&output) || round) && n > 1 {
        let s = if input.buf == super::plan::BufId::Scratch {
            input
        } else {
            let s = b.scratch(input.len);
            b.copy(input, s);
            s
        };
        if round {
            b.round_range(s);
        }
        s
    } else {
        input
    };
    for (o, l) in b.pieces_upto(input.len, b.piece_bytes) {
        let (input, output) = (input.sub(o, l), output.sub(o, l));
        for k in 0..n {
            if k != g.me {
                b.send(g.at(k), 0, input);
            }
        }
        for k in 0..n {
            match (k == g.me, k == 0) {
                (true, true) => b.copy(input, output),
                (true, false) => b.reduce(output, input, output),
                (false, true) => b.recv(g.at(k), 0, output),
                (false, false) => b.recv_reduce(g.at(k), 0, output, output),
            }
        }
    }
    b.post(post, output);
}

/// Combines this rank's `input` with the same-sized message of every other
/// group rank (in rank order) into `dst`.
fn gather_reduce(b: &mut Builder, g: &Group, input: BufRange, dst: BufRange, chan: u8) {
    let mut local = input;
    for k in 0..g.n() {
        if k != g.me {
            b.recv_reduce(g.at(k), chan, local, dst);
            local = dst;
        }
    }
    b.copy(local, dst);
}

/// Direct broadcast: the root sends to everybody.
pub(crate) fn broadcast(b: &mut Builder, g: &Group, root: Rank, input: BufRange, output: BufRange) {
    let root = root as usize;
    if g.me == root {
        for k in 0..g.n() {
            if k != root {
                b.send(g.at(k), 0, input);
            }
        }
        b.copy(input, output);
    } else {
        b.recv(g.at(root), 0, output);
    }
}

/// Direct reduce: everybody sends to the root, which reduces.
pub(crate) fn reduce(
    b: &mut Builder,
    g: &Group,
    root: Rank,
    input: BufRange,
    output: BufRange,
    post: bool,
) {
    let root = root as usize;
    if g.me == root {
        gather_reduce(b, g, input, output, 0);
        b.post(post, output);
    } else {
        b.send(g.at(root), 0, input);
    }
}

/// Direct all-gather: everybody sends its block to everybody.
pub(crate) fn allgather(b: &mut Builder, g: &Group, input: BufRange, output: BufRange) {
    let block = |k: usize| output.sub(k * input.len, input.len);
    for k in 0..g.n() {
        if k != g.me {
            b.send(g.at(k), 0, input);
        }
    }
    for k in 0..g.n() {
        if k != g.me {
            b.recv(g.at(k), 0, block(k));
        }
    }
    b.copy(input, block(g.me));
}

/// Direct reduce-scatter: block `k` of everybody's input goes to rank `k`,
/// which reduces it starting from its own block (in place, that block is
/// the output itself).
pub(crate) fn reduce_scatter(
    b: &mut Builder,
    g: &Group,
    input: BufRange,
    output: BufRange,
    post: bool,
) {
    let block = |k: usize| input.sub(k * output.len, output.len);
    for k in 0..g.n() {
        if k != g.me {
            b.send(g.at(k), 0, block(k));
        }
    }
    gather_reduce(b, g, block(g.me), output, 0);
    b.post(post, output);
}

/// All-to-all: block `k` of the input goes to rank `k` and lands in block
/// `me` of its output. Pairwise: step `s` sends to `me+s` and receives from
/// `me-s`; otherwise everything is posted in rank order.
pub(crate) fn alltoall(
    b: &mut Builder,
    g: &Group,
    input: BufRange,
    output: BufRange,
    pairwise: bool,
) {
    let n = g.n();
    let len = input.len / n.max(1);
    let (inb, outb) = (
        |k: usize| input.sub(k * len, len),
        |k: usize| output.sub(k * len, len),
    );
    b.copy(inb(g.me), outb(g.me));
    if pairwise {
        for s in 1..n {
            let (to, from) = (g.rel(s as isize), g.rel(-(s as isize)));
            b.send(g.at(to), 0, inb(to));
            b.recv(g.at(from), 0, outb(from));
        }
    } else {
        for k in (0..n).filter(|&k| k != g.me) {
            b.send(g.at(k), 0, inb(k));
        }
        for k in (0..n).filter(|&k| k != g.me) {
            b.recv(g.at(k), 0, outb(k));
        }
    }
}

/// Direct gather: everybody sends its block to the root.
pub(crate) fn gather(b: &mut Builder, g: &Group, root: Rank, input: BufRange, output: BufRange) {
    let root = root as usize;
    if g.me != root {
        b.send(g.at(root), 0, input);
        return;
    }
    let block = |k: usize| output.sub(k * input.len, input.len);
    for k in (0..g.n()).filter(|&k| k != root) {
        b.recv(g.at(k), 0, block(k));
    }
    b.copy(input, block(root));
}

/// Direct scatter: the root sends block `k` to rank `k`.
pub(crate) fn scatter(b: &mut Builder, g: &Group, root: Rank, input: BufRange, output: BufRange) {
    let root = root as usize;
    if g.me != root {
        b.recv(g.at(root), 0, output);
        return;
    }
    let block = |k: usize| input.sub(k * output.len, output.len);
    for k in (0..g.n()).filter(|&k| k != root) {
        b.send(g.at(k), 0, block(k));
    }
    b.copy(block(root), output);
}
