//! Data sockets ("lanes") and the helper threads that serve them.
//!
//! Large payloads are cut into tasks that go round-robin over the lanes.
//! Two ways to serve them:
//! - **helper threads**: thread `t` serves lanes `t, t + nthreads, ...` in
//!   task order with blocking I/O under a short socket timeout, so it notices
//!   `stop` and the comm timeout without ever blocking forever;
//! - **inline** (`nthreads == 0`): the lanes are non-blocking and the comm's
//!   own progress (`isend`/`irecv`/`test`) drives them with [`Lanes::poll`],
//!   like an epoll loop run by the caller's thread. No thread competes with
//!   a spinning caller for the CPU.
//!
//! Both ends enqueue the tasks of a message in the same order (the order of
//! CTS frames), so each lane's byte stream lines up.

use std::collections::VecDeque;
use std::io::{ErrorKind, Read};
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use crate::error::{NetError, Result};

/// How often a blocked helper wakes up to check `stop` and the timeout.
const TICK: Duration = Duration::from_millis(100);

/// Completion state of one message's tasks.
#[derive(Debug, Default)]
pub(crate) struct Progress {
    remaining: AtomicUsize,
    error: Mutex<Option<NetError>>,
}

impl Progress {
    /// A message with `tasks` tasks outstanding.
    pub(crate) fn new(tasks: usize) -> Arc<Self> {
        Arc::new(Self {
            remaining: AtomicUsize::new(tasks),
            error: Mutex::new(None),
        })
    }

    /// `Ok(true)` when all tasks are done, or the first task error.
    pub(crate) fn poll(&self) -> Result<bool> {
        if let Some(e) = self.error.lock().clone() {
            return Err(e);
        }
        Ok(self.remaining.load(Ordering::Acquire) == 0)
    }

    fn finish(&self, r: &Result<()>) {
        if let Err(e) = r {
            self.error.lock().get_or_insert_with(|| e.clone());
        }
        self.remaining.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Whether a lane set sends or receives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Dir {
    /// Writes tasks to the sockets.
    Send,
    /// Reads tasks from the sockets.
    Recv,
}

struct Task {
    lane: usize,
    ptr: usize,
    len: usize,
    /// Bytes already moved (inline mode).
    off: usize,
    prog: Arc<Progress>,
}

struct Shared {
    socks: Vec<TcpStream>,
    queues: Vec<(Mutex<VecDeque<Task>>, Condvar)>,
    stop: AtomicBool,
    failed: Mutex<Option<NetError>>,
    /// Set once `failed` is: the callers' polling checks this, not the lock.
    any_failed: AtomicBool,
    dir: Dir,
    timeout: Duration,
    /// No helper threads: one queue per lane, driven by [`Lanes::poll`].
    inline: bool,
    /// Inline mode: when each lane last moved bytes.
    last: Mutex<Vec<Instant>>,
    /// When any lane last moved bytes, in ns since `epoch`.
    moved_ns: AtomicU64,
    epoch: Instant,
    /// Tasks a helper thread has taken and not finished.
    active: AtomicUsize,
}

impl Shared {
    /// Notes that a lane moved bytes at `now`.
    fn moved(&self, now: Instant) {
        let ns = now.saturating_duration_since(self.epoch).as_nanos() as u64;
        self.moved_ns.fetch_max(ns, Ordering::Relaxed);
    }

    /// Records the first error that stops the lanes.
    fn fail(&self, e: &NetError) {
        self.failed.lock().get_or_insert_with(|| e.clone());
        self.any_failed.store(true, Ordering::Release);
    }
}

struct Core {
    shared: Arc<Shared>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

/// The lanes of one comm and their helper threads.
pub(crate) struct Lanes {
    core: Arc<Core>,
    next_lane: AtomicUsize,
}

/// A weak reference that can stop a comm's helpers (used by the transport's
/// shutdown, for comms the caller never closed).
#[derive(Clone)]
pub(crate) struct LaneWatch(std::sync::Weak<Core>);

impl LaneWatch {
    /// Stops and joins the helpers if the comm still exists.
    pub(crate) fn stop(&self) {
        if let Some(c) = self.0.upgrade() {
            c.stop();
        }
    }

    /// Whether the comm is gone.
    pub(crate) fn is_dead(&self) -> bool {
        self.0.strong_count() == 0
    }
}

impl Lanes {
    /// The data sockets' descriptors (tests).
    #[cfg(test)]
    pub(crate) fn fds(&self) -> Vec<std::os::fd::RawFd> {
        use std::os::fd::AsRawFd;
        self.core
            .shared
            .socks
            .iter()
            .map(|s| s.as_raw_fd())
            .collect()
    }

    /// Starts `nthreads` helpers (at most the lane count) over `socks`, or
    /// none when `nthreads == 0` (inline mode).
    pub(crate) fn start(
        socks: Vec<TcpStream>,
        nthreads: usize,
        dir: Dir,
        timeout: Duration,
    ) -> Result<Self> {
        for s in &socks {
            crate::sock::set_liveness(s, timeout)?;
            s.set_nonblocking(nthreads == 0)
                .map_err(|e| NetError::io("O_NONBLOCK", &e))?;
            s.set_nodelay(true)
                .map_err(|e| NetError::io("TCP_NODELAY", &e))?;
            s.set_read_timeout(Some(TICK))
                .map_err(|e| NetError::io("SO_RCVTIMEO", &e))?;
            s.set_write_timeout(Some(TICK))
                .map_err(|e| NetError::io("SO_SNDTIMEO", &e))?;
        }
        let inline = nthreads == 0;
        let nlanes = socks.len();
        let nthreads = if inline {
            0
        } else {
            nthreads.clamp(1, nlanes.max(1))
        };
        let nqueues = if inline { nlanes } else { nthreads };
        let shared = Arc::new(Shared {
            socks,
            inline,
            last: Mutex::new(vec![Instant::now(); nlanes]),
            queues: (0..nqueues)
                .map(|_| (Mutex::new(VecDeque::new()), Condvar::new()))
                .collect(),
            stop: AtomicBool::new(false),
            failed: Mutex::new(None),
            any_failed: AtomicBool::new(false),
            dir,
            timeout,
            moved_ns: AtomicU64::new(0),
            epoch: Instant::now(),
            active: AtomicUsize::new(0),
        });
        let mut threads = Vec::with_capacity(nthreads);
        // Inline lanes have no helper threads. The explicit guard matters:
        // rustc 1.95's release build entered this loop with a bound of 0
        // when the two branches above were folded into one `min`, and
        // spawned threads until the process ran out.
        let helpers = if inline { 0 } else { shared.queues.len() };
        for t in 0..helpers {
            let sh = shared.clone();
            let name = format!(
                "nccl-net-plugin-{}{t}",
                if dir == Dir::Send { "tx" } else { "rx" }
            );
            match std::thread::Builder::new()
                .name(name)
                .spawn(move || helper(&sh, t))
            {
                Ok(h) => threads.push(h),
                Err(e) => {
                    Core {
                        shared,
                        threads: Mutex::new(threads),
                    }
                    .stop();
                    return Err(NetError::io("spawning a helper thread", &e));
                }
            }
        }
        let core = Arc::new(Core {
            shared,
            threads: Mutex::new(threads),
        });
        Ok(Self {
            core,
            next_lane: AtomicUsize::new(0),
        })
    }

    /// A handle that can stop these helpers later.
    pub(crate) fn watch(&self) -> LaneWatch {
        LaneWatch(Arc::downgrade(&self.core))
    }

    /// Whether the caller's progress drives the lanes (no helper threads).
    pub(crate) fn is_inline(&self) -> bool {
        self.core.shared.inline
    }

    /// The sockets of the lanes that have work queued, with `events`, for a
    /// caller that waits in `poll(2)` until its progress can move them.
    /// `false` with helper threads: they move the lanes, not the caller.
    pub(crate) fn poll_fds(&self, events: i16, out: &mut Vec<libc::pollfd>) -> bool {
        let sh = &self.core.shared;
        if !sh.inline {
            return sh.queues.iter().all(|(q, _)| q.lock().is_empty())
                && sh.active.load(Ordering::Acquire) == 0;
        }
        for (sock, (q, _)) in sh.socks.iter().zip(&sh.queues) {
            if !q.lock().is_empty() {
                out.push(libc::pollfd {
                    fd: std::os::fd::AsRawFd::as_raw_fd(sock),
                    events,
                    revents: 0,
                });
            }
        }
        true
    }

    /// Number of lanes.
    pub(crate) fn len(&self) -> usize {
        self.core.shared.socks.len()
    }

    /// When any lane last moved bytes (the start of the lanes if none has).
    pub(crate) fn last_moved(&self) -> Instant {
        let sh = &self.core.shared;
        sh.epoch + Duration::from_nanos(sh.moved_ns.load(Ordering::Relaxed))
    }

    /// The error that stopped the lanes, if any.
    pub(crate) fn failure(&self) -> Option<NetError> {
        let sh = &self.core.shared;
        if !sh.any_failed.load(Ordering::Acquire) {
            return None;
        }
        sh.failed.lock().clone()
    }

    /// Splits `len` bytes at `ptr` into tasks of `task` bytes and queues them.
    ///
    /// # Safety
    /// The buffer must stay valid (readable for Send, writable for Recv)
    /// until the returned progress completes or the lanes stop.
    pub(crate) unsafe fn submit(&self, ptr: *mut u8, len: usize, task: usize) -> Arc<Progress> {
        let task = task.max(1);
        let ntasks = len.div_ceil(task);
        let prog = Progress::new(ntasks);
        let nqueues = self.core.shared.queues.len();
        // Inline mode: a lane that was idle starts its timeout clock now.
        let mut last = self
            .core
            .shared
            .inline
            .then(|| self.core.shared.last.lock());
        let mut off = 0;
        while off < len {
            let n = task.min(len - off);
            let lane = self.next_lane.fetch_add(1, Ordering::Relaxed) % self.len();
            let t = Task {
                lane,
                ptr: ptr as usize + off,
                len: n,
                off: 0,
                prog: prog.clone(),
            };
            let (q, cv) = &self.core.shared.queues[lane % nqueues];
            if let Some(last) = last.as_mut() {
                if q.lock().is_empty() {
                    last[lane] = Instant::now();
                }
            }
            q.lock().push_back(t);
            cv.notify_one();
            off += n;
        }
        prog
    }

    /// Stops the helpers and joins them. Idempotent.
    pub(crate) fn stop(&self) {
        self.core.stop();
    }

    /// Waits until no task is queued or running (until `deadline` at the
    /// latest), then joins the helpers, leaving the sockets open for a
    /// graceful close (`linger`); returns the sockets.
    pub(crate) fn quiesce(&self, deadline: Instant) -> &[TcpStream] {
        let sh = &self.core.shared;
        while (sh.active.load(Ordering::Acquire) > 0
            || sh.queues.iter().any(|(q, _)| !q.lock().is_empty()))
            && Instant::now() < deadline
            && !sh.any_failed.load(Ordering::Acquire)
        {
            if sh.inline {
                let _ = self.poll();
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        sh.stop.store(true, Ordering::Release);
        for (q, cv) in &sh.queues {
            let _g = q.lock();
            cv.notify_all();
        }
        for h in self.core.threads.lock().drain(..) {
            let _ = h.join();
        }
        &sh.socks
    }

    /// Inline mode: moves what the sockets take now. A no-op with helper threads.
    pub(crate) fn poll(&self) -> Result<()> {
        let sh = &self.core.shared;
        if !sh.inline {
            return Ok(());
        }
        if let Some(e) = self.failure() {
            return Err(e);
        }
        let r = poll_inline(sh);
        if let Err(e) = &r {
            sh.fail(e);
            for (q, _) in &sh.queues {
                for t in q.lock().drain(..) {
                    t.prog.finish(&Err(e.clone()));
                }
            }
        }
        r
    }
}

impl Core {
    fn stop(&self) {
        self.shared.stop.store(true, Ordering::Release);
        for s in &self.shared.socks {
            let _ = s.shutdown(Shutdown::Both);
        }
        for (q, cv) in &self.shared.queues {
            let _g = q.lock();
            cv.notify_all();
        }
        for h in self.threads.lock().drain(..) {
            let _ = h.join();
        }
        let err = NetError::InvalidUsage("comm closed".into());
        for (q, _) in &self.shared.queues {
            for t in q.lock().drain(..) {
                t.prog.finish(&Err(err.clone()));
            }
        }
    }
}

impl Drop for Lanes {
    fn drop(&mut self) {
        self.stop();
    }
}

fn poll_inline(sh: &Shared) -> Result<()> {
    let mut last = sh.last.lock();
    for (lane, (q, _)) in sh.queues.iter().enumerate() {
        let mut q = q.lock();
        let mut sock = &sh.socks[lane];
        while let Some(t) = q.front_mut() {
            let r = match sh.dir {
                // SAFETY: submit's contract keeps the buffer valid.
                Dir::Send => crate::sock::send_nosignal(sock, unsafe {
                    std::slice::from_raw_parts((t.ptr + t.off) as *const u8, t.len - t.off)
                }),
                // SAFETY: as above.
                Dir::Recv => sock.read(unsafe {
                    std::slice::from_raw_parts_mut((t.ptr + t.off) as *mut u8, t.len - t.off)
                }),
            };
            match r {
                Ok(0) if t.len > t.off => {
                    return Err(NetError::Remote("data connection closed by peer".into()))
                }
                Ok(n) => {
                    t.off += n;
                    let now = Instant::now();
                    last[lane] = now;
                    sh.moved(now);
                    if t.off == t.len {
                        let t = q.pop_front().expect("front exists");
                        t.prog.finish(&Ok(()));
                    }
                }
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::Interrupted) => {
                    if last[lane].elapsed() > sh.timeout {
                        return Err(NetError::Timeout(format!(
                            "no data progress for {:?}",
                            sh.timeout
                        )));
                    }
                    break;
                }
                Err(e) => return Err(NetError::Remote(format!("data socket: {e}"))),
            }
        }
        // An empty lane's clock is not read: `submit` restarts it when a
        // task arrives, so an idle poll reads no clock.
    }
    Ok(())
}

fn helper(sh: &Shared, t: usize) {
    let (q, cv) = &sh.queues[t];
    loop {
        let task = {
            let mut g = q.lock();
            loop {
                if sh.stop.load(Ordering::Acquire) {
                    return;
                }
                if let Some(task) = g.pop_front() {
                    sh.active.fetch_add(1, Ordering::AcqRel);
                    break task;
                }
                cv.wait_for(&mut g, TICK);
            }
        };
        let failed = sh.failed.lock().clone();
        let r = match failed {
            Some(e) => Err(e),
            None => run_task(sh, &task),
        };
        if let Err(e) = &r {
            if !sh.stop.load(Ordering::Acquire) {
                tracing::warn!(target: "hetccl::NET", "data socket {}: {e}", task.lane);
            }
            sh.fail(e);
        }
        task.prog.finish(&r);
        sh.active.fetch_sub(1, Ordering::AcqRel);
    }
}

fn run_task(sh: &Shared, task: &Task) -> Result<()> {
    let mut sock = &sh.socks[task.lane];
    let mut off = 0;
    let mut last = Instant::now();
    while off < task.len {
        if sh.stop.load(Ordering::Acquire) {
            return Err(NetError::InvalidUsage("comm closed".into()));
        }
        let r = match sh.dir {
            // SAFETY: submit's contract keeps the buffer valid.
            Dir::Send => crate::sock::send_nosignal(sock, unsafe {
                std::slice::from_raw_parts((task.ptr + off) as *const u8, task.len - off)
            }),
            // SAFETY: as above.
            Dir::Recv => sock.read(unsafe {
                std::slice::from_raw_parts_mut((task.ptr + off) as *mut u8, task.len - off)
            }),
        };
        match r {
            Ok(0) => return Err(NetError::Remote("data connection closed by peer".into())),
            Ok(n) => {
                off += n;
                last = Instant::now();
                sh.moved(last);
            }
            Err(e)
                if matches!(
                    e.kind(),
                    ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted
                ) =>
            {
                if last.elapsed() > sh.timeout {
                    return Err(NetError::Timeout(format!(
                        "no data progress for {:?}",
                        sh.timeout
                    )));
                }
            }
            Err(e) => return Err(NetError::Remote(format!("data socket: {e}"))),
        }
    }
    Ok(())
}
