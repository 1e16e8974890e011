//! Randomised sweep (fixed seed): random collective, algorithm, rank count,
//! node layout, count, dtype, op, root, in-place flag, chunk size and step
//! order, all checked exactly on the simulator.

mod algo_support;

use algo_support::{check, ops, Case};
use hetccl_abi::DataType;
use hetccl_collectives::algo::{supported, Collective};

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

#[test]
fn random_cases() {
    let mut rng = Rng(0x5eed_1234_abcd_0001);
    let colls: Vec<Collective> = Collective::ALL
        .into_iter()
        .filter(|c| !matches!(c, Collective::Send | Collective::Recv))
        .collect();
    for _ in 0..400 {
        let coll = colls[rng.below(colls.len())];
        let algos = supported(coll);
        let algo = algos[rng.below(algos.len())];
        let n = 1 + rng.below(12) as u32;
        let count = match rng.below(4) {
            0 => rng.below(4),
            1 => rng.below(40),
            _ => rng.below(300),
        };
        let mut c = Case::new(coll, algo, n, count);
        c.dtype = DataType::ALL[rng.below(12)];
        if coll.reduces() {
            let o = ops(c.dtype);
            c.op = o[rng.below(o.len())];
        }
        let nodes = 1 + rng.below(n as usize) as u32;
        c.nodes = (0..n).map(|_| rng.below(nodes as usize) as u32).collect();
        c.root = rng.below(n as usize) as u32;
        c.in_place = coll != Collective::AlltoAll && rng.below(2) == 0;
        c.chunk_bytes = 1 + rng.below(200);
        c.seed = rng.next();
        check(&c);
    }
}
