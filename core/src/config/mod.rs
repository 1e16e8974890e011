//! The typed configuration, read once from the `NCCL_*` / `HETCCL_*`
//! environment.
//!
//! - [`get`] returns the process-wide [`Config`], parsed on first use.
//! - [`Config::from_vars`] is the pure parser behind it, for tests.
//! - [`log_once`] prints the effective configuration at INFO (`hetccl::ENV`).
//!
//! Every variable is listed once in the table in `vars.rs`, which drives both
//! parsing and the "unknown `HETCCL_*` variable" warning. docs/configuration.md
//! describes each one.

mod debug;
mod display;
mod modes;
mod net;
mod parse;
mod suggest;
mod vars;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Once;

use once_cell::sync::Lazy;

pub use debug::{DebugLevel, SubsysMask};
pub use modes::{Compression, TuneMode};
pub use net::{split_host_port, AddrFamily, IfaceFilter};

/// The tracing target configuration messages are logged under.
pub const ENV_TARGET: &str = "hetccl::ENV";

/// The TCP congestion control of the transport's data sockets unless
/// `HETCCL_SOCKET_CC` says otherwise ([`Config::socket_cc`]); built into
/// every Linux kernel and allowed to unprivileged processes.
pub const DEFAULT_SOCKET_CC: &str = "reno";

/// Every setting hetccl reads from the environment, typed and defaulted.
///
/// Build one with [`Config::default`] or [`Config::from_vars`]; the process-wide
/// instance is [`get`]. Empty variables count as unset.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    /// `NCCL_DEBUG`: the log level. Default [`DebugLevel::None`] (nothing is
    /// printed, as in NCCL).
    pub debug: DebugLevel,
    /// `NCCL_DEBUG_SUBSYS`: the subsystems INFO and TRACE lines are shown for.
    /// Default `INIT,BOOTSTRAP,ENV`.
    pub debug_subsys: SubsysMask,
    /// `NCCL_DEBUG_FILE`: where logs go instead of stdout, raw (`%h` and `%p`
    /// are expanded by `obs`). Default unset.
    pub debug_file: Option<String>,
    /// `HETCCL_SOCKET_IFNAME`, else `NCCL_SOCKET_IFNAME`: the raw interface
    /// filter; see [`Config::socket_iface_filter`]. Default unset (the net
    /// code picks interfaces).
    pub socket_ifname: Option<String>,
    /// `NCCL_SOCKET_FAMILY`: force IPv4 or IPv6. Default unset (either).
    pub socket_family: Option<AddrFamily>,
    /// `NCCL_COMM_ID`: a fixed bootstrap root address, `host:port` or
    /// `[v6]:port` (validated with [`split_host_port`]). Default unset.
    pub comm_id: Option<String>,
    /// `NCCL_NSOCKS_PERTHREAD`: sockets per helper thread; `None` means auto
    /// (`-2` in the environment also means auto).
    pub nsocks_perthread: Option<i32>,
    /// `NCCL_SOCKET_NTHREADS`: helper threads per connection; `None` means
    /// auto (`-2` in the environment also means auto).
    pub socket_nthreads: Option<i32>,
    /// `NCCL_SOCKET_INLINE`: messages up to this size travel inline with their
    /// header. Default 128 bytes.
    pub socket_inline: usize,
    /// `NCCL_SOCKET_MIN_TASKSIZE`: the smallest piece a message is split into
    /// across sockets. Default 65536 bytes.
    pub socket_min_task_size: usize,
    /// `HETCCL_SOCKET_CC`: the TCP congestion control of the transport's
    /// data sockets (`TCP_CONGESTION`); `None` keeps the host's default
    /// (`system`). Default `reno`: a loss-based window that is not capped
    /// at an estimate of the path's bandwidth-delay product, which on
    /// links of microseconds holds every message beyond a few tens of KiB
    /// back on acknowledgements (docs/benchmarks.md).
    pub socket_cc: Option<String>,
    /// `HETCCL_TIMEOUT_S`: the bound on every wait in hetccl, in seconds.
    /// Default 300.
    pub timeout_s: f64,
    /// `HETCCL_HANG_REPORT_S`: an operation pending this long gets a hang
    /// report, in seconds; 0 disables reports. Default 60.
    pub hang_report_s: f64,
    /// `HETCCL_HOST_ID` (or its synonym `NCCL_HOSTID`): overrides the host
    /// identity (host hash), so that tests can pretend processes run on
    /// different nodes. Default unset.
    pub host_id: Option<String>,
    /// `NCCL_ALGO`: algorithm override, raw. Default unset.
    pub algo: Option<String>,
    /// `NCCL_PROTO`: protocol override, raw. Default unset.
    pub proto: Option<String>,
    /// `NCCL_BUFFSIZE`: bytes per pipeline buffer. Default 4 MiB.
    pub buffsize: usize,
    /// `NCCL_MIN_NCHANNELS`: the fewest channels to use. Default unset.
    pub min_nchannels: Option<u32>,
    /// `NCCL_MAX_NCHANNELS`: the most channels to use. Default unset.
    pub max_nchannels: Option<u32>,
    /// `HETCCL_TRACE_FILE`: write a Chrome-trace timeline here (`%h`, `%p`,
    /// `%r` expanded). Default unset.
    pub trace_file: Option<String>,
    /// `HETCCL_TRACE_MAX_EVENTS`: the timeline events kept per thread (the
    /// oldest are dropped). Default 65536.
    pub trace_max_events: usize,
    /// `HETCCL_STATUS`: run the status service (on an ephemeral port unless
    /// `HETCCL_STATUS_PORT` is set). Default off.
    pub status: bool,
    /// `HETCCL_STATUS_PORT`: the status service's query port on 127.0.0.1
    /// (setting it turns the service on; 0 picks a free port). Default
    /// unset.
    pub status_port: Option<u16>,
    /// `HETCCL_METRICS_FILE`: write the metrics here in the Prometheus text
    /// format (`%h`, `%p`, `%r` expanded). Default unset.
    pub metrics_file: Option<String>,
    /// `HETCCL_METRICS_INTERVAL_S`: how often the metrics file is rewritten,
    /// in seconds. Default 15.
    pub metrics_interval_s: f64,
    /// `HETCCL_NCCL_FALLBACK`: the real NCCL library to fall back to. Default
    /// unset.
    pub nccl_fallback: Option<String>,
    /// `HETCCL_NVRTC_LIB`: the NVRTC library (`libnvrtc.so.*`) that compiles
    /// the GPU reduction kernels. Default unset (the usual sonames).
    pub nvrtc_lib: Option<String>,
    /// `HETCCL_IBVERBS_LIB`: the libibverbs file to open in place of the
    /// usual sonames. Default unset.
    pub ibverbs_lib: Option<String>,
    /// `HETCCL_SYSFS_ROOT`: where sysfs is read for PCI placement and the
    /// peer-memory module (tests point it at a synthetic tree). Default
    /// unset (`/sys`).
    pub sysfs_root: Option<String>,
    /// `NCCL_SHM_DISABLE`: disable the shared-memory transport. Default false.
    pub shm_disable: bool,
    /// `NCCL_P2P_DISABLE`: disable the peer-to-peer (GPU IPC) transport.
    /// Default false.
    pub p2p_disable: bool,
    /// `NCCL_NET`: the network plugin/transport to use, by name. Default unset.
    pub net: Option<String>,
    /// `NCCL_IB_DISABLE`: disable the verbs transport (engine and plugin
    /// use TCP). Default false.
    pub ib_disable: bool,
    /// `NCCL_IB_HCA`: which RDMA devices and ports to use
    /// (`[^][=]dev[:port],...`). Default unset (all active ports).
    pub ib_hca: Option<String>,
    /// `NCCL_NET_GDR_LEVEL`: when to use GPUDirect RDMA. Default unset.
    pub net_gdr_level: Option<String>,
    /// `NCCL_IB_GID_INDEX`: the GID index; unset or -1: auto (RoCE v2 over
    /// IPv4 first).
    pub ib_gid_index: Option<i32>,
    /// `NCCL_IB_TC`: traffic class of RoCE packets. Default 0.
    pub ib_tc: u32,
    /// `NCCL_IB_SL`: InfiniBand service level. Default 0.
    pub ib_sl: u32,
    /// `NCCL_IB_TIMEOUT`: QP ack timeout exponent (4.096 µs × 2^n). Default 20.
    pub ib_timeout: u32,
    /// `NCCL_IB_RETRY_CNT`: QP retry count. Default 7.
    pub ib_retry_cnt: u32,
    /// `NCCL_IB_QPS_PER_CONNECTION`: QPs per verbs connection. Default 1.
    pub ib_qps_per_connection: u32,
    /// `NCCL_IB_SPLIT_DATA_ON_QPS`: split each message over the QPs
    /// (else each goes whole on one, round-robin). Default 0.
    pub ib_split_data_on_qps: bool,
    /// `NCCL_IB_PCI_RELAXED_ORDERING`: 0 off, 1 on, 2 (default) where supported.
    pub ib_pci_relaxed_ordering: u32,
    /// `NCCL_DMABUF_ENABLE`: register GPU memory through DMA-BUF. Default 1.
    pub dmabuf_enable: bool,
    /// `HETCCL_NET`: `ib` or `socket` forces the net plugin's and the
    /// engine's transport between nodes. Default unset (verbs when a port
    /// is active).
    pub hetccl_net: Option<String>,
    /// `HETCCL_SPIN_US`: how long a wait spins before it blocks, in
    /// microseconds. Default 50.
    pub spin_us: u32,
    /// `HETCCL_COPY_MIN_BYTES`: on single-node communicators, the operation
    /// size (bytes of the largest buffer) from which the single-copy path
    /// (`process_vm_readv`) replaces the pipelined rings; 0 turns it off.
    /// Default 32768.
    pub copy_min_bytes: u64,
    /// `HETCCL_COPY_WORKERS`: on single-node communicators, how many local
    /// ranks (the lowest) run the single-copy path's work items; the others
    /// post their buffers and wait, and take part only when no item
    /// finishes for a while. 0 (default): one per online processing unit,
    /// so every rank works unless ranks outnumber processing units.
    pub copy_workers: u32,
    /// `HETCCL_CHECK`: collectives on the executor's links exchange
    /// fingerprints, and ranks that called different collectives fail with
    /// `ncclInvalidUsage` instead of mixing data. Default off (it costs about
    /// 15 % of an 8 B AllReduce over TCP).
    pub check: bool,
    /// `HETCCL_COALESCE_BYTES`: on TCP links, point-to-point messages of up
    /// to an eighth of this size that are queued to one peer together
    /// travel as one wire message of at most this size; 0 turns it off.
    /// Every rank must set the same value, or it is off on all. Default
    /// 65536.
    pub coalesce_bytes: u64,
    /// `HETCCL_COMM_SECRET`: mixed into the secret of ids derived from
    /// `NCCL_COMM_ID`, so that they cannot be guessed from the address.
    /// Never printed. Default unset.
    pub comm_secret: Option<Secret>,
    /// `HETCCL_TUNING_FILE`: a tuning table (JSON). A `hetccl-tuning` table
    /// gives hetccl's own engine measured times per algorithm (rank 0's file
    /// counts for a whole communicator); a `hetccl-nccl-tuning` table is
    /// what the NCCL tuner plugin (`ncclTunerPlugin_v*`) reads. Default
    /// unset (the engine uses its cost model, the plugin leaves NCCL's
    /// choices alone).
    pub tuning_file: Option<String>,
    /// `HETCCL_TUNE`: `off` (default), `init` (calibrate the cost model at
    /// communicator init) or `online` (also adapt choices at run time).
    pub tune: TuneMode,
    /// `HETCCL_TUNE_BUDGET_MS`: the time the `HETCCL_TUNE=init` probe may
    /// take on a rank, in milliseconds (1..=10000). Default 50.
    pub tune_budget_ms: u32,
    /// `HETCCL_COMPRESS`: `off` (default), `bf16` or `fp8e4m3`: the wire
    /// format of float sum/avg reductions between nodes.
    pub compress: Compression,
    /// `HETCCL_TEST_DELAY_US`, a test hook: `ALGO:US` makes every executor
    /// call that runs algorithm `ALGO` (hetccl's name: `Ring`, `Tree`,
    /// `Direct`, `HalvingDoubling`, `Hierarchical`, `Pairwise`) wait `US`
    /// microseconds first. Default unset.
    pub test_delay: Option<(String, u64)>,
    /// Bit `i` set: entry `i` of the variable table came from the environment.
    from_env: u64,
}

/// A value that is never printed (`Debug` and the INFO dump redact it).
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(pub String);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

impl Default for Config {
    fn default() -> Self {
        Config {
            debug: DebugLevel::None,
            debug_subsys: SubsysMask::DEFAULT,
            debug_file: None,
            socket_ifname: None,
            socket_family: None,
            comm_id: None,
            nsocks_perthread: None,
            socket_nthreads: None,
            socket_inline: 128,
            socket_min_task_size: 65536,
            socket_cc: Some(DEFAULT_SOCKET_CC.to_string()),
            timeout_s: 300.0,
            hang_report_s: 60.0,
            host_id: None,
            algo: None,
            proto: None,
            buffsize: 4 << 20,
            min_nchannels: None,
            max_nchannels: None,
            trace_file: None,
            trace_max_events: 65536,
            status: false,
            status_port: None,
            metrics_file: None,
            metrics_interval_s: 15.0,
            nccl_fallback: None,
            nvrtc_lib: None,
            ibverbs_lib: None,
            sysfs_root: None,
            shm_disable: false,
            p2p_disable: false,
            net: None,
            ib_disable: false,
            ib_hca: None,
            net_gdr_level: None,
            ib_gid_index: None,
            ib_tc: 0,
            ib_sl: 0,
            ib_timeout: 20,
            ib_retry_cnt: 7,
            ib_qps_per_connection: 1,
            ib_split_data_on_qps: false,
            ib_pci_relaxed_ordering: 2,
            dmabuf_enable: true,
            hetccl_net: None,
            spin_us: 50,
            copy_min_bytes: 32 << 10,
            copy_workers: 0,
            check: false,
            coalesce_bytes: 64 << 10,
            comm_secret: None,
            tuning_file: None,
            tune: TuneMode::Off,
            tune_budget_ms: 50,
            compress: Compression::Off,
            test_delay: None,
            from_env: 0,
        }
    }
}

impl Config {
    /// Builds a configuration from `(name, value)` pairs, without touching the
    /// process environment. Returns it with the warnings to report: unknown
    /// `HETCCL_*` names and unparseable values (which keep their default).
    /// When a name appears twice, the last value wins.
    pub fn from_vars<I: IntoIterator<Item = (String, String)>>(vars: I) -> (Config, Vec<String>) {
        vars::build(vars)
    }

    /// The parsed form of [`Config::socket_ifname`], if set.
    pub fn socket_iface_filter(&self) -> Option<IfaceFilter> {
        self.socket_ifname.as_deref().map(IfaceFilter::parse)
    }

    /// True when the variable `name` was read from the environment (and its
    /// value was valid).
    pub fn is_set(&self, name: &str) -> bool {
        vars::index_of(name).is_some_and(|i| self.from_env & (1u64 << i) != 0)
    }

    /// The names of every variable hetccl reads, in table order.
    pub fn known_names() -> impl Iterator<Item = &'static str> {
        vars::VARS.iter().map(|v| v.name)
    }

    /// Why hetccl ignores the variable `name` (it reads it so that it can
    /// say so), or `None` when the variable is honoured.
    pub fn ignored_reason(name: &str) -> Option<&'static str> {
        vars::ignored(name)
    }

    /// The variables from the environment that hetccl ignores, with why.
    pub fn ignored_settings(&self) -> Vec<(&'static str, &'static str)> {
        vars::IGNORED
            .iter()
            .copied()
            .filter(|(n, _)| self.is_set(n))
            .collect()
    }
}

/// The process-wide configuration and its warnings, parsed on first use.
static LOADED: Lazy<(Config, Vec<String>)> = Lazy::new(|| {
    // `std::env::vars()` panics on non-UTF-8 entries; skip those instead.
    let vars = std::env::vars_os()
        .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)));
    std::panic::catch_unwind(|| Config::from_vars(vars.collect::<Vec<_>>())).unwrap_or_else(|_| {
        (
            Config::default(),
            vec!["internal error while reading the environment; using defaults".to_string()],
        )
    })
});

static WARNED: Once = Once::new();
static LOGGED: AtomicBool = AtomicBool::new(false);

/// The process-wide configuration, read from the environment the first time.
///
/// The first call also sets up logging ([`crate::obs::ensure_init`]) so that
/// the parse warnings reach the log, at WARN under `hetccl::ENV`.
pub fn get() -> &'static Config {
    let cfg = &LOADED.0;
    if !WARNED.is_completed() {
        crate::obs::ensure_init();
        emit_warnings_once();
    }
    cfg
}

/// The cached configuration without any logging side effect (for `obs`,
/// which must not re-enter its own initialisation).
pub(crate) fn loaded() -> &'static Config {
    &LOADED.0
}

/// Logs the parse warnings of the process-wide configuration, once.
pub(crate) fn emit_warnings_once() {
    WARNED.call_once(|| {
        for w in &LOADED.1 {
            tracing::warn!(target: ENV_TARGET, "{w}");
        }
    });
}

/// Prints the effective configuration at INFO under `hetccl::ENV`, one line
/// per variable, the first time it is called; later calls do nothing.
pub fn log_once() {
    if LOGGED.swap(true, Ordering::AcqRel) {
        return;
    }
    let cfg = get();
    for line in cfg.to_string().lines() {
        tracing::info!(target: ENV_TARGET, "{line}");
    }
}

#[cfg(test)]
mod tests;
