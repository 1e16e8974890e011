//! hetccl's network transports and the NCCL net-plugin adapters.
//!
//! - [`tcp`]: the TCP transport as a Rust API over host buffers ([`tcp::TcpNet`],
//!   [`tcp::TcpSendComm`], [`tcp::TcpRecvComm`]); the engine reuses it for
//!   inter-node traffic.
//! - [`ib`]: the verbs transport (InfiniBand / RoCE), libibverbs loaded at
//!   run time.
//! - [`transport`]: the traits a transport implements.
//! - [`plugin`]: the one internal API behind the C tables, and one adapter
//!   file per `ncclNetPlugin_vN` (v6 to v12), all exported from `libhetccl.so`.
//! - [`tuner`]: NVIDIA NCCL's tuner plugin (`ncclTunerPlugin_v3..v6`),
//!   which applies a measured tuning table to NCCL's cost table.
//! - [`wire`]: everything that crosses the network, with bounded decoders.
//! - [`iface`]: device discovery (`NCCL_SOCKET_IFNAME`, `/sys/class/net`).

pub mod error;
mod fasthash;
pub mod ib;
pub mod iface;
pub mod plugin;
mod sock;
pub mod tcp;
pub mod transport;
pub mod tuner;
pub mod wire;

pub use error::{NetError, Result};
