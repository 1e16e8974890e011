//! The vectors a [`super::Batch`] fills, kept by the communicator's links
//! between batches, so that a small operation allocates none of them.
//!
//! A batch takes a set when it is built and gives it back, emptied but
//! with its capacity, from [`super::Batch::into_jobs`]. A batch dropped
//! any other way simply frees its vectors.

use std::collections::VecDeque;

use parking_lot::Mutex;

use super::LinkKey;

/// Sets kept per communicator: one batch runs at a time under its exec
/// lock; a second covers a batch built beside it (calibration, tests).
const KEPT: usize = 2;

/// A set grown past this many steps is freed rather than kept, so that
/// one huge group does not pin its memory for the communicator's life.
const KEPT_STEPS: usize = 4096;

/// One batch's vectors (see the fields of [`super::Batch`]).
#[derive(Debug, Default)]
pub(super) struct Bufs {
    pub index: Vec<(usize, usize)>,
    pub deps_left: Vec<u32>,
    pub dependents: Vec<Vec<u32>>,
    pub moved: Vec<usize>,
    pub ahead: Vec<bool>,
    pub done: Vec<bool>,
    pub ready: Vec<u32>,
    pub queues: Vec<(LinkKey, VecDeque<u32>)>,
    /// Emptied link queues, for the links of the next batch.
    pub spare_queues: Vec<VecDeque<u32>>,
    pub started: Vec<u64>,
    /// The job list of a one-job batch ([`super::Batch::one`]), emptied.
    pub jobs: Vec<super::Job>,
    /// Step ids a pack is made of (`exec::coalesce`), reused.
    pub ids: Vec<u32>,
}

impl Bufs {
    /// Empties every vector for a batch of `total` steps, keeping their
    /// capacity: per-step vectors get `total` zeroed entries (`started`
    /// only when `timeline`), the others none.
    pub fn reset(&mut self, total: usize, timeline: bool) {
        self.index.clear();
        self.deps_left.clear();
        self.dependents.truncate(total);
        for d in &mut self.dependents {
            d.clear();
        }
        self.dependents.resize_with(total, Vec::new);
        self.moved.clear();
        self.moved.resize(total, 0);
        self.ahead.clear();
        self.ahead.resize(total, false);
        self.done.clear();
        self.done.resize(total, false);
        self.ready.clear();
        for (_, mut q) in self.queues.drain(..) {
            q.clear();
            self.spare_queues.push(q);
        }
        self.started.clear();
        if timeline {
            self.started.resize(total, 0);
        }
    }

    /// Whether the set is small enough to keep.
    fn keep(&self) -> bool {
        self.index.capacity() <= KEPT_STEPS && self.jobs.capacity() <= KEPT_STEPS
    }
}

/// The sets a communicator keeps.
#[derive(Debug, Default)]
// Boxed on purpose: a batch takes and gives back one pointer, not a dozen
// vectors (a move of a few hundred bytes on every call).
#[allow(clippy::vec_box)]
pub struct BufPool(Mutex<Vec<Box<Bufs>>>);

impl BufPool {
    /// A kept set, or a new empty one.
    pub(super) fn take(&self) -> Box<Bufs> {
        self.0.lock().pop().unwrap_or_default()
    }

    /// Keeps `b` for a later batch (unless enough are kept or it is large).
    pub(super) fn give(&self, b: Box<Bufs>) {
        if !b.keep() {
            return;
        }
        let mut kept = self.0.lock();
        if kept.len() < KEPT {
            kept.push(b);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reset_empties_and_sizes_every_vector() {
        let mut b = Bufs::default();
        b.reset(3, false);
        b.index.push((0, 0));
        b.deps_left.push(1);
        b.dependents[2].push(7);
        b.moved[1] = 9;
        b.ahead[0] = true;
        b.done[2] = true;
        b.ready.push(4);
        b.queues.push(((1, 0, true), VecDeque::from([5, 6])));
        b.reset(2, true);
        assert!(b.index.is_empty() && b.deps_left.is_empty() && b.ready.is_empty());
        assert_eq!(b.dependents.len(), 2);
        assert!(b.dependents.iter().all(Vec::is_empty));
        assert_eq!(
            (b.moved.as_slice(), b.ahead.as_slice()),
            (&[0, 0][..], &[false, false][..])
        );
        assert_eq!(
            (b.done.as_slice(), b.started.as_slice()),
            (&[false, false][..], &[0, 0][..])
        );
        assert!(b.queues.is_empty());
        assert_eq!(b.spare_queues.len(), 1);
        assert!(b.spare_queues[0].is_empty() && b.spare_queues[0].capacity() >= 2);
        b.reset(4, false);
        assert_eq!(b.dependents.len(), 4);
        assert!(b.started.is_empty());
    }

    #[test]
    fn the_pool_keeps_few_and_small_sets() {
        let pool = BufPool::default();
        for _ in 0..3 {
            let mut b = Box::<Bufs>::default();
            b.reset(1, false);
            b.index.reserve(8);
            pool.give(b);
        }
        assert_eq!(pool.0.lock().len(), KEPT);
        let mut big = pool.take();
        big.index.reserve(KEPT_STEPS + 1);
        pool.give(big);
        assert_eq!(pool.0.lock().len(), KEPT - 1, "a large set is freed");
        assert!(
            pool.take().index.capacity() >= 8,
            "a kept set keeps its capacity"
        );
    }
}
