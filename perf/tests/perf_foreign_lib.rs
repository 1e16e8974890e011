//! hetccl-perf drives any NCCL-API library: against NVIDIA's own
//! libnccl.so.2 (from the PyPI wheel that scripts/fetch-nvidia-headers.sh
//! caches) it resolves every symbol, reports NVIDIA's version, gets a unique
//! id from it and reaches communicator creation. Without a GPU that is where
//! NVIDIA's library stops, and hetccl-perf must say so and stop every rank.

use std::path::PathBuf;
use std::process::Command;

use hetccl_testkit::cc;

/// NVIDIA's `libnccl.so.2` and its version.
fn nvidia_lib() -> (PathBuf, String) {
    let nv = cc::nvidia();
    (nv.libnccl(), nv.version.clone())
}

#[test]
fn drives_nvidias_libnccl() {
    let (lib, version) = nvidia_lib();
    let v: Vec<i32> = version.split('.').map(|p| p.parse().unwrap()).collect();
    let code = v[0] * 10000 + v[1] * 100 + v[2];
    let o = Command::new(env!("CARGO_BIN_EXE_hetccl-perf"))
        .args([
            "all_reduce",
            "-np",
            "2",
            "-b",
            "8",
            "-e",
            "8",
            "-T",
            "30",
            "--lib",
        ])
        .arg(&lib)
        .env_remove("HETCCL_PERF_LIB")
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        out.contains(&format!("nccl-library={code} ")),
        "{out}\n{err}"
    );
    assert!(out.contains("#  Rank  1 Group  0"), "{out}\n{err}");
    if !o.status.success() {
        // No GPU (or no CUDA driver): NVIDIA's library fails at comm init,
        // after ncclGetUniqueId worked, and the whole run stops with 2.
        assert_eq!(o.status.code(), Some(2), "{err}");
        // Without a GPU that is ncclCommInitRankConfig; with one, a call on
        // host buffers may be refused instead.
        assert!(
            err.contains("ncclCommInitRank") || err.contains(" failed: "),
            "{err}"
        );
        assert!(!err.contains("missing symbol"), "{err}");
    }
}
