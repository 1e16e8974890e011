//! Reduction kernels on host memory: every NCCL datatype × every NCCL op.
//!
//! A reduction has up to three parts, as in NCCL's device code:
//! - a **pre-op** applied once to each rank's own input before it enters the
//!   reduction: multiply by a scalar ([`ReduceOp::PreMulSum`], and
//!   [`ReduceOp::Avg`] on float types, whose scalar is `1/nranks` rounded to
//!   the datatype — NCCL's `ncclDevPreMulSum`);
//! - the **combine**, a commutative binary op: sum, prod, max or min (both
//!   PreMulSum and Avg combine by sum);
//! - a **post-op** applied once to the final result: truncating integer
//!   division by `nranks` for [`ReduceOp::Avg`] on integer types (NCCL's
//!   `ncclDevSumPostDiv`).
//!
//! Semantics (matching NCCL): integer sum and product wrap; float max/min
//! return the non-NaN operand when exactly one is NaN (`fmaxf`/`fminf`,
//! `__hmax`); float16 and bfloat16 results are rounded once to the type (to
//! nearest even); fp8 results are rounded to float16 and then to fp8 with
//! saturation to the largest finite value (see [`narrow`]).
//!
//! Slices may be misaligned and of any element count; aligned slices take a
//! typed fast path that the compiler vectorises.

mod fold;
mod kernels;
pub mod narrow;
pub mod wire;
mod wire_fast;

pub use fold::{fold_tiles, TILE};
use hetccl_abi::{DataType, RedOp};
use kernels::{Arith, Narrow};

/// A scalar of some datatype, kept as its little-endian bytes (the first
/// `DataType::size()` bytes are meaningful, the rest are zero).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Scalar {
    raw: [u8; 8],
}

impl Scalar {
    /// The scalar whose value is the first `dt.size()` bytes of `bytes`
    /// (native little-endian layout, as `ncclRedOpCreatePreMulSum` receives
    /// it). `None` when `bytes` is too short.
    pub fn from_bytes(dt: DataType, bytes: &[u8]) -> Option<Self> {
        let n = dt.size();
        let mut raw = [0u8; 8];
        raw[..n].copy_from_slice(bytes.get(..n)?);
        Some(Self { raw })
    }

    /// `v` converted to `dt`: floats round to nearest even (fp8 saturates),
    /// integers truncate toward zero and wrap.
    pub fn from_f64(dt: DataType, v: f64) -> Self {
        let mut raw = [0u8; 8];
        match dt {
            DataType::Int8 => raw[0] = (v as i64) as i8 as u8,
            DataType::Uint8 => raw[0] = (v as i64) as u8,
            DataType::Int32 => raw[..4].copy_from_slice(&((v as i64) as i32).to_le_bytes()),
            DataType::Uint32 => raw[..4].copy_from_slice(&((v as i64) as u32).to_le_bytes()),
            DataType::Int64 => raw.copy_from_slice(&(v as i64).to_le_bytes()),
            DataType::Uint64 => raw.copy_from_slice(&(v as u64).to_le_bytes()),
            DataType::Float16 => {
                raw[..2].copy_from_slice(&half::f16::from_f64(v).to_bits().to_le_bytes())
            }
            DataType::Bfloat16 => {
                raw[..2].copy_from_slice(&half::bf16::from_f64(v).to_bits().to_le_bytes())
            }
            DataType::Float32 => raw[..4].copy_from_slice(&(v as f32).to_le_bytes()),
            DataType::Float64 => raw.copy_from_slice(&v.to_le_bytes()),
            DataType::Float8e4m3 => raw[0] = float8::F8E4M3::from_f64(v).to_bits(),
            DataType::Float8e5m2 => raw[0] = float8::F8E5M2::from_f64(v).to_bits(),
        }
        Self { raw }
    }

    /// The scalar's bytes for `dt` (`dt.size()` of them).
    pub fn bytes(&self, dt: DataType) -> &[u8] {
        &self.raw[..dt.size()]
    }

    /// `1/nranks` in `dt`, computed as NCCL's host code does for `ncclAvg`:
    /// `1.0/n` in double, then `float(...)`, then the datatype's
    /// round-to-nearest conversion (double directly for float64).
    pub fn avg_scale(dt: DataType, nranks: u32) -> Self {
        let inv = 1.0f64 / f64::from(nranks.max(1));
        match dt {
            DataType::Float64 => Self::from_f64(dt, inv),
            DataType::Float16 => {
                Self::from_f64(dt, f64::from(half::f16::from_f32(inv as f32).to_f32()))
            }
            DataType::Bfloat16 => {
                Self::from_f64(dt, f64::from(half::bf16::from_f32(inv as f32).to_f32()))
            }
            DataType::Float8e4m3 => Self {
                raw: [narrow::f32_to_e4m3(inv as f32), 0, 0, 0, 0, 0, 0, 0],
            },
            DataType::Float8e5m2 => Self {
                raw: [narrow::f32_to_e5m2(inv as f32), 0, 0, 0, 0, 0, 0, 0],
            },
            _ => Self::from_f64(dt, f64::from(inv as f32)),
        }
    }
}

/// A reduction operation as hetccl runs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    /// `ncclSum`.
    Sum,
    /// `ncclProd`.
    Prod,
    /// `ncclMax`.
    Max,
    /// `ncclMin`.
    Min,
    /// `ncclAvg`: pre-multiply by `1/nranks` for floats, sum, then (integers
    /// only) divide by `nranks` truncating toward zero.
    Avg,
    /// An op from `ncclRedOpCreatePreMulSum`: each input is multiplied by the
    /// scalar (of the reduction's datatype), then summed.
    PreMulSum(Scalar),
}

/// The combining binary operation of a [`ReduceOp`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Combine {
    /// Addition.
    Sum,
    /// Multiplication.
    Prod,
    /// Maximum.
    Max,
    /// Minimum.
    Min,
}

/// Why a kernel refused its arguments.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ReduceError {
    /// The slices' lengths differ.
    #[error("slice lengths differ: {0} and {1} bytes")]
    LengthMismatch(usize, usize),
    /// A length is not a whole number of elements.
    #[error("{len} bytes is not a whole number of {size}-byte elements")]
    Ragged {
        /// The length in bytes.
        len: usize,
        /// The element size.
        size: usize,
    },
}

impl ReduceOp {
    /// The op for an NCCL `RedOp`; `premul` gives the scalar of a dynamic
    /// (PreMulSum) op and is ignored for the built-in ones. `None` for a
    /// dynamic op without a scalar.
    pub fn from_redop(op: RedOp, premul: Option<Scalar>) -> Option<Self> {
        Some(match op {
            RedOp::Sum => Self::Sum,
            RedOp::Prod => Self::Prod,
            RedOp::Max => Self::Max,
            RedOp::Min => Self::Min,
            RedOp::Avg => Self::Avg,
            RedOp::Dynamic(_) => Self::PreMulSum(premul?),
        })
    }

    /// The binary combine.
    pub fn combine(self) -> Combine {
        match self {
            Self::Sum | Self::Avg | Self::PreMulSum(_) => Combine::Sum,
            Self::Prod => Combine::Prod,
            Self::Max => Combine::Max,
            Self::Min => Combine::Min,
        }
    }

    /// The pre-op scalar for `dt` on a communicator of `nranks`, if the op
    /// pre-multiplies its inputs.
    pub fn pre_scalar(self, dt: DataType, nranks: u32) -> Option<Scalar> {
        match self {
            Self::PreMulSum(s) => Some(s),
            Self::Avg if dt.is_float() => Some(Scalar::avg_scale(dt, nranks)),
            _ => None,
        }
    }

    /// Whether the op has a pre-op on `dt`.
    pub fn has_pre_op(self, dt: DataType) -> bool {
        matches!(self, Self::PreMulSum(_)) || (self == Self::Avg && dt.is_float())
    }

    /// Whether the op has a post-op on `dt` (integer Avg).
    pub fn has_post_op(self, dt: DataType) -> bool {
        self == Self::Avg && !dt.is_float()
    }
}

fn check(dt: DataType, a: usize, b: usize) -> Result<(), ReduceError> {
    if a != b {
        return Err(ReduceError::LengthMismatch(a, b));
    }
    let size = dt.size();
    if a % size != 0 {
        return Err(ReduceError::Ragged { len: a, size });
    }
    Ok(())
}

/// Dispatches on `$dt`: `$wide` runs with `$A` bound to the `Arith` type of
/// integer and f32/f64 types, `$narrow` with `$N` bound to the `Narrow`
/// type of the 16- and 8-bit floats.
macro_rules! dispatch {
    ($dt:expr, $A:ident => $wide:expr, $N:ident => $narrow:expr) => {
        match $dt {
            DataType::Int8 => {
                type $A = kernels::I8;
                $wide
            }
            DataType::Uint8 => {
                type $A = kernels::U8;
                $wide
            }
            DataType::Int32 => {
                type $A = kernels::I32;
                $wide
            }
            DataType::Uint32 => {
                type $A = kernels::U32;
                $wide
            }
            DataType::Int64 => {
                type $A = kernels::I64;
                $wide
            }
            DataType::Uint64 => {
                type $A = kernels::U64;
                $wide
            }
            DataType::Float32 => {
                type $A = kernels::F32;
                $wide
            }
            DataType::Float64 => {
                type $A = kernels::F64;
                $wide
            }
            DataType::Float16 => {
                type $N = kernels::F16;
                $narrow
            }
            DataType::Bfloat16 => {
                type $N = kernels::BF16;
                $narrow
            }
            DataType::Float8e4m3 => {
                type $N = kernels::E4M3;
                $narrow
            }
            DataType::Float8e5m2 => {
                type $N = kernels::E5M2;
                $narrow
            }
        }
    };
}

#[inline(always)]
fn zip2_for<A: Arith>(c: Combine, dst: &mut [u8], src: &[u8]) {
    match c {
        Combine::Sum => kernels::zip2::<A::T>(dst, src, A::sum),
        Combine::Prod => kernels::zip2::<A::T>(dst, src, A::prod),
        Combine::Max => kernels::zip2::<A::T>(dst, src, A::max),
        Combine::Min => kernels::zip2::<A::T>(dst, src, A::min),
    }
}

#[inline(always)]
fn zip3_for<A: Arith>(c: Combine, dst: &mut [u8], a: &[u8], b: &[u8]) {
    match c {
        Combine::Sum => kernels::zip3::<A::T>(dst, a, b, A::sum),
        Combine::Prod => kernels::zip3::<A::T>(dst, a, b, A::prod),
        Combine::Max => kernels::zip3::<A::T>(dst, a, b, A::max),
        Combine::Min => kernels::zip3::<A::T>(dst, a, b, A::min),
    }
}

#[inline(always)]
fn narrow_zip2_for<N: Narrow>(c: Combine, dst: &mut [u8], src: &[u8]) {
    match c {
        Combine::Sum => kernels::narrow_zip2::<N>(dst, src, |a, b| a + b),
        Combine::Prod => kernels::narrow_zip2::<N>(dst, src, |a, b| a * b),
        Combine::Max => kernels::narrow_zip2::<N>(dst, src, f32::max),
        Combine::Min => kernels::narrow_zip2::<N>(dst, src, f32::min),
    }
}

#[inline(always)]
fn narrow_zip3_for<N: Narrow>(c: Combine, dst: &mut [u8], a: &[u8], b: &[u8]) {
    match c {
        Combine::Sum => kernels::narrow_zip3::<N>(dst, a, b, |a, b| a + b),
        Combine::Prod => kernels::narrow_zip3::<N>(dst, a, b, |a, b| a * b),
        Combine::Max => kernels::narrow_zip3::<N>(dst, a, b, f32::max),
        Combine::Min => kernels::narrow_zip3::<N>(dst, a, b, f32::min),
    }
}

/// A narrow-format scalar decoded to f32 (exact).
fn narrow_scalar<N: Narrow>(s: &Scalar) -> f32 {
    let mut v = [0f32; 1];
    N::decode(&s.raw[..N::SIZE], &mut v);
    v[0]
}

/// `dst = dst ⊕ src` element-wise, where ⊕ is `op`'s combine (the pre- and
/// post-ops are not applied: see [`pre_op`] and [`post_op`]).
pub fn reduce_into(
    dst: &mut [u8],
    src: &[u8],
    dt: DataType,
    op: ReduceOp,
) -> Result<(), ReduceError> {
    check(dt, dst.len(), src.len())?;
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2.
        unsafe { avx2::reduce_into(dst, src, dt, op) };
        return Ok(());
    }
    reduce_into_body(dst, src, dt, op);
    Ok(())
}

#[inline(always)]
fn reduce_into_body(dst: &mut [u8], src: &[u8], dt: DataType, op: ReduceOp) {
    let c = op.combine();
    dispatch!(dt, A => zip2_for::<A>(c, dst, src), N => narrow_zip2_for::<N>(c, dst, src));
}

#[inline(always)]
fn reduce3_body(dst: &mut [u8], a: &[u8], b: &[u8], dt: DataType, op: ReduceOp) {
    let c = op.combine();
    dispatch!(dt, A => zip3_for::<A>(c, dst, a, b), N => narrow_zip3_for::<N>(c, dst, a, b));
}

/// The same kernels compiled for AVX2 (256-bit vectors), picked at run
/// time: the element-wise operations are the same IEEE operations, so the
/// results are bit-identical to the baseline build.
#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::*;

    /// [`super::reduce_into`] after its checks.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn reduce_into(dst: &mut [u8], src: &[u8], dt: DataType, op: ReduceOp) {
        reduce_into_body(dst, src, dt, op)
    }

    /// [`super::reduce3`] after its checks.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn reduce3(dst: &mut [u8], a: &[u8], b: &[u8], dt: DataType, op: ReduceOp) {
        reduce3_body(dst, a, b, dt, op)
    }
}

/// `dst = a ⊕ b` element-wise (the fused form for reduce-then-send steps).
pub fn reduce3(
    dst: &mut [u8],
    a: &[u8],
    b: &[u8],
    dt: DataType,
    op: ReduceOp,
) -> Result<(), ReduceError> {
    check(dt, dst.len(), a.len())?;
    check(dt, a.len(), b.len())?;
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2.
        unsafe { avx2::reduce3(dst, a, b, dt, op) };
        return Ok(());
    }
    reduce3_body(dst, a, b, dt, op);
    Ok(())
}

/// `dst = src * scalar` in `dt`'s arithmetic (wrapping for integers;
/// rounded once to the type for floats, as NCCL's PreMulSum pre-op).
fn scale_into(dst: &mut [u8], src: &[u8], dt: DataType, scalar: Scalar) {
    dispatch!(dt, A => {
        let s = kernels::scalar_of::<A>(&scalar.raw);
        kernels::map2::<<A as Arith>::T>(dst, src, |x| A::mul(x, s));
    }, N => {
        let s = narrow_scalar::<N>(&scalar);
        kernels::narrow_map2::<N>(dst, src, |x| x * s);
    });
}

/// `buf[i] *= scalar` in `dt`'s arithmetic (wrapping for integers; rounded
/// as NCCL's PreMulSum pre-op for floats).
pub fn scale(buf: &mut [u8], dt: DataType, scalar: Scalar) -> Result<(), ReduceError> {
    check(dt, buf.len(), buf.len())?;
    let src = buf.to_vec();
    scale_into(buf, &src, dt, scalar);
    Ok(())
}

/// `dst = pre(src)`: `src` multiplied by `op`'s pre-op scalar, or copied
/// when `op` has no pre-op on `dt`.
pub fn pre_op(
    dst: &mut [u8],
    src: &[u8],
    dt: DataType,
    op: ReduceOp,
    nranks: u32,
) -> Result<(), ReduceError> {
    check(dt, dst.len(), src.len())?;
    match op.pre_scalar(dt, nranks) {
        None => dst.copy_from_slice(src),
        Some(scalar) => scale_into(dst, src, dt, scalar),
    }
    Ok(())
}

/// Applies `op`'s post-op to a final result in place: integer division by
/// `nranks` (truncating toward zero) for integer Avg; nothing otherwise.
pub fn post_op(buf: &mut [u8], dt: DataType, op: ReduceOp, nranks: u32) -> Result<(), ReduceError> {
    if op.has_post_op(dt) {
        finalize_avg(buf, dt, nranks)?;
    }
    Ok(())
}

/// The end of `ncclAvg`: on integer types, divides each element by `nranks`
/// truncating toward zero (signed types by magnitude, as NCCL's
/// `FuncSumPostDiv`). Float types were already scaled by `1/nranks` in the
/// pre-op, so this leaves them unchanged.
pub fn finalize_avg(buf: &mut [u8], dt: DataType, nranks: u32) -> Result<(), ReduceError> {
    check(dt, buf.len(), buf.len())?;
    if dt.is_float() {
        return Ok(());
    }
    let n = u64::from(nranks.max(1));
    dispatch!(dt, A => kernels::map1::<<A as Arith>::T>(buf, |x| A::div(x, n)), N => {
        let _ = std::marker::PhantomData::<N>;
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn misaligned_f32_sum() {
        let a: Vec<u8> = (0..41u32).flat_map(|i| (i as f32).to_le_bytes()).collect();
        let mut dst = vec![0u8; a.len() + 1];
        dst[1..].copy_from_slice(&a);
        let src = a.clone();
        reduce_into(&mut dst[1..], &src, DataType::Float32, ReduceOp::Sum).unwrap();
        for i in 0..41 {
            let b = &dst[1 + 4 * i..5 + 4 * i];
            assert_eq!(f32::from_le_bytes(b.try_into().unwrap()), 2.0 * i as f32);
        }
    }

    #[test]
    fn errors() {
        let mut d = [0u8; 4];
        assert_eq!(
            reduce_into(&mut d, &[0u8; 3], DataType::Int8, ReduceOp::Sum),
            Err(ReduceError::LengthMismatch(4, 3))
        );
        assert_eq!(
            reduce_into(&mut d[..3], &[0u8; 3], DataType::Int32, ReduceOp::Sum),
            Err(ReduceError::Ragged { len: 3, size: 4 })
        );
    }

    #[test]
    fn avg_scales() {
        assert_eq!(
            Scalar::avg_scale(DataType::Float32, 4).bytes(DataType::Float32),
            0.25f32.to_le_bytes()
        );
        assert_eq!(
            Scalar::avg_scale(DataType::Float8e4m3, 2).bytes(DataType::Float8e4m3),
            [0x30]
        );
        let mut v = (-7i8).to_le_bytes();
        finalize_avg(&mut v, DataType::Int8, 2).unwrap();
        assert_eq!(i8::from_le_bytes(v), -3);
    }
}
