//! A whole rank-ordered fold in one pass over memory: the inputs are folded
//! a small tile at a time in a buffer that stays in L1, and each finished
//! tile is handed to the caller (who streams it into the outputs) before the
//! next tile's inputs are read. Loads of one tile and the stores of the
//! previous one are thus in flight together, and no result ever goes
//! through L2 or memory twice.
//!
//! Each tile runs the same element-wise kernels, in the same order, as a
//! fold of the whole slices ([`super::reduce3`], [`super::reduce_into`],
//! [`super::pre_op`], [`super::post_op`]), so the results are bit-identical.

use hetccl_abi::DataType;

use super::{ReduceError, ReduceOp};

/// Bytes per tile: a multiple of every element size and of 64 (a cache
/// line), small enough that a tile and its pre-op buffer stay in L1.
pub const TILE: usize = 4096;

/// A tile buffer aligned to a cache line, so that the typed (vectorised)
/// kernel paths apply whenever the inputs are aligned.
#[repr(C, align(64))]
struct Tile([u8; TILE]);

/// Folds `inputs` (rank order, all of one length) with `op` as NCCL does
/// — `pre(0) ⊕ pre(1) ⊕ …`, then the post-op — and calls `emit(offset,
/// tile)` for each finished tile of the result, in order.
///
/// `pre_ops[k]` is the operation whose pre-op rank `k`'s input takes (its
/// own PreMulSum scalar); `None` when `op` has no pre-op on `dt`.
pub fn fold_tiles(
    inputs: &[&[u8]],
    pre_ops: Option<&[ReduceOp]>,
    dt: DataType,
    op: ReduceOp,
    nranks: u32,
    mut emit: impl FnMut(usize, &[u8]),
) -> Result<(), ReduceError> {
    let Some(first) = inputs.first() else {
        return Ok(());
    };
    let len = first.len();
    for s in inputs {
        super::check(dt, len, s.len())?;
    }
    if let Some(p) = pre_ops {
        if p.len() != inputs.len() {
            return Err(ReduceError::LengthMismatch(p.len(), inputs.len()));
        }
    }
    let mut acc = Tile([0; TILE]);
    let mut tmp = Tile([0; TILE]);
    let mut off = 0;
    while off < len {
        let m = TILE.min(len - off);
        let acc = &mut acc.0[..m];
        let part = |k: usize| &inputs[k][off..off + m];
        match pre_ops {
            Some(p) => {
                super::pre_op(acc, part(0), dt, p[0], nranks)?;
                for (k, &pk) in p.iter().enumerate().skip(1) {
                    let t = &mut tmp.0[..m];
                    super::pre_op(t, part(k), dt, pk, nranks)?;
                    super::reduce_into(acc, t, dt, op)?;
                }
            }
            None if inputs.len() >= 2 => {
                super::reduce3(acc, part(0), part(1), dt, op)?;
                for k in 2..inputs.len() {
                    super::reduce_into(acc, part(k), dt, op)?;
                }
            }
            None => acc.copy_from_slice(part(0)),
        }
        super::post_op(acc, dt, op, nranks)?;
        emit(off, acc);
        off += m;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::Scalar;
    use super::*;

    const TYPES: [DataType; 12] = [
        DataType::Int8,
        DataType::Uint8,
        DataType::Int32,
        DataType::Uint32,
        DataType::Int64,
        DataType::Uint64,
        DataType::Float16,
        DataType::Float32,
        DataType::Float64,
        DataType::Bfloat16,
        DataType::Float8e4m3,
        DataType::Float8e5m2,
    ];

    /// Deterministic bytes that include NaNs, infinities and negatives.
    fn noise(seed: u64, len: usize) -> Vec<u8> {
        let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x >> 24) as u8
            })
            .collect()
    }

    /// The fold of whole slices, as the work items did it before tiles.
    fn plain(
        inputs: &[&[u8]],
        pre: Option<&[ReduceOp]>,
        dt: DataType,
        op: ReduceOp,
        nr: u32,
    ) -> Vec<u8> {
        let mut acc = vec![0u8; inputs[0].len()];
        match pre {
            Some(p) => {
                super::super::pre_op(&mut acc, inputs[0], dt, p[0], nr).unwrap();
                for k in 1..inputs.len() {
                    let mut t = vec![0u8; acc.len()];
                    super::super::pre_op(&mut t, inputs[k], dt, p[k], nr).unwrap();
                    super::super::reduce_into(&mut acc, &t, dt, op).unwrap();
                }
            }
            None if inputs.len() >= 2 => {
                super::super::reduce3(&mut acc, inputs[0], inputs[1], dt, op).unwrap();
                for s in &inputs[2..] {
                    super::super::reduce_into(&mut acc, s, dt, op).unwrap();
                }
            }
            None => acc.copy_from_slice(inputs[0]),
        }
        super::super::post_op(&mut acc, dt, op, nr).unwrap();
        acc
    }

    #[test]
    fn tiles_match_the_plain_fold_bit_for_bit() {
        let ops = |dt: DataType| {
            let s = Scalar::from_f64(dt, 3.0);
            [
                ReduceOp::Sum,
                ReduceOp::Prod,
                ReduceOp::Max,
                ReduceOp::Min,
                ReduceOp::Avg,
                ReduceOp::PreMulSum(s),
            ]
        };
        for dt in TYPES {
            let size = dt.size();
            for op in ops(dt) {
                for n in [1usize, 2, 3] {
                    // Odd element counts across tile edges, and starts off
                    // every alignment.
                    for (elems, skew) in [
                        (1usize, 0usize),
                        (37, 1),
                        (TILE / size + 3, 3),
                        (2 * TILE / size + 11, 5),
                    ] {
                        let len = elems * size;
                        let bufs: Vec<Vec<u8>> = (0..n)
                            .map(|k| noise((k * 131 + len + skew) as u64, len + 8))
                            .collect();
                        let inputs: Vec<&[u8]> = bufs
                            .iter()
                            .enumerate()
                            .map(|(k, b)| &b[(skew + k) % 8..][..len])
                            .collect();
                        let pre_ops: Vec<ReduceOp> = (0..n)
                            .map(|k| match op {
                                ReduceOp::PreMulSum(_) => {
                                    ReduceOp::PreMulSum(Scalar::from_f64(dt, 1.0 + k as f64))
                                }
                                o => o,
                            })
                            .collect();
                        let pre = op.has_pre_op(dt).then_some(&pre_ops[..]);
                        let want = plain(&inputs, pre, dt, op, n as u32);
                        let mut got = vec![0u8; len];
                        let mut next = 0;
                        fold_tiles(&inputs, pre, dt, op, n as u32, |off, t| {
                            assert_eq!(off, next, "tiles in order");
                            got[off..off + t.len()].copy_from_slice(t);
                            next = off + t.len();
                        })
                        .unwrap();
                        assert_eq!(next, len);
                        assert!(got == want, "{dt:?} {op:?} n {n} elems {elems} skew {skew}");
                    }
                }
            }
        }
    }

    #[test]
    fn rejects_unequal_or_ragged_inputs() {
        let (a, b) = ([0u8; 8], [0u8; 12]);
        let r = fold_tiles(
            &[&a, &b],
            None,
            DataType::Int32,
            ReduceOp::Sum,
            2,
            |_, _| {},
        );
        assert_eq!(r, Err(ReduceError::LengthMismatch(8, 12)));
        let r = fold_tiles(
            &[&a[..6]],
            None,
            DataType::Int32,
            ReduceOp::Sum,
            1,
            |_, _| {},
        );
        assert_eq!(r, Err(ReduceError::Ragged { len: 6, size: 4 }));
        let p = [ReduceOp::Sum];
        let r = fold_tiles(
            &[&a, &a],
            Some(&p),
            DataType::Int32,
            ReduceOp::Sum,
            2,
            |_, _| {},
        );
        assert_eq!(r, Err(ReduceError::LengthMismatch(1, 2)));
    }
}
