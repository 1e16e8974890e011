//! `ncclDataType_t`.

/// The C type: a raw `int` enum.
#[allow(non_camel_case_types)]
pub type ncclDataType_t = i32;

/// NCCL's element types, with the values of `nccl.h`.
#[repr(i32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DataType {
    /// `ncclInt8` (also `ncclChar`).
    Int8 = 0,
    /// `ncclUint8`.
    Uint8 = 1,
    /// `ncclInt32` (also `ncclInt`).
    Int32 = 2,
    /// `ncclUint32`.
    Uint32 = 3,
    /// `ncclInt64`.
    Int64 = 4,
    /// `ncclUint64`.
    Uint64 = 5,
    /// `ncclFloat16` (also `ncclHalf`).
    Float16 = 6,
    /// `ncclFloat32` (also `ncclFloat`).
    Float32 = 7,
    /// `ncclFloat64` (also `ncclDouble`).
    Float64 = 8,
    /// `ncclBfloat16`.
    Bfloat16 = 9,
    /// `ncclFloat8e4m3`.
    Float8e4m3 = 10,
    /// `ncclFloat8e5m2`.
    Float8e5m2 = 11,
}

/// `ncclNumTypes`.
pub const NCCL_NUM_TYPES: i32 = 12;

impl DataType {
    /// Every type, in value order.
    pub const ALL: [DataType; 12] = [
        Self::Int8,
        Self::Uint8,
        Self::Int32,
        Self::Uint32,
        Self::Int64,
        Self::Uint64,
        Self::Float16,
        Self::Float32,
        Self::Float64,
        Self::Bfloat16,
        Self::Float8e4m3,
        Self::Float8e5m2,
    ];

    /// Bytes per element.
    pub const fn size(self) -> usize {
        match self {
            Self::Int8 | Self::Uint8 | Self::Float8e4m3 | Self::Float8e5m2 => 1,
            Self::Float16 | Self::Bfloat16 => 2,
            Self::Int32 | Self::Uint32 | Self::Float32 => 4,
            Self::Int64 | Self::Uint64 | Self::Float64 => 8,
        }
    }

    /// The name nccl-tests prints (`float`, `bfloat16`, ...).
    pub const fn name(self) -> &'static str {
        match self {
            Self::Int8 => "int8",
            Self::Uint8 => "uint8",
            Self::Int32 => "int32",
            Self::Uint32 => "uint32",
            Self::Int64 => "int64",
            Self::Uint64 => "uint64",
            Self::Float16 => "half",
            Self::Float32 => "float",
            Self::Float64 => "double",
            Self::Bfloat16 => "bfloat16",
            Self::Float8e4m3 => "f8e4m3",
            Self::Float8e5m2 => "f8e5m2",
        }
    }

    /// Whether the type is a floating-point type.
    pub const fn is_float(self) -> bool {
        matches!(
            self,
            Self::Float16
                | Self::Float32
                | Self::Float64
                | Self::Bfloat16
                | Self::Float8e4m3
                | Self::Float8e5m2
        )
    }

    /// `count` elements in bytes, or `None` on overflow.
    pub const fn bytes(self, count: usize) -> Option<usize> {
        count.checked_mul(self.size())
    }
}

impl TryFrom<i32> for DataType {
    type Error = i32;
    fn try_from(v: i32) -> Result<Self, i32> {
        Self::ALL
            .get(usize::try_from(v).map_err(|_| v)?)
            .copied()
            .ok_or(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conversions() {
        for (i, t) in DataType::ALL.iter().enumerate() {
            assert_eq!(DataType::try_from(i as i32), Ok(*t));
        }
        assert!(DataType::try_from(NCCL_NUM_TYPES).is_err());
        assert!(DataType::try_from(-3).is_err());
        assert_eq!(DataType::Float64.bytes(usize::MAX), None);
        assert_eq!(DataType::Bfloat16.bytes(3), Some(6));
    }
}
