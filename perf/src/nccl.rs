//! The library under test, opened with `dlopen` and driven through NCCL's C
//! API only. Nothing here knows it might be hetccl.
//!
//! Communicators are opaque handles the library gave out; they are passed
//! back to it and never dereferenced here.
#![allow(clippy::not_unsafe_ptr_arg_deref)]

use std::ffi::{c_char, c_int, c_void, CStr};
use std::path::{Path, PathBuf};

/// `ncclResult_t`.
pub type NcclResult = c_int;
/// `ncclComm_t`.
pub type Comm = *mut c_void;
/// `cudaStream_t` (NULL for host buffers, the rank's stream for device buffers).
pub type Stream = *mut c_void;

/// `ncclInvalidUsage`.
pub const NCCL_INVALID_USAGE: NcclResult = 5;
/// `ncclScalarHostImmediate`.
pub const SCALAR_HOST_IMMEDIATE: c_int = 1;

/// `ncclUniqueId`: 128 opaque bytes, passed by value.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct UniqueId {
    /// The bytes.
    pub internal: [u8; 128],
}

impl Default for UniqueId {
    fn default() -> Self {
        UniqueId { internal: [0; 128] }
    }
}

/// `ncclConfig_t` as NCCL 2.28's header lays it out (`NCCL_CONFIG_INITIALIZER`).
/// Libraries read it by its `size`/`version` fields.
#[repr(C)]
#[allow(non_snake_case)]
struct Config {
    size: usize,
    magic: u32,
    version: u32,
    blocking: c_int,
    cgaClusterSize: c_int,
    minCTAs: c_int,
    maxCTAs: c_int,
    netName: *const c_char,
    splitShare: c_int,
    trafficClass: c_int,
    commName: *const c_char,
    collnetEnable: c_int,
    CTAPolicy: c_int,
    shrinkShare: c_int,
    nvlsCTAs: c_int,
    nChannelsPerNetPeer: c_int,
    nvlinkCentricSched: c_int,
}

const CONFIG_UNDEF: c_int = i32::MIN;

impl Config {
    fn initializer() -> Self {
        Config {
            size: std::mem::size_of::<Config>(),
            magic: 0xcafe_beef,
            version: 22800,
            blocking: CONFIG_UNDEF,
            cgaClusterSize: CONFIG_UNDEF,
            minCTAs: CONFIG_UNDEF,
            maxCTAs: CONFIG_UNDEF,
            netName: std::ptr::null(),
            splitShare: CONFIG_UNDEF,
            trafficClass: CONFIG_UNDEF,
            commName: std::ptr::null(),
            collnetEnable: CONFIG_UNDEF,
            CTAPolicy: CONFIG_UNDEF,
            shrinkShare: CONFIG_UNDEF,
            nvlsCTAs: CONFIG_UNDEF,
            nChannelsPerNetPeer: CONFIG_UNDEF,
            nvlinkCentricSched: CONFIG_UNDEF,
        }
    }
}

type FnVersion = unsafe extern "C" fn(*mut c_int) -> NcclResult;
type FnGetUniqueId = unsafe extern "C" fn(*mut UniqueId) -> NcclResult;
type FnInitRank = unsafe extern "C" fn(*mut Comm, c_int, UniqueId, c_int) -> NcclResult;
type FnInitRankConfig =
    unsafe extern "C" fn(*mut Comm, c_int, UniqueId, c_int, *mut Config) -> NcclResult;
type FnComm = unsafe extern "C" fn(Comm) -> NcclResult;
type FnCommInt = unsafe extern "C" fn(Comm, *mut c_int) -> NcclResult;
type FnErrorString = unsafe extern "C" fn(NcclResult) -> *const c_char;
type FnLastError = unsafe extern "C" fn(Comm) -> *const c_char;
type FnVoid = unsafe extern "C" fn() -> NcclResult;
type FnAllReduce = unsafe extern "C" fn(
    *const c_void,
    *mut c_void,
    usize,
    c_int,
    c_int,
    Comm,
    Stream,
) -> NcclResult;
type FnAllGather =
    unsafe extern "C" fn(*const c_void, *mut c_void, usize, c_int, Comm, Stream) -> NcclResult;
type FnRooted = unsafe extern "C" fn(
    *const c_void,
    *mut c_void,
    usize,
    c_int,
    c_int,
    Comm,
    Stream,
) -> NcclResult;
type FnReduce = unsafe extern "C" fn(
    *const c_void,
    *mut c_void,
    usize,
    c_int,
    c_int,
    c_int,
    Comm,
    Stream,
) -> NcclResult;
type FnSend = unsafe extern "C" fn(*const c_void, usize, c_int, c_int, Comm, Stream) -> NcclResult;
type FnRecv = unsafe extern "C" fn(*mut c_void, usize, c_int, c_int, Comm, Stream) -> NcclResult;
type FnPreMul = unsafe extern "C" fn(*mut c_int, *mut c_void, c_int, c_int, Comm) -> NcclResult;
type FnOpDestroy = unsafe extern "C" fn(c_int, Comm) -> NcclResult;
type FnMemAlloc = unsafe extern "C" fn(*mut *mut c_void, usize) -> NcclResult;
type FnMemFree = unsafe extern "C" fn(*mut c_void) -> NcclResult;
type FnGetStats = unsafe extern "C" fn(Comm, *mut c_char, usize, *mut usize) -> NcclResult;

/// An error from the library: the call, its result code and the library's
/// own words for it. One pointer, so that the `Result<(), NcclError>` of
/// every timed call comes back in a register rather than through memory.
#[derive(Debug, Clone)]
pub struct NcclError(Box<ErrorDetails>);

/// What an [`NcclError`] says.
#[derive(Debug, Clone)]
pub struct ErrorDetails {
    /// The entry point.
    pub call: &'static str,
    /// Its `ncclResult_t`.
    pub code: NcclResult,
    /// `ncclGetErrorString(code)`.
    pub string: String,
    /// `ncclGetLastError(comm)` right after the call.
    pub last: String,
}

impl std::ops::Deref for NcclError {
    type Target = ErrorDetails;
    fn deref(&self) -> &ErrorDetails {
        &self.0
    }
}

impl std::fmt::Display for NcclError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} failed: {} ({}): {}",
            self.call, self.string, self.code, self.last
        )
    }
}

impl std::error::Error for NcclError {}

/// The NCCL entry points hetccl-perf uses, resolved from one library.
pub struct Nccl {
    path: PathBuf,
    version: c_int,
    get_unique_id: FnGetUniqueId,
    init_rank: FnInitRank,
    init_rank_config: Option<FnInitRankConfig>,
    comm_destroy: FnComm,
    comm_abort: Option<FnComm>,
    comm_count: FnCommInt,
    comm_user_rank: FnCommInt,
    comm_get_async_error: Option<FnCommInt>,
    error_string: FnErrorString,
    last_error: Option<FnLastError>,
    group_start: FnVoid,
    group_end: FnVoid,
    all_reduce: FnAllReduce,
    all_gather: FnAllGather,
    reduce_scatter: FnAllReduce,
    broadcast: FnRooted,
    reduce: FnReduce,
    alltoall: Option<FnAllGather>,
    gather: Option<FnRooted>,
    scatter: Option<FnRooted>,
    send: FnSend,
    recv: FnRecv,
    premul_create: Option<FnPreMul>,
    op_destroy: Option<FnOpDestroy>,
    mem_alloc: Option<FnMemAlloc>,
    mem_free: Option<FnMemFree>,
    get_stats: Option<FnGetStats>,
    _lib: libloading::Library,
}

// SAFETY: the struct holds plain function pointers into a library that stays
// loaded for the struct's lifetime; NCCL's API is callable from any thread.
unsafe impl Send for Nccl {}
// SAFETY: as above; no interior mutability.
unsafe impl Sync for Nccl {}

macro_rules! sym {
    ($lib:expr, $name:literal) => {{
        // SAFETY: the symbol is declared with NCCL's C signature.
        let s: libloading::Symbol<'_, _> = unsafe { $lib.get(concat!($name, "\0").as_bytes()) }
            .map_err(|e| format!("{}: missing symbol {}: {e}", "library", $name))?;
        *s
    }};
}

macro_rules! opt_sym {
    ($lib:expr, $name:literal) => {{
        // SAFETY: the symbol is declared with NCCL's C signature.
        unsafe { $lib.get(concat!($name, "\0").as_bytes()) }
            .ok()
            .map(|s: libloading::Symbol<'_, _>| *s)
    }};
}

impl Nccl {
    /// Opens `path` and resolves the API.
    pub fn open(path: &Path) -> Result<Nccl, String> {
        // SAFETY: loading a shared library runs its initialisers; the library
        // under test is trusted by the user who named it.
        let lib = unsafe { libloading::Library::new(path) }
            .map_err(|e| format!("cannot load {}: {e}", path.display()))?;
        let get_version: FnVersion = sym!(lib, "ncclGetVersion");
        let mut version: c_int = 0;
        // SAFETY: valid out pointer.
        let rc = unsafe { get_version(&mut version) };
        if rc != 0 {
            return Err(format!("ncclGetVersion returned {rc}"));
        }
        Ok(Nccl {
            path: path.to_path_buf(),
            version,
            get_unique_id: sym!(lib, "ncclGetUniqueId"),
            init_rank: sym!(lib, "ncclCommInitRank"),
            init_rank_config: opt_sym!(lib, "ncclCommInitRankConfig"),
            comm_destroy: sym!(lib, "ncclCommDestroy"),
            comm_abort: opt_sym!(lib, "ncclCommAbort"),
            comm_count: sym!(lib, "ncclCommCount"),
            comm_user_rank: sym!(lib, "ncclCommUserRank"),
            comm_get_async_error: opt_sym!(lib, "ncclCommGetAsyncError"),
            error_string: sym!(lib, "ncclGetErrorString"),
            last_error: opt_sym!(lib, "ncclGetLastError"),
            group_start: sym!(lib, "ncclGroupStart"),
            group_end: sym!(lib, "ncclGroupEnd"),
            all_reduce: sym!(lib, "ncclAllReduce"),
            all_gather: sym!(lib, "ncclAllGather"),
            reduce_scatter: sym!(lib, "ncclReduceScatter"),
            broadcast: sym!(lib, "ncclBroadcast"),
            reduce: sym!(lib, "ncclReduce"),
            alltoall: opt_sym!(lib, "ncclAlltoAll"),
            gather: opt_sym!(lib, "ncclGather"),
            scatter: opt_sym!(lib, "ncclScatter"),
            send: sym!(lib, "ncclSend"),
            recv: sym!(lib, "ncclRecv"),
            premul_create: opt_sym!(lib, "ncclRedOpCreatePreMulSum"),
            op_destroy: opt_sym!(lib, "ncclRedOpDestroy"),
            mem_alloc: opt_sym!(lib, "ncclMemAlloc"),
            mem_free: opt_sym!(lib, "ncclMemFree"),
            get_stats: opt_sym!(lib, "hetcclCommGetStats"),
            _lib: lib,
        })
    }

    /// The path it was loaded from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `ncclGetVersion`.
    pub fn version(&self) -> i32 {
        self.version
    }

    /// `ncclGetErrorString`.
    pub fn error_string(&self, code: NcclResult) -> String {
        // SAFETY: NCCL returns a static C string (or NULL).
        unsafe { cstr((self.error_string)(code)) }
    }

    /// `hetcclCommGetStats(comm)`: the communicator's metrics as JSON text;
    /// `None` when the library lacks the function.
    pub fn comm_stats(&self, comm: Comm) -> Option<Result<String, NcclError>> {
        let f = self.get_stats?;
        let mut needed = 0usize;
        // SAFETY: a NULL buffer of length 0 asks for the size; `needed` is a
        // valid out pointer.
        let rc = unsafe { f(comm, std::ptr::null_mut(), 0, &mut needed) };
        if let Err(e) = self.check("hetcclCommGetStats", rc, comm) {
            return Some(Err(e));
        }
        let mut buf = vec![0u8; needed + 1];
        // SAFETY: `buf` holds `buf.len()` writable bytes.
        let rc = unsafe { f(comm, buf.as_mut_ptr().cast(), buf.len(), &mut needed) };
        Some(self.check("hetcclCommGetStats", rc, comm).map(|()| {
            buf.truncate(needed.min(buf.len() - 1));
            String::from_utf8_lossy(&buf).into_owned()
        }))
    }

    /// `ncclGetLastError(comm)` (empty when the library lacks it).
    pub fn last_error(&self, comm: Comm) -> String {
        match self.last_error {
            // SAFETY: NCCL returns a C string owned by the library (or NULL).
            Some(f) => unsafe { cstr(f(comm)) },
            None => String::new(),
        }
    }

    #[inline]
    fn check(&self, call: &'static str, code: NcclResult, comm: Comm) -> Result<(), NcclError> {
        if code == 0 {
            return Ok(());
        }
        Err(self.failed(call, code, comm))
    }

    #[cold]
    #[inline(never)]
    fn failed(&self, call: &'static str, code: NcclResult, comm: Comm) -> NcclError {
        NcclError(Box::new(ErrorDetails {
            call,
            code,
            string: self.error_string(code),
            last: self.last_error(comm),
        }))
    }

    /// `ncclGetUniqueId`.
    pub fn get_unique_id(&self) -> Result<UniqueId, NcclError> {
        let mut id = UniqueId::default();
        // SAFETY: valid out pointer.
        let rc = unsafe { (self.get_unique_id)(&mut id) };
        self.check("ncclGetUniqueId", rc, std::ptr::null_mut())?;
        Ok(id)
    }

    /// `ncclCommInitRankConfig` (blocking config) when the library has it and
    /// `use_config`, else `ncclCommInitRank`.
    pub fn comm_init_rank(
        &self,
        nranks: usize,
        id: UniqueId,
        rank: usize,
        use_config: bool,
    ) -> Result<Comm, NcclError> {
        let mut comm: Comm = std::ptr::null_mut();
        match self.init_rank_config.filter(|_| use_config) {
            Some(f) => {
                let mut cfg = Config::initializer();
                cfg.blocking = 1;
                // SAFETY: valid out pointer and config.
                let rc = unsafe { f(&mut comm, nranks as c_int, id, rank as c_int, &mut cfg) };
                self.check("ncclCommInitRankConfig", rc, std::ptr::null_mut())?;
            }
            None => {
                // SAFETY: valid out pointer.
                let rc = unsafe { (self.init_rank)(&mut comm, nranks as c_int, id, rank as c_int) };
                self.check("ncclCommInitRank", rc, std::ptr::null_mut())?;
            }
        }
        Ok(comm)
    }

    /// `ncclCommDestroy`.
    pub fn comm_destroy(&self, comm: Comm) -> Result<(), NcclError> {
        // SAFETY: `comm` came from comm_init_rank.
        let rc = unsafe { (self.comm_destroy)(comm) };
        self.check("ncclCommDestroy", rc, std::ptr::null_mut())
    }

    /// `ncclCommAbort` (best effort, for timeouts).
    pub fn comm_abort(&self, comm: Comm) {
        if let Some(f) = self.comm_abort {
            // SAFETY: `comm` came from comm_init_rank.
            unsafe { f(comm) };
        }
    }

    /// `(ncclCommCount, ncclCommUserRank)`.
    pub fn comm_count_rank(&self, comm: Comm) -> Result<(usize, usize), NcclError> {
        let (mut n, mut r) = (0, 0);
        // SAFETY: valid comm and out pointers.
        self.check(
            "ncclCommCount",
            // SAFETY: the caller guarantees the buffers, the comm and the stream (see this
            // function's contract).
            unsafe { (self.comm_count)(comm, &mut n) },
            comm,
        )?;
        // SAFETY: as above.
        self.check(
            "ncclCommUserRank",
            // SAFETY: the caller guarantees the buffers, the comm and the stream (see this
            // function's contract).
            unsafe { (self.comm_user_rank)(comm, &mut r) },
            comm,
        )?;
        Ok((n as usize, r as usize))
    }

    /// `ncclCommGetAsyncError` (success when the library lacks it).
    pub fn comm_async_error(&self, comm: Comm) -> Result<(), NcclError> {
        let Some(f) = self.comm_get_async_error else {
            return Ok(());
        };
        let mut e: c_int = 0;
        // SAFETY: valid comm and out pointer.
        self.check("ncclCommGetAsyncError", unsafe { f(comm, &mut e) }, comm)?;
        self.check("ncclCommGetAsyncError (async)", e, comm)
    }

    /// `ncclGroupStart`.
    pub fn group_start(&self) -> Result<(), NcclError> {
        // SAFETY: no arguments.
        self.check(
            "ncclGroupStart",
            unsafe { (self.group_start)() },
            std::ptr::null_mut(),
        )
    }

    /// `ncclGroupEnd`.
    pub fn group_end(&self) -> Result<(), NcclError> {
        // SAFETY: no arguments.
        self.check(
            "ncclGroupEnd",
            unsafe { (self.group_end)() },
            std::ptr::null_mut(),
        )
    }

    /// Whether native `ncclAlltoAll`/`ncclGather`/`ncclScatter` are used
    /// (NCCL ≥ 2.28 and the symbol present), else grouped send/recv as
    /// nccl-tests does for older libraries.
    pub fn has_native(&self, which: &str) -> bool {
        self.version >= 22800
            && match which {
                "alltoall" => self.alltoall.is_some(),
                "gather" => self.gather.is_some(),
                "scatter" => self.scatter.is_some(),
                _ => false,
            }
    }

    /// `ncclRedOpCreatePreMulSum` with a host-immediate scalar.
    pub fn premul_create(
        &self,
        scalar: &mut u64,
        dtype: c_int,
        comm: Comm,
    ) -> Result<c_int, NcclError> {
        let f = self
            .premul_create
            .ok_or_else(|| self.missing("ncclRedOpCreatePreMulSum"))?;
        let mut op: c_int = 0;
        // SAFETY: the scalar is a live u64 holding the value in its low bytes (little endian).
        let rc = unsafe {
            f(
                &mut op,
                scalar as *mut u64 as *mut c_void,
                dtype,
                SCALAR_HOST_IMMEDIATE,
                comm,
            )
        };
        self.check("ncclRedOpCreatePreMulSum", rc, comm)?;
        Ok(op)
    }

    /// `ncclRedOpDestroy`.
    pub fn op_destroy(&self, op: c_int, comm: Comm) -> Result<(), NcclError> {
        let f = self
            .op_destroy
            .ok_or_else(|| self.missing("ncclRedOpDestroy"))?;
        // SAFETY: `op` came from premul_create on `comm`.
        self.check("ncclRedOpDestroy", unsafe { f(op, comm) }, comm)
    }

    fn missing(&self, call: &'static str) -> NcclError {
        NcclError(Box::new(ErrorDetails {
            call,
            code: NCCL_INVALID_USAGE,
            string: "missing symbol".into(),
            last: format!("{} does not export {call}", self.path.display()),
        }))
    }

    /// `ncclMemAlloc`, or `None` when the library lacks it.
    pub fn mem_alloc(&self, bytes: usize) -> Option<Result<*mut u8, NcclError>> {
        let f = self.mem_alloc?;
        let mut p: *mut c_void = std::ptr::null_mut();
        // SAFETY: valid out pointer.
        let rc = unsafe { f(&mut p, bytes) };
        Some(
            self.check("ncclMemAlloc", rc, std::ptr::null_mut())
                .map(|_| p as *mut u8),
        )
    }

    /// `ncclMemFree`.
    pub fn mem_free(&self, p: *mut u8) -> Result<(), NcclError> {
        let f = self.mem_free.ok_or_else(|| self.missing("ncclMemFree"))?;
        // SAFETY: `p` came from mem_alloc.
        self.check(
            "ncclMemFree",
            unsafe { f(p as *mut c_void) },
            std::ptr::null_mut(),
        )
    }

    /// Runs one operation of `kind` on raw pointers (see `bench`).
    ///
    /// # Safety
    /// `send`/`recv` must be valid for the byte counts the collective implies.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn run_coll(
        &self,
        kind: crate::coll::Coll,
        send: *const u8,
        recv: *mut u8,
        count: usize,
        dtype: c_int,
        op: c_int,
        root: usize,
        comm: Comm,
        st: Stream,
    ) -> Result<(), NcclError> {
        use crate::coll::Coll;
        let s = send as *const c_void;
        let r = recv as *mut c_void;
        let root = root as c_int;
        let (call, rc) = match kind {
            // SAFETY: the caller guarantees the buffers, the comm and the stream (see this
            // function's contract).
            Coll::AllReduce => ("ncclAllReduce", unsafe {
                (self.all_reduce)(s, r, count, dtype, op, comm, st)
            }),
            // SAFETY: the caller guarantees the buffers, the comm and the stream (see this
            // function's contract).
            Coll::AllGather => ("ncclAllGather", unsafe {
                (self.all_gather)(s, r, count, dtype, comm, st)
            }),
            // SAFETY: the caller guarantees the buffers, the comm and the stream (see this
            // function's contract).
            Coll::ReduceScatter => ("ncclReduceScatter", unsafe {
                (self.reduce_scatter)(s, r, count, dtype, op, comm, st)
            }),
            // SAFETY: the caller guarantees the buffers, the comm and the stream (see this
            // function's contract).
            Coll::Broadcast => ("ncclBroadcast", unsafe {
                (self.broadcast)(s, r, count, dtype, root, comm, st)
            }),
            // SAFETY: the caller guarantees the buffers, the comm and the stream (see this
            // function's contract).
            Coll::Reduce => ("ncclReduce", unsafe {
                (self.reduce)(s, r, count, dtype, op, root, comm, st)
            }),
            Coll::AlltoAll if self.has_native("alltoall") => {
                let f = self.alltoall.expect("checked");
                // SAFETY: the caller guarantees the buffers, the comm and the stream (see this
                // function's contract).
                ("ncclAlltoAll", unsafe { f(s, r, count, dtype, comm, st) })
            }
            Coll::Gather if self.has_native("gather") => {
                if count == 0 {
                    return Ok(());
                }
                let f = self.gather.expect("checked");
                // SAFETY: the caller guarantees the buffers, the comm and the stream (see this
                // function's contract).
                ("ncclGather", unsafe {
                    f(s, r, count, dtype, root, comm, st)
                })
            }
            Coll::Scatter if self.has_native("scatter") => {
                if count == 0 {
                    return Ok(());
                }
                let f = self.scatter.expect("checked");
                // SAFETY: the caller guarantees the buffers, the comm and the stream (see this
                // function's contract).
                ("ncclScatter", unsafe {
                    f(s, r, count, dtype, root, comm, st)
                })
            }
            Coll::AlltoAll | Coll::Gather | Coll::Scatter | Coll::SendRecv => {
                // SAFETY: the caller guarantees the buffers, the comm and the stream (see this
                // function's contract).
                return unsafe {
                    self.p2p(kind, send, recv, count, dtype, root as usize, comm, st)
                };
            }
        };
        self.check(call, rc, comm)
    }

    /// Grouped send/recv forms (nccl-tests' fallbacks and sendrecv).
    #[allow(clippy::too_many_arguments)]
    unsafe fn p2p(
        &self,
        kind: crate::coll::Coll,
        send: *const u8,
        recv: *mut u8,
        count: usize,
        dtype: c_int,
        root: usize,
        comm: Comm,
        st: Stream,
    ) -> Result<(), NcclError> {
        use crate::coll::Coll;
        let (n, rank) = self.comm_count_rank(comm)?;
        let bytes = count * crate::bench::dtype_size(dtype);
        if matches!(kind, Coll::Gather | Coll::Scatter) && count == 0 {
            return Ok(());
        }
        let send_to = |buf: *const u8, peer: usize| -> Result<(), NcclError> {
            // SAFETY: caller guarantees the buffers.
            let rc =
                unsafe { (self.send)(buf as *const c_void, count, dtype, peer as c_int, comm, st) };
            self.check("ncclSend", rc, comm)
        };
        let recv_from = |buf: *mut u8, peer: usize| -> Result<(), NcclError> {
            // SAFETY: caller guarantees the buffers.
            let rc =
                unsafe { (self.recv)(buf as *mut c_void, count, dtype, peer as c_int, comm, st) };
            self.check("ncclRecv", rc, comm)
        };
        self.group_start()?;
        let res = (|| {
            match kind {
                Coll::AlltoAll => {
                    for p in 0..n {
                        send_to(send.wrapping_add(p * bytes), p)?;
                        recv_from(recv.wrapping_add(p * bytes), p)?;
                    }
                }
                Coll::Gather => {
                    send_to(send, root)?;
                    if rank == root {
                        for p in 0..n {
                            recv_from(recv.wrapping_add(p * bytes), p)?;
                        }
                    }
                }
                Coll::Scatter => {
                    if rank == root {
                        for p in 0..n {
                            send_to(send.wrapping_add(p * bytes), p)?;
                        }
                    }
                    recv_from(recv, root)?;
                }
                _ => {
                    send_to(send, (rank + 1) % n)?;
                    recv_from(recv, (rank + n - 1) % n)?;
                }
            }
            Ok(())
        })();
        let end = self.group_end();
        res.and(end)
    }
}

/// Copies a C string (NULL → empty).
///
/// # Safety
/// `p` is NULL or a valid NUL-terminated string.
unsafe fn cstr(p: *const c_char) -> String {
    if p.is_null() {
        String::new()
    } else {
        // SAFETY: per the function contract.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }
}
