//! One sweep point: this binary run as an ordinary benchmark with one
//! algorithm (and protocol) forced through `NCCL_ALGO`/`NCCL_PROTO`, and
//! the nccl-tests rows of its output.

use std::path::Path;
use std::process::Command;

/// One row of an nccl-tests table.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    /// The `size` column: bytes of the largest buffer (NCCL's nBytes).
    pub size: u64,
    /// The `count` column: the count passed to NCCL.
    pub count: u64,
    /// The `type` column (`float`, `int32`, ...).
    pub dtype: String,
    /// Out-of-place time, microseconds.
    pub time_oop_us: f64,
    /// In-place time, microseconds.
    pub time_ip_us: f64,
    /// `#wrong` of both variants summed (`N/A` counts as 0).
    pub wrong: u64,
}

impl Row {
    /// The time a tuning table records: the faster of the two variants,
    /// which differ only by where the output lies.
    pub fn time_us(&self) -> f64 {
        self.time_oop_us.min(self.time_ip_us)
    }
}

/// The element size of an nccl-tests type name.
pub fn type_size(name: &str) -> Option<u64> {
    Some(match name {
        "int8" | "uint8" | "f8e4m3" | "f8e5m2" => 1,
        "half" | "bfloat16" => 2,
        "int32" | "uint32" | "float" => 4,
        "int64" | "uint64" | "double" => 8,
        _ => return None,
    })
}

/// The data rows of an nccl-tests table (lines that do not start with
/// `#` and have its 13 columns); anything else is skipped.
pub fn parse_rows(text: &str) -> Vec<Row> {
    let mut rows = Vec::new();
    for line in text.lines() {
        let t = line.trim();
        if t.is_empty() || t.starts_with('#') {
            continue;
        }
        let f: Vec<&str> = t.split_whitespace().collect();
        if f.len() != 13 {
            continue;
        }
        let num = |s: &str| s.parse::<f64>().ok().filter(|v| v.is_finite() && *v >= 0.0);
        let wrong = |s: &str| {
            if s == "N/A" {
                Some(0)
            } else {
                s.parse::<u64>().ok()
            }
        };
        let (Ok(size), Ok(count)) = (f[0].parse::<u64>(), f[1].parse::<u64>()) else {
            continue;
        };
        let (Some(a), Some(b), Some(w1), Some(w2)) =
            (num(f[5]), num(f[9]), wrong(f[8]), wrong(f[12]))
        else {
            continue;
        };
        rows.push(Row {
            size,
            count,
            dtype: f[2].to_string(),
            time_oop_us: a,
            time_ip_us: b,
            wrong: w1 + w2,
        });
    }
    rows
}

/// The rows of several runs of one point: for each size present in every
/// run, the median out-of-place and in-place times (the upper median of an
/// even count). `wrong` is summed.
pub fn median_rows(runs: &[Vec<Row>]) -> Vec<Row> {
    let Some(first) = runs.first() else {
        return Vec::new();
    };
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let mut out = Vec::new();
    for r in first {
        let same: Vec<&Row> = runs
            .iter()
            .filter_map(|run| run.iter().find(|x| x.size == r.size && x.count == r.count))
            .collect();
        if same.len() != runs.len() {
            continue;
        }
        out.push(Row {
            time_oop_us: median(same.iter().map(|x| x.time_oop_us).collect()),
            time_ip_us: median(same.iter().map(|x| x.time_ip_us).collect()),
            wrong: same.iter().map(|x| x.wrong).sum(),
            ..r.clone()
        });
    }
    out
}

/// What one forced run gave.
#[derive(Debug)]
pub enum Outcome {
    /// The rows, all exact.
    Rows(Vec<Row>),
    /// The run failed or was wrong; the reason (the library refused the
    /// algorithm, a rank failed, `#wrong` > 0).
    Failed(String),
}

/// Runs `exe <coll> <flags>` with `env` added, and returns its rows.
pub fn run(exe: &Path, coll: &str, flags: &[String], env: &[(&str, &str)]) -> Outcome {
    let mut cmd = Command::new(exe);
    cmd.arg(coll).args(flags);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = match cmd.output() {
        Ok(o) => o,
        Err(e) => return Outcome::Failed(format!("cannot run {}: {e}", exe.display())),
    };
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        // The benchmark's own error lines say why (a refused algorithm, a
        // failed rank); its table header does not.
        let last = err
            .lines()
            .rev()
            .find(|l| l.contains("failed"))
            .or_else(|| err.lines().rev().find(|l| l.contains("hetccl-perf:")))
            .or_else(|| err.lines().last())
            .unwrap_or("no message")
            .trim()
            .to_string();
        return Outcome::Failed(format!("exit status {:?}: {last}", out.status.code()));
    }
    let rows = parse_rows(&stdout);
    if rows.is_empty() {
        return Outcome::Failed("no table rows in the output".into());
    }
    if let Some(r) = rows.iter().find(|r| r.wrong > 0) {
        return Outcome::Failed(format!("{} wrong values at {} B", r.wrong, r.size));
    }
    Outcome::Rows(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_are_read_and_everything_else_skipped() {
        let text = "# nccl-tests version\n#\n\
            \x20          8             2     float     sum      -1    10.50    0.00    0.00       0    9.90    0.00    0.00       0\n\
            \x20     1048576        262144     float     sum      -1    812.1    1.29    1.29       0    800.0    1.31    1.31     N/A\n\
            \x20     2048   512  float  sum  -1  x  0  0  0  1  0  0  0\n\
            # Out of bounds values : 0 OK\n";
        let rows = parse_rows(text);
        assert_eq!(rows.len(), 2, "{rows:?}");
        assert_eq!((rows[0].size, rows[0].count), (8, 2));
        assert_eq!(rows[0].time_us(), 9.9);
        assert_eq!(rows[1].wrong, 0);
        assert_eq!(rows[1].dtype, "float");
        assert_eq!(type_size("bfloat16"), Some(2));
        let mut slow = rows.clone();
        slow[0].time_oop_us = 100.0;
        let mut fast = rows.clone();
        fast[0].time_oop_us = 1.0;
        let m = median_rows(&[slow, rows.clone(), fast]);
        assert_eq!(
            m[0].time_oop_us, rows[0].time_oop_us,
            "the median of 1, 10.5, 100"
        );
        let m = median_rows(&[rows.clone(), rows[..1].to_vec()]);
        assert_eq!(m.len(), 1, "sizes missing from a run are dropped");
        assert_eq!(type_size("nope"), None);
    }
}
