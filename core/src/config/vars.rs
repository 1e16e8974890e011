//! The one table of variables hetccl reads, and the parse driver over it.
//!
//! Order matters: entries are applied in table order, so when two names set
//! the same field (`NCCL_SOCKET_IFNAME`, then `HETCCL_SOCKET_IFNAME`) the later
//! one wins. Display also follows this order.

use super::debug::{DebugLevel, SubsysMask};
use super::net::{split_host_port, AddrFamily};
use super::{parse, suggest, Config};

/// What applying a value produced: `Ok(None)` applied cleanly, `Ok(Some(w))`
/// applied with a warning, `Err(expected)` rejected (the default stays).
pub(crate) type Applied = Result<Option<String>, String>;

/// One environment variable.
pub(crate) struct Var {
    /// The variable name.
    pub name: &'static str,
    /// The `Config` field it sets; names that share a field are aliases.
    pub field: &'static str,
    /// Parses a non-empty value into the config.
    pub apply: fn(&mut Config, &str) -> Applied,
    /// Renders the field's current value; `None` when unset.
    pub show: fn(&Config) -> Option<String>,
}

fn ok<T>(r: Result<T, String>, set: impl FnOnce(T)) -> Applied {
    r.map(|v| {
        set(v);
        None
    })
}

/// `-2` or unset means auto; otherwise at least 1.
fn auto_count(s: &str) -> Result<Option<i32>, String> {
    match parse::int(s) {
        Ok(-2) => Ok(None),
        Ok(v) if v >= 0 && v <= i64::from(i32::MAX) => Ok(Some(v as i32)),
        _ => Err("an integer >= 0, or -2 for auto".to_string()),
    }
}

fn show_auto(v: Option<i32>) -> Option<String> {
    Some(v.map_or_else(|| "auto".to_string(), |n| n.to_string()))
}

fn channels(s: &str) -> Result<u32, String> {
    parse::int_in(s, 1, i64::from(u32::MAX)).map(|v| v as u32)
}

/// Variables hetccl reads only to say that it ignores them, with why. A
/// user who sets one gets one WARN line, and the INFO dump marks it.
pub(crate) const IGNORED: &[(&str, &str)] = &[
    (
        "NCCL_PROTO",
        "NCCL's LL, LL128 and Simple are GPU-kernel protocols; hetccl's transports each have one protocol of their own",
    ),
    (
        "NCCL_MIN_NCHANNELS",
        "hetccl's plans use a fixed two channels per link for collectives and one for point-to-point",
    ),
    (
        "NCCL_MAX_NCHANNELS",
        "hetccl's plans use a fixed two channels per link for collectives and one for point-to-point",
    ),
];

/// Why `name` is ignored, if it is.
pub(crate) fn ignored(name: &str) -> Option<&'static str> {
    IGNORED
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, why)| *why)
}

/// The bounds of a non-zero `HETCCL_COALESCE_BYTES`.
const MIN_COALESCE: usize = 1 << 10;
const MAX_COALESCE: usize = 16 << 20;

/// The table. At most 64 entries (`Config::from_env` is a bitmask).
pub(crate) const VARS: &[Var] = &[
    Var {
        name: "NCCL_DEBUG",
        field: "debug",
        apply: |c, v| {
            let level =
                DebugLevel::parse(v).ok_or("one of NONE, VERSION, WARN, INFO, ABORT, TRACE")?;
            c.debug = level;
            Ok(None)
        },
        show: |c| Some(c.debug.to_string()),
    },
    Var {
        name: "NCCL_DEBUG_SUBSYS",
        field: "debug_subsys",
        apply: |c, v| {
            let (mask, unknown) = SubsysMask::parse(v);
            c.debug_subsys = mask;
            Ok((!unknown.is_empty())
                .then(|| format!("unknown subsystem(s) {} ignored", unknown.join(","))))
        },
        show: |c| Some(c.debug_subsys.to_string()),
    },
    Var {
        name: "NCCL_DEBUG_FILE",
        field: "debug_file",
        apply: |c, v| ok(parse::text(v), |t| c.debug_file = Some(t)),
        show: |c| c.debug_file.clone(),
    },
    Var {
        name: "NCCL_SOCKET_IFNAME",
        field: "socket_ifname",
        apply: |c, v| ok(parse::text(v), |t| c.socket_ifname = Some(t)),
        show: |c| c.socket_ifname.clone(),
    },
    Var {
        name: "HETCCL_SOCKET_IFNAME",
        field: "socket_ifname",
        apply: |c, v| ok(parse::text(v), |t| c.socket_ifname = Some(t)),
        show: |c| c.socket_ifname.clone(),
    },
    Var {
        name: "NCCL_SOCKET_FAMILY",
        field: "socket_family",
        apply: |c, v| {
            c.socket_family = Some(AddrFamily::parse(v).ok_or("AF_INET or AF_INET6")?);
            Ok(None)
        },
        show: |c| c.socket_family.map(|f| f.to_string()),
    },
    Var {
        name: "NCCL_COMM_ID",
        field: "comm_id",
        apply: |c, v| {
            split_host_port(v).ok_or("host:port or [ipv6]:port")?;
            c.comm_id = Some(v.trim().to_string());
            Ok(None)
        },
        show: |c| c.comm_id.clone(),
    },
    Var {
        name: "NCCL_NSOCKS_PERTHREAD",
        field: "nsocks_perthread",
        apply: |c, v| ok(auto_count(v), |n| c.nsocks_perthread = n),
        show: |c| show_auto(c.nsocks_perthread),
    },
    Var {
        name: "NCCL_SOCKET_NTHREADS",
        field: "socket_nthreads",
        apply: |c, v| ok(auto_count(v), |n| c.socket_nthreads = n),
        show: |c| show_auto(c.socket_nthreads),
    },
    Var {
        name: "NCCL_SOCKET_INLINE",
        field: "socket_inline",
        apply: |c, v| ok(parse::size(v), |n| c.socket_inline = n),
        show: |c| Some(c.socket_inline.to_string()),
    },
    Var {
        name: "NCCL_SOCKET_MIN_TASKSIZE",
        field: "socket_min_task_size",
        apply: |c, v| ok(parse::size_nonzero(v), |n| c.socket_min_task_size = n),
        show: |c| Some(c.socket_min_task_size.to_string()),
    },
    Var {
        name: "HETCCL_SOCKET_CC",
        field: "socket_cc",
        apply: |c, v| ok(parse::congestion(v), |cc| c.socket_cc = cc),
        show: |c| Some(c.socket_cc.clone().unwrap_or_else(|| "system".into())),
    },
    Var {
        name: "HETCCL_TIMEOUT_S",
        field: "timeout_s",
        apply: |c, v| ok(parse::seconds(v, 0.001), |s| c.timeout_s = s),
        show: |c| Some(c.timeout_s.to_string()),
    },
    Var {
        name: "HETCCL_HANG_REPORT_S",
        field: "hang_report_s",
        apply: |c, v| ok(parse::seconds(v, 0.0), |s| c.hang_report_s = s),
        show: |c| Some(c.hang_report_s.to_string()),
    },
    Var {
        name: "NCCL_HOSTID",
        field: "host_id",
        apply: |c, v| ok(parse::text(v), |t| c.host_id = Some(t)),
        show: |c| c.host_id.clone(),
    },
    Var {
        name: "HETCCL_HOST_ID",
        field: "host_id",
        apply: |c, v| ok(parse::text(v), |t| c.host_id = Some(t)),
        show: |c| c.host_id.clone(),
    },
    Var {
        name: "NCCL_ALGO",
        field: "algo",
        apply: |c, v| ok(parse::text(v), |t| c.algo = Some(t)),
        show: |c| c.algo.clone(),
    },
    Var {
        name: "NCCL_PROTO",
        field: "proto",
        apply: |c, v| ok(parse::text(v), |t| c.proto = Some(t)),
        show: |c| c.proto.clone(),
    },
    Var {
        name: "NCCL_BUFFSIZE",
        field: "buffsize",
        apply: |c, v| ok(parse::size_nonzero(v), |n| c.buffsize = n),
        show: |c| Some(c.buffsize.to_string()),
    },
    Var {
        name: "NCCL_MIN_NCHANNELS",
        field: "min_nchannels",
        apply: |c, v| ok(channels(v), |n| c.min_nchannels = Some(n)),
        show: |c| c.min_nchannels.map(|n| n.to_string()),
    },
    Var {
        name: "NCCL_MAX_NCHANNELS",
        field: "max_nchannels",
        apply: |c, v| ok(channels(v), |n| c.max_nchannels = Some(n)),
        show: |c| c.max_nchannels.map(|n| n.to_string()),
    },
    Var {
        name: "HETCCL_TRACE_FILE",
        field: "trace_file",
        apply: |c, v| ok(parse::text(v), |t| c.trace_file = Some(t)),
        show: |c| c.trace_file.clone(),
    },
    Var {
        name: "HETCCL_TRACE_MAX_EVENTS",
        field: "trace_max_events",
        apply: |c, v| {
            c.trace_max_events = parse::int_in(v, 1, 1 << 26)? as usize;
            Ok(None)
        },
        show: |c| Some(c.trace_max_events.to_string()),
    },
    Var {
        name: "HETCCL_STATUS",
        field: "status",
        apply: |c, v| ok(parse::boolean(v), |b| c.status = b),
        show: |c| Some(u8::from(c.status).to_string()),
    },
    Var {
        name: "HETCCL_STATUS_PORT",
        field: "status_port",
        apply: |c, v| {
            c.status_port = Some(parse::int_in(v, 0, 65535)? as u16);
            Ok(None)
        },
        show: |c| c.status_port.map(|p| p.to_string()),
    },
    Var {
        name: "HETCCL_METRICS_FILE",
        field: "metrics_file",
        apply: |c, v| ok(parse::text(v), |t| c.metrics_file = Some(t)),
        show: |c| c.metrics_file.clone(),
    },
    Var {
        name: "HETCCL_METRICS_INTERVAL_S",
        field: "metrics_interval_s",
        apply: |c, v| {
            c.metrics_interval_s = parse::seconds(v, 0.001)?;
            Ok(None)
        },
        show: |c| Some(c.metrics_interval_s.to_string()),
    },
    Var {
        name: "HETCCL_NCCL_FALLBACK",
        field: "nccl_fallback",
        apply: |c, v| ok(parse::text(v), |t| c.nccl_fallback = Some(t)),
        show: |c| c.nccl_fallback.clone(),
    },
    Var {
        name: "HETCCL_NVRTC_LIB",
        field: "nvrtc_lib",
        apply: |c, v| ok(parse::text(v), |t| c.nvrtc_lib = Some(t)),
        show: |c| c.nvrtc_lib.clone(),
    },
    Var {
        name: "HETCCL_IBVERBS_LIB",
        field: "ibverbs_lib",
        apply: |c, v| ok(parse::text(v), |t| c.ibverbs_lib = Some(t)),
        show: |c| c.ibverbs_lib.clone(),
    },
    Var {
        name: "HETCCL_SYSFS_ROOT",
        field: "sysfs_root",
        apply: |c, v| ok(parse::text(v), |t| c.sysfs_root = Some(t)),
        show: |c| c.sysfs_root.clone(),
    },
    Var {
        name: "NCCL_SHM_DISABLE",
        field: "shm_disable",
        apply: |c, v| ok(parse::boolean(v), |b| c.shm_disable = b),
        show: |c| Some(u8::from(c.shm_disable).to_string()),
    },
    Var {
        name: "NCCL_P2P_DISABLE",
        field: "p2p_disable",
        apply: |c, v| ok(parse::boolean(v), |b| c.p2p_disable = b),
        show: |c| Some(u8::from(c.p2p_disable).to_string()),
    },
    Var {
        name: "NCCL_NET",
        field: "net",
        apply: |c, v| ok(parse::text(v), |t| c.net = Some(t)),
        show: |c| c.net.clone(),
    },
    Var {
        name: "NCCL_IB_DISABLE",
        field: "ib_disable",
        apply: |c, v| ok(parse::boolean(v), |b| c.ib_disable = b),
        show: |c| Some(u8::from(c.ib_disable).to_string()),
    },
    Var {
        name: "NCCL_IB_HCA",
        field: "ib_hca",
        apply: |c, v| ok(parse::text(v), |t| c.ib_hca = Some(t)),
        show: |c| c.ib_hca.clone(),
    },
    Var {
        name: "NCCL_NET_GDR_LEVEL",
        field: "net_gdr_level",
        apply: |c, v| ok(parse::text(v), |t| c.net_gdr_level = Some(t)),
        show: |c| c.net_gdr_level.clone(),
    },
    Var {
        name: "NCCL_IB_GID_INDEX",
        field: "ib_gid_index",
        apply: |c, v| {
            ok(parse::int_in(v, -1, 255), |i| {
                c.ib_gid_index = (i >= 0).then_some(i as i32)
            })
        },
        show: |c| {
            Some(
                c.ib_gid_index
                    .map_or_else(|| "auto".to_string(), |i| i.to_string()),
            )
        },
    },
    Var {
        name: "NCCL_IB_TC",
        field: "ib_tc",
        apply: |c, v| ok(parse::int_in(v, 0, 255), |i| c.ib_tc = i as u32),
        show: |c| Some(c.ib_tc.to_string()),
    },
    Var {
        name: "NCCL_IB_SL",
        field: "ib_sl",
        apply: |c, v| ok(parse::int_in(v, 0, 15), |i| c.ib_sl = i as u32),
        show: |c| Some(c.ib_sl.to_string()),
    },
    Var {
        name: "NCCL_IB_TIMEOUT",
        field: "ib_timeout",
        apply: |c, v| ok(parse::int_in(v, 1, 31), |i| c.ib_timeout = i as u32),
        show: |c| Some(c.ib_timeout.to_string()),
    },
    Var {
        name: "NCCL_IB_RETRY_CNT",
        field: "ib_retry_cnt",
        apply: |c, v| ok(parse::int_in(v, 0, 7), |i| c.ib_retry_cnt = i as u32),
        show: |c| Some(c.ib_retry_cnt.to_string()),
    },
    Var {
        name: "NCCL_IB_QPS_PER_CONNECTION",
        field: "ib_qps_per_connection",
        apply: |c, v| {
            ok(parse::int_in(v, 1, 8), |i| {
                c.ib_qps_per_connection = i as u32
            })
        },
        show: |c| Some(c.ib_qps_per_connection.to_string()),
    },
    Var {
        name: "NCCL_IB_SPLIT_DATA_ON_QPS",
        field: "ib_split_data_on_qps",
        apply: |c, v| ok(parse::boolean(v), |b| c.ib_split_data_on_qps = b),
        show: |c| Some(u8::from(c.ib_split_data_on_qps).to_string()),
    },
    Var {
        name: "NCCL_IB_PCI_RELAXED_ORDERING",
        field: "ib_pci_relaxed_ordering",
        apply: |c, v| {
            ok(parse::int_in(v, 0, 2), |i| {
                c.ib_pci_relaxed_ordering = i as u32
            })
        },
        show: |c| Some(c.ib_pci_relaxed_ordering.to_string()),
    },
    Var {
        name: "NCCL_DMABUF_ENABLE",
        field: "dmabuf_enable",
        apply: |c, v| ok(parse::boolean(v), |b| c.dmabuf_enable = b),
        show: |c| Some(u8::from(c.dmabuf_enable).to_string()),
    },
    Var {
        name: "HETCCL_NET",
        field: "hetccl_net",
        apply: |c, v| {
            let t = v.trim().to_ascii_lowercase();
            if t == "ib" || t == "socket" {
                c.hetccl_net = Some(t);
                Ok(None)
            } else {
                Err("ib or socket".to_string())
            }
        },
        show: |c| c.hetccl_net.clone(),
    },
    Var {
        name: "HETCCL_SPIN_US",
        field: "spin_us",
        apply: |c, v| {
            let us = parse::int_in(v, 0, i64::from(u32::MAX))?;
            c.spin_us = us as u32;
            Ok(None)
        },
        show: |c| Some(c.spin_us.to_string()),
    },
    Var {
        name: "HETCCL_COPY_MIN_BYTES",
        field: "copy_min_bytes",
        apply: |c, v| {
            c.copy_min_bytes = parse::size(v)? as u64;
            Ok(None)
        },
        show: |c| Some(c.copy_min_bytes.to_string()),
    },
    Var {
        name: "HETCCL_COMM_SECRET",
        field: "comm_secret",
        apply: |c, v| ok(parse::text(v), |t| c.comm_secret = Some(super::Secret(t))),
        show: |c| c.comm_secret.as_ref().map(|_| "<redacted>".to_string()),
    },
    Var {
        name: "HETCCL_CHECK",
        field: "check",
        apply: |c, v| ok(parse::boolean(v), |b| c.check = b),
        show: |c| Some(u8::from(c.check).to_string()),
    },
    Var {
        name: "HETCCL_COALESCE_BYTES",
        field: "coalesce_bytes",
        apply: |c, v| {
            let b = parse::size(v)?;
            if b != 0 && !(MIN_COALESCE..=MAX_COALESCE).contains(&b) {
                return Err("0 (off), or a size from 1K to 16M".to_string());
            }
            c.coalesce_bytes = b as u64;
            Ok(None)
        },
        show: |c| Some(c.coalesce_bytes.to_string()),
    },
    Var {
        name: "HETCCL_COPY_WORKERS",
        field: "copy_workers",
        apply: |c, v| {
            c.copy_workers = parse::int_in(v, 0, 4096)? as u32;
            Ok(None)
        },
        show: |c| Some(c.copy_workers.to_string()),
    },
    Var {
        name: "HETCCL_TUNING_FILE",
        field: "tuning_file",
        apply: |c, v| ok(parse::text(v), |t| c.tuning_file = Some(t)),
        show: |c| c.tuning_file.clone(),
    },
    Var {
        name: "HETCCL_TUNE",
        field: "tune",
        apply: |c, v| ok(super::TuneMode::parse(v), |m| c.tune = m),
        show: |c| Some(c.tune.to_string()),
    },
    Var {
        name: "HETCCL_TUNE_BUDGET_MS",
        field: "tune_budget_ms",
        apply: |c, v| {
            c.tune_budget_ms = parse::int_in(v, 1, 10_000)? as u32;
            Ok(None)
        },
        show: |c| Some(c.tune_budget_ms.to_string()),
    },
    Var {
        name: "HETCCL_COMPRESS",
        field: "compress",
        apply: |c, v| ok(super::Compression::parse(v), |m| c.compress = m),
        show: |c| Some(c.compress.to_string()),
    },
    Var {
        name: "HETCCL_TEST_DELAY_US",
        field: "test_delay",
        apply: |c, v| ok(parse_test_delay(v), |d| c.test_delay = Some(d)),
        show: |c| c.test_delay.as_ref().map(|(a, us)| format!("{a}:{us}")),
    },
];

/// `ALGO:US` of `HETCCL_TEST_DELAY_US`: an algorithm name (checked by the
/// engine) and up to one second in microseconds.
fn parse_test_delay(v: &str) -> Result<(String, u64), String> {
    let want = || "ALGO:US, e.g. Ring:2000 (at most 1000000 us)".to_string();
    let (a, us) = v.split_once(':').ok_or_else(want)?;
    let a = a.trim();
    let us: u64 = us.trim().parse().map_err(|_| want())?;
    if a.is_empty() || !a.chars().all(|c| c.is_ascii_alphabetic()) || us > 1_000_000 {
        return Err(want());
    }
    Ok((a.to_string(), us))
}

/// Variables of hetccl-perf (its launcher's rank, size and store), which it
/// sets for the ranks it spawns: not the library's, and not unknown.
const TOOL_PREFIX: &str = "HETCCL_PERF_";

/// The table index of `name`, if hetccl reads it.
pub(crate) fn index_of(name: &str) -> Option<usize> {
    VARS.iter().position(|v| v.name == name)
}

/// The parse driver behind [`Config::from_vars`].
pub(crate) fn build<I: IntoIterator<Item = (String, String)>>(vars: I) -> (Config, Vec<String>) {
    let mut values: Vec<Option<String>> = vec![None; VARS.len()];
    let mut unknown: Vec<String> = Vec::new();
    for (name, value) in vars {
        if let Some(i) = index_of(&name) {
            values[i] = Some(value);
        } else if name.starts_with("HETCCL_")
            && !name.starts_with(TOOL_PREFIX)
            && !unknown.contains(&name)
        {
            unknown.push(name);
        }
    }

    let mut cfg = Config::default();
    let mut warnings = Vec::new();
    for (i, (var, value)) in VARS.iter().zip(&values).enumerate() {
        let Some(value) = value.as_deref().filter(|v| !v.is_empty()) else {
            continue;
        };
        match (var.apply)(&mut cfg, value) {
            Ok(note) => {
                cfg.from_env |= 1u64 << i;
                if let Some(note) = note {
                    warnings.push(format!("{}={value}: {note}", var.name));
                }
                if let Some(why) = ignored(var.name) {
                    warnings.push(format!("{}={value} is ignored by hetccl: {why}", var.name));
                }
            }
            Err(expected) => {
                let default = (var.show)(&Config::default()).unwrap_or_else(|| "unset".to_string());
                warnings.push(format!(
                    "invalid value {value:?} for {}: expected {expected}; using default ({default})",
                    var.name
                ));
            }
        }
    }

    if let (Some(lo), Some(hi)) = (cfg.min_nchannels, cfg.max_nchannels) {
        if lo > hi {
            warnings.push(format!(
                "NCCL_MIN_NCHANNELS={lo} is above NCCL_MAX_NCHANNELS={hi}; the maximum wins"
            ));
        }
    }

    unknown.sort();
    for name in unknown {
        let hint = suggest::closest(&name, VARS.iter().map(|v| v.name))
            .map(|s| format!("; did you mean {s}?"))
            .unwrap_or_default();
        warnings.push(format!("unknown variable {name}{hint}"));
    }
    (cfg, warnings)
}

const _: () = assert!(VARS.len() <= 64, "Config::from_env is a u64 bitmask");

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_ignored_variable_is_in_the_table() {
        for (name, why) in IGNORED {
            assert!(index_of(name).is_some(), "{name}");
            assert!(!why.is_empty());
        }
    }

    #[test]
    fn names_are_unique_and_prefixed() {
        for (i, v) in VARS.iter().enumerate() {
            assert!(
                v.name.starts_with("NCCL_") || v.name.starts_with("HETCCL_"),
                "{}",
                v.name
            );
            assert_eq!(index_of(v.name), Some(i), "duplicate {}", v.name);
        }
    }

    #[test]
    fn aliases_are_adjacent_and_share_show() {
        let d = Config::default();
        for w in VARS.windows(2) {
            if w[0].field == w[1].field {
                assert_eq!((w[0].show)(&d), (w[1].show)(&d));
            }
        }
        // A field never reappears after a different field in between.
        let mut seen: Vec<&str> = Vec::new();
        for v in VARS {
            if seen.last() != Some(&v.field) {
                assert!(!seen.contains(&v.field), "{} is split", v.field);
                seen.push(v.field);
            }
        }
    }
}
