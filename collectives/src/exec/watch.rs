//! Watching the peers of a stalled operation: the node's progress board.
//!
//! Every rank of a communicator maps one small shared-memory file per node
//! and communicator (`/dev/shm/hetccl-board-<comm>-n<node>`, unlinked right
//! after init, so nothing is left behind). Rank `r` owns slot `r`: its pid,
//! its pid namespace, whether it is inside an operation, the operation's
//! sequence number, and — once it has been stalled for a while — since when
//! and on which peer and step it waits. Only the owner writes a slot;
//! anyone on the node reads it.
//!
//! Two things use it:
//! - liveness: a rank stalled on a peer of its own node checks whether the
//!   peer's process still exists (it must have published its pid from the
//!   same pid namespace), so a peer killed with `kill -9` is reported in a
//!   few hundred milliseconds instead of after `HETCCL_TIMEOUT_S`;
//! - the hang summary: when an operation has been stalled for
//!   `HETCCL_HANG_REPORT_S`, one rank per node prints which ranks are behind.
//!   Ranks on other nodes are not observable from here and are said to be.
//!
//! Threads of one process share the board like processes do; a peer in the
//! same process is never reported dead.

use std::ffi::CString;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

const SLOT_WORDS: usize = 8;
const W_PID: usize = 0;
const W_PIDNS: usize = 1;
const W_STATE: usize = 2;
const W_SEQ: usize = 3;
const W_STALLED_MS: usize = 4;
const W_WAIT: usize = 5;

/// What a stalled step waits for (published on the board).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WaitOn {
    /// The peer rank.
    pub peer: usize,
    /// The step index inside its operation's plan.
    pub step: usize,
    /// 1: data from the peer; 2: room to send to it; 3: earlier steps.
    pub kind: u8,
}

impl WaitOn {
    fn encode(self) -> u64 {
        (self.peer as u64 + 1)
            | ((self.step as u64 & 0xff_ffff) << 32)
            | (u64::from(self.kind) << 56)
    }
    fn decode(w: u64) -> Option<Self> {
        let peer = (w & 0xffff_ffff) as usize;
        (peer != 0).then(|| Self {
            peer: peer - 1,
            step: ((w >> 32) & 0xff_ffff) as usize,
            kind: (w >> 56) as u8,
        })
    }
    fn words(self) -> &'static str {
        match self.kind {
            1 => "waits for data from",
            2 => "waits for room to send to",
            _ => "waits for earlier steps before talking to",
        }
    }
}

/// What this rank is doing, kept in this process for the status service
/// (`crate::telemetry::status`) when it is on, board or no board.
#[derive(Debug, Default)]
pub struct Doing {
    /// 1 + the sequence number of the operation in progress; 0 when idle.
    pub current: AtomicU64,
    /// 1 + the sequence number of the last operation that ended; 0 before
    /// the first.
    pub done: AtomicU64,
    /// 1 + the `Collective` of the operation in progress; 0 when unknown.
    pub kind: AtomicU64,
    /// Since when (`mono_ms`) the operation has been stalled; 0 while it
    /// moves.
    pub stalled_ms: AtomicU64,
    /// What it waits on ([`WaitOn`], encoded), while stalled.
    pub wait: AtomicU64,
}

impl Doing {
    /// What a stalled operation waits on.
    pub fn waits_on(&self) -> Option<WaitOn> {
        WaitOn::decode(self.wait.load(Ordering::Relaxed))
    }
}

impl WaitOn {
    /// "waits for data from", "waits for room to send to", ...
    pub fn describe(self) -> &'static str {
        self.words()
    }
}

/// How a local process is doing, as far as `/proc` tells.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProcState {
    /// Running or sleeping.
    Alive,
    /// Stopped (SIGSTOP) or traced.
    Stopped,
    /// Gone, or a zombie.
    Dead,
    /// Not checkable (another pid namespace, or this very process).
    Unknown,
}

fn proc_state(pid: u32) -> ProcState {
    // SAFETY: kill with signal 0 only checks that the process exists.
    let r = unsafe { libc::kill(pid as libc::pid_t, 0) };
    if r != 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH) {
        return ProcState::Dead;
    }
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return if r == 0 {
            ProcState::Alive
        } else {
            ProcState::Unknown
        };
    };
    match stat.rsplit_once(") ").and_then(|(_, s)| s.chars().next()) {
        Some('Z' | 'X' | 'x') => ProcState::Dead,
        Some('T' | 't') => ProcState::Stopped,
        _ => ProcState::Alive,
    }
}

fn pid_ns() -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self/ns/pid").map_or(0, |m| m.ino())
}

/// Milliseconds of `CLOCK_MONOTONIC` (the same clock in every process of a
/// host).
pub fn mono_ms() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid timespec out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1000 + ts.tv_nsec as u64 / 1_000_000
}

/// The `/dev/shm` name of a communicator's board on one node.
pub fn board_name(comm_hash: u64, node: usize) -> String {
    format!("/dev/shm/hetccl-board-{comm_hash:016x}-n{node}")
}

/// A mapped board, or none (single-rank comms, tests, or a failed map:
/// the board is a diagnostic aid, never a reason to fail).
#[derive(Debug)]
pub struct Watch {
    base: *const AtomicU64,
    nranks: usize,
    rank: usize,
    comm_hash: u64,
    /// Whether each rank is on this node (has a slot worth reading).
    local: Vec<bool>,
    /// What this rank is doing, for the status service (when it is on).
    doing: Option<std::sync::Arc<Doing>>,
}

// SAFETY: the mapping is shared memory accessed only through atomics.
unsafe impl Send for Watch {}
// SAFETY: as above.
unsafe impl Sync for Watch {}

impl Drop for Watch {
    fn drop(&mut self) {
        if !self.base.is_null() {
            // SAFETY: unmapping our own mapping of exactly this length.
            unsafe { libc::munmap(self.base as *mut libc::c_void, self.nranks * SLOT_WORDS * 8) };
        }
    }
}

impl Watch {
    /// No board: nothing is published or checked.
    pub fn none() -> Self {
        Self {
            base: std::ptr::null(),
            nranks: 0,
            rank: 0,
            comm_hash: 0,
            local: Vec::new(),
            doing: None,
        }
    }

    /// Keeps what this rank is doing in `doing` too (the status service).
    pub fn with_doing(mut self, doing: std::sync::Arc<Doing>) -> Self {
        self.doing = Some(doing);
        self
    }

    /// This rank enters operation `seq`, a `kind`.
    pub fn begin_op(&self, seq: u64, kind: crate::algo::Collective) {
        if let Some(d) = &self.doing {
            d.stalled_ms.store(0, Ordering::Relaxed);
            d.kind.store(kind as u64 + 1, Ordering::Relaxed);
            d.current.store(seq + 1, Ordering::Release);
        }
        self.begin(seq);
    }

    /// Maps (creating if needed) the board `board_name(comm_hash, node)` and
    /// publishes this rank's pid. Every local rank must call it before the
    /// same bootstrap barrier, and [`Watch::unlink`] after it. On any OS
    /// error it logs and returns [`Watch::none`].
    pub fn open(comm_hash: u64, node: usize, rank: usize, local: Vec<bool>) -> Self {
        let nranks = local.len();
        let path = board_name(comm_hash, node);
        match Self::map(&path, nranks) {
            Ok(base) => {
                let w = Self {
                    base,
                    nranks,
                    rank,
                    comm_hash,
                    local,
                    doing: None,
                };
                w.word(rank, W_PID)
                    .store(u64::from(std::process::id()), Ordering::Relaxed);
                w.word(rank, W_PIDNS).store(pid_ns(), Ordering::Release);
                w
            }
            Err(e) => {
                tracing::info!(target: "hetccl::INIT", "no progress board ({path}): {e}");
                Self::none()
            }
        }
    }

    fn map(path: &str, nranks: usize) -> std::io::Result<*const AtomicU64> {
        let len = nranks * SLOT_WORDS * 8;
        let c = CString::new(path).map_err(std::io::Error::other)?;
        // SAFETY: plain open/ftruncate/mmap of a file we name; the fd is
        // closed on every path.
        unsafe {
            let fd = libc::open(
                c.as_ptr(),
                libc::O_RDWR | libc::O_CREAT | libc::O_CLOEXEC,
                0o600,
            );
            if fd < 0 {
                return Err(std::io::Error::last_os_error());
            }
            let mut st: libc::stat = std::mem::zeroed();
            let ok = libc::fstat(fd, &mut st) == 0
                && (st.st_size as usize == len || libc::ftruncate(fd, len as libc::off_t) == 0);
            let p = if ok {
                libc::mmap(
                    std::ptr::null_mut(),
                    len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_SHARED,
                    fd,
                    0,
                )
            } else {
                libc::MAP_FAILED
            };
            let err = std::io::Error::last_os_error();
            libc::close(fd);
            if p == libc::MAP_FAILED {
                return Err(err);
            }
            Ok(p as *const AtomicU64)
        }
    }

    /// Removes the board's name (every rank calls it after the barrier that
    /// follows [`Watch::open`]; the mappings live on).
    pub fn unlink(comm_hash: u64, node: usize) {
        if let Ok(c) = CString::new(board_name(comm_hash, node)) {
            // SAFETY: unlink of a path we name; ENOENT (another rank was
            // first) is fine.
            unsafe { libc::unlink(c.as_ptr()) };
        }
    }

    fn word(&self, rank: usize, w: usize) -> &AtomicU64 {
        debug_assert!(!self.base.is_null() && rank < self.nranks);
        // SAFETY: in bounds of the mapping, which lives as long as self.
        unsafe { &*self.base.add(rank * SLOT_WORDS + w) }
    }

    fn active(&self) -> bool {
        !self.base.is_null()
    }

    /// This rank enters operation `seq`.
    pub fn begin(&self, seq: u64) {
        if self.active() {
            self.word(self.rank, W_STALLED_MS)
                .store(0, Ordering::Relaxed);
            self.word(self.rank, W_WAIT).store(0, Ordering::Relaxed);
            self.word(self.rank, W_SEQ).store(seq, Ordering::Relaxed);
            self.word(self.rank, W_STATE).store(1, Ordering::Release);
        }
    }

    /// This rank left its operation (done or failed).
    pub fn end(&self) {
        if let Some(d) = &self.doing {
            // Only the thread running the operation writes `current`
            // (under the communicator's exec gate): no read-modify-write.
            let cur = d.current.load(Ordering::Relaxed);
            d.current.store(0, Ordering::Release);
            if cur != 0 {
                d.done.store(cur, Ordering::Release);
            }
        }
        if self.active() {
            self.word(self.rank, W_STATE).store(0, Ordering::Release);
        }
    }

    /// This rank has been stalled for `idle`, waiting on `on`.
    pub fn stalled(&self, idle: Duration, on: Option<WaitOn>) {
        if let Some(d) = &self.doing {
            let since = mono_ms().saturating_sub(idle.as_millis() as u64).max(1);
            d.wait
                .store(on.map_or(0, WaitOn::encode), Ordering::Relaxed);
            d.stalled_ms.store(since, Ordering::Release);
        }
        if self.active() {
            let since = mono_ms().saturating_sub(idle.as_millis() as u64).max(1);
            self.word(self.rank, W_WAIT)
                .store(on.map_or(0, WaitOn::encode), Ordering::Relaxed);
            self.word(self.rank, W_STALLED_MS)
                .store(since, Ordering::Release);
        }
    }

    /// This rank moved again after [`Watch::stalled`].
    pub fn moving(&self) {
        if let Some(d) = &self.doing {
            d.stalled_ms.store(0, Ordering::Release);
        }
        if self.active() {
            self.word(self.rank, W_STALLED_MS)
                .store(0, Ordering::Release);
        }
    }

    /// The state of `peer`'s process, when it is on this node, published
    /// its pid from this pid namespace, and is not this process.
    pub fn peer_state(&self, peer: usize) -> ProcState {
        if !self.active() || peer >= self.nranks || !self.local[peer] {
            return ProcState::Unknown;
        }
        let pid = self.word(peer, W_PID).load(Ordering::Relaxed) as u32;
        let ns = self.word(peer, W_PIDNS).load(Ordering::Acquire);
        if pid == 0 || pid == std::process::id() || ns == 0 || ns != pid_ns() {
            return ProcState::Unknown;
        }
        proc_state(pid)
    }

    /// The pid `peer` published, if any.
    pub fn pid(&self, peer: usize) -> Option<u32> {
        (self.active() && peer < self.nranks && self.local[peer])
            .then(|| self.word(peer, W_PID).load(Ordering::Relaxed) as u32)
            .filter(|&p| p != 0)
    }

    /// The hang summary for operation `seq`, stalled for at least `after`,
    /// if this rank is the one of its node that prints it: the lowest local
    /// rank that is stalled in `seq` for `after` and whose process runs.
    pub fn summary(&self, seq: u64, after: Duration) -> Option<Vec<String>> {
        if !self.active() {
            return None;
        }
        let now = mono_ms();
        let stalled_for = |r: usize| {
            let s = self.word(r, W_STALLED_MS).load(Ordering::Acquire);
            let in_op = self.word(r, W_STATE).load(Ordering::Acquire) == 1
                && self.word(r, W_SEQ).load(Ordering::Relaxed) == seq;
            (in_op && s != 0).then(|| Duration::from_millis(now.saturating_sub(s)))
        };
        let reporter = (0..self.nranks).find(|&r| {
            self.local[r]
                && stalled_for(r).is_some_and(|d| d + Duration::from_millis(500) >= after)
                && matches!(self.peer_state(r), ProcState::Alive | ProcState::Unknown)
        });
        if reporter != Some(self.rank) {
            return None;
        }
        let mut lines = vec![format!(
            "hang summary of comm {:016x} op seq {seq}, seen from rank {} (ranks of this node only):",
            self.comm_hash, self.rank
        )];
        let mut behind = Vec::new();
        for r in 0..self.nranks {
            if !self.local[r] {
                lines.push(format!(
                    "  rank {r}: on another node, not observable from here"
                ));
                continue;
            }
            let pid = self.pid(r).map_or("?".to_string(), |p| p.to_string());
            let st = self.peer_state(r);
            let state = self.word(r, W_STATE).load(Ordering::Acquire);
            let rseq = self.word(r, W_SEQ).load(Ordering::Relaxed);
            let what = if state == 1 && rseq == seq {
                match (
                    stalled_for(r),
                    WaitOn::decode(self.word(r, W_WAIT).load(Ordering::Relaxed)),
                ) {
                    (Some(d), Some(w)) => format!(
                        "in seq {seq}, no progress for {:.1} s, step {} {} rank {}",
                        d.as_secs_f64(),
                        w.step,
                        w.words(),
                        w.peer
                    ),
                    (Some(d), None) => {
                        format!("in seq {seq}, no progress for {:.1} s", d.as_secs_f64())
                    }
                    (None, _) => format!("in seq {seq}, moving"),
                }
            } else if state == 1 {
                format!("in another operation (seq {rseq})")
            } else {
                if rseq < seq {
                    behind.push(format!("rank {r} (has not started seq {seq})"));
                }
                format!("not in any operation; last seq {rseq}")
            };
            let health = match st {
                ProcState::Dead => {
                    behind.push(format!("rank {r} (process gone)"));
                    "DEAD, "
                }
                ProcState::Stopped => {
                    behind.push(format!("rank {r} (stopped)"));
                    "STOPPED, "
                }
                _ => "",
            };
            lines.push(format!("  rank {r} (pid {pid}): {health}{what}"));
        }
        lines.push(if behind.is_empty() {
            "  behind: none visible on this node".to_string()
        } else {
            format!("  behind: {}", behind.join(", "))
        });
        Some(lines)
    }
}

#[cfg(test)]
impl Watch {
    /// Overwrites this rank's published pid (tests of dead peers).
    pub fn fake_pid_for_tests(&self, pid: u32) {
        self.word(self.rank, W_PID)
            .store(u64::from(pid), Ordering::Release);
    }
}
