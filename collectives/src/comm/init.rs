//! Creating a communicator: bootstrap, topology, shm arena, verbs and TCP
//! links.
//!
//! Every rank runs the same sequence of bootstrap barriers, so a failure on
//! one rank (say, the shm arena cannot be created) reaches the others as an
//! error or a timeout rather than a hang.

use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use parking_lot::Mutex;

use super::config::CommConfig;
use super::engine::Engine;
use super::settings::Settings;
use super::Comm;
use crate::algo::Topology;
use crate::bootstrap::id::UniqueId;
use crate::bootstrap::{Bootstrap, Params};
use crate::cost::{CostModel, TransportKind};
use crate::error::{Error, Result};
use crate::exec::watch::Watch;
use crate::exec::{Links, NCHAN, P2P_CHAN};
use crate::topo;
use crate::transport::arena::{self, Arena};
use crate::transport::{coalesce, net, shm, verbs, Conn};

/// The data bytes of one shm ring: NCCL_BUFFSIZE split over the channels,
/// a power of two between 64 KiB and 64 MiB.
fn ring_capacity(buffsize: usize) -> usize {
    let per = buffsize / NCHAN;
    per.clamp(64 << 10, 64 << 20).next_power_of_two()
}

/// The bootstrap's part of a communicator's settings.
pub fn bootstrap_params(s: &Settings) -> Params {
    Params {
        ip: s.bootstrap_ip(),
        timeout: s.timeout,
        coalesce: s.coalesce_bytes,
        checks: s.check,
        compress: s.compress,
    }
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
    let mut settings = Settings::new(hetccl_core::config::get(), &config)?;
    crate::telemetry::clock::init();
    let mut bs = Bootstrap::join(
        id,
        rank,
        nranks,
        topo::host_hash(settings.host_id.as_deref()),
        bootstrap_params(&settings),
    )?;
    // The status service's listener for the other ranks, published with
    // the clock probe (every rank takes part, with or without a service).
    let status_listener = settings.status_port.and_then(|_| {
        crate::telemetry::status::Listener::bind(settings.bootstrap_ip())
            .map_err(|e| {
                tracing::warn!(target: "hetccl::INIT",
                    "rank {rank}: status: cannot listen: {e}; the status service is off");
            })
            .ok()
    });
    let card = status_listener
        .as_ref()
        .map(crate::telemetry::status::Listener::card)
        .unwrap_or_default();
    let (sync, status_cards) = bs.clock_sync(crate::telemetry::clock::now_unix_ns, &card)?;
    // Fingerprints change every plan's messages: the ranks must agree.
    if settings.check && bs.cards.iter().any(|c| !c.checks) {
        tracing::warn!(target: "hetccl::INIT",
            "rank {rank}: HETCCL_CHECK is off on some ranks of this communicator: collective \
             fingerprints are off on every rank");
        settings.check = false;
    }
    // Compression changes message sizes between nodes: the ranks must agree.
    if bs.cards.iter().any(|c| c.compress != settings.compress) {
        if rank == 0 {
            tracing::warn!(target: "hetccl::INIT",
                "HETCCL_COMPRESS differs between the ranks of this communicator ({}): \
                 compression is off on every rank",
                bs.cards.iter().map(|c| c.compress.name()).collect::<Vec<_>>().join(","));
        }
        settings.compress = hetccl_core::config::Compression::Off;
    }
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
    // Every rank's RDMA fabric (an all-gather every rank runs): verbs joins
    // two ranks whose ports share one.
    let vparams = verbs::VerbsParams {
        ib: settings.ib.clone(),
        ports: settings.ib_ports.clone(),
        ip: settings.bootstrap_ip(),
    };
    let cross = (0..nranks).any(|p| node_of[p] != node_of[rank]);
    let ib_ports = verbs::local_ports(settings.verbs && cross, &vparams);
    let gdr_recv = crate::transport::gdr::receives_in_place(&ib_ports);
    let (fabrics, gdr_recvs) = verbs::fabrics(&mut bs, &ib_ports, gdr_recv)?;
    // The channel factory: per pair, the nearest-reaching enabled transport
    // (`NCCL_SHM_DISABLE` takes shm out of the running; verbs needs a
    // shared fabric).
    let mut choice: Vec<Option<TransportKind>> = Vec::with_capacity(nranks);
    for p in 0..nranks {
        let t = pair_transport(&topology, &fabrics, settings.shm_disable, rank, p)
            .ok_or_else(|| Error::usage(format!("no enabled transport can reach rank {p}")))?;
        choice.push((p != rank).then_some(t));
    }
    let mut costs = CostModel::default();
    let remote: Vec<TransportKind> = (0..nranks)
        .filter(|&p| node_of[p] != node_of[rank])
        .filter_map(|p| choice[p])
        .collect();
    if !remote.is_empty() && remote.iter().all(|&t| t == TransportKind::Verbs) {
        if let Some(c) = TransportKind::Verbs.cross_node_cost() {
            costs.cross_node = c;
        }
    }
    let use_shm = local.iter().any(|&p| choice[p] == Some(TransportKind::Shm));
    let arena = if use_shm {
        Some(Arc::new(setup_arena(
            &mut bs,
            ring_capacity(settings.buffsize),
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
            if choice[peer] == Some(TransportKind::Shm) {
                peers[peer] = Some(
                    (0..NCHAN)
                        .map(|c| shm::connect(a, me_local, li, c))
                        .collect(),
                );
            }
        }
    }
    let tcp_peers: Vec<usize> = (0..nranks)
        .filter(|&p| choice[p] == Some(TransportKind::Tcp))
        .collect();
    let net_params = net::NetParams {
        ifname: settings.socket_ifname.clone(),
        family: settings.socket_family,
        tcp: settings.tcp.clone(),
    };
    for (p, conns) in net::setup(&mut bs, &tcp_peers, NCHAN, &net_params)? {
        peers[p] = Some(conns);
    }
    let verbs_peers: Vec<usize> = (0..nranks)
        .filter(|&p| choice[p] == Some(TransportKind::Verbs))
        .collect();
    let mut gdr_ports: Vec<Option<nccl_net_plugin::ib::IbPort>> = vec![None; nranks];
    for (p, conns, port) in verbs::setup(
        &mut bs,
        &verbs_peers,
        &ib_ports,
        NCHAN,
        &vparams,
        &gdr_recvs,
    )? {
        peers[p] = Some(conns);
        gdr_ports[p] = Some(port);
    }
    let gdr = crate::transport::gdr::Paths::new(
        gdr_ports,
        gdr_recv && !verbs_peers.is_empty(),
        settings.ib.clone(),
    );
    // Coalescing changes the P2P channel's wire format: the ranks agree.
    let limits = coalesce::agree(&bs.cards, settings.coalesce_bytes, rank);
    if limits.is_none() {
        settings.coalesce_bytes = 0;
    }
    for (p, conns) in peers.iter_mut().enumerate() {
        if let (Some(l), Some(c)) = (limits, conns.as_mut()) {
            if coalesce::applies(c[P2P_CHAN].transport) {
                let plain = c.remove(P2P_CHAN);
                c.insert(P2P_CHAN, coalesce::wrap(plain, p, l));
            }
        }
    }
    let stop: Arc<crate::exec::stop::Stop> = Arc::default();
    let hw = topo::host::host_info();
    if local.len() > hw.pus {
        settings.patience.spin = std::time::Duration::ZERO;
    }
    // Single-copy workers: one per processing unit unless configured.
    let workers = match settings.copy_workers {
        0 => hw.pus,
        w => w,
    }
    .clamp(1, local.len().max(1));
    // The direct paths need every rank on this node, joined by shm; the
    // board is set up before the last barrier so peers see it afterwards.
    let direct = match &arena {
        Some(a)
            if local.len() == nranks
                && (0..nranks).all(|p| p == rank || choice[p] == Some(TransportKind::Shm)) =>
        {
            Some(crate::intranode::Node::new(
                a.clone(),
                me_local,
                stop.clone(),
                crate::intranode::Options {
                    patience: settings.patience,
                    copy_min: settings.copy_min_bytes,
                    workers,
                    own_cpus: local.len() <= hw.pus,
                    comm_hash,
                    label: settings.label(comm_hash),
                },
            ))
        }
        _ => None,
    };
    // The node's progress board (exec/watch.rs): mapped before the last
    // barrier, its name removed after it.
    let on_node: Vec<bool> = (0..nranks).map(|r| node_of[r] == node_of[rank]).collect();
    let doing = status_listener
        .as_ref()
        .map(|_| Arc::new(crate::exec::watch::Doing::default()));
    let mut watch = Watch::open(comm_hash, node_of[rank], rank, on_node);
    if let Some(d) = &doing {
        watch = watch.with_doing(d.clone());
    }
    let last = bs.barrier();
    Watch::unlink(comm_hash, node_of[rank]);
    last?;
    let bell = arena.as_ref().map(|a| a.bell(me_local));
    let metrics = Arc::new(crate::telemetry::Metrics::new(rank, &choice));
    let links = Links {
        rank,
        label: settings.label(comm_hash),
        peers,
        bell,
        stop: stop.clone(),
        watch,
        metrics: metrics.clone(),
        cross_node: (0..nranks).map(|r| node_of[r] != node_of[rank]).collect(),
        bufs: Default::default(),
    };
    let kinds: Vec<&str> = links
        .peers
        .iter()
        .map(|p| p.as_ref().map_or("self", |c| c[0].transport.name()))
        .collect();
    tracing::info!(target: "hetccl::INIT",
        "{} rank {rank}/{nranks}: nodes {:?}, links {:?}", settings.label(comm_hash), node_of, kinds);
    tracing::info!(target: "hetccl::INIT",
        "rank {rank}: {} local ranks on {} PUs / {} cores / {} NUMA nodes ({}); spin {:?}",
        local.len(), hw.pus, hw.cores, hw.numa_nodes, hw.source, settings.patience.spin);
    // Rank 0's table layout and (HETCCL_TUNE=init) calibrated model, for
    // every rank: the links are up, every rank runs the same exchanges.
    let transports = || transports_used(&topology, &fabrics, settings.shm_disable);
    let (costs, tuning) = crate::tune::setup(
        &mut bs,
        &crate::tune::Inputs {
            settings: &settings,
            topo: &topology,
            links: &links,
            comm_hash,
            label: settings.label(comm_hash),
            transports: &transports,
        },
        costs,
    )?;
    let engine = Engine {
        id: id.clone(),
        comm_hash,
        config,
        bootstrap: Mutex::new(bs),
        topo: topology,
        links,
        arena,
        exec_gate: Default::default(),
        stop,
        seq: AtomicU64::new(0),
        coll_seq: AtomicU64::new(0),
        plans: Mutex::new(Default::default()),
        scratch_pool: Mutex::new(Vec::new()),
        intranode: direct,
        costs,
        tuning,
        control: crate::control::Control::new(&settings),
        settings,
        status: doing.clone(),
        gdr,
    };
    let observe = (
        engine.settings.metrics_file.clone(),
        engine.settings.trace_file.clone(),
    );
    let interval = engine.settings.metrics_interval;
    let status_port = engine.settings.status_port;
    let label = engine.settings.label(comm_hash);
    let pids: Vec<u32> = engine
        .bootstrap
        .lock()
        .cards
        .iter()
        .map(|c| c.pid)
        .collect();
    let max_events = engine.settings.trace_max_events;
    let meta = crate::telemetry::render::Meta {
        comm_hash,
        comm_name: engine.settings.comm_name.clone(),
        nranks,
    };
    comm.engine
        .set(engine)
        .map_err(|_| Error::Internal("communicator initialised twice".into()))?;
    if let Some(t) = &observe.1 {
        crate::telemetry::trace::start(t, rank, comm_hash, max_events, sync);
    }
    if let Some(m) = &observe.0 {
        crate::telemetry::writer::register(metrics, meta, m, interval);
    }
    if let (Some(l), Some(d), Some(port)) = (status_listener, doing, status_port) {
        use crate::telemetry::status;
        let peers = status_cards
            .iter()
            .zip(&pids)
            .map(|(c, &pid)| status::parse_card(c, pid))
            .collect();
        let entry = status::Entry::new(label, rank, peers, id.secret, d);
        status::register(Arc::new(entry), l, port);
    }
    Ok(())
}

/// The node leader creates the arena; everyone maps it; the leader unlinks
/// it once all have. Two barriers, as on ranks without an arena.
fn setup_arena(
    bs: &mut Bootstrap,
    cap: usize,
    comm_hash: u64,
    local: &[usize],
    node: usize,
) -> Result<Arena> {
    let leader = local[0];
    let path = arena::name(comm_hash, node, bs.cards[leader].pid);
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

/// The transport joining ranks `a` and `b`: the nearest-reaching enabled
/// one (`NCCL_SHM_DISABLE` takes shm out of the running; verbs needs a
/// shared fabric); `None` if none reaches.
fn pair_transport(
    topology: &Topology,
    fabrics: &[Option<[u8; 9]>],
    shm_disable: bool,
    a: usize,
    b: usize,
) -> Option<TransportKind> {
    let class = CostModel::class(topology, a as u32, b as u32);
    let same_fabric = fabrics[a].is_some() && fabrics[a] == fabrics[b];
    let enabled = |t: TransportKind| match t {
        TransportKind::Shm => !shm_disable,
        TransportKind::Verbs => same_fabric,
        TransportKind::Tcp => true,
    };
    TransportKind::for_class(class, enabled)
}

/// The transports the communicator's links use, over every pair of ranks
/// (with this rank's `NCCL_SHM_DISABLE`, which init requires to agree).
/// Ranks with the same node, process and fabric are alike, so one pair per
/// combination of such groups (and one inside each group) is enough.
fn transports_used(
    topology: &Topology,
    fabrics: &[Option<[u8; 9]>],
    shm_disable: bool,
) -> Vec<TransportKind> {
    // The first two ranks of each (node, process, fabric) group.
    type Key = (u32, Option<u32>, Option<[u8; 9]>);
    let mut groups: Vec<(Key, usize, Option<usize>)> = Vec::new();
    let mut index = std::collections::HashMap::new();
    for r in 0..topology.nranks() {
        let key = (
            topology.node(r),
            topology.process(r),
            fabrics.get(r as usize).copied().flatten(),
        );
        match index.get(&key) {
            Some(&g) => {
                let e: &mut (_, usize, Option<usize>) = &mut groups[g];
                e.2.get_or_insert(r as usize);
            }
            None => {
                index.insert(key, groups.len());
                groups.push((key, r as usize, None));
            }
        }
    }
    let mut used: Vec<TransportKind> = Vec::new();
    for (i, g) in groups.iter().enumerate() {
        let pairs = g.2.into_iter().chain(groups[i + 1..].iter().map(|h| h.1));
        for other in pairs {
            match pair_transport(topology, fabrics, shm_disable, g.1, other) {
                Some(t) if !used.contains(&t) => used.push(t),
                _ => {}
            }
        }
    }
    crate::tune::table::sorted(&used)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_transport_set_covers_every_pair() {
        use TransportKind::{Shm, Tcp, Verbs};
        let two_by_two = Topology::from_nodes(vec![0, 0, 1, 1]).with_processes(vec![0, 1, 2, 3]);
        let none = [None; 4];
        assert_eq!(transports_used(&two_by_two, &none, false), vec![Shm, Tcp]);
        assert_eq!(transports_used(&two_by_two, &none, true), vec![Tcp]);
        let fab = [Some([1u8; 9]); 4];
        assert_eq!(transports_used(&two_by_two, &fab, false), vec![Shm, Verbs]);
        // Only ranks 2 and 3 share a fabric: verbs for that pair, TCP for
        // the other cross-node pairs.
        let some = [None, None, Some([1u8; 9]), Some([1u8; 9])];
        let four_nodes = Topology::from_nodes(vec![0, 1, 2, 3]);
        assert_eq!(transports_used(&four_nodes, &some, false), vec![Tcp, Verbs]);
        // Rank 0 alone on its node: the others' shm counts too.
        let uneven = Topology::from_nodes(vec![0, 1, 1]).with_processes(vec![0, 1, 2]);
        assert_eq!(transports_used(&uneven, &[None; 3], false), vec![Shm, Tcp]);
        // Threads of one process, one node.
        let threads = Topology::flat(3).with_processes(vec![7, 7, 7]);
        assert_eq!(transports_used(&threads, &[None; 3], false), vec![Shm]);
        assert!(transports_used(&Topology::flat(1), &[None], false).is_empty());
    }
}
