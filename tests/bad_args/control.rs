//! The bad-argument rows of the control API (`hetcclCommSetOption`,
//! `hetcclCommGetOption`), on the fixture's 1-rank communicator, where a
//! set needs no peer.

use std::ffi::c_char;

use hetccl_collectives::api::ext::options::{hetcclCommGetOption, hetcclCommSetOption};

use super::*;

/// A NUL-terminated string leaked for the test's life.
fn cstr(s: &str) -> *const c_char {
    let mut v = s.as_bytes().to_vec();
    v.push(0);
    Box::leak(v.into_boxed_slice()).as_ptr().cast()
}

/// The rows for the control API.
pub(super) fn control_rows(t: &mut Table, fx: Fx) {
    let e = INVALID_ARGUMENT;
    let u = INVALID_USAGE;
    let c1 = fx.c1;
    let buf: *mut c_char = leak([0 as c_char; 64]).cast();
    let need: *mut usize = leak(0usize);
    let (key, val) = (cstr("algo.allreduce"), cstr("ring"));
    let set_rows: [(&str, *const c_char, *const c_char, &'static str); 11] = [
        ("key NULL", null(), val, "key"),
        ("value NULL", key, null(), "value"),
        ("unknown key", cstr("channels"), val, "unknown key"),
        (
            "send has no filter",
            cstr("algo.send"),
            val,
            "unknown collective",
        ),
        ("unknown algorithm", key, cstr("rung"), "rung"),
        ("two entries", key, cstr("ring;tree"), "algorithm list"),
        ("empty algo", cstr("algo"), cstr(" "), "NCCL_ALGO"),
        ("bad tune", cstr("tune"), cstr("fast"), "off, init, online"),
        ("bad compress", cstr("compress"), cstr("fp16"), "bf16"),
        (
            "chunk too small",
            cstr("chunk_bytes"),
            cstr("1K"),
            "4K to 64M",
        ),
        ("key too long", cstr(&"k".repeat(5000)), val, "longer than"),
    ];
    for (what, k, v, sub) in set_rows {
        // SAFETY: a bad-argument row: the bad argument must be refused before any access, and
        // every other pointer is a live fixture (leaked for the test's life).
        t.add(
            format!("hetcclCommSetOption: {what}"),
            e,
            sub,
            move || unsafe { hetcclCommSetOption(c1, k, v) },
        );
    }
    for (what, c, sub) in [
        ("comm NULL", null_mut(), "comm"),
        ("destroyed comm", fx.dead, "destroyed"),
        ("never a comm", fx.foreign, "not a communicator"),
    ] {
        // SAFETY: a bad-argument row: the bad argument must be refused before any access, and
        // every other pointer is a live fixture (leaked for the test's life).
        t.add(
            format!("hetcclCommSetOption: {what}"),
            e,
            sub,
            move || unsafe { hetcclCommSetOption(c, key, val) },
        );
        // SAFETY: as above.
        t.add(
            format!("hetcclCommGetOption: {what}"),
            e,
            sub,
            move || unsafe { hetcclCommGetOption(c, key, buf, 64, need) },
        );
    }
    // SAFETY: a bad-argument row: the bad argument must be refused before any access, and every
    // other pointer is a live fixture (leaked for the test's life).
    t.add("hetcclCommGetOption: key NULL", e, "key", move || unsafe {
        hetcclCommGetOption(c1, null(), buf, 64, need)
    });
    // SAFETY: as above.
    t.add("hetcclCommGetOption: buf NULL", e, "buf", move || unsafe {
        hetcclCommGetOption(c1, key, null_mut(), 64, need)
    });
    let nope = cstr("nope");
    // SAFETY: as above.
    t.add(
        "hetcclCommGetOption: unknown key",
        e,
        "unknown key",
        move || unsafe { hetcclCommGetOption(c1, nope, buf, 64, need) },
    );
    // A set is not queued by a group.
    t.add(
        "hetcclCommSetOption: inside a group",
        u,
        "group",
        move || {
            // SAFETY: a bad-argument row; the group is closed again at once.
            unsafe {
                check(ncclGroupStart(), "ncclGroupStart");
                let r = hetcclCommSetOption(c1, key, val);
                let msg = last_error();
                check(ncclGroupEnd(), "ncclGroupEnd");
                hetccl_collectives::api::guard::set_last_error(&msg);
                r
            }
        },
    );
}
