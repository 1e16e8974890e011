//! Compressed wire formats for float sum reductions between nodes
//! (`HETCCL_COMPRESS`, `docs/tuning.md` "Gradient compression").
//!
//! A message of float32 or float16 elements travels as:
//! - **bf16**: 2 bytes per element, each rounded to nearest even
//!   (relative error at most 2⁻⁸);
//! - **fp8 e4m3**: a 4-byte header holding a power-of-two scale exponent
//!   `e` (little-endian `i32`), then 1 byte per element: `x·2^e` rounded to
//!   nearest even e4m3. `e` is chosen per message so that the largest
//!   finite magnitude lands in (224, 448], so an element within 2¹⁴ of the
//!   message's largest one is a normal e4m3 number (relative error at most
//!   2⁻⁴); smaller ones keep an absolute error of at most 2⁻¹⁰·2⁻ᵉ.
//!   Infinities and NaN travel as NaN (e4m3 has no infinity).
//!
//! The receiver decodes into float32 and adds into its accumulator in
//! float32 ([`decode_reduce`], [`bf16_part`]), rounding once to the
//! buffer's type. Scaling by a power of two is exact, and a value already
//! rounded to the format ([`round`]) crosses the wire unchanged.

use half::f16;
use hetccl_abi::DataType;
use hetccl_core::config::Compression;

use super::narrow::{e4m3_to_f32, f32_to_bf16_bits, f32_to_e4m3};
use super::ReduceOp;

/// Bytes of the fp8 header (the scale exponent).
pub const FP8_HEADER: usize = 4;
/// The largest finite e4m3 value.
const E4M3_MAX: f32 = 448.0;
/// e4m3's NaN.
const E4M3_NAN: u8 = 0x7f;

/// Why a compressed message was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// The message's length is not what its elements need.
    #[error("compressed message of {got} bytes where {want} were expected")]
    Length {
        /// Bytes received.
        got: usize,
        /// Bytes expected.
        want: usize,
    },
    /// The fp8 header holds an exponent out of range.
    #[error("compressed message with scale exponent {0} (out of range)")]
    Scale(i32),
    /// The data or the format cannot be compressed.
    #[error("{0} data cannot travel compressed as {1}")]
    Type(&'static str, &'static str),
}

/// Whether a reduction of `dt` under `op` travels compressed as `c`:
/// float32 and float16 sums and averages (never integers, min, max, prod
/// or PreMulSum). With bf16, float16 data travels as it is (bf16 would
/// save nothing and only lose precision); fp8 compresses it.
pub fn eligible(c: Compression, dt: DataType, op: ReduceOp) -> bool {
    let size_gain = match c {
        Compression::Off => false,
        Compression::Bf16 => dt == DataType::Float32,
        Compression::Fp8E4M3 => matches!(dt, DataType::Float32 | DataType::Float16),
    };
    size_gain && matches!(op, ReduceOp::Sum | ReduceOp::Avg)
}

/// The bytes on the wire of a `bytes`-byte message of `dt` elements.
pub fn wire_len(c: Compression, dt: DataType, bytes: usize) -> usize {
    let elems = bytes / dt.size().max(1);
    match c {
        Compression::Off => bytes,
        Compression::Bf16 => 2 * elems,
        Compression::Fp8E4M3 if elems == 0 => 0,
        Compression::Fp8E4M3 => FP8_HEADER + elems,
    }
}

/// An element type that may travel compressed.
trait Elem {
    const SIZE: usize;
    fn load(b: &[u8]) -> f32;
    fn store(x: f32, out: &mut [u8]);
}

struct F32;
struct F16;

impl Elem for F32 {
    const SIZE: usize = 4;
    #[inline(always)]
    fn load(b: &[u8]) -> f32 {
        f32::from_le_bytes([b[0], b[1], b[2], b[3]])
    }
    #[inline(always)]
    fn store(x: f32, out: &mut [u8]) {
        out.copy_from_slice(&x.to_le_bytes());
    }
}

impl Elem for F16 {
    const SIZE: usize = 2;
    #[inline(always)]
    fn load(b: &[u8]) -> f32 {
        f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32()
    }
    #[inline(always)]
    fn store(x: f32, out: &mut [u8]) {
        out.copy_from_slice(&f16::from_f32(x).to_bits().to_le_bytes());
    }
}

/// Runs `$body` with `$E` bound to the element type of `$dt`.
macro_rules! by_type {
    ($dt:expr, $c:expr, $E:ident => $body:expr) => {
        match $dt {
            DataType::Float32 => {
                type $E = F32;
                $body
            }
            DataType::Float16 => {
                type $E = F16;
                $body
            }
            _ => Err(WireError::Type($dt.name(), $c.name())),
        }
    };
}

/// The scale exponent for data whose largest finite magnitude is `amax`:
/// `amax·2^e` lands in (224, 448] (0 for all-zero or non-finite data).
fn fp8_exponent(amax: f32) -> i32 {
    if amax <= 0.0 || !amax.is_finite() {
        return 0;
    }
    let e = (E4M3_MAX / amax).log2().floor() as i32;
    // Guard the float log against an off-by-one at the boundaries.
    let e = e.clamp(-126, 126);
    if amax * pow2(e) > E4M3_MAX {
        e - 1
    } else if e < 126 && amax * pow2(e + 1) <= E4M3_MAX {
        e + 1
    } else {
        e
    }
}

/// `2^e` for `e` in `-126..=127` (exact).
fn pow2(e: i32) -> f32 {
    f32::from_bits(((e + 127) as u32) << 23)
}

fn amax<E: Elem>(src: &[u8]) -> f32 {
    src.chunks_exact(E::SIZE)
        .map(|b| E::load(b).abs())
        .filter(|x| x.is_finite())
        .fold(0.0, f32::max)
}

#[inline(always)]
fn fp8_encode(x: f32, scale: f32) -> u8 {
    if x.is_finite() {
        f32_to_e4m3(x * scale)
    } else {
        E4M3_NAN
    }
}

fn encode_as<E: Elem>(c: Compression, src: &[u8], out: &mut Vec<u8>) {
    let elems = src.len() / E::SIZE;
    out.clear();
    match c {
        Compression::Off => out.extend_from_slice(src),
        Compression::Bf16 => {
            out.resize(2 * elems, 0);
            if E::SIZE == 4 && super::wire_fast::encode(src, out) {
                return;
            }
            for (o, i) in out.chunks_exact_mut(2).zip(src.chunks_exact(E::SIZE)) {
                o.copy_from_slice(&f32_to_bf16_bits(E::load(i)).to_le_bytes());
            }
        }
        Compression::Fp8E4M3 => {
            if elems == 0 {
                return;
            }
            let e = fp8_exponent(amax::<E>(src));
            let scale = pow2(e);
            out.resize(FP8_HEADER + elems, 0);
            out[..FP8_HEADER].copy_from_slice(&e.to_le_bytes());
            for (o, i) in out[FP8_HEADER..].iter_mut().zip(src.chunks_exact(E::SIZE)) {
                *o = fp8_encode(E::load(i), scale);
            }
        }
    }
}

/// Encodes `src` (whole `dt` elements) into `out` (cleared first).
pub fn encode(
    c: Compression,
    dt: DataType,
    src: &[u8],
    out: &mut Vec<u8>,
) -> Result<(), WireError> {
    by_type!(dt, c, E => {
        encode_as::<E>(c, src, out);
        Ok(())
    })
}

/// Checks a message's length against `elems` elements and returns the
/// element bytes and the fp8 scale's inverse.
fn open(c: Compression, msg: &[u8], elems: usize, esize: usize) -> Result<(&[u8], f32), WireError> {
    let want = match c {
        Compression::Off => elems * esize,
        Compression::Bf16 => 2 * elems,
        Compression::Fp8E4M3 if elems == 0 => 0,
        Compression::Fp8E4M3 => FP8_HEADER + elems,
    };
    if msg.len() != want {
        return Err(WireError::Length {
            got: msg.len(),
            want,
        });
    }
    match c {
        Compression::Fp8E4M3 if elems > 0 => {
            let e = i32::from_le_bytes([msg[0], msg[1], msg[2], msg[3]]);
            if !(-126..=126).contains(&e) {
                return Err(WireError::Scale(e));
            }
            Ok((&msg[FP8_HEADER..], pow2(-e)))
        }
        _ => Ok((msg, 1.0)),
    }
}

/// One element on the wire: its size and its decoded value (`inv` is the
/// message's inverse fp8 scale).
trait Code {
    const SIZE: usize;
    fn get(b: &[u8], inv: f32) -> f32;
}

struct Bf16Code;
struct Fp8Code;

impl Code for Bf16Code {
    const SIZE: usize = 2;
    #[inline(always)]
    fn get(b: &[u8], _inv: f32) -> f32 {
        f32::from_bits(u32::from(u16::from_le_bytes([b[0], b[1]])) << 16)
    }
}

impl Code for Fp8Code {
    const SIZE: usize = 1;
    #[inline(always)]
    fn get(b: &[u8], inv: f32) -> f32 {
        e4m3_to_f32(b[0]) * inv
    }
}

/// Plain elements (no compression) as a [`Code`].
impl<E: Elem> Code for E {
    const SIZE: usize = E::SIZE;
    #[inline(always)]
    fn get(b: &[u8], _inv: f32) -> f32 {
        E::load(b)
    }
}

/// The typed loops; `C` decodes the wire, `E` is the buffers' type.
#[inline(always)]
fn decode_loop<E: Elem, C: Code>(body: &[u8], inv: f32, dst: &mut [u8]) {
    for (o, w) in dst
        .chunks_exact_mut(E::SIZE)
        .zip(body.chunks_exact(C::SIZE))
    {
        E::store(C::get(w, inv), o);
    }
}

#[inline(always)]
fn add_loop<E: Elem, C: Code>(body: &[u8], inv: f32, local: Option<&[u8]>, dst: &mut [u8]) {
    match local {
        Some(l) => {
            let it = dst.chunks_exact_mut(E::SIZE).zip(l.chunks_exact(E::SIZE));
            for ((o, l), w) in it.zip(body.chunks_exact(C::SIZE)) {
                E::store(E::load(l) + C::get(w, inv), o);
            }
        }
        None => {
            for (o, w) in dst
                .chunks_exact_mut(E::SIZE)
                .zip(body.chunks_exact(C::SIZE))
            {
                let acc = E::load(o) + C::get(w, inv);
                E::store(acc, o);
            }
        }
    }
}

fn decode_as<E: Elem>(c: Compression, msg: &[u8], dst: &mut [u8]) -> Result<(), WireError> {
    let (body, inv) = open(c, msg, dst.len() / E::SIZE, E::SIZE)?;
    match c {
        Compression::Off => decode_loop::<E, E>(body, inv, dst),
        Compression::Bf16 => decode_loop::<E, Bf16Code>(body, inv, dst),
        Compression::Fp8E4M3 => decode_loop::<E, Fp8Code>(body, inv, dst),
    }
    Ok(())
}

/// `dst = decode(msg)`: a received message (untrusted: its length and
/// header are checked) into `dst`'s elements.
pub fn decode(c: Compression, dt: DataType, msg: &[u8], dst: &mut [u8]) -> Result<(), WireError> {
    by_type!(dt, c, E => decode_as::<E>(c, msg, dst))
}

fn decode_reduce_as<E: Elem>(
    c: Compression,
    msg: &[u8],
    local: Option<&[u8]>,
    dst: &mut [u8],
) -> Result<(), WireError> {
    let elems = dst.len() / E::SIZE;
    if let Some(l) = local {
        if l.len() != dst.len() {
            return Err(WireError::Length {
                got: l.len(),
                want: dst.len(),
            });
        }
    }
    let (body, inv) = open(c, msg, elems, E::SIZE)?;
    if c == Compression::Bf16 && E::SIZE == 4 && super::wire_fast::decode(body, local, dst, true) {
        return Ok(());
    }
    match c {
        Compression::Off => add_loop::<E, E>(body, inv, local, dst),
        Compression::Bf16 => add_loop::<E, Bf16Code>(body, inv, local, dst),
        Compression::Fp8E4M3 => add_loop::<E, Fp8Code>(body, inv, local, dst),
    }
    Ok(())
}

/// `dst = local + decode(msg)` (or `dst += decode(msg)` without `local`),
/// added in float32 and rounded once to `dt`.
pub fn decode_reduce(
    c: Compression,
    dt: DataType,
    msg: &[u8],
    local: Option<&[u8]>,
    dst: &mut [u8],
) -> Result<(), WireError> {
    by_type!(dt, c, E => decode_reduce_as::<E>(c, msg, local, dst))
}

/// `x` rounded to nearest even with `bits` significant bits (the implicit
/// one included), keeping its exponent; non-finite results become NaN.
#[inline(always)]
fn round_significand(x: f32, bits: u32) -> f32 {
    let drop = 24 - bits;
    let b = x.to_bits();
    let half = (1u32 << (drop - 1)) - 1 + ((b >> drop) & 1);
    let r = f32::from_bits(b.wrapping_add(half) & !((1u32 << drop) - 1));
    if x.is_finite() && r.is_finite() {
        r
    } else {
        f32::NAN
    }
}

fn round_as<E: Elem>(c: Compression, buf: &mut [u8]) {
    if c == Compression::Bf16 && <E as Elem>::SIZE == 4 && super::wire_fast::round(buf) {
        return;
    }
    for b in buf.chunks_exact_mut(<E as Elem>::SIZE) {
        let x = E::load(b);
        let r = match c {
            Compression::Off => x,
            Compression::Bf16 => Bf16Code::get(&f32_to_bf16_bits(x).to_le_bytes(), 1.0),
            Compression::Fp8E4M3 => round_significand(x, 4),
        };
        E::store(r, b);
    }
}

/// Rounds `buf` in place to the wire's precision, element by element: to
/// bf16, or to the 4 significant bits of e4m3 (non-finite values become
/// NaN, as on the wire). A rounded value then crosses the wire unchanged
/// (for e4m3: when it is within 2¹⁴ of its message's largest magnitude,
/// whatever the message's scale), so every rank ends with the same value.
pub fn round(c: Compression, dt: DataType, buf: &mut [u8]) -> Result<(), WireError> {
    if c == Compression::Off {
        return Ok(());
    }
    by_type!(dt, c, E => {
        round_as::<E>(c, buf);
        Ok(())
    })
}

/// `dst = decode(part)` or `dst = local + decode(part)` (`add`) for a part
/// of a bf16 message (which has no header, so it can be decoded as it
/// arrives): `part` holds whole 2-byte elements, as many as `dst` holds.
pub fn bf16_part(
    dt: DataType,
    part: &[u8],
    local: Option<&[u8]>,
    dst: &mut [u8],
    add: bool,
) -> Result<(), WireError> {
    let c = Compression::Bf16;
    by_type!(dt, c, E => {
        let elems = dst.len() / <E as Elem>::SIZE;
        if part.len() != 2 * elems || local.is_some_and(|l| l.len() != dst.len()) {
            return Err(WireError::Length { got: part.len(), want: 2 * elems });
        }
        if <E as Elem>::SIZE == 4 && super::wire_fast::decode(part, local, dst, add) {
            return Ok(());
        }
        if add {
            add_loop::<E, Bf16Code>(part, 1.0, local, dst);
        } else {
            decode_loop::<E, Bf16Code>(part, 1.0, dst);
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f32s(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    fn back(b: &[u8]) -> Vec<f32> {
        b.chunks_exact(4).map(F32::load).collect()
    }

    #[test]
    fn lengths() {
        assert_eq!(wire_len(Compression::Bf16, DataType::Float32, 40), 20);
        assert_eq!(wire_len(Compression::Bf16, DataType::Float16, 40), 40);
        assert_eq!(wire_len(Compression::Fp8E4M3, DataType::Float32, 40), 14);
        assert_eq!(wire_len(Compression::Fp8E4M3, DataType::Float32, 0), 0);
        assert_eq!(wire_len(Compression::Off, DataType::Float32, 40), 40);
    }

    #[test]
    fn bf16_round_trip_within_bound() {
        let v: Vec<f32> = (1..2000).map(|i| (i as f32).sqrt() * 1.37e-3).collect();
        let mut w = Vec::new();
        encode(Compression::Bf16, DataType::Float32, &f32s(&v), &mut w).unwrap();
        assert_eq!(w.len(), 2 * v.len());
        let mut out = vec![0u8; 4 * v.len()];
        decode(Compression::Bf16, DataType::Float32, &w, &mut out).unwrap();
        for (a, b) in v.iter().zip(back(&out)) {
            assert!(((a - b) / a).abs() <= 2f32.powi(-8), "{a} {b}");
        }
    }

    #[test]
    fn fp8_scale_and_bound() {
        for mag in [1e-30f32, 1e-6, 1.0, 3e5, 1e30] {
            let v: Vec<f32> = (1..500).map(|i| mag * (1.0 + i as f32 / 97.0)).collect();
            let mut w = Vec::new();
            encode(Compression::Fp8E4M3, DataType::Float32, &f32s(&v), &mut w).unwrap();
            assert_eq!(w.len(), 4 + v.len());
            let mut out = vec![0u8; 4 * v.len()];
            decode(Compression::Fp8E4M3, DataType::Float32, &w, &mut out).unwrap();
            for (a, b) in v.iter().zip(back(&out)) {
                assert!(((a - b) / a).abs() <= 2f32.powi(-4), "{mag}: {a} {b}");
            }
        }
        // Largest magnitude lands in (224, 448].
        for amax in [1e-3f32, 0.5, 1.0, 224.0, 224.5, 448.0, 449.0, 7e20] {
            let s = amax * pow2(fp8_exponent(amax));
            assert!(s > 224.0 && s <= 448.0, "{amax}: {s}");
        }
    }

    #[test]
    fn rounded_data_crosses_exactly() {
        for c in [Compression::Bf16, Compression::Fp8E4M3] {
            for dt in [DataType::Float32, DataType::Float16] {
                let n = 300;
                let mut buf: Vec<u8> = (0..n)
                    .flat_map(|i| {
                        let x = 0.01 + (i as f32 * 0.37).sin().abs() * (1 + i % 7) as f32;
                        let mut b = vec![0u8; dt.size()];
                        if dt == DataType::Float32 {
                            F32::store(x, &mut b)
                        } else {
                            F16::store(x, &mut b)
                        }
                        b
                    })
                    .collect();
                round(c, dt, &mut buf).unwrap();
                let es = dt.size();
                // Any sub-range (a message) crosses unchanged.
                for (lo, hi) in [(0, n), (10, 20), (150, 300), (7, 8)] {
                    let part = &buf[lo * es..hi * es];
                    let mut w = Vec::new();
                    encode(c, dt, part, &mut w).unwrap();
                    let mut out = vec![0u8; part.len()];
                    decode(c, dt, &w, &mut out).unwrap();
                    assert_eq!(out, part, "{c} {dt:?} {lo}..{hi}");
                }
            }
        }
    }

    #[test]
    fn fast_and_portable_loops_agree() {
        // The same data aligned (typed loops) and shifted by one byte
        // (portable loops), NaN and rounding ties included.
        let mut v: Vec<f32> = (0..1000).map(|i| (i as f32 - 500.0) * 0.0137).collect();
        v.extend([
            f32::NAN,
            f32::INFINITY,
            1.0 + 2f32.powi(-8),
            1.0 + 3.0 * 2f32.powi(-8),
        ]);
        let raw = f32s(&v);
        let mut shifted = vec![0u8; raw.len() + 1];
        shifted[1..].copy_from_slice(&raw);
        let c = Compression::Bf16;
        let (mut w1, mut w2) = (Vec::new(), Vec::new());
        encode(c, DataType::Float32, &raw, &mut w1).unwrap();
        encode(c, DataType::Float32, &shifted[1..], &mut w2).unwrap();
        assert_eq!(w1, w2);
        let mut a = raw.clone();
        let mut b = shifted.clone();
        decode_reduce(c, DataType::Float32, &w1, Some(&raw), &mut a).unwrap();
        decode_reduce(c, DataType::Float32, &w1, Some(&raw), &mut b[1..]).unwrap();
        assert_eq!(a, &b[1..]);
        round(c, DataType::Float32, &mut a).unwrap();
        round(c, DataType::Float32, &mut b[1..]).unwrap();
        assert_eq!(a, &b[1..]);
    }

    #[test]
    fn decode_reduce_adds_in_f32() {
        let local = f32s(&[1.0, 2.0, 3.0]);
        let msg = f32s(&[0.5, 0.25, -1.0]);
        let mut w = Vec::new();
        encode(Compression::Bf16, DataType::Float32, &msg, &mut w).unwrap();
        let mut dst = vec![0u8; 12];
        decode_reduce(
            Compression::Bf16,
            DataType::Float32,
            &w,
            Some(&local),
            &mut dst,
        )
        .unwrap();
        assert_eq!(back(&dst), vec![1.5, 2.25, 2.0]);
        decode_reduce(Compression::Bf16, DataType::Float32, &w, None, &mut dst).unwrap();
        assert_eq!(back(&dst), vec![2.0, 2.5, 1.0]);
    }

    #[test]
    fn untrusted_messages_are_checked() {
        let mut dst = vec![0u8; 12];
        let c = Compression::Fp8E4M3;
        assert_eq!(
            decode(c, DataType::Float32, &[0u8; 6], &mut dst),
            Err(WireError::Length { got: 6, want: 7 })
        );
        let mut bad = vec![0u8; 7];
        bad[..4].copy_from_slice(&500i32.to_le_bytes());
        assert_eq!(
            decode(c, DataType::Float32, &bad, &mut dst),
            Err(WireError::Scale(500))
        );
        assert!(decode(Compression::Bf16, DataType::Int32, &[0u8; 6], &mut dst).is_err());
        // Non-finite values travel as NaN.
        let mut w = Vec::new();
        encode(c, DataType::Float32, &f32s(&[f32::INFINITY, 1.0]), &mut w).unwrap();
        let mut out = vec![0u8; 8];
        decode(c, DataType::Float32, &w, &mut out).unwrap();
        assert!(back(&out)[0].is_nan());
        assert_eq!(back(&out)[1], 1.0);
    }

    #[test]
    fn eligibility() {
        let (b, f) = (Compression::Bf16, Compression::Fp8E4M3);
        assert!(eligible(b, DataType::Float32, ReduceOp::Sum));
        assert!(!eligible(b, DataType::Float16, ReduceOp::Sum));
        assert!(eligible(f, DataType::Float16, ReduceOp::Avg));
        assert!(!eligible(f, DataType::Float32, ReduceOp::Max));
        assert!(!eligible(f, DataType::Int32, ReduceOp::Sum));
        assert!(!eligible(b, DataType::Bfloat16, ReduceOp::Sum));
        assert!(!eligible(
            Compression::Off,
            DataType::Float32,
            ReduceOp::Sum
        ));
    }
}
