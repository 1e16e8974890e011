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

use std::ptr::null_mut;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hetccl_abi::{ncclComm_t, ncclUniqueId};
use hetccl_collectives::api::{comm_init::*, comm_life::*, version::*};

mod soak_ops;
use soak_ops::*;
mod soak_exec;
use soak_exec::*;

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
    // SAFETY: every pointer passed is NULL where the API allows it, or memory this test owns for
    // the whole call.
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
                        // SAFETY: every pointer passed is NULL where the API allows it, or memory
                        // this test owns for the whole call.
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
                    // SAFETY: every pointer passed is NULL where the API allows it, or memory
                    // this test owns for the whole call.
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
                    // SAFETY: every pointer passed is NULL where the API allows it, or memory
                    // this test owns for the whole call.
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
    // SAFETY: every pointer passed is NULL where the API allows it, or memory this test owns for
    // the whole call.
    check(unsafe { ncclGetVersion(&mut v) }, "ncclGetVersion");
    let fd_before = fd_count();
    let mut c: ncclComm_t = null_mut();
    check(
        // SAFETY: every pointer passed is NULL where the API allows it, or memory this test owns
        // for the whole call.
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
        // SAFETY: every pointer passed is NULL where the API allows it, or memory this test owns
        // for the whole call.
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
    // SAFETY: every pointer passed is NULL where the API allows it, or memory this test owns for
    // the whole call.
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
