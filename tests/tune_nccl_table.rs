//! `hetccl-perf tune --format nccl` writes a table that hetccl's NCCL tuner
//! plugin reads: the sweep runs through the library with `NCCL_ALGO` and
//! `NCCL_PROTO` forced (hetccl stands in for NVIDIA's NCCL here: it takes
//! Ring and Tree, and warns that NCCL_PROTO is ignored), and the file it
//! writes parses with the plugin's own parser, covers every size of each
//! swept collective with one of the swept pairs, and is refused by the
//! engine-format merge.

use hetccl_testkit::perf::run_env;
use nccl_net_plugin::tuner::table::Table;

#[test]
fn an_nccl_table_from_tune_loads_in_the_tuner_plugin() {
    let dir = std::env::temp_dir().join(format!("hetccl-tune-nccl-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join("nccl.json");
    let o = out.to_str().unwrap();
    let env = [("HETCCL_SOCKET_IFNAME", "lo")];
    let r = run_env(
        &[
            "tune",
            "--format",
            "nccl",
            "--out",
            o,
            "--colls",
            "all_reduce,broadcast",
            "--algos",
            "Ring,Tree",
            "--protos",
            "LL,Simple",
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
            "2",
            "-w",
            "1",
        ],
        &env,
    );
    let err = String::from_utf8_lossy(&r.stderr);
    assert!(r.status.success(), "{err}");
    assert!(err.contains("NCCL table for 4 ranks on 2 node(s)"), "{err}");
    let t = Table::load(o).unwrap_or_else(|e| panic!("the tuner plugin refuses the table: {e}"));
    let l = t.layout(4, 2).expect("a layout for 4 ranks on 2 nodes");
    // NCCL's collective indices: broadcast 0, allreduce 4.
    for coll in [0usize, 4] {
        for nbytes in [0u64, 8, 100, 4096, 65536, 1 << 30] {
            assert!(
                l.lookup(coll, nbytes).is_some(),
                "collective {coll} at {nbytes} B is not covered"
            );
        }
    }
    // A second run of the other format into the same file is refused.
    let r = run_env(
        &[
            "tune",
            "--out",
            o,
            "--colls",
            "all_reduce",
            "--algos",
            "Ring",
            "-np",
            "2",
            "-b",
            "8",
            "-e",
            "8",
            "-n",
            "1",
            "-w",
            "0",
        ],
        &env,
    );
    assert!(!r.status.success());
    assert!(String::from_utf8_lossy(&r.stderr).contains("not a hetccl-tuning version 1 table"));
    let _ = std::fs::remove_dir_all(&dir);
}
