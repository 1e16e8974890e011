//! A table written by `hetccl-perf tune` drives the engine: the sweep (4
//! ranks on 2 emulated nodes, AllReduce with Ring, Tree and Direct) writes a
//! `hetccl-tuning` file; the engine's parser reads it and finds the layout
//! of that communicator; then 4 processes on 2 host ids run AllReduce with
//! the file, and every rank logs, for every size the table covers, the
//! algorithm the table's interpolation picks (`tune::choose::from_table`),
//! with exact results. Needs `cargo build -p hetccl-perf` (same profile),
//! as `cargo test --workspace` does.

use std::path::Path;

use hetccl_collectives::algo::{AlgoFilter, Collective};
use hetccl_collectives::cost::TransportKind;
use hetccl_collectives::tune::choose::from_table;
use hetccl_collectives::tune::table::Table;
use hetccl_testkit::coll::{self, allreduce_algos, Job};
use hetccl_testkit::perf::run_env;
use hetccl_testkit::{hetccl_so, ranks, tmp_dir};

fn exe() -> &'static Path {
    coll::program("coll_check_mp")
}

#[test]
fn a_table_from_hetccl_perf_tune_drives_the_engine() {
    let out = tmp_dir().join("tune_perf_table.json");
    let _ = std::fs::remove_file(&out);
    let o = out.to_str().unwrap();
    let env = [("HETCCL_SOCKET_IFNAME", "lo"), ("NCCL_DEBUG", "WARN")];
    let r = run_env(
        &[
            "tune",
            "--out",
            o,
            "--colls",
            "all_reduce",
            "--algos",
            "Ring,Tree,Direct",
            "-np",
            "4",
            "--hosts",
            "2",
            "-b",
            "8",
            "-e",
            "64K",
            "-f",
            "8",
            "-n",
            "3",
            "-w",
            "1",
        ],
        &env,
    );
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    let t = Table::load(o).unwrap_or_else(|e| panic!("the engine refuses the sweep's table: {e}"));
    let layout = t
        .layout(4, 2, &[TransportKind::Shm, TransportKind::Tcp])
        .expect("a layout for 4 ranks on 2 nodes over shm and tcp")
        .clone();
    assert_eq!(layout.entries.len(), 3, "{layout:?}");
    // float32 counts inside the measured 8 B .. 32 KiB.
    let counts = [2usize, 100, 1000, 8000];
    let want: Vec<String> = counts
        .iter()
        .map(|&c| {
            let (a, _) = from_table(&layout, Collective::AllReduce, c * 4, &AlgoFilter::all())
                .expect("covered");
            format!("count {c} float bytes {} algo={}", c * 4, a.name())
        })
        .collect();
    eprintln!("[tune_perf_table] the table picks: {want:?}");
    let counts_arg = counts.map(|c| c.to_string()).join(",");
    let path = out.clone();
    let job = Job::new("tune_perf_table", 4, "allreduce")
        .args([
            "--counts",
            counts_arg.as_str(),
            "--dtypes",
            "float32",
            "--big-dtypes",
            "float32",
        ])
        .rank_env(move |rank, _| {
            vec![
                ("HETCCL_HOST_ID".into(), format!("node{}", rank / 2)),
                ("HETCCL_TUNING_FILE".into(), path.display().to_string()),
                ("NCCL_DEBUG".into(), "INFO".into()),
                ("NCCL_DEBUG_SUBSYS".into(), "TUNING".into()),
            ]
        });
    let outs = coll::run_all("tune_perf_table", exe(), &hetccl_so(), vec![job]);
    for o in &outs[0].outs {
        let lines = allreduce_algos(&o.stdout);
        for w in &want {
            assert!(
                lines.iter().any(|l| l.ends_with(w.as_str())),
                "rank {}: no AllReduce logged {w:?}:\n{}",
                o.rank,
                ranks::tail(&o.stdout, 4000)
            );
        }
    }
    let _ = std::fs::remove_file(&out);
}
