//! Per-collective counts (rounded down as nccl-tests does) and the algbw /
//! busbw formulas of nccl-tests' `*GetBw` (dropin-facts §1.4).

use hetccl_perf::coll::{Coll, Counts};

#[test]
fn busbw_factors_per_collective() {
    for n in [1usize, 2, 3, 4, 8, 17] {
        let nf = n as f64;
        for c in Coll::ALL {
            let want = match c {
                Coll::AllReduce => 2.0 * (nf - 1.0) / nf,
                Coll::AllGather
                | Coll::ReduceScatter
                | Coll::AlltoAll
                | Coll::Gather
                | Coll::Scatter => (nf - 1.0) / nf,
                Coll::Broadcast | Coll::Reduce | Coll::SendRecv => 1.0,
            };
            assert_eq!(c.busbw_factor(n), want, "{c} n={n}");
        }
    }
}

#[test]
fn algbw_numerators_and_gb_is_1e9() {
    // 1000 floats in 1 ms on 4 ranks.
    let (count, elt, sec, n) = (1000usize, 4usize, 1e-3, 4usize);
    let bytes = 4000.0;
    for c in Coll::ALL {
        let numer = match c {
            Coll::AllReduce | Coll::Broadcast | Coll::Reduce | Coll::SendRecv => bytes,
            _ => bytes * n as f64,
        };
        let (alg, bus) = c.bandwidth(count, elt, sec, n);
        assert!((alg - numer / 1e9 / sec).abs() < 1e-12, "{c}: algbw {alg}");
        assert!(
            (bus - alg * c.busbw_factor(n)).abs() < 1e-12,
            "{c}: busbw {bus}"
        );
    }
    let (alg, bus) = Coll::AllReduce.bandwidth(1 << 20, 4, 1e-3, 2);
    assert!((alg - 4.194304).abs() < 1e-9 && (bus - 4.194304).abs() < 1e-9);
}

#[test]
fn counts_round_per_rank_parts_down_to_16_bytes() {
    // all_gather / gather: count = per-rank send count.
    let c = Coll::AllGather.counts(1000, 4, 3);
    assert_eq!(
        c,
        Counts {
            send: 332,
            recv: 996,
            param: 332,
            send_inplace_offset: 332,
            recv_inplace_offset: 0
        }
    );
    assert_eq!(Coll::Gather.counts(1000, 4, 3), c);
    // reduce_scatter / scatter: count = per-rank receive count.
    let c = Coll::ReduceScatter.counts(1000, 4, 3);
    assert_eq!(
        c,
        Counts {
            send: 996,
            recv: 332,
            param: 332,
            send_inplace_offset: 0,
            recv_inplace_offset: 332
        }
    );
    assert_eq!(Coll::Scatter.counts(1000, 4, 3), c);
    // alltoall: count = per-peer count.
    let c = Coll::AlltoAll.counts(1000, 4, 3);
    assert_eq!((c.send, c.recv, c.param), (996, 996, 332));
    // Unrounded ones.
    for k in [
        Coll::AllReduce,
        Coll::Broadcast,
        Coll::Reduce,
        Coll::SendRecv,
    ] {
        assert_eq!(
            k.counts(1001, 1, 3),
            Counts {
                send: 1001,
                recv: 1001,
                param: 1001,
                send_inplace_offset: 0,
                recv_inplace_offset: 0
            }
        );
    }
    // The 16-byte mask depends on the element size.
    assert_eq!(Coll::AllGather.counts(100, 1, 2).param, 48); // 50 & !15
    assert_eq!(Coll::AllGather.counts(25, 8, 2).param, 12); // 12 & !1
    assert_eq!(Coll::AllGather.counts(7, 2, 2).param, 0); // 3 & !7
    assert_eq!(Coll::AllGather.counts(0, 4, 4).param, 0);
}

#[test]
fn size_column_is_the_larger_buffer() {
    // 1 MiB floats on 4 ranks: all_gather sends 64K elements, receives 256K.
    let c = Coll::AllGather.counts((1 << 20) / 4, 4, 4);
    assert_eq!(c.send.max(c.recv) * 4, 1 << 20);
    assert_eq!(c.param, 65536);
}

#[test]
fn rooted_and_reduction_sets() {
    let rooted: Vec<_> = Coll::ALL.into_iter().filter(|c| c.is_rooted()).collect();
    assert_eq!(
        rooted,
        vec![Coll::Broadcast, Coll::Reduce, Coll::Scatter, Coll::Gather]
    );
    let red: Vec<_> = Coll::ALL.into_iter().filter(|c| c.is_reduction()).collect();
    assert_eq!(
        red,
        vec![Coll::AllReduce, Coll::ReduceScatter, Coll::Reduce]
    );
    let unchecked: Vec<_> = Coll::ALL
        .into_iter()
        .filter(|c| !c.checks_in_place())
        .collect();
    assert_eq!(unchecked, vec![Coll::AlltoAll, Coll::SendRecv]);
}
