//! Host staging of calls on CUDA memory, run by the GPU proxy thread on its
//! own stream: the inputs are copied into pinned host buffers, the host
//! engine runs the calls ([`crate::launch::submit`]), the outputs are
//! copied back, and the stream is synchronised before the proxy releases
//! the user's stream. Calls on pinned host memory skip the copies: the host
//! engine works on the user's buffers (after the stream reached the call).
//!
//! Large AllReduce, Broadcast and Reduce calls are cut into pieces of
//! [`PIECE`] bytes, each a host call of its own over its element range.
//! Alone in its batch, such a call is pipelined: every piece's input copy is
//! queued at once, each with an event, and the host engine reduces or sends
//! piece `i` (over shared memory or the network) while the copy engine still
//! moves the later ones; each piece's output copy is queued as soon as it is
//! done. Every rank cuts a call the same way, grouped or not, so all ranks
//! run the same sequence of host calls.

use std::ffi::c_void;
use std::sync::atomic::Ordering;
use std::time::Duration;

use hetccl_abi::NcclResult;

use super::driver::{self, cu};
use super::gdr::InPlace;
use super::memory::Placement;
use super::pinned::Pinned;
use crate::algo::Collective;
use crate::error::{Error, Result};
use crate::launch::Call;
use crate::launch::{self, group};
use crate::user_ptr::UserPtr;

/// Bytes of one piece of a cut call.
pub const PIECE: usize = 1 << 20;

/// A CUDA event, destroyed on drop.
pub(super) struct Event(pub(super) cu::CUevent);

impl Event {
    /// A new event without timing.
    pub(super) fn new() -> Result<Event> {
        let mut e: cu::CUevent = std::ptr::null_mut();
        let flags = cu::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32;
        // SAFETY: a writable slot; a context is current.
        driver::check(unsafe { cu::cuEventCreate(&mut e, flags) }, "cuEventCreate")?;
        Ok(Event(e))
    }

    /// Records the event on `stream`.
    pub(super) fn record(&self, stream: cu::CUstream) -> Result<()> {
        // SAFETY: a live event and a live stream.
        driver::check(
            unsafe { cu::cuEventRecord(self.0, stream) },
            "cuEventRecord",
        )
    }

    /// Waits until the event has passed.
    pub(super) fn wait(&self) -> Result<()> {
        // SAFETY: a live event.
        driver::check(
            unsafe { cu::cuEventSynchronize(self.0) },
            "cuEventSynchronize",
        )
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        // SAFETY: created by cuEventCreate; destroying a pending event is allowed.
        unsafe { cu::cuEventDestroy_v2(self.0) };
    }
}

/// Bytes copied back into the user's receive buffer.
fn recv_copy_bytes(a: &Call) -> usize {
    if a.recv.is_null() {
        0
    } else {
        a.recv_bytes
    }
}

/// Bytes copied from the user's send buffer.
fn send_copy_bytes(a: &Call) -> usize {
    if a.send.is_null() {
        0
    } else {
        a.send_bytes
    }
}

/// Bytes of the send buffer staged (none when it goes in place).
fn staged_send_bytes(a: &Call, ip: &InPlace) -> usize {
    if ip.send {
        0
    } else {
        send_copy_bytes(a)
    }
}

/// Bytes of the receive buffer staged (none when it goes in place).
fn staged_recv_bytes(a: &Call, ip: &InPlace) -> usize {
    if ip.recv {
        0
    } else {
        recv_copy_bytes(a)
    }
}

/// `cuMemcpyAsync` (unified addressing: any direction).
fn copy(dst: u64, src: u64, bytes: usize, stream: cu::CUstream) -> Result<()> {
    if bytes == 0 || dst == src {
        return Ok(());
    }
    // SAFETY: both ranges are valid for `bytes` (validated call, staging
    // buffer of that size); ordered on the proxy's stream.
    driver::check(
        unsafe { cu::cuMemcpyAsync(dst, src, bytes, stream) },
        "cuMemcpyAsync",
    )
}

/// Synchronises the proxy's stream.
pub(super) fn sync(stream: cu::CUstream) -> Result<()> {
    // SAFETY: the proxy's live stream.
    driver::check(
        unsafe { cu::cuStreamSynchronize(stream) },
        "cuStreamSynchronize",
    )
}

/// Allocates staging for `a`: the host-side call (same layout) and its
/// buffers. Overlapping send/receive ranges (in-place layouts) share one
/// buffer at the same offsets, so the host engine sees the same in-place
/// layout. A buffer that crosses its link in place (`ip`, GPUDirect RDMA)
/// keeps its device pointer and gets no staging.
fn host_args(a: &Call, ip: &InPlace) -> Result<(Call, Vec<Pinned>)> {
    if a.placement == Placement::PinnedHost {
        // The host engine reads and writes pinned memory where it lies.
        let host = Call {
            stream: UserPtr::NULL,
            placement: Placement::Host,
            ..a.clone()
        };
        return Ok((host, Vec::new()));
    }
    let (s, sb) = (a.send.addr(), staged_send_bytes(a, ip));
    let (r, rb) = (a.recv.addr(), staged_recv_bytes(a, ip));
    let overlap = sb > 0 && rb > 0 && s < r + rb && r < s + sb;
    let mut bufs = Vec::new();
    let (hs, hr): (*const c_void, *mut c_void) = if overlap {
        let lo = s.min(r);
        let hi = (s + sb).max(r + rb);
        let buf = Pinned::take(hi - lo)?;
        let base = buf.payload() as usize;
        bufs.push(buf);
        (
            (base + s - lo) as *const c_void,
            (base + r - lo) as *mut c_void,
        )
    } else {
        let mut one = |n: usize| -> Result<usize> {
            if n == 0 {
                return Ok(0);
            }
            let b = Pinned::take(n)?;
            let p = b.payload() as usize;
            bufs.push(b);
            Ok(p)
        };
        let hs = if ip.send { s } else { one(sb)? };
        let hr = if ip.recv { r } else { one(rb)? };
        (hs as *const c_void, hr as *mut c_void)
    };
    let host = Call {
        send: UserPtr::new(hs),
        recv: UserPtr::new(hr),
        stream: UserPtr::NULL,
        placement: Placement::Host,
        ..a.clone()
    };
    Ok((host, bufs))
}

/// The element ranges `(first, count)` a call is cut into: pieces of
/// [`PIECE`] bytes for large AllReduce, Broadcast and Reduce calls (the
/// same buffers, element for element), else the whole call.
pub fn pieces(a: &Call) -> Vec<(usize, usize)> {
    let es = a.dtype.size();
    let per = (PIECE / es).max(1);
    let cuttable = matches!(
        a.kind,
        Collective::AllReduce | Collective::Broadcast | Collective::Reduce
    );
    if !cuttable || a.count < 2 * per {
        return vec![(0, a.count)];
    }
    (0..a.count)
        .step_by(per)
        .map(|first| (first, per.min(a.count - first)))
        .collect()
}

/// Piece `(first, n)` of the call `a` (device or host pointers alike), a
/// kind [`pieces`] cuts (its buffers hold `count` elements where used).
fn piece(a: &Call, (first, n): (usize, usize)) -> Call {
    if (first, n) == (0, a.count) {
        return a.clone();
    }
    let es = a.dtype.size();
    let at = |p: usize, bytes: usize| if bytes == 0 { p } else { p + first * es };
    Call {
        send: UserPtr::new(at(a.send.addr(), a.send_bytes) as *const c_void),
        recv: UserPtr::new(at(a.recv.addr(), a.recv_bytes) as *const c_void),
        count: n,
        send_bytes: if a.send_bytes == 0 { 0 } else { n * es },
        recv_bytes: if a.recv_bytes == 0 { 0 } else { n * es },
        ..a.clone()
    }
}

/// Runs host calls, one host group when there are several; waits for a
/// nonblocking communicator's helper thread.
fn run_host(calls: &[Call]) -> Result<()> {
    let r = if calls.len() == 1 {
        launch::submit(&calls[0])
    } else {
        group::run_grouped(calls)
    };
    match r {
        Err(Error::InProgress) => wait_nonblocking(calls),
        r => r,
    }
}

/// Stages the calls of one batch (their device pointers as the user passed
/// them) on `stream` and runs them; the stream is synchronised on return.
/// `chosen` (one per call, or empty: all staged) says which buffers cross
/// their verbs link in place ([`super::gdr`]): those are neither copied nor
/// staged, and receives into them are flushed after the run.
pub(super) fn run(calls: &[&Call], chosen: &[InPlace], stream: cu::CUstream) -> Result<()> {
    let staged = InPlace::default();
    let ip = |i: usize| chosen.get(i).unwrap_or(&staged);
    let mut hosts = Vec::with_capacity(calls.len());
    let mut bufs = Vec::new();
    for (i, a) in calls.iter().enumerate() {
        let (h, mut v) = host_args(a, ip(i))?;
        hosts.push(h);
        bufs.append(&mut v);
    }
    if calls.len() == 1 && pieces(calls[0]).len() > 1 {
        let r = pipeline(calls[0], &hosts[0], stream);
        // The stream may still read the staging buffers after an error.
        sync(stream)?;
        return r;
    }
    for (i, (a, h)) in calls.iter().zip(&hosts).enumerate() {
        copy(
            h.send.addr() as u64,
            a.send.addr() as u64,
            staged_send_bytes(a, ip(i)),
            stream,
        )?;
    }
    sync(stream)?;
    let host_calls: Vec<Call> = hosts
        .iter()
        .flat_map(|h| pieces(h).into_iter().map(move |p| piece(h, p)))
        .collect();
    run_host(&host_calls)?;
    super::gdr::flush(calls, chosen)?;
    for (i, (a, h)) in calls.iter().zip(&hosts).enumerate() {
        copy(
            a.recv.addr() as u64,
            h.recv.addr() as u64,
            staged_recv_bytes(a, ip(i)),
            stream,
        )?;
    }
    sync(stream)?;
    drop(bufs);
    Ok(())
}

/// One call cut into pieces, its copies overlapping the host engine's work.
fn pipeline(a: &Call, h: &Call, stream: cu::CUstream) -> Result<()> {
    let ps = pieces(a);
    let mut ready = Vec::with_capacity(ps.len());
    for &p in &ps {
        let (dev, host) = (piece(a, p), piece(h, p));
        copy(
            host.send.addr() as u64,
            dev.send.addr() as u64,
            send_copy_bytes(&dev),
            stream,
        )?;
        let e = Event::new()?;
        e.record(stream)?;
        ready.push(e);
    }
    for (&p, e) in ps.iter().zip(&ready) {
        e.wait()?;
        let (dev, host) = (piece(a, p), piece(h, p));
        run_host(std::slice::from_ref(&host))?;
        copy(
            dev.recv.addr() as u64,
            host.recv.addr() as u64,
            recv_copy_bytes(&dev),
            stream,
        )?;
    }
    Ok(())
}

/// Nonblocking communicators finish on the engine's helper thread; wait for
/// each comm's async state to settle.
fn wait_nonblocking(hosts: &[Call]) -> Result<()> {
    for h in hosts {
        loop {
            let st = h.comm.async_error.load(Ordering::Acquire);
            if st == NcclResult::InProgress.raw() {
                std::thread::sleep(Duration::from_micros(50));
                continue;
            }
            if st != 0 {
                return Err(Error::Remote(
                    format!("nonblocking device-buffer operation failed with ncclResult {st}")
                        .into(),
                ));
            }
            break;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_large_contiguous_calls_are_cut_and_pieces_cover_them() {
        let per = PIECE / 4;
        for (count, want) in [
            (0, 1),
            (1, 1),
            (2 * per - 1, 1),
            (2 * per, 2),
            (5 * per + 3, 6),
        ] {
            let got = cut(Collective::AllReduce, count);
            assert_eq!(got.len(), want, "count {count}");
            let mut next = 0;
            for (first, n) in got {
                assert_eq!(first, next);
                assert!(n > 0 || count == 0);
                next = first + n;
            }
            assert_eq!(next, count);
        }
        assert_eq!(cut(Collective::Broadcast, 4 * per).len(), 4);
        assert_eq!(cut(Collective::Reduce, 4 * per).len(), 4);
        assert_eq!(cut(Collective::AllGather, 4 * per).len(), 1);
        assert_eq!(cut(Collective::ReduceScatter, 4 * per).len(), 1);
    }

    #[test]
    fn a_call_that_is_not_cut_keeps_its_extents() {
        let comm = std::sync::Arc::new(crate::comm::Comm::new(4, 1));
        let a = Call {
            kind: Collective::AlltoAll,
            comm,
            send: UserPtr::new(64 as *const c_void),
            recv: UserPtr::new(64 as *const c_void),
            count: 10 * PIECE,
            dtype: hetccl_abi::DataType::Uint8,
            op: hetccl_abi::RedOp::Sum,
            root: 0,
            send_bytes: 40 * PIECE,
            recv_bytes: 40 * PIECE,
            stream: UserPtr::NULL,
            placement: Placement::Device(0),
            filter: None,
            handle: 0,
        };
        let ps = pieces(&a);
        assert_eq!(ps, vec![(0, a.count)]);
        let p = piece(&a, ps[0]);
        assert_eq!(
            (p.send_bytes, p.recv_bytes, p.count),
            (a.send_bytes, a.recv_bytes, a.count)
        );
    }

    /// `pieces` of a float32 call of `kind` over `count` elements.
    fn cut(kind: Collective, count: usize) -> Vec<(usize, usize)> {
        let comm = std::sync::Arc::new(crate::comm::Comm::new(2, 0));
        let a = Call {
            kind,
            comm,
            send: UserPtr::new(16 as *const c_void),
            recv: UserPtr::new(4096 as *const c_void),
            count,
            dtype: hetccl_abi::DataType::Float32,
            op: hetccl_abi::RedOp::Sum,
            root: 0,
            send_bytes: count * 4,
            recv_bytes: count * 4,
            stream: UserPtr::NULL,
            placement: Placement::Device(0),
            filter: None,
            handle: 0,
        };
        let ps = pieces(&a);
        for &p in &ps {
            let x = piece(&a, p);
            assert_eq!(x.send.addr(), 16 + p.0 * 4);
            assert_eq!(x.recv.addr(), 4096 + p.0 * 4);
            assert_eq!((x.count, x.send_bytes), (p.1, p.1 * 4));
        }
        ps
    }
}
