//! The transport's error type and its `ncclResult_t` mapping.

use hetccl_abi::NcclResult;

/// Why a network operation failed. Every variant carries a message for the log.
///
/// Errors are `Clone` so that a comm that failed once can keep returning the
/// same error from every later call.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NetError {
    /// A bad argument from the caller (NULL pointer, out-of-range value).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// A call that is not allowed in this state, or a message larger than the
    /// posted receive.
    #[error("invalid usage: {0}")]
    InvalidUsage(String),
    /// A bug or an unexpected state inside the plugin.
    #[error("internal error: {0}")]
    Internal(String),
    /// A failed system call.
    #[error("system error: {0}")]
    System(String),
    /// The peer closed the connection, died, or broke the protocol.
    #[error("remote error: {0}")]
    Remote(String),
    /// No progress within the configured timeout.
    #[error("timed out: {0}")]
    Timeout(String),
    /// The peer closed the connection because rank `.0` of its
    /// communicator revoked it (a CLOSE frame; the engine's links only).
    #[error("remote error: rank {0} revoked the communicator")]
    Revoked(u32),
}

impl NetError {
    /// The `ncclResult_t` NCCL gets for this error. A timeout is a peer
    /// that stopped answering: `ncclRemoteError`, as the engine reports a
    /// stall (NVIDIA's NCCL has no code 8 for a net plugin to return).
    pub fn code(&self) -> NcclResult {
        match self {
            Self::InvalidArgument(_) => NcclResult::InvalidArgument,
            Self::InvalidUsage(_) => NcclResult::InvalidUsage,
            Self::Internal(_) => NcclResult::InternalError,
            Self::System(_) => NcclResult::SystemError,
            Self::Remote(_) => NcclResult::RemoteError,
            Self::Timeout(_) | Self::Revoked(_) => NcclResult::RemoteError,
        }
    }

    /// A system error from an `io::Error`, with what was being done.
    pub fn io(what: &str, e: &std::io::Error) -> Self {
        Self::System(format!("{what}: {e}"))
    }

    /// The peer closed the connection cleanly (end of stream).
    pub fn peer_closed() -> Self {
        Self::Remote(PEER_CLOSED.into())
    }

    /// Whether this is [`NetError::peer_closed`].
    pub fn is_peer_closed(&self) -> bool {
        matches!(self, Self::Remote(m) if m == PEER_CLOSED)
    }

    /// A protocol violation by the peer.
    pub fn proto(what: impl Into<String>) -> Self {
        Self::Remote(format!("protocol violation: {}", what.into()))
    }
}

const PEER_CLOSED: &str = "connection closed by peer";

/// Result alias of this crate.
pub type Result<T, E = NetError> = std::result::Result<T, E>;
