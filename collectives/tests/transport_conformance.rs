//! One conformance suite, run over every transport: each transport's test
//! module instantiates the same tests with its own connected pair.

use std::sync::Arc;
use std::time::{Duration, Instant};

use hetccl_collectives::transport::{arena::Arena, shm, tcp, Conn};

/// A connected pair and whatever keeps it alive.
struct Pair {
    a: Conn,
    b: Conn,
}

fn shm_pair() -> Pair {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let path = format!(
        "/dev/shm/hetccl-conformance-{}-{}",
        std::process::id(),
        N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    );
    let arena = Arc::new(Arena::create(&path, 2, 1, 1 << 16).unwrap());
    Arena::unlink(&path);
    Pair {
        a: shm::connect(&arena, 0, 1, 0),
        b: shm::connect(&arena, 1, 0, 0),
    }
}

fn tcp_pair() -> Pair {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let s = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
    let (t, _) = l.accept().unwrap();
    Pair {
        a: tcp::connect(s).unwrap(),
        b: tcp::connect(t).unwrap(),
    }
}

fn deadline() -> Instant {
    Instant::now() + Duration::from_secs(30)
}

/// Sends all of `data` (spinning), failing at the deadline.
fn send_all(c: &Conn, data: &[u8], piece: usize) {
    let dl = deadline();
    let mut off = 0;
    while off < data.len() {
        let end = (off + piece).min(data.len());
        off += c.tx.try_send(&data[off..end]).unwrap();
        assert!(Instant::now() < dl, "send stalled at {off}");
    }
}

/// Receives exactly `n` bytes in pieces of at most `piece`.
fn recv_n(c: &Conn, n: usize, piece: usize, elem: usize) -> Vec<u8> {
    let dl = deadline();
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        let want = (n - out.len()).min(piece);
        let got =
            c.rx.try_recv_with(want, elem, &mut |s| {
                assert_eq!(s.len() % elem, 0, "only whole elements");
                out.extend_from_slice(s);
            })
            .unwrap();
        assert!(got <= want, "never more than asked for");
        assert!(Instant::now() < dl, "recv stalled at {}", out.len());
    }
    out
}

fn ordered_stream(p: Pair) {
    let data: Vec<u8> = (0..5_000_003u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8)
        .collect();
    std::thread::scope(|s| {
        s.spawn(|| send_all(&p.a, &data, 77_777));
        let got = recv_n(&p.b, data.len(), 50_021, 1);
        assert!(got == data, "bytes arrive in order and intact");
    });
}

fn both_directions_at_once(p: Pair) {
    // Larger than any buffer in between: deadlocks unless both sides progress.
    let n = 3 << 20;
    let x: Vec<u8> = (0..n).map(|i| (i % 253) as u8).collect();
    let y: Vec<u8> = (0..n).map(|i| (i % 241) as u8).collect();
    std::thread::scope(|s| {
        s.spawn(|| {
            let dl = deadline();
            let (mut off, mut got) = (0, Vec::new());
            while off < n || got.len() < n {
                if off < n {
                    off += p.a.tx.try_send(&x[off..]).unwrap();
                }
                p.a.rx
                    .try_recv_with(n - got.len(), 1, &mut |s| got.extend_from_slice(s))
                    .unwrap();
                assert!(Instant::now() < dl);
            }
            assert!(got == y);
        });
        let dl = deadline();
        let (mut off, mut got) = (0, Vec::new());
        while off < n || got.len() < n {
            if off < n {
                off += p.b.tx.try_send(&y[off..]).unwrap();
            }
            p.b.rx
                .try_recv_with(n - got.len(), 1, &mut |s| got.extend_from_slice(s))
                .unwrap();
            assert!(Instant::now() < dl);
        }
        assert!(got == x);
    });
}

fn message_boundaries_and_elements(p: Pair) {
    // Two messages back to back: 3 bytes, then 1000 8-byte elements. The
    // receiver asks for exactly each message; nothing of the second may be
    // handed to the first, and the second arrives in whole elements even
    // though it starts misaligned in the stream.
    let m1 = [1u8, 2, 3];
    let m2: Vec<u8> = (0..8000u32).map(|i| i as u8).collect();
    std::thread::scope(|s| {
        s.spawn(|| {
            send_all(&p.a, &m1, 3);
            send_all(&p.a, &m2, 999);
        });
        assert_eq!(recv_n(&p.b, 3, 3, 1), m1);
        assert_eq!(recv_n(&p.b, 8000, 8000, 8), m2);
    });
}

fn zero_length_and_empty_polls(p: Pair) {
    assert_eq!(p.a.tx.try_send(&[]).unwrap(), 0);
    assert_eq!(
        p.b.rx
            .try_recv_with(16, 1, &mut |_| panic!("nothing was sent"))
            .unwrap(),
        0
    );
    send_all(&p.a, b"x", 1);
    assert_eq!(recv_n(&p.b, 1, 1, 1), b"x");
}

fn close_is_seen_by_the_peer(p: Pair) {
    p.a.tx.close();
    let dl = deadline();
    loop {
        match p.b.rx.try_recv_with(16, 1, &mut |_| {}) {
            Err(_) => break,
            Ok(_) => assert!(Instant::now() < dl, "peer never saw the close"),
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

macro_rules! conformance {
    ($name:ident, $make:expr) => {
        mod $name {
            use super::*;
            #[test]
            fn ordered_stream() {
                super::ordered_stream($make);
            }
            #[test]
            fn both_directions_at_once() {
                super::both_directions_at_once($make);
            }
            #[test]
            fn message_boundaries_and_elements() {
                super::message_boundaries_and_elements($make);
            }
            #[test]
            fn zero_length_and_empty_polls() {
                super::zero_length_and_empty_polls($make);
            }
            #[test]
            fn close_is_seen_by_the_peer() {
                super::close_is_seen_by_the_peer($make);
            }
        }
    };
}

conformance!(shm_transport, shm_pair());
conformance!(tcp_transport, tcp_pair());
