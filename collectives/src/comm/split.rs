//! Child communicators: `ncclCommSplit` and `ncclCommShrink`.
//!
//! Split: every parent rank contributes (color, key) through the parent's
//! bootstrap all-gather; each color's first member (by key, then parent
//! rank) creates a fresh unique id, which a second all-gather distributes;
//! the members then initialise the child like any communicator.
//!
//! Shrink: the excluded ranks take no part (they may be dead), so the
//! parent's ring cannot be used. The lowest surviving rank creates the id and
//! hands it to each survivor over a direct, authenticated connection.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use hetccl_abi::NCCL_SPLIT_NOCOLOR;

use super::config::CommConfig;
use super::{init, Comm};
use crate::bootstrap::id::UniqueId;
use crate::bootstrap::{self, frame, Purpose};
use crate::error::{Error, Result};

/// The members of `color` in child-rank order: sorted by key, ties by parent rank.
pub fn members(pairs: &[(i32, i32)], color: i32) -> Vec<usize> {
    let mut m: Vec<usize> = (0..pairs.len()).filter(|&r| pairs[r].0 == color).collect();
    m.sort_by_key(|&r| (pairs[r].1, r));
    m
}

/// Splits `parent`; returns `None` for ranks that passed NCCL_SPLIT_NOCOLOR.
pub fn split(parent: &Comm, color: i32, key: i32, cfg: CommConfig) -> Result<Option<Arc<Comm>>> {
    let e = parent.engine()?;
    let mut bs = e.bootstrap.lock();
    let mut mine = color.to_be_bytes().to_vec();
    mine.extend_from_slice(&key.to_be_bytes());
    let all = bs.allgather(&mine, 8)?;
    let pairs = all
        .iter()
        .map(|b| {
            let b: [u8; 8] = b
                .as_slice()
                .try_into()
                .map_err(|_| Error::Remote("bad split record".into()))?;
            Ok((
                i32::from_be_bytes(b[..4].try_into().expect("4")),
                i32::from_be_bytes(b[4..].try_into().expect("4")),
            ))
        })
        .collect::<Result<Vec<(i32, i32)>>>()?;
    let group = if color == NCCL_SPLIT_NOCOLOR {
        Vec::new()
    } else {
        members(&pairs, color)
    };
    let leader = group.first() == Some(&parent.rank);
    let id_bytes = if leader {
        bootstrap::new_root(bs.params())?.encode().internal.to_vec()
    } else {
        Vec::new()
    };
    let ids = bs.allgather(&id_bytes, 128)?;
    drop(bs);
    if color == NCCL_SPLIT_NOCOLOR {
        return Ok(None);
    }
    let raw: [u8; 128] = ids[group[0]]
        .as_slice()
        .try_into()
        .map_err(|_| Error::Remote("split: the color leader sent no id".into()))?;
    let id = UniqueId::decode(&hetccl_abi::ncclUniqueId { internal: raw })?;
    let me = group
        .iter()
        .position(|&r| r == parent.rank)
        .expect("member of own color");
    tracing::info!(target: "hetccl::INIT", "split: parent rank {} -> color {color} rank {me}/{}", parent.rank, group.len());
    init::init_rank(&id, group.len(), me, cfg).map(Some)
}

/// Shrinks `parent` to the ranks not in `excluded`. With `abort`, the
/// parent's pending operations are stopped first (the parent stays unusable).
pub fn shrink(
    parent: &Comm,
    excluded: &[usize],
    abort: bool,
    cfg: CommConfig,
) -> Result<Arc<Comm>> {
    let e = parent.engine()?;
    if abort {
        e.stop.abort();
        parent.revoked.store(true, Ordering::Release);
    }
    // Wait for any operation still running on another thread (it ends
    // within its own stall limit).
    let wait = e.settings.timeout + std::time::Duration::from_secs(1);
    drop(e.exec_gate.enter_for(wait).ok_or_else(|| {
        Error::Timeout("shrink: an operation on another thread did not end".into())
    })?);
    let survivors: Vec<usize> = (0..parent.nranks)
        .filter(|r| !excluded.contains(r))
        .collect();
    let me = survivors
        .iter()
        .position(|&r| r == parent.rank)
        .ok_or_else(|| Error::usage("this rank is in the exclude list of its own shrink"))?;
    let bs = e.bootstrap.lock();
    let dl = e.settings.deadline();
    let id = if me == 0 {
        let id = bootstrap::new_root(bs.params())?;
        let raw = id.encode();
        for &r in &survivors[1..] {
            let mut s = bs.connect_to(bs.cards[r].addr, Purpose::Handoff, dl)?;
            frame::send(&mut s, &raw.internal, dl)?;
        }
        id
    } else {
        let mut s = bs.accept_from(Purpose::Handoff, survivors[0], dl)?;
        let raw: [u8; 128] = frame::recv(&mut s, 128, dl)?
            .try_into()
            .map_err(|_| Error::Remote("shrink: bad id".into()))?;
        UniqueId::decode(&hetccl_abi::ncclUniqueId { internal: raw })?
    };
    drop(bs);
    tracing::info!(target: "hetccl::INIT", "shrink: parent rank {} -> rank {me}/{}", parent.rank, survivors.len());
    init::init_rank(&id, survivors.len(), me, cfg)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_follow_key_then_rank() {
        let pairs = [(0, 5), (1, 0), (0, 1), (0, 1), (-1, 0)];
        assert_eq!(members(&pairs, 0), vec![2, 3, 0]);
        assert_eq!(members(&pairs, 1), vec![1]);
        assert!(members(&pairs, 7).is_empty());
    }
}
