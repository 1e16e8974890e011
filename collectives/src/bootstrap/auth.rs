//! Authentication of every bootstrap and transport connection with the
//! secret of the unique id: challenge and response with HMAC-SHA256.
//!
//! The accepting side sends 32 random bytes; the connecting side answers
//! with `HMAC(secret, label || challenge || hello)` followed by its hello (a
//! small frame saying who it is and why it connects). A connection that does
//! not answer correctly before the deadline is refused and logged; the
//! secret itself never crosses the wire.

use std::net::TcpStream;
use std::time::Instant;

use hmac::{Hmac, Mac};
use sha2::Sha256;

use super::frame;
use crate::error::{Error, Result};

type HmacSha256 = Hmac<Sha256>;

const LABEL: &[u8] = b"hetccl-auth-v1";
const CHALLENGE: usize = 32;
const TAG: usize = 32;
/// The largest hello accepted.
pub const MAX_HELLO: usize = 256;

fn tag(secret: &[u8], challenge: &[u8], hello: &[u8]) -> HmacSha256 {
    let mut m = HmacSha256::new_from_slice(secret).expect("HMAC takes any key length");
    m.update(LABEL);
    m.update(challenge);
    m.update(&(hello.len() as u32).to_be_bytes());
    m.update(hello);
    m
}

/// Connecting side: answers the challenge and sends `hello`.
pub fn prove(s: &mut TcpStream, secret: &[u8], hello: &[u8], deadline: Instant) -> Result<()> {
    prove_by(s, secret, hello, deadline, deadline)
}

/// [`prove`], waiting for the challenge only until `challenge_by` (at most
/// `deadline`), and sending the answer by `deadline`.
pub fn prove_by(
    s: &mut TcpStream,
    secret: &[u8],
    hello: &[u8],
    challenge_by: Instant,
    deadline: Instant,
) -> Result<()> {
    let mut challenge = [0u8; CHALLENGE];
    frame::read_exact(s, &mut challenge, challenge_by.min(deadline))?;
    frame::send(s, &answer(secret, &challenge, hello), deadline)
}

/// The answer (the payload of the answer frame) to `challenge` with `hello`.
pub fn answer(secret: &[u8], challenge: &[u8], hello: &[u8]) -> Vec<u8> {
    let t = tag(secret, challenge, hello).finalize().into_bytes();
    let mut msg = Vec::with_capacity(TAG + hello.len());
    msg.extend_from_slice(&t);
    msg.extend_from_slice(hello);
    msg
}

/// The largest answer frame (tag and hello) the accepting side reads.
pub const MAX_ANSWER: usize = TAG + MAX_HELLO;

/// The accepting side's challenge, for callers that do their own
/// (nonblocking) I/O: send [`bytes`](Self::bytes), read one frame of at most
/// [`MAX_ANSWER`] bytes, and [`check`](Self::check) it.
#[derive(Debug, Clone)]
pub struct Challenge([u8; CHALLENGE]);

impl Challenge {
    /// A fresh random challenge.
    pub fn new() -> Result<Self> {
        let mut c = [0u8; CHALLENGE];
        getrandom::getrandom(&mut c)
            .map_err(|e| Error::System(format!("getrandom: {e}").into()))?;
        Ok(Self(c))
    }

    /// What is sent to the peer.
    pub fn bytes(&self) -> &[u8] {
        &self.0
    }

    /// Checks the peer's answer (the payload of its frame); returns its hello.
    pub fn check(&self, secret: &[u8], answer: &[u8]) -> Result<Vec<u8>> {
        if answer.len() < TAG {
            return Err(Error::Remote("authentication: short answer".into()));
        }
        let (t, hello) = answer.split_at(TAG);
        tag(secret, &self.0, hello).verify_slice(t).map_err(|_| {
            Error::Remote("authentication failed: the peer does not know the secret".into())
        })?;
        Ok(hello.to_vec())
    }
}

/// Accepting side: challenges the peer and returns its authenticated hello.
pub fn verify(s: &mut TcpStream, secret: &[u8], deadline: Instant) -> Result<Vec<u8>> {
    let c = Challenge::new()?;
    frame::write_all(s, c.bytes(), deadline)?;
    let msg = frame::recv(s, MAX_ANSWER, deadline)?;
    c.check(secret, &msg)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;
    use std::time::Duration;

    fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        (a, l.accept().unwrap().0)
    }

    #[test]
    fn right_secret_passes_wrong_secret_fails() {
        let dl = Instant::now() + Duration::from_secs(5);
        let (mut a, mut b) = pair();
        let h = std::thread::spawn(move || prove(&mut a, b"s3cret", b"rank 3", dl));
        assert_eq!(verify(&mut b, b"s3cret", dl).unwrap(), b"rank 3");
        h.join().unwrap().unwrap();

        let (mut a, mut b) = pair();
        let h = std::thread::spawn(move || prove(&mut a, b"guess", b"rank 3", dl));
        assert!(verify(&mut b, b"s3cret", dl).is_err());
        let _ = h.join();

        // Garbage instead of an answer.
        let (mut a, mut b) = pair();
        let h = std::thread::spawn(move || {
            let mut c = [0u8; 32];
            frame::read_exact(&mut a, &mut c, dl).unwrap();
            frame::write_all(&mut a, &[0xff; 40], dl).unwrap();
        });
        assert!(verify(&mut b, b"s3cret", dl).is_err());
        h.join().unwrap();
    }
}
