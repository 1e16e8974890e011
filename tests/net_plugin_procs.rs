//! Net-plugin harness, part 2: two processes over loopback, two network
//! namespaces joined by veth, kill -9 of the peer, and init/finalize with
//! dlclose and reload. Each peer is this binary run again in a role.

use std::time::{Duration, Instant};

use hetccl_testkit::net;
use hetccl_testkit::net::procs::{cross_connect, hex, read_stdin_line, unhex, Netns, Proc};
use hetccl_testkit::net::{exchange, pattern, Api, LIMIT, OK, P};

/// Sizes of the messages the two-process tests exchange.
const SIZES: [usize; 9] = [0, 8, 128, 129, 4096, 65536, 1 << 20, (8 << 20) + 5, 3];

fn role_api() -> Api {
    match std::env::var("HETCCL_NET_API").as_deref() {
        Ok("v8") => Api::v8_of(net::lib()),
        _ => Api::v12_of(net::lib()),
    }
}

fn recv_checked(api: &Api, r: P, len: usize, tag: i32, seed: u32) -> Vec<u8> {
    let mut buf = vec![0u8; len + 64];
    let rq = api
        .retry(|| api.irecv(r, &[buf.as_mut_ptr()], &[len + 64], &[tag], &[], false))
        .unwrap();
    let mut sz = [-1];
    api.wait(rq, &mut sz).expect("receive");
    assert_eq!(sz[0] as usize, len);
    buf.truncate(len);
    assert!(buf == pattern(len, seed), "payload {len}");
    buf
}

fn send_all(api: &Api, s: P, msgs: &[Vec<u8>]) {
    let reqs: Vec<P> = msgs
        .iter()
        .enumerate()
        .map(|(i, m)| {
            api.retry(|| api.isend(s, m.as_ptr(), m.len(), i as i32, P::null()))
                .unwrap()
        })
        .collect();
    for r in api.wait_all(&reqs, 1) {
        r.expect("send");
    }
}

fn role_server() {
    let api = role_api();
    let (h, l) = api.listen();
    println!("HANDLE {}", hex(&h));
    let peer = unhex(&read_stdin_line("HANDLE", LIMIT));
    let (s, r) = cross_connect(&api, l, &peer);
    let got: Vec<Vec<u8>> = SIZES
        .iter()
        .enumerate()
        .map(|(i, &n)| recv_checked(&api, r, n, i as i32, i as u32))
        .collect();
    send_all(&api, s, &got);
    api.close_send(s);
    api.close_recv(r);
    api.close_listen(l);
    api.finalize();
    println!("OK");
}

fn role_client() {
    let api = role_api();
    let peer = unhex(&std::env::var("HETCCL_NET_HANDLE").expect("HETCCL_NET_HANDLE"));
    let (h, l) = api.listen();
    println!("HANDLE {}", hex(&h));
    let (s, r) = cross_connect(&api, l, &peer);
    let msgs: Vec<Vec<u8>> = SIZES
        .iter()
        .enumerate()
        .map(|(i, &n)| pattern(n, i as u32))
        .collect();
    send_all(&api, s, &msgs);
    for (i, &n) in SIZES.iter().enumerate() {
        recv_checked(&api, r, n, i as i32, i as u32);
    }
    api.close_send(s);
    api.close_recv(r);
    api.close_listen(l);
    api.finalize();
    println!("OK");
}

fn role_victim() {
    let api = role_api();
    let peer = unhex(&std::env::var("HETCCL_NET_HANDLE").expect("HETCCL_NET_HANDLE"));
    let (h, l) = api.listen();
    println!("HANDLE {}", hex(&h));
    let (s, _r) = cross_connect(&api, l, &peer);
    api.send_wait(s, &pattern(1024, 1), 0).unwrap();
    println!("SENT");
    std::thread::sleep(Duration::from_secs(120));
}

fn helper_threads() -> usize {
    let Ok(rd) = std::fs::read_dir("/proc/self/task") else {
        return 0;
    };
    rd.filter_map(Result::ok)
        .filter(|t| {
            std::fs::read_to_string(t.path().join("comm"))
                .is_ok_and(|c| c.starts_with("nccl-net-plugin"))
        })
        .count()
}

fn lib_mapped() -> bool {
    std::fs::read_to_string("/proc/self/maps").is_ok_and(|m| m.contains("libhetccl.so"))
}

fn role_reload() {
    for round in 0..2 {
        let lib = net::open();
        let api = if round == 0 {
            Api::v12_of(&lib)
        } else {
            Api::v8_of(&lib)
        };
        let (s, r) = api.pair();
        exchange(
            &api,
            s,
            r,
            &[(0, pattern(8, 1)), (0, pattern(4 << 20, 2))],
            4 << 20,
        );
        if round == 0 {
            // A pair left open: finalize must still stop its helper threads.
            let (s2, r2) = api.pair();
            exchange(&api, s2, r2, &[(1, pattern(1 << 20, 3))], 1 << 20);
            if net::ib_dev().is_none() {
                assert!(helper_threads() > 0, "data sockets have helper threads");
            }
            api.close_send(s);
            api.close_recv(r);
            api.finalize();
        } else {
            api.close_send(s);
            api.close_recv(r);
        }
        assert_eq!(
            helper_threads(),
            0,
            "round {round}: helper threads left after finalize/close"
        );
        let _ = api;
        drop(lib);
        println!("UNLOADED {round} {}", !lib_mapped());
    }
    println!("OK");
}

/// Lines NCCL's logger stand-in received: (level, flags, message).
static LOGGED: std::sync::Mutex<Vec<(i32, u64, String)>> = std::sync::Mutex::new(Vec::new());

/// A stand-in for NCCL's logger. hetccl always calls it with the format
/// "%s" and one string, so a fixed-argument function reads the call
/// correctly on x86-64 (variadic and fixed calls pass these in the same
/// registers).
unsafe extern "C" fn fake_logger(
    level: i32,
    flags: u64,
    _file: *const std::ffi::c_char,
    _line: i32,
    fmt: *const std::ffi::c_char,
    arg: *const std::ffi::c_char,
) {
    // SAFETY: NUL-terminated strings from the caller.
    let (fmt, msg) = unsafe { (std::ffi::CStr::from_ptr(fmt), arg) };
    let msg = if fmt.to_bytes() == b"%s" {
        // SAFETY: as above.
        unsafe { std::ffi::CStr::from_ptr(msg) }
            .to_string_lossy()
            .into_owned()
    } else {
        fmt.to_string_lossy().into_owned()
    };
    LOGGED.lock().unwrap().push((level, flags, msg));
}

fn role_logger() {
    type Fixed = unsafe extern "C" fn(
        i32,
        u64,
        *const std::ffi::c_char,
        i32,
        *const std::ffi::c_char,
        *const std::ffi::c_char,
    );
    type Variadic =
        unsafe extern "C" fn(i32, u64, *const std::ffi::c_char, i32, *const std::ffi::c_char, ...);
    // SAFETY: see fake_logger; only the pointer's type changes.
    let logger: hetccl::abi::net::ncclDebugLogger_t =
        Some(unsafe { std::mem::transmute::<Fixed, Variadic>(fake_logger as Fixed) });
    let api = Api::v12_with_logger(net::lib(), logger);
    let b = [0u8; 8];
    assert!(api.isend(P::null(), b.as_ptr(), 8, 0, P::null()).is_err());
    let lines = LOGGED.lock().unwrap().clone();
    for (level, flags, msg) in &lines {
        println!("LOGGED {level} {flags:#x} {msg}");
    }
    let warn = lines
        .iter()
        .any(|(l, f, m)| *l == 2 && *f & 0x10 != 0 && m.contains("isend") && m.contains("NULL"));
    let dev0 = net::ib_dev().map_or_else(|| "lo".to_string(), |d| format!("NET/IB {d}:1"));
    let info = lines
        .iter()
        .any(|(l, _, m)| *l == 3 && m.contains(&format!("device 0: {dev0}")));
    assert!(
        warn,
        "the failed isend is logged at WARN under NET through NCCL's logger"
    );
    assert!(
        info,
        "the device line is logged at INFO through NCCL's logger"
    );
    api.finalize();
    println!("OK");
}

/// Plays the role named by `HETCCL_NET_ROLE`; does nothing in a normal run.
#[test]
fn child_role() {
    match std::env::var("HETCCL_NET_ROLE").as_deref() {
        Ok("server") => role_server(),
        Ok("client") => role_client(),
        Ok("victim") => role_victim(),
        Ok("reload") => role_reload(),
        Ok("logger") => role_logger(),
        Ok(other) => panic!("unknown role {other}"),
        Err(_) => {}
    }
}

/// Runs server and client, optionally in two namespaces, and checks both say OK.
fn run_pair(netns: Option<&Netns>) {
    let env = |k: usize| -> Vec<(&str, String)> {
        let mut e = vec![(
            "HETCCL_NET_API",
            if k == 0 { "v8" } else { "v12" }.to_string(),
        )];
        if let Some(n) = netns {
            e.push(("HETCCL_SOCKET_IFNAME", format!("={}", n.ifs[k])));
        }
        e
    };
    let ns = |k: usize| netns.map(|n| n.ns[k].clone());
    let mut server = Proc::spawn("server", ns(0).as_deref(), &env(0));
    let sh = server.expect("HANDLE", LIMIT);
    let mut cenv = env(1);
    cenv.push(("HETCCL_NET_HANDLE", sh));
    let mut client = Proc::spawn("client", ns(1).as_deref(), &cenv);
    let ch = client.expect("HANDLE", LIMIT);
    if let Some(n) = netns {
        let h = unhex(&ch);
        assert_eq!(
            &h[8..12],
            n.addrs[1].parse::<std::net::Ipv4Addr>().unwrap().octets(),
            "client listens on its veth"
        );
    }
    server.send_line(&format!("HANDLE {ch}"));
    server.expect("OK", LIMIT);
    client.expect("OK", LIMIT);
    assert!(
        server.wait_ok(LIMIT) && client.wait_ok(LIMIT),
        "children exit cleanly"
    );
}

#[test]
fn two_processes_over_loopback() {
    net::setup_env();
    run_pair(None);
}

#[test]
fn two_network_namespaces_over_veth() {
    net::setup_env();
    let n = match Netns::create("p") {
        Ok(n) => n,
        Err(e) => {
            eprintln!("network namespaces unavailable: {e}");
            assert!(
                std::env::var("HETCCL_REQUIRE_NETNS").as_deref() != Ok("1"),
                "HETCCL_REQUIRE_NETNS=1: {e}"
            );
            return;
        }
    };
    run_pair(Some(&n));
}

#[test]
fn kill_9_of_the_peer_fails_requests_cleanly() {
    let api = Api::v12_of(net::lib());
    let (h, l) = api.listen();
    let mut victim = Proc::spawn("victim", None, &[("HETCCL_NET_HANDLE", hex(&h))]);
    let peer = unhex(&victim.expect("HANDLE", LIMIT));
    let (s, r) = cross_connect(&api, l, &peer);
    let mut buf = vec![0u8; 64 << 20];
    let rq = api
        .retry(|| api.irecv(r, &[buf.as_mut_ptr()], &[64 << 20], &[0], &[], false))
        .unwrap();
    let mut sz = [0];
    api.wait(rq, &mut sz).unwrap();
    assert_eq!(sz[0], 1024);
    victim.expect("SENT", LIMIT);
    // Pending on the peer: a receive it will never satisfy and a 64 MiB send
    // it will never clear.
    let rq = api
        .retry(|| api.irecv(r, &[buf.as_mut_ptr()], &[64 << 20], &[0], &[], false))
        .unwrap();
    let big = pattern(64 << 20, 5);
    let sq = api
        .retry(|| api.isend(s, big.as_ptr(), big.len(), 0, P::null()))
        .unwrap();
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_millis(200) {
        assert_eq!(api.test(rq, None), Ok(false));
        assert_eq!(api.test(sq, None), Ok(false));
    }
    assert_eq!(
        // SAFETY: plain kill(2) of our own child.
        unsafe { libc::kill(victim.child.id() as i32, libc::SIGKILL) },
        0
    );
    let t0 = Instant::now();
    let res = api.wait_all(&[rq, sq], 1);
    eprintln!("peer death detected in {:?}", t0.elapsed());
    assert!(
        res.iter().all(|r| r.is_err()),
        "both requests fail: {res:?}"
    );
    // Later calls keep failing cleanly.
    let b = [0u8; 8];
    assert!(api.isend(s, b.as_ptr(), 8, 0, P::null()).is_err());
    assert!(api
        .irecv(r, &[buf.as_mut_ptr()], &[8], &[0], &[], false)
        .is_err());
    api.close_send(s);
    api.close_recv(r);
    api.close_listen(l);
    api.finalize();
    let _ = victim.wait_ok(LIMIT);
}

#[test]
fn init_finalize_dlclose_and_reload() {
    net::setup_env();
    let mut p = Proc::spawn("reload", None, &[]);
    let u0 = p.expect("UNLOADED 0", LIMIT);
    let u1 = p.expect("UNLOADED 1", LIMIT);
    p.expect("OK", LIMIT);
    assert!(p.wait_ok(LIMIT), "reload child exits cleanly");
    eprintln!("library unmapped after dlclose: first {u0}, second {u1}");
    let _ = OK;
}

#[test]
fn nccl_logger_receives_our_log_lines() {
    net::setup_env();
    let env = [
        ("NCCL_DEBUG", "INFO".to_string()),
        ("NCCL_DEBUG_SUBSYS", "ALL".to_string()),
    ];
    let mut p = Proc::spawn("logger", None, &env);
    p.expect("OK", LIMIT);
    assert!(p.wait_ok(LIMIT), "logger child exits cleanly");
}
