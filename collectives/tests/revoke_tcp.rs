//! `ncclCommRevoke` reaches the peers over TCP (`NCCL_SHM_DISABLE=1`): the
//! revoking rank's links carry a CLOSE frame naming it, so two ranks
//! blocked in an AllReduce it never joins return within 1 s saying that
//! rank 2 revoked the communicator.

use std::time::Duration;

use hetccl_testkit::revoke::{
    assert_told, revoke_ends_own_operation, revoke_reaches_blocked_peers,
};

#[test]
fn a_revoke_reaches_peers_blocked_over_tcp() {
    std::env::set_var("NCCL_SHM_DISABLE", "1");
    for count in [16usize, 1 << 16] {
        let seen = revoke_reaches_blocked_peers(count);
        assert_told(&seen, Duration::from_secs(1));
    }
}

/// The revoking rank's own operation in flight ends within 100 ms.
#[test]
fn a_revoke_ends_this_ranks_operation_in_flight_tcp() {
    std::env::set_var("NCCL_SHM_DISABLE", "1");
    for count in [16usize, 1 << 16] {
        let (after, rc, msg) = revoke_ends_own_operation(count);
        eprintln!("[revoke] tcp count {count}: returned {after:?} after the revoke");
        assert_eq!(rc, 6, "{msg}");
        assert!(msg.contains("rank 0 revoked the communicator"), "{msg}");
        assert!(after < Duration::from_millis(100), "{after:?}");
    }
}
