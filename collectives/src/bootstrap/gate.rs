//! Concurrent admission of authenticated connections on a listener (the
//! root's, and each rank's bootstrap listener).
//!
//! Every accepted connection becomes a pending entry driven without
//! blocking: the challenge goes out at once, the answer frame comes in (its
//! length bounded by [`auth::MAX_ANSWER`] before anything is allocated), and
//! then the answer is checked; one that fails gets a denial
//! ([`reply::deny`]). Each entry has its own deadline ([`AUTH_TIMEOUT`]
//! after it was accepted; entries stay pending across calls), so a silent
//! or slow connection costs a slot, not time.
//!
//! Under a flood the gate serves the connections it holds before it takes
//! new ones: every pass steps all pending entries first, then accepts at
//! most [`ACCEPT_BURST`] more. At most [`PENDING_CAP`] entries wait at once
//! (each with buffers of at most [`auth::MAX_ANSWER`] bytes). When the set
//! is full, a new connection is accepted only if an entry can be evicted:
//! one that has made no progress (challenge out, or answer bytes in) for
//! [`GRACE`], preferring those that sent none of their answer, oldest
//! first. An entry that is making progress is never evicted; if none can
//! be, new connections wait, in order, in the kernel's accept queue
//! ([`sock::BACKLOG`]) until a slot frees. Should that queue fill past a
//! quarter (a flood faster than `PENDING_CAP / GRACE`), entries that sent
//! none of their answer may go after [`GRACE_PRESSED`] instead, so that the
//! queue keeps draining rather than the kernel dropping new connections,
//! real ones among them. Drops are counted and summarised in the log
//! ([`tally`](super::tally)).

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use super::auth::{self, Challenge};
use super::reply;
use super::sock;
use super::tally::{Tally, Why};
use crate::error::{Error, Result};

/// How long one connection may take to authenticate before it is dropped.
pub const AUTH_TIMEOUT: Duration = Duration::from_secs(5);
/// The most connections authenticating at once on one listener.
pub const PENDING_CAP: usize = 64;
/// The most connections accepted in one pass, between two steps of the
/// pending ones.
pub const ACCEPT_BURST: usize = 16;
/// How long an entry is safe from eviction after it last made progress.
pub const GRACE: Duration = Duration::from_millis(50);
/// [`GRACE`] for entries that sent none of their answer, while the accept
/// queue is over a quarter full.
pub const GRACE_PRESSED: Duration = Duration::from_millis(5);
/// How long accepting pauses after `accept` failed for want of resources.
const ACCEPT_PAUSE: Duration = Duration::from_millis(10);

static PEAK: AtomicUsize = AtomicUsize::new(0);
static ACCEPTED: AtomicU64 = AtomicU64::new(0);
static ADMITTED: AtomicU64 = AtomicU64::new(0);
static EVICTED: AtomicU64 = AtomicU64::new(0);
static DROPPED: AtomicU64 = AtomicU64::new(0);

/// Process-wide counters over every gate, for tests and diagnostics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stats {
    /// The most entries one gate held at once.
    pub peak_pending: usize,
    /// Connections accepted.
    pub accepted: u64,
    /// Connections that authenticated.
    pub admitted: u64,
    /// Connections evicted to make room.
    pub evicted: u64,
    /// Connections dropped for any other reason.
    pub dropped: u64,
}

/// The counters of every gate of this process so far.
pub fn stats() -> Stats {
    Stats {
        peak_pending: PEAK.load(Ordering::Relaxed),
        accepted: ACCEPTED.load(Ordering::Relaxed),
        admitted: ADMITTED.load(Ordering::Relaxed),
        evicted: EVICTED.load(Ordering::Relaxed),
        dropped: DROPPED.load(Ordering::Relaxed),
    }
}

#[derive(Debug)]
struct Pending {
    s: TcpStream,
    peer: Option<SocketAddr>,
    challenge: Challenge,
    sent: usize,
    len: [u8; 4],
    got_len: usize,
    body: Vec<u8>,
    got: usize,
    /// When bytes last moved (the challenge fully out, answer bytes in).
    progress: Instant,
    deadline: Instant,
}

/// Reads into `buf`: `Ok(Some(n))` with n > 0, `Ok(None)` when nothing is
/// there yet, `Err` on close or error.
fn read_some(s: &mut TcpStream, buf: &mut [u8]) -> std::result::Result<Option<usize>, String> {
    loop {
        match s.read(buf) {
            Ok(0) => return Err("the peer closed the connection".into()),
            Ok(n) => return Ok(Some(n)),
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(None),
            Err(e) => return Err(format!("read: {e}")),
        }
    }
}

impl Pending {
    /// Moves what can move without blocking: `Ok(true)` once the whole
    /// answer frame is here (and from then on).
    fn io(&mut self, now: Instant) -> std::result::Result<bool, (Why, String)> {
        let closed = |e: String| (Why::Closed, e);
        while self.sent < self.challenge.bytes().len() {
            match self.s.write(&self.challenge.bytes()[self.sent..]) {
                Ok(0) => return Err(closed("the peer closed the connection".into())),
                Ok(n) => {
                    self.sent += n;
                    self.progress = now;
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(false),
                Err(e) => return Err(closed(format!("write: {e}"))),
            }
        }
        while self.got_len < 4 {
            match read_some(&mut self.s, &mut self.len[self.got_len..]).map_err(closed)? {
                Some(n) => {
                    self.got_len += n;
                    self.progress = now;
                }
                None => return Ok(false),
            }
            if self.got_len == 4 {
                let want = u32::from_be_bytes(self.len) as usize;
                if want > auth::MAX_ANSWER {
                    return Err((
                        Why::Garbage,
                        format!(
                            "answer frame of {want} bytes exceeds the bound {}",
                            auth::MAX_ANSWER
                        ),
                    ));
                }
                self.body = vec![0; want];
            }
        }
        while self.got < self.body.len() {
            match read_some(&mut self.s, &mut self.body[self.got..]).map_err(closed)? {
                Some(n) => {
                    self.got += n;
                    self.progress = now;
                }
                None => return Ok(false),
            }
        }
        Ok(true)
    }

    fn complete(&self) -> bool {
        self.got_len == 4 && self.got == self.body.len()
    }

    fn wants_write(&self) -> bool {
        self.sent < self.challenge.bytes().len()
    }

    /// When it may be evicted if idle until then: [`GRACE`] after its last
    /// progress ([`GRACE_PRESSED`] under `pressure` if it sent no answer
    /// bytes); never once complete.
    fn evictable_at(&self, pressure: bool) -> Option<Instant> {
        let grace = if pressure && self.got_len == 0 {
            GRACE_PRESSED
        } else {
            GRACE
        };
        (!self.complete()).then_some(self.progress + grace)
    }

    fn evictable(&self, now: Instant, pressure: bool) -> bool {
        self.evictable_at(pressure).is_some_and(|t| now >= t)
    }
}

/// Whether `l`'s accept queue is over a quarter full.
fn pressed(l: &TcpListener) -> bool {
    sock::accept_queue(l).is_some_and(|(n, cap)| u64::from(n) * 4 > u64::from(cap))
}

/// Whether `l` has a connection waiting (a poll without waiting).
fn readable(l: &TcpListener) -> bool {
    let mut pfd = libc::pollfd {
        fd: l.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd whose descriptor stays open during the call.
    let n = unsafe { libc::poll(&mut pfd, 1, 0) };
    n > 0 && pfd.revents & libc::POLLIN != 0
}

/// The connections of one listener that are still authenticating. Keep one
/// per listener across calls of [`next`](Self::next), so that a connection
/// half-way through is not lost.
#[derive(Debug, Default)]
pub struct Gate {
    pending: Vec<Pending>,
    tally: Tally,
    /// No accepts before this (after `accept` ran out of resources).
    paused_until: Option<Instant>,
}

impl Gate {
    /// A gate with nothing pending.
    pub fn new() -> Self {
        Self::default()
    }

    /// How many connections are authenticating now.
    pub fn pending(&self) -> usize {
        self.pending.len()
    }

    /// Returns the next connection on `l` (a nonblocking listener) that
    /// authenticates with `secret`, as a blocking stream with its hello;
    /// connections that fail or time out are dropped, counted and logged.
    /// Fails with [`Error::Timeout`] at `deadline`.
    pub fn next(
        &mut self,
        l: &TcpListener,
        secret: &[u8],
        deadline: Instant,
    ) -> Result<(TcpStream, Vec<u8>)> {
        if self.tally.at.is_none() {
            self.tally.at = l.local_addr().ok();
        }
        loop {
            let now = Instant::now();
            if let Some(x) = self.step_all(secret, now) {
                return Ok(x);
            }
            if now >= deadline {
                return Err(Error::Timeout(
                    "bootstrap: no peer connected in time".into(),
                ));
            }
            self.accept_some(l, Instant::now())?;
            self.tally.flush(now, false);
            self.wait(l, deadline);
        }
    }

    /// Steps every pending entry; returns the first that authenticates.
    fn step_all(&mut self, secret: &[u8], now: Instant) -> Option<(TcpStream, Vec<u8>)> {
        let mut i = 0;
        while i < self.pending.len() {
            let p = &mut self.pending[i];
            let (why, detail) = match p.io(now) {
                Ok(false) if now < p.deadline => {
                    i += 1;
                    continue;
                }
                Ok(false) => (Why::TimedOut, "did not authenticate in time".to_string()),
                Err(x) => x,
                Ok(true) => match p.challenge.check(secret, &p.body) {
                    Ok(hello) => {
                        let p = self.pending.remove(i);
                        match p.s.set_nonblocking(false) {
                            Ok(()) => {
                                ADMITTED.fetch_add(1, Ordering::Relaxed);
                                return Some((p.s, hello));
                            }
                            Err(e) => {
                                self.note(p.peer, Why::Closed, &e);
                                continue;
                            }
                        }
                    }
                    Err(e) => {
                        reply::deny(&mut p.s);
                        (Why::Denied, e.to_string())
                    }
                },
            };
            let p = self.pending.remove(i);
            self.note(p.peer, why, &detail);
        }
        None
    }

    /// Accepts at most [`ACCEPT_BURST`] connections, sending each its
    /// challenge; when the pending set is full, only as many as entries
    /// can be evicted.
    fn accept_some(&mut self, l: &TcpListener, now: Instant) -> Result<()> {
        if self.paused_until.is_some_and(|t| now < t) {
            return Ok(());
        }
        self.paused_until = None;
        for _ in 0..ACCEPT_BURST {
            if self.pending.len() >= PENDING_CAP
                && !(readable(l) && self.make_room(now, pressed(l)))
            {
                return Ok(());
            }
            let (s, peer) = match l.accept() {
                Ok(x) => x,
                Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(()),
                Err(e)
                    if matches!(
                        e.kind(),
                        ErrorKind::Interrupted | ErrorKind::ConnectionAborted
                    ) =>
                {
                    continue
                }
                Err(e)
                    if matches!(
                        e.raw_os_error(),
                        Some(libc::EBADF | libc::EINVAL | libc::ENOTSOCK | libc::EFAULT)
                    ) =>
                {
                    return Err(Error::System(format!("accept: {e}").into()))
                }
                Err(e) => {
                    // Out of descriptors or memory (a flood can cause it):
                    // the listener stays readable, so pause rather than spin.
                    self.paused_until = Some(now + ACCEPT_PAUSE);
                    self.tally
                        .note(Why::AcceptFailed, None, &format!("accept: {e}"));
                    return Ok(());
                }
            };
            ACCEPTED.fetch_add(1, Ordering::Relaxed);
            if let Err(e) = s.set_nonblocking(true).and_then(|()| s.set_nodelay(true)) {
                self.note(Some(peer), Why::Closed, &e);
                continue;
            }
            let mut p = Pending {
                s,
                peer: Some(peer),
                challenge: Challenge::new()?,
                sent: 0,
                len: [0; 4],
                got_len: 0,
                body: Vec::new(),
                got: 0,
                progress: now,
                deadline: now + AUTH_TIMEOUT,
            };
            match p.io(now) {
                Ok(_) => {
                    self.pending.push(p);
                    PEAK.fetch_max(self.pending.len(), Ordering::Relaxed);
                }
                Err((why, detail)) => self.note(Some(peer), why, &detail),
            }
        }
        Ok(())
    }

    /// Evicts entries until the set has room: the idle ones (see
    /// [`Pending::evictable_at`]) that sent none of their answer first, then
    /// the others, longest idle first. Each candidate is stepped once more
    /// before it goes, in case its answer has just arrived. False when no
    /// entry may go.
    fn make_room(&mut self, now: Instant, pressure: bool) -> bool {
        while self.pending.len() >= PENDING_CAP {
            let Some(i) = self
                .pending
                .iter()
                .enumerate()
                .filter(|(_, p)| p.evictable(now, pressure))
                .min_by_key(|(_, p)| (p.got_len > 0, p.progress))
                .map(|(i, _)| i)
            else {
                return false;
            };
            let p = &mut self.pending[i];
            let idle_since = p.progress;
            match p.io(now) {
                Err((why, detail)) => {
                    let p = self.pending.remove(i);
                    self.note(p.peer, why, &detail);
                }
                // It moved: no longer a candidate.
                Ok(_) if p.progress != idle_since => {}
                Ok(_) => {
                    let p = self.pending.remove(i);
                    EVICTED.fetch_add(1, Ordering::Relaxed);
                    self.tally.note(
                        Why::Evicted,
                        p.peer,
                        &format!(
                            "idle for {:?} while {PENDING_CAP} connections were authenticating",
                            now - idle_since
                        ),
                    );
                }
            }
        }
        true
    }

    fn note(&mut self, peer: Option<SocketAddr>, why: Why, detail: &dyn std::fmt::Display) {
        DROPPED.fetch_add(1, Ordering::Relaxed);
        self.tally.note(why, peer, detail);
    }

    /// Sleeps until the listener (if it may be accepted from) or a pending
    /// socket is ready, a pending deadline passes, an entry becomes
    /// evictable, or 100 ms, whichever comes first.
    fn wait(&self, l: &TcpListener, deadline: Instant) {
        let now = Instant::now();
        if self.pending.iter().any(Pending::complete) {
            return;
        }
        let mut until = deadline;
        let paused = self.paused_until.filter(|&t| now < t);
        let full = self.pending.len() >= PENDING_CAP;
        let pressure = full && pressed(l);
        let listen =
            paused.is_none() && (!full || self.pending.iter().any(|p| p.evictable(now, pressure)));
        if let Some(t) = paused {
            until = until.min(t);
        }
        let mut fds = Vec::with_capacity(1 + self.pending.len());
        if listen {
            fds.push(libc::pollfd {
                fd: l.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            });
        }
        for p in &self.pending {
            let mut events = libc::POLLIN;
            if p.wants_write() {
                events |= libc::POLLOUT;
            }
            fds.push(libc::pollfd {
                fd: p.s.as_raw_fd(),
                events,
                revents: 0,
            });
            until = until.min(p.deadline);
            if full && !listen {
                if let Some(t) = p.evictable_at(pressure) {
                    until = until.min(t);
                }
            }
        }
        let ms = until
            .saturating_duration_since(now)
            .as_millis()
            .clamp(1, 100) as i32;
        // SAFETY: `fds` is a valid array of `fds.len()` pollfds whose
        // descriptors stay open during the call.
        unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bootstrap::{frame, sock};

    #[test]
    fn silent_connections_do_not_hold_up_a_real_peer() {
        let l = sock::listen("127.0.0.1".parse().unwrap()).unwrap();
        let addr = l.local_addr().unwrap();
        let secret = [7u8; 32];
        // More silent connections than the cap: the oldest are dropped.
        let silent: Vec<TcpStream> = (0..PENDING_CAP + 8)
            .map(|_| TcpStream::connect(addr).unwrap())
            .collect();
        // Garbage with an oversized length, and a wrong secret.
        let mut big = TcpStream::connect(addr).unwrap();
        big.write_all(&u32::MAX.to_be_bytes()).unwrap();
        let dl = Instant::now() + Duration::from_secs(10);
        let wrong = std::thread::spawn(move || {
            let mut s = TcpStream::connect(addr).unwrap();
            let _ = auth::prove(&mut s, &[8u8; 32], b"bad", dl);
        });
        let real = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            let mut s = TcpStream::connect(addr).unwrap();
            auth::prove(&mut s, &[7u8; 32], b"real", dl).unwrap();
            frame::recv(&mut s, 16, dl).unwrap()
        });
        let t0 = Instant::now();
        let mut gate = Gate::new();
        let (mut s, hello) = gate.next(&l, &secret, dl).unwrap();
        assert_eq!(hello, b"real");
        assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
        assert!(gate.pending() <= PENDING_CAP);
        frame::send(&mut s, b"ok", dl).unwrap();
        assert_eq!(real.join().unwrap(), b"ok");
        wrong.join().unwrap();
        drop(silent);
        // Nothing else authenticates: the deadline ends the wait.
        let e = gate
            .next(&l, &secret, Instant::now() + Duration::from_millis(200))
            .unwrap_err();
        assert!(matches!(e, Error::Timeout(_)), "{e}");
    }

    /// Reads what is there within `wait`: `Some(bytes)` (maybe empty: the
    /// stream ended) or `None` (nothing, the stream is open).
    fn read_within(s: &mut TcpStream, n: usize, wait: Duration) -> Option<Vec<u8>> {
        s.set_read_timeout(Some(wait)).unwrap();
        let mut b = vec![0u8; n];
        match s.read(&mut b) {
            Ok(k) => Some(b[..k].to_vec()),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => None,
            Err(_) => Some(Vec::new()),
        }
    }

    #[test]
    fn a_full_gate_evicts_idle_strangers_and_serves_answers_first() {
        let l = sock::listen("127.0.0.1".parse().unwrap()).unwrap();
        let addr = l.local_addr().unwrap();
        let secret = [7u8; 32];
        let mut gate = Gate::new();
        // Fill the gate; every connection gets its challenge.
        let mut first: Vec<TcpStream> = (0..PENDING_CAP)
            .map(|_| TcpStream::connect(addr).unwrap())
            .collect();
        let soon = || Instant::now() + Duration::from_millis(300);
        assert!(matches!(
            gate.next(&l, &secret, soon()),
            Err(Error::Timeout(_))
        ));
        assert_eq!(gate.pending(), PENDING_CAP);
        let dl = Instant::now() + Duration::from_secs(10);
        let challenges: Vec<[u8; 32]> = first
            .iter_mut()
            .map(|s| {
                let mut c = [0u8; 32];
                frame::read_exact(s, &mut c, dl).unwrap();
                c
            })
            .collect();
        // Half start their answer (two bytes of the length), half stay silent.
        let half = PENDING_CAP / 2;
        for s in &mut first[..half] {
            s.write_all(&[0, 0]).unwrap();
        }
        // As many strangers again: each evicts one that sent nothing.
        let second: Vec<TcpStream> = (0..half)
            .map(|_| TcpStream::connect(addr).unwrap())
            .collect();
        assert!(matches!(
            gate.next(&l, &secret, soon()),
            Err(Error::Timeout(_))
        ));
        assert_eq!(gate.pending(), PENDING_CAP);
        // The silent ones end (waiting for their end of stream), then the
        // others are checked without waiting: they are all still open.
        for (i, s) in first.iter_mut().enumerate().skip(half) {
            let got = read_within(s, 8, Duration::from_secs(5));
            assert_eq!(
                got,
                Some(Vec::new()),
                "silent connection {i} was not evicted"
            );
        }
        for (i, s) in first.iter_mut().enumerate().take(half) {
            let got = read_within(s, 8, Duration::from_millis(1));
            assert_eq!(
                got, None,
                "connection {i}, which had started its answer, was dropped"
            );
        }
        // One that started completes its answer, then a burst of strangers
        // arrives: the answer is served first, however idle it looked.
        let hello = b"real";
        let a = auth::answer(&secret, &challenges[3], hello);
        let mut rest = (a.len() as u32).to_be_bytes()[2..].to_vec();
        rest.extend_from_slice(&a);
        first[3].write_all(&rest).unwrap();
        std::thread::sleep(GRACE * 2);
        let burst: Vec<TcpStream> = (0..PENDING_CAP)
            .map(|_| TcpStream::connect(addr).unwrap())
            .collect();
        let (_, h) = gate.next(&l, &secret, dl).unwrap();
        assert_eq!(h, hello);
        assert!(gate.pending() <= PENDING_CAP);
        assert!(stats().peak_pending <= PENDING_CAP);
        drop((second, burst));
    }
}
