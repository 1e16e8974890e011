//! The bad-argument rows for every entry point but the collectives (see
//! `tests/bad_args/main.rs` for the table and the collective rows).

use super::*;

/// The rows for everything but the collectives.
pub(super) fn other_rows(t: &mut Table, fx: Fx) {
    let e = INVALID_ARGUMENT;
    let u = INVALID_USAGE;
    let mut id = ncclUniqueId::default();
    // SAFETY: a writable id on this stack frame.
    check(unsafe { ncclGetUniqueId(&mut id) }, "ncclGetUniqueId");
    let out: *mut ncclComm_t = leak(null_mut());
    let iout: *mut c_int = leak(0);
    let ids: *mut ncclUniqueId = leak(id);
    let zero_id = ncclUniqueId::default();
    let mut garbage_id = id;
    garbage_id.internal[100] = 1; // reserved bytes must be zero
    let mut bad_family = id;
    bad_family.internal[5] = 9;

    // Version, errors, memory.
    // SAFETY: a bad-argument row: the bad argument must be refused before any access, and every
    // other pointer is a live fixture (leaked for the test's life).
    t.add("ncclGetVersion: version NULL", e, "version", || unsafe {
        ncclGetVersion(null_mut())
    });
    // SAFETY: a bad-argument row: the bad argument must be refused before any access, and every
    // other pointer is a live fixture (leaked for the test's life).
    t.add("ncclGetUniqueId: uniqueId NULL", e, "uniqueId", || unsafe {
        ncclGetUniqueId(null_mut())
    });
    // SAFETY: a bad-argument row: the bad argument must be refused before any access, and every
    // other pointer is a live fixture (leaked for the test's life).
    t.add("ncclMemAlloc: ptr NULL", e, "ptr", || unsafe {
        ncclMemAlloc(null_mut(), 64)
    });
    let pslot: *mut *mut c_void = leak(null_mut());
    // SAFETY: a bad-argument row: the bad argument must be refused before any access, and every
    // other pointer is a live fixture (leaked for the test's life).
    t.add("ncclMemAlloc: size 0", e, "size", move || unsafe {
        ncclMemAlloc(pslot, 0)
    });
    // SAFETY: a bad-argument row: the bad argument must be refused before any access, and every
    // other pointer is a live fixture (leaked for the test's life).
    t.add("ncclMemAlloc: size usize::MAX", e, "size", move || unsafe {
        ncclMemAlloc(pslot, usize::MAX)
    });
    t.add(
        "ncclMemFree: pointer not from ncclMemAlloc",
        e,
        "ncclMemAlloc",
        // SAFETY: a bad-argument row: the bad argument must be refused before any access, and
        // every other pointer is a live fixture (leaked for the test's life).
        move || unsafe { ncclMemFree(fx.sbuf) },
    );

    // Init.
    // SAFETY: a bad-argument row: the bad argument must be refused before any access, and every
    // other pointer is a live fixture (leaked for the test's life).
    t.add("ncclCommInitRank: comm NULL", e, "comm", move || unsafe {
        ncclCommInitRank(null_mut(), 2, id, 0)
    });
    for (n, r, sub) in [
        (0, 0, "nranks"),
        (-1, 0, "nranks"),
        (i32::MAX, 0, "nranks"),
        (2, -1, "rank"),
        (2, 2, "rank"),
    ] {
        t.add(
            format!("ncclCommInitRank: nranks {n} rank {r}"),
            e,
            sub,
            // SAFETY: a bad-argument row: the bad argument must be refused before any access, and
            // every other pointer is a live fixture (leaked for the test's life).
            move || unsafe { ncclCommInitRank(out, n, id, r) },
        );
    }
    for (what, bad, sub) in [
        ("all-zero id", zero_id, "unique id"),
        ("reserved bytes set", garbage_id, "unique id"),
        ("address family 9", bad_family, "unique id"),
    ] {
        t.add(
            format!("ncclCommInitRank: {what}"),
            e,
            sub,
            // SAFETY: a bad-argument row: the bad argument must be refused before any access, and
            // every other pointer is a live fixture (leaked for the test's life).
            move || unsafe { ncclCommInitRank(out, 2, bad, 0) },
        );
    }
    for (what, k, sub) in bad_comm_configs() {
        let k = leak(k);
        t.add(
            format!("ncclCommInitRankConfig: config {what}"),
            e,
            sub,
            // SAFETY: a bad-argument row: the bad argument must be refused before any access, and
            // every other pointer is a live fixture (leaked for the test's life).
            move || unsafe { ncclCommInitRankConfig(out, 2, id, 0, k) },
        );
    }
    // SAFETY: a bad-argument row: the bad argument must be refused before any access, and every
    // other pointer is a live fixture (leaked for the test's life).
    t.add("ncclCommInitAll: comms NULL", e, "comms", || unsafe {
        ncclCommInitAll(null_mut(), 1, null())
    });
    for n in [0, -5] {
        t.add(
            format!("ncclCommInitAll: ndev {n}"),
            e,
            "nranks",
            // SAFETY: a bad-argument row: the bad argument must be refused before any access, and
            // every other pointer is a live fixture (leaked for the test's life).
            move || unsafe { ncclCommInitAll(out, n, null()) },
        );
    }
    t.add(
        "ncclCommInitRankScalable: newcomm NULL",
        e,
        "newcomm",
        // SAFETY: a bad-argument row: the bad argument must be refused before any access, and
        // every other pointer is a live fixture (leaked for the test's life).
        move || unsafe { ncclCommInitRankScalable(null_mut(), 2, 0, 1, ids, null_mut()) },
    );
    t.add(
        "ncclCommInitRankScalable: commIds NULL",
        e,
        "commIds",
        // SAFETY: a bad-argument row: the bad argument must be refused before any access, and
        // every other pointer is a live fixture (leaked for the test's life).
        move || unsafe { ncclCommInitRankScalable(out, 2, 0, 1, null_mut(), null_mut()) },
    );
    t.add(
        "ncclCommInitRankScalable: nId 0",
        e,
        "nId",
        // SAFETY: a bad-argument row: the bad argument must be refused before any access, and
        // every other pointer is a live fixture (leaked for the test's life).
        move || unsafe { ncclCommInitRankScalable(out, 2, 0, 0, ids, null_mut()) },
    );
    t.add(
        "ncclCommInitRankScalable: nId > nranks",
        e,
        "nId",
        // SAFETY: a bad-argument row: the bad argument must be refused before any access, and
        // every other pointer is a live fixture (leaked for the test's life).
        move || unsafe { ncclCommInitRankScalable(out, 2, 0, 3, ids, null_mut()) },
    );
    t.add(
        "ncclCommInitRankScalable: myrank 2 of 2",
        e,
        "myrank",
        // SAFETY: a bad-argument row: the bad argument must be refused before any access, and
        // every other pointer is a live fixture (leaked for the test's life).
        move || unsafe { ncclCommInitRankScalable(out, 2, 2, 1, ids, null_mut()) },
    );
    let zero_ids = leak(zero_id);
    t.add(
        "ncclCommInitRankScalable: garbage id",
        e,
        "unique id",
        // SAFETY: a bad-argument row: the bad argument must be refused before any access, and
        // every other pointer is a live fixture (leaked for the test's life).
        move || unsafe { ncclCommInitRankScalable(out, 2, 0, 1, zero_ids, null_mut()) },
    );
    for (what, k, sub) in bad_comm_configs() {
        let k = leak(k);
        t.add(
            format!("ncclCommInitRankScalable: config {what}"),
            e,
            sub,
            // SAFETY: a bad-argument row: the bad argument must be refused before any access, and
            // every other pointer is a live fixture (leaked for the test's life).
            move || unsafe { ncclCommInitRankScalable(out, 2, 0, 1, ids, k) },
        );
    }

    // Comm-taking functions: every bad handle for every one.
    type CommFn = Box<dyn Fn(ncclComm_t) -> i32>;
    let uid_out: *mut ncclUniqueId = leak(ncclUniqueId::default());
    let u64_out: *mut u64 = leak(0);
    let res_out: *mut i32 = leak(0);
    let op_out: *mut i32 = leak(0);
    let scalar: *mut c_void = leak(1.0f32) as *mut c_void;
    let handle_out: *mut *mut c_void = leak(null_mut());
    let win_out: *mut *mut c_void = leak(null_mut());
    let desc: *mut ncclWaitSignalDesc_t = leak(ncclWaitSignalDesc_t::default());
    let comm_fns: Vec<(&str, CommFn)> = vec![
        (
            "ncclCommCount",
            // SAFETY: a bad-argument row: the bad argument must be refused before any access, and
            // every other pointer is a live fixture (leaked for the test's life).
            Box::new(move |c| unsafe { ncclCommCount(c, iout) }),
        ),
        (
            "ncclCommUserRank",
            // SAFETY: a bad-argument row: the bad argument must be refused before any access, and
            // every other pointer is a live fixture (leaked for the test's life).
            Box::new(move |c| unsafe { ncclCommUserRank(c, iout) }),
        ),
        (
            "ncclCommCuDevice",
            // SAFETY: a bad-argument row: the bad argument must be refused before any access, and
            // every other pointer is a live fixture (leaked for the test's life).
            Box::new(move |c| unsafe { ncclCommCuDevice(c, iout) }),
        ),
        (
            "ncclCommGetAsyncError",
            // SAFETY: a bad-argument row: the bad argument must be refused before any access, and
            // every other pointer is a live fixture (leaked for the test's life).
            Box::new(move |c| unsafe { ncclCommGetAsyncError(c, res_out) }),
        ),
        (
            "ncclCommGetUniqueId",
            // SAFETY: a bad-argument row: the bad argument must be refused before any access, and
            // every other pointer is a live fixture (leaked for the test's life).
            Box::new(move |c| unsafe { ncclCommGetUniqueId(c, uid_out) }),
        ),
        (
            "ncclCommFinalize",
            // SAFETY: a bad-argument row: the bad argument must be refused before any access, and
            // every other pointer is a live fixture (leaked for the test's life).
            Box::new(|c| unsafe { ncclCommFinalize(c) }),
        ),
        (
            "ncclCommRevoke",
            // SAFETY: a bad-argument row: the bad argument must be refused before any access, and
            // every other pointer is a live fixture (leaked for the test's life).
            Box::new(|c| unsafe { ncclCommRevoke(c, 0) }),
        ),
        (
            "ncclCommSuspend",
            // SAFETY: a bad-argument row: the bad argument must be refused before any access, and
            // every other pointer is a live fixture (leaked for the test's life).
            Box::new(|c| unsafe { ncclCommSuspend(c, 0) }),
        ),
        // SAFETY: a bad-argument row: the bad argument must be refused before any access, and
        // every other pointer is a live fixture (leaked for the test's life).
        ("ncclCommResume", Box::new(|c| unsafe { ncclCommResume(c) })),
        (
            "ncclCommMemStats",
            // SAFETY: a bad-argument row: the bad argument must be refused before any access, and
            // every other pointer is a live fixture (leaked for the test's life).
            Box::new(move |c| unsafe { ncclCommMemStats(c, 0, u64_out) }),
        ),
        (
            "ncclCommSplit",
            // SAFETY: a bad-argument row: the bad argument must be refused before any access, and
            // every other pointer is a live fixture (leaked for the test's life).
            Box::new(move |c| unsafe { ncclCommSplit(c, 0, 0, out, null_mut()) }),
        ),
        (
            "ncclCommShrink",
            // SAFETY: a bad-argument row: the bad argument must be refused before any access, and
            // every other pointer is a live fixture (leaked for the test's life).
            Box::new(move |c| unsafe { ncclCommShrink(c, null_mut(), 0, out, null_mut(), 0) }),
        ),
        (
            "ncclCommRegister",
            // SAFETY: a bad-argument row: the bad argument must be refused before any access, and
            // every other pointer is a live fixture (leaked for the test's life).
            Box::new(move |c| unsafe { ncclCommRegister(c, fx.sbuf, 64, handle_out) }),
        ),
        (
            "ncclCommDeregister",
            // SAFETY: a bad-argument row: the bad argument must be refused before any access, and
            // every other pointer is a live fixture (leaked for the test's life).
            Box::new(move |c| unsafe { ncclCommDeregister(c, 0x1000 as *mut c_void) }),
        ),
        (
            "ncclCommWindowRegister",
            // SAFETY: a bad-argument row: the bad argument must be refused before any access, and
            // every other pointer is a live fixture (leaked for the test's life).
            Box::new(move |c| unsafe { ncclCommWindowRegister(c, fx.sbuf, 64, win_out, 0) }),
        ),
        (
            "ncclCommWindowDeregister",
            // SAFETY: a bad-argument row: the bad argument must be refused before any access, and
            // every other pointer is a live fixture (leaked for the test's life).
            Box::new(move |c| unsafe { ncclCommWindowDeregister(c, fx.dummy) }),
        ),
        (
            "ncclWinGetUserPtr",
            // SAFETY: a bad-argument row: the bad argument must be refused before any access, and
            // every other pointer is a live fixture (leaked for the test's life).
            Box::new(move |c| unsafe { ncclWinGetUserPtr(c, fx.dummy, win_out) }),
        ),
        (
            "ncclDevCommCreate",
            // SAFETY: a bad-argument row: the bad argument must be refused before any access, and
            // every other pointer is a live fixture (leaked for the test's life).
            Box::new(move |c| unsafe { ncclDevCommCreate(c, fx.dummy, fx.dummy) }),
        ),
        (
            "ncclDevCommDestroy",
            // SAFETY: a bad-argument row: the bad argument must be refused before any access, and
            // every other pointer is a live fixture (leaked for the test's life).
            Box::new(move |c| unsafe { ncclDevCommDestroy(c, fx.dummy) }),
        ),
        (
            "ncclPutSignal",
            // SAFETY: a bad-argument row: the bad argument must be refused before any access, and
            // every other pointer is a live fixture (leaked for the test's life).
            Box::new(move |c| unsafe {
                ncclPutSignal(fx.sbuf, 4, FLOAT, 0, fx.dummy, 0, 0, 0, 0, c, null_mut())
            }),
        ),
        (
            "ncclSignal",
            // SAFETY: a bad-argument row: the bad argument must be refused before any access, and
            // every other pointer is a live fixture (leaked for the test's life).
            Box::new(|c| unsafe { ncclSignal(0, 0, 0, 0, c, null_mut()) }),
        ),
        (
            "ncclWaitSignal",
            // SAFETY: a bad-argument row: the bad argument must be refused before any access, and
            // every other pointer is a live fixture (leaked for the test's life).
            Box::new(move |c| unsafe { ncclWaitSignal(1, desc, c, null_mut()) }),
        ),
        (
            "ncclRedOpCreatePreMulSum",
            // SAFETY: a bad-argument row: the bad argument must be refused before any access, and
            // every other pointer is a live fixture (leaked for the test's life).
            Box::new(move |c| unsafe { ncclRedOpCreatePreMulSum(op_out, scalar, FLOAT, 1, c) }),
        ),
        (
            "ncclRedOpDestroy",
            // SAFETY: a bad-argument row: the bad argument must be refused before any access, and
            // every other pointer is a live fixture (leaked for the test's life).
            Box::new(|c| unsafe { ncclRedOpDestroy(5, c) }),
        ),
        (
            "ncclCommGrow",
            // SAFETY: a bad-argument row: the bad argument must be refused before any access, and
            // every other pointer is a live fixture (leaked for the test's life).
            Box::new(move |c| unsafe { ncclCommGrow(c, 2, ids, 0, out, null_mut()) }),
        ),
    ];
    let comm_fns: Vec<(&str, std::rc::Rc<CommFn>)> = comm_fns
        .into_iter()
        .map(|(n, f)| (n, std::rc::Rc::new(f)))
        .collect();
    for (name, f) in &comm_fns {
        // ncclCommGrow takes a NULL parent (new ranks joining).
        if *name != "ncclCommGrow" {
            let g = f.clone();
            t.add(format!("{name}: comm NULL"), e, "comm", move || {
                g(null_mut())
            });
        }
        let g = f.clone();
        t.add(
            format!("{name}: destroyed comm"),
            e,
            "destroyed",
            move || g(fx.dead),
        );
        let g = f.clone();
        t.add(
            format!("{name}: never a comm"),
            e,
            "not a communicator",
            move || g(fx.foreign),
        );
    }

    // Destroy and abort.
    t.add(
        "ncclCommDestroy: double destroy",
        e,
        "destroyed",
        // SAFETY: a bad-argument row: the bad argument must be refused before any access, and
        // every other pointer is a live fixture (leaked for the test's life).
        move || unsafe { ncclCommDestroy(fx.dead) },
    );
    t.add(
        "ncclCommDestroy: never a comm",
        e,
        "not a communicator",
        // SAFETY: a bad-argument row: the bad argument must be refused before any access, and
        // every other pointer is a live fixture (leaked for the test's life).
        move || unsafe { ncclCommDestroy(fx.foreign) },
    );
    t.add(
        "ncclCommAbort: destroyed comm",
        e,
        "destroyed",
        // SAFETY: a bad-argument row: the bad argument must be refused before any access, and
        // every other pointer is a live fixture (leaked for the test's life).
        move || unsafe { ncclCommAbort(fx.dead) },
    );
    t.add(
        "ncclCommAbort: never a comm",
        e,
        "not a communicator",
        // SAFETY: a bad-argument row: the bad argument must be refused before any access, and
        // every other pointer is a live fixture (leaked for the test's life).
        move || unsafe { ncclCommAbort(fx.foreign) },
    );

    // NULL outputs and bad values on a live comm.
    let c1 = fx.c1;
    let c2 = fx.c2;
    // SAFETY: a bad-argument row: the bad argument must be refused before any access, and every
    // other pointer is a live fixture (leaked for the test's life).
    t.add("ncclCommCount: count NULL", e, "count", move || unsafe {
        ncclCommCount(c1, null_mut())
    });
    // SAFETY: a bad-argument row: the bad argument must be refused before any access, and every
    // other pointer is a live fixture (leaked for the test's life).
    t.add("ncclCommUserRank: rank NULL", e, "rank", move || unsafe {
        ncclCommUserRank(c1, null_mut())
    });
    t.add(
        "ncclCommCuDevice: device NULL",
        e,
        "device",
        // SAFETY: a bad-argument row: the bad argument must be refused before any access, and
        // every other pointer is a live fixture (leaked for the test's life).
        move || unsafe { ncclCommCuDevice(c1, null_mut()) },
    );
    t.add(
        "ncclCommGetAsyncError: asyncError NULL",
        e,
        "asyncError",
        // SAFETY: a bad-argument row: the bad argument must be refused before any access, and
        // every other pointer is a live fixture (leaked for the test's life).
        move || unsafe { ncclCommGetAsyncError(c1, null_mut()) },
    );
    t.add(
        "ncclCommGetUniqueId: uniqueId NULL",
        e,
        "uniqueId",
        // SAFETY: a bad-argument row: the bad argument must be refused before any access, and
        // every other pointer is a live fixture (leaked for the test's life).
        move || unsafe { ncclCommGetUniqueId(c1, null_mut()) },
    );
    t.add(
        "ncclCommRevoke: flags 1",
        e,
        "revokeFlags",
        // SAFETY: a bad-argument row: the bad argument must be refused before any access, and
        // every other pointer is a live fixture (leaked for the test's life).
        move || unsafe { ncclCommRevoke(c1, 1) },
    );
    // SAFETY: a bad-argument row: the bad argument must be refused before any access, and every
    // other pointer is a live fixture (leaked for the test's life).
    t.add("ncclCommSuspend: flags 2", e, "flags", move || unsafe {
        ncclCommSuspend(c1, 2)
    });
    t.add(
        "ncclCommResume: not suspended",
        u,
        "not suspended",
        // SAFETY: a bad-argument row: the bad argument must be refused before any access, and
        // every other pointer is a live fixture (leaked for the test's life).
        move || unsafe { ncclCommResume(c1) },
    );
    for stat in [7, -1, 4] {
        t.add(
            format!("ncclCommMemStats: stat {stat}"),
            e,
            "ncclCommMemStat_t",
            // SAFETY: a bad-argument row: the bad argument must be refused before any access, and
            // every other pointer is a live fixture (leaked for the test's life).
            move || unsafe { ncclCommMemStats(c1, stat, u64_out) },
        );
    }
    // SAFETY: a bad-argument row: the bad argument must be refused before any access, and every
    // other pointer is a live fixture (leaked for the test's life).
    t.add("ncclCommMemStats: value NULL", e, "value", move || unsafe {
        ncclCommMemStats(c1, 0, null_mut())
    });
    t.add(
        "ncclCommSplit: newcomm NULL",
        e,
        "newcomm",
        // SAFETY: a bad-argument row: the bad argument must be refused before any access, and
        // every other pointer is a live fixture (leaked for the test's life).
        move || unsafe { ncclCommSplit(c1, 0, 0, null_mut(), null_mut()) },
    );
    // SAFETY: a bad-argument row: the bad argument must be refused before any access, and every
    // other pointer is a live fixture (leaked for the test's life).
    t.add("ncclCommSplit: color -2", e, "color", move || unsafe {
        ncclCommSplit(c1, -2, 0, out, null_mut())
    });
    for (what, k, sub) in bad_comm_configs() {
        let k = leak(k);
        t.add(
            format!("ncclCommSplit: config {what}"),
            e,
            sub,
            // SAFETY: a bad-argument row: the bad argument must be refused before any access, and
            // every other pointer is a live fixture (leaked for the test's life).
            move || unsafe { ncclCommSplit(c1, 0, 0, out, k) },
        );
    }
    t.add(
        "ncclCommShrink: newcomm NULL",
        e,
        "newcomm",
        // SAFETY: a bad-argument row: the bad argument must be refused before any access, and
        // every other pointer is a live fixture (leaked for the test's life).
        move || unsafe { ncclCommShrink(c1, null_mut(), 0, null_mut(), null_mut(), 0) },
    );
    // SAFETY: a bad-argument row: the bad argument must be refused before any access, and every
    // other pointer is a live fixture (leaked for the test's life).
    t.add("ncclCommShrink: flags 2", e, "flags", move || unsafe {
        ncclCommShrink(c1, null_mut(), 0, out, null_mut(), 2)
    });
    t.add(
        "ncclCommShrink: excludeRanksCount -1",
        e,
        "excludeRanksCount",
        // SAFETY: a bad-argument row: the bad argument must be refused before any access, and
        // every other pointer is a live fixture (leaked for the test's life).
        move || unsafe { ncclCommShrink(c2, null_mut(), -1, out, null_mut(), 0) },
    );
    t.add(
        "ncclCommShrink: excludeRanksCount = nranks",
        e,
        "excludeRanksCount",
        // SAFETY: a bad-argument row: the bad argument must be refused before any access, and
        // every other pointer is a live fixture (leaked for the test's life).
        move || unsafe { ncclCommShrink(c2, null_mut(), 2, out, null_mut(), 0) },
    );
    t.add(
        "ncclCommShrink: excludeRanksList NULL",
        e,
        "excludeRanksList",
        // SAFETY: a bad-argument row: the bad argument must be refused before any access, and
        // every other pointer is a live fixture (leaked for the test's life).
        move || unsafe { ncclCommShrink(c2, null_mut(), 1, out, null_mut(), 0) },
    );
    let excl_bad: *mut c_int = leak(2);
    t.add(
        "ncclCommShrink: excluded rank = nranks",
        e,
        "excluded rank",
        // SAFETY: a bad-argument row: the bad argument must be refused before any access, and
        // every other pointer is a live fixture (leaked for the test's life).
        move || unsafe { ncclCommShrink(c2, excl_bad, 1, out, null_mut(), 0) },
    );
    let excl_neg: *mut c_int = leak(-1);
    t.add(
        "ncclCommShrink: excluded rank -1",
        e,
        "excluded rank",
        // SAFETY: a bad-argument row: the bad argument must be refused before any access, and
        // every other pointer is a live fixture (leaked for the test's life).
        move || unsafe { ncclCommShrink(c2, excl_neg, 1, out, null_mut(), 0) },
    );
    for (what, k, sub) in bad_comm_configs() {
        let k = leak(k);
        let excl = leak(1 as c_int);
        t.add(
            format!("ncclCommShrink: config {what}"),
            e,
            sub,
            // SAFETY: a bad-argument row: the bad argument must be refused before any access, and
            // every other pointer is a live fixture (leaked for the test's life).
            move || unsafe { ncclCommShrink(c2, excl, 1, out, k, 0) },
        );
    }
    // SAFETY: a bad-argument row: the bad argument must be refused before any access, and every
    // other pointer is a live fixture (leaked for the test's life).
    t.add("ncclCommGrow: newcomm NULL", e, "newcomm", move || unsafe {
        ncclCommGrow(c1, 2, ids, 0, null_mut(), null_mut())
    });
    // SAFETY: a bad-argument row: the bad argument must be refused before any access, and every
    // other pointer is a live fixture (leaked for the test's life).
    t.add("ncclCommGrow: nranks 0", e, "nranks", move || unsafe {
        ncclCommGrow(c1, 0, ids, 0, out, null_mut())
    });
    // SAFETY: a bad-argument row: the bad argument must be refused before any access, and every
    // other pointer is a live fixture (leaked for the test's life).
    t.add("ncclCommGrow: new rank -1", e, "rank", move || unsafe {
        ncclCommGrow(null_mut(), 2, ids, -1, out, null_mut())
    });
    // SAFETY: a bad-argument row: the bad argument must be refused before any access, and every
    // other pointer is a live fixture (leaked for the test's life).
    t.add(
        "ncclCommGrow: existing rank passes a rank",
        e,
        "rank -1",
        move || unsafe { ncclCommGrow(c1, 2, ids, 0, out, null_mut()) },
    );
    t.add(
        "ncclCommGrow: uniqueId NULL",
        e,
        "uniqueId",
        // SAFETY: a bad-argument row: the bad argument must be refused before any access, and
        // every other pointer is a live fixture (leaked for the test's life).
        move || unsafe { ncclCommGrow(null_mut(), 2, null(), 0, out, null_mut()) },
    );
    for (what, k, sub) in bad_comm_configs() {
        let k = leak(k);
        t.add(
            format!("ncclCommGrow: config {what}"),
            e,
            sub,
            // SAFETY: a bad-argument row: the bad argument must be refused before any access, and
            // every other pointer is a live fixture (leaked for the test's life).
            move || unsafe { ncclCommGrow(c1, 2, ids, 0, out, k) },
        );
    }
    super::resources::resource_rows(t, fx);
}
