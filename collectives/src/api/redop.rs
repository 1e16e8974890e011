//! `ncclRedOpCreatePreMulSum` / `ncclRedOpDestroy`.

use std::ffi::c_void;

use hetccl_abi::{ncclComm_t, ncclDataType_t, ncclRedOp_t, ncclResult_t, ScalarResidence};

use super::check;
use super::guard::guard;
use crate::comm::handle;
use crate::error::Error;
use crate::export;

export! {
    /// Creates a PreMulSum op (inputs multiplied by `scalar`, then summed) on
    /// `comm` and writes its id to `op`.
    fn ncclRedOpCreatePreMulSum / pncclRedOpCreatePreMulSum(op: *mut ncclRedOp_t, scalar: *mut c_void,
        datatype: ncclDataType_t, residence: i32, comm: ncclComm_t) -> ncclResult_t {
        guard("ncclRedOpCreatePreMulSum", || {
            check::non_null(op, "op")?;
            check::non_null(scalar, "scalar")?;
            let dt = check::datatype(datatype)?;
            let residence = ScalarResidence::try_from(residence)
                .map_err(|v| Error::arg(format!("invalid ncclScalarResidence_t {v}")))?;
            let c = handle::lookup(comm)?;
            // SAFETY: `scalar` is non-NULL and, for host-immediate scalars, the
            // caller passes one element of `dt`.
            let raw = unsafe { c.redops.lock().create(scalar as *const u8, dt, residence)? };
            // SAFETY: checked non-NULL.
            unsafe { *op = raw };
            Ok(())
        })
    }
}

export! {
    /// Destroys an op made by [`ncclRedOpCreatePreMulSum`] on the same comm.
    fn ncclRedOpDestroy / pncclRedOpDestroy(op: ncclRedOp_t, comm: ncclComm_t) -> ncclResult_t {
        guard("ncclRedOpDestroy", || {
            check::redop(op)?;
            handle::lookup(comm)?.redops.lock().destroy(op)
        })
    }
}
