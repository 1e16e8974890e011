//! Algorithm selection: the cost model's choices, NCCL_ALGO filtering, and
//! the printable table.

use hetccl_collectives::algo::{
    estimate_us, select, selection_table, supported, AlgoFilter, Algorithm, Collective, CostModel,
    LinkClass, Topology,
};

#[test]
fn small_messages_go_direct_large_ones_use_bandwidth_optimal_schedules() {
    let m = CostModel::default();
    let flat8 = Topology::flat(8);
    let all = AlgoFilter::all();
    assert_eq!(
        select(Collective::AllReduce, 8, &flat8, &m, &all),
        Ok(Algorithm::Direct)
    );
    let big = select(Collective::AllReduce, 64 << 20, &flat8, &m, &all).unwrap();
    assert!(
        matches!(big, Algorithm::HalvingDoubling | Algorithm::Ring),
        "{big}"
    );
    // Non-power-of-two: the fold-in makes halving-doubling lose at large sizes.
    assert_eq!(
        select(
            Collective::AllReduce,
            64 << 20,
            &Topology::flat(7),
            &m,
            &all
        ),
        Ok(Algorithm::Ring)
    );
    // Two nodes of four: the hierarchical schedule keeps most bytes on the node.
    let two = Topology::from_nodes(vec![0, 0, 0, 0, 1, 1, 1, 1]);
    assert_eq!(
        select(Collective::AllReduce, 64 << 20, &two, &m, &all),
        Ok(Algorithm::Hierarchical)
    );
    assert_eq!(
        select(Collective::Broadcast, 64 << 20, &flat8, &m, &all),
        Ok(Algorithm::Ring)
    );
    assert_eq!(
        select(Collective::AlltoAll, 64 << 20, &flat8, &m, &all),
        Ok(Algorithm::Pairwise)
    );
    assert_eq!(
        select(Collective::Gather, 1, &flat8, &m, &all),
        Ok(Algorithm::Direct)
    );
    assert_eq!(
        select(Collective::Send, 1, &flat8, &m, &all),
        Ok(Algorithm::Direct)
    );
}

/// Two ranks on two nodes (the TCP comparison with OpenMPI): a 64 KiB
/// AllReduce is one exchange of the whole buffer both ways and a local
/// reduction (Direct, OpenMPI's recursive doubling at two ranks), not the
/// ring's two half-size rounds.
#[test]
fn two_nodes_of_one_rank_exchange_small_allreduces_whole() {
    let m = CostModel::default();
    let two = Topology::from_nodes(vec![0, 1]);
    let all = AlgoFilter::all();
    for bytes in [8, 64 << 10] {
        assert_eq!(
            select(Collective::AllReduce, bytes, &two, &m, &all),
            Ok(Algorithm::Direct),
            "{bytes} B"
        );
    }
    assert_eq!(
        select(Collective::Broadcast, 1 << 20, &two, &m, &all),
        Ok(Algorithm::Ring)
    );
}

#[test]
fn filter_restricts_and_can_leave_nothing() {
    let m = CostModel::default();
    let t = Topology::flat(8);
    let ring = AlgoFilter::parse("Ring").unwrap();
    for bytes in [0usize, 1, 1 << 10, 1 << 20, 1 << 30] {
        assert_eq!(
            select(Collective::AllReduce, bytes, &t, &m, &ring),
            Ok(Algorithm::Ring)
        );
    }
    // Plain lists do not govern all-to-all, gather, scatter or send/recv.
    assert_eq!(
        select(Collective::AlltoAll, 8, &t, &m, &ring).map(|a| a != Algorithm::Ring),
        Ok(true)
    );
    let no_direct = AlgoFilter::parse("^direct").unwrap();
    assert_ne!(
        select(Collective::AllReduce, 8, &t, &m, &no_direct),
        Ok(Algorithm::Direct)
    );
    let tree = AlgoFilter::parse("allreduce:tree;broadcast:ring").unwrap();
    assert_eq!(
        select(Collective::AllReduce, 1 << 30, &t, &m, &tree),
        Ok(Algorithm::Tree)
    );
    assert_eq!(
        select(Collective::Broadcast, 1, &t, &m, &tree),
        Ok(Algorithm::Ring)
    );
    let none = AlgoFilter::parse("allgather:tree").unwrap();
    let e = select(Collective::AllGather, 8, &t, &m, &none).unwrap_err();
    assert_eq!(e.collective, Collective::AllGather);
}

#[test]
fn estimates_grow_with_size_and_exist_only_where_supported() {
    let m = CostModel::default();
    let topos = [
        Topology::flat(5),
        Topology::from_nodes(vec![0, 0, 1, 1, 1, 2]),
    ];
    for t in &topos {
        for coll in Collective::ALL {
            for algo in Algorithm::ALL {
                let e = estimate_us(coll, algo, 1024, t, &m);
                assert_eq!(
                    e.is_some(),
                    supported(coll).contains(&algo),
                    "{coll} {algo}"
                );
                if let Some(small) = e {
                    let large = estimate_us(coll, algo, 1 << 24, t, &m).unwrap();
                    assert!(large > small && small > 0.0, "{coll} {algo}");
                }
            }
        }
    }
    assert_eq!(
        estimate_us(
            Collective::AllReduce,
            Algorithm::Ring,
            1 << 20,
            &Topology::flat(1),
            &m
        ),
        Some(0.0)
    );
}

#[test]
fn link_classes() {
    let t = Topology::from_nodes(vec![0, 0, 1]).with_processes(vec![7, 7, 7]);
    assert_eq!(CostModel::class(&t, 0, 1), LinkClass::SameProcess);
    assert_eq!(CostModel::class(&t, 1, 2), LinkClass::CrossNode);
    let t = Topology::from_nodes(vec![0, 0]);
    assert_eq!(CostModel::class(&t, 0, 1), LinkClass::SameNode);
}

#[test]
fn table_lists_ranges() {
    let m = CostModel::default();
    let t = Topology::from_nodes(vec![0, 0, 0, 0, 1, 1, 1, 1]);
    let table = selection_table(&Collective::ALL, &t, &m, &AlgoFilter::all(), 1 << 30);
    println!("{table}");
    assert!(table.starts_with("# hetccl algorithm selection: 8 ranks on 2 node(s) [4+4]"));
    assert!(
        table.contains("allreduce") && table.contains("Direct") && table.contains("Hierarchical")
    );
    assert!(table.contains("0 B - "), "{table}");
    assert!(table.contains("1 GiB"), "{table}");
    // Each collective's ranges tile the sizes: the first starts at 0 B.
    for coll in Collective::ALL {
        let first = table
            .lines()
            .find(|l| l.trim_start().starts_with(&format!("{} ", coll.name())))
            .unwrap();
        assert!(first.contains(" 0 B - "), "{first}");
    }
    let filtered = selection_table(
        &[Collective::AllGather],
        &t,
        &m,
        &AlgoFilter::parse("allgather:tree").unwrap(),
        1024,
    );
    assert!(filtered.contains("(none)"), "{filtered}");
}

#[test]
fn large_communicators_are_cheap_to_tabulate() {
    // 4096 ranks on 512 nodes: the table must not be quadratic in ranks.
    let t = Topology::from_nodes((0..4096).map(|r| r / 8).collect());
    let start = std::time::Instant::now();
    let table = selection_table(
        &[Collective::AllReduce],
        &t,
        &CostModel::default(),
        &AlgoFilter::all(),
        1 << 30,
    );
    assert!(table.contains("allreduce"));
    assert!(start.elapsed().as_secs() < 5, "{:?}", start.elapsed());
    let whole = Topology::flat(4).with_processes(vec![3; 4]);
    let m = CostModel::default();
    let same = estimate_us(Collective::AllReduce, Algorithm::Ring, 1 << 20, &whole, &m).unwrap();
    let shm = estimate_us(
        Collective::AllReduce,
        Algorithm::Ring,
        1 << 20,
        &Topology::flat(4),
        &m,
    )
    .unwrap();
    assert!(same < shm);
}
