//! LD_PRELOAD interposition: a C program compiled against NVIDIA's real
//! `nccl.h` and linked against NVIDIA's `libnccl.so.2` (as PyTorch is) calls
//! hetccl's functions once `libhetccl.so` is preloaded.
//!
//! The same binary (`tests/c/interpose.c`) runs twice: plain, where NVIDIA's
//! library answers (version 23203, its own error strings), and with
//! `LD_PRELOAD=libhetccl.so`, where every answer must be hetccl's: its
//! version, its strings, its argument checks and their `ncclGetLastError`
//! messages, and a working host `ncclMemAlloc`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use hetccl_testkit::{cc, hetccl_so};

/// NVIDIA's `NCCL_VERSION_CODE` for the 2.32.3 wheel.
const NVIDIA_VERSION: &str = "23203";
/// hetccl's `ncclGetVersion`: `NCCL_VERSION(2, 28, 0)`.
const HETCCL_VERSION: &str = "22800";

fn program() -> &'static Path {
    static EXE: OnceLock<PathBuf> = OnceLock::new();
    EXE.get_or_init(|| {
        cc::compile_c(
            "tests/c/interpose.c",
            "interpose",
            &cc::CcOpts {
                link_nvidia_nccl: true,
                extra: vec!["-ldl".into()],
            },
        )
    })
}

/// Runs the program, with `preload` in LD_PRELOAD if given (and nothing
/// inherited there otherwise), and parses its `key value` lines.
fn run(preload: Option<&Path>, args: &[&str]) -> BTreeMap<String, String> {
    let mut cmd = Command::new(program());
    cmd.args(args)
        .env_remove("LD_PRELOAD")
        .env_remove("LD_LIBRARY_PATH")
        .env_remove("NCCL_DEBUG");
    if let Some(so) = preload {
        cmd.env("LD_PRELOAD", so);
    }
    let out = cc::run_ok(&mut cmd);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !stderr.contains("cannot be preloaded"),
        "the dynamic linker refused the preload:\n{stderr}"
    );
    cc::parse_kv(&String::from_utf8(out.stdout).expect("UTF-8 output"))
}

fn get<'a>(m: &'a BTreeMap<String, String>, key: &str) -> &'a str {
    m.get(key)
        .unwrap_or_else(|| panic!("the program printed no {key}; output: {m:#?}"))
}

fn same_file(a: &str, b: &Path) -> bool {
    Path::new(a).canonicalize().ok().as_deref() == b.canonicalize().ok().as_deref()
}

#[test]
fn without_preload_nvidia_answers() {
    let nv = cc::nvidia();
    let m = run(None, &[]);
    assert_eq!(get(&m, "header_version"), NVIDIA_VERSION);
    for f in ["ncclGetVersion", "ncclGetErrorString", "ncclMemAlloc"] {
        let origin = get(&m, &format!("origin.{f}"));
        assert!(
            same_file(origin, &nv.libnccl()),
            "{f} bound to {origin}, not NVIDIA's {}",
            nv.libnccl().display()
        );
    }
    assert_eq!(get(&m, "getversion.rc"), "0");
    assert_eq!(get(&m, "getversion.version"), NVIDIA_VERSION);
    assert!(
        get(&m, "errstr.internal").contains("NCCL developers"),
        "{m:#?}"
    );
}

#[test]
fn with_preload_hetccl_answers() {
    let so = hetccl_so();
    let m = run(Some(&so), &["hetccl"]);

    // The dynamic linker bound the program's nccl* references to hetccl.
    for f in ["ncclGetVersion", "ncclGetErrorString", "ncclMemAlloc"] {
        let origin = get(&m, &format!("origin.{f}"));
        assert!(
            same_file(origin, &so),
            "{f} bound to {origin}, not {}",
            so.display()
        );
    }

    // Version and strings are hetccl's.
    assert_eq!(get(&m, "getversion.rc"), "0");
    assert_eq!(get(&m, "getversion.version"), HETCCL_VERSION);
    assert_eq!(
        get(&m, "errstr.invalid_usage"),
        "invalid usage (run with NCCL_DEBUG=WARN for details)"
    );
    assert_eq!(
        get(&m, "errstr.invalid_argument"),
        "invalid argument (run with NCCL_DEBUG=WARN for details)"
    );
    let internal = get(&m, "errstr.internal");
    assert!(
        internal.contains("hetccl") && !internal.contains("NCCL developers"),
        "ncclGetErrorString(ncclInternalError) = {internal:?} is not hetccl's"
    );

    // Invalid arguments: hetccl's code (ncclInvalidArgument = 4) and message.
    assert_eq!(get(&m, "getversion_null.rc"), "4");
    let msg = get(&m, "getversion_null.lasterror");
    assert!(msg.contains("ncclGetVersion"), "ncclGetLastError = {msg:?}");

    assert_eq!(get(&m, "memalloc0.rc"), "4");
    let msg = get(&m, "memalloc0.lasterror");
    assert!(msg.contains("ncclMemAlloc"), "ncclGetLastError = {msg:?}");

    assert_eq!(get(&m, "memfree_foreign.rc"), "4");
    let msg = get(&m, "memfree_foreign.lasterror");
    assert!(
        msg.contains("ncclMemFree") && msg.contains("was not allocated by ncclMemAlloc"),
        "ncclGetLastError = {msg:?}"
    );

    // A real allocation works and is writable host memory.
    assert_eq!(get(&m, "memalloc4096.rc"), "0");
    assert_eq!(get(&m, "memalloc4096.nonnull"), "1");
    assert_eq!(get(&m, "memalloc4096.rw"), "1");
    assert_eq!(get(&m, "memalloc4096.align4096"), "1");
    assert_eq!(get(&m, "memfree4096.rc"), "0");
    assert_eq!(get(&m, "memfree4096_again.rc"), "4", "double free refused");
    assert_eq!(get(&m, "done"), "1");
}
