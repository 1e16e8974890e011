//! Input and expected-output generation, the host-side counterpart of
//! nccl-tests' `verifiable/verifiable.cu`.
//!
//! Every element is a pure function of (seed, rank, index), so any rank can
//! regenerate any other rank's input. Values are built so that the reduced
//! result is exact in every summation order:
//!
//! - integers: random bits, combined with wrapping arithmetic (sums and
//!   products modulo 2^bits are associative and commutative), as nccl-tests;
//! - float sum / mulsum: integers whose magnitudes are bounded so that every
//!   partial sum stays within the type's exact-integer range, all scaled by
//!   one power of two per element (-4..=4);
//! - float prod: one rank contributes a random integer mantissa, the others
//!   ±1 or ±2 (a bounded number of 2s), so every partial product is exact;
//! - float max/min: random finite values (never zero, never NaN);
//! - float avg: only two ranks contribute non-zero values, as nccl-tests does,
//!   compared with a 2-ulp tolerance (the library may multiply by `1/n` in a
//!   different precision).

use crate::dtype::{premul_scalar, DType, Op};

fn mix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A 64-bit random value from (seed, index, salt): one splitmix64 finaliser
/// over a mix of the three (cheap enough to regenerate every rank's input
/// per element).
#[inline]
pub fn rng(seed: u64, index: u64, salt: u64) -> u64 {
    mix64(
        seed.wrapping_mul(0x9e37_79b9_7f4a_7c15)
            ^ index.wrapping_mul(0xc2b2_ae3d_27d4_eb4f).rotate_left(23)
            ^ salt.wrapping_mul(0xd6e8_feb8_6659_fd93),
    )
}

/// Random finite, non-zero float bits in the middle of the exponent range
/// (nccl-tests' generator for copies and min/max).
fn random_float(dt: DType, r: u64) -> u64 {
    let eb = dt.exponent_bits();
    let mb = dt.mantissa_bits();
    let sign = r & 1;
    let exp = ((r >> 1) & ((1u64 << (eb - 1)) - 1)) + (1u64 << (eb - 2));
    let mant = (r >> 12) & ((1u64 << mb) - 1);
    (sign << (eb + mb)) | (exp << mb) | mant
}

/// The value at `index` of a non-reduction collective's data stream `seed`.
pub fn copy_value(dt: DType, seed: u64, index: u64) -> u64 {
    let r = rng(seed, index, 0x636f_7079);
    if dt.is_float() {
        random_float(dt, r)
    } else {
        r & dt.mask()
    }
}

/// A uniform value in `0..m` from 64 random bits (multiply-high: no
/// division, which dominated data generation).
fn below(x: u64, m: u64) -> u64 {
    ((u128::from(x) * u128::from(m)) >> 64) as u64
}

/// `2^e` for small `e`, exactly.
fn exp2i(e: i32) -> f64 {
    f64::from_bits(((1023 + e) as u64) << 52)
}

/// Largest exactly representable integer magnitude of a float type.
fn exact_int_limit(dt: DType) -> i64 {
    1i64 << (dt.mantissa_bits() + 1)
}

/// The integer and the power-of-two scale of a float sum/mulsum input.
fn float_sum_parts(
    dt: DType,
    nranks: usize,
    rank: usize,
    seed: u64,
    index: u64,
    halve: bool,
) -> (i64, i32) {
    let n = nranks.max(1) as i64;
    let limit = if halve {
        exact_int_limit(dt) / 2
    } else {
        exact_int_limit(dt)
    };
    let h = rng(seed, index, 0);
    let shift = below(h.rotate_left(24), 9) as i32 - 4;
    let b = limit / n;
    let r = rng(seed, index, 1 + rank as u64);
    let v = if b >= 1 {
        below(r, 2 * b as u64 + 1) as i64 - b
    } else if below(h, n as u64) as usize == rank {
        below(r, 2 * limit as u64 + 1) as i64 - limit
    } else {
        0
    };
    (v, shift)
}

fn prod_kmax(dt: DType) -> usize {
    match dt {
        DType::Half | DType::F8E4M3 => 4,
        DType::F8E5M2 => 12,
        _ => 16,
    }
}

/// Signed magnitude of a float prod input.
fn float_prod_value(dt: DType, nranks: usize, rank: usize, seed: u64, index: u64) -> f64 {
    let n = nranks.max(1);
    let h = rng(seed, index, 0);
    let p0 = (h % n as u64) as usize;
    let k = ((h >> 20) % (prod_kmax(dt).min(n - 1) as u64 + 1)) as usize;
    let pos = (rank + n - p0) % n;
    let r = rng(seed, index, 1 + rank as u64);
    let mag = if pos == 0 {
        1 + (r >> 1) % (exact_int_limit(dt) as u64 - 1)
    } else if pos <= k {
        2
    } else {
        1
    };
    let v = mag as f64;
    if r & 1 == 1 {
        -v
    } else {
        v
    }
}

/// The mantissa integer (1+m) the avg contributor at position `pos` submits.
fn avg_value(dt: DType, seed: u64, index: u64, pos: usize) -> f64 {
    let m = rng(seed, index, 100 + pos as u64) & ((1u64 << dt.mantissa_bits()) - 1);
    (1 + m) as f64
}

fn avg_pos(nranks: usize, rank: usize, seed: u64, index: u64) -> usize {
    let n = nranks.max(1);
    let p0 = (rng(seed, index, 0) % n as u64) as usize;
    (rank + n - p0) % n
}

/// Rank `rank`'s input element `index` for reduction `op` over `nranks`.
pub fn input(dt: DType, op: Op, nranks: usize, rank: usize, seed: u64, index: u64) -> u64 {
    if !dt.is_float() {
        let bits = rng(seed, index, 1 + rank as u64) & dt.mask();
        return if op == Op::Prod && bits == 0 { 1 } else { bits };
    }
    match op {
        Op::Sum | Op::MulSum => {
            let (v, shift) = float_sum_parts(dt, nranks, rank, seed, index, op == Op::MulSum);
            dt.from_f64(v as f64 * exp2i(shift))
        }
        Op::Prod => dt.from_f64(float_prod_value(dt, nranks, rank, seed, index)),
        Op::Max | Op::Min => random_float(dt, rng(seed, index, 1 + rank as u64)),
        Op::Avg => {
            if avg_pos(nranks, rank, seed, index) < 2 {
                dt.from_f64(avg_value(
                    dt,
                    seed,
                    index,
                    avg_pos(nranks, rank, seed, index),
                ))
            } else {
                dt.from_f64(0.0)
            }
        }
    }
}

/// `x * 1/n` as NCCL's avg pre-op computes it (float multiply for types
/// narrower than double), rounded to `dt`.
fn avg_scaled(dt: DType, x: f64, nranks: usize) -> u64 {
    let inv = 1.0f64 / nranks as f64;
    if dt == DType::Double {
        dt.from_f64(x * inv)
    } else {
        dt.from_f64((x as f32 * inv as f32) as f64)
    }
}

/// The expected reduction of element `index` over all ranks' inputs.
pub fn expected(dt: DType, op: Op, nranks: usize, seed: u64, index: u64) -> u64 {
    let n = nranks.max(1);
    if !dt.is_float() {
        let mask = dt.mask();
        let mut acc = input(dt, op, n, 0, seed, index);
        if op == Op::MulSum {
            acc = acc.wrapping_mul(premul_scalar(dt, 0)) & mask;
        }
        for r in 1..n {
            let x = input(dt, op, n, r, seed, index);
            acc = match op {
                Op::Sum | Op::Avg => acc.wrapping_add(x),
                Op::MulSum => acc.wrapping_add(x.wrapping_mul(premul_scalar(dt, r))),
                Op::Prod => acc.wrapping_mul(x),
                Op::Max => {
                    if dt.int_value(x) > dt.int_value(acc) {
                        x
                    } else {
                        acc
                    }
                }
                Op::Min => {
                    if dt.int_value(x) < dt.int_value(acc) {
                        x
                    } else {
                        acc
                    }
                }
            } & mask;
        }
        if op == Op::Avg {
            acc = ((dt.int_value(acc) / n as i128) as u64) & mask;
        }
        return acc;
    }
    match op {
        Op::Sum | Op::MulSum => {
            let mut sum: i128 = 0;
            let mut shift = 0;
            for r in 0..n {
                let (v, s) = float_sum_parts(dt, n, r, seed, index, op == Op::MulSum);
                let scale = if op == Op::MulSum && r % 2 == 1 { 2 } else { 1 };
                sum += v as i128 * scale;
                shift = s;
            }
            dt.from_f64(sum as f64 * exp2i(shift))
        }
        Op::Prod => {
            let p: f64 = (0..n)
                .map(|r| float_prod_value(dt, n, r, seed, index))
                .product();
            dt.from_f64(p)
        }
        Op::Max | Op::Min => {
            let mut best = input(dt, op, n, 0, seed, index);
            for r in 1..n {
                let x = input(dt, op, n, r, seed, index);
                let (xv, bv) = (dt.to_f64(x), dt.to_f64(best));
                if (op == Op::Max && xv > bv) || (op == Op::Min && xv < bv) {
                    best = x;
                }
            }
            best
        }
        Op::Avg => {
            if n == 1 {
                return dt.from_f64(avg_value(dt, seed, index, 0));
            }
            let a = avg_scaled(dt, avg_value(dt, seed, index, 0), n);
            let b = avg_scaled(dt, avg_value(dt, seed, index, 1), n);
            dt.from_f64(dt.to_f64(a) + dt.to_f64(b))
        }
    }
}

/// How far (in units of the last place, compared as unsigned bit patterns)
/// a result may be from the expected value: 2 for float avg, else 0.
pub fn tolerance(dt: DType, op: Op) -> u64 {
    if op == Op::Avg && dt.is_float() {
        2
    } else {
        0
    }
}

/// Whether `got` is within `tol` ulps of `want` (exact when `tol` is 0).
pub fn matches(got: u64, want: u64, tol: u64) -> bool {
    got.abs_diff(want) <= tol
}

/// Applies a reduction op on the host to one element from every rank, with
/// the library's semantics (used only by tests, to cross-check `expected`).
pub fn reduce_reference(dt: DType, op: Op, inputs: &[u64]) -> u64 {
    let n = inputs.len();
    if !dt.is_float() {
        let mask = dt.mask();
        let mut acc = 0u64;
        for (r, &x) in inputs.iter().enumerate() {
            let x = if op == Op::MulSum {
                x.wrapping_mul(premul_scalar(dt, r))
            } else {
                x
            };
            acc = if r == 0 {
                x
            } else {
                match op {
                    Op::Sum | Op::Avg | Op::MulSum => acc.wrapping_add(x),
                    Op::Prod => acc.wrapping_mul(x),
                    Op::Max => {
                        if dt.int_value(x) > dt.int_value(acc) {
                            x
                        } else {
                            acc
                        }
                    }
                    Op::Min => {
                        if dt.int_value(x) < dt.int_value(acc) {
                            x
                        } else {
                            acc
                        }
                    }
                }
            } & mask;
        }
        if op == Op::Avg {
            acc = ((dt.int_value(acc) / n as i128) as u64) & mask;
        }
        return acc;
    }
    // Floats: combine in the type's own precision, in the given order.
    let mut acc = 0u64;
    for (r, &x) in inputs.iter().enumerate() {
        let x = match op {
            Op::MulSum => dt.from_f64(dt.to_f64(x) * dt.to_f64(premul_scalar(dt, r))),
            Op::Avg => avg_scaled(dt, dt.to_f64(x), n),
            _ => x,
        };
        acc = if r == 0 {
            x
        } else {
            let (a, b) = (dt.to_f64(acc), dt.to_f64(x));
            match op {
                Op::Sum | Op::Avg | Op::MulSum => dt.from_f64(a + b),
                Op::Prod => dt.from_f64(a * b),
                Op::Max => {
                    if b > a {
                        x
                    } else {
                        acc
                    }
                }
                Op::Min => {
                    if b < a {
                        x
                    } else {
                        acc
                    }
                }
            }
        };
    }
    acc
}
