//! Conversions for the narrow float formats: float16, bfloat16, and the two
//! fp8 formats.
//!
//! float16 and bfloat16 come from the `half` crate (round to nearest even,
//! overflow to infinity, NaN preserved). The fp8 formats come from the
//! `float8` crate, whose conversions follow CUDA's `cuda_fp8.hpp` with
//! `__NV_SATFINITE`: round to nearest even, out-of-range finite values *and
//! infinities* saturate to the largest finite value (448 for e4m3, 57344 for
//! e5m2), NaN stays NaN (e4m3 has no infinity; its NaN is `0x7f`/`0xff`).
//!
//! NCCL reduces fp8 in half precision (`__hadd`, `__hmul`, `__hmax` on
//! `__half`, then `__nv_fp8_e4m3(__half)`), so the result of one binary step
//! is "round to float16, then round to fp8". We reproduce that chain exactly:
//! the operation runs in f32 (exact for products of fp8 or f16 values; for
//! sums, rounding f32 then f16 equals rounding once to f16 because f32 has at
//! least 2·11+2 significand bits), then f32 → f16 → fp8.
//!
//! For speed, fp8 decoding uses a 256-entry table built at compile time from
//! the crate's `const fn` conversions, and f16 → fp8 encoding a 65536-entry
//! table per format built once on first use.

use std::sync::OnceLock;

use float8::{F8E4M3, F8E5M2};
use half::{bf16, f16};

/// Decodes float16 bits.
#[inline(always)]
pub fn f16_to_f32(bits: u16) -> f32 {
    f16::from_bits(bits).to_f32()
}

/// Encodes an f32 as float16 bits (round to nearest even).
#[inline(always)]
pub fn f32_to_f16(x: f32) -> u16 {
    f16::from_f32(x).to_bits()
}

/// Encodes an f32 as bfloat16 bits: round to nearest even, overflow to
/// infinity, NaN kept quiet (`half`'s semantics, written branch-free so
/// that block loops vectorise).
#[inline(always)]
pub fn f32_to_bf16_bits(x: f32) -> u16 {
    let b = x.to_bits();
    let rounded = (b.wrapping_add(0x7fff + ((b >> 16) & 1)) >> 16) as u16;
    let quiet_nan = ((b >> 16) | 0x0040) as u16;
    if x.is_nan() {
        quiet_nan
    } else {
        rounded
    }
}

/// Decodes bfloat16 bits.
#[inline(always)]
pub fn bf16_to_f32(bits: u16) -> f32 {
    bf16::from_bits(bits).to_f32()
}

/// Encodes an f32 as bfloat16 bits (round to nearest even).
#[inline(always)]
pub fn f32_to_bf16(x: f32) -> u16 {
    bf16::from_f32(x).to_bits()
}

const fn e4m3_table() -> [f32; 256] {
    let mut t = [0.0f32; 256];
    let mut i = 0;
    while i < 256 {
        t[i] = F8E4M3::from_bits(i as u8).to_f32();
        i += 1;
    }
    t
}

const fn e5m2_table() -> [f32; 256] {
    let mut t = [0.0f32; 256];
    let mut i = 0;
    while i < 256 {
        t[i] = F8E5M2::from_bits(i as u8).to_f32();
        i += 1;
    }
    t
}

static E4M3_DECODE: [f32; 256] = e4m3_table();
static E5M2_DECODE: [f32; 256] = e5m2_table();

/// Decodes fp8 e4m3 bits.
#[inline(always)]
pub fn e4m3_to_f32(bits: u8) -> f32 {
    E4M3_DECODE[bits as usize]
}

/// Decodes fp8 e5m2 bits.
#[inline(always)]
pub fn e5m2_to_f32(bits: u8) -> f32 {
    E5M2_DECODE[bits as usize]
}

fn encode_table(e4m3: bool) -> Box<[u8]> {
    (0..=u16::MAX)
        .map(|h| {
            let x = f16::from_bits(h).to_f64();
            if e4m3 {
                F8E4M3::from_f64(x).to_bits()
            } else {
                F8E5M2::from_f64(x).to_bits()
            }
        })
        .collect()
}

fn e4m3_encode_table() -> &'static [u8] {
    static T: OnceLock<Box<[u8]>> = OnceLock::new();
    T.get_or_init(|| encode_table(true))
}

fn e5m2_encode_table() -> &'static [u8] {
    static T: OnceLock<Box<[u8]>> = OnceLock::new();
    T.get_or_init(|| encode_table(false))
}

/// Encodes float16 bits as fp8 e4m3 (round to nearest even, saturating).
#[inline(always)]
pub fn f16_to_e4m3(h: u16) -> u8 {
    e4m3_encode_table()[h as usize]
}

/// Encodes float16 bits as fp8 e5m2 (round to nearest even, saturating).
#[inline(always)]
pub fn f16_to_e5m2(h: u16) -> u8 {
    e5m2_encode_table()[h as usize]
}

/// Encodes an f32 as fp8 e4m3 the way NCCL's kernels do: f32 → f16 → e4m3.
#[inline(always)]
pub fn f32_to_e4m3_via_f16(x: f32) -> u8 {
    f16_to_e4m3(f32_to_f16(x))
}

/// Encodes an f32 as fp8 e5m2 the way NCCL's kernels do: f32 → f16 → e5m2.
#[inline(always)]
pub fn f32_to_e5m2_via_f16(x: f32) -> u8 {
    f16_to_e5m2(f32_to_f16(x))
}

/// Encodes an f32 directly as fp8 e4m3 (one rounding; used for host-side
/// scalars such as the `1/nranks` of `ncclAvg`).
pub fn f32_to_e4m3(x: f32) -> u8 {
    F8E4M3::from_f32(x).to_bits()
}

/// Encodes an f32 directly as fp8 e5m2 (one rounding).
pub fn f32_to_e5m2(x: f32) -> u8 {
    F8E5M2::from_f32(x).to_bits()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fp8_round_trip_every_code() {
        for b in 0..=255u8 {
            let x = e4m3_to_f32(b);
            if x.is_nan() {
                assert_eq!(b & 0x7f, 0x7f);
                continue;
            }
            // Every e4m3 value is exact in f16, so both paths agree.
            assert_eq!(f32_to_e4m3(x), b, "e4m3 {b:#x}");
            assert_eq!(f32_to_e4m3_via_f16(x), b, "e4m3 via f16 {b:#x}");
        }
        for b in 0..=255u8 {
            let x = e5m2_to_f32(b);
            if x.is_nan() {
                continue;
            }
            if x.is_infinite() {
                // Saturating: infinity encodes as the largest finite value.
                assert_eq!(f32_to_e5m2(x) & 0x7f, 0x7b);
                continue;
            }
            assert_eq!(f32_to_e5m2(x), b, "e5m2 {b:#x}");
            assert_eq!(f32_to_e5m2_via_f16(x), b, "e5m2 via f16 {b:#x}");
        }
    }

    #[test]
    fn fp8_rounding_and_saturation() {
        // e4m3: 1.0 = 0x38, next is 1.125; 1.0625 is a tie and goes to even (1.0).
        assert_eq!(f32_to_e4m3(1.0625), 0x38);
        assert_eq!(f32_to_e4m3(1.1), 0x39);
        // 1.1875 is the tie between 1.125 (odd) and 1.25 (even).
        assert_eq!(f32_to_e4m3(1.1875), 0x3a);
        assert_eq!(e4m3_to_f32(0x7e), 448.0);
        assert_eq!(f32_to_e4m3(1.0e6), 0x7e);
        assert_eq!(f32_to_e4m3(-1.0e6), 0xfe);
        assert_eq!(f32_to_e4m3(f32::INFINITY), 0x7e);
        assert!(e4m3_to_f32(f32_to_e4m3(f32::NAN)).is_nan());
        assert_eq!(e5m2_to_f32(0x7b), 57344.0);
        assert_eq!(f32_to_e5m2(1.0e9), 0x7b);
        // Smallest subnormals.
        assert_eq!(e4m3_to_f32(1), 2f32.powi(-9));
        assert_eq!(e5m2_to_f32(1), 2f32.powi(-16));
        assert_eq!(f32_to_e4m3(2f32.powi(-11)), 0);
        assert_eq!(f32_to_e4m3(2f32.powi(-10) * 1.01), 1);
    }

    #[test]
    fn f16_rounds_to_nearest_even() {
        // 1 + 2^-11 is the tie between 1.0 and 1 + 2^-10: goes to 1.0 (even).
        assert_eq!(f32_to_f16(1.0 + 2f32.powi(-11)), 0x3c00);
        // 1 + 3·2^-11 is the tie between 1+2^-10 (odd) and 1+2^-9: goes up.
        assert_eq!(f32_to_f16(1.0 + 3.0 * 2f32.powi(-11)), 0x3c02);
        assert_eq!(f32_to_f16(65520.0), 0x7c00);
        assert_eq!(f32_to_bf16(1.0 + 2f32.powi(-8)), 0x3f80);
        assert_eq!(f32_to_bf16(1.0 + 3.0 * 2f32.powi(-8)), 0x3f82);
    }

    #[test]
    fn bf16_fast_encoding_matches_half() {
        let mut x = 0x1234_5678u32;
        for _ in 0..200_000 {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            let f = f32::from_bits(x);
            assert_eq!(f32_to_bf16_bits(f), f32_to_bf16(f), "{x:#x}");
        }
        for f in [
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::MAX,
            -f32::MAX,
            0.0,
            -0.0,
            f32::MIN_POSITIVE,
            1e-45,
        ] {
            assert_eq!(f32_to_bf16_bits(f), f32_to_bf16(f), "{f}");
        }
    }
}
