//! The connecting side's retries: a bounded, jittered backoff, and
//! [`dial`], which opens an authenticated connection and keeps trying until
//! the acceptor admits it or the deadline passes.
//!
//! A connection can be lost before the acceptor admits it for reasons that
//! say nothing about the peer: a busy listener evicts it to make room, the
//! kernel drops it from a full backlog, a reset. Each of those is retried
//! with a fresh connection. What the acceptor says on purpose (a wrong
//! secret, a refusal, a malformed table) ends the attempts at once.

use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use super::{auth, sock};
use crate::error::{Error, Result};

/// The first pause between two attempts; it doubles up to [`BACKOFF_MAX`].
pub const BACKOFF_FIRST: Duration = Duration::from_millis(10);
/// The longest pause between two attempts.
pub const BACKOFF_MAX: Duration = Duration::from_millis(500);
/// How long one attempt waits for the acceptor's challenge before it gives
/// the connection up and opens a new one (a connection the kernel lost from
/// a full backlog never gets one).
pub const CHALLENGE_WAIT: Duration = Duration::from_secs(10);

/// Exponential backoff with jitter: each pause is drawn uniformly from the
/// upper half of the current delay, so peers that failed together do not
/// retry together.
#[derive(Debug)]
pub struct Backoff {
    next: Duration,
    max: Duration,
    rng: u64,
}

impl Backoff {
    /// A backoff starting at `first`, doubling up to `max`.
    pub fn new(first: Duration, max: Duration) -> Self {
        let mut b = [0u8; 8];
        let _ = getrandom::getrandom(&mut b);
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        Self {
            next: first,
            max,
            rng: (u64::from_ne_bytes(b) ^ t) | 1,
        }
    }

    /// The next pause (without sleeping).
    pub fn pause(&mut self) -> Duration {
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        let half = self.next / 2;
        let extra = half.mul_f64((self.rng >> 11) as f64 / (1u64 << 53) as f64);
        let d = half + extra;
        self.next = (self.next * 2).min(self.max);
        d
    }

    /// Sleeps for the next pause, cut short at `deadline`; false (without
    /// sleeping) once `deadline` has passed.
    pub fn sleep(&mut self, deadline: Instant) -> bool {
        let now = Instant::now();
        if now >= deadline {
            return false;
        }
        std::thread::sleep(self.pause().min(deadline - now));
        true
    }
}

/// Why one attempt failed.
#[derive(Debug)]
pub enum Fail {
    /// The connection was lost before admission: try a new one.
    Retry(Error),
    /// The peer answered, and the answer ends it (or the deadline passed).
    Fatal(Error),
}

impl Fail {
    /// Classifies an I/O error of an attempt whose overall deadline is
    /// `deadline`: closes, resets and phase timeouts are retried; the
    /// deadline itself and local failures are not.
    pub fn io(e: Error, deadline: Instant) -> Self {
        match e {
            Error::Remote(_) => Self::Retry(e),
            Error::Timeout(_) if Instant::now() < deadline => Self::Retry(e),
            e => Self::Fatal(e),
        }
    }
}

/// Opens a connection to `addr`, answers its challenge with `secret` and
/// `hello`, and runs `admit` on it (which reads the acceptor's reply); on
/// [`Fail::Retry`] it starts over with a new connection after a backoff,
/// until `deadline`. `what` names the connection in logs and errors.
pub fn dial<T>(
    addr: SocketAddr,
    secret: &[u8],
    hello: &[u8],
    deadline: Instant,
    what: &str,
    mut admit: impl FnMut(&mut TcpStream) -> std::result::Result<T, Fail>,
) -> Result<(TcpStream, T)> {
    let mut backoff = Backoff::new(BACKOFF_FIRST, BACKOFF_MAX);
    let mut attempt = 1u32;
    loop {
        let r = sock::connect(addr, deadline)
            .map_err(Fail::Fatal)
            .and_then(|mut s| {
                let by = deadline.min(Instant::now() + CHALLENGE_WAIT);
                auth::prove_by(&mut s, secret, hello, by, deadline)
                    .map_err(|e| Fail::io(e, deadline))?;
                let v = admit(&mut s)?;
                Ok((s, v))
            });
        let e = match r {
            Ok(v) => {
                if attempt > 1 {
                    tracing::info!(target: "hetccl::BOOTSTRAP",
                        "{what}: admitted on attempt {attempt}");
                }
                return Ok(v);
            }
            Err(Fail::Fatal(e)) => return Err(e),
            Err(Fail::Retry(e)) => e,
        };
        tracing::debug!(target: "hetccl::BOOTSTRAP",
            "{what}: attempt {attempt} lost before admission ({e}); retrying");
        if !backoff.sleep(deadline) {
            return Err(Error::Timeout(
                format!(
                    "{what}: not admitted by the deadline after {attempt} attempts (last: {e})"
                )
                .into(),
            ));
        }
        attempt += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_is_jittered_and_bounded() {
        let mut a = Backoff::new(Duration::from_millis(8), Duration::from_millis(64));
        let mut b = Backoff::new(Duration::from_millis(8), Duration::from_millis(64));
        let (pa, pb): (Vec<_>, Vec<_>) = (0..20).map(|_| (a.pause(), b.pause())).unzip();
        let mut want = Duration::from_millis(8);
        for p in &pa {
            assert!(
                *p >= want / 2 && *p <= want,
                "{p:?} outside [{:?}, {want:?}]",
                want / 2
            );
            want = (want * 2).min(Duration::from_millis(64));
        }
        assert_ne!(pa, pb, "two backoffs drew the same pauses");
        // A passed deadline: no sleep, and false.
        assert!(!a.sleep(Instant::now()));
    }
}
