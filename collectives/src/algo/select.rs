//! Algorithm selection from an α-β cost model, and the printable table.
//!
//! Each pair of ranks is in a [`LinkClass`] (same process, same node, cross
//! node) with a latency α and an inverse bandwidth β (the communicator's
//! [`CostModel`], `crate::cost`). A message of `m` bytes
//! costs `o + α + m·β`, where `o` is a per-message software overhead paid
//! serially by the sender; messages posted together overlap their α. A
//! local reduction costs γ per byte. Each algorithm's estimate uses the
//! slowest link class its pattern crosses; the formulas are in
//! `docs/algorithms.md`. The model is a starting point for the measured
//! tables of the autotuner.

pub use crate::cost::{CostModel, LinkClass, LinkCost};

use super::filter::AlgoFilter;
use super::generate::{supported, Topology};
use super::{Algorithm, Collective};

impl CostModel {
    /// The class of the link between two ranks.
    pub fn class(topo: &Topology, a: u32, b: u32) -> LinkClass {
        if !topo.same_node(a, b) {
            LinkClass::CrossNode
        } else if topo.same_process(a, b) {
            LinkClass::SameProcess
        } else {
            LinkClass::SameNode
        }
    }
}

/// The slowest class among all pairs of ranks.
fn worst(topo: &Topology) -> LinkClass {
    if topo.nodes().len() > 1 {
        LinkClass::CrossNode
    } else if topo.single_process() {
        LinkClass::SameProcess
    } else {
        LinkClass::SameNode
    }
}

fn log2_ceil(n: u32) -> f64 {
    f64::from(u32::BITS - n.max(1).saturating_sub(1).leading_zeros())
}

/// The model's time in microseconds for `coll` with `algo`, where `bytes` is
/// NCCL's count times the element size; `None` if the algorithm does not
/// implement the collective.
pub fn estimate_us(
    coll: Collective,
    algo: Algorithm,
    bytes: usize,
    topo: &Topology,
    m: &CostModel,
) -> Option<f64> {
    if !supported(coll).contains(&algo) {
        return None;
    }
    let n = topo.nranks().max(1);
    if n == 1 {
        return Some(0.0);
    }
    let nf = f64::from(n);
    let b = bytes as f64;
    let l = m.link(worst(topo));
    let (a, beta, o, g) = (
        l.alpha_us,
        l.beta_us_per_byte,
        m.msg_overhead_us,
        m.reduce_us_per_byte,
    );
    let cong = 1.0 + m.direct_congestion * (nf - 2.0).max(0.0);
    let depth = log2_ceil(n + 1) - 1.0;
    let reduces = coll.reduces();
    let gam = |x: f64| if reduces { x * g } else { 0.0 };
    let t = match (coll, algo) {
        (Collective::AllReduce, Algorithm::Ring) => {
            2.0 * (nf - 1.0) * (o + a + b / nf * beta) + gam((nf - 1.0) / nf * b)
        }
        (Collective::AllReduce, Algorithm::Tree) => 2.0 * depth * (o + a) + 2.0 * b * beta + gam(b),
        (Collective::AllReduce, Algorithm::Direct) => {
            (nf - 1.0) * o + a + (nf - 1.0) * b * beta * cong + gam((nf - 1.0) * b)
        }
        (Collective::AllReduce, Algorithm::HalvingDoubling) => {
            let p = 2f64.powf(f64::from(u32::BITS - 1 - n.leading_zeros()));
            let fold = if p < nf {
                2.0 * (o + a + b * beta) + gam(b)
            } else {
                0.0
            };
            2.0 * p.log2() * (o + a)
                + 2.0 * (p - 1.0) / p * b * beta
                + gam((p - 1.0) / p * b)
                + fold
        }
        (Collective::AllReduce, Algorithm::Hierarchical) => {
            let nodes = topo.nodes();
            let k = nodes.len() as f64;
            let mm = nodes.iter().map(Vec::len).max().unwrap_or(1) as f64;
            let ln = m.link(LinkClass::SameNode);
            let intra = if mm > 1.0 {
                2.0 * ((mm - 1.0) * o + ln.alpha_us + (mm - 1.0) / mm * b * ln.beta_us_per_byte)
            } else {
                0.0
            };
            let lx = m.cross_node;
            let inter = if k > 1.0 {
                2.0 * (k - 1.0) * (o + lx.alpha_us + b / (mm * k) * lx.beta_us_per_byte)
            } else {
                0.0
            };
            intra + inter + gam(b)
        }
        (Collective::Broadcast | Collective::Reduce, Algorithm::Ring) => {
            (nf - 1.0) * (o + a) + b * beta + gam(b)
        }
        (Collective::Broadcast | Collective::Reduce, Algorithm::Tree) => {
            depth * (o + a) + 2.0 * b * beta + gam(2.0 * b)
        }
        (Collective::Broadcast | Collective::Reduce, Algorithm::Direct) => {
            (nf - 1.0) * o + a + (nf - 1.0) * b * beta * cong + gam((nf - 1.0) * b)
        }
        (Collective::AllGather | Collective::ReduceScatter, Algorithm::Ring) => {
            (nf - 1.0) * (o + a + b * beta) + gam((nf - 1.0) * b)
        }
        // Pairwise steps do not wait for each other: one latency, and no
        // incast since each step is a permutation.
        (Collective::AlltoAll, Algorithm::Pairwise) => (nf - 1.0) * o + a + (nf - 1.0) * b * beta,
        (_, Algorithm::Direct) if coll != Collective::Send && coll != Collective::Recv => {
            (nf - 1.0) * o + a + (nf - 1.0) * b * beta * cong + gam((nf - 1.0) * b)
        }
        _ => o + a + b * beta,
    };
    Some(t)
}

/// Why [`select`] found nothing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("NCCL_ALGO {filter:?} leaves no algorithm for {collective}")]
pub struct NoAlgorithm {
    /// The collective.
    pub collective: Collective,
    /// The filter's text.
    pub filter: String,
}

/// The cheapest algorithm for `coll` of `bytes` (count × element size) that
/// `filter` allows. Like NCCL 2.24 and later, a filter that leaves nothing
/// is an error rather than a silent fallback.
pub fn select(
    coll: Collective,
    bytes: usize,
    topo: &Topology,
    costs: &CostModel,
    filter: &AlgoFilter,
) -> Result<Algorithm, NoAlgorithm> {
    let mut best: Option<(f64, Algorithm)> = None;
    for &algo in supported(coll) {
        if !filter.allows(coll, algo) {
            continue;
        }
        let Some(t) = estimate_us(coll, algo, bytes, topo, costs) else {
            continue;
        };
        match best {
            Some((bt, _)) if bt <= t => {}
            _ => best = Some((t, algo)),
        }
    }
    best.map(|(_, a)| a).ok_or_else(|| NoAlgorithm {
        collective: coll,
        filter: filter.text().to_string(),
    })
}

fn human(bytes: usize) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes;
    let mut u = 0;
    while v >= 1024 && v % 1024 == 0 && u + 1 < UNITS.len() {
        v /= 1024;
        u += 1;
    }
    format!("{v} {}", UNITS[u])
}

/// One row's choice in [`selection_table_with`]: the algorithm, its
/// estimated time in microseconds and where the choice came from
/// (`model`, `calibrated`, `table`).
pub type RowChoice = Result<(Algorithm, f64, &'static str), NoAlgorithm>;

/// The selection per size range for each collective, like UCX's protocol
/// table: sizes 0 and every power of two up to `max_bytes` are evaluated,
/// and runs with the same choice are merged into one line showing the
/// range, the algorithm, the model's estimate at the range's end and the
/// source (`model`).
pub fn selection_table(
    colls: &[Collective],
    topo: &Topology,
    costs: &CostModel,
    filter: &AlgoFilter,
    max_bytes: usize,
) -> String {
    selection_table_with(colls, topo, filter, max_bytes, &|coll, bytes| {
        let a = select(coll, bytes, topo, costs, filter)?;
        let t = estimate_us(coll, a, bytes, topo, costs).unwrap_or(0.0);
        Ok((a, t, "model"))
    })
}

/// [`selection_table`] with the choice per (collective, size) made by
/// `choose`: runs with the same algorithm and source are merged, and the
/// estimate shown is `choose`'s at the range's end.
pub fn selection_table_with(
    colls: &[Collective],
    topo: &Topology,
    filter: &AlgoFilter,
    max_bytes: usize,
    choose: &dyn Fn(Collective, usize) -> RowChoice,
) -> String {
    use std::fmt::Write;
    let nodes = topo.nodes();
    let shape: Vec<String> = nodes.iter().map(|l| l.len().to_string()).collect();
    let mut out = String::new();
    let _ = writeln!(
        out,
        "# hetccl algorithm selection: {} ranks on {} node(s) [{}], NCCL_ALGO={:?}",
        topo.nranks(),
        nodes.len(),
        shape.join("+"),
        filter.text()
    );
    let _ = writeln!(
        out,
        "# {:<14} {:<25} {:<16} {:>14}  source",
        "collective", "size range", "algorithm", "est. at end"
    );
    let mut sizes = vec![0usize];
    let mut s = 1usize;
    while s <= max_bytes {
        sizes.push(s);
        s = match s.checked_mul(2) {
            Some(x) => x,
            None => break,
        };
    }
    // (first size, last size, choice at the last size)
    type Run = Option<(usize, usize, RowChoice)>;
    let same = |a: &RowChoice, b: &RowChoice| match (a, b) {
        (Ok((x, _, sx)), Ok((y, _, sy))) => x == y && sx == sy,
        (Err(x), Err(y)) => x == y,
        _ => false,
    };
    for &coll in colls {
        let mut run: Run = None;
        let flush = |out: &mut String, run: &Run| {
            if let Some((lo, hi, choice)) = run {
                let range = format!("{} - {}", human(*lo), human(*hi));
                match choice {
                    Ok((a, t, source)) => {
                        let _ = writeln!(
                            out,
                            "  {:<14} {:<25} {:<16} {:>11.1} us  {}",
                            coll.name(),
                            range,
                            a.name(),
                            t,
                            source
                        );
                    }
                    Err(_) => {
                        let _ = writeln!(
                            out,
                            "  {:<14} {:<25} {:<16} {:>14}  -",
                            coll.name(),
                            range,
                            "(none)",
                            "-"
                        );
                    }
                }
            }
        };
        for &size in &sizes {
            let choice = choose(coll, size);
            match &mut run {
                Some((_, hi, c)) if same(c, &choice) => {
                    *hi = size;
                    *c = choice;
                }
                _ => {
                    flush(&mut out, &run);
                    run = Some((size, size, choice));
                }
            }
        }
        flush(&mut out, &run);
    }
    out
}
