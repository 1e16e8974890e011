//! Forwarding to NVIDIA's NCCL (`HETCCL_NCCL_FALLBACK=/path/libnccl.so.2`)
//! for what hetccl cannot serve itself: the device-side APIs (device
//! communicators, window pointers, one-sided signals).
//!
//! The library is opened once with `libloading`; each forwarded entry point
//! is logged once at INFO. Forwarded calls that take a communicator need an
//! NVIDIA communicator mirroring ours: it is created lazily and
//! collectively, on the first forwarded call (NCCL's device APIs that create
//! state, `ncclDevCommCreate` and window registration, are collective, so
//! every rank reaches this point in the same order):
//! 1. rank 0 calls the fallback's `ncclGetUniqueId`;
//! 2. the 128-byte id travels to every rank by a broadcast over our own
//!    communicator (host memory);
//! 3. every rank calls the fallback's `ncclCommInitRank(nranks, id, rank)`
//!    with its CUDA device current, as for any NCCL init.
//!
//! The mirror lives as long as the process (it is not destroyed with our
//! communicator, since NVIDIA's destroy is collective too). It cannot be
//! created inside a group (the broadcast would be queued), which is refused
//! with a message. Without the variable, the device-side APIs return
//! `ncclInvalidUsage` naming it.

use std::collections::{HashMap, HashSet};
use std::ffi::{c_char, c_void, CStr};
use std::sync::atomic::Ordering;
use std::sync::OnceLock;
use std::time::Duration;

use hetccl_abi::{ncclComm_t, ncclResult_t, ncclUniqueId, NcclResult};
use once_cell::sync::Lazy;
use parking_lot::Mutex;

use super::engine_gate::device_only;
use crate::comm::handle;
use crate::error::{Error, Result};

/// NVIDIA's NCCL, opened from `HETCCL_NCCL_FALLBACK`.
pub struct Fallback {
    lib: libloading::Library,
    path: String,
}

/// The opened library, or why it could not be opened (None: not configured).
static FALLBACK: OnceLock<Option<std::result::Result<Fallback, String>>> = OnceLock::new();

/// Entry points already logged as forwarded.
static LOGGED: Lazy<Mutex<HashSet<&'static str>>> = Lazy::new(|| Mutex::new(HashSet::new()));

/// Mirror communicators: our handle's address -> NVIDIA's handle.
static MIRRORS: Lazy<Mutex<HashMap<usize, usize>>> = Lazy::new(|| Mutex::new(HashMap::new()));

fn open() -> Option<std::result::Result<Fallback, String>> {
    let path = hetccl_core::config::get().nccl_fallback.clone()?;
    // SAFETY: NVIDIA's NCCL; its initialisers only set up its own state.
    Some(match unsafe { libloading::Library::new(&path) } {
        Ok(lib) => {
            tracing::info!(target: "hetccl::INIT", "HETCCL_NCCL_FALLBACK: opened {path}");
            Ok(Fallback { lib, path })
        }
        Err(e) => Err(format!("HETCCL_NCCL_FALLBACK={path} cannot be opened: {e}")),
    })
}

/// The fallback library for `what`, or the error `what` returns without it.
pub fn require(what: &str) -> Result<&'static Fallback> {
    match FALLBACK.get_or_init(open) {
        None => Err(device_only(what)),
        Some(Ok(f)) => Ok(f),
        Some(Err(e)) => Err(Error::usage(format!("{what} needs NVIDIA's NCCL: {e}"))),
    }
}

impl Fallback {
    /// The fallback's `name` (NUL-terminated), logged once at INFO.
    ///
    /// # Safety
    /// `T` is the C prototype of `name` in NVIDIA's `nccl.h`.
    pub unsafe fn sym<T: Copy>(&self, name: &'static str) -> Result<T> {
        let bare = name.trim_end_matches('\0');
        // SAFETY: per the contract.
        let f = unsafe { self.lib.get::<T>(name.as_bytes()) }
            .map(|s| *s)
            .map_err(|e| Error::usage(format!("{} lacks {bare}: {e}", self.path)))?;
        if LOGGED.lock().insert(name) {
            tracing::info!(target: "hetccl::INIT", "forwarding {bare} to NVIDIA's NCCL ({})", self.path);
        }
        Ok(f)
    }

    /// The library's path as configured.
    pub fn path(&self) -> &str {
        &self.path
    }
}

/// Maps a result of NVIDIA's `what` to ours.
pub fn code(what: &str, rc: ncclResult_t) -> Result<()> {
    let msg = || format!("NVIDIA's NCCL {what} returned {rc}");
    match NcclResult::try_from(rc) {
        Ok(NcclResult::Success) => Ok(()),
        Ok(NcclResult::InProgress) => Err(Error::InProgress),
        Ok(NcclResult::InvalidArgument) => Err(Error::arg(msg())),
        Ok(NcclResult::InvalidUsage) => Err(Error::usage(msg())),
        Ok(NcclResult::SystemError) => Err(Error::System(msg().into())),
        Ok(NcclResult::RemoteError) => Err(Error::Remote(msg().into())),
        _ => Err(Error::Internal(msg().into())),
    }
}

type GetUniqueId = unsafe extern "C" fn(*mut ncclUniqueId) -> ncclResult_t;
type CommInitRank = unsafe extern "C" fn(*mut ncclComm_t, i32, ncclUniqueId, i32) -> ncclResult_t;

/// NVIDIA's communicator mirroring `comm`, created collectively on first use.
///
/// # Safety
/// `comm` is a handle as passed to an exported function (it is validated,
/// and used for one broadcast through the exported `ncclBroadcast`).
pub unsafe fn mirror(comm: ncclComm_t) -> Result<ncclComm_t> {
    let c = handle::lookup(comm)?;
    if let Some(&m) = MIRRORS.lock().get(&(comm as usize)) {
        return Ok(m as ncclComm_t);
    }
    if crate::launch::group::depth() > 0 {
        return Err(Error::usage(
            "the first forwarded device-side call on a communicator creates NVIDIA's \
             mirror communicator collectively and cannot run inside ncclGroupStart/End",
        ));
    }
    let fb = require("a mirror communicator")?;
    // SAFETY: prototypes from nccl.h.
    let (get_id, init) = unsafe {
        (
            fb.sym::<GetUniqueId>("ncclGetUniqueId\0")?,
            fb.sym::<CommInitRank>("ncclCommInitRank\0")?,
        )
    };
    let mut id = ncclUniqueId::default();
    // Every rank takes part in the broadcast, so a failing rank 0 sends an
    // all-zero id and everyone fails the same way below.
    let id_rc = if c.rank == 0 {
        // SAFETY: a writable id.
        unsafe { get_id(&mut id) }
    } else {
        0
    };
    let id_ptr = (&mut id as *mut ncclUniqueId).cast::<c_void>();
    let size = std::mem::size_of::<ncclUniqueId>();
    // SAFETY: our own broadcast on host memory (1 = ncclUint8).
    let rc = unsafe {
        super::coll::ncclBroadcast(id_ptr, id_ptr, size, 1, 0, comm, std::ptr::null_mut())
    };
    if rc == NcclResult::InProgress.raw() {
        // The helper thread ends within the stall limit; this wait is bounded
        // anyway, in case it never reports.
        let limit = Duration::from_secs_f64(hetccl_core::config::get().timeout_s.max(1.0) + 10.0);
        let t0 = std::time::Instant::now();
        loop {
            let st = c.async_error.load(Ordering::Acquire);
            if st != NcclResult::InProgress.raw() {
                code("broadcast of the mirror's unique id (hetccl)", st)?;
                break;
            }
            if t0.elapsed() > limit {
                return Err(Error::Remote(
                    "broadcast of the mirror's unique id did not complete".into(),
                ));
            }
            std::thread::sleep(Duration::from_micros(100));
        }
    } else {
        code("broadcast of the mirror's unique id (hetccl)", rc)?;
    }
    code("ncclGetUniqueId", id_rc)?;
    let mut m: ncclComm_t = std::ptr::null_mut();
    // SAFETY: a writable handle; the id came from the fallback's rank 0.
    let rc = unsafe { init(&mut m, c.nranks as i32, id, c.rank as i32) };
    code("ncclCommInitRank (mirror communicator)", rc)
        .map_err(|e| Error::usage(format!("{e} ({}; last error: {})", fb.path, last_error(fb))))?;
    tracing::info!(target: "hetccl::INIT", "rank {} of {}: NVIDIA mirror communicator created", c.rank, c.nranks);
    MIRRORS.lock().insert(comm as usize, m as usize);
    Ok(m)
}

/// NVIDIA's `ncclGetLastError(NULL)`, for messages.
fn last_error(fb: &Fallback) -> String {
    type LastError = unsafe extern "C" fn(ncclComm_t) -> *const c_char;
    // SAFETY: prototype from nccl.h; a static string or NULL comes back.
    match unsafe { fb.sym::<LastError>("ncclGetLastError\0") } {
        Ok(f) => {
            // SAFETY: NVIDIA's ncclGetLastError ignores its comm argument and returns a static
            // string.
            let p = unsafe { f(std::ptr::null_mut()) };
            if p.is_null() {
                String::new()
            } else {
                // SAFETY: NUL-terminated per nccl.h.
                unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
            }
        }
        Err(_) => String::new(),
    }
}
