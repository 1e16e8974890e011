//! The bad-argument rows for registration, the device-side API, reduction
//! ops, groups, and communicators that refuse work (revoked, suspended).

use super::*;

/// The rows for registration, the device-side API, reduction ops, groups
/// and unusable communicators.
pub(super) fn resource_rows(t: &mut Table, fx: Fx) {
    let e = INVALID_ARGUMENT;
    let u = INVALID_USAGE;
    let c1 = fx.c1;
    let op_out: *mut i32 = leak(0);
    let scalar: *mut c_void = leak(1.0f32) as *mut c_void;
    let handle_out: *mut *mut c_void = leak(null_mut());
    let win_out: *mut *mut c_void = leak(null_mut());
    let desc: *mut ncclWaitSignalDesc_t = leak(ncclWaitSignalDesc_t::default());

    // Registration.
    t.add(
        "ncclCommRegister: handle NULL",
        e,
        "handle",
        // SAFETY: a bad-argument row: the bad argument must be refused before any access, and
        // every other pointer is a live fixture (leaked for the test's life).
        move || unsafe { ncclCommRegister(c1, fx.sbuf, 64, null_mut()) },
    );
    // SAFETY: a bad-argument row: the bad argument must be refused before any access, and every
    // other pointer is a live fixture (leaked for the test's life).
    t.add("ncclCommRegister: buff NULL", e, "buff", move || unsafe {
        ncclCommRegister(c1, null_mut(), 64, handle_out)
    });
    t.add(
        "ncclCommRegister: size usize::MAX",
        e,
        "size",
        // SAFETY: a bad-argument row: the bad argument must be refused before any access, and
        // every other pointer is a live fixture (leaked for the test's life).
        move || unsafe { ncclCommRegister(c1, fx.sbuf, usize::MAX, handle_out) },
    );
    t.add(
        "ncclCommDeregister: never registered",
        e,
        "not registered",
        // SAFETY: a bad-argument row: the bad argument must be refused before any access, and
        // every other pointer is a live fixture (leaked for the test's life).
        move || unsafe { ncclCommDeregister(c1, 0x7777 as *mut c_void) },
    );
    t.add(
        "ncclCommDeregister: handle NULL",
        e,
        "not registered",
        // SAFETY: a bad-argument row: the bad argument must be refused before any access, and
        // every other pointer is a live fixture (leaked for the test's life).
        move || unsafe { ncclCommDeregister(c1, null_mut()) },
    );
    t.add(
        "ncclCommWindowRegister: win NULL",
        e,
        "win",
        // SAFETY: a bad-argument row: the bad argument must be refused before any access, and
        // every other pointer is a live fixture (leaked for the test's life).
        move || unsafe { ncclCommWindowRegister(c1, fx.sbuf, 64, null_mut(), 0) },
    );
    t.add(
        "ncclCommWindowRegister: buff NULL",
        e,
        "buff",
        // SAFETY: a bad-argument row: the bad argument must be refused before any access, and
        // every other pointer is a live fixture (leaked for the test's life).
        move || unsafe { ncclCommWindowRegister(c1, null_mut(), 64, win_out, 0) },
    );
    t.add(
        "ncclCommWindowDeregister: win NULL",
        e,
        "win",
        // SAFETY: a bad-argument row: the bad argument must be refused before any access, and
        // every other pointer is a live fixture (leaked for the test's life).
        move || unsafe { ncclCommWindowDeregister(c1, null_mut()) },
    );
    // SAFETY: a bad-argument row: the bad argument must be refused before any access, and every
    // other pointer is a live fixture (leaked for the test's life).
    t.add("ncclWinGetUserPtr: win NULL", e, "win", move || unsafe {
        ncclWinGetUserPtr(c1, null_mut(), win_out)
    });
    t.add(
        "ncclWinGetUserPtr: outUserPtr NULL",
        e,
        "outUserPtr",
        // SAFETY: a bad-argument row: the bad argument must be refused before any access, and
        // every other pointer is a live fixture (leaked for the test's life).
        move || unsafe { ncclWinGetUserPtr(c1, fx.dummy, null_mut()) },
    );

    // Device-side API: argument errors come before "device-only".
    // SAFETY: a bad-argument row: the bad argument must be refused before any access, and every
    // other pointer is a live fixture (leaked for the test's life).
    t.add("ncclDevCommCreate: reqs NULL", e, "reqs", move || unsafe {
        ncclDevCommCreate(c1, null(), fx.dummy)
    });
    t.add(
        "ncclDevCommCreate: outDevComm NULL",
        e,
        "outDevComm",
        // SAFETY: a bad-argument row: the bad argument must be refused before any access, and
        // every other pointer is a live fixture (leaked for the test's life).
        move || unsafe { ncclDevCommCreate(c1, fx.dummy, null_mut()) },
    );
    t.add(
        "ncclDevCommDestroy: devComm NULL",
        e,
        "devComm",
        // SAFETY: a bad-argument row: the bad argument must be refused before any access, and
        // every other pointer is a live fixture (leaked for the test's life).
        move || unsafe { ncclDevCommDestroy(c1, null()) },
    );
    t.add(
        "ncclGetLsaMultimemDevicePointer: window NULL",
        e,
        "window",
        // SAFETY: a bad-argument row: the bad argument must be refused before any access, and
        // every other pointer is a live fixture (leaked for the test's life).
        move || unsafe { ncclGetLsaMultimemDevicePointer(null_mut(), 0, win_out) },
    );
    t.add(
        "ncclGetLsaMultimemDevicePointer: outPtr NULL",
        e,
        "outPtr",
        // SAFETY: a bad-argument row: the bad argument must be refused before any access, and
        // every other pointer is a live fixture (leaked for the test's life).
        move || unsafe { ncclGetLsaMultimemDevicePointer(fx.dummy, 0, null_mut()) },
    );
    t.add(
        "ncclGetPeerDevicePointer: window NULL",
        e,
        "window",
        // SAFETY: a bad-argument row: the bad argument must be refused before any access, and
        // every other pointer is a live fixture (leaked for the test's life).
        move || unsafe { ncclGetPeerDevicePointer(null_mut(), 0, 0, win_out) },
    );
    t.add(
        "ncclGetPeerDevicePointer: outPtr NULL",
        e,
        "outPtr",
        // SAFETY: a bad-argument row: the bad argument must be refused before any access, and
        // every other pointer is a live fixture (leaked for the test's life).
        move || unsafe { ncclGetPeerDevicePointer(fx.dummy, 0, 0, null_mut()) },
    );
    // SAFETY: a bad-argument row: the bad argument must be refused before any access, and every
    // other pointer is a live fixture (leaked for the test's life).
    let put = move |buf: *const c_void, count: usize, dt: i32, peer: i32, win: *mut c_void| unsafe {
        ncclPutSignal(buf, count, dt, peer, win, 0, 0, 0, 0, c1, null_mut())
    };
    t.add("ncclPutSignal: localbuff NULL", e, "localbuff", move || {
        put(null(), 4, FLOAT, 0, fx.dummy)
    });
    t.add("ncclPutSignal: datatype 12", e, "datatype", move || {
        put(fx.sbuf, 4, 12, 0, fx.dummy)
    });
    t.add(
        "ncclPutSignal: count overflows",
        e,
        "overflows",
        move || put(fx.sbuf, usize::MAX / 2, FLOAT, 0, fx.dummy),
    );
    t.add("ncclPutSignal: peer -1", e, "peer", move || {
        put(fx.sbuf, 4, FLOAT, -1, fx.dummy)
    });
    t.add("ncclPutSignal: peer = nranks", e, "peer", move || {
        put(fx.sbuf, 4, FLOAT, 1, fx.dummy)
    });
    t.add("ncclPutSignal: peerWin NULL", e, "peerWin", move || {
        put(fx.sbuf, 4, FLOAT, 0, null_mut())
    });
    for peer in [-1, 1] {
        t.add(
            format!("ncclSignal: peer {peer}"),
            e,
            "peer",
            // SAFETY: a bad-argument row: the bad argument must be refused before any access, and
            // every other pointer is a live fixture (leaked for the test's life).
            move || unsafe { ncclSignal(peer, 0, 0, 0, c1, null_mut()) },
        );
    }
    // SAFETY: a bad-argument row: the bad argument must be refused before any access, and every
    // other pointer is a live fixture (leaked for the test's life).
    t.add("ncclWaitSignal: nDesc -1", e, "nDesc", move || unsafe {
        ncclWaitSignal(-1, desc, c1, null_mut())
    });
    t.add(
        "ncclWaitSignal: signalDescs NULL",
        e,
        "signalDescs",
        // SAFETY: a bad-argument row: the bad argument must be refused before any access, and
        // every other pointer is a live fixture (leaked for the test's life).
        move || unsafe { ncclWaitSignal(1, null_mut(), c1, null_mut()) },
    );
    let bad_desc = leak(ncclWaitSignalDesc_t {
        opCnt: 1,
        peer: 3,
        sigIdx: 0,
        ctx: 0,
    });
    // SAFETY: a bad-argument row: the bad argument must be refused before any access, and every
    // other pointer is a live fixture (leaked for the test's life).
    t.add("ncclWaitSignal: desc peer 3", e, "peer", move || unsafe {
        ncclWaitSignal(1, bad_desc, c1, null_mut())
    });

    // Reduction ops.
    t.add(
        "ncclRedOpCreatePreMulSum: op NULL",
        e,
        "op",
        // SAFETY: a bad-argument row: the bad argument must be refused before any access, and
        // every other pointer is a live fixture (leaked for the test's life).
        move || unsafe { ncclRedOpCreatePreMulSum(null_mut(), scalar, FLOAT, 1, c1) },
    );
    t.add(
        "ncclRedOpCreatePreMulSum: scalar NULL",
        e,
        "scalar",
        // SAFETY: a bad-argument row: the bad argument must be refused before any access, and
        // every other pointer is a live fixture (leaked for the test's life).
        move || unsafe { ncclRedOpCreatePreMulSum(op_out, null_mut(), FLOAT, 1, c1) },
    );
    for dt in [12, -1] {
        t.add(
            format!("ncclRedOpCreatePreMulSum: datatype {dt}"),
            e,
            "datatype",
            // SAFETY: a bad-argument row: the bad argument must be refused before any access, and
            // every other pointer is a live fixture (leaked for the test's life).
            move || unsafe { ncclRedOpCreatePreMulSum(op_out, scalar, dt, 1, c1) },
        );
    }
    for res in [2, -1] {
        t.add(
            format!("ncclRedOpCreatePreMulSum: residence {res}"),
            e,
            "ncclScalarResidence_t",
            // SAFETY: a bad-argument row: the bad argument must be refused before any access, and
            // every other pointer is a live fixture (leaked for the test's life).
            move || unsafe { ncclRedOpCreatePreMulSum(op_out, scalar, FLOAT, res, c1) },
        );
    }
    for op in [-1, 99, 5] {
        let sub = if op < 0 { "operation" } else { "op" };
        t.add(
            format!("ncclRedOpDestroy: op {op}"),
            e,
            sub,
            // SAFETY: a bad-argument row: the bad argument must be refused before any access, and
            // every other pointer is a live fixture (leaked for the test's life).
            move || unsafe { ncclRedOpDestroy(op, c1) },
        );
    }
    t.add(
        "ncclRedOpDestroy: built-in op (sum)",
        e,
        "op 0",
        // SAFETY: a bad-argument row: the bad argument must be refused before any access, and
        // every other pointer is a live fixture (leaked for the test's life).
        move || unsafe { ncclRedOpDestroy(SUM, c1) },
    );

    // Groups.
    t.add(
        "ncclGroupEnd: without ncclGroupStart",
        u,
        "ncclGroupStart",
        // SAFETY: a bad-argument row: the bad argument must be refused before any access, and
        // every other pointer is a live fixture (leaked for the test's life).
        || unsafe { ncclGroupEnd() },
    );
    t.add(
        "ncclGroupSimulateEnd: simInfo NULL",
        e,
        "simInfo",
        // SAFETY: a bad-argument row: the bad argument must be refused before any access, and
        // every other pointer is a live fixture (leaked for the test's life).
        || unsafe { ncclGroupSimulateEnd(null_mut()) },
    );
    let si_bad_magic = leak(ncclSimInfo_t {
        size: size_of::<ncclSimInfo_t>(),
        magic: 0,
        version: 23203,
        estimatedTime: 0.0,
    });
    t.add(
        "ncclGroupSimulateEnd: bad magic",
        e,
        "magic",
        // SAFETY: a bad-argument row: the bad argument must be refused before any access, and
        // every other pointer is a live fixture (leaked for the test's life).
        move || unsafe { ncclGroupSimulateEnd(si_bad_magic) },
    );
    let si_bad_size = leak(ncclSimInfo_t {
        size: 1 << 40,
        magic: hetccl_abi::NCCL_SIM_INFO_MAGIC,
        version: 23203,
        estimatedTime: 0.0,
    });
    t.add(
        "ncclGroupSimulateEnd: bad size",
        e,
        "size",
        // SAFETY: a bad-argument row: the bad argument must be refused before any access, and
        // every other pointer is a live fixture (leaked for the test's life).
        move || unsafe { ncclGroupSimulateEnd(si_bad_size) },
    );

    // A revoked comm refuses work with ncclInvalidUsage (kept last: it uses
    // a comm of its own).
    let revoked = {
        let mut c: ncclComm_t = null_mut();
        check(
            // SAFETY: a bad-argument row: the bad argument must be refused before any access, and
            // every other pointer is a live fixture (leaked for the test's life).
            unsafe { ncclCommInitAll(&mut c, 1, null()) },
            "ncclCommInitAll",
        );
        // SAFETY: a bad-argument row: the bad argument must be refused before any access, and
        // every other pointer is a live fixture (leaked for the test's life).
        check(unsafe { ncclCommRevoke(c, 0) }, "ncclCommRevoke");
        c
    };
    t.add(
        "ncclAllReduce: revoked comm",
        u,
        "revoked",
        // SAFETY: a bad-argument row: the bad argument must be refused before any access, and
        // every other pointer is a live fixture (leaked for the test's life).
        move || unsafe { ncclAllReduce(fx.sbuf, fx.rbuf, 4, FLOAT, SUM, revoked, null_mut()) },
    );
    // A revoked comm may be split or shrunk (NCCL's contract), not finalized.
    t.add(
        "ncclCommFinalize: revoked comm",
        u,
        "revoked",
        // SAFETY: a bad-argument row: the bad argument must be refused before any access, and
        // every other pointer is a live fixture (leaked for the test's life).
        move || unsafe { ncclCommFinalize(revoked) },
    );
    let suspended = {
        let mut c: ncclComm_t = null_mut();
        check(
            // SAFETY: a bad-argument row: the bad argument must be refused before any access, and
            // every other pointer is a live fixture (leaked for the test's life).
            unsafe { ncclCommInitAll(&mut c, 1, null()) },
            "ncclCommInitAll",
        );
        // SAFETY: a bad-argument row: the bad argument must be refused before any access, and
        // every other pointer is a live fixture (leaked for the test's life).
        check(unsafe { ncclCommSuspend(c, 1) }, "ncclCommSuspend");
        c
    };
    t.add(
        "ncclBroadcast: suspended comm",
        u,
        "suspended",
        // SAFETY: a bad-argument row: the bad argument must be refused before any access, and
        // every other pointer is a live fixture (leaked for the test's life).
        move || unsafe { ncclBroadcast(fx.sbuf, fx.rbuf, 4, FLOAT, 0, suspended, null_mut()) },
    );
}
