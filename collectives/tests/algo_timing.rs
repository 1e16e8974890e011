//! Timed replays: the schedules pipeline, and the cost model's estimates
//! are in line with the schedules they describe.

use hetccl_abi::DataType;
use hetccl_collectives::algo::timing::{makespan, Uniform};
use hetccl_collectives::algo::{
    estimate_us, generate, supported, Algorithm, Chunking, Collective, CostModel, LinkClass, Plan,
    PlanArgs, Topology,
};

fn plans(
    coll: Collective,
    algo: Algorithm,
    topo: &Topology,
    count: usize,
    chunk: usize,
) -> Vec<Plan> {
    let a = PlanArgs::new(coll, count, DataType::Uint8);
    (0..topo.nranks())
        .map(|r| generate(&a, algo, r, topo, &Chunking::with_chunk(chunk)).unwrap())
        .collect()
}

const LINK: Uniform = Uniform {
    alpha_us: 1.0,
    beta_us_per_byte: 0.001,
    local_us_per_byte: 0.0,
};

#[test]
fn chains_and_trees_pipeline() {
    let topo = Topology::flat(8);
    let bytes = 64 << 10;
    for (coll, algo) in [
        (Collective::Broadcast, Algorithm::Ring),
        (Collective::Reduce, Algorithm::Ring),
        (Collective::Broadcast, Algorithm::Tree),
        (Collective::AllReduce, Algorithm::Tree),
    ] {
        let whole = makespan(&plans(coll, algo, &topo, bytes, bytes), &LINK).unwrap();
        let piped = makespan(&plans(coll, algo, &topo, bytes, 1 << 10), &LINK).unwrap();
        println!("{coll} {algo}: one chunk {whole:.1} us, 1 KiB chunks {piped:.1} us");
        // A tree already overlaps the two children of a node; a chain gains most.
        let gain = if algo == Algorithm::Tree { 0.7 } else { 0.3 };
        assert!(piped < gain * whole, "{coll} {algo}: {piped} vs {whole}");
    }
    // A pipelined chain costs about one buffer time plus the fill.
    let chain = makespan(
        &plans(
            Collective::Broadcast,
            Algorithm::Ring,
            &topo,
            bytes,
            1 << 10,
        ),
        &LINK,
    )
    .unwrap();
    let ideal = (7.0 + 63.0) * (1.0 + 1024.0 * 0.001);
    assert!(chain < 1.2 * ideal, "{chain} vs {ideal}");
}

#[test]
fn ring_allreduce_moves_two_buffers_per_rank() {
    // Bandwidth-bound: about 2(n-1)/n · B · β.
    let topo = Topology::flat(8);
    let bytes = 8 << 20;
    let t = makespan(
        &plans(
            Collective::AllReduce,
            Algorithm::Ring,
            &topo,
            bytes,
            256 << 10,
        ),
        &LINK,
    )
    .unwrap();
    let bw = 2.0 * 7.0 / 8.0 * bytes as f64 * 0.001;
    assert!(t > bw && t < 1.2 * bw, "{t} vs {bw}");
}

#[test]
fn bandwidth_bound_allreduces_reach_the_bound() {
    // One node of 8: ring, halving-doubling and the hierarchical schedule
    // (direct reduce-scatter + all-gather) all move 2(n-1)/n · B per rank.
    let topo = Topology::flat(8);
    let bytes = 1 << 20;
    let link = Uniform {
        alpha_us: 1.0,
        beta_us_per_byte: 0.0001,
        local_us_per_byte: 0.0,
    };
    let bound = 2.0 * 7.0 / 8.0 * bytes as f64 * 0.0001;
    for algo in [
        Algorithm::Ring,
        Algorithm::HalvingDoubling,
        Algorithm::Hierarchical,
    ] {
        let t = makespan(
            &plans(Collective::AllReduce, algo, &topo, bytes, 64 << 10),
            &link,
        )
        .unwrap();
        assert!(t >= bound && t < 1.1 * bound, "{algo}: {t} vs {bound}");
    }
}

#[test]
fn estimates_track_schedules() {
    // The model's link for the flat topology, replayed on the schedules.
    let m = CostModel {
        msg_overhead_us: 0.0,
        reduce_us_per_byte: 0.0,
        direct_congestion: 0.0,
        ..CostModel::default()
    };
    let l = m.link(LinkClass::SameNode);
    let links = Uniform {
        alpha_us: l.alpha_us,
        beta_us_per_byte: l.beta_us_per_byte,
        local_us_per_byte: 0.0,
    };
    let topo = Topology::flat(8);
    for coll in [
        Collective::AllReduce,
        Collective::Broadcast,
        Collective::AllGather,
        Collective::AlltoAll,
    ] {
        for &algo in supported(coll) {
            for bytes in [1usize << 10, 1 << 20] {
                let replay = makespan(&plans(coll, algo, &topo, bytes, 64 << 10), &links).unwrap();
                let est = estimate_us(coll, algo, bytes, &topo, &m).unwrap();
                println!("{coll:>10} {algo:>16} {bytes:>8} B: schedule {replay:9.1} us, model {est:9.1} us");
                assert!(
                    est < 3.0 * replay && replay < 3.0 * est,
                    "{coll} {algo} {bytes}: {replay} vs {est}"
                );
            }
        }
    }
}
