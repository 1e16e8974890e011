//! hetccl's own algorithm choice from measurements: the tuning table
//! (`HETCCL_TUNING_FILE` in the `hetccl-tuning` format, [`table`]), the
//! init-time calibration of the cost model (`HETCCL_TUNE=init`,
//! [`calibrate`]), the agreement that makes every rank use rank 0's table
//! and model ([`agree`]), and the layered choice itself ([`choose`]).
//!
//! [`setup`] runs at communicator init, after the links are up; every rank
//! runs the same sequence of bootstrap exchanges, decided by rank 0.

pub mod agree;
pub mod calibrate;
pub mod choose;
pub mod table;

use std::sync::OnceLock;

use parking_lot::Mutex;
use std::time::Duration;

pub use self::choose::{Choice, Source, Tuning};
use self::table::{Table, TableError};
use crate::bootstrap::Bootstrap;
use crate::comm::settings::Settings;
use crate::cost::{CostModel, TransportKind};
use crate::error::Result;
use crate::exec::Links;
use crate::topo::Topology;

const TARGET: &str = "hetccl::TUNING";

/// The engine's table from `path`, loaded once per process and path; the
/// outcome is logged once (INFO when loaded or when the file is the tuner
/// plugin's, WARN when unusable).
fn process_table(path: &str) -> Option<Table> {
    type Loaded = Vec<(String, Option<Table>)>;
    static CACHE: OnceLock<Mutex<Loaded>> = OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    let mut c = cache.lock();
    if let Some((_, t)) = c.iter().find(|(p, _)| p == path) {
        return t.clone();
    }
    let t = match Table::load(path) {
        Ok(t) => {
            tracing::info!(target: TARGET,
                "tune: loaded {path} ({} layouts) for hetccl's own algorithm choice",
                t.layouts.len());
            Some(t)
        }
        Err(TableError::OtherFormat(f)) => {
            tracing::info!(target: TARGET,
                "tune: HETCCL_TUNING_FILE {path} is a {f:?} table for NCCL's tuner plugin; \
                 hetccl's own algorithm choice does not use it");
            None
        }
        Err(e) => {
            tracing::warn!(target: TARGET,
                "tune: ignoring HETCCL_TUNING_FILE for hetccl's own algorithm choice: {e}");
            None
        }
    };
    if c.len() < 16 {
        c.push((path.to_string(), t.clone()));
    }
    t
}

/// What [`setup`] needs from communicator init.
pub struct Inputs<'a> {
    /// The communicator's settings.
    pub settings: &'a Settings,
    /// Its topology.
    pub topo: &'a Topology,
    /// Its links (up, after the last init barrier).
    pub links: &'a Links,
    /// Its hash (logs, probe jobs).
    pub comm_hash: u64,
    /// Its log label.
    pub label: String,
    /// The transports its links use (every pair's, not only this rank's);
    /// computed only on rank 0 and only when rank 0 has a table.
    pub transports: &'a dyn Fn() -> Vec<TransportKind>,
}

/// Agrees on rank 0's table layout and, when rank 0 runs with
/// `HETCCL_TUNE=init` or `online`, calibrates the cost model and agrees on
/// rank 0's. Returns the model and tuning every rank chooses with.
pub fn setup(
    bs: &mut Bootstrap,
    inp: &Inputs<'_>,
    costs: CostModel,
) -> Result<(CostModel, Tuning)> {
    let (rank, nranks) = (bs.rank, bs.nranks());
    let nnodes = inp.topo.nodes().len() as u64;
    let label = &inp.label;
    let s = inp.settings;
    let mine = if rank == 0 {
        let layout = s
            .tuning_file
            .as_deref()
            .and_then(process_table)
            .and_then(|t| {
                let ts = table::sorted(&(inp.transports)());
                let l = t.layout(nranks as u64, nnodes, &ts).cloned();
                let names: Vec<&str> = ts.iter().map(|t| t.name()).collect();
                match &l {
                    Some(l) => tracing::info!(target: TARGET,
                    "{label}: tuning table layout for {nranks} ranks on {nnodes} nodes {names:?}: \
                     {} entries", l.entries.len()),
                    None => tracing::info!(target: TARGET,
                    "{label}: the tuning table has no layout for {nranks} ranks on {nnodes} nodes \
                     {names:?}; the cost model chooses"),
                }
                l
            });
        let d = agree::Decision {
            calibrate: s.tune != hetccl_core::config::TuneMode::Off && nranks > 1,
            budget_ms: s.tune_budget.as_millis().clamp(1, u128::from(u32::MAX)) as u32,
            layout,
        };
        let (b, fits) = agree::encode_decision(&d);
        if !fits {
            tracing::warn!(target: TARGET,
                "{label}: the tuning table's layout is too large to share; the cost model chooses");
        }
        b
    } else {
        Vec::new()
    };
    let all = bs.allgather(&mine, agree::MAX_DECISION_BYTES)?;
    let d = agree::decode_decision(&all[0], nranks as u64, nnodes)?;
    if rank != 0 {
        let own = s.tune != hetccl_core::config::TuneMode::Off;
        if own != d.calibrate || s.tuning_file.is_some() {
            tracing::info!(target: TARGET,
                "{label} rank {rank}: rank 0's choice counts: calibrate {}, table layout {}",
                d.calibrate, if d.layout.is_some() { "yes" } else { "none" });
        }
    }
    let mut model = costs;
    if d.calibrate {
        let budget = Duration::from_millis(u64::from(d.budget_ms));
        let t0 = std::time::Instant::now();
        let times = calibrate::measure(inp.links, inp.topo, budget, s.patience, inp.comm_hash)?;
        let gamma = (rank == 0).then(|| calibrate::reduce_cost(budget / 8));
        let all = bs.allgather(&agree::encode_times(&times, gamma), agree::MAX_TIMES_BYTES)?;
        let mine = if rank == 0 {
            let mut measured = Vec::new();
            let mut g = None;
            for b in &all {
                let (t, rg) = agree::decode_times(b)?;
                measured.extend(t);
                g = g.or(rg);
            }
            agree::encode_model(&calibrate::fold(&costs, &measured, g))
        } else {
            Vec::new()
        };
        let all = bs.allgather(&mine, agree::MODEL_BYTES)?;
        model = agree::decode_model(&all[0])?;
        tracing::info!(target: TARGET,
            "{label} rank {rank}: calibrated in {:?}: same process α {:.2} us {:.3} GB/s, \
             same node α {:.2} us {:.3} GB/s, cross node α {:.2} us {:.3} GB/s, \
             reduce {:.3} GB/s",
            t0.elapsed(),
            model.same_process.alpha_us, gbps(model.same_process.beta_us_per_byte),
            model.same_node.alpha_us, gbps(model.same_node.beta_us_per_byte),
            model.cross_node.alpha_us, gbps(model.cross_node.beta_us_per_byte),
            gbps(model.reduce_us_per_byte));
    }
    Ok((
        model,
        Tuning {
            layout: d.layout,
            calibrated: d.calibrate,
        },
    ))
}

/// GB/s of an inverse bandwidth in µs per byte.
fn gbps(us_per_byte: f64) -> f64 {
    1e-3 / us_per_byte
}
