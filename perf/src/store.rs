//! The out-of-band channel between ranks: the unique id, barriers and the
//! per-row results travel here, never through the library under test.
//!
//! Two implementations: a directory of small files (processes, local or on a
//! shared filesystem; every key is written to a temporary name and renamed,
//! so readers never see partial values) and an in-memory map (threads).
//! Every wait has a timeout.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// A key-value store shared by all ranks of one run.
pub trait Store: Send + Sync {
    /// Publishes `key` (write-once).
    fn set(&self, key: &str, value: &[u8]) -> Result<(), String>;
    /// Waits up to `timeout` for `key`.
    fn get(&self, key: &str, timeout: Duration) -> Result<Vec<u8>, String>;
}

/// Key-value pairs as files in one directory.
pub struct FileStore {
    dir: PathBuf,
}

impl FileStore {
    /// Uses (and creates) `dir`.
    pub fn new(dir: &Path) -> Result<FileStore, String> {
        std::fs::create_dir_all(dir)
            .map_err(|e| format!("cannot create store directory {}: {e}", dir.display()))?;
        Ok(FileStore {
            dir: dir.to_path_buf(),
        })
    }

    fn path(&self, key: &str) -> PathBuf {
        self.dir.join(key.replace('/', "_"))
    }
}

/// Writes `data` to `path` atomically (temporary file in the same directory,
/// then rename).
pub fn write_atomic(path: &Path, data: &[u8]) -> Result<(), String> {
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("key");
    let tmp = path.with_file_name(format!(
        ".{name}.tmp.{}.{:?}",
        std::process::id(),
        std::thread::current().id()
    ));
    std::fs::write(&tmp, data).map_err(|e| format!("cannot write {}: {e}", tmp.display()))?;
    std::fs::rename(&tmp, path)
        .map_err(|e| format!("cannot rename {} to {}: {e}", tmp.display(), path.display()))
}

static SPIN_US: AtomicU64 = AtomicU64::new(5000);

/// Sets how long [`poll`] yields before it starts sleeping: 5 ms when every
/// local rank has a core, 0 when ranks outnumber cores (spinning would take
/// the CPU from the ranks doing work).
pub fn set_spin(local_ranks: usize) {
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    SPIN_US.store(
        if local_ranks <= cores { 5000 } else { 0 },
        Ordering::Relaxed,
    );
}

/// Polls `f` until it returns `Some`, for at most `timeout`: yielding for
/// the first 5 ms (ranks arriving together leave a barrier microseconds
/// apart, which keeps the skew out of the timed loop; see [`set_spin`]),
/// then sleeping with a growing interval capped at 1 ms.
pub fn poll<T>(
    timeout: Duration,
    what: &str,
    mut f: impl FnMut() -> Option<T>,
) -> Result<T, String> {
    let spin = Duration::from_micros(SPIN_US.load(Ordering::Relaxed));
    let start = Instant::now();
    let mut sleep = Duration::from_micros(20);
    loop {
        if let Some(v) = f() {
            return Ok(v);
        }
        let waited = start.elapsed();
        if waited >= timeout {
            return Err(format!(
                "timed out after {:.0} s waiting for {what}",
                timeout.as_secs_f64()
            ));
        }
        if waited < spin {
            std::thread::yield_now();
        } else {
            std::thread::sleep(sleep);
            sleep = (sleep * 2).min(Duration::from_millis(1));
        }
    }
}

impl Store for FileStore {
    fn set(&self, key: &str, value: &[u8]) -> Result<(), String> {
        write_atomic(&self.path(key), value)
    }

    fn get(&self, key: &str, timeout: Duration) -> Result<Vec<u8>, String> {
        let p = self.path(key);
        poll(
            timeout,
            &format!("'{key}' in {}", self.dir.display()),
            || std::fs::read(&p).ok(),
        )
    }
}

/// Key-value pairs in memory, for ranks that are threads of one process.
#[derive(Default, Clone)]
pub struct MemStore {
    inner: Arc<(Mutex<KeyMap>, Condvar)>,
}

type KeyMap = HashMap<String, Vec<u8>>;

impl Store for MemStore {
    fn set(&self, key: &str, value: &[u8]) -> Result<(), String> {
        let (m, cv) = &*self.inner;
        m.lock()
            .map_err(|_| "store poisoned")?
            .insert(key.to_string(), value.to_vec());
        cv.notify_all();
        Ok(())
    }

    fn get(&self, key: &str, timeout: Duration) -> Result<Vec<u8>, String> {
        let (m, cv) = &*self.inner;
        let deadline = Instant::now() + timeout;
        let mut map = m.lock().map_err(|_| "store poisoned")?;
        loop {
            if let Some(v) = map.get(key) {
                return Ok(v.clone());
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(format!(
                    "timed out after {:.0} s waiting for '{key}'",
                    timeout.as_secs_f64()
                ));
            }
            map = cv
                .wait_timeout(map, deadline - now)
                .map_err(|_| "store poisoned")?
                .0;
        }
    }
}

/// One rank's handle on the store: numbers its synchronisation points so
/// that every rank uses the same keys for the same step.
pub struct Channel {
    store: Arc<dyn Store>,
    rank: usize,
    nranks: usize,
    seq: u64,
    timeout: Duration,
}

impl Channel {
    /// A handle for `rank` of `nranks`.
    pub fn new(store: Arc<dyn Store>, rank: usize, nranks: usize, timeout: Duration) -> Channel {
        Channel {
            store,
            rank,
            nranks,
            seq: 0,
            timeout,
        }
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Number of ranks.
    pub fn nranks(&self) -> usize {
        self.nranks
    }

    /// Publishes a named value (not numbered).
    pub fn set(&self, key: &str, value: &[u8]) -> Result<(), String> {
        self.store.set(key, value)
    }

    /// Waits for a named value (not numbered).
    pub fn get(&self, key: &str) -> Result<Vec<u8>, String> {
        self.store.get(key, self.timeout)
    }

    /// Every rank sends `value`; rank 0 receives all of them in rank order
    /// (other ranks get `None` and do not wait).
    pub fn gather(&mut self, value: &[u8]) -> Result<Option<Vec<Vec<u8>>>, String> {
        self.seq += 1;
        let seq = self.seq;
        self.store.set(&format!("g{seq}.{}", self.rank), value)?;
        if self.rank != 0 {
            return Ok(None);
        }
        let mut all = Vec::with_capacity(self.nranks);
        for r in 0..self.nranks {
            all.push(self.get(&format!("g{seq}.{r}"))?);
        }
        Ok(Some(all))
    }

    /// Waits until every rank has reached the same barrier.
    pub fn barrier(&mut self) -> Result<(), String> {
        self.seq += 1;
        let seq = self.seq;
        self.store.set(&format!("b{seq}.{}", self.rank), b"")?;
        for r in 0..self.nranks {
            self.get(&format!("b{seq}.{r}"))?;
        }
        Ok(())
    }

    /// Sum of `v` over all ranks, known to every rank (rank 0 gathers and
    /// publishes the total).
    pub fn all_sum(&mut self, v: u64) -> Result<u64, String> {
        if self.nranks == 1 {
            return Ok(v);
        }
        let all = self.gather(&v.to_le_bytes())?;
        let key = format!("s{}", self.seq);
        match all {
            Some(all) => {
                let s = all.iter().map(|b| u64_of(b)).sum();
                self.store.set(&key, &u64::to_le_bytes(s))?;
                Ok(s)
            }
            None => Ok(u64_of(&self.get(&key)?)),
        }
    }
}

/// A little-endian u64 from the first 8 bytes (0 if shorter).
pub fn u64_of(b: &[u8]) -> u64 {
    b.get(..8)
        .and_then(|s| s.try_into().ok())
        .map(u64::from_le_bytes)
        .unwrap_or(0)
}
