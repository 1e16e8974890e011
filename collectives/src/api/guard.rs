//! The FFI guard around every exported function (the last-error store
//! behind `ncclGetLastError` is `crate::error::last`).
//!
//! [`guard`] runs the body under `catch_unwind`. A panic becomes
//! `ncclInternalError`; an [`Error`] becomes its code. Either way the message
//! is logged at WARN and kept for `ncclGetLastError`. Nothing unwinds into C.

use std::panic::{catch_unwind, AssertUnwindSafe};

use hetccl_abi::{ncclResult_t, NcclResult};

pub use crate::error::last::{clear_last_error, last_error_ptr, set_last_error};
use crate::error::Error;

/// Runs `body` for the exported function `name` and converts its outcome to
/// `ncclResult_t`. See the module docs.
pub fn guard<F>(name: &'static str, body: F) -> ncclResult_t
where
    F: FnOnce() -> Result<(), Error>,
{
    crate::obs::ensure_init();
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => NcclResult::Success.raw(),
        Ok(Err(Error::InProgress)) => NcclResult::InProgress.raw(),
        Ok(Err(e)) => {
            let msg = format!("{name}: {e}");
            tracing::warn!(target: "hetccl::CALL", "{msg}");
            set_last_error(&msg);
            e.code().raw()
        }
        Err(payload) => {
            let what = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".to_string());
            let msg = format!("{name}: internal error (panic: {what})");
            tracing::error!(target: "hetccl::CALL", "{msg}");
            set_last_error(&msg);
            NcclResult::InternalError.raw()
        }
    }
}

/// Like [`guard`] for exports that return a value instead of a code: a panic
/// yields `fallback`.
pub fn guard_value<T, F>(name: &'static str, fallback: T, body: F) -> T
where
    F: FnOnce() -> T,
{
    crate::obs::ensure_init();
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(v) => v,
        Err(_) => {
            let msg = format!("{name}: internal error (panic)");
            tracing::error!(target: "hetccl::CALL", "{msg}");
            set_last_error(&msg);
            fallback
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn panic_becomes_internal_error() {
        let r = guard("ncclTest", || panic!("boom"));
        assert_eq!(r, NcclResult::InternalError.raw());
        // SAFETY: last_error_ptr returns a NUL-terminated string that stays valid on this thread
        // until its next hetccl call.
        let msg = unsafe { std::ffi::CStr::from_ptr(last_error_ptr()) };
        assert!(msg.to_str().unwrap().contains("boom"));
    }

    #[test]
    fn error_codes_and_messages() {
        let r = guard("ncclTest", || Err(Error::arg("count overflows")));
        assert_eq!(r, NcclResult::InvalidArgument.raw());
        // SAFETY: last_error_ptr returns a NUL-terminated string that stays valid on this thread
        // until its next hetccl call.
        let msg = unsafe { std::ffi::CStr::from_ptr(last_error_ptr()) };
        assert_eq!(
            msg.to_str().unwrap(),
            "ncclTest: invalid argument: count overflows"
        );
        assert_eq!(guard("ncclTest", || Ok(())), 0);
        assert_eq!(guard("ncclTest", || Err(Error::InProgress)), 7);
    }

    #[test]
    fn long_messages_are_bounded() {
        set_last_error(&"é".repeat(2000));
        // SAFETY: last_error_ptr returns a NUL-terminated string that stays valid on this thread
        // until its next hetccl call.
        let msg = unsafe { std::ffi::CStr::from_ptr(last_error_ptr()) };
        assert!(msg.to_bytes().len() <= crate::error::last::LAST_ERROR_MAX);
    }
}
