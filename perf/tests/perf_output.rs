//! The report functions produce nccl-tests' exact lines, and a whole report
//! assembled from them parses as nccl-tests output.

use hetccl_perf::cli::parse as parse_flags;
use hetccl_perf::coll::Coll;
use hetccl_perf::report;
use hetccl_testkit::perf;

#[test]
fn lines_match_nccl_tests_printf_formats() {
    assert_eq!(
        report::row_preamble(8, 2, "float", "sum", -1),
        "           8             2     float     sum      -1"
    );
    assert_eq!(
        report::row_preamble(1048576, 262144, "bfloat16", "none", 3),
        "     1048576        262144  bfloat16    none       3"
    );
    assert_eq!(
        report::row_body(7.96, 0.001, 0.0, Some(0)),
        "     7.96    0.00    0.00       0"
    );
    assert_eq!(
        report::row_body(216.54, 12.3456, 1234.5, Some(12)),
        "   216.54   12.35  1234.5      12"
    );
    assert_eq!(
        report::row_body(1.0, 1.0, 1.0, None),
        "     1.00    1.00    1.00    N/A"
    );
    assert_eq!(
        report::rank_line(0, 23052, "vm", None),
        "#  Rank  0 Group  0 Pid  23052 on         vm device -1 [cpu] host"
    );
    let h = report::table_header(false);
    assert_eq!(h[0], "#");
    assert_eq!(h[1], "#                                                              out-of-place                       in-place          ");
    assert_eq!(h[2], "#       size         count      type   redop    root     time   algbw   busbw  #wrong     time   algbw   busbw  #wrong ");
    assert_eq!(h[3], "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)             (us)  (GB/s)  (GB/s)         ");
    let f = report::footer(0, 0.04796, None, "all_reduce_perf", "");
    assert_eq!(
        f,
        vec![
            "# Out of bounds values : 0 OK",
            "# Avg bus bandwidth    : 0.04796 ",
            "#",
            "# Collective test concluded: all_reduce_perf",
            "#",
            ""
        ]
    );
    let f = report::footer(3, 1.5, Some(10.0), "reduce_perf", "boom");
    assert_eq!(f[0], "# Out of bounds values : 3 FAILED");
    assert_eq!(f[1], "# Avg bus bandwidth    : 1.5 FAILED");
    assert_eq!(f[5], "# error: boom");
}

#[test]
fn header_parameter_line() {
    let o = parse_flags(
        Coll::AllReduce,
        &"-b 8 -e 1M -f 4 -z 1"
            .split(' ')
            .map(String::from)
            .collect::<Vec<_>>(),
    )
    .unwrap();
    let h = report::header(&o, "all_reduce_perf", 22800, "/x/libhetccl.so", 1);
    assert!(h[0].starts_with(
        "# nccl-tests version 2.19.6 nccl-headers=22800 nccl-library=22800 hetccl-perf "
    ));
    assert_eq!(h[1], "# Collective test starting: all_reduce_perf");
    assert_eq!(
        h[2],
        "# nThread 1 nGpus 1 minBytes 8 maxBytes 1048576 step: 4(factor) warmup iters: 1 iters: 20 agg iters: 1 validation: 1 graph: 0 unalign: 0"
    );
    assert_eq!(
        h[3],
        "# Blocking Enabled: wait and barrier after each inner iteration (-m) "
    );
    assert_eq!(&h[4..], ["#", "# Using devices"]);
}

#[test]
fn assembled_report_parses() {
    let o = parse_flags(Coll::AllGather, &[]).unwrap();
    let mut out = report::header(&o, "all_gather_perf", 22800, "/x/lib.so", 1);
    out.push(report::rank_line(0, 1, "host-a", None));
    out.push(report::rank_line(1, 2, "host-b", None));
    out.extend(report::table_header(false));
    out.push(
        report::row_preamble(1024, 128, "float", "none", -1)
            + &report::row_body(10.0, 0.1, 0.05, Some(0))
            + &report::row_body(9.0, 0.11, 0.055, Some(0)),
    );
    out.push(
        report::row_preamble(2048, 256, "float", "none", -1)
            + &report::row_body(10.0, 0.2, 0.1, Some(0))
            + &report::row_unsupported(),
    );
    out.push(
        report::row_preamble(4096, 512, "float", "none", -1)
            + &report::row_body(10.0, 0.2, 0.1, Some(0))
            + &report::row_body(1.0, 2.0, 3.0, None),
    );
    out.extend(report::footer(0, 0.07, None, "all_gather_perf", ""));
    let p = perf::parse(&out.join("\n")).unwrap();
    assert_eq!(
        (p.ranks, p.rows.len(), p.out_of_bounds, p.oob_ok),
        (2, 3, 0, true)
    );
    assert_eq!(
        (p.program.as_str(), p.concluded.as_str(), p.library_version),
        ("all_gather_perf", "all_gather_perf", 22800)
    );
    assert_eq!(p.rows[0].size, 1024);
    assert_eq!(p.rows[0].ip.wrong, Some(0));
    assert_eq!(p.rows[1].ip.time_us, None);
    assert_eq!(p.rows[2].ip.wrong, None);
    assert_eq!(p.avg_busbw, 0.07);
}

#[test]
fn parser_rejects_malformed_output() {
    let o = parse_flags(Coll::AllReduce, &[]).unwrap();
    let mut base = report::header(&o, "all_reduce_perf", 22800, "/x", 1);
    base.push(report::rank_line(0, 1, "h", None));
    base.extend(report::table_header(false));
    let good_row = report::row_preamble(8, 2, "float", "sum", -1)
        + &report::row_body(1.0, 1.0, 1.0, Some(0))
        + &report::row_body(1.0, 1.0, 1.0, Some(0));
    let footer = report::footer(0, 1.0, None, "all_reduce_perf", "");
    let assemble = |row: &str| {
        let mut v = base.clone();
        v.push(row.to_string());
        v.extend(footer.clone());
        v.join("\n")
    };
    assert!(perf::parse(&assemble(&good_row)).is_ok());
    assert!(
        perf::parse(&assemble(&good_row.replacen("  ", " ", 1))).is_err(),
        "misaligned"
    );
    assert!(
        perf::parse(&assemble(&good_row[..good_row.len() - 8])).is_err(),
        "missing column"
    );
    assert!(
        perf::parse(&assemble(&good_row.replace("   0", "   x"))).is_err(),
        "bad #wrong"
    );
    let no_footer = {
        let mut v = base.clone();
        v.push(good_row.clone());
        v.join("\n")
    };
    assert!(perf::parse(&no_footer).is_err());
}
