//! Running `tests/c/coll_check.c` as N ranks and judging the result; shared
//! by `tests/collectives_mp.rs`, `tests/collectives_netns.rs` and the other
//! tests that launch `coll_check` (the modes are listed in
//! [`crate::modes`]).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::cc;
use crate::ranks::{self, RankOutput};
use crate::tmp_dir;

/// What every child gets unless a job overrides it.
pub const CHILD_TIMEOUT_S: &str = "60";

/// The hard deadline of one job (all its ranks): above the children's own
/// HETCCL_TIMEOUT_S, so that a hang inside hetccl is reported by hetccl.
pub const JOB_DEADLINE: Duration = Duration::from_secs(100);

/// Compiles coll_check once per test binary. `name` must differ between
/// test binaries (they may compile at the same time).
pub fn program(name: &str) -> &'static Path {
    static EXE: OnceLock<PathBuf> = OnceLock::new();
    EXE.get_or_init(|| {
        cc::compile_c(
            "tests/c/coll_check.c",
            name,
            &cc::CcOpts {
                // Linked to NVIDIA's libnccl.so.2 like PyTorch; the preload
                // must win for every nccl* symbol (the program checks).
                link_nvidia_nccl: true,
                extra: vec!["-lm".into(), "-pthread".into(), "-ldl".into()],
            },
        )
    })
}

/// The scratch dir for unique-id files of this test binary.
pub fn id_dir() -> PathBuf {
    let d = tmp_dir().join("coll_ids");
    std::fs::create_dir_all(&d).expect("create the id dir");
    d
}

/// The environment of one rank, given the rank and N.
pub type RankEnv = Box<dyn Fn(usize, usize) -> Vec<(String, String)>>;

/// One launch of N ranks of coll_check.
pub struct Job {
    /// For messages: `"shm_4 allreduce"`.
    pub label: String,
    /// N.
    pub nranks: usize,
    /// `--mode` (a comma list).
    pub modes: String,
    /// More coll_check arguments (`--counts`, `--dtypes`, `--nonblocking`).
    pub args: Vec<String>,
    /// Environment for every rank, after the defaults (LD_PRELOAD,
    /// HETCCL_SOCKET_IFNAME=lo, HETCCL_TIMEOUT_S=60, NCCL_DEBUG=WARN).
    pub env: Vec<(String, String)>,
    /// Environment for one rank (given rank and N), after `env`.
    pub rank_env: RankEnv,
    /// A command prefix for one rank (`ip netns exec <ns>`), or nothing.
    pub prefix: Box<dyn Fn(usize) -> Vec<String>>,
    /// The hard deadline.
    pub deadline: Duration,
}

impl Job {
    /// A job with the defaults: no extra env, no prefix, [`JOB_DEADLINE`].
    pub fn new(label: impl Into<String>, nranks: usize, modes: impl Into<String>) -> Self {
        Self {
            label: label.into(),
            nranks,
            modes: modes.into(),
            args: Vec::new(),
            env: Vec::new(),
            rank_env: Box::new(|_, _| Vec::new()),
            prefix: Box::new(|_| Vec::new()),
            deadline: JOB_DEADLINE,
        }
    }

    /// Adds coll_check arguments.
    pub fn args<I: IntoIterator<Item = S>, S: Into<String>>(mut self, a: I) -> Self {
        self.args.extend(a.into_iter().map(Into::into));
        self
    }

    /// Sets the per-rank environment.
    pub fn rank_env(mut self, f: impl Fn(usize, usize) -> Vec<(String, String)> + 'static) -> Self {
        self.rank_env = Box::new(f);
        self
    }

    /// Sets the per-rank command prefix.
    pub fn prefix(mut self, f: impl Fn(usize) -> Vec<String> + 'static) -> Self {
        self.prefix = Box::new(f);
        self
    }

    /// Adds an environment variable for every rank.
    pub fn env(mut self, k: &str, v: &str) -> Self {
        self.env.push((k.into(), v.into()));
        self
    }
}

/// A finished job.
pub struct Outcome {
    /// Every rank's output.
    pub outs: Vec<RankOutput>,
    /// Checks done, summed over ranks.
    pub checks: u64,
    /// Wall time.
    pub elapsed: Duration,
}

/// Runs `job` with the given program and preloaded library; `Err` holds a
/// readable account of what went wrong (summary first, then every rank's
/// output).
pub fn run(exe: &Path, so: &Path, job: &Job) -> Result<Outcome, String> {
    let idp = ranks::id_path(&id_dir(), &job.label);
    let cmds = commands(exe, so, job, &idp);
    let t0 = Instant::now();
    let outs = ranks::run_ranks(cmds, job.deadline);
    let elapsed = t0.elapsed();
    ranks::remove_id_files(&idp);
    let problems = judge(job, so, &outs);
    let checks = outs
        .iter()
        .filter_map(|o| o.get("checks")?.parse::<u64>().ok())
        .sum();
    if problems.is_empty() {
        Ok(Outcome {
            outs,
            checks,
            elapsed,
        })
    } else {
        Err(format!(
            "{} ({} ranks, {:.1}s) FAILED:\n{}\n{}",
            job.label,
            job.nranks,
            elapsed.as_secs_f64(),
            problems.join("\n"),
            ranks::report(&outs, 6000)
        ))
    }
}

/// The command of every rank of `job`, with the unique-id file `idp`
/// (what [`run`] starts; `tests/peer_faults.rs` starts them itself).
pub fn commands(exe: &Path, so: &Path, job: &Job, idp: &Path) -> Vec<Command> {
    let mut cmds = Vec::new();
    for rank in 0..job.nranks {
        let prefix = (job.prefix)(rank);
        let mut cmd = if prefix.is_empty() {
            Command::new(exe)
        } else {
            // The preload is for the program only, not for the prefix's
            // tools (`ip`): `prefix... env LD_PRELOAD=<so> <exe>`.
            let mut c = Command::new(&prefix[0]);
            c.args(&prefix[1..])
                .arg("env")
                .arg(format!("LD_PRELOAD={}", so.display()))
                .arg(exe);
            c
        };
        ranks::clean_env(&mut cmd); // after this, set what the ranks need
        if prefix.is_empty() {
            cmd.env("LD_PRELOAD", so);
        }
        cmd.env("HETCCL_SOCKET_IFNAME", "lo")
            .env("HETCCL_TIMEOUT_S", CHILD_TIMEOUT_S)
            .env("NCCL_DEBUG", "WARN");
        for (k, v) in job
            .env
            .iter()
            .chain((job.rank_env)(rank, job.nranks).iter())
        {
            cmd.env(k, v);
        }
        cmd.arg("--rank")
            .arg(rank.to_string())
            .arg("--nranks")
            .arg(job.nranks.to_string())
            .arg("--id")
            .arg(idp)
            .arg("--mode")
            .arg(&job.modes)
            .args(&job.args);
        cmds.push(cmd);
    }
    cmds
}

/// Whether `rank` legitimately prints no mode lines for `mode`: the rank
/// excluded by a shrink.
fn exempt(mode: &str, rank: usize, n: usize) -> bool {
    mode.starts_with("shrink") && rank == n - 1
}

/// Everything wrong with a job's outputs, one line each, most telling first.
fn judge(job: &Job, so: &Path, outs: &[RankOutput]) -> Vec<String> {
    let mut p = Vec::new();
    let mut killed = Vec::new();
    for o in outs {
        let kv = o.kv();
        let r = o.rank;
        if !o.ok() && o.killed_after_peer {
            // Not telling by itself: reported after the real failures.
            killed.push(format!("rank {r}: {}", o.how()));
            continue;
        }
        if !o.ok() {
            let mut line = format!("rank {r}: {}", o.how());
            for k in [
                "nccl_error",
                "nccl_error_call",
                "nccl_last_error",
                "nccl_error_mode",
                "nccl_error_context",
                "fatal",
            ] {
                if let Some(v) = kv.get(k) {
                    line.push_str(&format!("; {k} = {v}"));
                }
            }
            p.push(line);
        }
        for m in o.stderr.lines().filter(|l| l.contains("MISMATCH")).take(3) {
            p.push(format!("rank {r}: {m}"));
        }
        if !o.ok() {
            continue;
        }
        match kv.get("origin") {
            Some(v) if ranks::same_file(v, so) => {}
            v => p.push(format!(
                "rank {r}: nccl* bound to {v:?}, not the preloaded {}",
                so.display()
            )),
        }
        if kv.get("origin.all_same").map(String::as_str) != Some("1") {
            p.push(format!(
                "rank {r}: not every nccl* function was bound to the same library: {:?}",
                kv.iter()
                    .filter(|(k, _)| k.starts_with("origin."))
                    .collect::<Vec<_>>()
            ));
        }
        if kv.get("done").map(String::as_str) != Some("1") {
            p.push(format!("rank {r}: exited 0 without `done 1`"));
        }
        if kv.get("wrong_total").map(String::as_str) != Some("0") {
            p.push(format!(
                "rank {r}: wrong_total = {:?}",
                kv.get("wrong_total")
            ));
        }
        for m in job.modes.split(',') {
            if exempt(m, r, job.nranks) {
                continue;
            }
            let checks = kv.get(&format!("mode.{m}.checks"));
            let wrong = kv.get(&format!("mode.{m}.wrong"));
            if checks.is_none() || wrong.map(String::as_str) != Some("0") {
                p.push(format!(
                    "rank {r}: mode {m}: checks {checks:?}, wrong {wrong:?}"
                ));
            }
        }
        if job.modes.split(',').any(|m| m == "abort") && r == 0 {
            for (k, want) in [("abort.worker_returned", "1"), ("abort.rc", "0")] {
                if kv.get(k).map(String::as_str) != Some(want) {
                    p.push(format!("rank 0: {k} = {:?}, want {want}", kv.get(k)));
                }
            }
        }
    }
    // Errors that only echo another rank's failure (a peer's connection
    // went away) come after the ones that say what happened.
    let (echo, mut first): (Vec<String>, Vec<String>) = p
        .into_iter()
        .partition(|l| l.contains("nccl_error = 6;") || l.contains("remote error"));
    first.extend(echo);
    first.extend(killed);
    first
}

/// Runs jobs one after another, prints one line per job to stderr, and
/// panics at the end listing every failed job (all jobs run even when
/// some fail, so one run shows every broken mode).
pub fn run_all(suite: &str, exe: &Path, so: &Path, jobs: Vec<Job>) -> Vec<Outcome> {
    let t0 = Instant::now();
    let mut failures = Vec::new();
    let mut done = Vec::new();
    let total = jobs.len();
    for job in &jobs {
        match run(exe, so, job) {
            Ok(o) => {
                eprintln!(
                    "[{suite}] {}: ok, {} checks, {:.1}s",
                    job.label,
                    o.checks,
                    o.elapsed.as_secs_f64()
                );
                done.push(o);
            }
            Err(e) => {
                eprintln!(
                    "[{suite}] {}: FAILED ({})",
                    job.label,
                    e.lines().nth(1).unwrap_or("")
                );
                failures.push((job.label.clone(), e));
            }
        }
    }
    eprintln!(
        "[{suite}] {}/{} jobs passed in {:.1}s",
        total - failures.len(),
        total,
        t0.elapsed().as_secs_f64()
    );
    if !failures.is_empty() {
        let names: Vec<&str> = failures.iter().map(|(l, _)| l.as_str()).collect();
        let details: Vec<&str> = failures.iter().map(|(_, e)| e.as_str()).collect();
        panic!(
            "[{suite}] {} of {} jobs failed: {}\n\n{}",
            failures.len(),
            total,
            names.join(", "),
            details.join("\n\n")
        );
    }
    done
}

/// The lines of `text` (a rank's stdout at `NCCL_DEBUG=INFO
/// NCCL_DEBUG_SUBSYS=TUNING`) where hetccl logged its choice for an
/// AllReduce (`algo=<Name>`).
pub fn allreduce_algos(text: &str) -> Vec<&str> {
    text.lines()
        .filter(|l| l.contains("algo=") && l.to_ascii_lowercase().contains("allreduce"))
        .collect()
}
