//! nccl-tests' stdout format (`src/util.cu`), line for line, and its JSON
//! file (`-J`, format version 3).

use crate::cfmt::{c_g, float_str};
use crate::cli::Options;

/// The nccl-tests release whose output this reproduces.
pub const NCCL_TESTS_VERSION: &str = "2.19.6";
/// The NCCL API level hetccl-perf is written against (what nccl-tests
/// prints as `nccl-headers`).
pub const HEADERS_VERSION: i32 = 22800;

/// Header lines up to and including `# Using devices` (rank lines follow).
pub fn header(
    opts: &Options,
    program: &str,
    lib_version: i32,
    lib_path: &str,
    nthreads: usize,
) -> Vec<String> {
    let mut v = vec![
        format!(
            "# nccl-tests version {NCCL_TESTS_VERSION} nccl-headers={HEADERS_VERSION} nccl-library={lib_version} hetccl-perf {} lib={lib_path}",
            env!("CARGO_PKG_VERSION")
        ),
        format!("# Collective test starting: {program}"),
    ];
    let (step, kind) = if opts.step_factor > 1 {
        (opts.step_factor, "factor")
    } else {
        (opts.step_bytes, "bytes")
    };
    v.push(format!(
        "# nThread {} nGpus 1 minBytes {} maxBytes {} step: {}({}) warmup iters: {} iters: {} agg iters: {} validation: {} graph: 0 unalign: {}",
        nthreads, opts.min_bytes, opts.max_bytes, step, kind, opts.warmup_iters, opts.iters, opts.agg_iters, opts.check, opts.unalign
    ));
    match opts.blocking {
        1 => v.push("# Blocking Enabled: wait and barrier after each inner iteration (-m) ".into()),
        2 => v.push("# Blocking Enabled: wait after each inner iteration (-m), no barrier ".into()),
        3 => v.push("# Blocking Enabled: wait and barrier after each outer iteration (-n); time excludes barrier ".into()),
        _ => {}
    }
    v.push("#".into());
    v.push("# Using devices".into());
    v
}

/// One `#  Rank ...` line: device -1, `[cpu]`, `host` for host buffers,
/// else the CUDA device's ordinal and name (`[cuda]` stands for the PCI
/// bus id nccl-tests prints).
pub fn rank_line(rank: usize, pid: u32, host: &str, device: Option<(i32, &str)>) -> String {
    let (d, tag, info) = match device {
        Some((d, name)) => (d, "cuda", name),
        None => (-1, "cpu", "host"),
    };
    format!(
        "#  Rank {rank:2} Group {:2} Pid {pid:6} on {host:>10} device {d:2} [{tag}] {info}",
        0
    )
}

/// The `#` line and the two label rows of the table.
pub fn table_header(cputime: bool) -> Vec<String> {
    let t = if cputime { "cputime" } else { "time" };
    vec![
        "#".into(),
        format!(
            "# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}           out-of-place                       in-place          ",
            "", "", "", "", ""
        ),
        format!(
            "# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6}  {:>6} ",
            "size", "count", "type", "redop", "root", t, "algbw", "busbw", "#wrong", t, "algbw", "busbw", "#wrong"
        ),
        format!(
            "# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6}  {:>6} ",
            "(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", ""
        ),
    ]
}

/// The first five columns of a row.
pub fn row_preamble(bytes: usize, count: usize, dtype: &str, redop: &str, root: i64) -> String {
    format!(
        "{bytes:>12}  {count:>12}  {dtype:>8}  {redop:>6}  {:>6}",
        format!("{root:6}")
    )
}

/// One variant's four columns (time, algbw, busbw, #wrong or `N/A`).
pub fn row_body(time_us: f64, algbw: f64, busbw: f64, wrong: Option<u64>) -> String {
    let (t, a, b) = (
        float_str(time_us, 7),
        float_str(algbw, 6),
        float_str(busbw, 6),
    );
    match wrong {
        Some(w) => format!("  {t:>7}  {a:>6}  {b:>6}  {:>6}", c_g(w as f64)),
        None => format!("  {t:>7}  {a:>6}  {b:>6}    N/A"),
    }
}

/// The four columns of a variant the library refused (in-place alltoall).
pub fn row_unsupported() -> String {
    format!("  {:>7}  {:>6}  {:>6}  {:>6}", "N/A", "N/A", "N/A", "N/A")
}

/// The footer: out-of-bounds count, average bus bandwidth, the concluding
/// line, the `#` of `finalizeFooter` and the error line (empty when none).
pub fn footer(
    errors: u64,
    avg_busbw: f64,
    min_bw: Option<f64>,
    program: &str,
    last_error: &str,
) -> Vec<String> {
    let check = match min_bw {
        None => "",
        Some(m) if avg_busbw < m * 0.9 => "FAILED",
        Some(_) => "OK",
    };
    vec![
        format!(
            "# {:<20} : {} {}",
            "Out of bounds values",
            errors,
            if errors > 0 { "FAILED" } else { "OK" }
        ),
        format!(
            "# {:<20} : {} {}",
            "Avg bus bandwidth",
            c_g(avg_busbw),
            check
        ),
        "#".into(),
        format!("# Collective test concluded: {program}"),
        "#".into(),
        if last_error.is_empty() {
            String::new()
        } else {
            format!("# error: {last_error}")
        },
    ]
}

/// Local time as nccl-tests' `formatNow` prints it.
pub fn now_string() -> String {
    // SAFETY: time/localtime_r/strftime with valid buffers.
    unsafe {
        let t = libc::time(std::ptr::null_mut());
        let mut tm: libc::tm = std::mem::zeroed();
        libc::localtime_r(&t, &mut tm);
        let mut buf = [0u8; 64];
        let fmt = b"%Y-%m-%d %H:%M:%S\0";
        let n = libc::strftime(
            buf.as_mut_ptr() as *mut libc::c_char,
            buf.len(),
            fmt.as_ptr() as *const libc::c_char,
            &tm,
        );
        String::from_utf8_lossy(&buf[..n]).into_owned()
    }
}

/// Opens the JSON output the way nccl-tests does: only for a `.json`
/// suffix, never overwriting (`path`, then `path.0`, `path.1`, ...).
/// Returns the file and its path, or a message line to print instead.
pub fn open_json(
    path: &std::path::Path,
) -> Result<(std::fs::File, std::path::PathBuf), Option<String>> {
    let is_json = path
        .extension()
        .map(|e| e.eq_ignore_ascii_case("json"))
        .unwrap_or(false);
    if !is_json {
        return Err(None);
    }
    let mut try_path = path.to_path_buf();
    let mut n = 0;
    loop {
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&try_path)
        {
            Ok(f) => return Ok((f, try_path)),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                try_path = std::path::PathBuf::from(format!("{}.{n}", path.display()));
                n += 1;
            }
            Err(_) => {
                return Err(Some(format!(
                    "# skipping json output; {} not accessible",
                    try_path.display()
                )))
            }
        }
    }
}
