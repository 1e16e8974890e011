//! The emulated driver's f16, bf16 and fp8 kernels: against hetccl's host
//! kernels over every fp8 pair and every 16-bit value, and against known
//! results at the edges of rounding (ties, subnormals, overflow, NaN).

use hetccl_abi::DataType;
use hetccl_collectives::reduce::{self, ReduceOp, Scalar};
use hetccl_testkit::{cc, tmp_dir};

use super::command;

/// One kernel's cases: its name, and how hetccl's host kernels compute it.
enum Reference {
    /// `dst = op(a, b)`.
    Binary(ReduceOp),
    /// `dst = a*s + b` (avg, premulsum).
    MulAdd,
    /// `dst = a*s`.
    Premul,
}

/// One case: a kernel, its inputs, and how the host computes it.
struct Case {
    kernel: String,
    reference: Reference,
    dt: DataType,
    scalar: Scalar,
    a: Vec<u8>,
    b: Vec<u8>,
}

/// What the host kernels give for one case.
fn host_result(dt: DataType, r: &Reference, a: &[u8], b: &[u8], s: Scalar) -> Vec<u8> {
    let mut d = vec![0u8; a.len()];
    match r {
        Reference::Binary(op) => reduce::reduce3(&mut d, a, b, dt, *op).unwrap(),
        Reference::MulAdd => {
            let mut x = a.to_vec();
            reduce::scale(&mut x, dt, s).unwrap();
            reduce::reduce3(&mut d, &x, b, dt, ReduceOp::Sum).unwrap();
        }
        Reference::Premul => {
            d.copy_from_slice(a);
            reduce::scale(&mut d, dt, s).unwrap();
        }
    }
    d
}

/// Whether `v` (an element of `dt`) is a NaN, or a zero.
fn nan_or_zero(dt: DataType, v: u16) -> (bool, bool) {
    match dt {
        DataType::Float16 => (v & 0x7c00 == 0x7c00 && v & 0x3ff != 0, v & 0x7fff == 0),
        DataType::Bfloat16 => (v & 0x7f80 == 0x7f80 && v & 0x7f != 0, v & 0x7fff == 0),
        DataType::Float8e4m3 => (v & 0x7f == 0x7f, v & 0x7f == 0),
        _ => (v & 0x7c == 0x7c && v & 3 != 0, v & 0x7f == 0),
    }
}

/// The emulated f16, bf16 and fp8 kernels against hetccl's host kernels:
/// every pair of fp8 values, every float16/bfloat16 value against a
/// pseudo-random partner, for sum, prod, max, min, a*s + b (avg,
/// premulsum) and a*s (premul) with several scalars; bit for bit, except
/// that any NaN equals any NaN (the GPU's cvt gives a canonical NaN) and
/// max/min of +0 and -0 may keep either zero (host order differs).
#[test]
fn narrow_kernels_match_the_host_reference() {
    let dts = [
        (DataType::Float16, "f16"),
        (DataType::Bfloat16, "bf16"),
        (DataType::Float8e4m3, "f8e4m3"),
        (DataType::Float8e5m2, "f8e5m2"),
    ];
    let ops = [
        ("sum", ReduceOp::Sum),
        ("prod", ReduceOp::Prod),
        ("max", ReduceOp::Max),
        ("min", ReduceOp::Min),
    ];
    let mut cases: Vec<Case> = Vec::new();
    for (dt, sfx) in dts {
        let es = dt.size();
        let n = 1usize << 16;
        let (mut a, mut b) = (Vec::with_capacity(n * es), Vec::with_capacity(n * es));
        for i in 0..n {
            if es == 1 {
                a.push(i as u8);
                b.push((i >> 8) as u8);
            } else {
                let partner = (i as u32).wrapping_mul(0x9E37_79B1).rotate_left(13) as u16;
                a.extend_from_slice(&(i as u16).to_le_bytes());
                b.extend_from_slice(&partner.to_le_bytes());
            }
        }
        let mut add = |kernel: String, reference: Reference, scalar: Scalar| {
            cases.push(Case {
                kernel,
                reference,
                dt,
                scalar,
                a: a.clone(),
                b: b.clone(),
            })
        };
        for (name, op) in ops {
            let k = format!("hetccl_reduce_{sfx}_{name}");
            add(k, Reference::Binary(op), Scalar::default());
        }
        for v in [0.5, 1.5, -0.3, 3.0, 1e-3] {
            let s = Scalar::from_f64(dt, v);
            for name in ["avg", "premulsum"] {
                add(format!("hetccl_reduce_{sfx}_{name}"), Reference::MulAdd, s);
            }
            add(format!("hetccl_premul_{sfx}"), Reference::Premul, s);
        }
    }
    let got = run_cases(&cases, "every");
    let mut at = 0;
    let mut bad = Vec::new();
    for Case {
        kernel: k,
        reference: r,
        dt,
        scalar: s,
        a,
        b,
    } in &cases
    {
        let want = host_result(*dt, r, a, b, *s);
        let dev = &got[at..at + want.len()];
        at += want.len();
        let es = dt.size();
        let minmax = matches!(r, Reference::Binary(ReduceOp::Max | ReduceOp::Min));
        let mut wrong = 0;
        for i in 0..want.len() / es {
            let word = |v: &[u8]| {
                if es == 1 {
                    u16::from(v[i])
                } else {
                    u16::from_le_bytes([v[2 * i], v[2 * i + 1]])
                }
            };
            let (x, y) = (word(dev), word(&want));
            let ((xn, xz), (yn, yz)) = (nan_or_zero(*dt, x), nan_or_zero(*dt, y));
            if x == y || (xn && yn) || (minmax && xz && yz) {
                continue;
            }
            if wrong < 3 {
                let ai = word(a);
                let bi = word(b);
                bad.push(format!(
                    "{k} (s = {:02x?}): a {ai:#x}, b {bi:#x}: device {x:#x}, host {y:#x}",
                    s.bytes(*dt)
                ));
            }
            wrong += 1;
        }
        if wrong > 0 {
            bad.push(format!(
                "{k}: {wrong} of {} elements differ",
                want.len() / es
            ));
        }
    }
    assert_eq!(at, got.len(), "output size");
    assert!(
        bad.is_empty(),
        "emulated kernels differ from the host's:\n{}",
        bad.join("\n")
    );
}

/// Runs `cases` through the emulated kernels (the self-test's `narrow`
/// mode) in a directory named after `tag`; returns every case's output,
/// one after the other.
fn run_cases(cases: &[Case], tag: &str) -> Vec<u8> {
    let dir = tmp_dir().join(format!("fake_cuda_narrow_{tag}"));
    std::fs::create_dir_all(&dir).unwrap();
    let (inp, outp) = (dir.join("cases.bin"), dir.join("out.bin"));
    let mut file = Vec::new();
    for Case {
        kernel: k,
        dt,
        scalar: s,
        a,
        b,
        ..
    } in cases
    {
        file.extend_from_slice(&(k.len() as u32).to_le_bytes());
        file.extend_from_slice(k.as_bytes());
        file.extend_from_slice(&(dt.size() as u32).to_le_bytes());
        file.extend_from_slice(&((a.len() / dt.size()) as u64).to_le_bytes());
        let mut raw = [0u8; 8];
        raw[..dt.size()].copy_from_slice(s.bytes(*dt));
        file.extend_from_slice(&raw);
        file.extend_from_slice(a);
        file.extend_from_slice(b);
    }
    std::fs::write(&inp, &file).unwrap();
    let (ip, op) = (inp.display().to_string(), outp.display().to_string());
    let out = cc::run_ok(&mut command("narrow", &[&ip, &op], &[]));
    let kv = cc::parse_kv(&String::from_utf8_lossy(&out.stdout));
    assert_eq!(
        kv.get("narrow.cases").map(String::as_str),
        Some(&*cases.len().to_string())
    );
    std::fs::read(&outp).unwrap()
}

/// A result that is any NaN of the type.
const NAN: u16 = 0xffff;

/// Known results, element by element: (kernel suffix, op, a, b, want) as
/// bits. The operation is exact in float, so each case checks one
/// rounding to the type: ties go to the even neighbour, subnormals round
/// the same way, float16 and bfloat16 overflow to infinity, and fp8
/// saturates (CUDA's `__NV_SATFINITE`, which `__nv_fp8_e4m3(__half)` and
/// `__nv_fp8_e5m2(__half)` use): out-of-range values and infinities become
/// the largest finite value (e4m3 448 = 0x7e, e5m2 57344 = 0x7b), NaN stays
/// NaN.
const EDGES: &[(DataType, &str, ReduceOp, u16, u16, u16)] = {
    use DataType::{Bfloat16 as B, Float16 as H, Float8e4m3 as E4, Float8e5m2 as E5};
    use ReduceOp::{Prod as P, Sum as S};
    &[
        // float16: 1 = 0x3c00, 2^-11 = 0x1000.
        (H, "f16", S, 0x3c00, 0x1000, 0x3c00), // 1 + 2^-11: tie, to even (down)
        (H, "f16", S, 0x3c01, 0x1000, 0x3c02), // tie, to even (up)
        (H, "f16", S, 0x3c00, 0x1001, 0x3c01), // just above the tie
        (H, "f16", P, 0x3c01, 0x3c01, 0x3c02), // 1 + 2^-9 + 2^-20
        (H, "f16", S, 0x0001, 0x0001, 0x0002), // subnormals
        (H, "f16", S, 0x03ff, 0x0001, 0x0400), // into the smallest normal
        (H, "f16", P, 0x0400, 0x3800, 0x0200), // 2^-14 * 0.5: exact subnormal
        (H, "f16", P, 0x0001, 0x3800, 0x0000), // 2^-25: tie, to even (0)
        (H, "f16", P, 0x0003, 0x3800, 0x0002), // 1.5 * 2^-24: tie, to 2
        (H, "f16", P, 0x0001, 0xb800, 0x8000), // -2^-25: to -0
        (H, "f16", S, 0x7bff, 0x4800, 0x7bff), // 65504 + 8: below the tie
        (H, "f16", S, 0x7bff, 0x4c00, 0x7c00), // 65504 + 16 = 65520: tie, to inf
        (H, "f16", S, 0xfbff, 0xcc00, 0xfc00), // to -inf
        (H, "f16", S, 0x7c00, 0x3c00, 0x7c00), // inf + 1
        (H, "f16", S, 0x7c00, 0xfc00, NAN),    // inf - inf
        // bfloat16: 1 = 0x3f80, 2^-8 = 0x3b80, the largest finite 0x7f7f.
        (B, "bf16", S, 0x3f80, 0x3b80, 0x3f80), // tie, to even (down)
        (B, "bf16", S, 0x3f81, 0x3b80, 0x3f82), // tie, to even (up)
        (B, "bf16", S, 0x7f7f, 0x7a80, 0x7f7f), // max + a quarter unit
        (B, "bf16", S, 0x7f7f, 0x7b00, 0x7f80), // max + half a unit: tie, to inf
        (B, "bf16", S, 0x0001, 0x0001, 0x0002), // subnormals
        (B, "bf16", S, 0x007f, 0x0001, 0x0080), // into the smallest normal
        (B, "bf16", P, 0x0001, 0x3f00, 0x0000), // 2^-134: tie, to even (0)
        (B, "bf16", P, 0x0003, 0x3f00, 0x0002), // 1.5 * 2^-133: tie, to 2
        (B, "bf16", S, 0xff80, 0x7f80, NAN),    // -inf + inf
        // e4m3 (bias 7, no infinity, NaN 0x7f/0xff): 1 = 0x38, 2^-4 = 0x18,
        // 0.5 = 0x30, 8 = 0x50, 16 = 0x58, 448 = 0x7e.
        (E4, "f8e4m3", S, 0x38, 0x18, 0x38), // 1.0625: tie, to even (1)
        (E4, "f8e4m3", S, 0x39, 0x18, 0x3a), // 1.1875: tie, to even (1.25)
        (E4, "f8e4m3", S, 0x07, 0x01, 0x08), // subnormals into the smallest normal
        (E4, "f8e4m3", P, 0x01, 0x30, 0x00), // 2^-10: tie, to even (0)
        (E4, "f8e4m3", P, 0x03, 0x30, 0x02), // 1.5 * 2^-9: tie, to 2
        (E4, "f8e4m3", P, 0x01, 0xb0, 0x80), // to -0
        (E4, "f8e4m3", S, 0x7e, 0x50, 0x7e), // 456: rounds to 448
        (E4, "f8e4m3", S, 0x7e, 0x58, 0x7e), // 464: past 448, saturates (not NaN)
        (E4, "f8e4m3", S, 0x7e, 0x7e, 0x7e), // 896: saturates
        (E4, "f8e4m3", S, 0xfe, 0xfe, 0xfe), // -896: saturates
        (E4, "f8e4m3", S, 0x7f, 0x38, NAN),  // NaN + 1
        (E4, "f8e4m3", S, 0xff, 0x38, NAN),  // -NaN + 1
        // e5m2 (bias 15, IEEE-like): 1 = 0x3c, 0.125 = 0x30, 0.5 = 0x38,
        // 4096 = 0x6c, 57344 = 0x7b, inf = 0x7c.
        (E5, "f8e5m2", S, 0x3c, 0x30, 0x3c), // 1.125: tie, to even (1)
        (E5, "f8e5m2", S, 0x3d, 0x30, 0x3e), // 1.375: tie, to even (1.5)
        (E5, "f8e5m2", S, 0x03, 0x01, 0x04), // subnormals into the smallest normal
        (E5, "f8e5m2", P, 0x01, 0x38, 0x00), // 2^-17: tie, to even (0)
        (E5, "f8e5m2", P, 0x03, 0x38, 0x02), // 1.5 * 2^-16: tie, to 2
        (E5, "f8e5m2", S, 0x7b, 0x6c, 0x7b), // 61440: tie, saturates (not inf)
        (E5, "f8e5m2", S, 0x7b, 0x7b, 0x7b), // 114688 (inf in f16): saturates
        (E5, "f8e5m2", S, 0x7c, 0x3c, 0x7b), // inf + 1: saturates
        (E5, "f8e5m2", S, 0xfc, 0xbc, 0xfb), // -inf - 1: saturates
        (E5, "f8e5m2", S, 0x7c, 0xfc, NAN),  // inf - inf
        (E5, "f8e5m2", S, 0x7d, 0x3c, NAN),  // NaN + 1
    ]
};

/// Little-endian bytes of element bits `v` in `dt`.
fn elem(dt: DataType, v: u16) -> Vec<u8> {
    v.to_le_bytes()[..dt.size()].to_vec()
}

/// Whether `got` (bits of `dt`) is what an [`EDGES`] entry wants.
fn matches(dt: DataType, got: u16, want: u16) -> bool {
    if want == NAN {
        nan_or_zero(dt, got).0
    } else {
        got == want
    }
}

/// The emulated kernels, and hetccl's host kernels, give the known results
/// of [`EDGES`] bit for bit: both round to nearest even and saturate as
/// CUDA's fp8 conversions do.
#[test]
fn narrow_kernels_round_known_edges() {
    let name = |op: ReduceOp| if op == ReduceOp::Sum { "sum" } else { "prod" };
    let cases: Vec<Case> = EDGES
        .iter()
        .map(|&(dt, sfx, op, a, b, _)| Case {
            kernel: format!("hetccl_reduce_{sfx}_{}", name(op)),
            reference: Reference::Binary(op),
            dt,
            scalar: Scalar::default(),
            a: elem(dt, a),
            b: elem(dt, b),
        })
        .collect();
    let got = run_cases(&cases, "edges");
    let mut at = 0;
    let mut bad = Vec::new();
    for (c, &(dt, _, _, a, b, want)) in cases.iter().zip(EDGES) {
        let es = dt.size();
        let word = |v: &[u8]| {
            if es == 1 {
                u16::from(v[0])
            } else {
                u16::from_le_bytes([v[0], v[1]])
            }
        };
        let dev = word(&got[at..at + es]);
        at += es;
        let host = word(&host_result(dt, &c.reference, &c.a, &c.b, c.scalar));
        for (who, v) in [("emulated kernel", dev), ("host kernel", host)] {
            if !matches(dt, v, want) {
                bad.push(format!(
                    "{}: {a:#x}, {b:#x}: {who} gives {v:#x}, want {}",
                    c.kernel,
                    if want == NAN {
                        "NaN".into()
                    } else {
                        format!("{want:#x}")
                    }
                ));
            }
        }
    }
    assert_eq!(at, got.len(), "output size");
    assert!(bad.is_empty(), "wrong roundings:\n{}", bad.join("\n"));
}
