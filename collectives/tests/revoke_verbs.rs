//! `ncclCommRevoke` reaches the peers over verbs: three ranks as processes
//! (this test binary run again, one rank each) on three host ids
//! (`HETCCL_HOST_ID`), so that every pair takes the verbs transport. Ranks
//! 0 and 1 block in an AllReduce that rank 2 never joins; rank 2 revokes.
//! Its verbs comms write the revoke frame on their setup sockets, so both
//! blocked ranks must return within 1 s saying that rank 2 revoked the
//! communicator, as on TCP (`revoke_tcp.rs`).
//!
//! `scripts/rdma-tests.sh` runs this on Soft-RoCE inside a VM with
//! `HETCCL_REQUIRE_RDMA=1`; without an active RDMA port it says so and
//! passes (and fails under `HETCCL_REQUIRE_RDMA=1`).

use std::process::{Command, Stdio};
use std::ptr::null_mut;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use hetccl_abi::{ncclComm_t, ncclUniqueId};
use hetccl_collectives::api::comm_init::{ncclCommInitRank, ncclGetUniqueId};
use hetccl_collectives::api::comm_life::{ncclCommDestroy, ncclCommFinalize, ncclCommRevoke};
use hetccl_testkit::revoke::{allreduce, settle};
use hetccl_testkit::threads::{check, last_error, Comm};

/// Set in a rank's environment (not `HETCCL_`: the config warns of
/// unknown names of its own): its rank.
const RANK_VAR: &str = "REVOKE_VERBS_TEST_RANK";
/// Set in a rank's environment: the unique id, hex.
const ID_VAR: &str = "REVOKE_VERBS_TEST_ID";
/// Set in a rank's environment: the AllReduce's count.
const COUNT_VAR: &str = "REVOKE_VERBS_TEST_COUNT";
/// What a rank prints for the parent to read.
const TAG: &str = "REVOKE_VERBS";
const NRANKS: usize = 3;

fn have_rdma() -> bool {
    let ok = !nccl_net_plugin::ib::usable_ports(&Default::default()).is_empty();
    if !ok {
        assert!(
            std::env::var("HETCCL_REQUIRE_RDMA").as_deref() != Ok("1"),
            "HETCCL_REQUIRE_RDMA=1 but no active RDMA port"
        );
        eprintln!("skipped: no active RDMA port (scripts/rdma-tests.sh runs this on Soft-RoCE)");
    }
    ok
}

fn now_ns() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after 1970")
        .as_nanos()
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex"))
        .collect()
}

/// One launch: the three ranks, then what the blocked ones saw.
fn launch(count: usize) {
    std::env::set_var("HETCCL_SOCKET_IFNAME", "lo");
    let mut id = ncclUniqueId::default();
    // SAFETY: a valid out pointer.
    check(unsafe { ncclGetUniqueId(&mut id) });
    let exe = std::env::current_exe().expect("test binary");
    let kids: Vec<_> = (0..NRANKS)
        .map(|r| {
            Command::new(&exe)
                .args(["--ignored", "--exact", "one_rank", "--nocapture"])
                .env(RANK_VAR, r.to_string())
                .env(ID_VAR, hex(&id.internal))
                .env(COUNT_VAR, count.to_string())
                .env("HETCCL_HOST_ID", format!("node{r}"))
                .env("HETCCL_NET", "ib")
                .env("HETCCL_SOCKET_IFNAME", "lo")
                .env("HETCCL_TIMEOUT_S", "60")
                .env("NCCL_DEBUG", "WARN")
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("spawn a rank")
        })
        .collect();
    let outs: Vec<String> = kids
        .into_iter()
        .enumerate()
        .map(|(r, k)| {
            let o = k.wait_with_output().expect("rank ran");
            let text = format!(
                "{}{}",
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            );
            assert!(
                o.status.success(),
                "count {count}, rank {r}: {}\n{text}",
                o.status
            );
            text
        })
        .collect();
    let field = |text: &str, key: &str| -> String {
        let line = text
            .lines()
            .find(|l| l.starts_with(TAG) && l.contains(key))
            .unwrap_or_else(|| panic!("no `{TAG} {key}` line in:\n{text}"));
        line.split(key).nth(1).expect("split").trim().to_string()
    };
    let revoked: u128 = field(&outs[2], "revoked_at_ns").parse().expect("ns");
    for (r, text) in outs[..2].iter().enumerate() {
        let back: u128 = field(text, "returned_at_ns")
            .split_whitespace()
            .next()
            .expect("ns")
            .parse()
            .expect("ns");
        let rc = field(text, " rc ");
        let rc = rc.split_whitespace().next().expect("rc");
        let msg = field(text, " msg ");
        let after = Duration::from_nanos(back.saturating_sub(revoked) as u64);
        eprintln!("[revoke] verbs count {count}: rank {r} returned {after:?} after the revoke");
        assert_eq!(rc, "6", "count {count}, rank {r}: {msg}");
        assert!(
            msg.contains("rank 2 revoked the communicator"),
            "count {count}, rank {r}: {msg}"
        );
        assert!(
            after < Duration::from_secs(1),
            "count {count}, rank {r}: returned {after:?} after the revoke"
        );
    }
}

#[test]
fn a_revoke_reaches_peers_blocked_over_verbs() {
    if !have_rdma() {
        return;
    }
    for count in [16usize, 1 << 16] {
        launch(count);
    }
}

/// One rank of [`a_revoke_reaches_peers_blocked_over_verbs`] (run by it,
/// with its variables set; alone it does nothing).
#[test]
#[ignore = "a rank process of a_revoke_reaches_peers_blocked_over_verbs"]
fn one_rank() {
    let Ok(rank) = std::env::var(RANK_VAR) else {
        eprintln!("not a rank process: nothing to do");
        return;
    };
    let rank: usize = rank.parse().expect("rank");
    let count: usize = std::env::var(COUNT_VAR)
        .expect("count")
        .parse()
        .expect("count");
    let mut id = ncclUniqueId::default();
    id.internal
        .copy_from_slice(&unhex(&std::env::var(ID_VAR).expect("id")));
    let mut c: ncclComm_t = null_mut();
    // SAFETY: a valid out pointer; rank and size in range.
    check(unsafe { ncclCommInitRank(&mut c, NRANKS as i32, id, rank as i32) });
    let c = Comm(c);
    if rank == 2 {
        // Ranks 0 and 1 are blocked in the AllReduce by now (or enter it
        // soon after, and fail at once).
        std::thread::sleep(Duration::from_millis(500));
        println!("{TAG} revoked_at_ns {}", now_ns());
        // SAFETY: a live handle.
        check(unsafe { ncclCommRevoke(c.0, 0) });
        assert_eq!(settle(c), 0, "the revoking rank becomes quiescent");
        // SAFETY: a live handle.
        assert_eq!(unsafe { ncclCommFinalize(c.0) }, 5, "finalize after revoke");
    } else {
        let t0 = Instant::now();
        let rc = allreduce(c, count);
        let back = now_ns();
        let msg = last_error().replace('\n', " ");
        println!("{TAG} returned_at_ns {back} rc {rc} msg {msg}");
        eprintln!(
            "rank {rank}: the AllReduce returned after {:?}",
            t0.elapsed()
        );
        // The revoke reached this rank: its communicator is revoked too.
        assert_eq!(settle(c), 0);
        assert_ne!(allreduce(c, 1), 0, "no new operation on a revoked comm");
    }
    // SAFETY: a live handle, destroyed once.
    check(unsafe { ncclCommDestroy(c.0) });
}
