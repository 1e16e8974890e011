//! Creating a communicator: bootstrap, topology, shm arena and TCP links.
//!
//! Every rank runs the same sequence of bootstrap barriers, so a failure on
//! one rank (say, the shm arena cannot be created) reaches the others as an
//! error or a timeout rather than a hang.

use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::Arc;
use std::time::Instant;

use parking_lot::Mutex;

use super::engine::Engine;
use super::Comm;
use crate::algo::Topology;
use crate::api::config_read::CommConfig;
use crate::bootstrap::id::UniqueId;
use crate::bootstrap::{self, Bootstrap, Purpose};
use crate::error::{Error, Result};
use crate::exec::{Links, NCHAN};
use crate::topo;
use crate::transport::arena::{self, Arena};
use crate::transport::{shm, tcp, Conn};

/// The data bytes of one shm ring: NCCL_BUFFSIZE split over the channels,
/// a power of two between 64 KiB and 64 MiB.
fn ring_capacity() -> usize {
    let per = hetccl_core::config::get().buffsize / NCHAN;
    per.clamp(64 << 10, 64 << 20).next_power_of_two()
}

/// Creates this rank's communicator.
pub fn init_rank(
    id: &UniqueId,
    nranks: usize,
    rank: usize,
    config: CommConfig,
) -> Result<Arc<Comm>> {
    let comm = Arc::new(Comm::new(nranks, rank));
    init_engine(&comm, id, config)?;
    Ok(comm)
}

/// Builds the engine of `comm` (created with `Comm::new`).
pub fn init_engine(comm: &Comm, id: &UniqueId, config: CommConfig) -> Result<()> {
    let (nranks, rank) = (comm.nranks, comm.rank);
    hetccl_core::obs::print_version_once();
    hetccl_core::config::log_once();
    let cfg = hetccl_core::config::get();
    let mut bs = Bootstrap::join(id, rank, nranks, topo::host_hash())?;
    let hashes: Vec<u64> = bs.cards.iter().map(|c| c.host_hash).collect();
    let node_of = topo::node_of_ranks(&hashes);
    let procs: Vec<u32> = {
        let nonces: Vec<u64> = bs.cards.iter().map(|c| c.proc_nonce).collect();
        topo::node_of_ranks(&nonces)
            .into_iter()
            .map(|p| p as u32)
            .collect()
    };
    let topology =
        Topology::from_nodes(node_of.iter().map(|&n| n as u32).collect()).with_processes(procs);
    let comm_hash = id.comm_hash();
    let local: Vec<usize> = (0..nranks)
        .filter(|&r| node_of[r] == node_of[rank])
        .collect();
    let use_shm = !cfg.shm_disable && local.len() > 1;
    let arena = if use_shm {
        Some(Arc::new(setup_arena(
            &mut bs,
            comm_hash,
            &local,
            node_of[rank],
        )?))
    } else {
        // Keep the barrier sequence identical on every rank.
        bs.barrier()?;
        bs.barrier()?;
        None
    };
    let mut peers: Vec<Option<Vec<Conn>>> = (0..nranks).map(|_| None).collect();
    let me_local = local
        .iter()
        .position(|&r| r == rank)
        .expect("rank is local to itself");
    if let Some(a) = &arena {
        for (li, &peer) in local.iter().enumerate() {
            if peer != rank {
                peers[peer] = Some(
                    (0..NCHAN)
                        .map(|c| shm::connect(a, me_local, li, c))
                        .collect(),
                );
            }
        }
    }
    let tcp_peers: Vec<usize> = (0..nranks)
        .filter(|&p| p != rank && peers[p].is_none())
        .collect();
    for (p, conns) in connect_tcp(&bs, rank, &tcp_peers)? {
        peers[p] = Some(conns);
    }
    bs.barrier()?;
    let aborted = Arc::new(AtomicBool::new(false));
    let bell = arena.as_ref().map(|a| a.bell(me_local));
    let links = Links {
        rank,
        peers,
        bell,
        aborted: aborted.clone(),
    };
    let kinds: Vec<&str> = links
        .peers
        .iter()
        .map(|p| p.as_ref().map_or("self", |c| c[0].transport))
        .collect();
    tracing::info!(target: "hetccl::INIT",
        "comm {comm_hash:016x} rank {rank}/{nranks}: nodes {:?}, links {:?}", node_of, kinds);
    let hw = topo::host::host_info();
    let mut spin = std::time::Duration::from_micros(u64::from(cfg.spin_us));
    if local.len() > hw.pus {
        spin = std::time::Duration::ZERO;
    }
    tracing::info!(target: "hetccl::INIT",
        "rank {rank}: {} local ranks on {} PUs / {} cores / {} NUMA nodes ({}); spin {:?}",
        local.len(), hw.pus, hw.cores, hw.numa_nodes, hw.source, spin);
    let engine = Engine {
        id: id.clone(),
        comm_hash,
        config,
        bootstrap: Mutex::new(bs),
        topo: topology,
        links,
        arena,
        exec_lock: Mutex::new(()),
        aborted,
        seq: AtomicU64::new(0),
        plans: Mutex::new(Default::default()),
        spin,
    };
    comm.engine
        .set(engine)
        .map_err(|_| Error::Internal("communicator initialised twice".into()))
}

/// The node leader creates the arena; everyone maps it; the leader unlinks
/// it once all have. Two barriers, as on ranks without an arena.
fn setup_arena(bs: &mut Bootstrap, comm_hash: u64, local: &[usize], node: usize) -> Result<Arena> {
    let leader = local[0];
    let path = arena::name(comm_hash, node, bs.cards[leader].pid);
    let cap = ring_capacity();
    let mine = if bs.rank == leader {
        Some(Arena::create(&path, local.len(), NCHAN, cap))
    } else {
        None
    };
    bs.barrier()?;
    let arena = match mine {
        Some(a) => a,
        None => Arena::open(&path, local.len(), NCHAN, cap),
    };
    bs.barrier()?;
    if bs.rank == leader {
        Arena::unlink(&path);
    }
    arena
}

/// Opens `NCHAN` authenticated sockets to each peer in `peers`: the lower
/// rank connects, the higher accepts.
fn connect_tcp(bs: &Bootstrap, rank: usize, peers: &[usize]) -> Result<Vec<(usize, Vec<Conn>)>> {
    let dl = bootstrap::deadline();
    let lower: Vec<usize> = peers.iter().copied().filter(|&p| p < rank).collect();
    let higher: Vec<usize> = peers.iter().copied().filter(|&p| p > rank).collect();
    let expected = lower.len() * NCHAN;
    let (accepted, connected) = std::thread::scope(|sc| {
        let acc = sc.spawn(|| accept_all(bs, &lower, expected, dl));
        let con: Result<Vec<(usize, Vec<TcpStream>)>> = higher
            .iter()
            .map(|&p| {
                let socks = (0..NCHAN)
                    .map(|c| bs.connect_to(bs.cards[p].addr, Purpose::Data(c as u32), dl))
                    .collect::<Result<Vec<_>>>()?;
                Ok((p, socks))
            })
            .collect();
        (
            acc.join()
                .unwrap_or_else(|_| Err(Error::Internal("accept thread panicked".into()))),
            con,
        )
    });
    let mut out = Vec::new();
    for (p, socks) in accepted?.into_iter().chain(connected?) {
        let conns = socks
            .into_iter()
            .map(tcp::connect)
            .collect::<Result<Vec<_>>>()?;
        out.push((p, conns));
    }
    Ok(out)
}

fn accept_all(
    bs: &Bootstrap,
    lower: &[usize],
    expected: usize,
    dl: Instant,
) -> Result<Vec<(usize, Vec<TcpStream>)>> {
    let mut slots: Vec<Vec<Option<TcpStream>>> = lower
        .iter()
        .map(|_| (0..NCHAN).map(|_| None).collect())
        .collect();
    for _ in 0..expected {
        let (s, p, r) = bs.accept_any(dl, |p, r| {
            matches!(p, Purpose::Data(c) if (c as usize) < NCHAN) && lower.contains(&r)
        })?;
        let Purpose::Data(c) = p else {
            return Err(Error::Internal("accepted a non-data connection".into()));
        };
        let i = lower.iter().position(|&x| x == r).expect("filtered");
        if slots[i][c as usize].replace(s).is_some() {
            return Err(Error::Remote(format!(
                "rank {r} opened data channel {c} twice"
            )));
        }
    }
    lower
        .iter()
        .zip(slots)
        .map(|(&p, v)| {
            let socks = v
                .into_iter()
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| Error::Internal("missing data socket".into()))?;
            Ok((p, socks))
        })
        .collect()
}
