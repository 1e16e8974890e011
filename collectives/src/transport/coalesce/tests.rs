//! Coalescing links over TCP loopback and over an in-memory byte stream.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::*;
use crate::transport::net::loopback_pair;

const LIMITS: Limits = Limits {
    max_pack: 4096,
    max_part: 512,
};

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31) ^ seed)
        .collect()
}

/// A TCP loopback pair of one channel, both ends coalescing.
fn tcp_pair() -> (Conn, Conn) {
    tcp_pair_with(LIMITS)
}

fn tcp_pair_with(limits: Limits) -> (Conn, Conn) {
    let (mut a, mut b) = loopback_pair(1).unwrap();
    (wrap(a.remove(0), 1, limits), wrap(b.remove(0), 0, limits))
}

/// Sends `packs` (groups of messages, each group one pack when small, or
/// one plain message) from `a`, and receives `recvs` (sizes in order) at
/// `b`, driving both until done or an error; the received messages.
fn run(a: &Conn, b: &Conn, packs: &[Vec<Vec<u8>>], recvs: &[usize]) -> Result<Vec<Vec<u8>>> {
    let deadline = Instant::now() + Duration::from_secs(30);
    let (mut si, mut sending, mut sent) = (0, false, 0);
    let mut got: Vec<Vec<u8>> = Vec::new();
    let (mut dst, mut filled) = (Vec::new(), 0);
    while si < packs.len() || got.len() < recvs.len() {
        assert!(Instant::now() < deadline, "the exchange hung");
        if si < packs.len() {
            let group = &packs[si];
            let limits = a.tx.packer().expect("coalescing link").limits();
            if group.len() == 1 && !limits.packs(group[0].len()) {
                // The unsent remainder (byte streams take pieces).
                sent += a.tx.try_send(&group[0][sent..])?;
                if sent == group[0].len() {
                    (si, sent) = (si + 1, 0);
                }
            } else {
                let p = a.tx.packer().expect("coalescing link");
                if !sending {
                    let parts: Vec<&[u8]> = group.iter().map(Vec::as_slice).collect();
                    p.start(&parts)?;
                    sending = true;
                }
                if let (_, Some(n)) = p.poll()? {
                    assert_eq!(n, group.len());
                    sending = false;
                    si += 1;
                }
            }
        }
        if got.len() < recvs.len() {
            let want = recvs[got.len()];
            if dst.len() != want {
                dst = vec![0u8; want];
            }
            filled += b.rx.try_recv_into(&mut dst[filled..])?;
            if filled == want {
                got.push(std::mem::take(&mut dst));
                filled = 0;
            }
        }
    }
    Ok(got)
}

#[test]
fn packs_keep_boundaries_and_order_over_tcp() {
    let (a, b) = tcp_pair();
    // Packs of several sizes, a plain message between them, and a pack
    // whose sub-messages are taken by receives after the next pack arrived.
    let packs = vec![
        vec![pattern(1, 1), pattern(7, 2), pattern(512, 3)],
        vec![pattern(5000, 4)],
        vec![pattern(3, 5)],
        vec![pattern(100, 6), pattern(200, 7)],
    ];
    let recvs: Vec<usize> = packs.iter().flatten().map(Vec::len).collect();
    let got = run(&a, &b, &packs, &recvs).unwrap();
    let want: Vec<Vec<u8>> = packs.into_iter().flatten().collect();
    assert_eq!(got, want);
}

#[test]
fn packs_above_the_eager_limit_wait_for_the_receiver() {
    let (a, b) = tcp_pair_with(Limits::from_bytes(64 << 10).unwrap());
    // 6 × 7000 B: a pack of 42 KiB, above EAGER_MAX, then a small one.
    let packs = vec![
        (0..6).map(|i| pattern(7000, i)).collect::<Vec<_>>(),
        vec![pattern(9, 9)],
    ];
    assert!(pack::encoded_len(6, 42_000) > EAGER_MAX);
    let recvs: Vec<usize> = packs.iter().flatten().map(Vec::len).collect();
    let got = run(&a, &b, &packs, &recvs).unwrap();
    assert_eq!(got, packs.into_iter().flatten().collect::<Vec<_>>());
}

#[test]
fn a_receive_of_another_size_is_invalid_usage() {
    let usage = |r: Result<Vec<Vec<u8>>>| match r {
        Err(Error::InvalidUsage(m)) => assert!(m.contains("mismatched"), "{m}"),
        other => panic!("expected ncclInvalidUsage, got {other:?}"),
    };
    // A sub-message of 7 bytes where 8 are expected.
    let (a, b) = tcp_pair();
    usage(run(&a, &b, &[vec![pattern(7, 0)]], &[8]));
    // Sub-messages left over where a large message is expected.
    let (a, b) = tcp_pair();
    usage(run(
        &a,
        &b,
        &[vec![pattern(7, 0), pattern(9, 0)], vec![pattern(600, 0)]],
        &[7, 600],
    ));
    // A plain message where the size says a pack.
    let (mut a, mut b) = loopback_pair(1).unwrap();
    let (a, b) = (a.remove(0), wrap(b.remove(0), 0, LIMITS));
    let deadline = Instant::now() + Duration::from_secs(30);
    let msg = pattern(20, 0);
    let mut dst = [0u8; 20];
    let r = loop {
        let _ = a.tx.try_send(&msg);
        match b.rx.try_recv_into(&mut dst) {
            Ok(0) => assert!(Instant::now() < deadline, "hung"),
            r => break r,
        }
    };
    assert!(matches!(r, Err(Error::InvalidUsage(_))), "{r:?}");
}

#[test]
fn a_malformed_pack_is_a_remote_error() {
    // Each goes out from a plain link to a coalescing receiver that
    // expects a 4-byte message.
    let mut bad: Vec<Vec<u8>> = Vec::new();
    let mut good = Vec::new();
    pack::encode(&[b"abcd"], &mut good);
    let mut count = good.clone();
    count[4..8].copy_from_slice(&1000u32.to_le_bytes());
    bad.push(count);
    let mut len = good.clone();
    len[12..16].copy_from_slice(&u32::MAX.to_le_bytes());
    bad.push(len);
    let mut huge = Vec::new();
    pack::encode(&[&[1u8; 600]], &mut huge);
    bad.push(huge);
    for msg in bad {
        let (mut a, mut b) = loopback_pair(1).unwrap();
        let (a, b) = (a.remove(0), wrap(b.remove(0), 0, LIMITS));
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut dst = [0u8; 4];
        let r = loop {
            let _ = a.tx.try_send(&msg);
            match b.rx.try_recv_into(&mut dst) {
                Ok(0) => assert!(Instant::now() < deadline, "hung"),
                r => break r,
            }
        };
        assert!(
            matches!(&r, Err(Error::Remote(m)) if m.contains("malformed pack")),
            "{r:?}"
        );
    }
}

/// One direction of an in-memory byte stream that takes at most 3 bytes
/// and hands out 1 per call, as a slow shm ring could.
#[derive(Debug, Default, Clone)]
struct Trickle(Arc<Mutex<VecDeque<u8>>>);

impl SendLink for Trickle {
    fn try_send(&self, src: &[u8]) -> Result<usize> {
        let mut q = self.0.lock();
        let n = src.len().min(3);
        q.extend(&src[..n]);
        Ok(n)
    }
    fn wait_source(&self) -> WaitSource {
        WaitSource::Poll
    }
    fn close(&self) {}
}

impl RecvLink for Trickle {
    fn try_recv_with(&self, max: usize, _: usize, f: &mut dyn FnMut(&[u8])) -> Result<usize> {
        let mut q = self.0.lock();
        match q.pop_front() {
            Some(b) if max > 0 => {
                f(&[b]);
                Ok(1)
            }
            Some(b) => {
                q.push_front(b);
                Ok(0)
            }
            None => Ok(0),
        }
    }
    fn wait_source(&self) -> WaitSource {
        WaitSource::Poll
    }
    fn close(&self) {}
}

#[test]
fn packs_cross_a_byte_stream_in_pieces() {
    let t = Trickle::default();
    let conn = || Conn {
        tx: Box::new(t.clone()),
        rx: Box::new(t.clone()),
        transport: TransportKind::Shm,
    };
    let (a, b) = (wrap(conn(), 1, LIMITS), wrap(conn(), 0, LIMITS));
    let packs = vec![
        vec![pattern(1, 9), pattern(300, 8)],
        vec![pattern(2000, 7)],
        vec![pattern(12, 6)],
    ];
    let recvs: Vec<usize> = packs.iter().flatten().map(Vec::len).collect();
    let got = run(&a, &b, &packs, &recvs).unwrap();
    assert_eq!(got, packs.into_iter().flatten().collect::<Vec<_>>());
}

#[test]
fn limits_and_agreement() {
    assert_eq!(Limits::from_bytes(0), None);
    let l = Limits::from_bytes(65536).unwrap();
    assert_eq!(l.max_part, 8192);
    assert!(!l.packs(0) && l.packs(1) && l.packs(8192) && !l.packs(8193));
    let card = |rank: u32, coalesce: u32| Card {
        rank,
        nranks: 2,
        host_hash: 1,
        pid: 1,
        proc_nonce: 1,
        coalesce,
        addr: "127.0.0.1:9".parse().unwrap(),
        checks: false,
        compress: hetccl_core::config::Compression::Off,
    };
    assert_eq!(agree(&[card(0, 65536), card(1, 65536)], 65536, 1), Some(l));
    assert_eq!(agree(&[card(0, 65536), card(1, 4096)], 65536, 0), None);
    assert_eq!(agree(&[card(0, 0), card(1, 0)], 0, 0), None);
    // A sender refuses what breaks the rule.
    let (a, _b) = tcp_pair();
    let p = a.tx.packer().unwrap();
    assert!(p.start(&[]).is_err());
    assert!(p.start(&[&[0u8; 513]]).is_err());
    assert!(p.start(&[&[0u8; 400][..]; 11]).is_err());
    p.start(&[&[0u8; 10]]).unwrap();
    assert!(p.start(&[&[0u8; 10]]).is_err(), "a second pack in flight");
    assert!(a.tx.try_send(&[0u8; 1000]).is_err(), "plain while packing");
}

/// A coalescing link's waits are its inner link's: a receive that waits
/// for the next pack sleeps on the TCP socket (not in a nap), and one
/// with sub-messages of a pack left over does not wait on it.
#[test]
fn waits_go_to_the_inner_links_sockets() {
    let (a, b) = tcp_pair();
    let mut dst = [0u8; 7];
    assert_eq!(b.rx.try_recv_into(&mut dst).unwrap(), 0, "nothing sent yet");
    let mut fds = Vec::new();
    assert!(
        b.rx.wait_fds(&mut fds),
        "a receive in flight waits on its socket"
    );
    assert!(!fds.is_empty(), "the socket to wait on");
    let (one, two) = (pattern(7, 1), pattern(9, 2));
    let p = a.tx.packer().expect("coalescing link");
    p.start(&[&one, &two]).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while p.poll().unwrap().1.is_none() {
        assert!(Instant::now() < deadline, "the pack was not sent");
    }
    while b.rx.try_recv_into(&mut dst).unwrap() == 0 {
        assert!(Instant::now() < deadline, "the pack did not arrive");
    }
    assert_eq!(dst[..], one[..]);
    let mut fds = Vec::new();
    assert!(
        !b.rx.wait_fds(&mut fds),
        "a sub-message left over is ready: nothing to wait for"
    );
}
