//! `bench-scripts/compare` parses hetccl-perf's and its OpenMPI program's
//! (`bench-scripts/compare.d/mpi_coll.c`) tables with one parser
//! (`compare.d/compare.py`). This runs that parser's self-test on the
//! captured samples in `compare.d/samples/` (one of each program), so a
//! change to either format that the script would misread fails here.
//! Skipped when `python3` is missing.

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
}
