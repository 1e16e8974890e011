//! `ncclTunerPlugin_v4`: `init(nRanks, nNodes, logger, ctx)`, `getCollInfo`
//! with `regBuff` (the signature of v5 and v6 too) and `destroy`.

use std::ffi::{c_int, c_void};

use hetccl_abi::ncclResult_t;
use hetccl_abi::net::ncclDebugLogger_t;
use hetccl_abi::tuner::{ncclFunc_t, ncclTuner_v4_t};

use super::TUNER_NAME;

/// `init` of v3 and v4.
pub(super) unsafe extern "C" fn init(
    nranks: usize,
    nnodes: usize,
    logger: ncclDebugLogger_t,
    ctx: *mut *mut c_void,
) -> ncclResult_t {
    // SAFETY: pointers checked inside.
    unsafe { super::init(ctx, nranks, nnodes, logger) }
}

/// `getCollInfo` of v4, v5 and v6.
#[allow(clippy::too_many_arguments)]
pub(super) unsafe extern "C" fn get_coll_info(
    ctx: *mut c_void,
    coll: ncclFunc_t,
    nbytes: usize,
    _num_pipe_ops: c_int,
    table: *mut *mut f32,
    num_algo: c_int,
    num_proto: c_int,
    _reg_buff: c_int,
    nchannels: *mut c_int,
) -> ncclResult_t {
    // SAFETY: pointers checked inside.
    unsafe { super::get_coll_info(ctx, coll, nbytes, table, num_algo, num_proto, nchannels) }
}

/// `destroy` (v3, v4) and `finalize` (v5, v6).
pub(super) unsafe extern "C" fn finalize(ctx: *mut c_void) -> ncclResult_t {
    // SAFETY: validated inside.
    unsafe { super::finalize(ctx) }
}

/// The v4 table.
#[no_mangle]
pub static ncclTunerPlugin_v4: ncclTuner_v4_t = ncclTuner_v4_t {
    name: TUNER_NAME.as_ptr(),
    init: Some(init),
    getCollInfo: Some(get_coll_info),
    destroy: Some(finalize),
};
