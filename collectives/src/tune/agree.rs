//! The messages that make every rank choose as rank 0 does, sent over the
//! (authenticated) bootstrap ring: rank 0's decision (calibrate or not,
//! the budget, its table layout), each rank's probe times, and rank 0's
//! calibrated model. Pure encoders and bounded decoders; `tune::setup`
//! sends them.

use super::calibrate::LinkTimes;
use super::table::{Layout, Table, TableError, MAX_FILE_BYTES};
use crate::cost::{CostModel, LinkClass, LinkCost};
use crate::error::{Error, Result};

const DECISION_MAGIC: &[u8; 4] = b"HTD1";
const TIMES_MAGIC: &[u8; 4] = b"HTT1";
const MODEL_MAGIC: &[u8; 4] = b"HTM1";
/// The largest decision message (a whole table file's worth of layout).
pub const MAX_DECISION_BYTES: usize = 13 + MAX_FILE_BYTES as usize;
/// The most probe results one rank sends (one per link class).
const MAX_TIMES: usize = LinkClass::ALL.len();
/// The largest times message.
pub const MAX_TIMES_BYTES: usize = 4 + 1 + MAX_TIMES * 25 + 8;
/// The size of a model message.
pub const MODEL_BYTES: usize = 4 + 9 * 8;

/// What rank 0 decided for the communicator.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    /// Calibrate the cost model (`HETCCL_TUNE` on rank 0).
    pub calibrate: bool,
    /// The probe's budget in milliseconds (rank 0's).
    pub budget_ms: u32,
    /// Rank 0's table layout for this communicator.
    pub layout: Option<Layout>,
}

fn remote(what: &str) -> Error {
    Error::Remote(format!("tune: rank 0's {what}").into())
}

/// Encodes a decision; a layout whose JSON would not fit is left out
/// (`None` returned second when that happened).
pub fn encode_decision(d: &Decision) -> (Vec<u8>, bool) {
    let json = d.layout.as_ref().map(Layout::to_json);
    let fits = json
        .as_ref()
        .is_none_or(|j| j.len() as u64 <= MAX_FILE_BYTES);
    let json = if fits { json } else { None };
    let mut out = Vec::with_capacity(13 + json.as_ref().map_or(0, String::len));
    out.extend_from_slice(DECISION_MAGIC);
    out.push(u8::from(d.calibrate) | (u8::from(json.is_some()) << 1));
    out.extend_from_slice(&d.budget_ms.to_le_bytes());
    let body = json.unwrap_or_default();
    out.extend_from_slice(&(body.len() as u32).to_le_bytes());
    out.extend_from_slice(body.as_bytes());
    (out, fits)
}

/// Decodes rank 0's decision for a communicator of `nranks` on `nnodes`;
/// the layout is parsed as a table file and must be for that shape.
pub fn decode_decision(b: &[u8], nranks: u64, nnodes: u64) -> Result<Decision> {
    if b.len() < 13 || &b[..4] != DECISION_MAGIC || b.len() > MAX_DECISION_BYTES {
        return Err(remote("decision is malformed"));
    }
    let flags = b[4];
    if flags & !3 != 0 {
        return Err(remote("decision has unknown flags"));
    }
    let budget_ms = u32::from_le_bytes(b[5..9].try_into().expect("4 bytes"));
    let len = u32::from_le_bytes(b[9..13].try_into().expect("4 bytes")) as usize;
    if b.len() != 13 + len || (len > 0) != (flags & 2 != 0) || budget_ms == 0 {
        return Err(remote("decision is malformed"));
    }
    let layout = if len > 0 {
        let mut t = Table::parse(&b[13..]).map_err(|e: TableError| {
            Error::Remote(format!("tune: rank 0's table layout: {e}").into())
        })?;
        if t.layouts.len() != 1 || t.layouts[0].nranks != nranks || t.layouts[0].nnodes != nnodes {
            return Err(remote("table layout is not for this communicator"));
        }
        t.layouts.pop()
    } else {
        None
    };
    Ok(Decision {
        calibrate: flags & 1 != 0,
        budget_ms,
        layout,
    })
}

fn class_code(c: LinkClass) -> u8 {
    match c {
        LinkClass::SameProcess => 0,
        LinkClass::SameNode => 1,
        LinkClass::CrossNode => 2,
    }
}

fn f64_at(b: &[u8], at: usize) -> f64 {
    f64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// Encodes a rank's probe times and, on rank 0, its reduction cost.
pub fn encode_times(times: &[LinkTimes], reduce_us_per_byte: Option<f64>) -> Vec<u8> {
    let times = &times[..times.len().min(MAX_TIMES)];
    let mut out = Vec::with_capacity(MAX_TIMES_BYTES);
    out.extend_from_slice(TIMES_MAGIC);
    out.push(times.len() as u8);
    for t in times {
        out.push(class_code(t.class));
        out.extend_from_slice(&t.rtt_us.to_le_bytes());
        out.extend_from_slice(&t.bulk_us.to_le_bytes());
        out.extend_from_slice(&t.bulk_bytes.to_le_bytes());
    }
    out.extend_from_slice(&reduce_us_per_byte.unwrap_or(-1.0).to_le_bytes());
    out
}

/// Decodes a rank's probe times: bounded counts, known classes, finite
/// non-negative times, bulk sizes of at least one byte.
pub fn decode_times(b: &[u8]) -> Result<(Vec<LinkTimes>, Option<f64>)> {
    let bad = || Error::Remote("tune: a peer's probe times are malformed".into());
    if b.len() < 5 || &b[..4] != TIMES_MAGIC {
        return Err(bad());
    }
    let n = b[4] as usize;
    if n > MAX_TIMES || b.len() != 5 + n * 25 + 8 {
        return Err(bad());
    }
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let at = 5 + i * 25;
        let class = *LinkClass::ALL.get(b[at] as usize).ok_or_else(bad)?;
        let (rtt_us, bulk_us) = (f64_at(b, at + 1), f64_at(b, at + 9));
        let bulk_bytes = u64::from_le_bytes(b[at + 17..at + 25].try_into().expect("8 bytes"));
        if !(rtt_us.is_finite() && rtt_us >= 0.0 && bulk_us.is_finite() && bulk_us >= 0.0)
            || bulk_bytes == 0
        {
            return Err(bad());
        }
        out.push(LinkTimes {
            class,
            rtt_us,
            bulk_us,
            bulk_bytes,
        });
    }
    let g = f64_at(b, 5 + n * 25);
    let g = match g {
        -1.0 => None,
        g if g.is_finite() && g >= 0.0 => Some(g),
        _ => return Err(bad()),
    };
    Ok((out, g))
}

fn model_fields(m: &CostModel) -> [f64; 9] {
    [
        m.same_process.alpha_us,
        m.same_process.beta_us_per_byte,
        m.same_node.alpha_us,
        m.same_node.beta_us_per_byte,
        m.cross_node.alpha_us,
        m.cross_node.beta_us_per_byte,
        m.msg_overhead_us,
        m.reduce_us_per_byte,
        m.direct_congestion,
    ]
}

/// Encodes a cost model.
pub fn encode_model(m: &CostModel) -> Vec<u8> {
    let mut out = Vec::with_capacity(MODEL_BYTES);
    out.extend_from_slice(MODEL_MAGIC);
    for f in model_fields(m) {
        out.extend_from_slice(&f.to_le_bytes());
    }
    out
}

/// Decodes rank 0's model: every number finite and non-negative, every
/// link's β positive.
pub fn decode_model(b: &[u8]) -> Result<CostModel> {
    if b.len() != MODEL_BYTES || &b[..4] != MODEL_MAGIC {
        return Err(remote("cost model is malformed"));
    }
    let f: Vec<f64> = (0..9).map(|i| f64_at(b, 4 + i * 8)).collect();
    if f.iter().any(|v| !v.is_finite() || *v < 0.0) || [1, 3, 5].iter().any(|&i| f[i] <= 0.0) {
        return Err(remote("cost model has a bad number"));
    }
    let link = |i: usize| LinkCost {
        alpha_us: f[i],
        beta_us_per_byte: f[i + 1],
    };
    Ok(CostModel {
        same_process: link(0),
        same_node: link(2),
        cross_node: link(4),
        msg_overhead_us: f[6],
        reduce_us_per_byte: f[7],
        direct_congestion: f[8],
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cost::TransportKind;

    fn layout() -> Layout {
        let text = r#"{"format":"hetccl-tuning","version":1,"layouts":[
            {"nranks":4,"nnodes":2,"transports":["shm","tcp"],"entries":[
              {"collective":"allreduce","algo":"ring","points":[[8,35.2],[65536,120.0]]}]}]}"#;
        Table::parse(text.as_bytes()).unwrap().layouts.remove(0)
    }

    #[test]
    fn decisions_round_trip_and_are_checked() {
        for d in [
            Decision {
                calibrate: true,
                budget_ms: 50,
                layout: Some(layout()),
            },
            Decision {
                calibrate: false,
                budget_ms: 7,
                layout: None,
            },
        ] {
            let (b, fits) = encode_decision(&d);
            assert!(fits);
            assert_eq!(decode_decision(&b, 4, 2).unwrap(), d);
        }
        let d = Decision {
            calibrate: false,
            budget_ms: 50,
            layout: Some(layout()),
        };
        let (b, _) = encode_decision(&d);
        assert!(decode_decision(&b, 4, 1).is_err(), "another shape");
        assert!(decode_decision(&b, 8, 2).is_err(), "another shape");
        assert_eq!(
            decode_decision(&b, 4, 2)
                .unwrap()
                .layout
                .unwrap()
                .transports,
            vec![TransportKind::Shm, TransportKind::Tcp]
        );
        // Every truncation and every single-byte change of the header is
        // refused or decodes to something valid; nothing panics.
        for cut in 0..b.len() {
            assert!(decode_decision(&b[..cut], 4, 2).is_err(), "cut at {cut}");
        }
        for at in 0..13 {
            for v in [0u8, 1, 2, 3, 0x80, 0xff] {
                let mut m = b.clone();
                m[at] = v;
                let _ = decode_decision(&m, 4, 2);
            }
        }
        let mut m = b.clone();
        m[4] = 4;
        assert!(decode_decision(&m, 4, 2).is_err(), "unknown flag");
        let mut m = b.clone();
        m.push(b' ');
        assert!(decode_decision(&m, 4, 2).is_err(), "trailing byte");
        let mut m = b.clone();
        let last = m.len() - 2;
        m[last] = b'x';
        assert!(decode_decision(&m, 4, 2).is_err(), "bad JSON");
    }

    #[test]
    fn times_round_trip_and_are_checked() {
        let t = vec![
            LinkTimes {
                class: LinkClass::SameNode,
                rtt_us: 3.5,
                bulk_us: 120.0,
                bulk_bytes: 1 << 20,
            },
            LinkTimes {
                class: LinkClass::CrossNode,
                rtt_us: 60.0,
                bulk_us: 900.0,
                bulk_bytes: 1 << 20,
            },
        ];
        let b = encode_times(&t, Some(1e-4));
        assert!(b.len() <= MAX_TIMES_BYTES);
        assert_eq!(decode_times(&b).unwrap(), (t.clone(), Some(1e-4)));
        assert_eq!(
            decode_times(&encode_times(&[], None)).unwrap(),
            (vec![], None)
        );
        for cut in 0..b.len() {
            assert!(decode_times(&b[..cut]).is_err());
        }
        let mut m = b.clone();
        m[5] = 3;
        assert!(decode_times(&m).is_err(), "unknown class");
        let mut m = b.clone();
        m[6..14].copy_from_slice(&f64::NAN.to_le_bytes());
        assert!(decode_times(&m).is_err(), "NaN");
        let mut m = b.clone();
        m[14..22].copy_from_slice(&(-5.0f64).to_le_bytes());
        assert!(decode_times(&m).is_err(), "negative");
        let mut m = b.clone();
        m[22..30].copy_from_slice(&0u64.to_le_bytes());
        assert!(decode_times(&m).is_err(), "zero bytes");
        let mut m = b.clone();
        m[4] = 200;
        assert!(decode_times(&m).is_err(), "count");
    }

    #[test]
    fn models_round_trip_and_are_checked() {
        let mut m = CostModel::default();
        m.cross_node.alpha_us = 17.25;
        m.reduce_us_per_byte = 3e-5;
        let b = encode_model(&m);
        assert_eq!(decode_model(&b).unwrap(), m);
        assert!(decode_model(&b[..b.len() - 1]).is_err());
        for (field, v) in [(0, f64::INFINITY), (2, -1.0), (5, 0.0), (8, f64::NAN)] {
            let mut x = b.clone();
            x[4 + field * 8..12 + field * 8].copy_from_slice(&v.to_le_bytes());
            assert!(decode_model(&x).is_err(), "field {field} = {v}");
        }
        let mut x = b.clone();
        x[0] = b'X';
        assert!(decode_model(&x).is_err());
    }
}
