//! NCCL-style logging through `tracing`.
//!
//! hetccl crates log with `tracing` macros whose target names an NCCL
//! subsystem: `tracing::info!(target: "hetccl::INIT", "...")`. [`ensure_init`]
//! installs a global subscriber that prints them the way NCCL does:
//!
//! ```text
//! node1:4242:4250 [0] NCCL INFO hetccl: comm 0x1f2e init done
//! ```
//!
//! - NCCL_DEBUG picks the level (VERSION: the version line only; WARN: also
//!   `warn!`/`error!`; INFO: also `info!`; TRACE: also `debug!`/`trace!`).
//! - NCCL_DEBUG_SUBSYS filters INFO and TRACE lines by target subsystem; WARN
//!   lines always print. Targets that are not `hetccl::<SUBSYS>` print at
//!   INFO/TRACE only with `NCCL_DEBUG_SUBSYS=ALL`.
//! - Lines go to stdout, or to NCCL_DEBUG_FILE (`%h`/`%p` expanded), or to
//!   NCCL's logger after [`set_external_logger`].
//! - If the host process already has a global `tracing` subscriber, hetccl
//!   leaves it alone and its events go there.
//!
//! docs/logging.md has the details.

mod external;
mod filter;
mod layer;
mod line;
mod sink;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Once};

use tracing_subscriber::layer::SubscriberExt;

pub use external::{has_external_logger, set_external_logger, NcclLogger};
pub use line::{gettid, set_thread_rank, short_hostname, thread_rank};
pub use sink::{expand_debug_file, expand_template};

use crate::config;

/// The NCCL version hetccl presents itself as in its version line.
pub const NCCL_VERSION_STR: &str = "2.28.0";

static INIT: Once = Once::new();
static READY: AtomicBool = AtomicBool::new(false);
static OWNS_GLOBAL: AtomicBool = AtomicBool::new(false);

/// Sets up logging from [`config::get`]'s settings, once; afterwards it costs
/// one atomic load. Never panics.
///
/// It tries `tracing::subscriber::set_global_default` with hetccl's
/// subscriber. If the process already has a global subscriber, that one is
/// kept untouched and receives hetccl's events (filtered and formatted by the
/// host, not by NCCL_DEBUG); see [`owns_global_subscriber`].
#[inline]
pub fn ensure_init() {
    if !READY.load(Ordering::Acquire) {
        init_now();
    }
}

/// [`ensure_init`]'s first call (or calls, racing).
#[cold]
#[inline(never)]
fn init_now() {
    INIT.call_once(|| {
        let installed = std::panic::catch_unwind(install).unwrap_or(false);
        OWNS_GLOBAL.store(installed, Ordering::Release);
    });
    READY.store(true, Ordering::Release);
    config::emit_warnings_once();
}

/// Builds hetccl's subscriber and tries to make it the global default.
fn install() -> bool {
    let cfg = config::loaded();
    let sink = Arc::new(sink::DestSink::new(cfg.debug_file.clone()));
    let layer = layer::NcclLayer::new(
        filter::Filter::from_config(cfg),
        sink,
        external::GLOBAL_SLOT.clone(),
    );
    let subscriber = tracing_subscriber::registry().with(layer);
    tracing::subscriber::set_global_default(subscriber).is_ok()
}

/// True when [`ensure_init`] installed hetccl's subscriber as the global
/// default; false before it ran or when the host already had one.
pub fn owns_global_subscriber() -> bool {
    OWNS_GLOBAL.load(Ordering::Acquire)
}

/// The version line: `NCCL version 2.28.0+hetccl <crate version>`.
pub fn version_line() -> String {
    format!(
        "NCCL version {NCCL_VERSION_STR}+hetccl {}",
        env!("CARGO_PKG_VERSION")
    )
}

/// Logs [`version_line`] at NCCL's VERSION level (shown for any NCCL_DEBUG
/// from VERSION up, whatever NCCL_DEBUG_SUBSYS says), the first time it is
/// called.
pub fn print_version_once() {
    static ONCE: Once = Once::new();
    ensure_init();
    ONCE.call_once(|| {
        tracing::info!(target: filter::VERSION_TARGET, "{}", version_line());
    });
}
