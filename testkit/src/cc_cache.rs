//! A content-keyed cache of the C programs [`crate::cc::compile_c`] builds,
//! in `<target>/cc-cache`.
//!
//! The key hashes the compiler, every argument, the source and every file
//! argument, and every file of `tests/c` (the headers the sources include).
//! A hit is copied to the requested path instead of compiling. The RDMA
//! tests' QEMU guest sees the host's target directory read-only, so the
//! programs the host's `cargo test` compiled are found there; gcc under
//! emulation took close to a minute per test binary. A miss compiles as
//! before; a cache that cannot be written (the guest's) is no error.

use std::hash::Hasher;
use std::path::{Path, PathBuf};

use crate::{repo_root, target_dir};

/// FNV-1a, 64 bits: stable across processes and builds, unlike std's
/// `DefaultHasher` seedings, and enough to tell sources apart.
struct Fnv(u64);

impl Hasher for Fnv {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 ^= u64::from(*b);
            self.0 = self.0.wrapping_mul(0x0100_0000_01b3);
        }
    }
}

/// Feeds `bytes` and its length (so that concatenations differ).
fn feed(h: &mut Fnv, bytes: &[u8]) {
    h.write(&(bytes.len() as u64).to_le_bytes());
    h.write(bytes);
}

/// The cache key of compiling with `args` (the whole command line, compiler
/// first): a hex string.
pub fn key(args: &[String]) -> String {
    let mut h = Fnv(0xcbf2_9ce4_8422_2325);
    for a in args {
        feed(&mut h, a.as_bytes());
        if a.ends_with(".c") || a.ends_with(".h") {
            feed(&mut h, &std::fs::read(a).unwrap_or_default());
        }
    }
    let dir = repo_root().join("tests/c");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .map(|rd| rd.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default();
    files.sort();
    for f in files {
        feed(&mut h, f.to_string_lossy().as_bytes());
        feed(&mut h, &std::fs::read(&f).unwrap_or_default());
    }
    format!("{:016x}", h.finish())
}

fn entry(key: &str) -> PathBuf {
    target_dir().join("cc-cache").join(key)
}

/// Copies the cached program of `key` to `out`; false when there is none.
pub fn fetch(key: &str, out: &Path) -> bool {
    let src = entry(key);
    if !src.is_file() {
        return false;
    }
    let tmp = out.with_extension(format!("cc-cache.{}", std::process::id()));
    let ok = std::fs::copy(&src, &tmp).is_ok() && std::fs::rename(&tmp, out).is_ok();
    let _ = std::fs::remove_file(&tmp);
    ok
}

/// Stores the program at `out` under `key`, atomically (a temporary name,
/// then a rename); failures are ignored (a read-only target).
pub fn store(key: &str, out: &Path) {
    let dst = entry(key);
    let Some(dir) = dst.parent() else { return };
    if std::fs::create_dir_all(dir).is_err() {
        return;
    }
    let tmp = dst.with_extension(format!("part.{}", std::process::id()));
    if std::fs::copy(out, &tmp).is_ok() {
        let _ = std::fs::rename(&tmp, &dst);
    }
    let _ = std::fs::remove_file(&tmp);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_follows_arguments_and_source_contents() {
        let dir = crate::tmp_dir().join(format!("cc_cache_key.{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let src = dir.join("x.c");
        std::fs::write(&src, "int main(void) { return 0; }\n").unwrap();
        let args = |extra: &str| {
            vec![
                "gcc".to_string(),
                src.display().to_string(),
                extra.to_string(),
            ]
        };
        let a = key(&args("-O1"));
        assert_eq!(a, key(&args("-O1")));
        assert_ne!(a, key(&args("-O2")));
        std::fs::write(&src, "int main(void) { return 1; }\n").unwrap();
        assert_ne!(a, key(&args("-O1")));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
