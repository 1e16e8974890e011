//! `ncclTunerPlugin_v6` (NCCL 2.30+): the v5 calls plus `getChunkSize`.

use std::ffi::{c_int, c_void};

use hetccl_abi::ncclResult_t;
use hetccl_abi::tuner::{ncclFunc_t, ncclTuner_v6_t};

use super::TUNER_NAME;

unsafe extern "C" fn get_chunk_size(
    ctx: *mut c_void,
    coll: ncclFunc_t,
    nbytes: usize,
    algo: c_int,
    proto: c_int,
    _nchannels: c_int,
    chunk: *mut usize,
) -> ncclResult_t {
    // SAFETY: pointers checked inside.
    unsafe { super::get_chunk_size(ctx, coll, nbytes, algo, proto, chunk) }
}

/// The v6 table.
#[no_mangle]
pub static ncclTunerPlugin_v6: ncclTuner_v6_t = ncclTuner_v6_t {
    name: TUNER_NAME.as_ptr(),
    init: Some(super::v5::init),
    getCollInfo: Some(super::v4::get_coll_info),
    finalize: Some(super::v4::finalize),
    getChunkSize: Some(get_chunk_size),
};
