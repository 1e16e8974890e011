//! Growing a communicator (`ncclCommGetUniqueId` + `ncclCommGrow`, NCCL
//! 2.29's contract).
//!
//! One existing rank, the root of the grow, asks its communicator for a
//! fresh unique id ([`issue_uid`]): a new bootstrap root starts on this
//! process, and the id stays pending on the communicator until a grow
//! consumes it. A second id is refused while one is pending, and an id is
//! consumed once. The existing ranks then call the grow together: the root
//! with the id, the others without it. The id travels to them over the
//! parent's authenticated bootstrap ring, and every existing rank keeps its
//! rank in the grown communicator. New ranks join with the id and the rank
//! they were given. The grown communicator is initialised from scratch,
//! like any other: fresh links, every transport and path a new one would
//! take.

use std::sync::Arc;

use super::config::CommConfig;
use super::{init, Comm};
use crate::bootstrap::id::UniqueId;
use crate::bootstrap::{self, Bootstrap};
use crate::error::{Error, Result};

/// Where a communicator's grow uid stands.
#[derive(Debug, Default)]
pub struct GrowUid {
    /// Issued by `ncclCommGetUniqueId`, not consumed yet.
    pending: Option<UniqueId>,
    /// Secrets of the ids grows consumed (to say so when one comes back).
    consumed: Vec<[u8; 32]>,
}

/// Issues a fresh grow id on `c` (`ncclCommGetUniqueId`).
pub fn issue_uid(c: &Comm) -> Result<UniqueId> {
    let e = c.engine()?;
    let mut g = c.grow_uid.lock();
    if g.pending.is_some() {
        return Err(Error::usage(
            "ncclCommGetUniqueId: a unique id issued on this communicator has not been \
             consumed by ncclCommGrow yet",
        ));
    }
    let id = bootstrap::new_root(e.bootstrap.lock().params())?;
    g.pending = Some(id.clone());
    Ok(id)
}

/// Takes the pending uid if it is `id` (the root's side of a grow).
fn consume(c: &Comm, id: &UniqueId) -> Result<()> {
    let mut g = c.grow_uid.lock();
    match &g.pending {
        Some(p) if p == id => {
            g.consumed.push(id.secret);
            g.pending = None;
            Ok(())
        }
        _ if g.consumed.contains(&id.secret) => Err(Error::usage(
            "ncclCommGrow: this unique id was already consumed by an earlier grow",
        )),
        _ => Err(Error::usage(
            "ncclCommGrow: the unique id was not issued by ncclCommGetUniqueId on this \
             communicator",
        )),
    }
}

/// The id of a grow, as every existing rank learns it: the root passes
/// `mine`, the others `None`; exactly one must have it.
fn agree_on_uid(bs: &mut Bootstrap, mine: Option<&UniqueId>) -> Result<UniqueId> {
    let blob = mine
        .map(|id| id.encode().internal.to_vec())
        .unwrap_or_default();
    let all = bs.allgather(&blob, 128)?;
    let givers: Vec<usize> = (0..all.len()).filter(|&r| !all[r].is_empty()).collect();
    match givers.as_slice() {
        [r] => {
            let raw: [u8; 128] = all[*r]
                .as_slice()
                .try_into()
                .map_err(|_| Error::Remote("ncclCommGrow: a malformed unique id".into()))?;
            UniqueId::decode(&hetccl_abi::ncclUniqueId { internal: raw })
        }
        [] => Err(Error::usage(
            "ncclCommGrow: no existing rank passed the unique id (the root of the grow \
             passes the id from ncclCommGetUniqueId, the others NULL)",
        )),
        many => Err(Error::usage(format!(
            "ncclCommGrow: ranks {many:?} all passed a unique id; exactly one existing rank \
             (the root of the grow) passes it"
        ))),
    }
}

/// The existing ranks' side of a grow to `nranks` ranks: the root passes
/// the id it was issued, the others `None`. Returns the grown
/// communicator, in which this rank keeps its rank. Every existing rank
/// must call it (it runs an all-gather on the parent's bootstrap).
pub fn grow_existing(
    parent: &Comm,
    nranks: usize,
    id: Option<UniqueId>,
    cfg: CommConfig,
) -> Result<Arc<Comm>> {
    let id = prepare(parent, nranks, id)?;
    init::init_rank(&id, nranks, parent.rank, cfg)
}

/// Checks the call, agrees on the id over the parent's bootstrap, and
/// returns it (for [`grow_existing`] and its nonblocking form, which then
/// initialise the grown communicator).
pub fn prepare(parent: &Comm, nranks: usize, id: Option<UniqueId>) -> Result<UniqueId> {
    let e = parent.engine()?;
    if nranks <= parent.nranks {
        return Err(Error::arg(format!(
            "ncclCommGrow: nRanks {nranks} must exceed the communicator's {} ranks",
            parent.nranks
        )));
    }
    // The root's id is checked before the exchange, but a bad one still
    // takes part (as no id), so that no rank waits for it.
    let checked = match &id {
        Some(id) => consume(parent, id).map(|()| Some(id)),
        None => Ok(None),
    };
    let mut bs = e.bootstrap.lock();
    let agreed = agree_on_uid(&mut bs, checked.as_ref().ok().copied().flatten());
    drop(bs);
    checked?;
    let agreed = agreed?;
    tracing::info!(target: "hetccl::INIT",
        "{} rank {}: grows from {} to {nranks} ranks", e.settings.label(e.comm_hash),
        parent.rank, parent.nranks);
    Ok(agreed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_id_is_consumed_once() {
        let c = Comm::new(2, 0);
        let id = UniqueId::generate("127.0.0.1:1".parse().unwrap()).unwrap();
        assert!(consume(&c, &id)
            .unwrap_err()
            .to_string()
            .contains("not issued"));
        c.grow_uid.lock().pending = Some(id.clone());
        consume(&c, &id).unwrap();
        let e = consume(&c, &id).unwrap_err().to_string();
        assert!(e.contains("already consumed"), "{e}");
    }
}
