//! Device-side APIs: device communicators, window pointers and one-sided
//! signals. hetccl checks their arguments, then forwards them to NVIDIA's
//! NCCL when `HETCCL_NCCL_FALLBACK` names it (through a mirror communicator,
//! see [`super::fallback`]); without it they return `ncclInvalidUsage` with
//! a message.

use std::ffi::{c_int, c_uint, c_void};

use hetccl_abi::{
    cudaStream_t, ncclComm_t, ncclDataType_t, ncclResult_t, ncclWaitSignalDesc_t, ncclWindow_t,
};

use super::check;
use super::fallback::{self, code, mirror};
use super::guard::guard;
use crate::comm::handle;
use crate::export;

export! {
    /// Creates a device communicator (device-only).
    fn ncclDevCommCreate / pncclDevCommCreate(comm: ncclComm_t, reqs: *const c_void,
        out_dev_comm: *mut c_void) -> ncclResult_t {
        guard("ncclDevCommCreate", || {
            handle::lookup(comm)?;
            check::non_null(reqs, "reqs")?;
            check::non_null(out_dev_comm, "outDevComm")?;
            let fb = fallback::require("ncclDevCommCreate")?;
            type F = unsafe extern "C" fn(ncclComm_t, *const c_void, *mut c_void) -> ncclResult_t;
            // SAFETY: the prototype in nccl.h.
            let f = unsafe { fb.sym::<F>("ncclDevCommCreate\0")? };
            // SAFETY: the caller's handle, validated inside.
            let m = unsafe { mirror(comm)? };
            // SAFETY: checked arguments, passed through.
            code("ncclDevCommCreate", unsafe { f(m, reqs, out_dev_comm) })
        })
    }
}

export! {
    /// Destroys a device communicator (device-only).
    fn ncclDevCommDestroy / pncclDevCommDestroy(comm: ncclComm_t, dev_comm: *const c_void) -> ncclResult_t {
        guard("ncclDevCommDestroy", || {
            handle::lookup(comm)?;
            check::non_null(dev_comm, "devComm")?;
            let fb = fallback::require("ncclDevCommDestroy")?;
            type F = unsafe extern "C" fn(ncclComm_t, *const c_void) -> ncclResult_t;
            // SAFETY: the prototype in nccl.h.
            let f = unsafe { fb.sym::<F>("ncclDevCommDestroy\0")? };
            // SAFETY: the caller's handle, validated inside.
            let m = unsafe { mirror(comm)? };
            // SAFETY: checked arguments, passed through.
            code("ncclDevCommDestroy", unsafe { f(m, dev_comm) })
        })
    }
}

export! {
    /// Multimem pointer into a window (device-only).
    fn ncclGetLsaMultimemDevicePointer / pncclGetLsaMultimemDevicePointer(window: ncclWindow_t,
        offset: usize, out_ptr: *mut *mut c_void) -> ncclResult_t {
        guard("ncclGetLsaMultimemDevicePointer", || {
            check::non_null(window, "window")?;
            check::non_null(out_ptr, "outPtr")?;
            let fb = fallback::require("ncclGetLsaMultimemDevicePointer")?;
            type F = unsafe extern "C" fn(ncclWindow_t, usize, *mut *mut c_void) -> ncclResult_t;
            // SAFETY: the prototype in nccl.h; windows come from the fallback.
            let f = unsafe { fb.sym::<F>("ncclGetLsaMultimemDevicePointer\0")? };
            // SAFETY: checked arguments, passed through.
            code("ncclGetLsaMultimemDevicePointer", unsafe { f(window, offset, out_ptr) })
        })
    }
}

export! {
    /// A peer's pointer into a window (device-only).
    fn ncclGetPeerDevicePointer / pncclGetPeerDevicePointer(window: ncclWindow_t, offset: usize,
        peer: c_int, out_ptr: *mut *mut c_void) -> ncclResult_t {
        guard("ncclGetPeerDevicePointer", || {
            check::non_null(window, "window")?;
            check::non_null(out_ptr, "outPtr")?;
            let fb = fallback::require("ncclGetPeerDevicePointer")?;
            type F = unsafe extern "C" fn(ncclWindow_t, usize, c_int, *mut *mut c_void) -> ncclResult_t;
            // SAFETY: the prototype in nccl.h; windows come from the fallback.
            let f = unsafe { fb.sym::<F>("ncclGetPeerDevicePointer\0")? };
            // SAFETY: checked arguments, passed through.
            code("ncclGetPeerDevicePointer", unsafe { f(window, offset, peer, out_ptr) })
        })
    }
}

export! {
    /// One-sided put into a peer's window plus a signal (device-only).
    fn ncclPutSignal / pncclPutSignal(localbuff: *const c_void, count: usize, datatype: ncclDataType_t,
        peer: c_int, peer_win: ncclWindow_t, peer_win_offset: usize, sig_idx: c_int, ctx: c_int,
        flags: c_uint, comm: ncclComm_t, stream: cudaStream_t) -> ncclResult_t {
        guard("ncclPutSignal", || {
            let c = handle::lookup(comm)?;
            let dt = check::datatype(datatype)?;
            let bytes = check::bytes(count, dt, "localbuff")?;
            check::buffer(localbuff, bytes, "localbuff")?;
            check::rank_in(peer, c.nranks as c_int, "peer")?;
            check::non_null(peer_win, "peerWin")?;
            let fb = fallback::require("ncclPutSignal")?;
            type F = unsafe extern "C" fn(*const c_void, usize, ncclDataType_t, c_int, ncclWindow_t,
                usize, c_int, c_int, c_uint, ncclComm_t, cudaStream_t) -> ncclResult_t;
            // SAFETY: the prototype in nccl.h.
            let f = unsafe { fb.sym::<F>("ncclPutSignal\0")? };
            // SAFETY: the caller's handle, validated inside.
            let m = unsafe { mirror(comm)? };
            // SAFETY: checked arguments, passed through with the mirror comm.
            code("ncclPutSignal", unsafe {
                f(localbuff, count, datatype, peer, peer_win, peer_win_offset, sig_idx, ctx, flags, m, stream)
            })
        })
    }
}

export! {
    /// Signals a peer (device-only).
    fn ncclSignal / pncclSignal(peer: c_int, sig_idx: c_int, ctx: c_int, flags: c_uint,
        comm: ncclComm_t, stream: cudaStream_t) -> ncclResult_t {
        guard("ncclSignal", || {
            let c = handle::lookup(comm)?;
            check::rank_in(peer, c.nranks as c_int, "peer")?;
            let fb = fallback::require("ncclSignal")?;
            type F = unsafe extern "C" fn(c_int, c_int, c_int, c_uint, ncclComm_t, cudaStream_t) -> ncclResult_t;
            // SAFETY: the prototype in nccl.h.
            let f = unsafe { fb.sym::<F>("ncclSignal\0")? };
            // SAFETY: the caller's handle, validated inside.
            let m = unsafe { mirror(comm)? };
            // SAFETY: checked arguments, passed through with the mirror comm.
            code("ncclSignal", unsafe { f(peer, sig_idx, ctx, flags, m, stream) })
        })
    }
}

export! {
    /// Waits for signals from peers (device-only).
    fn ncclWaitSignal / pncclWaitSignal(n_desc: c_int, descs: *mut ncclWaitSignalDesc_t,
        comm: ncclComm_t, stream: cudaStream_t) -> ncclResult_t {
        guard("ncclWaitSignal", || {
            let c = handle::lookup(comm)?;
            if n_desc < 0 {
                return Err(crate::error::Error::arg(format!("nDesc {n_desc} is negative")));
            }
            if n_desc > 0 {
                check::non_null(descs, "signalDescs")?;
                // SAFETY: non-NULL with n_desc entries, per the caller.
                let descs = unsafe { std::slice::from_raw_parts(descs, n_desc as usize) };
                for d in descs {
                    check::rank_in(d.peer, c.nranks as c_int, "signalDescs[].peer")?;
                }
            }
            let fb = fallback::require("ncclWaitSignal")?;
            type F = unsafe extern "C" fn(c_int, *mut ncclWaitSignalDesc_t, ncclComm_t, cudaStream_t) -> ncclResult_t;
            // SAFETY: the prototype in nccl.h.
            let f = unsafe { fb.sym::<F>("ncclWaitSignal\0")? };
            // SAFETY: the caller's handle, validated inside.
            let m = unsafe { mirror(comm)? };
            // SAFETY: checked arguments, passed through with the mirror comm.
            code("ncclWaitSignal", unsafe { f(n_desc, descs, m, stream) })
        })
    }
}
