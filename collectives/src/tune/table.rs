//! The engine's tuning table: measured times per (collective, algorithm)
//! and message size, for communicator layouts, read from
//! `HETCCL_TUNING_FILE` when its format is `hetccl-tuning`.
//!
//! ```json
//! {"format": "hetccl-tuning", "version": 1, "meta": {"any": "thing"},
//!  "layouts": [
//!    {"nranks": 4, "nnodes": 2, "transports": ["shm", "tcp"],
//!     "entries": [
//!       {"collective": "allreduce", "algo": "ring",
//!        "points": [[8, 35.2], [65536, 120.0], [1048576, 900.5]]}]}]}
//! ```
//!
//! `points` are `[bytes, microseconds]`, bytes strictly ascending and at
//! least 1 (bytes as `algo::select` sees them: count × element size), the
//! time the measured average of one call. The file is untrusted input: its
//! size, counts and numbers are bounded, unknown keys are errors (only the
//! top-level `meta` may hold anything), and any error rejects the whole
//! file. The same variable names the NCCL tuner plugin's table
//! (`hetccl-nccl-tuning`, `nccl-net-plugin/src/tuner/table.rs`); such a file
//! is reported as [`TableError::OtherFormat`].

use std::io::Read;

use nccl_net_plugin::tuner::json::{array, known_keys, normalise, object, string, uint};
use serde_json::{json, Value};

use crate::algo::{Algorithm, Collective};
use crate::cost::TransportKind;

/// The `format` string of an engine table.
pub const FORMAT: &str = "hetccl-tuning";
/// The `format` string of the NCCL tuner plugin's table.
pub const PLUGIN_FORMAT: &str = "hetccl-nccl-tuning";
/// The one `version` this code reads.
pub const VERSION: u64 = 1;
/// The largest file accepted.
pub const MAX_FILE_BYTES: u64 = 1 << 20;
/// The most layouts in one file.
pub const MAX_LAYOUTS: usize = 256;
/// The most entries in one layout.
pub const MAX_ENTRIES: usize = 1024;
/// The most points in one entry.
pub const MAX_POINTS: usize = 256;
/// The most ranks of a layout.
pub const MAX_RANKS: u64 = 1 << 20;
/// The longest time a point may give, in microseconds (one hour).
pub const MAX_TIME_US: f64 = 3.6e9;

/// Why a file gives no table.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TableError {
    /// A well-formed file in another format (`hetccl-nccl-tuning`, the
    /// tuner plugin's); the string is the format.
    #[error("a {0:?} table (not {FORMAT:?})")]
    OtherFormat(String),
    /// Anything else: unreadable, not JSON, out of bounds.
    #[error("{0}")]
    Invalid(String),
}

fn bad(s: impl Into<String>) -> TableError {
    TableError::Invalid(s.into())
}

/// The measured curve of one algorithm for one collective.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    /// The collective.
    pub collective: Collective,
    /// The algorithm.
    pub algo: Algorithm,
    /// `(bytes, microseconds)`, bytes strictly ascending and >= 1, times
    /// finite and positive.
    pub points: Vec<(u64, f64)>,
}

impl Entry {
    /// The time at `bytes`, interpolated linearly in log(bytes)/log(time)
    /// between the neighbouring points; `None` outside
    /// `first.bytes..=last.bytes`.
    pub fn time_at(&self, bytes: u64) -> Option<f64> {
        let first = self.points.first()?;
        let last = self.points.last()?;
        if bytes < first.0 || bytes > last.0 {
            return None;
        }
        // The first point at or above `bytes` (exists: bytes <= last).
        let hi = self.points.partition_point(|p| p.0 < bytes);
        let (b1, t1) = self.points[hi];
        if b1 == bytes || hi == 0 {
            return Some(t1);
        }
        let (b0, t0) = self.points[hi - 1];
        let (lb0, lb1, lb) = ((b0 as f64).ln(), (b1 as f64).ln(), (bytes as f64).ln());
        let f = (lb - lb0) / (lb1 - lb0);
        Some((t0.ln() + f * (t1.ln() - t0.ln())).exp())
    }
}

/// The entries of one communicator layout.
#[derive(Debug, Clone, PartialEq)]
pub struct Layout {
    /// Ranks of the communicator.
    pub nranks: u64,
    /// Nodes of the communicator.
    pub nnodes: u64,
    /// The transports its links use, sorted by name, no duplicates.
    pub transports: Vec<TransportKind>,
    /// Entries; no two share (collective, algorithm).
    pub entries: Vec<Entry>,
}

impl Layout {
    /// The entry of `coll` with `algo`, if measured.
    pub fn entry(&self, coll: Collective, algo: Algorithm) -> Option<&Entry> {
        self.entries
            .iter()
            .find(|e| e.collective == coll && e.algo == algo)
    }

    /// Whether this layout describes a communicator of `nranks` ranks on
    /// `nnodes` nodes whose links use `transports` (in any order).
    pub fn matches(&self, nranks: u64, nnodes: u64, transports: &[TransportKind]) -> bool {
        self.nranks == nranks && self.nnodes == nnodes && sorted(transports) == self.transports
    }

    /// This layout alone as a complete table file (what rank 0 sends to
    /// the other ranks; they parse it with [`Table::parse`]).
    pub fn to_json(&self) -> String {
        let entries: Vec<Value> = self
            .entries
            .iter()
            .map(|e| {
                let points: Vec<Value> = e.points.iter().map(|&(b, t)| json!([b, t])).collect();
                json!({
                    "collective": e.collective.name(),
                    "algo": e.algo.name().to_ascii_lowercase(),
                    "points": points,
                })
            })
            .collect();
        let names: Vec<&str> = self.transports.iter().map(|t| t.name()).collect();
        json!({
            "format": FORMAT,
            "version": VERSION,
            "layouts": [{
                "nranks": self.nranks,
                "nnodes": self.nnodes,
                "transports": names,
                "entries": entries,
            }],
        })
        .to_string()
    }
}

/// `transports` sorted by name, duplicates removed.
pub fn sorted(transports: &[TransportKind]) -> Vec<TransportKind> {
    let mut v = transports.to_vec();
    v.sort_by_key(|t| t.name());
    v.dedup();
    v
}

/// A whole engine tuning table.
#[derive(Debug, Clone, PartialEq)]
pub struct Table {
    /// Layouts; no two share (nranks, nnodes, transports).
    pub layouts: Vec<Layout>,
}

impl Table {
    /// The layout matching a communicator (see [`Layout::matches`]).
    pub fn layout(
        &self,
        nranks: u64,
        nnodes: u64,
        transports: &[TransportKind],
    ) -> Option<&Layout> {
        self.layouts
            .iter()
            .find(|l| l.matches(nranks, nnodes, transports))
    }

    /// Reads and parses `path`: a regular file of at most
    /// [`MAX_FILE_BYTES`].
    pub fn load(path: &str) -> Result<Table, TableError> {
        let f = std::fs::File::open(path).map_err(|e| bad(format!("cannot open {path}: {e}")))?;
        let meta = f
            .metadata()
            .map_err(|e| bad(format!("cannot stat {path}: {e}")))?;
        if !meta.is_file() {
            return Err(bad(format!("{path} is not a regular file")));
        }
        if meta.len() > MAX_FILE_BYTES {
            return Err(bad(format!(
                "{path} has {} bytes (at most {MAX_FILE_BYTES})",
                meta.len()
            )));
        }
        let mut bytes = Vec::new();
        f.take(MAX_FILE_BYTES + 1)
            .read_to_end(&mut bytes)
            .map_err(|e| bad(format!("cannot read {path}: {e}")))?;
        Table::parse(&bytes)
    }

    /// Parses a table from JSON bytes.
    pub fn parse(bytes: &[u8]) -> Result<Table, TableError> {
        if bytes.len() as u64 > MAX_FILE_BYTES {
            return Err(bad(format!(
                "{} bytes (at most {MAX_FILE_BYTES})",
                bytes.len()
            )));
        }
        let v: Value = serde_json::from_slice(bytes).map_err(|e| bad(format!("not JSON: {e}")))?;
        let top = object(&v, "the table").map_err(bad)?;
        match top.get("format").and_then(Value::as_str) {
            Some(FORMAT) => {}
            Some(PLUGIN_FORMAT) => return Err(TableError::OtherFormat(PLUGIN_FORMAT.into())),
            _ => return Err(bad(format!("\"format\" must be \"{FORMAT}\""))),
        }
        known_keys(top, "the table", &["format", "version", "layouts", "meta"]).map_err(bad)?;
        let version = uint(top, "version", "the table").map_err(bad)?;
        if version != VERSION {
            return Err(bad(format!(
                "version {version} (this hetccl reads {VERSION})"
            )));
        }
        let layouts = array(top, "layouts", "the table", MAX_LAYOUTS).map_err(bad)?;
        let mut out: Vec<Layout> = Vec::with_capacity(layouts.len());
        for (i, l) in layouts.iter().enumerate() {
            let l = parse_layout(l).map_err(|e| bad(format!("layouts[{i}]: {e}")))?;
            if out
                .iter()
                .any(|o| o.matches(l.nranks, l.nnodes, &l.transports))
            {
                return Err(bad(format!(
                    "layouts[{i}]: a second layout of nranks {} nnodes {} transports {:?}",
                    l.nranks,
                    l.nnodes,
                    l.transports.iter().map(|t| t.name()).collect::<Vec<_>>()
                )));
            }
            out.push(l);
        }
        Ok(Table { layouts: out })
    }
}

fn parse_layout(v: &Value) -> Result<Layout, String> {
    let m = object(v, "a layout")?;
    known_keys(
        m,
        "a layout",
        &["nranks", "nnodes", "transports", "entries"],
    )?;
    let nranks = uint(m, "nranks", "a layout")?;
    let nnodes = uint(m, "nnodes", "a layout")?;
    if !(1..=MAX_RANKS).contains(&nranks) || !(1..=nranks).contains(&nnodes) {
        return Err(format!(
            "nranks {nranks} nnodes {nnodes}: need 1 <= nnodes <= nranks <= {MAX_RANKS}"
        ));
    }
    let raw = array(m, "transports", "a layout", TransportKind::ALL.len())?;
    let mut transports = Vec::with_capacity(raw.len());
    for t in raw {
        let s = t
            .as_str()
            .ok_or("\"transports\" must hold strings".to_string())?;
        let k = TransportKind::ALL
            .into_iter()
            .find(|k| k.name().eq_ignore_ascii_case(s))
            .ok_or_else(|| format!("transport {s:?} is not one of shm, verbs, tcp"))?;
        if transports.contains(&k) {
            return Err(format!("transport {s:?} is listed twice"));
        }
        transports.push(k);
    }
    let raw = array(m, "entries", "a layout", MAX_ENTRIES)?;
    let mut entries: Vec<Entry> = Vec::with_capacity(raw.len());
    for (i, e) in raw.iter().enumerate() {
        let e = parse_entry(e).map_err(|err| format!("entries[{i}]: {err}"))?;
        if entries
            .iter()
            .any(|o| (o.collective, o.algo) == (e.collective, e.algo))
        {
            return Err(format!(
                "entries[{i}]: a second entry for {} {}",
                e.collective,
                e.algo.name()
            ));
        }
        entries.push(e);
    }
    Ok(Layout {
        nranks,
        nnodes,
        transports: sorted(&transports),
        entries,
    })
}

fn parse_entry(v: &Value) -> Result<Entry, String> {
    const W: &str = "an entry";
    let m = object(v, W)?;
    known_keys(m, W, &["collective", "algo", "points"])?;
    let coll_name = string(m, "collective")?;
    let collective = Collective::ALL
        .into_iter()
        .find(|c| c.name() == normalise(coll_name))
        .filter(|c| !matches!(c, Collective::Send | Collective::Recv))
        .ok_or_else(|| format!("collective {coll_name:?} is not a collective hetccl tunes"))?;
    let algo_name = string(m, "algo")?;
    let algo = Algorithm::ALL
        .into_iter()
        .find(|a| normalise(a.name()) == normalise(algo_name))
        .ok_or_else(|| format!("algo {algo_name:?} is not one of hetccl's algorithms"))?;
    if !crate::algo::supported(collective).contains(&algo) {
        return Err(format!("{} does not implement {collective}", algo.name()));
    }
    let raw = array(m, "points", W, MAX_POINTS)?;
    if raw.is_empty() {
        return Err("\"points\" is empty".into());
    }
    let mut points: Vec<(u64, f64)> = Vec::with_capacity(raw.len());
    for (i, p) in raw.iter().enumerate() {
        let pair = p
            .as_array()
            .filter(|a| a.len() == 2)
            .ok_or_else(|| format!("points[{i}] must be [bytes, microseconds]"))?;
        let b = pair[0]
            .as_u64()
            .filter(|&b| b >= 1)
            .ok_or_else(|| format!("points[{i}]: bytes must be an integer >= 1"))?;
        let t = pair[1]
            .as_f64()
            .filter(|t| t.is_finite() && *t > 0.0 && *t <= MAX_TIME_US)
            .ok_or_else(|| {
                format!("points[{i}]: microseconds must be a number in (0, {MAX_TIME_US}]")
            })?;
        if points.last().is_some_and(|&(pb, _)| pb >= b) {
            return Err(format!("points[{i}]: bytes {b} is not above the previous"));
        }
        points.push((b, t));
    }
    Ok(Entry {
        collective,
        algo,
        points,
    })
}

/// Lower case, `_` and `-` removed (`Halving_Doubling` is
/// `halvingdoubling`).
#[cfg(test)]
#[path = "table_tests.rs"]
mod tests;
