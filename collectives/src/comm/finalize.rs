//! Finalizing a communicator (`ncclCommFinalize`, and `ncclCommDestroy`
//! without it): no new operations, the ones in flight on other threads
//! finish, then every link closes gracefully.
//!
//! A rank that finishes its last operation first must not break the peers'
//! same operation by closing its links: a TCP socket closed with unread
//! bytes resets the connection and drops what the peer had not read yet.
//! Each TCP link therefore half-closes and waits until the peer's kernel
//! has acknowledged every byte this rank sent (`nccl_net_plugin::tcp`'s graceful
//! close). That waits for the peer's kernel, not for its application, so a
//! rank that destroys early does not wait for slower peers to reach their
//! own destroy. Shared memory keeps its bytes however the rank leaves, so
//! its links need nothing. A communicator whose operation failed, or that
//! was aborted, closes at once: its links hold nothing worth delivering.

use std::sync::atomic::Ordering;

use super::Comm;
use crate::error::{Error, Result};

/// Finalizes `c` on the calling thread, and writes the timeline file
/// (`crate::telemetry::trace`). Idempotent; bounded by the bootstrap
/// deadline (`HETCCL_TIMEOUT_S`).
pub fn finalize(c: &Comm) -> Result<()> {
    let r = close_links(c);
    crate::telemetry::trace::flush();
    r
}

/// The last metrics file of `c` and the timeline file, and the end of its
/// status service (destroy, abort).
pub fn write_telemetry(c: &Comm) {
    if let Some(e) = c.engine.get() {
        crate::telemetry::writer::unregister(&e.links.metrics);
        if let Some(d) = &e.status {
            crate::telemetry::status::unregister(d);
        }
    }
    crate::telemetry::trace::flush();
}

fn close_links(c: &Comm) -> Result<()> {
    if c.finalized.swap(true, Ordering::AcqRel) {
        return Ok(());
    }
    let Some(e) = c.engine.get() else {
        return Ok(());
    };
    let deadline = e.settings.deadline();
    // Operations other threads run on this communicator (a nonblocking
    // communicator's helper, the GPU proxy) hold the lock until they end.
    let Some(_running) = e.exec_gate.enter_until(deadline) else {
        return Err(Error::Timeout(
            "ncclCommFinalize: an operation on another thread did not finish in time".into(),
        ));
    };
    if c.has_failed() || e.stop.is_set() {
        return Ok(());
    }
    e.links.finish(deadline);
    tracing::debug!(target: "hetccl::INIT",
        "comm {:016x} rank {}: finalized", e.comm_hash, c.rank);
    Ok(())
}
