//! Mismatched calls between processes: 2 ranks of `tests/c/coll_check.c`
//! (mode `mismatch`) make one call where rank 1 passes twice rank 0's
//! count, another datatype, another op, another collective or another root,
//! with every buffer ending at a `PROT_NONE` page (or, for `ncclMemAlloc`
//! buffers, followed by canary bytes in the same allocation, which peers
//! map whole).
//!
//! On every direct path (board slots, single copy with
//! `process_vm_readv`/`writev`, single copy through mapped `ncclMemAlloc`
//! buffers) both ranks must return `ncclInvalidUsage` naming the
//! disagreement, except that when both ranks are roots of a small
//! broadcast, or the receiver of one passes another count, the root
//! (which posts and returns) may succeed; its next call fails. On the executor's links (TCP, pipelined rings over shared
//! memory) both ranks must return `ncclInvalidUsage` naming both calls,
//! from the collective fingerprints (`HETCCL_CHECK=1`). No canary next to any buffer changes
//! and no guard page is hit; on the direct paths the buffers themselves
//! are untouched, on the executor's links the input is. Afterwards the communicator is failed on every rank: a
//! well-formed AllReduce returns an error at once, and `ncclCommDestroy`
//! succeeds.

use std::path::Path;

use hetccl_testkit::coll::Job;
use hetccl_testkit::{coll, hetccl_so, ranks};

const INVALID_USAGE: &str = "5";
const REMOTE_ERROR: &str = "6";

fn exe() -> &'static Path {
    coll::program("coll_check_mismatch")
}

/// The path a case takes, as its label and environment say.
#[derive(Clone, Copy, PartialEq)]
enum Route {
    /// The single-node direct paths (board slots, single copy).
    Direct,
    /// The executor's links over TCP.
    Tcp,
    /// The executor's pipelined rings over shared memory.
    Rings,
}

/// Whether case `label` is a small broadcast whose root may post and
/// return before any rank sees the mismatch (both ranks roots, or the
/// receivers passing another count).
fn root_may_pass(label: &str) -> bool {
    label.starts_with("board") && (label.ends_with(" root") || label.ends_with(" bcount"))
}

fn job(label: &str, what: &str, count: usize, alloc: &str, route: Route) -> Job {
    let mut j = Job::new(label, 2, "mismatch")
        .env("COLL_CHECK_MM_WHAT", what)
        .env("COLL_CHECK_MM_COUNT", &count.to_string())
        .env("COLL_CHECK_MM_ALLOC", alloc)
        // A rank left waiting shows up as a slow error, not a long hang.
        .env("HETCCL_TIMEOUT_S", "10");
    // Fingerprints are off by default (their cost); the executor's routes
    // turn them on.
    match route {
        Route::Tcp => j = j.env("NCCL_SHM_DISABLE", "1").env("HETCCL_CHECK", "1"),
        Route::Rings => j = j.env("NCCL_ALGO", "Ring").env("HETCCL_CHECK", "1"),
        Route::Direct => {}
    }
    if root_may_pass(label) {
        j = j.env("COLL_CHECK_MM_ROOT_MAY_PASS", "1");
    }
    j
}

/// Everything wrong with what the ranks of one case reported.
fn problems(label: &str, path: Route, outs: &[ranks::RankOutput]) -> Vec<String> {
    let mut p = Vec::new();
    let mut usage = 0;
    for o in outs {
        let r = o.rank;
        let get = |k: &str| o.get(&format!("mismatch.{k}")).unwrap_or_default();
        let (rc, msg) = (get("rc"), get("last_error"));
        let detected = rc == INVALID_USAGE;
        usage += usize::from(detected);
        if rc == "0" && root_may_pass(label) {
            // A root that posted and returned: its next call must fail.
            let later = get("later_rc");
            if later != REMOTE_ERROR && later != INVALID_USAGE {
                p.push(format!(
                    "{label}: rank {r} succeeded, and a later AllReduce returned {later:?}"
                ));
            }
            continue;
        }
        match path {
            Route::Direct if !detected => p.push(format!(
                "{label}: rank {r}: rc {rc} ({msg}), want {INVALID_USAGE} (ncclInvalidUsage)"
            )),
            Route::Direct if !msg.contains("disagree") => p.push(format!(
                "{label}: rank {r}: the message does not say the ranks disagree: {msg}"
            )),
            Route::Direct if get("out_untouched") != "1" || get("in_untouched") != "1" => p.push(
                format!("{label}: rank {r}: a buffer was touched by the rejected call"),
            ),
            // The executor's links: every rank gets its peer's fingerprint
            // first and names both calls.
            Route::Tcp | Route::Rings if !detected => p.push(format!(
                "{label}: rank {r}: rc {rc} ({msg}), want {INVALID_USAGE} (ncclInvalidUsage)"
            )),
            Route::Tcp | Route::Rings
                if !(msg.contains(" called ") && msg.contains(" but rank ")) =>
            {
                p.push(format!(
                    "{label}: rank {r}: the message does not name both calls: {msg}"
                ))
            }
            // Data of a peer whose call matched, or a root's own copy, may
            // reach the output before the mismatch is found; nothing else.
            Route::Tcp | Route::Rings if get("in_untouched") != "1" => p.push(format!(
                "{label}: rank {r}: the input buffer was written by the rejected call"
            )),
            _ => {}
        }
        if path == Route::Direct && get("async") != INVALID_USAGE {
            p.push(format!("{label}: rank {r}: async error {}", get("async")));
        }
        if get("later_rc") != REMOTE_ERROR {
            p.push(format!(
                "{label}: rank {r}: a later AllReduce on the failed comm returned {:?}, want \
                 {REMOTE_ERROR} (ncclRemoteError)",
                get("later_rc")
            ));
        }
        if get("destroy_rc") != "0" {
            p.push(format!(
                "{label}: rank {r}: ncclCommDestroy returned {:?}",
                get("destroy_rc")
            ));
        }
    }
    if usage == 0 {
        p.push(format!("{label}: no rank returned ncclInvalidUsage"));
    }
    p
}

#[test]
fn mismatched_calls_fail_on_every_rank_without_touching_memory() {
    let so = hetccl_so();
    // (label, what, count, alloc, route)
    let mut cases: Vec<(String, &str, usize, &str, Route)> = Vec::new();
    // Every kind of mismatch on the direct paths (shapes on the board).
    for (name, count, alloc) in [
        ("board slots", 100, "guard"),
        ("single copy (CMA)", 100_000, "guard"),
        ("single copy (mapped ncclMemAlloc)", 100_000, "memalloc"),
    ] {
        for what in ["count", "dtype", "op", "kind", "root"] {
            cases.push((format!("{name} {what}"), what, count, alloc, Route::Direct));
        }
    }
    // Broadcasts of another count: 100 floats stay in the ring of 16 KiB
    // slots; 8 floats (32 B) are posted in the broadcast lines while the
    // receiver's 64 B wait in the slots.
    for (name, count) in [("board slots", 100), ("board lines", 8)] {
        cases.push((
            format!("{name} bcount"),
            "bcount",
            count,
            "guard",
            Route::Direct,
        ));
    }
    cases.push(("board lines root".into(), "root", 2, "guard", Route::Direct));
    // Every kind of mismatch on the executor's links (fingerprints).
    for (name, route) in [("tcp", Route::Tcp), ("rings", Route::Rings)] {
        for what in ["count", "dtype", "op", "kind", "root"] {
            cases.push((format!("{name} {what}"), what, 100_000, "guard", route));
        }
    }
    let cases: Vec<(&str, &str, usize, &str, Route)> = cases
        .iter()
        .map(|(l, w, c, a, r)| (l.as_str(), *w, *c, *a, *r))
        .collect();
    let mut failures = Vec::new();
    for &(label, what, count, alloc, path) in &cases {
        let j = job(label, what, count, alloc, path);
        match coll::run(exe(), &so, &j) {
            Ok(o) => {
                let p = problems(label, path, &o.outs);
                eprintln!(
                    "[mismatch] {label}: {} in {:.1}s",
                    if p.is_empty() { "ok" } else { "FAILED" },
                    o.elapsed.as_secs_f64()
                );
                for x in &o.outs {
                    eprintln!(
                        "    rank {}: rc {} in {} ms: {}",
                        x.rank,
                        x.get("mismatch.rc").unwrap_or_default(),
                        x.get("mismatch.ms").unwrap_or_default(),
                        x.get("mismatch.last_error").unwrap_or_default()
                    );
                }
                if !p.is_empty() {
                    failures.push(format!(
                        "{}\n{}",
                        p.join("\n"),
                        ranks::report(&o.outs, 3000)
                    ));
                }
            }
            Err(e) => failures.push(e),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// `HETCCL_CHECK=1` on all ranks but one (which has `0`) turns fingerprints
/// off on every rank of the communicator, with a warning, so that their
/// messages still agree: the allreduces over TCP are exact.
#[test]
fn ranks_that_disagree_on_the_check_turn_it_off_together() {
    let so = hetccl_so();
    let j = Job::new("tcp, HETCCL_CHECK=0 on rank 0", 2, "allreduce")
        .args(["--counts", "1,1000,100000"])
        .env("NCCL_SHM_DISABLE", "1")
        .env("NCCL_DEBUG", "WARN")
        .env("HETCCL_CHECK", "1")
        .rank_env(|r, _| {
            if r == 0 {
                vec![("HETCCL_CHECK".into(), "0".into())]
            } else {
                Vec::new()
            }
        });
    let o = coll::run(exe(), &so, &j).unwrap_or_else(|e| panic!("{e}"));
    assert!(o.checks > 0);
    let warned = &o.outs[1].stdout;
    assert!(
        warned.contains("HETCCL_CHECK is off on some ranks"),
        "rank 1 did not warn:\n{warned}"
    );
}

/// A mismatch across paths: rank 0 calls AllReduce (single copy on one
/// node), rank 1 Reduce to rank 0 (the executor). Neither sees the other's
/// shape. Rank 0 must fail within the stall limit; rank 1, whose part of a
/// Reduce needs nothing from the root, may finish, but then its next call
/// fails. With fingerprints on, rank 1 waits for the root's and fails at
/// the stall limit too. No canary or guard page is touched.
#[test]
fn a_mismatch_across_paths_fails_within_the_stall_limit() {
    let so = hetccl_so();
    for check in ["0", "1"] {
        let j = job(
            "allreduce against reduce",
            "reduce",
            100_000,
            "guard",
            Route::Direct,
        )
        .env("HETCCL_TIMEOUT_S", "3")
        .env("HETCCL_CHECK", check);
        let o = coll::run(exe(), &so, &j).unwrap_or_else(|e| panic!("{e}"));
        for x in &o.outs {
            let get = |k: &str| x.get(&format!("mismatch.{k}")).unwrap_or_default();
            eprintln!(
                "HETCCL_CHECK={check} rank {}: rc {} in {} ms: {}; later rc {}",
                x.rank,
                get("rc"),
                get("ms"),
                get("last_error"),
                get("later_rc")
            );
            let failed = get("rc") != "0";
            assert!(
                failed || (x.rank == 1 && check == "0"),
                "rank {} returned ncclSuccess",
                x.rank
            );
            assert!(
                failed || get("later_rc") != "0",
                "rank {}: no error",
                x.rank
            );
            let ms: f64 = get("ms").parse().unwrap_or(f64::MAX);
            assert!(ms < 5000.0, "rank {} took {ms} ms", x.rank);
            assert_eq!(get("destroy_rc"), "0", "rank {}: destroy", x.rank);
        }
    }
}
