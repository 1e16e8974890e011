//! CUDA memory: buffer classification, the stream-ordered path for calls on
//! device buffers, and the GPU reduction kernels (see `docs/gpu.md`).
//!
//! Everything here works on machines without CUDA: the driver is loaded at
//! run time ([`driver`]); without it, [`memory::classify`] still tells host
//! buffers apart from pointers that cannot be host memory, and refuses the
//! latter with a message.
//!
//! - [`driver`]: `cudarc` with dynamic loading, contexts, capture check;
//! - [`memory`]: host / pinned / device / managed, cached per thread;
//! - [`stream`]: the user's stream waits while the proxy thread runs the
//!   call, through [`peer`] (CUDA IPC inside a node) or host staging;
//! - [`ipc`]: exporting and opening device buffers between processes;
//! - [`p2p`]: sends and receives inside a node through a mailbox per pair;
//! - [`stage`]: host staging on the proxy's stream, large calls pipelined;
//! - [`gdr`]: sends and receives between nodes in place over GPUDirect RDMA;
//! - [`flags`]: the flags user streams wait on, in slabs;
//! - [`pinned`]: the pool of pinned host staging buffers;
//! - [`safe`]: safe points for the calls that wait for the device (frees,
//!   IPC closes, module loads) and for pinned allocations: never while a
//!   stream waits on a flag;
//! - [`kernels`], [`module`] and [`nvrtc`]: reduction kernels compiled at
//!   first use (a CUBIN for the device, else PTX) and loaded at a safe point.

pub mod driver;
pub mod flags;
pub mod gdr;
pub mod ipc;
pub mod kernels;
pub mod memory;
pub mod module;
pub mod nvrtc;
pub mod p2p;
pub mod peer;
pub mod pinned;
pub mod safe;
pub mod stage;
pub mod stream;

pub use memory::{classify, Placement};

use crate::error::Result;
use crate::launch::Call;

/// Runs a validated call whose buffers are CUDA memory (see [`stream`]).
pub fn submit(a: Call) -> Result<()> {
    stream::submit(a)
}

/// Runs the device calls an outermost group end collected, as one batch.
pub fn enqueue(calls: Vec<Call>) -> Result<()> {
    stream::enqueue(calls)
}
