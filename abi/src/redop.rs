//! `ncclRedOp_t` and `ncclScalarResidence_t`.

/// The C type: a raw `int` enum. Values from [`NCCL_NUM_OPS`] to
/// [`NCCL_MAX_RED_OP`] are ids of ops made by `ncclRedOpCreatePreMulSum`.
#[allow(non_camel_case_types)]
pub type ncclRedOp_t = i32;

/// `ncclNumOps`: the number of built-in ops; the first dynamic op id.
pub const NCCL_NUM_OPS: i32 = 5;
/// `ncclMaxRedOp`: the largest valid op value.
pub const NCCL_MAX_RED_OP: i32 = 0x7fff_ffff;

/// A reduction op as NCCL sees it: built in, or a dynamic PreMulSum id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RedOp {
    /// `ncclSum`.
    Sum,
    /// `ncclProd`.
    Prod,
    /// `ncclMax`.
    Max,
    /// `ncclMin`.
    Min,
    /// `ncclAvg`.
    Avg,
    /// An op created by `ncclRedOpCreatePreMulSum`; its raw value.
    Dynamic(i32),
}

impl RedOp {
    /// The built-in ops, in value order.
    pub const BUILTIN: [RedOp; 5] = [Self::Sum, Self::Prod, Self::Max, Self::Min, Self::Avg];

    /// The raw C value.
    pub const fn raw(self) -> ncclRedOp_t {
        match self {
            Self::Sum => 0,
            Self::Prod => 1,
            Self::Max => 2,
            Self::Min => 3,
            Self::Avg => 4,
            Self::Dynamic(v) => v,
        }
    }

    /// The name nccl-tests prints.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Sum => "sum",
            Self::Prod => "prod",
            Self::Max => "max",
            Self::Min => "min",
            Self::Avg => "avg",
            Self::Dynamic(_) => "premulsum",
        }
    }
}

impl TryFrom<i32> for RedOp {
    type Error = i32;
    fn try_from(v: i32) -> Result<Self, i32> {
        match v {
            0..=4 => Ok(Self::BUILTIN[v as usize]),
            NCCL_NUM_OPS..=NCCL_MAX_RED_OP => Ok(Self::Dynamic(v)),
            _ => Err(v),
        }
    }
}

/// `ncclScalarResidence_t`: where a PreMulSum scalar lives.
#[repr(i32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ScalarResidence {
    /// `ncclScalarDevice`: device-visible memory, read when the collective runs.
    Device = 0,
    /// `ncclScalarHostImmediate`: host memory, read once at op creation.
    HostImmediate = 1,
}

impl TryFrom<i32> for ScalarResidence {
    type Error = i32;
    fn try_from(v: i32) -> Result<Self, i32> {
        match v {
            0 => Ok(Self::Device),
            1 => Ok(Self::HostImmediate),
            _ => Err(v),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conversions() {
        assert_eq!(RedOp::try_from(4), Ok(RedOp::Avg));
        assert_eq!(RedOp::try_from(5), Ok(RedOp::Dynamic(5)));
        assert_eq!(RedOp::try_from(-1), Err(-1));
        assert_eq!(ScalarResidence::try_from(2), Err(2));
        for op in RedOp::BUILTIN {
            assert_eq!(RedOp::try_from(op.raw()), Ok(op));
        }
    }
}
