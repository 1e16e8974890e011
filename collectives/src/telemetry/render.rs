//! A metrics [`Snapshot`] as JSON (`hetcclCommGetStats`) and in the
//! Prometheus text exposition format (`HETCCL_METRICS_FILE`).

use std::fmt::Write;

use super::metrics::{bucket_upper_ns, HistSnapshot, Snapshot, ALGO_NAMES, BUCKETS};

/// Who the metrics belong to.
#[derive(Debug, Clone)]
pub struct Meta {
    /// The communicator's hash (the same on every rank).
    pub comm_hash: u64,
    /// Its `commName`, if any.
    pub comm_name: Option<String>,
    /// Ranks in the communicator.
    pub nranks: usize,
}

/// A JSON string literal.
pub fn json_str(s: &str) -> String {
    let mut o = String::with_capacity(s.len() + 2);
    o.push('"');
    for c in s.chars() {
        match c {
            '"' => o.push_str("\\\""),
            '\\' => o.push_str("\\\\"),
            '\n' => o.push_str("\\n"),
            '\r' => o.push_str("\\r"),
            '\t' => o.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                let _ = write!(o, "\\u{:04x}", c as u32);
            }
            c => o.push(c),
        }
    }
    o.push('"');
    o
}

fn opt_num(v: Option<u64>) -> String {
    v.map_or_else(|| "null".to_string(), |n| n.to_string())
}

fn hist_json(h: &HistSnapshot) -> String {
    let buckets: Vec<String> = h
        .counts
        .iter()
        .enumerate()
        .filter(|(_, &c)| c > 0)
        .map(|(i, c)| format!("[{},{c}]", opt_num(bucket_upper_ns(i))))
        .collect();
    format!(
        "{{\"count\":{},\"sum\":{},\"p50\":{},\"p99\":{},\"buckets\":[{}]}}",
        h.count(),
        h.sum_ns,
        opt_num(h.quantile_upper_ns(0.5)),
        opt_num(h.quantile_upper_ns(0.99)),
        buckets.join(",")
    )
}

/// The snapshot as one JSON object (documented in docs/observability.md).
pub fn json(m: &Meta, s: &Snapshot) -> String {
    let mut o = String::with_capacity(1024);
    let _ = write!(
        o,
        "{{\"comm\":\"{:016x}\",\"name\":{},\"rank\":{},\"nranks\":{},\"links\":[",
        m.comm_hash,
        m.comm_name.as_deref().map_or("null".to_string(), json_str),
        s.rank,
        m.nranks
    );
    for (i, l) in s.links.iter().enumerate() {
        let _ = write!(
            o,
            "{}{{\"peer\":{},\"transport\":\"{}\",\"bytes_sent\":{},\"messages_sent\":{},\
             \"bytes_received\":{},\"messages_received\":{},\"errors\":{},\"packs_sent\":{}}}",
            if i > 0 { "," } else { "" },
            l.peer,
            l.transport.name(),
            l.bytes_sent,
            l.msgs_sent,
            l.bytes_recv,
            l.msgs_recv,
            l.errors,
            l.packs_sent
        );
    }
    o.push_str("],\"collectives\":[");
    for (i, c) in s.colls.iter().enumerate() {
        let algos: Vec<String> = ALGO_NAMES
            .iter()
            .zip(c.algos)
            .filter(|(_, n)| *n > 0)
            .map(|(a, n)| format!("\"{a}\":{n}"))
            .collect();
        let _ = write!(
            o,
            "{}{{\"kind\":\"{}\",\"calls\":{},\"bytes\":{},\"algorithms\":{{{}}},\"latency_ns\":{}}}",
            if i > 0 { "," } else { "" },
            c.kind.name(),
            c.calls,
            c.bytes,
            algos.join(","),
            hist_json(&c.latency)
        );
    }
    let _ = write!(
        o,
        "],\"queue_wait_ns\":{},\"device_queue_wait_ns\":{},\"latency_sample_every\":{}}}",
        hist_json(&s.queue_wait),
        hist_json(&s.device_queue_wait),
        super::metrics::LATENCY_SAMPLE
    );
    o
}

/// A Prometheus label value, escaped.
fn label(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// Seconds, as Prometheus writes floats.
fn secs(ns: u64) -> String {
    format!("{:e}", ns as f64 / 1e9)
}

struct Prom {
    out: String,
    base: String,
}

impl Prom {
    fn family(&mut self, name: &str, kind: &str, help: &str) {
        let _ = writeln!(self.out, "# HELP {name} {help}");
        let _ = writeln!(self.out, "# TYPE {name} {kind}");
    }

    fn sample(&mut self, name: &str, labels: &str, v: impl std::fmt::Display) {
        let sep = if labels.is_empty() { "" } else { "," };
        let _ = writeln!(self.out, "{name}{{{}{sep}{labels}}} {v}", self.base);
    }

    fn histogram(&mut self, name: &str, labels: &str, h: &HistSnapshot) {
        let sep = if labels.is_empty() { "" } else { "," };
        let mut cum = 0;
        for i in 0..BUCKETS {
            cum += h.counts[i];
            let le = bucket_upper_ns(i).map_or_else(|| "+Inf".to_string(), secs);
            self.sample(
                &format!("{name}_bucket"),
                &format!("{labels}{sep}le=\"{le}\""),
                cum,
            );
        }
        self.sample(&format!("{name}_sum"), labels, secs(h.sum_ns));
        self.sample(&format!("{name}_count"), labels, h.count());
    }
}

/// The snapshot in the Prometheus text exposition format (version 0.0.4).
/// Every sample carries `comm` (the hash), `rank` and, when set,
/// `comm_name`. Collective kinds appear once they have run.
pub fn prometheus(m: &Meta, s: &Snapshot) -> String {
    let mut base = format!("comm=\"{:016x}\",rank=\"{}\"", m.comm_hash, s.rank);
    if let Some(n) = &m.comm_name {
        let _ = write!(base, ",comm_name=\"{}\"", label(n));
    }
    let mut p = Prom {
        out: String::with_capacity(4096),
        base,
    };
    p.family("hetccl_comm_ranks", "gauge", "Ranks in the communicator.");
    p.sample("hetccl_comm_ranks", "", m.nranks);
    type Field = fn(&super::metrics::LinkSnapshot) -> u64;
    let link_fields: [(&str, &str, Field); 6] = [
        (
            "hetccl_link_sent_bytes_total",
            "Bytes sent to the peer over the executor's links.",
            |l| l.bytes_sent,
        ),
        (
            "hetccl_link_sent_messages_total",
            "Messages sent to the peer.",
            |l| l.msgs_sent,
        ),
        (
            "hetccl_link_received_bytes_total",
            "Bytes received from the peer.",
            |l| l.bytes_recv,
        ),
        (
            "hetccl_link_received_messages_total",
            "Messages received from the peer.",
            |l| l.msgs_recv,
        ),
        (
            "hetccl_link_errors_total",
            "Message steps to or from the peer that failed.",
            |l| l.errors,
        ),
        (
            "hetccl_link_sent_packs_total",
            "Wire messages to the peer that carried coalesced point-to-point messages.",
            |l| l.packs_sent,
        ),
    ];
    for (name, help, f) in link_fields {
        p.family(name, "counter", help);
        for l in &s.links {
            let labels = format!("peer=\"{}\",transport=\"{}\"", l.peer, l.transport.name());
            p.sample(name, &labels, f(l));
        }
    }
    let ran: Vec<_> = s.colls.iter().filter(|c| c.calls > 0).collect();
    p.family(
        "hetccl_calls_total",
        "counter",
        "Calls completed, per kind.",
    );
    for c in &ran {
        p.sample(
            "hetccl_calls_total",
            &format!("kind=\"{}\"", c.kind.name()),
            c.calls,
        );
    }
    p.family(
        "hetccl_call_bytes_total",
        "counter",
        "Bytes of the calls completed (count x datatype size), per kind.",
    );
    for c in &ran {
        p.sample(
            "hetccl_call_bytes_total",
            &format!("kind=\"{}\"", c.kind.name()),
            c.bytes,
        );
    }
    p.family(
        "hetccl_call_algorithm_total",
        "counter",
        "Calls completed, per kind and algorithm.",
    );
    for c in &ran {
        for (a, n) in ALGO_NAMES.iter().zip(c.algos).filter(|(_, n)| *n > 0) {
            let labels = format!("kind=\"{}\",algorithm=\"{a}\"", c.kind.name());
            p.sample("hetccl_call_algorithm_total", &labels, n);
        }
    }
    p.family(
        "hetccl_call_latency_seconds",
        "histogram",
        "Call-to-completion latency, per kind.",
    );
    for c in &ran {
        p.histogram(
            "hetccl_call_latency_seconds",
            &format!("kind=\"{}\"", c.kind.name()),
            &c.latency,
        );
    }
    p.family(
        "hetccl_queue_wait_seconds",
        "histogram",
        "Call to start of the executor (queued in a group or behind another operation).",
    );
    p.histogram("hetccl_queue_wait_seconds", "", &s.queue_wait);
    p.family(
        "hetccl_device_queue_wait_seconds",
        "histogram",
        "Device-buffer calls: enqueued on the stream to started by the GPU proxy.",
    );
    p.histogram("hetccl_device_queue_wait_seconds", "", &s.device_queue_wait);
    p.out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algo::Collective;
    use crate::cost::TransportKind;
    use crate::telemetry::metrics::{Metrics, ALGO_BOARD};

    fn sample() -> (Meta, Snapshot) {
        let m = Metrics::new(1, &[Some(TransportKind::Shm), None]);
        let c = &m.colls[Collective::AllReduce as usize];
        crate::telemetry::metrics::bump(&c.calls, 1);
        crate::telemetry::metrics::bump(&c.bytes, 8);
        crate::telemetry::metrics::bump(&c.algos[ALGO_BOARD], 1);
        c.latency.record(3000);
        let meta = Meta {
            comm_hash: 0xab,
            comm_name: Some("d\"p".into()),
            nranks: 2,
        };
        (meta, m.snapshot())
    }

    #[test]
    fn prometheus_has_help_type_and_cumulative_buckets() {
        let (meta, s) = sample();
        let t = prometheus(&meta, &s);
        assert!(
            t.contains("# TYPE hetccl_call_latency_seconds histogram\n"),
            "{t}"
        );
        assert!(t.contains(
            "hetccl_calls_total{comm=\"00000000000000ab\",rank=\"1\",comm_name=\"d\\\"p\",kind=\"allreduce\"} 1\n"
        ), "{t}");
        assert!(t.contains("le=\"+Inf\"} 1\n"), "{t}");
        assert!(t.contains("hetccl_link_sent_bytes_total{comm=\"00000000000000ab\",rank=\"1\",comm_name=\"d\\\"p\",peer=\"0\",transport=\"shm\"} 0\n"), "{t}");
        assert!(!t.contains("broadcast"), "{t}");
    }

    #[test]
    fn json_names_every_kind() {
        let (meta, s) = sample();
        let j = json(&meta, &s);
        assert!(
            j.starts_with("{\"comm\":\"00000000000000ab\",\"name\":\"d\\\"p\",\"rank\":1,"),
            "{j}"
        );
        assert!(
            j.contains(
                "\"kind\":\"allreduce\",\"calls\":1,\"bytes\":8,\"algorithms\":{\"Board\":1}"
            ),
            "{j}"
        );
        assert!(j.contains("\"p50\":4096"), "{j}");
        assert_eq!(j.matches("\"kind\"").count(), Collective::ALL.len());
    }
}
