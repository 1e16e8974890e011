//! The reduction kernels against an independent scalar reference: every
//! datatype × op, odd lengths, misaligned slices, special values.

use hetccl_abi::DataType;
use hetccl_collectives::reduce::{
    finalize_avg, post_op, pre_op, reduce3, reduce_into, scale, ReduceOp, Scalar,
};

/// A tiny deterministic generator (xorshift64*).
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

fn rand_bytes(rng: &mut Rng, n: usize) -> Vec<u8> {
    (0..n).map(|_| rng.next() as u8).collect()
}

fn elem(b: &[u8]) -> u64 {
    let mut raw = [0u8; 8];
    raw[..b.len()].copy_from_slice(b);
    u64::from_le_bytes(raw)
}

/// Decodes a float element exactly into f64.
fn decode(dt: DataType, b: &[u8]) -> f64 {
    let v = elem(b);
    match dt {
        DataType::Float16 => half::f16::from_bits(v as u16).to_f64(),
        DataType::Bfloat16 => half::bf16::from_bits(v as u16).to_f64(),
        DataType::Float32 => f64::from(f32::from_bits(v as u32)),
        DataType::Float64 => f64::from_bits(v),
        DataType::Float8e4m3 => float8::F8E4M3::from_bits(v as u8).to_f64(),
        DataType::Float8e5m2 => float8::F8E5M2::from_bits(v as u8).to_f64(),
        _ => unreachable!(),
    }
}

/// Rounds an exact f64 result to the type as NCCL's kernels do (fp8 through
/// float16 first).
fn encode(dt: DataType, x: f64) -> Vec<u8> {
    match dt {
        DataType::Float16 => half::f16::from_f64(x).to_bits().to_le_bytes().to_vec(),
        DataType::Bfloat16 => half::bf16::from_f64(x).to_bits().to_le_bytes().to_vec(),
        DataType::Float32 => (x as f32).to_le_bytes().to_vec(),
        DataType::Float64 => x.to_le_bytes().to_vec(),
        DataType::Float8e4m3 => {
            vec![float8::F8E4M3::from_f64(half::f16::from_f64(x).to_f64()).to_bits()]
        }
        DataType::Float8e5m2 => {
            vec![float8::F8E5M2::from_f64(half::f16::from_f64(x).to_f64()).to_bits()]
        }
        _ => unreachable!(),
    }
}

fn fmax(a: f64, b: f64) -> f64 {
    if a.is_nan() {
        b
    } else if b.is_nan() || a > b {
        a
    } else {
        b
    }
}

fn fmin(a: f64, b: f64) -> f64 {
    if a.is_nan() {
        b
    } else if b.is_nan() || a < b {
        a
    } else {
        b
    }
}

/// Sign-extends or zero-extends an integer element to i128.
fn int(dt: DataType, b: &[u8]) -> i128 {
    let v = elem(b);
    match dt {
        DataType::Int8 => i128::from(v as u8 as i8),
        DataType::Int32 => i128::from(v as u32 as i32),
        DataType::Int64 => i128::from(v as i64),
        _ => i128::from(v),
    }
}

fn int_bytes(dt: DataType, v: i128) -> Vec<u8> {
    (v as u128).to_le_bytes()[..dt.size()].to_vec()
}

/// The reference for one element of `a ⊕ b`.
fn reference(dt: DataType, op: &str, a: &[u8], b: &[u8]) -> Vec<u8> {
    if dt.is_float() {
        let (x, y) = (decode(dt, a), decode(dt, b));
        let r = match op {
            "sum" => x + y,
            "prod" => x * y,
            "max" => fmax(x, y),
            "min" => fmin(x, y),
            _ => unreachable!(),
        };
        encode(dt, r)
    } else {
        let (x, y) = (int(dt, a), int(dt, b));
        let r = match op {
            "sum" => x.wrapping_add(y),
            // Truncation to the type's width makes the product wrap; i128
            // products of 64-bit values can overflow, so multiply in u128.
            "prod" => (x as u128).wrapping_mul(y as u128) as i128,
            "max" => x.max(y),
            "min" => x.min(y),
            _ => unreachable!(),
        };
        int_bytes(dt, r)
    }
}

/// Equal bit patterns, or both NaN, or both zero (either sign).
fn same(dt: DataType, got: &[u8], want: &[u8]) -> bool {
    if got == want {
        return true;
    }
    if dt.is_float() {
        let (g, w) = (decode(dt, got), decode(dt, want));
        return (g.is_nan() && w.is_nan()) || (g == 0.0 && w == 0.0);
    }
    false
}

fn op_of(name: &str) -> ReduceOp {
    match name {
        "sum" => ReduceOp::Sum,
        "prod" => ReduceOp::Prod,
        "max" => ReduceOp::Max,
        _ => ReduceOp::Min,
    }
}

#[test]
fn every_dtype_and_op_matches_reference() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for dt in DataType::ALL {
        let size = dt.size();
        for op in ["sum", "prod", "max", "min"] {
            for count in [0usize, 1, 2, 3, 7, 13, 31, 64, 257] {
                for misalign in [0usize, 1, 3] {
                    let n = count * size;
                    let a = rand_bytes(&mut rng, n);
                    let b = rand_bytes(&mut rng, n);
                    // reduce_into on misaligned slices
                    let mut dbuf = vec![0u8; n + misalign];
                    dbuf[misalign..].copy_from_slice(&a);
                    let mut sbuf = vec![0u8; n + 2 * misalign];
                    sbuf[2 * misalign..].copy_from_slice(&b);
                    reduce_into(&mut dbuf[misalign..], &sbuf[2 * misalign..], dt, op_of(op))
                        .unwrap();
                    // reduce3 into a third buffer
                    let mut out = vec![0u8; n + misalign];
                    reduce3(
                        &mut out[misalign..],
                        &a,
                        &sbuf[2 * misalign..],
                        dt,
                        op_of(op),
                    )
                    .unwrap();
                    for i in 0..count {
                        let r = i * size..(i + 1) * size;
                        let want = reference(dt, op, &a[r.clone()], &b[r.clone()]);
                        let got = &dbuf[misalign..][r.clone()];
                        assert!(
                            same(dt, got, &want),
                            "{} {op} count={count} i={i}: {:?} ⊕ {:?} = {got:?}, want {want:?}",
                            dt.name(),
                            &a[r.clone()],
                            &b[r.clone()]
                        );
                        assert!(
                            same(dt, &out[misalign..][r.clone()], &want),
                            "reduce3 {} {op}",
                            dt.name()
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn nan_loses_to_numbers_in_max_min() {
    for dt in [
        DataType::Float32,
        DataType::Float16,
        DataType::Bfloat16,
        DataType::Float8e4m3,
    ] {
        let nan = encode(dt, f64::NAN);
        let one = encode(dt, 1.0);
        for op in [ReduceOp::Max, ReduceOp::Min] {
            let mut d = nan.clone();
            reduce_into(&mut d, &one, dt, op).unwrap();
            assert_eq!(decode(dt, &d), 1.0, "{}", dt.name());
            let mut d = one.clone();
            reduce_into(&mut d, &nan, dt, op).unwrap();
            assert_eq!(decode(dt, &d), 1.0, "{}", dt.name());
        }
        let mut d = nan.clone();
        reduce_into(&mut d, &encode(dt, 2.0), dt, ReduceOp::Sum).unwrap();
        assert!(decode(dt, &d).is_nan());
    }
}

#[test]
fn fp8_saturates_and_rounds_through_f16() {
    let dt = DataType::Float8e4m3;
    let mut d = encode(dt, 448.0);
    reduce_into(&mut d, &encode(dt, 448.0), dt, ReduceOp::Sum).unwrap();
    assert_eq!(decode(dt, &d), 448.0);
    let dt = DataType::Float8e5m2;
    let mut d = encode(dt, 57344.0);
    reduce_into(&mut d, &encode(dt, 57344.0), dt, ReduceOp::Sum).unwrap();
    assert_eq!(decode(dt, &d), 57344.0);
}

#[test]
fn integer_ops_wrap() {
    let dt = DataType::Uint8;
    let mut d = vec![200u8, 16];
    reduce_into(&mut d, &[100, 16], dt, ReduceOp::Sum).unwrap();
    assert_eq!(d, [44, 32]);
    reduce_into(&mut d, &[10, 16], dt, ReduceOp::Prod).unwrap();
    assert_eq!(d, [440u32 as u8, 0]);
    let dt = DataType::Int64;
    let mut d = i64::MAX.to_le_bytes().to_vec();
    reduce_into(&mut d, &1i64.to_le_bytes(), dt, ReduceOp::Sum).unwrap();
    assert_eq!(d, i64::MIN.to_le_bytes());
}

#[test]
fn avg_and_premulsum() {
    // Integer avg: sum, then truncating division (toward zero).
    for (dt, vals) in [
        (DataType::Int8, vec![-7i128, 7, -128, 127, 5]),
        (DataType::Int32, vec![-7, 7, -2147483648, 5, 0]),
        (DataType::Int64, vec![-7, 7, -9, 5, 1]),
        (DataType::Uint8, vec![7, 255, 9, 5, 1]),
        (DataType::Uint32, vec![7, 4294967295, 9, 5, 1]),
        (DataType::Uint64, vec![7, 18446744073709551615, 9, 5, 1]),
    ] {
        let mut buf: Vec<u8> = vals.iter().flat_map(|v| int_bytes(dt, *v)).collect();
        assert!(ReduceOp::Avg.has_post_op(dt));
        post_op(&mut buf, dt, ReduceOp::Avg, 3).unwrap();
        for (i, v) in vals.iter().enumerate() {
            let got = int(dt, &buf[i * dt.size()..(i + 1) * dt.size()]);
            assert_eq!(got, v / 3, "{} {v}", dt.name());
        }
    }
    // Float avg: pre-multiplied by 1/n in the type; no post-op.
    for dt in DataType::ALL.into_iter().filter(|d| d.is_float()) {
        assert!(ReduceOp::Avg.has_pre_op(dt) && !ReduceOp::Avg.has_post_op(dt));
        let src = encode(dt, 3.0);
        let mut dst = vec![0u8; src.len()];
        pre_op(&mut dst, &src, dt, ReduceOp::Avg, 4).unwrap();
        assert_eq!(decode(dt, &dst), 0.75, "{}", dt.name());
        let mut same_buf = dst.clone();
        finalize_avg(&mut same_buf, dt, 4).unwrap();
        assert_eq!(same_buf, dst);
    }
    // 1/3 rounds in the datatype: f16(float(1/3)).
    let s = Scalar::avg_scale(DataType::Float16, 3);
    assert_eq!(
        s.bytes(DataType::Float16),
        half::f16::from_f32(1.0 / 3.0).to_bits().to_le_bytes()
    );
    // PreMulSum with an integer scalar wraps.
    let op = ReduceOp::PreMulSum(Scalar::from_f64(DataType::Uint8, 3.0));
    let mut dst = [0u8; 2];
    pre_op(&mut dst, &[100, 2], DataType::Uint8, op, 7).unwrap();
    assert_eq!(dst, [44, 6]);
    let mut buf = 1.5f64.to_le_bytes();
    scale(
        &mut buf,
        DataType::Float64,
        Scalar::from_f64(DataType::Float64, -2.0),
    )
    .unwrap();
    assert_eq!(f64::from_le_bytes(buf), -3.0);
    // Plain ops have neither.
    assert!(!ReduceOp::Sum.has_pre_op(DataType::Float32));
    let mut dst = [0u8; 4];
    pre_op(&mut dst, &[1, 2, 3, 4], DataType::Int32, ReduceOp::Max, 2).unwrap();
    assert_eq!(dst, [1, 2, 3, 4]);
}

#[test]
fn premul_matches_reference() {
    let mut rng = Rng(77);
    for dt in DataType::ALL {
        let s_bytes = rand_bytes(&mut rng, dt.size());
        let s = Scalar::from_bytes(dt, &s_bytes).unwrap();
        let n = 600 * dt.size();
        let src = rand_bytes(&mut rng, n);
        let mut dst = vec![0u8; n + 1];
        pre_op(&mut dst[1..], &src, dt, ReduceOp::PreMulSum(s), 5).unwrap();
        let mut inplace = src.clone();
        scale(&mut inplace, dt, s).unwrap();
        for i in 0..600 {
            let r = i * dt.size()..(i + 1) * dt.size();
            let want = if dt.is_float() {
                encode(dt, decode(dt, &src[r.clone()]) * decode(dt, &s_bytes))
            } else {
                let p = (int(dt, &src[r.clone()]) as u128).wrapping_mul(int(dt, &s_bytes) as u128);
                int_bytes(dt, p as i128)
            };
            assert!(same(dt, &dst[1..][r.clone()], &want), "{}", dt.name());
            assert!(same(dt, &inplace[r], &want), "{} in place", dt.name());
        }
    }
}

/// Throughput of the kernels and of plan generation; run with
/// `cargo test --release -p hetccl-collectives --test algo_reduce -- --ignored --nocapture`.
#[test]
#[ignore]
fn throughput() {
    use hetccl_collectives::algo::{generate, Algorithm, Chunking, Collective, PlanArgs, Topology};
    use std::time::Instant;
    let n = 16 << 20;
    for dt in DataType::ALL {
        // 0x3f bytes are normal numbers at every alignment and width, and
        // adding zeros keeps them so (denormals would distort timings).
        let src = vec![0u8; n];
        let mut dst = vec![0x3fu8; n];
        for (name, off) in [("aligned", 0usize), ("misaligned", 1)] {
            let len = (n - 8) / dt.size() * dt.size();
            let t = Instant::now();
            for _ in 0..4 {
                reduce_into(&mut dst[off..off + len], &src[..len], dt, ReduceOp::Sum).unwrap();
            }
            let gbs = 4.0 * len as f64 / t.elapsed().as_secs_f64() / 1e9;
            println!(
                "reduce_into sum {:>8} {name:>10}: {gbs:6.2} GB/s",
                dt.name()
            );
        }
    }
    let topo = Topology::flat(17);
    let args = PlanArgs::new(Collective::AllReduce, 1 << 28, DataType::Float32);
    for algo in [Algorithm::Ring, Algorithm::Tree, Algorithm::HalvingDoubling] {
        let t = Instant::now();
        let p = generate(&args, algo, 5, &topo, &Chunking::default()).unwrap();
        println!(
            "plan 1 GiB allreduce, 17 ranks, {algo}: {} steps in {:?}",
            p.steps.len(),
            t.elapsed()
        );
    }
}
