//! Everything that crosses the network, with bounded, validating decoders.
//!
//! Three formats, all little-endian except the port (network order):
//! - the 128-byte connect **handle** that NCCL ships to the peer;
//! - the 32-byte **hello** a connector writes first on each socket;
//! - the 24-byte **frame** header of the control socket.
//!
//! Decoders take byte arrays and return a validated value or an error; they
//! never panic, so they can be fuzzed as they are.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use crate::error::{NetError, Result};

/// Bytes of the connect handle (`NCCL_NET_HANDLE_MAXSIZE`).
pub const HANDLE_BYTES: usize = 128;
const HANDLE_MAGIC: [u8; 4] = *b"HCN1";
const HANDLE_VERSION: u8 = 1;
/// Offset of the connect-stage token that `connect` keeps in the handle.
const TOKEN_OFF: usize = 64;

/// What a listener publishes: where to connect and the nonce to present.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ListenInfo {
    /// The listening address.
    pub addr: SocketAddr,
    /// Random value the accept side checks on every incoming socket.
    pub nonce: u64,
}

/// Writes a fresh handle for `info` (connect stage cleared).
pub fn encode_handle(info: &ListenInfo, out: &mut [u8; HANDLE_BYTES]) {
    out.fill(0);
    out[0..4].copy_from_slice(&HANDLE_MAGIC);
    out[4] = HANDLE_VERSION;
    out[6..8].copy_from_slice(&info.addr.port().to_be_bytes());
    match info.addr.ip() {
        IpAddr::V4(a) => {
            out[5] = 4;
            out[8..12].copy_from_slice(&a.octets());
        }
        IpAddr::V6(a) => {
            out[5] = 6;
            out[8..24].copy_from_slice(&a.octets());
        }
    }
    out[24..32].copy_from_slice(&info.nonce.to_le_bytes());
}

/// Decodes the listener part of a handle.
pub fn decode_handle(h: &[u8; HANDLE_BYTES]) -> Result<ListenInfo> {
    if h[0..4] != HANDLE_MAGIC || h[4] != HANDLE_VERSION {
        return Err(NetError::InvalidArgument(
            "not a hetccl connect handle".into(),
        ));
    }
    let port = u16::from_be_bytes([h[6], h[7]]);
    if port == 0 {
        return Err(NetError::InvalidArgument(
            "connect handle has port 0".into(),
        ));
    }
    let ip = match h[5] {
        4 => IpAddr::V4(Ipv4Addr::new(h[8], h[9], h[10], h[11])),
        6 => {
            let mut o = [0u8; 16];
            o.copy_from_slice(&h[8..24]);
            IpAddr::V6(Ipv6Addr::from(o))
        }
        f => {
            return Err(NetError::InvalidArgument(format!(
                "connect handle has address family {f}"
            )))
        }
    };
    if ip.is_unspecified() || ip.is_multicast() {
        return Err(NetError::InvalidArgument(format!(
            "connect handle has address {ip}"
        )));
    }
    let nonce = u64::from_le_bytes(h[24..32].try_into().expect("8 bytes"));
    Ok(ListenInfo {
        addr: SocketAddr::new(ip, port),
        nonce,
    })
}

/// The connect-stage token kept in the handle between `connect` retries (0 = none).
pub fn handle_token(h: &[u8; HANDLE_BYTES]) -> u64 {
    u64::from_le_bytes(h[TOKEN_OFF..TOKEN_OFF + 8].try_into().expect("8 bytes"))
}

/// Stores the connect-stage token.
pub fn set_handle_token(h: &mut [u8; HANDLE_BYTES], token: u64) {
    h[TOKEN_OFF..TOKEN_OFF + 8].copy_from_slice(&token.to_le_bytes());
}

/// Bytes of a hello.
pub const HELLO_BYTES: usize = 32;
const HELLO_MAGIC: [u8; 4] = *b"HCNh";
/// The most data sockets a comm may have.
pub const MAX_SOCKS: usize = 64;

/// What a socket is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SockRole {
    /// The control socket of a comm.
    Ctrl,
    /// Data socket number `n` of a comm.
    Data(u16),
}

/// The first bytes a connector writes on each socket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hello {
    /// The listener's nonce, proving the connector read the handle.
    pub nonce: u64,
    /// Random id grouping the sockets of one comm.
    pub comm_id: u64,
    /// This socket's role.
    pub role: SockRole,
    /// How many data sockets the comm has.
    pub nsocks: u16,
}

/// Encodes a hello.
pub fn encode_hello(h: &Hello) -> [u8; HELLO_BYTES] {
    let mut b = [0u8; HELLO_BYTES];
    b[0..4].copy_from_slice(&HELLO_MAGIC);
    b[4] = 1;
    let (kind, idx) = match h.role {
        SockRole::Ctrl => (0u8, 0u16),
        SockRole::Data(i) => (1, i),
    };
    b[5] = kind;
    b[6..8].copy_from_slice(&idx.to_le_bytes());
    b[8..10].copy_from_slice(&h.nsocks.to_le_bytes());
    b[16..24].copy_from_slice(&h.nonce.to_le_bytes());
    b[24..32].copy_from_slice(&h.comm_id.to_le_bytes());
    b
}

/// Decodes a hello and checks everything but the nonce.
pub fn decode_hello(b: &[u8; HELLO_BYTES]) -> Result<Hello> {
    if b[0..4] != HELLO_MAGIC || b[4] != 1 || b[10..16].iter().any(|&x| x != 0) {
        return Err(NetError::proto("bad hello"));
    }
    let idx = u16::from_le_bytes([b[6], b[7]]);
    let nsocks = u16::from_le_bytes([b[8], b[9]]);
    if usize::from(nsocks) > MAX_SOCKS {
        return Err(NetError::proto(format!("hello asks for {nsocks} sockets")));
    }
    let role = match b[5] {
        0 if idx == 0 => SockRole::Ctrl,
        1 if idx < nsocks => SockRole::Data(idx),
        _ => return Err(NetError::proto("bad hello role")),
    };
    Ok(Hello {
        nonce: u64::from_le_bytes(b[16..24].try_into().expect("8 bytes")),
        comm_id: u64::from_le_bytes(b[24..32].try_into().expect("8 bytes")),
        role,
        nsocks,
    })
}

/// Bytes of a frame header.
pub const FRAME_BYTES: usize = 24;
/// The largest message size a frame may carry (1 TiB).
pub const MAX_MSG_BYTES: u64 = 1 << 40;

/// How the receiver wants a message's payload delivered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DataMode {
    /// One DATA frame on the control socket.
    Ctrl,
    /// Tasks of this many bytes, round-robin over the data sockets.
    Lanes(u64),
}

/// A control-socket frame header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Frame {
    /// Sender → receiver: a message; `inline` payloads follow the header.
    Msg {
        /// The sender's tag.
        tag: i32,
        /// The sender's sequence number (0, 1, 2, ... per comm).
        seq: u64,
        /// Payload bytes.
        size: u64,
        /// Whether the payload follows right after this header.
        inline: bool,
    },
    /// Sender → receiver: `len` payload bytes of message `seq` follow.
    Data {
        /// The message.
        seq: u64,
        /// Payload bytes.
        len: u64,
    },
    /// Receiver → sender: clear to send message `seq`.
    Cts {
        /// The message.
        seq: u64,
        /// How to send it.
        mode: DataMode,
    },
    /// Receiver → sender: message `seq` is larger than the posted receive.
    Reject {
        /// The message.
        seq: u64,
    },
    /// Either side: the connection ends because rank `by` of the engine's
    /// communicator revoked it; the comm fails with that reason.
    Close {
        /// The revoking rank.
        by: u32,
    },
}

/// Encodes a frame header.
pub fn encode_frame(f: &Frame) -> [u8; FRAME_BYTES] {
    let (kind, flags, tag, seq, size) = match *f {
        Frame::Msg {
            tag,
            seq,
            size,
            inline,
        } => (1u8, u8::from(inline), tag, seq, size),
        Frame::Data { seq, len } => (2, 0, 0, seq, len),
        Frame::Cts {
            seq,
            mode: DataMode::Ctrl,
        } => (3, 0, 0, seq, 0),
        Frame::Cts {
            seq,
            mode: DataMode::Lanes(t),
        } => (3, 1, 0, seq, t),
        Frame::Reject { seq } => (4, 0, 0, seq, 0),
        Frame::Close { by } => (5, 0, 0, u64::from(by), 0),
    };
    let mut b = [0u8; FRAME_BYTES];
    b[0] = kind;
    b[1] = flags;
    b[4..8].copy_from_slice(&tag.to_le_bytes());
    b[8..16].copy_from_slice(&seq.to_le_bytes());
    b[16..24].copy_from_slice(&size.to_le_bytes());
    b
}

/// Decodes a frame header; sizes are bounded by [`MAX_MSG_BYTES`].
pub fn decode_frame(b: &[u8; FRAME_BYTES]) -> Result<Frame> {
    let tag = i32::from_le_bytes(b[4..8].try_into().expect("4 bytes"));
    let seq = u64::from_le_bytes(b[8..16].try_into().expect("8 bytes"));
    let size = u64::from_le_bytes(b[16..24].try_into().expect("8 bytes"));
    if b[2] != 0 || b[3] != 0 || size > MAX_MSG_BYTES {
        return Err(NetError::proto("bad frame header"));
    }
    let f = match (b[0], b[1]) {
        (1, fl @ (0 | 1)) => Frame::Msg {
            tag,
            seq,
            size,
            inline: fl == 1,
        },
        (2, 0) if tag == 0 => Frame::Data { seq, len: size },
        (3, 0) if tag == 0 && size == 0 => Frame::Cts {
            seq,
            mode: DataMode::Ctrl,
        },
        (3, 1) if tag == 0 && size > 0 => Frame::Cts {
            seq,
            mode: DataMode::Lanes(size),
        },
        (4, 0) if tag == 0 && size == 0 => Frame::Reject { seq },
        (5, 0) if tag == 0 && size == 0 && seq <= u64::from(u32::MAX) => {
            Frame::Close { by: seq as u32 }
        }
        (k, fl) => return Err(NetError::proto(format!("bad frame kind {k}/{fl}"))),
    };
    Ok(f)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handle_round_trip_and_token() {
        let info = ListenInfo {
            addr: "10.231.0.2:4242".parse().unwrap(),
            nonce: 0xfeed_beef_1234,
        };
        let mut h = [0u8; HANDLE_BYTES];
        encode_handle(&info, &mut h);
        assert_eq!(decode_handle(&h).unwrap(), info);
        assert_eq!(handle_token(&h), 0);
        set_handle_token(&mut h, 77);
        assert_eq!(handle_token(&h), 77);
        assert_eq!(decode_handle(&h).unwrap(), info);
        let info6 = ListenInfo {
            addr: "[::1]:9".parse().unwrap(),
            nonce: 1,
        };
        encode_handle(&info6, &mut h);
        assert_eq!(decode_handle(&h).unwrap(), info6);
        h[0] = b'X';
        assert!(decode_handle(&h).is_err());
        assert!(decode_handle(&[0u8; HANDLE_BYTES]).is_err());
    }

    #[test]
    fn hello_round_trip_and_bounds() {
        let h = Hello {
            nonce: 5,
            comm_id: 9,
            role: SockRole::Data(3),
            nsocks: 4,
        };
        assert_eq!(decode_hello(&encode_hello(&h)).unwrap(), h);
        let bad = Hello {
            role: SockRole::Data(4),
            ..h
        };
        assert!(decode_hello(&encode_hello(&bad)).is_err());
        let many = Hello {
            nsocks: 65,
            role: SockRole::Ctrl,
            ..h
        };
        assert!(decode_hello(&encode_hello(&many)).is_err());
    }

    #[test]
    fn frame_round_trip_and_rejects() {
        for f in [
            Frame::Msg {
                tag: -3,
                seq: 7,
                size: 8,
                inline: true,
            },
            Frame::Msg {
                tag: 1,
                seq: 8,
                size: 1 << 30,
                inline: false,
            },
            Frame::Data { seq: 2, len: 99 },
            Frame::Cts {
                seq: 4,
                mode: DataMode::Ctrl,
            },
            Frame::Cts {
                seq: 4,
                mode: DataMode::Lanes(65536),
            },
            Frame::Reject { seq: 1 },
            Frame::Close { by: 7 },
        ] {
            assert_eq!(decode_frame(&encode_frame(&f)).unwrap(), f);
        }
        let mut b = encode_frame(&Frame::Data { seq: 1, len: 1 });
        b[16..24].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(decode_frame(&b).is_err());
        let mut c = encode_frame(&Frame::Close { by: 7 });
        c[8..16].copy_from_slice(&(u64::from(u32::MAX) + 1).to_le_bytes());
        assert!(decode_frame(&c).is_err(), "a revoking rank beyond u32");
        let mut b = encode_frame(&Frame::Reject { seq: 1 });
        b[0] = 9;
        assert!(decode_frame(&b).is_err());
        let mut b = encode_frame(&Frame::Cts {
            seq: 1,
            mode: DataMode::Ctrl,
        });
        b[1] = 1;
        assert!(decode_frame(&b).is_err(), "lanes mode with task size 0");
    }
}
