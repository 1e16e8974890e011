//! Loading the reduction kernels into a context, at a safe point.
//!
//! The kernels are compiled with NVRTC to a CUBIN for the device's exact
//! architecture (`sm_XX`): a CUBIN from a newer toolkit still loads on an
//! older driver of the same major version, where PTX from that NVRTC would
//! not (the driver cannot JIT a newer PTX ISA). If the CUBIN does not
//! compile or load, PTX for `compute_XX` is tried. Compiled images are
//! cached per architecture.
//!
//! Loading a module (and looking up its functions) waits for the device,
//! so it is never done while a stream may wait on a flag the proxy has yet
//! to set: [`prepare`] runs on the caller's thread before a batch begins,
//! and loads only at a safe point ([`super::safe::at_safe_point`]); when
//! batches are in flight it tries again at a later call. The proxy only
//! asks for what is loaded ([`loaded`]); a rank without kernels stages its
//! reductions (every rank agrees through the CUDA IPC protocol).
//!
//! A failed load is logged once at WARN with NVRTC's and the driver's
//! versions, and that context's reductions stage through host memory.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use once_cell::sync::Lazy;
use parking_lot::Mutex;

use super::driver::{self, cu};
use super::kernels::{self, DeviceKernels};
use super::nvrtc::Nvrtc;
use super::safe;
use crate::error::Error;

/// A context's kernels, or why they cannot be loaded (not retried).
type Loaded = std::result::Result<Arc<DeviceKernels>, String>;

/// Kernels by context.
static LOADED: Lazy<Mutex<HashMap<usize, Loaded>>> = Lazy::new(|| Mutex::new(HashMap::new()));

/// An image to load.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Kind {
    Cubin,
    Ptx,
}

/// A compiled image, or why NVRTC failed.
type Image = std::result::Result<Arc<Vec<u8>>, String>;

/// Compiled images by (compute capability as `XY`, kind). The lock is held
/// while compiling (no CUDA call is made then).
static IMAGES: Lazy<Mutex<HashMap<(i32, Kind), Image>>> = Lazy::new(|| Mutex::new(HashMap::new()));

/// An opened NVRTC, or why it could not be.
type Opened = std::result::Result<Arc<Nvrtc>, String>;

/// NVRTC by the path it was asked for (`None`: the sonames), opened once.
static NVRTC: Lazy<Mutex<HashMap<Option<PathBuf>, Opened>>> =
    Lazy::new(|| Mutex::new(HashMap::new()));

/// NVRTC at `path`, or the sonames.
fn nvrtc(path: Option<&Path>) -> Opened {
    NVRTC
        .lock()
        .entry(path.map(Path::to_path_buf))
        .or_insert_with(|| Nvrtc::open(path).map(Arc::new).map_err(|e| e.to_string()))
        .clone()
}

/// `CUBIN sm_90` or `PTX compute_90`.
fn label(kind: Kind, cc: i32) -> String {
    match kind {
        Kind::Cubin => format!("CUBIN sm_{cc}"),
        Kind::Ptx => format!("PTX compute_{cc}"),
    }
}

/// The image of `kind` for compute capability `cc`, compiled at first use.
fn image(nvrtc: &Nvrtc, cc: i32, kind: Kind) -> Image {
    let mut images = IMAGES.lock();
    if let Some(r) = images.get(&(cc, kind)) {
        return r.clone();
    }
    let r = match kind {
        Kind::Cubin => kernels::compile_cubin(nvrtc, &format!("sm_{cc}")),
        Kind::Ptx => kernels::compile_ptx(nvrtc, &format!("compute_{cc}")).map(|mut p| {
            p.push('\0');
            p.into_bytes()
        }),
    }
    .map(Arc::new)
    .map_err(|e| e.to_string());
    images.insert((cc, kind), r.clone());
    r
}

/// The current context's kernels, if they are loaded. Never loads: the
/// GPU proxy calls this while user streams wait.
pub fn loaded() -> Option<Arc<DeviceKernels>> {
    let ctx = driver::current_context().ok()?;
    LOADED.lock().get(&(ctx as usize))?.as_ref().ok().cloned()
}

/// The CUDA driver's version as `major.minor`.
fn driver_version() -> String {
    let mut v = 0;
    // SAFETY: a writable slot.
    if unsafe { cu::cuDriverGetVersion(&mut v) } != cu::CUresult::CUDA_SUCCESS {
        return "unknown".into();
    }
    format!("{}.{}", v / 1000, v % 1000 / 10)
}

/// Makes sure the current context's kernels are loaded: compiles them at
/// first use and loads them at a safe point. Returns whether they are
/// loaded; `false` also when no safe point was reached (a later call
/// tries again) or when they cannot be (logged once). Call on the caller's
/// thread before its batch begins ([`super::safe::begin`]), with the
/// NVRTC of `HETCCL_NVRTC_LIB` (`nvrtc`) or the usual sonames.
pub fn prepare(nvrtc: Option<&Path>) -> bool {
    let Ok(ctx) = driver::current_context() else {
        return false;
    };
    if ctx.is_null() {
        return false;
    }
    if let Some(r) = LOADED.lock().get(&(ctx as usize)) {
        return r.is_ok();
    }
    match try_load(ctx, nvrtc) {
        Ok(Some(_)) => true,
        Ok(None) => false,
        Err(e) => {
            LOADED.lock().insert(ctx as usize, Err(e));
            false
        }
    }
}

/// Compiles and loads; `Ok(None)`: not at a safe point now.
fn try_load(ctx: cu::CUcontext, nvrtc: Option<&Path>) -> std::result::Result<Option<()>, String> {
    let device = driver::current_device().ok_or("no device for the current context")?;
    let (major, minor) = kernels::capability(device).map_err(|e| e.to_string())?;
    let cc = major * 10 + minor;
    let nv = match self::nvrtc(nvrtc) {
        Ok(n) => n,
        Err(e) => {
            tracing::info!(target: "hetccl::INIT", "GPU reduction kernels unavailable on device {device}, device reductions stage through host memory: {e}");
            return Err(e);
        }
    };
    let (nv_major, nv_minor) = nv.version();
    let mut errors = Vec::new();
    for kind in [Kind::Cubin, Kind::Ptx] {
        let what = label(kind, cc);
        let img = match image(&nv, cc, kind) {
            Ok(i) => i,
            Err(e) => {
                errors.push(format!("{what}: NVRTC: {e}"));
                continue;
            }
        };
        let loaded = safe::at_safe_point(|| {
            let mut map = LOADED.lock();
            if let Some(r) = map.get(&(ctx as usize)) {
                return r.clone().map_err(|m| Error::Internal(m.into()));
            }
            let k = Arc::new(DeviceKernels::load(device, what.clone(), &img)?);
            map.insert(ctx as usize, Ok(k.clone()));
            Ok(k)
        });
        match loaded {
            None => return Ok(None),
            Some(Ok(k)) => {
                tracing::info!(target: "hetccl::INIT", "GPU reduction kernels loaded on device {device} as {} (NVRTC {nv_major}.{nv_minor}, CUDA driver {})", k.image, driver_version());
                return Ok(Some(()));
            }
            Some(Err(e)) => errors.push(format!("{what}: {e}")),
        }
    }
    let e = format!(
        "GPU reduction kernels could not be loaded on device {device} (NVRTC {nv_major}.{nv_minor} \
         from {}, CUDA driver {}): {}; device reductions on this device stage through host \
         memory instead",
        nv.path(),
        driver_version(),
        errors.join("; ")
    );
    tracing::warn!(target: "hetccl::INIT", "{e}");
    Err(e)
}
