//! Bootstrap: unique ids, the root rendezvous, authentication, and the
//! per-communicator out-of-band ring used for small all-gathers and barriers.
//!
//! Every connection (to the root, between ranks, and the transports' data
//! connections) is authenticated with the id's secret ([`auth`]); every wait
//! ends at a deadline derived from `HETCCL_TIMEOUT_S`; every length read from
//! the network is bounded ([`frame`]). The connecting side waits for the
//! acceptor's [`reply`] (the root's table, or an admission) and retries a
//! connection lost before it, with backoff, until its deadline ([`retry`]).

pub mod auth;
pub mod card;
pub mod clock_sync;
pub mod frame;
pub mod gate;
pub mod id;
pub mod reply;
pub mod retry;
pub mod root;
pub mod sock;
pub mod tally;

use std::net::{IpAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use hetccl_core::config::Compression;

use self::card::{decode_table, Card, CARD_BYTES};
use self::id::UniqueId;
use self::retry::Fail;
use crate::error::{Error, Result};

/// Where a rank's bootstrap listens and how long each of its phases may
/// take (from the communicator's settings).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Params {
    /// The address to listen on.
    pub ip: IpAddr,
    /// The bound of one bootstrap phase (`HETCCL_TIMEOUT_S`).
    pub timeout: Duration,
    /// This rank's `HETCCL_COALESCE_BYTES` (0: off), published on its card
    /// so that the ranks can agree.
    pub coalesce: u32,
    /// Whether this rank checks collective fingerprints (`HETCCL_CHECK`),
    /// published on its card so that the ranks can agree.
    pub checks: bool,
    /// This rank's wire compression (`HETCCL_COMPRESS`), published on its
    /// card so that the ranks can agree.
    pub compress: Compression,
}

impl Default for Params {
    /// Loopback and 300 s (tests).
    fn default() -> Self {
        Self {
            ip: IpAddr::V4(std::net::Ipv4Addr::LOCALHOST),
            timeout: Duration::from_secs(300),
            coalesce: 0,
            checks: true,
            compress: Compression::Off,
        }
    }
}

impl Params {
    /// The end of a phase that starts now.
    pub fn deadline(&self) -> Instant {
        Instant::now() + self.timeout
    }
}

/// Creates a unique id and starts its root on this process.
pub fn new_root(p: Params) -> Result<UniqueId> {
    let l = sock::listen(p.ip)?;
    let id = UniqueId::generate(l.local_addr()?)?;
    root::spawn(l, id.secret, p.deadline())?;
    tracing::info!(target: "hetccl::BOOTSTRAP", "root listening on {}", id.root);
    Ok(id)
}

/// Why a rank connects to another rank's listener.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Purpose {
    /// The out-of-band ring (from the previous rank).
    Ring,
    /// A transport data connection, with a channel index.
    Data(u32),
    /// A one-off hand-over of a new unique id (shrink).
    Handoff,
}

/// The hello a rank sends after authenticating to another rank's listener
/// (public for the `boot_hello` fuzz target).
#[doc(hidden)]
pub fn hello(purpose: Purpose, rank: usize) -> Vec<u8> {
    let mut h = Vec::with_capacity(12);
    match purpose {
        Purpose::Ring => h.extend_from_slice(b"RING"),
        Purpose::Data(c) => {
            h.extend_from_slice(b"DATA");
            h.extend_from_slice(&c.to_be_bytes());
        }
        Purpose::Handoff => h.extend_from_slice(b"HAND"),
    }
    h.extend_from_slice(&(rank as u32).to_be_bytes());
    h
}

/// Decodes a peer hello (untrusted: any bytes that passed authentication);
/// public for the `boot_hello` fuzz target.
#[doc(hidden)]
pub fn parse_hello(h: &[u8]) -> Result<(Purpose, usize)> {
    let be = |b: &[u8]| u32::from_be_bytes(b.try_into().expect("4 bytes"));
    match (h.len(), h.get(..4)) {
        (8, Some(b"RING")) => Ok((Purpose::Ring, be(&h[4..8]) as usize)),
        (8, Some(b"HAND")) => Ok((Purpose::Handoff, be(&h[4..8]) as usize)),
        (12, Some(b"DATA")) => Ok((Purpose::Data(be(&h[4..8])), be(&h[8..12]) as usize)),
        _ => Err(Error::Remote("unknown peer hello".into())),
    }
}

/// One rank's bootstrap state.
#[derive(Debug)]
pub struct Bootstrap {
    /// This rank.
    pub rank: usize,
    /// Every rank's card, by rank.
    pub cards: Vec<Card>,
    secret: [u8; 32],
    listener: TcpListener,
    /// Connections to `listener` still authenticating (kept across accepts).
    gate: parking_lot::Mutex<gate::Gate>,
    next: Option<TcpStream>,
    prev: Option<TcpStream>,
    params: Params,
}

/// A process-wide random value telling address spaces apart.
pub fn proc_nonce() -> u64 {
    static NONCE: once_cell::sync::Lazy<u64> = once_cell::sync::Lazy::new(|| {
        let mut b = [0u8; 8];
        let _ = getrandom::getrandom(&mut b);
        u64::from_ne_bytes(b) ^ u64::from(std::process::id())
    });
    *NONCE
}

impl Bootstrap {
    /// Joins the communicator named by `id` as `rank` of `nranks`.
    pub fn join(
        id: &UniqueId,
        rank: usize,
        nranks: usize,
        host_hash: u64,
        params: Params,
    ) -> Result<Self> {
        let dl = params.deadline();
        let listener = sock::listen(params.ip)?;
        let me = Card {
            rank: rank as u32,
            nranks: nranks as u32,
            host_hash,
            pid: std::process::id(),
            proc_nonce: proc_nonce(),
            coalesce: params.coalesce,
            addr: listener.local_addr()?,
            checks: params.checks,
            compress: params.compress,
        };
        let mut h = root::ROOT_TAG.to_vec();
        h.extend_from_slice(&me.encode());
        let what = format!("rank {rank}/{nranks}: join at {}", id.root);
        let (_, cards) = retry::dial(id.root, &id.secret, &h, dl, &what, |s| {
            let table = reply::recv(s, nranks * CARD_BYTES, dl)?;
            let cards = decode_table(&table, nranks).map_err(Fail::Fatal)?;
            if cards[rank] != me {
                return Err(Fail::Fatal(Error::Remote(
                    "the root's table does not hold this rank's card".into(),
                )));
            }
            Ok(cards)
        })?;
        let mut b = Self {
            rank,
            cards,
            secret: id.secret,
            listener,
            gate: Default::default(),
            next: None,
            prev: None,
            params,
        };
        if nranks > 1 {
            b.connect_ring(dl)?;
        }
        tracing::info!(target: "hetccl::BOOTSTRAP", "rank {rank}/{nranks} joined");
        Ok(b)
    }

    /// Where and how long this rank's bootstrap waits.
    pub fn params(&self) -> Params {
        self.params
    }

    /// The number of ranks.
    pub fn nranks(&self) -> usize {
        self.cards.len()
    }

    fn connect_ring(&mut self, dl: Instant) -> Result<()> {
        let n = self.nranks();
        let next = self.cards[(self.rank + 1) % n].addr;
        let prev_rank = (self.rank + n - 1) % n;
        let (next_s, prev_s) = std::thread::scope(|sc| {
            let acc = sc.spawn(|| self.accept_from(Purpose::Ring, prev_rank, dl));
            let con = self.connect_to(next, Purpose::Ring, dl);
            let acc = acc
                .join()
                .unwrap_or_else(|_| Err(Error::Internal("ring accept panicked".into())));
            (con, acc)
        });
        self.next = Some(next_s?);
        self.prev = Some(prev_s?);
        Ok(())
    }

    /// Opens an authenticated connection to `addr` for `purpose`, and
    /// returns it once the peer has admitted it; a connection lost before
    /// that is retried until `dl`.
    pub fn connect_to(
        &self,
        addr: std::net::SocketAddr,
        purpose: Purpose,
        dl: Instant,
    ) -> Result<TcpStream> {
        let what = format!("rank {}: {purpose:?} connection to {addr}", self.rank);
        let h = hello(purpose, self.rank);
        let (s, ()) = retry::dial(addr, &self.secret, &h, dl, &what, |s| {
            match reply::recv(s, reply::ADMITTED.len(), dl)? {
                p if p == reply::ADMITTED => Ok(()),
                p => Err(Fail::Fatal(Error::Remote(
                    format!("{what}: unexpected reply of {} bytes", p.len()).into(),
                ))),
            }
        })?;
        Ok(s)
    }

    /// Accepts the authenticated connection that `from` opens for `purpose`;
    /// connections that fail authentication are logged and dropped.
    pub fn accept_from(&self, purpose: Purpose, from: usize, dl: Instant) -> Result<TcpStream> {
        Ok(self.accept_any(dl, |p, r| p == purpose && r == from)?.0)
    }

    /// Accepts the next authenticated connection whose (purpose, rank)
    /// satisfies `want`, and admits it; others are refused.
    pub fn accept_any(
        &self,
        dl: Instant,
        want: impl Fn(Purpose, usize) -> bool,
    ) -> Result<(TcpStream, Purpose, usize)> {
        let mut gate = self.gate.lock();
        loop {
            let (mut s, h) = gate.next(&self.listener, &self.secret, dl)?;
            let why = match parse_hello(&h) {
                Ok((p, r)) if r < self.nranks() && want(p, r) => {
                    match frame::send(&mut s, reply::ADMITTED, dl) {
                        Ok(()) => return Ok((s, p, r)),
                        // Its peer retries with a new connection.
                        Err(e) => {
                            tracing::debug!(target: "hetccl::BOOTSTRAP",
                                "rank {}: {p:?} connection from rank {r} lost before \
                                 admission: {e}", self.rank);
                            continue;
                        }
                    }
                }
                Ok((p, r)) => format!("unexpected connection {p:?} from rank {r}"),
                Err(e) => e.to_string(),
            };
            tracing::warn!(target: "hetccl::BOOTSTRAP",
                "rank {}: refused a connection from {:?}: {why}", self.rank, s.peer_addr().ok());
            reply::refuse(&mut s, &why, dl);
        }
    }

    /// Ring all-gather of one small blob per rank (at most `max` bytes each).
    pub fn allgather(&mut self, mine: &[u8], max: usize) -> Result<Vec<Vec<u8>>> {
        let n = self.nranks();
        let mut out = vec![Vec::new(); n];
        out[self.rank] = mine.to_vec();
        if n == 1 {
            return Ok(out);
        }
        let dl = self.params.deadline();
        let (next, prev) = match (self.next.as_mut(), self.prev.as_mut()) {
            (Some(a), Some(b)) => (a, b),
            _ => return Err(Error::Internal("bootstrap ring is not connected".into())),
        };
        for step in 0..n - 1 {
            let send_idx = (self.rank + n - step) % n;
            let recv_idx = (self.rank + n - step - 1) % n;
            frame::send(next, &out[send_idx], dl)?;
            out[recv_idx] = frame::recv(prev, max, dl)?;
        }
        Ok(out)
    }

    /// Waits until every rank reaches the barrier.
    pub fn barrier(&mut self) -> Result<()> {
        self.allgather(&[], 0).map(drop)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn four_ranks_join_allgather_and_refuse_strangers() {
        let id = new_root(Params::default()).unwrap();
        // A stranger with a wrong secret knocks first; the root must ignore it.
        let mut bad = id.clone();
        bad.secret[0] ^= 1;
        let stranger =
            std::thread::spawn(move || Bootstrap::join(&bad, 0, 4, 1, Params::default()));
        std::thread::sleep(Duration::from_millis(50));
        let hs: Vec<_> = (0..4)
            .map(|r| {
                let id = id.clone();
                std::thread::spawn(move || {
                    let mut b = Bootstrap::join(&id, r, 4, 7, Params::default())?;
                    let all = b.allgather(&[r as u8; 3], 16)?;
                    b.barrier()?;
                    Ok::<_, Error>(all)
                })
            })
            .collect();
        for h in hs {
            let all = h.join().unwrap().unwrap();
            for (r, v) in all.iter().enumerate() {
                assert_eq!(v, &vec![r as u8; 3]);
            }
        }
        // The stranger never got a table (its connection was refused); it
        // fails rather than joining.
        assert!(stranger.join().unwrap().is_err());
    }

    fn lo() -> TcpListener {
        sock::listen("127.0.0.1".parse().unwrap()).unwrap()
    }

    #[test]
    fn join_retries_connections_lost_before_the_table() {
        let l = lo();
        let id = UniqueId::generate(l.local_addr().unwrap()).unwrap();
        let secret = id.secret;
        // A root that drops the first connection at once, the second after
        // authenticating it, and answers the third.
        let root = std::thread::spawn(move || {
            let dl = Instant::now() + Duration::from_secs(30);
            drop(sock::accept(&l, dl).unwrap());
            let mut s = sock::accept(&l, dl).unwrap();
            let h1 = auth::verify(&mut s, &secret, dl).unwrap();
            drop(s);
            let mut s = sock::accept(&l, dl).unwrap();
            let h2 = auth::verify(&mut s, &secret, dl).unwrap();
            assert_eq!(h1, h2, "the card changed between attempts");
            let card = root::parse_root_hello(&h2).unwrap();
            frame::send(&mut s, &card::encode_table(&[card]), dl).unwrap();
        });
        let b = Bootstrap::join(&id, 0, 1, 7, Params::default()).unwrap();
        assert_eq!(b.cards.len(), 1);
        root.join().unwrap();
    }

    #[test]
    fn connect_to_retries_until_admitted_and_stops_at_a_refusal() {
        let secret = [3u8; 32];
        let me = Bootstrap {
            rank: 0,
            cards: Vec::new(),
            secret,
            listener: lo(),
            gate: Default::default(),
            next: None,
            prev: None,
            params: Params::default(),
        };
        let l = lo();
        let addr = l.local_addr().unwrap();
        // A peer that drops the first connection after authenticating it,
        // admits the second, and refuses the third.
        let peer = std::thread::spawn(move || {
            let dl = Instant::now() + Duration::from_secs(30);
            let mut s = sock::accept(&l, dl).unwrap();
            auth::verify(&mut s, &secret, dl).unwrap();
            drop(s);
            let mut s = sock::accept(&l, dl).unwrap();
            auth::verify(&mut s, &secret, dl).unwrap();
            frame::send(&mut s, reply::ADMITTED, dl).unwrap();
            let got = frame::recv(&mut s, 16, dl).unwrap();
            let mut s = sock::accept(&l, dl).unwrap();
            auth::verify(&mut s, &secret, dl).unwrap();
            reply::refuse(&mut s, "not now", dl);
            got
        });
        let dl = Instant::now() + Duration::from_secs(60);
        let mut s = me.connect_to(addr, Purpose::Handoff, dl).unwrap();
        frame::send(&mut s, b"hi", dl).unwrap();
        let t = Instant::now();
        let e = me.connect_to(addr, Purpose::Handoff, dl).unwrap_err();
        assert!(e.to_string().contains("not now"), "{e}");
        // A refusal ends the attempts; it does not wait for the deadline.
        assert!(t.elapsed() < Duration::from_secs(30), "{:?}", t.elapsed());
        assert_eq!(peer.join().unwrap(), b"hi");
    }

    #[test]
    fn hello_codec() {
        assert_eq!(
            parse_hello(&hello(Purpose::Data(3), 5)).unwrap(),
            (Purpose::Data(3), 5)
        );
        assert_eq!(
            parse_hello(&hello(Purpose::Ring, 0)).unwrap(),
            (Purpose::Ring, 0)
        );
        assert_eq!(
            parse_hello(&hello(Purpose::Handoff, 2)).unwrap(),
            (Purpose::Handoff, 2)
        );
        assert!(parse_hello(b"XXXX1234").is_err());
    }
}
