//! `ncclTunerPlugin_v5` (NCCL 2.28): `init` with a communicator id, the NVL
//! domain info and NCCL's constants (left unchanged), and `finalize`.

use std::ffi::c_void;

use hetccl_abi::ncclResult_t;
use hetccl_abi::net::ncclDebugLogger_t;
use hetccl_abi::tuner::{ncclNvlDomainInfo_v5_t, ncclTunerConstants_v5_t, ncclTuner_v5_t};

use super::TUNER_NAME;

/// `init` of v5 and v6.
pub(super) unsafe extern "C" fn init(
    ctx: *mut *mut c_void,
    _comm_id: u64,
    nranks: usize,
    nnodes: usize,
    logger: ncclDebugLogger_t,
    _nvl: *mut ncclNvlDomainInfo_v5_t,
    _constants: *mut ncclTunerConstants_v5_t,
) -> ncclResult_t {
    // SAFETY: pointers checked inside.
    unsafe { super::init(ctx, nranks, nnodes, logger) }
}

/// The v5 table.
#[no_mangle]
pub static ncclTunerPlugin_v5: ncclTuner_v5_t = ncclTuner_v5_t {
    name: TUNER_NAME.as_ptr(),
    init: Some(init),
    getCollInfo: Some(super::v4::get_coll_info),
    finalize: Some(super::v4::finalize),
};
