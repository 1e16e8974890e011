//! `hetccl-perf tune`: sweeps every algorithm the library has (and, for
//! NVIDIA's NCCL, every protocol) for each collective over the sizes of the
//! benchmark flags, on the layout the flags launch, and writes a tuning
//! table (docs/tuning.md).
//!
//! Each point is this binary run as an ordinary benchmark with
//! `NCCL_ALGO` (and `NCCL_PROTO`) forced, so results are checked exactly
//! and the launch is the benchmark's own. A library that exports
//! `hetcclGetVersionString` gets hetccl's table (measured points per
//! algorithm, read by the engine through `HETCCL_TUNING_FILE`); any other
//! gets NCCL's (the fastest algorithm and protocol per size range, read by
//! hetccl's tuner plugin).

pub mod sweep;
pub mod table;

use std::path::{Path, PathBuf};

use serde_json::{json, Value};

use table::{Layout, Measure};

/// hetccl's algorithms, as `NCCL_ALGO` names them.
const HETCCL_ALGOS: [&str; 6] = [
    "Ring",
    "Tree",
    "Direct",
    "HalvingDoubling",
    "Hierarchical",
    "Pairwise",
];
/// NCCL's algorithms.
const NCCL_ALGOS: [&str; 7] = [
    "Tree",
    "Ring",
    "CollnetDirect",
    "CollnetChain",
    "NVLS",
    "NVLSTree",
    "PAT",
];
/// NCCL's protocols.
const NCCL_PROTOS: [&str; 3] = ["LL", "LL128", "Simple"];
/// The collectives swept by default.
const DEFAULT_COLLS: [&str; 5] = [
    "all_reduce",
    "all_gather",
    "reduce_scatter",
    "broadcast",
    "reduce",
];

const USAGE: &str = "usage: hetccl-perf tune [--out FILE] [--colls all_reduce,...] [--algos A,B] \
[--protos P,Q] [--format auto|hetccl|nccl] [--rounds N] [--nnodes N] [--transports shm,tcp] \
[--dry-run] BENCHMARK-FLAGS...
  Runs `hetccl-perf <collective> BENCHMARK-FLAGS` once per collective and algorithm
  (and protocol, for NCCL) with NCCL_ALGO/NCCL_PROTO set, and writes a tuning table
  to --out (merged into an existing table of the same format) or stdout.";

/// The parsed command line.
#[derive(Debug, Default)]
struct Args {
    out: Option<PathBuf>,
    colls: Vec<String>,
    algos: Option<Vec<String>>,
    protos: Option<Vec<String>>,
    format: Option<String>,
    nnodes: Option<usize>,
    transports: Option<Vec<String>>,
    dry_run: bool,
    /// Runs of each point; the median time per size is kept.
    rounds: usize,
    /// Everything else, handed to each benchmark run.
    flags: Vec<String>,
}

fn list(s: &str) -> Vec<String> {
    s.split(',')
        .map(str::trim)
        .filter(|x| !x.is_empty())
        .map(str::to_string)
        .collect()
}

fn parse(argv: &[String]) -> Result<Args, String> {
    let mut a = Args {
        colls: DEFAULT_COLLS.iter().map(|s| s.to_string()).collect(),
        rounds: 1,
        ..Args::default()
    };
    let mut it = argv.iter();
    while let Some(x) = it.next() {
        let (name, inline) = match x.split_once('=') {
            Some((n, v)) if n.starts_with("--") => (n, Some(v.to_string())),
            _ => (x.as_str(), None),
        };
        let takes = matches!(
            name,
            "--out"
                | "--colls"
                | "--algos"
                | "--protos"
                | "--format"
                | "--nnodes"
                | "--transports"
                | "--rounds"
        );
        if !takes {
            match name {
                "--dry-run" => a.dry_run = true,
                "-h" | "--help" => return Err(String::new()),
                _ => a.flags.push(x.clone()),
            }
            continue;
        }
        let v = match inline {
            Some(v) => v,
            None => it.next().cloned().ok_or(format!("{name} needs a value"))?,
        };
        match name {
            "--out" => a.out = Some(PathBuf::from(v)),
            "--colls" => a.colls = list(&v),
            "--algos" => a.algos = Some(list(&v)),
            "--protos" => a.protos = Some(list(&v)),
            "--format" => a.format = Some(v),
            "--rounds" => {
                a.rounds = v
                    .parse()
                    .ok()
                    .filter(|&r| r >= 1)
                    .ok_or(format!("--rounds {v}: a number from 1"))?
            }
            "--nnodes" => {
                a.nnodes = Some(v.parse().map_err(|_| format!("--nnodes {v}: a number"))?)
            }
            _ => a.transports = Some(list(&v)),
        }
    }
    for c in &a.colls {
        if crate::coll::Coll::from_name(c).is_none() {
            return Err(format!("--colls: unknown collective {c}"));
        }
    }
    Ok(a)
}

/// The value of a benchmark flag in `flags` (`-np 4`, `--np=4`, ...).
fn flag_value<'a>(flags: &'a [String], names: &[&str]) -> Option<&'a str> {
    let mut it = flags.iter();
    while let Some(f) = it.next() {
        for n in names {
            if f == n {
                return it.next().map(String::as_str);
            }
            if let Some(v) = f.strip_prefix(&format!("{n}=")) {
                return Some(v);
            }
        }
    }
    None
}

/// The layout the benchmark flags launch: `-np`/`--threads` ranks (or the
/// launcher's), `--hosts` nodes, and the transports hetccl joins them with
/// (shared memory inside a node, TCP between nodes), unless given.
fn layout(a: &Args) -> Layout {
    let num = |names: &[&str]| flag_value(&a.flags, names).and_then(|v| v.parse::<usize>().ok());
    let nranks = num(&["-np", "--np"])
        .or_else(|| num(&["--threads"]))
        .or_else(|| crate::launcher::rank_and_size().map(|(_, n, _)| n))
        .unwrap_or(1)
        .max(1);
    let nnodes = a
        .nnodes
        .or_else(|| num(&["--hosts"]))
        .unwrap_or(1)
        .clamp(1, nranks);
    let transports = a.transports.clone().unwrap_or_else(|| {
        let mut t = Vec::new();
        if nranks > nnodes {
            t.push("shm".to_string());
        }
        if nnodes > 1 {
            t.push("tcp".to_string());
        }
        t
    });
    let mut transports = transports;
    transports.sort();
    transports.dedup();
    Layout {
        nranks,
        nnodes,
        transports,
    }
}

/// Whether the library is hetccl (it exports `hetcclGetVersionString`).
fn is_hetccl(lib: &Path) -> Result<bool, String> {
    // SAFETY: loading an NCCL-API library, as the benchmark itself does.
    let l = unsafe { libloading::Library::new(lib) }
        .map_err(|e| format!("cannot load {}: {e}", lib.display()))?;
    // SAFETY: only the symbol's presence is checked; it is never called.
    let found = unsafe { l.get::<unsafe extern "C" fn()>(b"hetcclGetVersionString\0") }.is_ok();
    Ok(found)
}

/// The entry point of `hetccl-perf tune ARGS` (ARGS without `tune`).
pub fn main(argv: &[String]) -> i32 {
    let a = match parse(argv) {
        Ok(a) => a,
        Err(e) if e.is_empty() => {
            println!("{USAGE}");
            return 0;
        }
        Err(e) => {
            eprintln!("hetccl-perf tune: {e}\n{USAGE}");
            return 64;
        }
    };
    match run(&a) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("hetccl-perf tune: {e}");
            2
        }
    }
}

fn run(a: &Args) -> Result<(), String> {
    let lib = crate::launch::find_library(flag_value(&a.flags, &["--lib"]).map(Path::new))?;
    let hetccl = match a.format.as_deref() {
        None | Some("auto") => is_hetccl(&lib)?,
        Some("hetccl") => true,
        Some("nccl") => false,
        Some(f) => return Err(format!("--format {f}: expected auto, hetccl or nccl")),
    };
    let algos: Vec<String> = a.algos.clone().unwrap_or_else(|| {
        let all: &[&str] = if hetccl { &HETCCL_ALGOS } else { &NCCL_ALGOS };
        all.iter().map(|s| s.to_string()).collect()
    });
    let protos: Vec<Option<String>> = if hetccl {
        vec![None]
    } else {
        let p = a
            .protos
            .clone()
            .unwrap_or_else(|| NCCL_PROTOS.iter().map(|s| s.to_string()).collect());
        p.into_iter().map(Some).collect()
    };
    let lay = layout(a);
    let exe = std::env::current_exe().map_err(|e| format!("cannot find own path: {e}"))?;
    let mut flags = a.flags.clone();
    if flag_value(&flags, &["--lib"]).is_none() {
        flags.extend(["--lib".to_string(), lib.display().to_string()]);
    }
    eprintln!(
        "# hetccl-perf tune: {} table for {} ranks on {} node(s) [{}], library {}",
        if hetccl { "hetccl" } else { "NCCL" },
        lay.nranks,
        lay.nnodes,
        lay.transports.join(","),
        lib.display()
    );
    // Every (collective, algorithm, protocol) once per round, interleaved,
    // so that a slow moment of the machine does not pick the winner.
    type Key = (String, String, Option<String>);
    let mut runs: Vec<(Key, Vec<Vec<sweep::Row>>)> = Vec::new();
    let mut failed: Vec<Key> = Vec::new();
    for round in 0..a.rounds {
        for coll in &a.colls {
            for algo in &algos {
                for proto in &protos {
                    let key: Key = (coll.clone(), algo.clone(), proto.clone());
                    if failed.contains(&key) {
                        continue;
                    }
                    let mut env: Vec<(&str, &str)> = vec![("NCCL_ALGO", algo.as_str())];
                    if let Some(p) = proto {
                        env.push(("NCCL_PROTO", p.as_str()));
                    }
                    let what = format!(
                        "{coll} {algo}{}",
                        proto
                            .as_deref()
                            .map(|p| format!("/{p}"))
                            .unwrap_or_default()
                    );
                    if a.dry_run {
                        if round == 0 {
                            eprintln!(
                                "#   would run {what}: {} {coll} {}",
                                exe.display(),
                                flags.join(" ")
                            );
                        }
                        continue;
                    }
                    match sweep::run(&exe, coll, &flags, &env) {
                        sweep::Outcome::Rows(rows) => {
                            let times: Vec<String> = rows
                                .iter()
                                .map(|r| format!("{}B:{:.1}", r.size, r.time_us()))
                                .collect();
                            eprintln!("#   {what}: {}", times.join(" "));
                            match runs.iter_mut().find(|(k, _)| *k == key) {
                                Some((_, v)) => v.push(rows),
                                None => runs.push((key, vec![rows])),
                            }
                        }
                        sweep::Outcome::Failed(why) => {
                            eprintln!("#   {what}: skipped ({why})");
                            runs.retain(|(k, _)| *k != key);
                            failed.push(key);
                        }
                    }
                }
            }
        }
    }
    let measures: Vec<Measure> = runs
        .into_iter()
        .map(|((coll, algo, proto), rounds)| Measure {
            collective: table::collective_name(&coll),
            algo: algo.to_ascii_lowercase(),
            proto: proto.map(|p| p.to_ascii_lowercase()),
            rows: sweep::median_rows(&rounds),
        })
        .collect();
    if a.dry_run {
        return Ok(());
    }
    if measures.is_empty() {
        return Err("no algorithm ran: nothing to write".into());
    }
    let (format, layout_v) = if hetccl {
        (table::HETCCL_FORMAT, table::hetccl_layout(&lay, &measures))
    } else {
        (table::NCCL_FORMAT, table::nccl_layout(&lay, &measures))
    };
    let meta = json!({
        "tool": "hetccl-perf tune",
        "library": lib.display().to_string(),
        "flags": flags,
    });
    let existing: Option<Value> = match &a.out {
        Some(p) if p.exists() => {
            let text = std::fs::read_to_string(p).map_err(|e| format!("{}: {e}", p.display()))?;
            Some(serde_json::from_str(&text).map_err(|e| format!("{}: {e}", p.display()))?)
        }
        _ => None,
    };
    let whole = table::merge(format, existing, layout_v, meta)?;
    let text = serde_json::to_string_pretty(&whole).map_err(|e| e.to_string())? + "\n";
    match &a.out {
        Some(p) => {
            crate::store::write_atomic(p, text.as_bytes())?;
            eprintln!("# wrote {}", p.display());
        }
        None => print!("{text}"),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn tune_flags_are_taken_and_the_rest_passed_on() {
        let a = parse(&s(&[
            "--out",
            "/tmp/t.json",
            "-np",
            "4",
            "--hosts=2",
            "--colls",
            "all_reduce,broadcast",
            "-b",
            "8",
        ]))
        .unwrap();
        assert_eq!(a.out.as_deref(), Some(Path::new("/tmp/t.json")));
        assert_eq!(a.colls, s(&["all_reduce", "broadcast"]));
        assert_eq!(a.flags, s(&["-np", "4", "--hosts=2", "-b", "8"]));
        let l = layout(&a);
        assert_eq!((l.nranks, l.nnodes), (4, 2));
        assert_eq!(l.transports, s(&["shm", "tcp"]));
        assert!(parse(&s(&["--colls", "all_sum"])).is_err());
        assert!(parse(&s(&["--out"])).is_err());
        let one = layout(&parse(&s(&["-np", "2", "--hosts", "2"])).unwrap());
        assert_eq!(one.transports, s(&["tcp"]));
    }
}
