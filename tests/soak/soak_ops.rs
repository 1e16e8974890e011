//! The soak's operation model: the shared random sequence, the operations,
//! their exact inputs and expected outputs, and resource counters. See
//! `tests/soak/main.rs` for the driver.

use std::ffi::CStr;
use std::ptr::null_mut;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize};

use hetccl_abi::ncclComm_t;
use hetccl_collectives::api::version::ncclGetLastError;

pub const NRANKS: usize = 4;
pub const MAX_BYTES: usize = 4 << 20;
pub const GUARD: usize = 64;
pub const FILL: u8 = 0xCD;

// ---------------------------------------------------------------- rng

/// xorshift64*: the operation sequence, identical on every rank.
pub struct Rng(pub u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    pub fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// splitmix64: the value of element `i` of rank `r`'s input of one op.
pub fn mix(seed: u64, r: usize, i: usize) -> u64 {
    let mut z = seed ^ ((r as u64) << 56) ^ (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

// ---------------------------------------------------------------- types

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
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

pub const KINDS: [Kind; 9] = [
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
pub const DT_SIZE: [usize; 12] = [1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1];
pub const DT_NAME: [&str; 12] = [
    "int8", "uint8", "int32", "uint32", "int64", "uint64", "float16", "float32", "float64",
    "bfloat16", "fp8e4m3", "fp8e5m2",
];
pub const OP_NAME: [&str; 5] = ["sum", "prod", "max", "min", "avg"];

pub fn is_float(dt: i32) -> bool {
    dt >= 6
}
pub fn is_fp8(dt: i32) -> bool {
    dt >= 10
}

/// One operation, as every rank draws it.
#[derive(Clone, Copy, Debug)]
pub struct Op {
    pub idx: usize,
    pub kind: Kind,
    pub dtype: i32,
    pub op: i32,
    pub root: usize,
    pub in_place: bool,
    pub count: usize,
    /// Send/Recv: the peer shifts (second is 0 = none).
    pub shifts: [usize; 2],
    pub seed: u64,
}

impl Op {
    pub fn draw(rng: &mut Rng, idx: usize) -> Op {
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

    pub fn reduces(&self) -> bool {
        matches!(
            self.kind,
            Kind::AllReduce | Kind::Reduce | Kind::ReduceScatter
        )
    }

    pub fn describe(&self) -> String {
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
    pub fn values8(&self, r: usize, block: usize) -> [u8; 8] {
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
    pub fn reduced_q(&self, v: [u8; NRANKS]) -> usize {
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
pub fn encode(dt: i32, v: f64, out: &mut [u8]) {
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

pub fn fd_count() -> usize {
    std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count())
}

pub fn rss_bytes() -> u64 {
    let s = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = s
        .split_whitespace()
        .nth(1)
        .and_then(|x| x.parse().ok())
        .unwrap_or(0);
    pages * 4096
}

pub fn shm_entries() -> Vec<String> {
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

pub fn last_error() -> String {
    // SAFETY: ncclGetLastError returns a valid NUL-terminated string.
    unsafe { CStr::from_ptr(ncclGetLastError(null_mut())) }
        .to_string_lossy()
        .into_owned()
}

// ---------------------------------------------------------------- one rank

/// What one rank saw.
#[derive(Debug, Default)]
pub struct RankReport {
    pub done: usize,
    pub wrong: usize,
    /// (op, code, message) of the call that failed, if one did.
    pub error: Option<String>,
    pub timed_out: bool,
    pub mismatches: Vec<String>,
}

#[derive(Clone, Copy)]
pub struct Handle(pub ncclComm_t);
// SAFETY: a handle is an opaque token, usable from any thread.
unsafe impl Send for Handle {}
// SAFETY: as above; a shared handle is only copied.
unsafe impl Sync for Handle {}

/// Shared between the ranks of one process and the watchdog.
pub struct Shared {
    pub progress: AtomicU64,
    pub stop: AtomicBool,
    pub warm_rss: AtomicU64,
    pub warm_ranks: AtomicUsize,
}

/// 64-byte aligned buffer of MAX_BYTES + GUARD bytes.
pub struct Buf(Vec<u64>);
impl Buf {
    pub fn new() -> Self {
        Buf(vec![0; (MAX_BYTES + GUARD) / 8])
    }
    pub fn bytes(&mut self) -> &mut [u8] {
        let n = self.0.len() * 8;
        // SAFETY: a u64 vector viewed as bytes.
        unsafe { std::slice::from_raw_parts_mut(self.0.as_mut_ptr() as *mut u8, n) }
    }
}

/// What a checked byte range must hold.
#[derive(Clone, Copy, Debug)]
pub enum Want {
    /// Elements `first..` of the reduction over all ranks.
    Reduced { first: usize },
    /// Elements `first..` of rank `rank`'s input.
    Input { rank: usize, first: usize },
    /// Untouched (`FILL`).
    Fill,
}

/// Writes `elems` elements of `want` into `out`.
pub fn generate(op: &Op, tab: &[[u8; 8]], want: Want, elems: usize, out: &mut [u8]) {
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
pub fn compare(
    op: &Op,
    tab: &[[u8; 8]],
    want: Want,
    got: &[u8],
    scratch: &mut [u8],
) -> Option<String> {
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
pub fn table(dtype: i32) -> Vec<[u8; 8]> {
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
pub fn warm_ops_of(nops: usize) -> usize {
    (nops / 10).max(1)
}

/// Warm-up, part 1 (unchecked, zero inputs): the largest size of every
/// kind, in and out of place, sum and avg (avg pre-multiplies: more scratch),
/// every root, so that hetccl's per-communicator pools
/// (scratch buffers, `SCRATCH_POOL` in `collectives/src/api/launch.rs`) and
/// the allocator reach their high-water marks before RSS is sampled.
pub fn sweep_ops(seed: u64) -> Vec<Op> {
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
