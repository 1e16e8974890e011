//! Dead and stuck peers: 4 ranks of `tests/c/coll_check.c` (mode
//! `peer_fault`, under `LD_PRELOAD=libhetccl.so`) loop AllReduce; one rank
//! (rotating over 1..=3) is killed with `kill -9` or stopped with `SIGSTOP`
//! in the middle of the loop (`tests/support/faults.rs`). Every survivor's
//! failing call must return `ncclRemoteError` (6) or `ncclSystemError` (2)
//! within `HETCCL_TIMEOUT_S` (3 s here) plus 2 s after the signal,
//! `ncclCommGetAsyncError` must report it, a later call must fail too, and
//! `ncclCommAbort` must return within 1 s. No survivor may hang, crash or see
//! a wrong result before the fault.
//!
//! Transports: shm (one node), TCP (`NCCL_SHM_DISABLE=1`), and two network
//! namespaces joined by veth (2 nodes × 2 ranks). Trials per scenario:
//! `HETCCL_STRESS_REPS` (default 3, as in CI; `scripts/stress.sh` runs 20). Each
//! scenario prints one `STRESS` line with its figures.
//!
//! The SIGSTOP and idle-peer scenarios also run with
//! `HETCCL_HANG_REPORT_S=1` and check the hang summary (exec/watch.rs):
//! a survivor on the victim's node names it as stopped, or as not having
//! started the operation.

use std::path::Path;
use std::rc::Rc;
use std::time::Instant;

use hetccl_testkit::coll::Job;
use hetccl_testkit::faults::{Fault, Verdict};
use hetccl_testkit::{coll, faults, hetccl_so, netns};

const NRANKS: usize = 4;
const TIMEOUT_S: f64 = 3.0;
/// What a survivor may take on top of HETCCL_TIMEOUT_S.
const MARGIN_S: f64 = 2.0;

fn exe() -> &'static Path {
    coll::program("coll_check_faults")
}

fn reps() -> usize {
    std::env::var("HETCCL_STRESS_REPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3)
}

fn base_job(label: &str, fault: Fault) -> Job {
    let mut j = Job::new(label, NRANKS, "peer_fault")
        .env("HETCCL_TIMEOUT_S", &TIMEOUT_S.to_string())
        .env("NCCL_DEBUG", "WARN");
    if fault != Fault::Kill {
        j = j.env("HETCCL_HANG_REPORT_S", "1");
    }
    j
}

/// What the hang summary must say about the victim, if anything.
fn summary_problem(v: &Verdict, victim: usize, fault: Fault) -> Option<String> {
    let want = match fault {
        Fault::Kill => return None,
        Fault::Stop => format!("rank {victim} (pid {}): STOPPED", v.victim_pid),
        Fault::Idle => format!("rank {victim} (has not started seq"),
    };
    (!v.stdout.contains("hang summary") || !v.stdout.contains(&want))
        .then(|| format!("no hang summary with `{want}` in the survivors' output"))
}

/// Runs `reps()` trials of one scenario and asserts every one passed,
/// including the hang summary.
fn scenario(name: &str, fault: Fault, job: impl Fn() -> Job) {
    scenario_opts(name, fault, true, job)
}

/// [`scenario`], with or without the hang-summary check.
fn scenario_opts(name: &str, fault: Fault, summary: bool, job: impl Fn() -> Job) {
    let (exe, so) = (exe(), hetccl_so());
    let t0 = Instant::now();
    let n = reps();
    let (mut hangs, mut crashes, mut wrong, mut bad) = (0, 0, 0, 0);
    let (mut detect, mut abort) = (0f64, 0f64);
    let mut failures = Vec::new();
    for t in 0..n {
        let victim = 1 + t % (NRANKS - 1);
        let delay = (t as u64 * 37) % 50;
        let v = faults::trial(exe, &so, &job(), victim, fault, TIMEOUT_S, MARGIN_S, delay);
        if t == 0 && fault != Fault::Kill {
            // One example of the summary in the log (docs/reliability.md).
            for l in v.stdout.lines().filter(|l| {
                l.contains("hang summary") || l.contains("  rank ") || l.contains("  behind:")
            }) {
                eprintln!("  | {l}");
            }
        }
        let mut problems = v.bad.clone();
        if summary {
            problems.extend(summary_problem(&v, victim, fault));
        }
        hangs += usize::from(v.hang);
        crashes += usize::from(v.crash);
        wrong += usize::from(v.wrong);
        bad += usize::from(!problems.is_empty());
        detect = detect.max(v.detect_ms);
        abort = abort.max(v.abort_ms);
        if !v.ok() || !problems.is_empty() {
            failures.push(format!(
                "trial {t} (victim {victim}): hang {} crash {} wrong {}: {}\n{}",
                v.hang,
                v.crash,
                v.wrong,
                problems.join("; "),
                v.report
            ));
        }
    }
    eprintln!(
        "STRESS {name}: trials {n} hangs {hangs} crashes {crashes} wrong {wrong} bad {bad} \
         max_detect_ms {detect:.0} max_abort_ms {abort:.0} time_s {:.1}",
        t0.elapsed().as_secs_f64()
    );
    assert!(
        failures.is_empty(),
        "{name}: {} of {n} trials failed:\n{}",
        failures.len(),
        failures.join("\n\n")
    );
}

/// The pipelined rings of the executor over shm (`NCCL_ALGO=allreduce:Ring`
/// keeps AllReduce off the direct single-node paths of `direct/`).
fn shm_ring(label: &str, fault: Fault) -> Job {
    base_job(label, fault).env("NCCL_ALGO", "allreduce:Ring")
}

#[test]
fn kill_9_over_shm() {
    scenario("kill9_shm", Fault::Kill, || {
        shm_ring("kill9_shm", Fault::Kill)
    });
}

#[test]
fn sigstop_over_shm() {
    scenario("sigstop_shm", Fault::Stop, || {
        shm_ring("sigstop_shm", Fault::Stop)
    });
}

#[test]
fn idle_peer_is_named_by_the_hang_summary() {
    scenario("idle_shm", Fault::Idle, || {
        shm_ring("idle_shm", Fault::Idle)
    });
}

/// One node, default algorithm choice: AllReduce takes the direct
/// single-node path (`collectives/src/direct/`), which has its own waits and
/// publishes its stalls on the same progress board, so the hang summary must
/// name the stopped rank here too.
#[test]
fn kill_9_and_sigstop_on_the_direct_path() {
    scenario("kill9_direct", Fault::Kill, || {
        base_job("kill9_direct", Fault::Kill)
    });
    scenario_opts("sigstop_direct", Fault::Stop, true, || {
        base_job("sigstop_direct", Fault::Stop)
    });
}

#[test]
fn kill_9_over_tcp() {
    scenario("kill9_tcp", Fault::Kill, || {
        base_job("kill9_tcp", Fault::Kill).env("NCCL_SHM_DISABLE", "1")
    });
}

#[test]
fn sigstop_over_tcp() {
    scenario("sigstop_tcp", Fault::Stop, || {
        base_job("sigstop_tcp", Fault::Stop).env("NCCL_SHM_DISABLE", "1")
    });
}

/// The namespaces, or `None` when they cannot be made and
/// `HETCCL_REQUIRE_NETNS` is not 1 (then the test passes after saying so).
fn namespaces() -> Option<Rc<netns::NetnsPair>> {
    match netns::NetnsPair::create() {
        Ok(p) => Some(Rc::new(p)),
        Err(e) => {
            assert!(
                std::env::var("HETCCL_REQUIRE_NETNS").as_deref() != Ok("1"),
                "HETCCL_REQUIRE_NETNS=1 but: {e}"
            );
            eprintln!("SKIPPED: no network namespaces ({e})");
            None
        }
    }
}

fn netns_job(pair: &Rc<netns::NetnsPair>, label: &str, fault: Fault) -> Job {
    let (p1, p2) = (Rc::clone(pair), Rc::clone(pair));
    base_job(label, fault)
        .prefix(move |rank| p1.exec_prefix(rank / 2))
        .rank_env(move |rank, _| {
            vec![
                (
                    "HETCCL_HOST_ID".into(),
                    if rank < 2 { "A" } else { "B" }.into(),
                ),
                (
                    "HETCCL_SOCKET_IFNAME".into(),
                    p2.node(rank / 2).1.to_string(),
                ),
            ]
        })
}

#[test]
fn kill_9_across_network_namespaces() {
    let Some(pair) = namespaces() else { return };
    scenario("kill9_netns", Fault::Kill, || {
        netns_job(&pair, "kill9_netns", Fault::Kill)
    });
}

#[test]
fn sigstop_across_network_namespaces() {
    let Some(pair) = namespaces() else { return };
    scenario("sigstop_netns", Fault::Stop, || {
        netns_job(&pair, "sigstop_netns", Fault::Stop)
    });
}
