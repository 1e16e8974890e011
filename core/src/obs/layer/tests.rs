//! Filtering, formatting and routing through a real `tracing` dispatch.

use std::sync::Arc;

use parking_lot::Mutex;
use tracing_subscriber::layer::SubscriberExt;

use super::NcclLayer;
use crate::config::{DebugLevel, SubsysMask};
use crate::obs::external::{Forward, Slot};
use crate::obs::filter::Filter;
use crate::obs::line::{gettid, set_thread_rank, short_hostname};
use crate::obs::sink::BufferSink;

fn filter(level: DebugLevel, subsys: &str) -> Filter {
    Filter {
        level,
        subsys: SubsysMask::parse(subsys).0,
    }
}

/// Runs `f` under a layer with `filter`, returning the lines written.
fn capture(filter: Filter, slot: Slot, f: impl FnOnce()) -> Vec<String> {
    let sink = BufferSink::default();
    let layer = NcclLayer::new(filter, Arc::new(sink.clone()), slot);
    let subscriber = tracing_subscriber::registry().with(layer);
    tracing::subscriber::with_default(subscriber, f);
    sink.lines()
}

/// Emits one event of each kind; the message says which.
fn emit_all() {
    tracing::error!(target: "hetccl::NET", "error-net");
    tracing::warn!(target: "hetccl::NET", "warn-net");
    tracing::info!(target: "hetccl::INIT", "info-init");
    tracing::info!(target: "hetccl::NET", "info-net");
    tracing::info!(target: "other_crate::module", "info-other");
    tracing::debug!(target: "hetccl::INIT", "debug-init");
    tracing::trace!(target: "hetccl::NET", "trace-net");
    tracing::info!(target: "hetccl::VERSION", "version-line");
}

/// The messages (after the tag) of the captured lines, in order.
fn messages(lines: &[String]) -> Vec<String> {
    lines
        .iter()
        .map(|l| {
            let (_, msg) = l.split_once("hetccl: ").unwrap_or(("", l));
            msg.trim_end().to_string()
        })
        .collect()
}

fn run(level: DebugLevel, subsys: &str) -> Vec<String> {
    messages(&capture(filter(level, subsys), Slot::default(), emit_all))
}

#[test]
fn none_prints_nothing() {
    assert!(run(DebugLevel::None, "ALL").is_empty());
}

#[test]
fn version_prints_only_the_version_line() {
    assert_eq!(run(DebugLevel::Version, "ALL"), vec!["version-line"]);
}

#[test]
fn warn_prints_warnings_errors_and_version() {
    assert_eq!(
        run(DebugLevel::Warn, "INIT"),
        vec!["error-net", "warn-net", "version-line"]
    );
}

#[test]
fn info_filters_by_subsystem_but_not_warnings() {
    assert_eq!(
        run(DebugLevel::Info, "INIT"),
        vec!["error-net", "warn-net", "info-init", "version-line"]
    );
    assert_eq!(
        run(DebugLevel::Info, "NET"),
        vec!["error-net", "warn-net", "info-net", "version-line"]
    );
    assert_eq!(
        run(DebugLevel::Info, "^INIT"),
        vec!["error-net", "warn-net", "info-net", "version-line"]
    );
    assert_eq!(
        run(DebugLevel::Abort, "INIT"),
        run(DebugLevel::Info, "INIT")
    );
}

#[test]
fn other_targets_need_all() {
    assert_eq!(
        run(DebugLevel::Info, "ALL"),
        vec![
            "error-net",
            "warn-net",
            "info-init",
            "info-net",
            "info-other",
            "version-line"
        ]
    );
    assert!(!run(DebugLevel::Info, "^NET").contains(&"info-other".to_string()));
}

#[test]
fn trace_adds_debug_and_trace() {
    assert_eq!(
        run(DebugLevel::Trace, "INIT"),
        vec![
            "error-net",
            "warn-net",
            "info-init",
            "debug-init",
            "version-line"
        ]
    );
    assert_eq!(
        run(DebugLevel::Trace, "INIT,NET"),
        vec![
            "error-net",
            "warn-net",
            "info-init",
            "info-net",
            "debug-init",
            "trace-net",
            "version-line"
        ]
    );
}

#[test]
fn lines_have_the_nccl_shape() {
    let lines = capture(filter(DebugLevel::Trace, "ALL"), Slot::default(), || {
        set_thread_rank(Some(2));
        tracing::info!(target: "hetccl::INIT", "comm {} ready", 7);
        tracing::warn!(target: "hetccl::NET", peer = 3, "slow");
        set_thread_rank(None);
        tracing::debug!(target: "hetccl::INIT", "no rank");
        tracing::info!(target: "hetccl::VERSION", "NCCL version x");
    });
    let pfx = format!("{}:{}:{}", short_hostname(), std::process::id(), gettid());
    assert_eq!(
        lines,
        vec![
            format!("{pfx} [2] NCCL INFO hetccl: comm 7 ready\n"),
            format!("{pfx} [2] NCCL WARN hetccl: slow peer=3\n"),
            format!("{pfx} [-] NCCL TRACE hetccl: no rank\n"),
            format!("{pfx} [-] NCCL INFO hetccl: NCCL version x\n"),
        ]
    );
}

#[test]
fn fields_without_a_message_are_printed() {
    let lines = capture(filter(DebugLevel::Info, "ALL"), Slot::default(), || {
        tracing::info!(target: "hetccl::COLL", bytes = 64, op = "sum");
    });
    assert_eq!(messages(&lines), vec!["bytes=64 op=sum"]);
}

/// A forwarder that records what it receives.
#[derive(Default)]
struct Recorder(Mutex<Vec<(DebugLevel, u64, String)>>);

impl Forward for Recorder {
    fn forward(&self, level: DebugLevel, flags: u64, file: &str, line: u32, msg: &str) {
        assert!(file.ends_with(".rs") && line > 0, "{file}:{line}");
        self.0.lock().push((level, flags, msg.to_string()));
    }
}

#[test]
fn external_logger_takes_everything_at_or_above_the_level() {
    let rec = Arc::new(Recorder::default());
    let slot = Slot::default();
    *slot.write() = Some(rec.clone() as Arc<dyn Forward>);
    let own = capture(filter(DebugLevel::Info, "INIT"), slot.clone(), emit_all);
    assert!(own.is_empty(), "{own:?}");
    let got = rec.0.lock().clone();
    let all = !0u64;
    assert_eq!(
        got,
        vec![
            (DebugLevel::Warn, all, "hetccl: error-net".to_string()),
            (DebugLevel::Warn, all, "hetccl: warn-net".to_string()),
            (DebugLevel::Info, 0x1, "hetccl: info-init".to_string()),
            (DebugLevel::Info, 0x10, "hetccl: info-net".to_string()),
            (DebugLevel::Info, all, "hetccl: info-other".to_string()),
            (DebugLevel::Version, all, "hetccl: version-line".to_string()),
        ]
    );

    // Cleared: lines come back to the own sink.
    *slot.write() = None;
    let own = capture(filter(DebugLevel::Info, "INIT"), slot, || {
        tracing::info!(target: "hetccl::INIT", "back");
    });
    assert_eq!(messages(&own), vec!["back"]);
}

#[test]
fn external_logger_still_respects_the_level() {
    let rec = Arc::new(Recorder::default());
    let slot = Slot::default();
    *slot.write() = Some(rec.clone() as Arc<dyn Forward>);
    capture(filter(DebugLevel::Warn, "ALL"), slot, emit_all);
    let levels: Vec<DebugLevel> = rec.0.lock().iter().map(|r| r.0).collect();
    assert_eq!(
        levels,
        vec![DebugLevel::Warn, DebugLevel::Warn, DebugLevel::Version]
    );
}
