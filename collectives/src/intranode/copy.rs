//! Large collectives with one kernel copy per byte moved: ranks publish
//! their buffer addresses on their board's control line and read (or write)
//! each other's buffers with `process_vm_readv`/`process_vm_writev` (Linux
//! "cross memory attach"), or directly where they can see them (ranks in
//! the same process, `ncclMemAlloc` buffers mapped from their owner).
//!
//! Each operation `c` moves every rank's control line through stages
//! `(c << 8) | s`: 0 = addresses posted, 1 = no item left to claim. Once
//! every rank posted, the ranks claim and run the operation's items (see
//! [`super::work`]); a rank returns once the done counters of all ranks
//! add up to every item of the operation, so nobody touches a buffer its
//! owner may already reuse, and nobody sees the addresses of a later
//! operation. A rank that the scheduler keeps off a CPU only has to post
//! its addresses: the running ranks take over its share.
//!
//! With its addresses each rank posts the lengths of both buffers and the
//! call's shape ([`super::board::Extents`]). Before any item runs, every
//! rank checks that all ranks passed the same call and buffers that hold
//! what the operation reads and writes; otherwise every rank publishes stage
//! 1, waits for everyone's, and fails with `ncclInvalidUsage` (no item ran,
//! so the work counters stay where every rank expects them). Every access
//! to a peer's memory is checked once more against the peer's published
//! extent ([`Node::within`]).
use std::cell::Cell;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::board::{Control, PROBE_VALUE};
use super::elect;
use super::region;
use super::shape::{self, Shape};
use super::wait::Op;
use super::work::Job;
use super::Node;
use crate::algo::Collective;
use crate::error::{Error, Result};
use crate::exec::watch::Watch;
use crate::launch::Call;
use crate::reduce::ReduceOp;

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

/// How long a rank outside the workers lets the operation go without any
/// item finishing before it claims items itself.
const HELP_AFTER: Duration = Duration::from_millis(1);

const STATE_YES: u8 = 1;
const STATE_NO: u8 = 2;

/// Which of a peer's published buffers an access goes to: reads come from
/// send buffers, writes go to receive buffers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Side {
    /// The send buffer ([`Control::send`], [`Extents::send_len`]).
    Send,
    /// The receive buffer ([`Control::recv`], [`Extents::recv_len`]).
    Recv,
}

impl Node {
    /// Whether single-copy reads work between every pair of local ranks.
    /// The first call on each rank probes every peer (reads its probe word)
    /// and waits for every peer's verdict, so all ranks decide alike.
    /// `shape` is this rank's call ([`Shape::encode`]); a peer found in the
    /// board-slot operation of the same call instead (a smaller call) fails
    /// the call with `ncclInvalidUsage` rather than leaving both waiting. A
    /// peer that never gives its verdict fails the call at the stall limit
    /// (falling back to the rings would wait a second limit for it).
    pub(crate) fn copy_usable(&self, watch: &Watch, seq: u64, shape: [u64; 2]) -> Result<bool> {
        match self.copy_state.load(Ordering::Relaxed) {
            STATE_YES => return Ok(true),
            STATE_NO => return Ok(false),
            _ => {} // not probed yet
        }
        let n = self.nranks();
        // Published before `probe_ok`, for a peer that finds this rank here
        // while it waits in the board slots (see `Node::peer_in_copy`).
        for (w, v) in self.boards[self.me].extents().shape.iter().zip(shape) {
            w.store(v, Ordering::Relaxed);
        }
        let mine_ok = (0..n).filter(|&k| k != self.me).all(|k| self.probe(k));
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
        let verdict = |k: usize| self.boards[k].control().probe_ok.load(Ordering::Acquire);
        let other_path = Cell::new(None);
        let waited = self.wait(&op, || {
            for k in (0..n).filter(|&k| k != self.me) {
                if verdict(k) != 0 {
                    continue;
                }
                if self.peer_in_fast(k) && verdict(k) == 0 {
                    other_path.set(Some(k));
                    return None;
                }
                return Some(k);
            }
            None
        });
        if let Some(k) = other_path.get() {
            return Err(self.in_board_slots(k, shape));
        }
        waited?;
        let all_ok = (0..n).all(|k| verdict(k) == u64::from(STATE_YES));
        tracing::info!(target: "hetccl::INIT",
            "comm {:016x} rank {}: single-copy (process_vm_readv) between local ranks: {}",
            self.comm_hash, self.me, if all_ok { "yes" } else { "no" });
        self.copy_state
            .store(if all_ok { STATE_YES } else { STATE_NO }, Ordering::Relaxed);
        Ok(all_ok)
    }

    /// Whether this rank can read local rank `k`'s probe word (8 bytes at
    /// the address `k` published) and it holds [`PROBE_VALUE`].
    fn probe(&self, k: usize) -> bool {
        let ctl = self.boards[k].control();
        let addr = ctl.probe_addr.load(Ordering::Relaxed);
        let pid = ctl.pid.load(Ordering::Relaxed) as u32;
        if pid == self.pid {
            // The same process: the same static word.
            return addr == super::PROBE.as_ptr() as u64;
        }
        let mut word = [0u8; 8];
        cma(pid, addr, Io::Read(&mut word)).is_ok() && u64::from_ne_bytes(word) == PROBE_VALUE
    }

    /// Whether local rank `k` has posted a board-slot operation (or
    /// entered a broadcast) this rank has not. A rank in single-copy operation `c` that sees this of a
    /// peer that has not posted `c` (checked after this) knows the peer
    /// took the board slots for the same operation: a peer posts a later
    /// small operation only after finishing `c`.
    pub(super) fn peer_in_fast(&self, k: usize) -> bool {
        self.peer_in_fast_slots(k) || self.peer_in_bcast(k)
    }

    /// Whether local rank `k` has posted a full-exchange board-slot
    /// operation this rank has not.
    pub(super) fn peer_in_fast_slots(&self, k: usize) -> bool {
        self.boards[k].posted(self.fast_seq.load(Ordering::Relaxed) + 1)
    }

    /// The error of a call that local rank `k` runs through the board
    /// slots (or the broadcast ring) while this rank (call `shape`) runs it
    /// through single copy.
    fn in_board_slots(&self, k: usize, shape: [u64; 2]) -> Error {
        if !self.peer_in_fast_slots(k) {
            if let Some(theirs) = self.next_bcast_call(k) {
                return shape::disagree(
                    "single copy against broadcast ring",
                    k,
                    theirs,
                    self.me,
                    shape,
                );
            }
        }
        let s = self.fast_seq.load(Ordering::Relaxed) + 1;
        let (theirs, _) = self.boards[k].posted_shape(s);
        shape::disagree("single copy against board slots", k, theirs, self.me, shape)
    }

    /// Fails unless `[addr, addr + len)` lies inside the `side` buffer that
    /// local rank `k` published for its current single-copy operation
    /// (address on its control line, length on its extent line).
    pub(super) fn within(&self, k: usize, side: Side, addr: u64, len: usize) -> Result<()> {
        let (ctl, x) = (self.boards[k].control(), self.boards[k].extents());
        let (base, size) = match side {
            Side::Send => (
                ctl.send.load(Ordering::Relaxed),
                x.send_len.load(Ordering::Relaxed),
            ),
            Side::Recv => (
                ctl.recv.load(Ordering::Relaxed),
                x.recv_len.load(Ordering::Relaxed),
            ),
        };
        let end = addr.checked_add(len as u64);
        match (end, base.checked_add(size)) {
            (Some(end), Some(limit)) if addr >= base && end <= limit => Ok(()),
            _ => Err(Error::Internal(
                format!(
                    "single copy: {len} B at {addr:#x} lie outside rank {}'s {side:?} buffer \
                 ({size} B at {base:#x}); refused before any access",
                    self.rank_of(k)
                )
                .into(),
            )),
        }
    }

    /// Copies `dst.len()` bytes at `addr` of local rank `k`'s send buffer.
    pub(super) fn read(&self, k: usize, addr: u64, dst: &mut [u8]) -> Result<()> {
        if let Some(p) = self.peer_view(k, Side::Send, addr, dst.len())? {
            // SAFETY: inside rank k's published send buffer (checked by
            // `peer_view`), which (same process, or mapped) stays valid
            // until the peer reaches the final stage, which it does only
            // after this rank's reads.
            let src = unsafe { std::slice::from_raw_parts(p.cast_const(), dst.len()) };
            dst.copy_from_slice(src);
            return Ok(());
        }
        let pid = self.boards[k].control().pid.load(Ordering::Relaxed) as u32;
        cma(pid, addr, Io::Read(dst)).map_err(|e| {
            Error::Remote(
                format!("reading rank {}'s buffer (pid {pid}): {e}", self.rank_of(k)).into(),
            )
        })
    }

    /// Copies `src` to `addr` in local rank `k`'s receive buffer.
    pub(super) fn write(&self, k: usize, addr: u64, src: &[u8]) -> Result<()> {
        if let Some(p) = self.peer_view(k, Side::Recv, addr, src.len())? {
            // SAFETY: inside rank k's published receive buffer (checked by
            // `peer_view`; same process, or mapped), which only this rank
            // writes now.
            unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), p, src.len()) };
            return Ok(());
        }
        let pid = self.boards[k].control().pid.load(Ordering::Relaxed) as u32;
        cma(pid, addr, Io::Write(src)).map_err(|e| {
            Error::Remote(
                format!("writing rank {}'s buffer (pid {pid}): {e}", self.rank_of(k)).into(),
            )
        })
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

    /// Waits until every rank posted operation `c` (stage 0); `Err` when a
    /// rank turns out to run the same call through the board slots.
    fn wait_posted(&self, c: u64, op: &Op<'_>, shape: [u64; 2]) -> Result<()> {
        let want = c << 8;
        let stage = |k: usize| self.boards[k].control().stage.load(Ordering::Acquire);
        let other_path = Cell::new(None);
        self.wait(op, || {
            for k in (0..self.nranks()).filter(|&k| k != self.me) {
                if stage(k) >= want {
                    continue;
                }
                // Checked in this order: a peer posts `c` before it can
                // post a later small operation.
                if self.peer_in_fast(k) && stage(k) < want {
                    other_path.set(Some(k));
                    return None;
                }
                return Some(k);
            }
            None
        })?;
        match other_path.get() {
            Some(k) => Err(self.in_board_slots(k, shape)),
            None => Ok(()),
        }
    }

    /// Whether every rank posted the same call for `job` and buffers that
    /// hold what `job` reads and writes there (once every rank posted
    /// operation `c`): the error every rank returns when not. Every rank
    /// reads the same words: no rank leaves the operation before every rank
    /// has checked them, except after the operation ran (some item done),
    /// which means it passed the check, so a later operation's words read
    /// here then are ignored.
    fn agree(&self, job: &Job<'_>) -> Option<Error> {
        let n = self.nranks();
        let err = shape::check_all("single copy", n, |k| {
            Shape::load(&self.boards[k].extents().shape)
        })
        .or_else(|| job.check_extents());
        let ran = job.done() > self.done_base.load(Ordering::Relaxed);
        err.filter(|_| !ran)
    }
}

/// One cross-memory-attach transfer's direction and local buffer.
enum Io<'a> {
    Read(&'a mut [u8]),
    Write(&'a [u8]),
}

/// Moves the bytes of `io` from or to `addr` in process `pid` with
/// `process_vm_readv`/`process_vm_writev`, retrying partial transfers.
fn cma(pid: u32, addr: u64, mut io: Io<'_>) -> std::result::Result<(), String> {
    let len = match &io {
        Io::Read(d) => d.len(),
        Io::Write(s) => s.len(),
    };
    let mut done = 0usize;
    while done < len {
        let base = match &mut io {
            Io::Read(d) => d.as_mut_ptr(),
            Io::Write(s) => s.as_ptr().cast_mut(),
        };
        let local = libc::iovec {
            // SAFETY: inside the local buffer.
            iov_base: unsafe { base.add(done) }.cast(),
            iov_len: len - done,
        };
        let remote = libc::iovec {
            iov_base: (addr as usize + done) as *mut libc::c_void,
            iov_len: len - done,
        };
        // SAFETY: the local iovec covers memory of the local buffer (written
        // only for a read, which holds a mutable borrow); the kernel checks
        // the remote one.
        let r = unsafe {
            match io {
                Io::Read(_) => libc::process_vm_readv(pid as libc::pid_t, &local, 1, &remote, 1, 0),
                Io::Write(_) => {
                    libc::process_vm_writev(pid as libc::pid_t, &local, 1, &remote, 1, 0)
                }
            }
        };
        if r < 0 {
            let err = std::io::Error::last_os_error();
            if err.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(err.to_string());
        }
        if r == 0 {
            return Err("no progress".into());
        }
        done += r as usize;
    }
    Ok(())
}

/// Runs one large collective (`serves` and `copy_usable` returned true).
pub fn run(node: &Node, a: &Call, op: ReduceOp, trace: u64, watch: &Watch) -> Result<()> {
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
    let call = Shape::of(a);
    let shape = call.encode();
    let ctl = node.boards[me].control();
    ctl.send.store(a.send.addr() as u64, Ordering::Relaxed);
    ctl.recv.store(a.recv.addr() as u64, Ordering::Relaxed);
    let ext = node.boards[me].extents();
    ext.send_len.store(a.send_bytes as u64, Ordering::Relaxed);
    ext.recv_len.store(a.recv_bytes as u64, Ordering::Relaxed);
    call.store(&ext.shape);
    if let ReduceOp::PreMulSum(s) = op {
        let mut raw = [0u8; 8];
        raw[..a.dtype.size()].copy_from_slice(s.bytes(a.dtype));
        ctl.scalar.store(u64::from_le_bytes(raw), Ordering::Relaxed);
    }
    Control::publish(&ctl.send_region, region::find(a.send.addr(), a.send_bytes));
    Control::publish(&ctl.recv_region, region::find(a.recv.addr(), a.recv_bytes));
    if node.workers < n {
        ctl.cpu.store(elect::current_cpu(), Ordering::Relaxed);
    }
    node.set_stage(c, 0);
    let all = 0..n;
    let wop = Op {
        label: &what,
        watch,
        seq: trace,
    };
    node.wait_posted(c, &wop, shape)?;
    let job = Job::new(node, a, op);
    if let Some(e) = node.agree(&job) {
        // Every rank found the same; nobody leaves before everybody has
        // read the words it judged.
        node.set_stage(c, 1);
        node.wait_stage(c, 1, &wop, all)?;
        return Err(e);
    }
    let (target, done) = (job.target(), || job.done());
    let worker = node.workers >= n || {
        let cpus: Vec<u64> = (0..n)
            .map(|k| node.boards[k].control().cpu.load(Ordering::Relaxed))
            .collect();
        elect::is_worker(&cpus, node.workers, me)
    };
    if worker {
        job.run()?;
    } else {
        // More ranks than processing units, and a worker was on this
        // rank's CPU: leave the CPU to it, and take part only if no item
        // finishes for HELP_AFTER (a worker kept off its CPU). It yields
        // from the start: spinning would take the CPU from that worker.
        let mut last = (done(), Instant::now());
        node.wait_spinning(&wop, Duration::ZERO, || {
            let d = done();
            if d >= target {
                return None;
            }
            let now = Instant::now();
            if d != last.0 {
                last = (d, now);
            } else if now.duration_since(last.1) >= HELP_AFTER {
                return None;
            }
            Some((me + 1) % n)
        })?;
        if done() < target {
            job.run()?;
        }
    }
    node.set_stage(c, 1);
    let behind = (c << 8) | 1;
    let spin = if worker { node.spin } else { Duration::ZERO };
    node.wait_spinning(&wop, spin, || {
        if done() >= target {
            return None;
        }
        // Blame a rank that still claims or runs items; a rank's stage 1
        // is stored after its last done count, so if none is left behind,
        // the counters are complete now.
        let slow = (0..n)
            .find(|&k| k != me && node.boards[k].control().stage.load(Ordering::Acquire) < behind);
        match slow {
            Some(k) => Some(k),
            None if done() >= target => None,
            None => Some((me + 1) % n),
        }
    })?;
    job.finish();
    Ok(())
}
