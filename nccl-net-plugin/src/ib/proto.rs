//! What the verbs transport puts on the wire, with bounded decoders that
//! never panic:
//! - the connection **info** each side writes on the setup socket (QPs,
//!   GID, LID, PSN, MTU, the sender's control area and its rkey);
//! - the 32-byte **header** that starts every SEND (eager payload or
//!   rendezvous announcement);
//! - the 64-byte **CTS** entry a receiver RDMA-writes into the sender's
//!   control area, naming where a piece of a message goes.

use crate::error::{NetError, Result};

/// Most QPs per connection (`NCCL_IB_QPS_PER_CONNECTION` is clamped to it).
pub const MAX_QPS: usize = 8;
/// Bytes of the connection info.
pub const INFO_BYTES: usize = 128;
const INFO_MAGIC: [u8; 8] = *b"HCIBQP01";

/// One side's connection data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ConnInfo {
    /// The nonce of the listener's handle (checked by the acceptor).
    pub nonce: u64,
    /// QP numbers.
    pub qpn: [u32; MAX_QPS],
    /// QPs in use.
    pub nqps: u8,
    /// `enum ibv_mtu` of the port.
    pub mtu: u8,
    /// Link layer.
    pub link_layer: u8,
    /// LID (InfiniBand).
    pub lid: u16,
    /// Starting PSN of every QP.
    pub psn: u32,
    /// The port's GID.
    pub gid: [u8; 16],
    /// The sender's control area (credits and CTS fifo) and its rkey; 0 on
    /// the receiver's info.
    pub ctrl_addr: u64,
    /// rkey of the control area.
    pub ctrl_rkey: u32,
    /// Receive slots posted per QP.
    pub slots: u32,
}

impl ConnInfo {
    /// Encodes into `INFO_BYTES` bytes.
    pub fn encode(&self) -> [u8; INFO_BYTES] {
        let mut b = [0u8; INFO_BYTES];
        b[0..8].copy_from_slice(&INFO_MAGIC);
        b[8..16].copy_from_slice(&self.nonce.to_le_bytes());
        for (i, q) in self.qpn.iter().enumerate() {
            b[16 + 4 * i..20 + 4 * i].copy_from_slice(&q.to_le_bytes());
        }
        b[48] = self.nqps;
        b[49] = self.mtu;
        b[50] = self.link_layer;
        b[52..54].copy_from_slice(&self.lid.to_le_bytes());
        b[56..60].copy_from_slice(&self.psn.to_le_bytes());
        b[60..76].copy_from_slice(&self.gid);
        b[80..88].copy_from_slice(&self.ctrl_addr.to_le_bytes());
        b[88..92].copy_from_slice(&self.ctrl_rkey.to_le_bytes());
        b[92..96].copy_from_slice(&self.slots.to_le_bytes());
        b
    }

    /// Decodes and validates.
    pub fn decode(b: &[u8; INFO_BYTES]) -> Result<Self> {
        if b[0..8] != INFO_MAGIC {
            return Err(NetError::proto("verbs connection info: bad magic"));
        }
        let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().expect("4"));
        let mut qpn = [0u32; MAX_QPS];
        for (i, q) in qpn.iter_mut().enumerate() {
            *q = u32_at(16 + 4 * i);
        }
        let info = Self {
            nonce: u64::from_le_bytes(b[8..16].try_into().expect("8")),
            qpn,
            nqps: b[48],
            mtu: b[49],
            link_layer: b[50],
            lid: u16::from_le_bytes([b[52], b[53]]),
            psn: u32_at(56) & 0xff_ffff,
            gid: b[60..76].try_into().expect("16"),
            ctrl_addr: u64::from_le_bytes(b[80..88].try_into().expect("8")),
            ctrl_rkey: u32_at(88),
            slots: u32_at(92),
        };
        if info.nqps == 0 || info.nqps as usize > MAX_QPS {
            return Err(NetError::proto(format!("verbs info: {} QPs", info.nqps)));
        }
        if !(1..=5).contains(&info.mtu) {
            return Err(NetError::proto(format!(
                "verbs info: MTU code {}",
                info.mtu
            )));
        }
        if info.qpn[..info.nqps as usize]
            .iter()
            .any(|&q| q == 0 || q > 0xff_ffff)
        {
            return Err(NetError::proto("verbs info: bad QP number"));
        }
        if info.slots == 0 || info.slots > 4096 {
            return Err(NetError::proto(format!("verbs info: {} slots", info.slots)));
        }
        Ok(info)
    }
}

/// Bytes of a SEND header.
pub const HDR_BYTES: usize = 32;
const HDR_MAGIC: u32 = 0x4849_4231; // "HIB1"

/// What a SEND carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// The payload follows the header.
    Eager,
    /// Rendezvous: the receiver answers with CTS entries.
    Rts,
}

/// A SEND header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hdr {
    /// What follows.
    pub kind: Kind,
    /// The message's tag.
    pub tag: i32,
    /// The message's size.
    pub size: u64,
    /// The message's sequence number (from 0, in order).
    pub seq: u64,
    /// Rendezvous: the sender's buffer is registered, so a piece may be
    /// the whole message (else pieces are at most a bounce chunk).
    pub whole: bool,
}

/// Largest message a peer may announce (NCCL's `maxP2pBytes` is lower).
pub const MAX_MSG: u64 = 1 << 40;

impl Hdr {
    /// Encodes.
    pub fn encode(&self) -> [u8; HDR_BYTES] {
        let mut b = [0u8; HDR_BYTES];
        b[0..4].copy_from_slice(&HDR_MAGIC.to_le_bytes());
        b[4] = match self.kind {
            Kind::Eager => 1,
            Kind::Rts => 2,
        };
        b[5] = u8::from(self.whole);
        b[8..12].copy_from_slice(&self.tag.to_le_bytes());
        b[16..24].copy_from_slice(&self.size.to_le_bytes());
        b[24..32].copy_from_slice(&self.seq.to_le_bytes());
        b
    }

    /// Decodes the header of a SEND of `len` bytes, checking it against
    /// the length and the expected sequence number.
    pub fn decode(b: &[u8], len: usize, want_seq: u64) -> Result<Self> {
        if len < HDR_BYTES || b.len() < HDR_BYTES {
            return Err(NetError::proto(format!("verbs SEND of {len} bytes")));
        }
        if u32::from_le_bytes(b[0..4].try_into().expect("4")) != HDR_MAGIC
            || b[5] & !1 != 0
            || b[6..8] != [0; 2]
            || b[12..16] != [0; 4]
        {
            return Err(NetError::proto(
                "verbs SEND header: bad magic or reserved bits",
            ));
        }
        let kind = match b[4] {
            1 => Kind::Eager,
            2 => Kind::Rts,
            k => return Err(NetError::proto(format!("verbs SEND kind {k}"))),
        };
        let h = Self {
            kind,
            tag: i32::from_le_bytes(b[8..12].try_into().expect("4")),
            size: u64::from_le_bytes(b[16..24].try_into().expect("8")),
            seq: u64::from_le_bytes(b[24..32].try_into().expect("8")),
            whole: b[5] & 1 != 0,
        };
        if h.seq != want_seq {
            return Err(NetError::proto(format!(
                "verbs message {} where {want_seq} was next",
                h.seq
            )));
        }
        if h.size > MAX_MSG {
            return Err(NetError::proto(format!(
                "verbs message of {} bytes",
                h.size
            )));
        }
        let body = (len - HDR_BYTES) as u64;
        match h.kind {
            Kind::Eager if body != h.size => Err(NetError::proto(format!(
                "verbs eager message says {} bytes, carries {body}",
                h.size
            ))),
            Kind::Rts if body != 0 => Err(NetError::proto("verbs RTS with a payload")),
            _ => Ok(h),
        }
    }
}

/// Bytes of one CTS entry.
pub const CTS_BYTES: usize = 64;
/// CTS entries in the sender's fifo.
pub const NCTS: usize = 64;
/// CTS flag: the message is larger than the receiver's buffer.
pub const CTS_REJECT: u32 = 1;

/// Where the receiver wants a piece of a message written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Cts {
    /// This entry's sequence number (from 0).
    pub seq: u64,
    /// The message it is for.
    pub msg: u64,
    /// Offset of the piece in the message.
    pub offset: u64,
    /// Bytes of the piece.
    pub len: u64,
    /// Remote address to write at.
    pub addr: u64,
    /// Remote key.
    pub rkey: u32,
    /// `CTS_REJECT` or 0.
    pub flags: u32,
}

impl Cts {
    /// A check word over the entry's sequence number and fields. The
    /// receiver's NIC writes an entry into the sender's memory, which the
    /// sender polls: the bytes may become visible in any order (a software
    /// NIC copies with `rep movsb`, whose stores are not ordered), so the
    /// sequence numbers at both ends do not prove the middle has landed;
    /// this word, stored just before the trailer, does.
    fn check(&self) -> u64 {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for w in [
            self.seq + 1,
            self.msg,
            self.offset,
            self.len,
            self.addr,
            u64::from(self.rkey) | u64::from(self.flags) << 32,
        ] {
            h = (h ^ w).wrapping_mul(0x0000_0100_0000_01b3);
            h ^= h >> 29;
        }
        h
    }

    /// Encodes; the sequence number is at both ends (stored as seq + 1, so
    /// an all-zero entry is never valid) and a check word covers the
    /// fields, so a torn read is detected.
    pub fn encode(&self) -> [u8; CTS_BYTES] {
        let mut b = [0u8; CTS_BYTES];
        let s = (self.seq + 1).to_le_bytes();
        b[0..8].copy_from_slice(&s);
        b[8..16].copy_from_slice(&self.msg.to_le_bytes());
        b[16..24].copy_from_slice(&self.offset.to_le_bytes());
        b[24..32].copy_from_slice(&self.len.to_le_bytes());
        b[32..40].copy_from_slice(&self.addr.to_le_bytes());
        b[40..44].copy_from_slice(&self.rkey.to_le_bytes());
        b[44..48].copy_from_slice(&self.flags.to_le_bytes());
        b[48..56].copy_from_slice(&self.check().to_le_bytes());
        b[56..64].copy_from_slice(&s);
        b
    }

    /// Decodes the entry if it is the one with sequence number `want`
    /// (`Ok(None)`: not written yet, or not wholly: its check word does not
    /// match); checks the flags.
    pub fn decode(b: &[u8; CTS_BYTES], want: u64) -> Result<Option<Self>> {
        let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().expect("8"));
        if u64_at(0) != want + 1 || u64_at(56) != want + 1 {
            return Ok(None);
        }
        let c = Self {
            seq: want,
            msg: u64_at(8),
            offset: u64_at(16),
            len: u64_at(24),
            addr: u64_at(32),
            rkey: u32::from_le_bytes(b[40..44].try_into().expect("4")),
            flags: u32::from_le_bytes(b[44..48].try_into().expect("4")),
        };
        if u64_at(48) != c.check() {
            return Ok(None);
        }
        if c.flags & !CTS_REJECT != 0 {
            return Err(NetError::proto(format!("verbs CTS flags {:#x}", c.flags)));
        }
        Ok(Some(c))
    }
}

/// The sender's control area: credits returned per QP, then the CTS fifo.
pub const CTRL_CREDITS_OFF: usize = 0;
/// Offset of the CTS fifo in the control area.
pub const CTRL_CTS_OFF: usize = 64;
/// Bytes of the control area.
pub const CTRL_BYTES: usize = CTRL_CTS_OFF + NCTS * CTS_BYTES;

/// How a piece of `len` bytes is split over `nqps` QPs: `(qp, offset, len)`
/// of each part; both sides compute the same.
pub fn parts(cts_seq: u64, len: u64, nqps: usize, split: bool) -> Vec<(usize, u64, u64)> {
    let nqps = nqps.max(1);
    let base = (cts_seq % nqps as u64) as usize;
    let n = if split {
        (len.div_ceil(4096) as usize).clamp(1, nqps)
    } else {
        1
    };
    let per = len.div_ceil(n as u64).max(1);
    (0..n)
        .map(|j| {
            let off = (j as u64 * per).min(len);
            let l = per.min(len - off);
            ((base + j) % nqps, off, l)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn info_round_trips_and_rejects_garbage() {
        let mut i = ConnInfo {
            nonce: 7,
            nqps: 2,
            mtu: 3,
            link_layer: 2,
            lid: 0,
            psn: 0x12345,
            gid: [9; 16],
            ctrl_addr: 0x1000,
            ctrl_rkey: 5,
            slots: 64,
            ..Default::default()
        };
        i.qpn[0] = 17;
        i.qpn[1] = 18;
        assert_eq!(ConnInfo::decode(&i.encode()).unwrap(), i);
        for bad in [
            ConnInfo { nqps: 0, ..i },
            ConnInfo { nqps: 9, ..i },
            ConnInfo { mtu: 6, ..i },
            ConnInfo { slots: 0, ..i },
        ] {
            assert!(ConnInfo::decode(&bad.encode()).is_err(), "{bad:?}");
        }
        let mut b = i.encode();
        b[0] ^= 1;
        assert!(ConnInfo::decode(&b).is_err());
        let mut z = i;
        z.qpn[1] = 0;
        assert!(ConnInfo::decode(&z.encode()).is_err());
    }

    #[test]
    fn headers_are_checked_against_length_and_order() {
        let h = Hdr {
            kind: Kind::Eager,
            tag: -3,
            size: 10,
            seq: 4,
            whole: false,
        };
        let b = h.encode();
        assert_eq!(Hdr::decode(&b, HDR_BYTES + 10, 4).unwrap(), h);
        assert!(Hdr::decode(&b, HDR_BYTES + 9, 4).is_err(), "short payload");
        assert!(Hdr::decode(&b, HDR_BYTES + 10, 5).is_err(), "out of order");
        assert!(Hdr::decode(&b[..8], 8, 4).is_err(), "truncated");
        let r = Hdr {
            kind: Kind::Rts,
            size: 1 << 20,
            whole: true,
            ..h
        };
        assert_eq!(Hdr::decode(&r.encode(), HDR_BYTES, 4).unwrap(), r);
        let mut f = r.encode();
        f[5] = 2;
        assert!(
            Hdr::decode(&f, HDR_BYTES, 4).is_err(),
            "unknown header flag"
        );
        assert!(Hdr::decode(&r.encode(), HDR_BYTES + 1, 4).is_err());
        let big = Hdr {
            kind: Kind::Rts,
            size: MAX_MSG + 1,
            ..h
        };
        assert!(Hdr::decode(&big.encode(), HDR_BYTES, 4).is_err());
        let mut k = b;
        k[4] = 3;
        assert!(Hdr::decode(&k, HDR_BYTES + 10, 4).is_err());
    }

    #[test]
    fn cts_entries_need_both_sequence_numbers() {
        let c = Cts {
            seq: 3,
            msg: 1,
            offset: 0,
            len: 100,
            addr: 0x2000,
            rkey: 9,
            flags: 0,
        };
        let b = c.encode();
        assert_eq!(Cts::decode(&b, 3).unwrap(), Some(c));
        assert_eq!(Cts::decode(&b, 4).unwrap(), None);
        let mut torn = b;
        torn[56] ^= 0xff;
        assert_eq!(Cts::decode(&torn, 3).unwrap(), None);
        assert_eq!(Cts::decode(&[0; CTS_BYTES], 0).unwrap(), None);
        // Both sequence numbers landed but a middle field did not (its old
        // bytes, zero in a fresh slot): not written yet, whichever field.
        for at in (8..48).step_by(8) {
            let mut half = b;
            half[at..at + 8].fill(0);
            if half != b {
                assert_eq!(Cts::decode(&half, 3).unwrap(), None, "field at {at}");
            }
        }
        let bad = Cts { flags: 2, ..c };
        assert!(Cts::decode(&bad.encode(), 3).is_err());
    }

    #[test]
    fn parts_cover_the_piece_once() {
        for (len, nqps, split) in [
            (0, 1, false),
            (1, 4, true),
            (10_000, 4, true),
            (1 << 20, 3, true),
            (5, 2, false),
        ] {
            let p = parts(5, len, nqps, split);
            let total: u64 = p.iter().map(|x| x.2).sum();
            assert_eq!(total, len);
            let mut off = 0;
            for &(q, o, l) in &p {
                assert!(q < nqps);
                assert_eq!(o, off);
                off += l;
            }
        }
        assert_eq!(parts(1, 1 << 20, 4, false).len(), 1);
        assert_eq!(parts(1, 1 << 20, 4, true).len(), 4);
    }
}
