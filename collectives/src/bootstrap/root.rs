//! The root: a thread started by `ncclGetUniqueId` that collects every
//! rank's card and sends each rank the full table.
//!
//! Connections are admitted concurrently ([`Gate`]): each has its own
//! authentication deadline, so silent or slow connections do not hold up
//! the real ranks. Connections that fail authentication, send a malformed
//! card, claim a rank twice or disagree on the size are dropped and logged;
//! the root keeps waiting for the real ranks until the deadline.

use std::net::{TcpListener, TcpStream};
use std::time::Instant;

use super::card::{decode_table, encode_table, Card, CARD_BYTES};
use super::frame;
use super::gate::Gate;
use crate::error::{Error, Result};

/// The hello a rank sends the root: `ROOT` then its card.
pub const ROOT_TAG: &[u8; 4] = b"ROOT";

/// Serves one communicator's rendezvous on `listener`, until every rank has
/// its table or `deadline` passes.
pub fn serve(listener: TcpListener, secret: [u8; 32], deadline: Instant) -> Result<()> {
    let mut conns: Vec<(TcpStream, Card)> = Vec::new();
    let mut nranks: Option<usize> = None;
    let mut gate = Gate::new();
    while nranks.is_none_or(|n| conns.len() < n) {
        let (s, hello) = gate.next(&listener, &secret, deadline)?;
        let card = match parse_root_hello(&hello) {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(target: "hetccl::BOOTSTRAP", "root: refused a connection from {:?}: {e}", s.peer_addr().ok());
                continue;
            }
        };
        let n = card.nranks as usize;
        if nranks.is_some_and(|m| m != n) || conns.iter().any(|(_, c)| c.rank == card.rank) {
            tracing::warn!(target: "hetccl::BOOTSTRAP",
                "root: refused rank {} of {n}: size mismatch or duplicate rank", card.rank);
            continue;
        }
        nranks = Some(n);
        conns.push((s, card));
    }
    conns.sort_by_key(|(_, c)| c.rank);
    let n = conns.len();
    let table = encode_table(&conns.iter().map(|(_, c)| c.clone()).collect::<Vec<_>>());
    debug_assert!(decode_table(&table, n).is_ok());
    for (s, c) in &mut conns {
        if let Err(e) = frame::send(s, &table, deadline) {
            tracing::warn!(target: "hetccl::BOOTSTRAP", "root: could not send the table to rank {}: {e}", c.rank);
        }
    }
    tracing::info!(target: "hetccl::BOOTSTRAP", "root: {n} ranks joined");
    Ok(())
}

/// Decodes a rank's hello to the root (its card); public for the
/// `boot_hello` fuzz target.
#[doc(hidden)]
pub fn parse_root_hello(hello: &[u8]) -> Result<Card> {
    if hello.len() != 4 + CARD_BYTES || &hello[..4] != ROOT_TAG {
        return Err(Error::Remote("not a root hello".into()));
    }
    Card::decode(&hello[4..])
}

/// Starts [`serve`] on a thread. The thread ends by itself when done or at
/// the deadline; errors are logged.
pub fn spawn(listener: TcpListener, secret: [u8; 32], deadline: Instant) -> Result<()> {
    std::thread::Builder::new()
        .name("hetccl-root".into())
        .spawn(move || {
            if let Err(e) = serve(listener, secret, deadline) {
                tracing::warn!(target: "hetccl::BOOTSTRAP", "root ended: {e}");
            }
        })
        .map(drop)
        .map_err(|e| Error::System(format!("spawn root thread: {e}")))
}
