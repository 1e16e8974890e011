//! Asynchronous events of the opened devices: read without blocking (the
//! context's async fd is made non-blocking) from the comms' progress, logged
//! at WARN; QP errors fail the comms that own the QP, a port going down
//! fails the comms on that port (until it is active again, new comms on it
//! fail too), a fatal device error fails every comm on the device.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;

use super::ffi::{self, ibv_context, Verbs};

struct Watched {
    ctx: usize,
    name: String,
}

static CTXS: Mutex<Vec<Watched>> = Mutex::new(Vec::new());
/// QP numbers (per device name) that an async event has failed.
static FAILED_QPS: Mutex<Option<HashSet<(String, u32)>>> = Mutex::new(None);
static FATAL_DEVS: Mutex<Vec<String>> = Mutex::new(Vec::new());
/// Ports (device name, port number) that are down.
static DOWN_PORTS: Mutex<Vec<(String, u8)>> = Mutex::new(Vec::new());
/// Bumped on every failing event, so comms re-check only when it moves.
pub(crate) static GENERATION: AtomicU64 = AtomicU64::new(0);

const EV_CQ_ERR: u32 = 0;
const EV_QP_FATAL: u32 = 1;
const EV_QP_REQ_ERR: u32 = 2;
const EV_QP_ACCESS_ERR: u32 = 3;
const EV_DEVICE_FATAL: u32 = 8;
const EV_PORT_ACTIVE: u32 = 9;
const EV_PORT_ERR: u32 = 10;

/// Starts watching a context's events.
pub(crate) fn watch(_v: &Verbs, ctx: *mut ibv_context) {
    // SAFETY: a live context; the fd belongs to it.
    let fd = unsafe { (*ctx).async_fd };
    // SAFETY: fcntl on the context's own fd.
    unsafe {
        let fl = libc::fcntl(fd, libc::F_GETFL);
        if fl >= 0 {
            libc::fcntl(fd, libc::F_SETFL, fl | libc::O_NONBLOCK);
        }
    }
    // SAFETY: a live context; its device is live.
    let name = unsafe {
        let v = ffi::verbs().ok();
        v.map(|v| {
            std::ffi::CStr::from_ptr((v.get_device_name)((*ctx).device))
                .to_string_lossy()
                .into_owned()
        })
    }
    .unwrap_or_default();
    CTXS.lock().push(Watched {
        ctx: ctx as usize,
        name,
    });
}

/// Reads every pending event of every watched context.
pub(crate) fn poll() {
    let Ok(v) = ffi::verbs() else { return };
    let ctxs = CTXS.lock();
    for w in ctxs.iter() {
        loop {
            let mut ev = ffi::ibv_async_event {
                element: std::ptr::null_mut(),
                event_type: 0,
            };
            // SAFETY: a live context with a non-blocking async fd.
            if unsafe { (v.get_async_event)(w.ctx as *mut _, &mut ev) } != 0 {
                break;
            }
            let what = v.event_str(ev.event_type);
            match ev.event_type {
                EV_QP_FATAL | EV_QP_REQ_ERR | EV_QP_ACCESS_ERR => {
                    // SAFETY: for QP events the element is the QP.
                    let qpn = unsafe { (*(ev.element as *mut ffi::ibv_qp)).qp_num };
                    tracing::warn!(target: "hetccl::NET", "NET/IB: {}: async event {what} on QP {qpn}", w.name);
                    FAILED_QPS
                        .lock()
                        .get_or_insert_with(HashSet::new)
                        .insert((w.name.clone(), qpn));
                    GENERATION.fetch_add(1, Ordering::AcqRel);
                }
                EV_DEVICE_FATAL => {
                    tracing::warn!(target: "hetccl::NET", "NET/IB: {}: async event {what}", w.name);
                    FATAL_DEVS.lock().push(w.name.clone());
                    GENERATION.fetch_add(1, Ordering::AcqRel);
                }
                EV_PORT_ERR | EV_PORT_ACTIVE => {
                    // For port events the union holds the port number (an int).
                    let port = (ev.element as usize & 0xff) as u8;
                    let mut down = DOWN_PORTS.lock();
                    down.retain(|d| *d != (w.name.clone(), port));
                    if ev.event_type == EV_PORT_ERR {
                        tracing::warn!(target: "hetccl::NET",
                            "NET/IB: {}:{port}: async event {what}: its connections fail", w.name);
                        down.push((w.name.clone(), port));
                        GENERATION.fetch_add(1, Ordering::AcqRel);
                    } else {
                        tracing::info!(target: "hetccl::NET", "NET/IB: {}:{port}: async event {what}", w.name);
                    }
                }
                EV_CQ_ERR => {
                    tracing::warn!(target: "hetccl::NET", "NET/IB: {}: async event {what}", w.name);
                }
                _ => {
                    tracing::info!(target: "hetccl::NET", "NET/IB: {}: async event {what}", w.name);
                }
            }
            // SAFETY: the event just read.
            unsafe { (v.ack_async_event)(&mut ev) };
        }
    }
}

/// Why a comm on port `port` of `dev` with QPs `qpns` must fail, if an
/// event said so.
pub(crate) fn failure(dev: &str, port: u8, qpns: &[u32]) -> Option<String> {
    if FATAL_DEVS.lock().iter().any(|d| d == dev) {
        return Some(format!("device {dev} reported a fatal error"));
    }
    if DOWN_PORTS
        .lock()
        .iter()
        .any(|(d, p)| d == dev && *p == port)
    {
        return Some(format!("port {dev}:{port} went down (async event)"));
    }
    let g = FAILED_QPS.lock();
    let set = g.as_ref()?;
    qpns.iter()
        .find(|&&q| set.contains(&(dev.to_string(), q)))
        .map(|q| format!("async error event on {dev} QP {q}"))
}
