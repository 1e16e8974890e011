//! The `tracing` layer: filters events, formats them NCCL-style, and routes
//! them to the external logger or to hetccl's own sink.

use std::sync::Arc;

use tracing::subscriber::Interest;
use tracing::{Event, Metadata, Subscriber};
use tracing_subscriber::layer::{Context, Layer};

use super::external::Slot;
use super::filter::{Filter, Subsys};
use super::line::{format_line, MessageVisitor, TAG};
use super::sink::LineSink;

/// The layer hetccl installs (wrapped in a `Registry`).
pub(crate) struct NcclLayer {
    filter: Filter,
    sink: Arc<dyn LineSink>,
    external: Slot,
}

impl NcclLayer {
    /// A layer with the given filter, own sink, and external-logger slot.
    pub(crate) fn new(filter: Filter, sink: Arc<dyn LineSink>, external: Slot) -> NcclLayer {
        NcclLayer {
            filter,
            sink,
            external,
        }
    }
}

impl<S: Subscriber> Layer<S> for NcclLayer {
    fn register_callsite(&self, meta: &'static Metadata<'static>) -> Interest {
        // The filter is fixed for the layer's life, so a callsite's level
        // verdict can be cached; subsystems are checked per event because the
        // external logger (which skips that check) can come and go.
        if self.filter.level_of(meta).is_some() {
            Interest::always()
        } else {
            Interest::never()
        }
    }

    fn enabled(&self, meta: &Metadata<'_>, _ctx: Context<'_, S>) -> bool {
        self.filter.level_of(meta).is_some()
    }

    fn max_level_hint(&self) -> Option<tracing::level_filters::LevelFilter> {
        Some(self.filter.max_tracing_level())
    }

    fn on_event(&self, event: &Event<'_>, _ctx: Context<'_, S>) {
        let meta = event.metadata();
        let Some(level) = self.filter.level_of(meta) else {
            return;
        };
        let subsys = Subsys::of(meta.target());
        let external = self.external.read().clone();
        if external.is_none() && !self.filter.subsys_passes(level, subsys) {
            return;
        }
        let mut visitor = MessageVisitor::default();
        event.record(&mut visitor);
        let message = visitor.finish();
        match external {
            Some(fwd) => {
                let tagged = format!("{TAG}{message}");
                let file = meta.file().unwrap_or("");
                fwd.forward(
                    level,
                    subsys.flags(level),
                    file,
                    meta.line().unwrap_or(0),
                    &tagged,
                );
            }
            None => self.sink.write_line(&format_line(level, &message)),
        }
    }
}

#[cfg(test)]
mod tests;
