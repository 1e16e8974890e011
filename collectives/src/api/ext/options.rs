//! The control API: per-communicator options set and read at run time
//! (`crate::control`; keys and values in docs/tuning.md).
//!
//! A submodule of `ext`, so that cbindgen puts both functions in
//! `include/hetccl.h`.
#![allow(clippy::missing_safety_doc)]

use std::ffi::{c_char, CStr};

use hetccl_abi::{ncclComm_t, ncclResult_t};

use super::info::write_out;
use crate::api::check;
use crate::api::guard::guard;
use crate::comm::handle;
use crate::control::{agree, options};
use crate::error::{Error, Result};

/// The longest key or value string read from the caller (bytes); longer
/// ones are refused.
const MAX_TEXT: usize = 4096;

/// The UTF-8 text of a NUL-terminated C string (checked non-NULL, bounded).
///
/// # Safety
/// `p` is NULL or points to a NUL-terminated string.
unsafe fn text<'a>(p: *const c_char, what: &str) -> Result<&'a str> {
    check::non_null(p, what)?;
    // SAFETY: non-NULL and NUL-terminated (caller contract); the length is
    // bounded below before the string is used.
    let s = unsafe { CStr::from_ptr(p) };
    if s.to_bytes().len() > MAX_TEXT {
        return Err(Error::arg(format!(
            "{what} is longer than {MAX_TEXT} bytes"
        )));
    }
    s.to_str()
        .map_err(|_| Error::arg(format!("{what} is not UTF-8")))
}

/// Sets the option `key` to `value` on `comm`. Keys: `algo` (an `NCCL_ALGO`
/// value for every collective, or `default`), `algo.<collective>` (an
/// algorithm list for one collective, e.g. `algo.allreduce` = `ring`, or
/// `default`), `tune` (`off`, `init`, `online`), `compress` (`off`, `bf16`,
/// `fp8e4m3`) and `chunk_bytes` (4K to 64M, or `default`).
///
/// A collective call: every rank of `comm` calls it with the same key and
/// value at the same point of its sequence of collectives, and the value
/// applies from the next collective on, on every rank. Ranks that set
/// different options, or after different numbers of collectives, all get
/// `ncclInvalidUsage`; an unknown key or a bad value gives
/// `ncclInvalidArgument`. Nothing is applied when it fails. Not allowed
/// inside a group. See docs/tuning.md.
#[no_mangle]
pub unsafe extern "C" fn hetcclCommSetOption(
    comm: ncclComm_t,
    key: *const c_char,
    value: *const c_char,
) -> ncclResult_t {
    guard("hetcclCommSetOption", || {
        let c = handle::lookup(comm)?;
        // SAFETY: NULL or NUL-terminated strings (caller contract).
        let (k, v) = unsafe { (text(key, "key")?, text(value, "value")?) };
        crate::launch::claim_for_call(&c, || agree::set(&c, k, v))
    })
}

/// Writes the value of option `key` on `comm` (as `hetcclCommSetOption`
/// takes it; `default` for an `algo` key that is not set) into `buf` of
/// `len` bytes, NUL-terminated and truncated if needed; `*needed` (if not
/// NULL) receives its full length without the NUL, as snprintf does. Local:
/// not a collective call.
#[no_mangle]
pub unsafe extern "C" fn hetcclCommGetOption(
    comm: ncclComm_t,
    key: *const c_char,
    buf: *mut c_char,
    len: usize,
    needed: *mut usize,
) -> ncclResult_t {
    guard("hetcclCommGetOption", || {
        let c = handle::lookup(comm)?;
        // SAFETY: NULL or a NUL-terminated string (caller contract).
        let k = unsafe { text(key, "key")? };
        if len > 0 {
            check::non_null(buf, "buf")?;
        }
        let k = options::key(k).map_err(Error::arg)?;
        let value = c.engine()?.control.get(k);
        // SAFETY: `buf` holds `len` writable bytes (checked non-NULL when
        // len > 0); `needed` is NULL or a writable size_t (caller contract).
        unsafe { write_out(&value, buf, len, needed) };
        Ok(())
    })
}
