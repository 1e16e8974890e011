//! Bad arguments at the C API, table-driven (issue 6, item 4).
//!
//! Every exported `nccl*` entry point (the list in
//! `tests/data/torch-nccl-imports.txt`, plus `ncclCommCuDevice` and the eight
//! `nccl*Config` collective variants) is called with NULL pointers (each in
//! turn), out-of-range enums, counts whose byte size overflows, roots and
//! peers out of range, a destroyed communicator, a pointer that was never a
//! communicator, and garbage config structs. Each row names the code it must
//! return (`ncclInvalidArgument` = 4 or `ncclInvalidUsage` = 5) and a
//! substring that `ncclGetLastError` must then contain. All rows run; the
//! test fails once at the end listing every row that did not hold.
//!
//! The calls go straight to the Rust functions behind the exports
//! (`hetccl_collectives::api::*`), which are the very functions the cdylib
//! exports, so a crash here would be a crash of `libhetccl.so`.

use std::ffi::{c_int, c_void, CStr};
use std::mem::size_of;
use std::ptr::{null, null_mut};

use hetccl_abi::{
    ncclCollConfig_t, ncclComm_t, ncclConfig_t, ncclSimInfo_t, ncclUniqueId, ncclWaitSignalDesc_t,
    NCCL_API_MAGIC,
};
use hetccl_collectives::api::guard::clear_last_error;
use hetccl_collectives::api::{
    coll::*, comm_init::*, comm_life::*, device::*, group::*, mem::*, redop::*, register::*,
    version::*,
};

const INVALID_ARGUMENT: i32 = 4;
const INVALID_USAGE: i32 = 5;
const FLOAT: i32 = 7;
const SUM: i32 = 0;

/// One row of the table.
struct Case {
    name: String,
    call: Box<dyn Fn() -> i32>,
    expect: i32,
    substr: &'static str,
}

fn last_error() -> String {
    // SAFETY: ncclGetLastError returns a valid NUL-terminated string.
    unsafe { CStr::from_ptr(ncclGetLastError(null_mut())) }
        .to_string_lossy()
        .into_owned()
}

fn check(r: i32, what: &str) {
    assert_eq!(r, 0, "{what} failed: {r}: {}", last_error());
}

/// The raw pointers of the fixture, copied into the closures.
#[derive(Clone, Copy)]
struct Fx {
    /// A live 1-rank communicator (rank 0 of 1).
    c1: ncclComm_t,
    /// Rank 0 of a live 2-rank communicator (its peer is another thread).
    c2: ncclComm_t,
    /// A destroyed communicator.
    dead: ncclComm_t,
    /// A pointer to memory that was never a communicator.
    foreign: ncclComm_t,
    /// 64 floats of send buffer.
    sbuf: *mut c_void,
    /// 64 floats of receive buffer.
    rbuf: *mut c_void,
    /// A pointer that stands for a window or device object (never dereferenced
    /// by the argument checks, which must fail first).
    dummy: *mut c_void,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Coll {
    AllReduce,
    Broadcast,
    Bcast,
    Reduce,
    AllGather,
    ReduceScatter,
    AlltoAll,
    Gather,
    Scatter,
    Send,
    Recv,
}

impl Coll {
    const ALL: [Coll; 11] = [
        Coll::AllReduce,
        Coll::Broadcast,
        Coll::Bcast,
        Coll::Reduce,
        Coll::AllGather,
        Coll::ReduceScatter,
        Coll::AlltoAll,
        Coll::Gather,
        Coll::Scatter,
        Coll::Send,
        Coll::Recv,
    ];
    fn reduces(self) -> bool {
        matches!(self, Coll::AllReduce | Coll::Reduce | Coll::ReduceScatter)
    }
    /// Takes a root (or, for Send/Recv, a peer).
    fn rooted(self) -> bool {
        !matches!(
            self,
            Coll::AllReduce | Coll::AllGather | Coll::ReduceScatter | Coll::AlltoAll
        )
    }
    fn has_config_variant(self) -> bool {
        !matches!(self, Coll::Bcast | Coll::Send | Coll::Recv)
    }
    fn reads_send(self) -> bool {
        self != Coll::Recv
    }
    fn writes_recv(self) -> bool {
        !matches!(self, Coll::Send | Coll::Bcast)
    }
}

/// The arguments of one collective call.
#[derive(Clone, Copy)]
struct Args {
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    dtype: i32,
    op: i32,
    root: i32,
    comm: ncclComm_t,
    /// `Some` calls the `*Config` variant with this pointer.
    config: Option<*const ncclCollConfig_t>,
}

/// Calls the entry point for `c` (or its `*Config` variant).
unsafe fn call(c: Coll, a: Args) -> i32 {
    let s = null_mut();
    // SAFETY: a bad-argument row: the bad argument must be refused before any access, and every
    // other pointer is a live fixture (leaked for the test's life).
    unsafe {
        match (c, a.config) {
            (Coll::AllReduce, None) => {
                ncclAllReduce(a.send, a.recv, a.count, a.dtype, a.op, a.comm, s)
            }
            (Coll::AllReduce, Some(k)) => {
                ncclAllReduceConfig(a.send, a.recv, a.count, a.dtype, a.op, a.comm, s, k)
            }
            (Coll::Broadcast, None) => {
                ncclBroadcast(a.send, a.recv, a.count, a.dtype, a.root, a.comm, s)
            }
            (Coll::Broadcast, Some(k)) => {
                ncclBroadcastConfig(a.send, a.recv, a.count, a.dtype, a.root, a.comm, s, k)
            }
            (Coll::Bcast, _) => {
                ncclBcast(a.send as *mut c_void, a.count, a.dtype, a.root, a.comm, s)
            }
            (Coll::Reduce, None) => {
                ncclReduce(a.send, a.recv, a.count, a.dtype, a.op, a.root, a.comm, s)
            }
            (Coll::Reduce, Some(k)) => {
                ncclReduceConfig(a.send, a.recv, a.count, a.dtype, a.op, a.root, a.comm, s, k)
            }
            (Coll::AllGather, None) => ncclAllGather(a.send, a.recv, a.count, a.dtype, a.comm, s),
            (Coll::AllGather, Some(k)) => {
                ncclAllGatherConfig(a.send, a.recv, a.count, a.dtype, a.comm, s, k)
            }
            (Coll::ReduceScatter, None) => {
                ncclReduceScatter(a.send, a.recv, a.count, a.dtype, a.op, a.comm, s)
            }
            (Coll::ReduceScatter, Some(k)) => {
                ncclReduceScatterConfig(a.send, a.recv, a.count, a.dtype, a.op, a.comm, s, k)
            }
            (Coll::AlltoAll, None) => ncclAlltoAll(a.send, a.recv, a.count, a.dtype, a.comm, s),
            (Coll::AlltoAll, Some(k)) => {
                ncclAlltoAllConfig(a.send, a.recv, a.count, a.dtype, a.comm, s, k)
            }
            (Coll::Gather, None) => ncclGather(a.send, a.recv, a.count, a.dtype, a.root, a.comm, s),
            (Coll::Gather, Some(k)) => {
                ncclGatherConfig(a.send, a.recv, a.count, a.dtype, a.root, a.comm, s, k)
            }
            (Coll::Scatter, None) => {
                ncclScatter(a.send, a.recv, a.count, a.dtype, a.root, a.comm, s)
            }
            (Coll::Scatter, Some(k)) => {
                ncclScatterConfig(a.send, a.recv, a.count, a.dtype, a.root, a.comm, s, k)
            }
            (Coll::Send, _) => ncclSend(a.send, a.count, a.dtype, a.root, a.comm, s),
            (Coll::Recv, _) => ncclRecv(a.recv, a.count, a.dtype, a.root, a.comm, s),
        }
    }
}

fn coll_config() -> ncclCollConfig_t {
    ncclCollConfig_t {
        size: size_of::<ncclCollConfig_t>(),
        magic: NCCL_API_MAGIC,
        version: 23200,
        ext: null_mut(),
        minCTAs: i32::MIN,
        maxCTAs: i32::MIN,
        nvlsCTAs: i32::MIN,
        cgaClusterSize: i32::MIN,
        algSelection: null(),
        forceAlgSelection: i32::MIN,
        CTAPolicy: i32::MIN,
        userProfilerTag: 0,
        launchCompletionEvent: null_mut(),
    }
}

/// Garbage `ncclCollConfig_t`s: (label, struct, substring of the message).
fn bad_coll_configs() -> Vec<(&'static str, ncclCollConfig_t, &'static str)> {
    let good = coll_config();
    vec![
        (
            "bad magic",
            ncclCollConfig_t {
                magic: 0xdead_beef,
                ..good
            },
            "magic",
        ),
        ("size 0", ncclCollConfig_t { size: 0, ..good }, "size"),
        ("size 3", ncclCollConfig_t { size: 3, ..good }, "size"),
        (
            "size 1 GiB",
            ncclCollConfig_t {
                size: 1 << 30,
                ..good
            },
            "size",
        ),
        (
            "version 5",
            ncclCollConfig_t { version: 5, ..good },
            "version",
        ),
        (
            "version u32::MAX",
            ncclCollConfig_t {
                version: u32::MAX,
                ..good
            },
            "version",
        ),
    ]
}

/// Garbage `ncclConfig_t`s, as for [`bad_coll_configs`].
fn bad_comm_configs() -> Vec<(&'static str, ncclConfig_t, &'static str)> {
    let good = ncclConfig_t::default();
    vec![
        (
            "bad magic",
            ncclConfig_t {
                magic: 0x1234_5678,
                ..good
            },
            "magic",
        ),
        ("size 0", ncclConfig_t { size: 0, ..good }, "size"),
        ("size 7", ncclConfig_t { size: 7, ..good }, "size"),
        (
            "size usize::MAX",
            ncclConfig_t {
                size: usize::MAX,
                ..good
            },
            "size",
        ),
        ("version 0", ncclConfig_t { version: 0, ..good }, "version"),
        (
            "version 21399",
            ncclConfig_t {
                version: 21399,
                ..good
            },
            "version",
        ),
        (
            "blocking 7",
            ncclConfig_t {
                blocking: 7,
                ..good
            },
            "blocking",
        ),
        (
            "splitShare -3",
            ncclConfig_t {
                splitShare: -3,
                ..good
            },
            "splitShare",
        ),
    ]
}

/// Leaks `v` and returns a pointer to it: the table's closures are `'static`.
fn leak<T>(v: T) -> *mut T {
    Box::into_raw(Box::new(v))
}

struct Table(Vec<Case>);

impl Table {
    fn add(
        &mut self,
        name: impl Into<String>,
        expect: i32,
        substr: &'static str,
        call: impl Fn() -> i32 + 'static,
    ) {
        self.0.push(Case {
            name: name.into(),
            call: Box::new(call),
            expect,
            substr,
        });
    }
}

/// The rows for every collective and point-to-point entry point.
fn coll_rows(t: &mut Table, fx: Fx) {
    let e = INVALID_ARGUMENT;
    for c in Coll::ALL {
        let mut variants: Vec<(String, Option<*const ncclCollConfig_t>)> =
            vec![(format!("nccl{c:?}"), None)];
        if c.has_config_variant() {
            variants.push((
                format!("nccl{c:?}Config"),
                Some(leak(coll_config()) as *const _),
            ));
        }
        for (fname, cfg) in variants {
            let base = Args {
                send: fx.sbuf,
                recv: if c == Coll::Bcast { fx.sbuf } else { fx.rbuf },
                count: 4,
                dtype: FLOAT,
                op: SUM,
                root: 0,
                comm: fx.c1,
                config: cfg,
            };
            let mut row = |what: &str, substr: &'static str, a: Args| {
                // SAFETY: a bad-argument row: the bad argument must be refused before any access,
                // and every other pointer is a live fixture (leaked for the test's life).
                t.add(format!("{fname}: {what}"), e, substr, move || unsafe {
                    call(c, a)
                });
            };
            if c.reads_send() {
                let send_name = if c == Coll::Bcast {
                    "buff NULL"
                } else {
                    "sendbuff NULL"
                };
                row(
                    send_name,
                    "sendbuff",
                    Args {
                        send: null(),
                        ..base
                    },
                );
            }
            if c.writes_recv() {
                row(
                    "recvbuff NULL",
                    "recvbuff",
                    Args {
                        recv: null_mut(),
                        ..base
                    },
                );
            }
            row("datatype 12", "datatype", Args { dtype: 12, ..base });
            row("datatype -1", "datatype", Args { dtype: -1, ..base });
            if c.reduces() {
                row("op -1", "operation", Args { op: -1, ..base });
                row("op 99 (never created)", "op 99", Args { op: 99, ..base });
                row("op 5 (never created)", "op 5", Args { op: 5, ..base });
            }
            row(
                "count usize::MAX/2 floats",
                "overflows",
                Args {
                    count: usize::MAX / 2,
                    ..base
                },
            );
            row(
                "count usize::MAX/4+1 floats",
                "overflows",
                Args {
                    count: usize::MAX / 4 + 1,
                    ..base
                },
            );
            if c.rooted() {
                let what = if matches!(c, Coll::Send | Coll::Recv) {
                    "peer"
                } else {
                    "root"
                };
                let what_s: &'static str = what;
                row(&format!("{what} -1"), what_s, Args { root: -1, ..base });
                row(
                    &format!("{what} = nranks (1)"),
                    what_s,
                    Args { root: 1, ..base },
                );
                row(
                    &format!("{what} = nranks (2) on a 2-rank comm"),
                    what_s,
                    Args {
                        root: 2,
                        comm: fx.c2,
                        ..base
                    },
                );
                row(
                    &format!("{what} i32::MIN"),
                    what_s,
                    Args {
                        root: i32::MIN,
                        ..base
                    },
                );
            }
            row(
                "comm NULL",
                "comm",
                Args {
                    comm: null_mut(),
                    ..base
                },
            );
            row(
                "destroyed comm",
                "destroyed",
                Args {
                    comm: fx.dead,
                    ..base
                },
            );
            row(
                "never a comm",
                "not a communicator",
                Args {
                    comm: fx.foreign,
                    ..base
                },
            );
            if cfg.is_some() {
                for (what, k, sub) in bad_coll_configs() {
                    row(
                        &format!("config {what}"),
                        sub,
                        Args {
                            config: Some(leak(k) as *const _),
                            ..base
                        },
                    );
                }
            }
        }
    }
}

mod control;
mod other;
mod resources;
use control::control_rows;
use other::other_rows;

#[derive(Clone, Copy)]
struct SendComm(ncclComm_t);
// SAFETY: a handle is an opaque token, usable from any thread.
unsafe impl Send for SendComm {}

#[test]
fn bad_arguments_are_refused_with_a_message() {
    std::env::set_var("HETCCL_SOCKET_IFNAME", "lo");
    std::env::set_var("HETCCL_TIMEOUT_S", "20");

    // A 1-rank comm, a destroyed one, and rank 0 of a 2-rank comm whose
    // rank 1 lives on another thread.
    let mut c1: ncclComm_t = null_mut();
    check(
        // SAFETY: a bad-argument row: the bad argument must be refused before any access, and
        // every other pointer is a live fixture (leaked for the test's life).
        unsafe { ncclCommInitAll(&mut c1, 1, null()) },
        "ncclCommInitAll",
    );
    let mut dead: ncclComm_t = null_mut();
    check(
        // SAFETY: a bad-argument row: the bad argument must be refused before any access, and
        // every other pointer is a live fixture (leaked for the test's life).
        unsafe { ncclCommInitAll(&mut dead, 1, null()) },
        "ncclCommInitAll",
    );
    // SAFETY: a bad-argument row: the bad argument must be refused before any access, and every
    // other pointer is a live fixture (leaked for the test's life).
    check(unsafe { ncclCommDestroy(dead) }, "ncclCommDestroy");
    let mut id = ncclUniqueId::default();
    // SAFETY: a writable id on this stack frame.
    check(unsafe { ncclGetUniqueId(&mut id) }, "ncclGetUniqueId");
    let pair: Vec<SendComm> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..2)
            .map(|r| {
                s.spawn(move || {
                    let mut c: ncclComm_t = null_mut();
                    check(
                        // SAFETY: a bad-argument row: the bad argument must be refused before any
                        // access, and every other pointer is a live fixture (leaked for the
                        // test's life).
                        unsafe { ncclCommInitRank(&mut c, 2, id, r) },
                        "ncclCommInitRank",
                    );
                    SendComm(c)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let foreign = leak([0x6865_7463_636c_434du64, 1]) as ncclComm_t;
    let fx = Fx {
        c1,
        c2: pair[0].0,
        dead,
        foreign,
        sbuf: leak([1.0f32; 64]) as *mut c_void,
        rbuf: leak([0.0f32; 64]) as *mut c_void,
        dummy: leak([0u64; 64]) as *mut c_void,
    };

    let mut t = Table(Vec::new());
    coll_rows(&mut t, fx);
    other_rows(&mut t, fx);
    control_rows(&mut t, fx);

    let mut failures = Vec::new();
    for case in &t.0 {
        clear_last_error();
        let r = (case.call)();
        let msg = last_error();
        let ok = r == case.expect && !msg.is_empty() && msg.contains(case.substr);
        if !ok {
            failures.push(format!(
                "  {}: got {r} (want {}), last error {msg:?} (want it to contain {:?})",
                case.name, case.expect, case.substr
            ));
        }
    }
    // The 1-rank comm still works after all that.
    let (s, r) = (fx.sbuf, fx.rbuf);
    // SAFETY: a bad-argument row: the bad argument must be refused before any access, and every
    // other pointer is a live fixture (leaked for the test's life).
    let ok = unsafe { ncclAllReduce(s, r, 64, FLOAT, SUM, c1, null_mut()) };
    if ok != 0 {
        failures.push(format!(
            "  a valid AllReduce after the table: got {ok}: {}",
            last_error()
        ));
    }
    // Sanity rows for the two entry points that return strings.
    // SAFETY: a bad-argument row: the bad argument must be refused before any access, and every
    // other pointer is a live fixture (leaked for the test's life).
    let unknown = unsafe { CStr::from_ptr(ncclGetErrorString(99)) };
    if unknown.to_bytes().is_empty() {
        failures.push("  ncclGetErrorString(99): empty".into());
    }
    // SAFETY: a bad-argument row: the bad argument must be refused before any access, and every
    // other pointer is a live fixture (leaked for the test's life).
    let unknown = unsafe { CStr::from_ptr(ncclGetErrorString(-1)) };
    if unknown.to_bytes().is_empty() {
        failures.push("  ncclGetErrorString(-1): empty".into());
    }

    // SAFETY: a bad-argument row: the bad argument must be refused before any access, and every
    // other pointer is a live fixture (leaked for the test's life).
    check(unsafe { ncclCommDestroy(c1) }, "ncclCommDestroy");
    for c in &pair {
        // SAFETY: a bad-argument row: the bad argument must be refused before any access, and
        // every other pointer is a live fixture (leaked for the test's life).
        check(unsafe { ncclCommDestroy(c.0) }, "ncclCommDestroy");
    }
    eprintln!("bad_args: {} rows, {} failed", t.0.len(), failures.len());
    assert!(
        failures.is_empty(),
        "{} of {} rows failed:\n{}",
        failures.len(),
        t.0.len(),
        failures.join("\n")
    );
}
