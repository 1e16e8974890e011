//! Unique ids and communicator creation: `ncclGetUniqueId`,
//! `ncclCommInitRank[Config]`, `ncclCommInitAll`, `ncclCommInitRankScalable`,
//! `ncclCommGetUniqueId`, `ncclCommSplit`, `ncclCommShrink`, `ncclCommGrow`.
//!
//! Arguments are checked fully before anything is created.

use std::collections::HashSet;
use std::ffi::c_int;

use hetccl_abi::{
    ncclComm_t, ncclConfig_t, ncclResult_t, ncclUniqueId, NCCL_SHRINK_ABORT, NCCL_SPLIT_NOCOLOR,
};

use std::sync::atomic::Ordering;
use std::sync::Arc;

use hetccl_abi::NcclResult;

use super::check;
use super::config_read::{read_comm_config, CommConfig};
use super::guard::guard;
use crate::bootstrap::id::UniqueId;
use crate::bootstrap::{self, root};
use crate::comm::{grow, handle, init, split, Comm};
use crate::error::{Error, Result};
use crate::export;
use crate::launch;
use crate::user_ptr::UserPtr;

/// The id for `NCCL_COMM_ID=host:port`: every rank derives the same id from
/// the variable, so its secret is only as secret as the variable (set
/// HETCCL_COMM_SECRET as well to make it unguessable).
fn fixed_id(spec: &str) -> Result<UniqueId> {
    use sha2::{Digest, Sha256};
    let root = std::net::ToSocketAddrs::to_socket_addrs(spec)
        .ok()
        .and_then(|mut a| a.next())
        .ok_or_else(|| Error::arg(format!("NCCL_COMM_ID={spec} is not host:port")))?;
    let mut h = Sha256::new();
    h.update(b"hetccl-fixed-id");
    h.update(spec.as_bytes());
    if let Some(s) = &hetccl_core::config::get().comm_secret {
        h.update(s.0.as_bytes());
    }
    Ok(UniqueId {
        root,
        secret: h.finalize().into(),
    })
}

/// With NCCL_COMM_ID, rank 0 runs the root at the fixed address.
fn start_fixed_root(id: &UniqueId, rank: usize) -> Result<()> {
    if rank != 0 || hetccl_core::config::get().comm_id.is_none() {
        return Ok(());
    }
    let l = std::net::TcpListener::bind(id.root)
        .map_err(|e| Error::System(format!("NCCL_COMM_ID: bind {}: {e}", id.root).into()))?;
    l.set_nonblocking(true)?;
    root::spawn(l, id.secret, process_params().deadline())
}

/// The bootstrap settings of ids made outside a communicator (from the
/// process configuration).
fn process_params() -> bootstrap::Params {
    let cfg = hetccl_core::config::get();
    let timeout = if cfg.timeout_s.is_finite() && cfg.timeout_s > 0.0 {
        std::time::Duration::from_secs_f64(cfg.timeout_s)
    } else {
        std::time::Duration::from_secs(300)
    };
    let filter = cfg.socket_iface_filter();
    let ip = nccl_net_plugin::iface::discover_with(filter.as_ref(), cfg.socket_family)
        .first()
        .map_or(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), |d| {
            d.addr
        });
    bootstrap::Params {
        ip,
        timeout,
        ..Default::default()
    }
}

fn decode_id(raw: &ncclUniqueId) -> Result<UniqueId> {
    UniqueId::decode(raw)
}

/// Creates a communicator and writes its handle to `out`, blocking or not.
///
/// # Safety
/// `out` must be valid for writes until the call (or, in a group, the
/// group) ends.
unsafe fn create(
    out: *mut ncclComm_t,
    id: UniqueId,
    nranks: usize,
    rank: usize,
    cfg: CommConfig,
) -> Result<()> {
    start_fixed_root(&id, rank)?;
    if !cfg.blocking {
        // Nonblocking: the handle exists at once; the engine comes later.
        let comm = Arc::new(Comm::new(nranks, rank));
        comm.async_error
            .store(NcclResult::InProgress.raw(), Ordering::Release);
        let h = handle::register(comm.clone());
        // SAFETY: per this function's contract.
        unsafe { *out = h };
        std::thread::Builder::new()
            .name("hetccl-init".into())
            .spawn(move || {
                let code = match init::init_engine(&comm, &id, cfg) {
                    Ok(()) => NcclResult::Success.raw(),
                    Err(e) => {
                        super::guard::set_last_error(&format!("nonblocking init: {e}"));
                        e.code().raw()
                    }
                };
                comm.async_error.store(code, Ordering::Release);
            })
            .map_err(|e| Error::System(format!("spawn: {e}").into()))?;
        return Err(Error::InProgress);
    }
    // The caller's output slot, valid until the group ends.
    let o = UserPtr::new(out);
    launch::submit_init(Box::new(move || {
        let comm = init::init_rank(&id, nranks, rank, cfg)?;
        // SAFETY: per this function's contract, `out` is a writable
        // ncclComm_t slot until the group ends.
        unsafe { *o.get().cast::<ncclComm_t>() = handle::register(comm) };
        Ok(())
    }))
}

/// The most ranks one communicator may have.
pub const MAX_RANKS: i32 = 1 << 20;
/// The most ranks `ncclCommInitAll` creates in one process (one thread each
/// while they rendezvous).
pub const MAX_INIT_ALL: i32 = 1024;

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
            let id = match &hetccl_core::config::get().comm_id {
                Some(spec) => fixed_id(spec)?,
                None => bootstrap::new_root(process_params())?,
            };
            // SAFETY: checked non-NULL.
            unsafe { *unique_id = id.encode() };
            Ok(())
        })
    }
}

unsafe fn init_rank(
    name: &'static str,
    comm: *mut ncclComm_t,
    nranks: c_int,
    id: &ncclUniqueId,
    rank: c_int,
    config: *mut ncclConfig_t,
) -> ncclResult_t {
    guard(name, || {
        check::non_null(comm, "comm")?;
        check_nranks(nranks)?;
        check::rank_in(rank, nranks, "rank")?;
        // SAFETY: NULL or a caller-provided ncclConfig_t.
        let cfg = unsafe { read_comm_config(config)? };
        let id = decode_id(id)?;
        // SAFETY: `comm` is the caller's output slot.
        unsafe { create(comm, id, nranks as usize, rank as usize, cfg) }
    })
}

export! {
    /// Creates this rank's communicator of `nranks` ranks named by `comm_id`.
    fn ncclCommInitRank / pncclCommInitRank(comm: *mut ncclComm_t, nranks: c_int,
        comm_id: ncclUniqueId, rank: c_int) -> ncclResult_t {
        // SAFETY: the caller's arguments, forwarded under this function's contract (NCCL's).
        unsafe { init_rank("ncclCommInitRank", comm, nranks, &comm_id, rank, std::ptr::null_mut()) }
    }
}

export! {
    /// [`ncclCommInitRank`] with a config (blocking or not, name, ...).
    fn ncclCommInitRankConfig / pncclCommInitRankConfig(comm: *mut ncclComm_t, nranks: c_int,
        comm_id: ncclUniqueId, rank: c_int, config: *mut ncclConfig_t) -> ncclResult_t {
        // SAFETY: the caller's arguments, forwarded under this function's contract (NCCL's).
        unsafe { init_rank("ncclCommInitRankConfig", comm, nranks, &comm_id, rank, config) }
    }
}

export! {
    /// Creates `ndev` communicators in this process, one per listed device.
    fn ncclCommInitAll / pncclCommInitAll(comms: *mut ncclComm_t, ndev: c_int,
        devlist: *const c_int) -> ncclResult_t {
        guard("ncclCommInitAll", || {
            check::non_null(comms, "comms")?;
            check_nranks(ndev)?;
            if ndev > MAX_INIT_ALL {
                return Err(Error::arg(format!(
                    "ndev {ndev} is more than the {MAX_INIT_ALL} ranks one process may create"
                )));
            }
            let _ = devlist; // host ranks: the device list only names them
            let n = ndev as usize;
            let id = bootstrap::new_root(process_params())?;
            let made: Vec<Result<Arc<Comm>>> = std::thread::scope(|s| {
                let hs: Vec<_> = (0..n)
                    .map(|r| {
                        let id = id.clone();
                        s.spawn(move || init::init_rank(&id, n, r, CommConfig::default()))
                    })
                    .collect();
                hs.into_iter()
                    .map(|h| h.join().unwrap_or_else(|_| Err(Error::Internal("init thread panicked".into()))))
                    .collect()
            });
            let made = made.into_iter().collect::<Result<Vec<_>>>()?;
            for (r, c) in made.into_iter().enumerate() {
                // SAFETY: the caller passes an array of ndev handles.
                unsafe { *comms.add(r) = handle::register(c) };
            }
            Ok(())
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
            let cfg = unsafe { read_comm_config(config)? };
            // Every id is checked; the rendezvous goes through the first
            // one (see docs/api-status.md).
            // SAFETY: the caller passes n_id ids.
            let ids = unsafe { std::slice::from_raw_parts(comm_ids, n_id as usize) };
            let decoded = ids.iter().map(decode_id).collect::<Result<Vec<_>>>()?;
            // SAFETY: `newcomm` is the caller's output slot.
            unsafe { create(newcomm, decoded[0].clone(), nranks as usize, myrank as usize, cfg) }
        })
    }
}

export! {
    /// Writes the unique id a communicator was created from.
    fn ncclCommGetUniqueId / pncclCommGetUniqueId(comm: ncclComm_t, unique_id: *mut ncclUniqueId) -> ncclResult_t {
        guard("ncclCommGetUniqueId", || {
            let c = handle::lookup(comm)?;
            check::non_null(unique_id, "uniqueId")?;
            let id = grow::issue_uid(&c)?.encode();
            // SAFETY: checked non-NULL.
            unsafe { *unique_id = id };
            Ok(())
        })
    }
}

export! {
    /// Splits `comm` by `color`, ordering each child by `key`.
    fn ncclCommSplit / pncclCommSplit(comm: ncclComm_t, color: c_int, key: c_int,
        newcomm: *mut ncclComm_t, config: *mut ncclConfig_t) -> ncclResult_t {
        guard("ncclCommSplit", || {
            let c = handle::lookup(comm)?;
            // A revoked communicator may be split (NCCL's contract), once
            // its bootstrap is free again.
            if !c.revoked.load(Ordering::Acquire) {
                c.check_usable()?;
            }
            check::non_null(newcomm, "newcomm")?;
            if color < NCCL_SPLIT_NOCOLOR {
                return Err(Error::arg(format!("color {color} must be >= 0 or NCCL_SPLIT_NOCOLOR")));
            }
            // SAFETY: NULL or a caller-provided ncclConfig_t.
            let cfg = unsafe { read_comm_config(config)? };
            let child = split::split(&c, color, key, cfg)?;
            // SAFETY: checked non-NULL.
            unsafe { *newcomm = child.map_or(std::ptr::null_mut(), handle::register) };
            Ok(())
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
            let mut seen = HashSet::new();
            if exclude_count > 0 {
                check::non_null(exclude, "excludeRanksList")?;
                // SAFETY: non-NULL, and the caller passes exclude_count ints.
                let list = unsafe { std::slice::from_raw_parts(exclude, exclude_count as usize) };
                for &r in list {
                    check::rank_in(r, n, "excluded rank")?;
                    if !seen.insert(r as usize) {
                        return Err(Error::arg(format!("rank {r} is excluded twice")));
                    }
                }
            }
            // SAFETY: NULL or a caller-provided ncclConfig_t.
            let cfg = unsafe { read_comm_config(config)? };
            let excluded: Vec<usize> = seen.into_iter().collect();
            let child = split::shrink(&c, &excluded, flags & NCCL_SHRINK_ABORT != 0, cfg)?;
            // SAFETY: checked non-NULL.
            unsafe { *newcomm = handle::register(child) };
            Ok(())
        })
    }
}

export! {
    /// Grows a communicator by new ranks joining through `unique_id`
    /// (`comm::grow`): existing ranks pass `comm` and rank -1 (the root of
    /// the grow also the id from `ncclCommGetUniqueId`), new ranks pass NULL,
    /// the id and their rank.
    fn ncclCommGrow / pncclCommGrow(comm: ncclComm_t, nranks: c_int, unique_id: *const ncclUniqueId,
        rank: c_int, newcomm: *mut ncclComm_t, config: *mut ncclConfig_t) -> ncclResult_t {
        guard("ncclCommGrow", || {
            check::non_null(newcomm, "newcomm")?;
            check_nranks(nranks)?;
            // SAFETY: NULL or a caller-provided ncclConfig_t.
            let cfg = unsafe { read_comm_config(config)? };
            // SAFETY: NULL or the caller's ncclUniqueId.
            let id = unsafe { unique_id.as_ref() }.map(decode_id).transpose()?;
            if comm.is_null() {
                let Some(id) = id else {
                    return Err(Error::arg("a new rank of ncclCommGrow passes the uniqueId"));
                };
                let rank = check::rank_in(rank, nranks, "rank")?;
                // SAFETY: checked non-NULL; the caller's output slot.
                return unsafe { create(newcomm, id, nranks as usize, rank, cfg) };
            }
            let c = handle::lookup(comm)?;
            c.check_usable()?;
            if rank != -1 {
                return Err(Error::arg(format!(
                    "an existing rank of ncclCommGrow passes rank -1 (it keeps its rank {}), not {rank}",
                    c.rank
                )));
            }
            grow_existing(&c, nranks as usize, id, cfg, newcomm)
        })
    }
}

/// The existing ranks' side of `ncclCommGrow`, blocking or not.
fn grow_existing(
    c: &Arc<Comm>,
    nranks: usize,
    id: Option<UniqueId>,
    cfg: CommConfig,
    out: *mut ncclComm_t,
) -> Result<()> {
    if cfg.blocking {
        let child = grow::grow_existing(c, nranks, id, cfg)?;
        // SAFETY: checked non-NULL by the caller; the caller's output slot.
        unsafe { *out = handle::register(child) };
        return Ok(());
    }
    let child = Arc::new(Comm::new(nranks, c.rank));
    child
        .async_error
        .store(NcclResult::InProgress.raw(), Ordering::Release);
    // SAFETY: as above.
    unsafe { *out = handle::register(child.clone()) };
    let parent = c.clone();
    std::thread::Builder::new()
        .name("hetccl-grow".into())
        .spawn(move || {
            let r = grow::prepare(&parent, nranks, id)
                .and_then(|id| init::init_engine(&child, &id, cfg));
            let code = match r {
                Ok(()) => NcclResult::Success.raw(),
                Err(e) => {
                    super::guard::set_last_error(&format!("nonblocking ncclCommGrow: {e}"));
                    e.code().raw()
                }
            };
            child.async_error.store(code, Ordering::Release);
        })
        .map_err(|e| Error::System(format!("spawn: {e}").into()))?;
    Err(Error::InProgress)
}
