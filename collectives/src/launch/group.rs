//! The calling thread's open group: one struct for its nesting depth and
//! everything it queued (communicator inits, device calls, host jobs), and
//! the communicators it claimed (see `comm::owner`).
//!
//! Groups nest per thread, as in NCCL. The outermost end runs what was
//! queued: the inits in parallel, then the device calls as one batch on the
//! GPU path, then every communicator's host jobs in one `drive` loop, so
//! sends and receives of one group never deadlock whatever their order.
//! Point-to-point calls on host buffers queue as runs (`p2p_run`), which
//! become jobs in their place among a communicator's jobs.

use std::cell::RefCell;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use super::p2p_run::{self, Run, RunCall};
use super::run::{self, Init, Pending};
use super::{Call, P2p};
use crate::algo::{Algorithm, Collective};
use crate::comm::Comm;
use crate::error::{Error, Result};

/// The deepest nesting accepted: deeper is surely a missing group end.
const MAX_DEPTH: u32 = 1 << 16;

/// What one thread's open group holds.
#[derive(Default)]
struct Group {
    /// Nesting depth; 0 outside any group.
    depth: u32,
    /// Communicator inits, run first and concurrently.
    inits: Vec<Init>,
    /// Calls on device buffers, staged or run by the GPU path as one batch.
    device: Vec<Call>,
    /// Host jobs, run together.
    host: Vec<Pending>,
    /// Open point-to-point runs, at most one per communicator: each
    /// becomes a host job when its communicator queues another job, or at
    /// the group's end.
    runs: Vec<Run>,
    /// Communicators this thread claimed for the group.
    held: Vec<Arc<Comm>>,
    /// How many host jobs the thread's last group queued: the room the
    /// next group's list starts with, so a loop of large groups does not
    /// regrow it every time.
    host_hint: usize,
    /// How many calls the longest run of the thread's last group held:
    /// the room a new run starts with.
    run_hint: usize,
}

impl Group {
    /// Makes `comm`'s open run a host job (it goes before what `comm`
    /// queues next).
    fn close_run(&mut self, comm: &Arc<Comm>) -> Result<()> {
        if let Some(i) = self.runs.iter().position(|r| Arc::ptr_eq(&r.comm, comm)) {
            let r = self.runs.swap_remove(i);
            self.push(r.into_pending()?);
        }
        Ok(())
    }

    /// Makes every open run a host job.
    fn close_runs(&mut self) -> Result<()> {
        let mut first_err = None;
        for r in std::mem::take(&mut self.runs) {
            match r.into_pending() {
                Ok(p) => self.push(p),
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        first_err.map_or(Ok(()), Err)
    }

    /// Queues a host job.
    fn push(&mut self, p: Pending) {
        /// The least room made for the first job of a group: its list is
        /// taken at the group's end, so a group of many calls would
        /// otherwise regrow it.
        const FIRST: usize = 64;
        if self.host.capacity() == 0 {
            self.host.reserve(FIRST.max(self.host_hint));
        }
        self.host.push(p);
    }

    fn release_held(&mut self) {
        for c in self.held.drain(..) {
            c.owner.release();
        }
    }
}

thread_local! {
    static GROUP: RefCell<Group> = RefCell::new(Group::default());
}

/// Threads with a group open. While it is 0 no thread is inside a group,
/// so an ungrouped call learns its depth without a thread-local lookup (a
/// call into the dynamic loader in a shared library). A thread counts
/// itself before its own later calls read the counter, so it always sees
/// its own group.
static OPEN: AtomicUsize = AtomicUsize::new(0);

/// The current group nesting depth of this thread.
pub fn depth() -> u32 {
    if OPEN.load(Ordering::Relaxed) == 0 {
        return 0;
    }
    GROUP.with(|g| g.borrow().depth)
}

/// Opens a group (one level deeper).
pub fn start() -> Result<()> {
    GROUP.with(|g| {
        let mut g = g.borrow_mut();
        if g.depth >= MAX_DEPTH {
            return Err(Error::usage(format!(
                "groups nested deeper than {MAX_DEPTH}"
            )));
        }
        if g.depth == 0 {
            OPEN.fetch_add(1, Ordering::Relaxed);
        }
        g.depth += 1;
        Ok(())
    })
}

/// Closes one level; the outermost close runs what the group queued.
pub fn end() -> Result<()> {
    let outermost = GROUP.with(|g| {
        let mut g = g.borrow_mut();
        match g.depth {
            0 => Err(Error::usage(
                "ncclGroupEnd without a matching ncclGroupStart",
            )),
            n => {
                g.depth = n - 1;
                if n == 1 {
                    OPEN.fetch_sub(1, Ordering::Relaxed);
                }
                Ok(n == 1)
            }
        }
    })?;
    if !outermost {
        return Ok(());
    }
    let (mut g, closed) = GROUP.with(|g| {
        let mut g = g.borrow_mut();
        let run_hint = g.runs.iter().map(|r| r.calls().len()).max().unwrap_or(0);
        let closed = g.close_runs();
        let hint = g.host.len();
        let taken = std::mem::take(&mut *g);
        g.host_hint = hint;
        g.run_hint = run_hint;
        (taken, closed)
    });
    let held = std::mem::take(&mut g.held);
    let r = run::run_inits(g.inits)
        .and_then(|()| {
            if g.device.is_empty() {
                Ok(())
            } else {
                crate::gpu::enqueue(g.device)
            }
        })
        .and_then(|()| {
            if g.host.is_empty() {
                Ok(())
            } else {
                run::run(super::few::Few::Many(g.host))
            }
        });
    for c in held {
        c.owner.release();
    }
    // A run that could not become a job (its communicator has no engine)
    // is reported; the rest of the group ran as its peers' did.
    closed.and(r)
}

/// Closes one level without running anything: the outermost close drops
/// what the group queued (`ncclGroupSimulateEnd`). Returns whether it was
/// the outermost.
pub fn end_discarding() -> Result<bool> {
    GROUP.with(|g| {
        let mut g = g.borrow_mut();
        match g.depth {
            0 => Err(Error::usage(
                "ncclGroupEnd without a matching ncclGroupStart",
            )),
            1 => {
                let mut old = std::mem::take(&mut *g);
                old.release_held();
                OPEN.fetch_sub(1, Ordering::Relaxed);
                Ok(true)
            }
            n => {
                g.depth = n - 1;
                Ok(false)
            }
        }
    })
}

/// One host call the open group queued, as the cost model sees it.
#[derive(Debug, Clone, Copy)]
pub struct Queued<'a> {
    /// Its communicator.
    pub comm: &'a Comm,
    /// The operation.
    pub kind: Collective,
    /// The algorithm its plan uses.
    pub algorithm: Algorithm,
    /// The larger of the bytes it reads and writes.
    pub bytes: usize,
}

/// Runs `f` over the host calls the open group queued (for
/// `ncclGroupSimulateEnd`).
pub fn with_queued<R>(f: impl FnOnce(&[Queued<'_>]) -> R) -> R {
    GROUP.with(|g| {
        let g = g.borrow();
        let mut v = Vec::new();
        fn run_calls<'a>(comm: &'a Comm, calls: &[RunCall], v: &mut Vec<Queued<'a>>) {
            v.extend(calls.iter().map(|c| Queued {
                comm,
                kind: c.kind,
                algorithm: Algorithm::Direct,
                bytes: c.bytes,
            }));
        }
        for p in &g.host {
            if p.run.is_empty() {
                let plan = &p.job.plan;
                v.push(Queued {
                    comm: &p.comm,
                    kind: plan.collective,
                    algorithm: plan.algorithm,
                    bytes: plan.send_bytes.max(plan.recv_bytes),
                });
            } else {
                run_calls(&p.comm, &p.run, &mut v);
            }
        }
        for r in &g.runs {
            run_calls(&r.comm, r.calls(), &mut v);
        }
        f(&v)
    })
}

/// Queues a host job for the group's end, after the open run of its
/// communicator.
pub(super) fn push_host(p: Pending) -> Result<()> {
    GROUP.with(|g| {
        let g = &mut *g.borrow_mut();
        if !g.runs.is_empty() {
            g.close_run(&p.comm)?;
        }
        g.push(p);
        Ok(())
    })
}

/// Queues a send or receive on `handle` in this thread's open run of that
/// handle, without the lookup, claim and job of a full call: `check`
/// checks the call's arguments against the run's communicator. `None` when
/// no open group holds such a run, or the call is not one a run takes
/// (`p2p_run::takes`): the caller then takes the full path, which starts
/// or closes runs.
pub fn queue_in_run(handle: usize, check: impl FnOnce(&Comm) -> Result<P2p>) -> Option<Result<()>> {
    if OPEN.load(Ordering::Relaxed) == 0 || handle == 0 {
        return None;
    }
    GROUP.with(|g| {
        let g = &mut *g.borrow_mut();
        if g.depth == 0 {
            return None;
        }
        let run = g.runs.iter_mut().rev().find(|r| r.handle == handle)?;
        // SAFETY: the run's first call resolved `handle` with a full lookup.
        if !unsafe { crate::comm::handle::still_live(handle) } {
            return None;
        }
        let p = match check(&run.comm) {
            Ok(p) => p,
            Err(e) => return Some(Err(e)),
        };
        if !p2p_run::takes(&p, run.comm.rank) {
            return None;
        }
        Some(run.add(&p))
    })
}

/// Queues `p`, the point-to-point part of `a` (see `p2p_run::takes`),
/// made at tick `called`, in its communicator's open run.
pub(super) fn push_p2p(a: &Call, p: &P2p, called: u64) -> Result<()> {
    GROUP.with(|g| {
        let g = &mut *g.borrow_mut();
        // Usually the only run, or the last one opened.
        if let Some(r) = g
            .runs
            .iter_mut()
            .rev()
            .find(|r| Arc::ptr_eq(&r.comm, &a.comm))
        {
            return r.push(p, called);
        }
        let room = g.run_hint.max(16);
        g.runs.push(Run::start(&a.comm, a.handle, p, called, room)?);
        Ok(())
    })
}

/// Queues a call on device buffers for the group's end.
pub fn push_device(call: Call) {
    GROUP.with(|g| g.borrow_mut().device.push(call));
}

/// Runs a communicator init now, or queues it for the group's end.
pub fn submit_init(f: Init) -> Result<()> {
    if depth() > 0 {
        GROUP.with(|g| g.borrow_mut().inits.push(f));
        return Ok(());
    }
    f()
}

/// Runs `call` with `comm` claimed for the calling thread (see
/// `comm::owner`): until the call returns, or inside a group until it
/// ends. A second thread gets `ncclInvalidUsage`.
pub fn claim_for_call<R>(comm: &Arc<Comm>, call: impl FnOnce() -> Result<R>) -> Result<R> {
    let claim = comm.owner.claim(|| comm.describe())?;
    if depth() > 0 {
        if claim.is_fresh() {
            claim.keep();
            GROUP.with(|g| g.borrow_mut().held.push(comm.clone()));
        }
        return call();
    }
    let r = call();
    drop(claim);
    r
}

/// Runs several host calls as one group (the GPU path's staged batches):
/// the same as the caller wrapping them in a group of its own.
pub fn run_grouped(calls: &[Call]) -> Result<()> {
    start()?;
    let mut first_err = None;
    for c in calls {
        if let Err(e) = super::submit(c) {
            first_err.get_or_insert(e);
        }
    }
    // Whatever was queued runs, as the peers run theirs.
    let r = end();
    match first_err {
        Some(e) => Err(e),
        None => r,
    }
}
