//! Dead and stuck peers through the net plugin's API (what NVIDIA's NCCL
//! would call with `NCCL_NET_PLUGIN=hetccl`): a survivor and a victim
//! process (this binary in two roles, `tests/net/procs.rs`) exchange 128 MiB
//! messages in both directions in a loop, every received message checked.
//! (128 MiB is more than the kernel buffers of the data sockets hold, so a
//! send to a stopped peer cannot complete. A receive alone never times out
//! in the plugin: NCCL posts receives long before the data comes, so an
//! idle receive is not a stall; NCCL or the application decides then.)
//! The parent kills the victim with `kill -9`, or stops it with `SIGSTOP`,
//! in the middle of the loop. The survivor's pending requests must fail
//! with `ncclRemoteError` (6) or `ncclSystemError` (2) — at once for
//! kill -9 (closed sockets), within `HETCCL_TIMEOUT_S` (3 s) plus a margin
//! for SIGSTOP (the stall limit of a data-socket task that moves nothing, or
//! of a send whose CTS does not come while nothing else moves), the margin
//! being 4 s — and closing every comm and finalizing must take under 1 s.
//!
//! Trials per fault: `HETCCL_STRESS_REPS` (default 1); one `STRESS` line
//! each.

use std::time::{Duration, Instant};

use hetccl_testkit::net;
use hetccl_testkit::net::procs::{cross_connect, hex, read_stdin_line, unhex, Proc};
use hetccl_testkit::net::{pattern, Api, LIMIT, P};

const MSG: usize = 128 << 20;
const TIMEOUT_S: f64 = 3.0;
/// Slack for a loaded 2-core machine on top of HETCCL_TIMEOUT_S.
const MARGIN_S: f64 = 4.0;

/// Posts a receive and a send of `MSG` bytes and polls both; `Err(code)` as
/// soon as either fails.
fn exchange(api: &Api, s: P, r: P, out: &[u8], buf: &mut [u8]) -> Result<(), i32> {
    let rq = api.retry(|| api.irecv(r, &[buf.as_mut_ptr()], &[MSG], &[0], &[], false))?;
    let sq = api.retry(|| api.isend(s, out.as_ptr(), MSG, 0, P::null()))?;
    let (mut rd, mut sd) = (false, false);
    let t0 = Instant::now();
    while !(rd && sd) {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "requests neither completed nor failed"
        );
        if !rd {
            rd = api.test(rq, None)?;
        }
        if !sd {
            sd = api.test(sq, None)?;
        }
    }
    Ok(())
}

/// Survivor and victim differ only in who listens first.
fn role_loop(survivor: bool) {
    // The message and the buffer first: made after connecting, 128 MiB
    // each in a debug build on a loaded machine, they could keep one side
    // from moving bytes for longer than the peer's stall limit (3 s).
    let out = pattern(MSG, 9);
    let mut buf = vec![0u8; MSG];
    let api = Api::v12_of(net::lib());
    let (h, l) = api.listen();
    println!("HANDLE {}", hex(&h));
    let peer = if survivor {
        unhex(&read_stdin_line("HANDLE", LIMIT))
    } else {
        unhex(&std::env::var("HETCCL_NET_HANDLE").expect("HETCCL_NET_HANDLE"))
    };
    let (s, r) = cross_connect(&api, l, &peer);
    let mut wrong = 0;
    let mut iter = 0u64;
    let code = loop {
        buf.fill(0);
        if let Err(c) = exchange(&api, s, r, &out, &mut buf) {
            break c;
        }
        wrong += usize::from(buf != out);
        if iter == 0 {
            println!("RUNNING");
        }
        iter += 1;
    };
    println!("FAILED {code} {iter} {wrong}");
    let t = Instant::now();
    api.close_send(s);
    api.close_recv(r);
    api.close_listen(l);
    api.finalize();
    println!("CLOSED {}", t.elapsed().as_millis());
    println!("OK");
}

/// Plays the role named by `HETCCL_NET_ROLE`; does nothing in a normal run.
#[test]
fn child_role() {
    match std::env::var("HETCCL_NET_ROLE").as_deref() {
        Ok("survivor") => role_loop(true),
        Ok("victim") => role_loop(false),
        Ok(other) => panic!("unknown role {other}"),
        Err(_) => {}
    }
}

fn reps() -> usize {
    std::env::var("HETCCL_STRESS_REPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1)
}

/// One trial; `Err` says what went wrong.
fn trial(sig: i32, delay: Duration) -> Result<(f64, u64), String> {
    let env = |extra: Option<(&'static str, String)>| {
        let mut e = vec![
            ("HETCCL_SOCKET_IFNAME", "=lo".to_string()),
            ("HETCCL_TIMEOUT_S", TIMEOUT_S.to_string()),
        ];
        e.extend(extra);
        e
    };
    let mut surv = Proc::spawn("survivor", None, &env(None));
    let sh = surv.expect("HANDLE", LIMIT);
    let mut victim = Proc::spawn("victim", None, &env(Some(("HETCCL_NET_HANDLE", sh))));
    let vh = victim.expect("HANDLE", LIMIT);
    surv.send_line(&format!("HANDLE {vh}"));
    surv.expect("RUNNING", LIMIT);
    std::thread::sleep(delay);
    // SAFETY: kill(2) of our own child.
    unsafe { libc::kill(victim.child.id() as i32, sig) };
    let t = Instant::now();
    let limit = Duration::from_secs_f64(TIMEOUT_S + MARGIN_S);
    let failed = surv.expect("FAILED", limit);
    let detect = t.elapsed().as_secs_f64() * 1e3;
    let closed: u64 = surv.expect("CLOSED", LIMIT).parse().unwrap_or(u64::MAX);
    let ok = surv.wait_ok(LIMIT);
    // SAFETY: as above (a stopped victim dies of SIGKILL too).
    unsafe { libc::kill(victim.child.id() as i32, libc::SIGKILL) };
    let _ = victim.child.wait();
    let f: Vec<&str> = failed.split_whitespace().collect();
    let mut bad = Vec::new();
    if !matches!(f.first(), Some(&"2") | Some(&"6")) {
        bad.push(format!("request failed with {:?}, want 2 or 6", f.first()));
    }
    if f.get(2) != Some(&"0") {
        bad.push(format!("{:?} wrong messages before the fault", f.get(2)));
    }
    if closed > 1000 {
        bad.push(format!("closing took {closed} ms"));
    }
    if !ok {
        bad.push("the survivor did not exit cleanly".into());
    }
    if bad.is_empty() {
        Ok((detect, closed))
    } else {
        Err(bad.join("; "))
    }
}

fn scenario(name: &str, sig: i32) {
    let t0 = Instant::now();
    let n = reps();
    let (mut worst, mut worst_close, mut failures) = (0f64, 0u64, Vec::new());
    for t in 0..n {
        match trial(sig, Duration::from_millis((t as u64 * 37) % 50)) {
            Ok((d, c)) => {
                worst = worst.max(d);
                worst_close = worst_close.max(c);
            }
            Err(e) => failures.push(format!("trial {t}: {e}")),
        }
    }
    eprintln!(
        "STRESS {name}: trials {n} hangs 0 crashes 0 wrong 0 bad {} max_detect_ms {worst:.0} \
         max_abort_ms {worst_close} time_s {:.1}",
        failures.len(),
        t0.elapsed().as_secs_f64()
    );
    assert!(failures.is_empty(), "{name}: {failures:?}");
}

#[test]
fn kill_9_through_the_net_plugin() {
    scenario("kill9_netplugin", libc::SIGKILL);
}

/// The victim stops; the survivor's pending requests fail on the plugin's
/// stall limits: a data-socket task with nothing moving, or a send whose
/// CTS does not come while nothing else of the comm moves (the victim was
/// stopped between two exchanges, so only the survivor's next MSG frame is
/// out, and its receive is idle).
#[test]
fn sigstop_through_the_net_plugin() {
    scenario("sigstop_netplugin", libc::SIGSTOP);
}
