//! How ranks come to be: one process (1 rank), `-np N` (this binary
//! re-executed N times by a supervisor that kills the rest when one fails),
//! `--threads N`, or ranks started by mpirun/torchrun/Slurm (rank and size
//! from their environment variables, rendezvous through `--id-file`).

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use crate::bench::{run_rank, Progress, RankArgs};
use crate::cli::{self, Options};
use crate::nccl::Nccl;
use crate::store::{poll, write_atomic, Channel, FileStore, MemStore, Store};

pub use crate::launcher::{env_rank, ENV_LIB, ENV_NRANKS, ENV_RANK, ENV_STORE, LAUNCHER_VARS};

/// The library to test: `--lib`, `$HETCCL_PERF_LIB`, else `libhetccl.so`
/// next to this binary (`<target>/<profile>/`, its `deps/`, or `../lib/`).
pub fn find_library(opt: Option<&Path>) -> Result<PathBuf, String> {
    if let Some(p) = opt {
        return Ok(p.to_path_buf());
    }
    if let Some(p) = std::env::var_os(ENV_LIB).filter(|v| !v.is_empty()) {
        return Ok(PathBuf::from(p));
    }
    let exe = std::env::current_exe().map_err(|e| format!("cannot find own path: {e}"))?;
    let dir = exe.parent().map(Path::to_path_buf).unwrap_or_default();
    let candidates = [
        dir.join("libhetccl.so"),
        dir.join("deps/libhetccl.so"),
        dir.join("../lib/libhetccl.so"),
    ];
    candidates
        .iter()
        .find(|p| p.exists())
        .cloned()
        .ok_or_else(|| {
            format!(
                "no library to test: pass --lib PATH or set {ENV_LIB} (looked for {})",
                candidates[0].display()
            )
        })
}

/// Ends the process when a rank makes no progress for `-T` seconds plus a
/// margin (so that store waits, which say what they waited for, time out
/// first).
fn watchdog(progress: Arc<Progress>, timeout_s: u64) {
    let limit = timeout_s as f64 * 1.1 + 5.0;
    std::thread::Builder::new()
        .name("hetccl-perf-watchdog".into())
        .spawn(move || loop {
            std::thread::sleep(Duration::from_millis(200));
            if progress.idle_s() > limit {
                eprintln!(
                    "{}: Test timeout ({timeout_s}s): no progress; exiting",
                    crate::bench::hostname()
                );
                // SAFETY: _exit never returns and runs no handlers that could
                // block on a hung library.
                unsafe { libc::_exit(4) };
            }
        })
        .expect("spawn watchdog");
}

/// Entry point: parses argv, picks the launch mode, returns the exit code
/// (0 ok, 1 wrong results or bandwidth below `NCCL_TESTS_MIN_BW`, 2 library
/// or run error, 4 timeout, 64 usage).
pub fn main_entry(argv: Vec<String>) -> i32 {
    match argv.get(1).map(String::as_str) {
        Some("trace-merge") => return crate::trace_merge::main(&argv[2..]),
        Some("status") => return crate::status::main(&argv[2..]),
        Some("tune") => return crate::tune::main(&argv[2..]),
        _ => {}
    }
    let (coll, flags) = match cli::split_argv(&argv) {
        Ok(v) => v,
        Err(e) if e.is_empty() => {
            println!("{}", cli::command().render_help());
            return 0;
        }
        Err(e) => {
            eprintln!("{e}");
            return 64;
        }
    };
    let opts = match cli::parse(coll, &flags) {
        Ok(o) => o,
        Err(e) => {
            let is_help = e.contains("Usage:") && flags.iter().any(|f| f == "-h" || f == "--help");
            if is_help {
                println!("{e}");
                return 0;
            }
            eprintln!("hetccl-perf: {e}");
            return 64;
        }
    };
    let from_env = crate::launcher::rank_and_size();
    if opts.np > 1 && !crate::launcher::spawned_by_np() {
        return supervise(&opts, &argv);
    }
    let lib = match find_library(opts.lib.as_deref()) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("hetccl-perf: {e}");
            return 2;
        }
    };
    let nccl = match Nccl::open(&lib) {
        Ok(n) => Arc::new(n),
        Err(e) => {
            eprintln!("hetccl-perf: {e}");
            return 2;
        }
    };
    let progress = Arc::new(Progress::default());
    watchdog(progress.clone(), opts.timeout_s);
    let timeout = Duration::from_secs(opts.timeout_s);

    if opts.threads > 0 {
        return run_threads(&opts, nccl, &progress, &argv, timeout);
    }
    let (rank, nranks, source) = from_env.unwrap_or((0, 1, "single process"));
    if opts.bind_core == Some(true) && from_env.is_some() && !crate::launcher::spawned_by_np() {
        bind_launcher_rank(rank);
    }
    let (store, cleanup): (Arc<dyn Store>, Option<PathBuf>) = if nranks == 1 {
        (Arc::new(MemStore::default()), None)
    } else if let Some(dir) = crate::launcher::np_store() {
        match FileStore::new(Path::new(&dir)) {
            Ok(s) => (Arc::new(s), None),
            Err(e) => {
                eprintln!("hetccl-perf: rank {rank}: {e}");
                return 2;
            }
        }
    } else if let Some(idf) = &opts.id_file {
        match rendezvous(idf, rank, timeout) {
            Ok((s, dir)) => (Arc::new(s), if rank == 0 { Some(dir) } else { None }),
            Err(e) => {
                eprintln!("hetccl-perf: rank {rank}: {e}");
                return 2;
            }
        }
    } else {
        eprintln!(
            "hetccl-perf: rank {rank} of {nranks} (from {source}) needs --id-file PATH on a filesystem all ranks share, or use -np N"
        );
        return 64;
    };
    // Ranks of a -np run share this host; launcher ranks may not, so count
    // the local ones from the launcher's variables when it gives them.
    let local = crate::launcher::local_size().unwrap_or(nranks);
    crate::store::set_spin(local);
    let ch = Channel::new(store.clone(), rank, nranks, timeout);
    let args = RankArgs {
        nccl: &nccl,
        opts: &opts,
        nthreads: 1,
        progress: &progress,
        argv: &argv,
    };
    let code = match run_rank(&args, ch) {
        Ok(o) => outcome_code(&o),
        Err(e) => {
            eprintln!("hetccl-perf: rank {rank}: {}", e.0);
            2
        }
    };
    // The --id-file store is removed by rank 0 once every rank has said it
    // is leaving (a rank may still be reading the last barrier's keys).
    if rank != 0 {
        let _ = store.set(&format!("exit.{rank}"), b"");
    }
    if let Some(dir) = cleanup {
        for r in 1..nranks {
            let _ = store.get(&format!("exit.{r}"), timeout);
        }
        let _ = std::fs::remove_dir_all(&dir);
        if let Some(idf) = &opts.id_file {
            let _ = std::fs::remove_file(idf);
        }
    }
    code
}

fn outcome_code(o: &crate::bench::Outcome) -> i32 {
    if o.errors > 0 || o.bw_failed {
        1
    } else {
        0
    }
}

fn run_threads(
    opts: &Options,
    nccl: Arc<Nccl>,
    progress: &Arc<Progress>,
    argv: &[String],
    timeout: Duration,
) -> i32 {
    let n = opts.threads;
    let store: Arc<dyn Store> = Arc::new(MemStore::default());
    let codes: Vec<i32> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .map(|rank| {
                let store = store.clone();
                let nccl = nccl.clone();
                s.spawn(move || {
                    let ch = Channel::new(store, rank, n, timeout);
                    let args = RankArgs {
                        nccl: &nccl,
                        opts,
                        nthreads: n,
                        progress,
                        argv,
                    };
                    match run_rank(&args, ch) {
                        Ok(o) => outcome_code(&o),
                        Err(e) => {
                            eprintln!("hetccl-perf: rank {rank}: {}", e.0);
                            let _ = std::io::Write::flush(&mut std::io::stdout());
                            // The other threads may wait for this rank forever
                            // inside the library: end the process.
                            // SAFETY: _exit never returns.
                            unsafe { libc::_exit(2) };
                        }
                    }
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap_or(3)).collect()
    });
    codes.into_iter().max().unwrap_or(0)
}

/// `--id-file` rendezvous: rank 0 creates a fresh store directory next to
/// the file and publishes its name (with the job key) in the file, written
/// atomically; the others poll for a file of this job, no older than 60 s
/// before they started.
fn rendezvous(idf: &Path, rank: usize, timeout: Duration) -> Result<(FileStore, PathBuf), String> {
    let key = crate::launcher::job_key();
    if rank == 0 {
        let _ = std::fs::remove_file(idf);
        let nonce = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let dir = PathBuf::from(format!(
            "{}.store.{}.{nonce:x}",
            idf.display(),
            std::process::id()
        ));
        let store = FileStore::new(&dir)?;
        write_atomic(
            idf,
            format!("hetccl-perf-rendezvous 1\n{key}\n{}\n", dir.display()).as_bytes(),
        )?;
        return Ok((store, dir));
    }
    let started = SystemTime::now() - Duration::from_secs(60);
    let dir = poll(
        timeout,
        &format!("rendezvous file {}", idf.display()),
        || {
            let meta = std::fs::metadata(idf).ok()?;
            if meta.modified().ok()? < started {
                return None;
            }
            let text = std::fs::read_to_string(idf).ok()?;
            let mut lines = text.lines();
            if lines.next()? != "hetccl-perf-rendezvous 1" || lines.next()? != key {
                return None;
            }
            Some(PathBuf::from(lines.next()?))
        },
    )?;
    Ok((FileStore::new(&dir)?, dir))
}

/// `--bind-to core` for a rank started by a launcher (or by hand with
/// `--id-file`): pins this process to the local-rank-th CPU it may use, as
/// `mpirun --bind-to core` does. Best effort: a refused affinity leaves it
/// unbound, with a note on stderr.
fn bind_launcher_rank(rank: usize) {
    let cpus = usable_cpus();
    if cpus.is_empty() {
        return;
    }
    let cpu = cpus[crate::launcher::local_rank(rank) % cpus.len()];
    if !pin_to_cpu(cpu) {
        eprintln!(
            "hetccl-perf: rank {rank}: --bind-to core: cannot pin to CPU {cpu}: {}",
            std::io::Error::last_os_error()
        );
    }
}

/// Pins the calling process to `cpu` (one of [`usable_cpus`]); false when
/// the kernel refused (errno says why). Async-signal-safe: no allocation,
/// so `-np` children call it between fork and exec.
fn pin_to_cpu(cpu: usize) -> bool {
    // SAFETY: a zeroed cpu_set_t is valid.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `cpu` < CPU_SETSIZE (it came from sched_getaffinity's set).
    unsafe { libc::CPU_SET(cpu, &mut set) };
    // SAFETY: `set` is a valid cpu_set_t of the size passed.
    unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) == 0 }
}

/// The CPUs this process may run on, in order.
fn usable_cpus() -> Vec<usize> {
    // SAFETY: a zeroed cpu_set_t is valid; sched_getaffinity fills it.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is writable and of the size passed.
    let r = unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
    if r != 0 {
        return Vec::new();
    }
    // SAFETY: reading a filled set.
    (0..libc::CPU_SETSIZE as usize)
        .filter(|&c| unsafe { libc::CPU_ISSET(c, &set) })
        .collect()
}

/// The host identity of rank `r` of `np` split into `hosts` blocks of
/// consecutive ranks (`--hosts`).
pub fn host_id(r: usize, np: usize, hosts: usize) -> String {
    format!("hetccl-perf-host{}", r * hosts / np.max(1))
}

/// `-np N`: runs this binary N times with rank variables and a fresh store
/// directory; when one child fails the others are killed. Children also die
/// with the supervisor (`PR_SET_PDEATHSIG`).
fn supervise(opts: &Options, argv: &[String]) -> i32 {
    use std::os::unix::process::CommandExt;
    let np = opts.np;
    let nonce = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let dir = std::env::temp_dir().join(format!("hetccl-perf-{}-{nonce:x}", std::process::id()));
    if let Err(e) = std::fs::create_dir_all(&dir) {
        eprintln!("hetccl-perf: cannot create {}: {e}", dir.display());
        return 2;
    }
    let exe = match std::env::current_exe() {
        Ok(e) => e,
        Err(e) => {
            eprintln!("hetccl-perf: cannot find own path: {e}");
            return 2;
        }
    };
    let cpus = usable_cpus();
    let bind = opts.bind_core.unwrap_or(np <= cpus.len()) && !cpus.is_empty();
    let mut children: Vec<Option<Child>> = Vec::new();
    let mut code = 0;
    for r in 0..np {
        let cpu = bind.then(|| cpus[r % cpus.len()]);
        let mut cmd = Command::new(&exe);
        cmd.arg0(&argv[0])
            .args(&argv[1..])
            .env(ENV_RANK, r.to_string())
            .env(ENV_NRANKS, np.to_string())
            .env(ENV_STORE, &dir);
        if opts.hosts > 0 {
            cmd.env("HETCCL_HOST_ID", host_id(r, np, opts.hosts));
        }
        // SAFETY: prctl is async-signal-safe; runs in the child before exec.
        unsafe {
            cmd.pre_exec(move || {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                if let Some(c) = cpu {
                    // Best effort: a refused affinity leaves the rank unbound.
                    pin_to_cpu(c);
                }
                Ok(())
            });
        }
        match cmd.spawn() {
            Ok(c) => children.push(Some(c)),
            Err(e) => {
                eprintln!("hetccl-perf: cannot start rank {r}: {e}");
                code = 2;
                break;
            }
        }
    }
    // Wait; the first failure kills the rest.
    let start = Instant::now();
    while code == 0 && children.iter().any(Option::is_some) {
        for (r, slot) in children.iter_mut().enumerate() {
            let Some(c) = slot else { continue };
            match c.try_wait() {
                Ok(Some(st)) => {
                    *slot = None;
                    if !st.success() {
                        let c = st.code().unwrap_or_else(|| {
                            use std::os::unix::process::ExitStatusExt;
                            128 + st.signal().unwrap_or(0)
                        });
                        eprintln!("hetccl-perf: rank {r} exited with status {c}; stopping the other ranks");
                        code = c;
                        break;
                    }
                }
                Ok(None) => {}
                Err(e) => {
                    eprintln!("hetccl-perf: waiting for rank {r}: {e}");
                    code = 2;
                }
            }
        }
        if code == 0 {
            std::thread::sleep(Duration::from_millis(
                if start.elapsed() < Duration::from_secs(1) {
                    1
                } else {
                    10
                },
            ));
        }
    }
    for c in children.iter_mut().flatten() {
        let _ = c.kill();
        let _ = c.wait();
    }
    let _ = std::fs::remove_dir_all(&dir);
    code
}
