//! Per-communicator cache of chosen algorithms and generated plans.
//!
//! Training loops call the same collectives with the same sizes again and
//! again; selection and generation are pure functions of the call's
//! arguments and the communicator's topology, so their result is kept.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::Arc;

use hetccl_abi::DataType;

use crate::algo::{Algorithm, Collective, Plan};
use crate::exec::fingerprint::Layout;
use crate::reduce::ReduceOp;

/// Everything selection and generation depend on, besides the topology.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PlanKey {
    /// The operation.
    pub collective: Collective,
    /// NCCL's count.
    pub count: usize,
    /// Element type.
    pub dtype: DataType,
    /// Reduction op (with its PreMulSum scalar).
    pub op: ReduceOp,
    /// Root or peer.
    pub root: u32,
    /// NCCL's in-place layout.
    pub in_place: bool,
    /// The algorithms the call may use (`AlgoFilter::mask`).
    pub allowed: u8,
    /// Whether the plan exchanges collective fingerprints.
    pub checked: bool,
    /// The algorithm online adaptation chose (`None`: selection chooses).
    pub forced: Option<Algorithm>,
    /// The chunk size of pipelined plans (`Control::chunk_bytes`).
    pub chunk_bytes: usize,
    /// The communicator's wire compression when the call was made
    /// (`Engine::compression`).
    pub compress: hetccl_core::config::Compression,
}

/// A cached plan: its algorithm, the plan, and where its fingerprints live
/// (when it exchanges them).
pub type Cached = (Algorithm, Arc<Plan>, Option<Layout>);

/// The most plans kept per communicator; the cache is emptied when full.
pub const MAX_PLANS: usize = 256;

/// A multiply-rotate hash of the key's integer fields: every call looks
/// its plan up, and SipHash's resistance to chosen keys buys nothing for
/// keys made from the process's own calls in a map capped at
/// [`MAX_PLANS`].
#[derive(Debug, Default, Clone, Copy)]
pub struct KeyHasher(u64);

impl KeyHasher {
    fn add(&mut self, x: u64) {
        self.0 = (self.0.rotate_left(5) ^ x).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
}

impl Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for c in bytes.chunks(8) {
            let mut w = [0u8; 8];
            w[..c.len()].copy_from_slice(c);
            self.add(u64::from_le_bytes(w));
        }
    }
    fn write_u8(&mut self, x: u8) {
        self.add(u64::from(x));
    }
    fn write_u32(&mut self, x: u32) {
        self.add(u64::from(x));
    }
    fn write_u64(&mut self, x: u64) {
        self.add(x);
    }
    fn write_usize(&mut self, x: usize) {
        self.add(x as u64);
    }
}

/// The cache.
#[derive(Debug, Default)]
pub struct PlanCache {
    map: HashMap<PlanKey, Cached, BuildHasherDefault<KeyHasher>>,
    /// The entries looked up last, compared before hashing: a group of
    /// sends and receives of one size, or a loop of a few collectives,
    /// asks for the same plans call after call.
    recent: [Option<(PlanKey, Cached)>; RECENT],
    /// The slot of `recent` the next miss fills.
    next: usize,
}

/// Entries [`PlanCache`] compares before hashing.
const RECENT: usize = 4;

impl PlanCache {
    /// The cached entry for `key`, or the one `make` builds (then cached).
    pub fn get_or_try_insert<E>(
        &mut self,
        key: PlanKey,
        make: impl FnOnce() -> Result<(Algorithm, Plan, Option<Layout>), E>,
    ) -> Result<Cached, E> {
        for (k, (a, p, l)) in self.recent.iter().flatten() {
            if *k == key {
                return Ok((*a, p.clone(), *l));
            }
        }
        let hit = match self.map.get(&key) {
            Some((a, p, l)) => (*a, p.clone(), *l),
            None => {
                let (a, p, l) = make()?;
                if self.map.len() >= MAX_PLANS {
                    self.map.clear();
                }
                let p = Arc::new(p);
                self.map.insert(key, (a, p.clone(), l));
                (a, p, l)
            }
        };
        self.recent[self.next] = Some((key, (hit.0, hit.1.clone(), hit.2)));
        self.next = (self.next + 1) % RECENT;
        Ok(hit)
    }

    /// Cached entries.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(collective: Collective, count: usize) -> PlanKey {
        PlanKey {
            collective,
            count,
            dtype: DataType::Float32,
            op: ReduceOp::Sum,
            root: 1,
            in_place: false,
            allowed: 0,
            checked: false,
            forced: None,
            chunk_bytes: 1 << 19,
            compress: hetccl_core::config::Compression::Off,
        }
    }

    fn plan(k: &PlanKey) -> Plan {
        crate::exec::self_p2p::half(k.collective, 0, 2, k.dtype, k.count * 4)
    }

    /// The plan of `k` from `c`, counting in `made` the plans it made.
    fn get(c: &mut PlanCache, k: PlanKey, made: &mut usize) -> Arc<Plan> {
        c.get_or_try_insert(k, || {
            *made += 1;
            Ok::<_, ()>((Algorithm::Direct, plan(&k), None))
        })
        .unwrap()
        .1
    }

    /// Alternating keys (a group's sends and receives) hit the recent
    /// entries; every key keeps its own plan, also once the map was
    /// emptied for being full.
    #[test]
    fn each_key_keeps_its_plan_and_makes_it_once() {
        let mut c = PlanCache::default();
        let mut made = 0;
        let (s, r) = (key(Collective::Send, 16), key(Collective::Recv, 16));
        let (ps, pr) = (get(&mut c, s, &mut made), get(&mut c, r, &mut made));
        for _ in 0..10 {
            assert!(Arc::ptr_eq(&get(&mut c, s, &mut made), &ps));
            assert!(Arc::ptr_eq(&get(&mut c, r, &mut made), &pr));
        }
        assert_eq!(ps.collective, Collective::Send);
        assert_eq!(pr.collective, Collective::Recv);
        assert_eq!(made, 2);
        made = 0;
        for n in 0..(MAX_PLANS + 8) {
            let k = key(Collective::Send, 100 + n);
            assert_eq!(*get(&mut c, k, &mut made), plan(&k));
        }
        assert_eq!(made, MAX_PLANS + 8);
        assert!(c.len() <= MAX_PLANS);
    }
}
