//! Where ranks live: a node id (and optionally a process id) per rank.
//! Every schedule and the cost model read it; communicator init builds it
//! from the bootstrap's cards.

use crate::algo::Rank;

/// Where ranks live: a node id (and optionally a process id) per rank.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Topology {
    node_of: Vec<u32>,
    process_of: Option<Vec<u32>>,
}

impl Topology {
    /// `nranks` ranks on one node, one process each.
    pub fn flat(nranks: u32) -> Self {
        Self {
            node_of: vec![0; nranks as usize],
            process_of: None,
        }
    }

    /// The node id of each rank (`node_of[rank]`).
    pub fn from_nodes(node_of: Vec<u32>) -> Self {
        Self {
            node_of,
            process_of: None,
        }
    }

    /// Adds a process id per rank (ranks sharing a process share memory
    /// directly). Ignored unless it has one entry per rank.
    pub fn with_processes(mut self, process_of: Vec<u32>) -> Self {
        if process_of.len() == self.node_of.len() {
            self.process_of = Some(process_of);
        }
        self
    }

    /// Number of ranks.
    pub fn nranks(&self) -> u32 {
        self.node_of.len() as u32
    }

    /// The node id of `rank`.
    pub fn node(&self, rank: Rank) -> u32 {
        self.node_of.get(rank as usize).copied().unwrap_or(0)
    }

    /// The process id of `rank`, when process ids are known.
    pub fn process(&self, rank: Rank) -> Option<u32> {
        self.process_of.as_ref()?.get(rank as usize).copied()
    }

    /// Whether two ranks share a node.
    pub fn same_node(&self, a: Rank, b: Rank) -> bool {
        self.node(a) == self.node(b)
    }

    /// Whether two ranks share a process (only known with process ids).
    pub fn same_process(&self, a: Rank, b: Rank) -> bool {
        match &self.process_of {
            Some(p) => self.same_node(a, b) && p.get(a as usize) == p.get(b as usize),
            None => false,
        }
    }

    /// The ranks of each node, nodes in ascending id order, ranks ascending.
    pub fn nodes(&self) -> Vec<Vec<Rank>> {
        let mut by_node: std::collections::BTreeMap<u32, Vec<Rank>> =
            std::collections::BTreeMap::new();
        for (r, &id) in self.node_of.iter().enumerate() {
            by_node.entry(id).or_default().push(r as Rank);
        }
        by_node.into_values().collect()
    }

    /// Whether every rank shares one process (only known with process ids).
    pub fn single_process(&self) -> bool {
        match &self.process_of {
            Some(p) => self.nodes().len() <= 1 && p.windows(2).all(|w| w[0] == w[1]),
            None => false,
        }
    }
}
