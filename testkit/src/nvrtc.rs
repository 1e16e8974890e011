//! Where NVIDIA's NVRTC is for the tests: `HETCCL_NVRTC_LIB`, else the
//! `nvidia-cuda-nvrtc-cu12` wheel that `scripts/fetch-nvrtc.sh` caches in
//! `${HETCCL_CACHE:-~/.cache/hetccl}/nvrtc`. Shared by
//! `collectives/tests/gpu_nvrtc.rs` and `tests/gpu_fake_driver.rs`.

use std::path::PathBuf;

/// The NVRTC library, if present.
pub fn nvrtc_path() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("HETCCL_NVRTC_LIB") {
        return Some(PathBuf::from(p));
    }
    let cache = std::env::var_os("HETCCL_CACHE")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/hetccl")))?;
    let p = cache.join("nvrtc/nvidia/cuda_nvrtc/lib/libnvrtc.so.12");
    p.exists().then_some(p)
}

/// Whether a missing NVRTC must fail the test (`HETCCL_REQUIRE_NVRTC=1`, as
/// `scripts/test.sh` sets) instead of skipping what needs it.
pub fn required() -> bool {
    std::env::var("HETCCL_REQUIRE_NVRTC").as_deref() == Ok("1")
}
