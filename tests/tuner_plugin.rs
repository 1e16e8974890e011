//! The NCCL tuner plugin of `libhetccl.so`, called as NVIDIA NCCL calls it.
//!
//! `tests/c/tuner_check.c` dlopens the library, takes `ncclTunerPlugin_v6`,
//! `_v5`, `_v4` and `_v3`, and calls `init`, `getCollInfo` over a cost table
//! with unusable (-1.0) cells, `getChunkSize` and `finalize`. It checks that
//! every call succeeds and no -1.0 cell changes, and prints the pair NCCL
//! would pick for each (collective, size). This test writes the tuning
//! table, runs the program with and without it, and compares each pick with
//! what the table says.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use hetccl_testkit::{cc, hetccl_so, tmp_dir};

/// NCCL's pick in the harness's cost table when nothing is edited.
const BASE: &str = "ring/simple";
const VERSIONS: [&str; 4] = ["v6", "v5", "v4", "v3"];
const COLLS: [&str; 4] = ["allreduce", "allgather", "broadcast", "reducescatter"];
const SIZES: [u64; 6] = [8, 1024, 65535, 65536, 1048576, 4194304];

/// The table: for 4 ranks on 2 nodes, small allreduce Tree/LL, mid-size
/// allreduce PAT/Simple on 6 channels, allgather Tree/LL128 and broadcast
/// NVLS/Simple (both unusable in the harness's cost table), and a
/// reducescatter entry that is already NCCL's pick. 8 ranks get Ring/LL.
const TABLE: &str = r#"{
  "format": "hetccl-nccl-tuning", "version": 1,
  "meta": {"source": "tests/tuner_plugin.rs"},
  "layouts": [
    {"nranks": 4, "nnodes": 2, "entries": [
      {"collective": "allreduce", "max_bytes": 65535, "algo": "tree", "proto": "ll"},
      {"collective": "allreduce", "min_bytes": 65536, "max_bytes": 1048576,
       "algo": "pat", "proto": "simple", "nchannels": 6, "chunk_bytes": 131072},
      {"collective": "allgather", "algo": "tree", "proto": "ll128", "nchannels": 2},
      {"collective": "broadcast", "algo": "nvls", "proto": "simple"},
      {"collective": "reducescatter", "min_bytes": 1024, "max_bytes": 1024,
       "algo": "ring", "proto": "simple"}]},
    {"nranks": 8, "nnodes": 2, "entries": [
      {"collective": "allreduce", "algo": "ring", "proto": "ll"}]}
  ]
}"#;

fn program() -> &'static Path {
    static EXE: OnceLock<PathBuf> = OnceLock::new();
    EXE.get_or_init(|| {
        cc::compile_c(
            "tests/c/tuner_check.c",
            "tuner_check",
            &cc::CcOpts {
                link_nvidia_nccl: false,
                extra: vec!["-ldl".into()],
            },
        )
    })
}

fn write(name: &str, text: &str) -> PathBuf {
    let p = tmp_dir().join(name);
    std::fs::write(&p, text).unwrap();
    p
}

/// What one run printed: the `key value` lines, and the log lines.
struct Run {
    kv: BTreeMap<String, String>,
    logs: Vec<String>,
}

fn run(table: Option<&Path>, nranks: u32, nnodes: u32) -> Run {
    let mut cmd = Command::new(program());
    // The suite's own variables (HETCCL_REQUIRE_*) would draw warnings.
    hetccl_testkit::ranks::clean_env(&mut cmd);
    cmd.arg(hetccl_so())
        .arg(nranks.to_string())
        .arg(nnodes.to_string())
        .env_remove("HETCCL_TUNING_FILE")
        .env_remove("NCCL_DEBUG_FILE")
        .env("NCCL_DEBUG", "INFO")
        .env("NCCL_DEBUG_SUBSYS", "ALL");
    if let Some(t) = table {
        cmd.env("HETCCL_TUNING_FILE", t);
    }
    let out = cc::run_ok(&mut cmd);
    let text = String::from_utf8(out.stdout).expect("UTF-8 output");
    // Only the program's own lines: hetccl may print to stdout before NCCL's
    // logger is installed.
    let mine: Vec<&str> = text
        .lines()
        .filter(|l| {
            // `v3.`…`v6.` keys, not a log line from a host named `v…`.
            let versioned =
                l.starts_with('v') && l.as_bytes().get(1).is_some_and(u8::is_ascii_digit);
            versioned || l.starts_with("log.") || l.starts_with("ok ")
        })
        .collect();
    let kv = cc::parse_kv(&mine.join("\n"));
    assert_eq!(kv.get("ok").map(String::as_str), Some("1"), "{text}");
    let logs = kv
        .iter()
        .filter(|(k, _)| k.starts_with("log."))
        .map(|(_, v)| v.clone())
        .collect();
    Run { kv, logs }
}

/// The pick, channels and changed-cell count the table implies.
fn expected(coll: &str, bytes: u64) -> (&'static str, u32, u32) {
    match (coll, bytes) {
        ("allreduce", 0..=65535) => ("tree/ll", 0, 1),
        ("allreduce", 65536..=1048576) => ("pat/simple", 6, 1),
        _ => (BASE, 0, 0),
    }
}

/// The WARN lines (NCCL_LOG_WARN is 2).
fn warns(r: &Run) -> Vec<&String> {
    r.logs.iter().filter(|l| l.starts_with("2 ")).collect()
}

fn pick<'a>(r: &'a Run, key: &str) -> &'a str {
    r.kv.get(key)
        .unwrap_or_else(|| panic!("no {key} in {:#?}", r.kv))
}

#[test]
fn the_table_best_wins_where_covered_and_usable() {
    let table = write("tuner_table.json", TABLE);
    let r = run(Some(&table), 4, 2);
    for v in VERSIONS {
        for c in COLLS {
            for s in SIZES {
                let (want, nch, changed) = expected(c, s);
                assert_eq!(
                    pick(&r, &format!("{v}.{c}.{s}")),
                    format!("{want} nch={nch} changed={changed}"),
                    "{v} {c} {s} B"
                );
            }
        }
    }
    assert_eq!(pick(&r, "v6.chunk.pat/simple"), "131072");
    assert_eq!(pick(&r, "v6.chunk.tree/simple"), "4096");
    assert!(
        r.logs
            .iter()
            .any(|l| l.contains("loaded") && l.contains("2 layouts")),
        "{:#?}",
        r.logs
    );
    // The one WARN: the harness's bad getCollInfo calls (NULL table, NULL
    // context), reported once per process.
    let warns = warns(&r);
    assert_eq!(warns.len(), 1, "{:#?}", r.logs);
    assert!(
        warns[0].contains("getCollInfo") && warns[0].contains("NULL"),
        "{}",
        warns[0]
    );
}

#[test]
fn a_layout_not_in_the_table_changes_nothing() {
    let table = write("tuner_table_layout.json", TABLE);
    for (nranks, nnodes) in [(4, 1), (8, 1), (3, 2)] {
        let r = run(Some(&table), nranks, nnodes);
        for v in VERSIONS {
            for c in COLLS {
                for s in SIZES {
                    assert_eq!(
                        pick(&r, &format!("{v}.{c}.{s}")),
                        format!("{BASE} nch=0 changed=0"),
                        "{nranks}x{nnodes} {v} {c} {s}"
                    );
                }
            }
        }
        assert!(
            r.logs.iter().any(|l| l.contains("no layout")),
            "{:#?}",
            r.logs
        );
    }
    // The 8-rank layout applies to 8 ranks on 2 nodes.
    let r = run(Some(&table), 8, 2);
    assert_eq!(pick(&r, "v5.allreduce.8"), "ring/ll nch=0 changed=1");
    assert_eq!(
        pick(&r, "v5.allgather.8"),
        format!("{BASE} nch=0 changed=0")
    );
}

#[test]
fn without_a_file_nothing_changes_and_it_says_so_once() {
    let r = run(None, 4, 2);
    for v in VERSIONS {
        for c in COLLS {
            for s in SIZES {
                assert_eq!(
                    pick(&r, &format!("{v}.{c}.{s}")),
                    format!("{BASE} nch=0 changed=0")
                );
            }
        }
    }
    assert_eq!(pick(&r, "v6.chunk.pat/simple"), "4096");
    let unset: Vec<_> = r
        .logs
        .iter()
        .filter(|l| l.contains("HETCCL_TUNING_FILE is unset"))
        .collect();
    assert_eq!(unset.len(), 1, "{:#?}", r.logs);
}

#[test]
fn a_bad_file_warns_once_and_changes_nothing() {
    let bad = [
        (
            "tuner_bad_json.json",
            "{\"format\": \"hetccl-nccl-tuning\", \"vers".to_string(),
            "not JSON",
        ),
        (
            "tuner_bad_algo.json",
            TABLE.replace("\"pat\"", "\"mesh\""),
            "algo \"mesh\"",
        ),
        (
            "tuner_bad_big.json",
            " ".repeat((1 << 20) + 1),
            "at most 1048576",
        ),
    ];
    for (name, text, why) in &bad {
        let path = write(name, text);
        let r = run(Some(&path), 4, 2);
        for v in VERSIONS {
            assert_eq!(
                pick(&r, &format!("{v}.allreduce.8")),
                format!("{BASE} nch=0 changed=0"),
                "{name}"
            );
        }
        let warns: Vec<&String> = warns(&r)
            .into_iter()
            .filter(|l| !l.contains("getCollInfo"))
            .collect();
        assert_eq!(warns.len(), 1, "{name}: {:#?}", r.logs);
        assert!(
            warns[0].contains("HETCCL_TUNING_FILE") && warns[0].contains(why),
            "{name}: {}",
            warns[0]
        );
    }
    let r = run(Some(Path::new("/nonexistent/tuning.json")), 4, 2);
    assert_eq!(
        pick(&r, "v6.allreduce.8"),
        format!("{BASE} nch=0 changed=0")
    );
    assert!(r
        .logs
        .iter()
        .any(|l| l.starts_with("2 ") && l.contains("cannot open")));
}

#[test]
fn an_engine_table_is_an_info_line_not_a_warning() {
    let path = write(
        "tuner_engine_table.json",
        r#"{"format":"hetccl-tuning","version":1,"layouts":[{"nranks":4,"nnodes":2,
            "transports":["shm","tcp"],"entries":[
            {"collective":"allreduce","algo":"ring","points":[[8,35.2],[65536,120.0]]}]}]}"#,
    );
    let r = run(Some(&path), 4, 2);
    for v in VERSIONS {
        assert_eq!(
            pick(&r, &format!("{v}.allreduce.8")),
            format!("{BASE} nch=0 changed=0")
        );
    }
    let warns: Vec<&String> = warns(&r)
        .into_iter()
        .filter(|l| !l.contains("getCollInfo"))
        .collect();
    assert!(warns.is_empty(), "{:#?}", r.logs);
    let info: Vec<&String> = r
        .logs
        .iter()
        .filter(|l| l.contains("a table for hetccl's own engine; not used by the tuner plugin"))
        .collect();
    assert_eq!(info.len(), 1, "{:#?}", r.logs);
}
