//! Revoking a communicator (`ncclCommRevoke`), on this rank and on every
//! rank it reaches.
//!
//! A revoke stops the communicator's operations: its waits end within one
//! bounded sleep with "rank R revoked the communicator", and every link is
//! closed with that reason (a CLOSE frame on TCP, a revoke frame on the
//! setup socket of verbs connections, the ring's close word on shared
//! memory), so that peers blocked on this rank end the same way and
//! know who revoked it. A rank that learns of a revoke from a link revokes
//! its own communicator for the same rank, which carries the news to the
//! ranks it is linked with. As in NCCL, `ncclCommGetAsyncError` then says
//! `ncclInProgress` until no operation runs on the communicator any more,
//! then `ncclSuccess`; it can then be destroyed, split or shrunk, not
//! finalized.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use hetccl_abi::NcclResult;

use super::Comm;

/// Revokes `c` on behalf of rank `by` (this rank, or the peer whose revoke
/// reached it). Idempotent: the first revoke's rank stays.
pub fn revoke(c: &Arc<Comm>, by: usize) {
    if c.revoked.swap(true, Ordering::AcqRel) {
        return;
    }
    c.async_error
        .store(NcclResult::InProgress.raw(), Ordering::Release);
    let Some(e) = c.engine.get() else {
        c.async_error
            .store(NcclResult::Success.raw(), Ordering::Release);
        return;
    };
    tracing::warn!(target: "hetccl::INIT",
        "{} rank {}: revoked by rank {by}", e.settings.label(e.comm_hash), c.rank);
    e.links.revoke(by);
    // Quiescent once no operation holds the communicator: every wait ends
    // within one bounded sleep of the stop, so this takes milliseconds.
    let cc = c.clone();
    let wait = e.settings.timeout + Duration::from_secs(1);
    let spawned = std::thread::Builder::new()
        .name("hetccl-revoke".into())
        .spawn(move || {
            let Some(e) = cc.engine.get() else { return };
            let code = match e.exec_gate.enter_for(wait) {
                Some(_idle) => NcclResult::Success,
                None => NcclResult::RemoteError,
            };
            cc.async_error.store(code.raw(), Ordering::Release);
        });
    if spawned.is_err() {
        c.async_error
            .store(NcclResult::SystemError.raw(), Ordering::Release);
    }
}
