//! The timeline as Chrome trace-event JSON (the "JSON object format" that
//! Perfetto and chrome://tracing open): metadata events naming the process
//! track (the rank) and each thread's track, then one complete (`"X"`)
//! event per slice. Timestamps are microseconds since rank 0's clock probe,
//! on rank 0's clock.

use std::fmt::Write;

use parking_lot::MutexGuard;

use super::clock;
use super::render::json_str;
use super::trace::{Event, Ring, Tracer, What};

/// Microseconds since the origin, on rank 0's clock, with ns precision.
fn ts_us(t: &Tracer, ticks: u64) -> String {
    let aligned = clock::unix_ns(ticks) as i128 + i128::from(t.offset_ns) - t.origin_ns as i128;
    let sign = if aligned < 0 { "-" } else { "" };
    let a = aligned.unsigned_abs();
    format!("{sign}{}.{:03}", a / 1000, a % 1000)
}

fn event(o: &mut String, t: &Tracer, tid: i64, e: &Event) {
    let device_name;
    let (name, cat) = match e.what {
        What::Call(k) => (k.name(), "call"),
        What::Step(s) => (s, "step"),
        What::Device(k, phase) => {
            device_name = format!("{} {phase}", k.name());
            (device_name.as_str(), "device")
        }
    };
    let dur = clock::to_ns(e.end.saturating_sub(e.start));
    let _ = write!(
        o,
        ",\n{{\"name\":\"{name}\",\"cat\":\"{cat}\",\"ph\":\"X\",\"pid\":{},\"tid\":{tid},\
         \"ts\":{},\"dur\":{}.{:03},\"args\":{{\"trace_id\":\"{}\",\"comm\":\"{:016x}\",\
         \"seq\":{},\"rank\":{},\"bytes\":{},\"peer\":{}",
        t.rank,
        ts_us(t, e.start),
        dur / 1000,
        dur % 1000,
        e.id,
        e.id.comm_hash,
        e.id.seq,
        e.rank,
        e.bytes,
        e.peer
    );
    match e.what {
        What::Call(_) => {
            let _ = write!(
                o,
                ",\"algorithm\":\"{}\",\"dtype\":\"{}\",\"op\":\"{}\"",
                e.algo, e.dtype, e.op
            );
        }
        What::Step(_) if e.chan >= 0 => {
            let _ = write!(o, ",\"channel\":{}", e.chan);
        }
        What::Step(_) => {}
        What::Device(..) => {
            let _ = write!(o, ",\"dtype\":\"{}\",\"op\":\"{}\"", e.dtype, e.op);
        }
    }
    o.push_str("}}");
}

/// The whole file.
pub(super) fn render(t: &Tracer, rings: &[MutexGuard<'_, Ring>]) -> String {
    let n: usize = rings.iter().map(|r| r.events.len()).sum();
    let mut o = String::with_capacity(512 + n * 260);
    let host = hetccl_core::obs::short_hostname();
    let pid = std::process::id();
    let _ = write!(
        o,
        "{{\"displayTimeUnit\":\"ns\",\"otherData\":{{\"host\":{},\"pid\":{pid},\"rank\":{},\
         \"comm\":\"{:016x}\",\"clock_offset_ns\":{},\"origin_unix_ns\":{},\"dropped_events\":{}}},\
         \n\"traceEvents\":[\n{{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":{},\"tid\":0,\
         \"args\":{{\"name\":{}}}}},\n{{\"name\":\"process_sort_index\",\"ph\":\"M\",\"pid\":{},\
         \"tid\":0,\"args\":{{\"sort_index\":{}}}}}",
        json_str(host),
        t.rank,
        t.comm_hash,
        t.offset_ns,
        t.origin_ns,
        rings.iter().map(|r| r.dropped).sum::<u64>(),
        t.rank,
        json_str(&format!("rank {} ({host}, pid {pid})", t.rank)),
        t.rank,
        t.rank
    );
    for r in rings {
        let _ = write!(
            o,
            ",\n{{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":{},\"tid\":{},\"args\":{{\"name\":{}}}}}",
            t.rank,
            r.tid,
            json_str(&r.name)
        );
        for e in &r.events {
            event(&mut o, t, r.tid, e);
        }
    }
    o.push_str("\n]}\n");
    o
}
