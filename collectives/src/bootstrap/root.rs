//! The root: a thread started by `ncclGetUniqueId` that collects every
//! rank's card and sends each rank the full table.
//!
//! Connections are admitted concurrently ([`Gate`]): each has its own
//! authentication deadline, so silent or slow connections do not hold up
//! the real ranks. Connections that fail authentication or send a
//! malformed hello are dropped and logged; a rank that disagrees on the
//! size, or claims a rank another live connection holds, gets a refusal
//! ([`reply::refuse`]). The root keeps waiting for the real ranks until the
//! deadline.
//!
//! Ranks retry a connection lost before their table arrives, so one rank
//! may connect more than once. A rank's card is the same on every attempt
//! of one join (its listener address is fresh per join), so the root keys
//! ranks by rank and lets a connection with the same card replace the one
//! it holds; a different card replaces it only if the held connection is
//! dead. Before the table goes out, held connections that died are dropped
//! and waited for again; a rank whose table could not be sent may still
//! reconnect and get it, until the deadline.

use std::collections::BTreeMap;
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::time::Instant;

use super::card::{decode_table, encode_table, Card, CARD_BYTES};
use super::frame;
use super::gate::Gate;
use super::reply;
use super::sock;
use crate::error::{Error, Result};

/// The hello a rank sends the root: `ROOT` then its card.
pub const ROOT_TAG: &[u8; 4] = b"ROOT";

/// Whether the peer of `s` (a blocking stream the peer should not write to)
/// is still there: no hang-up, error or end of stream is pending.
pub fn alive(s: &TcpStream) -> bool {
    let mut pfd = libc::pollfd {
        fd: s.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd whose descriptor stays open during the call.
    let n = unsafe { libc::poll(&mut pfd, 1, 0) };
    if n <= 0 {
        return n == 0;
    }
    if pfd.revents & (libc::POLLERR | libc::POLLHUP | libc::POLLNVAL) != 0 {
        return false;
    }
    // Readable: bytes (unexpected, but alive) or the end of the stream. The
    // peek cannot block, poll said there is something to read.
    let mut b = [0u8; 1];
    matches!(s.peek(&mut b), Ok(n) if n > 0)
}

/// The ranks that have joined, by rank.
#[derive(Debug, Default)]
struct Joined {
    conns: BTreeMap<u32, (TcpStream, Card)>,
    nranks: Option<usize>,
}

impl Joined {
    fn complete(&self) -> bool {
        self.nranks.is_some_and(|n| self.conns.len() == n)
    }

    /// Takes a rank's connection, or refuses it.
    fn admit(&mut self, mut s: TcpStream, card: Card, deadline: Instant) {
        let (r, n) = (card.rank, card.nranks as usize);
        let why = match (self.nranks, self.conns.get(&r)) {
            (Some(m), _) if m != n => format!("rank {r} says {n} ranks, the first rank said {m}"),
            (_, Some((_, c))) if *c == card => {
                tracing::debug!(target: "hetccl::BOOTSTRAP",
                    "root: rank {r} reconnected; its new connection replaces the old one");
                String::new()
            }
            (_, Some((old, _))) if !alive(old) => {
                tracing::info!(target: "hetccl::BOOTSTRAP",
                    "root: rank {r} joined again with a new card; its old connection is closed");
                String::new()
            }
            (_, Some(_)) => format!("rank {r} has already joined"),
            (_, None) => String::new(),
        };
        if why.is_empty() {
            self.nranks = Some(n);
            self.conns.insert(r, (s, card));
        } else {
            tracing::warn!(target: "hetccl::BOOTSTRAP", "root: refused a rank: {why}");
            reply::refuse(&mut s, &why, deadline);
        }
    }

    /// Drops held connections whose rank has gone (it reconnects if it can).
    fn drop_dead(&mut self) {
        self.conns.retain(|r, (s, _)| {
            let ok = alive(s);
            if !ok {
                tracing::info!(target: "hetccl::BOOTSTRAP",
                    "root: rank {r}'s connection closed before the table; waiting for it again");
            }
            ok
        });
    }
}

/// Serves one communicator's rendezvous on `listener`, until every rank has
/// its table or `deadline` passes.
pub fn serve(listener: TcpListener, secret: [u8; 32], deadline: Instant) -> Result<()> {
    sock::widen_backlog(&listener);
    let mut joined = Joined::default();
    let mut gate = Gate::new();
    loop {
        if joined.complete() {
            joined.drop_dead();
            if joined.complete() {
                break;
            }
        }
        let (mut s, hello) = gate.next(&listener, &secret, deadline)?;
        match parse_root_hello(&hello) {
            Ok(card) => joined.admit(s, card, deadline),
            Err(e) => {
                tracing::warn!(target: "hetccl::BOOTSTRAP",
                    "root: refused a connection from {:?}: {e}", s.peer_addr().ok());
                reply::refuse(&mut s, &e.to_string(), deadline);
            }
        }
    }
    let cards: Vec<Card> = joined.conns.values().map(|(_, c)| c.clone()).collect();
    let n = cards.len();
    let table = encode_table(&cards);
    debug_assert!(decode_table(&table, n).is_ok());
    let mut unsent = Vec::new();
    for (r, (s, _)) in &mut joined.conns {
        if let Err(e) = frame::send(s, &table, deadline) {
            tracing::warn!(target: "hetccl::BOOTSTRAP",
                "root: could not send the table to rank {r}: {e}; waiting for it to reconnect");
            unsent.push(*r);
        }
    }
    drop(joined);
    tracing::info!(target: "hetccl::BOOTSTRAP", "root: {n} ranks joined");
    while !unsent.is_empty() {
        let (mut s, hello) = gate.next(&listener, &secret, deadline)?;
        match parse_root_hello(&hello) {
            Ok(c) if unsent.contains(&c.rank) && cards[c.rank as usize] == c => {
                if frame::send(&mut s, &table, deadline).is_ok() {
                    unsent.retain(|&r| r != c.rank);
                }
            }
            _ => reply::refuse(&mut s, "the communicator is complete", deadline),
        }
    }
    Ok(())
}

/// Decodes a rank's hello to the root (its card); public for the
/// `boot_hello` fuzz target.
#[doc(hidden)]
pub fn parse_root_hello(hello: &[u8]) -> Result<Card> {
    if hello.len() != 4 + CARD_BYTES || &hello[..4] != ROOT_TAG {
        return Err(Error::Remote("not a root hello".into()));
    }
    Card::decode(&hello[4..])
}

/// Starts [`serve`] on a thread. The thread ends by itself when done or at
/// the deadline; errors are logged.
pub fn spawn(listener: TcpListener, secret: [u8; 32], deadline: Instant) -> Result<()> {
    std::thread::Builder::new()
        .name("hetccl-root".into())
        .spawn(move || {
            if let Err(e) = serve(listener, secret, deadline) {
                tracing::warn!(target: "hetccl::BOOTSTRAP", "root ended: {e}");
            }
        })
        .map(drop)
        .map_err(|e| Error::System(format!("spawn root thread: {e}").into()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bootstrap::{auth, retry::Fail, sock};
    use std::net::SocketAddr;
    use std::time::Duration;

    fn card(rank: u32, nranks: u32, port: u16) -> Card {
        Card {
            rank,
            nranks,
            host_hash: 1,
            pid: 2,
            proc_nonce: 3,
            coalesce: 0,
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
            checks: true,
            compress: hetccl_core::config::Compression::Off,
        }
    }

    fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        (a, l.accept().unwrap().0)
    }

    fn refusal(s: &mut TcpStream) -> String {
        let dl = Instant::now() + Duration::from_secs(5);
        match reply::recv(s, CARD_BYTES, dl) {
            Err(Fail::Fatal(e)) => e.to_string(),
            other => panic!("not a refusal: {other:?}"),
        }
    }

    fn gone(s: &TcpStream) {
        let t = Instant::now();
        while alive(s) {
            assert!(t.elapsed() < Duration::from_secs(10), "still alive");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    #[test]
    fn a_rank_is_counted_once_however_often_it_connects() {
        let dl = Instant::now() + Duration::from_secs(10);
        let mut j = Joined::default();
        let c0 = card(0, 2, 1000);
        let (a_peer, a) = pair();
        j.admit(a, c0.clone(), dl);
        // A retry of the same join (the same card) replaces the connection.
        let (b_peer, b) = pair();
        j.admit(b, c0.clone(), dl);
        assert_eq!(j.conns.len(), 1);
        gone(&a_peer);
        // Another card for rank 0 while its connection lives: refused.
        let (mut c_peer, c) = pair();
        j.admit(c, card(0, 2, 2000), dl);
        assert!(refusal(&mut c_peer).contains("already joined"));
        assert_eq!(j.conns[&0].1, c0);
        // A size that disagrees: refused.
        let (mut d_peer, d) = pair();
        j.admit(d, card(1, 3, 3000), dl);
        assert!(refusal(&mut d_peer).contains("says 3 ranks"));
        // Once rank 0's connection is dead, a new card may take its place.
        drop(b_peer);
        gone(&j.conns[&0].0);
        let (_e_peer, e) = pair();
        j.admit(e, card(0, 2, 4000), dl);
        assert_eq!(j.conns[&0].1.addr.port(), 4000);
        assert!(!j.complete());
        let (_f_peer, f) = pair();
        j.admit(f, card(1, 2, 5000), dl);
        assert!(j.complete());
    }

    fn hello(c: &Card) -> Vec<u8> {
        let mut h = ROOT_TAG.to_vec();
        h.extend_from_slice(&c.encode());
        h
    }

    #[test]
    fn a_rank_whose_connection_died_before_the_table_gets_it_on_reconnect() {
        let l = sock::listen("127.0.0.1".parse().unwrap()).unwrap();
        let addr = l.local_addr().unwrap();
        let secret = [9u8; 32];
        let dl = Instant::now() + Duration::from_secs(20);
        let root = std::thread::spawn(move || serve(l, secret, dl));
        let (c0, c1) = (card(0, 2, 1000), card(1, 2, 1001));
        // Rank 0 authenticates, then its connection dies.
        let mut a = sock::connect(addr, dl).unwrap();
        auth::prove(&mut a, &secret, &hello(&c0), dl).unwrap();
        drop(a);
        // Rank 1 joins; the root counts rank 0's dead connection out.
        let h1 = hello(&c1);
        let r1 = std::thread::spawn(move || {
            let mut s = sock::connect(addr, dl).unwrap();
            auth::prove(&mut s, &secret, &h1, dl).unwrap();
            decode_table(&reply::recv(&mut s, 2 * CARD_BYTES, dl).unwrap(), 2).unwrap()
        });
        // Rank 0 reconnects with the same card and gets the table.
        let mut a = sock::connect(addr, dl).unwrap();
        auth::prove(&mut a, &secret, &hello(&c0), dl).unwrap();
        let t0 = decode_table(&reply::recv(&mut a, 2 * CARD_BYTES, dl).unwrap(), 2).unwrap();
        assert_eq!(t0, vec![c0, c1]);
        assert_eq!(r1.join().unwrap(), t0);
        root.join().unwrap().unwrap();
    }
}
