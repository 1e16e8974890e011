//! `ncclGroupStart` / `ncclGroupEnd` / `ncclGroupSimulateEnd`.
//!
//! The C boundary of `crate::launch::group`: groups nest per thread, as in
//! NCCL, and the outermost `ncclGroupEnd` launches what was queued.

use hetccl_abi::{ncclResult_t, ncclSimInfo_t, NCCL_SIM_INFO_MAGIC};

use super::check;
use super::guard::guard;
use crate::algo::estimate_us;
use crate::error::Error;
use crate::export;
use crate::launch::group;

/// The cost model's time for one queued call, in microseconds.
fn estimate(q: &group::Queued<'_>) -> f64 {
    let Ok(e) = q.comm.engine() else {
        return 0.0;
    };
    estimate_us(q.kind, q.algorithm, q.bytes, &e.topo, &e.costs).unwrap_or(0.0)
}

export! {
    /// Opens a group: later calls on this thread are queued until the
    /// matching [`ncclGroupEnd`].
    fn ncclGroupStart / pncclGroupStart() -> ncclResult_t {
        guard("ncclGroupStart", group::start)
    }
}

export! {
    /// Closes a group; the outermost close launches what was queued.
    fn ncclGroupEnd / pncclGroupEnd() -> ncclResult_t {
        guard("ncclGroupEnd", group::end)
    }
}

export! {
    /// Closes a group without running it and writes the cost model's
    /// estimate of its time (microseconds) into `sim_info`; the queued
    /// operations are dropped.
    fn ncclGroupSimulateEnd / pncclGroupSimulateEnd(sim_info: *mut ncclSimInfo_t) -> ncclResult_t {
        guard("ncclGroupSimulateEnd", || {
            check::non_null(sim_info, "simInfo")?;
            // SAFETY: checked non-NULL; the header fields are read unaligned-safe.
            let (size, magic) = unsafe { ((*sim_info).size, (*sim_info).magic) };
            if magic != NCCL_SIM_INFO_MAGIC {
                return Err(Error::arg(format!(
                    "simInfo has bad magic {magic:#x}; initialise it with NCCL_SIM_INFO_INITIALIZER"
                )));
            }
            if size < std::mem::size_of::<ncclSimInfo_t>() || size > 4096 {
                return Err(Error::arg(format!("simInfo has implausible size {size}")));
            }
            let est = group::with_queued(|ops| {
                ops.iter().map(estimate).sum::<f64>()
            });
            group::end_discarding()?;
            // SAFETY: checked non-NULL and size.
            unsafe { (*sim_info).estimatedTime = est as f32 };
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nesting() {
        // SAFETY: the group functions take no arguments.
        assert_eq!(unsafe { ncclGroupEnd() }, 5, "end without start");
        // SAFETY: the group functions take no arguments.
        assert_eq!(unsafe { ncclGroupStart() }, 0);
        // SAFETY: the group functions take no arguments.
        assert_eq!(unsafe { ncclGroupStart() }, 0);
        assert_eq!(group::depth(), 2);
        // SAFETY: the group functions take no arguments.
        assert_eq!(unsafe { ncclGroupEnd() }, 0);
        let mut si = ncclSimInfo_t {
            size: 24,
            magic: NCCL_SIM_INFO_MAGIC,
            version: 23203,
            estimatedTime: -1.0,
        };
        // SAFETY: a live ncclSimInfo_t on this stack frame.
        assert_eq!(unsafe { ncclGroupSimulateEnd(&mut si) }, 0);
        assert_eq!(si.estimatedTime, 0.0, "an empty group costs nothing");
        assert_eq!(group::depth(), 0);
        si.magic = 0;
        // SAFETY: a live ncclSimInfo_t on this stack frame.
        assert_eq!(unsafe { ncclGroupSimulateEnd(&mut si) }, 4);
        // SAFETY: NULL, which the function refuses.
        assert_eq!(unsafe { ncclGroupSimulateEnd(std::ptr::null_mut()) }, 4);
    }
}
