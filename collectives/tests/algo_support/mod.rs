//! Shared harness for the schedule tests: builds every rank's plan, fills
//! buffers with inputs whose reductions are exact in any order, runs the
//! simulator, and compares each rank's output with a reference computed
//! directly from the inputs.

#![allow(dead_code)]

use hetccl_abi::DataType;
use hetccl_collectives::algo::sim::{self, RankBuffers, SimOptions, SimReport};
use hetccl_collectives::algo::{
    generate, Algorithm, Chunking, Collective, Plan, PlanArgs, Topology, DEFAULT_PIECE_BYTES,
};
use hetccl_collectives::reduce::{ReduceOp, Scalar};

/// The ops the tests sweep: the built-ins plus a PreMulSum.
pub fn ops(dt: DataType) -> Vec<ReduceOp> {
    let s = if dt.is_float() { 2.0 } else { 3.0 };
    vec![
        ReduceOp::Sum,
        ReduceOp::Prod,
        ReduceOp::Max,
        ReduceOp::Min,
        ReduceOp::Avg,
        ReduceOp::PreMulSum(Scalar::from_f64(dt, s)),
    ]
}

/// One test case.
#[derive(Debug, Clone)]
pub struct Case {
    pub coll: Collective,
    pub algo: Algorithm,
    pub nodes: Vec<u32>,
    pub count: usize,
    pub dtype: DataType,
    pub op: ReduceOp,
    pub root: u32,
    pub in_place: bool,
    pub chunk_bytes: usize,
    /// The one-step schedules' piece size (`Chunking::piece_bytes`).
    pub piece_bytes: usize,
    pub seed: u64,
    /// Run the plans with collective fingerprints added (`exec::fingerprint`).
    pub fingerprinted: bool,
}

impl Case {
    pub fn new(coll: Collective, algo: Algorithm, nranks: u32, count: usize) -> Self {
        Self {
            coll,
            algo,
            nodes: vec![0; nranks as usize],
            count,
            dtype: DataType::Int32,
            op: ReduceOp::Sum,
            root: 0,
            in_place: false,
            chunk_bytes: 64,
            piece_bytes: DEFAULT_PIECE_BYTES,
            seed: 7,
            fingerprinted: false,
        }
    }
}

/// A value in the reference domain.
#[derive(Debug, Clone, Copy, PartialEq)]
enum V {
    I(i128),
    F(f64),
}

fn wrap(dt: DataType, v: i128) -> i128 {
    let bits = 8 * dt.size() as u32;
    let m = (v as u128) & (u128::MAX >> (128 - bits));
    let signed = matches!(dt, DataType::Int8 | DataType::Int32 | DataType::Int64);
    if signed && m >> (bits - 1) == 1 {
        (m as i128) - (1i128 << bits)
    } else {
        m as i128
    }
}

/// The input value of element `i` on `rank`, chosen so that every
/// reduction order gives the same (exactly representable) result.
fn input(dt: DataType, op: ReduceOp, rank: u32, i: usize) -> V {
    let (r, i) = (rank as i64, i as i64);
    if !dt.is_float() {
        return V::I(wrap(dt, i128::from((r * 131 + i * 7 + 3) % 251 - 100)));
    }
    let fp8 = matches!(dt, DataType::Float8e4m3 | DataType::Float8e5m2);
    let x = match op {
        ReduceOp::Sum | ReduceOp::PreMulSum(_) if fp8 => {
            [0.0, 1.0, 0.0, -1.0][((r + i) % 4) as usize]
        }
        ReduceOp::Sum | ReduceOp::PreMulSum(_) => ((r * 3 + i) % 5 - 2) as f64,
        ReduceOp::Prod if (r + i) % 8 == 0 => 2.0,
        ReduceOp::Prod if (r + 2 * i) % 5 == 0 => -1.0,
        ReduceOp::Prod => 1.0,
        ReduceOp::Max | ReduceOp::Min => ((r * 7 + i * 3) % 11 - 5) as f64,
        ReduceOp::Avg => f64::from(u8::from((r + i) % 9 == 0)),
    };
    V::F(x)
}

fn encode(dt: DataType, v: V) -> Vec<u8> {
    match v {
        V::I(x) => (x as u128).to_le_bytes()[..dt.size()].to_vec(),
        V::F(x) => Scalar::from_f64(dt, x).bytes(dt).to_vec(),
    }
}

fn decode_f(dt: DataType, b: &[u8]) -> f64 {
    let mut raw = [0u8; 8];
    raw[..b.len()].copy_from_slice(b);
    let u = u64::from_le_bytes(raw);
    match dt {
        DataType::Float16 => half::f16::from_bits(u as u16).to_f64(),
        DataType::Bfloat16 => half::bf16::from_bits(u as u16).to_f64(),
        DataType::Float32 => f64::from(f32::from_bits(u as u32)),
        DataType::Float64 => f64::from_bits(u),
        DataType::Float8e4m3 => float8::F8E4M3::from_bits(u as u8).to_f64(),
        _ => float8::F8E5M2::from_bits(u as u8).to_f64(),
    }
}

/// The reference reduction of element `i` over all ranks.
fn reduced(dt: DataType, op: ReduceOp, nranks: u32, i: usize) -> Vec<u8> {
    let vals: Vec<V> = (0..nranks).map(|r| input(dt, op, r, i)).collect();
    if dt.is_float() {
        let xs = vals.iter().map(|v| if let V::F(x) = v { *x } else { 0.0 });
        let scalar = |s: Scalar| decode_f(dt, s.bytes(dt));
        let r = match op {
            ReduceOp::Sum => xs.sum(),
            ReduceOp::Prod => xs.product(),
            ReduceOp::Max => xs.fold(f64::NEG_INFINITY, f64::max),
            ReduceOp::Min => xs.fold(f64::INFINITY, f64::min),
            ReduceOp::Avg => xs.sum::<f64>() * scalar(Scalar::avg_scale(dt, nranks)),
            ReduceOp::PreMulSum(s) => xs.sum::<f64>() * scalar(s),
        };
        return encode(dt, V::F(r));
    }
    let xs: Vec<i128> = vals
        .iter()
        .map(|v| if let V::I(x) = v { *x } else { 0 })
        .collect();
    let w = |x| wrap(dt, x);
    let r = match op {
        ReduceOp::Sum => xs.iter().fold(0, |a, &x| w(a + x)),
        ReduceOp::Prod => xs.iter().fold(1i128, |a, &x| w(a.wrapping_mul(x))),
        ReduceOp::Max => *xs.iter().max().unwrap_or(&0),
        ReduceOp::Min => *xs.iter().min().unwrap_or(&0),
        ReduceOp::Avg => xs.iter().fold(0, |a, &x| w(a + x)) / i128::from(nranks),
        ReduceOp::PreMulSum(s) => {
            let mut raw = [0u8; 16];
            raw[..dt.size()].copy_from_slice(s.bytes(dt));
            let sv = wrap(dt, i128::from_le_bytes(raw));
            xs.iter().fold(0, |a, &x| w(a + w(x.wrapping_mul(sv))))
        }
    };
    encode(dt, V::I(r))
}

/// Rank `rank`'s input buffer contents (`elems` elements from offset 0).
fn input_bytes(c: &Case, rank: u32, elems: usize) -> Vec<u8> {
    (0..elems)
        .flat_map(|i| encode(c.dtype, input(c.dtype, c.op, rank, i)))
        .collect()
}

/// Element counts of the input and output of `rank`.
fn extents(c: &Case, rank: u32, n: usize) -> (usize, usize) {
    use Collective::*;
    let root = rank == c.root;
    match c.coll {
        AllReduce | Broadcast => (c.count, c.count),
        Reduce => (c.count, if root { c.count } else { 0 }),
        AllGather => (c.count, n * c.count),
        ReduceScatter => (n * c.count, c.count),
        AlltoAll => (n * c.count, n * c.count),
        Gather => (c.count, if root { n * c.count } else { 0 }),
        Scatter => (if root { n * c.count } else { 0 }, c.count),
        Send => (c.count, 0),
        Recv => (0, c.count),
    }
}

/// Where input and output live: (in recv?, input offset, in recv?, output
/// offset), in elements, following NCCL's in-place layouts.
fn placement(c: &Case, rank: u32) -> (bool, usize, bool, usize) {
    use Collective::*;
    let (r, root) = (rank as usize, rank == c.root);
    if !c.in_place {
        return (false, 0, true, 0);
    }
    match c.coll {
        AllReduce | Broadcast => (true, 0, true, 0),
        Reduce if root => (true, 0, true, 0),
        Reduce => (false, 0, true, 0),
        AllGather => (true, r * c.count, true, 0),
        Gather if root => (true, r * c.count, true, 0),
        Gather => (false, 0, true, 0),
        ReduceScatter => (false, 0, false, r * c.count),
        Scatter if root => (false, 0, false, r * c.count),
        _ => (false, 0, true, 0),
    }
}

/// Inputs and reductions computed once per case.
struct Reference {
    /// Every rank's input elements `0..max` (encoded).
    inputs: Vec<Vec<u8>>,
    /// The reduction of elements `0..max` over all ranks (reducing
    /// collectives only).
    reduced: Vec<u8>,
}

impl Reference {
    fn new(c: &Case, n: u32) -> Self {
        let max = (0..n)
            .map(|r| extents(c, r, n as usize).0)
            .max()
            .unwrap_or(0);
        let inputs = (0..n).map(|r| input_bytes(c, r, max)).collect();
        let reduced = if c.coll.reduces() {
            (0..max)
                .flat_map(|i| reduced(c.dtype, c.op, n, i))
                .collect()
        } else {
            Vec::new()
        };
        Self { inputs, reduced }
    }
}

/// The expected output of `rank` (`None` where it has none).
fn expected(c: &Case, refs: &Reference, rank: u32, n: u32) -> Option<Vec<u8>> {
    use Collective::*;
    let es = c.dtype.size();
    let cnt = c.count;
    let red =
        |range: std::ops::Range<usize>| refs.reduced[range.start * es..range.end * es].to_vec();
    let inp = |r: u32, range: std::ops::Range<usize>| {
        refs.inputs[r as usize][range.start * es..range.end * es].to_vec()
    };
    let root = rank == c.root;
    let r = rank as usize;
    Some(match c.coll {
        AllReduce => red(0..cnt),
        Reduce if root => red(0..cnt),
        ReduceScatter => red(r * cnt..(r + 1) * cnt),
        Broadcast => inp(c.root, 0..cnt),
        AllGather => (0..n).flat_map(|k| inp(k, 0..cnt)).collect(),
        Gather if root => (0..n).flat_map(|k| inp(k, 0..cnt)).collect(),
        AlltoAll => (0..n)
            .flat_map(|k| inp(k, r * cnt..(r + 1) * cnt))
            .collect(),
        Scatter => inp(c.root, r * cnt..(r + 1) * cnt),
        _ => return None,
    })
}

/// Every rank's plan for the case.
pub fn plans(c: &Case) -> Vec<Plan> {
    let topo = Topology::from_nodes(c.nodes.clone());
    let args = PlanArgs {
        collective: c.coll,
        count: c.count,
        dtype: c.dtype,
        op: c.op,
        root: c.root,
        in_place: c.in_place,
        compress: hetccl_core::config::Compression::Off,
    };
    let chunking = Chunking {
        chunk_bytes: c.chunk_bytes,
        piece_bytes: c.piece_bytes,
    };
    (0..topo.nranks())
        .map(|r| {
            let p = generate(&args, c.algo, r, &topo, &chunking)
                .unwrap_or_else(|e| panic!("{c:?} rank {r}: {e}"));
            if c.fingerprinted {
                hetccl_collectives::exec::fingerprint::add(&p).0
            } else {
                p
            }
        })
        .collect()
}

/// Runs the case; panics with a description on any failure.
pub fn check(c: &Case) -> SimReport {
    let n = c.nodes.len() as u32;
    let plans = plans(c);
    let refs = Reference::new(c, n);
    let es = c.dtype.size();
    let poison = 0xeeu8;
    let mut bufs: Vec<RankBuffers> = (0..n)
        .map(|r| {
            let (ie, oe) = extents(c, r, n as usize);
            let (in_recv, ioff, out_recv, ooff) = placement(c, r);
            let p = &plans[r as usize];
            let mut send = vec![poison; p.send_bytes];
            let mut recv = vec![poison; p.recv_bytes];
            let need_send = [
                (!in_recv).then_some((ioff + ie) * es),
                (!out_recv).then_some((ooff + oe) * es),
            ];
            let need_recv = [
                in_recv.then_some((ioff + ie) * es),
                out_recv.then_some((ooff + oe) * es),
            ];
            let grow = |v: &mut Vec<u8>, need: [Option<usize>; 2]| {
                let m = need.into_iter().flatten().max().unwrap_or(0);
                if v.len() < m {
                    v.resize(m, poison);
                }
            };
            grow(&mut send, need_send);
            grow(&mut recv, need_recv);
            let data = &refs.inputs[r as usize][..ie * es];
            let dst = if in_recv { &mut recv } else { &mut send };
            dst[ioff * es..ioff * es + data.len()].copy_from_slice(data);
            RankBuffers { send, recv }
        })
        .collect();
    let report = sim::run(
        &plans,
        &mut bufs,
        &SimOptions {
            seed: c.seed,
            rendezvous: true,
        },
    )
    .unwrap_or_else(|e| panic!("{c:?}: {e}"));
    for r in 0..n {
        let Some(want) = expected(c, &refs, r, n) else {
            continue;
        };
        let (_, _, out_recv, ooff) = placement(c, r);
        let b = &bufs[r as usize];
        let src = if out_recv { &b.recv } else { &b.send };
        let got = &src[ooff * es..ooff * es + want.len()];
        if got != want.as_slice() {
            let first = (0..want.len() / es)
                .find(|&i| got[i * es..(i + 1) * es] != want[i * es..(i + 1) * es]);
            panic!(
                "{c:?}: rank {r} output differs first at element {first:?}: got {:?} want {:?}",
                first.map(|i| &got[i * es..(i + 1) * es]),
                first.map(|i| &want[i * es..(i + 1) * es])
            );
        }
    }
    report
}
