//! Typed float32 ↔ bf16 loops for `wire` on aligned buffers, compiled for
//! AVX2 when the CPU has it (the same element operations as the portable
//! loops in `wire`, so the results are identical). Each function returns
//! `false`, doing nothing, when a buffer is not aligned for its type; the
//! caller then takes the portable loop.

use super::narrow::f32_to_bf16_bits;

#[inline(always)]
fn bf16(w: u16) -> f32 {
    f32::from_bits(u32::from(w) << 16)
}

/// Runs `f` in a function compiled for AVX2 when the CPU has it.
#[inline(always)]
fn simd(f: impl FnOnce()) {
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2.
        unsafe { avx2(f) };
        return;
    }
    f()
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn avx2(f: impl FnOnce()) {
    f()
}

fn f32s(b: &[u8]) -> Option<&[f32]> {
    bytemuck::try_cast_slice(b).ok()
}

fn f32s_mut(b: &mut [u8]) -> Option<&mut [f32]> {
    bytemuck::try_cast_slice_mut(b).ok()
}

fn u16s(b: &[u8]) -> Option<&[u16]> {
    bytemuck::try_cast_slice(b).ok()
}

/// `out = bf16(src)`.
pub(super) fn encode(src: &[u8], out: &mut [u8]) -> bool {
    let (Some(s), Ok(o)) = (f32s(src), bytemuck::try_cast_slice_mut::<u8, u16>(out)) else {
        return false;
    };
    simd(|| {
        for (o, &x) in o.iter_mut().zip(s) {
            *o = f32_to_bf16_bits(x).to_le();
        }
    });
    true
}

/// `dst = decode(w)`, `dst += decode(w)` (`add`, no `local`) or
/// `dst = local + decode(w)`.
pub(super) fn decode(w: &[u8], local: Option<&[u8]>, dst: &mut [u8], add: bool) -> bool {
    let (Some(w), Some(d)) = (u16s(w), f32s_mut(dst)) else {
        return false;
    };
    match (local, add) {
        (Some(l), true) => {
            let Some(l) = f32s(l) else {
                return false;
            };
            simd(|| {
                for ((d, &l), &w) in d.iter_mut().zip(l).zip(w) {
                    *d = l + bf16(u16::from_le(w));
                }
            });
        }
        (None, true) => simd(|| {
            for (d, &w) in d.iter_mut().zip(w) {
                *d += bf16(u16::from_le(w));
            }
        }),
        (_, false) => simd(|| {
            for (d, &w) in d.iter_mut().zip(w) {
                *d = bf16(u16::from_le(w));
            }
        }),
    }
    true
}

/// `buf = bf16(buf)` in place.
pub(super) fn round(buf: &mut [u8]) -> bool {
    let Some(b) = f32s_mut(buf) else {
        return false;
    };
    simd(|| {
        for x in b.iter_mut() {
            *x = bf16(f32_to_bf16_bits(*x));
        }
    });
    true
}
