//! NCCL element types and reduction operations as nccl-tests names them, and
//! the bit-level conversions the data generator needs.

/// An `ncclDataType_t`, with nccl-tests' names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    /// `ncclInt8`.
    Int8,
    /// `ncclUint8`.
    Uint8,
    /// `ncclInt32`.
    Int32,
    /// `ncclUint32`.
    Uint32,
    /// `ncclInt64`.
    Int64,
    /// `ncclUint64`.
    Uint64,
    /// `ncclFloat16`.
    Half,
    /// `ncclFloat32`.
    Float,
    /// `ncclFloat64`.
    Double,
    /// `ncclBfloat16`.
    Bf16,
    /// `ncclFloat8e4m3`.
    F8E4M3,
    /// `ncclFloat8e5m2`.
    F8E5M2,
}

impl DType {
    /// Every type, in nccl-tests' order (which is also `ncclDataType_t` order).
    pub const ALL: [DType; 12] = [
        DType::Int8,
        DType::Uint8,
        DType::Int32,
        DType::Uint32,
        DType::Int64,
        DType::Uint64,
        DType::Half,
        DType::Float,
        DType::Double,
        DType::Bf16,
        DType::F8E4M3,
        DType::F8E5M2,
    ];

    /// The `ncclDataType_t` value.
    pub fn nccl(self) -> i32 {
        self as i32
    }

    /// Bytes per element (`wordSize` in nccl-tests).
    pub fn size(self) -> usize {
        match self {
            DType::Int8 | DType::Uint8 | DType::F8E4M3 | DType::F8E5M2 => 1,
            DType::Half | DType::Bf16 => 2,
            DType::Int32 | DType::Uint32 | DType::Float => 4,
            DType::Int64 | DType::Uint64 | DType::Double => 8,
        }
    }

    /// The name nccl-tests prints in the `type` column and accepts after `-d`.
    pub fn name(self) -> &'static str {
        match self {
            DType::Int8 => "int8",
            DType::Uint8 => "uint8",
            DType::Int32 => "int32",
            DType::Uint32 => "uint32",
            DType::Int64 => "int64",
            DType::Uint64 => "uint64",
            DType::Half => "half",
            DType::Float => "float",
            DType::Double => "double",
            DType::Bf16 => "bfloat16",
            DType::F8E4M3 => "f8e4m3",
            DType::F8E5M2 => "f8e5m2",
        }
    }

    /// Parses a `-d` value (nccl-tests' names, plus NCCL's own aliases).
    pub fn from_name(s: &str) -> Option<DType> {
        let t = match s {
            "int8" | "char" => DType::Int8,
            "uint8" => DType::Uint8,
            "int32" | "int" => DType::Int32,
            "uint32" => DType::Uint32,
            "int64" => DType::Int64,
            "uint64" => DType::Uint64,
            "half" | "float16" => DType::Half,
            "float" | "float32" => DType::Float,
            "double" | "float64" => DType::Double,
            "bfloat16" | "bf16" => DType::Bf16,
            "f8e4m3" | "float8e4m3" => DType::F8E4M3,
            "f8e5m2" | "float8e5m2" => DType::F8E5M2,
            _ => return None,
        };
        Some(t)
    }

    /// The first NCCL version (`ncclGetVersion` code) that knows this type.
    pub fn min_version(self) -> i32 {
        match self {
            DType::Bf16 => 21000,
            DType::F8E4M3 | DType::F8E5M2 => 22400,
            _ => 0,
        }
    }

    /// Floating-point types (everything but the six integer types).
    pub fn is_float(self) -> bool {
        matches!(
            self,
            DType::Half
                | DType::Float
                | DType::Double
                | DType::Bf16
                | DType::F8E4M3
                | DType::F8E5M2
        )
    }

    /// Signed integer types.
    pub fn is_signed_int(self) -> bool {
        matches!(self, DType::Int8 | DType::Int32 | DType::Int64)
    }

    /// Explicit mantissa bits of a float type (0 for integers).
    pub fn mantissa_bits(self) -> u32 {
        match self {
            DType::Half => 10,
            DType::Float => 23,
            DType::Double => 52,
            DType::Bf16 => 7,
            DType::F8E4M3 => 3,
            DType::F8E5M2 => 2,
            _ => 0,
        }
    }

    /// Exponent bits of a float type (0 for integers).
    pub fn exponent_bits(self) -> u32 {
        match self {
            DType::Half => 5,
            DType::Float => 8,
            DType::Double => 11,
            DType::Bf16 => 8,
            DType::F8E4M3 => 4,
            DType::F8E5M2 => 5,
            _ => 0,
        }
    }

    /// Mask of the element's bits inside a `u64`.
    pub fn mask(self) -> u64 {
        if self.size() == 8 {
            u64::MAX
        } else {
            (1u64 << (8 * self.size())) - 1
        }
    }

    /// The value of float bits `bits` (exact).
    pub fn to_f64(self, bits: u64) -> f64 {
        match self {
            DType::Half => half::f16::from_bits(bits as u16).to_f64(),
            DType::Float => f32::from_bits(bits as u32) as f64,
            DType::Double => f64::from_bits(bits),
            DType::Bf16 => half::bf16::from_bits(bits as u16).to_f64(),
            DType::F8E4M3 => float8::F8E4M3::from_bits(bits as u8).to_f64(),
            DType::F8E5M2 => float8::F8E5M2::from_bits(bits as u8).to_f64(),
            _ => panic!("to_f64 on integer type {}", self.name()),
        }
    }

    /// `v` rounded to this float type, as bits.
    pub fn from_f64(self, v: f64) -> u64 {
        match self {
            DType::Half => half::f16::from_f64(v).to_bits() as u64,
            DType::Float => (v as f32).to_bits() as u64,
            DType::Double => v.to_bits(),
            DType::Bf16 => half::bf16::from_f64(v).to_bits() as u64,
            DType::F8E4M3 => float8::F8E4M3::from_f64(v).to_bits() as u64,
            DType::F8E5M2 => float8::F8E5M2::from_f64(v).to_bits() as u64,
            _ => panic!("from_f64 on integer type {}", self.name()),
        }
    }

    /// Integer bits as a sign- or zero-extended `i128` (integers only).
    pub fn int_value(self, bits: u64) -> i128 {
        match self {
            DType::Int8 => bits as u8 as i8 as i128,
            DType::Int32 => bits as u32 as i32 as i128,
            DType::Int64 => bits as i64 as i128,
            _ => (bits & self.mask()) as i128,
        }
    }

    /// Reads element `i` of a little-endian buffer.
    pub fn load(self, buf: &[u8], i: usize) -> u64 {
        let s = self.size();
        let mut b = [0u8; 8];
        b[..s].copy_from_slice(&buf[i * s..(i + 1) * s]);
        u64::from_le_bytes(b)
    }

    /// Writes element `i` of a little-endian buffer.
    pub fn store(self, buf: &mut [u8], i: usize, bits: u64) {
        let s = self.size();
        buf[i * s..(i + 1) * s].copy_from_slice(&bits.to_le_bytes()[..s]);
    }
}

/// A reduction as nccl-tests' `-o` names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Op {
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
    /// `ncclRedOpCreatePreMulSum` with a per-rank host scalar (1 on even
    /// ranks, 2 on odd ones, as nccl-tests' `ncclVerifiablePremulScalar`).
    MulSum,
}

impl Op {
    /// Every op, in nccl-tests' order.
    pub const ALL: [Op; 6] = [Op::Sum, Op::Prod, Op::Max, Op::Min, Op::Avg, Op::MulSum];

    /// The name in the `redop` column.
    pub fn name(self) -> &'static str {
        match self {
            Op::Sum => "sum",
            Op::Prod => "prod",
            Op::Max => "max",
            Op::Min => "min",
            Op::Avg => "avg",
            Op::MulSum => "mulsum",
        }
    }

    /// Parses a `-o` value.
    pub fn from_name(s: &str) -> Option<Op> {
        Op::ALL.into_iter().find(|o| o.name() == s)
    }

    /// The built-in `ncclRedOp_t`, or `None` for the premul-sum op that must
    /// be created per communicator.
    pub fn nccl(self) -> Option<i32> {
        match self {
            Op::Sum => Some(0),
            Op::Prod => Some(1),
            Op::Max => Some(2),
            Op::Min => Some(3),
            Op::Avg => Some(4),
            Op::MulSum => None,
        }
    }

    /// The first NCCL version that has this op.
    pub fn min_version(self) -> i32 {
        match self {
            Op::Avg => 21000,
            Op::MulSum => 21100,
            _ => 0,
        }
    }
}

/// The premul-sum scalar of `rank` (1 or 2), as `dt` bits.
pub fn premul_scalar(dt: DType, rank: usize) -> u64 {
    let v = if rank % 2 == 0 { 1 } else { 2 };
    if dt.is_float() {
        dt.from_f64(v as f64)
    } else {
        v
    }
}
