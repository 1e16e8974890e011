//! Concurrent admission of authenticated connections on a listener (the
//! root's, and each rank's bootstrap listener).
//!
//! Every accepted connection becomes a pending entry driven without
//! blocking: the challenge goes out, the answer frame comes in (its length
//! bounded by [`auth::MAX_ANSWER`] before anything is allocated), and then
//! the answer is checked; one that fails gets a denial ([`reply::deny`]).
//! Each entry has its own deadline
//! ([`AUTH_TIMEOUT`], or the caller's deadline if sooner), so a silent or
//! slow connection costs nothing but a slot, and real peers are admitted
//! while it waits. At most [`PENDING_CAP`] entries wait at once; a new
//! connection beyond that drops the oldest unauthenticated one.

use std::collections::VecDeque;
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use super::auth::{self, Challenge};
use super::reply;
use crate::error::{Error, Result};

/// How long one connection may take to authenticate before it is dropped.
pub const AUTH_TIMEOUT: Duration = Duration::from_secs(5);
/// The most connections authenticating at once on one listener.
pub const PENDING_CAP: usize = 64;

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
    deadline: Instant,
}

enum Step {
    /// Needs more I/O.
    Wait,
    /// The whole answer frame is here.
    Answer(Vec<u8>),
    /// Closed, or broke the protocol.
    Fail(Error),
}

/// Reads into `buf`: `Ok(Some(n))` with n > 0, `Ok(None)` when nothing is
/// there yet, `Err` on close or error.
fn read_some(s: &mut TcpStream, buf: &mut [u8]) -> Result<Option<usize>> {
    loop {
        match s.read(buf) {
            Ok(0) => return Err(Error::Remote("the peer closed the connection".into())),
            Ok(n) => return Ok(Some(n)),
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(None),
            Err(e) => return Err(Error::Remote(format!("read: {e}"))),
        }
    }
}

impl Pending {
    fn step(&mut self) -> Step {
        match self.try_step() {
            Ok(Some(a)) => Step::Answer(a),
            Ok(None) => Step::Wait,
            Err(e) => Step::Fail(e),
        }
    }

    fn try_step(&mut self) -> Result<Option<Vec<u8>>> {
        while self.sent < self.challenge.bytes().len() {
            match self.s.write(&self.challenge.bytes()[self.sent..]) {
                Ok(0) => return Err(Error::Remote("the peer closed the connection".into())),
                Ok(n) => self.sent += n,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(None),
                Err(e) => return Err(Error::Remote(format!("write: {e}"))),
            }
        }
        while self.got_len < 4 {
            match read_some(&mut self.s, &mut self.len[self.got_len..])? {
                Some(n) => self.got_len += n,
                None => return Ok(None),
            }
            if self.got_len == 4 {
                let want = u32::from_be_bytes(self.len) as usize;
                if want > auth::MAX_ANSWER {
                    return Err(Error::Remote(format!(
                        "answer frame of {want} bytes exceeds the bound {}",
                        auth::MAX_ANSWER
                    )));
                }
                self.body = vec![0; want];
            }
        }
        while self.got < self.body.len() {
            match read_some(&mut self.s, &mut self.body[self.got..])? {
                Some(n) => self.got += n,
                None => return Ok(None),
            }
        }
        Ok(Some(std::mem::take(&mut self.body)))
    }

    fn wants_write(&self) -> bool {
        self.sent < self.challenge.bytes().len()
    }
}

/// The connections of one listener that are still authenticating. Keep one
/// per listener across calls of [`next`](Self::next), so that a connection
/// half-way through is not lost.
#[derive(Debug, Default)]
pub struct Gate {
    pending: VecDeque<Pending>,
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
    /// connections that fail or time out are logged and dropped. Fails with
    /// [`Error::Timeout`] at `deadline`.
    pub fn next(
        &mut self,
        l: &TcpListener,
        secret: &[u8],
        deadline: Instant,
    ) -> Result<(TcpStream, Vec<u8>)> {
        loop {
            self.accept_all(l, deadline)?;
            let now = Instant::now();
            let mut i = 0;
            while i < self.pending.len() {
                let p = &mut self.pending[i];
                let why = match p.step() {
                    Step::Wait if now < p.deadline => {
                        i += 1;
                        continue;
                    }
                    Step::Wait => Error::Timeout("did not authenticate in time".into()),
                    Step::Fail(e) => e,
                    Step::Answer(a) => match p.challenge.check(secret, &a) {
                        Ok(hello) => {
                            let p = self.pending.remove(i).expect("index in range");
                            p.s.set_nonblocking(false)?;
                            return Ok((p.s, hello));
                        }
                        Err(e) => {
                            reply::deny(&mut p.s);
                            e
                        }
                    },
                };
                let p = self.pending.remove(i).expect("index in range");
                tracing::warn!(target: "hetccl::BOOTSTRAP",
                    "refused a connection from {:?}: {why}", p.peer);
            }
            if now >= deadline {
                return Err(Error::Timeout(
                    "bootstrap: no peer connected in time".into(),
                ));
            }
            self.wait(l, deadline);
        }
    }

    fn accept_all(&mut self, l: &TcpListener, deadline: Instant) -> Result<()> {
        loop {
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
                Err(e) => return Err(Error::System(format!("accept: {e}"))),
            };
            if s.set_nonblocking(true).is_err() || s.set_nodelay(true).is_err() {
                continue;
            }
            if self.pending.len() >= PENDING_CAP {
                if let Some(old) = self.pending.pop_front() {
                    tracing::warn!(target: "hetccl::BOOTSTRAP",
                        "dropped a connection from {:?}: {PENDING_CAP} connections were \
                         authenticating, it was the oldest", old.peer);
                }
            }
            self.pending.push_back(Pending {
                s,
                peer: Some(peer),
                challenge: Challenge::new()?,
                sent: 0,
                len: [0; 4],
                got_len: 0,
                body: Vec::new(),
                got: 0,
                deadline: deadline.min(Instant::now() + AUTH_TIMEOUT),
            });
        }
    }

    /// Sleeps until the listener or a pending socket is ready, a pending
    /// deadline passes, or 100 ms, whichever comes first.
    fn wait(&self, l: &TcpListener, deadline: Instant) {
        let mut fds = Vec::with_capacity(1 + self.pending.len());
        fds.push(libc::pollfd {
            fd: l.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        });
        let mut until = deadline;
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
        }
        let ms = until
            .saturating_duration_since(Instant::now())
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
}
