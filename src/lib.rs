//! `libhetccl.so`: the one shared library that NCCL users load.
//!
//! This crate holds no logic beyond the `munmap`/`mremap` hooks
//! ([`unmap_hook`]). It links the engine (`hetccl-collectives`, which
//! defines every exported `nccl*`/`pnccl*` function) and the network plugin
//! (`nccl-net-plugin`, which defines the `ncclNetPlugin_v6..v12` tables), so that the
//! cdylib exports both. See `docs/architecture.md`.

pub use hetccl_abi as abi;
pub use hetccl_collectives as collectives;
pub use nccl_net_plugin as net;

#[cfg(all(
    target_os = "linux",
    any(target_arch = "x86_64", target_arch = "aarch64")
))]
pub mod unmap_hook;
