//! Self-test of the emulated CUDA driver (`tests/c/fake_cuda*.c`): its
//! exported symbols, and every emulated behaviour as seen by a C program
//! (`tests/c/fake_cuda_selftest*.c`) built against NVIDIA's real `cuda.h`
//! and linked to the fake: what it emulates, what makes it as strict as
//! CUDA (contexts, synchronising calls, host functions, images, the
//! watchdogs), and its narrow-float kernels against hetccl's host kernels.

use std::collections::BTreeMap;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

use hetccl_testkit::{cc, fake_cuda, repo_root};

#[path = "fake_cuda_selftest/narrow.rs"]
mod narrow;

const TAG: &str = "selftest";

/// What hetccl (through cudarc) and its tests may call, by exported name.
const EXPORTS: &[&str] = &[
    "cuCtxGetCurrent",
    "cuCtxGetDevice",
    "cuCtxSetCurrent",
    "cuCtxSynchronize",
    "cuDeviceCanAccessPeer",
    "cuDeviceGet",
    "cuDeviceGetAttribute",
    "cuDeviceGetCount",
    "cuDeviceGetName",
    "cuDeviceGetPCIBusId",
    "cuDeviceGetUuid",
    "cuDeviceGetUuid_v2",
    "cuDevicePrimaryCtxRelease_v2",
    "cuDevicePrimaryCtxRetain",
    "cuDeviceTotalMem_v2",
    "cuDriverGetVersion",
    "cuEventCreate",
    "cuEventDestroy_v2",
    "cuEventQuery",
    "cuEventRecord",
    "cuEventSynchronize",
    "cuGetErrorName",
    "cuGetErrorString",
    "cuGetExportTable",
    "cuGraphDestroy",
    "cuInit",
    "cuIpcCloseMemHandle",
    "cuIpcGetMemHandle",
    "cuIpcOpenMemHandle_v2",
    "cuLaunchHostFunc",
    "cuLaunchKernel",
    "cuMemAlloc_v2",
    "cuMemFreeHost",
    "cuMemFree_v2",
    "cuMemGetAddressRange_v2",
    "cuMemGetHandleForAddressRange",
    "cuMemHostAlloc",
    "cuMemHostGetDevicePointer_v2",
    "cuMemcpy",
    "cuMemcpyAsync",
    "cuMemcpyDtoDAsync_v2",
    "cuMemcpyDtoD_v2",
    "cuMemcpyDtoHAsync_v2",
    "cuMemcpyDtoH_v2",
    "cuMemcpyHtoDAsync_v2",
    "cuMemcpyHtoD_v2",
    "cuMemsetD8Async",
    "cuMemsetD8_v2",
    "cuModuleGetFunction",
    "cuModuleLoadData",
    "cuModuleUnload",
    "cuPointerGetAttribute",
    "cuPointerGetAttributes",
    "cuStreamBeginCapture_v2",
    "cuStreamCreate",
    "cuStreamDestroy_v2",
    "cuStreamEndCapture",
    "cuStreamGetCtx",
    "cuStreamIsCapturing",
    "cuStreamQuery",
    "cuStreamSynchronize",
    "cuStreamWaitEvent",
    "cuStreamWaitValue32_v2",
];

fn selftest_exe() -> &'static Path {
    static EXE: OnceLock<PathBuf> = OnceLock::new();
    EXE.get_or_init(|| {
        let dir = fake_cuda::fake_cuda_dir(TAG);
        // main is in fake_cuda_selftest.c; the other files share
        // fake_cuda_selftest.h (found next to them).
        let mut extra: Vec<String> = [
            "tests/c/fake_cuda_selftest_streams.c",
            "tests/c/fake_cuda_selftest_kernels.c",
            "tests/c/fake_cuda_selftest_strict.c",
        ]
        .iter()
        .map(|f| repo_root().join(f).display().to_string())
        .collect();
        extra.extend([
            "-L".into(),
            dir.display().to_string(),
            "-l:libcuda.so.1".into(),
            format!("-Wl,-rpath,{}", dir.display()),
            "-pthread".into(),
        ]);
        cc::compile_c(
            "tests/c/fake_cuda_selftest.c",
            "fake_cuda_selftest_prog",
            &cc::CcOpts {
                link_nvidia_nccl: false,
                extra,
            },
        )
    })
}

/// The self-test program in `mode` (with `args`) with only `env` from the
/// fake's switches.
fn command(mode: &str, args: &[&str], env: &[(&str, &str)]) -> Command {
    let mut cmd = Command::new(selftest_exe());
    cmd.arg(mode)
        .args(args)
        .env("LD_LIBRARY_PATH", fake_cuda::ld_library_path(TAG))
        .env("FAKE_CUDA_TIMEOUT_S", "60");
    for k in [
        "FAKE_CUDA_DEVICES",
        "FAKE_CUDA_NO_STREAM_MEMOPS",
        "FAKE_CUDA_LOG",
        "FAKE_CUDA_DEADLOCK_S",
        "FAKE_CUDA_HOSTFN_LIMIT_S",
        "FAKE_CUDA_DRIVER_VERSION",
        "FAKE_CUDA_REJECT_CUBIN",
    ] {
        cmd.env_remove(k);
    }
    cmd.envs(env.iter().copied());
    cmd
}

/// Runs the self-test in `mode` with only `env` from the fake's switches.
fn run(mode: &str, env: &[(&str, &str)]) -> (BTreeMap<String, String>, Output) {
    let out = cc::run_ok(&mut command(mode, &[], env));
    let kv = cc::parse_kv(&String::from_utf8_lossy(&out.stdout));
    (kv, out)
}

/// Asserts every `(key, value)` of `want` against `got`, reporting all
/// mismatches at once.
fn expect(got: &BTreeMap<String, String>, want: &[(&str, &str)], out: &Output) {
    let bad: Vec<String> = want
        .iter()
        .filter(|(k, v)| got.get(*k).map(String::as_str) != Some(*v))
        .map(|(k, v)| format!("{k}: want {v:?}, got {:?}", got.get(*k)))
        .collect();
    assert!(
        bad.is_empty(),
        "fake_cuda self-test mismatches:\n{}\nstderr:\n{}",
        bad.join("\n"),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn exports_exactly_the_emulated_api() {
    let lib = fake_cuda::fake_cuda_dir(TAG).join("libcuda.so.1");
    let nm = cc::tool("nm");
    let out = cc::run_ok(Command::new(&nm).args(["-D", "--defined-only"]).arg(&lib));
    let mut got: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() == 3 && f[1] == "T").then(|| f[2].to_string())
        })
        .collect();
    got.sort();
    let mut want: Vec<String> = EXPORTS.iter().map(|s| s.to_string()).collect();
    want.sort();
    assert_eq!(got, want, "exported functions of {}", lib.display());
    let link = std::fs::read_link(fake_cuda::fake_cuda_dir(TAG).join("libcuda.so"))
        .expect("libcuda.so is a symlink");
    assert_eq!(link, Path::new("libcuda.so.1"));
}

#[test]
fn emulated_driver_behaves() {
    let (kv, out) = run("all", &[("FAKE_CUDA_DEVICES", "2")]);
    // "wait-value pending, then done" pairs: NOT_READY (600), then SUCCESS.
    let pend = "600,0";
    #[rustfmt::skip]
    let want: &[(&str, &str)] = &[
        // Init, devices.
        ("init.before_init", "3"), // CUDA_ERROR_NOT_INITIALIZED
        ("dev.count", "2"),
        ("dev.bad_ordinal", "101"), // CUDA_ERROR_INVALID_DEVICE
        ("dev.cc", "9.0"),
        ("dev.unified", "1"),
        ("dev.host_ptr_reg", "1"),
        ("dev.name", "hetccl fake GPU"),
        ("dev.totalmem_gib", "80"),
        // UUIDs: "hetcclfakegpu", zero-padded, last byte the ordinal.
        ("uuid.stable", "1"),
        ("uuid.differ", "1"),
        ("uuid.v1_same", "1"),
        ("uuid.dev0", "68657463636c66616b65677075000000"),
        ("uuid.dev1", "68657463636c66616b65677075000001"),
        ("uuid.bad_dev", "101"), // CUDA_ERROR_INVALID_DEVICE
        ("uuid.bad_dev_v1", "101"),
        ("uuid.null", "1"), // CUDA_ERROR_INVALID_VALUE
        // Peer access between different devices (FAKE_CUDA_NO_PEER_ACCESS unset).
        ("peer.0_1", "1"),
        ("peer.1_1", "0"),
        ("peer.bad_dev", "101"),
        // Contexts: thread-local current context; none -> INVALID_CONTEXT.
        ("ctx.none_current", "1"),
        ("ctx.getdevice_none", "201"),
        ("ctx.alloc_none", "201"),
        ("ctx.set_bad", "201"),
        ("ctx.device", "1"),
        ("args.null_out", "1"),
        ("args.zero_alloc", "1"),
        ("args.null_event_record", "400"), // CUDA_ERROR_INVALID_HANDLE
        ("args.null_event_query", "400"),
        // Copies: H->D->D->H, async at interior offsets, memset, bounds.
        ("copy.roundtrip", "1"),
        ("copy.async_interior", "1"),
        ("copy.memset", "1"),
        ("copy.overrun", "1"),
        ("copy.default_handles", "1"),
        ("copy.double_free", "1"),
        // Pointer attributes: device memory allocated on device 1, asked
        // at an interior pointer; pinned memory; unknown pointers.
        ("bufid.nonzero", "1"),
        ("bufid.distinct", "1"),
        ("bufid.unknown", "0"),
        ("attr.dev.rc", "0"),
        ("attr.dev.type", "2"), // CU_MEMORYTYPE_DEVICE
        ("attr.dev.managed", "0"),
        ("attr.dev.ordinal", "1"),
        ("attr.dev.start_ok", "1"),
        ("attr.dev.size", "10000"),
        ("attr.dev.ctx_ok", "1"),
        ("attr.dev.single_rc", "0"),
        ("attr.dev.single_type", "2"),
        ("attr.dev.hostdevptr", "1"), // not pinned memory: INVALID_VALUE
        ("attr.pinned.devptr_same", "1"),
        ("attr.pinned.rc", "0"),
        ("attr.pinned.type", "1"), // CU_MEMORYTYPE_HOST
        ("attr.pinned.ordinal", "0"),
        ("attr.pinned.start_ok", "1"),
        ("attr.pinned.size", "5000"),
        ("attr.unknown.rc", "0"),
        ("attr.unknown.zeros", "1"),
        ("attr.unknown.single", "1"),
        ("attr.past_end.type", "0"),
        ("attr.freed.type", "0"),
        // cuMemGetAddressRange: base and size of the allocation holding an
        // interior pointer (either out-pointer may be NULL); unknown,
        // one-past-the-end and freed addresses -> CUDA_ERROR_NOT_FOUND.
        ("range.dev.rc", "0"),
        ("range.dev.base_ok", "1"),
        ("range.dev.size", "10000"),
        ("range.dev.last_rc", "0"),
        ("range.dev.last_base_ok", "1"),
        ("range.dev.null_base_rc", "0"),
        ("range.dev.null_base_size", "10000"),
        ("range.dev.past_end", "500"),
        ("range.pinned.rc", "0"),
        ("range.pinned.base_ok", "1"),
        ("range.pinned.size", "5000"),
        ("range.unknown.rc", "500"),
        ("range.unknown.untouched", "1"),
        ("range.null.rc", "500"),
        ("range.freed.rc", "500"),
        // Host reads: a device pointer faults (SIGSEGV), pinned memory not.
        ("segv.device_read_signal", "11"),
        ("segv.pinned_read_signal", "0"),
        // Stream order: work behind a wait-value waits for the host's write.
        ("fifo.wait_rc", "0"),
        ("fifo.query_pending", "600"),
        ("fifo.event_pending", "600"),
        ("fifo.copy_before", "0"),
        ("fifo.copy_after", "1"),
        ("fifo.event_after", "0"),
        ("fifo.query_after", "0"),
        ("fifo.query_running", "600"),
        ("wv.geq_cyclic", pend),
        ("wv.eq", pend),
        ("wv.and", pend),
        ("wv.nor", pend),
        ("wv.geq_flush", pend),
        ("wv.bad_flags", "1"),
        ("wv.unaligned", "1"),
        ("wv.devflag", pend),
        // Events.
        ("event.fresh", "0"),
        ("event.destroy_pending", "0"),
        ("event.destroy_pending_sync", "0"),
        // A free waits until the streams are idle (here for a flag that a
        // thread sets 50 ms later), so queued work has run.
        ("free.pending_rc", "0"),
        ("free.waited_for_stream", "1"),
        ("free.pending_data", "1"),
        ("free.pending_sync", "0"),
        // Host functions: on the worker thread, in stream order.
        ("hostfn.ran_before", "0"),
        ("hostfn.order", "12"),
        ("hostfn.on_worker", "1"),
        ("hostfn.saw_copy", "1"),
        ("destroy.rc", "0"),
        ("destroy.returned_early", "1"),
        ("destroy.pending_ran", "1"),
        // cuStreamWaitEvent across streams; cuCtxSynchronize.
        ("xwait.unrecorded", "0"),
        ("xwait.pending", "600"),
        ("xwait.copy_before", "0"),
        ("xwait.done", "0"),
        ("xwait.copy_after", "1"),
        ("ctxsync.flag_was_set", "1"),
        ("ctxsync.copy_done", "1"),
        // Capture: status, and every enqueue refused while capturing.
        ("capture.before", "0"), // CU_STREAM_CAPTURE_STATUS_NONE
        ("capture.begin", "0"),
        ("capture.active", "1"), // CU_STREAM_CAPTURE_STATUS_ACTIVE
        ("capture.begin_again", "401"), // CUDA_ERROR_ILLEGAL_STATE
        ("capture.copy", "900"), // CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED
        ("capture.memset", "900"),
        ("capture.record", "900"),
        ("capture.wait_value", "900"),
        ("capture.wait_event", "900"),
        ("capture.host_func", "900"),
        ("capture.sync", "900"),
        ("capture.event_untouched", "0"),
        ("capture.end", "0"),
        ("capture.graph_nonnull", "1"),
        ("capture.graph_destroy", "0"),
        ("capture.after", "0"),
        ("capture.end_again", "401"),
        ("capture.null_stream", "0"),
        ("capture.begin_null", "900"),
        ("capture.copy_after", "0"),
        // Kernels: modules of hetccl's kernels only; all 90 entry points
        // of reduce.cu; names that are no entry of reduce.cu
        // NOT_SUPPORTED (801), absent NOT_FOUND (500).
        ("kernel.load_garbage", "200"), // CUDA_ERROR_INVALID_IMAGE
        ("kernel.load_elf", "200"),
        ("kernel.load_null", "1"),
        ("kernel.load", "0"),
        ("kernel.module_nonnull", "1"),
        ("kernel.get_f32_sum", "0"),
        ("kernel.same_handle", "1"),
        ("kernel.get_f16_sum", "0"),
        ("kernel.get_f32_avg", "0"),
        ("kernel.get_premul", "0"),
        ("kernel.get_postdiv", "0"),
        ("kernel.premul_own_handle", "1"),
        ("kernel.get_f16_premul", "0"),
        ("kernel.get_bf16_avg", "0"),
        ("kernel.get_f32_postdiv", "801"), // not an entry of reduce.cu
        ("kernel.get_missing", "500"),
        ("kernel.get_prefix", "500"),
        ("kernel.get_bad_module", "400"),
        // In stream order: not run while a wait-value blocks the stream;
        // the parameters are the values at launch time.
        ("kernel.launch_rc", "0"),
        ("kernel.pending", "600"),
        ("kernel.not_run_before_release", "1"),
        ("kernel.f32_sum", "3.75,-1.5,16777216,0.300000012,0"),
        ("kernel.launch_f32_max", "0"),
        ("kernel.f32_max", "2,5,3,-7,nan"),
        // INT32_MAX*2, -3*5, 65536*65536, 7*INT32_MIN, wrapping.
        ("kernel.i32_prod", "-2,-15,0,-2147483648"),
        // 200+100, 1+2, 255+255 (mod 256); the bytes around untouched (9).
        ("kernel.u8_sum", "9,44,3,254,9"),
        ("kernel.i8_max", "0,127,1"),
        ("kernel.u64_sum", "1,0"),
        ("kernel.f64_min", "4,1.5,-2,-10000000000,1"),
        ("kernel.f64_exact", "1"),
        // avg/premulsum: dst = a*s + b (s = 0.25; 0.75 + 2^24 rounds to 2^24).
        ("kernel.f32_avg", "2,0.75,0,0.225000009,16777216"),
        // (1+2^-12)*(1+2^-12) - (1+2^-11): unfused 0, fused 2^-24; the
        // kernels round the product first (NVRTC --fmad=false).
        ("kernel.f32_fma_differs", "1"),
        ("kernel.f32_fma_ref", "0,5.96046448e-08"),
        ("kernel.f32_avg_unfused", "0"),
        // INT32_MAX*-3+1, -7*-3+2, 2^30*-3, 5*-3+INT32_MAX, wrapping.
        ("kernel.i32_premulsum", "-2147483644,23,1073741824,2147483632"),
        // 3*(1+2^-52) = 3 + 1.5 ulp rounds to even: 3 + 2 ulp.
        ("kernel.f64_premul", "4.5,-6,0.30000000000000004,inf,3.0000000000000009"),
        // 200*255, 3*255, 255*255 (mod 256), 0; the bytes around untouched (9).
        ("kernel.u8_premul", "9,56,253,1,0,9"),
        // Truncation toward zero; INT64_MIN/2.
        ("kernel.i64_postdiv", "-3,3,-4,-4611686018427387904,0,4"),
        // d = 2^64-1 is (long long)-1 in the kernel: negation, INT64_MIN wraps.
        ("kernel.i64_postdiv_dmax", "7,-7,8,-9223372036854775808,1,-9"),
        ("kernel.u32_postdiv", "1431655765,2,0,33"),
        ("kernel.u32_postdiv_2p32", "0,0,0,0"),
        ("kernel.postdiv_zero", "1"), // CUDA_ERROR_INVALID_VALUE
        ("kernel.postdiv_zero_n0", "0"),
        ("kernel.postdiv_null_param", "1"),
        // Each shape launched with exactly its parameters (5, 4, 3), the
        // array and each value ending at a PROT_NONE page.
        ("kernel.exact_params_reduce", "0"),
        ("kernel.exact_params_premul", "0"),
        ("kernel.exact_params_postdiv", "0"),
        ("kernel.launch_null_fn", "400"), // CUDA_ERROR_INVALID_HANDLE
        ("kernel.launch_grid0", "1"),
        ("kernel.launch_block0", "1"),
        ("kernel.launch_block_big", "1"),
        ("kernel.launch_no_params", "1"),
        ("kernel.launch_extra", "801"),
        ("kernel.launch_overrun", "1"),
        ("kernel.launch_null_ptr", "1"),
        ("kernel.launch_n0_null", "0"),
        ("kernel.load_no_ctx", "201"),
        ("kernel.launch_no_ctx", "201"),
        ("kernel.launch_capturing", "900"),
        ("kernel.unload", "0"),
        ("kernel.unload_again", "400"),
        // Contexts: streams and events carry theirs; an event recorded on
        // another context's stream is INVALID_HANDLE (400), as a kernel
        // launched on one; a kernel whose module is of another context
        // than the current one INVALID_CONTEXT (201). Waits on events and
        // copies cross contexts.
        ("ctxrule.stream_ctx", "1"),
        ("ctxrule.default_stream_ctx", "1"),
        ("ctxrule.record_other_ctx", "400"),
        ("ctxrule.record_other_default", "400"),
        ("ctxrule.record_same", "0"),
        ("ctxrule.record_own_stream_other_current", "0"),
        ("ctxrule.wait_event_cross", "0"),
        ("ctxrule.copy_other_ctx_stream", "0"),
        ("ctxrule.launch_other_stream", "400"),
        ("ctxrule.launch_other_module", "201"),
        ("ctxrule.launch_same", "0"),
        // Synchronising calls: cuMemFree waits for its context's streams,
        // cuMemFreeHost for every context's, cuModuleLoadData for the
        // current one's.
        ("quiesce.free_other_ctx", "0"),
        ("quiesce.free_other_ctx_did_not_wait", "1"),
        ("quiesce.freehost", "0"),
        ("quiesce.freehost_waited", "1"),
        ("quiesce.load", "0"),
        ("quiesce.load_waited", "1"),
        // Host functions: one thread for all, one at a time; a CUDA call
        // inside one is CUDA_ERROR_NOT_PERMITTED (800).
        ("hostfn.shared_thread", "1"),
        ("hostfn.serialised", "1"),
        ("hostfn.cuda_call", "800"),
        // Images: a CUBIN for sm_90 (the device's) loads with its global
        // functions as entries; sm_80's is NO_BINARY_FOR_GPU (209); PTX of
        // ISA 9.9 (newer than the 12.9 driver's 8.8) is
        // UNSUPPORTED_PTX_VERSION (222), for sm_100 NO_BINARY_FOR_GPU.
        ("cubin.load", "0"),
        ("cubin.get_f32_sum", "0"),
        ("cubin.get_f16_premul", "0"),
        ("cubin.get_absent", "500"),
        ("cubin.runs", "1"),
        ("cubin.other_arch", "209"),
        ("ptx.newer_isa", "222"),
        ("ptx.newer_target", "209"),
        // Error names.
        ("err.name_600", "CUDA_ERROR_NOT_READY"),
        ("err.name_900", "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED"),
        ("err.name_201", "CUDA_ERROR_INVALID_CONTEXT"),
        ("err.name_200", "CUDA_ERROR_INVALID_IMAGE"),
        ("err.text_0", "no error"),
        ("err.unknown", "1"),
        ("err.unknown_null", "1"),
        // IPC: another process opens the handle, reads, writes back.
        ("ipc.pinned", "1"),
        ("ipc.same_process", "201"),
        ("ipc.child_open", "0"),
        ("ipc.child_memtype", "2"),
        ("ipc.child_range_rc", "0"),
        ("ipc.child_range_base_ok", "1"),
        ("ipc.child_range_size", "8192"),
        ("ipc.child_uuid1", "68657463636c66616b65677075000001"), // as in the parent
        ("ipc.child_range_closed", "500"),
        ("ipc.child_read_ok", "1"),
        ("ipc.child_close", "0"),
        ("ipc.child_close_waited", "1"),
        ("ipc.child_close_again", "1"),
        ("ipc.child_exit", "0"),
        ("ipc.parent_sees_child", "1"),
        ("done", "1"),
    ];
    expect(&kv, want, &out);
    // CUDA_VERSION of the fetched cuda.h (12090 for CUDA 12.9); the PTX of
    // `kernel.load` is ISA 8.5 (CUDA 12.5).
    let ver: u32 = kv["drv.version"].parse().expect("drv.version is a number");
    assert!(ver >= 12050, "drv.version {ver}");
    let unchecked: Vec<&String> = kv
        .keys()
        .filter(|k| *k != "drv.version" && !want.iter().any(|(w, _)| w == k))
        .collect();
    assert!(
        unchecked.is_empty(),
        "keys printed but not checked: {unchecked:?}"
    );
}

#[test]
fn no_stream_memops_switch_and_log() {
    let (kv, out) = run(
        "nomemops",
        &[("FAKE_CUDA_NO_STREAM_MEMOPS", "1"), ("FAKE_CUDA_LOG", "1")],
    );
    expect(
        &kv,
        &[
            ("memops.attr", "0"),
            ("memops.wait", "801"), // CUDA_ERROR_NOT_SUPPORTED
            ("memops.hostfn_wait", "600,0"),
            ("done", "1"),
        ],
        &out,
    );
    let err = String::from_utf8_lossy(&out.stderr);
    for call in [
        "cuInit(0)",
        "cuStreamWaitValue32_v2(stream=",
        "cuLaunchHostFunc(stream=",
    ] {
        assert!(
            err.lines()
                .any(|l| l.starts_with("fake_cuda[") && l.contains(call)),
            "FAKE_CUDA_LOG=1 printed no {call:?} line:\n{err}"
        );
    }
    // Without the switch the wait is supported and nothing is logged.
    let (kv, out) = run("nomemops", &[]);
    expect(&kv, &[("memops.attr", "1"), ("memops.wait", "0")], &out);
    assert!(
        out.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn zero_devices_fail_init() {
    let (kv, out) = run("nodev", &[("FAKE_CUDA_DEVICES", "0")]);
    expect(
        &kv,
        &[
            ("init.rc", "100"), // CUDA_ERROR_NO_DEVICE
            ("init.count_after_failure", "3"),
        ],
        &out,
    );
}

/// Runs `mode`, which must be aborted by the fake (SIGABRT) with a message
/// containing every one of `words` on stderr, after printing `started`.
fn expect_abort(mode: &str, env: &[(&str, &str)], started: &str, words: &[&str]) {
    let t0 = std::time::Instant::now();
    let out = command(mode, &[], env)
        .output()
        .unwrap_or_else(|e| panic!("cannot run the self-test: {e}"));
    let err = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.signal(),
        Some(6),
        "{mode}: want SIGABRT, got {}\nstdout:\n{stdout}\nstderr:\n{err}",
        out.status
    );
    assert!(
        stdout.contains(started),
        "{mode}: never reached the wait:\n{stdout}"
    );
    assert!(
        !stdout.contains("returned 1"),
        "{mode}: the call returned:\n{stdout}"
    );
    for w in words {
        assert!(err.contains(w), "{mode}: stderr lacks {w:?}:\n{err}");
    }
    assert!(
        t0.elapsed().as_secs() < 30,
        "{mode}: the watchdog took {:?}",
        t0.elapsed()
    );
}

/// The watchdogs: a free made while a stream waits for a flag nobody sets
/// aborts after FAKE_CUDA_DEADLOCK_S naming the call and what the stream
/// waits on; a host function that waits past FAKE_CUDA_HOSTFN_LIMIT_S
/// aborts too; so does a pinned or device allocation while a stream waits
/// (at once; one after the wait is over does not).
#[test]
fn watchdogs_abort_deadlocks_and_waiting_host_functions() {
    expect_abort(
        "deadlock",
        &[("FAKE_CUDA_DEADLOCK_S", "1")],
        "freeing 1",
        &[
            "cuMemFreeHost: deadlock",
            "cuStreamWaitValue32",
            "FAKE_CUDA_DEADLOCK_S",
        ],
    );
    expect_abort(
        "hostfn_wait",
        &[("FAKE_CUDA_HOSTFN_LIMIT_S", "1")],
        "waiting 1",
        &["a host function has run for 1 s", "must not wait"],
    );
    for (mode, call) in [
        ("alloc_wait", "cuMemHostAlloc"),
        ("alloc_wait_dev", "cuMemAlloc"),
    ] {
        expect_abort(
            mode,
            &[],
            "allocating 1",
            &[
                &format!("{call} while stream"),
                "waits on cuStreamWaitValue32",
                "implicit synchronisation",
            ],
        );
    }
}

/// An old driver: `FAKE_CUDA_DRIVER_VERSION` is what cuDriverGetVersion
/// reports and bounds the PTX ISA it takes (12.2: 8.2);
/// `FAKE_CUDA_REJECT_CUBIN` refuses every CUBIN.
#[test]
fn old_driver_and_rejected_cubins() {
    let (kv, out) = run(
        "oldcuda",
        &[
            ("FAKE_CUDA_DRIVER_VERSION", "12020"),
            ("FAKE_CUDA_REJECT_CUBIN", "1"),
        ],
    );
    expect(
        &kv,
        &[
            ("old.version", "12020"),
            ("old.ptx_8_5", "222"), // CUDA_ERROR_UNSUPPORTED_PTX_VERSION
            ("old.ptx_8_2", "0"),
            ("old.cubin_rejected", "209"), // CUDA_ERROR_NO_BINARY_FOR_GPU
            ("done", "1"),
        ],
        &out,
    );
}
