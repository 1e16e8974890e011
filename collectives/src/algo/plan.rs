//! The step vocabulary of a per-rank plan, and its static checks.
//!
//! See `docs/algorithms.md` for the matching contract between plans.

use std::fmt;

use hetccl_abi::DataType;
use hetccl_core::config::Compression;

use super::{Algorithm, Collective};
use crate::reduce::ReduceOp;

/// A rank number within the communicator.
pub type Rank = u32;

/// Plans use message channels `0..CHANNELS` only, so an executor can open a
/// fixed number of connections (or tags) per peer.
pub const CHANNELS: u8 = 2;

/// Index of a step within its plan.
pub type StepId = u32;

/// The buffers a plan addresses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum BufId {
    /// The user's send buffer (read only).
    Send,
    /// The user's receive buffer.
    Recv,
    /// Scratch memory the executor allocates: [`Plan::scratch_bytes`] bytes.
    Scratch,
    /// Memory named by its address: the range's offset is the address
    /// (exposed by the call that passed it). Only the plans of a group's
    /// point-to-point runs use it, one caller buffer per step; generated
    /// plans never do.
    Addr,
}

/// A byte range of one buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BufRange {
    /// Which buffer.
    pub buf: BufId,
    /// Offset in bytes from the buffer's start.
    pub offset: usize,
    /// Length in bytes.
    pub len: usize,
}

impl BufRange {
    /// A range.
    pub const fn new(buf: BufId, offset: usize, len: usize) -> Self {
        Self { buf, offset, len }
    }

    /// One past the last byte.
    pub const fn end(&self) -> usize {
        self.offset + self.len
    }

    /// The sub-range `[off, off+len)` relative to this range's start.
    pub const fn sub(&self, off: usize, len: usize) -> Self {
        Self {
            buf: self.buf,
            offset: self.offset + off,
            len,
        }
    }

    /// Whether the two ranges share at least one byte.
    pub fn overlaps(&self, other: &BufRange) -> bool {
        self.buf == other.buf
            && self.len > 0
            && other.len > 0
            && self.offset < other.end()
            && other.offset < self.end()
    }

    /// Whether `other` lies entirely inside this range.
    pub fn covers(&self, other: &BufRange) -> bool {
        self.buf == other.buf && self.offset <= other.offset && other.end() <= self.end()
    }
}

/// What a step does. Messages are matched per (sender, receiver, channel)
/// in plan order: the k-th `Send` to a peer on a channel is the k-th
/// `Recv`/`RecvReduce` from this rank on that channel in the peer's plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StepKind {
    /// Send the bytes of `src` to `peer` on channel `chan`. Complete when
    /// `src` may be overwritten.
    Send {
        /// The receiving rank.
        peer: Rank,
        /// The channel (an independent FIFO between the same two ranks).
        chan: u8,
        /// The bytes to send.
        src: BufRange,
    },
    /// Receive the next message from `peer` on `chan` into `dst`; the
    /// message's length must equal `dst.len`.
    Recv {
        /// The sending rank.
        peer: Rank,
        /// The channel.
        chan: u8,
        /// Where the message lands.
        dst: BufRange,
    },
    /// Receive the next message from `peer` on `chan` into transport
    /// staging, then `dst = local ⊕ message` (the plan's combine op).
    /// `local` and `dst` are equal or disjoint.
    RecvReduce {
        /// The sending rank.
        peer: Rank,
        /// The channel.
        chan: u8,
        /// The local operand.
        local: BufRange,
        /// The result.
        dst: BufRange,
    },
    /// `dst = src`; disjoint ranges of equal length.
    Copy {
        /// Source.
        src: BufRange,
        /// Destination.
        dst: BufRange,
    },
    /// `dst = a ⊕ b`; `dst` equals or is disjoint from each operand.
    Reduce {
        /// First operand.
        a: BufRange,
        /// Second operand.
        b: BufRange,
        /// Result.
        dst: BufRange,
    },
    /// `dst = pre(src)`: the op's pre-multiplication (PreMulSum, float
    /// Avg); disjoint ranges of equal length.
    PreOp {
        /// Source (the user's input).
        src: BufRange,
        /// Destination.
        dst: BufRange,
    },
    /// `buf = post(buf)`: the op's post-op (integer Avg division); on
    /// plans with a compressed wire ([`Plan::wire`]), also the rounding of
    /// a finished result to the wire's precision.
    PostOp {
        /// The final result to finish.
        buf: BufRange,
    },
}

impl StepKind {
    /// The ranges the step reads.
    pub fn reads(&self) -> [Option<BufRange>; 2] {
        match *self {
            Self::Send { src, .. } | Self::Copy { src, .. } | Self::PreOp { src, .. } => {
                [Some(src), None]
            }
            Self::Recv { .. } => [None, None],
            Self::RecvReduce { local, .. } => [Some(local), None],
            Self::Reduce { a, b, .. } => [Some(a), Some(b)],
            Self::PostOp { buf } => [Some(buf), None],
        }
    }

    /// The range the step writes, if any.
    pub fn writes(&self) -> Option<BufRange> {
        match *self {
            Self::Send { .. } => None,
            Self::Recv { dst, .. }
            | Self::RecvReduce { dst, .. }
            | Self::Copy { dst, .. }
            | Self::Reduce { dst, .. }
            | Self::PreOp { dst, .. } => Some(dst),
            Self::PostOp { buf } => Some(buf),
        }
    }

    /// `(peer, chan, is_send)` for the message steps.
    pub fn message(&self) -> Option<(Rank, u8, bool)> {
        match *self {
            Self::Send { peer, chan, .. } => Some((peer, chan, true)),
            Self::Recv { peer, chan, .. } | Self::RecvReduce { peer, chan, .. } => {
                Some((peer, chan, false))
            }
            _ => None,
        }
    }

    /// The message length for message steps.
    pub fn message_len(&self) -> Option<usize> {
        match *self {
            Self::Send { src, .. } => Some(src.len),
            Self::Recv { dst, .. } | Self::RecvReduce { dst, .. } => Some(dst.len),
            _ => None,
        }
    }
}

/// One step and the earlier steps it waits for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    /// What to do.
    pub kind: StepKind,
    /// Indices of earlier steps that must be complete first (ascending).
    pub deps: Vec<StepId>,
}

/// One rank's schedule for one collective call.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// The collective.
    pub collective: Collective,
    /// The algorithm that produced it.
    pub algorithm: Algorithm,
    /// This rank.
    pub rank: Rank,
    /// Ranks in the communicator.
    pub nranks: u32,
    /// Element type.
    pub dtype: DataType,
    /// Reduction op (meaningful for reducing collectives; `Sum` otherwise).
    pub op: ReduceOp,
    /// Bytes the plan may touch in the send buffer.
    pub send_bytes: usize,
    /// Bytes the plan may touch in the receive buffer.
    pub recv_bytes: usize,
    /// Scratch bytes the executor must provide.
    pub scratch_bytes: usize,
    /// The steps, in a valid sequential order.
    pub steps: Vec<Step>,
    /// How messages to ranks on other nodes travel (`reduce::wire`):
    /// `Off` except for float sum/avg reductions on a communicator with
    /// compression on. Then each `PostOp` also rounds its range to the
    /// wire's precision, so that every rank ends with the same result.
    pub wire: Compression,
}

/// Why a plan failed its static checks.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanCheckError {
    /// A dependency points at the step itself or later.
    #[error("step {step}: dependency {dep} is not an earlier step")]
    ForwardDep {
        /// The step.
        step: StepId,
        /// The bad dependency.
        dep: StepId,
    },
    /// A range is outside its buffer or ragged.
    #[error("step {step}: range {range:?} is outside its buffer or not whole elements")]
    BadRange {
        /// The step.
        step: StepId,
        /// The range.
        range: BufRange,
    },
    /// Operands of different lengths, or partially overlapping ones.
    #[error("step {step}: operands differ in length or partially overlap")]
    BadOperands {
        /// The step.
        step: StepId,
    },
    /// A message on a channel at or above [`CHANNELS`].
    #[error("step {step}: channel {chan} is not below {CHANNELS}", CHANNELS = CHANNELS)]
    BadChannel {
        /// The step.
        step: StepId,
        /// The channel.
        chan: u8,
    },
    /// A message to or from this rank itself or a rank out of range.
    #[error("step {step}: bad peer {peer}")]
    BadPeer {
        /// The step.
        step: StepId,
        /// The peer.
        peer: Rank,
    },
}

impl Plan {
    /// The size of a buffer as the plan declares it.
    pub fn buffer_bytes(&self, buf: BufId) -> usize {
        match buf {
            BufId::Send => self.send_bytes,
            BufId::Recv => self.recv_bytes,
            BufId::Scratch => self.scratch_bytes,
            // Each call's range was checked when it was made.
            BufId::Addr => usize::MAX,
        }
    }

    /// Number of message steps (sends plus receives).
    pub fn message_count(&self) -> usize {
        self.steps
            .iter()
            .filter(|s| s.kind.message().is_some())
            .count()
    }

    /// Checks dependencies, ranges, operands and peers.
    pub fn validate(&self) -> Result<(), PlanCheckError> {
        let esize = self.dtype.size();
        for (i, s) in self.steps.iter().enumerate() {
            let step = i as StepId;
            if let Some(&dep) = s.deps.iter().find(|&&d| d >= step) {
                return Err(PlanCheckError::ForwardDep { step, dep });
            }
            let k = &s.kind;
            for range in k.reads().into_iter().flatten().chain(k.writes()) {
                if range.end() > self.buffer_bytes(range.buf) || range.len % esize != 0 {
                    return Err(PlanCheckError::BadRange { step, range });
                }
            }
            let ok = |x: &BufRange, y: &BufRange| x.len == y.len && (x == y || !x.overlaps(y));
            let disjoint = |x: &BufRange, y: &BufRange| x.len == y.len && !x.overlaps(y);
            let good = match k {
                StepKind::RecvReduce { local, dst, .. } => ok(local, dst),
                StepKind::Reduce { a, b, dst } => ok(a, dst) && ok(b, dst) && a.len == b.len,
                StepKind::Copy { src, dst } | StepKind::PreOp { src, dst } => disjoint(src, dst),
                _ => true,
            };
            if !good {
                return Err(PlanCheckError::BadOperands { step });
            }
            if let Some((peer, chan, _)) = k.message() {
                if peer == self.rank || peer >= self.nranks {
                    return Err(PlanCheckError::BadPeer { step, peer });
                }
                if chan >= CHANNELS {
                    return Err(PlanCheckError::BadChannel { step, chan });
                }
            }
        }
        Ok(())
    }
}

impl fmt::Display for BufRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = match self.buf {
            BufId::Send => "send",
            BufId::Recv => "recv",
            BufId::Scratch => "scratch",
            BufId::Addr => "addr",
        };
        write!(f, "{b}[{}..{}]", self.offset, self.end())
    }
}

impl fmt::Display for StepKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Send { peer, chan, src } => write!(f, "send {src} -> {peer}/{chan}"),
            Self::Recv { peer, chan, dst } => write!(f, "recv {dst} <- {peer}/{chan}"),
            Self::RecvReduce {
                peer,
                chan,
                local,
                dst,
            } => write!(f, "recv-reduce {dst} = {local} + <- {peer}/{chan}"),
            Self::Copy { src, dst } => write!(f, "copy {dst} = {src}"),
            Self::Reduce { a, b, dst } => write!(f, "reduce {dst} = {a} + {b}"),
            Self::PreOp { src, dst } => write!(f, "pre-op {dst} = pre({src})"),
            Self::PostOp { buf } => write!(f, "post-op {buf}"),
        }
    }
}

impl fmt::Display for Plan {
    /// One line per step: index, what, and dependencies (`peer/chan` names
    /// a lane).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "# {} {} rank {}/{} {} {:?}: send {} B, recv {} B, scratch {} B",
            self.collective,
            self.algorithm,
            self.rank,
            self.nranks,
            self.dtype.name(),
            self.op,
            self.send_bytes,
            self.recv_bytes,
            self.scratch_bytes
        )?;
        if self.wire != Compression::Off {
            writeln!(f, "# wire between nodes: {}", self.wire)?;
        }
        for (i, s) in self.steps.iter().enumerate() {
            write!(f, "{i:>5}: {}", s.kind)?;
            if !s.deps.is_empty() {
                write!(f, "  after {:?}", s.deps)?;
            }
            writeln!(f)?;
        }
        Ok(())
    }
}
