//! `bench-scripts/compare` parses hetccl-perf's and its OpenMPI program's
//! (`bench-scripts/compare.d/mpi_coll.c`) tables with one parser
//! (`compare.d/compare.py`), and the memory-limit program's
//! (`compare.d/mem_limit.c`) lines with another. This runs the script's
//! self-test on the captured samples in `compare.d/samples/` (one table of
//! each program, one mem_limit output, one coalescing sendrecv table), which
//! also checks the memory-limit fractions and the coalescing ratio that the
//! report derives from them, so a change to any format that the script would
//! misread, or to those formulas, fails here. Skipped when `python3` is
//! missing.

use std::path::Path;
use std::process::Command;

#[test]
fn compare_parser_reads_both_programs_tables() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let script = root.join("bench-scripts/compare.d/compare.py");
    let out = match Command::new("python3")
        .arg(&script)
        .arg("selftest")
        .output()
    {
        Ok(o) => o,
        Err(e) => {
            eprintln!("skipped: cannot run python3: {e}");
            return;
        }
    };
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "compare.py selftest failed:\n{text}");
    assert!(
        text.contains("hetccl-") && text.contains("openmpi-"),
        "{text}"
    );
    for line in [
        "mem_limit add: ",
        "coalesce-sendrecv.txt µs per group: ",
        "allreduce fraction: ",
        "allgather fraction: ",
        "coalescing ratio: ",
    ] {
        assert!(
            text.lines()
                .any(|l| l.starts_with(line) && l.ends_with(": ok")),
            "missing or failed: {line}\n{text}"
        );
    }
    assert!(!text.contains("FAILED"), "{text}");
}
