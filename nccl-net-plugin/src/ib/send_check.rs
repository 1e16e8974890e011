//! The sender's checks on what the receiver writes into its control area:
//! the credit counters and the CTS entries. A receiver that is buggy or
//! malicious can write any bytes there; these decide whether they are
//! taken, and fail the comm when they cannot be right, before anything is
//! copied or written with them.

use super::proto::{Cts, CTS_BYTES, CTS_REJECT};
use crate::error::{NetError, Result};

/// A credit counter of QP `q` read twice (`a`, `b`, to skip a value being
/// written): `Ok(Some(n))` when it returns more slots, `Ok(None)` when it
/// does not (unchanged, older, or torn), an error when it returns more
/// than were `used`.
pub fn credits(q: usize, a: u64, b: u64, returned: u64, used: u64) -> Result<Option<u64>> {
    if a != b || a <= returned {
        return Ok(None);
    }
    if a > used {
        return Err(NetError::proto(format!(
            "peer returned {a} credits on QP {q}, only {used} were used"
        )));
    }
    Ok(Some(a))
}

/// What the sender knows of the message a CTS entry names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MsgState {
    /// Its size.
    pub size: u64,
    /// Whether it went by rendezvous (an RTS, not an eager SEND).
    pub rendezvous: bool,
    /// Whether its RTS was posted.
    pub posted: bool,
    /// Whether it is finished (done or failed).
    pub finished: bool,
    /// Bytes earlier CTS entries covered.
    pub covered: u64,
    /// Whether the source is registered (else pieces go through bounce
    /// chunks of `chunk` bytes).
    pub registered: bool,
}

/// Reads the CTS entry `want` from its slot's bytes and checks it against
/// the message it names (`msg(id)`: `None` if unknown). `Ok(None)`: not
/// (wholly) written yet. `Ok(Some(c))`: a reject, or a piece that lies
/// inside the message, starts where the last one ended and fits a bounce
/// chunk when one is needed.
pub fn cts(
    raw: &[u8; CTS_BYTES],
    want: u64,
    chunk: usize,
    msg: impl FnOnce(u64) -> Option<MsgState>,
) -> Result<Option<Cts>> {
    let Some(c) = Cts::decode(raw, want)? else {
        return Ok(None);
    };
    let Some(m) = msg(c.msg) else {
        return Err(NetError::proto(format!(
            "CTS for unknown message {}",
            c.msg
        )));
    };
    if !m.posted || !m.rendezvous || m.finished {
        return Err(NetError::proto(format!(
            "CTS for message {} in the wrong state",
            c.msg
        )));
    }
    if c.flags & CTS_REJECT != 0 {
        return Ok(Some(c));
    }
    if c.offset != m.covered || c.len == 0 || c.len > m.size - c.offset {
        return Err(NetError::proto(format!(
            "CTS for bytes {}+{} of message {} ({} bytes, {} covered)",
            c.offset, c.len, c.msg, m.size, m.covered
        )));
    }
    if !m.registered && c.len > chunk as u64 {
        return Err(NetError::proto(format!("CTS piece of {} bytes", c.len)));
    }
    Ok(Some(c))
}

#[cfg(test)]
mod tests {
    use super::*;

    const CHUNK: usize = 1 << 20;
    const SIZE: u64 = 3 << 20;

    fn state(covered: u64, registered: bool) -> MsgState {
        MsgState {
            size: SIZE,
            rendezvous: true,
            posted: true,
            finished: false,
            covered,
            registered,
        }
    }

    fn entry(seq: u64, offset: u64, len: u64) -> Cts {
        Cts {
            seq,
            msg: 4,
            offset,
            len,
            addr: 0x5000,
            rkey: 11,
            flags: 0,
        }
    }

    fn check(raw: &[u8; CTS_BYTES], want: u64, st: Option<MsgState>) -> Result<Option<Cts>> {
        cts(raw, want, CHUNK, |m| {
            assert_eq!(m, 4, "looked up another message");
            st
        })
    }

    fn err(r: Result<Option<Cts>>) -> String {
        r.expect_err("a forged entry was taken").to_string()
    }

    #[test]
    fn the_entry_format_is_pinned() {
        // As fuzz/seeds/make_seeds.py writes it (seed `ib_sender/good`).
        let c = Cts {
            seq: 0,
            msg: 0,
            offset: 0,
            len: 1 << 20,
            addr: 0x10000,
            rkey: 7,
            flags: 0,
        };
        let check = 0x598f_df02_f0c8_fe03u64.to_le_bytes();
        let mut want = [0u8; CTS_BYTES];
        want[0] = 1;
        want[26] = 0x10;
        want[34] = 1;
        want[40] = 7;
        want[48..56].copy_from_slice(&check);
        want[56] = 1;
        assert_eq!(c.encode(), want);
    }

    #[test]
    fn a_good_piece_is_taken() {
        let c = entry(7, CHUNK as u64, CHUNK as u64);
        assert_eq!(
            check(&c.encode(), 7, Some(state(CHUNK as u64, false))).unwrap(),
            Some(c)
        );
        // Registered: one piece for the rest of the message.
        let c = entry(7, 0, SIZE);
        assert_eq!(
            check(&c.encode(), 7, Some(state(0, true))).unwrap(),
            Some(c)
        );
    }

    #[test]
    fn a_wrong_sequence_or_check_word_is_never_taken() {
        let c = entry(7, 0, 100);
        // The entry of another round of the fifo (stale or from the future).
        for want in [6, 8, 7 + 64] {
            assert_eq!(
                check(&c.encode(), want, Some(state(0, true))).unwrap(),
                None
            );
        }
        // One sequence number forged, or any field changed without the
        // check word: not taken (the comm times out, never writes).
        let raw = c.encode();
        for at in [0, 8, 16, 24, 32, 40, 44, 48, 56] {
            let mut b = raw;
            b[at] ^= 0x40;
            assert_eq!(
                check(&b, 7, Some(state(0, true))).unwrap(),
                None,
                "byte {at}"
            );
        }
        assert_eq!(check(&[0xff; CTS_BYTES], 7, None).unwrap(), None);
    }

    #[test]
    fn a_piece_outside_the_message_fails_the_comm() {
        let st = Some(state(CHUNK as u64, true));
        let covered = CHUNK as u64;
        for (off, len) in [
            (covered, SIZE - covered + 1), // past the end
            (covered, u64::MAX),           // length wraps
            (u64::MAX - 10, 20),           // offset wraps
            (SIZE, 1),                     // starts at the end
            (covered + 4096, 4096),        // skips bytes
            (0, 4096),                     // rewrites covered bytes
            (covered, 0),                  // empty
        ] {
            let e = err(check(&entry(3, off, len).encode(), 3, st));
            assert!(e.contains("CTS for bytes"), "{off}+{len}: {e}");
        }
        // Unregistered source: a piece larger than a bounce chunk.
        let e = err(check(
            &entry(3, 0, CHUNK as u64 + 1).encode(),
            3,
            Some(state(0, false)),
        ));
        assert!(e.contains("CTS piece of"), "{e}");
    }

    #[test]
    fn flags_and_messages_are_checked() {
        let bad = Cts {
            flags: 6,
            ..entry(0, 0, 100)
        };
        assert!(err(check(&bad.encode(), 0, Some(state(0, true)))).contains("CTS flags"));
        let e = err(check(&entry(0, 0, 100).encode(), 0, None));
        assert!(e.contains("unknown message 4"), "{e}");
        for st in [
            MsgState {
                posted: false,
                ..state(0, true)
            },
            MsgState {
                finished: true,
                ..state(0, true)
            },
            MsgState {
                rendezvous: false,
                ..state(0, true)
            },
        ] {
            let e = err(check(&entry(0, 0, 100).encode(), 0, Some(st)));
            assert!(e.contains("wrong state"), "{st:?}: {e}");
        }
        // A reject carries no range and is taken as such.
        let rej = Cts {
            flags: CTS_REJECT,
            offset: u64::MAX,
            len: u64::MAX,
            ..entry(0, 0, 0)
        };
        assert_eq!(
            check(&rej.encode(), 0, Some(state(0, false))).unwrap(),
            Some(rej)
        );
    }

    #[test]
    fn credits_beyond_what_was_used_fail_the_comm() {
        assert_eq!(credits(0, 5, 5, 3, 8).unwrap(), Some(5));
        assert_eq!(credits(0, 8, 8, 3, 8).unwrap(), Some(8));
        assert_eq!(credits(0, 3, 3, 3, 8).unwrap(), None, "unchanged");
        assert_eq!(credits(0, 2, 2, 3, 8).unwrap(), None, "older");
        assert_eq!(credits(0, 5, 6, 3, 8).unwrap(), None, "torn");
        let e = credits(2, 9, 9, 3, 8).unwrap_err().to_string();
        assert!(e.contains("returned 9 credits on QP 2, only 8"), "{e}");
        assert!(credits(0, u64::MAX, u64::MAX, 0, 0).is_err());
    }
}
