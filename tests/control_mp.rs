//! The control API and online adaptation between processes:
//! `tests/c/control_check.c` (built against NVIDIA's `nccl.h` and hetccl's
//! `include/hetccl.h`, linked to NVIDIA's `libnccl.so.2`, run with
//! `LD_PRELOAD=libhetccl.so`), every AllReduce checked exactly.
//!
//! - `hetcclCommSetOption` changes the AllReduce algorithm from the agreed
//!   call on, on every rank (the `algo=` lines of `NCCL_DEBUG_SUBSYS=TUNING`,
//!   by sequence number), and `hetcclCommGetOption` returns what was set:
//!   2 ranks over TCP on one host id, 4 ranks as 2 nodes × 2.
//! - Mismatched sets fail on every rank with `ncclInvalidUsage`, and the
//!   same bad value with `ncclInvalidArgument`; nothing is applied.
//! - Online adaptation: `HETCCL_TEST_DELAY_US` slows the model's first
//!   choice; every rank logs the same switch away from it, and the last
//!   calls run the runner-up. The time of each half of the loop is printed,
//!   not asserted.

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use hetccl_testkit::ranks::{self, RankOutput};
use hetccl_testkit::{cc, hetccl_so, repo_root, tmp_dir};

fn exe() -> &'static PathBuf {
    static EXE: OnceLock<PathBuf> = OnceLock::new();
    EXE.get_or_init(|| {
        cc::compile_c(
            "tests/c/control_check.c",
            "control_check",
            &cc::CcOpts {
                link_nvidia_nccl: true,
                extra: vec![
                    format!("-I{}", repo_root().join("include").display()),
                    "-ldl".into(),
                ],
            },
        )
    })
}

/// The layouts: label, ranks, per-rank environment.
type Layout = (
    &'static str,
    usize,
    fn(usize) -> Vec<(&'static str, String)>,
);

fn tcp_one_host(_: usize) -> Vec<(&'static str, String)> {
    vec![("NCCL_SHM_DISABLE", "1".into())]
}

fn two_hosts(r: usize) -> Vec<(&'static str, String)> {
    vec![("HETCCL_HOST_ID", format!("node{}", r * 2 / 4))]
}

fn two_hosts_of(n: usize) -> fn(usize) -> Vec<(&'static str, String)> {
    match n {
        2 => |r| vec![("HETCCL_HOST_ID", format!("node{r}"))],
        _ => two_hosts,
    }
}

/// Runs one launch; every rank must exit 0 with `done 1` and `wrong 0`.
fn launch(label: &str, layout: &Layout, env: &[(&str, &str)], args: &[&str]) -> Vec<RankOutput> {
    let (name, n, rank_env) = layout;
    let so = hetccl_so();
    let dir = tmp_dir().join(format!("control_{label}_{name}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("id dir");
    let cmds: Vec<Command> = (0..*n)
        .map(|rank| {
            let mut c = Command::new(exe());
            ranks::clean_env(&mut c);
            c.env("LD_PRELOAD", &so)
                .env("HETCCL_SOCKET_IFNAME", "lo")
                .env("HETCCL_TIMEOUT_S", "60")
                .env("NCCL_DEBUG", "INFO")
                .env("NCCL_DEBUG_SUBSYS", "TUNING");
            for (k, v) in rank_env(rank) {
                c.env(k, v);
            }
            for (k, v) in env {
                c.env(k, v);
            }
            c.args(["--rank", &rank.to_string(), "--nranks", &n.to_string()])
                .arg("--id")
                .arg(dir.join("id"))
                .args(args);
            c
        })
        .collect();
    let outs = ranks::run_ranks(cmds, Duration::from_secs(120));
    let _ = std::fs::remove_dir_all(&dir);
    for o in &outs {
        assert!(
            o.ok()
                && o.get("done").as_deref() == Some("1")
                && o.get("wrong").as_deref() == Some("0"),
            "{label} {name}: rank {} {} (wrong {:?})\n{}",
            o.rank,
            o.how(),
            o.get("wrong"),
            ranks::report(&outs, 4000)
        );
    }
    outs
}

/// The AllReduce algorithm of every logged call of a rank, by sequence
/// number (`... seq N rank R: allreduce ... algo=Name`).
fn algos(o: &RankOutput) -> Vec<(u64, String)> {
    let mut v: Vec<(u64, String)> = o
        .stdout
        .lines()
        .filter(|l| l.contains(": allreduce ") && l.contains("algo="))
        .filter_map(|l| {
            let seq = l.split(" seq ").nth(1)?.split(' ').next()?.parse().ok()?;
            let algo = l.split("algo=").nth(1)?.split_whitespace().next()?;
            Some((seq, algo.to_string()))
        })
        .collect();
    v.sort();
    v
}

const LAYOUTS: [Layout; 2] = [("tcp_2", 2, tcp_one_host), ("hosts_2x2", 4, two_hosts)];

#[test]
fn a_set_changes_the_algorithm_from_the_agreed_call_on() {
    let k = 3u64;
    for layout in &LAYOUTS {
        let outs = launch("set", layout, &[], &["--mode", "set", "--iters", "3"]);
        let model = algos(&outs[0])[0].1.clone();
        // Phases: none, algo.allreduce=tree, =ring, algo=direct (the
        // allreduce entry still wins), algo.allreduce=default, algo=default.
        let want = [
            model.as_str(),
            "Tree",
            "Ring",
            "Ring",
            "Direct",
            model.as_str(),
        ];
        let gets = ["", "tree", "ring", "direct", "default", "default"];
        for o in &outs {
            let got = algos(o);
            assert!(got.len() as u64 >= 6 * k, "rank {}: {got:?}", o.rank);
            for (seq, algo) in got.iter().filter(|(s, _)| *s < 6 * k) {
                let phase = (*seq / k) as usize;
                assert_eq!(
                    algo, want[phase],
                    "{}: rank {} call {seq} (phase {phase}) ran {algo}, want {}\n{got:?}",
                    layout.0, o.rank, want[phase]
                );
            }
            for (p, g) in gets.iter().enumerate().skip(1) {
                assert_eq!(o.get(&format!("phase.{p}.get")).as_deref(), Some(*g));
            }
            assert_eq!(o.get("get.compress").as_deref(), Some("bf16"));
            assert_eq!(o.get("get.tune").as_deref(), Some("off"));
            assert_eq!(o.get("get.chunk_bytes").as_deref(), Some("65536"));
            assert_eq!(o.get("get.chunk_default").as_deref(), Some("524288"));
            assert!(o.get("get.truncation_wrong").is_none(), "rank {}", o.rank);
            // Every rank logged the sets at the same collective.
            assert!(
                o.stdout
                    .contains("option algo.allreduce=tree from collective 3"),
                "rank {}:\n{}",
                o.rank,
                o.stdout
            );
        }
        eprintln!(
            "[control_mp] set {}: model {model}, then {want:?}",
            layout.0
        );
    }
}

/// On one node over shm, 64 KiB AllReduces take the single-copy path (no
/// plan, no `algo=` line) until a set leaves `Direct` out, and again once
/// the sets are cleared.
#[test]
fn a_set_reaches_the_single_node_direct_paths() {
    let k = 3u64;
    let layout: Layout = ("shm_2", 2, |_| Vec::new());
    let outs = launch("set", &layout, &[], &["--mode", "set", "--iters", "3"]);
    let want = [None, Some("Tree"), Some("Ring"), Some("Ring"), None, None];
    for o in &outs {
        let got = algos(o);
        let phases: Vec<(u64, &str)> = got
            .iter()
            .filter(|(s, _)| *s < 6 * k)
            .map(|(s, a)| (*s / k, a.as_str()))
            .collect();
        let expect: Vec<(u64, &str)> = want
            .iter()
            .enumerate()
            .filter_map(|(p, a)| a.map(|a| (p as u64, a)))
            .flat_map(|(p, a)| std::iter::repeat_n((p, a), k as usize))
            .collect();
        assert_eq!(phases, expect, "rank {}: {got:?}", o.rank);
    }
}

#[test]
fn mismatched_sets_fail_on_every_rank() {
    for layout in &[("hosts_2", 2, two_hosts_of(2)), LAYOUTS[1]] {
        let outs = launch("mismatch", layout, &[], &["--mode", "mismatch"]);
        for o in &outs {
            assert_eq!(
                o.get("mismatch.rc").as_deref(),
                Some("5"),
                "rank {}",
                o.rank
            );
            let e = o.get("mismatch.error").unwrap_or_default();
            assert!(e.contains("ranks disagree"), "rank {}: {e}", o.rank);
            assert_eq!(o.get("mismatch.get").as_deref(), Some("default"));
            assert_eq!(o.get("bad.rc").as_deref(), Some("4"), "rank {}", o.rank);
            let e = o.get("bad.error").unwrap_or_default();
            assert!(e.contains("rung"), "rank {}: {e}", o.rank);
        }
    }
}

/// The line `online: allreduce ... switch A -> B from call N` of a rank.
fn switches(o: &RankOutput) -> Vec<String> {
    o.stdout
        .lines()
        .filter(|l| l.contains("online: allreduce") && l.contains("switch"))
        .map(|l| {
            let s = l.split("switch ").nth(1).unwrap_or("");
            s.split(" (").next().unwrap_or("").to_string()
        })
        .collect()
}

/// A `hetccl-tuning` table that fixes the first choice of 64 KiB
/// AllReduces on both online layouts: `HETCCL_TUNE=online` calibrates the
/// cost model at init, so the model's own choice may differ between
/// launches. Direct on 2 hosts, Hierarchical on 2 × 2 (the default
/// model's choices).
fn pinned_table() -> String {
    let path = tmp_dir().join("control_online_table.json");
    let entry = |algo: &str| {
        format!(r#"{{"collective":"allreduce","algo":"{algo}","points":[[65536,100.0]]}}"#)
    };
    let text = format!(
        r#"{{"format":"hetccl-tuning","version":1,"layouts":[
          {{"nranks":2,"nnodes":2,"transports":["tcp"],"entries":[{}]}},
          {{"nranks":4,"nnodes":2,"transports":["shm","tcp"],"entries":[{}]}}]}}"#,
        entry("direct"),
        entry("hierarchical")
    );
    std::fs::write(&path, text).expect("table written");
    path.display().to_string()
}

/// The first choice for 64 KiB AllReduces on `layout` (from
/// [`pinned_table`]), without any delay.
fn first_choice(layout: &Layout) -> String {
    let table = pinned_table();
    let probe = launch(
        "online_probe",
        layout,
        &[("HETCCL_TUNE", "online"), ("HETCCL_TUNING_FILE", &table)],
        &["--mode", "online", "--iters", "2"],
    );
    algos(&probe[0])[0].1.clone()
}

/// 256 AllReduces with the first choice delayed 4 ms: every rank switches
/// away from it on the same call, and then runs the new choice on every
/// call but the exploration calls.
fn online_case(layout: &Layout, how: &str, first: &str) {
    let delay = format!("{first}:4000");
    let table = pinned_table();
    let mut env = vec![
        ("HETCCL_TEST_DELAY_US", delay.as_str()),
        ("HETCCL_TUNING_FILE", table.as_str()),
    ];
    let mut args = vec!["--mode", "online", "--iters", "256"];
    if how == "env" {
        env.push(("HETCCL_TUNE", "online"));
    } else {
        args.push("--set-tune");
    }
    let outs = launch(&format!("online_{how}"), layout, &env, &args);
    let sw0 = switches(&outs[0]);
    assert!(
        !sw0.is_empty() && sw0[0].starts_with(&format!("{first} -> ")),
        "{} {how}: no switch away from {first}:\n{}",
        layout.0,
        ranks::report(&outs, 4000)
    );
    let to = sw0[0]
        .split(" -> ")
        .nth(1)
        .and_then(|s| s.split(' ').next())
        .unwrap_or("")
        .to_string();
    for o in &outs {
        assert_eq!(switches(o), sw0, "{how}: rank {} decided otherwise", o.rank);
        assert_eq!(o.get("online.tune").as_deref(), Some("online"));
        let got = algos(o);
        assert_eq!(got.len(), 256, "{how}: rank {}", o.rank);
        assert_eq!(got[0].1, first);
        // In the second half only the exploration calls (index 7 mod 8)
        // run the old choice.
        for (i, (_, a)) in got.iter().enumerate().skip(128) {
            let want = if i % 8 == 7 { first } else { to.as_str() };
            assert_eq!(a, want, "{} {how}: rank {} call {i}", layout.0, o.rank);
        }
    }
    let ms = |k: &str| {
        outs[0]
            .get(k)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    eprintln!(
        "[control_mp] online {} ({how}): {first} delayed 4 ms, switch {}; halves {:.0} ms, {:.0} ms",
        layout.0,
        sw0.join("; "),
        ms("online.first_ms"),
        ms("online.second_ms")
    );
}

#[test]
fn online_adaptation_moves_away_from_a_slow_first_choice() {
    let two: Layout = ("hosts_2", 2, two_hosts_of(2));
    let first = first_choice(&two);
    online_case(&two, "env", &first);
    online_case(&two, "option", &first);
    let four = LAYOUTS[1];
    let first = first_choice(&four);
    online_case(&four, "env", &first);
}
