//! Transports: how bytes move between two ranks.
//!
//! Every connection is a pair of ordered message streams, one per
//! direction, split into a [`SendLink`] and a [`RecvLink`]. The plans that
//! run over them (see `algo`) are symmetric: both sides know every
//! message's size and order, so a receive always asks for exactly the bytes
//! of the matching send. Byte-stream transports (shm) may deliver a message
//! in pieces; message transports (TCP through `hetccl-net`) deliver it
//! whole. Links never block: `try_*`
//! calls move what they can and return; the executor waits on the links'
//! [`WaitSource`]s when nothing moves.
//!
//! Transports register their capabilities and an α-β cost in
//! [`TRANSPORTS`]; [`choose`] picks the cheapest capable one for each pair.

pub mod arena;
pub mod doorbell;
pub mod net;
pub mod ring;
pub mod shm;

use crate::error::Result;

/// How far apart two ranks are.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Reach {
    /// Threads of one process.
    SameProcess,
    /// Processes of one node.
    SameNode,
    /// Different nodes.
    CrossNode,
}

/// The α-β cost of a transport: a message of `b` bytes takes `alpha_us + b * beta_us_per_byte`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Cost {
    /// Per-message latency, microseconds.
    pub alpha_us: f64,
    /// Per-byte time, microseconds (1 / bandwidth).
    pub beta_us_per_byte: f64,
}

impl Cost {
    /// Time for one message of `bytes`.
    pub fn time_us(&self, bytes: usize) -> f64 {
        self.alpha_us + bytes as f64 * self.beta_us_per_byte
    }
}

/// What a transport declares about itself.
#[derive(Debug)]
pub struct TransportInfo {
    /// Name for logs and the selection table.
    pub name: &'static str,
    /// The farthest reach it can connect.
    pub max_reach: Reach,
    /// Whether it moves host memory.
    pub host_memory: bool,
    /// Whether it moves device memory.
    pub device_memory: bool,
    /// Its cost model (measured on the 2-vCPU reference machine; see docs).
    pub cost: Cost,
    /// The environment switch that disables it, if any.
    pub disabled_by: Option<&'static str>,
}

/// Shared-memory rings (also used between threads of one process).
pub static SHM: TransportInfo = TransportInfo {
    name: "shm",
    max_reach: Reach::SameNode,
    host_memory: true,
    device_memory: false,
    cost: Cost {
        alpha_us: 0.5,
        beta_us_per_byte: 1.0 / 8000.0,
    },
    disabled_by: Some("NCCL_SHM_DISABLE"),
};

/// TCP sockets.
pub static TCP: TransportInfo = TransportInfo {
    name: "tcp",
    max_reach: Reach::CrossNode,
    host_memory: true,
    device_memory: false,
    cost: Cost {
        alpha_us: 10.0,
        beta_us_per_byte: 1.0 / 3000.0,
    },
    disabled_by: None,
};

/// Every transport, in registration order (ties go to the earlier one).
pub static TRANSPORTS: &[&TransportInfo] = &[&SHM, &TCP];

/// Picks the cheapest registered transport that can connect `reach` for a
/// message of `bytes`, skipping those in `disabled`.
pub fn choose(reach: Reach, bytes: usize, disabled: &[&str]) -> Option<&'static TransportInfo> {
    TRANSPORTS
        .iter()
        .copied()
        .filter(|t| t.host_memory && t.max_reach >= reach)
        .filter(|t| !disabled.contains(&t.name))
        .min_by(|a, b| a.cost.time_us(bytes).total_cmp(&b.cost.time_us(bytes)))
}

/// What a link's owner waits on when the link cannot move.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitSource {
    /// The rank's doorbell (shm peers ring it).
    Bell,
    /// Nothing to sleep on: the link must be polled (its sockets are driven
    /// by its `try_*` calls).
    Poll,
}

/// The sending half of a connection: an ordered message stream to one peer.
pub trait SendLink: Send + Sync + std::fmt::Debug {
    /// Moves what it can of the message `src` (the rest of the current
    /// message: the caller passes the unsent remainder, the same range until
    /// it is taken); returns the bytes taken. Byte-stream links may take a
    /// part; message links return 0 until they take it all.
    fn try_send(&self, src: &[u8]) -> Result<usize>;
    /// What to wait on when `try_send` takes nothing.
    fn wait_source(&self) -> WaitSource;
    /// Marks the link dead (abort); the peer's calls then fail.
    fn close(&self);
    /// Prepares a graceful close after the last operation: returns once
    /// every byte this link sent is safe from the link being closed, or at
    /// `deadline`. Transports whose close cannot lose data do nothing.
    fn finish(&self, _deadline: std::time::Instant) {}
}

/// The receiving half of a connection.
pub trait RecvLink: Send + Sync + std::fmt::Debug {
    /// Hands up to `max` received bytes of the current message (`max` is
    /// what remains of it), in whole `elem`-byte elements, to `f` (possibly
    /// in several slices, in order); returns the bytes taken.
    fn try_recv_with(&self, max: usize, elem: usize, f: &mut dyn FnMut(&[u8])) -> Result<usize>;
    /// Moves up to `dst.len()` received bytes of the current message (what
    /// remains of it) into `dst`; returns the bytes taken. The caller
    /// passes the unfilled remainder, the same range until something is
    /// taken, and `dst` stays valid until the operation completes or the
    /// communicator is poisoned. Message links receive straight into it;
    /// the default copies what [`RecvLink::try_recv_with`] hands over.
    fn try_recv_into(&self, dst: &mut [u8]) -> Result<usize> {
        let mut off = 0;
        self.try_recv_with(dst.len(), 1, &mut |s| {
            dst[off..off + s.len()].copy_from_slice(s);
            off += s.len();
        })
    }
    /// What to wait on when nothing is ready.
    fn wait_source(&self) -> WaitSource;
    /// Marks the link dead (abort).
    fn close(&self);
    /// As [`SendLink::finish`], for the receiving half.
    fn finish(&self, _deadline: std::time::Instant) {}
}

/// Both halves of a connection to one peer.
#[derive(Debug)]
pub struct Conn {
    /// Bytes to the peer.
    pub tx: Box<dyn SendLink>,
    /// Bytes from the peer.
    pub rx: Box<dyn RecvLink>,
    /// Which transport made it.
    pub transport: &'static str,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn choice_follows_reach_cost_and_switches() {
        assert_eq!(choose(Reach::SameNode, 8, &[]).unwrap().name, "shm");
        assert_eq!(
            choose(Reach::SameProcess, 1 << 20, &[]).unwrap().name,
            "shm"
        );
        assert_eq!(choose(Reach::CrossNode, 8, &[]).unwrap().name, "tcp");
        assert_eq!(choose(Reach::SameNode, 8, &["shm"]).unwrap().name, "tcp");
        assert!(choose(Reach::CrossNode, 8, &["tcp"]).is_none());
    }
}
