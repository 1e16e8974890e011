//! Mismatched calls on the direct paths with ranks as threads: every rank
//! passes a different count, datatype, op, kind or root, and every buffer
//! has a `PROT_NONE` page right after it (and one before it, with canary
//! bytes in between). Single-copy between threads uses plain loads and
//! stores, so a read or write past a peer's buffer would crash this
//! process on the guard page. Every rank must get `ncclInvalidUsage` with a
//! message naming the disagreement, no buffer may be touched, and the
//! communicator stays failed (poisoned) afterwards on every rank.

use std::ffi::CStr;
use std::ptr::null_mut;
use std::sync::Once;

use hetccl_abi::{ncclComm_t, ncclUniqueId};
use hetccl_collectives::api::coll::*;
use hetccl_collectives::api::comm_init::{ncclCommInitRank, ncclGetUniqueId};
use hetccl_collectives::api::comm_life::{ncclCommDestroy, ncclCommGetAsyncError};
use hetccl_collectives::api::version::ncclGetLastError;

use hetccl_testkit::threads::{self, check, on_all, Comm};

const FLOAT32: i32 = 7;
const FLOAT64: i32 = 8;
const SUM: i32 = 0;
const MAX: i32 = 2;
const INVALID_USAGE: i32 = 5;

const CANARY: u8 = 0x3c;
const FRESH: u8 = 0xcd;

/// Loopback bootstrap, and a stall limit short enough that a rank left
/// waiting shows up as a slow `ncclRemoteError` rather than a long hang.
fn setup() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        threads::setup();
        std::env::set_var("HETCCL_TIMEOUT_S", "15");
    });
}

/// `n` ranks initialised concurrently (as `threads::comms`, with this
/// file's environment).
fn comms(n: usize) -> Vec<Comm> {
    setup();
    let mut id = ncclUniqueId::default();
    // SAFETY: every pointer passed is NULL where the API allows it, or memory this test owns for
    // the whole call.
    check(unsafe { ncclGetUniqueId(&mut id) });
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..n)
            .map(|r| {
                s.spawn(move || {
                    let mut c: ncclComm_t = null_mut();
                    // SAFETY: every pointer passed is NULL where the API allows it, or memory
                    // this test owns for the whole call.
                    check(unsafe { ncclCommInitRank(&mut c, n as i32, id, r as i32) });
                    Comm(c)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// `len` bytes that end right before a `PROT_NONE` page, with another
/// `PROT_NONE` page before them and canary bytes in the slack between.
struct Guarded {
    map: *mut u8,
    map_len: usize,
    page: usize,
    buf: *mut u8,
    len: usize,
}

// SAFETY: a private mapping owned by the value; only one rank's thread
// uses it at a time (the test hands it to its owner's closure).
unsafe impl Send for Guarded {}
// SAFETY: as above; shared references only read it.
unsafe impl Sync for Guarded {}

impl Guarded {
    fn new(len: usize) -> Self {
        // SAFETY: sysconf has no memory arguments.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
        let body = len.div_ceil(page).max(1) * page;
        let map_len = body + 2 * page;
        // SAFETY: a fresh anonymous mapping.
        let map = unsafe {
            libc::mmap(
                null_mut(),
                map_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(map, libc::MAP_FAILED, "mmap");
        let map = map.cast::<u8>();
        // SAFETY: both pages lie inside the mapping just made.
        unsafe {
            assert_eq!(libc::mprotect(map.cast(), page, libc::PROT_NONE), 0);
            assert_eq!(
                libc::mprotect(map.add(page + body).cast(), page, libc::PROT_NONE),
                0
            );
        }
        // SAFETY: the buffer ends where the second guard page starts.
        let buf = unsafe { map.add(page + body - len) };
        let g = Self {
            map,
            map_len,
            page,
            buf,
            len,
        };
        // SAFETY: the slack and the buffer are readable and writable.
        unsafe {
            std::ptr::write_bytes(map.add(page), CANARY, body - len);
            std::ptr::write_bytes(buf, FRESH, len);
        }
        g
    }

    fn bytes(&self) -> &[u8] {
        // SAFETY: the buffer lies in the mapping.
        unsafe { std::slice::from_raw_parts(self.buf, self.len) }
    }

    /// The slack between the first guard page and the buffer is intact.
    fn slack_intact(&self) -> bool {
        let start = self.page;
        let end = self.buf as usize - self.map as usize;
        // SAFETY: inside the mapping, readable.
        let s = unsafe { std::slice::from_raw_parts(self.map.add(start), end - start) };
        s.iter().all(|&b| b == CANARY)
    }

    /// Fills the buffer with a byte pattern of rank `r`.
    fn fill(&self, r: usize) {
        for i in 0..self.len {
            // SAFETY: inside the buffer, writable.
            unsafe { *self.buf.add(i) = (r * 31 + i % 251) as u8 | 1 };
        }
    }
}

impl Drop for Guarded {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`.
        unsafe { libc::munmap(self.map.cast(), self.map_len) };
    }
}

/// The collectives the cases call.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Kind {
    AllReduce,
    Reduce,
    Broadcast,
    AllGather,
    ReduceScatter,
}

/// What one rank passes.
#[derive(Clone, Copy, Debug)]
struct Call {
    kind: Kind,
    count: usize,
    dtype: i32,
    op: i32,
    root: i32,
}

const fn call(kind: Kind, count: usize, dtype: i32) -> Call {
    Call {
        kind,
        count,
        dtype,
        op: SUM,
        root: 0,
    }
}

fn elem(dtype: i32) -> usize {
    if dtype == FLOAT64 {
        8
    } else {
        4
    }
}

/// (send, recv) bytes of `c` on `n` ranks.
fn extents(c: &Call, n: usize) -> (usize, usize) {
    let b = c.count * elem(c.dtype);
    match c.kind {
        Kind::AllGather => (b, b * n),
        Kind::ReduceScatter => (b * n, b),
        _ => (b, b),
    }
}

/// What one rank saw.
#[derive(Debug)]
struct Seen {
    rc: i32,
    msg: String,
    /// The output buffer still holds its initial bytes.
    out_untouched: bool,
    /// The input buffer still holds what the rank put there.
    in_untouched: bool,
    /// Canary bytes before both buffers are intact.
    slack_intact: bool,
    /// A later well-formed AllReduce: its code.
    later_rc: i32,
    /// `ncclCommGetAsyncError` after the mismatch.
    async_err: i32,
}

/// Runs one mismatched call per rank (`calls[r]`) on fresh communicators
/// and returns what each rank saw; destroys the communicators.
fn run(calls: &[Call]) -> Vec<Seen> {
    run_after(calls, None)
}

/// [`run`], after a well-formed call `first` on every rank (which must
/// succeed).
fn run_after(calls: &[Call], first: Option<Call>) -> Vec<Seen> {
    let n = calls.len();
    let cs = comms(n);
    if let Some(f) = first {
        on_all(&cs, |_, c| {
            let send = vec![1f32; f.count];
            let mut recv = vec![0f32; f.count];
            // SAFETY: every pointer passed is NULL where the API allows it, or memory this test
            // owns for the whole call.
            check(unsafe {
                ncclAllReduce(
                    send.as_ptr().cast(),
                    recv.as_mut_ptr().cast(),
                    f.count,
                    FLOAT32,
                    SUM,
                    c.0,
                    null_mut(),
                )
            });
            assert!(recv.iter().all(|&v| v == n as f32));
        });
    }
    let seen = on_all(&cs, |r, c| {
        let k = calls[r];
        let (sb, rb) = extents(&k, n);
        let send = Guarded::new(sb);
        let recv = Guarded::new(rb);
        send.fill(r);
        let want_in = send.bytes().to_vec();
        let (sp, rp) = (send.buf.cast_const().cast(), recv.buf.cast());
        // SAFETY (each call): guarded buffers of the call's extents.
        // SAFETY: every pointer passed is NULL where the API allows it, or memory this test owns
        // for the whole call.
        let rc = unsafe {
            match k.kind {
                Kind::AllReduce => ncclAllReduce(sp, rp, k.count, k.dtype, k.op, c.0, null_mut()),
                Kind::Reduce => ncclReduce(sp, rp, k.count, k.dtype, k.op, k.root, c.0, null_mut()),
                Kind::Broadcast => ncclBroadcast(sp, rp, k.count, k.dtype, k.root, c.0, null_mut()),
                Kind::AllGather => ncclAllGather(sp, rp, k.count, k.dtype, c.0, null_mut()),
                Kind::ReduceScatter => {
                    ncclReduceScatter(sp, rp, k.count, k.dtype, k.op, c.0, null_mut())
                }
            }
        };
        // SAFETY: every pointer passed is NULL where the API allows it, or memory this test owns
        // for the whole call.
        let msg = unsafe { CStr::from_ptr(ncclGetLastError(null_mut())) }
            .to_string_lossy()
            .into_owned();
        let mut async_err = -1;
        // SAFETY: a live comm and a writable result.
        unsafe { ncclCommGetAsyncError(c.0, &mut async_err) };
        let x = [1f32; 4];
        let mut y = [0f32; 4];
        // SAFETY: 4-element buffers.
        let later_rc = unsafe {
            ncclAllReduce(
                x.as_ptr().cast(),
                y.as_mut_ptr().cast(),
                4,
                FLOAT32,
                SUM,
                c.0,
                null_mut(),
            )
        };
        Seen {
            rc,
            msg,
            out_untouched: recv.bytes().iter().all(|&b| b == FRESH),
            in_untouched: send.bytes() == want_in.as_slice(),
            slack_intact: send.slack_intact() && recv.slack_intact(),
            later_rc,
            async_err,
        }
    });
    for c in cs {
        // SAFETY: every pointer passed is NULL where the API allows it, or memory this test owns
        // for the whole call.
        check(unsafe { ncclCommDestroy(c.0) });
    }
    seen
}

/// Asserts what every rank of a mismatched call must see; `names` are
/// strings every message must contain.
fn assert_rejected(case: &str, seen: &[Seen], names: &[&str]) {
    for (r, s) in seen.iter().enumerate() {
        assert_eq!(
            s.rc, INVALID_USAGE,
            "{case}: rank {r} returned {} ({}), want ncclInvalidUsage; all ranks: {seen:#?}",
            s.rc, s.msg
        );
        assert!(
            s.msg.contains("disagree"),
            "{case}: rank {r}: the message does not say the ranks disagree: {}",
            s.msg
        );
        for w in names {
            assert!(
                s.msg.contains(w),
                "{case}: rank {r}: the message does not name {w:?}: {}",
                s.msg
            );
        }
        assert!(s.out_untouched, "{case}: rank {r}'s output was written");
        assert!(s.in_untouched, "{case}: rank {r}'s input was changed");
        assert!(
            s.slack_intact,
            "{case}: bytes before rank {r}'s buffers were written"
        );
        assert_eq!(
            s.async_err, INVALID_USAGE,
            "{case}: rank {r}: ncclCommGetAsyncError after the rejected call"
        );
        assert_eq!(
            s.later_rc, 6,
            "{case}: rank {r}: a later AllReduce on the failed comm (want ncclRemoteError)"
        );
    }
}

#[test]
fn board_slots_reject_mismatched_calls() {
    use Kind::*;
    let cases: [(&str, [Call; 2], &[&str]); 6] = [
        (
            "count",
            [call(AllReduce, 100, FLOAT32), call(AllReduce, 200, FLOAT32)],
            &["rank 1 passed", "200 float32", "100 float32"],
        ),
        (
            "dtype",
            [call(AllReduce, 100, FLOAT32), call(AllReduce, 100, FLOAT64)],
            &["float64", "float32"],
        ),
        (
            "op",
            [
                call(AllReduce, 100, FLOAT32),
                Call {
                    op: MAX,
                    ..call(AllReduce, 100, FLOAT32)
                },
            ],
            &["sum", "max"],
        ),
        (
            "root (each rank names the other)",
            [
                Call {
                    root: 1,
                    ..call(Broadcast, 100, FLOAT32)
                },
                call(Broadcast, 100, FLOAT32),
            ],
            &["root 0", "root 1"],
        ),
        (
            "kind, a broadcast against the exchange",
            [call(AllReduce, 100, FLOAT32), call(Broadcast, 100, FLOAT32)],
            &["AllReduce", "Broadcast"],
        ),
        (
            "kind",
            [call(AllReduce, 100, FLOAT32), call(Reduce, 100, FLOAT32)],
            &["AllReduce", "Reduce"],
        ),
    ];
    for (case, calls, names) in cases {
        let seen = run(&calls);
        assert_rejected(&format!("board slots, {case}"), &seen, names);
    }
}

#[test]
fn single_copy_between_threads_rejects_mismatched_calls() {
    use Kind::*;
    let cases: [(&str, Vec<Call>, &[&str]); 5] = [
        (
            "count (the probe's case)",
            vec![
                call(AllReduce, 100_000, FLOAT32),
                call(AllReduce, 200_000, FLOAT32),
            ],
            &[
                "rank 1 passed",
                "200000 float32",
                "rank 0 passed",
                "100000 float32",
            ],
        ),
        (
            "dtype",
            vec![
                call(AllReduce, 100_000, FLOAT32),
                call(AllReduce, 100_000, FLOAT64),
            ],
            &["100000 float64", "100000 float32"],
        ),
        (
            "allgather count",
            vec![
                call(AllGather, 30_000, FLOAT32),
                call(AllGather, 40_000, FLOAT32),
            ],
            &["30000", "40000"],
        ),
        (
            "reducescatter count",
            vec![
                call(ReduceScatter, 40_000, FLOAT32),
                call(ReduceScatter, 30_000, FLOAT32),
            ],
            &["30000", "40000"],
        ),
        (
            "3 ranks, the last one differs",
            vec![
                call(AllReduce, 100_000, FLOAT32),
                call(AllReduce, 100_000, FLOAT32),
                call(AllReduce, 150_000, FLOAT32),
            ],
            &["rank 2 passed", "150000 float32"],
        ),
    ];
    for (case, calls, names) in cases {
        let seen = run(&calls);
        assert_rejected(&format!("single copy, {case}"), &seen, names);
    }
}

#[test]
fn ranks_on_different_direct_paths_reject_the_call() {
    use Kind::*;
    // 400 B go through the board slots, 400 kB through single copy.
    let (small, large) = (
        call(AllReduce, 100, FLOAT32),
        call(AllReduce, 100_000, FLOAT32),
    );
    // The first large call also probes the single-copy path; after one
    // large call, ranks find each other through the operation counters.
    for (case, calls, first) in [
        ("first large call", vec![small, large], None),
        ("after a large call", vec![large, small], Some(large)),
        ("3 ranks, one large", vec![small, small, large], Some(large)),
    ] {
        let seen = run_after(&calls, first);
        assert_rejected(
            &format!("board slots against single copy, {case}"),
            &seen,
            &["100000 float32", "100 float32"],
        );
    }
    // A small broadcast's receiver against a root on single copy.
    let (small, large) = (
        call(Broadcast, 100, FLOAT32),
        call(Broadcast, 100_000, FLOAT32),
    );
    for (case, first) in [
        ("first large call", None),
        ("after a large call", Some(large)),
    ] {
        let seen = run_after(&[large, small], first);
        assert_rejected(
            &format!("broadcast ring against single copy, {case}"),
            &seen,
            &["100000 float32", "100 float32"],
        );
    }
}

/// Asserts what a mismatched broadcast must do where a root may have posted
/// and returned before anyone could see the mismatch: at least one rank
/// fails with `ncclInvalidUsage` naming `names`, no rank that failed wrote
/// its output, nobody read or wrote past a buffer, and a later call fails
/// on every rank.
fn assert_seen_by_some(case: &str, seen: &[Seen], names: &[&str]) {
    assert!(
        seen.iter().any(|s| s.rc == INVALID_USAGE),
        "{case}: no rank rejected the call: {seen:#?}"
    );
    for (r, s) in seen.iter().enumerate() {
        assert!(
            s.rc == 0 || s.rc == INVALID_USAGE,
            "{case}: rank {r} returned {} ({}); all ranks: {seen:#?}",
            s.rc,
            s.msg
        );
        if s.rc == INVALID_USAGE {
            for w in names {
                assert!(s.msg.contains(w), "{case}: rank {r}: no {w:?} in {}", s.msg);
            }
            assert!(s.out_untouched, "{case}: rank {r}'s output was written");
        }
        assert!(s.in_untouched, "{case}: rank {r}'s input was changed");
        assert!(
            s.slack_intact,
            "{case}: rank {r}: bytes before a buffer written"
        );
        // A root that returned finds its peers failed (closed links), or
        // still in the mismatched call (another usage error).
        assert!(
            s.later_rc == 6 || (s.rc == 0 && s.later_rc == INVALID_USAGE),
            "{case}: rank {r}: a later AllReduce on the failed comm returned {}",
            s.later_rc
        );
    }
}

#[test]
fn the_broadcast_ring_rejects_what_its_ranks_see() {
    use Kind::*;
    let bc = |count, root| Call {
        root,
        ..call(Broadcast, count, FLOAT32)
    };
    let cases: [(&str, Vec<Call>, &[&str]); 4] = [
        (
            "two roots",
            vec![bc(100, 0), bc(100, 1)],
            &["root 0", "root 1"],
        ),
        (
            "count, the receiver sees it",
            vec![bc(100, 0), bc(200, 0)],
            &["100 float32", "200 float32"],
        ),
        (
            "3 ranks, two roots",
            vec![bc(100, 0), bc(100, 0), bc(100, 2)],
            &["root 0", "root 2"],
        ),
        (
            // The root may be in its next call by the time the receiver
            // looks: only the receiver's own call is sure to be named.
            "a receiver on single copy",
            vec![bc(100, 0), bc(100_000, 0)],
            &["Broadcast of 100000 float32"],
        ),
    ];
    for (case, calls, names) in cases {
        let seen = run(&calls);
        assert_seen_by_some(&format!("broadcast ring, {case}"), &seen, names);
    }
}
