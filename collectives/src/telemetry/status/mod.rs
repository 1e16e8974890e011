//! The status service (`HETCCL_STATUS`, `HETCCL_STATUS_PORT`): who is
//! everyone waiting on.
//!
//! A process with the service on listens on 127.0.0.1 (the query port; its
//! number goes to `<tmp>/hetccl-status-<pid>.port` for
//! `hetccl-perf status --pid PID`). Each of its communicators also listens
//! on the bootstrap interface for the other ranks' questions, which must
//! authenticate with the communicator's secret (`bootstrap::auth`). A
//! query on the local port asks every rank of every communicator of the
//! process, in parallel, with a deadline of [`PEER_DEADLINE`] each, and
//! answers with one table per communicator (`table`). The threads that
//! answer never touch the communicator's locks, so they answer while the
//! application's threads are stuck inside a collective.

pub mod table;

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use once_cell::sync::OnceCell;
use parking_lot::Mutex;

use self::table::{RankStatus, Row};
use crate::algo::Collective;
use crate::bootstrap::{auth, frame, sock};
use crate::error::Result;
use crate::exec::watch::{mono_ms, Doing};

/// How long a query waits for each other rank.
pub const PEER_DEADLINE: Duration = Duration::from_secs(1);
/// What a rank's question says after authenticating.
const HELLO: &[u8] = b"hetccl-status-v1";

/// Where a rank's status listener is, and who it is (from init).
#[derive(Debug, Clone, Default)]
pub struct Peer {
    /// Its listener, when its service is on.
    pub addr: Option<SocketAddr>,
    /// Its short host name ("?" when unknown).
    pub host: String,
    /// Its process id (0 when unknown).
    pub pid: u32,
}

/// A communicator's listener for the other ranks' questions.
#[derive(Debug)]
pub struct Listener {
    l: TcpListener,
    addr: SocketAddr,
}

impl Listener {
    /// Listens on `ip` (the bootstrap interface), on a free port.
    pub fn bind(ip: IpAddr) -> Result<Self> {
        let l = sock::listen(ip)?;
        let addr = l.local_addr()?;
        Ok(Self { l, addr })
    }

    /// What this rank publishes at init: "addr host pid".
    pub fn card(&self) -> Vec<u8> {
        format!(
            "{} {} {}",
            self.addr,
            hetccl_core::obs::short_hostname(),
            std::process::id()
        )
        .into_bytes()
    }
}

/// Reads a rank's card (empty: its service is off; `pid` from the
/// bootstrap is used then).
pub fn parse_card(b: &[u8], pid: u32) -> Peer {
    let t = String::from_utf8_lossy(b);
    let mut f = t.split(' ');
    match (f.next(), f.next(), f.next()) {
        (Some(a), Some(h), Some(p)) => Peer {
            addr: a.parse().ok(),
            host: h.to_string(),
            pid: p.parse().unwrap_or(pid),
        },
        _ => Peer {
            addr: None,
            host: "?".into(),
            pid,
        },
    }
}

/// What the service knows of one communicator.
#[derive(Debug)]
pub struct Entry {
    /// "comm 0123… (\"name\")".
    pub label: String,
    /// This rank.
    pub rank: usize,
    /// Every rank, by rank.
    pub peers: Vec<Peer>,
    /// The communicator's secret.
    pub secret: [u8; 32],
    /// What this rank is doing (kept by its `exec::watch::Watch`).
    pub doing: Arc<Doing>,
    open: AtomicBool,
}

impl Entry {
    /// A communicator's entry.
    pub fn new(
        label: String,
        rank: usize,
        peers: Vec<Peer>,
        secret: [u8; 32],
        doing: Arc<Doing>,
    ) -> Self {
        Self {
            label,
            rank,
            peers,
            secret,
            doing,
            open: AtomicBool::new(true),
        }
    }

    /// What this rank says about itself now.
    pub fn local(&self) -> RankStatus {
        let d = &self.doing;
        let cur = d.current.load(Ordering::Acquire);
        let done = d.done.load(Ordering::Acquire);
        let kind = d.kind.load(Ordering::Relaxed);
        let since = d.stalled_ms.load(Ordering::Acquire);
        let name = Collective::ALL
            .get((kind as usize).wrapping_sub(1))
            .map_or("operation", |k| k.name());
        let stalled = cur != 0 && since != 0;
        RankStatus {
            rank: self.rank,
            host: hetccl_core::obs::short_hostname().to_string(),
            pid: std::process::id(),
            done: done.checked_sub(1),
            current: cur.checked_sub(1).map(|s| (s, name.to_string())),
            stalled_ms: if stalled {
                mono_ms().saturating_sub(since)
            } else {
                0
            },
            waits: d
                .waits_on()
                .filter(|_| stalled)
                .map(|w| (w.peer, w.step, w.describe().to_string())),
        }
    }
}

static ENTRIES: Mutex<Vec<Arc<Entry>>> = Mutex::new(Vec::new());
static SERVICE: OnceCell<u16> = OnceCell::new();

/// Serves `entry`'s questions from the other ranks on `listener`, and
/// starts the process's query service on `port` (once; 0 picks a free
/// port).
pub fn register(entry: Arc<Entry>, listener: Listener, port: u16) {
    ENTRIES.lock().push(entry.clone());
    let e = entry.clone();
    let spawned = std::thread::Builder::new()
        .name("hetccl-status-peer".into())
        .spawn(move || serve_peers(&e, &listener.l));
    if let Err(err) = spawned {
        tracing::warn!(target: "hetccl::INIT", "status: cannot start a thread: {err}");
    }
    if let Err(err) = SERVICE.get_or_try_init(|| start_service(port)) {
        tracing::warn!(target: "hetccl::INIT",
            "status: cannot listen on 127.0.0.1:{port}: {err}; the status service is off");
    }
}

/// Stops serving the communicator of `doing` (destroy, abort).
pub fn unregister(doing: &Arc<Doing>) {
    ENTRIES.lock().retain(|e| {
        let mine = Arc::ptr_eq(&e.doing, doing);
        if mine {
            e.open.store(false, Ordering::Release);
        }
        !mine
    });
}

/// The file holding the query port of process `pid`.
pub fn port_file(pid: u32) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("hetccl-status-{pid}.port"))
}

fn start_service(port: u16) -> std::io::Result<u16> {
    let l = TcpListener::bind(("127.0.0.1", port))?;
    let port = l.local_addr()?.port();
    crate::telemetry::path::write_atomic(
        &port_file(std::process::id()),
        format!("{port}\n").as_bytes(),
    )?;
    // SAFETY: a plain extern "C" function that never unwinds.
    unsafe { libc::atexit(remove_port_file) };
    std::thread::Builder::new()
        .name("hetccl-status".into())
        .spawn(move || {
            for s in l.incoming().flatten() {
                answer_query(s);
            }
        })?;
    tracing::info!(target: "hetccl::INIT", "status: query port 127.0.0.1:{port}");
    Ok(port)
}

extern "C" fn remove_port_file() {
    let _ = std::fs::remove_file(port_file(std::process::id()));
}

/// Answers one local query: reads its request line, writes the tables.
fn answer_query(mut s: TcpStream) {
    let _ = s.set_read_timeout(Some(Duration::from_secs(1)));
    let mut req = [0u8; 64];
    let _ = s.read(&mut req);
    let _ = s.write_all(report().as_bytes());
}

/// Logs every open communicator's table at WARN, when the service is on
/// (hang reports; it asks the other ranks, so it takes up to
/// [`PEER_DEADLINE`]).
pub fn log_view() {
    if SERVICE.get().is_none() {
        return;
    }
    for line in report().lines() {
        tracing::warn!(target: "hetccl::COLL", "status: {line}");
    }
}

/// Every open communicator's table.
pub fn report() -> String {
    let entries: Vec<Arc<Entry>> = ENTRIES.lock().clone();
    if entries.is_empty() {
        return "no communicator\n".into();
    }
    let mut out = String::new();
    for e in entries {
        out.push_str(&table::render(&e.label, e.rank, e.peers.len(), &rows(&e)));
    }
    out
}

/// Every rank's row: this one's from memory, the others' asked in
/// parallel.
fn rows(e: &Entry) -> Vec<Row> {
    std::thread::scope(|sc| {
        let hs: Vec<_> = (0..e.peers.len())
            .map(|r| {
                sc.spawn(move || {
                    if r == e.rank {
                        return Row::Answer(e.local());
                    }
                    let p = &e.peers[r];
                    match p.addr.and_then(|a| ask(a, &e.secret)) {
                        Some(s) if s.rank == r => Row::Answer(s),
                        _ => Row::NoAnswer(r, p.host.clone(), p.pid),
                    }
                })
            })
            .collect();
        hs.into_iter()
            .enumerate()
            .map(|(r, h)| h.join().unwrap_or_else(|_| Row::NoAnswer(r, "?".into(), 0)))
            .collect()
    })
}

/// Asks the rank listening at `addr`.
fn ask(addr: SocketAddr, secret: &[u8]) -> Option<RankStatus> {
    let dl = Instant::now() + PEER_DEADLINE;
    let mut s = sock::connect(addr, dl).ok()?;
    auth::prove(&mut s, secret, HELLO, dl).ok()?;
    let b = frame::recv(&mut s, 1024, dl).ok()?;
    RankStatus::decode(&String::from_utf8_lossy(&b))
}

/// Answers the other ranks' questions until the communicator closes.
fn serve_peers(e: &Entry, l: &TcpListener) {
    while e.open.load(Ordering::Acquire) {
        let Ok(mut s) = sock::accept(l, Instant::now() + Duration::from_millis(200)) else {
            continue;
        };
        let dl = Instant::now() + PEER_DEADLINE;
        match auth::verify(&mut s, &e.secret, dl) {
            Ok(h) if h == HELLO => {
                let _ = frame::send(&mut s, e.local().encode().as_bytes(), dl);
            }
            Ok(_) | Err(_) => {
                tracing::warn!(target: "hetccl::INIT",
                    "status: refused a question from {:?}", s.peer_addr().ok());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peers_answer_only_with_the_secret() {
        let l = Listener::bind(IpAddr::V4(std::net::Ipv4Addr::LOCALHOST)).unwrap();
        let addr = l.addr;
        let peer = parse_card(&l.card(), 0);
        assert_eq!(peer.addr, Some(addr));
        assert_eq!(peer.pid, std::process::id());
        let doing = Arc::new(Doing::default());
        doing.current.store(8, Ordering::Relaxed);
        doing
            .kind
            .store(Collective::Broadcast as u64 + 1, Ordering::Relaxed);
        let e = Arc::new(Entry::new(
            "c".into(),
            1,
            vec![Peer::default(), peer],
            [7; 32],
            doing,
        ));
        let e2 = e.clone();
        let t = std::thread::spawn(move || serve_peers(&e2, &l.l));
        let s = ask(addr, &[7; 32]).expect("an answer");
        assert_eq!(s.rank, 1);
        assert_eq!(s.current, Some((7, "broadcast".to_string())));
        assert_eq!(ask(addr, &[8; 32]), None, "a wrong secret gets nothing");
        e.open.store(false, Ordering::Release);
        t.join().unwrap();
        assert_eq!(parse_card(b"", 9).pid, 9);
    }
}
