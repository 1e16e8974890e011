//! The metrics files (`HETCCL_METRICS_FILE`): one thread per process
//! rewrites each registered communicator's file, atomically, every
//! `HETCCL_METRICS_INTERVAL_S`, and [`unregister`] writes it a last time at
//! destroy. The thread ends when no communicator is registered.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use once_cell::sync::Lazy;
use parking_lot::{Condvar, Mutex};

use super::metrics::Metrics;
use super::render::{prometheus, Meta};

struct Entry {
    metrics: Arc<Metrics>,
    meta: Meta,
    path: PathBuf,
    interval: Duration,
    next: Instant,
}

impl Entry {
    fn write(&self) {
        let text = prometheus(&self.meta, &self.metrics.snapshot());
        if let Err(e) = super::path::write_atomic(&self.path, text.as_bytes()) {
            tracing::warn!(target: "hetccl::INIT",
                "metrics: cannot write {}: {e}", self.path.display());
        }
    }
}

#[derive(Default)]
struct Registry {
    entries: Vec<Entry>,
    running: bool,
}

static REG: Lazy<(Mutex<Registry>, Condvar)> = Lazy::new(Default::default);

/// Writes `metrics` to `template` (expanded for the rank) now and every
/// `interval` until [`unregister`].
pub fn register(metrics: Arc<Metrics>, meta: Meta, template: &str, interval: Duration) {
    let path = super::path::expand(template, metrics.rank);
    let e = Entry {
        metrics,
        meta,
        path,
        interval,
        next: Instant::now() + interval,
    };
    e.write();
    let (lock, cv) = &*REG;
    let mut reg = lock.lock();
    reg.entries.push(e);
    if !reg.running {
        let spawned = std::thread::Builder::new()
            .name("hetccl-metrics".into())
            .spawn(run);
        match spawned {
            Ok(_) => reg.running = true,
            Err(err) => tracing::warn!(target: "hetccl::INIT",
                "metrics: cannot start the writer thread: {err}; the file is written at destroy only"),
        }
    }
    cv.notify_all();
}

/// Writes the file of `metrics` a last time and stops rewriting it. Does
/// nothing if it is not registered.
pub fn unregister(metrics: &Arc<Metrics>) {
    let (lock, cv) = &*REG;
    let mut reg = lock.lock();
    if let Some(i) = reg
        .entries
        .iter()
        .position(|e| Arc::ptr_eq(&e.metrics, metrics))
    {
        let e = reg.entries.swap_remove(i);
        e.write();
    }
    cv.notify_all();
}

fn run() {
    let (lock, cv) = &*REG;
    let mut reg = lock.lock();
    loop {
        if reg.entries.is_empty() {
            reg.running = false;
            return;
        }
        let now = Instant::now();
        for e in reg.entries.iter_mut().filter(|e| e.next <= now) {
            e.write();
            e.next = now + e.interval;
        }
        let next = reg.entries.iter().map(|e| e.next).min().unwrap_or(now);
        cv.wait_until(&mut reg, next);
    }
}
