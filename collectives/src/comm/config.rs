//! The settings a caller passes in C structs, as typed values: a
//! communicator's (`ncclConfig_t`) and a call's (`ncclCollConfig_t`). The C
//! API reads them (`api::config_read`); the engine only sees these.

/// The communicator settings hetccl takes from `ncclConfig_t`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommConfig {
    /// Calls return when done (true, the default) or may return `ncclInProgress`.
    pub blocking: bool,
    /// `netName`: the net plugin to use, if set.
    pub net_name: Option<String>,
    /// `commName`, for logs.
    pub comm_name: Option<String>,
    /// `splitShare`.
    pub split_share: bool,
    /// `trafficClass`, if set.
    pub traffic_class: Option<i32>,
    /// The header version of the caller's `nccl.h`, 0 when no config was given.
    pub header_version: u32,
}

impl Default for CommConfig {
    fn default() -> Self {
        Self {
            blocking: true,
            net_name: None,
            comm_name: None,
            split_share: false,
            traffic_class: None,
            header_version: 0,
        }
    }
}

/// The per-call settings hetccl takes from `ncclCollConfig_t`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CollConfig {
    /// `algSelection`: an NCCL_ALGO-style string restricting the algorithm.
    pub alg_selection: Option<String>,
    /// `userProfilerTag`.
    pub profiler_tag: u64,
}
