//! Benchmark driver of the net plugin (not a timed test: `#[ignore]`d, run
//! by `bench-scripts/net-bench.sh`). Two processes, over loopback or two
//! network namespaces, measure through the dlopen'd v12 table:
//! - throughput of a message-size sweep (up to 64 MiB), 4 sends in flight,
//!   the polling loop yielding the CPU when a pass completes nothing (as
//!   NCCL's proxy thread does);
//! - 8-byte ping-pong round-trip time.
//!
//! As baselines, plain TCP 8-byte ping-pongs with busy-polled non-blocking
//! reads (what NCCL's progress thread does with `test`), over one two-way
//! socket or two one-way connections (`BENCH_TCP_SOCKS=2`).
//!
//! Driver environment: `BENCH_MODE` = `plugin` | `tcp`; `BENCH_WHAT` =
//! `tput` | `lat` | `both`; `BENCH_SIZES` (comma list); `BENCH_ITERS`;
//! `BENCH_BYTES` (per size, default 1 GiB); `BENCH_REG=1` (regMr'd buffers);
//! `BENCH_NETNS`, `BENCH_IFS`, `BENCH_ADDRS` (comma pairs) for namespaces.
//! Results are printed as `RESULT key=value ...` lines.

use std::io::{ErrorKind, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::Instant;

use hetccl_testkit::net;
use hetccl_testkit::net::procs::{hex, read_stdin_line, unhex, Proc};
use hetccl_testkit::net::{Api, LIMIT, P};

const W: usize = 4;
const TAG_DATA: i32 = 1;
const TAG_CTRL: i32 = 2;
const TAG_PING: i32 = 3;

fn env_or(k: &str, d: &str) -> String {
    std::env::var(k).unwrap_or_else(|_| d.to_string())
}

fn sizes() -> Vec<usize> {
    env_or(
        "BENCH_SIZES",
        "4096,65536,262144,1048576,4194304,16777216,67108864",
    )
    .split(',')
    .filter_map(|s| s.trim().parse().ok())
    .collect()
}

/// Messages per size: `BENCH_BYTES` (default 1 GiB) worth, 8 to 20000.
fn count_for(size: usize) -> usize {
    let bytes: usize = env_or("BENCH_BYTES", "1073741824")
        .parse()
        .unwrap_or(1 << 30);
    (bytes / size.max(1)).clamp(8, 20_000)
}

/// `BENCH_REG=1`: register the buffers with `regMr` and pass the handles,
/// as NCCL does (the verbs transport then writes straight into them).
fn reg(api: &Api, comm: P, buf: &[u8]) -> P {
    if env_or("BENCH_REG", "0") == "1" && !buf.is_empty() {
        api.reg(comm, buf.as_ptr().cast_mut(), buf.len())
    } else {
        P::null()
    }
}

fn iters() -> usize {
    env_or("BENCH_ITERS", "20000").parse().unwrap_or(20_000)
}

fn what(k: &str) -> bool {
    let w = env_or("BENCH_WHAT", "both");
    w == "both" || w == k
}

/// Connects both directions in one thread.
fn cross(api: &Api, l: P, peer: &[u8; 128]) -> (P, P) {
    let mut h = *peer;
    let (mut s, mut r) = (P::null(), P::null());
    let t0 = Instant::now();
    while s.is_null() || r.is_null() {
        assert!(t0.elapsed() < LIMIT);
        if s.is_null() {
            s = api.connect(&mut h).unwrap();
        }
        if r.is_null() {
            r = api.accept(l).unwrap();
        }
    }
    (s, r)
}

fn post_recv(api: &Api, r: P, buf: &mut [u8], tag: i32) -> P {
    post_recv_mh(api, r, buf, tag, P::null())
}

fn post_recv_mh(api: &Api, r: P, buf: &mut [u8], tag: i32, mh: P) -> P {
    api.retry(|| api.irecv(r, &[buf.as_mut_ptr()], &[buf.len()], &[tag], &[mh], false))
        .unwrap()
}

fn post_send(api: &Api, s: P, buf: &[u8], tag: i32) -> P {
    post_send_mh(api, s, buf, tag, P::null())
}

fn post_send_mh(api: &Api, s: P, buf: &[u8], tag: i32, mh: P) -> P {
    api.retry(|| api.isend(s, buf.as_ptr(), buf.len(), tag, mh))
        .unwrap()
}

fn spin(api: &Api, req: P) {
    let mut sz = [0];
    while !api.test(req, Some(&mut sz)).unwrap() {}
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn plugin_server(api: &Api, s: P, r: P) {
    let mut ctl = [0u8; 8];
    if what("tput") {
        for size in sizes() {
            let n = count_for(size);
            // Touched up front: page faults are not what we measure.
            let mut bufs: Vec<Vec<u8>> = (0..W).map(|_| vec![0xA5u8; size]).collect();
            let mhs: Vec<P> = bufs.iter().map(|b| reg(api, r, b)).collect();
            let mut reqs: Vec<P> = bufs
                .iter_mut()
                .zip(&mhs)
                .take(n.min(W))
                .map(|(b, &mh)| post_recv_mh(api, r, b, TAG_DATA, mh))
                .collect();
            spin(api, post_send(api, s, &ctl, TAG_CTRL)); // ready
            let mut posted = reqs.len();
            let mut done = 0;
            while done < n {
                let before = done;
                for (k, q) in reqs.iter_mut().enumerate() {
                    if q.is_null() || !api.test(*q, None).unwrap() {
                        continue;
                    }
                    done += 1;
                    *q = if posted < n {
                        posted += 1;
                        post_recv_mh(api, r, &mut bufs[k], TAG_DATA, mhs[k])
                    } else {
                        P::null()
                    };
                }
                if done == before {
                    // Like NCCL's proxy thread: yield the CPU when idle.
                    std::thread::yield_now();
                }
            }
            spin(api, post_send(api, s, &ctl, TAG_CTRL)); // done
            for mh in mhs.into_iter().filter(|m| !m.is_null()) {
                api.dereg(r, mh);
            }
        }
    }
    if what("lat") {
        let total = iters() + 1000;
        let mut q = post_recv(api, r, &mut ctl, TAG_PING);
        for _ in 0..total {
            spin(api, q);
            q = post_recv(api, r, &mut ctl, TAG_PING);
            spin(api, post_send(api, s, &ctl, TAG_PING));
        }
        let _ = q;
    }
}

fn plugin_client(api: &Api, s: P, r: P) {
    let mut ctl = [0u8; 8];
    if what("tput") {
        for size in sizes() {
            let n = count_for(size);
            let src = net::pattern(size, 1);
            let smh = reg(api, s, &src);
            spin(api, post_recv(api, r, &mut ctl, TAG_CTRL)); // ready
            let done_q = post_recv(api, r, &mut ctl, TAG_CTRL);
            let t0 = Instant::now();
            let mut reqs: Vec<P> = Vec::new();
            let mut sent = 0;
            while sent < n || !reqs.is_empty() {
                while sent < n && reqs.len() < W {
                    reqs.push(post_send_mh(api, s, &src, TAG_DATA, smh));
                    sent += 1;
                }
                let before = reqs.len();
                reqs.retain(|q| !api.test(*q, None).unwrap());
                if reqs.len() == before {
                    // Like NCCL's proxy thread: yield the CPU when idle.
                    std::thread::yield_now();
                }
            }
            spin(api, done_q);
            let dt = t0.elapsed().as_secs_f64();
            if !smh.is_null() {
                api.dereg(s, smh);
            }
            println!(
                "RESULT tput size={size} count={n} bytes_per_s={:.0}",
                (size * n) as f64 / dt
            );
        }
    }
    if what("lat") {
        let it = iters();
        let batch = it / 5;
        let mut q = post_recv(api, r, &mut ctl, TAG_PING);
        let mut rtts = Vec::new();
        let mut each = Vec::with_capacity(it);
        for b in 0..6 {
            let m = if b == 0 { 1000 } else { batch };
            let t0 = Instant::now();
            let mut t = t0;
            for _ in 0..m {
                let sq = post_send(api, s, &ctl, TAG_PING);
                spin(api, q);
                q = post_recv(api, r, &mut ctl, TAG_PING);
                spin(api, sq);
                let now = Instant::now();
                if b > 0 {
                    each.push((now - t).as_secs_f64() * 1e6);
                }
                t = now;
            }
            if b > 0 {
                rtts.push(t0.elapsed().as_secs_f64() * 1e6 / m as f64);
            }
        }
        let _ = q;
        println!(
            "RESULT lat rtt_us={:.3} p50_us={:.3}",
            median(rtts),
            median(each)
        );
    }
}

fn tcp_server() {
    let addr = env_or("BENCH_ADDR", "127.0.0.1");
    let l = TcpListener::bind((addr.as_str(), 0)).unwrap();
    println!("PORT {}", l.local_addr().unwrap().port());
    let (mut c, _) = l.accept().unwrap();
    c.set_nodelay(true).unwrap();
    c.set_nonblocking(true).unwrap();
    // With BENCH_TCP_SOCKS=2, replies go on a second connection, as with a
    // plugin's separate send and receive comms.
    let mut back = match two_socks() {
        true => l.accept().unwrap().0,
        false => c.try_clone().unwrap(),
    };
    back.set_nodelay(true).unwrap();
    let mut b = [0u8; 8];
    for _ in 0..iters() + 1000 {
        read8(&mut c, &mut b);
        write8(&mut back, &b);
    }
}

/// `BENCH_TCP_PEEK` (0, 1 or 2), read once (not on every message).
fn tcp_peek() -> usize {
    static V: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *V.get_or_init(|| env_or("BENCH_TCP_PEEK", "0").parse().unwrap_or(0))
}

/// `BENCH_TCP_QUICKACK`, read once.
fn tcp_quickack_every() -> usize {
    static V: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *V.get_or_init(|| env_or("BENCH_TCP_QUICKACK", "0").parse().unwrap_or(0))
}

fn two_socks() -> bool {
    env_or("BENCH_TCP_SOCKS", "1") == "2"
}

fn read8(c: &mut TcpStream, b: &mut [u8; 8]) {
    if tcp_peek() > 0 {
        return peek8(c, b);
    }
    let mut got = 0;
    while got < 8 {
        match c.read(&mut b[got..]) {
            Ok(0) => panic!("peer closed"),
            Ok(n) => got += n,
            Err(e) if e.kind() == ErrorKind::WouldBlock => {}
            Err(e) => panic!("{e}"),
        }
    }
    // BENCH_TCP_QUICKACK=N: clear TCP_QUICKACK every N reads (fewer pure ACKs).
    static READS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let every = tcp_quickack_every();
    if every > 0 && READS.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % every == 0 {
        use std::os::fd::AsRawFd;
        let v: i32 = 0;
        // SAFETY: plain setsockopt on our socket.
        unsafe {
            libc::setsockopt(
                c.as_raw_fd(),
                libc::IPPROTO_TCP,
                libc::TCP_QUICKACK,
                &v as *const i32 as *const _,
                4,
            )
        };
    }
}

/// BENCH_TCP_PEEK=1: peek the message and discard it at the next read, so
/// the ACK that consuming it may trigger leaves after the reply.
/// BENCH_TCP_PEEK=2: the same, but the discard keeps the last byte queued
/// (so the kernel sees a non-empty queue and sends no ACK) except every
/// 8th time, which drains the queue and lets the ACK out.
fn peek8(c: &mut TcpStream, b: &mut [u8; 8]) {
    use std::os::fd::AsRawFd;
    use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
    static PENDING: AtomicUsize = AtomicUsize::new(0);
    static HELD: AtomicUsize = AtomicUsize::new(0);
    static COUNT: AtomicUsize = AtomicUsize::new(0);
    let fd = c.as_raw_fd();
    let mut buf = [0u8; 9];
    if PENDING.swap(0, Relaxed) == 1 {
        let held = HELD.load(Relaxed);
        let keep = usize::from(tcp_peek() == 2 && COUNT.fetch_add(1, Relaxed) % 8 != 7);
        let n = 8 + held - keep;
        // SAFETY: MSG_TRUNC discards without writing to the buffer.
        let got = unsafe {
            libc::recv(
                fd,
                buf.as_mut_ptr().cast(),
                n,
                libc::MSG_TRUNC | libc::MSG_DONTWAIT,
            )
        };
        assert_eq!(got, n as isize);
        HELD.store(keep, Relaxed);
    }
    let held = HELD.load(Relaxed);
    loop {
        // SAFETY: buf has room for held + 8 bytes.
        let n = unsafe {
            libc::recv(
                fd,
                buf.as_mut_ptr().cast(),
                8 + held,
                libc::MSG_PEEK | libc::MSG_DONTWAIT,
            )
        };
        if n == (8 + held) as isize {
            break;
        }
        assert!(n >= 0 || std::io::Error::last_os_error().kind() == ErrorKind::WouldBlock);
    }
    b.copy_from_slice(&buf[held..held + 8]);
    PENDING.store(1, Relaxed);
    let every = tcp_quickack_every();
    if every > 0 {
        let v: i32 = 0;
        // SAFETY: plain setsockopt on our socket.
        unsafe {
            libc::setsockopt(
                fd,
                libc::IPPROTO_TCP,
                libc::TCP_QUICKACK,
                &v as *const i32 as *const _,
                4,
            )
        };
    }
}

fn write8(c: &mut TcpStream, b: &[u8; 8]) {
    let mut off = 0;
    while off < 8 {
        match c.write(&b[off..]) {
            Ok(n) => off += n,
            Err(e) if e.kind() == ErrorKind::WouldBlock => {}
            Err(e) => panic!("{e}"),
        }
    }
}

fn tcp_client() {
    let addr = env_or("BENCH_ADDR", "127.0.0.1");
    let port = read_stdin_line("PORT", LIMIT);
    let mut out = TcpStream::connect(format!("{addr}:{port}")).unwrap();
    out.set_nodelay(true).unwrap();
    let mut c = match two_socks() {
        true => TcpStream::connect(format!("{addr}:{port}")).unwrap(),
        false => out.try_clone().unwrap(),
    };
    c.set_nonblocking(true).unwrap();
    let mut b = [7u8; 8];
    let batch = iters() / 5;
    let mut rtts = Vec::new();
    let mut each = Vec::with_capacity(iters());
    for k in 0..6 {
        let m = if k == 0 { 1000 } else { batch };
        let t0 = Instant::now();
        let mut t = t0;
        for _ in 0..m {
            write8(&mut out, &b);
            read8(&mut c, &mut b);
            let now = Instant::now();
            if k > 0 {
                each.push((now - t).as_secs_f64() * 1e6);
            }
            t = now;
        }
        if k > 0 {
            rtts.push(t0.elapsed().as_secs_f64() * 1e6 / m as f64);
        }
    }
    let kind = if two_socks() { "tcplat2" } else { "tcplat" };
    println!(
        "RESULT {kind} rtt_us={:.3} p50_us={:.3}",
        median(rtts),
        median(each)
    );
}

/// Plays a benchmark role in a child process; does nothing otherwise.
#[test]
fn child_role() {
    let role = match std::env::var("HETCCL_NET_ROLE") {
        Ok(r) => r,
        Err(_) => return,
    };
    match role.as_str() {
        "tcp_server" => return tcp_server(),
        "tcp_client" => return tcp_client(),
        _ => {}
    }
    let api = Api::v12_of(net::lib());
    let (h, l) = api.listen();
    println!("HANDLE {}", hex(&h));
    let peer = unhex(&read_stdin_line("HANDLE", LIMIT));
    let (s, r) = cross(&api, l, &peer);
    match role.as_str() {
        "plugin_server" => plugin_server(&api, s, r),
        "plugin_client" => plugin_client(&api, s, r),
        other => panic!("unknown role {other}"),
    }
    println!("FINISHED");
    api.close_send(s);
    api.close_recv(r);
    api.close_listen(l);
    api.finalize();
}

fn pair_env(k: &str, i: usize) -> Option<String> {
    std::env::var(k)
        .ok()
        .map(|v| v.split(',').nth(i).unwrap_or_default().to_string())
}

/// The driver: starts the two roles and prints their results.
#[test]
#[ignore = "benchmark; run by bench-scripts/net-bench.sh"]
fn net_bench() {
    let mode = env_or("BENCH_MODE", "plugin");
    let ns = |i| pair_env("BENCH_NETNS", i);
    let env = |i: usize| -> Vec<(&str, String)> {
        let mut e = Vec::new();
        if let Some(ifn) = pair_env("BENCH_IFS", i) {
            e.push(("HETCCL_SOCKET_IFNAME", format!("={ifn}")));
        }
        if let Some(a) = pair_env("BENCH_ADDRS", 0) {
            e.push(("BENCH_ADDR", a));
        }
        e
    };
    let long = std::time::Duration::from_secs(300);
    let mut client = if mode == "tcp" {
        let server = Proc::spawn("tcp_server", ns(0).as_deref(), &env(0));
        let port = server.expect("PORT", LIMIT);
        let mut client = Proc::spawn("tcp_client", ns(1).as_deref(), &env(1));
        client.send_line(&format!("PORT {port}"));
        let res = client.expect("RESULT", long);
        println!("RESULT {res}");
        let mut server = server;
        assert!(client.wait_ok(LIMIT) && server.wait_ok(LIMIT));
        return;
    } else {
        let mut server = Proc::spawn("plugin_server", ns(0).as_deref(), &env(0));
        let sh = server.expect("HANDLE", LIMIT);
        let mut client = Proc::spawn("plugin_client", ns(1).as_deref(), &env(1));
        let ch = client.expect("HANDLE", LIMIT);
        client.send_line(&format!("HANDLE {sh}"));
        server.send_line(&format!("HANDLE {ch}"));
        (client, server)
    };
    loop {
        let line = client.0.expect("", long);
        if line.contains("FINISHED") {
            break;
        }
        if let Some(i) = line.find("RESULT ") {
            println!("{}", &line[i..]);
        }
    }
    assert!(client.0.wait_ok(LIMIT) && client.1.wait_ok(LIMIT));
}
