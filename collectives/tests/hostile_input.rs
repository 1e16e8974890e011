//! Hostile input at live ports.
//!
//! - The bootstrap root that `ncclGetUniqueId` started: connections send
//!   random bytes, truncated and oversized length fields, or nothing at all
//!   (8 silent connections stay open while the ranks join), and a stranger
//!   holding an id with the right address but a different secret tries to
//!   join. The stranger must be refused, and the three real ranks must
//!   initialise quickly (the root admits connections concurrently).
//! - The TCP data listeners of the net transport (`transport/net.rs`). They
//!   exist only during init (each rank listens once per TCP peer, and the
//!   listeners are dropped once the links are up), so they are attacked
//!   during init: a `tracing` layer sees the transport's "listening on"
//!   event, which the listening thread emits before it hands out the handle,
//!   and fills the new listener's backlog with garbage, truncated hellos,
//!   oversized fields, wrong nonces and silent connections, before any real
//!   peer can connect. Init must succeed, the listeners must be closed
//!   afterwards, and AllReduce must be exact.
//! - The net plugin's listen port (`nccl_net_plugin::tcp::TcpNet`), with a real
//!   connect in between the attacks: exactly one comm comes out of accept,
//!   and it moves exact data.
//!
//! The process runs with `NCCL_SHM_DISABLE=1`, so the thread ranks talk
//! over TCP on loopback. The tests run one at a time (a lock).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::ptr::null_mut;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex, MutexGuard, Once};
use std::time::{Duration, Instant};

use hetccl_abi::{ncclComm_t, ncclUniqueId};
use hetccl_collectives::api::coll::*;
use hetccl_collectives::api::comm_init::*;
use hetccl_collectives::api::comm_life::*;
use hetccl_collectives::bootstrap::id::UniqueId;
use nccl_net_plugin::tcp::{RecvBuf, TcpNet, TcpOptions};
use nccl_net_plugin::wire::{decode_handle, encode_hello, Hello, SockRole, HELLO_BYTES};
use tracing::field::{Field, Visit};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};

const FLOAT: i32 = 7;
const SUM: i32 = 0;

#[derive(Clone, Copy)]
struct Comm(ncclComm_t);
// SAFETY: a comm handle may be used from any thread, one at a time.
unsafe impl Send for Comm {}

/// xorshift, so that the garbage is the same on every run.
fn rng(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

/// The payloads thrown at the root, one connection each.
fn payloads() -> Vec<Vec<u8>> {
    let mut s = 0x9e37_79b9_7f4a_7c15u64;
    let mut v: Vec<Vec<u8>> = (0..24)
        .map(|i| {
            let n = [0, 1, 3, 4, 7, 8, 31, 32, 33, 64, 200, 4096][i % 12];
            (0..n).map(|_| rng(&mut s) as u8).collect()
        })
        .collect();
    // Length prefixes far above any bound, both byte orders, then a few bytes.
    for len in [u32::MAX, 1 << 31, 1 << 24, 65_537] {
        let mut p = len.to_be_bytes().to_vec();
        p.extend_from_slice(b"abc");
        v.push(p);
        let mut p = len.to_le_bytes().to_vec();
        p.extend_from_slice(b"abc");
        v.push(p);
    }
    v.push(u64::MAX.to_be_bytes().to_vec());
    v
}

/// Sends `p`, half-closes, and reads whatever comes back, all bounded.
fn throw(addr: std::net::SocketAddr, p: &[u8]) {
    let Ok(mut s) = TcpStream::connect_timeout(&addr, Duration::from_secs(2)) else {
        return;
    };
    let _ = s.set_read_timeout(Some(Duration::from_millis(300)));
    let _ = s.set_write_timeout(Some(Duration::from_millis(300)));
    let _ = s.write_all(p);
    let _ = s.shutdown(std::net::Shutdown::Write);
    let mut sink = [0u8; 256];
    let _ = s.read(&mut sink);
}

// ------------------------------------------------------------ set-up

/// Serialises the tests of this file (the listen hook is process-wide).
fn setup() -> MutexGuard<'static, ()> {
    static ONCE: Once = Once::new();
    static SERIAL: Mutex<()> = Mutex::new(());
    ONCE.call_once(|| {
        std::env::set_var("HETCCL_SOCKET_IFNAME", "lo");
        std::env::set_var("HETCCL_TIMEOUT_S", "30");
        // Thread ranks talk over TCP, so the net transport's listeners exist.
        std::env::set_var("NCCL_SHM_DISABLE", "1");
        // Before hetccl's first call, so that hetccl keeps this subscriber.
        tracing::subscriber::set_global_default(tracing_subscriber::registry().with(ListenHook))
            .expect("no subscriber yet");
    });
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn unique_id() -> ncclUniqueId {
    let mut raw = ncclUniqueId::default();
    // SAFETY: a valid out-pointer.
    assert_eq!(unsafe { ncclGetUniqueId(&mut raw) }, 0);
    raw
}

/// Initialises `n` thread ranks of the comm `raw`; returns them and the
/// slowest init's time.
fn init_comms(raw: ncclUniqueId, n: usize) -> (Vec<Comm>, Duration) {
    let t0 = Instant::now();
    let comms = std::thread::scope(|s| {
        let hs: Vec<_> = (0..n)
            .map(|r| {
                s.spawn(move || {
                    let mut c: ncclComm_t = null_mut();
                    // SAFETY: valid pointers.
                    let rc = unsafe { ncclCommInitRank(&mut c, n as i32, raw, r as i32) };
                    assert_eq!(rc, 0, "rank {r} init");
                    Comm(c)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    (comms, t0.elapsed())
}

/// Each comm has `n` members and its own rank, AllReduce is exact for
/// every count, and every comm is destroyed.
fn check_and_destroy(comms: Vec<Comm>, counts: &[usize]) {
    let n = comms.len();
    std::thread::scope(|s| {
        for (r, c) in comms.iter().copied().enumerate() {
            s.spawn(move || {
                let c = c;
                let (mut cnt, mut me) = (0, -1);
                // SAFETY: a live comm and valid out-pointers.
                unsafe {
                    assert_eq!(ncclCommCount(c.0, &mut cnt), 0);
                    assert_eq!(ncclCommUserRank(c.0, &mut me), 0);
                }
                assert_eq!((cnt as usize, me), (n, r as i32));
                for &count in counts {
                    let mut buf: Vec<f32> =
                        (0..count).map(|i| (r * 1000 + i % 4096) as f32).collect();
                    // SAFETY: in-place AllReduce of `count` floats.
                    let rc = unsafe {
                        ncclAllReduce(
                            buf.as_ptr().cast(),
                            buf.as_mut_ptr().cast(),
                            count,
                            FLOAT,
                            SUM,
                            c.0,
                            null_mut(),
                        )
                    };
                    assert_eq!(rc, 0, "AllReduce of {count}");
                    let base: usize = (0..n).map(|k| k * 1000).sum();
                    for (i, x) in buf.iter().enumerate() {
                        assert_eq!(
                            *x,
                            (base + n * (i % 4096)) as f32,
                            "count {count} element {i}"
                        );
                    }
                }
            });
        }
    });
    for c in comms {
        // SAFETY: a live comm, destroyed once.
        assert_eq!(unsafe { ncclCommDestroy(c.0) }, 0);
    }
}

// ------------------------------------------- attacks on net listeners

/// Whether the listen hook attacks new net listeners.
static ARMED: AtomicBool = AtomicBool::new(false);
/// Connections the hook keeps open (silent, or a truncated hello).
static HELD: Mutex<Vec<TcpStream>> = Mutex::new(Vec::new());
/// Every listener the hook attacked, with the connections that got in.
static ATTACKED: Mutex<Vec<(SocketAddr, usize)>> = Mutex::new(Vec::new());

/// A `tracing` layer that attacks every net listener when it announces
/// itself (`hetccl::NET` "listening on <addr> (<dev>)"), while [`ARMED`].
struct ListenHook;

struct Msg(String);

impl Visit for Msg {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            self.0 = format!("{value:?}");
        }
    }
}

impl<S: tracing::Subscriber> Layer<S> for ListenHook {
    fn on_event(&self, event: &tracing::Event<'_>, _: Context<'_, S>) {
        if !ARMED.load(Ordering::SeqCst) || event.metadata().target() != "hetccl::NET" {
            return;
        }
        let mut m = Msg(String::new());
        event.record(&mut m);
        let Some(addr) =
            m.0.strip_prefix("listening on ")
                .and_then(|r| r.split(' ').next())
                .and_then(|a| a.parse::<SocketAddr>().ok())
        else {
            return;
        };
        let (landed, held) = attack_net_listener(addr, None);
        lock(&HELD).extend(held);
        lock(&ATTACKED).push((addr, landed));
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A hello in the net transport's format (32 bytes).
fn hello(nonce: u64, comm_id: u64, role: SockRole, nsocks: u16) -> [u8; HELLO_BYTES] {
    encode_hello(&Hello {
        nonce,
        comm_id,
        role,
        nsocks,
    })
}

/// What is thrown at a net listener: (bytes, keep the connection open).
/// With the listener's `nonce` (a leaked handle), also hellos that pass the
/// nonce check but never make a complete comm.
fn net_payloads(nonce: Option<u64>) -> Vec<(Vec<u8>, bool)> {
    let mut s = 0x2545_f491_4f6c_dd1du64;
    let mut v: Vec<(Vec<u8>, bool)> = [0, 1, 7, 31, 32, 33, 64, 4096]
        .iter()
        .map(|&n| ((0..n).map(|_| rng(&mut s) as u8).collect(), false))
        .collect();
    let wrong = 0x0bad_0bad_0bad_0badu64;
    let ctrl = hello(wrong, 1, SockRole::Ctrl, 2);
    // Truncated hellos: closed, and held open.
    v.push((ctrl[..16].to_vec(), false));
    v.push((ctrl[..20].to_vec(), true));
    // Wrong nonces, well formed; one followed by a flood.
    v.push((ctrl.to_vec(), false));
    v.push((hello(wrong, 1, SockRole::Data(1), 2).to_vec(), true));
    let mut flood = ctrl.to_vec();
    flood.extend((0..4096).map(|_| rng(&mut s) as u8));
    v.push((flood, false));
    // Oversized and inconsistent fields: nsocks 0xffff and MAX_SOCKS + 1,
    // a data index beyond nsocks, an unknown role, a wrong version, and
    // non-zero reserved bytes.
    let edits: [(usize, &[u8]); 6] = [
        (8, &[0xff, 0xff]),
        (8, &[65, 0]),
        (5, &[1, 9, 0]),
        (5, &[9]),
        (4, &[2]),
        (12, &[1]),
    ];
    for (at, bytes) in edits {
        let mut h = ctrl;
        h[at..at + bytes.len()].copy_from_slice(bytes);
        v.push((h.to_vec(), false));
    }
    // Length prefixes far above any bound.
    for len in [u32::MAX, 1 << 31] {
        v.push((len.to_be_bytes().to_vec(), false));
        v.push((len.to_le_bytes().to_vec(), false));
    }
    // Silent connections.
    for _ in 0..4 {
        v.push((Vec::new(), true));
    }
    if let Some(n) = nonce {
        // The right nonce: a control socket whose data sockets never come,
        // a data socket twice, and a socket count that disagrees.
        v.push((hello(n, 77, SockRole::Ctrl, 2).to_vec(), true));
        v.push((hello(n, 78, SockRole::Data(0), 2).to_vec(), true));
        v.push((hello(n, 78, SockRole::Data(0), 2).to_vec(), true));
        v.push((hello(n, 78, SockRole::Ctrl, 3).to_vec(), true));
    }
    v
}

/// Throws [`net_payloads`] at `addr`, one connection each, without reading
/// (the listener may not be accepting yet). Returns how many connected,
/// and the connections to keep open.
fn attack_net_listener(addr: SocketAddr, nonce: Option<u64>) -> (usize, Vec<TcpStream>) {
    let mut landed = 0;
    let mut held = Vec::new();
    for (bytes, keep) in net_payloads(nonce) {
        let Ok(mut s) = TcpStream::connect_timeout(&addr, Duration::from_secs(1)) else {
            continue;
        };
        landed += 1;
        let _ = s.set_write_timeout(Some(Duration::from_millis(300)));
        let _ = s.write_all(&bytes);
        if keep {
            held.push(s);
        } else {
            let _ = s.shutdown(std::net::Shutdown::Write);
        }
    }
    (landed, held)
}

#[test]
fn garbage_at_the_tcp_data_listeners_during_init() {
    let _serial = setup();
    lock(&ATTACKED).clear();
    let raw = unique_id();
    ARMED.store(true, Ordering::SeqCst);
    let (comms, took) = init_comms(raw, 3);
    ARMED.store(false, Ordering::SeqCst);
    let held = std::mem::take(&mut *lock(&HELD));
    let attacked = std::mem::take(&mut *lock(&ATTACKED));
    eprintln!(
        "init of 3 ranks with {} attacked data listeners took {took:?}",
        attacked.len()
    );
    // 3 ranks, each listening once per TCP peer: 6 listeners, each attacked
    // before its handle went out (if this fails with 0, the transport's
    // "listening on" debug event changed and the hook no longer sees it).
    assert_eq!(attacked.len(), 6, "{attacked:?}");
    let want = net_payloads(None).len();
    for (a, landed) in &attacked {
        assert_eq!(*landed, want, "connections that reached {a}");
    }
    assert!(took < Duration::from_secs(20), "init took {took:?}");
    drop(held);
    // The listeners are gone once init is over.
    for (a, _) in &attacked {
        assert!(
            TcpStream::connect_timeout(a, Duration::from_secs(1)).is_err(),
            "{a} still accepts connections after init"
        );
    }
    check_and_destroy(comms, &[1, 1021, 262_147]);
}

#[test]
fn garbage_at_the_net_plugin_listen_port() {
    let _serial = setup();
    let dev = nccl_net_plugin::iface::NetDevice {
        name: "lo".into(),
        addr: "127.0.0.1".parse().unwrap(),
        speed_mbps: 10_000,
        pci_path: None,
        loopback: true,
    };
    let opts = TcpOptions {
        nsocks: 2,
        nthreads: 1,
        timeout: Duration::from_secs(10),
        ..TcpOptions::default()
    };
    let net = TcpNet::new(Arc::new(vec![dev]), opts);
    let (mut l, mut handle) = net.listen(0).expect("listen");
    let info = decode_handle(&handle).expect("our handle");
    // Garbage before the real connect, and more from another thread while
    // it connects.
    let (landed, mut held) = attack_net_listener(info.addr, Some(info.nonce));
    assert_eq!(landed, net_payloads(Some(info.nonce)).len());
    let addr = info.addr;
    let noise = std::thread::spawn(move || {
        // Without waiting for replies (the listener never sends any).
        for p in payloads() {
            if let Ok(mut c) = TcpStream::connect_timeout(&addr, Duration::from_secs(1)) {
                let _ = c.set_write_timeout(Some(Duration::from_millis(300)));
                let _ = c.write_all(&p);
            }
        }
        attack_net_listener(addr, None).1
    });
    let (mut s, mut r) = (None, None);
    let t0 = Instant::now();
    while s.is_none() || r.is_none() {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "connect/accept hung"
        );
        if s.is_none() {
            s = net.connect(0, &mut handle).expect("connect");
        }
        if r.is_none() {
            r = net.accept(&mut l).expect("accept survives garbage");
        }
    }
    held.extend(noise.join().unwrap());
    // No stranger becomes a comm, however long accept is polled.
    let t1 = Instant::now();
    while t1.elapsed() < Duration::from_millis(500) {
        assert!(
            net.accept(&mut l).expect("accept").is_none(),
            "a stranger became a comm"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let (s, r) = (s.unwrap(), r.unwrap());
    assert_eq!((s.nsocks(), r.nsocks()), (2, 2));
    // The real connection moves exact data, small and large.
    for (k, len) in [5usize, 1 << 20, (4 << 20) + 3].into_iter().enumerate() {
        let src: Vec<u8> = (0..len).map(|i| (i * 31 + k) as u8).collect();
        let mut dst = vec![0u8; len + 64];
        // SAFETY: `dst` outlives the request, which is driven to completion.
        let rq = unsafe {
            r.irecv(
                &[RecvBuf {
                    ptr: dst.as_mut_ptr(),
                    cap: dst.len(),
                    tag: 3,
                }],
                false,
            )
        }
        .expect("irecv")
        .expect("posted");
        // SAFETY: `src` outlives the request, which is driven to completion.
        let sq = unsafe { s.isend(src.as_ptr(), len, 3) }
            .expect("isend")
            .expect("posted");
        let (mut got, mut sent) = (None, None);
        let t2 = Instant::now();
        while got.is_none() || sent.is_none() {
            assert!(t2.elapsed() < Duration::from_secs(20), "transfer hung");
            if sent.is_none() {
                sent = s.test(sq).expect("send");
            }
            if got.is_none() {
                got = r.test(rq).expect("recv").map(|v| v.to_vec());
            }
        }
        assert_eq!((sent, got), (Some(len), Some(vec![len])));
        assert!(dst[..len] == src[..], "payload of {len} bytes differs");
        assert!(dst[len..].iter().all(|&b| b == 0), "written past {len}");
    }
    drop(held);
}

// ------------------------------------------------ attacks on the root

#[test]
fn garbage_and_wrong_secrets_at_a_live_root() {
    let _serial = setup();
    let raw = unique_id();
    let id = UniqueId::decode(&raw).expect("our own id decodes");
    let root = id.root;

    // Before anyone joins.
    for p in payloads() {
        throw(root, &p);
    }
    // Silent connections, held open while the ranks join: the root admits
    // concurrently, each with its own 5 s authentication deadline, so they
    // must not delay the real ranks (one at a time, they took 8 × 5 s).
    let idle: Vec<TcpStream> = (0..8)
        .filter_map(|_| TcpStream::connect_timeout(&root, Duration::from_secs(2)).ok())
        .collect();
    assert_eq!(idle.len(), 8);

    // A stranger: the right address, a different secret.
    let mut forged = id.clone();
    forged.secret[0] ^= 0x5a;
    let forged_raw = forged.encode();
    let (tx, rx) = mpsc::channel();
    let stranger = std::thread::spawn(move || {
        let mut c: ncclComm_t = null_mut();
        // SAFETY: valid pointers.
        let r = unsafe { ncclCommInitRank(&mut c, 3, forged_raw, 1) };
        let _ = tx.send(r);
    });

    // Garbage during the joins, from another thread.
    let noise = std::thread::spawn(move || {
        for p in payloads().iter().rev() {
            throw(root, p);
        }
    });

    let (comms, took) = init_comms(raw, 3);
    eprintln!("init of 3 ranks with 8 silent connections at the root took {took:?}");
    assert!(
        took < Duration::from_secs(10),
        "init took {took:?} with 8 silent connections at the root"
    );
    noise.join().unwrap();
    drop(idle);

    // The stranger is refused (with an error, never success) in bounded time.
    let r = rx
        .recv_timeout(Duration::from_secs(40))
        .expect("the stranger's init returned");
    assert_ne!(r, 0, "a rank with a forged secret joined");
    stranger.join().unwrap();

    check_and_destroy(comms, &[1021]);
}
