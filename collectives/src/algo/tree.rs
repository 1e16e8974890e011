//! Binary-tree schedules: the double binary tree all-reduce, and one-tree
//! broadcast and reduce.
//!
//! Trees are binary heaps over *positions*: position `p` has children
//! `2p+1`, `2p+2` and parent `(p-1)/2`; a map takes positions to group
//! ranks. All-reduce uses two trees, `p ↦ p` and the mirror `p ↦ n-1-p`,
//! each carrying half the data: the inner nodes of one are (mostly) the
//! leaves of the other, so every rank's links are busy in both directions.
//! Rooted collectives use one tree, `p ↦ root+p`.

use super::builder::Builder;
use super::generate::Group;
use super::plan::{BufRange, Rank};

/// One rank's view of a tree.
struct Node {
    parent: Option<Rank>,
    children: Vec<Rank>,
}

fn heap(g: &Group, pos_of_me: usize, to_index: impl Fn(usize) -> usize) -> Node {
    let n = g.n();
    let p = pos_of_me;
    let parent = (p > 0).then(|| g.at(to_index((p - 1) / 2)));
    let children = [2 * p + 1, 2 * p + 2]
        .into_iter()
        .filter(|&c| c < n)
        .map(|c| g.at(to_index(c)))
        .collect();
    Node { parent, children }
}

/// The two trees of the double binary tree, as this rank sees them.
fn double_tree(g: &Group) -> [Node; 2] {
    let n = g.n();
    [heap(g, g.me, |p| p), heap(g, n - 1 - g.me, |p| n - 1 - p)]
}

/// Reduce one chunk up `t`: children's partials are combined with the local
/// input into `acc`; the result goes to the parent. Returns nothing; the
/// root's result is in `acc` (copied from `input` for a lone root).
fn reduce_up(b: &mut Builder, t: &Node, chan: u8, input: BufRange, acc: BufRange, post: bool) {
    let mut src = input;
    for (i, &child) in t.children.iter().enumerate() {
        let local = if i == 0 { input } else { acc };
        b.recv_reduce(child, chan, local, acc);
        src = acc;
    }
    match t.parent {
        Some(parent) => b.send(parent, chan, src),
        None => {
            b.copy(src, acc);
            b.post(post, acc);
        }
    }
}

/// Broadcast one chunk down `t` from its root (whose data is in `src`).
fn broadcast_down(b: &mut Builder, t: &Node, chan: u8, src: BufRange, out: BufRange) {
    let src = match t.parent {
        Some(parent) => {
            b.recv(parent, chan, out);
            out
        }
        None => src,
    };
    for &child in &t.children {
        b.send(child, chan, src);
    }
}

/// The pieces of `r` as ranges.
fn chunks(b: &Builder, r: BufRange) -> Vec<BufRange> {
    b.pieces(r.len).map(|(o, l)| r.sub(o, l)).collect()
}

/// Double binary tree all-reduce: half `h` of the data is reduced up tree
/// `h` and broadcast back down it, chunk by chunk, on channel `h`.
pub(crate) fn allreduce(b: &mut Builder, g: &Group, input: BufRange, output: BufRange, post: bool) {
    if g.n() == 1 {
        b.copy(input, output);
        b.post(post, output);
        return;
    }
    let trees = double_tree(g);
    let ins = [b.part(input, 2, 0), b.part(input, 2, 1)].map(|r| chunks(b, r));
    let outs = [b.part(output, 2, 0), b.part(output, 2, 1)].map(|r| chunks(b, r));
    let most = ins[0].len().max(ins[1].len());
    for c in 0..most {
        for h in 0..2 {
            if let (Some(&i), Some(&o)) = (ins[h].get(c), outs[h].get(c)) {
                reduce_up(b, &trees[h], h as u8, i, o, post);
            }
        }
    }
    for c in 0..most {
        for h in 0..2 {
            if let Some(&o) = outs[h].get(c) {
                broadcast_down(b, &trees[h], h as u8, o, o);
            }
        }
    }
}

fn rooted(g: &Group, root: Rank) -> Node {
    let n = g.n();
    let root = root as usize;
    heap(g, (g.me + n - root) % n, |p| (p + root) % n)
}

/// Tree broadcast from `root`, chunk by chunk.
pub(crate) fn broadcast(b: &mut Builder, g: &Group, root: Rank, input: BufRange, output: BufRange) {
    let t = rooted(g, root);
    let outs = chunks(b, output);
    let ins = chunks(b, input);
    for (c, &o) in outs.iter().enumerate() {
        let src = if t.parent.is_none() { ins[c] } else { o };
        broadcast_down(b, &t, 0, src, o);
    }
    // The root's own copy after its sends (see `ring::broadcast`).
    if t.parent.is_none() {
        b.copy(input, output);
    }
}

/// Tree reduce to `root`, chunk by chunk; inner non-roots accumulate in
/// rotating scratch slots.
pub(crate) fn reduce(
    b: &mut Builder,
    g: &Group,
    root: Rank,
    input: BufRange,
    output: BufRange,
    post: bool,
) {
    let t = rooted(g, root);
    let root_here = t.parent.is_none();
    let inner = !t.children.is_empty();
    let slots = b.slots(if inner && !root_here { input.len } else { 0 });
    let ins = chunks(b, input);
    let outs = chunks(b, output);
    for (c, i) in ins.into_iter().enumerate() {
        // Leaves send their input as is; inner nodes accumulate in a slot.
        let acc = if root_here {
            outs[c]
        } else {
            slots.get(c, i.len)
        };
        reduce_up(b, &t, 0, i, acc, post);
    }
}
