//! A rank's card: what every rank learns about every other at init (its
//! place, its process, and where it listens), and the card table's codec.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use hetccl_core::config::Compression;

use crate::error::{Error, Result};

/// Encoded size of one card.
pub const CARD_BYTES: usize = 52;

/// One rank's card.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Card {
    /// The rank.
    pub rank: u32,
    /// The communicator size this rank was told.
    pub nranks: u32,
    /// Which node the rank is on (host hash, or `HETCCL_HOST_ID`'s hash).
    pub host_hash: u64,
    /// The rank's process id.
    pub pid: u32,
    /// A random value per process: ranks with equal nonces share an address space.
    pub proc_nonce: u64,
    /// The rank's `HETCCL_COALESCE_BYTES` (0: off), so that the ranks can
    /// agree (`transport::coalesce::agree`).
    pub coalesce: u32,
    /// Where the rank accepts peer connections.
    pub addr: SocketAddr,
    /// Whether the rank checks collective fingerprints (`HETCCL_CHECK`).
    pub checks: bool,
    /// The rank's wire compression (`HETCCL_COMPRESS`).
    pub compress: Compression,
}

/// The code of a compression setting in the card's flags byte (bits 1–2).
fn compress_code(c: Compression) -> u8 {
    match c {
        Compression::Off => 0,
        Compression::Bf16 => 1,
        Compression::Fp8E4M3 => 2,
    }
}

impl Card {
    /// Encodes the card.
    pub fn encode(&self) -> [u8; CARD_BYTES] {
        let mut b = [0u8; CARD_BYTES];
        b[0..4].copy_from_slice(&self.rank.to_be_bytes());
        b[4..8].copy_from_slice(&self.nranks.to_be_bytes());
        b[8..16].copy_from_slice(&self.host_hash.to_be_bytes());
        b[16..20].copy_from_slice(&self.pid.to_be_bytes());
        b[20..28].copy_from_slice(&self.proc_nonce.to_be_bytes());
        b[28..30].copy_from_slice(&self.addr.port().to_be_bytes());
        b[31] = u8::from(self.checks) | compress_code(self.compress) << 1;
        match self.addr.ip() {
            IpAddr::V4(a) => {
                b[30] = 4;
                b[32..36].copy_from_slice(&a.octets());
            }
            IpAddr::V6(a) => {
                b[30] = 6;
                b[32..48].copy_from_slice(&a.octets());
            }
        }
        b[48..52].copy_from_slice(&self.coalesce.to_be_bytes());
        b
    }

    /// Decodes a card (untrusted input).
    pub fn decode(b: &[u8]) -> Result<Self> {
        if b.len() != CARD_BYTES {
            return Err(Error::Remote(format!("card of {} bytes", b.len()).into()));
        }
        let u32_at = |o: usize| u32::from_be_bytes(b[o..o + 4].try_into().expect("4 bytes"));
        let u64_at = |o: usize| u64::from_be_bytes(b[o..o + 8].try_into().expect("8 bytes"));
        let port = u16::from_be_bytes([b[28], b[29]]);
        // Flags (byte 31): bit 0 checks, bits 1-2 the compression code;
        // padding must be zero, as in the unique id: the unused tail of an
        // IPv4 address.
        let pad_ok = b[31] >> 1 <= 2 && (b[30] != 4 || b[36..48].iter().all(|&x| x == 0));
        let compress = match b[31] >> 1 {
            1 => Compression::Bf16,
            2 => Compression::Fp8E4M3,
            _ => Compression::Off,
        };
        if !pad_ok {
            return Err(Error::Remote("card with garbage in its padding".into()));
        }
        let ip = match b[30] {
            4 => IpAddr::V4(Ipv4Addr::new(b[32], b[33], b[34], b[35])),
            6 => IpAddr::V6(Ipv6Addr::from(
                <[u8; 16]>::try_from(&b[32..48]).expect("16 bytes"),
            )),
            f => {
                return Err(Error::Remote(
                    format!("card with address family {f}").into(),
                ))
            }
        };
        let c = Self {
            rank: u32_at(0),
            nranks: u32_at(4),
            host_hash: u64_at(8),
            pid: u32_at(16),
            proc_nonce: u64_at(20),
            coalesce: u32_at(48),
            addr: SocketAddr::new(ip, port),
            checks: b[31] & 1 == 1,
            compress,
        };
        if c.nranks == 0 || c.rank >= c.nranks || port == 0 {
            return Err(Error::Remote(
                format!("invalid card: rank {} of {}", c.rank, c.nranks).into(),
            ));
        }
        Ok(c)
    }
}

/// Encodes a full table (cards in rank order).
pub fn encode_table(cards: &[Card]) -> Vec<u8> {
    cards.iter().flat_map(|c| c.encode()).collect()
}

/// Decodes and validates a table of `nranks` cards.
pub fn decode_table(b: &[u8], nranks: usize) -> Result<Vec<Card>> {
    if nranks.checked_mul(CARD_BYTES) != Some(b.len()) {
        return Err(Error::Remote(
            format!("card table of {} bytes for {nranks} ranks", b.len()).into(),
        ));
    }
    let cards: Vec<Card> = b
        .chunks_exact(CARD_BYTES)
        .map(Card::decode)
        .collect::<Result<_>>()?;
    for (i, c) in cards.iter().enumerate() {
        if c.rank as usize != i || c.nranks as usize != nranks {
            return Err(Error::Remote(
                format!("card table entry {i} says rank {} of {}", c.rank, c.nranks).into(),
            ));
        }
    }
    Ok(cards)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn card(rank: u32, n: u32) -> Card {
        Card {
            rank,
            nranks: n,
            host_hash: 0xabc,
            pid: 42,
            proc_nonce: 7,
            coalesce: 65536 + rank,
            addr: "[::1]:99".parse().unwrap(),
            checks: r_checks(rank),
            compress: if rank == 1 {
                Compression::Fp8E4M3
            } else {
                Compression::Bf16
            },
        }
    }

    fn r_checks(rank: u32) -> bool {
        rank != 2
    }

    #[test]
    fn codec() {
        let c = card(1, 3);
        assert_eq!(Card::decode(&c.encode()).unwrap(), c);
        let t: Vec<Card> = (0..3).map(|r| card(r, 3)).collect();
        assert_eq!(decode_table(&encode_table(&t), 3).unwrap(), t);
        assert!(decode_table(&encode_table(&t), 2).is_err());
        let mut bad = encode_table(&t);
        bad[CARD_BYTES..CARD_BYTES + 4].copy_from_slice(&2u32.to_be_bytes());
        assert!(decode_table(&bad, 3).is_err());
        assert!(Card::decode(&card(3, 3).encode()).is_err());
        assert!(Card::decode(&[0u8; 5]).is_err());
        // The flags byte holds a bit and a compression code below 3.
        let mut flags = card(1, 3).encode();
        flags[31] = 6;
        assert!(Card::decode(&flags).is_err());
        flags[31] = 8;
        assert!(Card::decode(&flags).is_err());
        assert_eq!(
            Card::decode(&card(2, 3).encode()).unwrap().compress,
            Compression::Bf16
        );
        assert!(!Card::decode(&card(2, 3).encode()).unwrap().checks);
    }
}
