//! hetccl's CUDA-buffer path, end to end, without a GPU: N processes run
//! `tests/c/device_check*.c` (compiled against NVIDIA's real `nccl.h` and
//! `cuda.h`, linked to NVIDIA's `libnccl.so.2`) with `LD_PRELOAD=libhetccl.so`
//! and the emulated CUDA driver of `tests/c/fake_cuda.c` first in
//! `LD_LIBRARY_PATH`, so hetccl's `cudarc` loads it as `libcuda.so.1`.
//!
//! The emulated driver maps device memory `PROT_NONE` in the process, so a
//! host access of a device pointer crashes the rank; its streams run their
//! operations in order on worker threads, so results are right only if
//! hetccl orders its work on the caller's stream. It is as strict as CUDA
//! where hetccl could deadlock or misuse a context: frees, IPC closes and
//! module loads wait for idle streams (a watchdog aborts a deadlock),
//! events and kernels must be used in their stream's context, host
//! functions share one thread and may not call CUDA. What it cannot show
//! is listed in docs/gpu.md ("Tested without a GPU").
//!
//! Layouts: 2 ranks (every mode), 4 ranks on one device, 3 ranks with
//! nonblocking communicators, 4 ranks on two devices, 2 ranks with stream
//! memory operations switched off, and the jobs of CUDA's rules (one thread
//! driving two GPUs, a group with inits, a staging-pool overflow, IPC
//! eviction under load, narrow floats, CUBIN and PTX loading).

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use hetccl_testkit::coll::Job;
use hetccl_testkit::nvrtc as nvrtc_path;
use hetccl_testkit::perf::perf_bin;
use hetccl_testkit::{cc, coll, fake_cuda, hetccl_so, ranks, tmp_dir};

/// The emulated driver's directory.
fn driver_dir() -> &'static Path {
    fake_cuda::fake_cuda_dir("gpu_fake_driver")
}

/// device_check (`tests/c/device_check*.c`), compiled once, linked to the
/// emulated driver.
fn exe() -> &'static Path {
    fake_cuda::device_check("gpu_fake_driver")
}

/// NVIDIA's NVRTC, which compiles hetccl's reduction kernels (the emulated
/// driver then runs them): `HETCCL_NVRTC_LIB`, else the copy
/// `scripts/fetch-nvrtc.sh` caches. Missing: `None`, or a failure when
/// `HETCCL_REQUIRE_NVRTC=1` (as `scripts/test.sh` sets).
fn nvrtc() -> Option<String> {
    let p = nvrtc_path::nvrtc_path();
    if p.is_none() && nvrtc_path::required() {
        panic!("HETCCL_REQUIRE_NVRTC=1 but NVRTC is missing: run scripts/fetch-nvrtc.sh");
    }
    p.map(|p| p.display().to_string())
}

/// A job with the emulated driver on the library path (and NVRTC, when
/// present, so that device reductions can run as kernels).
fn job(label: &str, n: usize, modes: &str) -> Job {
    let j = Job::new(label, n, modes).env("LD_LIBRARY_PATH", &driver_dir().display().to_string());
    match nvrtc() {
        Some(p) => j.env("HETCCL_NVRTC_LIB", &p),
        None => j,
    }
}

/// `job` with hetccl's per-call path lines (`NCCL_DEBUG_SUBSYS=COLL`).
fn logged(label: &str, n: usize, modes: &str) -> Job {
    job(label, n, modes)
        .env("NCCL_DEBUG", "INFO")
        .env("NCCL_DEBUG_SUBSYS", "COLL")
}

fn run(jobs: Vec<Job>) -> Vec<coll::Outcome> {
    let so = hetccl_so();
    coll::run_all("gpu_fake_driver", exe(), &so, jobs)
}

/// Per rank, how many calls of `kind` (hetccl's lower-case name) took each
/// path: (CUDA IPC, staged through host memory).
fn paths(o: &coll::Outcome, kind: &str) -> Vec<(usize, usize)> {
    o.outs
        .iter()
        .map(|r| {
            let lines = || r.stdout.lines().chain(r.stderr.lines());
            let count = |what: &str| {
                lines()
                    .filter(|l| l.contains(&format!("hetccl: {kind} count ")) && l.ends_with(what))
                    .count()
            };
            (count(": CUDA IPC"), count(": staged through host memory"))
        })
        .collect()
}

/// Every mode on 2 ranks, one device. Collectives, alone or in groups
/// without sends and receives, run through CUDA IPC (reductions as kernels
/// when NVRTC is present); groups with sends and receives, and pinned host
/// buffers, are staged through host memory.
#[test]
fn two_ranks_every_mode() {
    let out = run(vec![logged(
        "dev_2",
        2,
        "coll,async,group,sendrecv,coalesced,avgpremul,capture,memalloc,pinned,mixed",
    )]);
    let o = &out[0];
    let mut ipc_kinds = vec!["allgather", "broadcast", "alltoall"];
    if nvrtc().is_some() {
        ipc_kinds.extend(["allreduce", "reduce", "reducescatter"]);
    }
    for kind in ipc_kinds {
        for (r, (ipc, _)) in paths(o, kind).into_iter().enumerate() {
            // coll runs each kind at 3 counts (allreduce 9 calls).
            assert!(
                ipc >= 3,
                "rank {r}: {kind} ran {ipc} times through CUDA IPC"
            );
        }
    }
    for kind in ["send", "recv"] {
        for (r, (ipc, staged)) in paths(o, kind).into_iter().enumerate() {
            // coll's ring at 4 counts, group's ring, and sendrecv's 2
            // messages per pair (self included).
            assert!(
                ipc >= 9 && staged == 0,
                "rank {r}: {kind}: {ipc} IPC, {staged} staged"
            );
        }
    }
    for (r, (_, staged)) in paths(o, "allreduce").into_iter().enumerate() {
        // The AllReduce of the group with sends and receives, and the
        // pinned-buffer one.
        assert!(staged >= 2, "rank {r}: {staged} staged allreduce calls");
    }
    if nvrtc().is_some() {
        // coll's four, the coalesced group's one, and avgpremul's PreMulSum
        // one (per-rank scalars: pre-multiplied on the GPU).
        for (r, (ipc, _)) in paths(o, "reducescatter").into_iter().enumerate() {
            assert!(ipc >= 6, "rank {r}: {ipc} reducescatters through CUDA IPC");
        }
    }
    // The coalesced group (no sends or receives) runs call by call through
    // CUDA IPC: one more broadcast than coll's four.
    for (r, (ipc, _)) in paths(o, "broadcast").into_iter().enumerate() {
        assert!(ipc >= 5, "rank {r}: {ipc} broadcasts through CUDA IPC");
    }
}

/// Calls whose shapes differ between ranks fail on every rank with
/// `ncclInvalidUsage` once the stream is released, and write nothing: an
/// AllGather whose count differs (caught by the CUDA IPC path's descriptor
/// check), and a send/recv ring whose receives are of other sizes than the
/// sends (refused through the mailboxes).
#[test]
fn mismatched_device_calls_fail_on_every_rank() {
    let out = run(vec![
        job("dev_mismatch", 2, "mismatch"),
        job("dev_mismatch_p2p", 2, "mismatch_p2p"),
    ]);
    for (o, (m, word)) in out
        .iter()
        .zip([("mismatch", "(CUDA IPC)"), ("mismatch_p2p", "mismatched")])
    {
        for r in &o.outs {
            assert_eq!(
                r.get(&format!("{m}.async")).as_deref(),
                Some("5"),
                "{m}: rank {}: {}",
                r.rank,
                r.stdout
            );
            let msg = r.get("mismatch.last_error").unwrap_or_default();
            assert!(msg.contains(word), "{m}: rank {}: {msg}", r.rank);
        }
    }
}

/// Several ranks on one device (no duplicate-GPU refusal), and the
/// nonblocking communicators, through CUDA IPC.
#[test]
fn ranks_sharing_a_device_and_nonblocking() {
    let out = run(vec![
        logged("dev_4_one_device", 4, "coll,group,sendrecv,async"),
        logged("dev_3_nonblocking", 3, "coll,group,sendrecv,avgpremul").args(["--nonblocking"]),
    ]);
    for o in &out {
        for (r, (ipc, _)) in paths(o, "allgather").into_iter().enumerate() {
            assert!(ipc >= 6, "rank {r}: {ipc} allgather calls through CUDA IPC");
        }
    }
}

/// Two nodes of two ranks (`HETCCL_HOST_ID`): no CUDA IPC across nodes, so
/// every call is staged, and the large ones are pipelined in pieces over
/// the host engine's network path.
#[test]
fn two_nodes_stage_and_pipeline() {
    let out = run(vec![logged(
        "dev_2x2_nodes",
        4,
        "coll,group,sendrecv,async",
    )
    .rank_env(|r, _| {
        vec![("HETCCL_HOST_ID".into(), format!("node{}", r / 2))]
    })]);
    for kind in ["allreduce", "broadcast", "reduce", "allgather", "send"] {
        for (r, (ipc, staged)) in paths(&out[0], kind).into_iter().enumerate() {
            assert!(
                ipc == 0 && staged >= 4,
                "rank {r}: {kind}: {ipc} IPC, {staged} staged"
            );
        }
    }
}

/// A rank dies right after init: the others' device AllReduce must release
/// their streams and report `ncclRemoteError` within the timeout, through
/// CUDA IPC's waits (one node) and through staging (two emulated nodes).
#[test]
fn a_dead_peer_releases_the_streams_with_an_error() {
    let out = run(vec![
        logged("dev_3_peer_death", 3, "peerdeath").env("HETCCL_TIMEOUT_S", "20"),
        logged("dev_2x2_peer_death", 4, "peerdeath")
            .env("HETCCL_TIMEOUT_S", "20")
            .rank_env(|r, _| vec![("HETCCL_HOST_ID".into(), format!("node{}", r / 2))]),
    ]);
    for o in &out {
        for r in &o.outs[..o.outs.len() - 1] {
            let ms: f64 = r
                .get("peerdeath.ms")
                .and_then(|v| v.parse().ok())
                .unwrap_or(1e9);
            assert!(ms < 30_000.0, "rank {}: the failure took {ms} ms", r.rank);
            eprintln!(
                "rank {}: {ms} ms, call {:?}, async {:?}, next {:?}: {:?}",
                r.rank,
                r.get("peerdeath.call_rc"),
                r.get("peerdeath.async"),
                r.get("peerdeath.again"),
                r.get("peerdeath.last_error")
            );
        }
    }
}

/// The CUDA IPC protocol's sequence outlives the proxy thread, which ends
/// after 10 s without calls: the call after the pause takes the same path
/// with the right result.
#[test]
fn device_calls_after_the_proxy_went_idle() {
    let out = run(vec![logged("dev_2_idle", 2, "idle")]);
    for (r, (ipc, staged)) in paths(&out[0], "allreduce").into_iter().enumerate() {
        let want = if nvrtc().is_some() { (2, 0) } else { (0, 2) };
        assert_eq!(
            (ipc, staged),
            want,
            "rank {r}: allreduce paths (IPC, staged)"
        );
    }
}

/// Device-buffer calls on the timeline and in the metrics: with
/// `HETCCL_TRACE_FILE`, each rank's file holds, on the GPU proxy's track,
/// a `queued` (enqueued to started) and a `run` slice per device call, with
/// trace ids that match across ranks; `hetcclCommGetStats` is not reachable
/// from the C program, so the enqueue-to-start histogram is checked through
/// `HETCCL_METRICS_FILE`.
#[test]
fn device_calls_on_the_timeline_and_in_the_metrics() {
    let dir = hetccl_testkit::tmp_dir().join("gpu_timeline");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let trace = dir.join("t.%r.json").display().to_string();
    let metrics = dir.join("m.%r.prom").display().to_string();
    run(vec![job("dev_2_timeline", 2, "idle")
        .env("HETCCL_TRACE_FILE", &trace)
        .env("HETCCL_METRICS_FILE", &metrics)]);
    let mut ids: Vec<Vec<String>> = Vec::new();
    for r in 0..2 {
        let text = std::fs::read_to_string(dir.join(format!("t.{r}.json")))
            .unwrap_or_else(|e| panic!("rank {r}: no timeline: {e}"));
        let v: serde_json::Value = serde_json::from_str(&text).expect("valid JSON");
        let events = v["traceEvents"].as_array().expect("traceEvents");
        let proxy_tids: Vec<&serde_json::Value> = events
            .iter()
            .filter(|e| e["ph"] == "M" && e["args"]["name"] == "hetccl-gpu-proxy")
            .map(|e| &e["tid"])
            .collect();
        let device: Vec<&serde_json::Value> =
            events.iter().filter(|e| e["cat"] == "device").collect();
        let runs: Vec<String> = device
            .iter()
            .filter(|e| e["name"] == "allreduce run")
            .map(|e| e["args"]["trace_id"].as_str().unwrap_or("").to_string())
            .collect();
        let queued = device
            .iter()
            .filter(|e| e["name"] == "allreduce queued")
            .count();
        assert_eq!(
            runs.len(),
            2,
            "rank {r}: device allreduce slices: {device:?}"
        );
        assert_eq!(queued, 2, "rank {r}: queued slices");
        assert!(
            device.iter().all(|e| proxy_tids.contains(&&e["tid"])),
            "rank {r}: device slices off the proxy's track"
        );
        assert!(runs.iter().all(|id| id.contains(":dev:")), "{runs:?}");
        ids.push(runs);
        let prom = std::fs::read_to_string(dir.join(format!("m.{r}.prom"))).unwrap();
        let count = prom
            .lines()
            .find(|l| l.starts_with("hetccl_device_queue_wait_seconds_count"))
            .and_then(|l| l.split_whitespace().last())
            .unwrap_or_else(|| panic!("rank {r}: no device queue wait in\n{prom}"));
        assert_eq!(count, "2", "rank {r}: device queue wait count");
    }
    assert_eq!(ids[0], ids[1], "device trace ids differ between ranks");
}

/// Two devices, ranks alternating between them: CUDA IPC through peer
/// access, and staging when the devices have none
/// (`FAKE_CUDA_NO_PEER_ACCESS=1`); and, where `cuStreamWaitValue32` is not
/// supported, calls that return once done (no host function waits: one
/// that did, for a peer 3 s late, would trip the driver's 2 s host-function
/// watchdog), with `NCCL_P2P_DISABLE=1`, which turns CUDA IPC off:
/// everything is staged.
#[test]
fn two_devices_and_no_stream_memops() {
    let two = |label: &str| {
        logged(label, 4, "memalloc,coll,sendrecv")
            .env("FAKE_CUDA_DEVICES", "2")
            .rank_env(|r, _| vec![("DEVICE_CHECK_DEVICE".into(), (r % 2).to_string())])
    };
    let out = run(vec![
        two("dev_4_two_devices"),
        two("dev_4_two_devices_no_peer_access").env("FAKE_CUDA_NO_PEER_ACCESS", "1"),
        logged("dev_2_no_memops_no_p2p", 2, "latepeer,coll,group,sendrecv")
            .env("FAKE_CUDA_NO_STREAM_MEMOPS", "1")
            .env("FAKE_CUDA_HOSTFN_LIMIT_S", "2")
            .env("NCCL_P2P_DISABLE", "1"),
    ]);
    for kind in ["allgather", "broadcast", "alltoall", "send", "recv"] {
        for (r, (ipc, _)) in paths(&out[0], kind).into_iter().enumerate() {
            assert!(
                ipc >= 4,
                "rank {r}: {kind}: {ipc} calls through CUDA IPC across devices"
            );
        }
    }
    for (o, kind) in [
        (1, "allgather"),
        (1, "broadcast"),
        (2, "allreduce"),
        (2, "allgather"),
        (2, "broadcast"),
        (2, "send"),
        (2, "recv"),
    ] {
        for (r, (ipc, staged)) in paths(&out[o], kind).into_iter().enumerate() {
            assert!(
                ipc == 0 && staged >= 3,
                "{}: rank {r}: {kind}: {ipc} IPC, {staged} staged",
                ["", "no peer access", "no P2P"][o]
            );
        }
    }
    // Without peer access, sends and receives are decided per pair: CUDA
    // IPC on the rank's own device (itself, rank r+2), staged to the other.
    for (r, (ipc, staged)) in paths(&out[1], "send").into_iter().enumerate() {
        assert!(
            ipc >= 4 && staged >= 4,
            "no peer access: rank {r}: send: {ipc} IPC, {staged} staged"
        );
    }
}

/// Per rank, how many calls of dtype `dt` (hetccl's `Debug` name, e.g.
/// `Float16`) went through CUDA IPC.
fn ipc_of_dtype(o: &coll::Outcome, dt: &str) -> Vec<usize> {
    o.outs
        .iter()
        .map(|r| {
            r.stdout
                .lines()
                .chain(r.stderr.lines())
                .filter(|l| l.contains(&format!(" {dt}: CUDA IPC")))
                .count()
        })
        .collect()
}

/// Whether every rank's output has a line containing all of `words`.
fn every_rank_logs(o: &coll::Outcome, words: &[&str]) -> bool {
    o.outs.iter().all(|r| {
        r.stdout
            .lines()
            .chain(r.stderr.lines())
            .any(|l| words.iter().all(|w| l.contains(w)))
    })
}

/// CUDA's context rules: one thread drives two GPUs in one group (two
/// ranks of a second communicator per process, both inits in one group,
/// then an AllReduce and a send/recv ring ended with the other device's
/// context current); and a group holding two inits and an AllReduce ended
/// on a thread with no current context, the rank on device 1. The strict
/// driver refuses an event recorded on another context's stream.
#[test]
fn contexts_of_multi_device_threads_and_init_groups() {
    run(vec![
        logged("dev_2_multidev", 2, "multidev").env("FAKE_CUDA_DEVICES", "2"),
        // Without stream memory operations the group's end waits for the
        // batch, which holds both devices' calls.
        logged("dev_2_multidev_no_memops", 2, "multidev")
            .env("FAKE_CUDA_DEVICES", "2")
            .env("FAKE_CUDA_NO_STREAM_MEMOPS", "1"),
        logged("dev_2_initgroup", 2, "initgroup")
            .env("FAKE_CUDA_DEVICES", "2")
            .env("DEVICE_CHECK_DEVICE", "1"),
    ]);
}

/// No synchronising call and no allocation while a stream waits: 60
/// staged AllReduces in flight need more pinned buffers than the pool
/// keeps, and 300 AllGathers through CUDA IPC on fresh buffers more
/// mappings than the import cache keeps and more flags than a slab holds.
/// The strict driver's frees and IPC closes wait for idle streams (one
/// made while a stream waits for the proxy aborts after 10 s), and its
/// allocations abort while a stream waits.
#[test]
fn pool_overflow_and_ipc_eviction_under_load() {
    let out = run(vec![
        logged("dev_2_sweep_staged", 2, "sweep")
            .env("NCCL_P2P_DISABLE", "1")
            .env("FAKE_CUDA_DEADLOCK_S", "10"),
        logged("dev_2_evict", 2, "evict").env("FAKE_CUDA_DEADLOCK_S", "10"),
    ]);
    for (r, (ipc, staged)) in paths(&out[0], "allreduce").into_iter().enumerate() {
        assert!(
            ipc == 0 && staged >= 60,
            "sweep: rank {r}: {ipc} IPC, {staged} staged"
        );
    }
    for (r, (ipc, _)) in paths(&out[1], "allgather").into_iter().enumerate() {
        assert!(
            ipc >= 300,
            "evict: rank {r}: {ipc} allgathers through CUDA IPC"
        );
    }
    // More batches in flight than a slab has flags: the rest wait on the
    // caller's thread (flags are allocated only when none is in flight).
    assert!(
        every_rank_logs(&out[1], &["no free stream flag"]),
        "evict: no rank ran out of stream flags"
    );
}

/// float16, bfloat16 and both fp8 formats through CUDA IPC with the
/// emulated kernels, bit for bit the host path's results; the kernels are
/// a CUBIN for the emulated device (sm_90).
#[test]
fn narrow_floats_through_cuda_ipc_match_the_host() {
    if nvrtc().is_none() {
        eprintln!("skipping: NVRTC not found (run scripts/fetch-nvrtc.sh)");
        return;
    }
    let out = run(vec![
        logged("dev_2_narrow", 2, "narrow").env("NCCL_DEBUG_SUBSYS", "COLL,INIT")
    ]);
    for dt in ["Float16", "Bfloat16", "Float8e4m3", "Float8e5m2"] {
        for (r, ipc) in ipc_of_dtype(&out[0], dt).into_iter().enumerate() {
            // 6 ops x (AllReduce, ReduceScatter, Reduce).
            assert!(ipc >= 18, "rank {r}: {dt}: {ipc} calls through CUDA IPC");
        }
    }
    assert!(
        every_rank_logs(
            &out[0],
            &["GPU reduction kernels loaded on device 0 as CUBIN sm_90"]
        ),
        "no rank says its kernels are a CUBIN for sm_90"
    );
}

/// The kernels load where PTX from this NVRTC would not: an emulated
/// driver 12.2 (PTX ISA 8.2) takes the CUBIN; refusing CUBINs, a 12.9
/// driver takes the PTX; refusing both, every rank logs a WARN naming the
/// NVRTC and driver versions and what runs instead, and stages, exactly.
#[test]
fn kernels_load_as_cubin_fall_back_to_ptx_and_warn() {
    if nvrtc().is_none() {
        eprintln!("skipping: NVRTC not found (run scripts/fetch-nvrtc.sh)");
        return;
    }
    let kernels = |label: &str| logged(label, 2, "avgpremul").env("NCCL_DEBUG_SUBSYS", "COLL,INIT");
    let out = run(vec![
        kernels("dev_2_old_driver").env("FAKE_CUDA_DRIVER_VERSION", "12020"),
        kernels("dev_2_no_cubin").env("FAKE_CUDA_REJECT_CUBIN", "1"),
        kernels("dev_2_no_kernels")
            .env("FAKE_CUDA_DRIVER_VERSION", "12020")
            .env("FAKE_CUDA_REJECT_CUBIN", "1"),
    ]);
    for (o, image) in [(&out[0], "as CUBIN sm_90"), (&out[1], "as PTX compute_90")] {
        assert!(
            every_rank_logs(o, &["GPU reduction kernels loaded on device 0", image]),
            "no line says the kernels loaded {image}"
        );
        for (r, (ipc, staged)) in paths(o, "allreduce").into_iter().enumerate() {
            assert!(
                ipc >= 2 && staged == 0,
                "{image}: rank {r}: {ipc} IPC, {staged} staged"
            );
        }
    }
    assert!(
        every_rank_logs(
            &out[2],
            &[
                "WARN",
                "GPU reduction kernels could not be loaded on device 0",
                "NVRTC 12.",
                "CUDA driver 12.2",
                "CUDA_ERROR_NO_BINARY_FOR_GPU",
                "CUDA_ERROR_UNSUPPORTED_PTX_VERSION",
                "stage through host memory instead",
            ]
        ),
        "no WARN naming the versions and the fallback"
    );
    for (r, (ipc, staged)) in paths(&out[2], "allreduce").into_iter().enumerate() {
        assert!(
            ipc == 0 && staged >= 2,
            "no kernels: rank {r}: {ipc} IPC, {staged} staged"
        );
    }
}

/// `tests/c/fake_nvidia_nccl.c` as a shared library (the fallback).
fn fake_nvidia_nccl() -> &'static Path {
    static LIB: OnceLock<PathBuf> = OnceLock::new();
    LIB.get_or_init(|| {
        cc::compile_c(
            "tests/c/fake_nvidia_nccl.c",
            "libfake_nvidia_nccl.so",
            &cc::CcOpts {
                link_nvidia_nccl: false,
                extra: vec!["-shared".into(), "-fPIC".into(), "-Wl,-Bsymbolic".into()],
            },
        )
    })
}

/// The window and signal APIs reach the fallback library through one mirror
/// communicator per rank, created collectively from one unique id.
#[test]
fn window_and_signal_calls_are_forwarded_to_the_fallback() {
    const N: usize = 3;
    let log = tmp_dir().join("fake_nvidia_nccl.log");
    let _ = std::fs::remove_file(&log);
    let fb = fake_nvidia_nccl().display().to_string();
    run(vec![job("dev_3_forward", N, "forward")
        .env("HETCCL_NCCL_FALLBACK", &fb)
        .env("FAKE_NCCL_LOG", &log.display().to_string())]);
    let text = std::fs::read_to_string(&log).expect("the fallback wrote its call log");
    let lines: Vec<Vec<&str>> = text.lines().map(|l| l.split(' ').collect()).collect();
    let of = |kind: &str| -> Vec<&Vec<&str>> { lines.iter().filter(|l| l[0] == kind).collect() };
    let ids = of("uniqueid");
    assert_eq!(ids.len(), 1, "one unique id for the mirror:\n{text}");
    let id = ids[0][1];
    let mut init_ranks: Vec<&str> = of("init")
        .iter()
        .map(|l| {
            assert_eq!(l[2], N.to_string(), "mirror size:\n{text}");
            assert_eq!(l[6], id, "every rank inits with rank 0's id:\n{text}");
            l[4]
        })
        .collect();
    init_ranks.sort();
    assert_eq!(init_ranks, ["0", "1", "2"], "one mirror per rank:\n{text}");
    for kind in ["winreg", "winptr", "signal", "windereg"] {
        assert_eq!(of(kind).len(), N, "{kind} once per rank:\n{text}");
    }
    for l in of("signal") {
        let (r, p): (usize, usize) = (l[2].parse().unwrap(), l[4].parse().unwrap());
        assert_eq!(p, (r + 1) % N, "signal peer passed through:\n{text}");
    }
    for l in of("winreg") {
        assert_eq!(l[4], "4096", "window size passed through:\n{text}");
    }
}

/// Runs hetccl-perf on hetccl with the emulated driver; returns stdout.
fn perf(args: &[&str]) -> String {
    let so = hetccl_so();
    let mut cmd = std::process::Command::new(perf_bin());
    ranks::clean_env(&mut cmd);
    cmd.env("LD_LIBRARY_PATH", driver_dir())
        .env("HETCCL_SOCKET_IFNAME", "lo")
        .env("HETCCL_TIMEOUT_S", "60")
        .args(args)
        .arg("--lib")
        .arg(&so)
        .args(["-T", "120"]);
    if let Some(p) = nvrtc() {
        cmd.env("HETCCL_NVRTC_LIB", p);
    }
    let out = cc::run_ok(&mut cmd);
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The `#wrong` columns of a table: every data row's 9th and 13th fields.
fn wrong_columns(table: &str) -> Vec<String> {
    table
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .flat_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            [f.get(8), f.get(12)]
                .into_iter()
                .flatten()
                .map(|s| s.to_string())
                .collect::<Vec<_>>()
        })
        .collect()
}

/// hetccl-perf's device-buffer mode: `--alloc device`, and the default
/// `--alloc nccl` when `ncclMemAlloc` returns device memory. Every row has
/// `#wrong` 0 and the rank lines name the device.
#[test]
fn hetccl_perf_on_device_buffers() {
    // Ranks as processes (-np) and as threads of one process (--threads,
    // where the CUDA IPC path uses the peers' pointers directly).
    for (coll, alloc, launch, n) in [
        ("all_reduce", "device", "-np", "2"),
        ("all_gather", "nccl", "-np", "3"),
        ("alltoall", "device", "-np", "2"),
        ("sendrecv", "device", "-np", "2"),
        ("broadcast", "nccl", "-np", "2"),
        ("all_reduce", "device", "--threads", "3"),
        ("reduce_scatter", "device", "--threads", "2"),
    ] {
        let out = perf(&[
            coll, launch, n, "-b", "8", "-e", "256K", "-f", "8", "-n", "3", "-w", "1", "--alloc",
            alloc,
        ]);
        let label = format!("{coll} --alloc {alloc} {launch} {n}");
        assert!(
            out.contains("[cuda] hetccl fake GPU"),
            "{label}: no device in the rank lines:\n{out}"
        );
        let wrong = wrong_columns(&out);
        assert!(wrong.len() >= 8, "{label}: too few #wrong fields:\n{out}");
        // In-place alltoall is unchecked (N/A), as in nccl-tests.
        let zeros = wrong.iter().filter(|w| *w == "0").count();
        assert!(
            zeros >= 6 && wrong.iter().all(|w| w == "0" || w == "N/A"),
            "{label}: wrong results:\n{out}"
        );
        assert!(
            out.contains("# Out of bounds values : 0 OK"),
            "{label}:\n{out}"
        );
    }
}
