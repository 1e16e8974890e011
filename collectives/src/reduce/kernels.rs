//! Element-wise loops over byte slices, one monomorphised copy per element
//! type and operation so that the compiler can vectorise them.
//!
//! Every loop has two paths: when all slices are aligned for the element
//! type, they are viewed as typed slices (`bytemuck`) and zipped; otherwise
//! elements are read with unaligned loads (`pod_read_unaligned`) and written
//! back byte-wise. Both give identical results.

use bytemuck::Pod;
use half::f16;
use half::slice::{HalfBitsSliceExt, HalfFloatSliceExt};

use super::narrow;

/// The arithmetic of one element type: the four combining operations, the
/// pre-op multiply, and the post-op division (integers only).
pub(crate) trait Arith {
    /// The storage type (the float types' bits for the narrow formats).
    type T: Pod;
    /// `a + b` (wrapping for integers).
    fn sum(a: Self::T, b: Self::T) -> Self::T;
    /// `a * b` (wrapping for integers).
    fn prod(a: Self::T, b: Self::T) -> Self::T;
    /// The larger; for floats a NaN operand loses to a number (`fmaxf`).
    fn max(a: Self::T, b: Self::T) -> Self::T;
    /// The smaller; for floats a NaN operand loses to a number (`fminf`).
    fn min(a: Self::T, b: Self::T) -> Self::T;
    /// `a * scalar`, rounded like NCCL's pre-op.
    fn mul(a: Self::T, s: Self::T) -> Self::T;
    /// Truncating division by `n` (integers); identity for floats.
    fn div(a: Self::T, n: u64) -> Self::T;
}

macro_rules! int_arith {
    ($name:ident, $t:ty) => {
        pub(crate) struct $name;
        impl Arith for $name {
            type T = $t;
            #[inline(always)]
            fn sum(a: $t, b: $t) -> $t {
                a.wrapping_add(b)
            }
            #[inline(always)]
            fn prod(a: $t, b: $t) -> $t {
                a.wrapping_mul(b)
            }
            #[inline(always)]
            fn max(a: $t, b: $t) -> $t {
                if a > b {
                    a
                } else {
                    b
                }
            }
            #[inline(always)]
            fn min(a: $t, b: $t) -> $t {
                if a < b {
                    a
                } else {
                    b
                }
            }
            #[inline(always)]
            fn mul(a: $t, s: $t) -> $t {
                a.wrapping_mul(s)
            }
            #[inline(always)]
            fn div(a: $t, n: u64) -> $t {
                // n is a rank count (>= 1) and fits every type's range only
                // for unsigned 64-bit; compare in i128 to stay exact.
                let q = (a as i128) / (n.max(1) as i128);
                q as $t
            }
        }
    };
}

int_arith!(I8, i8);
int_arith!(U8, u8);
int_arith!(I32, i32);
int_arith!(U32, u32);
int_arith!(I64, i64);
int_arith!(U64, u64);

macro_rules! wide_float_arith {
    ($name:ident, $t:ty) => {
        pub(crate) struct $name;
        impl Arith for $name {
            type T = $t;
            #[inline(always)]
            fn sum(a: $t, b: $t) -> $t {
                a + b
            }
            #[inline(always)]
            fn prod(a: $t, b: $t) -> $t {
                a * b
            }
            #[inline(always)]
            fn max(a: $t, b: $t) -> $t {
                a.max(b)
            }
            #[inline(always)]
            fn min(a: $t, b: $t) -> $t {
                a.min(b)
            }
            #[inline(always)]
            fn mul(a: $t, s: $t) -> $t {
                a * s
            }
            #[inline(always)]
            fn div(a: $t, _n: u64) -> $t {
                a
            }
        }
    };
}

wide_float_arith!(F32, f32);
wide_float_arith!(F64, f64);

/// A narrow float format, handled in blocks: decoded to f32 (exactly),
/// combined in f32, and rounded back once per element.
pub(crate) trait Narrow {
    /// Bytes per element.
    const SIZE: usize;
    /// Decodes `out.len()` elements from `b`.
    fn decode(b: &[u8], out: &mut [f32]);
    /// Encodes `v` into `out` (`v.len()` elements), rounding as NCCL does.
    fn encode(v: &[f32], out: &mut [u8]);
}

/// Elements per block of the narrow-float loops.
const BLK: usize = 256;

/// Copies 16-bit elements from bytes into an aligned buffer.
fn bits16(b: &[u8], out: &mut [u16]) {
    let n = 2 * out.len();
    bytemuck::cast_slice_mut::<u16, u8>(out).copy_from_slice(&b[..n]);
}

pub(crate) struct F16;
impl Narrow for F16 {
    const SIZE: usize = 2;
    fn decode(b: &[u8], out: &mut [f32]) {
        let mut bits = [0u16; BLK];
        let bits = &mut bits[..out.len()];
        bits16(b, bits);
        bits.reinterpret_cast::<f16>().convert_to_f32_slice(out);
    }
    fn encode(v: &[f32], out: &mut [u8]) {
        let mut h = [f16::ZERO; BLK];
        let h = &mut h[..v.len()];
        h.convert_from_f32_slice(v);
        out.copy_from_slice(bytemuck::cast_slice::<u16, u8>(h.reinterpret_cast()));
    }
}

pub(crate) struct BF16;
impl Narrow for BF16 {
    const SIZE: usize = 2;
    fn decode(b: &[u8], out: &mut [f32]) {
        let mut bits = [0u16; BLK];
        let bits = &mut bits[..out.len()];
        bits16(b, bits);
        for (o, &x) in out.iter_mut().zip(bits.iter()) {
            *o = f32::from_bits(u32::from(x) << 16);
        }
    }
    fn encode(v: &[f32], out: &mut [u8]) {
        let mut bits = [0u16; BLK];
        let bits = &mut bits[..v.len()];
        for (o, &x) in bits.iter_mut().zip(v) {
            *o = narrow::f32_to_bf16_bits(x);
        }
        out.copy_from_slice(bytemuck::cast_slice::<u16, u8>(bits));
    }
}

macro_rules! fp8 {
    ($name:ident, $dec:path, $enc:path) => {
        pub(crate) struct $name;
        impl Narrow for $name {
            const SIZE: usize = 1;
            fn decode(b: &[u8], out: &mut [f32]) {
                for (o, &x) in out.iter_mut().zip(b) {
                    *o = $dec(x);
                }
            }
            fn encode(v: &[f32], out: &mut [u8]) {
                // NCCL's fp8 arithmetic runs in half precision: round to
                // f16 first, then to fp8.
                let mut h = [f16::ZERO; BLK];
                let h = &mut h[..v.len()];
                h.convert_from_f32_slice(v);
                for (o, &x) in out.iter_mut().zip(HalfFloatSliceExt::reinterpret_cast(&*h)) {
                    *o = $enc(x);
                }
            }
        }
    };
}

fp8!(E4M3, narrow::e4m3_to_f32, narrow::f16_to_e4m3);
fp8!(E5M2, narrow::e5m2_to_f32, narrow::f16_to_e5m2);

/// `dst[i] = f(dst[i], src[i])` on a narrow format.
pub(crate) fn narrow_zip2<N: Narrow>(dst: &mut [u8], src: &[u8], f: impl Fn(f32, f32) -> f32) {
    let (mut x, mut y) = ([0f32; BLK], [0f32; BLK]);
    let step = BLK * N::SIZE;
    for (d, s) in dst.chunks_mut(step).zip(src.chunks(step)) {
        let k = d.len() / N::SIZE;
        N::decode(d, &mut x[..k]);
        N::decode(s, &mut y[..k]);
        for (x, y) in x[..k].iter_mut().zip(&y[..k]) {
            *x = f(*x, *y);
        }
        N::encode(&x[..k], d);
    }
}

/// `dst[i] = f(a[i], b[i])` on a narrow format.
pub(crate) fn narrow_zip3<N: Narrow>(
    dst: &mut [u8],
    a: &[u8],
    b: &[u8],
    f: impl Fn(f32, f32) -> f32,
) {
    let (mut x, mut y) = ([0f32; BLK], [0f32; BLK]);
    let step = BLK * N::SIZE;
    for ((d, a), b) in dst.chunks_mut(step).zip(a.chunks(step)).zip(b.chunks(step)) {
        let k = d.len() / N::SIZE;
        N::decode(a, &mut x[..k]);
        N::decode(b, &mut y[..k]);
        for (x, y) in x[..k].iter_mut().zip(&y[..k]) {
            *x = f(*x, *y);
        }
        N::encode(&x[..k], d);
    }
}

/// `dst[i] = f(src[i])` on a narrow format.
pub(crate) fn narrow_map2<N: Narrow>(dst: &mut [u8], src: &[u8], f: impl Fn(f32) -> f32) {
    let mut x = [0f32; BLK];
    let step = BLK * N::SIZE;
    for (d, s) in dst.chunks_mut(step).zip(src.chunks(step)) {
        let k = d.len() / N::SIZE;
        N::decode(s, &mut x[..k]);
        for x in x[..k].iter_mut() {
            *x = f(*x);
        }
        N::encode(&x[..k], d);
    }
}

#[inline(always)]
fn load<T: Pod>(b: &[u8]) -> T {
    bytemuck::pod_read_unaligned(b)
}

#[inline(always)]
fn store<T: Pod>(b: &mut [u8], v: T) {
    b.copy_from_slice(bytemuck::bytes_of(&v));
}

/// Elements per block of the unaligned wide-type loops.
const WBLK: usize = 64;

/// Copies elements from possibly misaligned bytes into an aligned array.
#[inline(always)]
fn unaligned_in<T: Pod>(b: &[u8], out: &mut [T]) {
    let n = std::mem::size_of_val(out);
    bytemuck::cast_slice_mut::<T, u8>(out).copy_from_slice(&b[..n]);
}

/// `dst[i] = f(dst[i], src[i])`. Lengths are checked by the caller.
#[inline(always)]
pub(crate) fn zip2<T: Pod>(dst: &mut [u8], src: &[u8], f: impl Fn(T, T) -> T) {
    let n = std::mem::size_of::<T>();
    match (
        bytemuck::try_cast_slice_mut::<u8, T>(dst),
        bytemuck::try_cast_slice::<u8, T>(src),
    ) {
        (Ok(d), Ok(s)) => {
            for (d, s) in d.iter_mut().zip(s) {
                *d = f(*d, *s);
            }
        }
        _ => {
            let (mut x, mut y) = ([T::zeroed(); WBLK], [T::zeroed(); WBLK]);
            for (d, s) in dst.chunks_mut(WBLK * n).zip(src.chunks(WBLK * n)) {
                let k = d.len() / n;
                unaligned_in(d, &mut x[..k]);
                unaligned_in(s, &mut y[..k]);
                for (x, y) in x[..k].iter_mut().zip(&y[..k]) {
                    *x = f(*x, *y);
                }
                d.copy_from_slice(bytemuck::cast_slice(&x[..k]));
            }
        }
    }
}

/// `dst[i] = f(a[i], b[i])`. Lengths are checked by the caller.
#[inline(always)]
pub(crate) fn zip3<T: Pod>(dst: &mut [u8], a: &[u8], b: &[u8], f: impl Fn(T, T) -> T) {
    let n = std::mem::size_of::<T>();
    match (
        bytemuck::try_cast_slice_mut::<u8, T>(dst),
        bytemuck::try_cast_slice::<u8, T>(a),
        bytemuck::try_cast_slice::<u8, T>(b),
    ) {
        (Ok(d), Ok(a), Ok(b)) => {
            for ((d, a), b) in d.iter_mut().zip(a).zip(b) {
                *d = f(*a, *b);
            }
        }
        _ => {
            let it = dst
                .chunks_exact_mut(n)
                .zip(a.chunks_exact(n))
                .zip(b.chunks_exact(n));
            for ((d, a), b) in it {
                store(d, f(load(a), load(b)));
            }
        }
    }
}

/// `dst[i] = f(src[i])`. Lengths are checked by the caller.
#[inline(always)]
pub(crate) fn map2<T: Pod>(dst: &mut [u8], src: &[u8], f: impl Fn(T) -> T) {
    let n = std::mem::size_of::<T>();
    match (
        bytemuck::try_cast_slice_mut::<u8, T>(dst),
        bytemuck::try_cast_slice::<u8, T>(src),
    ) {
        (Ok(d), Ok(s)) => {
            for (d, s) in d.iter_mut().zip(s) {
                *d = f(*s);
            }
        }
        _ => {
            for (d, s) in dst.chunks_exact_mut(n).zip(src.chunks_exact(n)) {
                store(d, f(load(s)));
            }
        }
    }
}

/// `buf[i] = f(buf[i])`.
#[inline(always)]
pub(crate) fn map1<T: Pod>(buf: &mut [u8], f: impl Fn(T) -> T) {
    let n = std::mem::size_of::<T>();
    match bytemuck::try_cast_slice_mut::<u8, T>(buf) {
        Ok(b) => {
            for x in b.iter_mut() {
                *x = f(*x);
            }
        }
        Err(_) => {
            for d in buf.chunks_exact_mut(n) {
                let v = f(load(d));
                store(d, v);
            }
        }
    }
}

/// Reads one element of type `A::T` from little-endian bytes (a scalar).
pub(crate) fn scalar_of<A: Arith>(raw: &[u8; 8]) -> A::T {
    load(&raw[..std::mem::size_of::<A::T>()])
}
