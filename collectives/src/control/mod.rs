//! A communicator's run-time controls: the values `hetcclCommSetOption`
//! changes while the communicator lives, and the online adaptation of its
//! algorithm choice.
//!
//! Each communicator's engine holds one [`Control`]. It starts from the
//! settings read at init (`NCCL_ALGO`, `HETCCL_TUNE`, `HETCCL_COMPRESS`);
//! [`agree::set`] changes it. A set is a collective call: every rank makes it
//! at the same point of its sequence of collectives, the ranks check over the
//! bootstrap ring that they all set the same (key, value) after the same
//! number of collectives, and the value applies from the next collective on.
//!
//! - [`options`]: the keys, their values, parsing and the printed form.
//! - [`agree`]: the agreement between ranks and the apply step.
//! - [`online`]: `tune=online`, the per-size-class adaptation of the choice.
//!
//! The keys and the rules are described in `docs/tuning.md`.

pub mod agree;
pub mod online;
pub mod options;

use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU8, AtomicUsize, Ordering};
use std::sync::Arc;

use hetccl_core::config::{Compression, TuneMode};
use parking_lot::Mutex;

use crate::algo::{AlgoFilter, Algorithm, Collective};
use crate::comm::settings::Settings;

/// The chunk size plans use unless `chunk_bytes` is set.
pub const DEFAULT_CHUNK_BYTES: usize = 512 * 1024;

/// The algorithm options in force, and the filter they make.
#[derive(Debug, Clone)]
struct AlgoOptions {
    /// `NCCL_ALGO` as read at init (empty when unset).
    base: String,
    /// The `algo` option (`None`: not set, `NCCL_ALGO` applies).
    all: Option<String>,
    /// The `algo.<collective>` options, in the order they were set.
    per: Vec<(Collective, String)>,
    /// The filter of `base`/`all` and `per`, rebuilt on each change.
    effective: Arc<AlgoFilter>,
}

impl AlgoOptions {
    /// Rebuilds `effective`: the `algo` value (or `NCCL_ALGO`), then one
    /// `collective:list` entry per `algo.<collective>` option, which
    /// overrides it for that collective.
    fn rebuild(&mut self) -> Result<(), String> {
        let mut text = self.all.clone().unwrap_or_else(|| self.base.clone());
        for (c, v) in &self.per {
            text.push_str(&format!(";{}:{v}", c.name()));
        }
        self.effective = Arc::new(AlgoFilter::parse(&text).map_err(|e| e.to_string())?);
        Ok(())
    }
}

/// A communicator's run-time controls (see the module docs).
#[derive(Debug)]
pub struct Control {
    algo: Mutex<AlgoOptions>,
    /// Whether the filter in `algo` restricts anything (a call on an
    /// unrestricted communicator takes neither the lock nor the `Arc`).
    restricted: AtomicBool,
    /// Bit `i` set: the filter in force allows the direct paths for
    /// `Collective::ALL[i]` (a copy of `algo`'s answer, read per call
    /// without the lock).
    direct: AtomicU16,
    tune: AtomicU8,
    compress: AtomicU8,
    chunk_bytes: AtomicUsize,
    /// The online adaptation's state.
    pub(crate) online: Mutex<online::Online>,
}

fn tune_code(m: TuneMode) -> u8 {
    match m {
        TuneMode::Off => 0,
        TuneMode::Init => 1,
        TuneMode::Online => 2,
    }
}

fn compress_code(c: Compression) -> u8 {
    match c {
        Compression::Off => 0,
        Compression::Bf16 => 1,
        Compression::Fp8E4M3 => 2,
    }
}

/// The bits of [`Control::allows_direct`] for `filter`.
fn direct_mask(filter: &AlgoFilter) -> u16 {
    Collective::ALL
        .iter()
        .enumerate()
        .filter(|(_, &c)| filter.allows(c, Algorithm::Direct))
        .fold(0, |m, (i, _)| m | 1 << i)
}

impl Control {
    /// The controls of a communicator created with `settings`.
    pub fn new(settings: &Settings) -> Self {
        Self {
            restricted: AtomicBool::new(!settings.algo_filter.is_unrestricted()),
            direct: AtomicU16::new(direct_mask(&settings.algo_filter)),
            algo: Mutex::new(AlgoOptions {
                base: settings.algo_filter.text().to_string(),
                all: None,
                per: Vec::new(),
                effective: Arc::new(settings.algo_filter.clone()),
            }),
            tune: AtomicU8::new(tune_code(settings.tune)),
            compress: AtomicU8::new(compress_code(settings.compress)),
            chunk_bytes: AtomicUsize::new(0),
            online: Mutex::new(online::Online::default()),
        }
    }

    /// The communicator's algorithm filter: `NCCL_ALGO`, or the `algo`
    /// option, with the `algo.<collective>` options over it.
    pub fn algo_filter(&self) -> Arc<AlgoFilter> {
        self.algo.lock().effective.clone()
    }

    /// [`Self::algo_filter`] when it restricts anything; `None` (no lock
    /// taken) when every algorithm is allowed.
    pub fn restricted_filter(&self) -> Option<Arc<AlgoFilter>> {
        self.restricted
            .load(Ordering::Acquire)
            .then(|| self.algo_filter())
    }

    /// Whether the filter in force allows the direct paths for `kind`: the
    /// per-call check of [`Self::algo_filter`], one relaxed load.
    pub fn allows_direct(&self, kind: Collective) -> bool {
        let i = Collective::ALL.iter().position(|&c| c == kind).unwrap_or(0);
        self.direct.load(Ordering::Relaxed) & (1 << i) != 0
    }

    /// The tuning mode in force (`HETCCL_TUNE`, or the `tune` option).
    pub fn tune(&self) -> TuneMode {
        match self.tune.load(Ordering::Relaxed) {
            1 => TuneMode::Init,
            2 => TuneMode::Online,
            _ => TuneMode::Off,
        }
    }

    /// The wire compression of float sum/avg reductions between nodes in
    /// force (`HETCCL_COMPRESS`, or the `compress` option). The compression
    /// code reads it once per collective.
    pub fn compression(&self) -> Compression {
        match self.compress.load(Ordering::Relaxed) {
            1 => Compression::Bf16,
            2 => Compression::Fp8E4M3,
            _ => Compression::Off,
        }
    }

    /// The chunk size of pipelined plans (`chunk_bytes`; 512 KiB unless set).
    pub fn chunk_bytes(&self) -> usize {
        match self.chunk_bytes.load(Ordering::Relaxed) {
            0 => DEFAULT_CHUNK_BYTES,
            n => n,
        }
    }

    /// The printed value of `key` (as `hetcclCommGetOption` returns it).
    pub fn get(&self, key: options::Key) -> String {
        use options::Key;
        match key {
            Key::Algo => self.algo.lock().all.clone(),
            Key::AlgoFor(c) => self
                .algo
                .lock()
                .per
                .iter()
                .find(|(x, _)| *x == c)
                .map(|(_, v)| v.clone()),
            Key::Tune => Some(self.tune().name().to_string()),
            Key::Compress => Some(self.compression().name().to_string()),
            Key::ChunkBytes => Some(self.chunk_bytes().to_string()),
        }
        .unwrap_or_else(|| options::DEFAULT.to_string())
    }

    /// Publishes what calls read of `filter` without the lock.
    fn publish(&self, filter: &AlgoFilter) {
        self.direct.store(direct_mask(filter), Ordering::Relaxed);
        self.restricted
            .store(!filter.is_unrestricted(), Ordering::Release);
    }

    /// Applies a parsed, agreed setting.
    pub(crate) fn apply(&self, s: &options::Setting) -> Result<(), String> {
        use options::Setting;
        match s {
            Setting::Algo(v) => {
                let mut a = self.algo.lock();
                let mut next = a.clone();
                next.all = v.clone();
                next.rebuild()?;
                self.publish(&next.effective);
                *a = next;
            }
            Setting::AlgoFor(c, v) => {
                let mut a = self.algo.lock();
                let mut next = a.clone();
                next.per.retain(|(x, _)| x != c);
                if let Some(v) = v {
                    next.per.push((*c, v.clone()));
                }
                next.rebuild()?;
                self.publish(&next.effective);
                *a = next;
            }
            Setting::Tune(m) => {
                self.tune.store(tune_code(*m), Ordering::Relaxed);
                // A new mode starts the adaptation afresh.
                *self.online.lock() = online::Online::default();
            }
            Setting::Compress(c) => self.compress.store(compress_code(*c), Ordering::Relaxed),
            Setting::ChunkBytes(n) => self.chunk_bytes.store(n.unwrap_or(0), Ordering::Relaxed),
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::options::{parse, Key};
    use super::*;
    use crate::algo::Algorithm;
    use crate::comm::config::CommConfig;
    use hetccl_core::config::Config;

    fn control(algo: Option<&str>) -> Control {
        let mut vars = Vec::new();
        if let Some(a) = algo {
            vars.push(("NCCL_ALGO".to_string(), a.to_string()));
        }
        let cfg = Config::from_vars(vars).0;
        Control::new(&Settings::new(&cfg, &CommConfig::default()).unwrap())
    }

    #[test]
    fn algo_options_layer_over_nccl_algo() {
        let c = control(Some("tree"));
        let ar = Collective::AllReduce;
        assert!(!c.algo_filter().allows(ar, Algorithm::Ring));
        assert!(!c.allows_direct(Collective::Broadcast));
        c.apply(&parse("algo.allreduce", "ring").unwrap()).unwrap();
        assert!(c.algo_filter().allows(ar, Algorithm::Ring));
        assert!(!c.algo_filter().allows(ar, Algorithm::Tree));
        assert!(!c
            .algo_filter()
            .allows(Collective::Broadcast, Algorithm::Ring));
        c.apply(&parse("algo", "direct").unwrap()).unwrap();
        assert!(c.allows_direct(Collective::Broadcast));
        assert!(!c.allows_direct(ar), "algo.allreduce=ring wins");
        assert!(c
            .algo_filter()
            .allows(Collective::Broadcast, Algorithm::Direct));
        assert!(!c
            .algo_filter()
            .allows(Collective::Broadcast, Algorithm::Tree));
        assert!(
            c.algo_filter().allows(ar, Algorithm::Ring),
            "per-collective wins"
        );
        assert_eq!(c.get(Key::AlgoFor(ar)), "ring");
        assert_eq!(c.get(Key::Algo), "direct");
        c.apply(&parse("algo.allreduce", "default").unwrap())
            .unwrap();
        c.apply(&parse("algo", "DEFAULT").unwrap()).unwrap();
        assert_eq!(c.get(Key::AlgoFor(ar)), "default");
        assert!(c.algo_filter().allows(ar, Algorithm::Tree));
        assert!(
            !c.algo_filter().allows(ar, Algorithm::Ring),
            "NCCL_ALGO again"
        );
    }

    #[test]
    fn only_a_restricting_filter_is_handed_out() {
        let c = control(None);
        assert!(c.restricted_filter().is_none(), "nothing restricted");
        c.apply(&parse("algo.allgather", "ring").unwrap()).unwrap();
        let f = c.restricted_filter().expect("algo.allgather restricts");
        assert!(!f.allows(Collective::AllGather, Algorithm::Tree));
        c.apply(&parse("algo.allgather", "default").unwrap())
            .unwrap();
        assert!(c.restricted_filter().is_none(), "back to no restriction");
        assert!(control(Some("tree")).restricted_filter().is_some());
    }

    #[test]
    fn scalar_options() {
        let c = control(None);
        assert_eq!(c.compression(), Compression::Off);
        c.apply(&parse("compress", "bf16").unwrap()).unwrap();
        assert_eq!(c.compression(), Compression::Bf16);
        assert_eq!(c.get(Key::Compress), "bf16");
        c.apply(&parse("tune", "online").unwrap()).unwrap();
        assert_eq!(c.tune(), TuneMode::Online);
        assert_eq!(c.chunk_bytes(), DEFAULT_CHUNK_BYTES);
        c.apply(&parse("chunk_bytes", "64K").unwrap()).unwrap();
        assert_eq!(c.chunk_bytes(), 65536);
        assert_eq!(c.get(Key::ChunkBytes), "65536");
        c.apply(&parse("chunk_bytes", "default").unwrap()).unwrap();
        assert_eq!(c.chunk_bytes(), DEFAULT_CHUNK_BYTES);
    }
}
