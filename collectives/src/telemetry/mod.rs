//! Observability: always-on metrics per communicator, the timeline, and
//! their outputs.
//!
//! - `clock`: the cheap clock of both (time-stamp counter ticks).
//! - `metrics`: relaxed atomic counters per peer link and per collective
//!   kind, log-spaced latency histograms, queue wait.
//! - `render`: the metrics as JSON (`hetcclCommGetStats`) and as the
//!   Prometheus text format (`HETCCL_METRICS_FILE`).
//! - `writer`: the thread that rewrites the metrics files.
//! - `trace`: bounded per-thread rings of timeline events, and
//!   `trace_out`, which writes them as Chrome trace-event JSON
//!   (`HETCCL_TRACE_FILE`).
//! - `path`: `%h`, `%p`, `%r` in file templates.
//! - `status`: the status service (who is everyone waiting on).
//! - `profiler`: NCCL's profiler plugin (`ncclProfiler_v6`, `_v5`).

pub mod clock;
pub mod metrics;
pub mod path;
pub mod profiler;
pub mod render;
pub mod status;
pub mod trace;
mod trace_out;
pub mod writer;

pub use metrics::Metrics;
