//! Forwarding to NCCL's logger when hetccl runs as an NCCL net plugin.

use std::ffi::{c_char, c_int, c_ulong, CString};
use std::sync::Arc;

use once_cell::sync::Lazy;
use parking_lot::RwLock;

use crate::config::DebugLevel;

/// NCCL's `ncclDebugLogger_t`:
/// `void (*)(ncclDebugLogLevel level, unsigned long flags, const char* file,
/// int line, const char* fmt, ...)`.
///
/// `level` is a [`DebugLevel`] value and `flags` a
/// [`SubsysMask`](crate::config::SubsysMask) value.
pub type NcclLogger = unsafe extern "C" fn(i32, c_ulong, *const c_char, i32, *const c_char, ...);

/// Something that takes lines in place of hetccl's own writer.
pub(crate) trait Forward: Send + Sync {
    /// Receives one message (already tagged `hetccl: `, no newline).
    fn forward(&self, level: DebugLevel, flags: u64, file: &str, line: u32, msg: &str);
}

/// The shared, replaceable forwarding slot a layer consults on every line.
pub(crate) type Slot = Arc<RwLock<Option<Arc<dyn Forward>>>>;

/// The process-wide slot behind [`set_external_logger`].
pub(crate) static GLOBAL_SLOT: Lazy<Slot> = Lazy::new(Slot::default);

/// A C `ncclDebugLogger_t`.
struct CLogger(NcclLogger);

/// A C string without interior NULs (they are dropped).
fn c_string(s: &str) -> CString {
    CString::new(s.replace('\0', "")).unwrap_or_default()
}

impl Forward for CLogger {
    fn forward(&self, level: DebugLevel, flags: u64, file: &str, line: u32, msg: &str) {
        let file = c_string(if file.is_empty() { "hetccl" } else { file });
        let msg = c_string(msg);
        let line = c_int::try_from(line).unwrap_or(c_int::MAX);
        // SAFETY: NCCL handed us this logger for this purpose. Every pointer is
        // a valid NUL-terminated string that outlives the call, and the message
        // is passed as an argument of a constant "%s" format, never as the
        // format itself.
        unsafe {
            (self.0)(
                level.as_raw(),
                flags as c_ulong,
                file.as_ptr(),
                line,
                c"%s".as_ptr(),
                msg.as_ptr(),
            );
        }
    }
}

/// Routes hetccl's log lines to NCCL's logger (`Some`), or back to hetccl's
/// own output (`None`).
///
/// While a logger is set, every event that passes the NCCL_DEBUG level goes to
/// it as `logger(level, flags, file, line, "%s", "hetccl: <message>")`; NCCL
/// then applies its own level and subsystem filtering. Only events that reach
/// hetccl's subscriber are forwarded (see [`ensure_init`](super::ensure_init)).
pub fn set_external_logger(logger: Option<NcclLogger>) {
    let fwd = logger.map(|l| Arc::new(CLogger(l)) as Arc<dyn Forward>);
    *GLOBAL_SLOT.write() = fwd;
}

/// True while a logger set by [`set_external_logger`] is in place.
pub fn has_external_logger() -> bool {
    GLOBAL_SLOT.read().is_some()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn c_strings_drop_interior_nuls() {
        assert_eq!(c_string("a\0b").as_bytes(), b"ab");
        assert_eq!(c_string("").as_bytes(), b"");
    }
}
