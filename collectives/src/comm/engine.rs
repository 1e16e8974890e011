//! The part of a communicator that moves data: its bootstrap, topology,
//! links, and the lock that serialises operations on it.

use std::sync::Arc;

use parking_lot::Mutex;

use super::config::CommConfig;
use crate::algo::Topology;
use crate::bootstrap::id::UniqueId;
use crate::bootstrap::Bootstrap;
use crate::exec::Links;
use crate::transport::arena::Arena;

/// A communicator's engine state.
#[derive(Debug)]
pub struct Engine {
    /// The id the communicator was created from.
    pub id: UniqueId,
    /// A hash of the id shared by every rank (logs, trace ids, shm names).
    pub comm_hash: u64,
    /// The settings from `ncclConfig_t`.
    pub config: CommConfig,
    /// The out-of-band channel (split, shrink, barriers).
    pub bootstrap: Mutex<Bootstrap>,
    /// Node (and process) of every rank.
    pub topo: Topology,
    /// The links to every peer.
    pub links: Links,
    /// The node's shared-memory arena, if this rank has local peers.
    pub arena: Option<Arc<Arena>>,
    /// Held while an operation runs on this communicator.
    pub exec_gate: super::exec_gate::ExecGate,
    /// Why operations must stop (abort, revoke); shared with `links.stop`.
    pub stop: Arc<crate::exec::stop::Stop>,
    /// Collectives run so far (the sequence number in fingerprints: the
    /// same on every rank, unlike `seq`, which counts point-to-point calls
    /// too).
    pub coll_seq: std::sync::atomic::AtomicU64,
    /// Number of operations run so far (the sequence part of trace ids).
    pub seq: std::sync::atomic::AtomicU64,
    /// Scratch buffers kept between operations (plans never read scratch
    /// they did not write, so the buffers are reused as they are).
    pub scratch_pool: Mutex<Vec<Vec<u8>>>,
    /// Algorithms and plans already made for this communicator.
    pub plans: Mutex<super::plan_cache::PlanCache>,
    /// The direct (board and single-copy) paths, when every rank is on this
    /// node and joined by shm.
    pub intranode: Option<crate::intranode::Node>,
    /// The cost model of this communicator's links (selection, simulation,
    /// the selection table).
    pub costs: crate::cost::CostModel,
    /// Rank 0's tuning-table layout and whether `costs` was calibrated
    /// (`crate::tune`): the same on every rank.
    pub tuning: crate::tune::Tuning,
    /// What it took from the configuration at init (passed down from here).
    pub settings: super::settings::Settings,
    /// The run-time controls (`hetcclCommSetOption`, online adaptation).
    pub control: crate::control::Control,
    /// What this rank is doing, for the status service (when it is on).
    pub status: Option<Arc<crate::exec::watch::Doing>>,
    /// Which peers' verbs links take device buffers in place (GPUDirect
    /// RDMA), their registrations and flushes.
    pub gdr: crate::transport::gdr::Paths,
}

impl Engine {
    /// The wire compression of float sum/avg reductions between nodes in
    /// force now: `HETCCL_COMPRESS`, or the last `compress` option set with
    /// `hetcclCommSetOption` (`crate::control`).
    pub fn compression(&self) -> hetccl_core::config::Compression {
        self.control.compression()
    }
}
