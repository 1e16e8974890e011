//! Device sends and receives inside a node through CUDA IPC: the receiver
//! copies straight from the sender's buffer, with no staging through host
//! memory.
//!
//! Every device `ncclSend`/`ncclRecv` on a communicator whose ranks share
//! this node goes through a mailbox per ordered pair of ranks in the node
//! arena ([`crate::transport::arena::Arena::mailbox`]), whatever path it
//! takes, so both sides always agree. Messages of a pair are numbered in
//! issue order (NCCL matches a pair's sends and receives in order); the
//! numbers live in the communicator (`gpu_p2p`). For a batch:
//! 1. post: for each send, once the receiver acknowledged the pair's
//!    previous message, the sender writes its buffer's descriptor (IPC
//!    handle, offset, bytes, pid, GPU UUID, whether it can take the path)
//!    and publishes the message number;
//! 2. decide: for each receive, the receiver waits for the post, decides
//!    (both able, peer access, the sender's buffer opened inside the
//!    allocation it exported) and acknowledges with the decision; a post
//!    whose size differs from the receive's is refused (mismatched calls:
//!    both sides fail with `ncclInvalidUsage` once the rest of the batch
//!    is done, and the message moves neither way);
//! 3. the senders read the decisions of their last messages;
//! 4. the receivers copy their IPC messages on the proxy's stream,
//!    synchronise it and publish each message as done; the calls that stage
//!    (staged messages, and any collectives of the batch) run as one host
//!    group, so no send or receive can deadlock another;
//! 5. each sender of an IPC message waits until it is done (its buffer may
//!    then be reused) before the proxy releases its stream.
//!
//! Posts and acknowledgements never wait for copies, so the steps cannot
//! deadlock between ranks that grouped their calls the same way NCCL
//! requires.

use std::sync::atomic::{AtomicU64, Ordering};

use super::driver::{self, cu};
use super::ipc::{self, Export, HANDLE_BYTES};
use super::memory::Placement;
use super::peer::PeerState;
use super::stage;
use crate::algo::Collective;
use crate::error::{Error, Result};
use crate::intranode::{Node, WaitOp};
use crate::launch::Call;
use crate::transport::arena::MAILBOX;

/// One ordered pair's mailbox (in the node arena; zero at creation).
#[repr(C, align(64))]
struct Mailbox {
    /// The last message the sender posted.
    post: AtomicU64,
    /// The last message the receiver acknowledged.
    ack: AtomicU64,
    /// The receiver's decision for message `ack`: 1 CUDA IPC, 2 staged, 3
    /// refused, with the receive's byte count above the low 8 bits.
    go: AtomicU64,
    /// The last message the receiver finished copying (CUDA IPC ones).
    done: AtomicU64,
    /// The sender's descriptor of message `post`.
    desc: [AtomicU64; 28],
}

const _: () = assert!(std::mem::size_of::<Mailbox>() == MAILBOX);

const D_ABLE: usize = 0;
const D_PID: usize = 1;
const D_UUID: usize = 2;
const D_BYTES: usize = 4;
const D_EXPORT: usize = 5;
const _: () = assert!(D_EXPORT + Export::WORDS <= 28);

fn mailbox(node: &Node, from: usize, to: usize) -> &Mailbox {
    // SAFETY: a MAILBOX-sized, 64-byte aligned, zero-initialised region of
    // the arena, which the node keeps alive; every field is an atomic.
    unsafe { &*(node.arena().mailbox(from, to) as *const Mailbox) }
}

/// What a sender tells its receiver.
#[derive(Debug, Clone, Copy)]
struct Post {
    able: bool,
    pid: u32,
    uuid: [u8; 16],
    bytes: u64,
    export: Export,
}

impl Post {
    fn write(&self, m: &Mailbox) {
        let d = &m.desc;
        d[D_ABLE].store(u64::from(self.able), Ordering::Relaxed);
        d[D_PID].store(u64::from(self.pid), Ordering::Relaxed);
        ipc::store_uuid(&d[D_UUID..D_UUID + 2], &self.uuid);
        d[D_BYTES].store(self.bytes, Ordering::Relaxed);
        self.export.store(&d[D_EXPORT..]);
    }

    fn read(m: &Mailbox) -> Post {
        let d = &m.desc;
        Post {
            able: d[D_ABLE].load(Ordering::Relaxed) != 0,
            pid: d[D_PID].load(Ordering::Relaxed) as u32,
            uuid: ipc::load_uuid(&d[D_UUID..D_UUID + 2]),
            bytes: d[D_BYTES].load(Ordering::Relaxed),
            export: Export::load(&d[D_EXPORT..]),
        }
    }
}

/// Whether this rank's side of `a` can take the CUDA IPC path.
fn local_able(a: &Call) -> bool {
    matches!(a.placement, Placement::Device(_))
        && !a.comm.engine().is_ok_and(|e| e.settings.p2p_disable)
}

/// The receiver's decisions ([`Mailbox::go`], low 8 bits).
const GO_IPC: u64 = 1;
const GO_REFUSED: u64 = 3;

/// One send or receive of the batch and what became of it.
struct Msg<'a> {
    a: &'a Call,
    node: &'a Node,
    k: u64,
    /// Decided to go through CUDA IPC.
    ipc: bool,
    /// The decision is known (for sends once the acknowledgement was seen).
    decided: bool,
    /// Posted (a send) or acknowledged (a receive).
    done_step: bool,
    /// For an IPC receive: the sender's buffer in this process.
    src: u64,
    /// Refused for a size mismatch: the error this rank returns.
    refused: Option<String>,
}

/// The direct-path node of `a`'s communicator (all its ranks on this node).
fn node_of(a: &Call) -> Option<(&Node, &crate::exec::watch::Watch)> {
    let e = a.comm.engine.get()?;
    e.intranode.as_ref().map(|n| (n, &e.links.watch))
}

/// Whether `a` is a send or receive on a communicator with a node mailbox
/// (such calls must go through [`run`]).
pub fn uses_mailbox(a: &Call) -> bool {
    matches!(a.kind, Collective::Send | Collective::Recv) && node_of(a).is_some()
}

/// Runs a batch holding sends or receives on single-node communicators
/// (every call of `calls` as passed to the proxy): the mailbox protocol for
/// those, then one host group for everything that stages.
pub fn run(calls: &[&Call], st: &mut PeerState, stream: cu::CUstream) -> Result<()> {
    // Number every message of the batch in issue order, per pair.
    let mut msgs: Vec<Msg<'_>> = Vec::new();
    for a in calls.iter().copied().filter(|a| uses_mailbox(a)) {
        let Some((node, _)) = node_of(a) else {
            continue;
        };
        let k = {
            let mut c = a.comm.gpu_p2p.lock();
            let e = &mut c[a.root];
            let n = if a.kind == Collective::Send {
                &mut e.0
            } else {
                &mut e.1
            };
            *n += 1;
            *n
        };
        msgs.push(Msg {
            a,
            node,
            k,
            ipc: false,
            decided: false,
            done_step: false,
            src: 0,
            refused: None,
        });
    }
    // 1-2. Post every send and acknowledge every receive, each as soon as
    // its pair's mailbox allows (a pair's messages go one at a time), so
    // that neither side waits for a step the other has not reached.
    let mine = ipc::current_uuid().ok();
    loop {
        let mut progress = false;
        let mut blocked: Option<usize> = None;
        for i in 0..msgs.len() {
            if msgs[i].done_step || !first_of_pair(&msgs, i) {
                continue;
            }
            let ready = if msgs[i].a.kind == Collective::Send {
                try_post(&mut msgs, i)
            } else {
                try_ack(&mut msgs[i], st, mine)
            };
            if ready {
                progress = true;
            } else {
                blocked.get_or_insert(i);
            }
        }
        let Some(i) = blocked else { break };
        if !progress {
            // Wait until any pending message can move (not only the first:
            // its peer may itself wait for one of the others).
            let heads: Vec<(&Mailbox, bool, u64)> = (0..msgs.len())
                .filter(|&j| !msgs[j].done_step && first_of_pair(&msgs, j))
                .map(|j| {
                    let m = &msgs[j];
                    (pair_box(m), m.a.kind == Collective::Send, m.k)
                })
                .collect();
            wait_for(&msgs[i], "device mailbox", || {
                !heads.iter().any(|&(m, send, k)| {
                    if send {
                        m.ack.load(Ordering::Acquire) >= k - 1
                    } else {
                        m.post.load(Ordering::Acquire) >= k
                    }
                })
            })?;
        }
    }
    // 3. The senders' decisions not seen yet (their pair's last message).
    for msg in msgs.iter_mut() {
        if msg.decided {
            continue;
        }
        let (m, k) = (pair_box(msg), msg.k);
        wait_for(msg, "device mailbox", || m.ack.load(Ordering::Acquire) < k)?;
        decide_send(msg, m.go.load(Ordering::Relaxed));
    }
    for msg in &msgs {
        let path = if msg.ipc {
            "CUDA IPC"
        } else if msg.refused.is_some() {
            "refused (sizes differ)"
        } else {
            "staged through host memory"
        };
        let a = msg.a;
        tracing::info!(target: "hetccl::COLL", "{} count {} {:?}: {path}", a.kind, a.count, a.dtype);
    }
    // 4. CUDA IPC copies, then everything staged as one host group.
    for msg in msgs
        .iter()
        .filter(|m| m.ipc && m.a.kind == Collective::Recv)
    {
        copy(msg.a.recv.addr() as u64, msg.src, msg.a.recv_bytes, stream)?;
    }
    stage::sync(stream)?;
    for msg in msgs
        .iter()
        .filter(|m| m.ipc && m.a.kind == Collective::Recv)
    {
        let m = mailbox(msg.node, msg.a.root, msg.node.me());
        m.done.store(msg.k, Ordering::Release);
        msg.node.wake_peers();
    }
    let staged: Vec<&Call> = calls
        .iter()
        .copied()
        .filter(|a| {
            !msgs
                .iter()
                .any(|m| (m.ipc || m.refused.is_some()) && std::ptr::eq(m.a, *a))
        })
        .collect();
    if !staged.is_empty() {
        stage::run(&staged, &[], stream)?;
    }
    // 5. Senders wait until their receivers have read their buffers.
    for msg in msgs
        .iter()
        .filter(|m| m.ipc && m.a.kind == Collective::Send)
    {
        let (m, k) = (pair_box(msg), msg.k);
        wait_for(msg, "device mailbox: the receiver's copy", || {
            m.done.load(Ordering::Acquire) < k
        })?;
    }
    match msgs.iter().find_map(|m| m.refused.clone()) {
        Some(why) => Err(Error::usage(why)),
        None => Ok(()),
    }
}

/// Records the receiver's decision `go` for send `msg`.
fn decide_send(msg: &mut Msg<'_>, go: u64) {
    msg.ipc = (go & 0xff) == GO_IPC;
    if (go & 0xff) == GO_REFUSED {
        msg.refused = Some(format!(
            "send {} of {} B to rank {}: the receive there is of {} B; the ranks' calls are \
             mismatched (a send and its receive must have the same count and datatype)",
            msg.k,
            msg.a.send_bytes,
            msg.a.root,
            go >> 8
        ));
    }
    msg.decided = true;
}

/// Waits while `blocked` holds, with the node's bounded wait (abort, stall
/// limit, the peer's liveness); `what` and `msg` name the wait.
fn wait_for(msg: &Msg<'_>, what: &str, mut blocked: impl FnMut() -> bool) -> Result<()> {
    let (a, k) = (msg.a, msg.k);
    let e = a.comm.engine.get().expect("a node has an engine");
    let label = || format!("{} {k} with rank {} ({what})", a.kind, a.root);
    let wop = WaitOp {
        label: &label,
        watch: &e.links.watch,
        seq: k,
    };
    msg.node.wait(&wop, || blocked().then_some(a.root))
}

/// The mailbox message `m` travels through.
fn pair_box<'a>(m: &Msg<'a>) -> &'a Mailbox {
    let me = m.node.me();
    if m.a.kind == Collective::Send {
        mailbox(m.node, me, m.a.root)
    } else {
        mailbox(m.node, m.a.root, me)
    }
}

/// Whether `msgs[i]` is the first unfinished message of its direction and
/// pair (a pair's messages go through its mailbox one at a time).
fn first_of_pair(msgs: &[Msg<'_>], i: usize) -> bool {
    let x = &msgs[i];
    !msgs[..i].iter().any(|y| {
        !y.done_step
            && y.a.kind == x.a.kind
            && y.a.root == x.a.root
            && std::sync::Arc::ptr_eq(&y.a.comm, &x.a.comm)
    })
}

/// Posts send `msgs[i]` if the receiver acknowledged the pair's previous
/// message (whose decision, if it is one of this batch, is read first).
fn try_post(msgs: &mut [Msg<'_>], i: usize) -> bool {
    let (a, k) = (msgs[i].a, msgs[i].k);
    let m = pair_box(&msgs[i]);
    if m.ack.load(Ordering::Acquire) < k - 1 {
        return false;
    }
    if let Some(prev) = msgs.iter_mut().find(|x| {
        x.a.kind == Collective::Send
            && x.a.root == a.root
            && std::sync::Arc::ptr_eq(&x.a.comm, &a.comm)
            && x.k == k - 1
    }) {
        decide_send(prev, m.go.load(Ordering::Relaxed));
    }
    let export = if a.send_bytes == 0 {
        None
    } else {
        ipc::export(a.send.get().cast_const()).ok()
    };
    let uuid = ipc::current_uuid().ok();
    let post = Post {
        able: local_able(a) && export.is_some() && uuid.is_some(),
        pid: std::process::id(),
        uuid: uuid.unwrap_or_default(),
        bytes: a.send_bytes as u64,
        export: export.unwrap_or(Export {
            handle: [0; HANDLE_BYTES],
            offset: 0,
            size: 0,
            ptr: a.send.addr() as u64,
        }),
    };
    post.write(m);
    m.post.store(k, Ordering::Release);
    msgs[i].node.wake_peers();
    msgs[i].done_step = true;
    true
}

/// Decides and acknowledges receive `msg` once its sender has posted it.
fn try_ack(msg: &mut Msg<'_>, st: &mut PeerState, mine: Option<[u8; 16]>) -> bool {
    let (a, k) = (msg.a, msg.k);
    let m = pair_box(msg);
    if m.post.load(Ordering::Acquire) < k {
        return false;
    }
    let p = Post::read(m);
    let want = a.recv_bytes as u64;
    if p.bytes != want {
        msg.refused = Some(format!(
            "receive {k} of {want} B from rank {}: the send there is of {} B; the ranks' calls \
             are mismatched (a send and its receive must have the same count and datatype)",
            a.root, p.bytes
        ));
    }
    let ipc = msg.refused.is_none()
        && p.able
        && local_able(a)
        && mine.is_some_and(|u| ipc::check_peer_access(&u, &p.uuid).is_ok())
        && match st.imports.resolve(p.pid, &p.export, p.bytes) {
            Ok(s) => {
                msg.src = s;
                true
            }
            Err(e) => {
                tracing::info!(target: "hetccl::COLL", "receive {k} from rank {}: staging through host memory: {e}", a.root);
                false
            }
        };
    let go = match (ipc, msg.refused.is_some()) {
        (true, _) => GO_IPC,
        (false, true) => GO_REFUSED | want << 8,
        (false, false) => 2,
    };
    m.go.store(go, Ordering::Relaxed);
    m.ack.store(k, Ordering::Release);
    msg.node.wake_peers();
    msg.ipc = ipc;
    msg.decided = true;
    msg.done_step = true;
    true
}

/// `cuMemcpyAsync` on the proxy's stream.
fn copy(dst: u64, src: u64, bytes: usize, stream: cu::CUstream) -> Result<()> {
    if bytes == 0 {
        return Ok(());
    }
    // SAFETY: the receive buffer of a validated call and the sender's
    // buffer of the same size, opened through IPC, live until the sender
    // sees the message done.
    driver::check(
        unsafe { cu::cuMemcpyAsync(dst, src, bytes, stream) },
        "cuMemcpyAsync (peer)",
    )
}
