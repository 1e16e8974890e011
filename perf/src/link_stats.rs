//! `--link-stats`: a per-link summary at the end of a run, from each rank's
//! `hetcclCommGetStats` JSON (docs/observability.md), gathered on rank 0.
//! Libraries without that function get one line saying so.

use serde_json::Value;

/// What one rank reported: its JSON, the library's error, or nothing (the
/// library has no `hetcclCommGetStats`).
pub type Report = Result<Option<String>, String>;

/// Encodes a rank's report for the gather: `J` + JSON, `E` + error, or `N`.
pub fn encode(r: &Report) -> Vec<u8> {
    match r {
        Ok(Some(j)) => [b"J", j.as_bytes()].concat(),
        Ok(None) => b"N".to_vec(),
        Err(e) => [b"E", e.as_bytes()].concat(),
    }
}

/// Decodes [`encode`].
pub fn decode(b: &[u8]) -> Report {
    let text = String::from_utf8_lossy(b.get(1..).unwrap_or_default()).into_owned();
    match b.first() {
        Some(b'J') => Ok(Some(text)),
        Some(b'E') => Err(text),
        _ => Ok(None),
    }
}

fn u(v: &Value) -> u64 {
    v.as_u64().unwrap_or(0)
}

/// The summary lines (nccl-tests style `#` comments), one per link of
/// every rank, then one per collective kind each rank ran.
pub fn lines(reports: &[Report]) -> Vec<String> {
    if reports.iter().all(|r| matches!(r, Ok(None))) {
        return vec!["# Link stats: not available (the library has no hetcclCommGetStats)".into()];
    }
    let mut out = vec![
        "# Link stats (the executor's links; direct single-node paths count per call only)".into(),
        format!(
            "# {:>5} {:>5} {:>9} {:>14} {:>10} {:>14} {:>10} {:>7}",
            "rank", "peer", "transport", "sent (B)", "msgs", "received (B)", "msgs", "errors"
        ),
    ];
    let mut calls = Vec::new();
    for (rank, r) in reports.iter().enumerate() {
        let j: Value = match r {
            Ok(Some(t)) => match serde_json::from_str(t) {
                Ok(v) => v,
                Err(e) => {
                    out.push(format!("# {rank:>5} unreadable stats: {e}"));
                    continue;
                }
            },
            Ok(None) => {
                out.push(format!("# {rank:>5} no stats"));
                continue;
            }
            Err(e) => {
                out.push(format!("# {rank:>5} {e}"));
                continue;
            }
        };
        for l in j["links"].as_array().into_iter().flatten() {
            out.push(format!(
                "# {rank:>5} {:>5} {:>9} {:>14} {:>10} {:>14} {:>10} {:>7}",
                u(&l["peer"]),
                l["transport"].as_str().unwrap_or("?"),
                u(&l["bytes_sent"]),
                u(&l["messages_sent"]),
                u(&l["bytes_received"]),
                u(&l["messages_received"]),
                u(&l["errors"])
            ));
        }
        for c in j["collectives"].as_array().into_iter().flatten() {
            if u(&c["calls"]) == 0 {
                continue;
            }
            let algos: Vec<String> = c["algorithms"]
                .as_object()
                .into_iter()
                .flatten()
                .map(|(a, n)| format!("{a} {}", u(n)))
                .collect();
            let q = |k: &str| {
                c["latency_ns"][k]
                    .as_u64()
                    .map_or_else(|| "-".to_string(), |ns| format!("{:.1}", ns as f64 / 1e3))
            };
            calls.push(format!(
                "# {rank:>5} {}: {} calls, {} B ({}); latency p50 <= {} us, p99 <= {} us",
                c["kind"].as_str().unwrap_or("?"),
                u(&c["calls"]),
                u(&c["bytes"]),
                algos.join(", "),
                q("p50"),
                q("p99")
            ));
        }
    }
    if !calls.is_empty() {
        out.push("# Calls per rank (latency buckets are powers of two)".into());
        out.extend(calls);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_lines() {
        let j = r#"{"links":[{"peer":1,"transport":"shm","bytes_sent":100,"messages_sent":2,"bytes_received":50,"messages_received":1,"errors":0}],
                    "collectives":[{"kind":"allreduce","calls":3,"bytes":24,"algorithms":{"Board":3},"latency_ns":{"p50":2048,"p99":4096}},
                                   {"kind":"broadcast","calls":0,"bytes":0,"algorithms":{},"latency_ns":{"p50":null,"p99":null}}]}"#;
        let reports = vec![
            decode(&encode(&Ok(Some(j.into())))),
            decode(&encode(&Err("boom".into()))),
        ];
        let l = lines(&reports);
        assert!(
            l[2].contains("shm") && l[2].contains("100") && l[2].contains("50"),
            "{l:?}"
        );
        assert!(l.iter().any(|x| x.contains("boom")), "{l:?}");
        assert!(
            l.iter().any(|x| x.contains(
                "allreduce: 3 calls, 24 B (Board 3); latency p50 <= 2.0 us, p99 <= 4.1 us"
            )),
            "{l:?}"
        );
        assert!(!l.iter().any(|x| x.contains("broadcast")), "{l:?}");
        assert_eq!(lines(&[Ok(None)]).len(), 1);
    }
}
