//! The objects handed to C as opaque pointers, each a `Box` with a magic
//! number checked on the way back in and cleared when it is freed.

use std::ffi::{c_int, c_void};
use std::sync::Arc;

use once_cell::sync::OnceCell;
use parking_lot::Mutex;

use super::backend::{AnyListen, AnyRecv, AnySend, Net};
use crate::error::{NetError, Result};
use crate::fasthash::IntSet;
use crate::ib::flush::Flusher;
use crate::ib::mr::Mr;
use crate::tcp::{RecvRequest, SendRequest};

const CTX_MAGIC: u64 = 0x4843_4e45_5443_5458; // "HCNETCTX"
const LISTEN_MAGIC: u64 = 0x4843_4e45_544c_5354;
const SEND_MAGIC: u64 = 0x4843_4e45_5453_4e44;
const RECV_MAGIC: u64 = 0x4843_4e45_5452_4356;
const MR_MAGIC: u64 = 0x4843_4e45_544d_5248;
const REQ_MAGIC: u64 = 0x4843_4e45_5452_4551;

/// Checks that `p` is non-NULL and starts with `magic`.
unsafe fn check<'a, T>(p: *mut c_void, magic: u64, what: &str) -> Result<&'a T> {
    if p.is_null() {
        return Err(NetError::InvalidArgument(format!("{what} is NULL")));
    }
    // SAFETY: every object of this module starts with its u64 magic; the
    // caller passes a pointer this module handed out.
    if unsafe { (p as *const u64).read() } != magic {
        return Err(NetError::InvalidArgument(format!(
            "{what} {p:?} is not a live {what}"
        )));
    }
    // SAFETY: the magic matched.
    Ok(unsafe { &*(p as *const T) })
}

/// Clears the magic and frees the box.
unsafe fn free<T>(p: *mut c_void) -> Box<T> {
    // SAFETY: the caller checked the magic; the first field is the u64 magic.
    unsafe {
        (p as *mut u64).write(0);
        Box::from_raw(p.cast::<T>())
    }
}

/// A plugin context (v11/v12 get one per communicator).
#[repr(C)]
pub(super) struct Ctx {
    magic: u64,
    pub(super) net: Arc<Net>,
}

impl Ctx {
    pub(super) fn new(net: Arc<Net>) -> Box<Self> {
        Box::new(Self {
            magic: CTX_MAGIC,
            net,
        })
    }
    pub(super) unsafe fn from_ptr<'a>(p: *mut c_void) -> Result<&'a Self> {
        // SAFETY: forwarded contract.
        unsafe { check(p, CTX_MAGIC, "context") }
    }
    pub(super) unsafe fn take(p: *mut c_void) -> Result<Box<Self>> {
        // SAFETY: checked first.
        unsafe {
            Self::from_ptr(p)?;
            Ok(free(p))
        }
    }
}

/// A listen comm.
#[repr(C)]
pub(super) struct ListenObj {
    magic: u64,
    pub(super) listen: Mutex<AnyListen>,
    pub(super) net: Arc<Net>,
}

impl ListenObj {
    pub(super) fn boxed(l: AnyListen, net: Arc<Net>) -> *mut c_void {
        Box::into_raw(Box::new(Self {
            magic: LISTEN_MAGIC,
            listen: Mutex::new(l),
            net,
        }))
        .cast()
    }
    pub(super) unsafe fn from_ptr<'a>(p: *mut c_void) -> Result<&'a Self> {
        // SAFETY: forwarded contract.
        unsafe { check(p, LISTEN_MAGIC, "listenComm") }
    }
    pub(super) unsafe fn close(p: *mut c_void) -> Result<()> {
        // SAFETY: checked first.
        unsafe {
            Self::from_ptr(p)?;
            drop(free::<Self>(p));
        }
        Ok(())
    }
}

/// Frees the requests still owned by a closing comm.
fn free_live(live: &Mutex<IntSet<usize>>) {
    for p in live.lock().drain() {
        // SAFETY: only live request pointers of this comm are in the set.
        drop(unsafe { free::<ReqObj>(p as *mut c_void) });
    }
}

/// A send comm.
#[repr(C)]
pub(super) struct SendObj {
    magic: u64,
    pub(super) comm: AnySend,
    live: Mutex<IntSet<usize>>,
}

impl SendObj {
    pub(super) fn boxed(comm: AnySend) -> *mut c_void {
        Box::into_raw(Box::new(Self {
            magic: SEND_MAGIC,
            comm,
            live: Mutex::default(),
        }))
        .cast()
    }
    pub(super) unsafe fn from_ptr<'a>(p: *mut c_void) -> Result<&'a Self> {
        // SAFETY: forwarded contract.
        unsafe { check(p, SEND_MAGIC, "sendComm") }
    }
    pub(super) unsafe fn close(p: *mut c_void) -> Result<()> {
        // SAFETY: checked first.
        let obj = unsafe {
            Self::from_ptr(p)?;
            free::<Self>(p)
        };
        free_live(&obj.live);
        obj.comm.close();
        Ok(())
    }
}

/// A receive comm.
#[repr(C)]
pub(super) struct RecvObj {
    magic: u64,
    pub(super) comm: AnyRecv,
    live: Mutex<IntSet<usize>>,
    /// The GPU flush QP, made on the first flush of a verbs comm.
    flush: OnceCell<Flusher>,
}

impl RecvObj {
    pub(super) fn boxed(comm: AnyRecv) -> *mut c_void {
        Box::into_raw(Box::new(Self {
            magic: RECV_MAGIC,
            comm,
            live: Mutex::default(),
            flush: OnceCell::new(),
        }))
        .cast()
    }
    /// The comm's flush QP on `port`, made on first use.
    pub(super) fn flusher(&self, port: &crate::ib::IbPort) -> Result<&Flusher> {
        self.flush.get_or_try_init(|| {
            Flusher::new(
                port,
                &crate::ib::IbOptions::from_config(hetccl_core::config::get()),
            )
        })
    }
    pub(super) unsafe fn from_ptr<'a>(p: *mut c_void) -> Result<&'a Self> {
        // SAFETY: forwarded contract.
        unsafe { check(p, RECV_MAGIC, "recvComm") }
    }
    pub(super) unsafe fn close(p: *mut c_void) -> Result<()> {
        // SAFETY: checked first.
        let obj = unsafe {
            Self::from_ptr(p)?;
            free::<Self>(p)
        };
        free_live(&obj.live);
        obj.comm.close();
        Ok(())
    }
}

/// Checks that `comm` is a live send or receive comm; returns its verbs
/// port, if it is a verbs comm.
pub(super) fn check_comm(comm: *mut c_void) -> Result<Option<crate::ib::IbPort>> {
    // SAFETY: read only after the NULL check; a comm pointer starts with its magic.
    unsafe {
        if let Ok(s) = SendObj::from_ptr(comm) {
            return Ok(s.comm.ib_port().cloned());
        }
        if let Ok(r) = RecvObj::from_ptr(comm) {
            return Ok(r.comm.ib_port().cloned());
        }
        SendObj::from_ptr(comm).map(|_| None)
    }
}

/// A memory registration: the range, and its verbs registration on a
/// verbs comm (TCP needs none).
#[repr(C)]
pub(super) struct MrObj {
    magic: u64,
    addr: usize,
    size: usize,
    pub(super) mr: Option<Arc<Mr>>,
    /// GPU memory (`NCCL_PTR_CUDA` or DMA-BUF): received data needs a flush.
    device: bool,
}

impl MrObj {
    pub(super) fn boxed(
        addr: usize,
        size: usize,
        mr: Option<Arc<Mr>>,
        device: bool,
    ) -> *mut c_void {
        Box::into_raw(Box::new(Self {
            magic: MR_MAGIC,
            addr,
            size,
            mr,
            device,
        }))
        .cast()
    }
    /// The rkey of a GPU-memory verbs registration (NULL or host: `None`).
    pub(super) unsafe fn device_rkey(p: *mut c_void) -> Result<Option<u32>> {
        if p.is_null() {
            return Ok(None);
        }
        // SAFETY: checked by magic.
        let m: &Self = unsafe { check(p, MR_MAGIC, "mhandle")? };
        Ok(m.mr.as_ref().filter(|_| m.device).map(|mr| mr.rkey))
    }
    /// The verbs registration of a handle NCCL passes back (NULL: none).
    pub(super) unsafe fn mr_of(p: *mut c_void) -> Result<Option<Arc<Mr>>> {
        if p.is_null() {
            return Ok(None);
        }
        // SAFETY: checked by magic.
        let m: &Self = unsafe { check(p, MR_MAGIC, "mhandle")? };
        Ok(m.mr.clone())
    }
    /// Frees the handle; returns its range.
    pub(super) unsafe fn free(p: *mut c_void) -> Result<(usize, usize)> {
        // SAFETY: checked first.
        unsafe {
            let mr: &Self = check(p, MR_MAGIC, "mhandle")?;
            tracing::trace!(target: "hetccl::NET", "deregMr {:#x}+{}", mr.addr, mr.size);
            let range = (mr.addr, mr.size);
            drop(free::<Self>(p));
            Ok(range)
        }
    }
}

enum ReqKind {
    Send(*const SendObj, SendRequest),
    Recv(*const RecvObj, RecvRequest),
    Flush(*const RecvObj, u64),
}

/// A request handed to NCCL; freed when `test` reports it done (or failed),
/// or when its comm closes.
#[repr(C)]
pub(super) struct ReqObj {
    magic: u64,
    kind: ReqKind,
}

impl ReqObj {
    pub(super) fn send(comm: &SendObj, r: SendRequest) -> *mut c_void {
        let p: *mut c_void = Box::into_raw(Box::new(Self {
            magic: REQ_MAGIC,
            kind: ReqKind::Send(comm, r),
        }))
        .cast();
        comm.live.lock().insert(p as usize);
        p
    }
    pub(super) fn recv(comm: &RecvObj, r: RecvRequest) -> *mut c_void {
        let p: *mut c_void = Box::into_raw(Box::new(Self {
            magic: REQ_MAGIC,
            kind: ReqKind::Recv(comm, r),
        }))
        .cast();
        comm.live.lock().insert(p as usize);
        p
    }
    /// Flush number `id` of the comm's [`Flusher`].
    pub(super) fn flush(comm: &RecvObj, id: u64) -> *mut c_void {
        let p: *mut c_void = Box::into_raw(Box::new(Self {
            magic: REQ_MAGIC,
            kind: ReqKind::Flush(comm, id),
        }))
        .cast();
        comm.live.lock().insert(p as usize);
        p
    }
}

fn to_int(s: usize) -> Result<c_int> {
    c_int::try_from(s)
        .map_err(|_| NetError::Internal(format!("size {s} does not fit test()'s int")))
}

/// Tests a request; see [`super::test`].
pub(super) unsafe fn test_request(
    p: *mut c_void,
    done: *mut c_int,
    sizes: *mut c_int,
) -> Result<()> {
    // SAFETY: forwarded contract.
    let req: &ReqObj = unsafe { check(p, REQ_MAGIC, "request")? };
    let mut buf = [0usize; crate::tcp::MAX_RECVS];
    let (live, outcome): (&Mutex<IntSet<usize>>, Result<Option<&[usize]>>) = match req.kind {
        ReqKind::Send(c, r) => {
            // SAFETY: a request's comm outlives it (close frees the requests first).
            let c = unsafe { &*c };
            let o = c.comm.test(r).map(|o| {
                o.map(|s| {
                    buf[0] = s;
                    &buf[..1]
                })
            });
            (&c.live, o)
        }
        ReqKind::Recv(c, r) => {
            // SAFETY: as above.
            let c = unsafe { &*c };
            let o = c.comm.test(r).map(|o| {
                o.map(|s| {
                    buf[..s.len()].copy_from_slice(&s);
                    &buf[..s.len()]
                })
            });
            (&c.live, o)
        }
        ReqKind::Flush(c, id) => {
            // SAFETY: as above.
            let c = unsafe { &*c };
            let o = match c.flush.get() {
                Some(f) => f.test(id).map(|d| d.then_some(&buf[..0])),
                None => Err(NetError::Internal(
                    "flush request without a flush QP".into(),
                )),
            };
            (&c.live, o)
        }
    };
    let finished = !matches!(outcome, Ok(None));
    let result = match outcome {
        Ok(Some(v)) => v.iter().try_for_each(|&s| to_int(s).map(|_| ())).map(|()| {
            if !sizes.is_null() {
                for (i, &s) in v.iter().enumerate() {
                    // SAFETY: NCCL's sizes array holds an entry per buffer; checked to fit.
                    unsafe { *sizes.add(i) = s as c_int };
                }
            }
            // SAFETY: non-NULL (checked by the caller).
            unsafe { *done = 1 };
        }),
        Ok(None) => Ok(()),
        Err(e) => Err(e),
    };
    if finished {
        live.lock().remove(&(p as usize));
        // SAFETY: checked above; the request is finished and NCCL drops it.
        drop(unsafe { free::<ReqObj>(p) });
    }
    result
}
