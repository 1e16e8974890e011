//! Device collectives inside a node through CUDA IPC: every rank reads its
//! peers' device buffers where they lie (copies and reduction kernels on the
//! proxy's stream), with no staging through host memory.
//!
//! It serves collectives of batches without sends or receives (a batch's
//! calls run one by one, in issue order) on communicators
//! whose ranks all share one node and shared memory (the direct paths'
//! [`Node`]), when every rank's buffers are `cuMemAlloc` memory on GPUs
//! that can read each other (the same GPU, or peer access), and, for
//! reductions, the kernels of the datatype and op loaded (every op: avg and
//! PreMulSum pre-multiply, with each rank's scalar in its descriptor).
//! Several ranks on one GPU are the case NCCL does not serve. Anything else
//! goes through host staging ([`super::stage`]), decided the same way on
//! every rank.
//!
//! The protocol uses each rank's device-collective slots on its board
//! ([`crate::intranode::board::GpuSlot`]), indexed by a per-communicator count
//! of device collectives, which every rank advances in the same order (NCCL
//! requires collectives in the same order on all ranks; batches of several
//! calls post too):
//! 1. Post: the rank writes its descriptor (IPC handles of both buffers,
//!    process id, device UUID, whether it can take this path) and publishes
//!    `seq`. A rank that cannot take the path, or whose batch holds sends or
//!    receives, posts "no" and stages without waiting.
//! 2. Decide: wait for every peer's post of `seq` and read it under a
//!    sequence check. A peer whose slot already holds a later collective
//!    chose staging (a rank that can take the path waits in step 3 for
//!    everyone), so it counts as "no". Any "no" sends everyone to staging.
//! 3. Open: each rank checks peer access to the other GPUs, opens the peer
//!    buffers it reads and publishes phase 1 with whether that worked; any
//!    failure sends everyone to staging.
//! 4. Work: each phase's copies and kernels run on the proxy's stream; the
//!    rank synchronises it, publishes the phase, and waits for everyone's,
//!    so no buffer is rewritten while a peer still reads it and no rank
//!    returns (releasing its stream) before its peers have read its input.
//!
//! AllReduce reduces one slice per rank (folding its own input first, so an
//! in-place operation never overwrites an input before reading it), then
//! copies the other ranks' slices; ReduceScatter is the first phase alone;
//! Reduce folds everything at the root. Results are identical on every rank
//! (each element is reduced once), though the folding order is not the host
//! path's rank order.

use std::ffi::c_void;
use std::sync::atomic::Ordering;

use super::driver::{self, cu};
use super::ipc::{self, Export, Imports};
use super::kernels::{self, DeviceKernels};
use super::memory::Placement;
use super::module;
use crate::algo::Collective;
use crate::comm::Comm;
use crate::error::{Error, Result};
use crate::exec::watch::Watch;
use crate::intranode::board::GpuSlot;
use crate::intranode::shape::{self, Shape};
use crate::intranode::{Node, WaitOp};
use crate::launch;
use crate::launch::Call;
use crate::reduce::Scalar;

/// The proxy thread's state for the CUDA IPC path: the peer allocations it
/// opened. (The slot sequence is the communicator's `gpu_seq`.)
#[derive(Debug, Default)]
pub struct PeerState {
    pub(super) imports: Imports,
}

/// The next slot sequence number of `comm`'s device collectives.
fn next_seq(comm: &Comm) -> u64 {
    comm.gpu_seq.fetch_add(1, Ordering::Relaxed) + 1
}

/// Publishes `d` as this rank's descriptor of `seq`. The sequence word is
/// cleared first, so that a reader checking it before and after reading
/// (see [`read_peer`]) never accepts a descriptor half rewritten.
fn post<'a>(node: &'a Node, seq: u64, d: &Desc) -> &'a GpuSlot {
    let slot = node.board(node.me()).gpu_slot(seq);
    slot.seq.store(0, Ordering::Relaxed);
    std::sync::atomic::fence(Ordering::Release);
    d.write(slot);
    slot.seq.store(seq, Ordering::Release);
    node.wake_peers();
    slot
}

/// A rank's descriptor in its slot (words of [`GpuSlot::desc`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Desc {
    able: bool,
    pid: u32,
    uuid: [u8; 16],
    /// The call's shape (`crate::intranode::shape::Shape` words; zeros when
    /// unknown): all ranks must agree.
    shape: [u64; 2],
    send: Option<Export>,
    recv: Option<Export>,
    /// Bytes of the send buffer the call reads (peers never read more).
    send_len: u64,
    /// Bytes of the receive buffer the call writes.
    recv_len: u64,
    /// The rank's pre-multiplier (PreMulSum, float Avg), little-endian.
    scalar: [u8; 8],
    /// Phase-1 result: whether the rank opened every buffer it reads.
    opened: bool,
}

/// Flags in the low 32 bits (bit 3: the phase-1 result, set later), the pid
/// in the high ones.
const W_FLAGS_PID: usize = 0;
const W_SEND_LEN: usize = 1;
const W_UUID: usize = 2;
const W_SHAPE: usize = 4;
const W_SEND: usize = 5;
const W_RECV: usize = 16;
const W_SHAPE2: usize = 27;
const W_SCALAR: usize = 28;
const W_RECV_LEN: usize = 29;
const _: () = assert!(W_RECV + Export::WORDS <= W_SHAPE2 && W_RECV_LEN < 30);
/// The flag of the phase-1 result in [`W_FLAGS_PID`].
const OPENED: u64 = 1 << 3;

impl Desc {
    fn write(&self, s: &GpuSlot) {
        let flags = u64::from(self.able)
            | u64::from(self.send.is_some()) << 1
            | u64::from(self.recv.is_some()) << 2;
        s.desc[W_FLAGS_PID].store(flags | u64::from(self.pid) << 32, Ordering::Relaxed);
        s.desc[W_SEND_LEN].store(self.send_len, Ordering::Relaxed);
        s.desc[W_RECV_LEN].store(self.recv_len, Ordering::Relaxed);
        ipc::store_uuid(&s.desc[W_UUID..W_UUID + 2], &self.uuid);
        s.desc[W_SHAPE].store(self.shape[0], Ordering::Relaxed);
        s.desc[W_SHAPE2].store(self.shape[1], Ordering::Relaxed);
        if let Some(e) = &self.send {
            e.store(&s.desc[W_SEND..]);
        }
        if let Some(e) = &self.recv {
            e.store(&s.desc[W_RECV..]);
        }
        s.desc[W_SCALAR].store(u64::from_le_bytes(self.scalar), Ordering::Relaxed);
    }

    fn read(s: &GpuSlot) -> Desc {
        let flags = s.desc[W_FLAGS_PID].load(Ordering::Relaxed);
        let uuid = ipc::load_uuid(&s.desc[W_UUID..W_UUID + 2]);
        Desc {
            able: flags & 1 != 0,
            pid: (flags >> 32) as u32,
            send_len: s.desc[W_SEND_LEN].load(Ordering::Relaxed),
            recv_len: s.desc[W_RECV_LEN].load(Ordering::Relaxed),
            uuid,
            shape: [
                s.desc[W_SHAPE].load(Ordering::Relaxed),
                s.desc[W_SHAPE2].load(Ordering::Relaxed),
            ],
            send: (flags & 2 != 0).then(|| Export::load(&s.desc[W_SEND..])),
            recv: (flags & 4 != 0).then(|| Export::load(&s.desc[W_RECV..])),
            opened: flags & OPENED != 0,
            scalar: s.desc[W_SCALAR].load(Ordering::Relaxed).to_le_bytes(),
        }
    }

    /// "Cannot take the path" for a call of `shape` (zeros: unknown, a
    /// batch with sends or receives).
    fn no(shape: [u64; 2]) -> Desc {
        Desc {
            able: false,
            pid: std::process::id(),
            uuid: [0; 16],
            shape,
            send: None,
            recv: None,
            send_len: 0,
            recv_len: 0,
            opened: false,
            scalar: [0; 8],
        }
    }
}

/// The collectives this path serves.
fn serves(a: &Call) -> bool {
    let in_place = a.send == a.recv;
    match a.kind {
        Collective::AllReduce | Collective::ReduceScatter | Collective::Reduce => true,
        Collective::AllGather
        | Collective::Broadcast
        | Collective::Gather
        | Collective::Scatter => true,
        // In place, every rank would overwrite blocks its peers still read.
        Collective::AlltoAll => !in_place,
        Collective::Send | Collective::Recv => false,
    }
}

/// The shape words of `a` (what every rank must pass alike).
fn shape_of(a: &Call) -> [u64; 2] {
    Shape::of(a).encode()
}

/// How a reduction folds its inputs on the GPU.
#[derive(Debug, Clone, Copy)]
struct Fold {
    /// Each input is first multiplied by its owner's scalar (PreMulSum,
    /// float Avg): `premul`, then `dst = in*s + dst` per further input.
    pre: bool,
    /// Integer Avg: the sum is divided by this at the end.
    div: Option<u64>,
}

/// The fold of `a`, this rank's scalar, and the kernels it launches
/// (None: the op cannot run on the GPU here).
fn fold_of(a: &Call, k: &DeviceKernels) -> Option<(Fold, [u8; 8])> {
    let op = launch::reduce_op(a).ok()?;
    let (dt, n) = (a.dtype, a.comm.nranks as u32);
    let pre = op.pre_scalar(dt, n);
    let div = op.has_post_op(dt).then_some(u64::from(n));
    let mut names = vec![kernels::reduce_kernel(dt, a.op)];
    if pre.is_some() {
        names.push(kernels::premul_kernel(dt));
    }
    if div.is_some() {
        names.push(kernels::postdiv_kernel(dt)?);
    }
    if !names.iter().all(|f| k.has(f)) {
        return None;
    }
    let mut scalar = [0u8; 8];
    match pre {
        Some(s) => scalar[..dt.size()].copy_from_slice(s.bytes(dt)),
        // Integer Avg folds with `a*1 + b`.
        None if div.is_some() => {
            scalar[..dt.size()].copy_from_slice(Scalar::from_f64(dt, 1.0).bytes(dt));
        }
        None => {}
    }
    Some((
        Fold {
            pre: pre.is_some(),
            div,
        },
        scalar,
    ))
}

/// A reduction's kernels and how it folds.
type Reducer = (std::sync::Arc<DeviceKernels>, Fold);

/// This rank's descriptor for `a`, and for a reduction its kernels and fold.
fn describe(a: &Call) -> (Desc, Option<Reducer>) {
    let shape = shape_of(a);
    let no = || (Desc::no(shape), None);
    if !matches!(a.placement, Placement::Device(_)) {
        return no();
    }
    let Ok(engine) = a.comm.engine() else {
        return no();
    };
    if engine.settings.p2p_disable || !serves(a) {
        return no();
    }
    let mut scalar = [0u8; 8];
    let reducer = if a.kind.reduces() {
        // Loaded (or not) on the caller's thread before the batch began:
        // loading here, while the user's stream waits, would never return.
        let Some(k) = module::loaded() else {
            return no();
        };
        let Some((fold, s)) = fold_of(a, &k) else {
            return no();
        };
        scalar = s;
        Some((k, fold))
    } else {
        None
    };
    let exp = |p: *const c_void, used: usize| -> Option<Option<Export>> {
        if used == 0 || p.is_null() {
            Some(None)
        } else {
            ipc::export(p).ok().map(Some)
        }
    };
    let (Some(send), Some(recv), Ok(uuid)) = (
        exp(a.send.get().cast_const(), a.send_bytes),
        exp(a.recv.get().cast_const(), a.recv_bytes),
        ipc::current_uuid(),
    ) else {
        return no();
    };
    let d = Desc {
        able: true,
        pid: std::process::id(),
        uuid,
        shape,
        send,
        recv,
        send_len: a.send_bytes as u64,
        recv_len: a.recv_bytes as u64,
        opened: false,
        scalar,
    };
    (d, reducer)
}

/// Posts "no" for a device collective of a batch with sends or receives
/// (it stages as one host group), keeping the slot sequence in step.
pub fn post_no(node: &Node, comm: &Comm) {
    post(node, next_seq(comm), &Desc::no([0; 2]));
}

/// Reads peer `k`'s descriptor of `seq` (None: it has moved past `seq`).
fn read_peer(node: &Node, k: usize, seq: u64) -> Option<Desc> {
    let slot = node.board(k).gpu_slot(seq);
    if slot.seq.load(Ordering::Acquire) != seq {
        return None;
    }
    // A peer's slot is rewritten only for seq + GPU_SLOTS; the check after
    // the read catches that.
    let d = Desc::read(slot);
    std::sync::atomic::fence(Ordering::Acquire);
    (slot.seq.load(Ordering::Relaxed) == seq).then_some(d)
}

/// Runs `a` (device buffers, a single call) through CUDA IPC when every rank
/// can; `Ok(false)` when the caller must stage it through host memory.
pub fn try_run(
    node: &Node,
    watch: &Watch,
    st: &mut PeerState,
    a: &Call,
    stream: cu::CUstream,
) -> Result<bool> {
    let seq = next_seq(&a.comm);
    let (n, me) = (node.nranks(), node.me());
    let (mine, reducer) = describe(a);
    let slot = post(node, seq, &mine);
    if !mine.able {
        return Ok(false);
    }
    let label = || format!("{} device collective {seq} (CUDA IPC)", a.kind);
    let wop = WaitOp {
        label: &label,
        watch,
        seq,
    };
    node.wait(&wop, || {
        (0..n).find(|&k| k != me && node.board(k).gpu_slot(seq).seq.load(Ordering::Acquire) < seq)
    })?;
    let mut descs = Vec::with_capacity(n);
    for k in 0..n {
        let d = if k == me {
            Some(mine)
        } else {
            read_peer(node, k, seq)
        };
        match d {
            // Every rank that can take the path reads every descriptor, so
            // each of them finds the disagreement and fails; a peer that
            // cannot (it posted its shape with "no") stages, and this
            // rank's failure closes the links it then waits on.
            Some(d) if d.shape != [0; 2] && d.shape != mine.shape => {
                return Err(shape::disagree("CUDA IPC", k, d.shape, me, mine.shape));
            }
            Some(d) if d.able => descs.push(d),
            _ => return Ok(false),
        }
    }
    // Phase 1: open what this rank reads.
    let ptrs = open_all(st, me, &descs);
    if ptrs.is_ok() {
        slot.desc[W_FLAGS_PID].fetch_or(OPENED, Ordering::Relaxed);
    }
    barrier(node, &wop, seq, 1)?;
    let all_opened = (0..n).all(|k| {
        k == me && ptrs.is_ok()
            || k != me
                && node.board(k).gpu_slot(seq).desc[W_FLAGS_PID].load(Ordering::Relaxed) & OPENED
                    != 0
    });
    let ptrs = match ptrs {
        Ok(p) if all_opened => p,
        Ok(_) => return Ok(false),
        Err(e) => {
            tracing::info!(target: "hetccl::COLL", "{}: staging through host memory: {e}", label());
            return Ok(false);
        }
    };
    let scalars: Vec<[u8; 8]> = descs.iter().map(|d| d.scalar).collect();
    let plan = Plan {
        a,
        n,
        me,
        ptrs: &ptrs,
        kernels: reducer.as_ref().map(|r| &*r.0),
        fold: reducer.as_ref().map(|r| r.1),
        scalars: &scalars,
        stream,
    };
    plan.phase(0)?;
    sync(stream)?;
    barrier(node, &wop, seq, 2)?;
    if a.kind == Collective::AllReduce && n > 1 {
        plan.phase(1)?;
        sync(stream)?;
        barrier(node, &wop, seq, 3)?;
    }
    Ok(true)
}

/// One rank's buffer in this process: address and the bytes its owner
/// published (0, 0 when absent).
#[derive(Debug, Clone, Copy, Default)]
struct Buf {
    addr: u64,
    len: u64,
}

/// Every rank's (send, recv) buffers in this process.
type Ptrs = Vec<(Buf, Buf)>;

/// Opens every rank's buffers, each checked against the allocation its
/// owner exported and the mapping made here (see [`Imports::resolve`]).
fn open_all(st: &mut PeerState, me: usize, descs: &[Desc]) -> Result<Ptrs> {
    let mut v = Vec::with_capacity(descs.len());
    for (k, d) in descs.iter().enumerate() {
        if k != me {
            ipc::check_peer_access(&descs[me].uuid, &d.uuid)?;
        }
        let mut one = |e: &Option<Export>, len: u64| -> Result<Buf> {
            match e {
                None => Ok(Buf::default()),
                Some(e) => Ok(Buf {
                    addr: st.imports.resolve(d.pid, e, len)?,
                    len,
                }),
            }
        };
        let s = one(&d.send, d.send_len)?;
        let r = one(&d.recv, d.recv_len)?;
        v.push((s, r));
    }
    Ok(v)
}

/// Publishes phase `p` of `seq` and waits for every rank's.
fn barrier(node: &Node, wop: &WaitOp<'_>, seq: u64, p: u64) -> Result<()> {
    let (n, me) = (node.nranks(), node.me());
    let want = seq << 8 | p;
    node.board(me)
        .gpu_slot(seq)
        .stage
        .store(want, Ordering::Release);
    node.wake_peers();
    node.wait(wop, || {
        (0..n)
            .find(|&k| k != me && node.board(k).gpu_slot(seq).stage.load(Ordering::Acquire) < want)
    })
}

fn sync(stream: cu::CUstream) -> Result<()> {
    // SAFETY: the proxy's live stream.
    driver::check(
        unsafe { cu::cuStreamSynchronize(stream) },
        "cuStreamSynchronize",
    )
}

/// One operation's device work.
struct Plan<'a> {
    a: &'a Call,
    n: usize,
    me: usize,
    ptrs: &'a Ptrs,
    kernels: Option<&'a DeviceKernels>,
    fold: Option<Fold>,
    /// Every rank's pre-multiplier.
    scalars: &'a [[u8; 8]],
    stream: cu::CUstream,
}

impl Plan<'_> {
    fn copy(&self, dst: u64, src: u64, bytes: usize) -> Result<()> {
        if bytes == 0 || dst == src {
            return Ok(());
        }
        // SAFETY: both ranges lie in buffers of the validated call (this
        // rank's or a peer's, opened through IPC) for the operation.
        driver::check(
            unsafe { cu::cuMemcpyAsync(dst, src, bytes, self.stream) },
            "cuMemcpyAsync (peer)",
        )
    }

    /// Folds `inputs` (address, owning rank) into `dst` over `elems`
    /// elements: `in0 op in1 op ...`, or with a pre-op `in0*s0 + in1*s1 +
    /// ...` (each input scaled by its owner's scalar), then the integer Avg
    /// division.
    fn fold(&self, dst: u64, inputs: &[(u64, usize)], elems: usize) -> Result<()> {
        let bytes = elems * self.a.dtype.size();
        if inputs.len() == 1 && self.fold.is_none_or(|f| !f.pre && f.div.is_none()) {
            return self.copy(dst, inputs[0].0, bytes);
        }
        let k = self.kernels.expect("reductions load their kernels");
        let f = self.fold.expect("reductions know their fold");
        let (dt, op, st, n) = (self.a.dtype, self.a.op, self.stream, elems as u64);
        let d = dst as *mut c_void;
        let p = |x: u64| x as *const c_void;
        // SAFETY: (every launch) device-accessible ranges of `elems`
        // elements, live until the stream is synchronised at the end of the
        // phase; `dst` may alias an input of the same element.
        unsafe {
            let rest = if f.pre {
                let (x, r) = inputs[0];
                k.premul(dt, d, p(x), n, self.scalars[r], st)?;
                &inputs[1..]
            } else if inputs.len() == 1 {
                self.copy(dst, inputs[0].0, bytes)?;
                &inputs[1..]
            } else {
                let s0 = self.scalars[inputs[0].1];
                k.reduce(dt, op, d, p(inputs[0].0), p(inputs[1].0), n, s0, st)?;
                &inputs[2..]
            };
            for &(x, r) in rest {
                // For avg/premulsum the kernel computes a*s + b: the new
                // input times its owner's scalar, plus the partial sum.
                k.reduce(dt, op, d, p(x), p(dst), n, self.scalars[r], st)?;
            }
            if let Some(div) = f.div {
                k.postdiv(dt, d, n, div, st)?;
            }
        }
        Ok(())
    }

    /// Rank `k`'s receive (`recv`) or send buffer at byte `off`, for
    /// `bytes` bytes: the address here, or an error (before anything of
    /// the range is enqueued) when the range leaves what `k` published.
    fn at(&self, k: usize, recv: bool, off: u64, bytes: usize) -> Result<u64> {
        let b = if recv { self.ptrs[k].1 } else { self.ptrs[k].0 };
        match off.checked_add(bytes as u64) {
            Some(end) if end <= b.len => Ok(b.addr + off),
            _ => Err(Error::Internal(
                format!(
                    "CUDA IPC: {bytes} B at offset {off} lie outside rank {k}'s {} buffer of {} B",
                    if recv { "receive" } else { "send" },
                    b.len
                )
                .into(),
            )),
        }
    }

    /// The inputs of byte offset `off` (`bytes` of each) for a fold: this
    /// rank's first (in place, its output may be its input), then the
    /// others.
    fn inputs_at(&self, off: u64, bytes: usize) -> Result<Vec<(u64, usize)>> {
        std::iter::once(self.me)
            .chain((0..self.n).filter(|&k| k != self.me))
            .map(|k| Ok((self.at(k, false, off, bytes)?, k)))
            .collect()
    }

    /// Elements `[lo, hi)` of rank `r`'s AllReduce slice.
    fn slice(&self, r: usize) -> (usize, usize) {
        let c = self.a.count;
        (c * r / self.n, c * (r + 1) / self.n)
    }

    fn phase(&self, p: usize) -> Result<()> {
        let a = self.a;
        let es = a.dtype.size();
        let bytes = a.count * es;
        let blk = bytes as u64;
        let (me, n) = (self.me, self.n);
        let out = |off: u64, len: usize| self.at(me, true, off, len);
        match a.kind {
            Collective::AllReduce if p == 0 => {
                let (lo, hi) = self.slice(me);
                let (off, len) = ((lo * es) as u64, (hi - lo) * es);
                self.fold(out(off, len)?, &self.inputs_at(off, len)?, hi - lo)
            }
            Collective::AllReduce => {
                for r in (0..n).filter(|&r| r != me) {
                    let (lo, hi) = self.slice(r);
                    let (off, len) = ((lo * es) as u64, (hi - lo) * es);
                    self.copy(out(off, len)?, self.at(r, true, off, len)?, len)?;
                }
                Ok(())
            }
            Collective::ReduceScatter => {
                let inputs = self.inputs_at(me as u64 * blk, bytes)?;
                self.fold(out(0, bytes)?, &inputs, a.count)
            }
            Collective::Reduce if a.root == me => {
                self.fold(out(0, bytes)?, &self.inputs_at(0, bytes)?, a.count)
            }
            Collective::Reduce => Ok(()),
            Collective::AllGather => {
                for r in 0..n {
                    self.copy(
                        out(r as u64 * blk, bytes)?,
                        self.at(r, false, 0, bytes)?,
                        bytes,
                    )?;
                }
                Ok(())
            }
            Collective::Broadcast => {
                self.copy(out(0, bytes)?, self.at(a.root, false, 0, bytes)?, bytes)
            }
            Collective::Gather if a.root == me => {
                for r in 0..n {
                    self.copy(
                        out(r as u64 * blk, bytes)?,
                        self.at(r, false, 0, bytes)?,
                        bytes,
                    )?;
                }
                Ok(())
            }
            Collective::Gather => Ok(()),
            Collective::Scatter => {
                let src = self.at(a.root, false, me as u64 * blk, bytes)?;
                self.copy(out(0, bytes)?, src, bytes)
            }
            Collective::AlltoAll => {
                for r in 0..n {
                    let src = self.at(r, false, me as u64 * blk, bytes)?;
                    self.copy(out(r as u64 * blk, bytes)?, src, bytes)?;
                }
                Ok(())
            }
            Collective::Send | Collective::Recv => unreachable!("not served"),
        }
    }
}
