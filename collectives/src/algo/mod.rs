//! Sans-IO collective schedules, their selection, and an in-process
//! simulator.
//!
//! A collective call on one rank becomes a [`Plan`]: a list of [`Step`]s
//! (send, receive, receive-and-reduce, copy, reduce, pre-op, post-op) over
//! byte ranges of the send, receive and scratch buffers, each with the
//! earlier steps it depends on. [`generate`] is a pure function of the call's
//! arguments, the algorithm, the rank and the [`Topology`]; [`select`] picks
//! the algorithm from an α-β [`CostModel`] and an `NCCL_ALGO`-style
//! [`AlgoFilter`]; [`sim`] runs every rank's plan over real buffers and checks
//! the matching contract, and [`timing`] replays them on an α-β link model
//! to measure how well they pipeline. The vocabulary, the contract and each schedule are
//! described in `docs/algorithms.md`.

mod builder;
mod direct;
mod filter;
mod generate;
mod halving;
mod hier;
mod plan;
mod ring;
mod select;
pub mod sim;
pub mod timing;
mod tree;

pub use filter::{AlgoFilter, FilterError};
pub use generate::{
    generate, supported, Chunking, PlanArgs, PlanError, Topology, DEFAULT_PIECE_BYTES,
};
pub use plan::{BufId, BufRange, Plan, PlanCheckError, Rank, Step, StepId, StepKind, CHANNELS};
pub use select::{
    estimate_us, select, selection_table, selection_table_with, CostModel, LinkClass, LinkCost,
    NoAlgorithm, RowChoice,
};

use std::fmt;

/// The collective operations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Collective {
    /// `ncclAllReduce`.
    AllReduce,
    /// `ncclBroadcast`.
    Broadcast,
    /// `ncclReduce`.
    Reduce,
    /// `ncclAllGather`.
    AllGather,
    /// `ncclReduceScatter`.
    ReduceScatter,
    /// `ncclAlltoAll`.
    AlltoAll,
    /// `ncclGather`.
    Gather,
    /// `ncclScatter`.
    Scatter,
    /// `ncclSend` to a peer.
    Send,
    /// `ncclRecv` from a peer.
    Recv,
}

impl Collective {
    /// Every collective.
    pub const ALL: [Collective; 10] = [
        Self::AllReduce,
        Self::Broadcast,
        Self::Reduce,
        Self::AllGather,
        Self::ReduceScatter,
        Self::AlltoAll,
        Self::Gather,
        Self::Scatter,
        Self::Send,
        Self::Recv,
    ];

    /// Whether the collective reduces (uses the op).
    pub const fn reduces(self) -> bool {
        matches!(self, Self::AllReduce | Self::Reduce | Self::ReduceScatter)
    }

    /// Whether the collective has a root.
    pub const fn rooted(self) -> bool {
        matches!(
            self,
            Self::Broadcast | Self::Reduce | Self::Gather | Self::Scatter
        )
    }

    /// The name as NCCL's `NCCL_ALGO` per-function syntax spells it, in
    /// lower case (`allreduce`, `reducescatter`, ...).
    pub const fn name(self) -> &'static str {
        match self {
            Self::AllReduce => "allreduce",
            Self::Broadcast => "broadcast",
            Self::Reduce => "reduce",
            Self::AllGather => "allgather",
            Self::ReduceScatter => "reducescatter",
            Self::AlltoAll => "alltoall",
            Self::Gather => "gather",
            Self::Scatter => "scatter",
            Self::Send => "send",
            Self::Recv => "recv",
        }
    }
}

impl fmt::Display for Collective {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The algorithms.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Algorithm {
    /// Ring (chain for rooted collectives), chunked and pipelined.
    Ring,
    /// Double binary tree (one tree for rooted collectives), pipelined.
    Tree,
    /// One step: everybody talks to everybody (or to the root) directly.
    Direct,
    /// Recursive halving (reduce-scatter) then doubling (all-gather).
    HalvingDoubling,
    /// Intra-node reduce-scatter, inter-node ring per shard, intra-node
    /// all-gather.
    Hierarchical,
    /// Pairwise exchange: step `s` sends to `rank+s`, receives from `rank-s`.
    Pairwise,
}

impl Algorithm {
    /// Every algorithm.
    pub const ALL: [Algorithm; 6] = [
        Self::Ring,
        Self::Tree,
        Self::Direct,
        Self::HalvingDoubling,
        Self::Hierarchical,
        Self::Pairwise,
    ];

    /// The name used in tables and accepted by `NCCL_ALGO`.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Ring => "Ring",
            Self::Tree => "Tree",
            Self::Direct => "Direct",
            Self::HalvingDoubling => "HalvingDoubling",
            Self::Hierarchical => "Hierarchical",
            Self::Pairwise => "Pairwise",
        }
    }
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
