//! Launching the ranks of a multi-process test (`tests/collectives_mp.rs`,
//! `tests/collectives_netns.rs`, ...): every rank is a child process with a
//! hard deadline, its stdout and stderr captured, and the whole set is
//! killed when one rank fails (after a grace period) or the deadline passes.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::fmt::Write as _;
use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long the other ranks may keep running after one failed, before they
/// are killed: long enough for their own error to show, short enough that a
/// failing run does not wait for every peer's HETCCL_TIMEOUT_S.
pub const PEER_GRACE: Duration = Duration::from_secs(5);

/// What one rank did.
#[derive(Debug)]
pub struct RankOutput {
    /// The rank.
    pub rank: usize,
    /// The exit status (`None` if it could not be collected).
    pub status: Option<ExitStatus>,
    /// Killed at the deadline.
    pub timed_out: bool,
    /// Killed because another rank had failed `PEER_GRACE` earlier.
    pub killed_after_peer: bool,
    /// Its stdout.
    pub stdout: String,
    /// Its stderr.
    pub stderr: String,
    /// Its wall time.
    pub elapsed: Duration,
}

impl RankOutput {
    /// Exited with status 0.
    pub fn ok(&self) -> bool {
        self.status.is_some_and(|s| s.success())
    }

    /// The `key value` lines of stdout. Lenient: hetccl's own log lines may
    /// be interleaved there (NCCL logs to stdout), later keys win.
    pub fn kv(&self) -> BTreeMap<String, String> {
        self.stdout
            .lines()
            .filter_map(|l| l.split_once(' '))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    /// One value of [`kv`](Self::kv).
    pub fn get(&self, key: &str) -> Option<String> {
        self.kv().remove(key)
    }

    /// How the process ended, in words.
    pub fn how(&self) -> String {
        let mut s = match self.status {
            Some(st) => match (
                st.code(),
                std::os::unix::process::ExitStatusExt::signal(&st),
            ) {
                (Some(c), _) => format!("exit {c}"),
                (None, Some(sig)) => format!("signal {sig}"),
                _ => format!("{st}"),
            },
            None => "no status".to_string(),
        };
        if self.timed_out {
            s.push_str(", killed at the deadline");
        }
        if self.killed_after_peer {
            s.push_str(", killed after another rank failed");
        }
        s
    }
}

/// The last `max` bytes of `s` (on a char boundary), with a marker.
pub fn tail(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut start = s.len() - max;
    while !s.is_char_boundary(start) {
        start += 1;
    }
    format!("[... {} bytes cut ...]\n{}", start, &s[start..])
}

/// A readable report of every rank's end, stdout and stderr (each cut to
/// its last `max` bytes).
pub fn report(outs: &[RankOutput], max: usize) -> String {
    let mut r = String::new();
    for o in outs {
        let _ = writeln!(
            r,
            "===== rank {}: {} after {:.1}s =====",
            o.rank,
            o.how(),
            o.elapsed.as_secs_f64()
        );
        let _ = writeln!(r, "--- stdout ---\n{}", tail(&o.stdout, max));
        let _ = writeln!(r, "--- stderr ---\n{}", tail(&o.stderr, max));
    }
    r
}

/// Removes every inherited NCCL_*, HETCCL_* and LD_* variable from `cmd`,
/// so that the test decides the children's configuration alone.
pub fn clean_env(cmd: &mut Command) {
    for (k, _) in std::env::vars_os() {
        let ks = k.to_string_lossy();
        if ks.starts_with("NCCL_") || ks.starts_with("HETCCL_") || ks == "LD_PRELOAD" {
            cmd.env_remove(&k);
        }
    }
}

/// A thread that reads `r` to its end and returns the bytes.
pub fn reader<R: Read + Send + 'static>(mut r: R) -> JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = r.read_to_end(&mut v);
        v
    })
}

struct Running {
    child: Child,
    out: Option<JoinHandle<Vec<u8>>>,
    err: Option<JoinHandle<Vec<u8>>>,
    status: Option<ExitStatus>,
    timed_out: bool,
    killed_after_peer: bool,
    ended: Option<Instant>,
}

fn kill_group(c: &Child) {
    // Each child leads its own process group (see `run_ranks`): kill the
    // group, so that anything it started goes too.
    let pid = c.id() as libc::pid_t;
    // SAFETY: kill(2) with a negative pid signals that process group; the
    // group id is our own child's pid, which has not been reaped yet.
    unsafe {
        libc::kill(-pid, libc::SIGKILL);
    }
}

/// Makes `cmd` a rank: stdin from `/dev/null`, stdout and stderr piped, its
/// own process group (so that killing the group kills what it started), and
/// `PR_SET_PDEATHSIG`: if the test process dies (killed, or its thread
/// ends), the rank goes too instead of lingering until its own timeouts.
pub fn prepare(cmd: &mut Command) {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    // SAFETY: prctl is async-signal-safe; nothing else runs between fork
    // and exec.
    unsafe {
        cmd.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong);
            Ok(())
        });
    }
}

/// Starts `cmds` (rank i is `cmds[i]`), each prepared by [`prepare`], and
/// waits for all of them. A rank still running at `deadline` is killed;
/// once a rank has failed, the others get [`PEER_GRACE`] and are then
/// killed.
pub fn run_ranks(cmds: Vec<Command>, deadline: Duration) -> Vec<RankOutput> {
    let start = Instant::now();
    let mut running: Vec<Running> = Vec::new();
    for (rank, mut cmd) in cmds.into_iter().enumerate() {
        prepare(&mut cmd);
        let mut child = match cmd.spawn() {
            Ok(c) => c,
            Err(e) => {
                for r in &mut running {
                    kill_group(&r.child);
                    let _ = r.child.wait();
                }
                panic!("cannot start rank {rank} ({cmd:?}): {e}");
            }
        };
        let out = child.stdout.take().map(reader);
        let err = child.stderr.take().map(reader);
        running.push(Running {
            child,
            out,
            err,
            status: None,
            timed_out: false,
            killed_after_peer: false,
            ended: None,
        });
    }
    let mut first_failure: Option<Instant> = None;
    loop {
        let mut alive = 0;
        for r in running.iter_mut().filter(|r| r.status.is_none()) {
            match r.child.try_wait() {
                Ok(Some(st)) => {
                    r.status = Some(st);
                    r.ended = Some(Instant::now());
                    if !st.success() && first_failure.is_none() {
                        first_failure = Some(Instant::now());
                    }
                }
                Ok(None) => alive += 1,
                Err(_) => {
                    r.ended = Some(Instant::now());
                    r.status = None;
                    kill_group(&r.child);
                    let _ = r.child.wait().map(|s| r.status = Some(s));
                }
            }
        }
        if alive == 0 {
            break;
        }
        let now = Instant::now();
        let expired = now.duration_since(start) > deadline;
        let peer_failed = first_failure.is_some_and(|t| now.duration_since(t) > PEER_GRACE);
        if expired || peer_failed {
            for r in running.iter_mut().filter(|r| r.status.is_none()) {
                kill_group(&r.child);
                r.timed_out = expired;
                r.killed_after_peer = !expired;
                r.status = r.child.wait().ok();
                r.ended = Some(Instant::now());
            }
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    running
        .into_iter()
        .enumerate()
        .map(|(rank, mut r)| {
            // Reap stragglers of the group so the pipes close.
            let stdout = r.out.take().map(|h| h.join().unwrap_or_default());
            let stderr = r.err.take().map(|h| h.join().unwrap_or_default());
            RankOutput {
                rank,
                status: r.status,
                timed_out: r.timed_out,
                killed_after_peer: r.killed_after_peer,
                stdout: String::from_utf8_lossy(&stdout.unwrap_or_default()).into_owned(),
                stderr: String::from_utf8_lossy(&stderr.unwrap_or_default()).into_owned(),
                elapsed: r.ended.unwrap_or_else(Instant::now).duration_since(start),
            }
        })
        .collect()
}

/// A fresh path for a unique-id file under `dir`, unique per process and
/// call; any file of that name (and its `.done` companion) is removed.
pub fn id_path(dir: &Path, label: &str) -> PathBuf {
    static SEQ: AtomicUsize = AtomicUsize::new(0);
    let n = SEQ.fetch_add(1, Ordering::Relaxed);
    let safe: String = label
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    let p = dir.join(format!("{safe}.{}.{n}.id", std::process::id()));
    remove_id_files(&p);
    p
}

/// Removes an id file and the files coll_check derives from it (`.done`,
/// and `.2`, `.3` for the ids of more comms).
pub fn remove_id_files(p: &Path) {
    let _ = std::fs::remove_file(p);
    for ext in [".done", ".2", ".3"] {
        let mut other: OsString = p.as_os_str().to_owned();
        other.push(ext);
        let _ = std::fs::remove_file(other);
    }
}

/// Whether `a` and `b` name the same file.
pub fn same_file(a: &str, b: &Path) -> bool {
    Path::new(a).canonicalize().ok().as_deref() == b.canonicalize().ok().as_deref()
}

/// The unique id of a multi-process test whose ranks share `dir`: rank 0
/// makes one (`ncclGetUniqueId`) and publishes it as `dir/id` (written
/// whole, then renamed); the others wait up to 30 s for it.
pub fn shared_unique_id(dir: &Path, rank: usize) -> hetccl_abi::ncclUniqueId {
    use hetccl_abi::ncclUniqueId;
    let path = dir.join("id");
    if rank == 0 {
        let mut id = ncclUniqueId::default();
        // SAFETY: a valid out pointer.
        let rc = unsafe { hetccl_collectives::api::comm_init::ncclGetUniqueId(&mut id) };
        assert_eq!(rc as i32, 0, "ncclGetUniqueId failed");
        let tmp = dir.join("id.tmp");
        std::fs::write(&tmp, id.internal).expect("write the id");
        std::fs::rename(&tmp, &path).expect("publish the id");
        return id;
    }
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(b) = std::fs::read(&path) {
            if b.len() == 128 {
                let mut id = ncclUniqueId::default();
                id.internal.copy_from_slice(&b);
                return id;
            }
        }
        assert!(Instant::now() < until, "no unique id from rank 0");
        std::thread::sleep(Duration::from_millis(10));
    }
}
