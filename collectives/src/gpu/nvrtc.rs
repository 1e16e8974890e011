//! NVRTC, NVIDIA's run-time CUDA compiler, loaded by path or soname with
//! `libloading` through a tiny FFI (eight functions, two more for CUBIN).
//!
//! NVRTC compiles CUDA C++ to PTX, or to a CUBIN for one real architecture
//! (`sm_XX`), without a GPU, which is what lets CI compile every kernel on
//! a CPU-only machine (`collectives/tests/gpu_nvrtc.rs`, with the library
//! from NVIDIA's `nvidia-cuda-nvrtc-cu12` wheel fetched by
//! `scripts/fetch-nvrtc.sh`). At run time the library is found through
//! `HETCCL_NVRTC_LIB` or the usual sonames.

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

type Program = *mut c_void;
type Status = c_int;
/// `nvrtcGet*Size` (T = usize) or `nvrtcGet*` (T = c_char).
type Getter<T> = unsafe extern "C" fn(Program, *mut T) -> Status;

/// The sonames tried, newest first, when no path is configured.
pub const SONAMES: [&str; 3] = ["libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"];

/// A loaded NVRTC library.
pub struct Nvrtc {
    path: String,
    create: unsafe extern "C" fn(
        *mut Program,
        *const c_char,
        *const c_char,
        c_int,
        *const *const c_char,
        *const *const c_char,
    ) -> Status,
    compile: unsafe extern "C" fn(Program, c_int, *const *const c_char) -> Status,
    ptx_size: unsafe extern "C" fn(Program, *mut usize) -> Status,
    ptx: unsafe extern "C" fn(Program, *mut c_char) -> Status,
    log_size: unsafe extern "C" fn(Program, *mut usize) -> Status,
    log: unsafe extern "C" fn(Program, *mut c_char) -> Status,
    destroy: unsafe extern "C" fn(*mut Program) -> Status,
    version: unsafe extern "C" fn(*mut c_int, *mut c_int) -> Status,
    /// `nvrtcGetCUBINSize` and `nvrtcGetCUBIN` (NVRTC 11.1 and later).
    cubin: Option<(Getter<usize>, Getter<c_char>)>,
    // Keeps the symbols above valid; dropped last.
    _lib: libloading::Library,
}

// SAFETY: NVRTC's API is thread-safe for distinct programs; the struct holds
// only function pointers into a library that stays loaded.
unsafe impl Send for Nvrtc {}
// SAFETY: as above.
unsafe impl Sync for Nvrtc {}

/// Why a compilation failed: NVRTC's status and its log.
#[derive(Debug, Clone)]
pub struct CompileError {
    /// The `nvrtcResult` of the failing call.
    pub status: i32,
    /// The compiler log (errors with line numbers).
    pub log: String,
}

impl std::fmt::Display for CompileError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "NVRTC status {}: {}", self.status, self.log.trim())
    }
}

/// Frees the program on every path out of [`Nvrtc::compile`].
struct ProgramGuard<'a>(&'a Nvrtc, Program);

impl Drop for ProgramGuard<'_> {
    fn drop(&mut self) {
        // SAFETY: the program was created by this library and is freed once.
        unsafe { (self.0.destroy)(&mut self.1) };
    }
}

impl Nvrtc {
    /// Opens NVRTC: `path` if given (`HETCCL_NVRTC_LIB`), else [`SONAMES`]
    /// in order.
    pub fn open(path: Option<&Path>) -> Result<Nvrtc> {
        let candidates: Vec<PathBuf> = match path.map(Path::to_path_buf) {
            Some(p) => vec![p],
            None => SONAMES.iter().map(PathBuf::from).collect(),
        };
        let mut errors = Vec::new();
        for c in &candidates {
            match Self::open_one(c) {
                Ok(n) => return Ok(n),
                Err(e) => errors.push(format!("{}: {e}", c.display())),
            }
        }
        Err(Error::usage(format!(
            "NVRTC (the CUDA run-time compiler) was not found; set HETCCL_NVRTC_LIB \
             to libnvrtc.so.* ({})",
            errors.join("; ")
        )))
    }

    fn open_one(path: &Path) -> std::result::Result<Nvrtc, String> {
        // NVRTC dlopens libnvrtc-builtins.so.* by soname; loading it first
        // from the same directory makes that work without LD_LIBRARY_PATH.
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            if let Ok(rd) = std::fs::read_dir(dir) {
                for e in rd.flatten() {
                    let name = e.file_name().to_string_lossy().into_owned();
                    if name.starts_with("libnvrtc-builtins.so") {
                        // SAFETY: NVIDIA's library; its initialisers are benign.
                        if let Ok(l) = unsafe { libloading::Library::new(e.path()) } {
                            std::mem::forget(l);
                        }
                    }
                }
            }
        }
        // SAFETY: loading NVRTC runs only its own initialisers.
        let lib = unsafe { libloading::Library::new(path) }.map_err(|e| e.to_string())?;
        macro_rules! sym {
            ($name:literal) => {
                // SAFETY: the type matches NVRTC's documented prototype.
                *unsafe { lib.get($name) }.map_err(|e| e.to_string())?
            };
        }
        // SAFETY: the types match NVRTC's documented prototypes.
        let cubin = unsafe {
            match (lib.get(b"nvrtcGetCUBINSize\0"), lib.get(b"nvrtcGetCUBIN\0")) {
                (Ok(a), Ok(b)) => Some((*a, *b)),
                _ => None,
            }
        };
        Ok(Nvrtc {
            cubin,
            path: path.display().to_string(),
            create: sym!(b"nvrtcCreateProgram\0"),
            compile: sym!(b"nvrtcCompileProgram\0"),
            ptx_size: sym!(b"nvrtcGetPTXSize\0"),
            ptx: sym!(b"nvrtcGetPTX\0"),
            log_size: sym!(b"nvrtcGetProgramLogSize\0"),
            log: sym!(b"nvrtcGetProgramLog\0"),
            destroy: sym!(b"nvrtcDestroyProgram\0"),
            version: sym!(b"nvrtcVersion\0"),
            _lib: lib,
        })
    }

    /// Where the library was loaded from (as given).
    pub fn path(&self) -> &str {
        &self.path
    }

    /// NVRTC's (major, minor) version.
    pub fn version(&self) -> (i32, i32) {
        let (mut a, mut b) = (0, 0);
        // SAFETY: two writable ints.
        unsafe { (self.version)(&mut a, &mut b) };
        (a, b)
    }

    /// Compiles `src` (named `name` in messages) with `options` to PTX.
    pub fn compile(
        &self,
        src: &str,
        name: &str,
        options: &[String],
    ) -> std::result::Result<String, CompileError> {
        let g = self.build(src, name, options)?;
        Ok(self.read(&g, self.ptx_size, self.ptx))
    }

    /// Compiles `src` with `options` (which name a real architecture,
    /// `--gpu-architecture=sm_XX`) to a CUBIN.
    pub fn compile_cubin(
        &self,
        src: &str,
        name: &str,
        options: &[String],
    ) -> std::result::Result<Vec<u8>, CompileError> {
        let Some((size, get)) = self.cubin else {
            return Err(CompileError {
                status: -1,
                log: "this NVRTC has no nvrtcGetCUBIN (older than 11.1)".into(),
            });
        };
        let g = self.build(src, name, options)?;
        let bin = self.read_bytes(&g, size, get);
        if bin.is_empty() {
            return Err(CompileError {
                status: -1,
                log: "NVRTC returned no CUBIN (a virtual architecture?)".into(),
            });
        }
        Ok(bin)
    }

    /// Creates and compiles a program; the guard frees it.
    fn build(
        &self,
        src: &str,
        name: &str,
        options: &[String],
    ) -> std::result::Result<ProgramGuard<'_>, CompileError> {
        let fail = |status, log: &str| CompileError {
            status,
            log: log.to_string(),
        };
        let csrc = CString::new(src).map_err(|_| fail(-1, "source contains a NUL byte"))?;
        let cname = CString::new(name).map_err(|_| fail(-1, "name contains a NUL byte"))?;
        let copts: Vec<CString> = options
            .iter()
            .map(|o| CString::new(o.as_str()))
            .collect::<std::result::Result<_, _>>()
            .map_err(|_| fail(-1, "an option contains a NUL byte"))?;
        let optp: Vec<*const c_char> = copts.iter().map(|c| c.as_ptr()).collect();
        let mut prog: Program = std::ptr::null_mut();
        // SAFETY: valid C strings; no headers.
        let st = unsafe {
            (self.create)(
                &mut prog,
                csrc.as_ptr(),
                cname.as_ptr(),
                0,
                std::ptr::null(),
                std::ptr::null(),
            )
        };
        if st != 0 {
            return Err(fail(st, "nvrtcCreateProgram failed"));
        }
        let guard = ProgramGuard(self, prog);
        // SAFETY: `optp` holds optp.len() valid C strings.
        let st = unsafe { (self.compile)(prog, optp.len() as c_int, optp.as_ptr()) };
        if st != 0 {
            return Err(fail(st, &self.read(&guard, self.log_size, self.log)));
        }
        Ok(guard)
    }

    /// Reads a NUL-terminated string out of the program (log or PTX).
    fn read(&self, g: &ProgramGuard<'_>, size: Getter<usize>, get: Getter<c_char>) -> String {
        let buf = self.read_bytes(g, size, get);
        CStr::from_bytes_until_nul(&buf)
            .map(|c| c.to_string_lossy().into_owned())
            .unwrap_or_default()
    }

    /// Reads a blob out of the program (empty on failure).
    fn read_bytes(
        &self,
        g: &ProgramGuard<'_>,
        size: Getter<usize>,
        get: Getter<c_char>,
    ) -> Vec<u8> {
        let mut n = 0usize;
        // SAFETY: a live program and a writable size.
        if unsafe { size(g.1, &mut n) } != 0 || n == 0 {
            return Vec::new();
        }
        let mut buf = vec![0u8; n];
        // SAFETY: `buf` holds the `n` bytes NVRTC said it needs.
        if unsafe { get(g.1, buf.as_mut_ptr().cast()) } != 0 {
            return Vec::new();
        }
        buf
    }
}
