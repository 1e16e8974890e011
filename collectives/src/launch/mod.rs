//! The dispatch layer: from a validated call to running plans.
//!
//! The C API (`crate::api`) checks arguments and hands a [`Call`] to
//! [`submit`]. Outside a group, a blocking single-node call takes a direct
//! path (`crate::intranode`) when one serves it; otherwise the call becomes a
//! job (`job`: reduction, algorithm, plan) that runs at once on the calling
//! thread, or is queued by the thread's open group (`group`) until its
//! outermost end. A communicator in nonblocking mode returns
//! `ncclInProgress` and a helper thread finishes the work (`run`);
//! `ncclCommGetAsyncError` reports when it is done. A failed operation
//! poisons its communicator ([`poison`]).

mod call;
mod few;
pub mod group;
mod job;
mod p2p_run;
mod run;
mod scratch;

pub use call::{Call, P2p};
pub use group::{claim_for_call, queue_in_run, submit_init};
pub use job::{make_job, reduce_op};
pub(crate) use run::enter_exec;
pub use run::poison;

use crate::algo::Collective;
use crate::error::Result;

/// Runs (or queues, inside a group) one validated call on host buffers.
pub fn submit(a: &Call) -> Result<()> {
    let called = a
        .comm
        .engine
        .get()
        .map_or(0, |e| e.links.metrics.issue(a.kind));
    let grouped = group::depth() > 0;
    if !grouped {
        if let Some(r) = crate::intranode::try_run(a, called, || reduce_op(a)) {
            if let Err(e) = &r {
                poison(&a.comm, e);
            }
            return r;
        }
    } else if matches!(a.kind, Collective::Send | Collective::Recv) {
        let p = P2p::of(a);
        if p2p_run::takes(&p, a.comm.rank) {
            return group::push_p2p(a, &p, called);
        }
    }
    let job = make_job(a)?;
    let engine = a.comm.engine()?;
    let delay = engine
        .settings
        .test_delay
        .filter(|(algo, _)| *algo == job.plan.algorithm && !job.p2p)
        .map(|(_, d)| d);
    let p = run::Pending::new(a, job, called);
    if grouped {
        return group::push_host(p);
    }
    // Only online adaptation reads the call's time (two clock reads and a
    // lock otherwise spent on every call).
    let online = engine.control.tune() == hetccl_core::config::TuneMode::Online;
    let t0 = online.then(std::time::Instant::now);
    if let Some(d) = delay {
        // HETCCL_TEST_DELAY_US, a test hook: this algorithm is made slow.
        std::thread::sleep(d);
    }
    let r = run::run(few::Few::One(p));
    if let Some(t0) = t0 {
        crate::control::online::finished(engine, r.is_ok().then(|| t0.elapsed()));
    }
    r
}
