//! The collective entry points and their `*Config` variants.
//!
//! Each validates its arguments into `Call` and hands them to
//! [`submit`]. In-place layouts follow NCCL: allgather in-place sends from
//! `recvbuff + rank*sendcount`, reducescatter and scatter in-place receive at
//! `sendbuff + rank*recvcount`.

use std::ffi::c_void;

use hetccl_abi::{
    cudaStream_t, ncclCollConfig_t, ncclComm_t, ncclDataType_t, ncclRedOp_t, ncclResult_t,
};

use super::coll_args::validate;
use super::config_read::{coll_filter, read_coll_config};
use super::guard::guard;
use crate::algo::Collective;
use crate::export;
use crate::launch::{claim_for_call, submit};

/// Validates and submits; shared by every entry point in this file.
#[allow(clippy::too_many_arguments)]
unsafe fn run(
    name: &'static str,
    kind: Collective,
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    dtype: ncclDataType_t,
    op: ncclRedOp_t,
    root: i32,
    comm: ncclComm_t,
    stream: cudaStream_t,
    config: *const ncclCollConfig_t,
) -> ncclResult_t {
    guard(name, || {
        if config.is_null() && matches!(kind, Collective::Send | Collective::Recv) {
            // A send or receive after another on the same communicator in
            // an open group: queued in that group's run.
            let buf = if kind == Collective::Send {
                send
            } else {
                recv.cast_const()
            };
            let queued = crate::launch::queue_in_run(comm as usize, |c| {
                super::coll_args::p2p(kind, buf, count, dtype, root, c)
            });
            if let Some(r) = queued {
                return r;
            }
        }
        let filter = if config.is_null() {
            None
        } else {
            // SAFETY: the caller passes NULL or a valid ncclCollConfig_t.
            let cfg = unsafe { read_coll_config(config)? };
            coll_filter(&cfg).map(std::sync::Arc::new)
        };
        let mut a = validate(kind, send, recv, count, dtype, op, root, comm, stream)?;
        a.filter = filter;
        if a.placement.is_device() {
            let c = a.comm.clone();
            return claim_for_call(&c, || crate::gpu::submit(a));
        }
        claim_for_call(&a.comm, || submit(&a))
    })
}

export! {
    /// Reduces `count` elements across ranks; every rank gets the result.
    fn ncclAllReduce / pncclAllReduce(send: *const c_void, recv: *mut c_void, count: usize,
        dtype: ncclDataType_t, op: ncclRedOp_t, comm: ncclComm_t, stream: cudaStream_t) -> ncclResult_t {
        // SAFETY: the caller's arguments, forwarded under this function's contract (NCCL's).
        unsafe { run("ncclAllReduce", Collective::AllReduce, send, recv, count, dtype, op, 0, comm, stream, std::ptr::null()) }
    }
}
export! {
    /// [`ncclAllReduce`] with a per-call config.
    fn ncclAllReduceConfig / pncclAllReduceConfig(send: *const c_void, recv: *mut c_void, count: usize,
        dtype: ncclDataType_t, op: ncclRedOp_t, comm: ncclComm_t, stream: cudaStream_t,
        config: *const ncclCollConfig_t) -> ncclResult_t {
        // SAFETY: the caller's arguments, forwarded under this function's contract (NCCL's).
        unsafe { run("ncclAllReduceConfig", Collective::AllReduce, send, recv, count, dtype, op, 0, comm, stream, config) }
    }
}
export! {
    /// Copies `count` elements from the root's `send` to every rank's `recv`.
    fn ncclBroadcast / pncclBroadcast(send: *const c_void, recv: *mut c_void, count: usize,
        dtype: ncclDataType_t, root: i32, comm: ncclComm_t, stream: cudaStream_t) -> ncclResult_t {
        // SAFETY: the caller's arguments, forwarded under this function's contract (NCCL's).
        unsafe { run("ncclBroadcast", Collective::Broadcast, send, recv, count, dtype, 0, root, comm, stream, std::ptr::null()) }
    }
}
export! {
    /// [`ncclBroadcast`] with a per-call config.
    fn ncclBroadcastConfig / pncclBroadcastConfig(send: *const c_void, recv: *mut c_void, count: usize,
        dtype: ncclDataType_t, root: i32, comm: ncclComm_t, stream: cudaStream_t,
        config: *const ncclCollConfig_t) -> ncclResult_t {
        // SAFETY: the caller's arguments, forwarded under this function's contract (NCCL's).
        unsafe { run("ncclBroadcastConfig", Collective::Broadcast, send, recv, count, dtype, 0, root, comm, stream, config) }
    }
}
export! {
    /// In-place broadcast (the legacy API).
    fn ncclBcast / pncclBcast(buff: *mut c_void, count: usize, dtype: ncclDataType_t, root: i32,
        comm: ncclComm_t, stream: cudaStream_t) -> ncclResult_t {
        // SAFETY: the caller's arguments, forwarded under this function's contract (NCCL's).
        unsafe { run("ncclBcast", Collective::Broadcast, buff, buff, count, dtype, 0, root, comm, stream, std::ptr::null()) }
    }
}
export! {
    /// Reduces `count` elements across ranks into the root's `recv`.
    fn ncclReduce / pncclReduce(send: *const c_void, recv: *mut c_void, count: usize,
        dtype: ncclDataType_t, op: ncclRedOp_t, root: i32, comm: ncclComm_t, stream: cudaStream_t) -> ncclResult_t {
        // SAFETY: the caller's arguments, forwarded under this function's contract (NCCL's).
        unsafe { run("ncclReduce", Collective::Reduce, send, recv, count, dtype, op, root, comm, stream, std::ptr::null()) }
    }
}
export! {
    /// [`ncclReduce`] with a per-call config.
    fn ncclReduceConfig / pncclReduceConfig(send: *const c_void, recv: *mut c_void, count: usize,
        dtype: ncclDataType_t, op: ncclRedOp_t, root: i32, comm: ncclComm_t, stream: cudaStream_t,
        config: *const ncclCollConfig_t) -> ncclResult_t {
        // SAFETY: the caller's arguments, forwarded under this function's contract (NCCL's).
        unsafe { run("ncclReduceConfig", Collective::Reduce, send, recv, count, dtype, op, root, comm, stream, config) }
    }
}
export! {
    /// Gathers `sendcount` elements from every rank into every rank's `recv`.
    fn ncclAllGather / pncclAllGather(send: *const c_void, recv: *mut c_void, sendcount: usize,
        dtype: ncclDataType_t, comm: ncclComm_t, stream: cudaStream_t) -> ncclResult_t {
        // SAFETY: the caller's arguments, forwarded under this function's contract (NCCL's).
        unsafe { run("ncclAllGather", Collective::AllGather, send, recv, sendcount, dtype, 0, 0, comm, stream, std::ptr::null()) }
    }
}
export! {
    /// [`ncclAllGather`] with a per-call config.
    fn ncclAllGatherConfig / pncclAllGatherConfig(send: *const c_void, recv: *mut c_void, sendcount: usize,
        dtype: ncclDataType_t, comm: ncclComm_t, stream: cudaStream_t,
        config: *const ncclCollConfig_t) -> ncclResult_t {
        // SAFETY: the caller's arguments, forwarded under this function's contract (NCCL's).
        unsafe { run("ncclAllGatherConfig", Collective::AllGather, send, recv, sendcount, dtype, 0, 0, comm, stream, config) }
    }
}
export! {
    /// Reduces, then scatters `recvcount` elements to each rank.
    fn ncclReduceScatter / pncclReduceScatter(send: *const c_void, recv: *mut c_void, recvcount: usize,
        dtype: ncclDataType_t, op: ncclRedOp_t, comm: ncclComm_t, stream: cudaStream_t) -> ncclResult_t {
        // SAFETY: the caller's arguments, forwarded under this function's contract (NCCL's).
        unsafe { run("ncclReduceScatter", Collective::ReduceScatter, send, recv, recvcount, dtype, op, 0, comm, stream, std::ptr::null()) }
    }
}
export! {
    /// [`ncclReduceScatter`] with a per-call config.
    fn ncclReduceScatterConfig / pncclReduceScatterConfig(send: *const c_void, recv: *mut c_void, recvcount: usize,
        dtype: ncclDataType_t, op: ncclRedOp_t, comm: ncclComm_t, stream: cudaStream_t,
        config: *const ncclCollConfig_t) -> ncclResult_t {
        // SAFETY: the caller's arguments, forwarded under this function's contract (NCCL's).
        unsafe { run("ncclReduceScatterConfig", Collective::ReduceScatter, send, recv, recvcount, dtype, op, 0, comm, stream, config) }
    }
}
export! {
    /// Sends `count` elements to each peer and receives `count` from each.
    fn ncclAlltoAll / pncclAlltoAll(send: *const c_void, recv: *mut c_void, count: usize,
        dtype: ncclDataType_t, comm: ncclComm_t, stream: cudaStream_t) -> ncclResult_t {
        // SAFETY: the caller's arguments, forwarded under this function's contract (NCCL's).
        unsafe { run("ncclAlltoAll", Collective::AlltoAll, send, recv, count, dtype, 0, 0, comm, stream, std::ptr::null()) }
    }
}
export! {
    /// [`ncclAlltoAll`] with a per-call config.
    fn ncclAlltoAllConfig / pncclAlltoAllConfig(send: *const c_void, recv: *mut c_void, count: usize,
        dtype: ncclDataType_t, comm: ncclComm_t, stream: cudaStream_t,
        config: *const ncclCollConfig_t) -> ncclResult_t {
        // SAFETY: the caller's arguments, forwarded under this function's contract (NCCL's).
        unsafe { run("ncclAlltoAllConfig", Collective::AlltoAll, send, recv, count, dtype, 0, 0, comm, stream, config) }
    }
}
export! {
    /// Gathers `count` elements from every rank into the root's `recv`.
    fn ncclGather / pncclGather(send: *const c_void, recv: *mut c_void, count: usize,
        dtype: ncclDataType_t, root: i32, comm: ncclComm_t, stream: cudaStream_t) -> ncclResult_t {
        // SAFETY: the caller's arguments, forwarded under this function's contract (NCCL's).
        unsafe { run("ncclGather", Collective::Gather, send, recv, count, dtype, 0, root, comm, stream, std::ptr::null()) }
    }
}
export! {
    /// [`ncclGather`] with a per-call config.
    fn ncclGatherConfig / pncclGatherConfig(send: *const c_void, recv: *mut c_void, count: usize,
        dtype: ncclDataType_t, root: i32, comm: ncclComm_t, stream: cudaStream_t,
        config: *const ncclCollConfig_t) -> ncclResult_t {
        // SAFETY: the caller's arguments, forwarded under this function's contract (NCCL's).
        unsafe { run("ncclGatherConfig", Collective::Gather, send, recv, count, dtype, 0, root, comm, stream, config) }
    }
}
export! {
    /// Scatters `count` elements per rank from the root's `send`.
    fn ncclScatter / pncclScatter(send: *const c_void, recv: *mut c_void, count: usize,
        dtype: ncclDataType_t, root: i32, comm: ncclComm_t, stream: cudaStream_t) -> ncclResult_t {
        // SAFETY: the caller's arguments, forwarded under this function's contract (NCCL's).
        unsafe { run("ncclScatter", Collective::Scatter, send, recv, count, dtype, 0, root, comm, stream, std::ptr::null()) }
    }
}
export! {
    /// [`ncclScatter`] with a per-call config.
    fn ncclScatterConfig / pncclScatterConfig(send: *const c_void, recv: *mut c_void, count: usize,
        dtype: ncclDataType_t, root: i32, comm: ncclComm_t, stream: cudaStream_t,
        config: *const ncclCollConfig_t) -> ncclResult_t {
        // SAFETY: the caller's arguments, forwarded under this function's contract (NCCL's).
        unsafe { run("ncclScatterConfig", Collective::Scatter, send, recv, count, dtype, 0, root, comm, stream, config) }
    }
}
export! {
    /// Sends `count` elements to `peer` (matched by the peer's `ncclRecv`).
    fn ncclSend / pncclSend(send: *const c_void, count: usize, dtype: ncclDataType_t, peer: i32,
        comm: ncclComm_t, stream: cudaStream_t) -> ncclResult_t {
        // SAFETY: the caller's arguments, forwarded under this function's contract (NCCL's).
        unsafe { run("ncclSend", Collective::Send, send, std::ptr::null_mut(), count, dtype, 0, peer, comm, stream, std::ptr::null()) }
    }
}
export! {
    /// Receives `count` elements from `peer`.
    fn ncclRecv / pncclRecv(recv: *mut c_void, count: usize, dtype: ncclDataType_t, peer: i32,
        comm: ncclComm_t, stream: cudaStream_t) -> ncclResult_t {
        // SAFETY: the caller's arguments, forwarded under this function's contract (NCCL's).
        unsafe { run("ncclRecv", Collective::Recv, std::ptr::null(), recv, count, dtype, 0, peer, comm, stream, std::ptr::null()) }
    }
}
