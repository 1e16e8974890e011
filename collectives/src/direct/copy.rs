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
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::board::{Control, PROBE_VALUE};
use super::elect;
use super::region;
use super::wait::Op;
use super::work::Job;
use super::Node;
use crate::algo::Collective;
use crate::api::coll_args::CollArgs;
use crate::error::{Error, Result};
use crate::exec::watch::Watch;
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

impl Node {
    /// Whether single-copy reads work between every pair of local ranks.
    /// The first call on each rank probes every peer (reads its probe word)
    /// and waits for every peer's verdict, so all ranks decide alike. A
    /// peer that never gives its verdict fails the call (it is this
    /// operation's stall: falling back to the rings would wait a second
    /// stall limit for the same peer).
    pub(crate) fn copy_usable(&self, watch: &Watch, seq: u64) -> Result<bool> {
        match self.copy_state.load(Ordering::Relaxed) {
            STATE_YES => return Ok(true),
            STATE_NO => return Ok(false),
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
        self.wait(&op, || {
            (0..n).find(|&k| {
                k != self.me && self.boards[k].control().probe_ok.load(Ordering::Acquire) == 0
            })
        })?;
        let all_ok = (0..n).all(|k| {
            self.boards[k].control().probe_ok.load(Ordering::Acquire) == u64::from(STATE_YES)
        });
        tracing::info!(target: "hetccl::INIT",
            "comm {:016x} rank {}: single-copy (process_vm_readv) between local ranks: {}",
            self.comm_hash, self.me, if all_ok { "yes" } else { "no" });
        self.copy_state
            .store(if all_ok { STATE_YES } else { STATE_NO }, Ordering::Relaxed);
        Ok(all_ok)
    }

    /// Copies `dst.len()` bytes at `addr` in local rank `k`'s address space.
    pub(super) fn read(&self, k: usize, addr: u64, dst: &mut [u8]) -> Result<()> {
        if let Some(p) = self.peer_view(k, addr, dst.len()) {
            // SAFETY: the peer's buffer (same process, or mapped) holds
            // `dst.len()` bytes at `p` and stays valid until the peer reaches
            // the final stage, which it does only after this rank's reads.
            let src = unsafe { std::slice::from_raw_parts(p.cast_const(), dst.len()) };
            dst.copy_from_slice(src);
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
    pub(super) fn write(&self, k: usize, addr: u64, src: &[u8]) -> Result<()> {
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
    node.wait_stage(c, 0, &wop, all.clone())?;
    let job = Job::new(node, a, op);
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
        // finishes for HELP_AFTER (a worker kept off its CPU).
        let mut last = (done(), Instant::now());
        node.wait(&wop, || {
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
    node.wait(&wop, || {
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
