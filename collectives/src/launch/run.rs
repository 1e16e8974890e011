//! Running what a call or a group produced: communicator inits in
//! parallel, then every communicator's jobs in one `drive` loop, on the
//! calling thread (blocking communicators) or a helper thread (nonblocking:
//! the call returns `ncclInProgress`).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use hetccl_abi::NcclResult;

use super::few::Few;
use super::p2p_run::RunCall;
use super::scratch::return_scratch;
use super::Call;
use crate::algo::Collective;
use crate::comm::Comm;
use crate::error::{Error, Result};
use crate::exec::single::{self, Once};
use crate::exec::{drive, self_p2p, Batch, Job};

/// A queued operation: its communicator and its job.
pub(super) struct Pending {
    /// The communicator.
    pub comm: Arc<Comm>,
    /// The job.
    pub job: Job,
    /// What the metrics and the timeline say about it.
    pub info: Info,
    /// The calls of a point-to-point run (`p2p_run`), each recorded on its
    /// own; empty for a job of one call.
    pub run: Vec<RunCall>,
}

/// What the metrics and the timeline record of a call.
#[derive(Debug, Clone, Copy)]
pub(super) struct Info {
    /// When the call was made (`telemetry::clock` ticks).
    pub called: u64,
    /// Its bytes (count × datatype size).
    pub bytes: usize,
    /// The peer (point-to-point) or root (rooted kinds); -1 otherwise.
    pub peer: i32,
}

impl Pending {
    /// The pending form of `job`, made for `a` at tick `called`.
    pub fn new(a: &Call, job: Job, called: u64) -> Self {
        let rooted = matches!(
            a.kind,
            Collective::Broadcast
                | Collective::Reduce
                | Collective::Gather
                | Collective::Scatter
                | Collective::Send
                | Collective::Recv
        );
        Self {
            comm: a.comm.clone(),
            job,
            info: Info {
                called,
                bytes: a.count * a.dtype.size(),
                peer: if rooted { a.root as i32 } else { -1 },
            },
            run: Vec::new(),
        }
    }

    /// What [`observe`] records of it once it is done (the calls of a run
    /// move there).
    fn observed(&mut self) -> Observed {
        Observed::of(&self.job, self.info, std::mem::take(&mut self.run))
    }
}

/// Records completed calls in their communicators' metrics and, when it is
/// on, the timeline: `start` is when the executor took them. Each call
/// names its communicator among `comms` by address.
fn observe(comms: &[Arc<Comm>], done: &[(*const Comm, Observed)], start: u64) {
    use crate::telemetry::{metrics, trace};
    for (at, o) in done {
        let Some(c) = comms.iter().find(|c| Arc::as_ptr(c) == *at) else {
            continue;
        };
        let Ok(e) = c.engine() else { continue };
        let m = &e.links.metrics;
        let algo = metrics::algo_index(o.algorithm);
        // A point-to-point run (never on the timeline): each of its calls.
        for r in &o.run {
            count_call(m, r.kind, r.bytes, algo, r.called, start);
        }
        if !o.run.is_empty() {
            continue;
        }
        let end = count_call(m, o.kind, o.info.bytes, algo, o.info.called, start);
        if o.info.called == 0 {
            continue;
        }
        if trace::on() {
            trace::record(trace::Event {
                what: trace::What::Call(o.kind),
                start: o.info.called,
                end,
                id: o.id,
                rank: m.rank as u32,
                algo: o.algorithm.name(),
                dtype: o.dtype.name(),
                op: o.op,
                peer: o.info.peer,
                chan: -1,
                bytes: o.info.bytes as u64,
            });
        }
    }
}

/// Counts a completed call of `bytes` in `m`, with its latency and its
/// wait in the queue when it was sampled (`called` is not 0); returns the
/// end tick (0 if not read). `start` is when the executor took it.
fn count_call(
    m: &crate::telemetry::metrics::Metrics,
    kind: Collective,
    bytes: usize,
    algo: usize,
    called: u64,
    start: u64,
) -> u64 {
    let end = m.complete(kind, bytes, algo, called);
    if called != 0 {
        m.queue_wait
            .record(crate::telemetry::clock::to_ns(start.saturating_sub(called)));
    }
    end
}

/// A job's facts, kept for [`observe`] while the job runs.
struct Observed {
    info: Info,
    kind: Collective,
    algorithm: crate::algo::Algorithm,
    dtype: hetccl_abi::DataType,
    op: &'static str,
    id: crate::telemetry::trace::TraceId,
    /// The calls of a point-to-point run, recorded one by one.
    run: Vec<RunCall>,
}

impl Observed {
    /// The facts of `job`, issued as `info` says, with the calls of a
    /// point-to-point run (empty otherwise).
    fn of(job: &Job, info: Info, run: Vec<RunCall>) -> Self {
        let plan = &job.plan;
        Self {
            info,
            kind: plan.collective,
            algorithm: plan.algorithm,
            dtype: plan.dtype,
            op: crate::telemetry::trace::op_name(plan.collective, &plan.op),
            id: job.trace.id,
            run,
        }
    }
}

/// A communicator init queued by a group.
pub(super) type Init = Box<dyn FnOnce() -> Result<()> + Send>;

/// Runs queued inits, concurrently when there are several (ranks
/// initialised by one thread must rendezvous together).
pub(super) fn run_inits(inits: Vec<Init>) -> Result<()> {
    if inits.len() <= 1 {
        return inits.into_iter().try_for_each(|f| f());
    }
    let results: Vec<Result<()>> = std::thread::scope(|s| {
        let hs: Vec<_> = inits.into_iter().map(|f| s.spawn(f)).collect();
        hs.into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(Error::Internal("init thread panicked".into())))
            })
            .collect()
    });
    results.into_iter().collect()
}

/// Runs queued operations: blocking communicators on this thread, and
/// nonblocking ones on a helper thread after returning `ncclInProgress`.
pub(super) fn run(ops: Few<Pending>) -> Result<()> {
    let nonblocking = ops
        .as_slice()
        .iter()
        .any(|p| p.comm.engine().map(|e| !e.config.blocking).unwrap_or(false));
    if !nonblocking {
        return execute(ops);
    }
    // One entry per communicator: a group with several operations on one
    // comm must publish its result once, or a late second store could
    // overwrite the `ncclInProgress` of the caller's next operation.
    let mut comms: Vec<Arc<Comm>> = Vec::new();
    for p in ops.as_slice() {
        if !comms.iter().any(|c| Arc::ptr_eq(c, &p.comm)) {
            comms.push(p.comm.clone());
        }
    }
    for c in &comms {
        c.async_error
            .store(NcclResult::InProgress.raw(), Ordering::Release);
    }
    std::thread::Builder::new()
        .name("hetccl-async".into())
        .spawn(move || {
            let r = execute(ops);
            let code = match &r {
                Ok(()) => NcclResult::Success.raw(),
                Err(e) => e.code().raw(),
            };
            if let Err(e) = &r {
                crate::error::last::set_last_error(&format!("nonblocking operation: {e}"));
            }
            for c in comms {
                c.async_error.store(code, Ordering::Release);
            }
        })
        .map_err(|e| Error::System(format!("spawn: {e}").into()))?;
    Err(Error::InProgress)
}

fn execute(ops: Few<Pending>) -> Result<()> {
    let ops = match ops {
        Few::One(p) => return execute_one(p),
        many => many,
    };
    // The jobs by communicator, in address order (the order their locks
    // are taken in), keeping issue order within each. Outside a group
    // every list holds one element and allocates nothing.
    let n = ops.as_slice().len();
    let mut comms: Few<Arc<Comm>> = Few::default();
    let mut jobs: Few<Vec<Job>> = Few::default();
    // Each call's communicator by address: `comms` holds them.
    let mut observed: Few<(*const Comm, Observed)> = Few::with_capacity(n);
    for mut p in ops.into_vec_iter() {
        let at = Arc::as_ptr(&p.comm);
        observed.push((at, p.observed()));
        let found = comms
            .as_slice()
            .binary_search_by_key(&(at as usize), |c| Arc::as_ptr(c) as usize);
        match found {
            Ok(i) => jobs.as_mut_slice()[i].push(p.job),
            Err(i) => {
                comms.insert(i, p.comm);
                let mut v = Vec::with_capacity(n);
                v.push(p.job);
                jobs.insert(i, v);
            }
        }
    }
    let comms = comms.as_slice();
    // Every engine's patience is the same process-wide stall limit; the
    // spin is the shortest of them (0 on an oversubscribed node).
    let mut patience = comms[0].engine()?.settings.patience;
    for c in &comms[1..] {
        patience.spin = patience.spin.min(c.engine()?.settings.patience.spin);
    }
    let mut locks = Few::default();
    for c in comms {
        locks.push(enter_exec(c.engine()?, patience)?);
    }
    let mut batches = Few::default();
    for (jobs, c) in jobs.into_vec_iter().zip(comms) {
        batches.push(Batch::new(&c.engine()?.links, self_p2p::pair(jobs)?)?);
    }
    let start = crate::telemetry::clock::ticks();
    let r = drive(batches.as_mut_slice(), patience);
    for (b, c) in batches.into_vec_iter().zip(comms) {
        let e = c.engine()?;
        b.finish_jobs(|j| return_scratch(e, j));
    }
    if r.is_ok() {
        observe(comms, observed.as_slice(), start);
    }
    if let Err(e) = &r {
        for c in comms {
            poison(c, e);
        }
    }
    drop(locks);
    r
}

/// [`execute`] of one operation: the same steps without the lists. An
/// operation of one message is tried once first (`exec::single`).
fn execute_one(mut p: Pending) -> Result<()> {
    let observed = [(Arc::as_ptr(&p.comm), p.observed())];
    let Pending { comm, job, .. } = p;
    let e = comm.engine()?;
    let patience = e.settings.patience;
    let lock = enter_exec(e, patience)?;
    let mut job = if job.self_p2p {
        // A lone send to oneself has no receive to pair with: `pair` says so.
        self_p2p::pair(vec![job])?
            .pop()
            .expect("pair keeps a lone job")
    } else {
        job
    };
    let comms = std::slice::from_ref(&comm);
    let start = crate::telemetry::clock::ticks();
    let r = match single::try_once(&e.links, &mut job) {
        Ok(Once::Done) => {
            // Done at once: the progress board still sees it begin and end.
            e.links.watch.begin_op(job.trace.seq, job.plan.collective);
            e.links.watch.end();
            return_scratch(e, job);
            Ok(())
        }
        Ok(once) => {
            let moved = if let Once::Started(m) = once { m } else { 0 };
            let mut batch = [Batch::one(&e.links, job, moved)?];
            let r = drive(&mut batch, patience);
            let [b] = batch;
            b.finish_jobs(|j| return_scratch(e, j));
            r
        }
        Err(err) => {
            return_scratch(e, job);
            Err(err)
        }
    };
    match &r {
        Ok(()) => observe(comms, &observed, start),
        Err(err) => poison(&comm, err),
    }
    drop(lock);
    r
}

/// Enters `e`'s exec gate, waiting for an operation another thread runs on
/// it (a nonblocking helper, the GPU proxy), which ends within its own
/// stall limit.
pub(crate) fn enter_exec(
    e: &crate::comm::engine::Engine,
    patience: crate::exec::Patience,
) -> Result<crate::comm::exec_gate::Running<'_>> {
    let wait = patience.stall_timeout + std::time::Duration::from_secs(1);
    e.exec_gate.enter_for(wait).ok_or_else(|| {
        Error::Timeout(
            format!(
                "an operation on another thread held communicator {:016x} for {wait:?}",
                e.comm_hash
            )
            .into(),
        )
    })
}

/// Records a failed operation on `c`: its asynchronous error, and the reason
/// every later operation fails (messages may have moved part-way, so no later
/// operation may read the stray bytes).
pub fn poison(c: &Arc<Comm>, e: &Error) {
    if let Error::Revoked(by) = e {
        // A peer's revoke reached this rank: this communicator is revoked
        // too, and the news goes on over its links.
        crate::comm::revoke::revoke(c, *by);
    }
    if c.revoked.load(Ordering::Acquire) {
        // The revoke owns the asynchronous state (in progress, then
        // success once quiescent).
        c.record_failure(|| e.to_string());
        return;
    }
    let code = match e {
        Error::Timeout(_) | Error::Remote(_) => NcclResult::RemoteError.raw(),
        other => other.code().raw(),
    };
    c.async_error.store(code, Ordering::Release);
    c.record_failure(|| e.to_string());
}
