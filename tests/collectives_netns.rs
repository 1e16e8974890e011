//! Two "nodes" × two ranks in two network namespaces joined by a veth pair
//! (`tests/support/netns.rs`): ranks 0 and 1 run in namespace A
//! (`HETCCL_HOST_ID=A`, `HETCCL_SOCKET_IFNAME=<A's veth>`), ranks 2 and 3
//! in B, so traffic between the nodes crosses a real (virtual) link with
//! its own addresses, and the unique-id file is on the shared filesystem.
//! Every mode of `tests/c/coll_check.c` must pass with 0 wrong (also over
//! TCP only, and with each AllReduce algorithm forced), and
//! AllReduce must choose the hierarchical algorithm (rank 0 runs with
//! `NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=TUNING`; hetccl logs
//! `algo=<Name>` per collective under `hetccl::TUNING`).
//!
//! Needs root (to create namespaces). When they cannot be created the test
//! prints why and passes, unless `HETCCL_REQUIRE_NETNS=1` (CI sets it), in
//! which case it fails.

use std::path::Path;
use std::rc::Rc;

use hetccl_testkit::coll::{allreduce_algos, Job};
use hetccl_testkit::modes::{ALLREDUCE_ALGOS, MODES};
use hetccl_testkit::netns::NetnsPair;
use hetccl_testkit::{coll, hetccl_so, ranks};

fn exe() -> &'static Path {
    coll::program("coll_check_netns")
}

/// The namespaces, or `None` (after saying why) when this host cannot make
/// them and `HETCCL_REQUIRE_NETNS` is not 1.
fn namespaces() -> Option<NetnsPair> {
    match NetnsPair::create() {
        Ok(p) => {
            eprintln!("network namespaces: {}", p.describe());
            Some(p)
        }
        Err(e) => {
            let required = std::env::var("HETCCL_REQUIRE_NETNS").is_ok_and(|v| v == "1");
            assert!(
                !required,
                "HETCCL_REQUIRE_NETNS=1 but the network namespaces cannot be created: {e}"
            );
            eprintln!("SKIPPED: cannot create network namespaces ({e}); set HETCCL_REQUIRE_NETNS=1 to make this an error");
            None
        }
    }
}

const RANKS_PER_NODE: usize = 2;
const NRANKS: usize = 4;

/// A job whose rank r runs in node r/2's namespace, with that node's host id
/// and veth; `extra_env(rank)` adds more.
fn job(
    pair: &Rc<NetnsPair>,
    label: &str,
    mode: &str,
    args: &[&str],
    extra_env: fn(usize) -> Vec<(String, String)>,
) -> Job {
    let p1 = Rc::clone(pair);
    let p2 = Rc::clone(pair);
    Job::new(format!("netns_2x2 {label}"), NRANKS, mode)
        .args(args.iter().copied())
        .prefix(move |rank| p1.exec_prefix(rank / RANKS_PER_NODE))
        .rank_env(move |rank, _| {
            let node = rank / RANKS_PER_NODE;
            let mut v = vec![
                (
                    "HETCCL_HOST_ID".to_string(),
                    if node == 0 { "A" } else { "B" }.to_string(),
                ),
                (
                    "HETCCL_SOCKET_IFNAME".to_string(),
                    p2.node(node).1.to_string(),
                ),
            ];
            v.extend(extra_env(rank));
            v
        })
}

fn none(_: usize) -> Vec<(String, String)> {
    Vec::new()
}

fn rank0_tuning(rank: usize) -> Vec<(String, String)> {
    if rank == 0 {
        vec![
            ("NCCL_DEBUG".into(), "INFO".into()),
            ("NCCL_DEBUG_SUBSYS".into(), "TUNING".into()),
        ]
    } else {
        Vec::new()
    }
}

#[test]
fn two_nodes_two_ranks_each() {
    let Some(pair) = namespaces() else { return };
    let pair = Rc::new(pair);
    let so = hetccl_so();
    let mut jobs: Vec<Job> = MODES
        .iter()
        .map(|m| {
            job(
                &pair,
                m,
                m,
                &["--counts", "0,1,1021,1048579", "--big-dtypes", "float32"],
                none,
            )
        })
        .collect();
    // TCP between the nodes and inside them too.
    jobs.push(
        job(
            &pair,
            "allreduce NCCL_SHM_DISABLE=1",
            "allreduce",
            &["--counts", "0,1,1021,1048579", "--big-dtypes", "float32"],
            none,
        )
        .env("NCCL_SHM_DISABLE", "1"),
    );
    // Every AllReduce algorithm forced in turn across the link.
    for algo in ALLREDUCE_ALGOS {
        jobs.push(
            job(
                &pair,
                &format!("allreduce NCCL_ALGO=allreduce:{algo}"),
                "allreduce",
                &[
                    "--counts",
                    "0,1,1021,1048579",
                    "--dtypes",
                    "int8,int32,float32,bfloat16,f8e4m3",
                    "--big-dtypes",
                    "float32",
                ],
                none,
            )
            .env("NCCL_ALGO", &format!("allreduce:{algo}")),
        );
    }
    jobs.push(job(
        &pair,
        "hierarchical choice",
        "allreduce",
        &[
            "--counts",
            "1021,1048579",
            "--dtypes",
            "float32",
            "--big-dtypes",
            "float32",
        ],
        rank0_tuning,
    ));
    let outs = coll::run_all("netns_2x2", exe(), &so, jobs);
    let log = &outs.last().expect("the tuning job ran").outs[0].stdout;
    let lines = allreduce_algos(log);
    assert!(
        !lines.is_empty(),
        "rank 0 logged no `algo=` line for AllReduce at NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=TUNING:\n{}",
        ranks::tail(log, 4000)
    );
    assert!(
        lines.iter().any(|l| l.contains("algo=Hierarchical")),
        "2 nodes x 2 ranks: no AllReduce chose the hierarchical algorithm:\n{}",
        lines.join("\n")
    );
    drop(outs);
    // `pair` (the last Rc) drops here and deletes the namespaces; a panic
    // above unwinds through the same Drop.
}
