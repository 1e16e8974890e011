//! The generated data is exact: reducing every rank's input in any order,
//! with the type's own rounding after every step, gives the expected value
//! (within 2 ulp for float avg), for every type, op and rank count. Also the
//! per-collective layouts of expected data, and the printf-compatible number
//! formatting.

use hetccl_perf::cfmt::{c_exp, c_g, float_str};
use hetccl_perf::coll::{Coll, Step};
use hetccl_perf::dtype::{DType, Op};
use hetccl_perf::verifiable::{copy_value, expected, input, matches, reduce_reference, tolerance};

fn orders(n: usize, seed: u64) -> Vec<Vec<usize>> {
    let id: Vec<usize> = (0..n).collect();
    let rev: Vec<usize> = (0..n).rev().collect();
    // A deterministic shuffle.
    let mut sh = id.clone();
    let mut s = seed | 1;
    for i in (1..n).rev() {
        s = s
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        sh.swap(i, (s >> 33) as usize % (i + 1));
    }
    // Interleaved halves (what a tree or ring might do).
    let inter: Vec<usize> = (0..n)
        .filter(|r| r % 2 == 1)
        .chain((0..n).filter(|r| r % 2 == 0))
        .collect();
    vec![id, rev, sh, inter]
}

#[test]
fn reductions_are_exact_in_any_order() {
    let ranks = [1usize, 2, 3, 4, 5, 7, 8, 9, 16, 17];
    for dt in DType::ALL {
        for op in Op::ALL {
            let tol = tolerance(dt, op);
            for &n in &ranks {
                for seed in [1u64, 99, 12345] {
                    for index in 0..150u64 {
                        let xs: Vec<u64> =
                            (0..n).map(|r| input(dt, op, n, r, seed, index)).collect();
                        if dt.is_float() {
                            for &x in &xs {
                                assert!(
                                    dt.to_f64(x).is_finite(),
                                    "{dt:?} {op:?} n={n}: non-finite input"
                                );
                            }
                        }
                        let want = expected(dt, op, n, seed, index);
                        for order in orders(n, seed ^ index) {
                            // Premul scalars and avg belong to the rank, not to the position.
                            let mut permuted = vec![0u64; n];
                            let got = if matches!(op, Op::MulSum) {
                                // Apply in rank order but starting from a different rank.
                                reduce_reference(dt, op, &xs)
                            } else {
                                for (k, &r) in order.iter().enumerate() {
                                    permuted[k] = xs[r];
                                }
                                reduce_reference(dt, op, &permuted)
                            };
                            assert!(
                                matches(got, want, tol),
                                "{dt:?} {op:?} n={n} seed={seed} index={index} order={order:?}: got {got:#x} want {want:#x}"
                            );
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn mulsum_is_exact_in_any_order() {
    // Premultiply by each rank's scalar (1 even, 2 odd) first, then sum the
    // products in several orders in the type's precision.
    for dt in DType::ALL.into_iter().filter(|t| t.is_float()) {
        for n in [1usize, 2, 3, 4, 7, 16] {
            for index in 0..200u64 {
                let want = expected(dt, Op::MulSum, n, 7, index);
                let xs: Vec<f64> = (0..n)
                    .map(|r| {
                        dt.to_f64(input(dt, Op::MulSum, n, r, 7, index))
                            * if r % 2 == 1 { 2.0 } else { 1.0 }
                    })
                    .collect();
                for order in orders(n, index) {
                    let mut acc = dt.from_f64(xs[order[0]]);
                    for &r in &order[1..] {
                        acc = dt.from_f64(dt.to_f64(acc) + xs[r]);
                    }
                    assert_eq!(acc, want, "{dt:?} n={n} index={index} order={order:?}");
                }
            }
        }
    }
}

#[test]
fn float_avg_differs_by_at_most_two_ulp_from_sum_then_divide() {
    // A library may also compute avg as (sum)/n; the 2-ulp tolerance covers it.
    for dt in DType::ALL.into_iter().filter(|t| t.is_float()) {
        for n in [2usize, 3, 5, 6, 7] {
            for index in 0..300u64 {
                let sum: f64 = (0..n)
                    .map(|r| dt.to_f64(input(dt, Op::Avg, n, r, 3, index)))
                    .sum();
                let alt = dt.from_f64(sum / n as f64);
                let want = expected(dt, Op::Avg, n, 3, index);
                assert!(
                    matches(alt, want, 2),
                    "{dt:?} n={n} index={index}: {alt:#x} vs {want:#x}"
                );
            }
        }
    }
}

#[test]
fn integer_ops_wrap_like_c() {
    // int8 sum of 127 + 1 wraps to -128; expected uses the same arithmetic.
    let dt = DType::Int8;
    assert_eq!(reduce_reference(dt, Op::Sum, &[127, 1]), 0x80);
    assert_eq!(reduce_reference(dt, Op::Max, &[0x80, 1]), 1);
    assert_eq!(reduce_reference(DType::Uint8, Op::Max, &[0x80, 1]), 0x80);
    assert_eq!(
        reduce_reference(dt, Op::Avg, &[0xfd, 0]),
        0xff,
        "-3/2 truncates to -1"
    );
    assert_eq!(
        reduce_reference(DType::Uint32, Op::Prod, &[0x8000_0000, 2]),
        0
    );
    assert_eq!(reduce_reference(DType::Int32, Op::MulSum, &[5, 7]), 19);
}

#[test]
fn inputs_are_deterministic_and_vary() {
    for dt in DType::ALL {
        let a: Vec<u64> = (0..64).map(|i| copy_value(dt, 5, i)).collect();
        let b: Vec<u64> = (0..64).map(|i| copy_value(dt, 5, i)).collect();
        let c: Vec<u64> = (0..64).map(|i| copy_value(dt, 6, i)).collect();
        assert_eq!(a, b);
        assert_ne!(a, c, "{dt:?}: seeds must matter");
        assert!(a.iter().all(|&x| x & !dt.mask() == 0));
        if dt.is_float() {
            assert!(a
                .iter()
                .all(|&x| dt.to_f64(x).is_finite() && dt.to_f64(x) != 0.0));
        }
        let r0: Vec<u64> = (0..64).map(|i| input(dt, Op::Sum, 4, 0, 1, i)).collect();
        let r1: Vec<u64> = (0..64).map(|i| input(dt, Op::Sum, 4, 1, 1, i)).collect();
        assert_ne!(r0, r1, "{dt:?}: ranks must differ");
    }
}

/// Simulates a collective on the host from every rank's init buffers and
/// checks that the expected data each rank computes matches.
fn simulate(coll: Coll, dt: DType, op: Op, n: usize, root: usize, count: usize, in_place: bool) {
    let es = dt.size();
    let counts = coll.counts(count, es, n);
    let cap = (count * es).max(64) + 64;
    let mut sends = vec![vec![0u8; cap]; n];
    let mut recvs = vec![vec![0u8; cap]; n];
    let mut exps = Vec::new();
    for r in 0..n {
        let st = Step {
            coll,
            dt,
            op,
            root,
            nranks: n,
            rank: r,
            counts,
            in_place,
        };
        exps.push(st.init(&mut sends[r], &mut recvs[r], 42));
    }
    // Where each rank's input lives.
    let src: Vec<Vec<u8>> = (0..n)
        .map(|r| {
            if in_place {
                recvs[r][r * counts.send_inplace_offset * es..][..counts.send * es].to_vec()
            } else {
                sends[r][..counts.send * es].to_vec()
            }
        })
        .collect();
    let el = |b: &[u8], i: usize| dt.load(b, i);
    for r in 0..n {
        let st = Step {
            coll,
            dt,
            op,
            root,
            nranks: n,
            rank: r,
            counts,
            in_place,
        };
        let mut out = recvs[r].clone();
        let base = st.check_offset();
        let put = |out: &mut Vec<u8>, i: usize, v: u64| dt.store(&mut out[base..], i, v);
        match coll {
            Coll::AllReduce | Coll::Reduce => {
                if coll == Coll::AllReduce || r == root {
                    for i in 0..counts.recv {
                        let xs: Vec<u64> = (0..n).map(|q| el(&src[q], i)).collect();
                        put(&mut out, i, reduce_reference(dt, op, &xs));
                    }
                }
            }
            Coll::ReduceScatter => {
                for i in 0..counts.recv {
                    let xs: Vec<u64> = (0..n).map(|q| el(&src[q], r * counts.recv + i)).collect();
                    put(&mut out, i, reduce_reference(dt, op, &xs));
                }
            }
            Coll::AllGather | Coll::Gather => {
                if coll == Coll::AllGather || r == root {
                    for (q, s) in src.iter().enumerate() {
                        for i in 0..counts.send {
                            put(&mut out, q * counts.send + i, el(s, i));
                        }
                    }
                }
            }
            Coll::Broadcast => {
                for i in 0..counts.recv {
                    put(&mut out, i, el(&src[root], i));
                }
            }
            Coll::Scatter => {
                for i in 0..counts.recv {
                    put(&mut out, i, el(&src[root], r * counts.recv + i));
                }
            }
            Coll::AlltoAll => {
                for (q, s) in src.iter().enumerate() {
                    for i in 0..counts.param {
                        put(&mut out, q * counts.param + i, el(s, r * counts.param + i));
                    }
                }
            }
            Coll::SendRecv => {
                let q = (r + n - 1) % n;
                for i in 0..counts.recv {
                    put(&mut out, i, el(&src[q], i));
                }
            }
        }
        let got = &out[base..base + counts.recv * es];
        assert_eq!(
            st.count_wrong(got, &exps[r]),
            0,
            "{coll} {dt:?} {op:?} n={n} root={root} rank={r} in_place={in_place}"
        );
        // And a single damaged element is detected.
        if counts.recv > 0 {
            let mut bad = got.to_vec();
            bad[0] ^= 0x40;
            assert_eq!(
                st.count_wrong(&bad, &exps[r]),
                1,
                "{coll}: damage not detected"
            );
        }
    }
}

#[test]
fn expected_layouts_match_a_host_simulation_of_every_collective() {
    for coll in Coll::ALL {
        for n in [1usize, 2, 3, 4] {
            for in_place in [false, true] {
                if in_place && !coll.checks_in_place() {
                    continue;
                }
                let roots = if coll.is_rooted() {
                    (0..n).collect()
                } else {
                    vec![0]
                };
                for root in roots {
                    for (dt, op) in [
                        (DType::Float, Op::Sum),
                        (DType::Int32, Op::Prod),
                        (DType::Bf16, Op::Max),
                        (DType::Half, Op::Avg),
                        (DType::Uint8, Op::MulSum),
                    ] {
                        simulate(coll, dt, op, n, root, 157, in_place);
                    }
                }
            }
        }
    }
}

#[test]
fn printf_compatible_number_formats() {
    assert_eq!(float_str(1.234, 7), "   1.23");
    assert_eq!(float_str(12345.678, 7), "12345.7");
    assert_eq!(float_str(1234567.0, 7), "1234567");
    assert_eq!(float_str(12345678.0, 7), "1.2e+07");
    assert_eq!(float_str(0.0, 6), "  0.00");
    assert_eq!(float_str(123456.0, 6), "123456");
    assert_eq!(float_str(1234567.0, 6), " 1e+06");
    assert_eq!(c_g(0.0), "0");
    assert_eq!(c_g(0.0479600), "0.04796");
    assert_eq!(c_g(12.5), "12.5");
    assert_eq!(c_g(1e-5), "1e-05");
    assert_eq!(c_g(1234567.0), "1.23457e+06");
    assert_eq!(c_g(100000.0), "100000");
    assert_eq!(c_g(3.0), "3");
    assert_eq!(c_g(0.0001), "0.0001");
    assert_eq!(c_exp(1234.5, 1), "1.2e+03");
    assert_eq!(c_exp(0.00012, 0), "1e-04");
}
