//! The tuning table of the NCCL tuner plugin: a versioned JSON file, read
//! once per process from `HETCCL_TUNING_FILE`.
//!
//! ```json
//! { "format": "hetccl-nccl-tuning", "version": 1,
//!   "layouts": [ { "nranks": 4, "nnodes": 2, "entries": [
//!     { "collective": "allreduce", "min_bytes": 0, "max_bytes": 65535,
//!       "algo": "tree", "proto": "ll", "nchannels": 4, "chunk_bytes": 131072 } ] } ] }
//! ```
//!
//! The file is untrusted input: its size, counts and numbers are bounded,
//! unknown keys are errors (so a typo is not silently ignored; only the
//! top-level `meta` may hold anything), and size ranges of one collective
//! may not overlap. Any error rejects the whole file.

use std::io::Read;

use super::json::{array, known_keys, normalise, object, opt_uint, string, uint};
use serde_json::{Map, Value};

/// The `format` string of a table.
pub const FORMAT: &str = "hetccl-nccl-tuning";
/// The `format` string of hetccl's own engine table
/// (`collectives/src/tune/table.rs`), which this plugin does not use.
pub const ENGINE_FORMAT: &str = "hetccl-tuning";
/// The error [`Table::parse`] gives for an engine table, so that the caller
/// can tell it apart from a broken file.
pub const ENGINE_TABLE: &str = "a table for hetccl's own engine (format \"hetccl-tuning\")";
/// The one `version` this code reads.
pub const VERSION: u64 = 1;
/// The largest file accepted.
pub const MAX_FILE_BYTES: u64 = 1 << 20;
/// The most layouts in one file.
pub const MAX_LAYOUTS: usize = 256;
/// The most entries in one layout.
pub const MAX_ENTRIES: usize = 1024;
/// The most ranks of a layout.
pub const MAX_RANKS: u64 = 1 << 20;
/// The most channels an entry may ask for (NCCL's `MAXCHANNELS`).
pub const MAX_CHANNELS: u64 = 64;
/// The largest chunk size an entry may ask for.
pub const MAX_CHUNK_BYTES: u64 = 1 << 30;

/// The collective names, indexed by `ncclFunc_t`.
const COLLECTIVES: [&str; 5] = [
    "broadcast",
    "reduce",
    "allgather",
    "reducescatter",
    "allreduce",
];
/// The algorithm names, indexed by `NCCL_ALGO_*`.
const ALGOS: [&str; 7] = [
    "tree",
    "ring",
    "collnetdirect",
    "collnetchain",
    "nvls",
    "nvlstree",
    "pat",
];
/// The protocol names, indexed by `NCCL_PROTO_*`.
const PROTOS: [&str; 3] = ["ll", "ll128", "simple"];

/// One measured choice: for `collective` and sizes in `min..=max`, the
/// (algorithm, protocol) that was fastest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// `ncclFunc_t` of the collective (0..5).
    pub collective: usize,
    /// Smallest size covered, in bytes.
    pub min_bytes: u64,
    /// Largest size covered, in bytes (inclusive).
    pub max_bytes: u64,
    /// `NCCL_ALGO_*` index.
    pub algo: usize,
    /// `NCCL_PROTO_*` index.
    pub proto: usize,
    /// Channels to ask for, if measured.
    pub nchannels: Option<u32>,
    /// Chunk size to ask for with this (algo, proto), if measured.
    pub chunk_bytes: Option<u64>,
}

/// The entries of one (nranks, nnodes) layout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    /// Ranks of the communicator.
    pub nranks: u64,
    /// Nodes of the communicator.
    pub nnodes: u64,
    /// Entries, sorted by (collective, min_bytes); ranges do not overlap.
    pub entries: Vec<Entry>,
}

impl Layout {
    /// The entry covering `nbytes` of `collective`, if any.
    pub fn lookup(&self, collective: usize, nbytes: u64) -> Option<&Entry> {
        self.entries
            .iter()
            .find(|e| e.collective == collective && (e.min_bytes..=e.max_bytes).contains(&nbytes))
    }
}

/// A whole tuning table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Table {
    /// Layouts; no two share (nranks, nnodes).
    pub layouts: Vec<Layout>,
}

impl Table {
    /// The layout of a communicator of `nranks` ranks on `nnodes` nodes.
    pub fn layout(&self, nranks: u64, nnodes: u64) -> Option<&Layout> {
        self.layouts
            .iter()
            .find(|l| l.nranks == nranks && l.nnodes == nnodes)
    }

    /// Reads and parses `path`: a regular file of at most
    /// [`MAX_FILE_BYTES`].
    pub fn load(path: &str) -> Result<Table, String> {
        let f = std::fs::File::open(path).map_err(|e| format!("cannot open {path}: {e}"))?;
        let meta = f
            .metadata()
            .map_err(|e| format!("cannot stat {path}: {e}"))?;
        if !meta.is_file() {
            return Err(format!("{path} is not a regular file"));
        }
        if meta.len() > MAX_FILE_BYTES {
            return Err(format!(
                "{path} has {} bytes (at most {MAX_FILE_BYTES})",
                meta.len()
            ));
        }
        let mut bytes = Vec::new();
        f.take(MAX_FILE_BYTES + 1)
            .read_to_end(&mut bytes)
            .map_err(|e| format!("cannot read {path}: {e}"))?;
        if bytes.len() as u64 > MAX_FILE_BYTES {
            return Err(format!("{path} grew past {MAX_FILE_BYTES} bytes"));
        }
        Table::parse(&bytes)
    }

    /// Parses a table from JSON bytes.
    pub fn parse(bytes: &[u8]) -> Result<Table, String> {
        if bytes.len() as u64 > MAX_FILE_BYTES {
            return Err(format!("{} bytes (at most {MAX_FILE_BYTES})", bytes.len()));
        }
        let v: Value = serde_json::from_slice(bytes).map_err(|e| format!("not JSON: {e}"))?;
        let top = object(&v, "the table")?;
        known_keys(top, "the table", &["format", "version", "layouts", "meta"])?;
        match top.get("format").and_then(Value::as_str) {
            Some(FORMAT) => {}
            Some(ENGINE_FORMAT) => return Err(ENGINE_TABLE.to_string()),
            _ => return Err(format!("\"format\" must be \"{FORMAT}\"")),
        }
        let version = uint(top, "version", "the table")?;
        if version != VERSION {
            return Err(format!("version {version} (this hetccl reads {VERSION})"));
        }
        let layouts = array(top, "layouts", "the table", MAX_LAYOUTS)?;
        let mut out: Vec<Layout> = Vec::with_capacity(layouts.len());
        for (i, l) in layouts.iter().enumerate() {
            let l = parse_layout(l).map_err(|e| format!("layouts[{i}]: {e}"))?;
            if out
                .iter()
                .any(|o| (o.nranks, o.nnodes) == (l.nranks, l.nnodes))
            {
                return Err(format!(
                    "layouts[{i}]: a second layout of nranks {} nnodes {}",
                    l.nranks, l.nnodes
                ));
            }
            out.push(l);
        }
        Ok(Table { layouts: out })
    }
}

fn parse_layout(v: &Value) -> Result<Layout, String> {
    let m = object(v, "a layout")?;
    known_keys(m, "a layout", &["nranks", "nnodes", "entries"])?;
    let nranks = uint(m, "nranks", "a layout")?;
    let nnodes = uint(m, "nnodes", "a layout")?;
    if !(1..=MAX_RANKS).contains(&nranks) || !(1..=nranks).contains(&nnodes) {
        return Err(format!(
            "nranks {nranks} nnodes {nnodes}: need 1 <= nnodes <= nranks <= {MAX_RANKS}"
        ));
    }
    let raw = array(m, "entries", "a layout", MAX_ENTRIES)?;
    let mut entries = raw
        .iter()
        .enumerate()
        .map(|(i, e)| parse_entry(e).map_err(|err| format!("entries[{i}]: {err}")))
        .collect::<Result<Vec<_>, _>>()?;
    entries.sort_by_key(|e| (e.collective, e.min_bytes));
    for w in entries.windows(2) {
        if w[0].collective == w[1].collective && w[1].min_bytes <= w[0].max_bytes {
            return Err(format!(
                "{} ranges {}..={} and {}..={} overlap",
                COLLECTIVES[w[0].collective],
                w[0].min_bytes,
                w[0].max_bytes,
                w[1].min_bytes,
                w[1].max_bytes
            ));
        }
    }
    Ok(Layout {
        nranks,
        nnodes,
        entries,
    })
}

fn parse_entry(v: &Value) -> Result<Entry, String> {
    const W: &str = "an entry";
    let m = object(v, W)?;
    known_keys(
        m,
        W,
        &[
            "collective",
            "min_bytes",
            "max_bytes",
            "algo",
            "proto",
            "nchannels",
            "chunk_bytes",
        ],
    )?;
    let collective = name(m, "collective", &COLLECTIVES)?;
    let algo = name(m, "algo", &ALGOS)?;
    let proto = name(m, "proto", &PROTOS)?;
    let min_bytes = opt_uint(m, "min_bytes", W)?.unwrap_or(0);
    let max_bytes = opt_uint(m, "max_bytes", W)?.unwrap_or(u64::MAX);
    if min_bytes > max_bytes {
        return Err(format!("min_bytes {min_bytes} > max_bytes {max_bytes}"));
    }
    let nchannels = match opt_uint(m, "nchannels", W)? {
        None => None,
        Some(n @ 1..=MAX_CHANNELS) => Some(n as u32),
        Some(n) => return Err(format!("nchannels {n} (1..={MAX_CHANNELS})")),
    };
    let chunk_bytes = match opt_uint(m, "chunk_bytes", W)? {
        None => None,
        Some(n @ 1..=MAX_CHUNK_BYTES) => Some(n),
        Some(n) => return Err(format!("chunk_bytes {n} (1..={MAX_CHUNK_BYTES})")),
    };
    Ok(Entry {
        collective,
        min_bytes,
        max_bytes,
        algo,
        proto,
        nchannels,
        chunk_bytes,
    })
}

/// The index of a name in `names`: case-insensitive, `_` and `-` ignored
/// (`CollNet_Direct` is `collnetdirect`).
fn name(m: &Map<String, Value>, key: &str, names: &[&str]) -> Result<usize, String> {
    let raw = string(m, key)?;
    let norm = normalise(raw);
    names
        .iter()
        .position(|n| *n == norm)
        .ok_or_else(|| format!("{key} {raw:?} is not one of {names:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(entries: &str) -> String {
        format!(
            r#"{{"format":"{FORMAT}","version":1,"meta":{{"tool":"x"}},
               "layouts":[{{"nranks":4,"nnodes":2,"entries":[{entries}]}}]}}"#
        )
    }

    #[test]
    fn parses_and_looks_up() {
        let t = Table::parse(
            table(
                r#"{"collective":"AllReduce","max_bytes":65535,"algo":"Tree","proto":"LL"},
                   {"collective":"allreduce","min_bytes":65536,"max_bytes":1048576,
                    "algo":"PAT","proto":"Simple","nchannels":6,"chunk_bytes":131072},
                   {"collective":"all_gather","algo":"collnet_direct","proto":"ll128"}"#,
            )
            .as_bytes(),
        )
        .unwrap();
        assert!(t.layout(4, 1).is_none() && t.layout(8, 2).is_none());
        let l = t.layout(4, 2).unwrap();
        let e = l.lookup(4, 0).unwrap();
        assert_eq!((e.algo, e.proto, e.nchannels), (0, 0, None));
        assert_eq!(l.lookup(4, 65535).unwrap().algo, 0);
        let e = l.lookup(4, 65536).unwrap();
        assert_eq!(
            (e.algo, e.proto, e.nchannels, e.chunk_bytes),
            (6, 2, Some(6), Some(131072))
        );
        assert!(l.lookup(4, 1048577).is_none());
        assert!(l.lookup(0, 8).is_none());
        let e = l.lookup(2, u64::MAX).unwrap();
        assert_eq!((e.algo, e.proto), (2, 1));
    }

    #[test]
    fn rejects_bad_tables_with_a_reason() {
        let cases: &[(&str, &str)] = &[
            ("", "not JSON"),
            ("[]", "object"),
            (r#"{"format":"x","version":1,"layouts":[]}"#, "format"),
            (
                &format!(r#"{{"format":"{FORMAT}","version":2,"layouts":[]}}"#),
                "version 2",
            ),
            (
                &format!(r#"{{"format":"{FORMAT}","version":1,"layouts":[],"x":1}}"#),
                "unknown key",
            ),
            (
                &table(r#"{"collective":"alltoall","algo":"ring","proto":"ll"}"#),
                "collective",
            ),
            (
                &table(r#"{"collective":"allreduce","algo":"mesh","proto":"ll"}"#),
                "algo",
            ),
            (
                &table(r#"{"collective":"allreduce","algo":"ring","proto":"ll64"}"#),
                "proto",
            ),
            (
                &table(r#"{"collective":"allreduce","algo":"ring"}"#),
                "proto",
            ),
            (
                &table(
                    r#"{"collective":"allreduce","algo":"ring","proto":"ll","min_bytes":9,"max_bytes":8}"#,
                ),
                "min_bytes 9",
            ),
            (
                &table(r#"{"collective":"allreduce","algo":"ring","proto":"ll","min_bytes":-1}"#),
                "integer",
            ),
            (
                &table(r#"{"collective":"allreduce","algo":"ring","proto":"ll","max_bytes":1.5}"#),
                "integer",
            ),
            (
                &table(r#"{"collective":"allreduce","algo":"ring","proto":"ll","nchannels":0}"#),
                "nchannels",
            ),
            (
                &table(r#"{"collective":"allreduce","algo":"ring","proto":"ll","nchannels":65}"#),
                "nchannels",
            ),
            (
                &table(r#"{"collective":"allreduce","algo":"ring","proto":"ll","chunk_bytes":0}"#),
                "chunk_bytes",
            ),
            (
                &table(r#"{"collective":"allreduce","algo":"ring","proto":"ll","nchanels":4}"#),
                "unknown key",
            ),
            (
                &table(
                    r#"{"collective":"allreduce","algo":"ring","proto":"ll","max_bytes":100},
                       {"collective":"allreduce","algo":"tree","proto":"ll","min_bytes":100}"#,
                ),
                "overlap",
            ),
            (
                &format!(
                    r#"{{"format":"{FORMAT}","version":1,"layouts":[{{"nranks":2,"nnodes":3,"entries":[]}}]}}"#
                ),
                "nnodes",
            ),
            (
                &format!(
                    r#"{{"format":"{FORMAT}","version":1,"layouts":[
                        {{"nranks":2,"nnodes":1,"entries":[]}},{{"nranks":2,"nnodes":1,"entries":[]}}]}}"#
                ),
                "second layout",
            ),
        ];
        for (text, why) in cases {
            let e = Table::parse(text.as_bytes()).unwrap_err();
            assert!(e.contains(why), "{text}: {e} (want {why:?})");
        }
    }

    #[test]
    fn an_engine_table_is_told_apart() {
        let engine = r#"{"format":"hetccl-tuning","version":1,"layouts":[]}"#;
        assert_eq!(
            Table::parse(engine.as_bytes()),
            Err(ENGINE_TABLE.to_string())
        );
    }

    #[test]
    fn bounds_sizes_and_counts() {
        let big = vec![b' '; MAX_FILE_BYTES as usize + 1];
        assert!(Table::parse(&big).unwrap_err().contains("at most"));
        let many = vec![
            r#"{"collective":"reduce","algo":"ring","proto":"ll","min_bytes":0,"max_bytes":0}"#;
            MAX_ENTRIES + 1
        ]
        .join(",");
        assert!(Table::parse(table(&many).as_bytes())
            .unwrap_err()
            .contains("at most 1024"));
        let deep = "[".repeat(100_000);
        assert!(Table::parse(deep.as_bytes()).is_err());
    }

    #[test]
    fn load_rejects_missing_and_special_files() {
        assert!(Table::load("/nonexistent/t.json")
            .unwrap_err()
            .contains("cannot open"));
        assert!(Table::load("/dev/zero").unwrap_err().contains("regular"));
        assert!(Table::load("/").unwrap_err().contains("regular"));
    }

    /// A small xorshift generator, so that the fuzz cases are reproducible.
    fn rng(seed: &mut u64) -> u64 {
        *seed ^= *seed << 13;
        *seed ^= *seed >> 7;
        *seed ^= *seed << 17;
        *seed
    }

    #[test]
    fn garbage_never_panics() {
        let good = table(
            r#"{"collective":"allreduce","min_bytes":0,"max_bytes":65535,"algo":"tree","proto":"ll","nchannels":4},
               {"collective":"broadcast","algo":"ring","proto":"simple","chunk_bytes":4096}"#,
        );
        assert!(Table::parse(good.as_bytes()).is_ok());
        let alphabet = br#"{}[]":,0123456789-.eE truefalsnl\"#;
        let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
        for round in 0..20_000 {
            let mut bytes = good.clone().into_bytes();
            let edits = 1 + rng(&mut seed) % 8;
            for _ in 0..edits {
                let at = (rng(&mut seed) as usize) % bytes.len();
                match rng(&mut seed) % 4 {
                    0 => bytes[at] = rng(&mut seed) as u8,
                    1 => bytes[at] = alphabet[(rng(&mut seed) as usize) % alphabet.len()],
                    2 => {
                        bytes.remove(at);
                    }
                    _ => bytes.insert(at, alphabet[(rng(&mut seed) as usize) % alphabet.len()]),
                }
                if bytes.is_empty() {
                    break;
                }
            }
            // Any result is fine, a panic is not; whatever parses is valid.
            if let Ok(t) = Table::parse(&bytes) {
                for l in &t.layouts {
                    assert!(l.nnodes >= 1 && l.nnodes <= l.nranks, "round {round}");
                    for e in &l.entries {
                        assert!(e.min_bytes <= e.max_bytes && e.algo < 7 && e.proto < 3);
                    }
                }
            }
        }
        for len in 0..2000 {
            let junk: Vec<u8> = (0..len).map(|_| rng(&mut seed) as u8).collect();
            assert!(Table::parse(&junk).is_err(), "random bytes of length {len}");
        }
    }
}
