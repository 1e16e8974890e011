//! The entry point: arguments, topology, and the dispatch to each
//! algorithm's generator.

use hetccl_abi::DataType;
use hetccl_core::config::Compression;

use super::builder::Builder;
use super::plan::{BufId, BufRange, Plan, Rank};
use super::{direct, halving, hier, ring, tree, Algorithm, Collective};
use crate::reduce::ReduceOp;
pub use crate::topo::Topology;

/// The arguments of one collective call, as NCCL takes them. Plans are
/// pure functions of these, the algorithm, the rank, the topology and the
/// chunking, all hashable, so an executor can cache them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PlanArgs {
    /// The collective.
    pub collective: Collective,
    /// NCCL's `count`: elements per rank buffer for AllReduce, Broadcast,
    /// Reduce, Send and Recv; the send count for AllGather and Gather; the
    /// receive count for ReduceScatter and Scatter; elements per peer for
    /// AlltoAll.
    pub count: usize,
    /// Element type.
    pub dtype: DataType,
    /// Reduction op (ignored by non-reducing collectives).
    pub op: ReduceOp,
    /// Root for rooted collectives; the peer for Send and Recv.
    pub root: Rank,
    /// In-place call with NCCL's aliasing: `sendbuff == recvbuff` for
    /// AllReduce, Broadcast and Reduce; `sendbuff == recvbuff +
    /// rank*count*size` for AllGather (and Gather at the root);
    /// `recvbuff == sendbuff + rank*count*size` for ReduceScatter (and
    /// Scatter at the root). In-place plans address the shared memory
    /// through one buffer id only, so their hazards are visible.
    pub in_place: bool,
    /// The communicator's wire compression. It applies only to float
    /// sum/avg AllReduce and ReduceScatter (`reduce::wire::eligible`) on a
    /// topology of several nodes; the plan's [`Plan::wire`] says whether it
    /// did.
    pub compress: Compression,
}

impl PlanArgs {
    /// Out-of-place arguments with op `Sum` and root 0.
    pub fn new(collective: Collective, count: usize, dtype: DataType) -> Self {
        Self {
            collective,
            count,
            dtype,
            op: ReduceOp::Sum,
            root: 0,
            in_place: false,
            compress: Compression::Off,
        }
    }
}

/// How data is cut into messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Chunking {
    /// Largest message in bytes (rounded down to whole elements, at least
    /// one element). Pipelined algorithms move each chunk independently.
    pub chunk_bytes: usize,
    /// Largest message of the one-step (direct) schedules, which cut their
    /// input into pieces so that each piece's reduction overlaps the next
    /// one's transfer (capped at `chunk_bytes`). Whoever runs the plans
    /// sets it to the largest message its links send without waiting for
    /// the receiver; it must be the same on every rank.
    pub piece_bytes: usize,
}

/// [`Chunking::piece_bytes`] unless set.
pub const DEFAULT_PIECE_BYTES: usize = 64 << 10;

impl Chunking {
    /// Chunks of `chunk_bytes`, with the default piece size.
    pub fn with_chunk(chunk_bytes: usize) -> Self {
        Self {
            chunk_bytes,
            ..Self::default()
        }
    }
}

impl Default for Chunking {
    fn default() -> Self {
        Self {
            chunk_bytes: 512 * 1024,
            piece_bytes: DEFAULT_PIECE_BYTES,
        }
    }
}

/// Why no plan could be made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    /// The rank is not below the communicator size (or the size is 0).
    #[error("rank {rank} is invalid for {nranks} ranks")]
    BadRank {
        /// The rank.
        rank: Rank,
        /// The communicator size.
        nranks: u32,
    },
    /// The root (or peer) is out of range.
    #[error("root or peer {0} is out of range")]
    BadRoot(Rank),
    /// The algorithm does not implement the collective.
    #[error("{algorithm} does not implement {collective}")]
    Unsupported {
        /// The collective.
        collective: Collective,
        /// The algorithm.
        algorithm: Algorithm,
    },
    /// The collective has no in-place form.
    #[error("{0} has no in-place form")]
    NoInPlace(Collective),
    /// Byte sizes overflow `usize`.
    #[error("buffer size overflows")]
    Overflow,
}

/// The algorithms that implement `coll`, in the order the selection table
/// lists them.
pub fn supported(coll: Collective) -> &'static [Algorithm] {
    use Algorithm::*;
    match coll {
        Collective::AllReduce => &[Ring, Tree, Direct, HalvingDoubling, Hierarchical],
        Collective::Broadcast | Collective::Reduce => &[Ring, Tree, Direct],
        Collective::AllGather | Collective::ReduceScatter => &[Ring, Direct],
        Collective::AlltoAll => &[Pairwise, Direct],
        Collective::Gather | Collective::Scatter | Collective::Send | Collective::Recv => &[Direct],
    }
}

/// A set of ranks taking part in a sub-schedule, and this rank's index.
#[derive(Debug, Clone)]
pub(crate) struct Group {
    /// Member ranks; index `i` is "group rank" `i`.
    pub ranks: Vec<Rank>,
    /// This rank's index in `ranks`.
    pub me: usize,
}

impl Group {
    /// The whole communicator.
    pub fn all(nranks: u32, rank: Rank) -> Self {
        Self {
            ranks: (0..nranks).collect(),
            me: rank as usize,
        }
    }

    /// Group size.
    pub fn n(&self) -> usize {
        self.ranks.len()
    }

    /// The global rank of group index `i` (taken modulo the size).
    pub fn at(&self, i: usize) -> Rank {
        self.ranks[i % self.ranks.len()]
    }

    /// Group index `me + d` modulo the size, for `d` possibly negative.
    pub fn rel(&self, d: isize) -> usize {
        let n = self.n() as isize;
        (((self.me as isize + d) % n + n) % n) as usize
    }
}

/// The input and output regions of a call on this rank.
pub(crate) struct Regions {
    pub input: BufRange,
    pub output: BufRange,
    pub send_bytes: usize,
    pub recv_bytes: usize,
}

fn regions(a: &PlanArgs, rank: Rank, n: usize) -> Result<Regions, PlanError> {
    use Collective::*;
    let b = a.dtype.bytes(a.count).ok_or(PlanError::Overflow)?;
    let nb = b.checked_mul(n).ok_or(PlanError::Overflow)?;
    let r = rank as usize;
    let root = rank == a.root;
    let s = |off, len| BufRange::new(BufId::Send, off, len);
    let v = |off, len| BufRange::new(BufId::Recv, off, len);
    let (input, output) = match (a.collective, a.in_place) {
        (AllReduce, false) | (Broadcast, false) => (s(0, b), v(0, b)),
        (AllReduce, true) | (Broadcast, true) => (v(0, b), v(0, b)),
        (Reduce, false) => (s(0, b), v(0, if root { b } else { 0 })),
        (Reduce, true) if root => (v(0, b), v(0, b)),
        (Reduce, true) => (s(0, b), v(0, 0)),
        (AllGather, false) => (s(0, b), v(0, nb)),
        (AllGather, true) => (v(r * b, b), v(0, nb)),
        (ReduceScatter, false) => (s(0, nb), v(0, b)),
        (ReduceScatter, true) => (s(0, nb), s(r * b, b)),
        (AlltoAll, false) => (s(0, nb), v(0, nb)),
        (AlltoAll, true) => return Err(PlanError::NoInPlace(AlltoAll)),
        (Gather, false) => (s(0, b), v(0, if root { nb } else { 0 })),
        (Gather, true) if root => (v(r * b, b), v(0, nb)),
        (Gather, true) => (s(0, b), v(0, 0)),
        (Scatter, false) => (s(0, if root { nb } else { 0 }), v(0, b)),
        (Scatter, true) if root => (s(0, nb), s(r * b, b)),
        (Scatter, true) => (s(0, 0), v(0, b)),
        (Send, _) => (s(0, b), v(0, 0)),
        (Recv, _) => (s(0, 0), v(0, b)),
    };
    let used = |id: BufId| {
        [input, output]
            .iter()
            .filter(|x| x.buf == id)
            .map(|x| x.end())
            .max()
            .unwrap_or(0)
    };
    Ok(Regions {
        input,
        output,
        send_bytes: used(BufId::Send),
        recv_bytes: used(BufId::Recv),
    })
}

/// The wire format of a call's messages between nodes: the communicator's
/// compression for float sum/avg AllReduce and ReduceScatter when the ranks
/// span several nodes, `Off` otherwise.
pub fn wire_format(
    args: &PlanArgs,
    coll: Collective,
    op: ReduceOp,
    topo: &Topology,
) -> Compression {
    let spans_nodes = (1..topo.nranks()).any(|r| !topo.same_node(0, r));
    let applies = matches!(coll, Collective::AllReduce | Collective::ReduceScatter)
        && crate::reduce::wire::eligible(args.compress, args.dtype, op)
        && spans_nodes;
    if applies {
        args.compress
    } else {
        Compression::Off
    }
}

/// This rank's plan for one call. Pure: the same arguments give the same
/// plan, and the plans of all ranks match each other (see
/// `docs/algorithms.md`).
pub fn generate(
    args: &PlanArgs,
    algorithm: Algorithm,
    rank: Rank,
    topo: &Topology,
    chunking: &Chunking,
) -> Result<Plan, PlanError> {
    let nranks = topo.nranks();
    if rank >= nranks {
        return Err(PlanError::BadRank { rank, nranks });
    }
    let coll = args.collective;
    if (coll.rooted() || matches!(coll, Collective::Send | Collective::Recv)) && args.root >= nranks
    {
        return Err(PlanError::BadRoot(args.root));
    }
    if matches!(coll, Collective::Send | Collective::Recv) && args.root == rank {
        return Err(PlanError::BadRoot(args.root));
    }
    if !supported(coll).contains(&algorithm) {
        return Err(PlanError::Unsupported {
            collective: coll,
            algorithm,
        });
    }
    let n = nranks as usize;
    let reg = regions(args, rank, n)?;
    let esize = args.dtype.size();
    let mut b = Builder::new(esize, chunking);
    let op = if coll.reduces() {
        args.op
    } else {
        ReduceOp::Sum
    };
    let post = op.has_post_op(args.dtype);
    let wire = wire_format(args, coll, op, topo);
    // With a compressed wire, every AllReduce result is rounded to the
    // wire's precision where it is finished, before it is distributed.
    b.round = wire != Compression::Off && coll == Collective::AllReduce;
    let mut input = reg.input;
    let output = reg.output;
    if coll.reduces() && op.has_pre_op(args.dtype) && input.len > 0 {
        // Scale the input once. Where the output is as large as the input
        // and separate from it, scale straight into the output and run the
        // schedule in place there (not for Direct, which would stage the
        // in-place input again); otherwise stage in scratch.
        let into_output = output.len == input.len
            && !output.overlaps(&input)
            && algorithm != Algorithm::Direct
            && matches!(coll, Collective::AllReduce | Collective::Reduce);
        let staged = if into_output {
            output
        } else {
            b.scratch(input.len)
        };
        b.pre(input, staged);
        input = staged;
    }
    let g = Group::all(nranks, rank);
    let root = args.root;
    match (coll, algorithm) {
        (Collective::AllReduce, Algorithm::Ring) => {
            ring::allreduce(&mut b, &g, input, output, 0, post)
        }
        (Collective::AllReduce, Algorithm::Tree) => {
            tree::allreduce(&mut b, &g, input, output, post)
        }
        (Collective::AllReduce, Algorithm::Direct) => {
            direct::allreduce(&mut b, &g, input, output, post)
        }
        (Collective::AllReduce, Algorithm::HalvingDoubling) => {
            halving::allreduce(&mut b, &g, input, output, post)
        }
        (Collective::AllReduce, Algorithm::Hierarchical) => {
            hier::allreduce(&mut b, topo, rank, input, output, post)
        }
        (Collective::AllReduce, Algorithm::Pairwise) => {
            return Err(PlanError::Unsupported {
                collective: coll,
                algorithm,
            })
        }
        (Collective::Broadcast, Algorithm::Ring) => {
            ring::broadcast(&mut b, &g, root, input, output)
        }
        (Collective::Broadcast, Algorithm::Tree) => {
            tree::broadcast(&mut b, &g, root, input, output)
        }
        (Collective::Broadcast, _) => direct::broadcast(&mut b, &g, root, input, output),
        (Collective::Reduce, Algorithm::Ring) => {
            ring::reduce(&mut b, &g, root, input, output, post)
        }
        (Collective::Reduce, Algorithm::Tree) => {
            tree::reduce(&mut b, &g, root, input, output, post)
        }
        (Collective::Reduce, _) => direct::reduce(&mut b, &g, root, input, output, post),
        (Collective::AllGather, Algorithm::Ring) => ring::allgather(&mut b, &g, input, output, 0),
        (Collective::AllGather, _) => direct::allgather(&mut b, &g, input, output),
        (Collective::ReduceScatter, Algorithm::Ring) => {
            ring::reduce_scatter(&mut b, &g, input, output, post)
        }
        (Collective::ReduceScatter, _) => direct::reduce_scatter(&mut b, &g, input, output, post),
        (Collective::AlltoAll, Algorithm::Pairwise) => {
            direct::alltoall(&mut b, &g, input, output, true)
        }
        (Collective::AlltoAll, _) => direct::alltoall(&mut b, &g, input, output, false),
        (Collective::Gather, _) => direct::gather(&mut b, &g, root, input, output),
        (Collective::Scatter, _) => direct::scatter(&mut b, &g, root, input, output),
        (Collective::Send, _) => b.send(root, 0, input),
        (Collective::Recv, _) => b.recv(root, 0, output),
    }
    let (steps, scratch_bytes) = b.finish();
    Ok(Plan {
        collective: coll,
        algorithm,
        rank,
        nranks,
        dtype: args.dtype,
        op,
        send_bytes: reg.send_bytes,
        recv_bytes: reg.recv_bytes,
        scratch_bytes,
        steps,
        wire,
    })
}
