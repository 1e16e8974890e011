//! `NCCL_ALGO` parsing, in NCCL's syntax (2.24 and later).
//!
//! The value is a `;`-separated list of entries. An entry is either a list
//! of algorithms, which applies to every function NCCL's `NCCL_ALGO`
//! governs (AllReduce, Broadcast, Reduce, AllGather, ReduceScatter), or
//! `function:list`, which applies to one function and overrides the
//! former. A list is comma-separated; a leading `^` turns it into an
//! exclusion list. Names are case-insensitive; an unknown name is an error.
//! Examples: `Ring`, `ring,tree`, `^tree`,
//! `ring;allreduce:tree,ring;broadcast:^tree`.
//!
//! NCCL's names map to ours: `Ring` → Ring, `Tree` → Tree,
//! `CollNetDirect`/`CollNetChain`/`CollNet`/`NVLSTree` → Hierarchical
//! (they combine an intra-node and an inter-node stage), `NVLS` → Direct (a
//! one-shot reduction), `PAT` → HalvingDoubling (logarithmic steps). Our own
//! names are accepted too: `Direct`, `HalvingDoubling`, `Hierarchical`,
//! `Pairwise`. Besides NCCL's functions, `alltoall:`, `gather:` and
//! `scatter:` entries restrict those collectives; plain lists leave them
//! alone, and Send/Recv are never filtered.

use super::{Algorithm, Collective};

/// Why an `NCCL_ALGO` value was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FilterError {
    /// An algorithm name nobody knows.
    #[error("NCCL_ALGO: unknown algorithm {0:?}")]
    UnknownAlgorithm(String),
    /// A function name nobody knows.
    #[error("NCCL_ALGO: unknown function {0:?}")]
    UnknownFunction(String),
    /// A list with no names.
    #[error("NCCL_ALGO: empty algorithm list in {0:?}")]
    EmptyList(String),
}

/// A set of algorithms, one bit per [`Algorithm`] in `Algorithm::ALL` order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Set(u8);

impl Set {
    const ALL: Set = Set((1 << Algorithm::ALL.len()) - 1);

    fn bit(a: Algorithm) -> u8 {
        1 << Algorithm::ALL.iter().position(|&x| x == a).unwrap_or(0)
    }

    fn has(self, a: Algorithm) -> bool {
        self.0 & Self::bit(a) != 0
    }
}

/// Which algorithms each collective may use.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct AlgoFilter {
    default: Option<Set>,
    per: Vec<(Collective, Set)>,
    text: String,
}

/// The algorithm an NCCL or hetccl name stands for.
fn algorithm(name: &str) -> Option<Algorithm> {
    Some(match name.to_ascii_lowercase().as_str() {
        "ring" => Algorithm::Ring,
        "tree" => Algorithm::Tree,
        "collnet" | "collnetdirect" | "collnetchain" | "nvlstree" | "hierarchical" => {
            Algorithm::Hierarchical
        }
        "nvls" | "direct" => Algorithm::Direct,
        "pat" | "halvingdoubling" => Algorithm::HalvingDoubling,
        "pairwise" => Algorithm::Pairwise,
        _ => return None,
    })
}

fn function(name: &str) -> Option<Collective> {
    let lower = name.to_ascii_lowercase();
    Collective::ALL
        .into_iter()
        .filter(|c| !matches!(c, Collective::Send | Collective::Recv))
        .find(|c| c.name() == lower)
}

fn parse_list(list: &str, entry: &str) -> Result<Set, FilterError> {
    let list = list.trim();
    let (exclude, names) = match list.strip_prefix('^') {
        Some(rest) => (true, rest),
        None => (false, list),
    };
    let mut set = 0u8;
    let mut any = false;
    for name in names.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let a = algorithm(name).ok_or_else(|| FilterError::UnknownAlgorithm(name.to_string()))?;
        set |= Set::bit(a);
        any = true;
    }
    if !any {
        return Err(FilterError::EmptyList(entry.to_string()));
    }
    Ok(if exclude {
        Set(Set::ALL.0 & !set)
    } else {
        Set(set)
    })
}

impl AlgoFilter {
    /// No restriction (an unset or empty `NCCL_ALGO`).
    pub fn all() -> Self {
        Self::default()
    }

    /// Parses an `NCCL_ALGO` value (see the module docs).
    pub fn parse(value: &str) -> Result<Self, FilterError> {
        let mut f = Self {
            text: value.trim().to_string(),
            ..Self::default()
        };
        for entry in value.split(';').map(str::trim).filter(|s| !s.is_empty()) {
            match entry.split_once(':') {
                Some((func, list)) => {
                    let coll = function(func.trim())
                        .ok_or_else(|| FilterError::UnknownFunction(func.to_string()))?;
                    let set = parse_list(list, entry)?;
                    f.per.retain(|(c, _)| *c != coll);
                    f.per.push((coll, set));
                }
                None => f.default = Some(parse_list(entry, entry)?),
            }
        }
        Ok(f)
    }

    /// Whether `coll` may use `algo`.
    pub fn allows(&self, coll: Collective, algo: Algorithm) -> bool {
        if let Some((_, set)) = self.per.iter().find(|(c, _)| *c == coll) {
            return set.has(algo);
        }
        let governed = matches!(
            coll,
            Collective::AllReduce
                | Collective::Broadcast
                | Collective::Reduce
                | Collective::AllGather
                | Collective::ReduceScatter
        );
        match self.default {
            Some(set) if governed => set.has(algo),
            _ => true,
        }
    }

    /// The algorithms `coll` may use, one bit per [`Algorithm`] in
    /// `Algorithm::ALL` order (a plan cache key).
    pub fn mask(&self, coll: Collective) -> u8 {
        Algorithm::ALL
            .iter()
            .filter(|&&a| self.allows(coll, a))
            .fold(0, |m, &a| m | Set::bit(a))
    }

    /// Whether the filter restricts nothing.
    pub fn is_unrestricted(&self) -> bool {
        self.default.is_none() && self.per.is_empty()
    }

    /// The text it was parsed from (empty for [`AlgoFilter::all`]).
    pub fn text(&self) -> &str {
        &self.text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn syntax() {
        let f = AlgoFilter::parse("Ring,TREE").unwrap();
        assert!(f.allows(Collective::AllReduce, Algorithm::Ring));
        assert!(f.allows(Collective::AllReduce, Algorithm::Tree));
        assert!(!f.allows(Collective::AllReduce, Algorithm::Direct));
        assert!(f.allows(Collective::AlltoAll, Algorithm::Pairwise));
        assert!(f.allows(Collective::Send, Algorithm::Direct));

        let f = AlgoFilter::parse("^tree").unwrap();
        assert!(!f.allows(Collective::Broadcast, Algorithm::Tree));
        assert!(f.allows(Collective::Broadcast, Algorithm::Ring));

        let f =
            AlgoFilter::parse(" ring ; allreduce: tree,CollNetDirect ;broadcast:^ring").unwrap();
        assert!(f.allows(Collective::AllReduce, Algorithm::Hierarchical));
        assert!(!f.allows(Collective::AllReduce, Algorithm::Ring));
        assert!(!f.allows(Collective::Broadcast, Algorithm::Ring));
        assert!(f.allows(Collective::Broadcast, Algorithm::Direct));
        assert!(f.allows(Collective::Reduce, Algorithm::Ring));
        assert!(!f.allows(Collective::Reduce, Algorithm::Tree));

        assert!(AlgoFilter::parse("").unwrap().is_unrestricted());
        assert_eq!(
            AlgoFilter::parse("Rung"),
            Err(FilterError::UnknownAlgorithm("Rung".into()))
        );
        assert_eq!(
            AlgoFilter::parse("allreduxe:ring"),
            Err(FilterError::UnknownFunction("allreduxe".into()))
        );
        assert!(matches!(
            AlgoFilter::parse("allreduce:"),
            Err(FilterError::EmptyList(_))
        ));
        assert!(matches!(
            AlgoFilter::parse("^"),
            Err(FilterError::EmptyList(_))
        ));
        let f = AlgoFilter::parse("NVLS,pat,Pairwise,hierarchical").unwrap();
        assert!(f.allows(Collective::AllReduce, Algorithm::Direct));
        assert!(f.allows(Collective::AllReduce, Algorithm::HalvingDoubling));
        assert!(f.allows(Collective::AllReduce, Algorithm::Hierarchical));
        assert!(!f.allows(Collective::AllReduce, Algorithm::Ring));
        let f = AlgoFilter::parse("alltoall:direct").unwrap();
        assert!(!f.allows(Collective::AlltoAll, Algorithm::Pairwise));
    }
}
