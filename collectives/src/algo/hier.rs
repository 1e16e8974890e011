//! Hierarchical all-reduce over a node topology.
//!
//! With `M` the largest number of ranks on any node, the data is cut into
//! `M` pieces. On a node with `m` local ranks, piece `j` belongs to local
//! rank `j mod m` (so on uneven layouts a local rank may own several):
//! 1. intra-node reduce-scatter, direct: every local rank sends piece `j`
//!    to its owner, which reduces (its own input first, then the others in
//!    local-rank order);
//! 2. inter-node all-reduce of each piece: the owners of piece `j` on all
//!    nodes (in node order) run a ring all-reduce on it, on channel
//!    `j mod CHANNELS`; the owners of different pieces work in parallel. The
//!    ring finishes (post-op) each reduced shard before it travels back;
//! 3. intra-node all-gather, direct: each owner sends its pieces to the
//!    other local ranks.
//!
//! With one node this is a direct reduce-scatter plus all-gather; with one
//! rank per node it is a plain ring.

use super::builder::Builder;
use super::generate::{Group, Topology};
use super::plan::{BufRange, Rank, CHANNELS};
use super::ring;

/// See the module docs. `input` may equal `output`.
pub(crate) fn allreduce(
    b: &mut Builder,
    topo: &Topology,
    rank: Rank,
    input: BufRange,
    output: BufRange,
    post: bool,
) {
    let nodes = topo.nodes();
    let Some(my_node) = nodes.iter().position(|l| l.contains(&rank)) else {
        return;
    };
    let local = &nodes[my_node];
    let m = local.len();
    let li = local.iter().position(|&r| r == rank).unwrap_or(0);
    let pieces = nodes.iter().map(Vec::len).max().unwrap_or(1);
    let piece = |b: &Builder, r: BufRange, j: usize| b.part(r, pieces, j);
    let owner = |j: usize| j % m;
    // 1. Intra-node reduce-scatter.
    for j in 0..pieces {
        if owner(j) != li {
            b.send(local[owner(j)], 0, piece(b, input, j));
        }
    }
    for j in (0..pieces).filter(|&j| owner(j) == li) {
        let dst = piece(b, output, j);
        let mut src = piece(b, input, j);
        for (k, &peer) in local.iter().enumerate() {
            if k != li {
                b.recv_reduce(peer, 0, src, dst);
                src = dst;
            }
        }
        b.copy(src, dst);
    }
    // 2. Inter-node ring per owned piece.
    for j in (0..pieces).filter(|&j| owner(j) == li) {
        let ranks: Vec<Rank> = nodes.iter().map(|l| l[j % l.len()]).collect();
        let g = Group { ranks, me: my_node };
        let dst = piece(b, output, j);
        ring::allreduce(b, &g, dst, dst, (j % usize::from(CHANNELS)) as u8, post);
    }
    // 3. Intra-node all-gather.
    for j in 0..pieces {
        let dst = piece(b, output, j);
        if owner(j) == li {
            for (k, &peer) in local.iter().enumerate() {
                if k != li {
                    b.send(peer, 0, dst);
                }
            }
        } else {
            b.recv(local[owner(j)], 0, dst);
        }
    }
}
