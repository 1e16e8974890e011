//! One peer-fault trial of `tests/peer_faults.rs`: N ranks of
//! `tests/c/coll_check.c` in mode `peer_fault`; when the victim announces
//! its pid (file `<id>.victim`), the harness kills it (`SIGKILL`), stops it
//! (`SIGSTOP`), or lets it idle, and then judges what the survivors saw.

use std::path::Path;
use std::process::Child;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::coll::{self, Job};
use crate::ranks::{self, reader};

/// A rank process and the threads collecting its stdout and stderr.
type Kid = (Child, JoinHandle<Vec<u8>>, JoinHandle<Vec<u8>>);

/// What happens to the victim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// `kill -9` in the middle of its AllReduce loop.
    Kill,
    /// `SIGSTOP` in the middle of its AllReduce loop (killed at the end).
    Stop,
    /// Alive but calls nothing more (`COLL_CHECK_VICTIM_IDLE=1`).
    Idle,
}

/// How one trial ended.
#[derive(Debug, Default, Clone)]
pub struct Verdict {
    /// A survivor did not return by the hard deadline.
    pub hang: bool,
    /// A survivor died of a signal.
    pub crash: bool,
    /// A survivor saw a wrong AllReduce result before the fault.
    pub wrong: bool,
    /// Anything else: a code other than 2/6, too slow, abort too slow.
    pub bad: Vec<String>,
    /// The slowest survivor: signal to its failing call's return, ms.
    pub detect_ms: f64,
    /// The slowest `ncclCommAbort`, ms.
    pub abort_ms: f64,
    /// Every survivor's stdout, concatenated (hang reports, summaries).
    pub stdout: String,
    /// The victim's pid.
    pub victim_pid: u32,
    /// A report of every rank, for failures.
    pub report: String,
}

impl Verdict {
    /// Nothing went wrong.
    pub fn ok(&self) -> bool {
        !self.hang && !self.crash && !self.wrong && self.bad.is_empty()
    }
}

fn mono_ms() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as f64 * 1e3 + ts.tv_nsec as f64 / 1e6
}

fn signal(pid: i32, sig: i32) {
    // SAFETY: kill(2) of a process this harness started.
    unsafe { libc::kill(pid, sig) };
}

/// Runs one trial of `job` (mode `peer_fault`, HETCCL_TIMEOUT_S =
/// `timeout_s`) with `victim` and `fault`; `delay_ms` after the victim's
/// announcement the signal is sent. A survivor must return 2 or 6 within
/// `timeout_s + margin_s` of the signal, report an asynchronous error, fail
/// a later call, and abort within 1 s.
#[allow(clippy::too_many_arguments)]
pub fn trial(
    exe: &Path,
    so: &Path,
    job: &Job,
    victim: usize,
    fault: Fault,
    timeout_s: f64,
    margin_s: f64,
    delay_ms: u64,
) -> Verdict {
    let idp = ranks::id_path(&coll::id_dir(), &job.label);
    let vpath = format!("{}.victim", idp.display());
    let _ = std::fs::remove_file(&vpath);
    let mut kids: Vec<Kid> = Vec::new();
    for mut cmd in coll::commands(exe, so, job, &idp) {
        cmd.env("COLL_CHECK_VICTIM", victim.to_string()).env(
            "COLL_CHECK_VICTIM_IDLE",
            if fault == Fault::Idle { "1" } else { "0" },
        );
        ranks::prepare(&mut cmd);
        let mut c = cmd.spawn().expect("spawn a rank");
        let o = reader(c.stdout.take().expect("stdout"));
        let e = reader(c.stderr.take().expect("stderr"));
        kids.push((c, o, e));
    }
    let mut v = Verdict::default();
    let start = Instant::now();
    let hard = Duration::from_secs_f64(timeout_s + margin_s + 60.0);
    // The victim's announcement.
    let mut t_sig = None;
    while start.elapsed() < hard {
        if let Some(pid) = std::fs::read_to_string(&vpath)
            .ok()
            .and_then(|s| s.trim().parse::<i32>().ok())
        {
            std::thread::sleep(Duration::from_millis(delay_ms));
            v.victim_pid = pid as u32;
            match fault {
                Fault::Kill => signal(pid, libc::SIGKILL),
                Fault::Stop => signal(pid, libc::SIGSTOP),
                Fault::Idle => {}
            }
            t_sig = Some(mono_ms());
            break;
        }
        if kids
            .iter_mut()
            .any(|k| matches!(k.0.try_wait(), Ok(Some(_))))
        {
            break; // a rank ended before the victim spoke
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    // The survivors (and an idle victim) end by themselves; a stopped one is
    // killed once they have.
    let mut status = vec![None; kids.len()];
    loop {
        for (i, k) in kids.iter_mut().enumerate() {
            if status[i].is_none() {
                if let Ok(Some(s)) = k.0.try_wait() {
                    status[i] = Some(s);
                }
            }
        }
        let waiting = (0..kids.len())
            .filter(|&i| status[i].is_none() && (i != victim || fault == Fault::Idle))
            .count();
        if waiting == 0 || start.elapsed() > hard {
            v.hang = waiting > 0;
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let mut outs = Vec::new();
    for (i, (mut c, o, e)) in kids.into_iter().enumerate() {
        if status[i].is_none() {
            // SAFETY: our own child's process group.
            unsafe { libc::kill(-(c.id() as i32), libc::SIGKILL) };
            status[i] = c.wait().ok();
        }
        outs.push(ranks::RankOutput {
            rank: i,
            status: status[i],
            timed_out: false,
            killed_after_peer: false,
            stdout: String::from_utf8_lossy(&o.join().unwrap_or_default()).into_owned(),
            stderr: String::from_utf8_lossy(&e.join().unwrap_or_default()).into_owned(),
            elapsed: start.elapsed(),
        });
    }
    ranks::remove_id_files(&idp);
    let _ = std::fs::remove_file(&vpath);
    let Some(t_sig) = t_sig else {
        v.bad.push("the victim never announced itself".into());
        v.report = ranks::report(&outs, 4000);
        return v;
    };
    for o in outs.iter().filter(|o| o.rank != victim) {
        judge_survivor(o, t_sig, timeout_s + margin_s, &mut v);
        v.stdout.push_str(&o.stdout);
    }
    if fault == Fault::Idle && !outs[victim].ok() {
        v.bad.push(format!("idle victim: {}", outs[victim].how()));
    }
    v.report = ranks::report(&outs, 4000);
    v
}

fn judge_survivor(o: &ranks::RankOutput, t_sig: f64, limit_s: f64, v: &mut Verdict) {
    let r = o.rank;
    if o.status
        .is_some_and(|s| std::os::unix::process::ExitStatusExt::signal(&s).is_some())
    {
        v.crash = true;
    }
    if o.stderr.contains("MISMATCH") || o.get("wrong_total").is_some_and(|w| w != "0") {
        v.wrong = true;
    }
    let num = |k: &str| o.get(k).and_then(|x| x.trim().parse::<f64>().ok());
    let code_ok = |c: Option<f64>| matches!(c, Some(x) if x == 2.0 || x == 6.0);
    if !code_ok(num("fault.rc")) {
        v.bad.push(format!(
            "rank {r}: failing call returned {:?}",
            o.get("fault.rc")
        ));
    }
    if !code_ok(num("fault.async")) {
        v.bad
            .push(format!("rank {r}: async error {:?}", o.get("fault.async")));
    }
    if !code_ok(num("fault.later_rc")) {
        v.bad.push(format!(
            "rank {r}: later call returned {:?}",
            o.get("fault.later_rc")
        ));
    }
    if o.get("fault.abort_rc").as_deref() != Some("0") {
        v.bad.push(format!(
            "rank {r}: ncclCommAbort returned {:?}",
            o.get("fault.abort_rc")
        ));
    }
    match num("fault.abort_ms") {
        Some(ms) if ms <= 1000.0 => v.abort_ms = v.abort_ms.max(ms),
        x => v.bad.push(format!("rank {r}: ncclCommAbort took {x:?} ms")),
    }
    match num("fault.fail_mono_ms") {
        Some(t) => {
            let d = (t - t_sig).max(0.0);
            v.detect_ms = v.detect_ms.max(d);
            if d > limit_s * 1e3 {
                v.bad.push(format!(
                    "rank {r}: failed {d:.0} ms after the signal (limit {limit_s} s)"
                ));
            }
        }
        None if !v.hang => v
            .bad
            .push(format!("rank {r}: no fault.fail_mono_ms ({})", o.how())),
        None => {}
    }
}
