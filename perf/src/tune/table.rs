//! The tuning tables `hetccl-perf tune` writes: hetccl's own
//! (`hetccl-tuning`: measured points per collective and algorithm, read by
//! the engine) and NCCL's (`hetccl-nccl-tuning`: the best algorithm and
//! protocol per size range, read by the tuner plugin). docs/tuning.md
//! describes both formats.

use serde_json::{json, Value};

use super::sweep::{type_size, Row};

/// What one forced run measured.
#[derive(Debug, Clone)]
pub struct Measure {
    /// The collective, in the tables' spelling (`allreduce`, ...).
    pub collective: String,
    /// The algorithm as the table spells it (lower case).
    pub algo: String,
    /// The protocol (NCCL tables only), lower case.
    pub proto: Option<String>,
    /// The rows of the run.
    pub rows: Vec<Row>,
}

/// The communicator a table's layout describes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    /// Ranks.
    pub nranks: usize,
    /// Nodes (host identities).
    pub nnodes: usize,
    /// The transports its links use, sorted (hetccl tables only).
    pub transports: Vec<String>,
}

/// The format names.
pub const HETCCL_FORMAT: &str = "hetccl-tuning";
/// The NCCL tuner plugin's format.
pub const NCCL_FORMAT: &str = "hetccl-nccl-tuning";

/// The tables' spelling of a benchmark name (`all_reduce` -> `allreduce`).
pub fn collective_name(bench: &str) -> String {
    bench.replace('_', "")
}

/// hetccl's layout: points `[bytes, us]` per collective and algorithm,
/// bytes being the count passed to NCCL times the element size (what the
/// engine's selection receives). Zero-byte rows are left out.
pub fn hetccl_layout(layout: &Layout, measures: &[Measure]) -> Value {
    let mut entries = Vec::new();
    for m in measures {
        let mut pts: Vec<(u64, f64)> = m
            .rows
            .iter()
            .filter_map(|r| Some((r.count * type_size(&r.dtype)?, r.time_us())))
            .filter(|&(b, t)| b > 0 && t > 0.0)
            .collect();
        pts.sort_by_key(|p| p.0);
        pts.dedup_by_key(|p| p.0);
        if pts.is_empty() {
            continue;
        }
        let points: Vec<Value> = pts.iter().map(|&(b, t)| json!([b, round3(t)])).collect();
        entries.push(json!({"collective": m.collective, "algo": m.algo, "points": points}));
    }
    json!({
        "nranks": layout.nranks,
        "nnodes": layout.nnodes,
        "transports": layout.transports,
        "entries": entries,
    })
}

fn round3(t: f64) -> f64 {
    (t * 1000.0).round() / 1000.0
}

/// NCCL's layout: for each collective, the fastest (algorithm, protocol)
/// at each measured size (NCCL's nBytes, the `size` column), merged into
/// ranges whose bounds lie at the geometric middle between measured sizes;
/// the first range starts at 0 and the last is unbounded.
pub fn nccl_layout(layout: &Layout, measures: &[Measure]) -> Value {
    let mut colls: Vec<&str> = measures.iter().map(|m| m.collective.as_str()).collect();
    colls.sort_unstable();
    colls.dedup();
    let mut entries = Vec::new();
    for coll in colls {
        let ms: Vec<&Measure> = measures.iter().filter(|m| m.collective == coll).collect();
        let mut sizes: Vec<u64> = ms
            .iter()
            .flat_map(|m| m.rows.iter().map(|r| r.size))
            .collect();
        sizes.sort_unstable();
        sizes.dedup();
        // The winner at each size.
        let mut best: Vec<(u64, &Measure)> = Vec::new();
        for &s in &sizes {
            let w = ms
                .iter()
                .filter_map(|m| Some((m.rows.iter().find(|r| r.size == s)?.time_us(), *m)))
                .min_by(|a, b| a.0.total_cmp(&b.0));
            if let Some((_, m)) = w {
                best.push((s, m));
            }
        }
        // Runs of one winner become ranges.
        let mut i = 0;
        while i < best.len() {
            let mut j = i;
            while j + 1 < best.len() && same_choice(best[j + 1].1, best[i].1) {
                j += 1;
            }
            let lo = if i == 0 {
                0
            } else {
                middle(best[i - 1].0, best[i].0) + 1
            };
            let m = best[i].1;
            let mut e = json!({
                "collective": coll,
                "min_bytes": lo,
                "algo": m.algo,
                "proto": m.proto.clone().unwrap_or_else(|| "simple".into()),
            });
            if j + 1 < best.len() {
                e["max_bytes"] = json!(middle(best[j].0, best[j + 1].0));
            }
            entries.push(e);
            i = j + 1;
        }
    }
    json!({"nranks": layout.nranks, "nnodes": layout.nnodes, "entries": entries})
}

fn same_choice(a: &Measure, b: &Measure) -> bool {
    a.algo == b.algo && a.proto == b.proto
}

/// The geometric middle of two sizes, rounded down, at least `a`.
fn middle(a: u64, b: u64) -> u64 {
    (((a as f64) * (b as f64)).sqrt() as u64).clamp(a, b.saturating_sub(1).max(a))
}

/// A whole table: `existing` (a parsed file of the same format) with any
/// layout of the same key replaced by `layout`, or a new table.
pub fn merge(
    format: &str,
    existing: Option<Value>,
    layout: Value,
    meta: Value,
) -> Result<Value, String> {
    let key = |l: &Value| {
        (
            l["nranks"].clone(),
            l["nnodes"].clone(),
            l["transports"].clone(),
        )
    };
    let mut layouts: Vec<Value> = match existing {
        None => Vec::new(),
        Some(v) => {
            if v["format"] != json!(format) || v["version"] != json!(1) {
                return Err(format!(
                    "the existing file is not a {format} version 1 table; give another --out"
                ));
            }
            v["layouts"].as_array().cloned().unwrap_or_default()
        }
    };
    layouts.retain(|l| key(l) != key(&layout));
    layouts.push(layout);
    Ok(json!({"format": format, "version": 1, "meta": meta, "layouts": layouts}))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(size: u64, count: u64, t: f64) -> Row {
        Row {
            size,
            count,
            dtype: "float".into(),
            time_oop_us: t,
            time_ip_us: t + 1.0,
            wrong: 0,
        }
    }

    fn m(algo: &str, proto: Option<&str>, rows: Vec<Row>) -> Measure {
        Measure {
            collective: "allreduce".into(),
            algo: algo.into(),
            proto: proto.map(str::to_string),
            rows,
        }
    }

    #[test]
    fn nccl_ranges_follow_the_winners() {
        let a = m(
            "ring",
            Some("ll"),
            vec![
                row(8, 2, 5.0),
                row(1024, 256, 9.0),
                row(1 << 20, 1 << 18, 500.0),
            ],
        );
        let b = m(
            "tree",
            Some("simple"),
            vec![
                row(8, 2, 7.0),
                row(1024, 256, 8.0),
                row(1 << 20, 1 << 18, 400.0),
            ],
        );
        let l = Layout {
            nranks: 4,
            nnodes: 2,
            transports: vec![],
        };
        let v = nccl_layout(&l, &[a, b]);
        let e = v["entries"].as_array().unwrap();
        assert_eq!(e.len(), 2, "{v}");
        assert_eq!(
            (e[0]["algo"].as_str(), e[0]["min_bytes"].as_u64()),
            (Some("ring"), Some(0))
        );
        assert_eq!(e[0]["max_bytes"].as_u64(), Some(90), "sqrt(8*1024) = 90.5");
        assert_eq!(
            (e[1]["algo"].as_str(), e[1]["min_bytes"].as_u64()),
            (Some("tree"), Some(91))
        );
        assert!(
            e[1].get("max_bytes").is_none(),
            "the last range is unbounded"
        );
    }

    #[test]
    fn hetccl_points_use_the_count_and_skip_zero() {
        let a = m(
            "ring",
            None,
            vec![row(0, 0, 1.0), row(1024, 64, 9.0), row(8, 2, 5.0)],
        );
        let l = Layout {
            nranks: 4,
            nnodes: 2,
            transports: vec!["shm".into(), "tcp".into()],
        };
        let v = hetccl_layout(&l, &[a]);
        assert_eq!(v["entries"][0]["points"], json!([[8, 5.0], [256, 9.0]]));
        assert_eq!(v["transports"], json!(["shm", "tcp"]));
    }

    #[test]
    fn merging_replaces_the_same_layout_only() {
        let l1 = json!({"nranks": 2, "nnodes": 1, "transports": ["shm"], "entries": []});
        let l2 = json!({"nranks": 4, "nnodes": 2, "transports": ["shm", "tcp"], "entries": []});
        let t = merge(HETCCL_FORMAT, None, l1.clone(), json!({})).unwrap();
        let t = merge(HETCCL_FORMAT, Some(t), l2.clone(), json!({})).unwrap();
        let t = merge(HETCCL_FORMAT, Some(t), l1, json!({})).unwrap();
        assert_eq!(t["layouts"].as_array().unwrap().len(), 2);
        assert!(merge(NCCL_FORMAT, Some(t), l2, json!({})).is_err());
    }
}
