//! What a rank passed to a direct operation, in two board words, so that
//! every rank can check that all ranks called the same operation before
//! anyone touches a peer's memory. NCCL requires the same kind, count,
//! datatype, op and root on every rank; a call that breaks this would
//! otherwise read past a peer's buffer (the larger count) and leave outputs
//! partly unwritten (the smaller).

use std::sync::atomic::{AtomicU64, Ordering};

use hetccl_abi::{DataType, RedOp};

use crate::algo::Collective;
use crate::error::Error;
use crate::launch::Call;

/// Marks a published shape (a zeroed board never reads as one).
const VALID: u64 = 1;

/// One rank's call, as every rank must pass it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    /// The collective.
    pub kind: Collective,
    /// NCCL's count (per rank, as the kind defines it).
    pub count: u64,
    /// The element type.
    pub dtype: DataType,
    /// The reduction (0 sum, 1 prod, 2 max, 3 min, 4 avg, 5 PreMulSum; 0 for
    /// kinds that do not reduce). PreMulSum scalars may differ per rank.
    pub op: u8,
    /// The root of rooted kinds, else 0.
    pub root: u32,
}

const OP_NAMES: [&str; 6] = ["sum", "prod", "max", "min", "avg", "premulsum"];

/// `nccl.h`'s names without the `nccl` prefix, in [`DataType::ALL`] order
/// (the size is in the name, which the mismatch messages need).
const DTYPE_NAMES: [&str; 12] = [
    "int8",
    "uint8",
    "int32",
    "uint32",
    "int64",
    "uint64",
    "float16",
    "float32",
    "float64",
    "bfloat16",
    "float8e4m3",
    "float8e5m2",
];

fn op_code(op: RedOp) -> u8 {
    match op {
        RedOp::Sum => 0,
        RedOp::Prod => 1,
        RedOp::Max => 2,
        RedOp::Min => 3,
        RedOp::Avg => 4,
        // Ops from ncclRedOpCreatePreMulSum: their handles and scalars may
        // differ per rank.
        RedOp::Dynamic(_) => 5,
    }
}

impl Shape {
    /// The shape of call `a`.
    pub fn of(a: &Call) -> Self {
        Self {
            kind: a.kind,
            count: a.count as u64,
            dtype: a.dtype,
            op: if a.kind.reduces() { op_code(a.op) } else { 0 },
            root: if a.kind.rooted() { a.root as u32 } else { 0 },
        }
    }

    /// The two board words.
    pub fn encode(&self) -> [u64; 2] {
        let kind = Collective::ALL
            .iter()
            .position(|&k| k == self.kind)
            .unwrap_or(0xff) as u64;
        [
            self.count,
            VALID
                | kind << 8
                | (self.dtype as u64) << 16
                | u64::from(self.op) << 24
                | u64::from(self.root) << 32,
        ]
    }

    /// Decodes [`Shape::encode`]'s words (`None`: not a shape).
    pub fn decode(w: [u64; 2]) -> Option<Self> {
        if w[1] & 0xff != VALID {
            return None;
        }
        let kind = *Collective::ALL.get((w[1] >> 8 & 0xff) as usize)?;
        let dtype = DataType::try_from((w[1] >> 16 & 0xff) as i32).ok()?;
        let op = (w[1] >> 24 & 0xff) as u8;
        if usize::from(op) >= OP_NAMES.len() {
            return None;
        }
        Some(Self {
            kind,
            count: w[0],
            dtype,
            op,
            root: (w[1] >> 32) as u32,
        })
    }

    /// Stores the shape in two board words (owner-written).
    pub fn store(&self, w: &[AtomicU64; 2]) {
        for (x, v) in w.iter().zip(self.encode()) {
            x.store(v, Ordering::Release);
        }
    }

    /// Loads two board words stored by [`Shape::store`].
    pub fn load(w: &[AtomicU64; 2]) -> [u64; 2] {
        [w[0].load(Ordering::Acquire), w[1].load(Ordering::Acquire)]
    }

    /// "AllReduce of 200000 float32 (sum)", "Broadcast of 10 int8 from root 1".
    pub fn describe(&self) -> String {
        let dtype = DTYPE_NAMES.get(self.dtype as usize).copied().unwrap_or("?");
        let mut s = format!("{:?} of {} {dtype}", self.kind, self.count);
        if self.kind.reduces() {
            s.push_str(&format!(" ({})", OP_NAMES[usize::from(self.op)]));
        }
        if self.kind.rooted() {
            s.push_str(&format!(" root {}", self.root));
        }
        s
    }
}

/// Describes published words, which may not be a shape at all.
pub fn describe_words(w: [u64; 2]) -> String {
    Shape::decode(w).map_or_else(
        || format!("an unreadable call ({:#x}, {:#x})", w[0], w[1]),
        |s| s.describe(),
    )
}

/// The error every rank returns when rank `k` passed `theirs` and rank `j`
/// passed `other` (`ncclInvalidUsage`).
pub fn disagree(path: &str, k: usize, theirs: [u64; 2], j: usize, other: [u64; 2]) -> Error {
    Error::usage(format!(
        "the ranks disagree on the operation ({path}): rank {k} passed {}, rank {j} passed {}; \
         every rank must pass the same kind, count, datatype, op and root",
        describe_words(theirs),
        describe_words(other)
    ))
}

/// The first rank whose words differ from rank 0's, among `n` ranks whose
/// words `get` returns, as the error [`disagree`] makes; `None` when all
/// agree.
pub fn check_all(path: &str, n: usize, get: impl Fn(usize) -> [u64; 2]) -> Option<Error> {
    let first = get(0);
    (1..n)
        .map(|k| (k, get(k)))
        .find(|&(_, w)| w != first)
        .map(|(k, w)| disagree(path, k, w, 0, first))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_round_trip_and_describe_themselves() {
        let s = Shape {
            kind: Collective::Broadcast,
            count: 200_000,
            dtype: DataType::Float32,
            op: 0,
            root: 3,
        };
        assert_eq!(Shape::decode(s.encode()), Some(s));
        assert_eq!(s.describe(), "Broadcast of 200000 float32 root 3");
        let r = Shape {
            kind: Collective::AllReduce,
            op: 2,
            root: 0,
            dtype: DataType::Float64,
            ..s
        };
        assert_eq!(r.describe(), "AllReduce of 200000 float64 (max)");
        assert_ne!(r.encode(), s.encode());
        assert_eq!(Shape::decode([0, 0]), None, "a zeroed board");
        assert_eq!(Shape::decode([1, VALID | 0xff << 8]), None);
        assert!(describe_words([7, 0]).contains("unreadable"));
    }

    #[test]
    fn the_first_disagreeing_rank_is_named() {
        let mk = |count| Shape {
            kind: Collective::AllReduce,
            count,
            dtype: DataType::Float32,
            op: 0,
            root: 0,
        };
        let words = [mk(100_000), mk(100_000), mk(200_000)].map(|s| s.encode());
        let e = check_all("single copy", 3, |k| words[k]).unwrap();
        let msg = e.to_string();
        assert!(matches!(e, Error::InvalidUsage(_)), "{msg}");
        assert!(
            msg.contains("rank 2 passed AllReduce of 200000 float32 (sum), rank 0 passed AllReduce of 100000 float32 (sum)"),
            "{msg}"
        );
        assert!(check_all("x", 2, |k| words[k]).is_none());
    }
}
