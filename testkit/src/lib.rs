//! hetccl's test kit: what the integration tests of several crates share.
//! A dev-only crate (`publish = false`), used only as a `[dev-dependencies]`
//! entry.
//!
//! This file is the locator: [`repo_root`], [`target_dir`], [`tmp_dir`],
//! [`profile_dir`] and [`hetccl_so`], the `libhetccl.so` of this build.
//! The modules, one job each:
//! - [`cc`]: NVIDIA's headers and `libnccl.so.2`, C compilation against
//!   them, running the programs and reading their `key value` lines;
//! - [`ranks`]: the multi-process runner (deadlines, process groups,
//!   reports);
//! - [`coll`]: `tests/c/coll_check.c` as N ranks, and the judging of what
//!   they printed;
//! - [`modes`]: the shared lists of `coll_check` modes and forced
//!   algorithms;
//! - [`faults`]: one peer-fault trial (kill, stop or idle a victim rank);
//! - [`netns`]: two network namespaces joined by a veth pair;
//! - [`fake_cuda`]: the emulated CUDA driver (`tests/c/fake_cuda*.c`);
//! - [`nvrtc`]: where NVIDIA's NVRTC is;
//! - [`threads`]: ranks as threads of the test process, through the
//!   exported C functions;
//! - [`net`]: the net-plugin conformance harness (dlopen, the v8/v12
//!   tables behind one API, child processes);
//! - [`perf`]: the `hetccl-perf` binary of this build and a strict parser of
//!   its nccl-tests output.

pub mod cc;
pub mod cc_cache;
pub mod coll;
pub mod fake_cuda;
pub mod fake_verbs;
pub mod faults;
pub mod modes;
pub mod net;
pub mod netns;
pub mod nvrtc;
pub mod perf;
pub mod prom;
pub mod ranks;
pub mod rdma;
pub mod revoke;
pub mod threads;

use std::path::{Path, PathBuf};

/// The workspace root (this crate lives in `<root>/testkit`).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("testkit/ has a parent directory")
        .to_path_buf()
}

/// The cargo profile output dir the running test binary was built into
/// (`target/debug`, `target/release`, `target/<triple>/<profile>`, ...,
/// wherever `CARGO_TARGET_DIR` put it). Integration tests live in
/// `<profile dir>/deps/`. A binary outside a `deps/` dir (started by hand
/// from elsewhere) gets `<target_dir>/debug` or `/release`, after the
/// profile this crate was built with.
pub fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    let deps = exe.parent().expect("test binary has a parent dir");
    if deps.file_name().and_then(|n| n.to_str()) == Some("deps") {
        return deps.parent().expect("deps/ has a parent").to_path_buf();
    }
    let profile = if cfg!(debug_assertions) {
        "debug"
    } else {
        "release"
    };
    target_dir().join(profile)
}

/// Cargo's target dir of this build: the nearest directory above the
/// running binary that holds cargo's `CACHEDIR.TAG`, or its parent when
/// that holds one too (`--target` builds tag `target/<triple>/` as well),
/// so `CARGO_TARGET_DIR` and `--target` layouts are followed; else
/// `CARGO_TARGET_DIR` as the environment gives it; else `<repo>/target`.
pub fn target_dir() -> PathBuf {
    let tagged = |d: &Path| d.join("CACHEDIR.TAG").is_file();
    let exe = std::env::current_exe().expect("current_exe");
    if let Some(d) = exe.ancestors().skip(1).find(|d| tagged(d)) {
        return match d.parent() {
            Some(p) if tagged(p) => p.to_path_buf(),
            _ => d.to_path_buf(),
        };
    }
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(d) if !d.is_empty() => repo_root().join(d),
        _ => repo_root().join("target"),
    }
}

/// A scratch directory for build products of tests (`<target>/tmp`, what
/// cargo names `CARGO_TARGET_TMPDIR`), created if missing.
pub fn tmp_dir() -> PathBuf {
    let d = target_dir().join("tmp");
    std::fs::create_dir_all(&d).unwrap_or_else(|e| panic!("create {}: {e}", d.display()));
    d
}

/// The `libhetccl.so` of this build.
///
/// `cargo test` of the root crate builds it: its lib is `crate-type =
/// ["cdylib", "rlib"]`, so compiling the rlib that the integration tests
/// link emits the cdylib in the same rustc invocation, as
/// `<profile>/deps/libhetccl.so`. That file is exactly as fresh as the test
/// binary, so it is preferred. (`cargo test` does not copy it up to
/// `<profile>/libhetccl.so`; only `cargo build` does, and that copy may be
/// stale.) Other crates' tests get it through a dev-dependency on `hetccl`
/// (as `hetccl-perf` has). Calling `cargo build` from here is no option: it
/// would block on the build-dir lock that the running `cargo test` holds.
pub fn hetccl_so() -> PathBuf {
    let dir = profile_dir();
    let candidates = [dir.join("deps/libhetccl.so"), dir.join("libhetccl.so")];
    candidates
        .iter()
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!(
                "none of {candidates:?} exists; build it with `cargo build -p hetccl` (same profile)"
            )
        })
        .canonicalize()
        .expect("canonicalize libhetccl.so path")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_locator_finds_this_build() {
        assert!(repo_root().join("testkit/Cargo.toml").is_file());
        let target = target_dir();
        assert!(target.join("CACHEDIR.TAG").is_file(), "{target:?}");
        let profile = profile_dir();
        assert!(profile.starts_with(&target), "{profile:?} in {target:?}");
        assert!(profile.join("deps").is_dir(), "{profile:?}");
        assert_eq!(tmp_dir(), target.join("tmp"));
        assert!(tmp_dir().is_dir());
    }
}
