//! Wire compression on the simulator (`HETCCL_COMPRESS`): every rank count
//! 2..=8 on two nodes, every algorithm of AllReduce and ReduceScatter,
//! float32 and float16, sum and avg, bf16 and fp8 e4m3. Results must stay
//! within the documented bound (`docs/tuning.md`, "Gradient compression"),
//! be identical on every rank for AllReduce, and the messages between the
//! nodes must really shrink. Integers and min/max must stay exact.

use half::f16;
use hetccl_abi::DataType;
use hetccl_collectives::algo::sim::{run_on, RankBuffers, SimOptions, SimReport};
use hetccl_collectives::algo::{generate, supported, Algorithm, Chunking, Collective, PlanArgs};
use hetccl_collectives::algo::{Plan, Topology};
use hetccl_collectives::reduce::ReduceOp;
use hetccl_core::config::Compression;

fn xorshift(s: &mut u64) -> u64 {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    *s
}

/// Values in [0.1, 1.0): one sign, within 2^14 of each other.
fn value(s: &mut u64) -> f64 {
    0.1 + 0.9 * (xorshift(s) >> 11) as f64 / (1u64 << 53) as f64
}

fn store(dt: DataType, x: f64) -> Vec<u8> {
    match dt {
        DataType::Float32 => (x as f32).to_le_bytes().to_vec(),
        DataType::Float16 => f16::from_f64(x).to_bits().to_le_bytes().to_vec(),
        DataType::Int32 => ((x * 1000.0) as i32).to_le_bytes().to_vec(),
        _ => unreachable!(),
    }
}

fn load(dt: DataType, b: &[u8]) -> f64 {
    match dt {
        DataType::Float32 => f64::from(f32::from_le_bytes(b.try_into().unwrap())),
        DataType::Float16 => f16::from_bits(u16::from_le_bytes(b.try_into().unwrap())).to_f64(),
        DataType::Int32 => f64::from(i32::from_le_bytes(b.try_into().unwrap())),
        _ => unreachable!(),
    }
}

/// Ranks `0..ceil(n/2)` on node 0, the rest on node 1.
fn two_nodes(n: u32) -> Topology {
    Topology::from_nodes((0..n).map(|r| u32::from(r >= n.div_ceil(2))).collect())
}

struct Run {
    plans: Vec<Plan>,
    inputs: Vec<Vec<f64>>,
    outputs: Vec<Vec<f64>>,
    report: SimReport,
}

/// A call: collective, algorithm, datatype and op.
type Call = (Collective, Algorithm, DataType, ReduceOp);

/// Runs one call on every rank of `topo` with random inputs.
fn run(topo: &Topology, call: Call, compress: Compression, count: usize, seed: u64) -> Run {
    let (coll, alg, dt, op) = call;
    let n = topo.nranks() as usize;
    let args = PlanArgs {
        op,
        compress,
        ..PlanArgs::new(coll, count, dt)
    };
    let chunking = Chunking::with_chunk(512);
    let plans: Vec<Plan> = (0..n as u32)
        .map(|r| generate(&args, alg, r, topo, &chunking).unwrap())
        .collect();
    let in_elems = if coll == Collective::ReduceScatter {
        count * n
    } else {
        count
    };
    let mut s = seed | 1;
    let inputs: Vec<Vec<f64>> = (0..n)
        .map(|_| {
            (0..in_elems)
                .map(|_| load(dt, &store(dt, value(&mut s))))
                .collect()
        })
        .collect();
    let mut bufs: Vec<RankBuffers> = inputs
        .iter()
        .map(|v| RankBuffers {
            send: v.iter().flat_map(|&x| store(dt, x)).collect(),
            recv: vec![0u8; count * dt.size()],
        })
        .collect();
    let report = run_on(
        &plans,
        &mut bufs,
        &SimOptions {
            seed,
            rendezvous: true,
        },
        topo,
    )
    .unwrap_or_else(|e| panic!("{coll} {alg} n={n} {dt:?} {op:?} {compress}: {e}"));
    let outputs = bufs
        .iter()
        .map(|b| {
            b.recv
                .chunks_exact(dt.size())
                .map(|c| load(dt, c))
                .collect()
        })
        .collect();
    Run {
        plans,
        inputs,
        outputs,
        report,
    }
}

/// The exact result of element `i` on rank `r`.
fn exact(run: &Run, coll: Collective, op: ReduceOp, r: usize, i: usize) -> f64 {
    let n = run.inputs.len();
    let count = run.outputs[r].len();
    let at = if coll == Collective::ReduceScatter {
        r * count + i
    } else {
        i
    };
    let sum: f64 = run.inputs.iter().map(|v| v[at]).sum();
    if op == ReduceOp::Avg {
        sum / n as f64
    } else {
        sum
    }
}

fn bound(c: Compression, n: usize) -> f64 {
    let unit = match c {
        Compression::Bf16 => 2f64.powi(-8),
        Compression::Fp8E4M3 => 2f64.powi(-4),
        Compression::Off => 0.0,
    };
    (n as f64 + 1.0) * unit
}

#[test]
fn float_sum_and_avg_stay_within_the_bound_on_two_nodes() {
    let mut cases = 0;
    for n in 2..=8u32 {
        let topo = two_nodes(n);
        for coll in [Collective::AllReduce, Collective::ReduceScatter] {
            for &alg in supported(coll) {
                for dt in [DataType::Float32, DataType::Float16] {
                    for op in [ReduceOp::Sum, ReduceOp::Avg] {
                        for c in [Compression::Bf16, Compression::Fp8E4M3] {
                            let count = 301;
                            let seed = u64::from(n) * 1000 + cases;
                            let r = run(&topo, (coll, alg, dt, op), c, count, seed);
                            let off =
                                run(&topo, (coll, alg, dt, op), Compression::Off, count, seed);
                            let what = format!("{coll} {alg} n={n} {dt:?} {op:?} {c}");
                            if dt == DataType::Float16 && c == Compression::Bf16 {
                                // bf16 would not shrink float16: it travels as it is.
                                assert!(r.plans.iter().all(|p| p.wire == Compression::Off));
                                assert_eq!(r.outputs, off.outputs, "{what}");
                                cases += 1;
                                continue;
                            }
                            assert!(r.plans.iter().all(|p| p.wire == c));
                            assert!(
                                r.report.bytes < off.report.bytes,
                                "{what}: {} bytes compressed, {} plain",
                                r.report.bytes,
                                off.report.bytes
                            );
                            let mut worst = 0f64;
                            for rank in 0..n as usize {
                                for i in 0..count {
                                    let want = exact(&r, coll, op, rank, i);
                                    let got = r.outputs[rank][i];
                                    worst = worst.max(((got - want) / want).abs());
                                }
                            }
                            assert!(
                                worst <= bound(c, n as usize),
                                "{what}: relative error {worst} above {}",
                                bound(c, n as usize)
                            );
                            if coll == Collective::AllReduce {
                                assert!(
                                    r.outputs.iter().all(|o| o == &r.outputs[0]),
                                    "{what}: ranks disagree"
                                );
                            }
                            cases += 1;
                        }
                    }
                }
            }
        }
    }
    // 7 rank counts x (5 + 2 algorithms) x 2 types x 2 ops x 2 formats.
    assert_eq!(cases, 7 * 7 * 8);
}

#[test]
fn bf16_error_is_real_but_bounded() {
    // The quantization must actually happen: some element differs from
    // the uncompressed result.
    let topo = two_nodes(4);
    let c = Compression::Bf16;
    let args = (Collective::AllReduce, Algorithm::Ring, DataType::Float32);
    let r = run(&topo, (args.0, args.1, args.2, ReduceOp::Sum), c, 257, 9);
    let off = run(
        &topo,
        (args.0, args.1, args.2, ReduceOp::Sum),
        Compression::Off,
        257,
        9,
    );
    assert_ne!(r.outputs, off.outputs);
}

#[test]
fn integers_min_max_and_one_node_stay_exact() {
    let topo = two_nodes(5);
    for c in [Compression::Bf16, Compression::Fp8E4M3] {
        for (dt, op) in [
            (DataType::Int32, ReduceOp::Sum),
            (DataType::Float32, ReduceOp::Max),
            (DataType::Float32, ReduceOp::Min),
            (DataType::Float16, ReduceOp::Max),
            (DataType::Float32, ReduceOp::Prod),
        ] {
            for alg in [Algorithm::Ring, Algorithm::Hierarchical] {
                let r = run(&topo, (Collective::AllReduce, alg, dt, op), c, 97, 3);
                let off = run(
                    &topo,
                    (Collective::AllReduce, alg, dt, op),
                    Compression::Off,
                    97,
                    3,
                );
                assert!(r.plans.iter().all(|p| p.wire == Compression::Off));
                assert_eq!(r.outputs, off.outputs, "{dt:?} {op:?} {alg} {c}");
                assert_eq!(r.report.bytes, off.report.bytes);
            }
        }
        // One node: nothing crosses nodes, so nothing is compressed.
        let one = Topology::from_nodes(vec![0; 4]);
        let r = run(
            &one,
            (
                Collective::AllReduce,
                Algorithm::Ring,
                DataType::Float32,
                ReduceOp::Sum,
            ),
            c,
            97,
            3,
        );
        assert!(r.plans.iter().all(|p| p.wire == Compression::Off));
    }
}
