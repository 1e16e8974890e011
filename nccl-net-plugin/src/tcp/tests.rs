//! Loopback tests of the TCP transport through its Rust API.

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::*;
use crate::iface::NetDevice;

fn lo_net(nsocks: usize, nthreads: usize) -> TcpNet {
    lo_net_timeout(nsocks, nthreads, Duration::from_secs(20))
}

fn lo_net_timeout(nsocks: usize, nthreads: usize, timeout: Duration) -> TcpNet {
    let dev = NetDevice {
        name: "lo".into(),
        addr: IpAddr::V4(Ipv4Addr::LOCALHOST),
        speed_mbps: 10_000,
        pci_path: None,
        loopback: true,
    };
    let opts = TcpOptions {
        nsocks,
        nthreads,
        timeout,
        ..TcpOptions::default()
    };
    TcpNet::new(Arc::new(vec![dev]), opts)
}

/// Connects a pair in one thread, alternating connect and accept.
fn pair(net: &TcpNet) -> (TcpSendComm, TcpRecvComm) {
    let (mut l, mut handle) = net.listen(0).unwrap();
    pair_on(net, &mut l, &mut handle, |_| {})
}

/// Connects to listener `l` (whose handle is `handle`) in one thread,
/// alternating connect and accept, and calling `between` after each
/// connect step.
fn pair_on(
    net: &TcpNet,
    l: &mut TcpListenComm,
    handle: &mut [u8; HANDLE_BYTES],
    mut between: impl FnMut(&TcpListenComm),
) -> (TcpSendComm, TcpRecvComm) {
    let (mut s, mut r) = (None, None);
    let t0 = Instant::now();
    while s.is_none() || r.is_none() {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "connect/accept did not finish"
        );
        if s.is_none() {
            s = net.connect(0, handle).unwrap();
        }
        between(l);
        if r.is_none() {
            r = net.accept(l).unwrap();
        }
    }
    (s.unwrap(), r.unwrap())
}

fn wait_recv(r: &TcpRecvComm, q: RecvRequest) -> Result<Vec<usize>> {
    let t0 = Instant::now();
    loop {
        if let Some(v) = r.test(q)? {
            return Ok(v.to_vec());
        }
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "receive did not finish"
        );
    }
}

/// Polls a receive and some sends together until all finish.
fn drive(
    s: &TcpSendComm,
    sqs: &[SendRequest],
    r: &TcpRecvComm,
    rq: RecvRequest,
) -> (Vec<Result<usize>>, Result<Vec<usize>>) {
    let mut sent: Vec<Option<Result<usize>>> = sqs.iter().map(|_| None).collect();
    let mut got = None;
    let t0 = Instant::now();
    while got.is_none() || sent.iter().any(Option::is_none) {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "requests did not finish"
        );
        for (i, q) in sqs.iter().enumerate() {
            if sent[i].is_none() {
                sent[i] = s.test(*q).transpose();
            }
        }
        if got.is_none() {
            got = r.test(rq).transpose();
        }
    }
    (
        sent.into_iter().map(Option::unwrap).collect(),
        got.unwrap().map(|s| s.to_vec()),
    )
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// Checks that `eager` completes with no receive posted while `plain`
/// waits for a CTS, then receives the messages in order
/// ([`receive_in_order`]; the receive of `plain_tag` releases `plain`).
fn eager_done_plain_waits(
    (s, r): (&TcpSendComm, &TcpRecvComm),
    (eager, plain, plain_tag): (SendRequest, SendRequest, i32),
    msgs: &[(i32, &[u8])],
) {
    let t0 = Instant::now();
    while s.test(eager).unwrap().is_none() {
        assert!(t0.elapsed() < Duration::from_secs(20), "eager send stuck");
    }
    for _ in 0..100 {
        assert_eq!(s.test(plain).unwrap(), None, "a plain send needs a CTS");
    }
    let at = msgs.iter().position(|&(tag, _)| tag == plain_tag);
    receive_in_order((s, r), (plain, at.expect("plain's tag is listed")), msgs);
}

/// Receives each `(tag, bytes)` in order into a fresh buffer, driving the
/// send request `waiting` together with the receive of message number
/// `at` (the one it sends), asserting sizes and contents.
fn receive_in_order(
    (s, r): (&TcpSendComm, &TcpRecvComm),
    (waiting, at): (SendRequest, usize),
    msgs: &[(i32, &[u8])],
) {
    for (i, &(tag, want)) in msgs.iter().enumerate() {
        let n = want.len();
        let mut dst = vec![0u8; n];
        // SAFETY: `dst` outlives the request, which the test waits for.
        let rq = unsafe {
            r.irecv(
                &[RecvBuf {
                    ptr: dst.as_mut_ptr(),
                    cap: n,
                    tag,
                }],
                false,
            )
        }
        .unwrap()
        .unwrap();
        let sends = [waiting];
        let (sent, got) = drive(s, if i == at { &sends } else { &[] }, r, rq);
        assert!(sent.iter().all(|x| x.as_ref().ok() == Some(&n)));
        assert_eq!(got.unwrap(), vec![n], "message {i}");
        assert!(dst == want, "message {i} (tag {tag}) differs");
    }
}

fn round_trip(nsocks: usize, nthreads: usize, sizes: &[usize]) {
    let net = lo_net(nsocks, nthreads);
    let (s, r) = pair(&net);
    for (k, &len) in sizes.iter().enumerate() {
        let src = pattern(len, k as u8);
        let mut dst = vec![0u8; len + 100];
        // SAFETY: the buffers outlive their requests, which the test waits for.
        let rq = unsafe {
            r.irecv(
                &[RecvBuf {
                    ptr: dst.as_mut_ptr(),
                    cap: dst.len(),
                    tag: 7,
                }],
                false,
            )
        }
        .unwrap()
        .unwrap();
        // SAFETY: the buffers outlive their requests, which the test waits for.
        let sq = unsafe { s.isend(src.as_ptr(), len, 7) }.unwrap().unwrap();
        let mut got = None;
        let mut sent = None;
        let t0 = Instant::now();
        while got.is_none() || sent.is_none() {
            assert!(t0.elapsed() < Duration::from_secs(20));
            if sent.is_none() {
                sent = s.test(sq).unwrap();
            }
            if got.is_none() {
                got = r.test(rq).unwrap();
            }
        }
        assert_eq!(sent, Some(len));
        assert_eq!(got.map(|s| s.to_vec()), Some(vec![len]));
        assert!(dst[..len] == src[..], "payload of {len} bytes differs");
    }
    s.close();
    r.close();
    net.shutdown();
}

#[test]
fn sizes_over_control_socket_only() {
    round_trip(0, 0, &[0, 1, 8, 128, 129, 4096, 1 << 20, 3 << 20]);
}

#[test]
fn sizes_over_lanes() {
    round_trip(4, 2, &[0, 8, 129, 65535, 65536, 1 << 20, (8 << 20) + 3]);
}

#[test]
fn sizes_over_inline_lanes() {
    round_trip(3, 0, &[0, 8, 129, 65536, 1 << 20, (8 << 20) + 3, 200_000]);
}

#[test]
fn grouped_tags_and_oversize() {
    let net = lo_net(2, 2);
    let (s, r) = pair(&net);
    // Sends with tags 2, 1, 2; one grouped receive with tags [1, 2, 2].
    let msgs: Vec<Vec<u8>> = vec![pattern(100, 1), pattern(200_000, 2), pattern(300, 3)];
    let tags = [2, 1, 2];
    let sqs: Vec<_> = msgs
        .iter()
        .zip(tags)
        // SAFETY: the buffers outlive their requests, which the test waits for.
        .map(|(m, t)| unsafe { s.isend(m.as_ptr(), m.len(), t) }.unwrap().unwrap())
        .collect();
    let mut bufs = vec![vec![0u8; 300_000]; 3];
    let rb: Vec<RecvBuf> = bufs
        .iter_mut()
        .zip([1, 2, 2])
        .map(|(b, tag)| RecvBuf {
            ptr: b.as_mut_ptr(),
            cap: b.len(),
            tag,
        })
        .collect();
    // SAFETY: the buffers outlive their requests, which the test waits for.
    let rq = unsafe { r.irecv(&rb, false) }.unwrap().unwrap();
    let (sent, got) = drive(&s, &sqs, &r, rq);
    assert_eq!(got.unwrap(), vec![200_000, 100, 300]);
    assert!(sent.iter().all(Result::is_ok));
    assert!(bufs[0][..200_000] == msgs[1][..]);
    assert!(bufs[1][..100] == msgs[0][..]);
    assert!(bufs[2][..300] == msgs[2][..]);
    // Oversize, inline and large: both are errors; the comm stays usable.
    for len in [100usize, 100_000] {
        let src = pattern(len, 9);
        let mut small = vec![0u8; 10];
        // SAFETY: the buffers outlive their requests, which the test waits for.
        let rq = unsafe {
            r.irecv(
                &[RecvBuf {
                    ptr: small.as_mut_ptr(),
                    cap: 10,
                    tag: 0,
                }],
                false,
            )
        }
        .unwrap()
        .unwrap();
        // SAFETY: the buffers outlive their requests, which the test waits for.
        let sq = unsafe { s.isend(src.as_ptr(), len, 0) }.unwrap().unwrap();
        let (sent, got) = drive(&s, &[sq], &r, rq);
        let e = got.unwrap_err();
        assert!(matches!(e, NetError::InvalidUsage(_)), "{e}");
        if len > 128 {
            assert!(matches!(sent[0], Err(NetError::InvalidUsage(_))));
        } else {
            assert!(sent[0].is_ok());
        }
    }
    let src = pattern(64, 1);
    let mut dst = vec![0u8; 64];
    // SAFETY: the buffers outlive their requests, which the test waits for.
    let rq = unsafe {
        r.irecv(
            &[RecvBuf {
                ptr: dst.as_mut_ptr(),
                cap: 64,
                tag: 0,
            }],
            false,
        )
    }
    .unwrap()
    .unwrap();
    // SAFETY: the buffers outlive their requests, which the test waits for.
    let sq = unsafe { s.isend(src.as_ptr(), 64, 0) }.unwrap().unwrap();
    let (sent, got) = drive(&s, &[sq], &r, rq);
    assert_eq!(got.unwrap(), vec![64]);
    assert_eq!(sent[0], Ok(64));
    assert_eq!(dst, src);
}

#[test]
fn peer_close_fails_pending_requests() {
    let net = lo_net(2, 1);
    let (s, r) = pair(&net);
    let mut dst = vec![0u8; 1 << 20];
    // SAFETY: the buffers outlive their requests, which the test waits for.
    let rq = unsafe {
        r.irecv(
            &[RecvBuf {
                ptr: dst.as_mut_ptr(),
                cap: dst.len(),
                tag: 0,
            }],
            false,
        )
    }
    .unwrap()
    .unwrap();
    s.close();
    let e = wait_recv(&r, rq).unwrap_err();
    assert!(matches!(e, NetError::Remote(_)), "{e}");
    // SAFETY: the buffers outlive their requests, which the test waits for.
    let again = unsafe {
        r.irecv(
            &[RecvBuf {
                ptr: dst.as_mut_ptr(),
                cap: 8,
                tag: 0,
            }],
            false,
        )
    };
    assert!(again.is_err(), "a failed comm keeps failing");
}

#[test]
fn bad_hello_is_rejected() {
    use std::io::Write;
    let net = lo_net(0, 0);
    let (mut l, h) = net.listen(0).unwrap();
    let info = crate::wire::decode_handle(&h).unwrap();
    let mut stray = std::net::TcpStream::connect(info.addr).unwrap();
    let bad = crate::wire::encode_hello(&crate::wire::Hello {
        nonce: info.nonce ^ 1,
        comm_id: 1,
        role: crate::wire::SockRole::Ctrl,
        nsocks: 0,
    });
    stray.write_all(&bad).unwrap();
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_millis(300) {
        assert!(
            net.accept(&mut l).unwrap().is_none(),
            "a wrong nonce must not make a comm"
        );
    }
}

#[test]
fn sender_close_after_completion_still_delivers() {
    for (nsocks, nthreads) in [(2, 2), (2, 0), (0, 0)] {
        let net = lo_net(nsocks, nthreads);
        let (s, r) = pair(&net);
        let mut dst = vec![0u8; 4 << 20];
        // Posted first, so the payload goes by CTS over lanes or control socket.
        // SAFETY: the buffers outlive their requests, which the test waits for.
        let rq = unsafe {
            r.irecv(
                &[RecvBuf {
                    ptr: dst.as_mut_ptr(),
                    cap: dst.len(),
                    tag: 0,
                }],
                false,
            )
        }
        .unwrap()
        .unwrap();
        let src = pattern(4 << 20, 3);
        let small = pattern(50, 4);
        // SAFETY: the buffers outlive their requests, which the test waits for.
        let q1 = unsafe { s.isend(src.as_ptr(), src.len(), 0) }
            .unwrap()
            .unwrap();
        // SAFETY: the buffers outlive their requests, which the test waits for.
        let q2 = unsafe { s.isend(small.as_ptr(), small.len(), 1) }
            .unwrap()
            .unwrap();
        let (sent, got) = drive(&s, &[q1, q2], &r, rq);
        assert!(sent.iter().all(Result::is_ok));
        assert_eq!(got.unwrap(), vec![4 << 20]);
        s.close();
        // The small message arrived before the close: still receivable.
        let mut b = vec![0u8; 64];
        // SAFETY: the buffers outlive their requests, which the test waits for.
        let rq = unsafe {
            r.irecv(
                &[RecvBuf {
                    ptr: b.as_mut_ptr(),
                    cap: 64,
                    tag: 1,
                }],
                false,
            )
        }
        .unwrap()
        .unwrap();
        assert_eq!(wait_recv(&r, rq).unwrap(), vec![50], "{nsocks}x{nthreads}");
        assert_eq!(&b[..50], &small[..]);
        assert!(dst == src);
        r.close();
    }
}

/// A send whose receiver never answers (no CTS: a stopped peer, or one that
/// left) fails after the timeout; an idle receive, whose message has not
/// started, does not.
#[test]
fn unanswered_send_times_out_but_idle_receive_does_not() {
    for (nsocks, nthreads) in [(0, 0), (2, 0), (2, 2)] {
        let timeout = Duration::from_millis(400);
        let net = lo_net_timeout(nsocks, nthreads, timeout);
        let (s, r) = pair(&net);
        let mut rbuf = vec![0u8; 1 << 20];
        let bufs = [RecvBuf {
            ptr: rbuf.as_mut_ptr(),
            cap: rbuf.len(),
            tag: 1,
        }];
        // SAFETY: `rbuf` outlives the comms.
        let rq = unsafe { r.irecv(&bufs, false) }.unwrap().unwrap();
        // Tag 2 matches no receive: the MSG stays unexpected, no CTS comes.
        let out = pattern(1 << 20, 3);
        // The send's stall clock starts inside isend: start ours before it.
        let t0 = Instant::now();
        // SAFETY: `out` outlives the comms.
        let sq = unsafe { s.isend(out.as_ptr(), out.len(), 2) }
            .unwrap()
            .unwrap();
        let err = loop {
            assert!(r.test(rq).unwrap().is_none());
            match s.test(sq) {
                Ok(None) => {}
                Ok(Some(_)) => panic!("send completed without a receive"),
                Err(e) => break e,
            }
            assert!(t0.elapsed() < Duration::from_secs(5), "send did not fail");
        };
        let t = t0.elapsed();
        assert!(matches!(err, NetError::Timeout(_)), "{err}");
        assert!(t >= timeout, "failed after {t:?}");
        assert_eq!(err.code(), hetccl_abi::NcclResult::RemoteError);
        // The receive stays pending well past the timeout.
        while t0.elapsed() < 3 * timeout {
            assert!(r.test(rq).unwrap().is_none());
        }
        s.close();
        r.close();
    }
}

/// A listener whose pending set is full of silent connections drops the
/// oldest of them, not a real peer's sockets.
#[test]
fn silent_connections_do_not_crowd_out_a_real_peer() {
    let net = lo_net(2, 1);
    let (mut l, h) = net.listen(0).unwrap();
    l.max_pending = 8;
    let addr = l.info().addr;
    let mut silent: Vec<std::net::TcpStream> = (0..20)
        .map(|_| std::net::TcpStream::connect(addr).unwrap())
        .collect();
    assert!(net.accept(&mut l).unwrap().is_none());
    assert_eq!(l.pending_len(), 8);
    let mut handle = h;
    let (s, r) = pair_on(&net, &mut l, &mut handle, |l| {
        // The flood goes on.
        for _ in 0..2 {
            silent.push(std::net::TcpStream::connect(addr).unwrap());
        }
        assert!(l.pending_len() <= 8);
    });
    assert!(l.pending_len() <= 8);
    let out = pattern(4096, 7);
    let mut got = vec![0u8; 4096];
    let bufs = [RecvBuf {
        ptr: got.as_mut_ptr(),
        cap: got.len(),
        tag: 5,
    }];
    // SAFETY: both buffers outlive the requests.
    let rq = unsafe { r.irecv(&bufs, false) }.unwrap().unwrap();
    // SAFETY: both buffers outlive the requests.
    let sq = unsafe { s.isend(out.as_ptr(), out.len(), 5) }
        .unwrap()
        .unwrap();
    let (sent, recvd) = drive(&s, &[sq], &r, rq);
    assert_eq!(sent[0].as_ref().ok(), Some(&4096));
    assert_eq!(recvd.unwrap(), [4096]);
    assert_eq!(got, out);
}

/// A sender that closes its comm as soon as its last send is done must not
/// take the message from a receiver that has not read it yet: closing with
/// the receiver's last CTS still queued (peeked, not yet dropped) used to
/// reset the connection, and the receiver's request failed with
/// "Connection reset by peer". The receiver runs on its own thread and
/// starts reading the rest only after the sender has closed.
#[test]
fn closing_right_after_the_last_send_loses_nothing() {
    for (nsocks, nthreads) in [(0, 0), (2, 0), (2, 2)] {
        let net = lo_net(nsocks, nthreads);
        for round in 0..12 {
            let (s, r) = pair(&net);
            // Small enough that the payload goes out in the pass that reads
            // the CTS, large enough to need one; one big one too.
            let len = [128 << 10, 256 << 10, 4 << 20][round % 3];
            let src: Vec<u8> = (0..len).map(|i| (i * 7 + round) as u8).collect();
            let (closed_tx, closed_rx) = std::sync::mpsc::channel::<()>();
            let (posted_tx, posted_rx) = std::sync::mpsc::channel::<()>();
            let receiver = std::thread::spawn(move || {
                let mut dst = vec![0u8; len];
                let buf = RecvBuf {
                    ptr: dst.as_mut_ptr(),
                    cap: len,
                    tag: 3,
                };
                // SAFETY: `dst` outlives the request.
                let rq = unsafe { r.irecv(&[buf], false) }.unwrap().unwrap();
                posted_tx.send(()).unwrap();
                // Move the request until the sender has closed: its CTS
                // goes out, part of the payload comes in.
                while closed_rx.try_recv().is_err() {
                    if r.test(rq).unwrap().is_some() {
                        closed_rx.recv().unwrap();
                        return Ok((vec![len], dst));
                    }
                    std::thread::sleep(Duration::from_micros(50));
                }
                let sizes = wait_recv(&r, rq)?;
                r.close();
                Ok::<_, NetError>((sizes, dst))
            });
            posted_rx.recv().unwrap();
            // SAFETY: `src` outlives the request.
            let sq = unsafe { s.isend(src.as_ptr(), len, 3) }.unwrap().unwrap();
            let t0 = Instant::now();
            while s.test(sq).unwrap().is_none() {
                assert!(
                    t0.elapsed() < Duration::from_secs(20),
                    "send did not finish"
                );
            }
            s.close();
            closed_tx.send(()).unwrap();
            let (sizes, dst) = receiver.join().unwrap().unwrap_or_else(|e| {
                panic!("nsocks {nsocks} nthreads {nthreads} round {round}: {e}")
            });
            assert_eq!(sizes, vec![len]);
            assert!(dst == src, "round {round}: payload differs");
        }
    }
}

#[test]
fn eager_sends_complete_before_the_receive_is_posted() {
    let net = lo_net(0, 0);
    let (s, r) = pair(&net);
    let len = 4096;
    let src = pattern(len, 3);
    // A plain send of 4 KiB (above inline_max, 128) waits for the CTS of a
    // posted receive; an eager one goes out inline at once.
    // SAFETY: the buffers outlive their requests, which the test waits for.
    let plain = unsafe { s.isend(src.as_ptr(), len, 1) }.unwrap().unwrap();
    // SAFETY: as above.
    let eager = unsafe { s.isend_eager(src.as_ptr(), len, 2) }
        .unwrap()
        .unwrap();
    eager_done_plain_waits((&s, &r), (eager, plain, 1), &[(2, &src), (1, &src)]);
    s.close();
    r.close();
    net.shutdown();
}

/// A sender that runs far ahead of its receiver with eager messages (more
/// messages and more inline bytes than the unexpected queue holds) is held
/// back by TCP flow control instead of failing the receiver: every message
/// arrives, in order, once the receives are posted.
#[test]
fn eager_flood_is_held_back_not_refused() {
    let net = lo_net(0, 0);
    let (s, r) = pair(&net);
    let n = 1200;
    let size = |i: usize| if i % 2 == 0 { 8 } else { 60 << 10 };
    let msgs: Vec<Vec<u8>> = (0..n).map(|i| pattern(size(i), i as u8)).collect();
    let mut sent = 0;
    let mut inflight: std::collections::VecDeque<SendRequest> = Default::default();
    let mut drive_sender = |sent: &mut usize| {
        while *sent < n {
            let m = &msgs[*sent];
            // SAFETY: `msgs` outlives the comms.
            match unsafe { s.isend_eager(m.as_ptr(), m.len(), 0) }.unwrap() {
                Some(q) => inflight.push_back(q),
                None => break,
            }
            *sent += 1;
        }
        inflight.retain(|&q| s.test(q).unwrap().is_none());
    };
    // A receive of another tag keeps the receiver reading.
    let mut other = [0u8; 8];
    // SAFETY: `other` outlives the comms.
    let idle = unsafe {
        r.irecv(
            &[RecvBuf {
                ptr: other.as_mut_ptr(),
                cap: other.len(),
                tag: 99,
            }],
            false,
        )
    }
    .unwrap()
    .unwrap();
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_millis(300) {
        drive_sender(&mut sent);
        assert!(r.test(idle).unwrap().is_none());
    }
    assert!(sent < n, "the receiver should have held the sender back");
    for (i, want) in msgs.iter().enumerate() {
        let mut got = vec![0u8; want.len()];
        let bufs = [RecvBuf {
            ptr: got.as_mut_ptr(),
            cap: got.len(),
            tag: 0,
        }];
        // SAFETY: `got` outlives the request (waited for below).
        let q = unsafe { r.irecv(&bufs, false) }.unwrap().unwrap();
        let t1 = Instant::now();
        loop {
            drive_sender(&mut sent);
            if let Some(sz) = r.test(q).unwrap() {
                assert_eq!(sz[0], want.len(), "message {i}");
                break;
            }
            assert!(
                t1.elapsed() < Duration::from_secs(20),
                "message {i} never came"
            );
        }
        assert!(got == *want, "message {i} differs");
    }
    assert!(r.test(idle).unwrap().is_none());
}

/// The eager limit counts payload bytes only: a message of exactly
/// [`MAX_EAGER`] bytes (a 64 KiB collective step) still goes out inline with
/// its header, before any receive is posted, while one byte more waits for
/// the receiver's CTS.
#[test]
fn a_message_of_max_eager_bytes_is_still_eager() {
    let net = lo_net(0, 0);
    let (s, r) = pair(&net);
    let (len, over) = (MAX_EAGER, MAX_EAGER + 1);
    let (small, big) = (pattern(len, 5), pattern(over, 6));
    // SAFETY: the buffers outlive their requests, which the test waits for.
    let eager = unsafe { s.isend_eager(small.as_ptr(), len, 1) }
        .unwrap()
        .unwrap();
    // SAFETY: as above.
    let plain = unsafe { s.isend_eager(big.as_ptr(), over, 2) }
        .unwrap()
        .unwrap();
    eager_done_plain_waits((&s, &r), (eager, plain, 2), &[(1, &small), (2, &big)]);
    s.close();
    r.close();
    net.shutdown();
}

/// `isend_eager_now` writes a small message whole at once on an idle comm
/// (`Sent`: no request to test) and posts one over [`MAX_EAGER`] like
/// `isend`; a small one sent while the large one waits for its CTS still
/// arrives after it, and every message arrives whole, in order.
#[test]
fn eager_now_sends_at_once_and_keeps_order() {
    let net = lo_net(0, 0);
    let (s, r) = pair(&net);
    let msgs = [pattern(8, 1), pattern(MAX_EAGER + 1, 2), pattern(16, 3)];
    let mut big = None;
    for (i, m) in msgs.iter().enumerate() {
        // SAFETY: `msgs` outlives the comms.
        match unsafe { s.isend_eager_now(m.as_ptr(), m.len(), 4) }.unwrap() {
            Some(EagerSend::Sent) => assert_ne!(i, 1, "a large message went inline"),
            Some(EagerSend::Posted(q)) => {
                assert_eq!(i, 1, "an idle comm posted a small message");
                big = Some(q);
            }
            None => panic!("the comm refused message {i}"),
        }
    }
    let big = big.expect("the large message has a request");
    let listed: Vec<(i32, &[u8])> = msgs.iter().map(|m| (4, &m[..])).collect();
    receive_in_order((&s, &r), (big, 1), &listed);
    s.close();
    r.close();
    net.shutdown();
}

/// A receive posted with `irecv_now` after its message arrived inline is
/// complete at once (`Done`, its size, the bytes in place), and such
/// receives take the queued messages of their tag in order.
#[test]
fn irecv_now_takes_arrived_messages_at_once() {
    let net = lo_net(0, 0);
    let (s, r) = pair(&net);
    let msgs = [pattern(8, 7), pattern(24, 8), pattern(40, 9)];
    for m in &msgs {
        // SAFETY: `msgs` outlives the comms.
        let sent = unsafe { s.isend_eager_now(m.as_ptr(), m.len(), 3) }.unwrap();
        assert_eq!(sent, Some(EagerSend::Sent));
    }
    for (i, want) in msgs.iter().enumerate() {
        let mut dst = vec![0u8; 64];
        let buf = RecvBuf {
            ptr: dst.as_mut_ptr(),
            cap: dst.len(),
            tag: 3,
        };
        // SAFETY: `dst` outlives the request, which the test waits for.
        let n = match unsafe { r.irecv_now(&[buf]) }.unwrap() {
            Some(RecvPosted::Done(sizes)) => sizes[0],
            // Nothing read yet: the first receive reads every queued frame.
            Some(RecvPosted::Posted(q)) if i == 0 => wait_recv(&r, q).unwrap()[0],
            other => panic!("message {i}: {other:?}, want it complete at once"),
        };
        assert_eq!(n, want.len(), "message {i}");
        assert!(dst[..n] == want[..], "message {i} differs");
    }
    s.close();
    r.close();
    net.shutdown();
}

#[test]
fn data_sockets_take_the_congestion_control_asked_for() {
    // Reno is built into every kernel and allowed to everyone; a name the
    // kernel refuses leaves the host's default and fails nothing. Control
    // sockets always keep the default.
    let default = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let c = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        crate::sock::congestion(std::os::fd::AsRawFd::as_raw_fd(&c)).unwrap()
    };
    for (cc, want) in [
        (Some("reno"), "reno"),
        (None, default.as_str()),
        (Some("nosuch_cc"), default.as_str()),
    ] {
        let mut net = lo_net(2, 0);
        net.opts.congestion = cc.map(str::to_string);
        let (s, r) = pair(&net);
        for fds in [s.fds(), r.fds()] {
            assert_eq!(fds.len(), 3, "a control and two data sockets");
            assert_eq!(crate::sock::congestion(fds[0]).unwrap(), default);
            for &fd in &fds[1..] {
                assert_eq!(crate::sock::congestion(fd).unwrap(), want, "{cc:?}");
            }
        }
    }
}
