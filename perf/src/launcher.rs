//! Every variable of the launchers hetccl-perf runs under (its own `-np`
//! supervisor, mpirun, torchrun, Slurm, PMI), read in one place: the rank
//! and size, the local rank and size, and the job's identity.

/// Rank of a process started by `-np` (set by the supervisor).
pub const ENV_RANK: &str = "HETCCL_PERF_RANK";
/// Number of ranks of a `-np` run.
pub const ENV_NRANKS: &str = "HETCCL_PERF_NRANKS";
/// Store directory of a `-np` run.
pub const ENV_STORE: &str = "HETCCL_PERF_STORE";
/// Library to test when `--lib` is not given.
pub const ENV_LIB: &str = "HETCCL_PERF_LIB";

/// Rank/size variables of the launchers hetccl-perf understands, in order.
pub const LAUNCHER_VARS: [(&str, &str, &str); 5] = [
    (ENV_RANK, ENV_NRANKS, "hetccl-perf -np"),
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "Open MPI"),
    ("PMI_RANK", "PMI_SIZE", "PMI (MPICH, Intel MPI)"),
    ("RANK", "WORLD_SIZE", "torchrun"),
    ("SLURM_PROCID", "SLURM_NTASKS", "Slurm"),
];

/// `(rank, size, launcher)` from the environment, if a launcher set them.
pub fn env_rank(get: impl Fn(&str) -> Option<String>) -> Option<(usize, usize, &'static str)> {
    for (r, s, name) in LAUNCHER_VARS {
        let rank = get(r).and_then(|v| v.trim().parse::<usize>().ok());
        let size = get(s).and_then(|v| v.trim().parse::<usize>().ok());
        if let (Some(rank), Some(size)) = (rank, size) {
            if size >= 1 && rank < size {
                return Some((rank, size, name));
            }
        }
    }
    None
}

/// The local rank: `LOCAL_RANK` (torchrun), `OMPI_COMM_WORLD_LOCAL_RANK`,
/// `SLURM_LOCALID`, else the global rank (one host).
pub fn local_rank(rank: usize) -> usize {
    ["LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID"]
        .iter()
        .find_map(|k| std::env::var(k).ok()?.trim().parse().ok())
        .unwrap_or(rank)
}

/// The number of ranks on this host, when the launcher says
/// (`OMPI_COMM_WORLD_LOCAL_SIZE`, `LOCAL_WORLD_SIZE`, `SLURM_NTASKS_PER_NODE`).
pub fn local_size() -> Option<usize> {
    [
        "OMPI_COMM_WORLD_LOCAL_SIZE",
        "LOCAL_WORLD_SIZE",
        "SLURM_NTASKS_PER_NODE",
    ]
    .iter()
    .find_map(|k| std::env::var(k).ok()?.trim().parse().ok())
}

/// A job key from the launcher's environment, so that ranks ignore a
/// rendezvous file left behind by another job.
pub fn job_key() -> String {
    for k in [
        "SLURM_JOB_ID",
        "PMIX_NAMESPACE",
        "OMPI_MCA_ess_base_jobid",
        "TORCHELASTIC_RUN_ID",
        "PMI_JOBID",
    ] {
        if let Ok(v) = std::env::var(k) {
            let step = if k == "SLURM_JOB_ID" {
                std::env::var("SLURM_STEP_ID").unwrap_or_default()
            } else {
                String::new()
            };
            return format!("{k}={v}.{step}");
        }
    }
    String::new()
}

/// `(rank, size, launcher)` from this process's environment.
pub fn rank_and_size() -> Option<(usize, usize, &'static str)> {
    env_rank(|k| std::env::var(k).ok())
}

/// Whether this process is a rank spawned by hetccl-perf's `-np`.
pub fn spawned_by_np() -> bool {
    std::env::var_os(ENV_RANK).is_some()
}

/// The store directory of the `-np` run this process belongs to.
pub fn np_store() -> Option<std::ffi::OsString> {
    std::env::var_os(ENV_STORE)
}
