//! The C tests under valgrind (memcheck), against the library built with
//! debug assertions (the test profile).
//!
//! - `coll_check` (`tests/c/coll_check.c`, as in `tests/collectives_mp.rs`):
//!   2 ranks over shared memory and 2 over TCP (`NCCL_SHM_DISABLE=1`), every
//!   rank process under its own valgrind, with counts 1, 1021 and 70000 so
//!   that the direct single-node paths (board slots for small operations,
//!   single copy with `process_vm_readv`/`process_vm_writev` for large
//!   ones), the executor over shm rings and over TCP all run.
//! - `interpose` (`tests/c/interpose.c`, as in `tests/interpose.rs`) with
//!   `LD_PRELOAD=libhetccl.so`.
//!
//! Every process runs under `valgrind --error-exitcode=97 --leak-check=no
//! --trace-children=no` with the suppressions of `tests/valgrind.supp`; a
//! memcheck error makes the process exit 97 and fails the test, with the
//! report. Results must still be exact.
//!
//! Without valgrind the test prints why and passes, unless
//! `HETCCL_REQUIRE_VALGRIND=1` (set by `scripts/test.sh`): then it fails.
//! See docs/testing.md.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use hetccl_testkit::coll::Job;
use hetccl_testkit::ranks::RankOutput;
use hetccl_testkit::{cc, coll, hetccl_so, ranks, repo_root, tmp_dir};

/// The exit code valgrind gives a process in which it found an error.
const VG_ERROR: i32 = 97;

/// Ranks wait this long (seconds) for a silent peer; valgrind slows them
/// 20–50 times, so it is far above the 60 s of the plain tests.
const RANK_TIMEOUT_S: &str = "150";

/// The hard deadline of one launch of ranks under valgrind.
const JOB_DEADLINE: Duration = Duration::from_secs(280);

/// Counts: 1 and 1021 take the board-slot path on shm, 70000 (above
/// coll_check's big threshold of 65536, float32 only, ncclSum) the single
/// copy path (above `HETCCL_COPY_MIN_BYTES`, 32 KiB by default).
const COUNTS: &str = "1,1021,70000";

/// Collectives with a direct path (AllReduce, Broadcast, AllGather,
/// ReduceScatter), then ones that always take the executor.
const MODES: &str = "allreduce,broadcast,allgather,reducescatter,reduce,sendrecv_ring";

/// Whether valgrind can run here; panics when it cannot but must.
fn valgrind_available() -> bool {
    let ok = Command::new("valgrind")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        let required = std::env::var("HETCCL_REQUIRE_VALGRIND").is_ok_and(|v| v == "1");
        assert!(
            !required,
            "valgrind is not installed, and HETCCL_REQUIRE_VALGRIND=1 \
             (scripts/setup.sh installs it with apt-get)"
        );
        eprintln!("sanitize: SKIPPED: valgrind is not installed (apt-get install valgrind)");
    }
    ok
}

/// valgrind's options for every process.
fn vg_args() -> Vec<String> {
    let supp = repo_root().join("tests/valgrind.supp");
    vec![
        "-q".into(),
        format!("--error-exitcode={VG_ERROR}"),
        "--leak-check=no".into(),
        "--trace-children=no".into(),
        // Spinning ranks must not starve the thread that would end the spin.
        "--fair-sched=yes".into(),
        format!("--suppressions={}", supp.display()),
    ]
}

/// `cmd` (program, arguments, environment) run under valgrind instead.
fn under_valgrind(cmd: &Command) -> Command {
    let mut v = Command::new("valgrind");
    v.args(vg_args())
        .arg(cmd.get_program())
        .args(cmd.get_args());
    for (k, val) in cmd.get_envs() {
        match val {
            Some(x) => v.env(k, x),
            None => v.env_remove(k),
        };
    }
    v
}

/// Whether a process's stderr holds a memcheck report.
fn vg_report(stderr: &str) -> Vec<&str> {
    stderr
        .lines()
        .filter(|l| l.starts_with("==") && l.contains("== "))
        .take(60)
        .collect()
}

/// Everything wrong with one rank's output.
fn judge_rank(o: &RankOutput, modes: &str, so: &Path) -> Vec<String> {
    let mut p = Vec::new();
    let r = o.rank;
    let kv = o.kv();
    if o.status.and_then(|s| s.code()) == Some(VG_ERROR) {
        p.push(format!(
            "rank {r}: valgrind found errors:\n{}",
            vg_report(&o.stderr).join("\n")
        ));
    } else if !o.ok() {
        p.push(format!(
            "rank {r}: {} (nccl_error {:?}, nccl_last_error {:?}, context {:?})",
            o.how(),
            kv.get("nccl_error"),
            kv.get("nccl_last_error"),
            kv.get("nccl_error_context")
        ));
    }
    let report = vg_report(&o.stderr);
    if o.ok() && !report.is_empty() {
        p.push(format!(
            "rank {r}: valgrind wrote to stderr although the process exited 0:\n{}",
            report.join("\n")
        ));
    }
    if !o.ok() {
        return p;
    }
    match kv.get("origin") {
        Some(v) if ranks::same_file(v, so) => {}
        v => p.push(format!(
            "rank {r}: nccl* bound to {v:?}, not {}",
            so.display()
        )),
    }
    for (k, want) in [
        ("done", "1"),
        ("wrong_total", "0"),
        ("origin.all_same", "1"),
    ] {
        if kv.get(k).map(String::as_str) != Some(want) {
            p.push(format!("rank {r}: {k} = {:?}, want {want}", kv.get(k)));
        }
    }
    for m in modes.split(',') {
        let checks = kv
            .get(&format!("mode.{m}.checks"))
            .and_then(|c| c.parse::<u64>().ok());
        let wrong = kv.get(&format!("mode.{m}.wrong"));
        if checks.is_none_or(|c| c == 0) || wrong.map(String::as_str) != Some("0") {
            p.push(format!(
                "rank {r}: mode {m}: checks {checks:?}, wrong {wrong:?}"
            ));
        }
    }
    p
}

/// Runs `job`'s ranks, each under valgrind; `Err` with a report on failure.
fn run_job(exe: &Path, so: &Path, job: &Job) -> Result<(Duration, Vec<RankOutput>), String> {
    let idp = ranks::id_path(&coll::id_dir(), &job.label);
    let cmds: Vec<Command> = coll::commands(exe, so, job, &idp)
        .iter()
        .map(under_valgrind)
        .collect();
    let t0 = Instant::now();
    let outs = ranks::run_ranks(cmds, job.deadline);
    let took = t0.elapsed();
    ranks::remove_id_files(&idp);
    let problems: Vec<String> = outs
        .iter()
        .flat_map(|o| judge_rank(o, &job.modes, so))
        .collect();
    if problems.is_empty() {
        Ok((took, outs))
    } else {
        Err(format!(
            "{} under valgrind FAILED after {:.1}s:\n{}\n{}",
            job.label,
            took.as_secs_f64(),
            problems.join("\n"),
            ranks::report(&outs, 8000)
        ))
    }
}

fn job(label: &str) -> Job {
    Job {
        deadline: JOB_DEADLINE,
        ..Job::new(label, 2, MODES)
    }
    .args([
        "--dtypes",
        "float32,int8",
        "--counts",
        COUNTS,
        "--big-dtypes",
        "float32",
    ])
    .env("HETCCL_TIMEOUT_S", RANK_TIMEOUT_S)
    // The hang report must not fire in a slow but healthy run.
    .env("HETCCL_HANG_REPORT_S", "0")
}

/// The harness itself: a C program that branches on uninitialised memory
/// must make valgrind exit with [`VG_ERROR`] and a report.
#[test]
fn valgrind_catches_an_uninitialised_read() {
    if !valgrind_available() {
        return;
    }
    let src = tmp_dir().join("vg_uninit.c");
    std::fs::write(
        &src,
        "#include <stdio.h>\n#include <stdlib.h>\n\
         int main(void) { volatile char* p = malloc(64); \
         if (p[7] == 42) puts(\"42\"); else puts(\"not 42\"); \
         free((void*)p); return 0; }\n",
    )
    .expect("write the C file");
    let exe = cc::compile_c(
        src.to_str().expect("UTF-8 path"),
        "vg_uninit",
        &cc::CcOpts {
            // gcc sees the uninitialised read too; that is the point.
            extra: vec!["-Wno-error".into()],
            ..Default::default()
        },
    );
    let outs = ranks::run_ranks(
        vec![under_valgrind(&Command::new(&exe))],
        Duration::from_secs(60),
    );
    let o = &outs[0];
    assert_eq!(
        o.status.and_then(|s| s.code()),
        Some(VG_ERROR),
        "valgrind missed the error: {}\n{}",
        o.how(),
        o.stderr
    );
    assert!(
        o.stderr.contains("uninitialised value"),
        "no report: {}",
        o.stderr
    );
}

/// 2 ranks over shm (direct paths and executor rings), then 2 over TCP,
/// each rank under valgrind.
#[test]
fn coll_check_under_valgrind() {
    if !valgrind_available() {
        return;
    }
    let exe = coll::program("coll_check_sanitize");
    let so = hetccl_so();
    // Rank 0 logs whether the single-copy probe passed under valgrind.
    let jobs = [
        job("valgrind shm_2").rank_env(|r, _| {
            if r == 0 {
                vec![
                    ("NCCL_DEBUG".into(), "INFO".into()),
                    ("NCCL_DEBUG_SUBSYS".into(), "INIT".into()),
                ]
            } else {
                Vec::new()
            }
        }),
        job("valgrind tcp_2").env("NCCL_SHM_DISABLE", "1"),
    ];
    let mut failures = Vec::new();
    for j in &jobs {
        match run_job(exe, &so, j) {
            Ok((t, outs)) => {
                eprintln!("[sanitize] {}: clean, {:.1}s", j.label, t.as_secs_f64());
                if j.label.contains("shm") {
                    let log = format!("{}{}", outs[0].stdout, outs[0].stderr);
                    assert!(
                        log.contains("single-copy (process_vm_readv) between local ranks: yes"),
                        "the single-copy path was not usable under valgrind, so it was \
                         not tested:\n{}",
                        ranks::tail(&log, 6000)
                    );
                }
            }
            Err(e) => {
                eprintln!("[sanitize] {}: FAILED", j.label);
                failures.push(e);
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// `tests/c/interpose.c` with hetccl preloaded, under valgrind.
#[test]
fn interpose_under_valgrind() {
    if !valgrind_available() {
        return;
    }
    let exe = cc::compile_c(
        "tests/c/interpose.c",
        "interpose_sanitize",
        &cc::CcOpts {
            link_nvidia_nccl: true,
            extra: vec!["-ldl".into()],
        },
    );
    let so = hetccl_so();
    let mut plain = Command::new(&exe);
    plain.arg("hetccl");
    ranks::clean_env(&mut plain);
    plain.env_remove("LD_LIBRARY_PATH").env("LD_PRELOAD", &so);
    let t0 = Instant::now();
    let outs = ranks::run_ranks(vec![under_valgrind(&plain)], Duration::from_secs(120));
    let o = &outs[0];
    let report = vg_report(&o.stderr);
    assert!(
        o.ok() && report.is_empty(),
        "interpose under valgrind: {}\n{}\n{}",
        o.how(),
        report.join("\n"),
        ranks::report(&outs, 8000)
    );
    let kv = o.kv();
    for (k, want) in [
        ("getversion.version", "22800"),
        ("getversion_null.rc", "4"),
        ("memalloc4096.rw", "1"),
        ("memfree4096.rc", "0"),
        ("memfree4096_again.rc", "4"),
        ("done", "1"),
    ] {
        assert_eq!(kv.get(k).map(String::as_str), Some(want), "{k}: {kv:#?}");
    }
    let origin = kv.get("origin.ncclGetVersion").expect("origin printed");
    assert!(ranks::same_file(origin, &so), "bound to {origin}");
    eprintln!(
        "[sanitize] interpose: clean, {:.1}s",
        t0.elapsed().as_secs_f64()
    );
}
