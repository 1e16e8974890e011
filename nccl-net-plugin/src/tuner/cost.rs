//! The edit of NCCL's cost table: make one (algo, proto) the cheapest
//! usable pair without touching the unusable ones.
//!
//! NCCL picks the smallest entry that is `>= 0.0` (the first on ties, in
//! algorithm-then-protocol order); negative entries, `-1.0` in practice, are
//! pairs it will not use, and a NaN is never picked either.

/// What [`prefer`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Edit {
    /// The pair's cost was lowered (and ties at zero raised) so it wins.
    Lowered,
    /// The pair already won; nothing changed.
    AlreadyBest,
    /// NCCL marked the pair unusable (or it is outside the table); nothing
    /// changed.
    Unusable,
}

/// True for an entry NCCL may pick.
pub fn usable(v: f32) -> bool {
    v >= 0.0
}

/// The pair NCCL would pick from `cells` (`num_proto` per algorithm row).
pub fn winner(cells: &[f32], num_proto: usize) -> Option<(usize, usize)> {
    let mut best: Option<(usize, f32)> = None;
    for (i, &v) in cells.iter().enumerate() {
        if usable(v) && best.is_none_or(|(_, b)| v < b) {
            best = Some((i, v));
        }
    }
    best.map(|(i, _)| (i / num_proto, i % num_proto))
}

/// Makes (`algo`, `proto`) the pair NCCL picks from `cells`, a row-major
/// `[num_algo][num_proto]` table, unless NCCL marked it unusable. Only the
/// chosen cell is lowered (to half the cheapest other usable cost); when
/// another usable cell costs exactly 0, the chosen one becomes 0 and those
/// become the smallest positive float, still usable. Unusable cells are
/// never written.
pub fn prefer(cells: &mut [f32], num_proto: usize, algo: usize, proto: usize) -> Edit {
    if num_proto == 0 || proto >= num_proto {
        return Edit::Unusable;
    }
    let Some(at) = algo
        .checked_mul(num_proto)
        .and_then(|r| r.checked_add(proto))
    else {
        return Edit::Unusable;
    };
    let Some(&mine) = cells.get(at) else {
        return Edit::Unusable;
    };
    if !usable(mine) {
        return Edit::Unusable;
    }
    if winner(cells, num_proto) == Some((algo, proto)) {
        return Edit::AlreadyBest;
    }
    let others = cells
        .iter()
        .enumerate()
        .filter(|&(i, &v)| i != at && usable(v))
        .map(|(_, &v)| v)
        .fold(f32::INFINITY, f32::min);
    if others > 0.0 {
        cells[at] = others / 2.0;
    } else {
        cells[at] = 0.0;
        for (i, v) in cells.iter_mut().enumerate() {
            if i != at && *v == 0.0 {
                *v = f32::MIN_POSITIVE;
            }
        }
    }
    Edit::Lowered
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: usize = 3;

    fn base() -> Vec<f32> {
        // Tree, Ring, CollNetDirect, CollNetChain, NVLS, NVLSTree, PAT.
        let mut t = vec![-1.0_f32; 7 * P];
        for a in [0, 1, 6] {
            for p in 0..P {
                t[a * P + p] = 50.0 + (a as f32 - 1.0).abs() * 10.0 + (2.0 - p as f32) * 3.0;
            }
        }
        t[1] = -1.0; // Tree/LL128 unusable.
        t
    }

    #[test]
    fn lowers_only_the_chosen_cell() {
        let mut t = base();
        assert_eq!(winner(&t, P), Some((1, 2)));
        let before = t.clone();
        assert_eq!(prefer(&mut t, P, 6, 0), Edit::Lowered);
        assert_eq!(winner(&t, P), Some((6, 0)));
        for i in 0..t.len() {
            if i != 6 * P {
                assert_eq!(t[i].to_bits(), before[i].to_bits(), "cell {i}");
            }
        }
        assert!(t[6 * P] >= 0.0);
    }

    #[test]
    fn leaves_unusable_and_out_of_range_pairs() {
        for (a, p) in [(0, 1), (2, 2), (4, 0), (7, 0), (0, 3), (usize::MAX, 2)] {
            let mut t = base();
            assert_eq!(prefer(&mut t, P, a, p), Edit::Unusable, "({a}, {p})");
            assert_eq!(t, base());
        }
        let mut nan = base();
        nan[0] = f32::NAN;
        assert_eq!(prefer(&mut nan, P, 0, 0), Edit::Unusable);
        assert!(nan[0].is_nan());
        assert_eq!(prefer(&mut [], P, 0, 0), Edit::Unusable);
        assert_eq!(prefer(&mut [1.0], 0, 0, 0), Edit::Unusable);
    }

    #[test]
    fn already_best_changes_nothing() {
        let mut t = base();
        assert_eq!(prefer(&mut t, P, 1, 2), Edit::AlreadyBest);
        assert_eq!(t, base());
    }

    #[test]
    fn ties_at_zero_are_broken_without_disabling() {
        let mut t = base();
        t[0] = 0.0; // Tree/LL free, and first in order.
        t[3 * P] = 0.0; // An unusable row made usable at cost 0.
        assert_eq!(prefer(&mut t, P, 6, 2), Edit::Lowered);
        assert_eq!(winner(&t, P), Some((6, 2)));
        assert_eq!(t[0], f32::MIN_POSITIVE);
        assert!(usable(t[3 * P]) && t[3 * P] > 0.0);
        assert_eq!(t[1], -1.0);
        // A tie with a later cell: the earlier one already wins.
        let mut t = base();
        t[0] = 10.0;
        t[6 * P] = 10.0;
        assert_eq!(prefer(&mut t, P, 6, 0), Edit::Lowered);
        assert_eq!(winner(&t, P), Some((6, 0)));
        assert_eq!(t[0], 10.0);
    }

    #[test]
    fn infinite_costs_still_lose() {
        let mut t = vec![f32::INFINITY, 5.0, -1.0];
        assert_eq!(prefer(&mut t, 3, 0, 0), Edit::Lowered);
        assert_eq!(winner(&t, 3), Some((0, 0)));
        assert_eq!(t[2], -1.0);
    }
}
