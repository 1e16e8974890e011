//! The FFI guard around every exported function, and the last-error store
//! behind `ncclGetLastError`.
//!
//! [`guard`] runs the body under `catch_unwind`. A panic becomes
//! `ncclInternalError`; an [`Error`] becomes its code. Either way the message
//! is logged at WARN and kept for `ncclGetLastError`. Nothing unwinds into C.

use std::cell::RefCell;
use std::ffi::{c_char, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};

use hetccl_abi::{ncclResult_t, NcclResult};
use parking_lot::Mutex;

use crate::error::Error;

/// The longest message kept for `ncclGetLastError` (NCCL keeps 1 KiB).
const LAST_ERROR_MAX: usize = 1024;

thread_local! {
    /// The last error raised on this thread, and the C string handed out for it.
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

/// The last error raised on any thread: what `ncclGetLastError` returns on a
/// thread that has raised none itself (e.g. PyTorch's watchdog thread).
static GLOBAL_LAST_ERROR: Mutex<String> = Mutex::new(String::new());

/// Records `msg` as the last error, on this thread and process-wide.
pub fn set_last_error(msg: &str) {
    let mut s: String = msg.chars().filter(|&c| c != '\0').collect();
    if s.len() > LAST_ERROR_MAX {
        let mut cut = LAST_ERROR_MAX;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
    }
    *GLOBAL_LAST_ERROR.lock() = s.clone();
    let c = CString::new(s).unwrap_or_default();
    LAST_ERROR.with(|l| *l.borrow_mut() = c);
}

/// Returns a pointer to the last error message. The pointer stays valid on
/// this thread until the next hetccl call on this thread that fails or asks
/// for the last error again.
pub fn last_error_ptr() -> *const c_char {
    LAST_ERROR.with(|l| {
        let mut l = l.borrow_mut();
        if l.as_bytes().is_empty() {
            let g = GLOBAL_LAST_ERROR.lock().clone();
            *l = CString::new(g).unwrap_or_default();
        }
        l.as_ptr()
    })
}

/// Clears this thread's last error (tests use it).
pub fn clear_last_error() {
    GLOBAL_LAST_ERROR.lock().clear();
    LAST_ERROR.with(|l| *l.borrow_mut() = CString::default());
}

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
        let msg = unsafe { std::ffi::CStr::from_ptr(last_error_ptr()) };
        assert!(msg.to_str().unwrap().contains("boom"));
    }

    #[test]
    fn error_codes_and_messages() {
        let r = guard("ncclTest", || Err(Error::arg("count overflows")));
        assert_eq!(r, NcclResult::InvalidArgument.raw());
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
        let msg = unsafe { std::ffi::CStr::from_ptr(last_error_ptr()) };
        assert!(msg.to_bytes().len() <= LAST_ERROR_MAX);
    }
}
