//! Tests of the table-driven parse and the display.

use super::*;

fn cfg(pairs: &[(&str, &str)]) -> (Config, Vec<String>) {
    Config::from_vars(pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())))
}

#[test]
fn defaults_when_nothing_is_set() {
    let (c, w) = cfg(&[("PATH", "/bin"), ("NCCL_SOMETHING_ELSE", "1")]);
    assert!(w.is_empty(), "{w:?}");
    assert_eq!(c, Config::default());
    assert_eq!(c.debug, DebugLevel::None);
    assert_eq!(c.debug_subsys, SubsysMask::DEFAULT);
    assert_eq!(c.socket_inline, 128);
    assert_eq!(c.socket_min_task_size, 65536);
    assert_eq!(c.socket_cc.as_deref(), Some("reno"));
    assert_eq!(c.timeout_s, 300.0);
    assert_eq!(c.hang_report_s, 60.0);
    assert_eq!(c.buffsize, 4 * 1024 * 1024);
    assert_eq!(c.spin_us, 50);
    assert!(!c.shm_disable && !c.p2p_disable && !c.ib_disable);
    assert!(c.socket_ifname.is_none() && c.nsocks_perthread.is_none());
}

#[test]
fn every_variable_parses() {
    let (c, w) = cfg(&[
        ("NCCL_DEBUG", "info"),
        ("NCCL_DEBUG_SUBSYS", "^NET"),
        ("NCCL_DEBUG_FILE", "/tmp/log.%h.%p"),
        ("NCCL_SOCKET_IFNAME", "=eth0"),
        ("NCCL_SOCKET_FAMILY", "AF_INET6"),
        ("NCCL_COMM_ID", "[::1]:5000"),
        ("NCCL_NSOCKS_PERTHREAD", "4"),
        ("NCCL_SOCKET_NTHREADS", "2"),
        ("NCCL_SOCKET_INLINE", "256"),
        ("NCCL_SOCKET_MIN_TASKSIZE", "128K"),
        ("HETCCL_SOCKET_CC", "system"),
        ("HETCCL_TIMEOUT_S", "2.5"),
        ("HETCCL_HANG_REPORT_S", "0"),
        ("NCCL_HOSTID", "nodeB"),
        ("HETCCL_HOST_ID", "nodeA"),
        ("NCCL_ALGO", "ring"),
        ("NCCL_PROTO", "^LL128"),
        ("NCCL_BUFFSIZE", "1048576"),
        ("NCCL_MIN_NCHANNELS", "2"),
        ("NCCL_MAX_NCHANNELS", "8"),
        ("HETCCL_TRACE_FILE", "/tmp/t.json"),
        ("HETCCL_TRACE_MAX_EVENTS", "1000"),
        ("HETCCL_METRICS_FILE", "/tmp/m.%r.prom"),
        ("HETCCL_STATUS", "1"),
        ("HETCCL_STATUS_PORT", "4242"),
        ("HETCCL_METRICS_INTERVAL_S", "0.5"),
        ("HETCCL_NCCL_FALLBACK", "/usr/lib/libnccl.so.2"),
        ("HETCCL_NVRTC_LIB", "/opt/nvrtc/libnvrtc.so.12"),
        ("HETCCL_IBVERBS_LIB", "/opt/rdma/libibverbs.so.1"),
        ("HETCCL_SYSFS_ROOT", "/tmp/fake-sys"),
        ("NCCL_SHM_DISABLE", "1"),
        ("NCCL_P2P_DISABLE", "true"),
        ("NCCL_NET", "Socket"),
        ("NCCL_IB_DISABLE", "1"),
        ("HETCCL_SPIN_US", "0"),
        ("HETCCL_COPY_MIN_BYTES", "1M"),
        ("HETCCL_COPY_WORKERS", "3"),
        ("NCCL_IB_HCA", "mlx5_0:1"),
        ("NCCL_NET_GDR_LEVEL", "PHB"),
        ("HETCCL_COMM_SECRET", "s3cret"),
        ("NCCL_IB_GID_INDEX", "3"),
        ("NCCL_IB_TC", "106"),
        ("NCCL_IB_SL", "1"),
        ("NCCL_IB_TIMEOUT", "22"),
        ("NCCL_IB_RETRY_CNT", "5"),
        ("NCCL_IB_QPS_PER_CONNECTION", "2"),
        ("NCCL_IB_SPLIT_DATA_ON_QPS", "1"),
        ("NCCL_IB_PCI_RELAXED_ORDERING", "0"),
        ("NCCL_DMABUF_ENABLE", "0"),
        ("HETCCL_NET", "IB"),
        ("HETCCL_CHECK", "1"),
        ("HETCCL_COALESCE_BYTES", "4K"),
        ("HETCCL_TUNING_FILE", "/tmp/tune.json"),
        ("HETCCL_TUNE", "online"),
        ("HETCCL_TUNE_BUDGET_MS", "120"),
        ("HETCCL_COMPRESS", "BF16"),
        ("HETCCL_TEST_DELAY_US", "Ring:2000"),
    ]);
    // Only the ignored variables warn, one line each.
    let ignored: Vec<&str> = vars::IGNORED.iter().map(|(n, _)| *n).collect();
    assert_eq!(w.len(), ignored.len(), "{w:?}");
    for (line, name) in w.iter().zip(&ignored) {
        assert!(line.starts_with(&format!("{name}=")), "{line}");
        assert!(line.contains(" is ignored by hetccl: "), "{line}");
    }
    assert_eq!(c.debug, DebugLevel::Info);
    assert!(!c.debug_subsys.contains("NET") && c.debug_subsys.contains("COLL"));
    assert_eq!(c.debug_file.as_deref(), Some("/tmp/log.%h.%p"));
    assert_eq!(c.socket_ifname.as_deref(), Some("=eth0"));
    let filter = c.socket_iface_filter().expect("filter");
    assert!(filter.matches("eth0") && !filter.matches("eth1"));
    assert_eq!(c.socket_family, Some(AddrFamily::Inet6));
    assert_eq!(c.comm_id.as_deref(), Some("[::1]:5000"));
    assert_eq!(c.nsocks_perthread, Some(4));
    assert_eq!(c.socket_nthreads, Some(2));
    assert_eq!(c.socket_inline, 256);
    assert_eq!(c.socket_min_task_size, 128 * 1024);
    assert_eq!(c.socket_cc, None, "system: the host's default");
    assert_eq!(c.timeout_s, 2.5);
    assert_eq!(c.hang_report_s, 0.0);
    assert_eq!(c.host_id.as_deref(), Some("nodeA"));
    assert_eq!(c.algo.as_deref(), Some("ring"));
    assert_eq!(c.proto.as_deref(), Some("^LL128"));
    assert_eq!(c.buffsize, 1 << 20);
    assert_eq!((c.min_nchannels, c.max_nchannels), (Some(2), Some(8)));
    assert_eq!(c.trace_file.as_deref(), Some("/tmp/t.json"));
    assert_eq!(c.trace_max_events, 1000);
    assert_eq!(c.metrics_file.as_deref(), Some("/tmp/m.%r.prom"));
    assert_eq!(c.metrics_interval_s, 0.5);
    assert!(c.status);
    assert_eq!(c.status_port, Some(4242));
    assert_eq!(c.nccl_fallback.as_deref(), Some("/usr/lib/libnccl.so.2"));
    assert_eq!(c.nvrtc_lib.as_deref(), Some("/opt/nvrtc/libnvrtc.so.12"));
    assert!(c.shm_disable && c.p2p_disable && c.ib_disable);
    assert_eq!(c.net.as_deref(), Some("Socket"));
    assert_eq!(c.spin_us, 0);
    assert_eq!(c.copy_min_bytes, 1 << 20);
    assert_eq!(c.copy_workers, 3);
    assert_eq!(c.ib_hca.as_deref(), Some("mlx5_0:1"));
    assert_eq!(c.net_gdr_level.as_deref(), Some("PHB"));
    assert_eq!(c.ib_gid_index, Some(3));
    assert_eq!(
        (c.ib_tc, c.ib_sl, c.ib_timeout, c.ib_retry_cnt),
        (106, 1, 22, 5)
    );
    assert_eq!(c.ib_qps_per_connection, 2);
    assert!(c.ib_split_data_on_qps && !c.dmabuf_enable);
    assert_eq!(c.ib_pci_relaxed_ordering, 0);
    assert_eq!(c.hetccl_net.as_deref(), Some("ib"));
    assert_eq!(c.comm_secret, Some(Secret("s3cret".into())));
    assert_eq!(c.ibverbs_lib.as_deref(), Some("/opt/rdma/libibverbs.so.1"));
    assert_eq!(c.sysfs_root.as_deref(), Some("/tmp/fake-sys"));
    assert!(c.check);
    assert_eq!(c.coalesce_bytes, 4096);
    assert_eq!(c.tuning_file.as_deref(), Some("/tmp/tune.json"));
    assert_eq!(c.tune, super::TuneMode::Online);
    assert_eq!(c.tune_budget_ms, 120);
    assert_eq!(c.compress, super::Compression::Bf16);
    assert_eq!(c.test_delay, Some(("Ring".to_string(), 2000)));
    assert!(
        !format!("{c:?}").contains("s3cret"),
        "Debug redacts the secret"
    );
    assert!(
        !c.to_string().contains("s3cret"),
        "the dump redacts the secret"
    );
    assert!(c.to_string().contains("HETCCL_COMM_SECRET=<redacted>\n"));
    for name in Config::known_names().filter(|n| *n != "HETCCL_SOCKET_IFNAME") {
        assert!(c.is_set(name), "{name}");
    }
    assert!(!c.is_set("HETCCL_SOCKET_IFNAME"));
    assert!(!c.is_set("NOT_A_VAR"));
}

#[test]
fn hetccl_ifname_beats_nccl_ifname_in_any_order() {
    for pairs in [
        [
            ("HETCCL_SOCKET_IFNAME", "ib"),
            ("NCCL_SOCKET_IFNAME", "eth"),
        ],
        [
            ("NCCL_SOCKET_IFNAME", "eth"),
            ("HETCCL_SOCKET_IFNAME", "ib"),
        ],
    ] {
        let (c, w) = cfg(&pairs);
        assert!(w.is_empty());
        assert_eq!(c.socket_ifname.as_deref(), Some("ib"));
        let shown = c.to_string();
        assert!(
            shown.contains("HETCCL_SOCKET_IFNAME=ib (overrides NCCL_SOCKET_IFNAME)\n"),
            "{shown}"
        );
        assert!(!shown.contains("NCCL_SOCKET_IFNAME=eth"), "{shown}");
    }
    let (c, _) = cfg(&[("NCCL_SOCKET_IFNAME", "^docker")]);
    assert_eq!(c.socket_ifname.as_deref(), Some("^docker"));
    assert!(c.to_string().contains("\nNCCL_SOCKET_IFNAME=^docker\n"));
}

#[test]
fn garbage_values_keep_defaults_and_warn() {
    let (c, w) = cfg(&[
        ("NCCL_DEBUG", "loud"),
        ("NCCL_BUFFSIZE", "lots"),
        ("HETCCL_TIMEOUT_S", "-5"),
        ("HETCCL_SPIN_US", "1e3"),
        ("NCCL_SOCKET_FAMILY", "ipx"),
        ("NCCL_COMM_ID", "nohost"),
        ("NCCL_SHM_DISABLE", "perhaps"),
        ("NCCL_NSOCKS_PERTHREAD", "-7"),
        ("NCCL_MAX_NCHANNELS", "0"),
        ("NCCL_SOCKET_MIN_TASKSIZE", "0"),
        ("HETCCL_SOCKET_CC", "Reno; rm"),
    ]);
    assert_eq!(c, Config::default());
    assert_eq!(w.len(), 11, "{w:#?}");
    assert!(w
        .iter()
        .any(|m| m.contains("HETCCL_SOCKET_CC") && m.contains("using default (reno)")));
    assert!(w.iter().any(|m| m.contains("NCCL_DEBUG")
        && m.contains("\"loud\"")
        && m.contains("using default (NONE)")));
    assert!(w
        .iter()
        .any(|m| m.contains("NCCL_BUFFSIZE") && m.contains("using default (4194304)")));
    assert!(w
        .iter()
        .any(|m| m.contains("HETCCL_TIMEOUT_S") && m.contains("using default (300)")));
    assert!(w
        .iter()
        .any(|m| m.contains("NCCL_COMM_ID") && m.contains("using default (unset)")));
    assert!(w
        .iter()
        .any(|m| m.contains("NCCL_NSOCKS_PERTHREAD") && m.contains("auto")));
    // An invalid value does not count as set.
    assert!(!c.is_set("NCCL_BUFFSIZE"));
}

#[test]
fn unknown_subsystem_names_warn_but_the_rest_applies() {
    let (c, w) = cfg(&[("NCCL_DEBUG_SUBSYS", "INIT,NETT")]);
    assert_eq!(c.debug_subsys, SubsysMask::INIT);
    assert_eq!(
        w,
        vec!["NCCL_DEBUG_SUBSYS=INIT,NETT: unknown subsystem(s) NETT ignored".to_string()]
    );
}

#[test]
fn unknown_hetccl_names_warn_with_a_suggestion() {
    let (c, w) = cfg(&[
        ("HETCCL_TIMEOUT", "5"),
        ("HETCCL_COMPLETELY_DIFFERENT_THING", "1"),
        ("HETCCL_TIMEOUT", "6"),
        ("NCCL_UNKNOWN_TO_US", "1"),
    ]);
    assert_eq!(c, Config::default());
    assert_eq!(
        w,
        vec![
            "unknown variable HETCCL_COMPLETELY_DIFFERENT_THING".to_string(),
            "unknown variable HETCCL_TIMEOUT; did you mean HETCCL_TIMEOUT_S?".to_string(),
        ]
    );
}

#[test]
fn hetccl_perf_variables_are_not_unknown() {
    let (_, w) = cfg(&[("HETCCL_PERF_RANK", "1"), ("HETCCL_PERF_STORE", "/tmp/x")]);
    assert!(w.is_empty(), "{w:?}");
}

#[test]
fn empty_values_are_unset_without_warning() {
    let (c, w) = cfg(&[
        ("NCCL_DEBUG", ""),
        ("NCCL_SOCKET_IFNAME", ""),
        ("HETCCL_TIMEOUT_S", ""),
    ]);
    assert!(w.is_empty());
    assert_eq!(c, Config::default());
}

#[test]
fn blank_text_values_warn() {
    let (c, w) = cfg(&[("NCCL_SOCKET_IFNAME", "   ")]);
    assert!(c.socket_ifname.is_none());
    assert_eq!(w.len(), 1);
}

#[test]
fn minus_two_means_auto() {
    let (c, w) = cfg(&[
        ("NCCL_NSOCKS_PERTHREAD", "-2"),
        ("NCCL_SOCKET_NTHREADS", "-2"),
    ]);
    assert!(w.is_empty());
    assert_eq!((c.nsocks_perthread, c.socket_nthreads), (None, None));
    assert!(c.is_set("NCCL_SOCKET_NTHREADS"));
    assert!(c.to_string().contains("NCCL_SOCKET_NTHREADS=auto\n"));
}

#[test]
fn last_duplicate_wins() {
    let (c, _) = cfg(&[("NCCL_BUFFSIZE", "1024"), ("NCCL_BUFFSIZE", "2048")]);
    assert_eq!(c.buffsize, 2048);
}

#[test]
fn min_above_max_channels_warns() {
    let (c, w) = cfg(&[("NCCL_MIN_NCHANNELS", "16"), ("NCCL_MAX_NCHANNELS", "4")]);
    assert_eq!((c.min_nchannels, c.max_nchannels), (Some(16), Some(4)));
    assert_eq!(w.len(), 3, "{w:?}");
    assert!(w[0].contains("NCCL_MIN_NCHANNELS=16 is ignored by hetccl"));
    assert!(w[1].contains("NCCL_MAX_NCHANNELS=4 is ignored by hetccl"));
    assert!(w[2].contains("above"));
}

#[test]
fn display_marks_defaults_and_omits_unset_options() {
    let (c, _) = cfg(&[("NCCL_DEBUG", "WARN"), ("NCCL_ALGO", "tree")]);
    let shown = c.to_string();
    let lines: Vec<&str> = shown.lines().collect();
    assert_eq!(lines[0], "NCCL_DEBUG=WARN");
    assert_eq!(lines[1], "NCCL_DEBUG_SUBSYS=INIT,ENV,BOOTSTRAP (default)");
    assert!(lines.contains(&"NCCL_ALGO=tree"));
    assert!(lines.contains(&"NCCL_BUFFSIZE=4194304 (default)"));
    assert!(lines.contains(&"HETCCL_TIMEOUT_S=300 (default)"));
    assert!(lines.contains(&"NCCL_SHM_DISABLE=0 (default)"));
    assert!(lines.contains(&"NCCL_NSOCKS_PERTHREAD=auto (default)"));
    assert!(!shown.contains("NCCL_PROTO"));
    assert!(!shown.contains("NCCL_COMM_ID"));
    assert!(lines.iter().all(|l| l.contains('=')));
}

#[test]
fn each_ignored_variable_warns_once_and_is_marked_in_the_dump() {
    for (name, why) in vars::IGNORED {
        let (c, w) = cfg(&[(name, "1")]);
        assert_eq!(w, vec![format!("{name}=1 is ignored by hetccl: {why}")]);
        assert_eq!(Config::ignored_reason(name), Some(*why));
        assert_eq!(c.ignored_settings(), vec![(*name, *why)]);
        let dump = c.to_string();
        assert!(
            dump.contains(&format!("{name}=1 (ignored: {why})\n")),
            "{dump}"
        );
    }
    assert_eq!(Config::ignored_reason("NCCL_ALGO"), None);
    let (c, w) = cfg(&[("NCCL_ALGO", "ring")]);
    assert!(w.is_empty() && c.ignored_settings().is_empty());
}

#[test]
fn display_shows_values_set_in_code() {
    let c = Config {
        timeout_s: 1.5,
        host_id: Some("h".into()),
        ..Config::default()
    };
    let shown = c.to_string();
    assert!(shown.contains("HETCCL_TIMEOUT_S=1.5\n"), "{shown}");
    // NCCL_HOSTID and HETCCL_HOST_ID share the field; unset, the first name shows it.
    assert!(shown.contains("NCCL_HOSTID=h\n"), "{shown}");
}

#[test]
fn coalesce_bytes_is_off_or_within_bounds() {
    let get = |v: &str| {
        let (c, w) = Config::from_vars([("HETCCL_COALESCE_BYTES".to_string(), v.to_string())]);
        (c.coalesce_bytes, w.len())
    };
    assert_eq!(Config::default().coalesce_bytes, 65536);
    assert_eq!(get("0"), (0, 0));
    assert_eq!(get("1K"), (1024, 0));
    assert_eq!(get("16M"), (16 << 20, 0));
    // Out of bounds or not a size: the default stays, with a warning.
    for bad in ["100", "17M", "lots"] {
        assert_eq!(get(bad), (65536, 1), "{bad}");
    }
}

#[test]
fn docs_describe_every_variable() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/configuration.md");
    let doc = std::fs::read_to_string(path).expect("docs/configuration.md exists");
    for name in Config::known_names() {
        assert!(
            doc.contains(&format!("`{name}`")),
            "docs/configuration.md lacks {name}"
        );
        let row = doc
            .lines()
            .find(|l| l.starts_with(&format!("| `{name}` |")))
            .unwrap_or_else(|| panic!("docs/configuration.md has no row for {name}"));
        assert_eq!(
            row.contains("**Ignored**"),
            vars::ignored(name).is_some(),
            "docs/configuration.md: {name} must be marked **Ignored** exactly when it is"
        );
    }
}
