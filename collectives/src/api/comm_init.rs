//! Unique ids and communicator creation: `ncclGetUniqueId`,
//! `ncclCommInitRank[Config]`, `ncclCommInitAll`, `ncclCommInitRankScalable`,
//! `ncclCommGetUniqueId`, `ncclCommSplit`, `ncclCommShrink`, `ncclCommGrow`.
//!
//! Arguments are checked fully; creation itself needs the bootstrap of the
//! engine and is gated by [`unavailable`] until it lands.

use std::collections::HashSet;
use std::ffi::c_int;

use hetccl_abi::{
    ncclComm_t, ncclConfig_t, ncclResult_t, ncclUniqueId, NCCL_SHRINK_ABORT, NCCL_SPLIT_NOCOLOR,
};

use super::check;
use super::config_read::read_comm_config;
use super::engine_gate::unavailable;
use super::guard::guard;
use crate::comm::handle;
use crate::error::{Error, Result};
use crate::export;

/// The most ranks one communicator may have.
pub const MAX_RANKS: i32 = 1 << 20;

fn check_nranks(nranks: i32) -> Result<()> {
    if !(1..=MAX_RANKS).contains(&nranks) {
        return Err(Error::arg(format!(
            "nranks {nranks} is not in [1, {MAX_RANKS}]"
        )));
    }
    Ok(())
}

export! {
    /// Creates a unique id naming a new communicator's rendezvous point.
    fn ncclGetUniqueId / pncclGetUniqueId(unique_id: *mut ncclUniqueId) -> ncclResult_t {
        guard("ncclGetUniqueId", || {
            check::non_null(unique_id, "uniqueId")?;
            Err(unavailable("ncclGetUniqueId (bootstrap)"))
        })
    }
}

unsafe fn init_rank(
    name: &'static str,
    comm: *mut ncclComm_t,
    nranks: c_int,
    rank: c_int,
    config: *mut ncclConfig_t,
) -> ncclResult_t {
    guard(name, || {
        check::non_null(comm, "comm")?;
        check_nranks(nranks)?;
        check::rank_in(rank, nranks, "rank")?;
        // SAFETY: NULL or a caller-provided ncclConfig_t.
        let _cfg = unsafe { read_comm_config(config)? };
        Err(unavailable(name))
    })
}

export! {
    /// Creates this rank's communicator of `nranks` ranks named by `comm_id`.
    fn ncclCommInitRank / pncclCommInitRank(comm: *mut ncclComm_t, nranks: c_int,
        comm_id: ncclUniqueId, rank: c_int) -> ncclResult_t {
        let _ = comm_id;
        unsafe { init_rank("ncclCommInitRank", comm, nranks, rank, std::ptr::null_mut()) }
    }
}

export! {
    /// [`ncclCommInitRank`] with a config (blocking or not, name, ...).
    fn ncclCommInitRankConfig / pncclCommInitRankConfig(comm: *mut ncclComm_t, nranks: c_int,
        comm_id: ncclUniqueId, rank: c_int, config: *mut ncclConfig_t) -> ncclResult_t {
        let _ = comm_id;
        unsafe { init_rank("ncclCommInitRankConfig", comm, nranks, rank, config) }
    }
}

export! {
    /// Creates `ndev` communicators in this process, one per listed device.
    fn ncclCommInitAll / pncclCommInitAll(comms: *mut ncclComm_t, ndev: c_int,
        devlist: *const c_int) -> ncclResult_t {
        guard("ncclCommInitAll", || {
            check::non_null(comms, "comms")?;
            check_nranks(ndev)?;
            let _ = devlist; // NULL means devices 0..ndev
            Err(unavailable("ncclCommInitAll"))
        })
    }
}

export! {
    /// Creates this rank's communicator from `n_id` unique ids (several roots).
    fn ncclCommInitRankScalable / pncclCommInitRankScalable(newcomm: *mut ncclComm_t, nranks: c_int,
        myrank: c_int, n_id: c_int, comm_ids: *mut ncclUniqueId, config: *mut ncclConfig_t) -> ncclResult_t {
        guard("ncclCommInitRankScalable", || {
            check::non_null(newcomm, "newcomm")?;
            check_nranks(nranks)?;
            check::rank_in(myrank, nranks, "myrank")?;
            if n_id < 1 || n_id > nranks {
                return Err(Error::arg(format!("nId {n_id} is not in [1, nranks={nranks}]")));
            }
            check::non_null(comm_ids, "commIds")?;
            // SAFETY: NULL or a caller-provided ncclConfig_t.
            let _cfg = unsafe { read_comm_config(config)? };
            Err(unavailable("ncclCommInitRankScalable"))
        })
    }
}

export! {
    /// Writes the unique id a communicator was created from.
    fn ncclCommGetUniqueId / pncclCommGetUniqueId(comm: ncclComm_t, unique_id: *mut ncclUniqueId) -> ncclResult_t {
        guard("ncclCommGetUniqueId", || {
            handle::lookup(comm)?;
            check::non_null(unique_id, "uniqueId")?;
            Err(unavailable("ncclCommGetUniqueId"))
        })
    }
}

export! {
    /// Splits `comm` by `color`, ordering each child by `key`.
    fn ncclCommSplit / pncclCommSplit(comm: ncclComm_t, color: c_int, key: c_int,
        newcomm: *mut ncclComm_t, config: *mut ncclConfig_t) -> ncclResult_t {
        guard("ncclCommSplit", || {
            let c = handle::lookup(comm)?;
            c.check_usable()?;
            check::non_null(newcomm, "newcomm")?;
            if color < NCCL_SPLIT_NOCOLOR {
                return Err(Error::arg(format!("color {color} must be >= 0 or NCCL_SPLIT_NOCOLOR")));
            }
            let _ = key;
            // SAFETY: NULL or a caller-provided ncclConfig_t.
            let _cfg = unsafe { read_comm_config(config)? };
            Err(unavailable("ncclCommSplit"))
        })
    }
}

export! {
    /// Makes a communicator of the ranks of `comm` not in the exclude list.
    fn ncclCommShrink / pncclCommShrink(comm: ncclComm_t, exclude: *mut c_int, exclude_count: c_int,
        newcomm: *mut ncclComm_t, config: *mut ncclConfig_t, flags: c_int) -> ncclResult_t {
        guard("ncclCommShrink", || {
            let c = handle::lookup(comm)?;
            check::non_null(newcomm, "newcomm")?;
            if flags & !NCCL_SHRINK_ABORT != 0 {
                return Err(Error::arg(format!("unknown shrink flags {flags:#x}")));
            }
            let n = c.nranks as i32;
            if exclude_count < 0 || exclude_count >= n {
                return Err(Error::arg(format!("excludeRanksCount {exclude_count} is not in [0, {n})")));
            }
            if exclude_count > 0 {
                check::non_null(exclude, "excludeRanksList")?;
                // SAFETY: non-NULL, and the caller passes exclude_count ints.
                let list = unsafe { std::slice::from_raw_parts(exclude, exclude_count as usize) };
                let mut seen = HashSet::new();
                for &r in list {
                    check::rank_in(r, n, "excluded rank")?;
                    if !seen.insert(r) {
                        return Err(Error::arg(format!("rank {r} is excluded twice")));
                    }
                }
            }
            // SAFETY: NULL or a caller-provided ncclConfig_t.
            let _cfg = unsafe { read_comm_config(config)? };
            Err(unavailable("ncclCommShrink"))
        })
    }
}

export! {
    /// Grows a communicator by new ranks joining through `unique_id`.
    fn ncclCommGrow / pncclCommGrow(comm: ncclComm_t, nranks: c_int, unique_id: *const ncclUniqueId,
        rank: c_int, newcomm: *mut ncclComm_t, config: *mut ncclConfig_t) -> ncclResult_t {
        guard("ncclCommGrow", || {
            if !comm.is_null() {
                handle::lookup(comm)?;
            }
            check::non_null(newcomm, "newcomm")?;
            check_nranks(nranks)?;
            check::rank_in(rank, nranks, "rank")?;
            check::non_null(unique_id, "uniqueId")?;
            // SAFETY: NULL or a caller-provided ncclConfig_t.
            let _cfg = unsafe { read_comm_config(config)? };
            Err(unavailable("ncclCommGrow"))
        })
    }
}
