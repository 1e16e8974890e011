//! Real ranks get through a flood of strangers at a bootstrap listener.
//!
//! Four flood threads of this process connect to the listener in bursts (20
//! connects back to back, then a 5 ms pause; a connect that gets no
//! handshake in 50 ms is given up, so a full accept queue does not stall
//! the flood): two open connections and close them at once, with a FIN or
//! a reset; one sends garbage (random bytes, an answer-sized frame of random
//! bytes, an oversized length, a truncated frame held open, one byte); one
//! connects and stays silent, holding its last 300 connections open.
//!
//! - `root_flood`: 20 communicators of 4 thread ranks join through
//!   `Bootstrap::join` (root rendezvous, then the ring) and run an
//!   all-gather and a barrier while the root of each is flooded. All 20 must
//!   succeed; no gate may ever hold more than `PENDING_CAP` connections that
//!   are still authenticating (and the flood must have filled one); the
//!   roots log their drops as a few WARN summaries, with a DEBUG line each.
//! - `rank_listener_flood`: 20 hand-overs (`Purpose::Handoff`, as shrink
//!   uses) from rank 0 to rank 1 of a 2-rank bootstrap while rank 1's
//!   listener is flooded; rank 1 starts accepting 30 ms after rank 0
//!   connects, so the real connection waits in the backlog with the flood.
//!   Each must arrive.
//!
//! The tests run one at a time (a lock), with loopback and, unless the
//! environment sets one, a 20 s bootstrap deadline.

use std::collections::VecDeque;
use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Once};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use hetccl_collectives::bootstrap::{self, frame, gate, Bootstrap, Purpose};
use tracing::field::{Field, Visit};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};

const INITS: usize = 20;
const RANKS: usize = 4;

fn setup() -> MutexGuard<'static, ()> {
    static ONCE: Once = Once::new();
    static SERIAL: Mutex<()> = Mutex::new(());
    ONCE.call_once(|| {
        std::env::set_var("HETCCL_SOCKET_IFNAME", "lo");
        if std::env::var_os("HETCCL_TIMEOUT_S").is_none() {
            std::env::set_var("HETCCL_TIMEOUT_S", "20");
        }
        tracing::subscriber::set_global_default(tracing_subscriber::registry().with(Count))
            .expect("no subscriber yet");
    });
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// Bootstrap log events: WARN lines, DEBUG lines about dropped
/// connections, and DEBUG lines about retried attempts.
static WARNS: AtomicU64 = AtomicU64::new(0);
static DEBUG_DROPS: AtomicU64 = AtomicU64::new(0);
static RETRIES: AtomicU64 = AtomicU64::new(0);

/// A `tracing` layer that counts the bootstrap's log events.
struct Count;

struct Msg(String);

impl Visit for Msg {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            self.0 = format!("{value:?}");
        }
    }
}

impl<S: tracing::Subscriber> Layer<S> for Count {
    fn on_event(&self, event: &tracing::Event<'_>, _: Context<'_, S>) {
        let m = event.metadata();
        if m.target() != "hetccl::BOOTSTRAP" {
            return;
        }
        if *m.level() == tracing::Level::WARN {
            WARNS.fetch_add(1, Ordering::Relaxed);
        } else if *m.level() == tracing::Level::DEBUG {
            let mut msg = Msg(String::new());
            event.record(&mut msg);
            if msg.0.contains("dropped a connection") {
                DEBUG_DROPS.fetch_add(1, Ordering::Relaxed);
            } else if msg.0.contains("lost before admission") {
                RETRIES.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

/// The log counters: (WARN lines, DEBUG drop lines, retried attempts).
fn logged() -> (u64, u64, u64) {
    (
        WARNS.load(Ordering::Relaxed),
        DEBUG_DROPS.load(Ordering::Relaxed),
        RETRIES.load(Ordering::Relaxed),
    )
}

/// xorshift, so that every run throws the same garbage.
fn rng(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

/// Closes `s` with a reset instead of a FIN (SO_LINGER with a zero timeout).
fn reset(s: TcpStream) {
    let l = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // SAFETY: a valid socket and a `linger` struct of the size passed.
    unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&l as *const libc::linger).cast(),
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        );
    }
    drop(s);
}

/// The flood: one thread per kind of stranger, all aimed at `target`.
struct Flood {
    target: Arc<Mutex<Option<SocketAddr>>>,
    stop: Arc<AtomicBool>,
    connects: Arc<AtomicU64>,
    threads: Vec<JoinHandle<()>>,
}

#[derive(Clone, Copy)]
enum Kind {
    /// Connect, then close (FIN) or reset (RST) at once.
    Closer,
    /// Connect and send garbage; some are held open.
    Garbage,
    /// Connect and say nothing; the last 300 are held open.
    Silent,
}

impl Flood {
    fn start() -> Self {
        let target = Arc::new(Mutex::new(None::<SocketAddr>));
        let stop = Arc::new(AtomicBool::new(false));
        let connects = Arc::new(AtomicU64::new(0));
        let threads = [Kind::Closer, Kind::Closer, Kind::Garbage, Kind::Silent]
            .into_iter()
            .enumerate()
            .map(|(i, kind)| {
                let (target, stop, connects) = (target.clone(), stop.clone(), connects.clone());
                std::thread::spawn(move || flood(kind, i as u64, &target, &stop, &connects))
            })
            .collect();
        Self {
            target,
            stop,
            connects,
            threads,
        }
    }

    fn aim(&self, at: Option<SocketAddr>) {
        *self.target.lock().unwrap() = at;
    }

    fn stop(self) -> u64 {
        self.stop.store(true, Ordering::SeqCst);
        for t in self.threads {
            t.join().unwrap();
        }
        self.connects.load(Ordering::SeqCst)
    }
}

fn flood(
    kind: Kind,
    seed: u64,
    target: &Mutex<Option<SocketAddr>>,
    stop: &AtomicBool,
    n: &AtomicU64,
) {
    let mut s = 0x9e37_79b9_7f4a_7c15u64 ^ (seed + 1).wrapping_mul(0x2545_f491_4f6c_dd1d);
    let mut held: VecDeque<TcpStream> = VecDeque::new();
    let mut burst = 0u64;
    let keep = match kind {
        Kind::Silent => 300,
        _ => 32,
    };
    while !stop.load(Ordering::SeqCst) {
        let Some(addr) = *target.lock().unwrap() else {
            held.clear();
            std::thread::sleep(Duration::from_millis(2));
            continue;
        };
        // A short wait: a SYN dropped by a full accept queue must not stall
        // the flood (the kernel would resend it only after a second).
        let Ok(mut c) = TcpStream::connect_timeout(&addr, Duration::from_millis(50)) else {
            std::thread::sleep(Duration::from_millis(1));
            continue;
        };
        n.fetch_add(1, Ordering::Relaxed);
        let r = rng(&mut s);
        match kind {
            Kind::Closer if r % 2 == 0 => reset(c),
            Kind::Closer => drop(c),
            Kind::Garbage => {
                let _ = c.set_write_timeout(Some(Duration::from_millis(100)));
                let mut p: Vec<u8> = match r % 5 {
                    // Random bytes, 1 to 300 of them.
                    0 => (0..1 + r % 300).map(|_| rng(&mut s) as u8).collect(),
                    // An answer-sized frame of random bytes (fails the HMAC).
                    1 => 88u32.to_be_bytes().to_vec(),
                    // A length far above the bound.
                    2 => u32::MAX.to_be_bytes().to_vec(),
                    // A truncated frame: a plausible length and 10 bytes.
                    3 => 88u32.to_be_bytes().to_vec(),
                    // One byte.
                    _ => vec![0x42],
                };
                let body = match r % 5 {
                    1 => 88,
                    3 => 10,
                    _ => 0,
                };
                p.extend((0..body).map(|_| rng(&mut s) as u8));
                let _ = c.write_all(&p);
                if r % 5 == 3 || (r >> 8) % 4 == 0 {
                    held.push_back(c);
                }
            }
            Kind::Silent => held.push_back(c),
        }
        while held.len() > keep {
            held.pop_front();
        }
        // Bursts: 20 connections back to back, then a short pause.
        burst += 1;
        if burst % 20 == 0 {
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

/// One communicator of `RANKS` thread ranks: join, all-gather, barrier.
fn one_init(id: &bootstrap::id::UniqueId) -> Result<(), String> {
    let hs: Vec<_> = (0..RANKS)
        .map(|r| {
            let id = id.clone();
            std::thread::spawn(move || {
                let mut b = Bootstrap::join(&id, r, RANKS, 7, bootstrap::Params::default())
                    .map_err(|e| format!("rank {r}: {e}"))?;
                let all = b
                    .allgather(&[r as u8; 5], 16)
                    .map_err(|e| format!("rank {r} allgather: {e}"))?;
                for (k, v) in all.iter().enumerate() {
                    if v != &vec![k as u8; 5] {
                        return Err(format!("rank {r}: rank {k}'s blob is {v:?}"));
                    }
                }
                b.barrier().map_err(|e| format!("rank {r} barrier: {e}"))
            })
        })
        .collect();
    let errs: Vec<String> = hs
        .into_iter()
        .filter_map(|h| h.join().unwrap().err())
        .collect();
    if errs.is_empty() {
        Ok(())
    } else {
        Err(errs.join("; "))
    }
}

#[test]
fn root_flood() {
    let _serial = setup();
    let (w0, d0, r0) = logged();
    let dropped0 = gate::stats().dropped + gate::stats().evicted;
    let flood = Flood::start();
    let t0 = Instant::now();
    let mut failed = Vec::new();
    for i in 0..INITS {
        let id = bootstrap::new_root(bootstrap::Params::default()).expect("root");
        flood.aim(Some(id.root));
        // Let the flood reach the new root before the ranks do.
        std::thread::sleep(Duration::from_millis(20));
        if let Err(e) = one_init(&id) {
            eprintln!("init {i} failed: {e}");
            failed.push(i);
        }
    }
    let took = t0.elapsed();
    flood.aim(None);
    let connects = flood.stop();
    let st = gate::stats();
    let (w, d, r) = logged();
    let (warns, debug_drops, retries) = (w - w0, d - d0, r - r0);
    let dropped = st.dropped + st.evicted - dropped0;
    eprintln!(
        "{INITS} inits of {RANKS} ranks under a flood of {connects} connections took {took:?}; \
         {} of them failed; gates: {st:?}; {dropped} dropped, {warns} WARN lines, \
         {debug_drops} DEBUG drop lines, {retries} rank attempts retried",
        failed.len()
    );
    assert!(
        failed.is_empty(),
        "{} of {INITS} inits failed: {failed:?}",
        failed.len()
    );
    assert!(
        connects >= 1000,
        "the flood made only {connects} connections"
    );
    // The cap held, and the flood did fill a gate up to it.
    assert_eq!(st.peak_pending, gate::PENDING_CAP, "{st:?}");
    // Logs stay sane: each root logs its first drop and then at most one
    // summary a second, and one when it ends; each drop has a DEBUG line.
    let bound = 2 * INITS as u64 + took.as_secs() + 10;
    assert!(
        warns <= bound,
        "{warns} WARN lines for {dropped} drops (bound {bound})"
    );
    assert!(
        debug_drops >= dropped,
        "{debug_drops} DEBUG lines for {dropped} drops"
    );
}

#[test]
fn rank_listener_flood() {
    let _serial = setup();
    let id = bootstrap::new_root(bootstrap::Params::default()).expect("root");
    let (b0, b1) = std::thread::scope(|s| {
        let h0 = s.spawn(|| Bootstrap::join(&id, 0, 2, 7, bootstrap::Params::default()).unwrap());
        let h1 = s.spawn(|| Bootstrap::join(&id, 1, 2, 7, bootstrap::Params::default()).unwrap());
        (h0.join().unwrap(), h1.join().unwrap())
    });
    let (_, _, r0) = logged();
    let flood = Flood::start();
    let t0 = Instant::now();
    flood.aim(Some(b1.cards[1].addr));
    std::thread::sleep(Duration::from_millis(50));
    let mut failed = Vec::new();
    for i in 0..INITS as u8 {
        let dl = bootstrap::Params::default().deadline();
        let got = std::thread::scope(|s| {
            let send = s.spawn(|| {
                let mut c = b0.connect_to(b0.cards[1].addr, Purpose::Handoff, dl)?;
                frame::send(&mut c, &[i; 128], dl)
            });
            // The acceptor comes late, as in a shrink: the flood and the
            // real connection wait in the listener's backlog together.
            std::thread::sleep(Duration::from_millis(30));
            let recv = b1
                .accept_from(Purpose::Handoff, 0, dl)
                .and_then(|mut c| frame::recv(&mut c, 128, dl));
            (send.join().unwrap(), recv)
        });
        match got {
            (Ok(()), Ok(v)) if v == [i; 128] => {}
            other => {
                eprintln!("hand-over {i} failed: {other:?}");
                failed.push(i);
            }
        }
    }
    let took = t0.elapsed();
    flood.aim(None);
    let connects = flood.stop();
    eprintln!(
        "{INITS} hand-overs under a flood of {connects} connections took {took:?}; {} failed; \
         gates: {:?}; {} attempts retried",
        failed.len(),
        gate::stats(),
        logged().2 - r0
    );
    assert!(
        failed.is_empty(),
        "{} of {INITS} hand-overs failed: {failed:?}",
        failed.len()
    );
    assert!(
        connects >= 200,
        "the flood made only {connects} connections"
    );
    assert!(gate::stats().peak_pending <= gate::PENDING_CAP);
}
