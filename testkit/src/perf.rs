//! hetccl-perf's tests: an nccl-tests output parser (as strict as a script
//! reading nccl-tests' tables would be), the binary of this build, and runs
//! of it against this build's libhetccl.so.

use std::path::PathBuf;
use std::process::{Command, Output};

use crate::{hetccl_so, profile_dir};

/// One variant's columns.
#[derive(Debug, Clone, PartialEq)]
pub struct Variant {
    /// Time in µs (`None` = `N/A`: variant refused by the library).
    pub time_us: Option<f64>,
    /// algbw, GB/s.
    pub algbw: Option<f64>,
    /// busbw, GB/s.
    pub busbw: Option<f64>,
    /// #wrong (`None` = `N/A`).
    pub wrong: Option<u64>,
}

/// One table row.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    /// size (B).
    pub size: u64,
    /// count (elements).
    pub count: u64,
    /// type.
    pub dtype: String,
    /// redop.
    pub redop: String,
    /// root.
    pub root: i64,
    /// Out-of-place columns.
    pub oop: Variant,
    /// In-place columns.
    pub ip: Variant,
}

/// A parsed run.
#[derive(Debug, Clone)]
pub struct Parsed {
    /// `nccl-library=` of the first line.
    pub library_version: i64,
    /// Program of `# Collective test starting:`.
    pub program: String,
    /// `#  Rank` lines.
    pub ranks: usize,
    /// The rows in order.
    pub rows: Vec<Row>,
    /// `# Out of bounds values : N OK|FAILED`.
    pub out_of_bounds: u64,
    /// Whether that line said OK.
    pub oob_ok: bool,
    /// `# Avg bus bandwidth    : x`.
    pub avg_busbw: f64,
    /// Program of `# Collective test concluded:`.
    pub concluded: String,
}

fn num(s: &str, what: &str, line: &str) -> Result<Option<f64>, String> {
    if s == "N/A" {
        return Ok(None);
    }
    s.parse::<f64>()
        .map(Some)
        .map_err(|_| format!("bad {what} '{s}' in row: {line}"))
}

fn variant(t: &[&str], line: &str) -> Result<Variant, String> {
    let wrong = if t[3] == "N/A" {
        None
    } else {
        Some(
            t[3].parse::<u64>()
                .map_err(|_| format!("bad #wrong '{}' in row: {line}", t[3]))?,
        )
    };
    Ok(Variant {
        time_us: num(t[0], "time", line)?,
        algbw: num(t[1], "algbw", line)?,
        busbw: num(t[2], "busbw", line)?,
        wrong,
    })
}

/// Parses nccl-tests stdout: header, the two label rows with every column
/// name, 13-column rows (right-aligned in nccl-tests' widths), and the
/// footer in order.
pub fn parse(out: &str) -> Result<Parsed, String> {
    let lines: Vec<&str> = out.lines().collect();
    let mut i = 0;
    let find = |i: &mut usize, pred: &dyn Fn(&str) -> bool, what: &str| -> Result<usize, String> {
        while *i < lines.len() {
            if pred(lines[*i]) {
                let at = *i;
                *i += 1;
                return Ok(at);
            }
            *i += 1;
        }
        Err(format!("missing {what}"))
    };
    let v = find(
        &mut i,
        &|l| l.starts_with("# nccl-tests version "),
        "version line",
    )?;
    let library_version = lines[v]
        .split_whitespace()
        .find_map(|w| w.strip_prefix("nccl-library="))
        .ok_or("no nccl-library= in version line")?
        .parse::<i64>()
        .map_err(|e| e.to_string())?;
    let s = find(
        &mut i,
        &|l| l.starts_with("# Collective test starting: "),
        "starting line",
    )?;
    let program = lines[s]["# Collective test starting: ".len()..]
        .trim()
        .to_string();
    let p = find(&mut i, &|l| l.starts_with("# nThread "), "parameter line")?;
    for key in [
        "nGpus",
        "minBytes",
        "maxBytes",
        "step:",
        "warmup iters:",
        "iters:",
        "agg iters:",
        "validation:",
    ] {
        if !lines[p].contains(key) {
            return Err(format!("parameter line lacks '{key}': {}", lines[p]));
        }
    }
    find(&mut i, &|l| l == "# Using devices", "# Using devices")?;
    let mut ranks = 0;
    while i < lines.len() && lines[i].starts_with("#  Rank ") {
        let t: Vec<&str> = lines[i].split_whitespace().collect();
        // #  Rank N Group G Pid P on HOST device D [BUS] NAME
        if t.len() < 12
            || t[1] != "Rank"
            || t[3] != "Group"
            || t[5] != "Pid"
            || t[7] != "on"
            || t[9] != "device"
        {
            return Err(format!("bad rank line: {}", lines[i]));
        }
        if t[2].parse::<usize>().ok() != Some(ranks) {
            return Err(format!("rank lines out of order: {}", lines[i]));
        }
        ranks += 1;
        i += 1;
    }
    let h1 = find(
        &mut i,
        &|l| l.contains("out-of-place") && l.contains("in-place"),
        "label row 1",
    )?;
    let _ = h1;
    let cols: Vec<&str> = lines
        .get(i)
        .ok_or("missing label row 2")?
        .split_whitespace()
        .collect();
    let want = [
        "#", "size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong", "time",
        "algbw", "busbw", "#wrong",
    ];
    let want_cpu: Vec<&str> = want
        .iter()
        .map(|c| if *c == "time" { "cputime" } else { *c })
        .collect();
    if cols != want && cols != want_cpu {
        return Err(format!("label row 2 is {cols:?}"));
    }
    i += 1;
    let units: Vec<&str> = lines
        .get(i)
        .ok_or("missing label row 3")?
        .split_whitespace()
        .collect();
    if units
        != [
            "#",
            "(B)",
            "(elements)",
            "(us)",
            "(GB/s)",
            "(GB/s)",
            "(us)",
            "(GB/s)",
            "(GB/s)",
        ]
    {
        return Err(format!("unit row is {units:?}"));
    }
    i += 1;
    let mut rows = Vec::new();
    while i < lines.len() && !lines[i].starts_with('#') {
        let line = lines[i];
        i += 1;
        if line.trim().is_empty() {
            continue;
        }
        let t: Vec<&str> = line.split_whitespace().collect();
        if t.len() != 13 {
            return Err(format!("row has {} columns: {line}", t.len()));
        }
        // nccl-tests' widths: "%12li  %12li  %8s  %6s  %6s", then per variant
        // "  %7s  %6s  %6s  %6g" (33 characters) or "  %7s  %6s  %6s    N/A" (32).
        let pre = [(0, 12), (14, 26), (28, 36), (38, 44), (46, 52)];
        for (k, &(a, b)) in pre.iter().enumerate() {
            let cell = line
                .get(a..b)
                .ok_or_else(|| format!("short row: {line:?}"))?;
            if cell.trim() != t[k] || cell.ends_with(' ') || (k > 0 && &line[a - 2..a] != "  ") {
                return Err(format!(
                    "column {k} is not right-aligned in nccl-tests' width: {line:?}"
                ));
            }
        }
        if !(52 + 64..=52 + 66).contains(&line.len()) {
            return Err(format!(
                "row width {} differs from nccl-tests': {line:?}",
                line.len()
            ));
        }
        rows.push(Row {
            size: t[0].parse().map_err(|_| format!("bad size in {line}"))?,
            count: t[1].parse().map_err(|_| format!("bad count in {line}"))?,
            dtype: t[2].to_string(),
            redop: t[3].to_string(),
            root: t[4].parse().map_err(|_| format!("bad root in {line}"))?,
            oop: variant(&t[5..9], line)?,
            ip: variant(&t[9..13], line)?,
        });
    }
    let o = find(
        &mut i,
        &|l| l.starts_with("# Out of bounds values : "),
        "out-of-bounds line",
    )?;
    let ot: Vec<&str> = lines[o]["# Out of bounds values : ".len()..]
        .split_whitespace()
        .collect();
    let out_of_bounds = ot
        .first()
        .and_then(|s| s.parse().ok())
        .ok_or("bad out-of-bounds count")?;
    let oob_ok = ot.get(1) == Some(&"OK");
    if !oob_ok && ot.get(1) != Some(&"FAILED") {
        return Err(format!("bad out-of-bounds line: {}", lines[o]));
    }
    if i != o + 1
        || !lines
            .get(i)
            .is_some_and(|l| l.starts_with("# Avg bus bandwidth    : "))
    {
        return Err("avg bus bandwidth line must follow".into());
    }
    let avg_busbw = lines[i]["# Avg bus bandwidth    : ".len()..]
        .split_whitespace()
        .next()
        .and_then(|s| s.parse::<f64>().ok())
        .ok_or("bad avg bus bandwidth")?;
    i += 1;
    if lines.get(i) != Some(&"#") {
        return Err("'#' must follow the bandwidth line".into());
    }
    i += 1;
    let concluded = lines
        .get(i)
        .and_then(|l| l.strip_prefix("# Collective test concluded: "))
        .ok_or("missing concluded line")?
        .to_string();
    Ok(Parsed {
        library_version,
        program,
        ranks,
        rows,
        out_of_bounds,
        oob_ok,
        avg_busbw,
        concluded,
    })
}

/// The hetccl-perf binary of this build (`<profile dir>/hetccl-perf`, where
/// cargo puts it before it runs hetccl-perf's integration tests, the path
/// they get as `CARGO_BIN_EXE_hetccl-perf`).
pub fn perf_bin() -> PathBuf {
    let p = profile_dir().join("hetccl-perf");
    assert!(
        p.is_file(),
        "{} is missing: build it with `cargo build -p hetccl-perf` (same profile)",
        p.display()
    );
    p
}

/// Runs hetccl-perf with `args` against this build's libhetccl.so.
pub fn run(args: &[&str]) -> Output {
    run_env(args, &[])
}

/// [`run`] with extra environment variables.
pub fn run_env(args: &[&str], env: &[(&str, &str)]) -> Output {
    Command::new(perf_bin())
        .args(args)
        .envs(env.iter().copied())
        .env("HETCCL_PERF_LIB", hetccl_so())
        .env_remove("HETCCL_PERF_RANK")
        .env_remove("HETCCL_PERF_NRANKS")
        .env_remove("HETCCL_PERF_STORE")
        .env_remove("OMPI_COMM_WORLD_RANK")
        .env_remove("PMI_RANK")
        .env_remove("RANK")
        .env_remove("SLURM_PROCID")
        .output()
        .expect("run hetccl-perf")
}
