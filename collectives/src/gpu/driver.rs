//! The CUDA driver API through `cudarc` with dynamic loading: `libcuda.so.1`
//! is found at run time, so `libhetccl.so` has no link-time dependency on
//! CUDA and loads on machines without it.
//!
//! `cudarc` panics when a function is called and the library is missing, so
//! every entry here first goes through [`available`], which probes for the
//! library with `libloading` and runs `cuInit` once. A process without the
//! driver (or without a GPU) gets a clear error instead.

use std::ffi::{c_void, CStr};
use std::sync::OnceLock;

pub use cudarc::driver::sys as cu;

use crate::error::{Error, Result};

/// Whether the driver was found and initialised, or why not.
static STATE: OnceLock<std::result::Result<(), String>> = OnceLock::new();

/// The library names probed, in order (the first is what the driver
/// package installs; `cudarc` searches the same names).
const PROBE: [&str; 2] = ["libcuda.so.1", "libcuda.so"];

fn probe() -> std::result::Result<(), String> {
    let mut errs = Vec::new();
    let found = PROBE.iter().any(|n| {
        // SAFETY: loading the CUDA driver runs only its own initialisers.
        match unsafe { libloading::Library::new(n) } {
            Ok(_) => true,
            Err(e) => {
                errs.push(format!("{n}: {e}"));
                false
            }
        }
    });
    // SAFETY: cudarc loads the same library (its candidate list includes
    // both names); this check keeps its loader from panicking.
    if !found || !unsafe { cu::is_culib_present() } {
        return Err(format!("libcuda.so.1 not found ({})", errs.join("; ")));
    }
    // SAFETY: the library is present; cuInit may be called any number of times.
    let r = std::panic::catch_unwind(|| unsafe { cu::cuInit(0) })
        .map_err(|_| "cuInit is missing from libcuda".to_string())?;
    if r != cu::CUresult::CUDA_SUCCESS {
        return Err(format!("cuInit failed: {}", name(r)));
    }
    tracing::info!(target: "hetccl::INIT", "CUDA driver loaded: device buffers use the stream path");
    Ok(())
}

/// Whether the CUDA driver is loaded and initialised (probed once).
pub fn available() -> bool {
    STATE.get_or_init(probe).is_ok()
}

/// Whether the driver is usable without loading it for this question: it
/// was probed already, or the process has `libcuda.so.1` mapped (the
/// application uses CUDA), in which case it is probed now.
pub fn loaded() -> bool {
    if let Some(s) = STATE.get() {
        return s.is_ok();
    }
    // SAFETY: RTLD_NOLOAD only looks the library up; nothing is loaded or
    // initialised.
    let mapped = unsafe {
        libloading::os::unix::Library::open(Some(PROBE[0]), libc::RTLD_NOLOAD | libc::RTLD_LAZY)
    }
    .is_ok();
    mapped && available()
}

/// Why the driver is not available (empty when it is).
pub fn unavailable_reason() -> String {
    match STATE.get_or_init(probe) {
        Ok(()) => String::new(),
        Err(e) => e.clone(),
    }
}

/// `Ok` when the driver is usable, else an `ncclInvalidUsage` error naming
/// `what` and the reason.
pub fn require(what: &str) -> Result<()> {
    match STATE.get_or_init(probe) {
        Ok(()) => Ok(()),
        Err(e) => Err(Error::usage(format!(
            "{what} needs the CUDA driver (libcuda.so.1), which was not found: {e}"
        ))),
    }
}

/// The driver's name for a result code.
pub fn name(r: cu::CUresult) -> String {
    let mut p: *const std::ffi::c_char = std::ptr::null();
    // SAFETY: only called once the library is present; a static string comes back.
    let ok = unsafe { cu::cuGetErrorName(r, &mut p) } == cu::CUresult::CUDA_SUCCESS;
    if ok && !p.is_null() {
        // SAFETY: the driver returns a static NUL-terminated string.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    } else {
        format!("{r:?}")
    }
}

/// Maps a driver result to `Ok` or an [`Error::System`] naming the call.
pub fn check(r: cu::CUresult, what: &str) -> Result<()> {
    if r == cu::CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(Error::System(format!("{what}: {}", name(r)).into()))
    }
}

/// The calling thread's current context (NULL when none).
pub fn current_context() -> Result<cu::CUcontext> {
    require("a CUDA context")?;
    let mut c: cu::CUcontext = std::ptr::null_mut();
    // SAFETY: a writable slot.
    check(unsafe { cu::cuCtxGetCurrent(&mut c) }, "cuCtxGetCurrent")?;
    Ok(c)
}

/// Makes `ctx` current on the calling thread.
///
/// # Safety
/// `ctx` came from the driver and is still alive.
pub unsafe fn set_current(ctx: cu::CUcontext) -> Result<()> {
    // SAFETY: per the contract.
    check(unsafe { cu::cuCtxSetCurrent(ctx) }, "cuCtxSetCurrent")
}

/// The primary context of `device`, retained for the life of the process
/// (what the CUDA runtime, and so PyTorch, uses).
pub fn primary_context(device: i32) -> Result<cu::CUcontext> {
    require("a CUDA context")?;
    let mut c: cu::CUcontext = std::ptr::null_mut();
    check(
        // SAFETY: a writable slot; device ordinals are checked by the driver.
        unsafe { cu::cuDevicePrimaryCtxRetain(&mut c, device) },
        "cuDevicePrimaryCtxRetain",
    )?;
    Ok(c)
}

/// The device of the calling thread's current context, if there is one.
pub fn current_device() -> Option<i32> {
    if !available() {
        return None;
    }
    let c = current_context().ok()?;
    if c.is_null() {
        return None;
    }
    let mut d = -1;
    // SAFETY: a writable slot; a context is current.
    (unsafe { cu::cuCtxGetDevice(&mut d) } == cu::CUresult::CUDA_SUCCESS).then_some(d)
}

/// Makes a context current on this thread when none is: the primary
/// context of device 0 (NCCL's callers always have one already).
pub fn ensure_context() -> Result<cu::CUcontext> {
    let c = current_context()?;
    if !c.is_null() {
        return Ok(c);
    }
    let c = primary_context(0)?;
    // SAFETY: a primary context, retained for the life of the process.
    unsafe { set_current(c)? };
    Ok(c)
}

/// Whether work is being captured into a CUDA graph on `stream`.
///
/// # Safety
/// `stream` is NULL or a live stream of the current context.
pub unsafe fn is_capturing(stream: cu::CUstream) -> Result<bool> {
    let mut st = cu::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    check(
        // SAFETY: per the contract.
        unsafe { cu::cuStreamIsCapturing(stream, &mut st) },
        "cuStreamIsCapturing",
    )?;
    Ok(st != cu::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE)
}

/// Device memory from `cuMemAlloc` in the current context.
pub fn mem_alloc(bytes: usize) -> Result<*mut c_void> {
    ensure_context()?;
    let mut p: cu::CUdeviceptr = 0;
    // SAFETY: a writable slot; a context is current.
    check(unsafe { cu::cuMemAlloc_v2(&mut p, bytes) }, "cuMemAlloc")?;
    Ok(p as *mut c_void)
}

/// Frees memory from [`mem_alloc`].
///
/// # Safety
/// `p` came from [`mem_alloc`] and nothing uses it any more.
pub unsafe fn mem_free(p: *mut c_void) -> Result<()> {
    // SAFETY: per the contract.
    check(
        unsafe { cu::cuMemFree_v2(p as cu::CUdeviceptr) },
        "cuMemFree",
    )
}
