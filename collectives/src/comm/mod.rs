//! Communicators: the object behind `ncclComm_t`, its C handle registry, and
//! its per-comm tables.
//!
//! The engine (bootstrap, transports, executor) attaches to [`Comm`]; the
//! C API only ever reaches a comm through [`handle::lookup`], which rejects
//! NULL, never-created and destroyed handles alike.

pub mod config;
pub mod engine;
pub mod exec_gate;
pub mod finalize;
pub mod grow;
pub mod handle;
pub mod init;
pub mod owner;
pub mod plan_cache;
pub mod redop_table;
pub mod revoke;
pub mod settings;
pub mod split;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};

use parking_lot::Mutex;

use self::redop_table::RedOpTable;
use crate::error::{Error, Result};

/// One rank's communicator.
#[derive(Debug)]
pub struct Comm {
    /// Number of ranks.
    pub nranks: usize,
    /// This rank.
    pub rank: usize,
    /// CUDA device, or -1 on host-only ranks.
    pub cuda_device: i32,
    /// PreMulSum ops created on this comm.
    pub redops: Mutex<RedOpTable>,
    /// What `ncclCommGetAsyncError` reports (`ncclResult_t`).
    pub async_error: AtomicI32,
    /// Set by `ncclCommRevoke`/`ncclCommAbort`: no new operations.
    pub revoked: AtomicBool,
    /// Set by `ncclCommSuspend`, cleared by `ncclCommResume`.
    pub suspended: AtomicBool,
    /// Buffers registered with `ncclCommRegister`: handle token -> (address, bytes).
    pub registrations: Mutex<HashMap<usize, (usize, usize)>>,
    /// Set when an operation failed part-way: the links may hold stray
    /// bytes, so every later operation fails at once with this reason.
    /// Set through [`Comm::record_failure`].
    pub failure: Mutex<Option<String>>,
    /// Whether `failure` is set (checked on every call without the lock).
    failed: AtomicBool,
    /// The data-moving part: set once init completes (at once for blocking
    /// init, later for nonblocking init); never set for unit-test comms.
    pub engine: once_cell::sync::OnceCell<engine::Engine>,
    /// Device collectives posted on the node board so far: the sequence of
    /// the CUDA IPC protocol (`crate::gpu::peer`), advanced by the GPU proxy
    /// thread only. It lives here, not in the proxy, because a proxy ends
    /// when idle and the sequence must continue.
    pub gpu_seq: std::sync::atomic::AtomicU64,
    /// Device sends and receives so far, per peer: (sent to, received
    /// from); the message numbers of the mailbox protocol (`crate::gpu::p2p`).
    pub gpu_p2p: Mutex<Vec<(u64, u64)>>,
    /// The thread inside an operation on this communicator.
    pub owner: owner::Owner,
    /// The unique id `ncclCommGetUniqueId` issued for a grow, until a grow
    /// consumes it.
    pub grow_uid: Mutex<grow::GrowUid>,
    /// Set when `ncclCommFinalize` starts: no new operations.
    pub finalized: AtomicBool,
    /// A nonblocking communicator's finalize, running on a helper thread
    /// (joined by destroy).
    pub finalizer: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl Comm {
    /// A communicator description with no transports attached yet.
    pub fn new(nranks: usize, rank: usize) -> Self {
        Self {
            nranks,
            rank,
            cuda_device: -1,
            redops: Mutex::new(RedOpTable::default()),
            async_error: AtomicI32::new(0),
            revoked: AtomicBool::new(false),
            suspended: AtomicBool::new(false),
            registrations: Mutex::new(HashMap::new()),
            engine: once_cell::sync::OnceCell::new(),
            failure: Mutex::new(None),
            failed: AtomicBool::new(false),
            gpu_seq: std::sync::atomic::AtomicU64::new(0),
            gpu_p2p: Mutex::new(vec![(0, 0); nranks]),
            owner: owner::Owner::default(),
            grow_uid: Mutex::new(grow::GrowUid::default()),
            finalized: AtomicBool::new(false),
            finalizer: Mutex::new(None),
        }
    }

    /// The engine, or an error for comms without one.
    pub fn engine(&self) -> Result<&engine::Engine> {
        self.engine.get().ok_or_else(|| {
            Error::usage(
                "the communicator is not initialised yet (nonblocking init in progress or failed)",
            )
        })
    }

    /// Records why an operation failed part-way (the first reason stays).
    pub fn record_failure(&self, why: impl FnOnce() -> String) {
        self.failure.lock().get_or_insert_with(why);
        self.failed.store(true, Ordering::Release);
    }

    /// "communicator 0123… (\"name\") (rank 2 of 4)", for messages.
    pub fn describe(&self) -> String {
        match self.engine.get() {
            Some(e) => format!(
                "{} (rank {} of {})",
                e.settings
                    .label(e.comm_hash)
                    .replacen("comm", "communicator", 1),
                self.rank,
                self.nranks
            ),
            None => format!("communicator (rank {} of {})", self.rank, self.nranks),
        }
    }

    /// Whether an operation failed part-way (see [`Comm::record_failure`]).
    pub fn has_failed(&self) -> bool {
        self.failed.load(Ordering::Acquire)
    }

    /// Fails unless the comm accepts new operations.
    #[inline]
    pub fn check_usable(&self) -> Result<()> {
        if self.failed.load(Ordering::Acquire)
            || self.revoked.load(Ordering::Acquire)
            || self.finalized.load(Ordering::Acquire)
            || self.suspended.load(Ordering::Acquire)
        {
            return Err(self.unusable());
        }
        Ok(())
    }

    /// Why [`Comm::check_usable`] refused the communicator.
    #[cold]
    #[inline(never)]
    fn unusable(&self) -> Error {
        if self.failed.load(Ordering::Acquire) {
            let why = self.failure.lock().clone().unwrap_or_default();
            return Error::Remote(
                format!("an earlier operation failed ({why}); the communicator must be aborted")
                    .into(),
            );
        }
        if self.revoked.load(Ordering::Acquire) {
            return Error::usage("the communicator was revoked or aborted");
        }
        if self.finalized.load(Ordering::Acquire) {
            return Error::usage("the communicator was finalized; it can only be destroyed");
        }
        // Suspended (or resumed since the check: the call is refused all
        // the same, as it would have been a moment earlier).
        Error::usage("the communicator is suspended (call ncclCommResume)")
    }
}
