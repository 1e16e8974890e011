//! Soak (issue 6, item 5): thousands of random collectives on 4 ranks,
//! checked exactly, with resource accounting.
//!
//! Every rank draws the same sequence of operations from a shared seed (a
//! xorshift generator, no dependency): the kind (AllReduce, Broadcast,
//! Reduce, AllGather, ReduceScatter, AlltoAll, Gather, Scatter, a group of
//! Send/Recv), a size (0 ..= 4 MiB for the largest buffer, log-uniform), a
//! datatype, an op, a root, in place or not. Inputs are small integers (or,
//! for data movement, pseudo-random bytes) that every datatype holds exactly
//! at every partial result, so any reduction order gives the same bits:
//! results are compared byte for byte. Averages are exact too: 4 ranks, so
//! the `1/nranks` pre-multiplication of floats is exact, and integer
//! averages are the truncated exact sum. Output buffers start as `0xCD` and
//! carry 64 guard bytes; sampled inputs of out-of-place calls must be
//! unchanged.
//!
//! Resources: open fds (`/proc/self/fd`) before the communicator exists and
//! after it is destroyed (after one warm-up lifecycle, so lazy one-time
//! state does not count); `/dev/shm/hetccl*` entries after destroy; RSS
//! (`/proc/self/statm`) after a warm-up tenth of the operations and at the
//! end, growth < 5 %.
//!
//! Modes:
//! - `soak_threads` (CI): 4 ranks as threads of this process, through the
//!   exported API (`ncclGetUniqueId` + `ncclCommInitRank`);
//! - `soak_processes` (CI): 4 processes re-executing this test binary
//!   (`soak_child`), as two emulated nodes of two (`HETCCL_HOST_ID`), so
//!   both shm and TCP links carry data.
//!
//! `HETCCL_SOAK_N` sets the number of random operations (default 400 for
//! threads, 100 for processes), after an unchecked warm-up sweep of
//! largest-size operations (see `sweep_ops`; processes run it, and assert
//! RSS growth, from 600 operations on). `HETCCL_SOAK_SEED` sets the seed,
//! `HETCCL_SOAK_HANG_S` the watchdog (default 60 s without progress = a
//! hang), `HETCCL_SOAK_VERBOSE` prints every operation that grows RSS by
//! more than 1 MiB. `scripts/soak.sh` runs
//! the long version. Each mode prints one `SOAK ...` line with its figures.

use std::ffi::{c_void, CStr};
use std::ptr::null_mut;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hetccl_abi::{ncclComm_t, ncclUniqueId};
use hetccl_collectives::api::{coll::*, comm_init::*, comm_life::*, group::*, version::*};

const NRANKS: usize = 4;
const MAX_BYTES: usize = 4 << 20;
const GUARD: usize = 64;
const FILL: u8 = 0xCD;

// ---------------------------------------------------------------- rng

/// xorshift64*: the operation sequence, identical on every rank.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        Self(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// splitmix64: the value of element `i` of rank `r`'s input of one op.
fn mix(seed: u64, r: usize, i: usize) -> u64 {
    let mut z = seed ^ ((r as u64) << 56) ^ (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

// ---------------------------------------------------------------- types

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    AllReduce,
    Broadcast,
    Reduce,
    AllGather,
    ReduceScatter,
    AlltoAll,
    Gather,
    Scatter,
    SendRecv,
}

const KINDS: [Kind; 9] = [
    Kind::AllReduce,
    Kind::Broadcast,
    Kind::Reduce,
    Kind::AllGather,
    Kind::ReduceScatter,
    Kind::AlltoAll,
    Kind::Gather,
    Kind::Scatter,
    Kind::SendRecv,
];

/// NCCL's datatype numbering and sizes.
const DT_SIZE: [usize; 12] = [1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1];
const DT_NAME: [&str; 12] = [
    "int8", "uint8", "int32", "uint32", "int64", "uint64", "float16", "float32", "float64",
    "bfloat16", "fp8e4m3", "fp8e5m2",
];
const OP_NAME: [&str; 5] = ["sum", "prod", "max", "min", "avg"];

fn is_float(dt: i32) -> bool {
    dt >= 6
}
fn is_fp8(dt: i32) -> bool {
    dt >= 10
}

/// One operation, as every rank draws it.
#[derive(Clone, Copy, Debug)]
struct Op {
    idx: usize,
    kind: Kind,
    dtype: i32,
    op: i32,
    root: usize,
    in_place: bool,
    count: usize,
    /// Send/Recv: the peer shifts (second is 0 = none).
    shifts: [usize; 2],
    seed: u64,
}

impl Op {
    fn draw(rng: &mut Rng, idx: usize) -> Op {
        let kind = KINDS[rng.below(KINDS.len() as u64) as usize];
        let dtype = rng.below(12) as i32;
        let op = rng.below(5) as i32;
        let root = rng.below(NRANKS as u64) as usize;
        let mut in_place = rng.below(2) == 1;
        // Log-uniform bytes in 0 ..= 4 MiB for the largest buffer (with a
        // few exact zeros).
        let bytes = if rng.below(32) == 0 {
            0
        } else {
            let e = rng.below(23) as u32; // 2^0 .. 2^22
            let lo = 1usize << e;
            (lo + rng.below(lo as u64) as usize).min(MAX_BYTES)
        };
        let factor = match kind {
            Kind::AllGather
            | Kind::ReduceScatter
            | Kind::AlltoAll
            | Kind::Gather
            | Kind::Scatter => NRANKS,
            Kind::SendRecv => 2,
            _ => 1,
        };
        let count = bytes / (DT_SIZE[dtype as usize] * factor);
        let s1 = rng.below(NRANKS as u64) as usize;
        let s2 = if rng.below(2) == 1 {
            1 + rng.below(NRANKS as u64 - 1) as usize
        } else {
            0
        };
        if kind == Kind::SendRecv {
            in_place = false;
        }
        Op {
            idx,
            kind,
            dtype,
            op,
            root,
            in_place,
            count,
            shifts: [s1, s2],
            seed: rng.next(),
        }
    }

    fn reduces(&self) -> bool {
        matches!(
            self.kind,
            Kind::AllReduce | Kind::Reduce | Kind::ReduceScatter
        )
    }

    fn describe(&self) -> String {
        let op = if self.reduces() {
            format!(" op={}", OP_NAME[self.op as usize])
        } else {
            String::new()
        };
        format!(
            "#{} {:?} dtype={} count={}{op} root={} in_place={} shifts={:?}",
            self.idx,
            self.kind,
            DT_NAME[self.dtype as usize],
            self.count,
            self.root,
            self.in_place,
            self.shifts
        )
    }

    /// The inputs (small integers) of elements `8*block .. 8*block+8` of
    /// rank `r`, for reductions.
    fn values8(&self, r: usize, block: usize) -> [u8; 8] {
        let w = mix(self.seed, r, block).to_le_bytes();
        let range: u8 = if is_fp8(self.dtype) { 3 } else { 16 };
        let mut v = [0u8; 8];
        for k in 0..8 {
            v[k] = if self.op == 1 {
                1 + (w[k] & 1) // prod: 1 or 2
            } else {
                w[k] % range
            };
        }
        v
    }

    /// The exact reduction of one element over all ranks, in quarters (the
    /// index into [`table`]).
    fn reduced_q(&self, v: [u8; NRANKS]) -> usize {
        let v = v.map(usize::from);
        match self.op {
            0 => v.iter().sum::<usize>() * 4,
            1 => v.iter().product::<usize>() * 4,
            2 => *v.iter().max().unwrap() * 4,
            3 => *v.iter().min().unwrap() * 4,
            _ => {
                let s: usize = v.iter().sum();
                if is_float(self.dtype) {
                    s // s/4 exactly: 1/4 is a power of two
                } else {
                    s / NRANKS * 4 // integers: truncated
                }
            }
        }
    }
}

/// Encodes an exact small value (0, or >= 1/4) in datatype `dt`.
fn encode(dt: i32, v: f64, out: &mut [u8]) {
    // (exponent bias, mantissa bits) of the narrow float formats.
    let narrow = |bias: i32, mbits: u32| -> u64 {
        if v == 0.0 {
            return 0;
        }
        let e = v.log2().floor() as i32;
        let m = v / 2f64.powi(e) - 1.0;
        (((e + bias) as u64) << mbits) | ((m * (1u64 << mbits) as f64) as u64)
    };
    match dt {
        0 | 1 => out[0] = v as i64 as u8,
        2 | 3 => out.copy_from_slice(&(v as i64 as u32).to_le_bytes()),
        4 | 5 => out.copy_from_slice(&(v as i64 as u64).to_le_bytes()),
        6 => out.copy_from_slice(&(narrow(15, 10) as u16).to_le_bytes()),
        7 => out.copy_from_slice(&(v as f32).to_le_bytes()),
        8 => out.copy_from_slice(&v.to_le_bytes()),
        9 => out.copy_from_slice(&(((v as f32).to_bits() >> 16) as u16).to_le_bytes()),
        10 => out[0] = narrow(7, 3) as u8,
        _ => out[0] = narrow(15, 2) as u8,
    }
}

// ---------------------------------------------------------------- resources

fn fd_count() -> usize {
    std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count())
}

fn rss_bytes() -> u64 {
    let s = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = s
        .split_whitespace()
        .nth(1)
        .and_then(|x| x.parse().ok())
        .unwrap_or(0);
    pages * 4096
}

fn shm_entries() -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir("/dev/shm")
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with("hetccl"))
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

fn last_error() -> String {
    // SAFETY: ncclGetLastError returns a valid NUL-terminated string.
    unsafe { CStr::from_ptr(ncclGetLastError(null_mut())) }
        .to_string_lossy()
        .into_owned()
}

// ---------------------------------------------------------------- one rank

/// What one rank saw.
#[derive(Debug, Default)]
struct RankReport {
    done: usize,
    wrong: usize,
    /// (op, code, message) of the call that failed, if one did.
    error: Option<String>,
    timed_out: bool,
    mismatches: Vec<String>,
}

#[derive(Clone, Copy)]
struct Handle(ncclComm_t);
// SAFETY: a handle is an opaque token, usable from any thread.
unsafe impl Send for Handle {}
unsafe impl Sync for Handle {}

/// Shared between the ranks of one process and the watchdog.
struct Shared {
    progress: AtomicU64,
    stop: AtomicBool,
    warm_rss: AtomicU64,
    warm_ranks: AtomicUsize,
}

/// 64-byte aligned buffer of MAX_BYTES + GUARD bytes.
struct Buf(Vec<u64>);
impl Buf {
    fn new() -> Self {
        Buf(vec![0; (MAX_BYTES + GUARD) / 8])
    }
    fn bytes(&mut self) -> &mut [u8] {
        let n = self.0.len() * 8;
        // SAFETY: a u64 vector viewed as bytes.
        unsafe { std::slice::from_raw_parts_mut(self.0.as_mut_ptr() as *mut u8, n) }
    }
}

/// What a checked byte range must hold.
#[derive(Clone, Copy, Debug)]
enum Want {
    /// Elements `first..` of the reduction over all ranks.
    Reduced { first: usize },
    /// Elements `first..` of rank `rank`'s input.
    Input { rank: usize, first: usize },
    /// Untouched (`FILL`).
    Fill,
}

/// Writes `elems` elements of `want` into `out`.
fn generate(op: &Op, tab: &[[u8; 8]], want: Want, elems: usize, out: &mut [u8]) {
    let es = DT_SIZE[op.dtype as usize];
    let out = &mut out[..elems * es];
    match want {
        Want::Fill => out.fill(FILL),
        Want::Input { rank, first } if op.reduces() => {
            let mut e = first;
            let mut o = 0;
            while o < out.len() {
                let v = op.values8(rank, e / 8);
                while o < out.len() {
                    out[o..o + es].copy_from_slice(&tab[usize::from(v[e % 8]) * 4][..es]);
                    o += es;
                    e += 1;
                    if e % 8 == 0 {
                        break;
                    }
                }
            }
        }
        Want::Input { rank, first } => {
            // Bytes of a stream of 64-bit words, mix(seed, rank, word).
            let mut j = first * es;
            let mut o = 0;
            while o < out.len() {
                let w = mix(op.seed, rank, j / 8).to_le_bytes();
                let off = j % 8;
                let take = (8 - off).min(out.len() - o);
                out[o..o + take].copy_from_slice(&w[off..off + take]);
                o += take;
                j += take;
            }
        }
        Want::Reduced { first } => {
            let mut e = first;
            let mut o = 0;
            while o < out.len() {
                let vs: [[u8; 8]; NRANKS] = std::array::from_fn(|r| op.values8(r, e / 8));
                while o < out.len() {
                    let q = op.reduced_q(std::array::from_fn(|r| vs[r][e % 8]));
                    out[o..o + es].copy_from_slice(&tab[q][..es]);
                    o += es;
                    e += 1;
                    if e % 8 == 0 {
                        break;
                    }
                }
            }
        }
    }
}

/// The first mismatch of `got` against `want`, generated chunk by chunk.
fn compare(op: &Op, tab: &[[u8; 8]], want: Want, got: &[u8], scratch: &mut [u8]) -> Option<String> {
    let es = DT_SIZE[op.dtype as usize];
    let chunk = scratch.len() / es;
    let elems = got.len() / es;
    let mut e0 = 0;
    while e0 < elems {
        let n = chunk.min(elems - e0);
        let w = match want {
            Want::Reduced { first } => Want::Reduced { first: first + e0 },
            Want::Input { rank, first } => Want::Input {
                rank,
                first: first + e0,
            },
            Want::Fill => Want::Fill,
        };
        let s = &mut scratch[..n * es];
        generate(op, tab, w, n, s);
        let g = &got[e0 * es..(e0 + n) * es];
        if g != &s[..] {
            let k = g
                .iter()
                .zip(s.iter())
                .position(|(a, b)| a != b)
                .unwrap_or(0);
            return Some(format!(
                "byte {} (element {}) is {:#04x}, want {:#04x} ({want:?})",
                e0 * es + k,
                e0 + k / es,
                g[k],
                s[k]
            ));
        }
        e0 += n;
    }
    None
}

/// The encodings of the values 0, 1/4, 2/4, ... 255/4 in the op's datatype.
fn table(dtype: i32) -> Vec<[u8; 8]> {
    let es = DT_SIZE[dtype as usize];
    (0..256)
        .map(|q| {
            let mut b = [0u8; 8];
            encode(dtype, q as f64 / 4.0, &mut b[..es]);
            b
        })
        .collect()
}

/// Random operations that count as warm-up (part 2) before RSS is sampled:
/// a tenth. (hetccl also caches up to 256 plans per communicator,
/// `MAX_PLANS` in `collectives/src/comm/plan_cache.rs`, emptied when full;
/// measured, that stays within the 5 % once the sweep has run.)
fn warm_ops_of(nops: usize) -> usize {
    (nops / 10).max(1)
}

/// Warm-up, part 1 (unchecked, zero inputs): the largest size of every
/// kind, in and out of place, sum and avg (avg pre-multiplies: more scratch),
/// every root, so that hetccl's per-communicator pools
/// (scratch buffers, `SCRATCH_POOL` in `collectives/src/api/launch.rs`) and
/// the allocator reach their high-water marks before RSS is sampled.
fn sweep_ops(seed: u64) -> Vec<Op> {
    let mut v = Vec::new();
    let mut rng = Rng::new(seed ^ 0x5eed);
    for kind in KINDS {
        let reduces = matches!(kind, Kind::AllReduce | Kind::Reduce | Kind::ReduceScatter);
        let rooted = matches!(
            kind,
            Kind::Broadcast | Kind::Reduce | Kind::Gather | Kind::Scatter
        );
        let in_places: &[bool] = if kind == Kind::SendRecv {
            &[false]
        } else {
            &[false, true]
        };
        let ops: &[i32] = if reduces { &[0, 4] } else { &[0] };
        let dtypes: &[i32] = &[7];
        let roots: Vec<usize> = if rooted {
            (0..NRANKS).collect()
        } else {
            vec![0]
        };
        let shifts: &[[usize; 2]] = if kind == Kind::SendRecv {
            &[[1, 2], [0, 3], [2, 2]]
        } else {
            &[[0, 0]]
        };
        for &in_place in in_places {
            for &op in ops {
                for &dtype in dtypes {
                    for &root in &roots {
                        for &sh in shifts {
                            let mut o = Op::draw(&mut rng, 0);
                            let factor = match kind {
                                Kind::AllReduce | Kind::Broadcast | Kind::Reduce => 1,
                                Kind::SendRecv => 2,
                                _ => NRANKS,
                            };
                            o.kind = kind;
                            o.in_place = in_place;
                            o.op = op;
                            o.dtype = dtype;
                            o.root = root;
                            o.shifts = sh;
                            o.count = MAX_BYTES / DT_SIZE[dtype as usize] / factor;
                            v.push(o);
                        }
                    }
                }
            }
        }
    }
    v
}

fn run_rank(
    comm: ncclComm_t,
    rank: usize,
    nops: usize,
    seed: u64,
    sh: &Shared,
    sweep: bool,
) -> RankReport {
    let mut rep = RankReport::default();
    let mut sbuf = Buf::new();
    let mut rbuf = Buf::new();
    let mut scratch = vec![0u8; 64 << 10];
    // Touch every page once so RSS reflects the buffers from the start.
    sbuf.bytes().fill(0);
    rbuf.bytes().fill(FILL);
    let warm_ops = if sweep { sweep_ops(seed) } else { Vec::new() };
    let mut rng = Rng::new(seed);
    let warm = warm_ops_of(nops);
    let verbose = std::env::var_os("HETCCL_SOAK_VERBOSE").is_some();
    let mut last_rss = 0;
    let total = warm_ops.len() + nops;
    for idx in 0..total {
        if sh.stop.load(Ordering::Acquire) {
            break;
        }
        let op = if idx < warm_ops.len() {
            Op {
                idx,
                ..warm_ops[idx]
            }
        } else {
            Op::draw(&mut rng, idx)
        };
        let checked = idx >= warm_ops.len();
        match run_op(comm, rank, &op, &mut sbuf, &mut rbuf, &mut scratch, checked) {
            Ok(bad) => {
                if !bad.is_empty() {
                    rep.wrong += 1;
                    if rep.mismatches.len() < 5 {
                        rep.mismatches.push(format!(
                            "rank {rank} {}: {}",
                            op.describe(),
                            bad.join("; ")
                        ));
                    }
                }
            }
            Err((code, msg)) => {
                rep.timed_out = code == 8 || msg.contains("timed out") || msg.contains("timeout");
                rep.error = Some(format!("rank {rank} {}: code {code}: {msg}", op.describe()));
                sh.stop.store(true, Ordering::Release);
                // Release the other ranks at once instead of at the timeout.
                unsafe { ncclCommAbort(comm) };
                return rep;
            }
        }
        rep.done += usize::from(checked);
        sh.progress.fetch_add(1, Ordering::Relaxed);
        if verbose && rank == 0 {
            // Each operation that grows RSS by more than 1 MiB, and a
            // sample every 500.
            let now = rss_bytes();
            if now > last_rss + (1 << 20) || idx % 500 == 0 {
                eprintln!(
                    "SOAK rank 0 after {}: rss {:.1} MiB",
                    op.describe(),
                    now as f64 / 1048576.0
                );
            }
            last_rss = now;
        }
        if idx + 1 == warm_ops.len() + warm
            && sh.warm_ranks.fetch_add(1, Ordering::AcqRel) + 1 == NRANKS
        {
            sh.warm_rss.store(rss_bytes(), Ordering::Release);
        }
    }
    rep
}

/// Runs one operation and checks it; Ok(list of mismatches) or Err(code, msg).
fn run_op(
    comm: ncclComm_t,
    rank: usize,
    op: &Op,
    sbuf: &mut Buf,
    rbuf: &mut Buf,
    scratch: &mut [u8],
    checked: bool,
) -> Result<Vec<String>, (i32, String)> {
    let n = NRANKS;
    let es = DT_SIZE[op.dtype as usize];
    let cb = op.count * es; // bytes of `count` elements
    let is_root = rank == op.root;
    let tab = if op.reduces() {
        table(op.dtype)
    } else {
        Vec::new()
    };
    let (sb, rb) = (sbuf.bytes(), rbuf.bytes());
    // Rank `r`'s input elements [first, first+elems) into `buf`.
    let fill_input = |buf: &mut [u8], r: usize, first: usize, elems: usize| {
        if checked {
            generate(op, &tab, Want::Input { rank: r, first }, elems, buf);
        } else {
            buf[..elems * es].fill(0); // warm-up: zeros, not checked
        }
    };
    let input = |r: usize, first: usize| Want::Input { rank: r, first };

    // (offset in rbuf, what, elements) to check after the call.
    let mut expect: Vec<(usize, Want, usize)> = Vec::new();
    let recv_extent; // bytes of rbuf the op may write (guards follow)
    let mut send_check: Option<usize> = None; // out of place: elements of sbuf to recheck
    rb[..(2 * n * cb).min(MAX_BYTES) + GUARD].fill(FILL);
    let sp = sb.as_mut_ptr();
    let rp = rb.as_mut_ptr();
    let s = null_mut();
    let code;
    // SAFETY (all calls): buffers hold MAX_BYTES + GUARD bytes and every
    // extent below is at most MAX_BYTES.
    unsafe {
        match op.kind {
            Kind::AllReduce | Kind::Broadcast | Kind::Reduce => {
                let has_input = op.kind != Kind::Broadcast || is_root;
                let (send, recv): (*const c_void, *mut c_void) = if op.in_place {
                    if has_input {
                        fill_input(rb, rank, 0, op.count);
                    }
                    (rp as *const c_void, rp as *mut c_void)
                } else {
                    if has_input {
                        fill_input(sb, rank, 0, op.count);
                        send_check = Some(op.count);
                    }
                    (sp as *const c_void, rp as *mut c_void)
                };
                code = match op.kind {
                    Kind::AllReduce => {
                        ncclAllReduce(send, recv, op.count, op.dtype, op.op, comm, s)
                    }
                    Kind::Broadcast if op.in_place && op.idx % 2 == 0 => {
                        ncclBcast(recv, op.count, op.dtype, op.root as i32, comm, s)
                    }
                    Kind::Broadcast => {
                        ncclBroadcast(send, recv, op.count, op.dtype, op.root as i32, comm, s)
                    }
                    _ => ncclReduce(
                        send,
                        recv,
                        op.count,
                        op.dtype,
                        op.op,
                        op.root as i32,
                        comm,
                        s,
                    ),
                };
                recv_extent = cb;
                let want = match op.kind {
                    Kind::AllReduce => Want::Reduced { first: 0 },
                    Kind::Broadcast => input(op.root, 0),
                    _ if is_root => Want::Reduced { first: 0 },
                    // Non-root: recv untouched (in place: still its input).
                    _ if op.in_place => input(rank, 0),
                    _ => Want::Fill,
                };
                expect.push((0, want, op.count));
            }
            Kind::AllGather => {
                let send = if op.in_place {
                    fill_input(&mut rb[rank * cb..], rank, 0, op.count);
                    rp.add(rank * cb)
                } else {
                    fill_input(sb, rank, 0, op.count);
                    send_check = Some(op.count);
                    sp
                };
                code = ncclAllGather(
                    send as *const c_void,
                    rp as *mut c_void,
                    op.count,
                    op.dtype,
                    comm,
                    s,
                );
                recv_extent = n * cb;
                for r in 0..n {
                    expect.push((r * cb, input(r, 0), op.count));
                }
            }
            Kind::ReduceScatter => {
                // Input: n*count elements; rank r's output is elements
                // [r*count, (r+1)*count) of the reduction.
                let (send, recv, out_off) = if op.in_place {
                    fill_input(rb, rank, 0, n * op.count);
                    (rp, rp.add(rank * cb), rank * cb)
                } else {
                    fill_input(sb, rank, 0, n * op.count);
                    send_check = Some(n * op.count);
                    (sp, rp, 0)
                };
                code = ncclReduceScatter(
                    send as *const c_void,
                    recv as *mut c_void,
                    op.count,
                    op.dtype,
                    op.op,
                    comm,
                    s,
                );
                recv_extent = if op.in_place { n * cb } else { cb };
                expect.push((
                    out_off,
                    Want::Reduced {
                        first: rank * op.count,
                    },
                    op.count,
                ));
            }
            Kind::AlltoAll => {
                // In place (supported since fd0c558): send == recv.
                let send = if op.in_place {
                    fill_input(rb, rank, 0, n * op.count);
                    rp
                } else {
                    fill_input(sb, rank, 0, n * op.count);
                    send_check = Some(n * op.count);
                    sp
                };
                code = ncclAlltoAll(
                    send as *const c_void,
                    rp as *mut c_void,
                    op.count,
                    op.dtype,
                    comm,
                    s,
                );
                recv_extent = n * cb;
                for j in 0..n {
                    expect.push((j * cb, input(j, rank * op.count), op.count));
                }
            }
            Kind::Gather => {
                let send = if op.in_place && is_root {
                    fill_input(&mut rb[rank * cb..], rank, 0, op.count);
                    rp.add(rank * cb)
                } else {
                    fill_input(sb, rank, 0, op.count);
                    send_check = Some(op.count);
                    sp
                };
                code = ncclGather(
                    send as *const c_void,
                    rp as *mut c_void,
                    op.count,
                    op.dtype,
                    op.root as i32,
                    comm,
                    s,
                );
                if is_root {
                    recv_extent = n * cb;
                    for j in 0..n {
                        expect.push((j * cb, input(j, 0), op.count));
                    }
                } else {
                    recv_extent = 0;
                    expect.push((0, Want::Fill, n * op.count));
                }
            }
            Kind::Scatter => {
                let recv = if is_root && op.in_place {
                    fill_input(rb, rank, 0, n * op.count);
                    rp.add(rank * cb)
                } else if is_root {
                    fill_input(sb, rank, 0, n * op.count);
                    send_check = Some(n * op.count);
                    rp
                } else {
                    rp
                };
                let send = if op.in_place { rp } else { sp };
                code = ncclScatter(
                    send as *const c_void,
                    recv as *mut c_void,
                    op.count,
                    op.dtype,
                    op.root as i32,
                    comm,
                    s,
                );
                let off = if op.in_place && is_root { rank * cb } else { 0 };
                recv_extent = if op.in_place && is_root { n * cb } else { cb };
                expect.push((off, input(op.root, rank * op.count), op.count));
            }
            Kind::SendRecv => {
                // Pair k sends elements [k*count, (k+1)*count) of its input
                // to rank+shift and receives them from rank-shift.
                let pairs: Vec<usize> = op
                    .shifts
                    .iter()
                    .copied()
                    .enumerate()
                    .filter(|&(k, sh)| k == 0 || sh != 0)
                    .map(|(_, sh)| sh)
                    .collect();
                fill_input(sb, rank, 0, pairs.len() * op.count);
                send_check = Some(pairs.len() * op.count);
                let mut c = ncclGroupStart();
                // Per-rank order of the calls inside the group.
                let recv_first = mix(op.seed, rank, 7) & 1 == 1;
                for (k, &sh) in pairs.iter().enumerate() {
                    let to = (rank + sh) % n;
                    let from = (rank + n - sh) % n;
                    let snd = |c: &mut i32| {
                        if *c == 0 {
                            *c = ncclSend(
                                sp.add(k * cb) as *const c_void,
                                op.count,
                                op.dtype,
                                to as i32,
                                comm,
                                s,
                            );
                        }
                    };
                    let rcv = |c: &mut i32| {
                        if *c == 0 {
                            *c = ncclRecv(
                                rp.add(k * cb) as *mut c_void,
                                op.count,
                                op.dtype,
                                from as i32,
                                comm,
                                s,
                            );
                        }
                    };
                    if recv_first {
                        rcv(&mut c);
                        snd(&mut c);
                    } else {
                        snd(&mut c);
                        rcv(&mut c);
                    }
                    expect.push((k * cb, input(from, k * op.count), op.count));
                }
                let e = ncclGroupEnd();
                code = if c != 0 { c } else { e };
                recv_extent = pairs.len() * cb;
            }
        }
    }
    if code != 0 {
        return Err((code, last_error()));
    }
    if !checked {
        return Ok(Vec::new());
    }

    // Check.
    let mut bad = Vec::new();
    for &(off, want, elems) in &expect {
        if let Some(m) = compare(op, &tab, want, &rb[off..off + elems * es], scratch) {
            bad.push(format!("recv at byte {off}: {m}"));
        }
    }
    if rb[recv_extent..recv_extent + GUARD]
        .iter()
        .any(|&b| b != FILL)
    {
        bad.push(format!("guard bytes after recv[{recv_extent}] overwritten"));
    }
    if let Some(elems) = send_check {
        if let Some(m) = compare(op, &tab, input(rank, 0), &sb[..elems * es], scratch) {
            bad.push(format!("the input of an out-of-place call changed: {m}"));
        }
    }
    Ok(bad)
}

// ---------------------------------------------------------------- drivers

fn env_num(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn set_env() {
    std::env::set_var("HETCCL_SOCKET_IFNAME", "lo");
    if std::env::var_os("HETCCL_TIMEOUT_S").is_none() {
        std::env::set_var("HETCCL_TIMEOUT_S", "30");
    }
}

fn check(r: i32, what: &str) {
    assert_eq!(r, 0, "{what} failed: {r}: {}", last_error());
}

/// Creates 4 ranks as threads, runs `nops` on each, destroys. Returns the
/// rank reports, whether the watchdog fired, and the warm RSS.
fn threads_lifecycle(
    nops: usize,
    seed: u64,
    hang_s: u64,
    sweep: bool,
) -> (Vec<RankReport>, bool, u64, u64, usize) {
    let mut id = ncclUniqueId::default();
    check(unsafe { ncclGetUniqueId(&mut id) }, "ncclGetUniqueId");
    let sh = Arc::new(Shared {
        progress: AtomicU64::new(0),
        stop: AtomicBool::new(false),
        warm_rss: AtomicU64::new(0),
        warm_ranks: AtomicUsize::new(0),
    });
    let comms: Arc<Mutex<Vec<Handle>>> = Arc::new(Mutex::new(Vec::new()));
    let done = Arc::new(AtomicBool::new(false));
    let hung = Arc::new(AtomicBool::new(false));
    // Watchdog: no progress for hang_s seconds = a hang; abort every comm.
    let wd = {
        let (sh, comms, done, hung) = (sh.clone(), comms.clone(), done.clone(), hung.clone());
        std::thread::spawn(move || {
            let mut last = (0u64, Instant::now());
            while !done.load(Ordering::Acquire) {
                std::thread::sleep(Duration::from_millis(200));
                let p = sh.progress.load(Ordering::Relaxed);
                if p != last.0 {
                    last = (p, Instant::now());
                } else if last.1.elapsed() > Duration::from_secs(hang_s) {
                    eprintln!(
                        "SOAK watchdog: no progress for {hang_s} s after {p} rank-ops: aborting"
                    );
                    hung.store(true, Ordering::Release);
                    sh.stop.store(true, Ordering::Release);
                    for c in comms.lock().unwrap().iter() {
                        unsafe { ncclCommAbort(c.0) };
                    }
                    return;
                }
            }
        })
    };
    let mut end_rss = 0;
    let reports: Vec<RankReport> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..NRANKS)
            .map(|r| {
                let (sh, comms) = (sh.clone(), comms.clone());
                s.spawn(move || {
                    let mut c: ncclComm_t = null_mut();
                    let rc = unsafe { ncclCommInitRank(&mut c, NRANKS as i32, id, r as i32) };
                    if rc != 0 {
                        return (
                            RankReport {
                                error: Some(format!("rank {r} init: code {rc}: {}", last_error())),
                                ..Default::default()
                            },
                            Handle(null_mut()),
                        );
                    }
                    comms.lock().unwrap().push(Handle(c));
                    (run_rank(c, r, nops, seed, &sh, sweep), Handle(c))
                })
            })
            .collect();
        let out: Vec<(RankReport, Handle)> = hs
            .into_iter()
            .enumerate()
            .map(|(r, h)| {
                h.join().unwrap_or_else(|_| {
                    (
                        RankReport {
                            error: Some(format!("rank {r} panicked")),
                            ..Default::default()
                        },
                        Handle(null_mut()),
                    )
                })
            })
            .collect();
        end_rss = rss_bytes();
        out.into_iter()
            .map(|(rep, h)| {
                if !h.0.is_null() {
                    // After an abort the handle is gone: destroy may refuse it.
                    let _ = unsafe { ncclCommDestroy(h.0) };
                }
                rep
            })
            .collect()
    });
    done.store(true, Ordering::Release);
    let _ = wd.join();
    let warm = sh.warm_rss.load(Ordering::Acquire);
    let ops = reports.iter().map(|r| r.done).min().unwrap_or(0);
    (reports, hung.load(Ordering::Acquire), warm, end_rss, ops)
}

/// The figures of one soak run, checked at the end.
struct Figures {
    mode: &'static str,
    trials: usize,
    hangs: usize,
    crashes: usize,
    wrong: usize,
    errors: Vec<String>,
    mismatches: Vec<String>,
    fd: (usize, usize),
    shm_left: Vec<String>,
    rss: (u64, u64),
    /// Whether RSS growth is asserted (runs long enough to fill the plan
    /// cache once per rank; see [`warm_ops_of`]).
    check_rss: bool,
    secs: f64,
}

impl Figures {
    fn print_and_check(&self) {
        let growth = if self.rss.0 > 0 {
            (self.rss.1 as f64 / self.rss.0 as f64 - 1.0) * 100.0
        } else {
            0.0
        };
        println!(
            "\nSOAK mode={} ranks={NRANKS} trials={} hangs={} crashes={} wrong={} errors={} \
             fds_before={} fds_after={} shm_left={} rss_warm_mib={:.1} rss_end_mib={:.1} \
             rss_growth_pct={growth:.2} secs={:.1}",
            self.mode,
            self.trials,
            self.hangs,
            self.crashes,
            self.wrong,
            self.errors.len(),
            self.fd.0,
            self.fd.1,
            self.shm_left.len(),
            self.rss.0 as f64 / 1048576.0,
            self.rss.1 as f64 / 1048576.0,
            self.secs
        );
        let mut fails = Vec::new();
        if self.hangs > 0 {
            fails.push(format!("{} hang(s)", self.hangs));
        }
        if self.crashes > 0 {
            fails.push(format!("{} crash(es)", self.crashes));
        }
        if self.wrong > 0 {
            fails.push(format!(
                "{} wrong result(s):\n    {}",
                self.wrong,
                self.mismatches.join("\n    ")
            ));
        }
        if !self.errors.is_empty() {
            fails.push(format!("errors:\n    {}", self.errors.join("\n    ")));
        }
        if self.fd.1 > self.fd.0 {
            fails.push(format!("open fds grew from {} to {}", self.fd.0, self.fd.1));
        }
        if !self.shm_left.is_empty() {
            fails.push(format!("/dev/shm entries left: {:?}", self.shm_left));
        }
        if self.check_rss && growth >= 5.0 {
            fails.push(format!("RSS grew by {growth:.2} % after the warm-up"));
        }
        assert!(
            fails.is_empty(),
            "soak {} failed:\n  {}",
            self.mode,
            fails.join("\n  ")
        );
    }
}

/// The soak tests count the process's fds: they must not overlap.
static SERIAL: Mutex<()> = Mutex::new(());

#[test]
fn soak_threads() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    set_env();
    let nops = env_num("HETCCL_SOAK_N", 400) as usize;
    let seed = env_num("HETCCL_SOAK_SEED", 0x5eed_0001);
    let hang_s = env_num("HETCCL_SOAK_HANG_S", 60);
    // Warm-up lifecycle: one-time lazy state must not count as a leak.
    let (w, _, _, _, _) = threads_lifecycle(3, seed ^ 1, hang_s, false);
    assert!(
        w.iter().all(|r| r.error.is_none()),
        "warm-up failed: {:?}",
        w
    );
    std::thread::sleep(Duration::from_millis(300));
    let shm_before = shm_entries();
    let fd_before = fd_count();
    let t0 = Instant::now();
    let (reps, hung, warm, end, ops) = threads_lifecycle(nops, seed, hang_s, true);
    let secs = t0.elapsed().as_secs_f64();
    std::thread::sleep(Duration::from_millis(300)); // the root thread ends
    let fd_after = fd_count();
    let shm_left: Vec<String> = shm_entries()
        .into_iter()
        .filter(|e| !shm_before.contains(e))
        .collect();
    let errors: Vec<String> = reps.iter().filter_map(|r| r.error.clone()).collect();
    Figures {
        mode: "threads",
        trials: ops,
        hangs: usize::from(hung || reps.iter().any(|r| r.timed_out)),
        crashes: reps
            .iter()
            .filter(|r| r.error.as_deref().is_some_and(|e| e.contains("panicked")))
            .count(),
        wrong: reps.iter().map(|r| r.wrong).max().unwrap_or(0),
        mismatches: reps.iter().flat_map(|r| r.mismatches.clone()).collect(),
        errors,
        fd: (fd_before, fd_after),
        shm_left,
        rss: (warm, end),
        check_rss: true,
        secs,
    }
    .print_and_check();
}

// ---------------------------------------------------------------- processes

fn id_to_hex(id: &ncclUniqueId) -> String {
    id.internal.iter().map(|b| format!("{b:02x}")).collect()
}

fn id_from_hex(s: &str) -> ncclUniqueId {
    let mut id = ncclUniqueId::default();
    for (i, b) in id.internal.iter_mut().enumerate() {
        *b = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).expect("hex id");
    }
    id
}

/// One rank of `soak_processes` (does nothing unless started by it).
#[test]
fn soak_child() {
    let Ok(rank) = std::env::var("HETCCL_SOAK_RANK") else {
        return;
    };
    let rank: usize = rank.parse().unwrap();
    let id = id_from_hex(&std::env::var("HETCCL_SOAK_ID").unwrap());
    let nops = env_num("HETCCL_SOAK_N", 100) as usize;
    let seed = env_num("HETCCL_SOAK_SEED", 0x5eed_0002);
    // One-time lazy state (logging) first, so that it does not count.
    let mut v = 0;
    check(unsafe { ncclGetVersion(&mut v) }, "ncclGetVersion");
    let fd_before = fd_count();
    let mut c: ncclComm_t = null_mut();
    check(
        unsafe { ncclCommInitRank(&mut c, NRANKS as i32, id, rank as i32) },
        "ncclCommInitRank",
    );
    let sh = Shared {
        progress: AtomicU64::new(0),
        stop: AtomicBool::new(false),
        warm_rss: AtomicU64::new(0),
        warm_ranks: AtomicUsize::new(NRANKS - 1), // one rank per process
    };
    // The warm-up sweep only matters where RSS is asserted.
    let rep = run_rank(c, rank, nops, seed, &sh, nops >= 600);
    let end_rss = rss_bytes();
    if rep.error.is_none() {
        check(unsafe { ncclCommDestroy(c) }, "ncclCommDestroy");
    }
    std::thread::sleep(Duration::from_millis(200));
    println!(
        "\nCHILD rank={rank} done={} wrong={} timed_out={} fds_before={fd_before} fds_after={} \
         rss_warm={} rss_end={end_rss}",
        rep.done,
        rep.wrong,
        rep.timed_out,
        fd_count(),
        sh.warm_rss.load(Ordering::Acquire)
    );
    for m in &rep.mismatches {
        println!("CHILD mismatch {m}");
    }
    if let Some(e) = &rep.error {
        println!("CHILD error {e}");
    }
}

#[test]
fn soak_processes() {
    if std::env::var_os("HETCCL_SOAK_RANK").is_some() {
        return; // a child runs soak_child only
    }
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    set_env();
    let nops = env_num("HETCCL_SOAK_N", 100);
    let hang_s = env_num("HETCCL_SOAK_HANG_S", 60);
    let shm_before = shm_entries();
    let mut id = ncclUniqueId::default();
    check(unsafe { ncclGetUniqueId(&mut id) }, "ncclGetUniqueId");
    let exe = std::env::current_exe().unwrap();
    let t0 = Instant::now();
    let mut kids: Vec<_> = (0..NRANKS)
        .map(|r| {
            let mut cmd = std::process::Command::new(&exe);
            cmd.args(["--exact", "soak_child", "--nocapture", "--test-threads=1"])
                .env("HETCCL_SOAK_RANK", r.to_string())
                .env("HETCCL_SOAK_ID", id_to_hex(&id))
                .env("HETCCL_SOAK_N", nops.to_string())
                // Two emulated nodes of two ranks: shm inside, TCP across.
                .env("HETCCL_HOST_ID", format!("node{}", r / 2))
                .env("HETCCL_SOCKET_IFNAME", "lo")
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped());
            cmd.spawn().expect("spawn soak child")
        })
        .collect();
    // Hard deadline: hetccl's own timeout, the watchdog budget, and slack
    // per operation.
    let deadline = t0 + Duration::from_secs(hang_s * 2 + 60 + nops / 2);
    let mut status = [None; NRANKS];
    let mut killed = false;
    while status.iter().any(|s| s.is_none()) {
        for (r, k) in kids.iter_mut().enumerate() {
            if status[r].is_none() {
                status[r] = k.try_wait().unwrap();
            }
        }
        if Instant::now() > deadline {
            killed = true;
            for k in kids.iter_mut() {
                let _ = k.kill();
            }
            for (r, k) in kids.iter_mut().enumerate() {
                if status[r].is_none() {
                    status[r] = Some(k.wait().unwrap());
                }
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let secs = t0.elapsed().as_secs_f64();
    std::thread::sleep(Duration::from_millis(200));
    let mut fig = Figures {
        mode: "processes",
        trials: 0,
        hangs: usize::from(killed),
        crashes: 0,
        wrong: 0,
        errors: Vec::new(),
        mismatches: Vec::new(),
        fd: (0, 0),
        shm_left: shm_entries()
            .into_iter()
            .filter(|e| !shm_before.contains(e))
            .collect(),
        rss: (0, 0),
        check_rss: nops >= 600,
        secs,
    };
    let mut done_min = usize::MAX;
    for (r, k) in kids.into_iter().enumerate() {
        let out = k.wait_with_output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let st = status[r].unwrap();
        use std::os::unix::process::ExitStatusExt;
        if st.signal().is_some() && !killed {
            fig.crashes += 1;
        }
        if !st.success() {
            fig.errors.push(format!(
                "rank {r} exited with {st}; stderr tail: {}",
                String::from_utf8_lossy(&out.stderr)
                    .lines()
                    .rev()
                    .take(15)
                    .collect::<Vec<_>>()
                    .into_iter()
                    .rev()
                    .collect::<Vec<_>>()
                    .join("\n      ")
            ));
        }
        let kv = |key: &str| -> u64 {
            stdout
                .lines()
                .find(|l| l.starts_with("CHILD rank="))
                .and_then(|l| {
                    l.split_whitespace()
                        .find_map(|f| f.strip_prefix(&format!("{key}=")).map(str::to_string))
                })
                .and_then(|v| v.parse().ok())
                .unwrap_or(0)
        };
        if !stdout.lines().any(|l| l.starts_with("CHILD rank=")) {
            fig.errors.push(format!(
                "rank {r} ({st}) printed no CHILD line; stdout: {stdout}\nstderr: {}",
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        done_min = done_min.min(kv("done") as usize);
        fig.wrong = fig.wrong.max(kv("wrong") as usize);
        // Per process: compare, then keep the worst.
        let (fb, fa) = (kv("fds_before") as usize, kv("fds_after") as usize);
        if r == 0 || fa as i64 - fb as i64 > fig.fd.1 as i64 - fig.fd.0 as i64 {
            fig.fd = (fb, fa);
        }
        let (rw, re) = (kv("rss_warm"), kv("rss_end"));
        if fig.rss.0 == 0 || (re as f64 / rw.max(1) as f64) > (fig.rss.1 as f64 / fig.rss.0 as f64)
        {
            fig.rss = (rw, re);
        }
        for l in stdout.lines() {
            if let Some(m) = l.strip_prefix("CHILD mismatch ") {
                fig.mismatches.push(m.to_string());
            }
            if let Some(e) = l.strip_prefix("CHILD error ") {
                if e.contains("timed out") || e.contains("code 8") {
                    fig.hangs += 1;
                }
                fig.errors.push(e.to_string());
            }
        }
    }
    fig.trials = if done_min == usize::MAX { 0 } else { done_min };
    fig.print_and_check();
}
