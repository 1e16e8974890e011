//! Validation of collective and point-to-point arguments into a typed
//! [`Call`], shared by every collective entry point.

use std::ffi::c_void;

use hetccl_abi::{ncclComm_t, RedOp};

use super::check;
use crate::algo::Collective;
use crate::comm::handle;
use crate::comm::Comm;
use crate::error::{Error, Result};
use crate::gpu::memory;
use crate::launch::{Call, P2p};
use crate::user_ptr::UserPtr;

/// What each rank's buffers must hold for `coll`, in elements: (send,
/// recv), at the root for rooted kinds.
#[inline(always)]
fn extents(coll: Collective, count: usize, nranks: usize, is_root: bool) -> Option<(usize, usize)> {
    let n = |x: usize| x.checked_mul(nranks);
    Some(match coll {
        Collective::AllReduce => (count, count),
        Collective::Broadcast => (if is_root { count } else { 0 }, count),
        Collective::Reduce => (count, if is_root { count } else { 0 }),
        Collective::AllGather => (count, n(count)?),
        Collective::ReduceScatter => (n(count)?, count),
        Collective::AlltoAll => (n(count)?, n(count)?),
        Collective::Gather => (count, if is_root { n(count)? } else { 0 }),
        Collective::Scatter => (if is_root { n(count)? } else { 0 }, count),
        Collective::Send => (count, 0),
        Collective::Recv => (0, count),
    })
}

/// Validates the raw arguments of any collective or point-to-point call.
/// Inlined into its one caller, so that the [`Call`] is built where it is
/// used rather than copied out of a returned `Result` (docs/benchmarks.md).
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub fn validate(
    kind: Collective,
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    dtype: i32,
    op: i32,
    root: i32,
    comm: ncclComm_t,
    stream: *mut c_void,
) -> Result<Call> {
    let handle = comm;
    let comm = handle::lookup(handle)?;
    if matches!(kind, Collective::Send | Collective::Recv) {
        let buf = if kind == Collective::Send {
            send
        } else {
            recv.cast_const()
        };
        return validate_p2p(kind, buf, count, dtype, root, comm, handle, stream);
    }
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
    let root = if kind.rooted() {
        check::rank_in(root, nranks as i32, "root")?
    } else {
        0
    };
    let is_root = kind.rooted() && root == comm.rank;
    let (se, re) = extents(kind, count, nranks, is_root)
        .ok_or_else(|| Error::arg(format!("count {count} x {nranks} ranks overflows")))?;
    let send_bytes = check::bytes(se, dtype, "sendbuff")?;
    let recv_bytes = check::bytes(re, dtype, "recvbuff")?;
    check::buffer(send, send_bytes, "sendbuff")?;
    check::buffer(recv, recv_bytes, "recvbuff")?;
    let placement = memory::classify_call(send, send_bytes, recv, recv_bytes)?;
    Ok(Call {
        kind,
        comm,
        handle: handle as usize,
        send: UserPtr::new(send),
        recv: UserPtr::new(recv),
        count,
        dtype,
        op,
        root,
        send_bytes,
        recv_bytes,
        stream: UserPtr::new(stream),
        placement,
        filter: None,
    })
}

/// [`validate`] of a send or receive (`buf` is its buffer). Not inlined:
/// the collectives' path would carry its frame.
#[allow(clippy::too_many_arguments)]
#[inline(never)]
fn validate_p2p(
    kind: Collective,
    buf: *const c_void,
    count: usize,
    dtype: i32,
    peer: i32,
    comm: std::sync::Arc<Comm>,
    handle: ncclComm_t,
    stream: *mut c_void,
) -> Result<Call> {
    let p = p2p(kind, buf, count, dtype, peer, &comm)?;
    Ok(Call::of_p2p(
        &p,
        comm,
        handle as usize,
        count,
        UserPtr::new(stream),
    ))
}

/// Checks a send (`buf` is its send buffer) or receive (its receive
/// buffer) against `comm`: [`validate`]'s checks of such a call, also
/// made alone for a call that joins a group's open run. Inlined into its
/// two callers, so that the [`P2p`] is built where it is used.
#[inline(always)]
pub fn p2p(
    kind: Collective,
    buf: *const c_void,
    count: usize,
    dtype: i32,
    peer: i32,
    comm: &Comm,
) -> Result<P2p> {
    comm.check_usable()?;
    let dtype = check::datatype(dtype)?;
    let peer = check::rank_in(peer, comm.nranks as i32, "peer")?;
    let what = if kind == Collective::Send {
        "sendbuff"
    } else {
        "recvbuff"
    };
    let bytes = check::bytes(count, dtype, what)?;
    check::buffer(buf, bytes, what)?;
    let null = std::ptr::null();
    let (send, recv) = if kind == Collective::Send {
        ((buf, bytes), (null, 0))
    } else {
        ((null, 0), (buf, bytes))
    };
    let placement = memory::classify_call(send.0, send.1, recv.0, recv.1)?;
    Ok(P2p {
        kind,
        peer,
        buf: UserPtr::new(buf),
        bytes,
        dtype,
        placement,
    })
}
