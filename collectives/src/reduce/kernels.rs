//! Element-wise loops over byte slices, one monomorphised copy per element
//! type and operation so that the compiler can vectorise them.
//!
//! Every loop has two paths: when all slices are aligned for the element
//! type, they are viewed as typed slices (`bytemuck`) and zipped; otherwise
//! elements are read with unaligned loads (`pod_read_unaligned`) and written
//! back byte-wise. Both give identical results.

use bytemuck::Pod;

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

macro_rules! narrow_float_arith {
    ($name:ident, $t:ty, $dec:path, $enc:path) => {
        pub(crate) struct $name;
        impl Arith for $name {
            type T = $t;
            #[inline(always)]
            fn sum(a: $t, b: $t) -> $t {
                $enc($dec(a) + $dec(b))
            }
            #[inline(always)]
            fn prod(a: $t, b: $t) -> $t {
                $enc($dec(a) * $dec(b))
            }
            #[inline(always)]
            fn max(a: $t, b: $t) -> $t {
                $enc($dec(a).max($dec(b)))
            }
            #[inline(always)]
            fn min(a: $t, b: $t) -> $t {
                $enc($dec(a).min($dec(b)))
            }
            #[inline(always)]
            fn mul(a: $t, s: $t) -> $t {
                $enc($dec(a) * $dec(s))
            }
            #[inline(always)]
            fn div(a: $t, _n: u64) -> $t {
                a
            }
        }
    };
}

narrow_float_arith!(F16, u16, narrow::f16_to_f32, narrow::f32_to_f16);
narrow_float_arith!(BF16, u16, narrow::bf16_to_f32, narrow::f32_to_bf16);
narrow_float_arith!(E4M3, u8, narrow::e4m3_to_f32, narrow::f32_to_e4m3_via_f16);
narrow_float_arith!(E5M2, u8, narrow::e5m2_to_f32, narrow::f32_to_e5m2_via_f16);

#[inline(always)]
fn load<T: Pod>(b: &[u8]) -> T {
    bytemuck::pod_read_unaligned(b)
}

#[inline(always)]
fn store<T: Pod>(b: &mut [u8], v: T) {
    b.copy_from_slice(bytemuck::bytes_of(&v));
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
            for (d, s) in dst.chunks_exact_mut(n).zip(src.chunks_exact(n)) {
                let v = f(load(d), load(s));
                store(d, v);
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
