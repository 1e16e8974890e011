//! Collective fingerprints on the executor's links: 32 bytes that say which
//! call a rank is making (kind, count, datatype, op, root and the
//! communicator's collective sequence number) travel at the head of its
//! first message of a collective on each link, and each rank checks the one
//! it receives first on each link against its own. Ranks that passed
//! different calls fail with `ncclInvalidUsage` naming both calls, instead
//! of mixing their data. (The single-node direct paths compare shapes on
//! their boards; point-to-point calls are matched by size.)
//!
//! [`add`] rewrites a plan so: the first message on each link carries the
//! fingerprint and up to [`CARRY`] bytes of its data, so no message is added
//! on a link used both ways. The slots live in the job's scratch buffer,
//! after the plan's own scratch. `HETCCL_CHECK=0` turns this off; the ranks
//! of a communicator agree at init.

use hetccl_abi::DataType;
use hetccl_core::config::Compression;

use crate::algo::{BufId, BufRange, Collective, Plan, Step, StepKind};
use crate::error::{Error, Result};
use crate::reduce::ReduceOp;

/// Bytes of one fingerprint.
pub const BYTES: usize = 32;
const MAGIC: u16 = 0x4650; // "FP"
const VERSION: u8 = 1;

/// What a collective call is, as every rank must pass it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fingerprint {
    /// The collective.
    pub kind: Collective,
    /// The element count (NCCL's, per kind).
    pub count: u64,
    /// The element type.
    pub dtype: DataType,
    /// The reduction (its kind; PreMulSum scalars may differ per rank).
    pub op: u8,
    /// The root, for rooted kinds.
    pub root: u32,
    /// The communicator's collective sequence number.
    pub seq: u64,
    /// The plan's wire format between nodes (`HETCCL_COMPRESS`), which
    /// changes message sizes: 0 off, 1 bf16, 2 fp8 e4m3.
    pub wire: u8,
}

fn op_code(op: ReduceOp) -> u8 {
    match op {
        ReduceOp::Sum => 0,
        ReduceOp::Prod => 1,
        ReduceOp::Max => 2,
        ReduceOp::Min => 3,
        ReduceOp::Avg => 4,
        ReduceOp::PreMulSum(_) => 5,
    }
}

fn op_name(code: u8) -> &'static str {
    ["sum", "prod", "max", "min", "avg", "premulsum"]
        .get(code as usize)
        .copied()
        .unwrap_or("?")
}

impl Fingerprint {
    /// The fingerprint of a call.
    pub fn new(
        kind: Collective,
        count: usize,
        dtype: DataType,
        op: ReduceOp,
        root: u32,
        seq: u64,
    ) -> Self {
        Self {
            kind,
            count: count as u64,
            dtype,
            op: if kind.reduces() { op_code(op) } else { 0 },
            root: if kind.rooted() { root } else { 0 },
            seq,
            wire: 0,
        }
    }

    /// The fingerprint of a call whose plan sends in wire format `wire`
    /// between nodes.
    pub fn with_wire(self, wire: Compression) -> Self {
        let wire = match wire {
            Compression::Off => 0,
            Compression::Bf16 => 1,
            Compression::Fp8E4M3 => 2,
        };
        Self { wire, ..self }
    }

    /// The 32 bytes on the wire.
    pub fn encode(&self) -> [u8; BYTES] {
        let mut b = [0u8; BYTES];
        b[0..2].copy_from_slice(&MAGIC.to_le_bytes());
        b[2] = VERSION;
        b[3] = Collective::ALL
            .iter()
            .position(|&k| k == self.kind)
            .unwrap_or(0) as u8;
        b[4] = self.dtype as u8;
        b[5] = self.op;
        b[6] = self.wire;
        b[8..12].copy_from_slice(&self.root.to_le_bytes());
        b[16..24].copy_from_slice(&self.count.to_le_bytes());
        b[24..32].copy_from_slice(&self.seq.to_le_bytes());
        b
    }

    /// Decodes a peer's fingerprint (untrusted bytes).
    pub fn decode(b: &[u8]) -> Option<Self> {
        if b.len() != BYTES || b[0..2] != MAGIC.to_le_bytes() || b[2] != VERSION || b[6] > 2 {
            return None;
        }
        let kind = *Collective::ALL.get(b[3] as usize)?;
        let dtype = DataType::try_from(i32::from(b[4])).ok()?;
        Some(Self {
            kind,
            dtype,
            op: b[5],
            wire: b[6],
            root: u32::from_le_bytes(b[8..12].try_into().ok()?),
            count: u64::from_le_bytes(b[16..24].try_into().ok()?),
            seq: u64::from_le_bytes(b[24..32].try_into().ok()?),
        })
    }

    fn describe(&self) -> String {
        let mut s = format!("{}(count={}, {}", self.kind, self.count, self.dtype.name());
        if self.kind.reduces() {
            s.push_str(&format!(", {}", op_name(self.op)));
        }
        if self.kind.rooted() {
            s.push_str(&format!(", root={}", self.root));
        }
        if self.wire != 0 {
            let w = ["off", "bf16", "fp8e4m3"][self.wire as usize % 3];
            s.push_str(&format!(", HETCCL_COMPRESS={w}"));
        }
        s.push(')');
        s
    }
}

/// Data bytes of a link's first message that travel in the same message as
/// its fingerprint (a multiple of every element size); the rest of a longer
/// first message follows as a message of its own.
pub const CARRY: usize = 16 * 1024 - BYTES;
/// Bytes of one fingerprint slot: a fingerprint and the data it carries.
/// A receive slot takes the largest first message any peer may send.
pub const SLOT: usize = BYTES + CARRY;

/// Where a plan's fingerprints live in the job's scratch buffer: one send
/// slot and one receive slot per link, `SLOT` bytes apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    /// The first send slot; each starts with this rank's fingerprint.
    pub out: usize,
    /// The first receive slot; each starts with a peer's fingerprint.
    pub inbox: usize,
    /// Links, hence slots of each kind.
    pub links: usize,
}

impl Layout {
    /// The offsets of the send slots.
    pub fn out_slots(&self) -> impl Iterator<Item = usize> {
        let out = self.out;
        (0..self.links).map(move |i| out + i * SLOT)
    }

    /// Whether `r` starts a send slot: this rank's first message.
    pub fn is_out(&self, r: &BufRange) -> bool {
        r.buf == BufId::Scratch
            && r.offset >= self.out
            && r.offset < self.out + self.links * SLOT
            && (r.offset - self.out) % SLOT == 0
    }

    /// Whether `r` is a receive slot's range: a peer's first message.
    pub fn is_inbox(&self, r: &BufRange) -> bool {
        r.buf == BufId::Scratch
            && r.offset >= self.inbox
            && r.offset < self.inbox + self.links * SLOT
            && (r.offset - self.inbox) % SLOT == 0
    }
}

/// A link, `(peer, chan)`, and the indices of its first send and receive.
type LinkUse = ((u32, u8), Option<usize>, Option<usize>);

/// The plan with a fingerprint at the head of the first message on every
/// link it uses, and where the fingerprints go.
///
/// On each link, the first send copies up to [`CARRY`] bytes of its data
/// behind the fingerprint in a send slot and sends the slot; the first
/// receive takes the slot's message into a receive slot, where the
/// executor checks the fingerprint before a copy or reduction moves the
/// data on. A link used one way only also carries a bare fingerprint the
/// other way, so that a rank that only sends (a root) still learns its
/// peer's call: two ranks that both think they are the root find out
/// instead of both returning. No step waits for anything it did not wait
/// for before, so the transformed plan cannot deadlock where the original
/// did not.
pub fn add(plan: &Plan) -> (Plan, Layout) {
    // (peer, chan) -> (first send, first receive), in order of first use.
    let mut links: Vec<LinkUse> = Vec::new();
    for (i, s) in plan.steps.iter().enumerate() {
        if let Some((peer, chan, is_send)) = s.kind.message() {
            let l = match links.iter().position(|l| l.0 == (peer, chan)) {
                Some(l) => l,
                None => {
                    links.push(((peer, chan), None, None));
                    links.len() - 1
                }
            };
            let slot = if is_send {
                &mut links[l].1
            } else {
                &mut links[l].2
            };
            slot.get_or_insert(i);
        }
    }
    let out = plan.scratch_bytes.next_multiple_of(64);
    let layout = Layout {
        out,
        inbox: out + links.len() * SLOT,
        links: links.len(),
    };
    let out_slot = |l: usize, len: usize| BufRange::new(BufId::Scratch, out + l * SLOT, len);
    let in_slot =
        |l: usize, len: usize| BufRange::new(BufId::Scratch, layout.inbox + l * SLOT, len);
    let mut steps: Vec<Step> = Vec::with_capacity(plan.steps.len() + 3 * links.len());
    // Bare fingerprints on the links used one way.
    for (l, &((peer, chan), send, recv)) in links.iter().enumerate() {
        if send.is_none() {
            let src = out_slot(l, BYTES);
            steps.push(Step {
                kind: StepKind::Send { peer, chan, src },
                deps: vec![],
            });
        }
        if recv.is_none() {
            let dst = in_slot(l, BYTES);
            steps.push(Step {
                kind: StepKind::Recv { peer, chan, dst },
                deps: vec![],
            });
        }
    }
    // done[i]: the new steps whose completion completes original step i.
    let mut done: Vec<Vec<u32>> = Vec::with_capacity(plan.steps.len());
    for (i, s) in plan.steps.iter().enumerate() {
        let mut deps: Vec<u32> = s
            .deps
            .iter()
            .flat_map(|&d| done[d as usize].iter().copied())
            .collect();
        deps.sort_unstable();
        let first = links
            .iter()
            .position(|&(_, send, recv)| send == Some(i) || recv == Some(i));
        let mut push = |kind: StepKind, deps: Vec<u32>| {
            steps.push(Step { kind, deps });
            steps.len() as u32 - 1
        };
        let ids = match (first, s.kind) {
            (Some(l), StepKind::Send { peer, chan, src }) => {
                let m = src.len.min(CARRY);
                let mut send_deps = deps.clone();
                if m > 0 {
                    let copy = StepKind::Copy {
                        src: src.sub(0, m),
                        dst: out_slot(l, BYTES + m).sub(BYTES, m),
                    };
                    send_deps = vec![push(copy, deps.clone())];
                }
                let head = StepKind::Send {
                    peer,
                    chan,
                    src: out_slot(l, BYTES + m),
                };
                let mut ids = vec![push(head, send_deps)];
                if src.len > m {
                    let rest = StepKind::Send {
                        peer,
                        chan,
                        src: src.sub(m, src.len - m),
                    };
                    ids.push(push(rest, deps));
                }
                ids
            }
            (Some(l), StepKind::Recv { peer, chan, dst }) => {
                let m = dst.len.min(CARRY);
                let head = push(
                    StepKind::Recv {
                        peer,
                        chan,
                        dst: in_slot(l, BYTES + m),
                    },
                    deps.clone(),
                );
                let mut ids = Vec::new();
                if m > 0 {
                    let copy = StepKind::Copy {
                        src: in_slot(l, BYTES + m).sub(BYTES, m),
                        dst: dst.sub(0, m),
                    };
                    ids.push(push(copy, merge(&deps, head)));
                } else {
                    ids.push(head);
                }
                if dst.len > m {
                    let rest = StepKind::Recv {
                        peer,
                        chan,
                        dst: dst.sub(m, dst.len - m),
                    };
                    ids.push(push(rest, deps));
                }
                ids
            }
            (
                Some(l),
                StepKind::RecvReduce {
                    peer,
                    chan,
                    local,
                    dst,
                },
            ) => {
                let m = dst.len.min(CARRY);
                let head = push(
                    StepKind::Recv {
                        peer,
                        chan,
                        dst: in_slot(l, BYTES + m),
                    },
                    deps.clone(),
                );
                let mut ids = Vec::new();
                if m > 0 {
                    let reduce = StepKind::Reduce {
                        a: local.sub(0, m),
                        b: in_slot(l, BYTES + m).sub(BYTES, m),
                        dst: dst.sub(0, m),
                    };
                    ids.push(push(reduce, merge(&deps, head)));
                } else {
                    ids.push(head);
                }
                if dst.len > m {
                    let rest = StepKind::RecvReduce {
                        peer,
                        chan,
                        local: local.sub(m, dst.len - m),
                        dst: dst.sub(m, dst.len - m),
                    };
                    ids.push(push(rest, deps));
                }
                ids
            }
            (_, kind) => vec![push(kind, deps)],
        };
        done.push(ids);
    }
    let with = Plan {
        steps,
        scratch_bytes: layout.inbox + links.len() * SLOT,
        ..plan.clone()
    };
    (with, layout)
}

/// `deps` and `extra`, ascending.
fn merge(deps: &[u32], extra: u32) -> Vec<u32> {
    let mut v = deps.to_vec();
    v.push(extra);
    v.sort_unstable();
    v
}

/// Checks a peer's fingerprint, received from rank `from`, against this
/// rank's (`mine`, rank `me`).
pub fn check(mine: &[u8], theirs: &[u8], me: usize, from: usize) -> Result<()> {
    if mine == theirs {
        return Ok(());
    }
    let m = Fingerprint::decode(mine).ok_or_else(|| Error::Internal("own fingerprint".into()))?;
    let t = match Fingerprint::decode(theirs) {
        Some(t) => t,
        None => {
            return Err(Error::usage(format!(
                "rank {from} sent something other than a collective where this rank (rank {me}) \
                 called {} at seq {}: the ranks' calls are mismatched",
                m.describe(),
                m.seq
            )))
        }
    };
    let at = if t.seq == m.seq {
        format!("at seq {}", m.seq)
    } else {
        format!("at seq {} and {} respectively", t.seq, m.seq)
    };
    Err(Error::usage(format!(
        "rank {from} called {} but rank {me} called {} {at}: every rank must call the same \
         collectives, with the same count, datatype, op and root (and compression), in the same order",
        t.describe(),
        m.describe()
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encode_decode_and_messages() {
        let a = Fingerprint::new(
            Collective::AllReduce,
            1000,
            DataType::Float32,
            ReduceOp::Sum,
            0,
            17,
        );
        assert_eq!(Fingerprint::decode(&a.encode()), Some(a));
        let b = Fingerprint { count: 2000, ..a };
        assert!(check(&a.encode(), &a.encode(), 1, 0).is_ok());
        let e = check(&b.encode(), &a.encode(), 1, 0)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("rank 0 called allreduce(count=1000, float, sum) but rank 1 called allreduce(count=2000, float, sum) at seq 17"),
            "{e}"
        );
        let r = Fingerprint::new(
            Collective::Broadcast,
            8,
            DataType::Int8,
            ReduceOp::Max,
            3,
            2,
        );
        assert_eq!(r.op, 0, "no op for broadcast");
        assert!(r.describe().contains("root=3"));
        assert!(Fingerprint::decode(&[0u8; 32]).is_none());
        assert!(Fingerprint::decode(&[0u8; 31]).is_none());
        let e = check(&a.encode(), &[9u8; 32], 0, 1)
            .unwrap_err()
            .to_string();
        assert!(e.contains("something other than a collective"), "{e}");
        // Ranks that compress differently are told so.
        let w = a.with_wire(Compression::Bf16);
        assert_eq!(Fingerprint::decode(&w.encode()), Some(w));
        let e = check(&a.encode(), &w.encode(), 0, 1)
            .unwrap_err()
            .to_string();
        assert!(e.contains("sum, HETCCL_COMPRESS=bf16)"), "{e}");
    }
}
