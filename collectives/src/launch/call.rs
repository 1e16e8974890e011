//! A validated call, as the C API hands it to the dispatch layer.

use std::sync::Arc;

use hetccl_abi::{DataType, RedOp};

use crate::algo::{AlgoFilter, Collective};
use crate::comm::Comm;
use crate::gpu::memory::Placement;
use crate::user_ptr::UserPtr;

/// A validated collective or point-to-point call: what the C API hands
/// the dispatch layer.
#[derive(Debug, Clone)]
pub struct Call {
    /// The operation.
    pub kind: Collective,
    /// The communicator.
    pub comm: Arc<Comm>,
    /// The C handle the caller named it by (0 for calls made inside the
    /// library): a group's open run of this handle takes the next
    /// point-to-point call without a lookup (`launch::group::queue_in_run`).
    pub handle: usize,
    /// Send buffer (may be NULL where nothing is sent).
    pub send: UserPtr,
    /// Receive buffer (may be NULL where nothing is received).
    pub recv: UserPtr,
    /// The count as passed (per rank / per peer, as NCCL defines it per kind).
    pub count: usize,
    /// Element type.
    pub dtype: DataType,
    /// Reduction op (Sum for non-reducing kinds).
    pub op: RedOp,
    /// Root for rooted kinds, peer for Send/Recv; 0 otherwise.
    pub root: usize,
    /// Bytes this rank reads from `send`.
    pub send_bytes: usize,
    /// Bytes this rank writes to `recv`.
    pub recv_bytes: usize,
    /// The stream (NULL for host calls).
    pub stream: UserPtr,
    /// Where the buffers live; CUDA memory takes the stream path
    /// ([`crate::gpu::submit`]).
    pub placement: Placement,
    /// The call's own algorithm restriction (`ncclCollConfig_t`'s
    /// `algSelection`), in place of the communicator's `NCCL_ALGO`.
    pub filter: Option<Arc<AlgoFilter>>,
}

impl Call {
    /// The validated call of `p`, on `comm` by C handle `handle`, of
    /// `count` elements, on `stream`.
    pub fn of_p2p(p: &P2p, comm: Arc<Comm>, handle: usize, count: usize, stream: UserPtr) -> Self {
        let (send, recv, send_bytes, recv_bytes) = if p.kind == Collective::Send {
            (p.buf, UserPtr::NULL, p.bytes, 0)
        } else {
            (UserPtr::NULL, p.buf, 0, p.bytes)
        };
        Self {
            kind: p.kind,
            comm,
            handle,
            send,
            recv,
            count,
            dtype: p.dtype,
            op: RedOp::Sum,
            root: p.peer,
            send_bytes,
            recv_bytes,
            stream,
            placement: p.placement,
            filter: None,
        }
    }

    /// The algorithm restriction in force for this call.
    pub fn filter<'a>(&'a self, comm_default: &'a AlgoFilter) -> &'a AlgoFilter {
        self.filter.as_deref().unwrap_or(comm_default)
    }
}

/// A point-to-point call checked against a communicator that a group's
/// open run already holds (`launch::group::queue_in_run`): what the run
/// needs of it.
#[derive(Debug, Clone, Copy)]
pub struct P2p {
    /// `Send` or `Recv`.
    pub kind: Collective,
    /// The peer.
    pub peer: usize,
    /// The buffer (send buffer of a send, receive buffer of a receive).
    pub buf: UserPtr,
    /// Its bytes.
    pub bytes: usize,
    /// Element type.
    pub dtype: DataType,
    /// Where the buffer lives.
    pub placement: Placement,
}

impl P2p {
    /// The point-to-point part of `a`, a validated `Send` or `Recv`.
    pub fn of(a: &Call) -> Self {
        let (buf, bytes) = if a.kind == Collective::Send {
            (a.send, a.send_bytes)
        } else {
            (a.recv, a.recv_bytes)
        };
        Self {
            kind: a.kind,
            peer: a.root,
            buf,
            bytes,
            dtype: a.dtype,
            placement: a.placement,
        }
    }
}
