//! Topology: which node each rank is on.
//!
//! A node is named by a host hash: a hash of the hostname and the kernel's
//! boot id, or of `HETCCL_HOST_ID` when set (tests use it to make "nodes" out
//! of network namespaces or plain processes). [`host`] counts processing
//! units and NUMA nodes through hwloc; GPU and NIC placement come later.

pub mod host;
mod layout;

pub use layout::Topology;

use sha2::{Digest, Sha256};

/// This process's host hash; `host_id` (`HETCCL_HOST_ID`) replaces the
/// host's identity when set.
pub fn host_hash(host_id: Option<&str>) -> u64 {
    let mut h = Sha256::new();
    match host_id {
        Some(id) => {
            h.update(b"id:");
            h.update(id.as_bytes());
        }
        None => {
            h.update(b"host:");
            h.update(hostname().as_bytes());
            if let Ok(b) = std::fs::read_to_string("/proc/sys/kernel/random/boot_id") {
                h.update(b.trim().as_bytes());
            }
        }
    }
    u64::from_be_bytes(h.finalize()[..8].try_into().expect("8 bytes"))
}

/// The hostname, or "localhost" if it cannot be read.
pub fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: a writable buffer of the given length.
    let r = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if r != 0 {
        return "localhost".into();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

/// The node layout of a communicator: for each rank, the index of its node
/// (nodes numbered in order of their lowest rank).
pub fn node_of_ranks(host_hashes: &[u64]) -> Vec<usize> {
    let mut seen: Vec<u64> = Vec::new();
    host_hashes
        .iter()
        .map(|h| match seen.iter().position(|x| x == h) {
            Some(i) => i,
            None => {
                seen.push(*h);
                seen.len() - 1
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nodes_are_numbered_by_first_rank() {
        assert_eq!(node_of_ranks(&[9, 9, 4, 9, 4, 1]), vec![0, 0, 1, 0, 1, 2]);
        assert!(node_of_ranks(&[]).is_empty());
        assert!(!hostname().is_empty());
    }
}
