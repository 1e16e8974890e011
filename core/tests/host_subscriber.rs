//! A host process that already has a global `tracing` subscriber keeps it:
//! hetccl does not replace it, does not panic, and its events reach the host.
//! (Own test binary, so the global state is fresh.)

use std::sync::{Arc, Mutex};

use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};

/// The host's subscriber: records `target: message` of every event.
#[derive(Clone, Default)]
struct HostRecorder(Arc<Mutex<Vec<String>>>);

struct Msg(String);

impl Visit for Msg {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            self.0 = format!("{value:?}");
        }
    }
}

impl<S: Subscriber> Layer<S> for HostRecorder {
    fn on_event(&self, event: &Event<'_>, _ctx: Context<'_, S>) {
        let mut m = Msg(String::new());
        event.record(&mut m);
        if let Ok(mut v) = self.0.lock() {
            v.push(format!("{}: {}", event.metadata().target(), m.0));
        }
    }
}

#[test]
fn host_subscriber_is_kept_and_receives_hetccl_events() {
    // hetccl's own filter would drop everything with NCCL_DEBUG unset; the host
    // subscriber applies its own policy instead.
    std::env::remove_var("NCCL_DEBUG");
    std::env::set_var("HETCCL_NO_SUCH_KNOB", "1");

    let host = HostRecorder::default();
    tracing::subscriber::set_global_default(tracing_subscriber::registry().with(host.clone()))
        .expect("the host installs its subscriber first");

    hetccl_core::obs::ensure_init();
    hetccl_core::obs::ensure_init();
    assert!(!hetccl_core::obs::owns_global_subscriber());

    let cfg = hetccl_core::config::get();
    assert_eq!(cfg.debug, hetccl_core::config::DebugLevel::None);
    hetccl_core::obs::print_version_once();
    tracing::info!(target: "hetccl::NET", "to the host");

    let got = host.0.lock().map(|v| v.clone()).unwrap_or_default();
    assert!(
        got.contains(&"hetccl::ENV: unknown variable HETCCL_NO_SUCH_KNOB".to_string()),
        "{got:?}"
    );
    assert!(
        got.contains(&format!(
            "hetccl::VERSION: {}",
            hetccl_core::obs::version_line()
        )),
        "{got:?}"
    );
    assert!(
        got.contains(&"hetccl::NET: to the host".to_string()),
        "{got:?}"
    );
}
