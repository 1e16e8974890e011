//! The emulated CUDA driver (`tests/c/fake_cuda*.c`) for integration tests
//! of the device-buffer paths on machines without a GPU.
//!
//! [`fake_cuda_dir`] builds it once per test binary as `libcuda.so.1` (plus
//! a `libcuda.so` link, the first name `cudarc` tries) and returns the
//! directory; put it first in a child process's `LD_LIBRARY_PATH`
//! ([`ld_library_path`]) and hetccl loads the fake instead of NVIDIA's
//! driver. Device pointers are real addresses mapped `PROT_NONE`, so a host
//! access of one crashes, as on a GPU. The model, its switches and where it
//! differs from the real driver are described at the top of
//! `tests/c/fake_cuda.c`.
//!
//! Switches, read from the child's environment:
//! - `FAKE_CUDA_DEVICES=N` (default 1; 0: `cuInit` fails with
//!   `CUDA_ERROR_NO_DEVICE`);
//! - `FAKE_CUDA_NO_STREAM_MEMOPS=1`: `cuStreamWaitValue32` returns
//!   `CUDA_ERROR_NOT_SUPPORTED` (hetccl's host-function fallback);
//! - `FAKE_CUDA_LOG=1`: one line per driver call on stderr;
//! - `FAKE_CUDA_PEERMEM=1`: device memory is mapped read-write, so that a
//!   real RDMA device (Soft-RoCE) can register it, as with nvidia-peermem;
//! - `FAKE_CUDA_TIMEOUT_S` (default 120): any wait inside the fake aborts
//!   the process after this long.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use crate::{cc, repo_root, tmp_dir};

/// The fake driver's C files, relative to the repository root.
const FAKE_CUDA_SOURCES: &[&str] = &[
    "tests/c/fake_cuda.c",
    "tests/c/fake_cuda_memory.c",
    "tests/c/fake_cuda_streams.c",
    "tests/c/fake_cuda_kernels.c",
];

/// Compiles the fake driver (first call only) into
/// [`tmp_dir`]`/fake_cuda_<tag>/` and returns that directory, which
/// holds `libcuda.so.1` and `libcuda.so`. `tag` must differ between test
/// binaries (they may compile at the same time); later calls in the same
/// binary return the first directory whatever their tag.
pub fn fake_cuda_dir(tag: &str) -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let name = format!("fake_cuda_{tag}");
        let dir = tmp_dir().join(&name);
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("create {}: {e}", dir.display()));
        // fake_cuda.c first; the others share fake_cuda_internal.h (found
        // next to them) and export only the CUDA API.
        let mut extra: Vec<String> = FAKE_CUDA_SOURCES[1..]
            .iter()
            .map(|f| repo_root().join(f).display().to_string())
            .collect();
        extra.extend(["-shared".into(), "-fPIC".into(), "-pthread".into()]);
        cc::compile_c(
            FAKE_CUDA_SOURCES[0],
            &format!("{name}/libcuda.so.1"),
            &cc::CcOpts {
                link_nvidia_nccl: false,
                extra,
            },
        );
        let link = dir.join("libcuda.so");
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink("libcuda.so.1", &link)
            .unwrap_or_else(|e| panic!("symlink {}: {e}", link.display()));
        dir
    })
}

/// `LD_LIBRARY_PATH` for a child that must load the fake driver: its
/// directory first, then this process's `LD_LIBRARY_PATH`, if any.
pub fn ld_library_path(tag: &str) -> OsString {
    let mut v = OsString::from(fake_cuda_dir(tag));
    if let Some(old) = std::env::var_os("LD_LIBRARY_PATH").filter(|o| !o.is_empty()) {
        v.push(":");
        v.push(old);
    }
    v
}

/// `tests/c/device_check*.c` (one rank of the device-buffer checks),
/// compiled once per test binary and linked to the fake driver of
/// [`fake_cuda_dir`]`(tag)`; run it with that directory first in
/// `LD_LIBRARY_PATH`.
pub fn device_check(tag: &str) -> &'static Path {
    static EXE: OnceLock<PathBuf> = OnceLock::new();
    EXE.get_or_init(|| {
        let dir = fake_cuda_dir(tag);
        let src = |rel: &str| repo_root().join(rel).display().to_string();
        cc::compile_c(
            "tests/c/device_check.c",
            &format!("device_check_{tag}"),
            &cc::CcOpts {
                link_nvidia_nccl: true,
                extra: vec![
                    src("tests/c/device_check_colls.c"),
                    src("tests/c/device_check_features.c"),
                    src("tests/c/device_check_strict.c"),
                    format!("-L{}", dir.display()),
                    "-l:libcuda.so.1".into(),
                    "-ldl".into(),
                ],
            },
        )
    })
}
