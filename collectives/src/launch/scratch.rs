//! Scratch buffers kept per communicator between operations (plans never
//! read scratch they did not write, so the buffers are reused as they are).

use crate::comm::engine::Engine;
use crate::exec::Job;

/// A scratch buffer of at least `bytes` from the communicator's pool.
pub(super) fn take_scratch(engine: &Engine, bytes: usize) -> Vec<u8> {
    if bytes == 0 {
        return Vec::new();
    }
    let mut pool = engine.scratch_pool.lock();
    let mut v = match pool.iter().position(|b| b.len() >= bytes) {
        Some(i) => pool.swap_remove(i),
        None => pool.pop().unwrap_or_default(),
    };
    if v.len() < bytes {
        v.resize(bytes, 0);
    }
    v
}

/// The most scratch buffers a communicator keeps.
const SCRATCH_POOL: usize = 4;

/// Gives a finished job's scratch buffer back to its communicator's pool
/// (the pool's lock is taken only for a job that has one).
pub(super) fn return_scratch(engine: &Engine, job: Job) {
    if job.bufs.scratch.capacity() == 0 {
        return;
    }
    let mut pool = engine.scratch_pool.lock();
    if pool.len() < SCRATCH_POOL {
        pool.push(job.bufs.scratch);
    }
}
