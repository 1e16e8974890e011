//! Conformance harness of the NCCL net plugin (`ncclNetPlugin_v8` and
//! `_v12` of `libhetccl.so`, loaded with dlopen as NCCL does), over loopback.
//! Process, namespace, fault and reload tests are in `net_plugin_procs.rs`.

use std::collections::HashSet;
use std::ffi::c_int;
use std::time::{Duration, Instant};

use hetccl_testkit::net;
use hetccl_testkit::net::{
    exchange, pattern, Api, Ver, INTERNAL, INVALID_ARG, INVALID_USAGE, LIMIT, OK, P,
};

#[test]
fn exports_and_properties() {
    let lib = net::lib();
    for v in 6..=12 {
        assert!(
            // SAFETY: only checks that the data symbol exists.
            unsafe { lib.get::<*const u8>(format!("ncclNetPlugin_v{v}").as_bytes()) }.is_ok(),
            "v{v} missing"
        );
    }
    let ib = net::ib_dev();
    for api in Api::both() {
        assert_eq!(api.name(), "hetccl");
        assert_eq!(
            api.devices(),
            1,
            "HETCCL_SOCKET_IFNAME==lo selects exactly lo (verbs: the one rxe port)"
        );
    }
    let v12 = Api::v12_of(lib);
    let p = v12.v12_props(0).unwrap();
    // SAFETY: the plugin returns a C string that lives as long as the library.
    let name = unsafe { std::ffi::CStr::from_ptr(p.name) }
        .to_str()
        .unwrap();
    match &ib {
        None => {
            assert_eq!(name, "lo");
            assert!(p.pciPath.is_null(), "loopback is virtual");
            assert_eq!(p.port, 0);
        }
        Some(dev) => {
            assert_eq!(name, dev, "device 0 is the RDMA port");
            assert_eq!(p.port, 1, "port number of the RDMA port");
            assert_ne!(p.guid, 0, "node GUID from the device");
            assert!(p.pciPath.is_null(), "Soft-RoCE has no PCI device");
        }
    }
    assert_eq!(p.ptrSupport, hetccl::abi::net::NCCL_PTR_HOST);
    assert_eq!(p.netDeviceType, hetccl::abi::net::NCCL_NET_DEVICE_HOST);
    assert_eq!(p.maxRecvs, 8);
    assert!(p.maxP2pBytes > 0 && p.maxP2pBytes <= hetccl::abi::net::NCCL_MAX_NET_SIZE_BYTES);
    assert!(p.speed > 0 && p.maxComms > 0);
    assert_eq!((p.vProps.ndevs, p.vProps.devs[0]), (1, 0));
    assert_eq!(v12.v12_props(1).unwrap_err(), INVALID_ARG);
    assert_eq!(v12.v12_props(-1).unwrap_err(), INVALID_ARG);
    v12.finalize();
    let v8 = Api::v8_of(lib);
    let p8 = v8.v8_props(0).unwrap();
    assert_eq!((p8.maxRecvs, p8.ptrSupport, p8.netDeviceType), (1, 1, 0));
}

#[test]
fn one_thread_connect_accept_and_handle_reuse() {
    for api in Api::both() {
        let (h, l) = api.listen();
        let (s, r, retries) = api.pair_on(l, &h);
        // Every retry reused the same handle; none may have started a second
        // connection: accept must find nothing more.
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_millis(200) {
            assert!(
                api.accept(l).unwrap().is_null(),
                "{:?}: an extra comm after {retries} retries",
                api.ver
            );
        }
        exchange(
            &api,
            s,
            r,
            &[(0, pattern(10, 1)), (3, pattern(100_000, 2))],
            100_000,
        );
        api.close_listen(l);
        api.close_send(s);
        api.close_recv(r);
        api.finalize();
    }
}

#[test]
fn accept_before_connect_and_stray_connections() {
    for api in Api::both() {
        let (h, l) = api.listen();
        for _ in 0..10 {
            assert!(api.accept(l).unwrap().is_null());
        }
        // A stray connection that writes garbage, and one that sends a hello
        // with the wrong nonce, must not turn into comms or inject data.
        let port = u16::from_be_bytes([h[6], h[7]]);
        let mut stray = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        std::io::Write::write_all(&mut stray, &[0x41; 64]).unwrap();
        let mut forged = h;
        forged[24] ^= 0xff; // flip the nonce
        let mut fs = P::null();
        let t0 = Instant::now();
        if net::ib_dev().is_some() {
            // Verbs: a connect completes only with the acceptor's QP info,
            // which a wrong nonce never gets; it fails or keeps waiting.
            while t0.elapsed() < Duration::from_millis(300) {
                match api.connect(&mut forged) {
                    Ok(p) => assert!(p.is_null(), "{:?}: a forged connect completed", api.ver),
                    Err(_) => break,
                }
                assert!(
                    api.accept(l).unwrap().is_null(),
                    "{:?}: a forged comm",
                    api.ver
                );
            }
        }
        while fs.is_null() && net::ib_dev().is_none() {
            assert!(t0.elapsed() < LIMIT);
            fs = api.connect(&mut forged).unwrap();
        }
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_millis(300) {
            assert!(
                api.accept(l).unwrap().is_null(),
                "{:?}: a forged connection became a comm",
                api.ver
            );
        }
        let (s, r, _) = api.pair_on(l, &h);
        exchange(&api, s, r, &[(1, pattern(64, 7))], 64);
        if !fs.is_null() {
            api.close_send(fs);
        }
        api.close_send(s);
        api.close_recv(r);
        api.close_listen(l);
        api.finalize();
    }
}

#[test]
fn sizes_capacity_zero_bytes_and_oversize() {
    for api in Api::both() {
        let (s, r) = api.pair();
        let msgs: Vec<(i32, Vec<u8>)> =
            [0usize, 1, 8, 128, 129, 5000, 65536, 1 << 20, (4 << 20) + 7]
                .iter()
                .map(|&n| (5, pattern(n, n as u32)))
                .collect();
        exchange(&api, s, r, &msgs, (4 << 20) + 4096);
        // 0-byte message into a 0-capacity buffer.
        exchange(&api, s, r, &[(5, Vec::new())], 0);
        // Larger than the posted capacity: an error, not truncation; then the comm still works.
        for len in [100usize, 300_000] {
            let msg = pattern(len, 3);
            let mut buf = vec![0u8; 50];
            let rq = api
                .retry(|| api.irecv(r, &[buf.as_mut_ptr()], &[50], &[5], &[], false))
                .unwrap();
            let sq = api
                .retry(|| api.isend(s, msg.as_ptr(), len, 5, P::null()))
                .unwrap();
            let res = api.wait_all(&[sq, rq], 1);
            assert_eq!(
                res[1],
                Err(INVALID_USAGE),
                "{:?}: oversize {len} must fail the receive",
                api.ver
            );
            if len > 128 {
                assert_eq!(
                    res[0],
                    Err(INVALID_USAGE),
                    "{:?}: the sender learns it too",
                    api.ver
                );
            }
        }
        exchange(&api, s, r, &[(5, pattern(5000, 9))], 5200);
        api.close_send(s);
        api.close_recv(r);
        api.finalize();
    }
}

#[test]
fn outstanding_requests_and_null_retry() {
    for api in Api::both() {
        let (s, r) = api.pair();
        let max = 32 * api.max_recvs();
        let msgs: Vec<Vec<u8>> = (0..max).map(|i| pattern(1000 + i, i as u32)).collect();
        let mh = api.reg(s, msgs[0].as_ptr().cast_mut(), 1);
        // max sends, all posted before any receive.
        let sreqs: Vec<P> = msgs
            .iter()
            .map(|m| {
                api.retry(|| api.isend(s, m.as_ptr(), m.len(), 1, mh))
                    .unwrap()
            })
            .collect();
        assert_eq!(sreqs.iter().collect::<HashSet<_>>().len(), max);
        // The plugin may refuse more (NULL request = retry), but never fails.
        let extra = pattern(10, 0);
        let mut refused = 0;
        let mut extra_req = P::null();
        for _ in 0..3 {
            extra_req = api.isend(s, extra.as_ptr(), 10, 1, mh).unwrap();
            if !extra_req.is_null() {
                break;
            }
            refused += 1;
        }
        // Receives: 32 requests of maxRecvs buffers each.
        let per = api.max_recvs();
        let mut bufs: Vec<Vec<u8>> = (0..max).map(|_| vec![0u8; 4096]).collect();
        let mut rreqs = Vec::new();
        for g in 0..32 {
            let ptrs: Vec<*mut u8> = bufs[g * per..(g + 1) * per]
                .iter_mut()
                .map(|b| b.as_mut_ptr())
                .collect();
            rreqs.push(
                api.retry(|| api.irecv(r, &ptrs, &vec![4096; per], &vec![1; per], &[], false))
                    .unwrap(),
            );
        }
        let mut all = sreqs.clone();
        all.extend(&rreqs);
        let res = api.wait_all(&all, per);
        for (i, x) in res[..max].iter().enumerate() {
            assert_eq!(x.as_ref().unwrap()[0] as usize, 1000 + i);
        }
        for (g, x) in res[max..].iter().enumerate() {
            let sizes = x.as_ref().unwrap();
            for (k, &size) in sizes.iter().enumerate().take(per) {
                let i = g * per + k;
                assert_eq!(size as usize, 1000 + i, "{:?}: per-buffer size", api.ver);
                assert!(
                    bufs[i][..1000 + i] == msgs[i][..],
                    "{:?}: FIFO order, message {i}",
                    api.ver
                );
            }
        }
        if extra_req.is_null() {
            extra_req = api
                .retry(|| api.isend(s, extra.as_ptr(), 10, 1, mh))
                .unwrap();
        }
        let mut b = vec![0u8; 16];
        let rq = api
            .retry(|| api.irecv(r, &[b.as_mut_ptr()], &[16], &[1], &[], false))
            .unwrap();
        assert!(api.wait_all(&[extra_req, rq], 1).iter().all(Result::is_ok));
        eprintln!(
            "{:?}: {max} outstanding sends accepted; the next was refused {refused} times",
            api.ver
        );
        api.dereg(s, mh);
        api.close_send(s);
        api.close_recv(r);
        api.finalize();
    }
}

#[test]
fn grouped_receives_tags_sizes_and_fifo() {
    let api = Api::v12_of(net::lib());
    let (s, r) = api.pair();
    // Sends, in this order: (tag, size).
    let plan: [(i32, usize); 8] = [
        (3, 10),
        (1, 70_000),
        (2, 0),
        (3, 20),
        (1, 30),
        (2, 300_000),
        (0, 128),
        (3, 129),
    ];
    let msgs: Vec<Vec<u8>> = plan
        .iter()
        .enumerate()
        .map(|(i, &(_, n))| pattern(n, 100 + i as u32))
        .collect();
    // One grouped receive whose tags appear in another order; same-tag
    // entries must be filled in send order (per-tag FIFO).
    let tags = [1, 2, 3, 0, 3, 1, 2, 3];
    let mut bufs: Vec<Vec<u8>> = (0..8).map(|_| vec![0u8; 400_000]).collect();
    let ptrs: Vec<*mut u8> = bufs.iter_mut().map(|b| b.as_mut_ptr()).collect();
    let rq = api
        .retry(|| api.irecv(r, &ptrs, &[400_000; 8], &tags, &[], false))
        .unwrap();
    let sreqs: Vec<P> = plan
        .iter()
        .zip(&msgs)
        .map(|(&(t, n), m)| {
            api.retry(|| api.isend(s, m.as_ptr(), n, t, P::null()))
                .unwrap()
        })
        .collect();
    let mut all = sreqs;
    all.push(rq);
    let res = api.wait_all(&all, 8);
    let sizes = res[8].as_ref().unwrap();
    // Expected mapping: entry -> send index.
    let expect = [1usize, 2, 0, 6, 3, 4, 5, 7];
    for (e, &si) in expect.iter().enumerate() {
        assert_eq!(sizes[e] as usize, plan[si].1, "entry {e} size");
        assert!(
            bufs[e][..plan[si].1] == msgs[si][..],
            "entry {e} holds send {si}"
        );
    }
    // A message that arrives before its receive is posted is matched later.
    let early = pattern(50, 1);
    let sq = api
        .retry(|| api.isend(s, early.as_ptr(), 50, 9, P::null()))
        .unwrap();
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_millis(50) {
        let _ = api.test(sq, None);
    }
    let mut b = vec![0u8; 64];
    let rq = api
        .retry(|| api.irecv(r, &[b.as_mut_ptr()], &[64], &[9], &[], false))
        .unwrap();
    let res = api.wait_all(&[sq, rq], 1);
    assert_eq!(res[1].as_ref().unwrap()[0], 50);
    assert_eq!(&b[..50], &early[..]);
    api.close_send(s);
    api.close_recv(r);
    api.finalize();
}

#[test]
fn optional_completion_hint_and_iflush() {
    let api = Api::v12_of(net::lib());
    let (s, r) = api.pair();
    for len in [8usize, 4096, 1 << 20] {
        let msg = pattern(len, len as u32);
        let mut buf = vec![0u8; len];
        let rq = api
            .retry(|| api.irecv(r, &[buf.as_mut_ptr()], &[len], &[0], &[], true))
            .unwrap();
        assert_ne!(
            rq.0 as usize, 1,
            "the hint must be replaced by a real request"
        );
        let sq = api
            .retry(|| api.isend(s, msg.as_ptr(), len, 0, P::null()))
            .unwrap();
        let res = api.wait_all(&[sq, rq], 1);
        assert!(res.iter().all(Result::is_ok));
        // With the hint, completion may come before the payload: like NCCL's
        // LL protocol, wait for the data itself.
        // The helper threads write the buffer behind the compiler's back:
        // read it with volatile loads, as C code polling LL flags would.
        let arrived = |b: &[u8]| {
            let p = b.as_ptr();
            // SAFETY: in-bounds reads of a live buffer.
            (0..b.len()).all(|i| unsafe { std::ptr::read_volatile(p.add(i)) } == msg[i])
        };
        let t0 = Instant::now();
        while !arrived(&buf) {
            assert!(t0.elapsed() < LIMIT, "payload never arrived");
            std::thread::sleep(Duration::from_millis(1));
        }
        let (rc, fr) = api.iflush(r, buf.as_mut_ptr(), len as c_int, P::null());
        assert_eq!(
            (rc, fr),
            (OK, P::null()),
            "iflush of host memory: NULL request"
        );
    }
    api.close_send(s);
    api.close_recv(r);
    api.finalize();
}

#[test]
fn dereg_and_close_with_requests_in_flight() {
    for api in Api::both() {
        for _round in 0..3 {
            let (s, r) = api.pair();
            let src = pattern(1 << 20, 1);
            let mut dst = vec![0u8; 1 << 20];
            let smh = api.reg(s, src.as_ptr().cast_mut(), src.len());
            let rmh = api.reg(r, dst.as_mut_ptr(), dst.len());
            let mut sent = 0;
            for _ in 0..32 {
                let _ = api
                    .irecv(r, &[dst.as_mut_ptr()], &[1 << 20], &[0], &[rmh], false)
                    .unwrap();
                if !api
                    .isend(s, src.as_ptr(), src.len(), 0, smh)
                    .unwrap()
                    .is_null()
                {
                    sent += 1;
                }
            }
            assert!(sent > 0);
            api.dereg(s, smh);
            api.dereg(r, rmh);
            api.close_send(s);
            api.close_recv(r);
        }
        api.finalize();
    }
}

#[test]
fn listen_reuse() {
    for api in Api::both() {
        let (h, l) = api.listen();
        for i in 0..5 {
            // NCCL re-copies the handle for each connection.
            let (s, r, _) = api.pair_on(l, &h);
            exchange(&api, s, r, &[(i, pattern(1000, i as u32))], 1000);
            api.close_send(s);
            api.close_recv(r);
        }
        api.close_listen(l);
        api.finalize();
    }
}

#[test]
fn comms_from_several_threads() {
    for api in Api::both() {
        let api = &api;
        // Four pairs, each used by its own thread.
        std::thread::scope(|sc| {
            for t in 0..4u32 {
                sc.spawn(move || {
                    let (s, r) = api.pair();
                    let msgs: Vec<(i32, Vec<u8>)> = (0..50)
                        .map(|i| {
                            (
                                t as i32,
                                pattern(if i % 10 == 0 { 200_000 } else { 100 }, t * 100 + i),
                            )
                        })
                        .collect();
                    exchange(api, s, r, &msgs, 200_000);
                    api.close_send(s);
                    api.close_recv(r);
                });
            }
        });
        // One pair shared: one thread sends, another receives (as NCCL's
        // progress thread and service thread share a comm).
        let (s, r) = api.pair();
        let msgs: Vec<Vec<u8>> = (0..200)
            .map(|i| pattern(if i % 20 == 0 { 100_000 } else { 64 }, i))
            .collect();
        std::thread::scope(|sc| {
            let m = &msgs;
            sc.spawn(move || {
                for x in m {
                    api.send_wait(s, x, 0).unwrap();
                }
            });
            sc.spawn(move || {
                let mut buf = vec![0u8; 100_000];
                for x in m {
                    let rq = api
                        .retry(|| api.irecv(r, &[buf.as_mut_ptr()], &[100_000], &[0], &[], false))
                        .unwrap();
                    let mut sz = [0];
                    api.wait(rq, &mut sz).unwrap();
                    assert_eq!(sz[0] as usize, x.len());
                    assert!(buf[..x.len()] == x[..]);
                }
            });
        });
        api.close_send(s);
        api.close_recv(r);
        api.finalize();
    }
}

#[test]
fn bad_arguments_are_rejected() {
    for api in Api::both() {
        let (s, r) = api.pair();
        let mut fake = [0u64; 8];
        let fake = P(fake.as_mut_ptr().cast());
        let b = [0u8; 8];
        assert_eq!(
            api.isend(fake, b.as_ptr(), 8, 0, P::null()),
            Err(INVALID_ARG),
            "garbage comm"
        );
        assert_eq!(
            api.isend(P::null(), b.as_ptr(), 8, 0, P::null()),
            Err(INVALID_ARG),
            "NULL comm"
        );
        assert_eq!(
            api.isend(s, std::ptr::null(), 8, 0, P::null()),
            Err(INVALID_ARG),
            "NULL data"
        );
        let mut buf = [0u8; 8];
        assert_eq!(
            api.irecv(r, &[], &[], &[], &[], false),
            Err(INVALID_ARG),
            "n = 0"
        );
        let nine = [buf.as_mut_ptr(); 9];
        assert_eq!(
            api.irecv(r, &nine, &[8; 9], &[0; 9], &[], false),
            Err(INVALID_ARG),
            "n = 9"
        );
        assert_eq!(
            api.irecv(s, &[buf.as_mut_ptr()], &[8], &[0], &[], false),
            Err(INVALID_ARG),
            "send comm as recv comm"
        );
        assert_eq!(api.test(fake, None), Err(INVALID_ARG), "garbage request");
        assert_eq!(
            api.reg_type(s, buf.as_mut_ptr(), 8, hetccl::abi::net::NCCL_PTR_CUDA),
            INTERNAL,
            "CUDA memory"
        );
        let mut bad_handle = [0u8; 128];
        assert_eq!(
            api.connect(&mut bad_handle),
            Err(INVALID_ARG),
            "zero handle"
        );
        if api.ver == Ver::V8 {
            assert_eq!(
                api.isend(s, b.as_ptr(), usize::MAX, 0, P::null()),
                Err(INVALID_ARG),
                "negative int size"
            );
        }
        // The comms still work.
        exchange(&api, s, r, &[(0, pattern(8, 8))], 8);
        api.close_send(s);
        api.close_recv(r);
        api.finalize();
    }
}
