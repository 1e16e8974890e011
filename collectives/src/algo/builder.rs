//! Builds a plan from a sequential program, inferring the dependencies.
//!
//! Generators emit steps in an order that would be correct if run one at a
//! time. For each new step the builder adds a dependency on every earlier
//! step whose byte ranges conflict with it (read after write, write after
//! read, write after write). The executor may then run steps in any order
//! that respects the dependencies (and the per-peer message order), and gets
//! the same bytes as the sequential program.

use super::plan::{BufId, BufRange, Rank, Step, StepId, StepKind};

#[derive(Debug, Clone, Copy)]
struct Access {
    range: BufRange,
    step: StepId,
}

/// Accesses of one buffer, sorted by offset, so that the ones overlapping
/// a range are found by binary search (`max_len` bounds how far back an
/// overlapping access may start).
#[derive(Debug, Default)]
struct List {
    v: Vec<Access>,
    max_len: usize,
}

impl List {
    /// Pushes the steps of accesses overlapping `r` onto `deps`.
    fn hits(&self, r: &BufRange, deps: &mut Vec<StepId>) {
        let from = r.offset.saturating_sub(self.max_len);
        let lo = self.v.partition_point(|a| a.range.offset < from);
        for a in self.v[lo..].iter().take_while(|a| a.range.offset < r.end()) {
            if a.range.overlaps(r) {
                deps.push(a.step);
            }
        }
    }

    fn insert(&mut self, a: Access) {
        let pos = self.v.partition_point(|x| x.range.offset <= a.range.offset);
        self.v.insert(pos, a);
        self.max_len = self.max_len.max(a.range.len);
    }

    /// Drops the accesses that lie inside `w`.
    fn prune(&mut self, w: &BufRange) {
        let lo = self.v.partition_point(|a| a.range.offset < w.offset);
        let hi = lo
            + self.v[lo..]
                .iter()
                .take_while(|a| a.range.offset < w.end())
                .count();
        let mut keep = lo;
        for i in lo..hi {
            if !w.covers(&self.v[i].range) {
                self.v.swap(keep, i);
                keep += 1;
            }
        }
        self.v.drain(keep..hi);
    }
}

/// The accesses that later steps may conflict with, per buffer: reads and
/// writes apart, since a read-only step need only look at the writes.
#[derive(Debug, Default)]
struct Live {
    reads: [List; 4],
    writes: [List; 4],
}

fn slot(b: BufId) -> usize {
    match b {
        BufId::Send => 0,
        BufId::Recv => 1,
        BufId::Scratch => 2,
        BufId::Addr => 3,
    }
}

/// Accumulates steps; see the module docs.
#[derive(Debug)]
pub(crate) struct Builder {
    steps: Vec<Step>,
    live: Live,
    scratch: usize,
    /// Element size: chunks are whole elements.
    pub esize: usize,
    /// Maximum bytes per message.
    pub chunk_bytes: usize,
    /// Maximum bytes per message of one-step schedules
    /// ([`super::Chunking::piece_bytes`]).
    pub piece_bytes: usize,
    /// Whether finished results are rounded to a compressed wire's
    /// precision: [`Builder::post`] then always emits a `PostOp`.
    pub round: bool,
}

impl Builder {
    /// An empty plan body, cut as `chunking` says.
    pub fn new(esize: usize, chunking: &super::Chunking) -> Self {
        let esize = esize.max(1);
        let chunk_bytes = (chunking.chunk_bytes / esize).max(1) * esize;
        Self {
            steps: Vec::new(),
            live: Live::default(),
            scratch: 0,
            esize,
            chunk_bytes,
            piece_bytes: chunking.piece_bytes,
            round: false,
        }
    }

    /// Reserves `len` scratch bytes (16-byte aligned) and returns them.
    pub fn scratch(&mut self, len: usize) -> BufRange {
        let off = self.scratch.div_ceil(16) * 16;
        self.scratch = off + len;
        BufRange::new(BufId::Scratch, off, len)
    }

    /// Scratch for staging the chunks of a `total`-byte transfer in
    /// [`SLOTS`] rotating chunk-sized slots (or less, if `total` is smaller):
    /// chunk `c` uses slot `c mod SLOTS`, so at most `SLOTS` chunks are in
    /// flight through it, as with NCCL's `NCCL_STEPS` buffer slots.
    pub fn slots(&mut self, total: usize) -> Slots {
        let len = total.min(SLOTS * self.chunk_bytes);
        Slots {
            region: self.scratch(len),
            chunk: self.chunk_bytes,
        }
    }

    /// Appends a step, inferring its dependencies. Zero-length steps are
    /// dropped (and return `None`).
    pub fn push(&mut self, kind: StepKind) -> Option<StepId> {
        let len = kind
            .message_len()
            .or(kind.writes().map(|w| w.len))
            .unwrap_or(0);
        if len == 0 {
            return None;
        }
        let id = self.steps.len() as StepId;
        let reads = kind.reads();
        let write = kind.writes();
        let mut deps: Vec<StepId> = Vec::new();
        for r in reads.iter().flatten() {
            self.live.writes[slot(r.buf)].hits(r, &mut deps);
        }
        if let Some(w) = write {
            self.live.writes[slot(w.buf)].hits(&w, &mut deps);
            self.live.reads[slot(w.buf)].hits(&w, &mut deps);
        }
        deps.sort_unstable();
        deps.dedup();
        if let Some(w) = write {
            // A write that covers an earlier access stands in for it: later
            // conflicting steps depend on this write, which depends on it.
            let k = slot(w.buf);
            self.live.reads[k].prune(&w);
            self.live.writes[k].prune(&w);
        }
        for r in reads.into_iter().flatten() {
            self.live.reads[slot(r.buf)].insert(Access { range: r, step: id });
        }
        if let Some(w) = write {
            self.live.writes[slot(w.buf)].insert(Access { range: w, step: id });
        }
        self.steps.push(Step { kind, deps });
        Some(id)
    }

    /// The `[off, off+len)` pieces of a `len`-byte range, each at most
    /// `chunk_bytes` long. Empty for `len == 0`.
    pub fn pieces(&self, len: usize) -> impl Iterator<Item = (usize, usize)> {
        pieces_of(len, self.chunk_bytes)
    }

    /// As [`Builder::pieces`], with pieces of at most `max` bytes (whole
    /// elements, at least one).
    pub fn pieces_upto(&self, len: usize, max: usize) -> impl Iterator<Item = (usize, usize)> {
        pieces_of(
            len,
            self.chunk_bytes.min((max / self.esize).max(1) * self.esize),
        )
    }

    /// Sends `src` to `peer`, split into chunk-sized messages.
    pub fn send(&mut self, peer: Rank, chan: u8, src: BufRange) {
        for (o, l) in self.pieces(src.len).collect::<Vec<_>>() {
            self.push(StepKind::Send {
                peer,
                chan,
                src: src.sub(o, l),
            });
        }
    }

    /// Receives `dst` from `peer`, split like [`Builder::send`].
    pub fn recv(&mut self, peer: Rank, chan: u8, dst: BufRange) {
        for (o, l) in self.pieces(dst.len).collect::<Vec<_>>() {
            self.push(StepKind::Recv {
                peer,
                chan,
                dst: dst.sub(o, l),
            });
        }
    }

    /// Receives from `peer` and reduces: `dst = local ⊕ msg`, split like
    /// [`Builder::send`].
    pub fn recv_reduce(&mut self, peer: Rank, chan: u8, local: BufRange, dst: BufRange) {
        for (o, l) in self.pieces(dst.len).collect::<Vec<_>>() {
            self.push(StepKind::RecvReduce {
                peer,
                chan,
                local: local.sub(o, l),
                dst: dst.sub(o, l),
            });
        }
    }

    /// `dst = src` unless they are the same range, split into pieces of at
    /// most [`COPY_PIECE`] bytes (or a chunk, if smaller), so that the
    /// executor moves messages between the pieces of a large copy.
    pub fn copy(&mut self, src: BufRange, dst: BufRange) {
        if src != dst {
            for (o, l) in self.pieces_upto(src.len, COPY_PIECE) {
                self.push(StepKind::Copy {
                    src: src.sub(o, l),
                    dst: dst.sub(o, l),
                });
            }
        }
    }

    /// `dst = a ⊕ b`.
    pub fn reduce(&mut self, a: BufRange, b: BufRange, dst: BufRange) {
        self.push(StepKind::Reduce { a, b, dst });
    }

    /// `buf = post(buf)` when `post` is set. When finished results are
    /// rounded to the wire ([`Builder::round`]), one `PostOp` per chunk, so
    /// that each chunk can travel on as soon as it is finished.
    pub fn post(&mut self, post: bool, buf: BufRange) {
        if self.round {
            self.round_range(buf);
        } else if post {
            self.push(StepKind::PostOp { buf });
        }
    }

    /// One `PostOp` per chunk of `buf`.
    pub fn round_range(&mut self, buf: BufRange) {
        for (o, l) in self.pieces(buf.len).collect::<Vec<_>>() {
            self.push(StepKind::PostOp { buf: buf.sub(o, l) });
        }
    }

    /// `dst = pre(src)`.
    pub fn pre(&mut self, src: BufRange, dst: BufRange) {
        self.push(StepKind::PreOp { src, dst });
    }

    /// Part `k` of `r` split into `parts` nearly equal runs of whole
    /// elements (see [`split`]).
    pub fn part(&self, r: BufRange, parts: usize, k: usize) -> BufRange {
        let (start, len) = split(r.len / self.esize, parts, k);
        r.sub(start * self.esize, len * self.esize)
    }

    /// The steps and the scratch size.
    pub fn finish(self) -> (Vec<Step>, usize) {
        (self.steps, self.scratch)
    }
}

/// The `[off, off+len)` pieces of a `len`-byte range, each at most `piece`
/// (> 0) long. Empty for `len == 0`.
fn pieces_of(len: usize, piece: usize) -> impl Iterator<Item = (usize, usize)> {
    (0..len.div_ceil(piece)).map(move |i| (i * piece, piece.min(len - i * piece)))
}

/// The largest piece of a local copy. A piece runs without a break, and
/// messages move only between pieces: a peer's header that arrives during a
/// long copy waits for its answer (a TCP receiver's CTS) until the piece
/// ends. 64 KiB takes about 10 µs to copy.
pub const COPY_PIECE: usize = 64 << 10;

/// Rotating chunk slots in scratch; see [`Builder::slots`].
pub(crate) const SLOTS: usize = 8;

/// See [`Builder::slots`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct Slots {
    region: BufRange,
    chunk: usize,
}

impl Slots {
    /// The slot for chunk `c`, `len` bytes long (at most one chunk).
    pub fn get(&self, c: usize, len: usize) -> BufRange {
        let n = (self.region.len / self.chunk.max(1)).max(1);
        self.region.sub((c % n) * self.chunk, len)
    }
}

/// Element `[start, start+len)` of `count` elements split into `parts`
/// nearly equal parts (the first `count % parts` parts get one more).
pub(crate) fn split(count: usize, parts: usize, k: usize) -> (usize, usize) {
    let parts = parts.max(1);
    let base = count / parts;
    let extra = count % parts;
    let start = k * base + k.min(extra);
    (start, base + usize::from(k < extra))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algo::Chunking;

    #[test]
    fn infers_raw_war_waw() {
        let mut b = Builder::new(4, &Chunking::with_chunk(8));
        let r = |o, l| BufRange::new(BufId::Recv, o, l);
        let s0 = b
            .push(StepKind::Recv {
                peer: 1,
                chan: 0,
                dst: r(0, 8),
            })
            .unwrap();
        let s1 = b
            .push(StepKind::Send {
                peer: 1,
                chan: 0,
                src: r(4, 4),
            })
            .unwrap();
        let s2 = b
            .push(StepKind::Send {
                peer: 2,
                chan: 0,
                src: r(8, 4),
            })
            .unwrap();
        let s3 = b
            .push(StepKind::Recv {
                peer: 2,
                chan: 0,
                dst: r(0, 12),
            })
            .unwrap();
        assert!(b
            .push(StepKind::Recv {
                peer: 2,
                chan: 0,
                dst: r(0, 0)
            })
            .is_none());
        let (steps, _) = b.finish();
        assert!(steps[s1 as usize].deps == vec![s0]);
        assert!(steps[s2 as usize].deps.is_empty());
        assert_eq!(steps[s3 as usize].deps, vec![s0, s1, s2]);
    }

    /// A long copy comes in pieces of at most `COPY_PIECE` (or a chunk,
    /// whole elements), in order, covering it, and none waits for another:
    /// the executor can move messages between them.
    #[test]
    fn copies_come_in_pieces() {
        let src = BufRange::new(BufId::Send, 0, 0);
        let dst = BufRange::new(BufId::Recv, 0, 0);
        for (esize, chunk, len) in [
            (4, 512 << 10, (512 << 10) + 4),
            (8, 1 << 20, 3 * COPY_PIECE - 8),
            (4, 8, 20),
            (12, 100, 12 * 40),
        ] {
            let mut b = Builder::new(esize, &Chunking::with_chunk(chunk));
            b.copy(src.sub(0, len), dst.sub(0, len));
            let (steps, _) = b.finish();
            let most = (chunk / esize).min(COPY_PIECE / esize) * esize;
            assert_eq!(steps.len(), len.div_ceil(most), "{esize} {chunk} {len}");
            let mut next = 0;
            for s in &steps {
                let StepKind::Copy { src: a, dst: d } = s.kind else {
                    panic!("not a copy: {:?}", s.kind);
                };
                assert!(s.deps.is_empty());
                assert_eq!((a.offset, d.offset), (next, next));
                assert!(a.len <= most && a.len % esize == 0 && a.len == d.len);
                next += a.len;
            }
            assert_eq!(next, len);
        }
    }

    #[test]
    fn split_covers() {
        for count in 0..20 {
            for parts in 1..7 {
                let mut next = 0;
                for k in 0..parts {
                    let (s, l) = split(count, parts, k);
                    assert_eq!(s, next);
                    next = s + l;
                }
                assert_eq!(next, count);
            }
        }
    }
}
