//! Buffer registration: `ncclCommRegister`/`ncclCommDeregister` (host
//! handles) and the window API (forwarded to NVIDIA's NCCL through
//! `HETCCL_NCCL_FALLBACK`, see [`super::fallback`]).

use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicUsize, Ordering};

use hetccl_abi::{ncclComm_t, ncclResult_t, ncclWindow_t};

use super::check;
use super::fallback::{self, code, mirror};
use super::guard::guard;
use crate::comm::handle;
use crate::error::Error;
use crate::export;

/// Registration handles are opaque tokens, never dereferenced.
static NEXT_TOKEN: AtomicUsize = AtomicUsize::new(0x1000);

export! {
    /// Registers `buff` with the communicator and returns a handle.
    fn ncclCommRegister / pncclCommRegister(comm: ncclComm_t, buff: *mut c_void, size: usize,
        reg_handle: *mut *mut c_void) -> ncclResult_t {
        guard("ncclCommRegister", || {
            let c = handle::lookup(comm)?;
            check::non_null(reg_handle, "handle")?;
            check::buffer(buff, size, "buff")?;
            if size > isize::MAX as usize {
                return Err(Error::arg(format!("size {size} is too large")));
            }
            let token = NEXT_TOKEN.fetch_add(16, Ordering::Relaxed);
            c.registrations.lock().insert(token, (buff as usize, size));
            // Verbs links then write straight from and into host memory;
            // device memory is registered for GPUDirect where allowed.
            match crate::gpu::classify(buff, size, "buff")?.device() {
                Some(d) => crate::transport::gdr::register_user(buff as usize, size, d),
                None => nccl_net_plugin::ib::register_user(buff as usize, size),
            }
            // SAFETY: checked non-NULL.
            unsafe { *reg_handle = token as *mut c_void };
            Ok(())
        })
    }
}

export! {
    /// Releases a handle from [`ncclCommRegister`].
    fn ncclCommDeregister / pncclCommDeregister(comm: ncclComm_t, reg_handle: *mut c_void) -> ncclResult_t {
        guard("ncclCommDeregister", || {
            let c = handle::lookup(comm)?;
            let removed = c.registrations.lock().remove(&(reg_handle as usize));
            if let Some((addr, size)) = removed {
                nccl_net_plugin::ib::unregister_user(addr, size);
            }
            removed.map(drop).ok_or_else(|| {
                Error::arg(format!("handle {reg_handle:p} is not registered with this communicator"))
            })
        })
    }
}

export! {
    /// Registers a symmetric memory window: forwarded to NVIDIA's NCCL
    /// (`HETCCL_NCCL_FALLBACK`) on the mirror communicator; collective, as
    /// in NCCL. Without the fallback: `ncclInvalidUsage`.
    fn ncclCommWindowRegister / pncclCommWindowRegister(comm: ncclComm_t, buff: *mut c_void, size: usize,
        win: *mut ncclWindow_t, win_flags: c_int) -> ncclResult_t {
        guard("ncclCommWindowRegister", || {
            handle::lookup(comm)?;
            check::non_null(win, "win")?;
            check::buffer(buff, size, "buff")?;
            let fb = fallback::require("ncclCommWindowRegister")?;
            type F = unsafe extern "C" fn(ncclComm_t, *mut c_void, usize, *mut ncclWindow_t, c_int) -> ncclResult_t;
            // SAFETY: the prototype in nccl.h.
            let f = unsafe { fb.sym::<F>("ncclCommWindowRegister\0")? };
            // SAFETY: the caller's handle, validated inside.
            let m = unsafe { mirror(comm)? };
            // SAFETY: checked arguments, passed through with the mirror comm.
            code("ncclCommWindowRegister", unsafe { f(m, buff, size, win, win_flags) })
        })
    }
}

export! {
    /// Releases a window from [`ncclCommWindowRegister`] (forwarded).
    fn ncclCommWindowDeregister / pncclCommWindowDeregister(comm: ncclComm_t, win: ncclWindow_t) -> ncclResult_t {
        guard("ncclCommWindowDeregister", || {
            handle::lookup(comm)?;
            check::non_null(win, "win")?;
            let fb = fallback::require("ncclCommWindowDeregister")?;
            type F = unsafe extern "C" fn(ncclComm_t, ncclWindow_t) -> ncclResult_t;
            // SAFETY: the prototype in nccl.h.
            let f = unsafe { fb.sym::<F>("ncclCommWindowDeregister\0")? };
            // SAFETY: the caller's handle, validated inside.
            let m = unsafe { mirror(comm)? };
            // SAFETY: a window from the fallback, passed through.
            code("ncclCommWindowDeregister", unsafe { f(m, win) })
        })
    }
}

export! {
    /// Writes the user pointer a window was registered with (forwarded).
    fn ncclWinGetUserPtr / pncclWinGetUserPtr(comm: ncclComm_t, win: ncclWindow_t,
        out: *mut *mut c_void) -> ncclResult_t {
        guard("ncclWinGetUserPtr", || {
            handle::lookup(comm)?;
            check::non_null(win, "win")?;
            check::non_null(out, "outUserPtr")?;
            let fb = fallback::require("ncclWinGetUserPtr")?;
            type F = unsafe extern "C" fn(ncclComm_t, ncclWindow_t, *mut *mut c_void) -> ncclResult_t;
            // SAFETY: the prototype in nccl.h.
            let f = unsafe { fb.sym::<F>("ncclWinGetUserPtr\0")? };
            // SAFETY: the caller's handle, validated inside.
            let m = unsafe { mirror(comm)? };
            // SAFETY: checked arguments, passed through with the mirror comm.
            code("ncclWinGetUserPtr", unsafe { f(m, win, out) })
        })
    }
}
