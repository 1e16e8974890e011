//! hetccl-perf: an nccl-tests-compatible benchmark for any library that
//! exposes NCCL's C API. The library is opened at run time (`--lib`), so the
//! same binary measures hetccl, NVIDIA's NCCL or any other drop-in.
//!
//! Modules follow nccl-tests' own split: [`cli`] (flags), [`coll`] (per
//! collective counts, bandwidth formulas and data), [`verifiable`] (exact
//! data generation), [`report`] (the output format), [`bench`] (one rank's
//! run), [`launch`], [`launcher`] and [`store`] (how ranks start, what their
//! launcher told them, and how they talk out of band),
//! [`nccl`] (the dynamically loaded API), [`buffers`] and [`cuda`] (host
//! or device buffers, and the CUDA driver for the latter). [`trace_merge`]
//! is the `trace-merge` subcommand, [`link_stats`] the `--link-stats`
//! summary, [`status`] the `status` subcommand, [`tune`] the `tune` subcommand.

pub mod bench;
pub mod buffers;
pub mod cfmt;
pub mod cli;
pub mod coll;
pub mod cuda;
pub mod dtype;
pub mod launch;
pub mod launcher;
pub mod link_stats;
pub mod nccl;
pub mod report;
pub mod status;
pub mod store;
pub mod trace_merge;
pub mod tune;
pub mod verifiable;
