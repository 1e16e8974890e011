//! `ncclGetVersion`, `ncclGetErrorString`, `ncclGetLastError`.

use std::ffi::{c_char, c_int, CStr};

use hetccl_abi::{ncclComm_t, ncclResult_t, NcclResult};

use super::check;
use super::guard::{guard, guard_value, last_error_ptr};
use crate::export;

/// The NCCL API level hetccl implements, as `NCCL_VERSION(2, 28, 0)`.
///
/// 2.28 is the level whose host API hetccl serves: it includes
/// ncclCommShrink and ncclMemAlloc (2.19/2.27, which PyTorch gates on) and the
/// 2.28 ncclGather/ncclScatter/ncclAlltoAll that nccl-tests calls directly.
/// See `docs/api-status.md`.
pub const API_VERSION: c_int = hetccl_abi::nccl_version_code(2, 28, 0);

export! {
    /// Writes the NCCL API level hetccl implements ([`API_VERSION`]).
    fn ncclGetVersion / pncclGetVersion(version: *mut c_int) -> ncclResult_t {
        guard("ncclGetVersion", || {
            check::non_null(version, "version")?;
            // SAFETY: checked non-NULL; the caller passes a writable int.
            unsafe { *version = API_VERSION };
            Ok(())
        })
    }
}

/// Static C strings for each result code.
fn error_cstr(result: ncclResult_t) -> &'static CStr {
    match NcclResult::try_from(result) {
        Ok(NcclResult::Success) => c"no error",
        Ok(NcclResult::UnhandledCudaError) => {
            c"unhandled cuda error (run with NCCL_DEBUG=INFO for details)"
        }
        Ok(NcclResult::SystemError) => {
            c"unhandled system error (run with NCCL_DEBUG=INFO for details)"
        }
        Ok(NcclResult::InternalError) => {
            c"internal error - please report this issue to the hetccl developers"
        }
        Ok(NcclResult::InvalidArgument) => {
            c"invalid argument (run with NCCL_DEBUG=WARN for details)"
        }
        Ok(NcclResult::InvalidUsage) => c"invalid usage (run with NCCL_DEBUG=WARN for details)",
        Ok(NcclResult::RemoteError) => c"remote process exited or there was a network error",
        Ok(NcclResult::InProgress) => c"NCCL operation in progress",
        Ok(NcclResult::Timeout) => c"operation timed out",
        Err(_) => c"unknown result code",
    }
}

export! {
    /// Returns a static string describing `result`.
    fn ncclGetErrorString / pncclGetErrorString(result: ncclResult_t) -> *const c_char {
        guard_value("ncclGetErrorString", c"unknown result code".as_ptr(), || {
            error_cstr(result).as_ptr()
        })
    }
}

export! {
    /// Returns the message of the last error hetccl raised. `comm` may be
    /// NULL; messages are kept per thread, falling back to the process's last.
    fn ncclGetLastError / pncclGetLastError(comm: ncclComm_t) -> *const c_char {
        let _ = comm;
        guard_value("ncclGetLastError", c"".as_ptr(), last_error_ptr)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_and_strings() {
        let mut v = 0;
        // SAFETY: a writable int.
        assert_eq!(unsafe { ncclGetVersion(&mut v) }, 0);
        assert_eq!(v, 22800);
        // SAFETY: NULL, which the function refuses.
        assert_eq!(unsafe { ncclGetVersion(std::ptr::null_mut()) }, 4);
        // SAFETY: the function returns a static NUL-terminated string for any code.
        let s = unsafe { CStr::from_ptr(ncclGetErrorString(5)) };
        assert!(s.to_str().unwrap().starts_with("invalid usage"));
        // SAFETY: the function returns a static NUL-terminated string for any code.
        let s = unsafe { CStr::from_ptr(pncclGetErrorString(99)) };
        assert_eq!(s.to_str().unwrap(), "unknown result code");
        for r in NcclResult::ALL {
            assert_eq!(error_cstr(r.raw()).to_str().unwrap(), r.as_str());
        }
    }
}
