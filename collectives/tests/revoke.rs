//! `ncclCommRevoke` reaches the peers over shared memory: two ranks blocked
//! in an AllReduce that the third never joins return within 1 s of its
//! revoke, saying that rank 2 revoked the communicator (the board slots for
//! a small call, the single-copy path for a large one). The TCP case is
//! `revoke_tcp.rs` (a process of its own: the configuration is read once).

use std::time::Duration;

use hetccl_testkit::revoke::{
    assert_told, revoke_ends_own_operation, revoke_reaches_blocked_peers,
};

#[test]
fn a_revoke_reaches_peers_blocked_in_board_slots_and_single_copy() {
    for count in [16usize, 1 << 16] {
        let seen = revoke_reaches_blocked_peers(count);
        assert_told(&seen, Duration::from_secs(1));
    }
}

/// The revoking rank's own operation in flight ends within 100 ms.
#[test]
fn a_revoke_ends_this_ranks_operation_in_flight_shm() {
    for count in [16usize, 1 << 16] {
        let (after, rc, msg) = revoke_ends_own_operation(count);
        eprintln!("[revoke] shm count {count}: returned {after:?} after the revoke");
        assert_eq!(rc, 6, "{msg}");
        assert!(msg.contains("rank 0 revoked the communicator"), "{msg}");
        assert!(after < Duration::from_millis(100), "{after:?}");
    }
}
