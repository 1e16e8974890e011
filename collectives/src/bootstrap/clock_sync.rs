//! The clock probe over the bootstrap ring: how this rank's clock relates
//! to rank 0's, for the timeline.
//!
//! Rank 0 sends its time around the ring [`ROUNDS`] times; every rank notes
//! when the token reached it. Rank 0 keeps the fastest round and shares its
//! start time and loop duration, and each rank takes the token's hops as
//! equally long: rank r received it at `start + r · loop / n` on rank 0's
//! clock. Every rank runs the same sequence, so a failure is an error on
//! every rank, not a hang. The final all-gather also carries a small blob
//! per rank for the caller (the status service's address).

use super::{frame, Bootstrap};
use crate::error::{Error, Result};
use crate::telemetry::trace::ClockSync;

/// Trips around the ring; the fastest is used.
const ROUNDS: usize = 5;
/// The largest blob a rank may add to the exchange.
pub const MAX_EXTRA: usize = 512;

fn u64_at(b: &[u8], i: usize) -> Result<u64> {
    b.get(i * 8..i * 8 + 8)
        .map(|s| u64::from_le_bytes(s.try_into().expect("8 bytes")))
        .ok_or_else(|| Error::Remote("clock probe: short message".into()))
}

impl Bootstrap {
    /// Estimates this rank's clock offset to rank 0's; `now` reads this
    /// host's clock (Unix ns). Also all-gathers `extra` (at most
    /// [`MAX_EXTRA`] bytes): every rank's, by rank.
    pub fn clock_sync(
        &mut self,
        now: impl Fn() -> u64,
        extra: &[u8],
    ) -> Result<(ClockSync, Vec<Vec<u8>>)> {
        if extra.len() > MAX_EXTRA {
            return Err(Error::Internal("clock probe: extra blob too long".into()));
        }
        let n = self.nranks();
        if n == 1 {
            let sync = ClockSync {
                offset_ns: 0,
                origin_ns: now(),
            };
            return Ok((sync, vec![extra.to_vec()]));
        }
        let dl = self.params.deadline();
        let (next, prev) = match (self.next.as_mut(), self.prev.as_mut()) {
            (Some(a), Some(b)) => (a, b),
            _ => return Err(Error::Internal("bootstrap ring is not connected".into())),
        };
        // Rank 0: (start, loop) per round; others: arrival per round.
        let mut mine = [(0u64, 0u64); ROUNDS];
        for m in &mut mine {
            if self.rank == 0 {
                let t0 = now();
                frame::send(next, &t0.to_le_bytes(), dl)?;
                frame::recv(prev, 8, dl)?;
                *m = (t0, now().saturating_sub(t0));
            } else {
                let tok = frame::recv(prev, 8, dl)?;
                let at = now();
                frame::send(next, &tok, dl)?;
                *m = (at, 0);
            }
        }
        let best = (0..ROUNDS).min_by_key(|&i| mine[i].1).unwrap_or(0);
        let mut blob: Vec<u8> = mine
            .iter()
            .flat_map(|(a, b)| [a.to_le_bytes(), b.to_le_bytes()])
            .flatten()
            .collect();
        blob.extend_from_slice(extra);
        let all = self.allgather(&blob, ROUNDS * 16 + MAX_EXTRA)?;
        if all.iter().any(|b| b.len() < ROUNDS * 16) {
            return Err(Error::Remote("clock probe: short message".into()));
        }
        let zero = &all[0];
        let best = if self.rank == 0 {
            best
        } else {
            (0..ROUNDS)
                .min_by_key(|&i| u64_at(zero, 2 * i + 1).unwrap_or(u64::MAX))
                .unwrap_or(0)
        };
        let (start, lap) = (u64_at(zero, 2 * best)?, u64_at(zero, 2 * best + 1)?);
        let offset_ns = if self.rank == 0 {
            0
        } else {
            let arrival = u64_at(&all[self.rank], 2 * best)?;
            let expected = start as i128 + (lap as i128 * self.rank as i128) / n as i128;
            (expected - arrival as i128).clamp(i64::MIN as i128, i64::MAX as i128) as i64
        };
        let extras = all.iter().map(|b| b[ROUNDS * 16..].to_vec()).collect();
        Ok((
            ClockSync {
                offset_ns,
                origin_ns: start,
            },
            extras,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::super::{new_root, Params};
    use super::*;

    #[test]
    fn skewed_clocks_are_aligned_to_rank_0() {
        let id = new_root(Params::default()).unwrap();
        let skew = [0i64, 5_000_000_000, -3_000_000_000];
        let hs: Vec<_> = (0..3)
            .map(|r| {
                let id = id.clone();
                std::thread::spawn(move || {
                    let mut b = Bootstrap::join(&id, r, 3, 7, Params::default())?;
                    let base = std::time::Instant::now();
                    let now =
                        || (10_000_000_000i64 + base.elapsed().as_nanos() as i64 + skew[r]) as u64;
                    b.clock_sync(now, &[r as u8; 3])
                })
            })
            .collect();
        for (r, h) in hs.into_iter().enumerate() {
            let (s, extras) = h.join().unwrap().unwrap();
            assert_eq!(extras, vec![vec![0u8; 3], vec![1; 3], vec![2; 3]]);
            // The threads' bases differ by their start-up skew (well under 50 ms).
            let err = (s.offset_ns + skew[r]).abs();
            assert!(
                err < 50_000_000,
                "rank {r}: offset {} for skew {}",
                s.offset_ns,
                skew[r]
            );
        }
    }
}
