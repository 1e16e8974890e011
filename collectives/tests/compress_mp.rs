//! Wire compression across processes: four ranks, one process each (this
//! test binary run again as each rank), on two "nodes" (`HETCCL_HOST_ID`
//! node0 for ranks 0-1, node1 for ranks 2-3, so the nodes talk over TCP on
//! loopback) with `HETCCL_COMPRESS=bf16`. Each rank checks:
//! - float32 sum and avg AllReduce and sum ReduceScatter are within
//!   (nranks+1)·2⁻⁸ relative of the exact result, and every AllReduce
//!   result is a bf16 value (rounded once where it was finished, so that
//!   all ranks agree); the parent checks that all ranks got the same bytes;
//! - int32 sum and float32 max stay exact, and so does float16 sum (bf16
//!   would not shrink float16, so it travels as it is).
//!
//! A second launch does the same with `fp8e4m3` (bound (nranks+1)·2⁻⁴,
//! results of 4 significant bits). A third sets `HETCCL_COMPRESS=bf16` on
//! rank 0 only: the ranks must turn compression off everywhere, with a
//! WARN, and still agree.

use std::path::Path;
use std::process::Command;
use std::ptr::null_mut;
use std::time::Duration;

use half::f16;
use hetccl_abi::ncclComm_t;
use hetccl_collectives::api::coll::{ncclAllReduce, ncclReduceScatter};
use hetccl_collectives::api::comm_init::ncclCommInitRank;
use hetccl_collectives::api::comm_life::ncclCommDestroy;
use hetccl_testkit::{ranks, threads::check};

const ROLE: &str = "COMPRESS_TEST_RANK";
const DIR: &str = "COMPRESS_TEST_DIR";
const EXPECT: &str = "COMPRESS_TEST_EXPECT";
const TEST: &str = "bf16_between_two_nodes";
const NRANKS: usize = 4;
const COUNT: usize = 100_003;
const INT32: i32 = 2;
const FLOAT16: i32 = 6;
const FLOAT32: i32 = 7;
const SUM: i32 = 0;
const MAX: i32 = 2;
const AVG: i32 = 4;

/// Rank `r`'s element `i`: in [0.1, 1.0), of one sign.
fn value(r: usize, i: usize) -> f32 {
    let mut s = (r as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15)
        ^ (i as u64).wrapping_mul(0x2545_f491_4f6c_dd1d);
    s ^= s >> 29;
    s = s.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    s ^= s >> 32;
    0.1 + 0.9 * (s >> 40) as f32 / (1u64 << 24) as f32
}

/// # Safety
/// `send` and `recv` hold the elements the call reads and writes.
unsafe fn allreduce<T>(send: &[T], recv: &mut [T], dt: i32, op: i32, c: ncclComm_t) {
    // SAFETY: per this function's contract; host memory.
    check(unsafe {
        ncclAllReduce(
            send.as_ptr().cast(),
            recv.as_mut_ptr().cast(),
            recv.len(),
            dt,
            op,
            c,
            null_mut(),
        )
    });
}

fn rel(got: f32, want: f64) -> f64 {
    ((f64::from(got) - want) / want).abs()
}

/// One rank's part: `format` is the compression in force ("off" when the
/// ranks must have turned it off). Writes the AllReduce results' bytes for
/// the parent.
fn child(rank: usize, dir: &Path, format: &str) {
    let compressed = format != "off";
    // Unit roundoff, and the low bits a rounded float32 result has clear.
    let (unit, low_bits) = match format {
        "fp8e4m3" => (2f64.powi(-4), 0xf_ffffu32),
        _ => (2f64.powi(-8), 0xffff),
    };
    let id = hetccl_testkit::ranks::shared_unique_id(dir, rank);
    let mut c: ncclComm_t = null_mut();
    // SAFETY: a valid out pointer; rank and size in range.
    check(unsafe { ncclCommInitRank(&mut c, NRANKS as i32, id, rank as i32) });
    let bound = (NRANKS as f64 + 1.0) * unit;
    let exact = |i: usize| (0..NRANKS).map(|r| f64::from(value(r, i))).sum::<f64>();
    let is_rounded = |x: f32| x.to_bits() & low_bits == 0;

    // float32 sum and avg.
    let send: Vec<f32> = (0..COUNT).map(|i| value(rank, i)).collect();
    let mut sum = vec![0f32; COUNT];
    let mut avg = vec![0f32; COUNT];
    // SAFETY: buffers of COUNT elements.
    unsafe {
        allreduce(&send, &mut sum, FLOAT32, SUM, c);
        allreduce(&send, &mut avg, FLOAT32, AVG, c);
    }
    let mut worst = 0f64;
    for i in 0..COUNT {
        worst = worst
            .max(rel(sum[i], exact(i)))
            .max(rel(avg[i], exact(i) / NRANKS as f64));
    }
    assert!(
        worst <= bound,
        "rank {rank}: relative error {worst} > {bound}"
    );
    let rounded = sum.iter().chain(&avg).filter(|&&x| is_rounded(x)).count();
    if compressed {
        assert_eq!(
            rounded,
            2 * COUNT,
            "rank {rank}: results are not {format} values"
        );
    } else {
        assert!(rounded < COUNT, "rank {rank}: results look compressed");
    }
    let bytes: Vec<u8> = sum
        .iter()
        .chain(&avg)
        .flat_map(|x| x.to_le_bytes())
        .collect();
    std::fs::write(dir.join(format!("out.{rank}")), bytes).unwrap();

    // float32 sum ReduceScatter: block `rank` of every input.
    let rs_send: Vec<f32> = (0..COUNT * NRANKS).map(|i| value(rank, i)).collect();
    let mut rs = vec![0f32; COUNT];
    // SAFETY: NRANKS·COUNT elements in, COUNT out; host memory.
    check(unsafe {
        ncclReduceScatter(
            rs_send.as_ptr().cast(),
            rs.as_mut_ptr().cast(),
            COUNT,
            FLOAT32,
            SUM,
            c,
            null_mut(),
        )
    });
    for (i, &got) in rs.iter().enumerate() {
        let want = exact(rank * COUNT + i);
        assert!(
            rel(got, want) <= bound,
            "rank {rank}: reducescatter {i}: {got} vs {want}"
        );
    }

    // Integers, max and float16 (bf16 would not shrink it) stay exact.
    let ints: Vec<i32> = (0..COUNT)
        .map(|i| (i as i32 % 1000) * (rank as i32 + 1))
        .collect();
    let mut isum = vec![0i32; COUNT];
    let mut fmax = vec![0f32; COUNT];
    let halves: Vec<u16> = (0..COUNT)
        .map(|i| f16::from_f32((i % 64) as f32).to_bits())
        .collect();
    let mut hsum = vec![0u16; COUNT];
    // SAFETY: buffers of COUNT elements.
    unsafe {
        allreduce(&ints, &mut isum, INT32, SUM, c);
        allreduce(&send, &mut fmax, FLOAT32, MAX, c);
        allreduce(&halves, &mut hsum, FLOAT16, SUM, c);
    }
    for i in 0..COUNT {
        assert_eq!(isum[i], (i as i32 % 1000) * 10, "int32 sum {i}");
        let m = (0..NRANKS).map(|r| value(r, i)).fold(0f32, f32::max);
        assert_eq!(fmax[i], m, "float32 max {i}");
        let (got, want) = (
            f16::from_bits(hsum[i]).to_f32(),
            (i % 64) as f32 * NRANKS as f32,
        );
        if format == "fp8e4m3" {
            // fp8 does compress float16.
            let err = f64::from((got - want).abs());
            assert!(err <= bound * f64::from(want), "float16 sum {i}: {got}");
        } else {
            assert_eq!(got, want, "float16 sum {i}");
        }
    }
    // SAFETY: a live communicator, destroyed once.
    check(unsafe { ncclCommDestroy(c) });
}

/// Four ranks on two host ids; rank `r` gets `HETCCL_COMPRESS=format` when
/// `compress_on(r)`; `expect` is the compression the ranks must use.
fn launch(label: &str, format: &str, compress_on: fn(usize) -> bool, expect: &str) {
    let compressed = expect != "off";
    let dir = std::env::temp_dir().join(format!("hetccl-compress-{label}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let exe = std::env::current_exe().unwrap();
    let cmds: Vec<Command> = (0..NRANKS)
        .map(|r| {
            let mut c = Command::new(&exe);
            ranks::clean_env(&mut c);
            c.args(["--exact", TEST, "--nocapture", "--test-threads=1"])
                .env(ROLE, r.to_string())
                .env(DIR, &dir)
                .env(EXPECT, expect)
                .env("HETCCL_HOST_ID", format!("node{}", r / 2))
                .env("HETCCL_SOCKET_IFNAME", "lo")
                .env("HETCCL_TIMEOUT_S", "60")
                .env("NCCL_DEBUG", "WARN");
            if compress_on(r) {
                c.env("HETCCL_COMPRESS", format);
            }
            c
        })
        .collect();
    let outs = ranks::run_ranks(cmds, Duration::from_secs(180));
    assert!(
        outs.iter().all(|o| o.ok()),
        "{label}:\n{}",
        ranks::report(&outs, 4000)
    );
    let first = std::fs::read(dir.join("out.0")).unwrap();
    for r in 1..NRANKS {
        let other = std::fs::read(dir.join(format!("out.{r}"))).unwrap();
        assert!(
            other == first,
            "{label}: rank {r}'s AllReduce results differ from rank 0's"
        );
    }
    if !compressed {
        let log = format!("{}{}", outs[0].stdout, outs[0].stderr);
        assert!(
            log.contains("HETCCL_COMPRESS differs"),
            "{label}: no warning on rank 0:\n{log}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bf16_between_two_nodes() {
    if let Ok(r) = std::env::var(ROLE) {
        let dir = std::env::var(DIR).unwrap();
        let expect = std::env::var(EXPECT).unwrap();
        child(r.parse().unwrap(), Path::new(&dir), &expect);
        return;
    }
    launch("bf16", "bf16", |_| true, "bf16");
    launch("fp8", "fp8e4m3", |_| true, "fp8e4m3");
    launch("differ", "bf16", |r| r == 0, "off");
}
