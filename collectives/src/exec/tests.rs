//! Executor tests over real TCP links with a silent peer.

use std::sync::Arc;
use std::time::{Duration, Instant};

use hetccl_abi::DataType;

use super::*;
use crate::algo::{Algorithm, BufRange, Collective, Step, StepKind};
use crate::reduce::ReduceOp;

/// Rank 0's links to a rank 1 that holds the other ends (TCP through
/// `nccl-net-plugin` on loopback) and never sends unless a test makes it.
fn links_to_silent_peer() -> (Links, Vec<Conn>) {
    let (mine, theirs) = crate::transport::net::loopback_pair(NCHAN).unwrap();
    let links = Links {
        rank: 0,
        label: "comm 0000000000000abc".into(),
        peers: vec![None, Some(mine)],
        bell: None,
        stop: Arc::default(),
        watch: watch::Watch::none(),
        metrics: metrics(2),
        cross_node: vec![false; 2],
        bufs: Default::default(),
    };
    (links, theirs)
}

/// Rank 0's metrics with TCP links to `n - 1` peers.
fn metrics(n: usize) -> Arc<crate::telemetry::Metrics> {
    let t: Vec<_> = (0..n)
        .map(|p| (p != 0).then_some(crate::cost::TransportKind::Tcp))
        .collect();
    Arc::new(crate::telemetry::Metrics::new(0, &t))
}

fn recv_job(buf: &mut [u8]) -> Job {
    let dst = BufRange::new(BufId::Recv, 0, buf.len());
    Job {
        plan: Arc::new(Plan {
            collective: Collective::Recv,
            algorithm: Algorithm::Direct,
            rank: 0,
            nranks: 2,
            dtype: DataType::Int8,
            op: ReduceOp::Sum,
            send_bytes: 0,
            recv_bytes: buf.len(),
            scratch_bytes: 0,
            wire: hetccl_core::config::Compression::Off,
            steps: vec![Step {
                kind: StepKind::Recv {
                    peer: 1,
                    chan: 0,
                    dst,
                },
                deps: vec![],
            }],
        }),
        bufs: OpBuffers {
            send: crate::user_ptr::UserPtr::NULL,
            recv: crate::user_ptr::UserPtr::new(buf.as_mut_ptr()),
            scratch: Vec::new(),
            staged_send: Vec::new(),
        },
        p2p: true,
        trace: Trace {
            comm_hash: 0xabc,
            seq: 7,
            id: Default::default(),
        },
        self_p2p: false,
        fingerprint: None,
    }
}

#[test]
fn a_silent_peer_times_out_with_a_description() {
    let (links, _theirs) = links_to_silent_peer();
    let mut buf = vec![0u8; 100];
    let mut b = vec![Batch::new(&links, vec![recv_job(&mut buf)]).unwrap()];
    let p = Patience {
        spin: Duration::from_micros(10),
        hang_report: Some(Duration::from_millis(50)),
        stall_timeout: Duration::from_millis(300),
    };
    let t = Instant::now();
    let err = drive(&mut b, p).unwrap_err();
    assert!(t.elapsed() >= Duration::from_millis(250) && t.elapsed() < Duration::from_secs(10));
    // A stalled operation is a peer failure (ncclRemoteError), not ncclTimeout.
    assert_eq!(err.code(), hetccl_abi::NcclResult::RemoteError, "{err}");
    let e = err.to_string();
    assert!(e.contains("no progress from rank(s) 1 for"), "{e}");
    assert!(
        e.starts_with("remote error: comm 0000000000000abc: "),
        "{e}"
    );
    assert!(e.contains("waits for data from rank 1"), "{e}");
    assert!(e.contains("0/100 bytes"), "{e}");
    assert!(e.contains("recv seq 7 trace 0000000000000abc:7"), "{e}");
}

#[test]
fn a_late_message_within_the_stall_limit_completes() {
    let (links, theirs) = links_to_silent_peer();
    let mut buf = vec![0u8; 100];
    let mut b = vec![Batch::new(&links, vec![recv_job(&mut buf)]).unwrap()];
    let p = Patience {
        spin: Duration::ZERO,
        hang_report: None,
        stall_timeout: Duration::from_millis(400),
    };
    let sender = std::thread::spawn(move || {
        // The message comes late, but within the stall limit.
        std::thread::sleep(Duration::from_millis(300));
        let msg: Vec<u8> = (0..100u8).map(|i| i / 10).collect();
        let mut off = 0;
        while off < msg.len() {
            off += theirs[P2P_CHAN].tx.try_send(&msg[off..]).unwrap();
        }
        theirs
    });
    drive(&mut b, p).unwrap();
    drop(b);
    let _ = sender.join().unwrap();
    for (i, c) in buf.chunks(10).enumerate() {
        assert!(c.iter().all(|&x| x == i as u8));
    }
}

#[test]
fn abort_flag_ends_the_wait() {
    let (links, _theirs) = links_to_silent_peer();
    let mut buf = vec![0u8; 8];
    let stop = links.stop.clone();
    let mut b = vec![Batch::new(&links, vec![recv_job(&mut buf)]).unwrap()];
    let t = Instant::now();
    let h = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(100));
        stop.abort();
    });
    let p = Patience {
        spin: Duration::ZERO,
        hang_report: None,
        stall_timeout: Duration::from_secs(60),
    };
    assert!(drive(&mut b, p).is_err());
    assert!(t.elapsed() < Duration::from_secs(5));
    h.join().unwrap();
}

#[test]
fn a_failed_operation_closes_its_links() {
    let (links, theirs) = links_to_silent_peer();
    let mut buf = vec![0u8; 8];
    let mut b = vec![Batch::new(&links, vec![recv_job(&mut buf)]).unwrap()];
    let p = Patience {
        spin: Duration::ZERO,
        hang_report: None,
        stall_timeout: Duration::from_millis(100),
    };
    assert!(drive(&mut b, p).is_err());
    drop(b);
    // Our side is closed: later use of the link fails at once.
    let e = links.peers[1].as_ref().unwrap()[P2P_CHAN]
        .tx
        .try_send(&[1, 2, 3])
        .unwrap_err();
    assert_eq!(e.code(), hetccl_abi::NcclResult::RemoteError, "{e}");
    assert!(!links.stop.is_set());
    drop(theirs);
}

#[test]
fn the_board_reports_a_dead_local_process() {
    // A child that exits at once: its pid is gone (and reaped) afterwards.
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let pid = child.id();
    child.wait().unwrap();
    let hash = 0x5eed_0000_0000_0000 | u64::from(std::process::id());
    let me = watch::Watch::open(hash, 0, 0, vec![true, true]);
    let peer = watch::Watch::open(hash, 0, 1, vec![true, true]);
    watch::Watch::unlink(hash, 0);
    assert!(!std::path::Path::new(&watch::board_name(hash, 0)).exists());
    // Same process: never reported dead.
    assert_eq!(me.peer_state(1), watch::ProcState::Unknown);
    peer.fake_pid_for_tests(pid);
    assert_eq!(me.peer_state(1), watch::ProcState::Dead);
    peer.fake_pid_for_tests(std::process::id()); // restore
    me.begin(5);
    me.stalled(
        Duration::from_secs(3),
        Some(watch::WaitOn {
            peer: 1,
            step: 2,
            kind: 1,
        }),
    );
    let s = me
        .summary(5, Duration::from_secs(2))
        .expect("rank 0 reports")
        .join("\n");
    assert!(s.contains("rank 0 (pid"), "{s}");
    assert!(s.contains("step 2 waits for data from rank 1"), "{s}");
    assert!(s.contains("rank 1 (has not started seq 5)"), "{s}");
    // Rank 1 is not stalled in seq 5: it does not report.
    assert!(peer.summary(5, Duration::from_secs(2)).is_none());
}

/// With a clock the test controls, a silent peer fails the operation
/// exactly at the stall limit, however long the limit: no real sleeps.
#[test]
fn the_stall_limit_holds_on_a_manual_clock() {
    let (links, _theirs) = links_to_silent_peer();
    let mut buf = vec![0u8; 100];
    let mut b = vec![Batch::new(&links, vec![recv_job(&mut buf)]).unwrap()];
    let p = Patience {
        spin: Duration::from_micros(10),
        hang_report: Some(Duration::from_secs(60)),
        stall_timeout: Duration::from_secs(300),
    };
    let clock = clock::ManualClock::default();
    let (t0, real) = (clock::Clock::now(&clock), Instant::now());
    let err = drive_with(&mut b, p, &clock).unwrap_err();
    let waited = clock::Clock::now(&clock) - t0;
    assert!(
        waited >= Duration::from_secs(300) && waited < Duration::from_millis(300_100),
        "{waited:?}"
    );
    assert!(real.elapsed() < Duration::from_secs(20), "no real sleeping");
    let e = err.to_string();
    assert!(e.contains("no progress from rank(s) 1 for 300.0 s"), "{e}");
    assert_eq!(err.code(), hetccl_abi::NcclResult::RemoteError);
}

/// A dead local peer is noticed at the first process check (200 ms into
/// the stall), long before the stall limit, on a manual clock.
#[test]
fn a_dead_local_peer_is_noticed_at_the_first_check_on_a_manual_clock() {
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let pid = child.id();
    child.wait().unwrap();
    let hash = 0x5eed_1000_0000_0000 | u64::from(std::process::id());
    let me = watch::Watch::open(hash, 0, 0, vec![true, true]);
    let peer = watch::Watch::open(hash, 0, 1, vec![true, true]);
    watch::Watch::unlink(hash, 0);
    peer.fake_pid_for_tests(pid);
    // Shared-memory links (TCP links report a dead peer themselves).
    let path = format!("/dev/shm/hetccl-exec-test-{}", std::process::id());
    let arena = Arc::new(crate::transport::arena::Arena::create(&path, 2, NCHAN, 1 << 16).unwrap());
    crate::transport::arena::Arena::unlink(&path);
    let mine: Vec<Conn> = (0..NCHAN)
        .map(|c| crate::transport::shm::connect(&arena, 0, 1, c))
        .collect();
    let links = Links {
        rank: 0,
        label: "comm 0000000000000abc".into(),
        peers: vec![None, Some(mine)],
        bell: None,
        stop: Arc::default(),
        watch: me,
        metrics: metrics(3),
        cross_node: vec![false; 3],
        bufs: Default::default(),
    };
    let mut buf = vec![0u8; 8];
    let mut b = vec![Batch::new(&links, vec![recv_job(&mut buf)]).unwrap()];
    let p = Patience {
        spin: Duration::ZERO,
        hang_report: None,
        stall_timeout: Duration::from_secs(300),
    };
    let clock = clock::ManualClock::default();
    let t0 = clock::Clock::now(&clock);
    let e = drive_with(&mut b, p, &clock).unwrap_err().to_string();
    let waited = clock::Clock::now(&clock) - t0;
    assert_eq!(waited, clock::WATCH_AFTER, "{e}");
    assert!(e.contains(&format!("rank 1 (pid {pid}) died")), "{e}");
    peer.fake_pid_for_tests(std::process::id());
}

/// A local peer that finished its part and exited is not a dead peer for a
/// step that only waits for earlier steps: what it sent is in the ring.
/// Here rank 0 first waits for rank 2 (silent), then receives from rank 1,
/// whose process is gone but whose message is already in the ring. Before,
/// the dead-peer check blamed rank 1 at the first check (a rank that had
/// left normally made a peer fail with "rank 1 died").
#[test]
fn a_peer_that_left_after_its_part_is_not_reported_dead() {
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let pid = child.id();
    child.wait().unwrap();
    let hash = 0x5eed_2000_0000_0000 | u64::from(std::process::id());
    let me = watch::Watch::open(hash, 0, 0, vec![true, true, true]);
    let one = watch::Watch::open(hash, 0, 1, vec![true, true, true]);
    watch::Watch::unlink(hash, 0);
    one.fake_pid_for_tests(pid);
    let path = format!("/dev/shm/hetccl-exec-left-{}", std::process::id());
    let arena = Arc::new(crate::transport::arena::Arena::create(&path, 3, NCHAN, 1 << 16).unwrap());
    crate::transport::arena::Arena::unlink(&path);
    let to = |peer: usize| -> Vec<Conn> {
        (0..NCHAN)
            .map(|c| crate::transport::shm::connect(&arena, 0, peer, c))
            .collect()
    };
    // Rank 1 "sent" its 8 bytes before leaving.
    let from_one = crate::transport::shm::connect(&arena, 1, 0, P2P_CHAN);
    assert_eq!(from_one.tx.try_send(&[7u8; 8]).unwrap(), 8);
    let links = Links {
        rank: 0,
        label: "comm 0000000000000abc".into(),
        peers: vec![None, Some(to(1)), Some(to(2))],
        bell: None,
        stop: Arc::default(),
        watch: me,
        metrics: metrics(3),
        cross_node: vec![false; 3],
        bufs: Default::default(),
    };
    let mut buf = vec![0u8; 16];
    let mut job = recv_job(&mut buf);
    let plan = Arc::get_mut(&mut job.plan).unwrap();
    plan.nranks = 3;
    plan.recv_bytes = 16;
    plan.steps = vec![
        Step {
            kind: StepKind::Recv {
                peer: 2,
                chan: 0,
                dst: BufRange::new(BufId::Recv, 0, 8),
            },
            deps: vec![],
        },
        Step {
            kind: StepKind::Recv {
                peer: 1,
                chan: 0,
                dst: BufRange::new(BufId::Recv, 8, 8),
            },
            deps: vec![0],
        },
    ];
    let mut b = vec![Batch::new(&links, vec![job]).unwrap()];
    let p = Patience {
        spin: Duration::ZERO,
        hang_report: None,
        stall_timeout: Duration::from_secs(300),
    };
    let clock = clock::ManualClock::default();
    let e = drive_with(&mut b, p, &clock).unwrap_err().to_string();
    assert!(!e.contains("died"), "{e}");
    assert!(e.contains("no progress from rank(s) 2"), "{e}");
    one.fake_pid_for_tests(std::process::id());
}

/// Sends `msg` on `conn` whole (the peer's side of a test link).
fn send_all(conn: &Conn, msg: &[u8]) {
    let mut off = 0;
    while off < msg.len() {
        off += conn.tx.try_send(&msg[off..]).unwrap();
    }
}

/// Drives jobs that `make` builds on fresh `len`-byte receive buffers
/// through the one-message shortcut, with `msg` sent by the silent peer:
/// first with nothing sent yet (the job must start and finish in a batch
/// from the bytes it moved), then with the message already there (within
/// 20 tries, one must complete at once). Every buffer must end as `want`.
fn shortcut_both_ways(msg: &[u8], len: usize, want: &[u8], make: impl Fn(&mut [u8]) -> Job) {
    let (links, theirs) = links_to_silent_peer();
    let p = Patience {
        spin: Duration::ZERO,
        hang_report: None,
        stall_timeout: Duration::from_secs(5),
    };
    let mut buf = vec![0u8; len];
    let mut job = make(&mut buf);
    let Ok(single::Once::Started(moved)) = single::try_once(&links, &mut job) else {
        panic!("a job with nothing sent completed or was refused");
    };
    send_all(&theirs[P2P_CHAN], msg);
    let mut b = [Batch::one(&links, job, moved).unwrap()];
    drive(&mut b, p).unwrap();
    drop(b);
    assert_eq!(buf, want);
    let mut done_at_once = false;
    for _ in 0..20 {
        send_all(&theirs[P2P_CHAN], msg);
        std::thread::sleep(Duration::from_millis(20));
        let mut buf = vec![0u8; len];
        let mut job = make(&mut buf);
        match single::try_once(&links, &mut job).unwrap() {
            single::Once::Done => done_at_once = true,
            single::Once::Started(moved) => {
                let mut b = [Batch::one(&links, job, moved).unwrap()];
                drive(&mut b, p).unwrap();
            }
            single::Once::Unfit => panic!("the shortcut refused the job"),
        }
        assert_eq!(buf, want);
        if done_at_once {
            break;
        }
    }
    assert!(done_at_once, "an arrived message never completed at once");
}

/// The shortcut of one message: a receive whose message is already there
/// completes in `try_once`; one that is not goes on in a batch from the
/// bytes it moved; the bytes are right either way.
#[test]
fn one_message_completes_at_once_or_goes_on_in_a_batch() {
    let msg: Vec<u8> = (0..100u8).collect();
    shortcut_both_ways(&msg, 100, &msg, recv_job);
}

/// Plans the shortcut leaves to the batch: more than one step, or a
/// receive from this rank itself; nothing moves.
#[test]
fn the_shortcut_refuses_what_it_does_not_take() {
    let (links, theirs) = links_to_silent_peer();
    send_all(&theirs[P2P_CHAN], &[7u8; 16]);
    std::thread::sleep(Duration::from_millis(20));
    let mut buf = vec![0u8; 16];
    let mut two = recv_job(&mut buf);
    let mut plan = (*two.plan).clone();
    plan.steps.push(plan.steps[0].clone());
    two.plan = Arc::new(plan);
    assert_eq!(
        single::try_once(&links, &mut two).unwrap(),
        single::Once::Unfit
    );
    let mut own = recv_job(&mut buf);
    let mut plan = (*own.plan).clone();
    if let StepKind::Recv { peer, .. } = &mut plan.steps[0].kind {
        *peer = 0;
    }
    own.plan = Arc::new(plan);
    assert_eq!(
        single::try_once(&links, &mut own).unwrap(),
        single::Once::Unfit
    );
    assert_eq!(buf, vec![0u8; 16]);
    // The message is still there for a plain receive.
    let mut job = recv_job(&mut buf);
    let r = single::try_once(&links, &mut job).unwrap();
    if let single::Once::Started(moved) = r {
        let p = Patience {
            spin: Duration::ZERO,
            hang_report: None,
            stall_timeout: Duration::from_secs(5),
        };
        let mut b = [Batch::one(&links, job, moved).unwrap()];
        drive(&mut b, p).unwrap();
    }
    assert_eq!(buf, vec![7u8; 16]);
}

/// A message followed by copies that wait for nothing (an out-of-place
/// broadcast root's own copy): the copies run once the message is done,
/// at once or in the batch; a copy with a dependency leaves the plan to
/// the batch.
#[test]
fn a_message_and_free_copies_take_the_shortcut() {
    let input: Vec<u8> = (100..108u8).collect();
    let with_copy = |buf: &mut [u8], deps: Vec<u32>| {
        let mut job = recv_job(buf);
        let mut plan = (*job.plan).clone();
        if let StepKind::Recv { dst, .. } = &mut plan.steps[0].kind {
            *dst = BufRange::new(BufId::Recv, 0, 16);
        }
        plan.send_bytes = input.len();
        plan.steps.push(Step {
            kind: StepKind::Copy {
                src: BufRange::new(BufId::Send, 0, 8),
                dst: BufRange::new(BufId::Recv, 16, 8),
            },
            deps,
        });
        job.plan = Arc::new(plan);
        job.bufs.send = crate::user_ptr::UserPtr::new(input.as_ptr().cast_mut());
        job
    };
    // A copy that depends on the message: refused, nothing moves.
    let (links, _theirs) = links_to_silent_peer();
    let mut buf = vec![0u8; 24];
    let mut job = with_copy(&mut buf, vec![0]);
    assert_eq!(
        single::try_once(&links, &mut job).unwrap(),
        single::Once::Unfit
    );
    drop(job);
    assert_eq!(buf, vec![0u8; 24]);
    // Free copies: run with the message, at once or in the batch.
    let mut want = vec![7u8; 16];
    want.extend_from_slice(&input);
    shortcut_both_ways(&[7u8; 16], 24, &want, |b| with_copy(b, vec![]));
}

/// A link half that only records when it is finished.
#[derive(Debug)]
struct FinishLog {
    what: String,
    log: Arc<parking_lot::Mutex<Vec<String>>>,
}

impl FinishLog {
    fn note(&self) {
        self.log.lock().push(self.what.clone());
    }
}

impl crate::transport::SendLink for FinishLog {
    fn try_send(&self, _src: &[u8]) -> Result<usize> {
        Ok(0)
    }
    fn wait_source(&self) -> WaitSource {
        WaitSource::Poll
    }
    fn close(&self) {}
    fn finish(&self, _deadline: Instant) {
        self.note();
    }
}

impl crate::transport::RecvLink for FinishLog {
    fn try_recv_with(&self, _max: usize, _elem: usize, _f: &mut dyn FnMut(&[u8])) -> Result<usize> {
        Ok(0)
    }
    fn wait_source(&self) -> WaitSource {
        WaitSource::Poll
    }
    fn close(&self) {}
    fn finish(&self, _deadline: Instant) {
        self.note();
    }
}

/// A graceful close finishes every receive side before any send side: a
/// verbs send side waits for its peer's receive side to close, so two
/// ranks that each finished a peer's send side first could wait for each
/// other until the deadline.
#[test]
fn finish_closes_every_receive_side_before_any_send_side() {
    let log = Arc::new(parking_lot::Mutex::new(Vec::new()));
    let half = |what: String| FinishLog {
        what,
        log: log.clone(),
    };
    let conns = |peer: usize| -> Vec<Conn> {
        (0..2)
            .map(|c| Conn {
                tx: Box::new(half(format!("tx {peer}.{c}"))),
                rx: Box::new(half(format!("rx {peer}.{c}"))),
                transport: crate::transport::TransportKind::Verbs,
            })
            .collect()
    };
    let links = Links {
        rank: 0,
        label: "comm 0000000000000abc".into(),
        peers: vec![None, Some(conns(1)), Some(conns(2))],
        bell: None,
        stop: Arc::default(),
        watch: watch::Watch::none(),
        metrics: metrics(3),
        cross_node: vec![true; 3],
        bufs: Default::default(),
    };
    links.finish(Instant::now() + Duration::from_secs(1));
    let got = log.lock().clone();
    assert_eq!(got.len(), 8, "every half finished once: {got:?}");
    let first_tx = got.iter().position(|w| w.starts_with("tx")).unwrap();
    assert!(
        got[..first_tx].len() == 4 && got[first_tx..].iter().all(|w| w.starts_with("tx")),
        "a send side finished before a receive side: {got:?}"
    );
}
