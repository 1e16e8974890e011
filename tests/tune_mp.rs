//! Every rank chooses as rank 0 does: 4 processes on 2 "nodes"
//! (`HETCCL_HOST_ID`, shm inside a node, TCP between), each with its own
//! `HETCCL_TUNING_FILE`. Rank 0's table makes Ring the fastest AllReduce;
//! the other ranks' tables make Direct the fastest; the cost model alone
//! picks Hierarchical on this layout. Every rank must log the same `algo=`
//! for every AllReduce (target `hetccl::TUNING`), all Ring, and every
//! result must be exact (`tests/c/coll_check.c`). A second launch runs
//! `HETCCL_TUNE=init` on rank 0 only: every rank calibrates and agrees on
//! rank 0's model.

use std::path::{Path, PathBuf};

use hetccl_testkit::coll::{self, allreduce_algos, Job};
use hetccl_testkit::{hetccl_so, ranks, tmp_dir};

fn exe() -> &'static Path {
    coll::program("coll_check_mp")
}

/// A table for 4 ranks on 2 nodes over shm and TCP where `algo` is the
/// fastest AllReduce at every size from 1 B to 1 GiB.
fn table(algo: &str) -> String {
    format!(
        r#"{{"format":"hetccl-tuning","version":1,"meta":{{"test":"tune_mp"}},
  "layouts":[{{"nranks":4,"nnodes":2,"transports":["shm","tcp"],"entries":[
    {{"collective":"allreduce","algo":"{algo}","points":[[1,1.0],[1073741824,2.0]]}},
    {{"collective":"allreduce","algo":"tree","points":[[1,50.0],[1073741824,90000.0]]}}]}}]}}"#
    )
}

fn write(name: &str, text: &str) -> PathBuf {
    let p = tmp_dir().join(name);
    std::fs::write(&p, text).unwrap();
    p
}

/// Node = rank / 2; INFO logging of the TUNING subsystem on every rank.
fn base_env(rank: usize) -> Vec<(String, String)> {
    vec![
        ("HETCCL_HOST_ID".into(), format!("node{}", rank / 2)),
        ("NCCL_DEBUG".into(), "INFO".into()),
        ("NCCL_DEBUG_SUBSYS".into(), "TUNING".into()),
    ]
}

fn allreduce_job(label: &str) -> Job {
    Job::new(label, 4, "allreduce").args([
        "--counts",
        "1,1021,1048579",
        "--dtypes",
        "float32,int32",
        "--big-dtypes",
        "float32",
    ])
}

/// Each rank's AllReduce choices, as `allreduce count .. algo=<Name>` (the
/// log line without its rank-specific prefix).
fn choices(out: &str) -> Vec<String> {
    allreduce_algos(out)
        .into_iter()
        .map(|l| match l.split_once(": allreduce ") {
            Some((_, c)) => format!("allreduce {c}"),
            None => l.to_string(),
        })
        .collect()
}

#[test]
fn every_rank_uses_rank_0s_table() {
    let so = hetccl_so();
    let ring = write("tune_mp_rank0.json", &table("ring"));
    let direct = write("tune_mp_others.json", &table("direct"));
    let job = allreduce_job("tune_mp tables differ").rank_env(move |rank, _| {
        let mut v = base_env(rank);
        let t = if rank == 0 { &ring } else { &direct };
        v.push(("HETCCL_TUNING_FILE".into(), t.display().to_string()));
        v
    });
    let outs = coll::run_all("tune_mp", exe(), &so, vec![job]);
    let outs = &outs[0].outs;
    let per_rank: Vec<Vec<String>> = outs.iter().map(|o| choices(&o.stdout)).collect();
    assert!(
        !per_rank[0].is_empty(),
        "rank 0 logged no AllReduce choice:\n{}",
        ranks::tail(&outs[0].stdout, 4000)
    );
    for (r, c) in per_rank.iter().enumerate() {
        assert_eq!(c, &per_rank[0], "rank {r} chose differently from rank 0");
    }
    assert!(
        per_rank[0].iter().all(|l| l.ends_with("algo=Ring")),
        "rank 0's table makes Ring the fastest:\n{}",
        per_rank[0].join("\n")
    );
    for (r, o) in outs.iter().enumerate().skip(1) {
        assert!(
            o.stdout.contains("rank 0's choice counts"),
            "rank {r} did not say it follows rank 0:\n{}",
            ranks::tail(&o.stdout, 4000)
        );
    }
}

#[test]
fn calibration_on_rank_0_is_used_by_every_rank() {
    let so = hetccl_so();
    let job = allreduce_job("tune_mp init on rank 0").rank_env(|rank, _| {
        let mut v = base_env(rank);
        if rank == 0 {
            v.push(("HETCCL_TUNE".into(), "init".into()));
            v.push(("HETCCL_TUNE_BUDGET_MS".into(), "40".into()));
        }
        v
    });
    let outs = coll::run_all("tune_mp", exe(), &so, vec![job]);
    let outs = &outs[0].outs;
    // Every rank logs the model it uses; they are rank 0's, so the text
    // after "calibrated in <time>:" is the same everywhere.
    let models: Vec<String> = outs
        .iter()
        .map(|o| {
            let line = o
                .stdout
                .lines()
                .find(|l| l.contains(": calibrated in "))
                .unwrap_or_else(|| {
                    panic!(
                        "rank {} did not calibrate:\n{}",
                        o.rank,
                        ranks::tail(&o.stdout, 4000)
                    )
                });
            line.split_once(": calibrated in ")
                .and_then(|(_, rest)| rest.split_once(": "))
                .map(|(_, m)| m.to_string())
                .unwrap_or_default()
        })
        .collect();
    eprintln!("[tune_mp] rank 0's calibrated model: {}", models[0]);
    for (r, m) in models.iter().enumerate() {
        assert_eq!(m, &models[0], "rank {r}'s model differs from rank 0's");
    }
    let per_rank: Vec<Vec<String>> = outs.iter().map(|o| choices(&o.stdout)).collect();
    assert!(!per_rank[0].is_empty());
    for (r, c) in per_rank.iter().enumerate() {
        assert_eq!(c, &per_rank[0], "rank {r} chose differently from rank 0");
    }
}
