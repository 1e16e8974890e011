//! Recursive halving-doubling all-reduce (Rabenseifner).
//!
//! With `p` the largest power of two not above `n` and `rem = n - p`:
//! 1. fold-in: among the first `2·rem` ranks, each even rank sends its whole
//!    input to the odd rank above it, which reduces; the even ranks then
//!    wait for the result. The `p` remaining ranks get new ranks `0..p`;
//! 2. reduce-scatter by recursive halving: the data is cut into `p` blocks;
//!    at distance `d = p/2, p/4, …, 1` a rank exchanges half of its current
//!    block range with the new rank `new ^ d` and keeps (and reduces) the
//!    half that matches its bit `d`. Each rank ends with one fully reduced
//!    block, which it finishes (post-op);
//! 3. all-gather by recursive doubling: the same exchanges in reverse order,
//!    each rank sending everything it has;
//! 4. fold-out: each odd rank of the fold-in sends the result to its even
//!    partner.

use super::builder::Builder;
use super::generate::Group;
use super::plan::BufRange;

/// See the module docs. `input` may equal `output`.
pub(crate) fn allreduce(b: &mut Builder, g: &Group, input: BufRange, output: BufRange, post: bool) {
    let n = g.n();
    if n == 1 {
        b.copy(input, output);
        b.post(post, output);
        return;
    }
    let p = 1usize << (usize::BITS - 1 - n.leading_zeros());
    let rem = n - p;
    let me = g.me;
    // Fold-in.
    let mut folded = false;
    if me < 2 * rem {
        if me % 2 == 0 {
            b.send(g.at(me + 1), 0, input);
            b.recv(g.at(me + 1), 0, output);
            return;
        }
        b.recv_reduce(g.at(me - 1), 0, input, output);
        folded = true;
    }
    let new = if me < 2 * rem { me / 2 } else { me - rem };
    let real = |nr: usize| if nr < rem { 2 * nr + 1 } else { nr + rem };
    // Blocks [lo, hi) of p blocks; `range` turns block indices into bytes.
    let range = |b: &Builder, r: BufRange, lo: usize, hi: usize| {
        let first = b.part(r, p, lo);
        let last = b.part(r, p, hi - 1);
        BufRange::new(r.buf, first.offset, last.end() - first.offset)
    };
    let (mut lo, mut hi) = (0usize, p);
    let mut stack = Vec::new();
    let mut d = p / 2;
    let mut first = true;
    while d >= 1 {
        let peer = g.at(real(new ^ d));
        let mid = lo + (hi - lo) / 2;
        let (keep, give) = if new & d == 0 {
            ((lo, mid), (mid, hi))
        } else {
            ((mid, hi), (lo, mid))
        };
        let src = if first && !folded { input } else { output };
        b.send(peer, 0, range(b, src, give.0, give.1));
        let local = range(b, src, keep.0, keep.1);
        b.recv_reduce(peer, 0, local, range(b, output, keep.0, keep.1));
        stack.push((peer, give));
        (lo, hi) = keep;
        first = false;
        d /= 2;
    }
    b.post(post, range(b, output, lo, hi));
    // All-gather: undo the halving steps in reverse.
    while let Some((peer, give)) = stack.pop() {
        b.send(peer, 0, range(b, output, lo, hi));
        b.recv(peer, 0, range(b, output, give.0, give.1));
        (lo, hi) = (lo.min(give.0), hi.max(give.1));
    }
    // Fold-out.
    if folded {
        b.send(g.at(me - 1), 0, output);
    }
}
