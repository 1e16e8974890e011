//! Where hetccl's own lines go: stdout, or NCCL_DEBUG_FILE.

use std::fs::OpenOptions;
use std::io::Write;
#[cfg(test)]
use std::sync::Arc;

use once_cell::sync::OnceCell;
use parking_lot::Mutex;

use super::line::{gettid, short_hostname};

/// Receives whole lines (newline included). Implementations write each line
/// with one call, under a lock, so lines from threads never interleave.
pub(crate) trait LineSink: Send + Sync {
    /// Writes one line. Errors are swallowed: logging never fails the caller.
    fn write_line(&self, line: &str);
}

/// Expands NCCL_DEBUG_FILE's `%h` (short host name) and `%p` (pid); `%%` is a
/// literal `%`, and any other `%x` is kept as written.
pub fn expand_debug_file(template: &str, host: &str, pid: u32) -> String {
    expand_template(template, host, pid, None)
}

/// Expands a file template: `%h` (short host name), `%p` (pid), `%r` (the
/// rank, when one is given), `%%` (a literal `%`); any other `%x` is kept
/// as written.
pub fn expand_template(template: &str, host: &str, pid: u32, rank: Option<usize>) -> String {
    let mut out = String::with_capacity(template.len() + 16);
    let mut chars = template.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('h') => out.push_str(host),
            Some('p') => out.push_str(&pid.to_string()),
            Some('r') if rank.is_some() => {
                out.push_str(&rank.map_or_else(String::new, |r| r.to_string()))
            }
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

/// Writes to stdout, or to the NCCL_DEBUG_FILE opened on the first line (so
/// that no file is created while nothing is logged).
pub(crate) struct DestSink {
    template: Option<String>,
    out: OnceCell<Mutex<Box<dyn Write + Send>>>,
}

impl DestSink {
    /// A sink for the given NCCL_DEBUG_FILE template (`None`: stdout).
    pub(crate) fn new(template: Option<String>) -> DestSink {
        DestSink {
            template,
            out: OnceCell::new(),
        }
    }

    fn open(&self) -> Box<dyn Write + Send> {
        let Some(template) = &self.template else {
            return Box::new(std::io::stdout());
        };
        let path = expand_debug_file(template, short_hostname(), std::process::id());
        match OpenOptions::new().create(true).append(true).open(&path) {
            Ok(f) => Box::new(f),
            Err(e) => {
                let msg = format!(
                    "{}:{}:{} [-] NCCL WARN hetccl: cannot open NCCL_DEBUG_FILE {path:?}: {e}; logging to stdout\n",
                    short_hostname(),
                    std::process::id(),
                    gettid()
                );
                let _ = std::io::stderr().write_all(msg.as_bytes());
                Box::new(std::io::stdout())
            }
        }
    }
}

impl LineSink for DestSink {
    fn write_line(&self, line: &str) {
        let out = self.out.get_or_init(|| Mutex::new(self.open()));
        let mut w = out.lock();
        let _ = w.write_all(line.as_bytes());
        let _ = w.flush();
    }
}

/// Collects lines in memory (tests).
#[cfg(test)]
#[derive(Clone, Default)]
pub(crate) struct BufferSink {
    lines: Arc<Mutex<Vec<String>>>,
}

#[cfg(test)]
impl BufferSink {
    /// Every line written so far.
    pub(crate) fn lines(&self) -> Vec<String> {
        self.lines.lock().clone()
    }
}

#[cfg(test)]
impl LineSink for BufferSink {
    fn write_line(&self, line: &str) {
        self.lines.lock().push(line.to_string());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expands_host_and_pid() {
        assert_eq!(
            expand_debug_file("/tmp/nccl.%h.%p.log", "node1", 123),
            "/tmp/nccl.node1.123.log"
        );
        assert_eq!(expand_debug_file("%p%p", "h", 7), "77");
        assert_eq!(expand_debug_file("a%%h", "h", 7), "a%h");
        assert_eq!(expand_debug_file("a%x%", "h", 7), "a%x%");
        assert_eq!(expand_debug_file("plain", "h", 7), "plain");
        assert_eq!(expand_debug_file("ü%h", "h", 7), "üh");
    }

    #[test]
    fn file_sink_appends_and_creates() {
        let dir =
            std::env::temp_dir().join(format!("hetccl-sink-{}-{}", std::process::id(), gettid()));
        let _ = std::fs::create_dir_all(&dir);
        let template = dir.join("log.%h.%p").to_string_lossy().into_owned();
        let path = expand_debug_file(&template, short_hostname(), std::process::id());
        std::fs::write(&path, "earlier\n").expect("seed file");
        let sink = DestSink::new(Some(template));
        sink.write_line("one\n");
        sink.write_line("two\n");
        let got = std::fs::read_to_string(&path).expect("read log");
        assert_eq!(got, "earlier\none\ntwo\n");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn unopenable_file_falls_back_without_panicking() {
        let sink = DestSink::new(Some("/nonexistent-dir-hetccl/x/%p.log".to_string()));
        sink.write_line("");
        assert!(!std::path::Path::new("/nonexistent-dir-hetccl").exists());
    }
}
