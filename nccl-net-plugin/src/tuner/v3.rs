//! `ncclTunerPlugin_v3`: as v4, without `regBuff` in `getCollInfo`.

use std::ffi::{c_int, c_void};

use hetccl_abi::ncclResult_t;
use hetccl_abi::tuner::{ncclFunc_t, ncclTuner_v3_t};

use super::TUNER_NAME;

unsafe extern "C" fn get_coll_info(
    ctx: *mut c_void,
    coll: ncclFunc_t,
    nbytes: usize,
    _num_pipe_ops: c_int,
    table: *mut *mut f32,
    num_algo: c_int,
    num_proto: c_int,
    nchannels: *mut c_int,
) -> ncclResult_t {
    // SAFETY: pointers checked inside.
    unsafe { super::get_coll_info(ctx, coll, nbytes, table, num_algo, num_proto, nchannels) }
}

/// The v3 table.
#[no_mangle]
pub static ncclTunerPlugin_v3: ncclTuner_v3_t = ncclTuner_v3_t {
    name: TUNER_NAME.as_ptr(),
    init: Some(super::v4::init),
    getCollInfo: Some(get_coll_info),
    destroy: Some(super::v4::finalize),
};
