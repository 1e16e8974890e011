//! The shared lists of the multi-process tests: the modes of
//! `tests/c/coll_check.c` (one launch each, see its header comment) and the
//! algorithms that `NCCL_ALGO` can force per collective.

/// The modes whose every call is a collective or point-to-point operation
/// of one communicator, so they also run with nonblocking communicators
/// (`--nonblocking`), in the order they run.
pub const NONBLOCKING_MODES: &[&str] = &[
    "allreduce",
    "premulsum",
    "broadcast",
    "reduce",
    "allgather",
    "reducescatter",
    "alltoall",
    "gather",
    "scatter",
    "sendrecv_ring",
    "sendrecv_allpairs",
    "sendrecv_self",
    "group",
    "simulate",
];

/// The communicator modes: they create, split, shrink or abort
/// communicators, with blocking semantics of their own, so they are left to
/// the blocking runs.
pub const COMM_MODES: &[&str] = &[
    "split",
    "multicomm",
    "newcomms",
    "threads",
    "shrink",
    "shrink_abort",
    "abort",
];

/// Every mode, in the order they run: [`NONBLOCKING_MODES`], then
/// [`COMM_MODES`]. (`peer_fault` is not among them: only
/// `tests/peer_faults.rs` runs it, through [`crate::faults`].)
pub const MODES: &[&str] =
    &concat::<{ NONBLOCKING_MODES.len() + COMM_MODES.len() }>(NONBLOCKING_MODES, COMM_MODES);

/// The algorithms that implement AllReduce, as `NCCL_ALGO` names them.
pub const ALLREDUCE_ALGOS: &[&str] = &["Ring", "Tree", "Direct", "HalvingDoubling", "Hierarchical"];

/// (mode, `NCCL_ALGO` function, the algorithms that implement it): every
/// algorithm a test can force, per collective.
pub const ALGOS: &[(&str, &str, &[&str])] = &[
    ("allreduce", "allreduce", ALLREDUCE_ALGOS),
    ("broadcast", "broadcast", &["Ring", "Tree", "Direct"]),
    ("reduce", "reduce", &["Ring", "Tree", "Direct"]),
    ("allgather", "allgather", &["Ring", "Direct"]),
    ("reducescatter", "reducescatter", &["Ring", "Direct"]),
    ("alltoall", "alltoall", &["Pairwise", "Direct"]),
];

/// `a` then `b`, at compile time.
const fn concat<const N: usize>(a: &[&'static str], b: &[&'static str]) -> [&'static str; N] {
    assert!(a.len() + b.len() == N);
    let mut out = [""; N];
    let mut i = 0;
    while i < a.len() {
        out[i] = a[i];
        i += 1;
    }
    let mut j = 0;
    while j < b.len() {
        out[a.len() + j] = b[j];
        j += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_are_the_two_lists_in_order_and_distinct() {
        assert_eq!(MODES.len(), 21);
        assert_eq!(&MODES[..NONBLOCKING_MODES.len()], NONBLOCKING_MODES);
        assert_eq!(&MODES[NONBLOCKING_MODES.len()..], COMM_MODES);
        let mut sorted = MODES.to_vec();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), MODES.len(), "a mode is listed twice");
    }
}
