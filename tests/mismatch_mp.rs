//! Mismatched calls between processes: 2 ranks of `tests/c/coll_check.c`
//! (mode `mismatch`) call one AllReduce where rank 1 passes twice rank 0's
//! count, or the same count in float64 instead of float32, with every
//! buffer ending at a `PROT_NONE` page (or, for `ncclMemAlloc` buffers,
//! followed by canary bytes in the same allocation, which peers map whole).
//!
//! On every direct path (board slots, single copy with
//! `process_vm_readv`/`writev`, single copy through mapped `ncclMemAlloc`
//! buffers) both ranks must return `ncclInvalidUsage` naming the
//! disagreement, with no buffer touched and no canary changed. Over TCP the
//! rank that sees the wrong message size returns `ncclInvalidUsage`; the
//! other may instead see its peer go (`ncclRemoteError`) within the stall
//! limit. Afterwards the communicator is failed on every rank: a
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
    Direct,
    Tcp,
}

fn job(label: &str, what: &str, count: usize, alloc: &str, tcp: bool) -> Job {
    let mut j = Job::new(label, 2, "mismatch")
        .env("COLL_CHECK_MM_WHAT", what)
        .env("COLL_CHECK_MM_COUNT", &count.to_string())
        .env("COLL_CHECK_MM_ALLOC", alloc)
        // A rank left waiting shows up as a slow error, not a long hang.
        .env("HETCCL_TIMEOUT_S", "10");
    if tcp {
        j = j.env("NCCL_SHM_DISABLE", "1");
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
            Route::Tcp if !detected && rc != REMOTE_ERROR => p.push(format!(
                "{label}: rank {r}: rc {rc} ({msg}), want ncclInvalidUsage or ncclRemoteError"
            )),
            Route::Tcp if detected && !msg.contains("mismatched") => p.push(format!(
                "{label}: rank {r}: the message does not name mismatched operations: {msg}"
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
    // (label, what, count, alloc, over TCP)
    let cases: &[(&str, &str, usize, &str, bool)] = &[
        ("board slots count", "count", 100, "guard", false),
        ("board slots dtype", "dtype", 100, "guard", false),
        ("single copy (CMA) count", "count", 100_000, "guard", false),
        ("single copy (CMA) dtype", "dtype", 100_000, "guard", false),
        (
            "single copy (mapped ncclMemAlloc) count",
            "count",
            100_000,
            "memalloc",
            false,
        ),
        (
            "single copy (mapped ncclMemAlloc) dtype",
            "dtype",
            100_000,
            "memalloc",
            false,
        ),
        ("tcp count", "count", 100_000, "guard", true),
        ("tcp dtype", "dtype", 100_000, "guard", true),
    ];
    let mut failures = Vec::new();
    for &(label, what, count, alloc, tcp) in cases {
        let j = job(label, what, count, alloc, tcp);
        let path = if tcp { Route::Tcp } else { Route::Direct };
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
