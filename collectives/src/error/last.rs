//! The last-error store behind `ncclGetLastError`: per thread, with a
//! process-wide fallback for threads that raised nothing themselves.

use std::cell::RefCell;
use std::ffi::{c_char, CString};

use parking_lot::Mutex;

/// The longest message kept for `ncclGetLastError` (NCCL keeps 1 KiB).
pub const LAST_ERROR_MAX: usize = 1024;

thread_local! {
    /// The last error raised on this thread, and the C string handed out for it.
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

/// The last error raised on any thread: what `ncclGetLastError` returns on a
/// thread that has raised none itself (e.g. PyTorch's watchdog thread).
static GLOBAL_LAST_ERROR: Mutex<String> = Mutex::new(String::new());

/// Records `msg` as the last error, on this thread and process-wide.
pub fn set_last_error(msg: &str) {
    let mut s: String = msg.chars().filter(|&c| c != '\0').collect();
    if s.len() > LAST_ERROR_MAX {
        let mut cut = LAST_ERROR_MAX;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
    }
    *GLOBAL_LAST_ERROR.lock() = s.clone();
    let c = CString::new(s).unwrap_or_default();
    LAST_ERROR.with(|l| *l.borrow_mut() = c);
}

/// Returns a pointer to the last error message. The pointer stays valid on
/// this thread until the next hetccl call on this thread that fails or asks
/// for the last error again.
pub fn last_error_ptr() -> *const c_char {
    LAST_ERROR.with(|l| {
        let mut l = l.borrow_mut();
        if l.as_bytes().is_empty() {
            let g = GLOBAL_LAST_ERROR.lock().clone();
            *l = CString::new(g).unwrap_or_default();
        }
        l.as_ptr()
    })
}

/// Clears this thread's last error (tests use it).
pub fn clear_last_error() {
    GLOBAL_LAST_ERROR.lock().clear();
    LAST_ERROR.with(|l| *l.borrow_mut() = CString::default());
}
