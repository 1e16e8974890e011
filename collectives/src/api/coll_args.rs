//! Validation of collective and point-to-point arguments into a typed
//! [`CollArgs`], shared by every collective entry point.

use std::ffi::c_void;
use std::sync::Arc;

use hetccl_abi::{ncclComm_t, DataType, RedOp};

use super::check;
use crate::comm::{handle, Comm};
use crate::error::{Error, Result};

/// The collective (or point-to-point) operation, named as nccl-tests names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CollKind {
    /// `ncclAllReduce`.
    AllReduce,
    /// `ncclBroadcast` / `ncclBcast`.
    Broadcast,
    /// `ncclReduce`.
    Reduce,
    /// `ncclAllGather`.
    AllGather,
    /// `ncclReduceScatter`.
    ReduceScatter,
    /// `ncclAlltoAll`.
    AlltoAll,
    /// `ncclGather`.
    Gather,
    /// `ncclScatter`.
    Scatter,
    /// `ncclSend`.
    Send,
    /// `ncclRecv`.
    Recv,
}

impl CollKind {
    /// Whether the operation reduces (takes an op).
    pub fn reduces(self) -> bool {
        matches!(self, Self::AllReduce | Self::Reduce | Self::ReduceScatter)
    }

    /// Whether the operation has a root.
    pub fn rooted(self) -> bool {
        matches!(
            self,
            Self::Broadcast | Self::Reduce | Self::Gather | Self::Scatter
        )
    }

    /// (send elements, recv elements) as multiples of `count` for `nranks`:
    /// what each rank's buffers must hold (at the root for rooted kinds).
    fn extents(self, count: usize, nranks: usize, is_root: bool) -> Option<(usize, usize)> {
        let n = |x: usize| x.checked_mul(nranks);
        Some(match self {
            Self::AllReduce => (count, count),
            Self::Broadcast => (if is_root { count } else { 0 }, count),
            Self::Reduce => (count, if is_root { count } else { 0 }),
            Self::AllGather => (count, n(count)?),
            Self::ReduceScatter => (n(count)?, count),
            Self::AlltoAll => (n(count)?, n(count)?),
            Self::Gather => (count, if is_root { n(count)? } else { 0 }),
            Self::Scatter => (if is_root { n(count)? } else { 0 }, count),
            Self::Send => (count, 0),
            Self::Recv => (0, count),
        })
    }
}

/// A validated call.
#[derive(Debug, Clone)]
pub struct CollArgs {
    /// The operation.
    pub kind: CollKind,
    /// The communicator.
    pub comm: Arc<Comm>,
    /// Send buffer (may be NULL where nothing is sent).
    pub send: *const c_void,
    /// Receive buffer (may be NULL where nothing is received).
    pub recv: *mut c_void,
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
    pub stream: *mut c_void,
}

/// Validates the raw arguments of any collective or point-to-point call.
#[allow(clippy::too_many_arguments)]
pub fn validate(
    kind: CollKind,
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    dtype: i32,
    op: i32,
    root: i32,
    comm: ncclComm_t,
    stream: *mut c_void,
) -> Result<CollArgs> {
    let comm = handle::lookup(comm)?;
    comm.check_usable()?;
    let dtype = check::datatype(dtype)?;
    let op = if kind.reduces() {
        let op = check::redop(op)?;
        if let RedOp::Dynamic(raw) = op {
            let pm = comm.redops.lock().get(raw)?;
            if pm.dtype != dtype {
                return Err(Error::arg(format!(
                    "op {raw} was created for {} but the call uses {}",
                    pm.dtype.name(),
                    dtype.name()
                )));
            }
        }
        op
    } else {
        RedOp::Sum
    };
    let nranks = comm.nranks;
    let root = match kind {
        CollKind::Send | CollKind::Recv => check::rank_in(root, nranks as i32, "peer")?,
        k if k.rooted() => check::rank_in(root, nranks as i32, "root")?,
        _ => 0,
    };
    let is_root = kind.rooted() && root == comm.rank;
    let (se, re) = kind
        .extents(count, nranks, is_root)
        .ok_or_else(|| Error::arg(format!("count {count} x {nranks} ranks overflows")))?;
    let send_bytes = check::bytes(se, dtype, "sendbuff")?;
    let recv_bytes = check::bytes(re, dtype, "recvbuff")?;
    check::buffer(send, send_bytes, "sendbuff")?;
    check::buffer(recv, recv_bytes, "recvbuff")?;
    Ok(CollArgs {
        kind,
        comm,
        send,
        recv,
        count,
        dtype,
        op,
        root,
        send_bytes,
        recv_bytes,
        stream,
    })
}
