//! Device-side APIs: device communicators, window pointers and one-sided
//! signals. They need CUDA (the GPU work, or NVIDIA's NCCL as a fallback);
//! this build checks their arguments and refuses them with
//! `ncclInvalidUsage` and a message.

use std::ffi::{c_int, c_uint, c_void};

use hetccl_abi::{
    cudaStream_t, ncclComm_t, ncclDataType_t, ncclResult_t, ncclWaitSignalDesc_t, ncclWindow_t,
};

use super::check;
use super::engine_gate::device_only;
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
            Err(device_only("ncclDevCommCreate"))
        })
    }
}

export! {
    /// Destroys a device communicator (device-only).
    fn ncclDevCommDestroy / pncclDevCommDestroy(comm: ncclComm_t, dev_comm: *const c_void) -> ncclResult_t {
        guard("ncclDevCommDestroy", || {
            handle::lookup(comm)?;
            check::non_null(dev_comm, "devComm")?;
            Err(device_only("ncclDevCommDestroy"))
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
            let _ = offset;
            Err(device_only("ncclGetLsaMultimemDevicePointer"))
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
            let _ = (offset, peer);
            Err(device_only("ncclGetPeerDevicePointer"))
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
            let _ = (peer_win_offset, sig_idx, ctx, flags, stream);
            Err(device_only("ncclPutSignal"))
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
            let _ = (sig_idx, ctx, flags, stream);
            Err(device_only("ncclSignal"))
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
            let _ = stream;
            Err(device_only("ncclWaitSignal"))
        })
    }
}
