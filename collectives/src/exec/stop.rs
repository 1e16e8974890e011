//! Why a communicator's operations must stop: it was aborted
//! (`ncclCommAbort`), or revoked by a rank (`ncclCommRevoke`, this one or a
//! peer). One word shared by every wait of the communicator (the executor,
//! the single-node paths); the first reason stays.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::Error;

const RUNNING: u64 = 0;
const ABORTED: u64 = 1;
/// Revoked by rank R: `REVOKED + R`.
const REVOKED: u64 = 2;

/// The stop state of a communicator.
#[derive(Debug, Default)]
pub struct Stop(AtomicU64);

impl Stop {
    /// Stops every wait: the communicator is aborted.
    pub fn abort(&self) {
        let _ = self
            .0
            .compare_exchange(RUNNING, ABORTED, Ordering::AcqRel, Ordering::Acquire);
    }

    /// Stops every wait: rank `by` revoked the communicator.
    pub fn revoke(&self, by: usize) {
        let code = REVOKED.saturating_add(by as u64);
        let _ = self
            .0
            .compare_exchange(RUNNING, code, Ordering::AcqRel, Ordering::Acquire);
    }

    /// Whether waits must stop.
    pub fn is_set(&self) -> bool {
        self.0.load(Ordering::Acquire) != RUNNING
    }

    /// The rank that revoked the communicator, if it was revoked.
    pub fn revoked_by(&self) -> Option<usize> {
        match self.0.load(Ordering::Acquire) {
            c if c >= REVOKED => Some((c - REVOKED) as usize),
            _ => None,
        }
    }

    /// The error a stopped wait ends with, or `None` while running.
    pub fn error(&self) -> Option<Error> {
        match self.0.load(Ordering::Acquire) {
            RUNNING => None,
            ABORTED => Some(Error::Remote("the communicator was aborted".into())),
            c => Some(Error::Revoked((c - REVOKED) as usize)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_reason_stays() {
        let s = Stop::default();
        assert!(!s.is_set() && s.error().is_none());
        s.revoke(3);
        s.abort();
        assert_eq!(s.revoked_by(), Some(3));
        assert!(matches!(s.error(), Some(Error::Revoked(3))));
        let a = Stop::default();
        a.abort();
        a.revoke(1);
        assert_eq!(a.revoked_by(), None);
        assert!(a.error().unwrap().to_string().contains("aborted"));
    }
}
