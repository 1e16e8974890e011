//! AllReduce schedules on the simulator: every algorithm, rank counts
//! 1..=17, counts from 0 to primes, in and out of place, every dtype × op.

mod algo_support;

use algo_support::{check, ops, Case};
use hetccl_abi::DataType;
use hetccl_collectives::algo::{Algorithm, Collective};

const ALGOS: [Algorithm; 5] = [
    Algorithm::Ring,
    Algorithm::Tree,
    Algorithm::Direct,
    Algorithm::HalvingDoubling,
    Algorithm::Hierarchical,
];

#[test]
fn every_algorithm_rank_count_and_size() {
    for algo in ALGOS {
        for n in 1..=17u32 {
            for count in [0usize, 1, 2, 3, 7, 13, 31, 1021] {
                for in_place in [false, true] {
                    let mut c = Case::new(Collective::AllReduce, algo, n, count);
                    c.in_place = in_place;
                    c.seed = u64::from(n) * 1000 + count as u64;
                    // Several chunks per block either way; fewer messages for the big count.
                    if count > 100 {
                        c.chunk_bytes = 1024;
                    }
                    // Put the ranks on two nodes so hierarchical has work.
                    if algo == Algorithm::Hierarchical {
                        c.nodes = (0..n).map(|r| u32::from(r >= n / 2)).collect();
                    }
                    check(&c);
                }
            }
        }
    }
}

#[test]
fn every_dtype_and_op() {
    for dt in DataType::ALL {
        for op in ops(dt) {
            for algo in ALGOS {
                for (n, count) in [(2u32, 13usize), (3, 31), (7, 13), (17, 37)] {
                    let mut c = Case::new(Collective::AllReduce, algo, n, count);
                    c.dtype = dt;
                    c.op = op;
                    c.in_place = n % 2 == 1;
                    c.chunk_bytes = 16;
                    if algo == Algorithm::Hierarchical {
                        c.nodes = (0..n).map(|r| r % 3).collect();
                    }
                    check(&c);
                }
            }
        }
    }
}

#[test]
fn large_count() {
    // One large prime count per algorithm; f32 everywhere, bf16 once.
    for algo in ALGOS {
        for (n, dt) in [
            (3u32, DataType::Float32),
            (17, DataType::Float32),
            (8, DataType::Bfloat16),
        ] {
            if dt == DataType::Bfloat16 && algo != Algorithm::Ring {
                continue;
            }
            let mut c = Case::new(Collective::AllReduce, algo, n, 65537);
            c.dtype = dt;
            c.chunk_bytes = 16384;
            c.in_place = n == 8;
            if algo == Algorithm::Hierarchical {
                c.nodes = (0..n).map(|r| r / 4).collect();
            }
            check(&c);
        }
    }
}

#[test]
fn random_schedules_agree() {
    // Different step orders (seeds) must not change any result.
    for seed in 0..20 {
        for algo in ALGOS {
            let mut c = Case::new(Collective::AllReduce, algo, 6, 29);
            c.seed = seed;
            c.chunk_bytes = 8;
            c.dtype = DataType::Float16;
            if algo == Algorithm::Hierarchical {
                c.nodes = vec![0, 0, 1, 1, 1, 2];
            }
            check(&c);
        }
    }
}
