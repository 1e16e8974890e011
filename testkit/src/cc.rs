//! C programs of the tests: NVIDIA's real `nccl.h` (and the CUDA headers it
//! includes) and `libnccl.so.2`, compiling against them, running the
//! programs and reading what they print.
//!
//! - [`nvidia`]: the headers and library, fetched once per test process by
//!   `scripts/fetch-nvidia-headers.sh` into `${HETCCL_CACHE:-~/.cache/hetccl}`.
//!   A failed fetch fails the test: CI has PyPI access.
//! - [`compile_c`]: compiles a C program against the real headers with gcc.
//! - [`run_ok`], [`parse_kv`]: run a program and read its `key value` lines.
//! - [`tool`]: the path of a host tool (`nm`, `readelf`), overridable.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Command, Output};
use std::sync::OnceLock;

use crate::{cc_cache, repo_root, tmp_dir};

/// NVIDIA's headers and library, as `scripts/fetch-nvidia-headers.sh` reports them.
#[derive(Debug, Clone)]
pub struct Nvidia {
    /// The include dirs of the nccl, cuda_runtime, cuda_nvcc, cuda_cccl wheels.
    pub include_dirs: Vec<PathBuf>,
    /// The dir holding NVIDIA's `libnccl.so.2`.
    pub lib_dir: PathBuf,
    /// The NCCL version of the wheel, e.g. `2.32.3`.
    pub version: String,
}

impl Nvidia {
    /// `libnccl.so.2`.
    pub fn libnccl(&self) -> PathBuf {
        self.lib_dir.join("libnccl.so.2")
    }
}

/// Fetches (first call only) and returns NVIDIA's headers and library.
/// Panics, failing the test, when the fetch fails.
pub fn nvidia() -> &'static Nvidia {
    static NV: OnceLock<Nvidia> = OnceLock::new();
    NV.get_or_init(|| {
        let script = repo_root().join("scripts/fetch-nvidia-headers.sh");
        let out = Command::new("bash")
            .arg(&script)
            .output()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", script.display()));
        assert!(
            out.status.success(),
            "{} failed ({}); it needs PyPI access or a populated cache.\nstderr:\n{}",
            script.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        let text = String::from_utf8(out.stdout).expect("script output is UTF-8");
        let vars: BTreeMap<&str, &str> = text.lines().filter_map(|l| l.split_once('=')).collect();
        let get = |k: &str| -> String {
            vars.get(k)
                .unwrap_or_else(|| panic!("{} printed no {k}:\n{text}", script.display()))
                .to_string()
        };
        let nv = Nvidia {
            include_dirs: [
                "HETCCL_NCCL_INCLUDE",
                "HETCCL_CUDA_RUNTIME_INCLUDE",
                "HETCCL_CUDA_NVCC_INCLUDE",
                "HETCCL_CUDA_CCCL_INCLUDE",
            ]
            .iter()
            .map(|k| PathBuf::from(get(k)))
            .collect(),
            lib_dir: PathBuf::from(get("HETCCL_NCCL_LIB")),
            version: get("HETCCL_NCCL_VERSION"),
        };
        assert!(
            nv.include_dirs[0].join("nccl.h").is_file(),
            "no nccl.h in {nv:?}"
        );
        assert!(nv.libnccl().is_file(), "no libnccl.so.2 in {nv:?}");
        nv
    })
}

/// Options for [`compile_c`].
#[derive(Debug, Default, Clone)]
pub struct CcOpts {
    /// Link against NVIDIA's `libnccl.so.2`, with an rpath to its dir.
    pub link_nvidia_nccl: bool,
    /// Extra arguments, appended last (libraries such as `-ldl`).
    pub extra: Vec<String>,
}

/// Compiles `src` (relative to the repo root, e.g. `tests/c/x.c`) with gcc
/// against NVIDIA's real headers, warnings as errors, into
/// [`tmp_dir`]`/<name>`, and returns the executable's path. A program
/// compiled before from the same arguments and sources comes from the
/// cache ([`cc_cache`]).
/// Panics with gcc's output on failure.
pub fn compile_c(src: &str, name: &str, opts: &CcOpts) -> PathBuf {
    let nv = nvidia();
    let src = repo_root().join(src);
    let out = tmp_dir().join(name);
    let cc = std::env::var("CC").unwrap_or_else(|_| "gcc".to_string());
    let mut args: Vec<String> = ["-std=gnu11", "-O1", "-g", "-Wall", "-Wextra", "-Werror"]
        .map(String::from)
        .to_vec();
    for d in &nv.include_dirs {
        args.push("-I".into());
        args.push(d.display().to_string());
    }
    args.push(src.display().to_string());
    if opts.link_nvidia_nccl {
        // The wheel has only libnccl.so.2 (no libnccl.so dev symlink).
        args.extend(["-L".into(), nv.lib_dir.display().to_string()]);
        args.push("-l:libnccl.so.2".into());
        args.push(format!("-Wl,-rpath,{}", nv.lib_dir.display()));
    }
    args.extend(opts.extra.iter().cloned());
    // The output's name is no part of the key: programs that differ only
    // in their name share one entry.
    let key = cc_cache::key(&[std::slice::from_ref(&cc), &args[..]].concat());
    if cc_cache::fetch(&key, &out) {
        return out;
    }
    let mut cmd = Command::new(&cc);
    cmd.args(&args).arg("-o").arg(&out);
    let o = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cc}: {e}"));
    assert!(
        o.status.success(),
        "compiling {} failed:\n{:?}\n{}{}",
        src.display(),
        cmd,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    cc_cache::store(&key, &out);
    out
}

/// Runs `cmd`, panics unless it exits 0, returns its output.
pub fn run_ok(cmd: &mut Command) -> Output {
    let o = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    assert!(
        o.status.success(),
        "{cmd:?} failed: {}\nstdout:\n{}\nstderr:\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    o
}

/// Parses `key value` lines (value: the rest of the line after the first
/// space). Panics on a duplicate key or a line without a space.
pub fn parse_kv(text: &str) -> BTreeMap<String, String> {
    let mut m = BTreeMap::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let (k, v) = line
            .split_once(' ')
            .unwrap_or_else(|| panic!("malformed line (no value): {line:?}"));
        if let Some(old) = m.insert(k.to_string(), v.to_string()) {
            panic!("duplicate key {k:?}: {old:?} and {v:?}");
        }
    }
    m
}

/// Path of a host tool; lets CI override (`NM=llvm-nm`, `READELF=...`).
pub fn tool(name: &str) -> String {
    std::env::var(name.to_uppercase()).unwrap_or_else(|_| name.to_string())
}
