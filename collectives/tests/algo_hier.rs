//! Hierarchical all-reduce over node layouts, including uneven ones.

mod algo_support;

use algo_support::{check, ops, Case};
use hetccl_abi::DataType;
use hetccl_collectives::algo::{
    generate, Algorithm, Chunking, Collective, PlanArgs, StepKind, Topology,
};

fn layouts() -> Vec<Vec<u32>> {
    vec![
        vec![0],
        vec![0, 0],
        vec![0, 1],
        vec![0, 0, 1, 1],          // 2×2
        vec![0, 0, 1, 1, 2, 2],    // 3×2
        vec![0, 0, 0, 1, 1, 1],    // 2×3
        vec![0, 0, 0, 1],          // uneven
        vec![1, 0, 1, 0, 1],       // interleaved ids, uneven
        vec![0, 1, 1, 2, 2, 2, 3], // 1+2+3+1
        vec![5, 5, 5, 5, 5, 5, 5, 5],
        vec![0, 1, 2, 3, 4, 5, 6, 7, 8],
        (0..17).map(|r| r % 4).collect(),
    ]
}

#[test]
fn node_layouts() {
    for nodes in layouts() {
        for count in [0usize, 1, 2, 3, 7, 13, 31, 1021] {
            for in_place in [false, true] {
                let mut c = Case::new(
                    Collective::AllReduce,
                    Algorithm::Hierarchical,
                    nodes.len() as u32,
                    count,
                );
                c.nodes = nodes.clone();
                c.in_place = in_place;
                c.seed = count as u64 + nodes.len() as u64;
                if count > 100 {
                    c.chunk_bytes = 512;
                }
                check(&c);
            }
        }
    }
}

#[test]
fn node_layouts_every_dtype_and_op() {
    for nodes in [vec![0, 0, 1, 1, 2, 2], vec![0, 0, 0, 1]] {
        for dt in DataType::ALL {
            for op in ops(dt) {
                let mut c = Case::new(
                    Collective::AllReduce,
                    Algorithm::Hierarchical,
                    nodes.len() as u32,
                    29,
                );
                c.nodes = nodes.clone();
                c.dtype = dt;
                c.op = op;
                c.chunk_bytes = 8;
                check(&c);
            }
        }
    }
}

#[test]
fn cross_node_traffic_is_one_shard_per_rank() {
    // 2 nodes × 4 ranks: each rank sends only about 2·(1/4)·(1/2) of the
    // data across nodes (its shard, reduce-scatter then all-gather halves).
    let topo = Topology::from_nodes(vec![0, 0, 0, 0, 1, 1, 1, 1]);
    let bytes = 4096 * 4;
    let a = PlanArgs::new(Collective::AllReduce, 4096, DataType::Float32);
    for r in 0..8 {
        let p = generate(&a, Algorithm::Hierarchical, r, &topo, &Chunking::default()).unwrap();
        let cross: usize = p
            .steps
            .iter()
            .filter_map(|s| match s.kind {
                StepKind::Send { peer, src, .. } if !topo.same_node(r, peer) => Some(src.len),
                _ => None,
            })
            .sum();
        assert_eq!(cross, bytes / 4, "rank {r}");
    }
}
