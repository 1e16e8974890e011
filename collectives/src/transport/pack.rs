//! The wire format of a pack: several small point-to-point messages to one
//! peer carried as one wire message (see `transport::coalesce`).
//!
//! ```text
//! 0..4        magic "HCPK"
//! 4..8        count n of sub-messages (u32, little-endian, >= 1)
//! 8..12       payload bytes p (u32, little-endian)
//! 12..12+4n   the n sub-message lengths (u32, little-endian, each >= 1)
//! then        the n payloads, back to back (p bytes, the sum of the lengths)
//! ```
//!
//! A pack has no slack: its length is exactly `12 + 4n + p`, so a decoded
//! pack re-encodes to the same bytes. Everything here is untrusted input on
//! the receiving side: [`decode`] checks every count and length before it
//! hands out a range, with checked arithmetic, and never reads past the
//! buffer.

use std::ops::Range;

/// The fixed header: magic, count, payload bytes.
pub const HEADER: usize = 12;
/// The first four bytes of every pack.
pub const MAGIC: [u8; 4] = *b"HCPK";

/// Why bytes are not a well-formed pack.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PackError {
    /// Fewer bytes than the fixed header.
    #[error("{0} bytes, shorter than the {HEADER}-byte header")]
    Truncated(usize),
    /// The first four bytes are not [`MAGIC`].
    #[error("no pack magic (a plain message where a pack was expected)")]
    Magic,
    /// The count is 0, or more lengths than the bytes can hold.
    #[error("a count of {count} sub-messages in a pack of {len} bytes")]
    Count {
        /// The count the header states.
        count: u32,
        /// The pack's length.
        len: usize,
    },
    /// The header's sizes disagree with the pack's length or the limit.
    #[error("header says {stated} bytes in all, the pack has {len} (limit {max})")]
    Length {
        /// `12 + 4n + p` from the header (saturating).
        stated: usize,
        /// The bytes at hand.
        len: usize,
        /// The largest pack the receiver accepts.
        max: usize,
    },
    /// A sub-message of 0 bytes, or above the per-message limit.
    #[error("sub-message {index} has {len} bytes (allowed 1..={max})")]
    Part {
        /// Its position in the pack.
        index: usize,
        /// Its stated length.
        len: u32,
        /// The per-message limit.
        max: usize,
    },
    /// The lengths do not add up to the stated payload.
    #[error("sub-message lengths add up to {sum}, the header says {payload}")]
    Sum {
        /// The sum of the lengths (saturating).
        sum: u64,
        /// The payload bytes the header states.
        payload: u32,
    },
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

/// The encoded length of a pack of `count` sub-messages holding `payload`
/// bytes in all.
pub fn encoded_len(count: usize, payload: usize) -> usize {
    HEADER
        .saturating_add(count.saturating_mul(4))
        .saturating_add(payload)
}

/// Encodes `parts` as one pack into `out` (cleared first). Every part must
/// be non-empty, and the counts must fit in 32 bits (the caller keeps packs
/// within its limit, far below that).
pub fn encode(parts: &[&[u8]], out: &mut Vec<u8>) {
    let payload: usize = parts.iter().map(|p| p.len()).sum();
    debug_assert!(parts.iter().all(|p| !p.is_empty()));
    let n = u32::try_from(parts.len()).expect("pack count fits in u32");
    let p = u32::try_from(payload).expect("pack payload fits in u32");
    out.clear();
    out.reserve(encoded_len(parts.len(), payload));
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&n.to_le_bytes());
    out.extend_from_slice(&p.to_le_bytes());
    for part in parts {
        let l = u32::try_from(part.len()).expect("part length fits in u32");
        out.extend_from_slice(&l.to_le_bytes());
    }
    for part in parts {
        out.extend_from_slice(part);
    }
}

/// The total length a pack's header states, checked against `max` (for
/// byte streams, which read the header first and then the rest).
pub fn stated_len(header: &[u8], max: usize) -> Result<usize, PackError> {
    if header.len() < HEADER {
        return Err(PackError::Truncated(header.len()));
    }
    if header[..4] != MAGIC {
        return Err(PackError::Magic);
    }
    let count = u32_at(header, 4);
    if count == 0 {
        return Err(PackError::Count {
            count,
            len: header.len(),
        });
    }
    let stated = encoded_len(count as usize, u32_at(header, 8) as usize);
    if stated > max {
        return Err(PackError::Length {
            stated,
            len: header.len(),
            max,
        });
    }
    Ok(stated)
}

/// Decodes a whole pack: the byte range of each sub-message in `buf`, in
/// order. `max_pack` bounds the pack, `max_part` each sub-message.
pub fn decode(
    buf: &[u8],
    max_pack: usize,
    max_part: usize,
) -> Result<Vec<Range<usize>>, PackError> {
    let stated = stated_len(buf, max_pack)?;
    let count = u32_at(buf, 4);
    // At most one length per 4 bytes after the header: bounds the
    // allocation below by the bytes received, whatever the count says.
    if count as usize > (buf.len() - HEADER) / 4 {
        return Err(PackError::Count {
            count,
            len: buf.len(),
        });
    }
    if stated != buf.len() {
        return Err(PackError::Length {
            stated,
            len: buf.len(),
            max: max_pack,
        });
    }
    let n = count as usize;
    let payload = u32_at(buf, 8);
    let mut at = HEADER + 4 * n;
    let mut sum = 0u64;
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let len = u32_at(buf, HEADER + 4 * i);
        if len == 0 || len as usize > max_part {
            return Err(PackError::Part {
                index: i,
                len,
                max: max_part,
            });
        }
        sum += u64::from(len);
        if sum > u64::from(payload) {
            return Err(PackError::Sum { sum, payload });
        }
        out.push(at..at + len as usize);
        at += len as usize;
    }
    if sum != u64::from(payload) {
        return Err(PackError::Sum { sum, payload });
    }
    debug_assert_eq!(at, buf.len());
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pack(parts: &[&[u8]]) -> Vec<u8> {
        let mut v = Vec::new();
        encode(parts, &mut v);
        v
    }

    #[test]
    fn round_trip_keeps_boundaries_and_order() {
        let parts: [&[u8]; 4] = [b"a", b"bcd", &[7u8; 100], b"xy"];
        let b = pack(&parts);
        assert_eq!(b.len(), encoded_len(4, 106));
        let r = decode(&b, 1 << 16, 100).unwrap();
        let got: Vec<&[u8]> = r.iter().map(|x| &b[x.clone()]).collect();
        assert_eq!(got, parts);
        assert_eq!(stated_len(&b[..HEADER], 1 << 16), Ok(b.len()));
    }

    #[test]
    fn malformed_packs_are_refused() {
        let good = pack(&[b"hello", b"w"]);
        let max = 1 << 16;
        // Truncated anywhere: the header, the lengths, the payload.
        for cut in 0..good.len() {
            assert!(decode(&good[..cut], max, 64).is_err(), "cut at {cut}");
        }
        // A byte too many.
        let mut long = good.clone();
        long.push(0);
        assert!(matches!(
            decode(&long, max, 64),
            Err(PackError::Length { .. })
        ));
        // Bad magic.
        let mut m = good.clone();
        m[0] = b'X';
        assert_eq!(decode(&m, max, 64), Err(PackError::Magic));
        // A count of zero, and counts that disagree with the lengths.
        let mut c = good.clone();
        c[4..8].copy_from_slice(&0u32.to_le_bytes());
        assert!(matches!(decode(&c, max, 64), Err(PackError::Count { .. })));
        for n in [1u32, 3, u32::MAX] {
            let mut c = good.clone();
            c[4..8].copy_from_slice(&n.to_le_bytes());
            assert!(decode(&c, max, 64).is_err(), "count {n}");
        }
        // A payload size that overflows with the header.
        let mut p = good.clone();
        p[8..12].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(
            decode(&p, usize::MAX, 64),
            Err(PackError::Length { .. })
        ));
        // Lengths that overflow, are zero, exceed the limit, or add up
        // wrong while the total still matches.
        let mut l = good.clone();
        l[12..16].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(decode(&l, max, 64), Err(PackError::Part { .. })));
        assert!(matches!(
            decode(&l, max, usize::MAX),
            Err(PackError::Sum { .. })
        ));
        let mut z = good.clone();
        z[12..16].copy_from_slice(&0u32.to_le_bytes());
        assert!(matches!(decode(&z, max, 64), Err(PackError::Part { .. })));
        assert!(matches!(decode(&good, max, 4), Err(PackError::Part { .. })));
        let mut s = good.clone();
        s[12..16].copy_from_slice(&4u32.to_le_bytes());
        s[16..20].copy_from_slice(&2u32.to_le_bytes());
        assert!(decode(&s, max, 64).is_ok(), "same total, other split");
        s[16..20].copy_from_slice(&1u32.to_le_bytes());
        assert!(matches!(decode(&s, max, 64), Err(PackError::Sum { .. })));
        // Over the receiver's pack limit.
        assert!(matches!(
            decode(&good, good.len() - 1, 64),
            Err(PackError::Length { .. })
        ));
        assert!(stated_len(&good[..HEADER], good.len() - 1).is_err());
    }
}
