//! Plans with collective fingerprints added (`exec::fingerprint::add`)
//! give the same results as the plans without, on the simulator, for every
//! collective and algorithm: first messages shorter and longer than the
//! data a fingerprint carries, links used both ways and one way (roots),
//! in and out of place.

mod algo_support;

use algo_support::{check, Case};
use hetccl_abi::DataType;
use hetccl_collectives::algo::{generate, supported, Chunking, Collective, PlanArgs, Topology};
use hetccl_collectives::exec::fingerprint::{self, CARRY, SLOT};
use hetccl_collectives::reduce::ReduceOp;

#[test]
fn fingerprinted_plans_compute_the_same_results() {
    for &coll in &Collective::ALL {
        if matches!(coll, Collective::Send | Collective::Recv) {
            continue;
        }
        for &algo in supported(coll) {
            for n in [1u32, 2, 3, 5, 8] {
                // 1021 int32 fit in one carried message; 6007 do not.
                for count in [0usize, 1, 7, 1021, 6007] {
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
                            c.fingerprinted = true;
                            c.chunk_bytes = if count > 2000 { 1 << 16 } else { 256 };
                            c.seed = u64::from(n) * 31 + count as u64 + u64::from(root);
                            check(&c);
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn reductions_match_with_fingerprints() {
    for &coll in &[
        Collective::AllReduce,
        Collective::Reduce,
        Collective::ReduceScatter,
    ] {
        for &algo in supported(coll) {
            for op in [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Avg] {
                for dtype in [DataType::Float32, DataType::Float64, DataType::Int8] {
                    let mut c = Case::new(coll, algo, 4, 6007);
                    c.op = op;
                    c.dtype = dtype;
                    c.fingerprinted = true;
                    c.chunk_bytes = 1 << 16;
                    check(&c);
                }
            }
        }
    }
}

#[test]
fn every_link_gets_one_slot_each_way() {
    let topo = Topology::flat(4);
    let args = PlanArgs::new(Collective::Broadcast, 100_000, DataType::Float32);
    for &algo in supported(Collective::Broadcast) {
        for r in 0..4 {
            let p = generate(&args, algo, r, &topo, &Chunking::default()).unwrap();
            let (f, l) = fingerprint::add(&p);
            f.validate().unwrap();
            let mut links: Vec<(u32, u8)> = p
                .steps
                .iter()
                .filter_map(|s| s.kind.message().map(|(peer, chan, _)| (peer, chan)))
                .collect();
            links.sort_unstable();
            links.dedup();
            assert_eq!(l.links, links.len(), "{algo:?} rank {r}");
            assert_eq!(f.scratch_bytes, l.inbox + l.links * SLOT);
            // Each link: one send and one receive of a slot, the receive
            // taking at most a fingerprint and CARRY bytes.
            for &(peer, chan) in &links {
                let outs = f.steps.iter().filter(|s| {
                    matches!(s.kind, hetccl_collectives::algo::StepKind::Send { peer: p2, chan: c2, src }
                        if (p2, c2) == (peer, chan) && l.is_out(&src))
                });
                assert_eq!(outs.count(), 1, "{algo:?} rank {r} link {peer}/{chan}");
                let ins: Vec<_> = f
                    .steps
                    .iter()
                    .filter_map(|s| match s.kind {
                        hetccl_collectives::algo::StepKind::Recv {
                            peer: p2,
                            chan: c2,
                            dst,
                        } if (p2, c2) == (peer, chan) && l.is_inbox(&dst) => Some(dst),
                        _ => None,
                    })
                    .collect();
                assert_eq!(ins.len(), 1, "{algo:?} rank {r} link {peer}/{chan}");
                assert!(ins[0].len <= fingerprint::BYTES + CARRY);
            }
        }
    }
}
