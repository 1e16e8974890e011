//! End to end: hetccl-perf against this build's libhetccl.so, for every
//! collective, as 2 and 4 processes (`-np`), as threads, under an
//! mpirun-style environment with `--id-file`, and through an argv[0] alias.
//! Every table must parse as nccl-tests output with #wrong == 0.

use std::process::{Command, Output};

use hetccl_perf::coll::Coll;
use hetccl_testkit::hetccl_so;
use hetccl_testkit::perf::{parse, perf_bin, run, run_env, Parsed};

fn text(o: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// Fails with the reason when the engine under test is still a stub.
fn engine_gate(stderr: &str) {
    assert!(
        !stderr.contains("not implemented yet"),
        "the library under test reports an unimplemented engine (ncclInvalidUsage): {stderr}"
    );
}

/// Runs, requires success, parses, and checks every reported #wrong is 0 and
/// that only unchecked in-place variants (alltoall, sendrecv) show N/A.
fn run_ok(args: &[&str]) -> Parsed {
    run_ok_env(args, &[])
}

/// [`run_ok`] with extra environment variables.
fn run_ok_env(args: &[&str], env: &[(&str, &str)]) -> Parsed {
    let o = run_env(args, env);
    let (out, err) = text(&o);
    engine_gate(&err);
    assert!(
        o.status.success(),
        "hetccl-perf {args:?} failed ({:?})\nstdout:\n{out}\nstderr:\n{err}",
        o.status
    );
    let p = parse(&out).unwrap_or_else(|e| panic!("output of {args:?} does not parse: {e}\n{out}"));
    let coll = Coll::from_name(args[0]).expect("first arg is the collective");
    assert_eq!(p.program, coll.program());
    assert_eq!(p.concluded, coll.program());
    assert!(
        p.oob_ok && p.out_of_bounds == 0,
        "{args:?}: out of bounds {}\n{out}",
        p.out_of_bounds
    );
    assert!(!p.rows.is_empty(), "{args:?}: no rows\n{out}");
    for r in &p.rows {
        assert_eq!(r.oop.wrong, Some(0), "{args:?}: {r:?}");
        if coll.checks_in_place() {
            assert_eq!(r.ip.wrong, Some(0), "{args:?}: {r:?}");
        } else {
            assert_eq!(
                r.ip.wrong, None,
                "{args:?}: in-place {coll} is not checked, as in nccl-tests"
            );
        }
        assert!(r.oop.time_us.unwrap() >= 0.0);
        if !coll.is_reduction() {
            assert_eq!(r.redop, "none");
        }
        if !coll.is_rooted() {
            assert_eq!(r.root, -1);
        }
    }
    p
}

#[test]
fn all_reduce_np2_issue_example() {
    let p = run_ok(&["all_reduce", "-np", "2", "-b", "8", "-e", "1M", "-f", "4"]);
    assert_eq!(p.ranks, 2);
    let sizes: Vec<u64> = p.rows.iter().map(|r| r.size).collect();
    assert_eq!(
        sizes,
        vec![8, 32, 128, 512, 2048, 8192, 32768, 131072, 524288]
    );
    assert!(p
        .rows
        .iter()
        .all(|r| r.count == r.size / 4 && r.dtype == "float" && r.redop == "sum"));
    // busbw = algbw * 2(n-1)/n = algbw for 2 ranks.
    for r in &p.rows {
        let (a, b) = (r.oop.algbw.unwrap(), r.oop.busbw.unwrap());
        assert!((a - b).abs() <= 0.011, "{r:?}");
    }
    assert_eq!(p.library_version, 22800);
}

fn every_collective(launch: &[&str], nranks: usize) {
    for c in Coll::ALL {
        let mut args = vec![c.name()];
        args.extend_from_slice(launch);
        args.extend_from_slice(&["-b", "8", "-e", "256K", "-f", "8", "-n", "3", "-w", "1"]);
        if c.is_rooted() {
            args.extend_from_slice(&["-r", "-1"]);
        }
        let p = run_ok(&args);
        assert_eq!(p.ranks, nranks, "{c}");
        if c.is_rooted() {
            let roots: std::collections::BTreeSet<i64> = p.rows.iter().map(|r| r.root).collect();
            assert_eq!(roots.len(), nranks, "{c}: -r -1 runs every root");
        }
    }
}

#[test]
fn every_collective_np2() {
    every_collective(&["-np", "2"], 2);
}

#[test]
fn every_collective_np4() {
    every_collective(&["-np", "4"], 4);
}

/// The single-node direct paths across processes (board slots, then the
/// single-copy path from 32 KiB): with `ncclMemAlloc` buffers, which peers
/// map and access in place, and with plain host buffers, which they reach
/// through `process_vm_readv`/`writev`; 3 ranks give uneven shards.
#[test]
fn direct_paths_np3_mapped_and_cma_buffers() {
    for alloc in ["nccl", "host"] {
        for c in ["all_reduce", "reduce_scatter", "all_gather", "broadcast"] {
            run_ok(&[
                c, "-np", "3", "-b", "4", "-e", "4M", "-f", "16", "-n", "2", "-w", "1", "--alloc",
                alloc,
            ]);
        }
    }
}

/// Fewer single-copy workers than ranks (what 4 ranks on 2 CPUs get by
/// default): the other ranks wait, or help when the workers stall; results
/// stay exact, including PreMulSum with per-rank scalars.
#[test]
fn direct_paths_np3_with_fewer_workers() {
    for workers in ["1", "2"] {
        let env = [("HETCCL_COPY_WORKERS", workers)];
        for alloc in ["nccl", "host"] {
            for c in ["all_reduce", "reduce_scatter", "all_gather", "broadcast"] {
                run_ok_env(
                    &[
                        c, "-np", "3", "-b", "64K", "-e", "4M", "-f", "8", "-n", "2", "-w", "1",
                        "--alloc", alloc,
                    ],
                    &env,
                );
            }
        }
        run_ok_env(
            &[
                "all_reduce",
                "-np",
                "3",
                "-b",
                "1M",
                "-e",
                "1M",
                "-n",
                "2",
                "-w",
                "1",
                "-o",
                "mulsum",
                "-d",
                "float",
            ],
            &env,
        );
    }
}

#[test]
fn every_collective_threads() {
    every_collective(&["--threads", "3"], 3);
}

#[test]
fn every_type_and_op_threads() {
    for c in ["all_reduce", "reduce_scatter", "reduce"] {
        let p = run_ok(&[
            c,
            "--threads",
            "3",
            "-b",
            "64",
            "-e",
            "4K",
            "-f",
            "8",
            "-n",
            "1",
            "-d",
            "all",
            "-o",
            "all",
            "-r",
            "1",
        ]);
        let combos: std::collections::BTreeSet<(String, String)> = p
            .rows
            .iter()
            .map(|r| (r.dtype.clone(), r.redop.clone()))
            .collect();
        assert_eq!(combos.len(), 12 * 6, "{c}: every type x op");
    }
    let p = run_ok(&[
        "broadcast",
        "-np",
        "2",
        "-b",
        "64",
        "-e",
        "1K",
        "-f",
        "4",
        "-n",
        "1",
        "-d",
        "all",
    ]);
    assert_eq!(
        p.rows
            .iter()
            .map(|r| r.dtype.clone())
            .collect::<std::collections::BTreeSet<_>>()
            .len(),
        12
    );
}

#[test]
fn options_that_change_the_loop() {
    // Aggregated groups, blocking modes, several checks, averages, cycles,
    // unaligned buffers, host allocation, plain ncclCommInitRank.
    run_ok(&[
        "all_reduce",
        "-np",
        "2",
        "-b",
        "1K",
        "-e",
        "4K",
        "-i",
        "1K",
        "-m",
        "3",
        "-z",
        "1",
        "-c",
        "3",
        "-a",
        "3",
    ]);
    run_ok(&[
        "all_gather",
        "--threads",
        "2",
        "-b",
        "1K",
        "-e",
        "8K",
        "-f",
        "2",
        "-z",
        "3",
        "-a",
        "0",
        "-N",
        "2",
        "-u",
        "1",
    ]);
    run_ok(&[
        "reduce_scatter",
        "-np",
        "2",
        "-b",
        "1K",
        "-e",
        "8K",
        "-f",
        "2",
        "--alloc",
        "host",
        "--init",
        "rank",
        "-w",
        "0",
        "-c",
        "2",
    ]);
}

#[test]
fn check_zero_prints_na() {
    let o = run(&[
        "all_reduce",
        "--threads",
        "2",
        "-b",
        "1K",
        "-e",
        "1K",
        "-c",
        "0",
    ]);
    let (out, err) = text(&o);
    engine_gate(&err);
    assert!(o.status.success(), "{err}");
    let p = parse(&out).unwrap();
    assert!(
        p.rows
            .iter()
            .all(|r| r.oop.wrong.is_none() && r.ip.wrong.is_none()),
        "{out}"
    );
}

#[test]
fn wrong_results_are_counted_and_fail_the_run() {
    // The self-test hook damages one element of every check on rank 1.
    let o = Command::new(perf_bin())
        .args(["all_reduce", "-np", "2", "-b", "1K", "-e", "4K", "-f", "2"])
        .env("HETCCL_PERF_LIB", hetccl_so())
        .env("HETCCL_PERF_TEST_CORRUPT", "1")
        .output()
        .unwrap();
    let (out, err) = text(&o);
    engine_gate(&err);
    assert_eq!(o.status.code(), Some(1), "{out}\n{err}");
    let p = parse(&out).unwrap();
    assert_eq!(p.rows.len(), 3);
    assert!(
        p.rows
            .iter()
            .all(|r| r.oop.wrong == Some(1) && r.ip.wrong == Some(1)),
        "{out}"
    );
    assert_eq!((p.out_of_bounds, p.oob_ok), (6, false));
}

#[test]
fn argv0_alias_and_json() {
    let dir = std::env::temp_dir().join(format!("hetccl-perf-alias-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let link = dir.join("all_gather_perf");
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(perf_bin(), &link).unwrap();
    let json = dir.join("out.json");
    let _ = std::fs::remove_file(&json);
    let o = Command::new(&link)
        .args(["-np", "2", "-b", "1K", "-e", "16K", "-f", "4", "-J"])
        .arg(&json)
        .env("HETCCL_PERF_LIB", hetccl_so())
        .output()
        .unwrap();
    let (out, err) = text(&o);
    engine_gate(&err);
    assert!(o.status.success(), "{out}\n{err}");
    assert!(
        out.starts_with(&format!("# Writing JSON output to {}\n", json.display())),
        "{out}"
    );
    let p = parse(&out).unwrap();
    assert_eq!(p.program, "all_gather_perf");
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(doc["version"], 3);
    let results = doc["results"].as_array().unwrap();
    assert_eq!(results.len(), p.rows.len());
    assert_eq!(results[0]["size"], 1024);
    assert_eq!(
        results[0]["out_of_place"]["nwrong"],
        0.0_f64.max(0.0) as u64
    );
    assert_eq!(doc["out_of_bounds"]["count"], 0);
    let devices = doc["config"]["devices"].as_array().unwrap();
    assert_eq!(devices.len(), 2);
    assert_eq!(devices[1]["rank"], 1);
    assert!(devices[1]["pid"].as_u64().unwrap() > 0);
    assert_eq!(devices[0]["hostname"], hetccl_perf::bench::hostname());
    assert!(doc["average_bus_bandwidth"]["bandwidth"].is_number());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn mpirun_style_environment_with_id_file() {
    let dir = std::env::temp_dir().join(format!("hetccl-perf-idf-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let idf = dir.join("rendezvous");
    let spawn = |rank: usize| {
        Command::new(perf_bin())
            .args(["sendrecv", "-b", "1K", "-e", "4K", "-f", "2", "--id-file"])
            .arg(&idf)
            .env("HETCCL_PERF_LIB", hetccl_so())
            .env("OMPI_COMM_WORLD_RANK", rank.to_string())
            .env("OMPI_COMM_WORLD_SIZE", "2")
            .env_remove("HETCCL_PERF_RANK")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap()
    };
    // Rank 1 first: it must wait for rank 0's rendezvous file.
    let r1 = spawn(1);
    std::thread::sleep(std::time::Duration::from_millis(200));
    let r0 = spawn(0);
    let o0 = r0.wait_with_output().unwrap();
    let o1 = r1.wait_with_output().unwrap();
    let (out0, err0) = text(&o0);
    let (out1, err1) = text(&o1);
    engine_gate(&err0);
    assert!(
        o0.status.success() && o1.status.success(),
        "rank0: {out0}\n{err0}\nrank1: {out1}\n{err1}"
    );
    let p = parse(&out0).unwrap();
    assert_eq!((p.ranks, p.rows.len()), (2, 3));
    assert!(out1.is_empty(), "only rank 0 prints: {out1}");
    assert!(!idf.exists(), "rank 0 removes the rendezvous file");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn launcher_ranks_without_id_file_are_refused() {
    let o = Command::new(perf_bin())
        .args(["all_reduce", "-b", "8", "-e", "8"])
        .env("HETCCL_PERF_LIB", hetccl_so())
        .env("RANK", "1")
        .env("WORLD_SIZE", "2")
        .output()
        .unwrap();
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(64), "{err}");
    assert!(err.contains("--id-file"), "{err}");
}

#[test]
fn a_failing_rank_stops_the_others() {
    // A root outside the communicator fails on every rank; the supervisor
    // must return promptly with that failure.
    let t = std::time::Instant::now();
    let o = run(&["broadcast", "-np", "3", "-b", "8", "-e", "8", "-r", "5"]);
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("root 5"), "{err}");
    assert!(t.elapsed().as_secs() < 60);
    // A library that cannot be loaded.
    let o = Command::new(perf_bin())
        .args([
            "all_reduce",
            "--lib",
            "/nonexistent/libnccl.so",
            "-b",
            "8",
            "-e",
            "8",
        ])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("cannot load"));
}

#[test]
fn a_missing_rank_times_out_after_t_seconds() {
    // Rank 0 of 2 alone: its wait for rank 1 must end after -T seconds.
    let dir = std::env::temp_dir().join(format!("hetccl-perf-to-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let t = std::time::Instant::now();
    let o = Command::new(perf_bin())
        .args(["all_reduce", "-b", "8", "-e", "8", "-T", "2", "--id-file"])
        .arg(dir.join("id"))
        .env("HETCCL_PERF_LIB", hetccl_so())
        .env("PMI_RANK", "0")
        .env("PMI_SIZE", "2")
        .output()
        .unwrap();
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("timed out after 2 s"), "{err}");
    assert!(t.elapsed().as_secs() < 30, "took {:?}", t.elapsed());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn device_buffers_without_cuda_are_refused() {
    // This machine has no CUDA driver (tests/gpu_fake_driver.rs runs the
    // device mode on an emulated one): --alloc device must fail with the
    // reason, not crash or fall back silently.
    let o = run(&[
        "all_reduce",
        "-np",
        "2",
        "-b",
        "8",
        "-e",
        "8",
        "--alloc",
        "device",
    ]);
    let (_, err) = text(&o);
    assert!(!o.status.success(), "{err}");
    assert!(err.contains("need the CUDA driver"), "{err}");
}

/// Variables hetccl ignores are not silently dropped: each rank process
/// logs one WARN line per ignored variable the user set, and the run works.
#[test]
fn ignored_variables_warn_once_per_process() {
    let o = run_env(
        &[
            "all_reduce",
            "-np",
            "2",
            "-b",
            "8",
            "-e",
            "8",
            "-n",
            "2",
            "-w",
            "1",
        ],
        &[
            ("NCCL_DEBUG", "WARN"),
            ("NCCL_PROTO", "LL128"),
            ("NCCL_MAX_NCHANNELS", "4"),
        ],
    );
    let (out, err) = text(&o);
    assert!(o.status.success(), "{out}\n{err}");
    let all = format!("{out}\n{err}");
    for var in ["NCCL_PROTO=LL128", "NCCL_MAX_NCHANNELS=4"] {
        let lines: Vec<&str> = all
            .lines()
            .filter(|l| {
                l.contains("NCCL WARN") && l.contains(&format!("{var} is ignored by hetccl: "))
            })
            .collect();
        assert_eq!(
            lines.len(),
            2,
            "{var}: one line per rank process, got {lines:?}\n{all}"
        );
    }
}

/// The CPUs in a `/proc/PID/status` `Cpus_allowed_list` (`0-3,6`), of
/// `pid` or `self`; empty when it cannot be read.
fn allowed_cpus(pid: &str) -> Vec<usize> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let Some(list) = status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
    else {
        return Vec::new();
    };
    let mut cpus = Vec::new();
    for part in list.trim().split(',').filter(|p| !p.is_empty()) {
        let (lo, hi) = part.split_once('-').unwrap_or((part, part));
        cpus.extend(lo.parse::<usize>().unwrap()..=hi.parse::<usize>().unwrap());
    }
    cpus
}

#[test]
fn launcher_ranks_bind_to_their_local_cpu_only_with_bind_to_core() {
    use std::io::BufRead;
    let usable = allowed_cpus("self");
    assert!(!usable.is_empty());
    let local = usable.len() - 1;
    // The rank binds itself before it prints the table's header; the
    // loop keeps it running while the affinity is read.
    let affinity_while_running = |bind: bool| {
        let mut cmd = Command::new(perf_bin());
        cmd.args([
            "all_reduce",
            "-b",
            "8",
            "-e",
            "8",
            "-n",
            "5000000",
            "-c",
            "0",
        ])
        .env("HETCCL_PERF_LIB", hetccl_so())
        .env("RANK", "0")
        .env("WORLD_SIZE", "1")
        .env("LOCAL_RANK", local.to_string())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null());
        if bind {
            cmd.args(["--bind-to", "core"]);
        }
        let mut child = cmd.spawn().unwrap();
        let out = std::io::BufReader::new(child.stdout.take().unwrap());
        let mut header = false;
        for line in out.lines() {
            if line.unwrap().contains("out-of-place") {
                header = true;
                break;
            }
        }
        let seen = allowed_cpus(&child.id().to_string());
        let _ = child.kill();
        let _ = child.wait();
        assert!(header, "no table header");
        seen
    };
    assert_eq!(affinity_while_running(true), vec![usable[local]]);
    assert_eq!(affinity_while_running(false), usable);
}
