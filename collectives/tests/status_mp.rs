//! The status service across processes: three ranks with `HETCCL_STATUS=1`,
//! where rank 2 waits before joining an allreduce that ranks 0 and 1 are
//! already in. A query on rank 0's status port names rank 2 as the rank the
//! others wait on, within 5 s; with rank 2 stopped (SIGSTOP), it says
//! `no answer` for rank 2 and blames it. Rank 0's hang report logs the same
//! view. The ranks are this test binary run again as child processes.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::ptr::null_mut;
use std::time::{Duration, Instant};

use hetccl_abi::{ncclComm_t, ncclUniqueId};
use hetccl_collectives::api::coll::ncclAllReduce;
use hetccl_collectives::api::comm_init::{ncclCommInitRank, ncclGetUniqueId};
use hetccl_collectives::api::comm_life::ncclCommDestroy;
use hetccl_collectives::telemetry::status::port_file;
use hetccl_testkit::{ranks, threads::check};

const ROLE: &str = "STATUS_TEST_RANK";
const DIR: &str = "STATUS_TEST_DIR";
const TEST: &str = "status_names_the_rank_everyone_waits_on";

fn wait_for(path: &Path, what: &str) -> Vec<u8> {
    let until = Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok(b) = std::fs::read(path) {
            if !b.is_empty() {
                return b;
            }
        }
        assert!(Instant::now() < until, "no {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn publish(path: &Path, b: &[u8]) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, b).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

fn child(rank: usize, dir: &Path) {
    let id = if rank == 0 {
        let mut id = ncclUniqueId::default();
        // SAFETY: a valid out pointer.
        check(unsafe { ncclGetUniqueId(&mut id) });
        publish(&dir.join("id"), &id.internal);
        id
    } else {
        let b = wait_for(&dir.join("id"), "unique id");
        let mut id = ncclUniqueId::default();
        id.internal.copy_from_slice(&b);
        id
    };
    let mut c: ncclComm_t = null_mut();
    // SAFETY: a valid out pointer; rank and size in range.
    check(unsafe { ncclCommInitRank(&mut c, 3, id, rank as i32) });
    publish(
        &dir.join(format!("ready.{rank}")),
        std::process::id().to_string().as_bytes(),
    );
    if rank == 2 {
        wait_for(&dir.join("go"), "go");
    }
    let send = [1.0f32; 16];
    let mut recv = [0.0f32; 16];
    // SAFETY: host buffers of 16 floats owned by this frame.
    check(unsafe {
        ncclAllReduce(
            send.as_ptr().cast(),
            recv.as_mut_ptr().cast(),
            16,
            7,
            0,
            c,
            null_mut(),
        )
    });
    assert_eq!(recv, [3.0; 16]);
    // SAFETY: a live communicator, destroyed once.
    check(unsafe { ncclCommDestroy(c) });
}

/// Asks the status service of process `pid`.
fn query(pid: u32) -> String {
    let port = String::from_utf8(wait_for(&port_file(pid), "port file")).unwrap();
    let mut s = TcpStream::connect(("127.0.0.1", port.trim().parse::<u16>().unwrap())).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(b"status\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

fn pid_of(dir: &Path, rank: usize) -> u32 {
    let b = wait_for(&dir.join(format!("ready.{rank}")), "ready file");
    String::from_utf8(b).unwrap().parse().unwrap()
}

#[test]
fn status_names_the_rank_everyone_waits_on() {
    if let Ok(r) = std::env::var(ROLE) {
        let dir = PathBuf::from(std::env::var(DIR).unwrap());
        return child(r.parse().unwrap(), &dir);
    }
    let dir = std::env::temp_dir().join(format!("hetccl-status-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let exe = std::env::current_exe().unwrap();
    let cmds: Vec<Command> = (0..3)
        .map(|r| {
            let mut c = Command::new(&exe);
            ranks::clean_env(&mut c);
            c.args(["--exact", TEST, "--nocapture", "--test-threads=1"])
                .env(ROLE, r.to_string())
                .env(DIR, &dir)
                .env("HETCCL_STATUS", "1")
                .env("HETCCL_SOCKET_IFNAME", "lo")
                .env("HETCCL_TIMEOUT_S", "60")
                .env("HETCCL_HANG_REPORT_S", "1")
                .env("NCCL_DEBUG", "WARN");
            c
        })
        .collect();
    let runner = std::thread::spawn(move || ranks::run_ranks(cmds, Duration::from_secs(120)));
    let pids: Vec<u32> = (0..3).map(|r| pid_of(&dir, r)).collect();

    // Ranks 0 and 1 are in the allreduce; rank 2 has not joined it.
    let t0 = Instant::now();
    let want = format!(
        "blocking: rank 2 (host {}, pid {}): not in allreduce",
        hetccl_core::obs::short_hostname(),
        pids[2]
    );
    let text = loop {
        let t = query(pids[0]);
        let waiting = t.contains("waits for data from rank 2");
        if (t.contains(&want) && waiting) || t0.elapsed() > Duration::from_secs(5) {
            break t;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(text.contains(&want), "after {:?}:\n{text}", t0.elapsed());
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
    assert_eq!(
        text.matches("allreduce seq").count(),
        2 + 1,
        "ranks 0 and 1 in it, and the blocking line:\n{text}"
    );
    assert!(text.contains("waits for data from rank 2"), "{text}");

    // Rank 2 stopped: no answer.
    // SAFETY: signals a child of this test.
    unsafe { libc::kill(pids[2] as libc::pid_t, libc::SIGSTOP) };
    let t1 = Instant::now();
    let text = query(pids[0]);
    let took = t1.elapsed();
    // SAFETY: as above.
    unsafe { libc::kill(pids[2] as libc::pid_t, libc::SIGCONT) };
    assert!(took < Duration::from_secs(5), "{took:?}");
    let silent = format!(
        "blocking: rank 2 (host {}, pid {}): no answer",
        hetccl_core::obs::short_hostname(),
        pids[2]
    );
    assert!(text.contains(&silent), "{text}");
    assert!(
        text.lines()
            .any(|l| l.trim_start().starts_with('2') && l.ends_with("no answer")),
        "{text}"
    );

    // The hang report (after 1 s) logs the same view.
    std::thread::sleep(Duration::from_secs(2).saturating_sub(t0.elapsed()));
    publish(&dir.join("go"), b"1");
    let outs = runner.join().unwrap();
    assert!(
        outs.iter().all(|o| o.ok()),
        "{}",
        ranks::report(&outs, 4000)
    );
    let log = &outs[0].stdout;
    assert!(log.contains("status: blocking: rank 2 (host"), "{log}");
    std::fs::remove_dir_all(&dir).unwrap();
}
