//! The calling thread's open group: one struct for its nesting depth and
//! everything it queued (communicator inits, device calls, host jobs), and
//! the communicators it claimed (see `comm::owner`).
//!
//! Groups nest per thread, as in NCCL. The outermost end runs what was
//! queued: the inits in parallel, then the device calls as one batch on the
//! GPU path, then every communicator's host jobs in one `drive` loop, so
//! sends and receives of one group never deadlock whatever their order.

use std::cell::RefCell;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use super::run::{self, Init, Pending};
use super::Call;
use crate::comm::Comm;
use crate::error::{Error, Result};
use crate::exec::Job;

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
    /// Communicators this thread claimed for the group.
    held: Vec<Arc<Comm>>,
    /// How many host jobs the thread's last group queued: the room the
    /// next group's list starts with, so a loop of large groups does not
    /// regrow it every time.
    host_hint: usize,
}

impl Group {
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
    let mut g = GROUP.with(|g| {
        let mut g = g.borrow_mut();
        let hint = g.host.len();
        let taken = std::mem::take(&mut *g);
        g.host_hint = hint;
        taken
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
    r
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

/// Runs `f` over the host jobs the open group queued (for
/// `ncclGroupSimulateEnd`).
pub fn with_queued<R>(f: impl FnOnce(&[(&Comm, &Job)]) -> R) -> R {
    GROUP.with(|g| {
        let g = g.borrow();
        let v: Vec<(&Comm, &Job)> = g.host.iter().map(|p| (&*p.comm, &p.job)).collect();
        f(&v)
    })
}

/// Queues a host job for the group's end.
pub(super) fn push_host(p: Pending) {
    /// The least room made for the first job of a group: its list is
    /// taken at the group's end, so a group of many calls would otherwise
    /// regrow it.
    const FIRST: usize = 64;
    GROUP.with(|g| {
        let g = &mut *g.borrow_mut();
        if g.host.capacity() == 0 {
            g.host.reserve(FIRST.max(g.host_hint));
        }
        g.host.push(p);
    });
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
