//! Tests of closing on a real RDMA port (Soft-RoCE in
//! `scripts/rdma-vm.sh`): what a close delivers, how long it waits, and
//! what a comm does once its peer has closed. Without a port they say so
//! and pass, unless `HETCCL_REQUIRE_RDMA=1`.

use std::time::{Duration, Instant};

use super::tests::{failure_within, pair, pattern};
use super::*;
use crate::tcp::{RecvBuf, RecvRequest};

/// Posts a receive of tag `tag` into `b`.
///
/// # Safety
/// `b` must stay valid until the request completes or fails, or `r` drops.
unsafe fn post_recv(r: &IbRecvComm, b: &mut [u8], tag: i32) -> RecvRequest {
    let rb = RecvBuf {
        ptr: b.as_mut_ptr(),
        cap: b.len(),
        tag,
    };
    // SAFETY: the caller keeps `b` valid as long as the request needs it.
    unsafe { r.irecv(&[rb], &[None]) }.unwrap().unwrap()
}

/// Five small messages of tag 2, each sent eagerly (unsignaled) and
/// complete at once.
fn send_small(s: &IbSendComm) -> Vec<Vec<u8>> {
    let msgs: Vec<Vec<u8>> = (0..5).map(|i| pattern(10 + i, i as u8)).collect();
    for m in &msgs {
        // SAFETY: `msgs` outlives the requests (eager: done at post).
        let q = unsafe { s.isend(m.as_ptr(), m.len(), 2, None) }
            .unwrap()
            .unwrap();
        assert_eq!(s.test(q).unwrap(), Some(m.len()));
    }
    msgs
}

/// Receives `msgs` (tag 2) one at a time and checks every byte.
fn receive_small(r: &IbRecvComm, msgs: &[Vec<u8>]) {
    for m in msgs {
        let mut b = vec![0u8; 64];
        // SAFETY: `b` outlives the request (waited for below).
        let q = unsafe { post_recv(r, &mut b, 2) };
        let t0 = Instant::now();
        let n = loop {
            assert!(t0.elapsed() < Duration::from_secs(30), "not delivered");
            if let Some(sz) = r.test(q).unwrap() {
                break sz[0];
            }
        };
        assert_eq!(&b[..n], &m[..]);
    }
}

/// A few small sends (all unsignaled), then close: the close flushes them
/// so they are delivered before the QP goes.
#[test]
fn unsignaled_sends_before_close_are_delivered() {
    let Some((s, r)) = pair(IbOptions::default()) else {
        return;
    };
    let msgs = send_small(&s);
    s.close();
    receive_small(&r, &msgs);
}

/// A sender whose five small messages were all received, and whose peer
/// then closed (its QP gone): a flush of the sender's is left in flight
/// that nothing will acknowledge.
fn sender_after_the_peer_closed() -> Option<IbSendComm> {
    let (s, r) = pair(IbOptions::default())?;
    let msgs = send_small(&s);
    receive_small(&r, &msgs);
    r.close();
    Some(s)
}

/// The sender's close ends when it sees the peer's setup socket close,
/// not when the QP's retries (about 30 s) or the close's time limit
/// (10 s) run out.
#[test]
fn a_close_after_the_peer_closed_does_not_wait_for_acks() {
    let Some(s) = sender_after_the_peer_closed() else {
        return;
    };
    let t0 = Instant::now();
    s.close();
    let took = t0.elapsed();
    assert!(
        took < Duration::from_secs(5),
        "the sender's close took {took:?} after its peer had closed"
    );
}

/// The engine finishes a connection's send comm once per channel. After a
/// first finish that stopped on the peer's close with a flush still in
/// flight, the later ones return at once instead of waiting for the
/// deadline with no socket left to see the peer go.
#[test]
fn a_second_finish_after_the_peer_closed_returns_at_once() {
    let Some(s) = sender_after_the_peer_closed() else {
        return;
    };
    let t0 = Instant::now();
    for _ in 0..3 {
        s.finish(Instant::now() + Duration::from_secs(20));
    }
    let took = t0.elapsed();
    assert!(
        took < Duration::from_secs(5),
        "three finishes took {took:?} after the peer had closed"
    );
}

/// The receiver sees its peer's setup socket close while a receive is
/// open, and the message comes after that (as the completion of a message
/// the peer sent before closing may): the receive still completes, within
/// the close grace. A receive nothing will satisfy then fails, soon.
#[test]
fn a_message_landing_after_the_peers_close_is_still_received() {
    let Some((s, r)) = pair(IbOptions::default()) else {
        return;
    };
    let mut b = vec![0u8; 64];
    // SAFETY: `b` outlives the request (waited for below).
    let q = unsafe { post_recv(&r, &mut b, 2) };
    s.shut_setup_socket();
    let t0 = Instant::now();
    while t0.elapsed() < wr::CLOSE_GRACE / 5 {
        assert_eq!(r.test(q).unwrap(), None, "failed inside the close grace");
    }
    let m = pattern(10, 9);
    // SAFETY: `m` outlives the request (eager: done at post).
    unsafe { s.isend(m.as_ptr(), m.len(), 2, None) }
        .unwrap()
        .unwrap();
    let n = loop {
        assert!(
            t0.elapsed() < wr::CLOSE_GRACE,
            "not delivered within the grace"
        );
        if let Some(sz) = r.test(q).unwrap() {
            break sz[0];
        }
    };
    assert_eq!(&b[..n], &m[..]);
    // SAFETY: as above.
    let q = unsafe { post_recv(&r, &mut b, 3) };
    failure_within(Duration::from_secs(5), "a receive nobody sends to", || {
        r.test(q)
    });
}

/// The same on the sending side: the receiver's setup socket closes while
/// a rendezvous send waits for its clear-to-send, which comes after that.
#[test]
fn a_send_completing_after_the_peers_close_still_succeeds() {
    let Some((s, r)) = pair(IbOptions::default()) else {
        return;
    };
    let m = pattern(100_000, 4);
    // SAFETY: `m` outlives the request (waited for below).
    let q = unsafe { s.isend(m.as_ptr(), m.len(), 5, None) }
        .unwrap()
        .unwrap();
    r.shut_setup_socket();
    let t0 = Instant::now();
    while t0.elapsed() < wr::CLOSE_GRACE / 5 {
        assert_eq!(s.test(q).unwrap(), None, "failed inside the close grace");
    }
    let mut b = vec![0u8; m.len()];
    // SAFETY: `b` outlives the request (waited for below).
    let rq = unsafe { post_recv(&r, &mut b, 5) };
    let (mut sent, mut got) = (false, false);
    while !(sent && got) {
        assert!(t0.elapsed() < wr::CLOSE_GRACE, "not done within the grace");
        sent = sent || s.test(q).unwrap().is_some();
        got = got || r.test(rq).unwrap().is_some();
    }
    assert!(b == m, "payload intact");
}

/// A peer whose setup socket closes without a BYE (the kernel's close of
/// a process that died) fails an open receive at once, not after the
/// close grace that a graceful close gets.
#[test]
fn a_receive_whose_peer_died_fails_inside_the_grace() {
    let Some((s, r)) = pair(IbOptions::default()) else {
        return;
    };
    let mut b = vec![0u8; 64];
    // SAFETY: `b` outlives the request (it fails below, then `r` drops).
    let q = unsafe { post_recv(&r, &mut b, 2) };
    s.drop_setup_socket();
    let e = failure_within(wr::CLOSE_GRACE / 2, "a receive from a dead peer", || {
        r.test(q)
    });
    assert!(e.contains("without a BYE"), "{e}");
}
