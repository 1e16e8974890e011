//! What a communicator takes from the process configuration, read once at
//! its init and passed down from there: the layers below `comm` never read
//! the global configuration themselves.

use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};

use hetccl_core::config::{AddrFamily, Config};
use nccl_net_plugin::tcp::TcpOptions;

use super::config::CommConfig;
use crate::algo::AlgoFilter;
use crate::error::{Error, Result};
use crate::exec::Patience;

/// A communicator's settings.
#[derive(Debug, Clone)]
pub struct Settings {
    /// How long waits spin, report and give up (`HETCCL_SPIN_US`,
    /// `HETCCL_HANG_REPORT_S`, `HETCCL_TIMEOUT_S`); the spin is 0 on a node
    /// with more local ranks than processing units.
    pub patience: Patience,
    /// The bound of every bootstrap phase (`HETCCL_TIMEOUT_S`).
    pub timeout: Duration,
    /// The parsed `NCCL_ALGO` restriction (everything when unset).
    pub algo_filter: AlgoFilter,
    /// `HETCCL_COPY_MIN_BYTES`: where the single-copy path starts (0: off).
    pub copy_min_bytes: usize,
    /// `HETCCL_COPY_WORKERS` (0: one per processing unit).
    pub copy_workers: usize,
    /// `NCCL_BUFFSIZE`.
    pub buffsize: usize,
    /// `NCCL_SHM_DISABLE`.
    pub shm_disable: bool,
    /// `NCCL_P2P_DISABLE`.
    pub p2p_disable: bool,
    /// The interface filter of TCP links (`HETCCL_`/`NCCL_SOCKET_IFNAME`).
    pub socket_ifname: Option<String>,
    /// `NCCL_SOCKET_FAMILY`.
    pub socket_family: Option<AddrFamily>,
    /// The TCP transport's options (`NCCL_SOCKET_*`, `NCCL_NSOCKS_PERTHREAD`).
    pub tcp: TcpOptions,
    /// `HETCCL_HOST_ID`: the host identity override.
    pub host_id: Option<String>,
    /// `commName` of `ncclConfig_t`, for logs and hang reports.
    pub comm_name: Option<String>,
    /// `HETCCL_NVRTC_LIB`: the NVRTC that compiles the GPU kernels.
    pub nvrtc_lib: Option<String>,
    /// `HETCCL_CHECK`: collectives on the executor's links exchange
    /// fingerprints (`exec::fingerprint`).
    pub check: bool,
    /// `HETCCL_COALESCE_BYTES` (0: off): the pack size of coalesced
    /// point-to-point messages (`transport::coalesce`); set to 0 at init
    /// when the ranks disagree.
    pub coalesce_bytes: u32,
    /// `HETCCL_METRICS_FILE`: the Prometheus file template (unexpanded).
    pub metrics_file: Option<String>,
    /// `HETCCL_METRICS_INTERVAL_S`: how often the metrics file is rewritten.
    pub metrics_interval: Duration,
    /// `HETCCL_TRACE_FILE`: the timeline file template (unexpanded).
    pub trace_file: Option<String>,
    /// `HETCCL_TRACE_MAX_EVENTS`: timeline events kept per thread.
    pub trace_max_events: usize,
    /// The status service's query port (`HETCCL_STATUS_PORT`, 0 for any
    /// when only `HETCCL_STATUS` is set); `None`: the service is off.
    pub status_port: Option<u16>,
    /// Whether verbs may join ranks on different nodes: off with
    /// `NCCL_IB_DISABLE=1`, `NCCL_NET=Socket` or `HETCCL_NET=socket`.
    pub verbs: bool,
    /// The verbs transport's options (`NCCL_IB_*`).
    pub ib: nccl_net_plugin::ib::IbOptions,
    /// Which RDMA ports verbs may use (`NCCL_IB_HCA`, `NCCL_IB_GID_INDEX`).
    pub ib_ports: nccl_net_plugin::ib::DiscoverOpts,
    /// `HETCCL_TUNE`: the tuning mode.
    pub tune: hetccl_core::config::TuneMode,
    /// `HETCCL_TUNING_FILE`: the tuning table (the engine reads it on rank 0
    /// when its format is `hetccl-tuning`).
    pub tuning_file: Option<String>,
    /// `HETCCL_TUNE_BUDGET_MS`: how long the init probe may take.
    pub tune_budget: Duration,
    /// `HETCCL_COMPRESS`: the wire format of float sum/avg reductions
    /// between nodes (the communicator's starting value).
    pub compress: hetccl_core::config::Compression,
    /// `HETCCL_TEST_DELAY_US`, a test hook: every call that runs this
    /// algorithm on the executor waits this long first.
    pub test_delay: Option<(crate::algo::Algorithm, Duration)>,
}

/// Whether the configuration lets verbs carry cross-node traffic.
fn verbs_allowed(cfg: &Config) -> bool {
    let socket = cfg
        .net
        .as_deref()
        .is_some_and(|n| n.eq_ignore_ascii_case("socket"));
    match cfg.hetccl_net.as_deref() {
        Some("ib") => true,
        Some(_) => false,
        None => !cfg.ib_disable && !socket,
    }
}

/// A positive, finite number of seconds, or `None`.
fn secs(s: f64) -> Option<Duration> {
    (s.is_finite() && s > 0.0).then(|| Duration::from_secs_f64(s))
}

impl Settings {
    /// The settings of a communicator created with `comm` under `cfg`.
    pub fn new(cfg: &Config, comm: &CommConfig) -> Result<Self> {
        let timeout = secs(cfg.timeout_s).unwrap_or(Duration::from_secs(300));
        let algo_filter = match cfg.algo.as_deref() {
            Some(s) => AlgoFilter::parse(s).map_err(|e| Error::arg(format!("NCCL_ALGO: {e}")))?,
            None => AlgoFilter::all(),
        };
        let test_delay = match &cfg.test_delay {
            Some((name, us)) => {
                let algo = crate::algo::Algorithm::ALL
                    .into_iter()
                    .find(|x| x.name().eq_ignore_ascii_case(name))
                    .ok_or_else(|| {
                        Error::arg(format!("HETCCL_TEST_DELAY_US: unknown algorithm {name:?}"))
                    })?;
                Some((algo, Duration::from_micros(*us)))
            }
            None => None,
        };
        Ok(Self {
            patience: Patience {
                spin: Duration::from_micros(u64::from(cfg.spin_us)),
                hang_report: secs(cfg.hang_report_s),
                stall_timeout: timeout,
            },
            timeout,
            algo_filter,
            copy_min_bytes: usize::try_from(cfg.copy_min_bytes).unwrap_or(usize::MAX),
            copy_workers: cfg.copy_workers as usize,
            buffsize: cfg.buffsize,
            shm_disable: cfg.shm_disable,
            p2p_disable: cfg.p2p_disable,
            socket_ifname: cfg.socket_ifname.clone(),
            socket_family: cfg.socket_family,
            tcp: engine_tcp(cfg),
            host_id: cfg.host_id.clone(),
            comm_name: comm.comm_name.clone(),
            nvrtc_lib: cfg.nvrtc_lib.clone(),
            check: cfg.check,
            coalesce_bytes: u32::try_from(cfg.coalesce_bytes).unwrap_or(0),
            metrics_file: cfg.metrics_file.clone(),
            metrics_interval: secs(cfg.metrics_interval_s).unwrap_or(Duration::from_secs(15)),
            trace_file: cfg.trace_file.clone(),
            trace_max_events: cfg.trace_max_events,
            status_port: cfg.status_port.or(cfg.status.then_some(0)),
            verbs: verbs_allowed(cfg),
            ib: nccl_net_plugin::ib::IbOptions::from_config(cfg),
            ib_ports: nccl_net_plugin::plugin::backend::discover_opts(cfg),
            tune: cfg.tune,
            tuning_file: cfg.tuning_file.clone(),
            tune_budget: Duration::from_millis(u64::from(cfg.tune_budget_ms)),
            compress: cfg.compress,
            test_delay,
        })
    }

    /// The end of a bootstrap phase that starts now.
    pub fn deadline(&self) -> Instant {
        Instant::now() + self.timeout
    }

    /// The address ranks listen on for the bootstrap: the first interface
    /// the socket filter selects, else loopback.
    pub fn bootstrap_ip(&self) -> IpAddr {
        let filter = self
            .socket_ifname
            .as_deref()
            .map(hetccl_core::config::IfaceFilter::parse);
        nccl_net_plugin::iface::discover_with(filter.as_ref(), self.socket_family)
            .first()
            .map(|d| d.addr)
            .unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST))
    }

    /// "comm 0123…" or "comm 0123… (\"name\")", for log lines.
    pub fn label(&self, comm_hash: u64) -> String {
        match &self.comm_name {
            Some(n) => format!("comm {comm_hash:016x} ({n:?})"),
            None => format!("comm {comm_hash:016x}"),
        }
    }
}

/// Data sockets of an engine TCP link when `NCCL_NSOCKS_PERTHREAD` is
/// unset (and helper threads count as none when `NCCL_SOCKET_NTHREADS` is
/// unset). The engine drives its links from the calling thread, so more
/// sockets add no core, only system calls and bytes in flight: between two
/// network namespaces on 2 CPUs, one data socket beat four at 1 and 64 MiB
/// for broadcast and all-reduce (docs/benchmarks.md).
pub const ENGINE_NSOCKS: usize = 1;

/// The TCP options of the engine's links: the configuration's, with the
/// engine's own defaults for unset values, driven without helper threads.
fn engine_tcp(cfg: &hetccl_core::config::Config) -> TcpOptions {
    let mut o = TcpOptions::from_config_or(cfg, 0, ENGINE_NSOCKS);
    o.nthreads = 0;
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(pairs: &[(&str, &str)]) -> Config {
        Config::from_vars(pairs.iter().map(|(k, v)| (k.to_string(), v.to_string()))).0
    }

    #[test]
    fn settings_follow_the_configuration() {
        let s = Settings::new(
            &cfg(&[
                ("HETCCL_TIMEOUT_S", "2.5"),
                ("HETCCL_SPIN_US", "7"),
                ("HETCCL_HANG_REPORT_S", "0"),
                ("NCCL_ALGO", "ring"),
                ("HETCCL_COPY_MIN_BYTES", "64K"),
            ]),
            &CommConfig {
                comm_name: Some("dp".into()),
                ..CommConfig::default()
            },
        )
        .unwrap();
        assert_eq!(s.timeout, Duration::from_millis(2500));
        assert_eq!(s.patience.stall_timeout, s.timeout);
        assert_eq!(s.patience.spin, Duration::from_micros(7));
        assert_eq!(s.patience.hang_report, None);
        assert!(!s.algo_filter.is_unrestricted());
        assert_eq!(s.copy_min_bytes, 64 << 10);
        assert_eq!(s.label(0xab), "comm 00000000000000ab (\"dp\")");
        let e = Settings::new(&cfg(&[("NCCL_ALGO", "rung")]), &CommConfig::default()).unwrap_err();
        assert!(e.to_string().contains("NCCL_ALGO"), "{e}");
        let s = Settings::new(
            &cfg(&[("HETCCL_TEST_DELAY_US", "halvingdoubling:25")]),
            &CommConfig::default(),
        )
        .unwrap();
        assert_eq!(
            s.test_delay,
            Some((
                crate::algo::Algorithm::HalvingDoubling,
                Duration::from_micros(25)
            ))
        );
        let e = Settings::new(
            &cfg(&[("HETCCL_TEST_DELAY_US", "Rung:5")]),
            &CommConfig::default(),
        )
        .unwrap_err();
        assert!(e.to_string().contains("HETCCL_TEST_DELAY_US"), "{e}");
    }

    #[test]
    fn engine_links_take_one_data_socket_unless_the_user_chose() {
        let socks = |pairs: &[(&str, &str)]| {
            let s = Settings::new(&cfg(pairs), &CommConfig::default()).unwrap();
            assert_eq!(s.tcp.nthreads, 0, "{pairs:?}");
            s.tcp.nsocks
        };
        assert_eq!(socks(&[]), ENGINE_NSOCKS);
        assert_eq!(socks(&[("NCCL_SOCKET_NTHREADS", "-2")]), ENGINE_NSOCKS);
        assert_eq!(
            socks(&[
                ("NCCL_SOCKET_NTHREADS", "0"),
                ("NCCL_NSOCKS_PERTHREAD", "3")
            ]),
            3
        );
        assert_eq!(socks(&[("NCCL_SOCKET_NTHREADS", "0")]), 1);
        assert_eq!(
            socks(&[
                ("NCCL_SOCKET_NTHREADS", "2"),
                ("NCCL_NSOCKS_PERTHREAD", "2")
            ]),
            4
        );
        assert_eq!(socks(&[("NCCL_NSOCKS_PERTHREAD", "0")]), 0);
        // Unset helper threads count as none: the engine starts none.
        assert_eq!(socks(&[("NCCL_NSOCKS_PERTHREAD", "3")]), 3);
    }
}
