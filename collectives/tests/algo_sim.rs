//! The simulator enforces the matching contract: it reports size
//! mismatches, deadlocks, sources changed in flight, and stray messages.

use hetccl_abi::DataType;
use hetccl_collectives::algo::sim::{run, RankBuffers, SimError, SimOptions};
use hetccl_collectives::algo::{Algorithm, BufId, BufRange, Collective, Plan, Step, StepKind};
use hetccl_collectives::reduce::ReduceOp;

fn plan(rank: u32, steps: Vec<(StepKind, Vec<u32>)>) -> Plan {
    Plan {
        collective: Collective::AllReduce,
        algorithm: Algorithm::Direct,
        rank,
        nranks: 2,
        dtype: DataType::Uint8,
        op: ReduceOp::Sum,
        send_bytes: 8,
        recv_bytes: 8,
        scratch_bytes: 0,
        wire: hetccl_core::config::Compression::Off,
        steps: steps
            .into_iter()
            .map(|(kind, deps)| Step { kind, deps })
            .collect(),
    }
}

fn s(off: usize, len: usize) -> BufRange {
    BufRange::new(BufId::Send, off, len)
}
fn r(off: usize, len: usize) -> BufRange {
    BufRange::new(BufId::Recv, off, len)
}

fn bufs() -> Vec<RankBuffers> {
    (0..2)
        .map(|i| RankBuffers {
            send: vec![i as u8 + 1; 8],
            recv: vec![0; 8],
        })
        .collect()
}

#[test]
fn exchange_works() {
    let p0 = plan(
        0,
        vec![
            (
                StepKind::Send {
                    peer: 1,
                    chan: 0,
                    src: s(0, 8),
                },
                vec![],
            ),
            (
                StepKind::Recv {
                    peer: 1,
                    chan: 0,
                    dst: r(0, 8),
                },
                vec![],
            ),
        ],
    );
    let p1 = plan(
        1,
        vec![
            (
                StepKind::Recv {
                    peer: 0,
                    chan: 0,
                    dst: r(0, 8),
                },
                vec![],
            ),
            (
                StepKind::Send {
                    peer: 0,
                    chan: 0,
                    src: s(0, 8),
                },
                vec![],
            ),
        ],
    );
    let mut b = bufs();
    let rep = run(&[p0, p1], &mut b, &SimOptions::default()).unwrap();
    assert_eq!((rep.messages, rep.bytes, rep.steps), (2, 16, 4));
    assert_eq!(b[0].recv, vec![2; 8]);
    assert_eq!(b[1].recv, vec![1; 8]);
}

#[test]
fn size_mismatch() {
    let p0 = plan(
        0,
        vec![(
            StepKind::Send {
                peer: 1,
                chan: 0,
                src: s(0, 8),
            },
            vec![],
        )],
    );
    let p1 = plan(
        1,
        vec![(
            StepKind::Recv {
                peer: 0,
                chan: 0,
                dst: r(0, 4),
            },
            vec![],
        )],
    );
    let e = run(&[p0, p1], &mut bufs(), &SimOptions::default()).unwrap_err();
    assert!(
        matches!(
            e,
            SimError::SizeMismatch {
                sent: 8,
                expected: 4,
                ..
            }
        ),
        "{e}"
    );
}

#[test]
fn deadlock_is_reported_with_a_dump() {
    // Both ranks receive before they send, and the sends depend on the
    // receives: nobody can move.
    let p = |rank, peer| {
        plan(
            rank,
            vec![
                (
                    StepKind::Recv {
                        peer,
                        chan: 0,
                        dst: r(0, 8),
                    },
                    vec![],
                ),
                (
                    StepKind::Send {
                        peer,
                        chan: 0,
                        src: r(0, 8),
                    },
                    vec![0],
                ),
            ],
        )
    };
    let e = run(&[p(0, 1), p(1, 0)], &mut bufs(), &SimOptions::default()).unwrap_err();
    let SimError::Deadlock(dump) = e else {
        panic!("{e}")
    };
    assert!(
        dump.contains("rank 0") && dump.contains("rank 1") && dump.contains("receive from"),
        "{dump}"
    );
}

#[test]
fn rendezvous_catches_reliance_on_buffering() {
    // Rank 0 waits for its send to complete before receiving; rank 1 does
    // the same: fine with buffering, a deadlock with rendezvous sends.
    let p = |rank, peer| {
        plan(
            rank,
            vec![
                (
                    StepKind::Send {
                        peer,
                        chan: 0,
                        src: s(0, 8),
                    },
                    vec![],
                ),
                (
                    StepKind::Recv {
                        peer,
                        chan: 0,
                        dst: r(0, 8),
                    },
                    vec![0],
                ),
            ],
        )
    };
    let eager = SimOptions {
        seed: 3,
        rendezvous: false,
    };
    run(&[p(0, 1), p(1, 0)], &mut bufs(), &eager).unwrap();
    let e = run(&[p(0, 1), p(1, 0)], &mut bufs(), &SimOptions::default()).unwrap_err();
    assert!(matches!(e, SimError::Deadlock(_)), "{e}");
}

#[test]
fn channels_are_independent_fifos() {
    // Rank 0 sends A on chan 0 then B on chan 1; rank 1 receives chan 1
    // first. With one FIFO this would deadlock under rendezvous.
    let p0 = plan(
        0,
        vec![
            (
                StepKind::Send {
                    peer: 1,
                    chan: 0,
                    src: s(0, 4),
                },
                vec![],
            ),
            (
                StepKind::Send {
                    peer: 1,
                    chan: 1,
                    src: s(4, 4),
                },
                vec![],
            ),
        ],
    );
    let p1 = plan(
        1,
        vec![
            (
                StepKind::Recv {
                    peer: 0,
                    chan: 1,
                    dst: r(4, 4),
                },
                vec![],
            ),
            (
                StepKind::Recv {
                    peer: 0,
                    chan: 0,
                    dst: r(0, 4),
                },
                vec![0],
            ),
        ],
    );
    run(&[p0, p1], &mut bufs(), &SimOptions::default()).unwrap();
}

#[test]
fn source_modified_in_flight() {
    // Rank 0 overwrites its send source without waiting for the send.
    let p0 = plan(
        0,
        vec![
            (
                StepKind::Send {
                    peer: 1,
                    chan: 0,
                    src: r(0, 8),
                },
                vec![],
            ),
            (
                StepKind::Copy {
                    src: s(0, 8),
                    dst: r(0, 8),
                },
                vec![],
            ),
        ],
    );
    let p1 = plan(
        1,
        vec![(
            StepKind::Recv {
                peer: 0,
                chan: 0,
                dst: r(0, 8),
            },
            vec![],
        )],
    );
    // Find a seed where the copy runs before the receive.
    let hit = (0..64).any(|seed| {
        matches!(
            run(
                &[p0.clone(), p1.clone()],
                &mut bufs(),
                &SimOptions {
                    seed,
                    rendezvous: true
                }
            ),
            Err(SimError::SourceModified { rank: 0, step: 0 })
        )
    });
    assert!(hit);
}

#[test]
fn unreceived_and_invalid() {
    let p0 = plan(
        0,
        vec![(
            StepKind::Send {
                peer: 1,
                chan: 0,
                src: s(0, 8),
            },
            vec![],
        )],
    );
    let p1 = plan(1, vec![]);
    let eager = SimOptions {
        seed: 1,
        rendezvous: false,
    };
    assert!(matches!(
        run(&[p0.clone(), p1.clone()], &mut bufs(), &eager),
        Err(SimError::Unreceived(_))
    ));
    // With rendezvous sends the send never completes: also unreceived.
    assert!(matches!(
        run(&[p0, p1], &mut bufs(), &SimOptions::default()),
        Err(SimError::Unreceived(_))
    ));
    let bad = plan(
        0,
        vec![(
            StepKind::Send {
                peer: 0,
                chan: 0,
                src: s(0, 8),
            },
            vec![],
        )],
    );
    assert!(matches!(
        run(&[bad, plan(1, vec![])], &mut bufs(), &SimOptions::default()),
        Err(SimError::Invalid { .. })
    ));
    let oob = plan(
        0,
        vec![(
            StepKind::Copy {
                src: s(4, 8),
                dst: r(0, 8),
            },
            vec![],
        )],
    );
    assert!(matches!(
        run(&[oob, plan(1, vec![])], &mut bufs(), &SimOptions::default()),
        Err(SimError::Invalid { .. })
    ));
    let chan = plan(
        0,
        vec![(
            StepKind::Send {
                peer: 1,
                chan: 2,
                src: s(0, 8),
            },
            vec![],
        )],
    );
    assert!(matches!(
        run(
            &[chan, plan(1, vec![])],
            &mut bufs(),
            &SimOptions::default()
        ),
        Err(SimError::Invalid {
            err: hetccl_collectives::algo::PlanCheckError::BadChannel { chan: 2, .. },
            ..
        })
    ));
    let fwd = plan(
        0,
        vec![(
            StepKind::Copy {
                src: s(0, 8),
                dst: r(0, 8),
            },
            vec![0],
        )],
    );
    assert!(matches!(
        run(&[fwd, plan(1, vec![])], &mut bufs(), &SimOptions::default()),
        Err(SimError::Invalid { .. })
    ));
}
