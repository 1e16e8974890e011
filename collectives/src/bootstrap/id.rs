//! The unique id: what `ncclGetUniqueId` writes into the 128-byte
//! `ncclUniqueId`, and its decoder.
//!
//! Layout (all integers big-endian):
//!
//! | bytes | field |
//! |---|---|
//! | 0..4 | magic `HCID` |
//! | 4 | format version (1) |
//! | 5 | address family: 4 or 6 |
//! | 6..8 | root port |
//! | 8..24 | root IP (IPv4 in the first 4 bytes) |
//! | 24..56 | secret: 256 random bits that authenticate every connection |
//! | 56..128 | zero |
//!
//! Ids travel through user code (a c10d store, MPI, a file), so the decoder
//! treats them as untrusted input.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use hetccl_abi::ncclUniqueId;

use crate::error::{Error, Result};

const MAGIC: &[u8; 4] = b"HCID";
const VERSION: u8 = 1;
/// Bytes of secret carried by an id.
pub const SECRET_BYTES: usize = 32;

/// A decoded unique id.
#[derive(Clone, PartialEq, Eq)]
pub struct UniqueId {
    /// Where the root listens.
    pub root: SocketAddr,
    /// The shared secret.
    pub secret: [u8; SECRET_BYTES],
}

impl std::fmt::Debug for UniqueId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "UniqueId(root {})", self.root)
    }
}

impl UniqueId {
    /// A new id for a root at `root`, with a fresh random secret.
    pub fn generate(root: SocketAddr) -> Result<Self> {
        let mut secret = [0u8; SECRET_BYTES];
        getrandom::getrandom(&mut secret)
            .map_err(|e| Error::System(format!("getrandom: {e}").into()))?;
        Ok(Self { root, secret })
    }

    /// A short, non-secret hash naming the communicator (for logs, shm names
    /// and trace ids). Every rank computes the same value.
    pub fn comm_hash(&self) -> u64 {
        use sha2::{Digest, Sha256};
        let mut h = Sha256::new();
        h.update(b"hetccl-comm-hash");
        h.update(self.secret);
        let d = h.finalize();
        u64::from_be_bytes(d[..8].try_into().expect("8 bytes"))
    }

    /// Encodes into NCCL's 128-byte id.
    pub fn encode(&self) -> ncclUniqueId {
        let mut b = [0u8; 128];
        b[..4].copy_from_slice(MAGIC);
        b[4] = VERSION;
        match self.root.ip() {
            IpAddr::V4(a) => {
                b[5] = 4;
                b[8..12].copy_from_slice(&a.octets());
            }
            IpAddr::V6(a) => {
                b[5] = 6;
                b[8..24].copy_from_slice(&a.octets());
            }
        }
        b[6..8].copy_from_slice(&self.root.port().to_be_bytes());
        b[24..56].copy_from_slice(&self.secret);
        ncclUniqueId { internal: b }
    }

    /// Decodes an id, rejecting anything that is not one of ours.
    pub fn decode(id: &ncclUniqueId) -> Result<Self> {
        let b = &id.internal;
        if &b[..4] != MAGIC {
            return Err(Error::arg(
                "unique id was not made by hetccl's ncclGetUniqueId (bad magic)",
            ));
        }
        if b[4] != VERSION {
            return Err(Error::arg(format!(
                "unique id format {} is not supported",
                b[4]
            )));
        }
        let port = u16::from_be_bytes([b[6], b[7]]);
        let ip = match b[5] {
            4 => IpAddr::V4(Ipv4Addr::new(b[8], b[9], b[10], b[11])),
            6 => IpAddr::V6(Ipv6Addr::from(
                <[u8; 16]>::try_from(&b[8..24]).expect("16 bytes"),
            )),
            f => {
                return Err(Error::arg(format!(
                    "unique id has unknown address family {f}"
                )))
            }
        };
        if port == 0 || ip.is_unspecified() {
            return Err(Error::arg("unique id has no root address"));
        }
        if b[56..].iter().any(|&x| x != 0) {
            return Err(Error::arg("unique id has garbage in its reserved bytes"));
        }
        let mut secret = [0u8; SECRET_BYTES];
        secret.copy_from_slice(&b[24..56]);
        Ok(Self {
            root: SocketAddr::new(ip, port),
            secret,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_v4_v6_and_rejects() {
        for root in ["127.0.0.1:5000", "[::1]:6000"] {
            let id = UniqueId::generate(root.parse().unwrap()).unwrap();
            let back = UniqueId::decode(&id.encode()).unwrap();
            assert_eq!(back, id);
            assert_eq!(back.comm_hash(), id.comm_hash());
        }
        let a = UniqueId::generate("127.0.0.1:1".parse().unwrap()).unwrap();
        let b = UniqueId::generate("127.0.0.1:1".parse().unwrap()).unwrap();
        assert_ne!(a.secret, b.secret, "secrets are random");
        let mut raw = a.encode();
        raw.internal[0] = b'X';
        assert!(UniqueId::decode(&raw).is_err());
        let mut raw = a.encode();
        raw.internal[5] = 9;
        assert!(UniqueId::decode(&raw).is_err());
        let mut raw = a.encode();
        raw.internal[100] = 1;
        assert!(UniqueId::decode(&raw).is_err());
        assert!(UniqueId::decode(&ncclUniqueId::default()).is_err());
    }
}
