//! Buffer registration: `ncclCommRegister`/`ncclCommDeregister` (host
//! handles) and the window API (device-only for now).

use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicUsize, Ordering};

use hetccl_abi::{ncclComm_t, ncclResult_t, ncclWindow_t};

use super::check;
use super::engine_gate::device_only;
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
            removed.map(drop).ok_or_else(|| {
                Error::arg(format!("handle {reg_handle:p} is not registered with this communicator"))
            })
        })
    }
}

export! {
    /// Registers a symmetric memory window (device-only for now).
    fn ncclCommWindowRegister / pncclCommWindowRegister(comm: ncclComm_t, buff: *mut c_void, size: usize,
        win: *mut ncclWindow_t, win_flags: c_int) -> ncclResult_t {
        guard("ncclCommWindowRegister", || {
            handle::lookup(comm)?;
            check::non_null(win, "win")?;
            check::buffer(buff, size, "buff")?;
            let _ = win_flags;
            Err(device_only("ncclCommWindowRegister"))
        })
    }
}

export! {
    /// Releases a window (device-only for now).
    fn ncclCommWindowDeregister / pncclCommWindowDeregister(comm: ncclComm_t, win: ncclWindow_t) -> ncclResult_t {
        guard("ncclCommWindowDeregister", || {
            handle::lookup(comm)?;
            check::non_null(win, "win")?;
            Err(device_only("ncclCommWindowDeregister"))
        })
    }
}

export! {
    /// Writes the user pointer a window was registered with (device-only for now).
    fn ncclWinGetUserPtr / pncclWinGetUserPtr(comm: ncclComm_t, win: ncclWindow_t,
        out: *mut *mut c_void) -> ncclResult_t {
        guard("ncclWinGetUserPtr", || {
            handle::lookup(comm)?;
            check::non_null(win, "win")?;
            check::non_null(out, "outUserPtr")?;
            Err(device_only("ncclWinGetUserPtr"))
        })
    }
}
