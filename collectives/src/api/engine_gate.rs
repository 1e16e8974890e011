//! The errors of entry points hetccl does not serve: each validates its
//! arguments fully, then returns `ncclInvalidUsage` through [`unavailable`]
//! or [`device_only`], with a message for `ncclGetLastError`.
//! `docs/api-status.md` lists these entry points.

use crate::error::Error;

/// The error for an entry point whose engine support is not built yet.
pub fn unavailable(what: &str) -> Error {
    Error::usage(format!(
        "{what} is not implemented yet in this hetccl build (see docs/api-status.md)"
    ))
}

/// The error for a device-only API (windows, signals, device comms) that the
/// host engine cannot serve; the GPU work adds them or forwards them to
/// NVIDIA's NCCL through HETCCL_NCCL_FALLBACK.
pub fn device_only(what: &str) -> Error {
    Error::usage(format!(
        "{what} is a device-side API that this hetccl build does not serve \
         (no CUDA support and no HETCCL_NCCL_FALLBACK; see docs/api-status.md)"
    ))
}
