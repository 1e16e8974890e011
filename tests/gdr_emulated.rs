//! GPUDirect RDMA up to the driver calls, without a GPU or an RDMA device:
//! child processes run with the emulated CUDA driver (`tests/c/fake_cuda*.c`,
//! first on `LD_LIBRARY_PATH`), the emulated libibverbs
//! (`tests/c/fake_ibverbs.c`, through `HETCCL_IBVERBS_LIB`, which logs every
//! registration's arguments) and a synthetic sysfs tree
//! (`HETCCL_SYSFS_ROOT`): the NIC `fake0` at a PCI path, the fake GPU 0
//! (`0000:10:00.0`) on the same PCI switch or on the other socket, and the
//! `nvidia_peermem` module present or not.
//!
//! The plugin side: `ptrSupport` under each condition, `regMr` of
//! `NCCL_PTR_CUDA` memory calling `ibv_reg_mr` on the device address,
//! `regMrDmaBuf` passing NCCL's fd, offset and length to
//! `ibv_reg_dmabuf_mr`, and `iflush` returning a request (an RDMA read of
//! the device address) only for GPU-registered receives. The engine side:
//! the decision per GPU/NIC pair, the registration of device memory
//! through a DMA-BUF fd from `cuMemGetHandleForAddressRange` (or
//! `ibv_reg_mr` with peer memory), the flush, and staging when GDR is not
//! allowed. Nothing here moves data: what a real NIC and GPU do with these
//! registrations is untested (docs/rdma.md).

use std::ffi::{c_int, c_void};
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use hetccl_abi::net::{NCCL_PTR_CUDA, NCCL_PTR_DMABUF, NCCL_PTR_HOST};
use hetccl_testkit::net::{self, Api};
use hetccl_testkit::{fake_cuda, fake_verbs, tmp_dir};

const TAG: &str = "gdr_emulated";
const GPU_NEAR: &str = "pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:08.0/0000:10:00.0";
const GPU_FAR: &str = "pci0000:80/0000:80:01.0/0000:10:00.0";
const NIC: &str = "pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:10.0/0000:20:00.0";
const MIB: usize = 1 << 20;

/// A sysfs tree for one case.
fn fake_sys(case: &str, gpu: &str, peermem: bool) -> PathBuf {
    let root = tmp_dir().join(format!("gdr_sys_{case}"));
    let _ = std::fs::remove_dir_all(&root);
    let dev = |path: &str, numa: i32| {
        let d = root.join("devices").join(path);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("numa_node"), format!("{numa}\n")).unwrap();
        d
    };
    let g = dev(gpu, i32::from(gpu.starts_with("pci0000:80")));
    let n = dev(NIC, 0);
    std::fs::create_dir_all(root.join("bus/pci/devices")).unwrap();
    std::os::unix::fs::symlink(&g, root.join("bus/pci/devices/0000:10:00.0")).unwrap();
    std::fs::create_dir_all(root.join("class/infiniband/fake0")).unwrap();
    std::os::unix::fs::symlink(&n, root.join("class/infiniband/fake0/device")).unwrap();
    std::fs::create_dir_all(root.join("module/ib_core")).unwrap();
    if peermem {
        std::fs::create_dir_all(root.join("module/nvidia_peermem")).unwrap();
    }
    root
}

/// What a child printed and the fake verbs library logged.
struct Out {
    stdout: String,
    stderr: String,
    log: String,
}

impl Out {
    /// The value after `key ` on the line starting with it.
    fn get(&self, key: &str) -> &str {
        self.stdout
            .lines()
            .find_map(|l| l.strip_prefix(key).and_then(|r| r.strip_prefix(' ')))
            .unwrap_or_else(|| panic!("no {key} line:\n{}", self.stdout))
    }
}

/// Runs the child test `child` for `case` with the fakes and `env`.
fn run(child: &str, case: &str, gpu: &str, peermem: bool, env: &[(&str, &str)]) -> Out {
    let sys = fake_sys(case, gpu, peermem);
    let log = tmp_dir().join(format!("gdr_log_{case}.txt"));
    let _ = std::fs::remove_file(&log);
    let mut cmd = Command::new(std::env::current_exe().expect("own path"));
    cmd.args(["--exact", child, "--nocapture", "--test-threads=1"])
        .env("HETCCL_GDR_CHILD", "1")
        .env("HETCCL_LIB", hetccl_testkit::hetccl_so())
        .env("HETCCL_IBVERBS_LIB", fake_verbs::fake_verbs_lib(TAG))
        .env("FAKE_IBV_LOG", &log)
        .env("HETCCL_SYSFS_ROOT", &sys)
        .env("LD_LIBRARY_PATH", fake_cuda::ld_library_path(TAG))
        .env("HETCCL_NET", "ib")
        .env("HETCCL_SOCKET_IFNAME", "=lo")
        .env("HETCCL_TIMEOUT_S", "20")
        .env("NCCL_DEBUG", "INFO")
        .env("NCCL_DEBUG_SUBSYS", "NET")
        .env_remove("NCCL_NET_GDR_LEVEL")
        .env_remove("NCCL_DMABUF_ENABLE")
        .env_remove("NCCL_IB_HCA");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let o = cmd.output().expect("run the child");
    let stdout = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(
        o.status.success(),
        "child {child} ({case}) failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let log = std::fs::read_to_string(&log).unwrap_or_default();
    let _ = std::fs::remove_dir_all(&sys);
    let stderr = String::from_utf8_lossy(&o.stderr).into_owned();
    Out {
        stdout,
        stderr,
        log,
    }
}

fn is_child() -> bool {
    std::env::var_os("HETCCL_GDR_CHILD").is_some()
}

/// The emulated driver: a current context on device 0.
struct Cuda {
    lib: libloading::Library,
}

type Fn0 = unsafe extern "C" fn(u32) -> c_int;
type Retain = unsafe extern "C" fn(*mut *mut c_void, c_int) -> c_int;
type SetCur = unsafe extern "C" fn(*mut c_void) -> c_int;
type Alloc = unsafe extern "C" fn(*mut u64, usize) -> c_int;
type Handle = unsafe extern "C" fn(*mut c_void, u64, usize, c_int, u64) -> c_int;

impl Cuda {
    fn new() -> Self {
        // SAFETY: the emulated driver (LD_LIBRARY_PATH); the calls below
        // follow the driver API's signatures.
        unsafe {
            let lib = libloading::Library::new("libcuda.so.1").expect("the fake driver");
            assert_eq!(lib.get::<Fn0>(b"cuInit\0").unwrap()(0), 0);
            let mut ctx = std::ptr::null_mut();
            assert_eq!(
                lib.get::<Retain>(b"cuDevicePrimaryCtxRetain\0").unwrap()(&mut ctx, 0),
                0
            );
            assert_eq!(lib.get::<SetCur>(b"cuCtxSetCurrent\0").unwrap()(ctx), 0);
            Self { lib }
        }
    }

    fn alloc(&self, n: usize) -> u64 {
        let mut d = 0;
        // SAFETY: a writable slot; a context is current.
        let rc = unsafe { self.lib.get::<Alloc>(b"cuMemAlloc_v2\0").unwrap()(&mut d, n) };
        assert_eq!(rc, 0);
        d
    }

    /// A DMA-BUF fd for `d..d+n`.
    fn dmabuf_fd(&self, d: u64, n: usize) -> c_int {
        let mut fd: c_int = -1;
        // SAFETY: a writable int; 1 is CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD.
        let rc = unsafe {
            self.lib
                .get::<Handle>(b"cuMemGetHandleForAddressRange\0")
                .unwrap()((&mut fd as *mut c_int).cast(), d, n, 1, 0)
        };
        assert_eq!(rc, 0);
        fd
    }
}

/// Tests `req` until done (within the limit).
fn wait(api: &Api, req: net::P) {
    let t = Instant::now();
    while !api.test(req, None).expect("test") {
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "request never completed"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// The plugin child: properties, registrations and flushes through the
/// v12 table, printing what it got.
#[test]
fn child_plugin() {
    if !is_child() {
        return;
    }
    let cuda = Cuda::new();
    let api = Api::v12_of(net::lib());
    println!("DEVICES {}", api.devices());
    let p = api.v12_props(0).expect("properties");
    println!("PTR {}", p.ptrSupport);
    let (s, r) = api.pair();
    let d = cuda.alloc(MIB);
    println!("DEV {d:#x}");
    match api.reg_typed(r, d as *mut u8, MIB, NCCL_PTR_CUDA) {
        Ok(mh) => {
            println!("REGCUDA ok");
            let (rc, req) = api.iflush(r, (d + 64) as *mut u8, 4096, mh);
            assert_eq!(rc, 0);
            println!("FLUSHCUDA {}", !req.is_null());
            if !req.is_null() {
                wait(&api, req);
            }
            api.dereg(r, mh);
        }
        Err(rc) => println!("REGCUDA err {rc}"),
    }
    small_sends(&api, s, d);
    if p.ptrSupport & NCCL_PTR_DMABUF != 0 {
        let fd = cuda.dmabuf_fd(d, MIB);
        println!("FD {fd}");
        let mh = api
            .reg_dmabuf(r, (d + 8192) as *mut u8, 3 * 4096, NCCL_PTR_CUDA, 8192, fd)
            .expect("regMrDmaBuf");
        // SAFETY: our fd; the registration does not need it any more.
        unsafe { libc::close(fd) };
        let (rc, req) = api.iflush(r, (d + 8192) as *mut u8, 100, mh);
        assert_eq!(rc, 0);
        println!("FLUSHDMABUF {}", !req.is_null());
        if !req.is_null() {
            wait(&api, req);
        }
        api.dereg(r, mh);
    }
    let mut host = vec![0u8; 4096];
    let mh = api
        .reg_typed(r, host.as_mut_ptr(), host.len(), NCCL_PTR_HOST)
        .expect("regMr of host memory");
    let (rc, req) = api.iflush(r, host.as_mut_ptr(), 4096, mh);
    assert_eq!(rc, 0);
    println!("FLUSHHOST {}", !req.is_null());
    api.dereg(r, mh);
    api.close_send(s);
    api.close_recv(r);
    api.finalize();
}

/// Appends `line` to the fake verbs log, to mark where a step's posts begin.
fn mark(line: &str) {
    use std::io::Write;
    let path = std::env::var_os("FAKE_IBV_LOG").expect("FAKE_IBV_LOG");
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(path)
        .expect("open the log");
    writeln!(f, "{line}").expect("write the log");
}

/// A 64-byte send (an eager size) from GPU memory registered on the send
/// comm, then one from host memory, each after a mark in the log.
fn small_sends(api: &Api, s: net::P, d: u64) {
    let Ok(mh) = api.reg_typed(s, d as *mut u8, MIB, NCCL_PTR_CUDA) else {
        println!("SENDCUDA none");
        return;
    };
    mark("MARK device send");
    let req = api
        .retry(|| api.isend(s, (d + 4096) as *const u8, 64, 3, mh))
        .expect("isend from GPU memory");
    // The message waits for a CTS the emulated peer never writes.
    assert!(!api.test(req, None).expect("test"));
    println!("SENDCUDA posted");
    let host = [5u8; 64];
    let hm = api
        .reg_typed(s, host.as_ptr() as *mut u8, host.len(), NCCL_PTR_HOST)
        .expect("regMr of host memory");
    mark("MARK host send");
    let req = api
        .retry(|| api.isend(s, host.as_ptr(), 64, 3, hm))
        .expect("isend from host memory");
    wait(api, req);
    mark("MARK end");
}

/// The SENDs (opcode 2) the log shows between `from` and the next mark.
fn sends_after<'a>(log: &'a str, from: &str) -> Vec<&'a str> {
    log.lines()
        .skip_while(|l| *l != from)
        .skip(1)
        .take_while(|l| !l.starts_with("MARK"))
        .filter(|l| l.starts_with("post_send op=2 "))
        .collect()
}

fn plugin(case: &str, gpu: &str, peermem: bool, env: &[(&str, &str)]) -> Out {
    let o = run("child_plugin", case, gpu, peermem, env);
    assert_eq!(o.get("DEVICES"), "1", "{}", o.stdout);
    assert!(
        o.stdout.contains("NET/IB: port 0: fake0:1 RoCE"),
        "{}",
        o.stdout
    );
    o
}

fn ptr(o: &Out) -> i32 {
    o.get("PTR").parse().expect("a number")
}

#[test]
fn peermem_and_dmabuf_near_the_gpu_register_and_flush_device_memory() {
    if is_child() {
        return;
    }
    let o = plugin("all", GPU_NEAR, true, &[]);
    assert_eq!(
        ptr(&o),
        NCCL_PTR_HOST | NCCL_PTR_CUDA | NCCL_PTR_DMABUF,
        "{}",
        o.stdout
    );
    let d = u64::from_str_radix(o.get("DEV").trim_start_matches("0x"), 16).unwrap();
    assert_eq!(o.get("REGCUDA"), "ok");
    // regMr of device memory: ibv_reg_mr on the device address (the cache
    // registers whole pages; cuMemAlloc's addresses are page-aligned).
    let want = format!("reg_mr addr={d:#x} len={MIB} ");
    assert!(o.log.contains(&want), "{want}\n{}", o.log);
    // The fd, offset and length NCCL passed, unchanged.
    let fd = o.get("FD");
    let want = format!(
        "reg_dmabuf_mr offset=8192 len=12288 iova={:#x} fd={fd} fd_ok=1 ",
        d + 8192
    );
    assert!(o.log.contains(&want), "{want}\n{}", o.log);
    // iflush: a request (an RDMA read of the received buffer) for GPU
    // registrations, none for host memory.
    assert_eq!(o.get("FLUSHCUDA"), "true");
    assert_eq!(o.get("FLUSHDMABUF"), "true");
    assert_eq!(o.get("FLUSHHOST"), "false");
    // A 64-byte send from GPU memory is never copied by the CPU (no eager
    // slot, no inline payload): it goes by rendezvous, a SEND of the
    // 32-byte header alone. From host memory it goes eager, header and
    // payload in one SEND.
    assert_eq!(o.get("SENDCUDA"), "posted");
    let dev = sends_after(&o.log, "MARK device send");
    assert_eq!(dev.len(), 1, "{}", o.log);
    assert!(dev[0].contains(" len=32 "), "{dev:?}");
    let host = sends_after(&o.log, "MARK host send");
    assert_eq!(host.len(), 1, "{}", o.log);
    assert!(host[0].contains(" len=96 "), "{host:?}");
    let reads: Vec<&str> = o.log.lines().filter(|l| l.contains("rdma_read")).collect();
    assert_eq!(reads.len(), 2, "{}", o.log);
    assert!(
        reads[0].contains(&format!("remote={:#x} ", d + 64)),
        "{reads:?}"
    );
    assert!(
        reads[1].contains(&format!("remote={:#x} ", d + 8192)),
        "{reads:?}"
    );
}

#[test]
fn without_peermem_or_dmabuf_only_host_memory_is_offered() {
    if is_child() {
        return;
    }
    let o = plugin("none", GPU_NEAR, false, &[("NCCL_DMABUF_ENABLE", "0")]);
    assert_eq!(ptr(&o), NCCL_PTR_HOST, "{}", o.stdout);
    assert!(o.get("REGCUDA").starts_with("err"), "{}", o.stdout);
    assert!(!o.log.contains("reg_dmabuf_mr"), "{}", o.log);
    assert_eq!(o.get("FLUSHHOST"), "false");
    // DMA-BUF alone: offered, while regMr of NCCL_PTR_CUDA is refused.
    let o = plugin("dmabuf_only", GPU_NEAR, false, &[]);
    assert_eq!(ptr(&o), NCCL_PTR_HOST | NCCL_PTR_DMABUF, "{}", o.stdout);
    assert!(o.get("REGCUDA").starts_with("err"), "{}", o.stdout);
    assert_eq!(o.get("FLUSHDMABUF"), "true");
}

#[test]
fn the_gdr_level_is_compared_with_the_gpu_nic_distance() {
    if is_child() {
        return;
    }
    // The GPU on the other socket (SYS) is beyond the default PXB ...
    let o = plugin("far_default", GPU_FAR, true, &[]);
    assert_eq!(ptr(&o), NCCL_PTR_HOST, "{}", o.stdout);
    assert!(o.stdout.contains("GPU distance SYS"), "{}", o.stdout);
    // ... and within SYS (old number 4).
    let o = plugin("far_sys", GPU_FAR, true, &[("NCCL_NET_GDR_LEVEL", "4")]);
    assert_eq!(
        ptr(&o),
        NCCL_PTR_HOST | NCCL_PTR_CUDA | NCCL_PTR_DMABUF,
        "{}",
        o.stdout
    );
    // Same switch (PIX) is within PIX; LOC turns GPUDirect off.
    let o = plugin("near_pix", GPU_NEAR, true, &[("NCCL_NET_GDR_LEVEL", "PIX")]);
    assert_eq!(
        ptr(&o),
        NCCL_PTR_HOST | NCCL_PTR_CUDA | NCCL_PTR_DMABUF,
        "{}",
        o.stdout
    );
    let o = plugin("near_loc", GPU_NEAR, true, &[("NCCL_NET_GDR_LEVEL", "LOC")]);
    assert_eq!(ptr(&o), NCCL_PTR_HOST, "{}", o.stdout);
}

/// The engine child: decision, registration and flush of a device buffer
/// through `hetccl_collectives::transport::gdr`.
#[test]
fn child_engine() {
    if !is_child() {
        return;
    }
    use hetccl_collectives::transport::gdr;
    use nccl_net_plugin::ib::gdr::GdrMode;
    let ports = nccl_net_plugin::ib::usable_ports(&Default::default());
    let port = ports.first().expect("the fake port");
    let d = hetccl_collectives::gpu::driver::mem_alloc(MIB).expect("cuMemAlloc") as usize;
    println!("DEV {d:#x}");
    let mode = gdr::decide(port, 0);
    println!("MODE {mode:?}");
    match gdr::register(port, &mode, d + 100, 1000) {
        Ok(mr) => {
            println!("MR {:#x} {} {}", mr.addr, mr.len, mr.rkey);
            let f = gdr::GdrFlush::new(port.clone(), Default::default());
            let id = f.post(&mr, d + 100).expect("flush");
            let t = Instant::now();
            while !f.done(id).expect("flush test") {
                assert!(
                    t.elapsed() < Duration::from_secs(20),
                    "flush never completed"
                );
            }
            println!("FLUSHED");
            assert!(
                f.post(&mr, d + 2 * MIB).is_err(),
                "outside the registration"
            );
            link_send(d + 4096);
        }
        Err(e) => println!("STAGED {e}"),
    }
    // ncclCommRegister's path: held in the registration cache.
    let d2 = hetccl_collectives::gpu::driver::mem_alloc(MIB).expect("cuMemAlloc") as usize;
    gdr::register_user(d2, MIB, 0);
    let hit = nccl_net_plugin::ib::find_registered(port, d2, MIB).is_some();
    println!("CACHED {hit}");
    if matches!(mode, GdrMode::Staged(_)) {
        assert!(!hit);
    }
}

/// 64 bytes at the registered device address `at` through the engine's
/// verbs link (a loopback pair on the fake port), after a mark in the log.
fn link_send(at: usize) {
    let (a, _b) = hetccl_collectives::transport::verbs::loopback_pair(1)
        .expect("loopback pair")
        .expect("the fake port");
    mark("MARK link send");
    // SAFETY: the emulated driver backs device memory with host memory;
    // the slice is only handed to the link, which must not read it.
    let src = unsafe { std::slice::from_raw_parts(at as *const u8, 64) };
    // Posted by rendezvous: waits for a CTS the emulated peer never writes.
    assert_eq!(a[0].tx.try_send(src).expect("try_send"), 0);
    mark("MARK end");
    println!("LINKSENT");
}

#[test]
fn the_engine_registers_device_memory_through_a_dmabuf_fd() {
    if is_child() {
        return;
    }
    let o = run(
        "child_engine",
        "engine_dmabuf",
        GPU_NEAR,
        true,
        &[("FAKE_CUDA_LOG", "1")],
    );
    assert_eq!(o.get("MODE"), "DmaBuf", "{}", o.stdout);
    let d = u64::from_str_radix(o.get("DEV").trim_start_matches("0x"), 16).unwrap();
    // The whole allocation, through the fd cuMemGetHandleForAddressRange gave.
    assert_eq!(
        o.get("MR").split(' ').take(2).collect::<Vec<_>>(),
        [format!("{d:#x}"), MIB.to_string()]
    );
    let line = o
        .log
        .lines()
        .find(|l| l.starts_with("reg_dmabuf_mr"))
        .expect(&o.log);
    assert!(
        line.contains(&format!("offset=0 len={MIB} iova={d:#x} ")) && line.contains("fd_ok=1"),
        "{line}"
    );
    // The fd is the one the driver exported (its log: `-> fd N`).
    let fd = line
        .split(' ')
        .find_map(|w| w.strip_prefix("fd="))
        .expect("fd=");
    assert!(
        o.stderr.contains(&format!(
            "cuMemGetHandleForAddressRange({d:#x}, {MIB}) -> fd {fd}"
        )),
        "{line}\n{}",
        o.stderr
    );
    assert!(!o.log.contains(&format!("reg_mr addr={d:#x}")), "{}", o.log);
    let rkey = o.get("MR").split(' ').nth(2).unwrap().to_string();
    assert!(
        o.log
            .contains(&format!("remote={:#x} rkey={rkey}", d + 100)),
        "{}",
        o.log
    );
    assert!(o.stdout.lines().any(|l| l == "FLUSHED"), "{}", o.stdout);
    assert_eq!(o.get("CACHED"), "true");
    // The engine's verbs link finds the device registration: a 64-byte
    // send from it posts the RTS header alone, never the payload.
    assert!(o.stdout.lines().any(|l| l == "LINKSENT"), "{}", o.stdout);
    let sends = sends_after(&o.log, "MARK link send");
    assert_eq!(sends.len(), 1, "{}", o.log);
    assert!(sends[0].contains(" len=32 "), "{sends:?}");
}

#[test]
fn the_engine_uses_peermem_without_dmabuf_and_stages_beyond_the_level() {
    if is_child() {
        return;
    }
    let o = run(
        "child_engine",
        "engine_peermem",
        GPU_NEAR,
        true,
        &[("NCCL_DMABUF_ENABLE", "0")],
    );
    assert_eq!(o.get("MODE"), "PeerMem", "{}", o.stdout);
    let d = u64::from_str_radix(o.get("DEV").trim_start_matches("0x"), 16).unwrap();
    assert!(
        o.log.contains(&format!("reg_mr addr={d:#x} len={MIB} ")),
        "{}",
        o.log
    );
    assert!(!o.log.contains("reg_dmabuf_mr"), "{}", o.log);
    let o = run("child_engine", "engine_far", GPU_FAR, true, &[]);
    assert!(
        o.get("MODE").starts_with("Staged(\"GPU-NIC distance SYS"),
        "{}",
        o.stdout
    );
    assert!(o.get("STAGED").contains("staged"), "{}", o.stdout);
    assert_eq!(o.get("CACHED"), "false");
    let d = u64::from_str_radix(o.get("DEV").trim_start_matches("0x"), 16).unwrap();
    assert!(
        !o.log.contains("reg_dmabuf_mr") && !o.log.contains(&format!("reg_mr addr={d:#x}")),
        "{}",
        o.log
    );
}
