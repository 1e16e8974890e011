//! The hetccl engine and its C API.
//!
//! Module map (see `docs/architecture.md`):
//! - [`config`], [`obs`]: re-exported from `hetccl-core` (shared with the net plugin);
//! - [`error`]: the engine's error type and its `ncclResult_t` mapping;
//! - [`api`]: every exported `nccl*`/`pnccl*` function, each behind the FFI guard.

pub mod algo;
pub mod api;
pub mod bootstrap;
pub mod comm;
pub mod control;
pub mod cost;
pub mod error;
pub mod exec;
pub mod gpu;
pub mod intranode;
pub mod launch;
pub mod reduce;
pub mod telemetry;
pub mod topo;
pub mod transport;
pub mod tune;
pub mod user_ptr;

pub use hetccl_core::{config, obs};

pub use error::{Error, Result};
