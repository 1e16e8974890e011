//! The engine's error type. Only the C API turns it into `ncclResult_t`.

pub mod last;

use hetccl_abi::NcclResult;

/// An error the engine reports to its caller.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A bad pointer, enum, count or rank from the caller (`ncclInvalidArgument`).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// A call that is valid C but not valid now or not supported (`ncclInvalidUsage`).
    #[error("invalid usage: {0}")]
    InvalidUsage(String),
    /// An OS call failed (`ncclSystemError`).
    #[error("system error: {0}")]
    System(String),
    /// A peer died, or the network failed (`ncclRemoteError`).
    #[error("remote error: {0}")]
    Remote(String),
    /// A bounded wait ran out (`ncclTimeout`).
    #[error("timeout: {0}")]
    Timeout(String),
    /// A broken invariant inside hetccl (`ncclInternalError`).
    #[error("internal error: {0}")]
    Internal(String),
    /// The operation was accepted and is still running (`ncclInProgress`).
    #[error("operation in progress")]
    InProgress,
    /// Rank `.0` revoked the communicator (`ncclCommRevoke`): operations
    /// end with `ncclRemoteError`.
    #[error("remote error: rank {0} revoked the communicator")]
    Revoked(usize),
}

impl Error {
    /// The `ncclResult_t` this error is reported as.
    pub fn code(&self) -> NcclResult {
        match self {
            Self::InvalidArgument(_) => NcclResult::InvalidArgument,
            Self::InvalidUsage(_) => NcclResult::InvalidUsage,
            Self::System(_) => NcclResult::SystemError,
            Self::Remote(_) => NcclResult::RemoteError,
            Self::Timeout(_) => NcclResult::Timeout,
            Self::Internal(_) => NcclResult::InternalError,
            Self::InProgress => NcclResult::InProgress,
            Self::Revoked(_) => NcclResult::RemoteError,
        }
    }

    /// Shorthand for [`Error::InvalidArgument`].
    pub fn arg(msg: impl Into<String>) -> Self {
        Self::InvalidArgument(msg.into())
    }

    /// Shorthand for [`Error::InvalidUsage`].
    pub fn usage(msg: impl Into<String>) -> Self {
        Self::InvalidUsage(msg.into())
    }

    /// Builds [`Error::System`] from the OS error of the last call.
    pub fn last_os(what: &str) -> Self {
        Self::System(format!("{what}: {}", std::io::Error::last_os_error()))
    }
}

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Self {
        Self::System(e.to_string())
    }
}

/// The engine's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
