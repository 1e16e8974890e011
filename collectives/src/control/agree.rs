//! A set as a collective call: every rank sends a fixed-size record of what
//! it sets, and after how many collectives, around the bootstrap ring; the
//! set applies only when every record is the same.
//!
//! The record is [`RECORD`] bytes: the collective count (`Engine::coll_seq`)
//! as u64 LE, a flag (0: the value parsed on that rank, 1: it did not), the
//! key and value lengths, then the canonical key (or the raw one when it did
//! not parse) in [`MAX_KEY`] bytes and the value in [`MAX_VALUE`] bytes, zero
//! padded. Records that differ fail the set on every rank with
//! `ncclInvalidUsage`; the same unparsable value on every rank fails it with
//! `ncclInvalidArgument`. Nothing is applied in either case.

use std::sync::Arc;

use crate::comm::Comm;
use crate::error::{Error, Result};

use super::options::{self, Setting, MAX_KEY, MAX_VALUE};

/// Bytes of one rank's record.
pub const RECORD: usize = 16 + MAX_KEY + MAX_VALUE;

/// One rank's record of a set.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Record {
    coll_seq: u64,
    valid: bool,
    key: String,
    value: String,
}

/// At most `max` bytes of `s`, cut at a character boundary.
fn clip(s: &str, max: usize) -> &str {
    let mut n = s.len().min(max);
    while !s.is_char_boundary(n) {
        n -= 1;
    }
    &s[..n]
}

impl Record {
    fn encode(&self) -> [u8; RECORD] {
        let mut b = [0u8; RECORD];
        let (k, v) = (clip(&self.key, MAX_KEY), clip(&self.value, MAX_VALUE));
        b[..8].copy_from_slice(&self.coll_seq.to_le_bytes());
        b[8] = u8::from(!self.valid);
        b[9] = k.len() as u8;
        b[10] = v.len() as u8;
        b[16..16 + k.len()].copy_from_slice(k.as_bytes());
        b[16 + MAX_KEY..16 + MAX_KEY + v.len()].copy_from_slice(v.as_bytes());
        b
    }

    /// The record of `b`, checked: every length is bounded.
    fn decode(b: &[u8]) -> Option<Self> {
        if b.len() != RECORD || b[8] > 1 {
            return None;
        }
        let (kl, vl) = (usize::from(b[9]), usize::from(b[10]));
        if kl > MAX_KEY || vl > MAX_VALUE {
            return None;
        }
        Some(Self {
            coll_seq: u64::from_le_bytes(b[..8].try_into().ok()?),
            valid: b[8] == 0,
            key: String::from_utf8_lossy(&b[16..16 + kl]).into_owned(),
            value: String::from_utf8_lossy(&b[16 + MAX_KEY..16 + MAX_KEY + vl]).into_owned(),
        })
    }

    fn describe(&self) -> String {
        format!(
            "{}={} after {} collectives",
            self.key, self.value, self.coll_seq
        )
    }
}

/// Sets `key` to `value` on `comm`, as a collective call (see the module
/// docs). Refused inside a group: a set is not queued.
pub fn set(comm: &Arc<Comm>, key: &str, value: &str) -> Result<()> {
    if crate::launch::group::depth() > 0 {
        return Err(Error::usage(
            "hetcclCommSetOption cannot be called inside a group",
        ));
    }
    comm.check_usable()?;
    let e = comm.engine()?;
    let parsed = options::parse(key, value);
    let coll_seq = e.coll_seq.load(std::sync::atomic::Ordering::Relaxed);
    let mine = match &parsed {
        Ok(s) => {
            let (k, v) = options::canonical(s);
            Record {
                coll_seq,
                valid: true,
                key: k,
                value: v,
            }
        }
        Err(_) => Record {
            coll_seq,
            valid: false,
            key: key.to_string(),
            value: value.to_string(),
        },
    };
    let all = match e.bootstrap.lock().allgather(&mine.encode(), RECORD) {
        Ok(all) => all,
        Err(err) => {
            // The bootstrap ring may hold part of the exchange: nothing
            // more may run on this communicator.
            crate::launch::poison(comm, &err);
            return Err(err);
        }
    };
    let mut records = Vec::with_capacity(all.len());
    for (r, b) in all.iter().enumerate() {
        let rec = Record::decode(b).ok_or_else(|| {
            Error::Internal(format!("malformed option record from rank {r}").into())
        })?;
        records.push(rec);
    }
    let me = &records[comm.rank];
    if let Some((r, other)) = records.iter().enumerate().find(|(_, x)| *x != me) {
        return Err(Error::usage(format!(
            "ranks disagree on a hetcclCommSetOption: rank {} set {}, rank {r} set {} \
             (every rank must set the same option at the same point of its collectives)",
            comm.rank,
            me.describe(),
            other.describe()
        )));
    }
    let setting: Setting = parsed.map_err(Error::arg)?;
    e.control.apply(&setting).map_err(Error::arg)?;
    tracing::info!(target: "hetccl::TUNING",
        "{} rank {}: option {}={} from collective {coll_seq}",
        e.settings.label(e.comm_hash), comm.rank, me.key, me.value);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_are_bounded() {
        let r = Record {
            coll_seq: 7,
            valid: true,
            key: "algo.allreduce".into(),
            value: "ring".into(),
        };
        assert_eq!(Record::decode(&r.encode()), Some(r.clone()));
        let long = Record {
            value: "é".repeat(200),
            valid: false,
            ..r
        };
        let d = Record::decode(&long.encode()).unwrap();
        assert!(d.value.len() <= MAX_VALUE && !d.valid);
        let mut bad = long.encode();
        bad[10] = 200;
        assert_eq!(Record::decode(&bad), None);
        assert_eq!(Record::decode(&bad[..10]), None);
        bad[10] = 0;
        bad[8] = 2;
        assert_eq!(Record::decode(&bad), None);
    }
}
