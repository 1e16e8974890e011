//! `hetccl-perf trace-merge a.json b.json ... > all.json`: one Chrome
//! trace-event file from the per-rank timelines `HETCCL_TRACE_FILE` writes
//! (docs/observability.md). The events are concatenated; every input keeps
//! its process ids unless an earlier input used them, in which case they
//! are moved above every id seen so far. When every input gives the Unix
//! time its timestamps count from (`otherData.origin_unix_ns`), events are
//! shifted onto the earliest origin, so that files whose origins differ
//! (the profiler plugin's, one per process) line up. `otherData` lists each
//! input's own `otherData`.

use std::collections::{HashMap, HashSet};
use std::io::Write;

use serde_json::{json, Map, Value};

/// Merges the trace files `paths`; the merged JSON object, or what is wrong
/// with an input.
pub fn merge(paths: &[String]) -> Result<Value, String> {
    let mut events: Vec<Value> = Vec::new();
    let mut inputs: Vec<Value> = Vec::new();
    let mut used: HashSet<i64> = HashSet::new();
    let mut files = Vec::with_capacity(paths.len());
    for p in paths {
        let text = std::fs::read_to_string(p).map_err(|e| format!("{p}: {e}"))?;
        let v: Value = serde_json::from_str(&text).map_err(|e| format!("{p}: {e}"))?;
        files.push((p, v));
    }
    let origins: Option<Vec<u64>> = files
        .iter()
        .map(|(_, v)| v["otherData"]["origin_unix_ns"].as_u64())
        .collect();
    let first = origins.as_ref().and_then(|o| o.iter().min().copied());
    for (i, (p, v)) in files.iter().enumerate() {
        let shift_us = match (&origins, first) {
            (Some(o), Some(f)) => (o[i] - f) as f64 / 1e3,
            _ => 0.0,
        };
        let list = v
            .get("traceEvents")
            .and_then(Value::as_array)
            .ok_or_else(|| format!("{p}: no traceEvents array"))?;
        let mine: HashSet<i64> = list
            .iter()
            .filter_map(|e| e.get("pid").and_then(Value::as_i64))
            .collect();
        let mut top = used.iter().chain(&mine).copied().max().unwrap_or(0);
        let mut remap: HashMap<i64, i64> = HashMap::new();
        let mut sorted: Vec<i64> = mine.iter().copied().collect();
        sorted.sort_unstable();
        for pid in sorted {
            if used.contains(&pid) {
                top += 1;
                remap.insert(pid, top);
            }
        }
        for e in list {
            let mut e = e.clone();
            if let Some(pid) = e.get("pid").and_then(Value::as_i64) {
                let to = remap.get(&pid).copied().unwrap_or(pid);
                e["pid"] = json!(to);
            }
            if shift_us != 0.0 {
                if let Some(ts) = e.get("ts").and_then(Value::as_f64) {
                    e["ts"] = json!(ts + shift_us);
                }
            }
            events.push(e);
        }
        used.extend(mine.iter().map(|p| remap.get(p).copied().unwrap_or(*p)));
        inputs.push(json!({
            "file": p,
            "otherData": v.get("otherData").cloned().unwrap_or(Value::Null),
        }));
    }
    // Metadata first, as the writers put it.
    events.sort_by_key(|e| e.get("ph").and_then(Value::as_str) != Some("M"));
    let mut out = Map::new();
    out.insert("displayTimeUnit".into(), json!("ns"));
    out.insert("otherData".into(), json!({ "merged": inputs }));
    out.insert("traceEvents".into(), Value::Array(events));
    Ok(Value::Object(out))
}

/// The subcommand: merges `args` (file names) to stdout. Returns the exit
/// code (0 done, 2 an input is unreadable or not a trace, 64 usage).
pub fn main(args: &[String]) -> i32 {
    if args.is_empty() || args.iter().any(|a| a == "-h" || a == "--help") {
        eprintln!("usage: hetccl-perf trace-merge FILE.json... > merged.json");
        return if args.is_empty() { 64 } else { 0 };
    }
    match merge(args) {
        Ok(v) => {
            let mut out = std::io::stdout().lock();
            let written = serde_json::to_writer(&mut out, &v)
                .map_err(std::io::Error::from)
                .and_then(|()| writeln!(out));
            match written {
                Ok(()) => 0,
                Err(e) => {
                    eprintln!("hetccl-perf trace-merge: {e}");
                    2
                }
            }
        }
        Err(e) => {
            eprintln!("hetccl-perf trace-merge: {e}");
            2
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merges_and_moves_clashing_pids() {
        let dir = std::env::temp_dir().join(format!("perf-merge-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let a = dir.join("a.json");
        let b = dir.join("b.json");
        std::fs::write(&a, r#"{"traceEvents":[{"ph":"X","pid":0,"tid":1,"ts":1,"dur":1,"name":"x"},{"ph":"M","pid":0,"tid":0,"name":"process_name","args":{"name":"rank 0"}}],"otherData":{"rank":0}}"#).unwrap();
        std::fs::write(&b, r#"{"traceEvents":[{"ph":"X","pid":0,"tid":1,"ts":2,"dur":1,"name":"y"},{"ph":"X","pid":1,"tid":1,"ts":2,"dur":1,"name":"z"}]}"#).unwrap();
        let files = [a.display().to_string(), b.display().to_string()];
        let v = merge(&files).unwrap();
        let ev = v["traceEvents"].as_array().unwrap();
        assert_eq!(ev.len(), 4);
        assert_eq!(ev[0]["ph"], "M");
        let pid = |n: &str| {
            ev.iter().find(|e| e["name"] == n).unwrap()["pid"]
                .as_i64()
                .unwrap()
        };
        assert_eq!(pid("x"), 0);
        assert_eq!(pid("z"), 1);
        assert_eq!(
            pid("y"),
            2,
            "rank 0 of the second file moves above every pid seen"
        );
        assert_eq!(v["otherData"]["merged"][0]["otherData"]["rank"], 0);
        // Origins 5 µs apart: the later file's events move by 5 µs.
        std::fs::write(&a, r#"{"traceEvents":[{"ph":"X","pid":0,"ts":1,"name":"x"}],"otherData":{"origin_unix_ns":1000}}"#).unwrap();
        std::fs::write(&b, r#"{"traceEvents":[{"ph":"X","pid":1,"ts":1,"name":"y"}],"otherData":{"origin_unix_ns":6000}}"#).unwrap();
        let v = merge(&files).unwrap();
        let ts = |n: &str| {
            v["traceEvents"]
                .as_array()
                .unwrap()
                .iter()
                .find(|e| e["name"] == n)
                .unwrap()["ts"]
                .as_f64()
                .unwrap()
        };
        assert_eq!((ts("x"), ts("y")), (1.0, 6.0));
        std::fs::write(&b, "{").unwrap();
        assert!(merge(&files).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
