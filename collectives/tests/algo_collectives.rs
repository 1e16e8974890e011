//! Every collective other than AllReduce, with every algorithm that
//! implements it, on the simulator: rank counts 1..=17, counts from 0 to
//! primes, in and out of place, roots 0 and n-1.

mod algo_support;

use algo_support::{check, ops, Case};
use hetccl_abi::DataType;
use hetccl_collectives::algo::sim::{self, RankBuffers, SimOptions};
use hetccl_collectives::algo::{
    generate, supported, Algorithm, Chunking, Collective, PlanArgs, PlanError, Topology,
};

const COLLS: [Collective; 7] = [
    Collective::Broadcast,
    Collective::Reduce,
    Collective::AllGather,
    Collective::ReduceScatter,
    Collective::AlltoAll,
    Collective::Gather,
    Collective::Scatter,
];

#[test]
fn every_collective_algorithm_rank_count_and_size() {
    for coll in COLLS {
        for &algo in supported(coll) {
            for n in 1..=17u32 {
                for count in [0usize, 1, 2, 3, 7, 13, 31, 1021] {
                    // Keep the O(n²)-message patterns on the larger counts modest.
                    if count == 1021 && n > 9 && matches!(coll, Collective::AlltoAll) {
                        continue;
                    }
                    for in_place in [false, true] {
                        if in_place && coll == Collective::AlltoAll {
                            continue;
                        }
                        let roots = if coll.rooted() {
                            vec![0, n - 1]
                        } else {
                            vec![0]
                        };
                        for root in roots {
                            let mut c = Case::new(coll, algo, n, count);
                            c.in_place = in_place;
                            c.root = root;
                            c.seed = u64::from(n) * 7919 + count as u64 + u64::from(root);
                            // Several chunks per block either way; fewer messages for the big count.
                            if count > 100 {
                                c.chunk_bytes = 1024;
                            }
                            check(&c);
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn reducing_collectives_every_dtype_and_op() {
    for coll in [Collective::Reduce, Collective::ReduceScatter] {
        for dt in DataType::ALL {
            for op in ops(dt) {
                for &algo in supported(coll) {
                    for (n, count, root) in [(2u32, 13usize, 1u32), (5, 7, 4), (17, 3, 0)] {
                        let mut c = Case::new(coll, algo, n, count);
                        c.dtype = dt;
                        c.op = op;
                        c.root = root;
                        c.in_place = n == 5;
                        c.chunk_bytes = 8;
                        check(&c);
                    }
                }
            }
        }
    }
}

#[test]
fn data_movement_every_dtype() {
    // Non-reducing collectives only move bytes, but sizes differ per dtype.
    for coll in [
        Collective::Broadcast,
        Collective::AllGather,
        Collective::AlltoAll,
        Collective::Gather,
        Collective::Scatter,
    ] {
        for dt in DataType::ALL {
            for &algo in supported(coll) {
                let mut c = Case::new(coll, algo, 6, 11);
                c.dtype = dt;
                c.root = 5;
                c.chunk_bytes = 24;
                check(&c);
            }
        }
    }
}

#[test]
fn large_counts() {
    for coll in COLLS {
        for &algo in supported(coll) {
            let n = 7u32;
            // Per-rank blocks for the n-block collectives, whole buffers otherwise.
            let count = if matches!(coll, Collective::Broadcast | Collective::Reduce) {
                65537
            } else {
                9973
            };
            let mut c = Case::new(coll, algo, n, count);
            c.dtype = DataType::Float32;
            c.chunk_bytes = 16384;
            c.root = 3;
            c.in_place = coll != Collective::AlltoAll;
            check(&c);
        }
    }
}

#[test]
fn send_recv_pairs() {
    // Ranks pair up 0<->1, 2<->3, ...: even ranks send, odd ranks receive.
    for count in [0usize, 1, 5, 1000] {
        let n = 6u32;
        let topo = Topology::flat(n);
        let ch = Chunking::with_chunk(128);
        let plans: Vec<_> = (0..n)
            .map(|r| {
                let coll = if r % 2 == 0 {
                    Collective::Send
                } else {
                    Collective::Recv
                };
                let mut a = PlanArgs::new(coll, count, DataType::Uint8);
                a.root = r ^ 1;
                generate(&a, Algorithm::Direct, r, &topo, &ch).unwrap()
            })
            .collect();
        let mut bufs: Vec<RankBuffers> = (0..n)
            .map(|r| RankBuffers {
                send: vec![r as u8 + 1; plans[r as usize].send_bytes],
                recv: vec![0; plans[r as usize].recv_bytes],
            })
            .collect();
        sim::run(&plans, &mut bufs, &SimOptions::default()).unwrap();
        for r in (1..n).step_by(2) {
            assert!(
                bufs[r as usize].recv.iter().all(|&b| b == r as u8),
                "rank {r}"
            );
            assert_eq!(bufs[r as usize].recv.len(), count);
        }
    }
}

#[test]
fn argument_errors() {
    let topo = Topology::flat(4);
    let ch = Chunking::default();
    let a = PlanArgs::new(Collective::AllGather, 8, DataType::Int8);
    assert_eq!(
        generate(&a, Algorithm::Tree, 0, &topo, &ch),
        Err(PlanError::Unsupported {
            collective: Collective::AllGather,
            algorithm: Algorithm::Tree
        })
    );
    assert_eq!(
        generate(&a, Algorithm::Ring, 4, &topo, &ch),
        Err(PlanError::BadRank { rank: 4, nranks: 4 })
    );
    let mut b = PlanArgs::new(Collective::Broadcast, 8, DataType::Int8);
    b.root = 9;
    assert_eq!(
        generate(&b, Algorithm::Ring, 0, &topo, &ch),
        Err(PlanError::BadRoot(9))
    );
    let mut c = PlanArgs::new(Collective::AlltoAll, 8, DataType::Int8);
    c.in_place = true;
    assert_eq!(
        generate(&c, Algorithm::Pairwise, 0, &topo, &ch),
        Err(PlanError::NoInPlace(Collective::AlltoAll))
    );
    let mut d = PlanArgs::new(Collective::Send, 8, DataType::Int8);
    d.root = 2;
    assert_eq!(
        generate(&d, Algorithm::Direct, 2, &topo, &ch),
        Err(PlanError::BadRoot(2))
    );
    let e = PlanArgs::new(Collective::AllGather, usize::MAX / 2, DataType::Int64);
    assert_eq!(
        generate(&e, Algorithm::Ring, 0, &topo, &ch),
        Err(PlanError::Overflow)
    );
}

#[test]
fn plans_are_deterministic_and_valid() {
    let topo = Topology::from_nodes(vec![0, 0, 1, 1, 1]);
    for coll in COLLS {
        for &algo in supported(coll) {
            let mut a = PlanArgs::new(coll, 100, DataType::Float32);
            a.root = 2;
            for r in 0..5 {
                let p1 = generate(&a, algo, r, &topo, &Chunking::with_chunk(64)).unwrap();
                let p2 = generate(&a, algo, r, &topo, &Chunking::with_chunk(64)).unwrap();
                assert_eq!(p1, p2);
                p1.validate().unwrap();
                // Messages never exceed the chunk size.
                assert!(p1
                    .steps
                    .iter()
                    .filter_map(|s| s.kind.message_len())
                    .all(|l| l <= 64));
            }
        }
    }
}

#[test]
fn plans_print() {
    let topo = Topology::flat(3);
    let a = PlanArgs::new(Collective::AllReduce, 6, DataType::Float32);
    let p = generate(&a, Algorithm::Ring, 1, &topo, &Chunking::with_chunk(8)).unwrap();
    let text = p.to_string();
    println!("{text}");
    assert!(
        text.starts_with("# allreduce Ring rank 1/3 float Sum: send 24 B, recv 24 B, scratch 0 B")
    );
    assert!(text.contains("send send[8..16] -> 2/0"));
    assert!(text.contains("recv-reduce recv[0..8] = send[0..8] + <- 0/0"));
    assert_eq!(text.lines().count(), p.steps.len() + 1);
}

#[test]
fn scratch_stays_small() {
    // Partials rotate through a few slots instead of mirroring the input.
    let topo = Topology::flat(17);
    let ch = Chunking::with_chunk(4096);
    let rs = PlanArgs::new(Collective::ReduceScatter, 1 << 16, DataType::Float32);
    let p = generate(&rs, Algorithm::Ring, 5, &topo, &ch).unwrap();
    assert!(p.scratch_bytes <= 2 * (1 << 18), "{}", p.scratch_bytes);
    for algo in [Algorithm::Ring, Algorithm::Tree] {
        let mut red = PlanArgs::new(Collective::Reduce, 1 << 20, DataType::Float32);
        red.root = 3;
        for r in 0..17 {
            let p = generate(&red, algo, r, &topo, &ch).unwrap();
            assert!(
                p.scratch_bytes <= 8 * 4096,
                "{algo} rank {r}: {}",
                p.scratch_bytes
            );
        }
    }
}

#[test]
fn pre_op_scales_into_the_output_when_it_can() {
    use hetccl_collectives::reduce::ReduceOp;
    let topo = Topology::flat(4);
    let ch = Chunking::default();
    let mut a = PlanArgs::new(Collective::AllReduce, 1000, DataType::Float32);
    a.op = ReduceOp::Avg;
    let p = generate(&a, Algorithm::Ring, 1, &topo, &ch).unwrap();
    assert_eq!(p.scratch_bytes, 0);
    a.in_place = true;
    let p = generate(&a, Algorithm::Ring, 1, &topo, &ch).unwrap();
    assert_eq!(p.scratch_bytes, 4000);
}

#[test]
fn direct_allreduce_cuts_its_pieces_to_the_piece_size() {
    // 3 ranks, 1000 floats: pieces of 22 B round down to 20 B (5 floats),
    // and no message is larger, whatever the chunk size.
    let topo = Topology::flat(3);
    let a = PlanArgs::new(Collective::AllReduce, 1000, DataType::Float32);
    for (chunk, piece, most) in [(4096, 22, 20), (16, 4096, 16), (1 << 19, 1 << 16, 4000)] {
        let ch = Chunking {
            chunk_bytes: chunk,
            piece_bytes: piece,
        };
        let p = generate(&a, Algorithm::Direct, 1, &topo, &ch).unwrap();
        let sends: Vec<usize> = p
            .steps
            .iter()
            .filter(|s| s.kind.message().is_some_and(|(_, _, send)| send))
            .filter_map(|s| s.kind.message_len())
            .collect();
        assert!(
            sends.iter().all(|&l| l <= most),
            "{chunk}/{piece}: {sends:?}"
        );
        assert_eq!(sends.len(), 2 * 4000usize.div_ceil(most), "{chunk}/{piece}");
    }
    // The results stay exact with small pieces, in place and out of place.
    for in_place in [false, true] {
        let mut c = Case::new(Collective::AllReduce, Algorithm::Direct, 4, 77);
        (c.chunk_bytes, c.piece_bytes, c.in_place) = (64, 12, in_place);
        check(&c);
    }
}
