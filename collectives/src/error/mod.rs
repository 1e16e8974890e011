//! The engine's error type. Only the C API turns it into `ncclResult_t`.

pub mod last;

use hetccl_abi::NcclResult;

/// An error the engine reports to its caller.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A bad pointer, enum, count or rank from the caller (`ncclInvalidArgument`).
    #[error("invalid argument: {0}")]
    InvalidArgument(Msg),
    /// A call that is valid C but not valid now or not supported (`ncclInvalidUsage`).
    #[error("invalid usage: {0}")]
    InvalidUsage(Msg),
    /// An OS call failed (`ncclSystemError`).
    #[error("system error: {0}")]
    System(Msg),
    /// A peer died, or the network failed (`ncclRemoteError`).
    #[error("remote error: {0}")]
    Remote(Msg),
    /// A bounded wait ran out (`ncclTimeout`).
    #[error("timeout: {0}")]
    Timeout(Msg),
    /// A broken invariant inside hetccl (`ncclInternalError`).
    #[error("internal error: {0}")]
    Internal(Msg),
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
    pub fn arg(msg: impl Into<Msg>) -> Self {
        Self::InvalidArgument(msg.into())
    }

    /// Shorthand for [`Error::InvalidUsage`].
    pub fn usage(msg: impl Into<Msg>) -> Self {
        Self::InvalidUsage(msg.into())
    }

    /// Builds [`Error::System`] from the OS error of the last call.
    pub fn last_os(what: &str) -> Self {
        Self::System(format!("{what}: {}", std::io::Error::last_os_error()).into())
    }
}

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Self {
        Self::System(e.to_string().into())
    }
}

/// An error's message, one pointer wide: an [`Error`] is then two words,
/// so `Result<(), Error>` comes back in registers rather than through
/// memory. A caller reading a returned `Result` from memory in wider loads
/// than the callee stored it with waits until those stores, and every store
/// before them, reach the cache: after a small operation that wrote to
/// lines its peers read, that is a round trip to their cores.
// A `String` is three words; its box is one (an error's extra allocation
// is nothing beside the copy of its message).
#[allow(clippy::box_collection)]
pub struct Msg(Box<String>);

impl From<String> for Msg {
    fn from(s: String) -> Self {
        Self(Box::new(s))
    }
}

impl From<&str> for Msg {
    fn from(s: &str) -> Self {
        Self(Box::new(s.to_owned()))
    }
}

impl std::ops::Deref for Msg {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for Msg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::fmt::Debug for Msg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(&*self.0, f)
    }
}

const _: () = assert!(std::mem::size_of::<Error>() == 16);

/// The engine's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
