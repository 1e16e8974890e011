//! The NCCL-style line: `<host>:<pid>:<tid> [<rank>] NCCL <LEVEL> hetccl: <message>`.

use std::cell::Cell;
use std::fmt::{self, Write as _};

use once_cell::sync::Lazy;
use tracing::field::{Field, Visit};

use crate::config::DebugLevel;

/// The tag every hetccl message starts with.
pub(crate) const TAG: &str = "hetccl: ";

thread_local! {
    static RANK: Cell<Option<i32>> = const { Cell::new(None) };
}

/// Sets the rank (or device) shown in this thread's log lines; `None` shows
/// `[-]`.
pub fn set_thread_rank(rank: Option<i32>) {
    let _ = RANK.try_with(|r| r.set(rank));
}

/// The rank set by [`set_thread_rank`] on this thread.
pub fn thread_rank() -> Option<i32> {
    RANK.try_with(Cell::get).ok().flatten()
}

/// The host name up to its first dot, as NCCL prints it.
pub fn short_hostname() -> &'static str {
    static HOST: Lazy<String> = Lazy::new(|| {
        let mut buf = [0u8; 256];
        // SAFETY: the buffer is valid for its length; gethostname NUL-terminates
        // on success (or truncates), and we stop at the first NUL or the end.
        let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len() - 1) };
        if rc != 0 {
            return "localhost".to_string();
        }
        let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
        let full = String::from_utf8_lossy(&buf[..end]).into_owned();
        let short = full.split('.').next().unwrap_or("").to_string();
        if short.is_empty() {
            "localhost".to_string()
        } else {
            short
        }
    });
    &HOST
}

/// The kernel thread id of the caller (`gettid`).
pub fn gettid() -> i64 {
    // SAFETY: SYS_gettid takes no arguments and cannot fail.
    unsafe { libc::syscall(libc::SYS_gettid) }
}

/// The label NCCL prints for a level.
fn label(level: DebugLevel) -> &'static str {
    match level {
        DebugLevel::Warn => "WARN",
        DebugLevel::Trace => "TRACE",
        // VERSION lines read as INFO lines, as in NCCL's logs.
        _ => "INFO",
    }
}

/// Writes the prefix `<host>:<pid>:<tid> [<rank>] NCCL <LEVEL> ` into `out`.
pub(crate) fn write_prefix(
    out: &mut String,
    level: DebugLevel,
    host: &str,
    pid: u32,
    tid: i64,
    rank: Option<i32>,
) {
    let _ = write!(out, "{host}:{pid}:{tid} ");
    match rank {
        Some(r) => {
            let _ = write!(out, "[{r}] ");
        }
        None => out.push_str("[-] "),
    }
    let _ = write!(out, "NCCL {} ", label(level));
}

/// A full line, newline included, for the calling thread and process.
pub(crate) fn format_line(level: DebugLevel, message: &str) -> String {
    let mut out = String::with_capacity(64 + message.len());
    write_prefix(
        &mut out,
        level,
        short_hostname(),
        std::process::id(),
        gettid(),
        thread_rank(),
    );
    out.push_str(TAG);
    out.push_str(message);
    out.push('\n');
    out
}

/// Collects an event's message and fields as `message k=v k2=v2`.
#[derive(Default)]
pub(crate) struct MessageVisitor {
    /// The formatted message so far.
    pub text: String,
    fields: String,
}

impl MessageVisitor {
    /// The message followed by its fields.
    pub(crate) fn finish(mut self) -> String {
        if !self.fields.is_empty() {
            if !self.text.is_empty() {
                self.text.push(' ');
            }
            self.text.push_str(&self.fields);
        }
        self.text
    }

    fn field_sep(&mut self) {
        if !self.fields.is_empty() {
            self.fields.push(' ');
        }
    }
}

impl Visit for MessageVisitor {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.text.push_str(value);
        } else if !field.name().starts_with("log.") {
            self.field_sep();
            let _ = write!(self.fields, "{}={value}", field.name());
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        if field.name() == "message" {
            let _ = write!(self.text, "{value:?}");
        } else if !field.name().starts_with("log.") {
            self.field_sep();
            let _ = write!(self.fields, "{}={value:?}", field.name());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_matches_nccl_shape() {
        let mut s = String::new();
        write_prefix(&mut s, DebugLevel::Info, "node1", 42, 43, Some(3));
        assert_eq!(s, "node1:42:43 [3] NCCL INFO ");
        s.clear();
        write_prefix(&mut s, DebugLevel::Warn, "node1", 42, 43, None);
        assert_eq!(s, "node1:42:43 [-] NCCL WARN ");
        s.clear();
        write_prefix(&mut s, DebugLevel::Trace, "h", 1, 2, Some(0));
        assert_eq!(s, "h:1:2 [0] NCCL TRACE ");
        s.clear();
        write_prefix(&mut s, DebugLevel::Version, "h", 1, 2, Some(0));
        assert_eq!(s, "h:1:2 [0] NCCL INFO ");
    }

    #[test]
    fn thread_rank_is_per_thread() {
        set_thread_rank(Some(5));
        assert_eq!(thread_rank(), Some(5));
        let other = std::thread::spawn(thread_rank).join().ok().flatten();
        assert_eq!(other, None);
        set_thread_rank(None);
        assert_eq!(thread_rank(), None);
    }

    #[test]
    fn format_line_uses_this_process() {
        set_thread_rank(Some(7));
        let line = format_line(DebugLevel::Info, "hello");
        set_thread_rank(None);
        let expected = format!(
            "{}:{}:{} [7] NCCL INFO hetccl: hello\n",
            short_hostname(),
            std::process::id(),
            gettid()
        );
        assert_eq!(line, expected);
        assert!(!short_hostname().contains('.'));
        assert!(gettid() > 0);
    }
}
