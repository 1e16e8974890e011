//! Command line: nccl-tests' flags (same letters, long names and defaults)
//! plus hetccl-perf's own launch options.

use std::path::PathBuf;

use clap::{Arg, ArgAction, ArgMatches, Command};

use crate::coll::Coll;
use crate::dtype::{DType, Op};

/// Where the benchmark buffers come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Alloc {
    /// `ncclMemAlloc`/`ncclMemFree` of the library under test (nccl-tests ≥
    /// 2.19 behaviour), falling back to host memory when it is missing.
    Nccl,
    /// Page-aligned host memory from hetccl-perf itself.
    Host,
    /// CUDA device memory (`cuMemAlloc` on the rank's device), with calls
    /// issued on a stream of the rank, as nccl-tests does.
    Device,
}

/// Everything a run needs to know.
#[derive(Clone, Debug)]
pub struct Options {
    /// The collective.
    pub coll: Coll,
    /// `-b`.
    pub min_bytes: usize,
    /// `-e`.
    pub max_bytes: usize,
    /// `-i`.
    pub step_bytes: usize,
    /// `-f` (1 = additive steps).
    pub step_factor: usize,
    /// `-n`.
    pub iters: usize,
    /// `-w`.
    pub warmup_iters: usize,
    /// `-m`.
    pub agg_iters: usize,
    /// `-N` (0 = forever).
    pub run_cycles: usize,
    /// `-c`.
    pub check: usize,
    /// `-o` (`None` = all).
    pub op: Option<Op>,
    /// `-d` (`None` = all).
    pub dtype: Option<DType>,
    /// `-r` (-1 = every root).
    pub root: i64,
    /// `-z`.
    pub blocking: u32,
    /// `-a`: 0 rank 0, 1 average, 2 min, 3 max.
    pub average: u32,
    /// `-T` in seconds: bounds every wait (store, init, a step without progress).
    pub timeout_s: u64,
    /// `-J`.
    pub json: Option<PathBuf>,
    /// `-C`.
    pub report_cputime: bool,
    /// `-u`.
    pub unalign: usize,
    /// `-np`: local processes to spawn.
    pub np: usize,
    /// `--threads`: ranks as threads of this process.
    pub threads: usize,
    /// `--hosts N` with `-np`: the ranks are split into N blocks of
    /// consecutive ranks, each given its own host identity
    /// (`HETCCL_HOST_ID`), so one machine stands in for N nodes. 0: unset.
    pub hosts: usize,
    /// `--lib`.
    pub lib: Option<PathBuf>,
    /// `--link-stats`: print the library's per-link counters at the end
    /// (`hetcclCommGetStats`).
    pub link_stats: bool,
    /// `--id-file`.
    pub id_file: Option<PathBuf>,
    /// `--alloc`.
    pub alloc: Alloc,
    /// `--init config|rank`.
    pub init_config: bool,
    /// `--bind-to core|none` for `-np` ranks: pin rank `r` to the `r`-th
    /// CPU this process may use (as `mpirun --bind-to core`). Default: core
    /// when the ranks fit the CPUs, none when they would oversubscribe them.
    /// A rank started by a launcher or with `--id-file` is pinned only when
    /// `core` is given, to its local rank's CPU.
    pub bind_core: Option<bool>,
    /// Messages for flags accepted with a fallback (printed by rank 0).
    pub notes: Vec<String>,
}

/// nccl-tests' `parsesize`: a number (may have decimals) with an optional
/// K/M/G suffix (powers of 1024, either case).
pub fn parse_size(s: &str) -> Result<usize, String> {
    let t = s.trim();
    let (num, unit) = match t
        .char_indices()
        .find(|&(_, c)| c.is_ascii_alphabetic() && c != 'e' && c != 'E')
    {
        Some((i, _)) => (&t[..i], t[i..].trim()),
        None => (t, ""),
    };
    let mult: f64 = match unit {
        "" => 1.0,
        "K" | "k" => 1024.0,
        "M" | "m" => 1024.0 * 1024.0,
        "G" | "g" => 1024.0 * 1024.0 * 1024.0,
        _ => return Err(format!("invalid size '{s}' (suffixes: K, M, G)")),
    };
    let v: f64 = num
        .trim()
        .parse()
        .map_err(|_| format!("invalid size '{s}'"))?;
    if v.is_nan() || v < 0.0 || !v.is_finite() {
        return Err(format!("invalid size '{s}'"));
    }
    Ok((v * mult) as usize)
}

fn parse_int(s: &str) -> Result<i64, String> {
    let t = s.trim();
    let (neg, body) = match t.strip_prefix('-') {
        Some(b) => (true, b),
        None => (false, t),
    };
    let v = if let Some(h) = body.strip_prefix("0x").or_else(|| body.strip_prefix("0X")) {
        i64::from_str_radix(h, 16)
    } else {
        body.parse::<i64>()
    }
    .map_err(|_| format!("invalid integer '{s}'"))?;
    Ok(if neg { -v } else { v })
}

/// The clap command (flags only; the collective comes from argv[0] or the
/// first argument).
pub fn command() -> Command {
    let v = |short: char, long: &'static str, help: &'static str| {
        Arg::new(long)
            .short(short)
            .long(long)
            .help(help)
            .num_args(1)
            .allow_negative_numbers(true)
    };
    Command::new("hetccl-perf")
        .about("nccl-tests-compatible benchmark for any library with NCCL's C API (loaded with dlopen)")
        .override_usage(
            "hetccl-perf <all_reduce|all_gather|broadcast|reduce|reduce_scatter|alltoall|gather|scatter|sendrecv> [FLAGS]\n       <collective>_perf [FLAGS]   (argv[0] alias, e.g. a symlink all_reduce_perf -> hetccl-perf)",
        )
        .disable_version_flag(true)
        .disable_help_flag(true)
        .arg(v('t', "nthreads", "threads per process: only 1 (use --threads N for ranks as threads)"))
        .arg(v('g', "ngpus", "GPUs per thread: only 1"))
        .arg(v('b', "minbytes", "minimum size in bytes, K/M/G suffixes (default 32M)"))
        .arg(v('e', "maxbytes", "maximum size in bytes (default 32M)"))
        .arg(v('i', "stepbytes", "additive step (default 1M)"))
        .arg(v('f', "stepfactor", "multiplicative step (default: off)"))
        .arg(v('n', "iters", "timed iterations (default 20)"))
        .arg(v('m', "agg_iters", "operations per iteration, grouped (default 1)"))
        .arg(v('w', "warmup_iters", "warm-up iterations (default 1)"))
        .arg(v('N', "run_cycles", "repeat the sweep N times, 0 = forever (default 1)"))
        .arg(v('p', "parallel_init", "accepted, no effect"))
        .arg(v('c', "check", "check iterations per size, 0 = none (default 1)"))
        .arg(v('o', "op", "sum/prod/max/min/avg/mulsum/all (default sum)"))
        .arg(v('d', "datatype", "int8..uint64, half, float, double, bfloat16, f8e4m3, f8e5m2, all (default float)"))
        .arg(v('r', "root", "root of rooted collectives, -1 = all (default 0)"))
        .arg(v('z', "blocking", "0 async, 1 barrier per op, 2 no barrier, 3 barrier per iteration, untimed (default 0)"))
        .arg(v('y', "stream_null", "accepted, no effect (host buffers use the NULL stream)"))
        .arg(v('T', "timeout", "seconds every wait may take (default 600; nccl-tests: off)"))
        .arg(v('G', "cudagraph", "only 0 (no CUDA graphs on host buffers)"))
        .arg(v('C', "report_cputime", "label the time column cputime (same clock here)"))
        .arg(v('a', "average", "time across ranks: 0 rank 0, 1 average, 2 min, 3 max (default 1)"))
        .arg(v('R', "local_register", "only 0"))
        .arg(v('S', "report_timestamps", "only 0"))
        .arg(v('J', "output_file", "JSON output file (needs a .json suffix)"))
        .arg(v('M', "memory", "only 0"))
        .arg(v('u', "unalign", "misalign buffers by N elements (default 0)"))
        .arg(v('I', "per_iter_timing", "only 0"))
        .arg(Arg::new("np").long("np").num_args(1).help("spawn N local processes, one rank each (also written -np N)"))
        .arg(Arg::new("threads").long("threads").num_args(1).help("run N ranks as threads of this process"))
        .arg(Arg::new("hosts").long("hosts").num_args(1).help("with -np: split the ranks into N consecutive blocks, each with its own HETCCL_HOST_ID (N emulated nodes)"))
        .arg(Arg::new("lib").long("lib").num_args(1).help("library to test (default: $HETCCL_PERF_LIB, else libhetccl.so next to this binary)"))
        .arg(Arg::new("id-file").long("id-file").num_args(1).help("rendezvous file on a shared filesystem, for ranks from mpirun/torchrun/Slurm"))
        .arg(Arg::new("alloc").long("alloc").num_args(1).help("buffers from 'nccl' (ncclMemAlloc, default), 'host' or 'device' (cuMemAlloc)"))
        .arg(Arg::new("bind-to").long("bind-to").num_args(1).help("-np ranks: 'core' pins rank r to the r-th usable CPU, 'none' does not (default: core unless ranks outnumber CPUs); launcher and --id-file ranks: pinned to their local rank's CPU only with 'core'"))
        .arg(Arg::new("init").long("init").num_args(1).help("'config' (ncclCommInitRankConfig, default) or 'rank' (ncclCommInitRank)"))
        .arg(Arg::new("link-stats").long("link-stats").action(ArgAction::SetTrue).help("print a per-link summary at the end (bytes, messages, errors per peer, from hetcclCommGetStats)"))
        .arg(Arg::new("help").short('h').long("help").action(ArgAction::Help).help("print help"))
}

/// Splits argv into the collective and the flags: `all_reduce_perf ...`
/// (argv[0] alias) or `hetccl-perf all_reduce ...`. `-np` is rewritten to
/// `--np` (getopt-style parsing would read it as `-n p`).
pub fn split_argv(argv: &[String]) -> Result<(Coll, Vec<String>), String> {
    let prog = argv
        .first()
        .map(|s| s.rsplit('/').next().unwrap_or(s).to_string())
        .unwrap_or_default();
    let (coll, rest) = match Coll::from_name(&prog) {
        Some(c) => (c, &argv[1.min(argv.len())..]),
        None => {
            let sub = argv.get(1).ok_or_else(usage_error)?;
            match Coll::from_name(sub) {
                Some(c) => (c, &argv[2..]),
                None if sub == "-h" || sub == "--help" => return Err(String::new()),
                None => return Err(format!("unknown collective '{sub}'\n{}", usage_error())),
            }
        }
    };
    let flags = rest
        .iter()
        .map(|a| match a.as_str() {
            "-np" => "--np".to_string(),
            s if s.starts_with("-np=") => format!("--np={}", &s[4..]),
            s => s.to_string(),
        })
        .collect();
    Ok((coll, flags))
}

fn usage_error() -> String {
    let names: Vec<&str> = Coll::ALL.iter().map(|c| c.name()).collect();
    format!(
        "usage: hetccl-perf <{}> [FLAGS] (see --help)",
        names.join("|")
    )
}

fn get<'a>(m: &'a ArgMatches, name: &str) -> Option<&'a str> {
    m.get_one::<String>(name).map(|s| s.as_str())
}

fn int_flag(m: &ArgMatches, name: &str, default: i64, min: i64) -> Result<i64, String> {
    match get(m, name) {
        None => Ok(default),
        Some(s) => {
            let v = parse_int(s).map_err(|e| format!("--{name}: {e}"))?;
            if v < min {
                return Err(format!("--{name}: {v} is below {min}"));
            }
            Ok(v)
        }
    }
}

/// Parses the flags of `coll` (argv without program and subcommand).
pub fn parse(coll: Coll, flags: &[String]) -> Result<Options, String> {
    let m = command()
        .no_binary_name(true)
        .try_get_matches_from(flags)
        .map_err(|e| e.render().to_string())?;
    let mut notes = Vec::new();
    let size = |name: &str, default: usize| -> Result<usize, String> {
        get(&m, name)
            .map(parse_size)
            .transpose()
            .map(|v| v.unwrap_or(default))
            .map_err(|e| format!("--{name}: {e}"))
    };
    let min_bytes = size("minbytes", 32 << 20)?;
    let max_bytes = size("maxbytes", 32 << 20)?;
    if min_bytes > max_bytes {
        return Err(format!(
            "invalid sizes for 'minbytes' and 'maxbytes': {min_bytes} > {max_bytes}"
        ));
    }
    for (name, only) in [
        ("nthreads", 1),
        ("ngpus", 1),
        ("cudagraph", 0),
        ("local_register", 0),
        ("report_timestamps", 0),
        ("memory", 0),
        ("per_iter_timing", 0),
    ] {
        let v = int_flag(&m, name, only, i64::MIN)?;
        if v != only {
            return Err(format!(
                "--{name} {v}: hetccl-perf supports only {only} (host buffers, one rank per thread; use -np N or --threads N for more ranks)"
            ));
        }
    }
    let op = match get(&m, "op") {
        None => Some(Op::Sum),
        Some("all") => None,
        Some(s) => match Op::from_name(s) {
            Some(o) => Some(o),
            None => {
                notes.push(format!("invalid op {s}, defaulting to sum .. "));
                Some(Op::Sum)
            }
        },
    };
    let dtype = match get(&m, "datatype") {
        None => Some(DType::Float),
        Some("all") => None,
        Some(s) => match DType::from_name(s) {
            Some(t) => Some(t),
            None => {
                notes.push(format!("invalid type {s}, defaulting to float .. "));
                Some(DType::Float)
            }
        },
    };
    let blocking = int_flag(&m, "blocking", 0, 0)?;
    if blocking > 3 {
        return Err(format!("--blocking {blocking}: must be 0..3"));
    }
    let average = int_flag(&m, "average", 1, 0)?;
    if average > 3 {
        return Err(format!("--average {average}: must be 0..3"));
    }
    let alloc = match get(&m, "alloc") {
        None | Some("nccl") => Alloc::Nccl,
        Some("host") => Alloc::Host,
        Some("device") => Alloc::Device,
        Some(s) => return Err(format!("--alloc {s}: expected 'nccl', 'host' or 'device'")),
    };
    let init_config = match get(&m, "init") {
        None | Some("config") => true,
        Some("rank") => false,
        Some(s) => return Err(format!("--init {s}: expected 'config' or 'rank'")),
    };
    let bind_core = match get(&m, "bind-to") {
        None => None,
        Some("core") => Some(true),
        Some("none") => Some(false),
        Some(s) => return Err(format!("--bind-to {s}: expected 'core' or 'none'")),
    };
    let np = int_flag(&m, "np", 0, 0)? as usize;
    let threads = int_flag(&m, "threads", 0, 0)? as usize;
    if np > 0 && threads > 0 {
        return Err("-np and --threads cannot be combined".into());
    }
    let hosts = int_flag(&m, "hosts", 0, 0)? as usize;
    if hosts > 0 && (np == 0 || hosts > np) {
        return Err(format!("--hosts {hosts}: needs -np N with N >= {hosts}"));
    }
    let timeout = int_flag(&m, "timeout", 600, 0)?;
    Ok(Options {
        coll,
        min_bytes,
        max_bytes,
        step_bytes: size("stepbytes", 1 << 20)?,
        step_factor: int_flag(&m, "stepfactor", 1, 0)? as usize,
        iters: int_flag(&m, "iters", 20, 0)? as usize,
        warmup_iters: int_flag(&m, "warmup_iters", 1, 0)? as usize,
        agg_iters: int_flag(&m, "agg_iters", 1, 1)? as usize,
        run_cycles: int_flag(&m, "run_cycles", 1, 0)? as usize,
        check: int_flag(&m, "check", 1, 0)? as usize,
        op,
        dtype,
        root: int_flag(&m, "root", 0, -1)?,
        blocking: blocking as u32,
        average: average as u32,
        timeout_s: if timeout == 0 { 600 } else { timeout as u64 },
        json: get(&m, "output_file").map(PathBuf::from),
        report_cputime: int_flag(&m, "report_cputime", 0, 0)? != 0,
        unalign: int_flag(&m, "unalign", 0, 0)? as usize,
        np,
        threads,
        hosts,
        lib: get(&m, "lib").map(PathBuf::from),
        link_stats: m.get_flag("link-stats"),
        id_file: get(&m, "id-file").map(PathBuf::from),
        alloc,
        init_config,
        bind_core,
        notes,
    })
}

impl Options {
    /// The sizes of one sweep, as nccl-tests steps them (`-f` multiplies
    /// when above 1, else `-i` adds). A zero size or step ends the sweep after one row
    /// instead of looping forever.
    pub fn sizes(&self) -> Vec<usize> {
        let mut v = Vec::new();
        let mut size = self.min_bytes;
        while size <= self.max_bytes {
            v.push(size);
            let next = if self.step_factor > 1 {
                size.saturating_mul(self.step_factor)
            } else {
                size.saturating_add(self.step_bytes)
            };
            if next <= size {
                break;
            }
            size = next;
        }
        v
    }

    /// The warm-up sizes: doubling from `-b` to `-e` regardless of `-f`.
    pub fn warmup_sizes(&self) -> Vec<usize> {
        let mut v = Vec::new();
        let mut size = self.min_bytes;
        while size <= self.max_bytes {
            v.push(size);
            if size == 0 {
                break;
            }
            size = size.saturating_mul(2);
        }
        v
    }

    /// Types to run, limited to what the library's version knows.
    pub fn dtypes(&self, version: i32) -> Vec<DType> {
        match self.dtype {
            Some(t) => vec![t],
            None => DType::ALL
                .into_iter()
                .filter(|t| t.min_version() <= version)
                .collect(),
        }
    }

    /// Ops to run (reductions only), limited to the library's version.
    pub fn ops(&self, version: i32) -> Vec<Op> {
        match self.op {
            Some(o) => vec![o],
            None => Op::ALL
                .into_iter()
                .filter(|o| o.min_version() <= version)
                .collect(),
        }
    }
}
