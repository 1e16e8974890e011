//! Large collectives with one kernel copy per byte moved: ranks publish
//! their buffer addresses on their board's control line and read (or write)
//! each other's buffers with `process_vm_readv`/`process_vm_writev` (Linux
//! "cross memory attach"; a plain copy for ranks in the same process).
//!
//! Each operation `c` moves every rank's control line through stages
//! `(c << 8) | s`: 0 = addresses posted, 2 = finished with every peer's
//! buffers. A rank returns only once every rank reached stage 2, so nobody
//! touches a buffer its owner may already reuse, and nobody sees the
//! addresses of a later operation.
//!
//! - AllReduce: rank `r` reduces shard `r` of everybody's input into its own
//!   output, reading each peer's shard chunk by chunk into an L2-sized
//!   buffer, and writes each finished chunk, still in cache, into every
//!   peer's output. Per rank and byte of its shard: DRAM reads of its own
//!   input and the peer's, one write of its output and one into the peer's
//!   (the rings copy through shared memory twice more).
//! - ReduceScatter: the same without the writes to peers.
//! - AllGather: every rank copies every peer's input into place.
//! - Broadcast: every non-root copies the root's input.

use std::cell::RefCell;
use std::sync::atomic::Ordering;

use super::board::{Control, PROBE_VALUE};
use super::ntcopy;
use super::region;
use super::wait::Op;
use super::Node;
use crate::algo::Collective;
use crate::api::coll_args::CollArgs;
use crate::error::{Error, Result};
use crate::exec::watch::Watch;
use crate::reduce::{self, ReduceError, ReduceOp, Scalar};

/// Bytes read from a peer per call and reduced from cache.
const CHUNK: usize = 128 << 10;

/// Whether the single-copy path implements `kind`.
pub fn serves(kind: Collective) -> bool {
    matches!(
        kind,
        Collective::AllReduce
            | Collective::ReduceScatter
            | Collective::AllGather
            | Collective::Broadcast
    )
}

thread_local! {
    /// Chunk buffers: a peer's data, its pre-multiplied copy, and the
    /// reduced chunk (for non-temporal output).
    static BUFS: RefCell<(Vec<u8>, Vec<u8>, Vec<u8>)> =
        const { RefCell::new((Vec::new(), Vec::new(), Vec::new())) };
}

fn kernel(e: ReduceError) -> Error {
    Error::Internal(format!("reduction kernel: {e}"))
}

const STATE_YES: u8 = 1;
const STATE_NO: u8 = 2;

impl Node {
    /// Whether single-copy reads work between every pair of local ranks.
    /// The first call on each rank probes every peer (reads its probe word)
    /// and waits for every peer's verdict, so all ranks decide alike.
    pub(crate) fn copy_usable(&self, watch: &Watch, seq: u64) -> bool {
        match self.copy_state.load(Ordering::Relaxed) {
            STATE_YES => return true,
            STATE_NO => return false,
            _ => {} // not probed yet
        }
        let n = self.nranks();
        let mine_ok = (0..n).filter(|&k| k != self.me).all(|k| {
            let ctl = self.boards[k].control();
            let mut word = [0u8; 8];
            self.read(k, ctl.probe_addr.load(Ordering::Relaxed), &mut word)
                .is_ok()
                && u64::from_ne_bytes(word) == PROBE_VALUE
        });
        let ctl = self.boards[self.me].control();
        ctl.probe_ok.store(
            if mine_ok { STATE_YES } else { STATE_NO }.into(),
            Ordering::SeqCst,
        );
        self.wake_peers();
        let label = || "single-copy probe".to_string();
        let op = Op {
            label: &label,
            watch,
            seq,
        };
        let waited = self.wait(&op, || {
            (0..n).find(|&k| {
                k != self.me && self.boards[k].control().probe_ok.load(Ordering::Acquire) == 0
            })
        });
        let all_ok = waited.is_ok()
            && (0..n).all(|k| {
                self.boards[k].control().probe_ok.load(Ordering::Acquire) == u64::from(STATE_YES)
            });
        tracing::info!(target: "hetccl::INIT",
            "comm {:016x} rank {}: single-copy (process_vm_readv) between local ranks: {}",
            self.comm_hash, self.me, if all_ok { "yes" } else { "no" });
        self.copy_state
            .store(if all_ok { STATE_YES } else { STATE_NO }, Ordering::Relaxed);
        all_ok
    }

    /// Copies `dst.len()` bytes at `addr` in local rank `k`'s address space.
    fn read(&self, k: usize, addr: u64, dst: &mut [u8]) -> Result<()> {
        if let Some(p) = self.peer_view(k, addr, dst.len()) {
            // SAFETY: the peer's buffer (same process, or mapped) holds
            // `dst.len()` bytes at `p` and stays valid until the peer reaches
            // the final stage, which it does only after this rank's reads.
            let src = unsafe { std::slice::from_raw_parts(p.cast_const(), dst.len()) };
            copy_out(dst, src);
            return Ok(());
        }
        let pid = self.boards[k].control().pid.load(Ordering::Relaxed) as libc::pid_t;
        let mut done = 0usize;
        while done < dst.len() {
            let local = libc::iovec {
                // SAFETY: inside `dst`.
                iov_base: unsafe { dst.as_mut_ptr().add(done) }.cast(),
                iov_len: dst.len() - done,
            };
            let remote = libc::iovec {
                iov_base: (addr as usize + done) as *mut libc::c_void,
                iov_len: dst.len() - done,
            };
            // SAFETY: the local iovec covers writable memory of `dst`; the
            // kernel checks the remote one.
            let r = unsafe { libc::process_vm_readv(pid, &local, 1, &remote, 1, 0) };
            if r < 0 {
                let err = std::io::Error::last_os_error();
                if err.kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(Error::Remote(format!(
                    "reading rank {}'s buffer (pid {pid}): {err}",
                    self.rank_of(k)
                )));
            }
            if r == 0 {
                return Err(Error::Remote(format!(
                    "reading rank {}'s buffer (pid {pid}): no progress",
                    self.rank_of(k)
                )));
            }
            done += r as usize;
        }
        Ok(())
    }

    /// Copies `src` to `addr` in local rank `k`'s address space.
    fn write(&self, k: usize, addr: u64, src: &[u8]) -> Result<()> {
        if let Some(p) = self.peer_view(k, addr, src.len()) {
            // SAFETY: the peer's buffer (same process, or mapped) holds
            // `src.len()` bytes at `p`, which only this rank writes now.
            unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), p, src.len()) };
            return Ok(());
        }
        let pid = self.boards[k].control().pid.load(Ordering::Relaxed) as libc::pid_t;
        let mut done = 0usize;
        while done < src.len() {
            let local = libc::iovec {
                // SAFETY: inside `src` (the kernel only reads it).
                iov_base: unsafe { src.as_ptr().add(done) }.cast_mut().cast(),
                iov_len: src.len() - done,
            };
            let remote = libc::iovec {
                iov_base: (addr as usize + done) as *mut libc::c_void,
                iov_len: src.len() - done,
            };
            // SAFETY: the local iovec covers readable memory of `src`; the
            // kernel checks the remote one.
            let r = unsafe { libc::process_vm_writev(pid, &local, 1, &remote, 1, 0) };
            if r < 0 {
                let err = std::io::Error::last_os_error();
                if err.kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(Error::Remote(format!(
                    "writing rank {}'s buffer (pid {pid}): {err}",
                    self.rank_of(k)
                )));
            }
            if r == 0 {
                return Err(Error::Remote(format!(
                    "writing rank {}'s buffer (pid {pid}): no progress",
                    self.rank_of(k)
                )));
            }
            done += r as usize;
        }
        Ok(())
    }

    /// Publishes this rank's stage `s` of operation `c` and wakes peers.
    fn set_stage(&self, c: u64, s: u64) {
        self.boards[self.me]
            .control()
            .stage
            .store((c << 8) | s, Ordering::SeqCst);
        self.wake_peers();
    }

    /// Waits until every rank in `ranks` reached stage `s` of operation `c`.
    fn wait_stage(
        &self,
        c: u64,
        s: u64,
        op: &Op<'_>,
        ranks: impl Iterator<Item = usize> + Clone,
    ) -> Result<()> {
        let want = (c << 8) | s;
        self.wait(op, || {
            ranks.clone().find(|&k| {
                k != self.me && self.boards[k].control().stage.load(Ordering::Acquire) < want
            })
        })
    }
}

/// Copies into an output buffer: large copies with non-temporal stores
/// (about 1.35x glibc's memcpy at 32 MiB on the reference VM: the output
/// lines are not read first).
fn copy_out(dst: &mut [u8], src: &[u8]) {
    if dst.len() >= ntcopy::NT_MIN_BYTES / 2 {
        // SAFETY: `dst` is a distinct buffer of `src.len()` bytes.
        unsafe { ntcopy::copy(dst.as_mut_ptr(), src) }
    } else {
        dst.copy_from_slice(src);
    }
}

/// Byte range of shard `k` of `count` elements of `elem` bytes over `n`.
fn shard(count: usize, elem: usize, n: usize, k: usize) -> (usize, usize) {
    let (q, r) = (count / n, count % n);
    let lo = k * q + k.min(r);
    let hi = lo + q + usize::from(k < r);
    (lo * elem, hi * elem)
}

/// `op` as rank `k` runs it: with `k`'s published scalar for PreMulSum.
fn peer_op(node: &Node, k: usize, op: ReduceOp, dt: hetccl_abi::DataType) -> ReduceOp {
    match op {
        ReduceOp::PreMulSum(_) => {
            let raw = node.boards[k].control().scalar.load(Ordering::Relaxed);
            Scalar::from_bytes(dt, &raw.to_le_bytes()).map_or(op, ReduceOp::PreMulSum)
        }
        other => other,
    }
}

/// `out = op(mine, peers' [off, off + out.len()) of their `send`)`, chunk
/// by chunk through the thread's chunk buffers. `mine` points to this
/// rank's `out.len()` input bytes, which may be `out` itself (in place).
/// With `push`, each finished chunk is also written, while it is in cache,
/// to the same offset of every peer's `recv` (AllReduce).
fn reduce_from_peers(
    node: &Node,
    a: &CollArgs,
    op: ReduceOp,
    mine: *const u8,
    out: &mut [u8],
    off: usize,
    push: bool,
) -> Result<()> {
    let (dt, n) = (a.dtype, node.nranks());
    let pre = op.has_pre_op(dt);
    let in_place = std::ptr::eq(mine, out.as_ptr());
    // Large outputs: reduce each chunk in a cached buffer and write it out
    // (here and into the peers) with non-temporal stores, which skip the
    // read-for-ownership of every output line.
    // Not in place: there the output lines were just read (they are this
    // rank's input, and the peers' outputs are their inputs, read here),
    // and a non-temporal store to a cached line costs more than it saves.
    let nt = !in_place && out.len() * n >= ntcopy::NT_MIN_BYTES;
    BUFS.with(|b| {
        let (tmp, tmp2, acc_buf) = &mut *b.borrow_mut();
        for start in (0..out.len()).step_by(CHUNK) {
            let end = (start + CHUNK).min(out.len());
            let len = end - start;
            let o = &mut out[start..end];
            // SAFETY: the caller's input, disjoint from `out` unless in place
            // (then it is not read through this slice).
            let m =
                (!in_place).then(|| unsafe { std::slice::from_raw_parts(mine.add(start), len) });
            tmp.resize(len, 0);
            tmp2.resize(len, 0);
            let acc: &mut [u8] = if nt {
                acc_buf.resize(len, 0);
                if in_place {
                    acc_buf.copy_from_slice(o);
                }
                acc_buf
            } else {
                o
            };
            // `acc` holds this rank's input when `m` is None (in place).
            let mut first = true;
            if pre {
                match m {
                    Some(m) => reduce::pre_op(acc, m, dt, op, n as u32),
                    None => {
                        tmp2.copy_from_slice(acc);
                        reduce::pre_op(acc, tmp2, dt, op, n as u32)
                    }
                }
                .map_err(kernel)?;
                first = false;
            }
            for k in (0..n).filter(|&k| k != node.me) {
                let addr =
                    node.boards[k].control().send.load(Ordering::Relaxed) + (off + start) as u64;
                let src: &[u8] = match node.peer_view(k, addr, len) {
                    // SAFETY: the peer's input range, which nobody writes
                    // until this rank reaches the final stage (in place,
                    // only this rank writes it, after reading it here).
                    Some(p) => unsafe { std::slice::from_raw_parts(p.cast_const(), len) },
                    None => {
                        node.read(k, addr, tmp)?;
                        tmp
                    }
                };
                let r = if pre {
                    reduce::pre_op(tmp2, src, dt, peer_op(node, k, op, dt), n as u32)
                        .and_then(|()| reduce::reduce_into(acc, tmp2, dt, op))
                } else if let (true, Some(m)) = (first, m) {
                    reduce::reduce3(acc, m, src, dt, op)
                } else {
                    reduce::reduce_into(acc, src, dt, op)
                };
                r.map_err(kernel)?;
                first = false;
            }
            reduce::post_op(acc, dt, op, n as u32).map_err(kernel)?;
            let result: &[u8] = if nt {
                // SAFETY: `o` is this rank's output chunk, `acc` a separate
                // buffer of the same length.
                unsafe { ntcopy::copy(o.as_mut_ptr(), acc_buf) };
                acc_buf
            } else {
                o
            };
            if push {
                for k in (0..n).filter(|&k| k != node.me) {
                    let addr = node.boards[k].control().recv.load(Ordering::Relaxed)
                        + (off + start) as u64;
                    match node.peer_view(k, addr, len) {
                        // SAFETY: shard `me` of the peer's output, which
                        // only this rank writes.
                        Some(p) if nt => unsafe { ntcopy::copy(p, result) },
                        _ => node.write(k, addr, result)?,
                    }
                }
            }
        }
        Ok(())
    })
}

/// Runs one large collective (`serves` and `copy_usable` returned true).
pub fn run(node: &Node, a: &CollArgs, op: ReduceOp, trace: u64, watch: &Watch) -> Result<()> {
    let n = node.nranks();
    let me = node.me;
    let elem = a.dtype.size();
    let bytes = a.count * elem;
    let c = node.copy_seq.fetch_add(1, Ordering::Relaxed) + 1;
    let what = || {
        format!(
            "{} seq {trace} trace {:016x}-{trace} ({bytes} B, single-copy)",
            a.kind, node.comm_hash
        )
    };
    let ctl = node.boards[me].control();
    ctl.send.store(a.send as u64, Ordering::Relaxed);
    ctl.recv.store(a.recv as u64, Ordering::Relaxed);
    if let ReduceOp::PreMulSum(s) = op {
        let mut raw = [0u8; 8];
        raw[..a.dtype.size()].copy_from_slice(s.bytes(a.dtype));
        ctl.scalar.store(u64::from_le_bytes(raw), Ordering::Relaxed);
    }
    Control::publish(
        &ctl.send_region,
        region::find(a.send as usize, a.send_bytes),
    );
    Control::publish(
        &ctl.recv_region,
        region::find(a.recv as usize, a.recv_bytes),
    );
    node.set_stage(c, 0);
    let all = 0..n;
    let wop = Op {
        label: &what,
        watch,
        seq: trace,
    };
    node.wait_stage(c, 0, &wop, all.clone())?;
    let send = a.send.cast::<u8>();
    let recv = a.recv.cast::<u8>();
    match a.kind {
        Collective::AllReduce => {
            // Rank `me` alone reads shard `me` of every input and writes
            // shard `me` of every output (its own and, pushed, its peers'),
            // so in-place buffers are safe.
            let (lo, hi) = shard(a.count, elem, n, me);
            // SAFETY: validated: both buffers hold `bytes`.
            let out = unsafe { std::slice::from_raw_parts_mut(recv.add(lo), hi - lo) };
            // SAFETY: inside the validated `send`.
            reduce_from_peers(node, a, op, unsafe { send.add(lo) }, out, lo, true)?;
        }
        Collective::ReduceScatter => {
            let lo = me * bytes;
            // SAFETY: validated: `recv` holds bytes.
            let out = unsafe { std::slice::from_raw_parts_mut(recv, bytes) };
            // SAFETY: inside the validated `send` (n × bytes).
            reduce_from_peers(node, a, op, unsafe { send.add(lo) }, out, lo, false)?;
        }
        Collective::AllGather => {
            for k in 0..n {
                // SAFETY: block `k` of the n × bytes output.
                let dst = unsafe { std::slice::from_raw_parts_mut(recv.add(k * bytes), bytes) };
                if k == me {
                    if !std::ptr::eq(send, dst.as_ptr()) {
                        // SAFETY: validated: `send` holds `bytes`.
                        copy_out(dst, unsafe { std::slice::from_raw_parts(send, bytes) });
                    }
                } else {
                    let addr = node.boards[k].control().send.load(Ordering::Relaxed);
                    node.read(k, addr, dst)?;
                }
            }
        }
        Collective::Broadcast => {
            // SAFETY: validated: `recv` holds `bytes`.
            let dst = unsafe { std::slice::from_raw_parts_mut(recv, bytes) };
            if me != a.root {
                let addr = node.boards[a.root].control().send.load(Ordering::Relaxed);
                node.read(a.root, addr, dst)?;
            } else if !std::ptr::eq(send, recv.cast_const()) {
                // SAFETY: validated: `send` holds `bytes`.
                copy_out(dst, unsafe { std::slice::from_raw_parts(send, bytes) });
            }
        }
        other => return Err(Error::Internal(format!("single-copy cannot run {other}"))),
    }
    node.set_stage(c, 2);
    node.wait_stage(c, 2, &wop, all)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_cover_the_buffer_in_order() {
        for (count, n) in [(10, 3), (1, 4), (1 << 20, 2), (7, 7), (0, 2)] {
            let mut next = 0;
            for k in 0..n {
                let (lo, hi) = shard(count, 4, n, k);
                assert_eq!(lo, next);
                assert!(hi >= lo && hi - lo <= (count / n + 1) * 4);
                next = hi;
            }
            assert_eq!(next, count * 4);
        }
    }
}
