//! File templates of `HETCCL_METRICS_FILE` and `HETCCL_TRACE_FILE`: `%h`
//! (the short host name), `%p` (the process id), `%r` (the rank), `%%` (a
//! literal `%`); any other `%x` is kept as written.

use std::io::Write;
use std::path::{Path, PathBuf};

/// Expands `template` for `rank` on this host and process.
pub fn expand(template: &str, rank: usize) -> PathBuf {
    expand_with(
        template,
        hetccl_core::obs::short_hostname(),
        std::process::id(),
        rank,
    )
    .into()
}

/// [`expand`] with the host and pid given (tests).
pub fn expand_with(template: &str, host: &str, pid: u32, rank: usize) -> String {
    hetccl_core::obs::expand_template(template, host, pid, Some(rank))
}

/// Replaces `path` with `text` atomically: a temporary file next to it,
/// then a rename, so that readers see the old or the new file, never a
/// part of one.
pub fn write_atomic(path: &Path, text: &[u8]) -> std::io::Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(format!(".tmp.{}", std::process::id()));
    let tmp = PathBuf::from(tmp);
    let r = std::fs::File::create(&tmp)
        .and_then(|mut f| f.write_all(text))
        .and_then(|()| std::fs::rename(&tmp, path));
    if r.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates_expand() {
        assert_eq!(
            expand_with("/t/m.%h.%p.%r.prom", "n1", 42, 3),
            "/t/m.n1.42.3.prom"
        );
        assert_eq!(expand_with("a%%r%x%", "h", 1, 2), "a%r%x%");
    }

    #[test]
    fn atomic_writes_replace_the_file() {
        let d = std::env::temp_dir().join(format!("hetccl-path-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        let p = d.join("f");
        write_atomic(&p, b"one").unwrap();
        write_atomic(&p, b"two").unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"two");
        assert_eq!(std::fs::read_dir(&d).unwrap().count(), 1);
        std::fs::remove_dir_all(&d).unwrap();
    }
}
