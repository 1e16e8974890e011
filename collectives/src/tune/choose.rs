//! The layered algorithm choice of the executor: the tuning table where it
//! covers the call's size, else the communicator's cost model (calibrated
//! at init with `HETCCL_TUNE=init`, or the defaults). Pure: no IO, so the
//! same inputs give the same choice on every rank.
//!
//! `launch/job.rs::choose()` and `hetcclCommSelectionTable` both call
//! [`choose`]; run-time overrides belong in front of the table lookup here.

use super::table::Layout;
use crate::algo::{estimate_us, select, supported, AlgoFilter, Algorithm, Collective, NoAlgorithm};
use crate::cost::CostModel;
use crate::topo::Topology;

/// Where a choice came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// The tuning table's measured times.
    Table,
    /// The cost model with calibrated numbers (`HETCCL_TUNE=init`).
    Calibrated,
    /// The cost model's defaults.
    Model,
}

impl Source {
    /// The name in `hetcclCommSelectionTable` and logs.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Table => "table",
            Self::Calibrated => "calibrated",
            Self::Model => "model",
        }
    }
}

/// What a communicator chooses from besides its topology and filter: the
/// same on every rank (rank 0's, see `tune::agree`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Tuning {
    /// The tuning table's layout for this communicator, if any.
    pub layout: Option<Layout>,
    /// The cost model was calibrated at init.
    pub calibrated: bool,
}

/// One choice: the algorithm, where it came from, and its estimated time
/// (the table's interpolated time, or the model's estimate).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Choice {
    /// The algorithm.
    pub algo: Algorithm,
    /// Where it came from.
    pub source: Source,
    /// Estimated microseconds of one call.
    pub est_us: f64,
}

/// The fastest algorithm by the table for `coll` of `bytes` among those
/// `filter` allows, when at least one measured curve covers `bytes`
/// (`first.bytes <= bytes <= last.bytes`); ties go to the earlier
/// algorithm of `supported(coll)`. Size 0 is never taken from the table.
pub fn from_table(
    layout: &Layout,
    coll: Collective,
    bytes: usize,
    filter: &AlgoFilter,
) -> Option<(Algorithm, f64)> {
    if bytes == 0 {
        return None;
    }
    let mut best: Option<(Algorithm, f64)> = None;
    for &algo in supported(coll) {
        if !filter.allows(coll, algo) {
            continue;
        }
        let Some(t) = layout
            .entry(coll, algo)
            .and_then(|e| e.time_at(bytes as u64))
        else {
            continue;
        };
        if best.is_none_or(|(_, bt)| t < bt) {
            best = Some((algo, t));
        }
    }
    best
}

/// The algorithm for `coll` of `bytes` (count × element size): from the
/// table when it covers the size, else from the cost model. Fails as
/// [`select`] does when `filter` leaves nothing.
pub fn choose(
    coll: Collective,
    bytes: usize,
    topo: &Topology,
    costs: &CostModel,
    filter: &AlgoFilter,
    tuning: &Tuning,
) -> Result<Choice, NoAlgorithm> {
    if let Some((algo, est_us)) = tuning
        .layout
        .as_ref()
        .and_then(|l| from_table(l, coll, bytes, filter))
    {
        return Ok(Choice {
            algo,
            source: Source::Table,
            est_us,
        });
    }
    let algo = select(coll, bytes, topo, costs, filter)?;
    Ok(Choice {
        algo,
        source: if tuning.calibrated {
            Source::Calibrated
        } else {
            Source::Model
        },
        est_us: estimate_us(coll, algo, bytes, topo, costs).unwrap_or(0.0),
    })
}

#[cfg(test)]
mod tests {
    use super::super::table::Table;
    use super::*;

    fn layout(entries: &str) -> Layout {
        let text = format!(
            r#"{{"format":"hetccl-tuning","version":1,"layouts":[
                {{"nranks":4,"nnodes":2,"transports":["shm","tcp"],"entries":[{entries}]}}]}}"#
        );
        Table::parse(text.as_bytes()).unwrap().layouts.remove(0)
    }

    fn topo() -> Topology {
        Topology::from_nodes(vec![0, 0, 1, 1])
    }

    /// Ring is fast below 64 KiB, Tree from 64 KiB to 1 MiB, neither
    /// covers beyond 1 MiB.
    fn two_curves() -> Tuning {
        Tuning {
            layout: Some(layout(
                r#"{"collective":"allreduce","algo":"ring","points":[[8,10],[65536,100],[1048576,5000]]},
                   {"collective":"allreduce","algo":"tree","points":[[1024,50],[65536,90],[1048576,1000]]}"#,
            )),
            calibrated: false,
        }
    }

    #[test]
    fn the_fastest_covering_curve_wins() {
        let (t, m, all) = (topo(), CostModel::default(), AlgoFilter::all());
        let tu = two_curves();
        let c = |b| choose(Collective::AllReduce, b, &t, &m, &all, &tu).unwrap();
        // Only Ring covers 8..1024.
        assert_eq!((c(8).algo, c(8).source), (Algorithm::Ring, Source::Table));
        assert_eq!(c(8).est_us, 10.0);
        // Both cover 1024: Ring at ~20.5 µs beats Tree's 50.
        assert_eq!(c(1024).algo, Algorithm::Ring);
        // 65536: Tree 90 < Ring 100.
        assert_eq!(c(65536).algo, Algorithm::Tree);
        assert_eq!(c(1048576).algo, Algorithm::Tree);
        // Outside every curve: the model, which picks Hierarchical here.
        let model = select(Collective::AllReduce, 4 << 20, &t, &m, &all).unwrap();
        assert_eq!(c(4 << 20).algo, model);
        assert_eq!(c(4 << 20).source, Source::Model);
        assert_eq!(c(4).source, Source::Model);
        // Size 0 is the model's even inside a curve's range.
        assert_eq!(c(0).source, Source::Model);
        // Other collectives: the model.
        let b = choose(Collective::Broadcast, 64, &t, &m, &all, &tu).unwrap();
        assert_eq!(b.source, Source::Model);
    }

    #[test]
    fn the_filter_applies_to_the_table() {
        let (t, m) = (topo(), CostModel::default());
        let tu = two_curves();
        let no_tree = AlgoFilter::parse("^tree").unwrap();
        let c = choose(Collective::AllReduce, 65536, &t, &m, &no_tree, &tu).unwrap();
        assert_eq!((c.algo, c.source), (Algorithm::Ring, Source::Table));
        // Only Direct allowed, and no curve for it: the model picks Direct.
        let direct = AlgoFilter::parse("direct").unwrap();
        let c = choose(Collective::AllReduce, 65536, &t, &m, &direct, &tu).unwrap();
        assert_eq!((c.algo, c.source), (Algorithm::Direct, Source::Model));
        // A filter that leaves nothing is an error, table or not.
        let none = AlgoFilter::parse("allgather:tree").unwrap();
        assert!(choose(Collective::AllGather, 64, &t, &m, &none, &tu).is_err());
    }

    #[test]
    fn the_source_says_calibrated_when_the_model_was() {
        let (t, m, all) = (topo(), CostModel::default(), AlgoFilter::all());
        let tu = Tuning {
            layout: None,
            calibrated: true,
        };
        let c = choose(Collective::AllReduce, 64, &t, &m, &all, &tu).unwrap();
        assert_eq!(c.source, Source::Calibrated);
        assert_eq!(
            c.algo,
            select(Collective::AllReduce, 64, &t, &m, &all).unwrap()
        );
        let c = choose(Collective::AllReduce, 64, &t, &m, &all, &Tuning::default()).unwrap();
        assert_eq!(c.source, Source::Model);
    }

    #[test]
    fn ties_go_to_the_earlier_supported_algorithm() {
        let tu = Tuning {
            layout: Some(layout(
                r#"{"collective":"allreduce","algo":"direct","points":[[8,10]]},
                   {"collective":"allreduce","algo":"tree","points":[[8,10]]}"#,
            )),
            calibrated: false,
        };
        let (t, m, all) = (topo(), CostModel::default(), AlgoFilter::all());
        let c = choose(Collective::AllReduce, 8, &t, &m, &all, &tu).unwrap();
        assert_eq!(c.algo, Algorithm::Tree);
    }
}
