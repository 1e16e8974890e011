//! From validated arguments to running plans: plan generation, the group
//! queue, blocking and nonblocking execution.
//!
//! Outside a group, an operation runs at once on the calling thread. Inside
//! a group, operations (and communicator inits) are queued per thread and the
//! outermost `ncclGroupEnd` runs them together: the inits in parallel, then
//! every communicator's operations in one [`drive`] loop, so sends and
//! receives of one group never deadlock whatever their order. A
//! communicator in nonblocking mode returns `ncclInProgress` and a helper
//! thread finishes the work; `ncclCommGetAsyncError` reports when it is done.

use std::cell::RefCell;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use hetccl_abi::{NcclResult, RedOp};

use super::coll_args::CollArgs;
use crate::algo::{self, AlgoFilter, Chunking, Collective};
use crate::comm::engine::Engine;
use crate::comm::plan_cache::PlanKey;
use crate::comm::redop_table::Scalar as OpScalar;
use crate::comm::Comm;
use crate::error::{Error, Result};
use crate::exec::{drive, self_p2p, Batch, Job, OpBuffers, Patience, Trace};
use crate::reduce::{ReduceOp, Scalar};

/// A queued operation: its communicator and its job.
struct Pending {
    comm: Arc<Comm>,
    job: Job,
}

/// Work queued by one thread's open group.
#[derive(Default)]
struct GroupQueue {
    ops: Vec<Pending>,
    inits: Vec<Box<dyn FnOnce() -> Result<()>>>,
    /// Communicators this thread claimed for the group (released when the
    /// group ends or is discarded).
    held: Vec<Arc<Comm>>,
}

impl GroupQueue {
    fn release_held(&mut self) {
        for c in self.held.drain(..) {
            c.owner.release();
        }
    }
}

/// Claims `comm` for the calling thread's operation (see `comm::owner`):
/// until the call returns, or inside a group until it ends. A second thread
/// gets `ncclInvalidUsage`.
pub fn claim_for_call<R>(comm: &Arc<Comm>, call: impl FnOnce() -> Result<R>) -> Result<R> {
    let claim = comm.owner.claim(|| comm.describe())?;
    if super::group::depth() > 0 {
        if claim.is_fresh() {
            claim.keep();
            QUEUE.with(|q| q.borrow_mut().held.push(comm.clone()));
        }
        return call();
    }
    let r = call();
    drop(claim);
    r
}

thread_local! {
    static QUEUE: RefCell<GroupQueue> = RefCell::new(GroupQueue::default());
}

/// Whether the call uses NCCL's in-place layout for its kind.
fn in_place(a: &CollArgs) -> bool {
    let (s, r) = (a.send as usize, a.recv as usize);
    let block = a.count * a.dtype.size();
    let is_root = a.root == a.comm.rank;
    match a.kind {
        Collective::AllReduce | Collective::Broadcast => s == r,
        Collective::Reduce => is_root && s == r,
        Collective::AllGather => s == r + a.comm.rank * block,
        Collective::Gather => is_root && s == r + a.comm.rank * block,
        Collective::ReduceScatter => r == s + a.comm.rank * block,
        Collective::Scatter => is_root && r == s + a.comm.rank * block,
        Collective::AlltoAll | Collective::Send | Collective::Recv => false,
    }
}

/// The reduction of a validated call (built-in, or a live PreMulSum op).
pub(crate) fn reduce_op(a: &CollArgs) -> Result<ReduceOp> {
    let op = match a.op {
        RedOp::Dynamic(raw) => {
            let pm = a.comm.redops.lock().get(raw)?;
            let scalar = match pm.scalar {
                OpScalar::Immediate(b) => Scalar::from_bytes(a.dtype, &b),
                OpScalar::Pointer(p) => {
                    // SAFETY: the caller keeps a device-resident scalar valid
                    // while operations use it; on host-memory runs it is host
                    // memory of one element.
                    let b = unsafe { std::slice::from_raw_parts(p as *const u8, a.dtype.size()) };
                    Scalar::from_bytes(a.dtype, b)
                }
            };
            ReduceOp::from_redop(a.op, scalar)
        }
        op => ReduceOp::from_redop(op, None),
    };
    op.ok_or_else(|| Error::arg(format!("reduction op {:?} is not supported", a.op)))
}

/// Builds the job (plan and buffers) for one validated call.
pub fn make_job(a: &CollArgs) -> Result<Job> {
    let engine = a.comm.engine()?;
    let coll = a.kind;
    let inp = in_place(a);
    // In-place all-to-all: NCCL accepts it (nccl-tests calls it), and no
    // schedule can overwrite blocks it still has to send, so the input is
    // snapshotted and the out-of-place plan runs from the copy.
    let staged_send = if a.kind == Collective::AlltoAll
        && a.send_bytes > 0
        && std::ptr::eq(a.send, a.recv.cast_const())
    {
        // SAFETY: validated: `send` holds send_bytes readable bytes.
        unsafe { std::slice::from_raw_parts(a.send as *const u8, a.send_bytes) }.to_vec()
    } else {
        Vec::new()
    };
    let op = if a.kind.reduces() {
        reduce_op(a)?
    } else {
        ReduceOp::Sum
    };
    let bytes = a.count * a.dtype.size();
    let key = PlanKey {
        collective: coll,
        count: a.count,
        dtype: a.dtype,
        op,
        root: a.root as u32,
        in_place: inp,
    };
    let self_p2p = matches!(coll, Collective::Send | Collective::Recv) && a.root == a.comm.rank;
    if self_p2p {
        let seq = engine.seq.fetch_add(1, Ordering::Relaxed);
        return Ok(Job {
            plan: Arc::new(self_p2p::half(
                coll,
                a.comm.rank,
                a.comm.nranks,
                a.dtype,
                bytes,
            )),
            bufs: OpBuffers {
                send: a.send as *const u8,
                recv: a.recv as *mut u8,
                scratch: Vec::new(),
                staged_send: Vec::new(),
            },
            p2p: true,
            trace: Trace {
                comm_hash: engine.comm_hash,
                seq,
            },
            self_p2p: true,
        });
    }
    let (algorithm, plan) = engine.plans.lock().get_or_try_insert(key, || {
        let algorithm = choose(engine, coll, bytes)?;
        let args = algo::CollArgs {
            collective: key.collective,
            count: key.count,
            dtype: key.dtype,
            op: key.op,
            root: key.root,
            in_place: key.in_place,
        };
        let plan = algo::generate(
            &args,
            algorithm,
            a.comm.rank as u32,
            &engine.topo,
            &Chunking::default(),
        )
        .map_err(|e| Error::Internal(format!("plan for {coll}: {e}")))?;
        Ok::<_, Error>((algorithm, plan))
    })?;
    let seq = engine.seq.fetch_add(1, Ordering::Relaxed);
    tracing::info!(target: "hetccl::TUNING",
        "comm {:016x} seq {seq} rank {}: {coll} count {} {} bytes {bytes} algo={}",
        engine.comm_hash, a.comm.rank, a.count, a.dtype.name(), algorithm.name());
    let scratch = take_scratch(engine, plan.scratch_bytes);
    Ok(Job {
        plan,
        bufs: OpBuffers {
            send: if staged_send.is_empty() {
                a.send as *const u8
            } else {
                staged_send.as_ptr()
            },
            recv: a.recv as *mut u8,
            scratch,
            staged_send,
        },
        p2p: matches!(coll, Collective::Send | Collective::Recv),
        trace: Trace {
            comm_hash: engine.comm_hash,
            seq,
        },
        self_p2p: false,
    })
}

/// The algorithm for a collective of `bytes`: `NCCL_ALGO` filters, the α-β
/// model picks.
fn choose(engine: &Engine, coll: Collective, bytes: usize) -> Result<algo::Algorithm> {
    if matches!(coll, Collective::Send | Collective::Recv) {
        return Ok(algo::Algorithm::Direct);
    }
    algo::select(coll, bytes, &engine.topo, &engine.costs, &algo_filter()?)
        .map_err(|e| Error::usage(e.to_string()))
}

/// The `NCCL_ALGO` restriction in force (everything when unset).
pub fn algo_filter() -> Result<AlgoFilter> {
    match hetccl_core::config::get().algo.as_deref() {
        Some(s) => AlgoFilter::parse(s).map_err(|e| Error::arg(format!("NCCL_ALGO: {e}"))),
        None => Ok(AlgoFilter::all()),
    }
}

/// A scratch buffer of at least `bytes` from the communicator's pool.
fn take_scratch(engine: &Engine, bytes: usize) -> Vec<u8> {
    if bytes == 0 {
        return Vec::new();
    }
    let mut pool = engine.scratch_pool.lock();
    let mut v = match pool.iter().position(|b| b.len() >= bytes) {
        Some(i) => pool.swap_remove(i),
        None => pool.pop().unwrap_or_default(),
    };
    if v.len() < bytes {
        v.resize(bytes, 0);
    }
    v
}

/// The most scratch buffers a communicator keeps.
const SCRATCH_POOL: usize = 4;

/// Gives finished jobs' scratch buffers back to their communicator's pool.
fn return_scratch(engine: &Engine, jobs: Vec<Job>) {
    let mut pool = engine.scratch_pool.lock();
    for j in jobs {
        if j.bufs.scratch.capacity() > 0 && pool.len() < SCRATCH_POOL {
            pool.push(j.bufs.scratch);
        }
    }
}

/// Runs (or queues, inside a group) one validated call.
pub fn submit(a: CollArgs) -> Result<()> {
    if super::group::depth() == 0 {
        if let Some(r) = crate::direct::try_run(&a, || reduce_op(&a)) {
            if let Err(e) = &r {
                poison(&a.comm, e);
            }
            return r;
        }
    }
    let job = make_job(&a)?;
    if super::group::depth() > 0 {
        QUEUE.with(|q| q.borrow_mut().ops.push(Pending { comm: a.comm, job }));
        return Ok(());
    }
    run(vec![Pending { comm: a.comm, job }])
}

/// Queues a communicator init until the group ends (or runs it now).
pub fn submit_init(f: Box<dyn FnOnce() -> Result<()>>) -> Result<()> {
    if super::group::depth() > 0 {
        QUEUE.with(|q| q.borrow_mut().inits.push(f));
        return Ok(());
    }
    f()
}

/// Runs everything the thread's closing group queued.
pub fn group_end() -> Result<()> {
    let mut q = QUEUE.with(|q| std::mem::take(&mut *q.borrow_mut()));
    let held = std::mem::take(&mut q.held);
    let r = run_inits(q.inits).and_then(|()| if q.ops.is_empty() { Ok(()) } else { run(q.ops) });
    for c in held {
        c.owner.release();
    }
    r
}

/// Drops what the thread's group queued (after a failure, or a simulated end).
pub fn group_discard() -> usize {
    QUEUE.with(|q| {
        let mut q = std::mem::take(&mut *q.borrow_mut());
        q.release_held();
        q.ops.len() + q.inits.len()
    })
}

/// The jobs queued by the open group (for `ncclGroupSimulateEnd`).
pub fn with_queued<R>(f: impl FnOnce(&[(&Comm, &Job)]) -> R) -> R {
    QUEUE.with(|q| {
        let q = q.borrow();
        let v: Vec<(&Comm, &Job)> = q.ops.iter().map(|p| (&*p.comm, &p.job)).collect();
        f(&v)
    })
}

fn run_inits(inits: Vec<Box<dyn FnOnce() -> Result<()>>>) -> Result<()> {
    if inits.len() <= 1 {
        return inits.into_iter().try_for_each(|f| f());
    }
    // Several ranks initialised by one thread must rendezvous concurrently.
    struct SendBox(Box<dyn FnOnce() -> Result<()>>);
    // SAFETY: the closures capture only owned ids, configs and raw output
    // pointers that the caller keeps valid until ncclGroupEnd returns.
    unsafe impl Send for SendBox {}
    let results: Vec<Result<()>> = std::thread::scope(|s| {
        let hs: Vec<_> = inits
            .into_iter()
            .map(|f| {
                let b = SendBox(f);
                s.spawn(move || {
                    let b = b;
                    (b.0)()
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(Error::Internal("init thread panicked".into())))
            })
            .collect()
    });
    results.into_iter().collect()
}

struct SendOps(Vec<Pending>);
// SAFETY: the raw buffer pointers inside the jobs stay valid until the
// operation completes, per NCCL's contract, whichever thread completes it.
unsafe impl Send for SendOps {}

/// Runs queued operations: blocking communicators on this thread, and
/// nonblocking ones on a helper thread after returning `ncclInProgress`.
fn run(ops: Vec<Pending>) -> Result<()> {
    let nonblocking = ops
        .iter()
        .any(|p| p.comm.engine().map(|e| !e.config.blocking).unwrap_or(false));
    if !nonblocking {
        return execute(ops);
    }
    // One entry per communicator: a group with several operations on one
    // comm must publish its result once, or a late second store could
    // overwrite the `ncclInProgress` of the caller's next operation.
    let mut comms: Vec<Arc<Comm>> = Vec::new();
    for p in &ops {
        if !comms.iter().any(|c| Arc::ptr_eq(c, &p.comm)) {
            comms.push(p.comm.clone());
        }
    }
    for c in &comms {
        c.async_error
            .store(NcclResult::InProgress.raw(), Ordering::Release);
    }
    let work = SendOps(ops);
    std::thread::Builder::new()
        .name("hetccl-async".into())
        .spawn(move || {
            let work = work;
            let r = execute(work.0);
            let code = match &r {
                Ok(()) => NcclResult::Success.raw(),
                Err(e) => e.code().raw(),
            };
            if let Err(e) = &r {
                super::guard::set_last_error(&format!("nonblocking operation: {e}"));
            }
            for c in comms {
                c.async_error.store(code, Ordering::Release);
            }
        })
        .map_err(|e| Error::System(format!("spawn: {e}")))?;
    Err(Error::InProgress)
}

fn execute(ops: Vec<Pending>) -> Result<()> {
    // Group the jobs by communicator, keeping issue order within each.
    let mut by_comm: Vec<(Arc<Comm>, Vec<Job>)> = Vec::new();
    for p in ops {
        match by_comm.iter_mut().find(|(c, _)| Arc::ptr_eq(c, &p.comm)) {
            Some((_, v)) => v.push(p.job),
            None => by_comm.push((p.comm, vec![p.job])),
        }
    }
    by_comm.sort_by_key(|(c, _)| Arc::as_ptr(c) as usize);
    let (comms, jobs): (Vec<Arc<Comm>>, Vec<Vec<Job>>) = by_comm.into_iter().unzip();
    let engines = comms
        .iter()
        .map(|c| c.engine())
        .collect::<Result<Vec<_>>>()?;
    let _locks: Vec<_> = engines.iter().map(|e| e.exec_lock.lock()).collect();
    let mut batches = Vec::with_capacity(comms.len());
    for (jobs, e) in jobs.into_iter().zip(&engines) {
        batches.push(Batch::new(&e.links, self_p2p::pair(jobs)?)?);
    }
    let mut patience = Patience::from_config();
    patience.spin = engines
        .iter()
        .map(|e| e.spin)
        .min()
        .unwrap_or(patience.spin);
    let r = drive(&mut batches, patience);
    for (b, e) in batches.into_iter().zip(&engines) {
        return_scratch(e, b.into_jobs());
    }
    if let Err(e) = &r {
        for c in &comms {
            poison(c, e);
        }
    }
    r
}

/// Records a failed operation on `c`: its asynchronous error, and the reason
/// every later operation fails (messages may have moved part-way, so no later
/// operation may read the stray bytes).
pub(crate) fn poison(c: &Comm, e: &Error) {
    let code = match e {
        Error::Timeout(_) | Error::Remote(_) => NcclResult::RemoteError.raw(),
        other => other.code().raw(),
    };
    c.async_error.store(code, Ordering::Release);
    c.record_failure(|| e.to_string());
}
