//! The net-plugin conformance harness's helpers (`tests/net_plugin*.rs`,
//! `tests/peer_faults_net.rs`): load `libhetccl.so` with dlopen as NCCL
//! does, and drive it through the v8 or the v12 table with one
//! version-independent API ([`Api`]); [`procs`]: child processes and
//! network namespaces.

pub mod procs;

use std::ffi::{c_int, c_void, CStr};
use std::sync::{Once, OnceLock};
use std::time::{Duration, Instant};

use hetccl_abi::net::v12::{ncclNetProperties_v12_t, ncclNet_v12_t};
use hetccl_abi::net::v8::{ncclNetProperties_v8_t, ncclNet_v8_t};
use hetccl_abi::net::NCCL_PTR_HOST;

/// `ncclSuccess`, `ncclInternalError`, `ncclInvalidArgument`, `ncclInvalidUsage`.
pub const OK: i32 = 0;
/// `ncclInternalError`.
pub const INTERNAL: i32 = 3;
/// `ncclInvalidArgument`.
pub const INVALID_ARG: i32 = 4;
/// `ncclInvalidUsage`.
pub const INVALID_USAGE: i32 = 5;

/// Generous limit for anything that should finish.
pub const LIMIT: Duration = Duration::from_secs(30);

/// Sets the environment the plugin reads, before the library is first used:
/// loopback only (the tests never send anywhere else).
pub fn setup_env() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        if std::env::var_os("HETCCL_SOCKET_IFNAME").is_none() {
            std::env::set_var("HETCCL_SOCKET_IFNAME", "=lo");
        }
        if std::env::var_os("HETCCL_TIMEOUT_S").is_none() {
            std::env::set_var("HETCCL_TIMEOUT_S", "20");
        }
    });
}

/// Whether the tests run over the verbs transport (`HETCCL_NET=ib`, as
/// `scripts/rdma-vm.sh` runs them on Soft-RoCE), and on which device
/// (`HETCCL_TEST_IB_DEV`, default `rxe0`).
pub fn ib_dev() -> Option<String> {
    (std::env::var("HETCCL_NET").ok().as_deref() == Some("ib"))
        .then(|| std::env::var("HETCCL_TEST_IB_DEV").unwrap_or_else(|_| "rxe0".into()))
}

/// The `libhetccl.so` under test: `HETCCL_LIB` (how a parent hands its
/// library to the children it starts, see [`procs::Proc::spawn`]), else
/// [`crate::hetccl_so`].
pub fn so_path() -> std::path::PathBuf {
    if let Some(p) = std::env::var_os("HETCCL_LIB") {
        return p.into();
    }
    crate::hetccl_so()
}

/// Opens the library as NCCL does (`RTLD_NOW | RTLD_LOCAL`).
pub fn open() -> libloading::Library {
    setup_env();
    let flags = libc::RTLD_NOW | libc::RTLD_LOCAL;
    // SAFETY: loading our own library; its initialisers are Rust statics only.
    let lib = unsafe { libloading::os::unix::Library::open(Some(so_path()), flags) }
        .expect("dlopen libhetccl.so");
    lib.into()
}

/// The library, opened once per test process and never closed.
pub fn lib() -> &'static libloading::Library {
    static LIB: OnceLock<libloading::Library> = OnceLock::new();
    LIB.get_or_init(open)
}

/// Looks up a table by symbol name.
pub fn table<T>(lib: &libloading::Library, name: &str) -> &'static T {
    // SAFETY: the symbol is a data object of type T (checked by the ABI layout tests).
    unsafe {
        let s: libloading::Symbol<*const T> = lib
            .get(name.as_bytes())
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        &**s
    }
}

/// Which table an [`Api`] drives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ver {
    /// `ncclNetPlugin_v8`.
    V8,
    /// `ncclNetPlugin_v12`.
    V12,
}

/// One version-independent view of a plugin table (plus a v12 context).
pub struct Api {
    /// The table it drives.
    pub ver: Ver,
    v8: Option<&'static ncclNet_v8_t>,
    v12: Option<&'static ncclNet_v12_t>,
    /// The v12 context from `init` (NULL for v8).
    pub ctx: *mut c_void,
}

// SAFETY: the plugin is thread-safe; the context pointer is shared by design.
unsafe impl Send for Api {}
// SAFETY: as above.
unsafe impl Sync for Api {}

/// An opaque plugin pointer that may cross threads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct P(pub *mut c_void);
// SAFETY: comms and requests are thread-safe objects of the plugin.
unsafe impl Send for P {}
// SAFETY: as above.
unsafe impl Sync for P {}

impl P {
    /// The NULL pointer (a post that asks for a retry returns it).
    pub fn null() -> Self {
        P(std::ptr::null_mut())
    }
    /// Whether it is NULL.
    pub fn is_null(self) -> bool {
        self.0.is_null()
    }
}

macro_rules! call_v {
    ($t:expr, $f:ident ( $($a:expr),* )) => {
        // SAFETY: calling the plugin with arguments that follow its contract.
        unsafe { ($t.unwrap().$f.expect(stringify!($f)))($($a),*) }
    };
}

macro_rules! call {
    ($api:expr, $f:ident ( $($a:expr),* )) => {
        match ($api.v8, $api.v12) {
            // SAFETY: calling the plugin with arguments that follow its contract.
            (Some(t), _) => unsafe { (t.$f.expect(stringify!($f)))($($a),*) },
            // SAFETY: as above.
            (_, Some(t)) => unsafe { (t.$f.expect(stringify!($f)))($($a),*) },
            _ => unreachable!(),
        }
    };
}

fn check(rc: i32, what: &str) -> Result<(), i32> {
    if rc == OK {
        Ok(())
    } else {
        let _ = what;
        Err(rc)
    }
}

impl Api {
    /// The v8 table of `lib`, initialised (v8 init is process-wide).
    pub fn v8_of(lib: &libloading::Library) -> Self {
        let t: &'static ncclNet_v8_t = table(lib, "ncclNetPlugin_v8");
        // SAFETY: no logger.
        assert_eq!(unsafe { (t.init.unwrap())(None) }, OK);
        Self {
            ver: Ver::V8,
            v8: Some(t),
            v12: None,
            ctx: std::ptr::null_mut(),
        }
    }

    /// The v12 table of `lib`, with a fresh context.
    pub fn v12_of(lib: &libloading::Library) -> Self {
        Self::v12_with_logger(lib, None)
    }

    /// The v12 table of `lib`, with a fresh context initialised with `logger`.
    pub fn v12_with_logger(
        lib: &libloading::Library,
        logger: hetccl_abi::net::ncclDebugLogger_t,
    ) -> Self {
        let t: &'static ncclNet_v12_t = table(lib, "ncclNetPlugin_v12");
        let mut ctx = std::ptr::null_mut();
        let mut cfg = hetccl_abi::net::ncclNetCommConfig_t { trafficClass: -1 };
        // SAFETY: valid out pointers.
        let rc = unsafe { (t.init.unwrap())(&mut ctx, 0x1234, &mut cfg, logger, None) };
        assert_eq!(rc, OK);
        assert!(!ctx.is_null());
        Self {
            ver: Ver::V12,
            v8: None,
            v12: Some(t),
            ctx,
        }
    }

    /// Both tables of the shared library.
    pub fn both() -> Vec<Api> {
        vec![Self::v8_of(lib()), Self::v12_of(lib())]
    }

    /// The table's `name`.
    pub fn name(&self) -> String {
        let p = match (self.v8, self.v12) {
            (Some(t), _) => t.name,
            (_, Some(t)) => t.name,
            _ => unreachable!(),
        };
        // SAFETY: the table's name is a C string literal.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }

    /// `devices`: how many NICs the plugin offers.
    pub fn devices(&self) -> i32 {
        let mut n = -1;
        assert_eq!(call!(self, devices(&mut n)), OK);
        n
    }

    /// `getProperties` of the v12 table.
    pub fn v12_props(&self, dev: i32) -> Result<ncclNetProperties_v12_t, i32> {
        // SAFETY: all-zero is a valid value of the plain-data properties struct.
        let mut p: ncclNetProperties_v12_t = unsafe { std::mem::zeroed() };
        // SAFETY: valid out pointer.
        check(
            unsafe { (self.v12.unwrap().getProperties.unwrap())(dev, &mut p) },
            "getProperties",
        )
        .map(|_| p)
    }

    /// `getProperties` of the v8 table.
    pub fn v8_props(&self, dev: i32) -> Result<ncclNetProperties_v8_t, i32> {
        // SAFETY: as above.
        let mut p: ncclNetProperties_v8_t = unsafe { std::mem::zeroed() };
        // SAFETY: valid out pointer.
        check(
            unsafe { (self.v8.unwrap().getProperties.unwrap())(dev, &mut p) },
            "getProperties",
        )
        .map(|_| p)
    }

    /// Most buffers per irecv, as the table advertises.
    pub fn max_recvs(&self) -> usize {
        match self.ver {
            Ver::V8 => self.v8_props(0).unwrap().maxRecvs as usize,
            Ver::V12 => self.v12_props(0).unwrap().maxRecvs as usize,
        }
    }

    /// `listen` on device 0: the handle and the listen comm.
    pub fn listen(&self) -> ([u8; 128], P) {
        let mut h = [0u8; 128];
        let mut l = std::ptr::null_mut();
        let rc = match self.ver {
            Ver::V8 => call_v!(self.v8, listen(0, h.as_mut_ptr().cast(), &mut l)),
            Ver::V12 => call_v!(self.v12, listen(self.ctx, 0, h.as_mut_ptr().cast(), &mut l)),
        };
        assert_eq!(rc, OK, "listen");
        assert!(!l.is_null());
        (h, P(l))
    }

    /// `connect` on device 0 to handle `h`; `Ok(P::null())` means "retry".
    pub fn connect(&self, h: &mut [u8; 128]) -> Result<P, i32> {
        let mut s = std::ptr::null_mut();
        let mut dev = std::ptr::null_mut();
        let rc = match self.ver {
            Ver::V8 => call_v!(self.v8, connect(0, h.as_mut_ptr().cast(), &mut s, &mut dev)),
            Ver::V12 => call_v!(
                self.v12,
                connect(self.ctx, 0, h.as_mut_ptr().cast(), &mut s, &mut dev)
            ),
        };
        check(rc, "connect").map(|_| P(s))
    }

    /// `accept` on listen comm `l`; `Ok(P::null())` means "retry".
    pub fn accept(&self, l: P) -> Result<P, i32> {
        let mut r = std::ptr::null_mut();
        let mut dev = std::ptr::null_mut();
        check(call!(self, accept(l.0, &mut r, &mut dev)), "accept").map(|_| P(r))
    }

    /// Connects a pair in one thread, alternating connect and accept; returns
    /// (send, recv, connect calls that returned NULL).
    pub fn pair_on(&self, l: P, h: &[u8; 128]) -> (P, P, usize) {
        let mut h = *h;
        let (mut s, mut r, mut retries) = (P::null(), P::null(), 0);
        let t0 = Instant::now();
        while s.is_null() || r.is_null() {
            assert!(
                t0.elapsed() < LIMIT,
                "connect/accept in one thread did not finish"
            );
            if s.is_null() {
                s = self.connect(&mut h).expect("connect");
                retries += usize::from(s.is_null());
            }
            if r.is_null() {
                r = self.accept(l).expect("accept");
            }
        }
        (s, r, retries)
    }

    /// A connected (send, recv) pair over a fresh listener (closed again).
    pub fn pair(&self) -> (P, P) {
        let (h, l) = self.listen();
        let (s, r, _) = self.pair_on(l, &h);
        self.close_listen(l);
        (s, r)
    }

    /// `regMr` of a host buffer; panics unless it succeeds.
    pub fn reg(&self, comm: P, ptr: *mut u8, len: usize) -> P {
        let mut mh = std::ptr::null_mut();
        let rc = match self.ver {
            Ver::V8 => call_v!(
                self.v8,
                regMr(comm.0, ptr.cast(), len, NCCL_PTR_HOST, &mut mh)
            ),
            Ver::V12 => call_v!(
                self.v12,
                regMr(comm.0, ptr.cast(), len, NCCL_PTR_HOST, &mut mh)
            ),
        };
        assert_eq!(rc, OK, "regMr");
        P(mh)
    }

    /// `regMr` with pointer type `ty`; returns the result code.
    pub fn reg_type(&self, comm: P, ptr: *mut u8, len: usize, ty: c_int) -> i32 {
        let mut mh = std::ptr::null_mut();
        call!(self, regMr(comm.0, ptr.cast(), len, ty, &mut mh))
    }

    /// `regMr` with pointer type `ty`: the handle, or the result code.
    pub fn reg_typed(&self, comm: P, ptr: *mut u8, len: usize, ty: c_int) -> Result<P, i32> {
        let mut mh = std::ptr::null_mut();
        check(
            call!(self, regMr(comm.0, ptr.cast(), len, ty, &mut mh)),
            "regMr",
        )
        .map(|_| P(mh))
    }

    /// `regMrDmaBuf`: the handle, or the result code.
    pub fn reg_dmabuf(
        &self,
        comm: P,
        ptr: *mut u8,
        len: usize,
        ty: c_int,
        offset: u64,
        fd: c_int,
    ) -> Result<P, i32> {
        let mut mh = std::ptr::null_mut();
        let rc = call!(
            self,
            regMrDmaBuf(comm.0, ptr.cast(), len, ty, offset, fd, &mut mh)
        );
        check(rc, "regMrDmaBuf").map(|_| P(mh))
    }

    /// `deregMr`; panics unless it succeeds.
    pub fn dereg(&self, comm: P, mh: P) {
        assert_eq!(call!(self, deregMr(comm.0, mh.0)), OK, "deregMr");
    }

    /// Posts a send; `Ok(P::null())` means "retry".
    pub fn isend(&self, comm: P, ptr: *const u8, len: usize, tag: i32, mh: P) -> Result<P, i32> {
        let mut req = std::ptr::null_mut();
        let rc = match self.ver {
            Ver::V8 => call_v!(
                self.v8,
                isend(
                    comm.0,
                    ptr as *mut c_void,
                    len as c_int,
                    tag,
                    mh.0,
                    &mut req
                )
            ),
            Ver::V12 => {
                call_v!(
                    self.v12,
                    isend(
                        comm.0,
                        ptr as *mut c_void,
                        len,
                        tag,
                        mh.0,
                        std::ptr::null_mut(),
                        &mut req
                    )
                )
            }
        };
        check(rc, "isend").map(|_| P(req))
    }

    /// Posts a grouped receive; `hint` passes NCCL's 0x1 in `*request`.
    pub fn irecv(
        &self,
        comm: P,
        bufs: &[*mut u8],
        caps: &[usize],
        tags: &[i32],
        mhs: &[P],
        hint: bool,
    ) -> Result<P, i32> {
        let n = bufs.len() as c_int;
        let mut data: Vec<*mut c_void> = bufs.iter().map(|&b| b.cast()).collect();
        let mut tags = tags.to_vec();
        let mut mh: Vec<*mut c_void> = mhs.iter().map(|m| m.0).collect();
        mh.resize(bufs.len(), std::ptr::null_mut());
        let mut req: *mut c_void = if hint {
            std::ptr::without_provenance_mut::<c_void>(
                hetccl_abi::net::NCCL_NET_OPTIONAL_RECV_COMPLETION,
            )
        } else {
            std::ptr::null_mut()
        };
        let rc = match self.ver {
            Ver::V8 => {
                let mut sz: Vec<c_int> = caps.iter().map(|&c| c as c_int).collect();
                call_v!(
                    self.v8,
                    irecv(
                        comm.0,
                        n,
                        data.as_mut_ptr(),
                        sz.as_mut_ptr(),
                        tags.as_mut_ptr(),
                        mh.as_mut_ptr(),
                        &mut req
                    )
                )
            }
            Ver::V12 => {
                let mut sz = caps.to_vec();
                let mut ph = vec![std::ptr::null_mut(); bufs.len()];
                call_v!(
                    self.v12,
                    irecv(
                        comm.0,
                        n,
                        data.as_mut_ptr(),
                        sz.as_mut_ptr(),
                        tags.as_mut_ptr(),
                        mh.as_mut_ptr(),
                        ph.as_mut_ptr(),
                        &mut req
                    )
                )
            }
        };
        check(rc, "irecv").map(|_| P(req))
    }

    /// Tests once: `Ok(true)` when done.
    pub fn test(&self, req: P, sizes: Option<&mut [c_int]>) -> Result<bool, i32> {
        let mut done = 0;
        let sp = sizes.map_or(std::ptr::null_mut(), |s| s.as_mut_ptr());
        check(call!(self, test(req.0, &mut done, sp)), "test").map(|_| done == 1)
    }

    /// `iflush` of one buffer: the result code and the request.
    pub fn iflush(&self, comm: P, buf: *mut u8, size: c_int, mh: P) -> (i32, P) {
        let mut data = [buf.cast::<c_void>()];
        let mut sizes = [size];
        let mut mhs = [mh.0];
        let mut req = std::ptr::null_mut();
        let rc = call!(
            self,
            iflush(
                comm.0,
                1,
                data.as_mut_ptr(),
                sizes.as_mut_ptr(),
                mhs.as_mut_ptr(),
                &mut req
            )
        );
        (rc, P(req))
    }

    /// `closeSend`; panics unless it succeeds.
    pub fn close_send(&self, c: P) {
        assert_eq!(call!(self, closeSend(c.0)), OK, "closeSend");
    }
    /// `closeRecv`; panics unless it succeeds.
    pub fn close_recv(&self, c: P) {
        assert_eq!(call!(self, closeRecv(c.0)), OK, "closeRecv");
    }
    /// `closeListen`; panics unless it succeeds.
    pub fn close_listen(&self, c: P) {
        assert_eq!(call!(self, closeListen(c.0)), OK, "closeListen");
    }

    /// `finalize` (v12; v8 has none).
    pub fn finalize(&self) {
        if let Some(t) = self.v12 {
            // SAFETY: the context init returned.
            assert_eq!(unsafe { (t.finalize.unwrap())(self.ctx) }, OK, "finalize");
        }
    }

    /// Sends `msg` and waits for completion (polling only the send).
    pub fn send_wait(&self, comm: P, msg: &[u8], tag: i32) -> Result<usize, i32> {
        let req = self.retry(|| self.isend(comm, msg.as_ptr(), msg.len(), tag, P::null()))?;
        let mut sizes = [-1];
        self.wait(req, &mut sizes)?;
        Ok(sizes[0] as usize)
    }

    /// Retries a post until it returns a request.
    pub fn retry(&self, mut f: impl FnMut() -> Result<P, i32>) -> Result<P, i32> {
        let t0 = Instant::now();
        loop {
            let r = f()?;
            if !r.is_null() {
                return Ok(r);
            }
            assert!(t0.elapsed() < LIMIT, "post kept asking for a retry");
            std::thread::yield_now();
        }
    }

    /// Tests until done.
    pub fn wait(&self, req: P, sizes: &mut [c_int]) -> Result<(), i32> {
        let t0 = Instant::now();
        while !self.test(req, Some(sizes))? {
            assert!(t0.elapsed() < LIMIT, "request did not complete");
        }
        Ok(())
    }

    /// Polls several requests until all are done; returns each one's result
    /// and sizes (`n` ints each).
    pub fn wait_all(&self, reqs: &[P], n: usize) -> Vec<Result<Vec<c_int>, i32>> {
        let mut out: Vec<Option<Result<Vec<c_int>, i32>>> = vec![None; reqs.len()];
        let t0 = Instant::now();
        while out.iter().any(Option::is_none) {
            assert!(t0.elapsed() < LIMIT, "requests did not complete");
            for (i, r) in reqs.iter().enumerate() {
                if out[i].is_none() {
                    let mut s = vec![-1; n.max(1)];
                    match self.test(*r, Some(&mut s)) {
                        Ok(true) => out[i] = Some(Ok(s)),
                        Ok(false) => {}
                        Err(e) => out[i] = Some(Err(e)),
                    }
                }
            }
        }
        out.into_iter().map(Option::unwrap).collect()
    }
}

/// A deterministic byte pattern.
pub fn pattern(len: usize, seed: u32) -> Vec<u8> {
    (0..len)
        .map(|i| ((i as u32).wrapping_mul(2_654_435_761).wrapping_add(seed) >> 13) as u8)
        .collect()
}

/// Sends `msgs` (tag, bytes) over `s` and receives each into a buffer of
/// `cap` bytes over `r`, one at a time with both requests polled together;
/// checks sizes and data.
pub fn exchange(api: &Api, s: P, r: P, msgs: &[(i32, Vec<u8>)], cap: usize) {
    for (tag, m) in msgs {
        let mut buf = vec![0xEEu8; cap.max(1)];
        let rq = api
            .retry(|| api.irecv(r, &[buf.as_mut_ptr()], &[cap], &[*tag], &[], false))
            .unwrap();
        let sq = api
            .retry(|| api.isend(s, m.as_ptr(), m.len(), *tag, P::null()))
            .unwrap();
        let res = api.wait_all(&[sq, rq], 1);
        assert_eq!(
            res[0].as_ref().unwrap()[0] as usize,
            m.len(),
            "{:?}: send size",
            api.ver
        );
        assert_eq!(
            res[1].as_ref().unwrap()[0] as usize,
            m.len(),
            "{:?}: receive size",
            api.ver
        );
        assert!(
            buf[..m.len()] == m[..],
            "{:?}: payload of {} bytes differs",
            api.ver,
            m.len()
        );
    }
}
