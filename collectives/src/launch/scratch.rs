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

/// Gives finished jobs' scratch buffers back to their communicator's pool.
pub(super) fn return_scratch(engine: &Engine, jobs: Vec<Job>) {
    let mut pool = engine.scratch_pool.lock();
    for j in jobs {
        if j.bufs.scratch.capacity() > 0 && pool.len() < SCRATCH_POOL {
            pool.push(j.bufs.scratch);
        }
    }
}
