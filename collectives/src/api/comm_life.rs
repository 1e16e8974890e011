//! Communicator queries and lifecycle: count, rank, device, async error,
//! finalize, destroy, abort, revoke, suspend/resume, memory statistics.

use std::ffi::c_int;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use hetccl_abi::{ncclComm_t, ncclResult_t, CommMemStat, NcclResult};

use super::check;
use super::guard::guard;
use crate::comm::{finalize, handle, revoke};
use crate::error::{Error, Result};
use crate::export;

/// The longest graceful close an abort of an idle communicator waits for.
const ABORT_LINGER: Duration = Duration::from_secs(1);

/// `NCCL_SUSPEND_MEM`, the only suspend flag.
const NCCL_SUSPEND_MEM: c_int = 0x01;

/// Writes `v` through `out` after checking it.
fn write_out<T>(out: *mut T, v: T, what: &str) -> Result<()> {
    check::non_null(out, what)?;
    // SAFETY: checked non-NULL; the caller passes a writable location.
    unsafe { out.write(v) };
    Ok(())
}

export! {
    /// Writes the number of ranks.
    fn ncclCommCount / pncclCommCount(comm: ncclComm_t, count: *mut c_int) -> ncclResult_t {
        guard("ncclCommCount", || write_out(count, handle::rank_and_size(comm)?.1 as c_int, "count"))
    }
}

export! {
    /// Writes this rank's index.
    fn ncclCommUserRank / pncclCommUserRank(comm: ncclComm_t, rank: *mut c_int) -> ncclResult_t {
        guard("ncclCommUserRank", || write_out(rank, handle::rank_and_size(comm)?.0 as c_int, "rank"))
    }
}

export! {
    /// Writes the CUDA device of the communicator: the one recorded at
    /// init, else (CUDA present) the device of the caller's current context,
    /// else -1 for a host-only rank.
    fn ncclCommCuDevice / pncclCommCuDevice(comm: ncclComm_t, device: *mut c_int) -> ncclResult_t {
        guard("ncclCommCuDevice", || {
            let c = handle::lookup(comm)?;
            let d = if c.cuda_device >= 0 {
                c.cuda_device
            } else {
                crate::gpu::driver::current_device().unwrap_or(-1)
            };
            write_out(device, d, "device")
        })
    }
}

export! {
    /// Writes the communicator's asynchronous error state (`ncclInProgress`
    /// while a nonblocking operation runs).
    fn ncclCommGetAsyncError / pncclCommGetAsyncError(comm: ncclComm_t, async_error: *mut ncclResult_t) -> ncclResult_t {
        guard("ncclCommGetAsyncError", || {
            let c = handle::lookup(comm)?;
            write_out(async_error, c.async_error.load(Ordering::Acquire), "asyncError")
        })
    }
}

export! {
    /// Completes the communicator's outstanding operations and closes its
    /// links gracefully (`comm::finalize`). A nonblocking communicator
    /// finalizes on a helper thread: the call returns `ncclInProgress` and
    /// `ncclCommGetAsyncError` reports the end.
    fn ncclCommFinalize / pncclCommFinalize(comm: ncclComm_t) -> ncclResult_t {
        guard("ncclCommFinalize", || {
            let c = handle::lookup(comm)?;
            if c.revoked.load(Ordering::Acquire) {
                return Err(Error::usage(
                    "ncclCommFinalize after ncclCommRevoke: a revoked communicator can be \
                     destroyed, split or shrunk, not finalized",
                ));
            }
            let nonblocking = c.engine.get().is_some_and(|e| !e.config.blocking);
            if !nonblocking {
                return finalize::finalize(&c);
            }
            let mut slot = c.finalizer.lock();
            if slot.is_some() || c.finalized.load(Ordering::Acquire) {
                return Ok(());
            }
            c.async_error.store(NcclResult::InProgress.raw(), Ordering::Release);
            let cc = c.clone();
            let h = std::thread::Builder::new()
                .name("hetccl-finalize".into())
                .spawn(move || {
                    let code = match finalize::finalize(&cc) {
                        Ok(()) => NcclResult::Success.raw(),
                        Err(e) => {
                            super::guard::set_last_error(&format!("ncclCommFinalize: {e}"));
                            e.code().raw()
                        }
                    };
                    cc.async_error.store(code, Ordering::Release);
                })
                .map_err(|e| Error::System(format!("spawn: {e}").into()))?;
            *slot = Some(h);
            Err(Error::InProgress)
        })
    }
}

export! {
    /// Frees the communicator, finalizing it first unless that was done
    /// (waiting for a nonblocking finalize still running). NULL is
    /// accepted, as NCCL does.
    fn ncclCommDestroy / pncclCommDestroy(comm: ncclComm_t) -> ncclResult_t {
        guard("ncclCommDestroy", || {
            if comm.is_null() {
                return Ok(());
            }
            let c = handle::unregister(comm)?;
            let running = c.finalizer.lock().take();
            if let Some(h) = running {
                let _ = h.join();
            }
            if let Err(e) = finalize::finalize(&c) {
                tracing::warn!(target: "hetccl::INIT",
                    "ncclCommDestroy: rank {}: {e}; closing the links at once", c.rank);
            }
            finalize::write_telemetry(&c);
            Ok(())
        })
    }
}

export! {
    /// Stops the communicator's operations and frees it. NULL is accepted.
    fn ncclCommAbort / pncclCommAbort(comm: ncclComm_t) -> ncclResult_t {
        guard("ncclCommAbort", || {
            if comm.is_null() {
                return Ok(());
            }
            let c = handle::unregister(comm)?;
            c.revoked.store(true, Ordering::Release);
            if let Some(e) = c.engine.get() {
                // An idle, healthy communicator (an application's exit path)
                // still closes gracefully, briefly, so that peers finishing
                // their last operation lose nothing; one with an operation
                // in flight is stopped at once.
                if !c.has_failed() {
                    if let Some(_idle) = e.exec_gate.try_enter() {
                        e.links.finish(Instant::now() + ABORT_LINGER);
                    }
                }
                // Operations running on other threads see the flag within
                // one bounded wait; peers see the closed links.
                e.links.close_all();
            }
            finalize::write_telemetry(&c);
            Ok(())
        })
    }
}

export! {
    /// Stops the communicator's operations; it can then only be destroyed.
    fn ncclCommRevoke / pncclCommRevoke(comm: ncclComm_t, flags: c_int) -> ncclResult_t {
        guard("ncclCommRevoke", || {
            let c = handle::lookup(comm)?;
            if flags != 0 {
                return Err(Error::arg(format!("revokeFlags must be 0, not {flags:#x}")));
            }
            revoke::revoke(&c, c.rank);
            Ok(())
        })
    }
}

export! {
    /// Suspends the communicator. Host communicators hold no releasable
    /// device memory, so this only blocks new operations until resumed.
    fn ncclCommSuspend / pncclCommSuspend(comm: ncclComm_t, flags: c_int) -> ncclResult_t {
        guard("ncclCommSuspend", || {
            let c = handle::lookup(comm)?;
            if flags & !NCCL_SUSPEND_MEM != 0 {
                return Err(Error::arg(format!("unknown suspend flags {flags:#x}")));
            }
            c.suspended.store(true, Ordering::Release);
            Ok(())
        })
    }
}

export! {
    /// Resumes a suspended communicator.
    fn ncclCommResume / pncclCommResume(comm: ncclComm_t) -> ncclResult_t {
        guard("ncclCommResume", || {
            let c = handle::lookup(comm)?;
            if !c.suspended.swap(false, Ordering::AcqRel) {
                return Err(Error::usage("the communicator is not suspended"));
            }
            Ok(())
        })
    }
}

export! {
    /// Writes a GPU-memory statistic; host communicators allocate none, so
    /// every statistic is 0.
    fn ncclCommMemStats / pncclCommMemStats(comm: ncclComm_t, stat: c_int, value: *mut u64) -> ncclResult_t {
        guard("ncclCommMemStats", || {
            let c = handle::lookup(comm)?;
            let stat = CommMemStat::try_from(stat)
                .map_err(|v| Error::arg(format!("invalid ncclCommMemStat_t {v}")))?;
            let v = match stat {
                CommMemStat::GpuMemSuspended => u64::from(c.suspended.load(Ordering::Acquire)),
                _ => 0,
            };
            write_out(value, v, "value")
        })
    }
}
