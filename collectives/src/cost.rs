//! The one cost model: how far apart two ranks are ([`LinkClass`]), which
//! transport joins them ([`TransportKind`]), and what a message over it
//! costs ([`CostModel`]).
//!
//! A communicator builds its model once at init and keeps it on its engine;
//! algorithm selection, `ncclGroupSimulateEnd` and
//! `hetcclCommSelectionTable` read it from there. The numbers are α-β
//! estimates for a host-memory cluster; `HETCCL_TUNE=init` replaces them
//! with measured ones (`crate::tune::calibrate`). Each transport declares its reach and capabilities
//! through its [`TransportKind`]; a communicator joins each pair of ranks
//! with the nearest-reaching enabled one ([`TransportKind::for_class`]).

use std::fmt;

/// How far apart two ranks are.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum LinkClass {
    /// Threads of one process.
    SameProcess,
    /// Processes of one node.
    SameNode,
    /// Different nodes.
    CrossNode,
}

impl LinkClass {
    /// Every class, nearest first.
    pub const ALL: [LinkClass; 3] = [Self::SameProcess, Self::SameNode, Self::CrossNode];
}

/// The transports hetccl can join two ranks with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TransportKind {
    /// Shared-memory rings in the node's arena.
    Shm,
    /// RDMA verbs (InfiniBand / RoCE) through `nccl-net-plugin::ib`; only
    /// between ranks whose ports share a fabric.
    Verbs,
    /// TCP sockets through `nccl-net-plugin`.
    Tcp,
}

impl TransportKind {
    /// Every transport, in preference order for equal costs.
    pub const ALL: [TransportKind; 3] = [Self::Shm, Self::Verbs, Self::Tcp];

    /// The name in logs and tables.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Shm => "shm",
            Self::Verbs => "verbs",
            Self::Tcp => "tcp",
        }
    }

    /// The farthest class it can join.
    pub const fn max_reach(self) -> LinkClass {
        match self {
            Self::Shm => LinkClass::SameNode,
            Self::Verbs | Self::Tcp => LinkClass::CrossNode,
        }
    }

    /// Its own cost between nodes, where it differs from the model's
    /// cross-node default (TCP): verbs at ~5 µs and ~10 GB/s.
    pub const fn cross_node_cost(self) -> Option<LinkCost> {
        match self {
            Self::Verbs => Some(LinkCost {
                alpha_us: 5.0,
                beta_us_per_byte: 1.0 / 10_000.0,
            }),
            _ => None,
        }
    }

    /// Whether it moves host memory.
    pub const fn host_memory(self) -> bool {
        true
    }
}

impl fmt::Display for TransportKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Latency and inverse bandwidth of one link.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LinkCost {
    /// Latency in microseconds.
    pub alpha_us: f64,
    /// Microseconds per byte (1 / bandwidth).
    pub beta_us_per_byte: f64,
}

impl LinkCost {
    /// Time for one message of `bytes`.
    pub fn time_us(&self, bytes: usize) -> f64 {
        self.alpha_us + bytes as f64 * self.beta_us_per_byte
    }
}

/// The α-β model's parameters: latency and bandwidth per link class.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CostModel {
    /// Ranks in one process.
    pub same_process: LinkCost,
    /// Ranks on one node.
    pub same_node: LinkCost,
    /// Ranks on different nodes.
    pub cross_node: LinkCost,
    /// Sender-side overhead per message, microseconds.
    pub msg_overhead_us: f64,
    /// Local reduction, microseconds per byte.
    pub reduce_us_per_byte: f64,
    /// Bandwidth lost per extra concurrent peer in direct (all-to-all
    /// style) patterns: their bandwidth term is multiplied by
    /// `1 + direct_congestion·(peers-1)`.
    pub direct_congestion: f64,
}

impl Default for CostModel {
    /// Defaults for a host-memory cluster: memcpy at ~20 GB/s, shared memory
    /// at ~10 GB/s with 1 µs latency, TCP over 10 GbE at ~1.2 GB/s with
    /// 25 µs latency.
    fn default() -> Self {
        Self {
            same_process: LinkCost {
                alpha_us: 0.2,
                beta_us_per_byte: 1.0 / 20_000.0,
            },
            same_node: LinkCost {
                alpha_us: 1.0,
                beta_us_per_byte: 1.0 / 10_000.0,
            },
            cross_node: LinkCost {
                alpha_us: 25.0,
                beta_us_per_byte: 1.0 / 1_200.0,
            },
            msg_overhead_us: 0.5,
            reduce_us_per_byte: 1.0 / 8_000.0,
            direct_congestion: 0.1,
        }
    }
}

impl CostModel {
    /// The cost of a link class.
    pub fn link(&self, class: LinkClass) -> LinkCost {
        match class {
            LinkClass::SameProcess => self.same_process,
            LinkClass::SameNode => self.same_node,
            LinkClass::CrossNode => self.cross_node,
        }
    }
}

impl TransportKind {
    /// The transport that joins ranks of `class`: the first in
    /// [`TransportKind::ALL`] (nearest first) that reaches that far, moves
    /// host memory and is `enabled`.
    pub fn for_class(class: LinkClass, enabled: impl Fn(TransportKind) -> bool) -> Option<Self> {
        Self::ALL
            .into_iter()
            .find(|t| t.host_memory() && t.max_reach() >= class && enabled(*t))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_transport_choice_follows_reach_and_switches() {
        let all = |_| true;
        for (class, want) in [
            (LinkClass::SameProcess, TransportKind::Shm),
            (LinkClass::SameNode, TransportKind::Shm),
            (LinkClass::CrossNode, TransportKind::Verbs),
        ] {
            assert_eq!(TransportKind::for_class(class, all), Some(want));
        }
        let no_verbs = |t| t != TransportKind::Verbs;
        assert_eq!(
            TransportKind::for_class(LinkClass::CrossNode, no_verbs),
            Some(TransportKind::Tcp)
        );
        assert_eq!(TransportKind::Verbs.max_reach(), LinkClass::CrossNode);
        assert!(TransportKind::Verbs.cross_node_cost().is_some());
        let no_shm = |t| t != TransportKind::Shm;
        assert_eq!(
            TransportKind::for_class(LinkClass::SameNode, no_shm),
            Some(TransportKind::Verbs),
            "without shm, ranks of a node share the NIC as NCCL's NET does"
        );
        let tcp_only = |t| t == TransportKind::Tcp;
        assert_eq!(
            TransportKind::for_class(LinkClass::SameNode, tcp_only),
            Some(TransportKind::Tcp)
        );
        assert_eq!(
            TransportKind::for_class(LinkClass::CrossNode, |t| t == TransportKind::Shm),
            None
        );
    }

    #[test]
    fn links_are_priced_by_class() {
        let m = CostModel::default();
        assert_eq!(m.link(LinkClass::SameNode), m.same_node);
        assert_eq!(m.link(LinkClass::SameProcess), m.same_process);
        assert_eq!(m.link(LinkClass::CrossNode), m.cross_node);
        let a = m.link(LinkClass::CrossNode).time_us(1 << 20);
        assert!(a > m.link(LinkClass::SameNode).time_us(1 << 20));
    }
}
