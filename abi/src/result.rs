//! `ncclResult_t`.

use core::fmt;

/// The C type: a raw `int` enum. Values outside [`NcclResult`] may arrive from C.
#[allow(non_camel_case_types)]
pub type ncclResult_t = i32;

/// NCCL's result codes, with the values of `nccl.h`.
#[repr(i32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NcclResult {
    /// `ncclSuccess`.
    Success = 0,
    /// `ncclUnhandledCudaError`.
    UnhandledCudaError = 1,
    /// `ncclSystemError`.
    SystemError = 2,
    /// `ncclInternalError`.
    InternalError = 3,
    /// `ncclInvalidArgument`.
    InvalidArgument = 4,
    /// `ncclInvalidUsage`.
    InvalidUsage = 5,
    /// `ncclRemoteError`.
    RemoteError = 6,
    /// `ncclInProgress`.
    InProgress = 7,
    /// `ncclTimeout`.
    Timeout = 8,
}

/// `ncclNumResults`.
pub const NCCL_NUM_RESULTS: i32 = 9;

impl NcclResult {
    /// Every code, in value order.
    pub const ALL: [NcclResult; 9] = [
        Self::Success,
        Self::UnhandledCudaError,
        Self::SystemError,
        Self::InternalError,
        Self::InvalidArgument,
        Self::InvalidUsage,
        Self::RemoteError,
        Self::InProgress,
        Self::Timeout,
    ];

    /// The raw C value.
    pub const fn raw(self) -> ncclResult_t {
        self as i32
    }

    /// The string `ncclGetErrorString` returns for this code (NCCL's wording).
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Success => "no error",
            Self::UnhandledCudaError => {
                "unhandled cuda error (run with NCCL_DEBUG=INFO for details)"
            }
            Self::SystemError => "unhandled system error (run with NCCL_DEBUG=INFO for details)",
            Self::InternalError => {
                "internal error - please report this issue to the hetccl developers"
            }
            Self::InvalidArgument => "invalid argument (run with NCCL_DEBUG=WARN for details)",
            Self::InvalidUsage => "invalid usage (run with NCCL_DEBUG=WARN for details)",
            Self::RemoteError => "remote process exited or there was a network error",
            Self::InProgress => "NCCL operation in progress",
            Self::Timeout => "operation timed out",
        }
    }
}

impl TryFrom<i32> for NcclResult {
    type Error = i32;
    fn try_from(v: i32) -> Result<Self, i32> {
        Self::ALL
            .get(usize::try_from(v).map_err(|_| v)?)
            .copied()
            .ok_or(v)
    }
}

impl fmt::Display for NcclResult {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_reject() {
        for r in NcclResult::ALL {
            assert_eq!(NcclResult::try_from(r.raw()), Ok(r));
        }
        assert_eq!(NcclResult::try_from(9), Err(9));
        assert_eq!(NcclResult::try_from(-1), Err(-1));
    }
}
