//! The layout of one local rank's board in the node arena
//! ([`crate::transport::arena::BOARD`] bytes, zeroed at creation).
//!
//! ```text
//! offset 0      control lines (128 B): single-copy handshake, owner writes
//! offset 128    extent line (64 B): the single-copy operation's buffer
//!               lengths and shape, owner writes
//! offset 192    work line (64 B): single-copy work counters
//! offset 256    done line (64 B): single-copy items finished, owner writes
//! offset 320    small-message slot, parity 0: header (32 B) + data
//! offset 320+S  small-message slot, parity 1
//! offset 320+2S device-collective slots (16 × 256 B, see `crate::gpu::peer`)
//! then          broadcast line (64 B): last broadcast entered, finished,
//!               and its shape
//! then          broadcast calls (2048 × 32 B): the shape of each broadcast
//!               this rank was root of
//! then          broadcast ring (32 slots of S), this rank's broadcasts as root
//! then          broadcast lines (2048 slots of 64 B), its broadcasts of up
//!               to 32 B as root
//! ```
//!
//! The broadcast words follow their own protocol (see `intranode::bcast`).
//!
//! Every word is written by the board's owner only and read by the other
//! local ranks, except the work line's claim counter, which every rank
//! advances with compare-and-swap (see `intranode::copy`). A slot's header
//! (the call's shape and the bytes posted) and data are written before its
//! `seq` is published with `Release`; a reader that sees `seq == s` with
//! `Acquire` may read the header and data of operation `s`. The data starts
//! in the same cache line as `seq`, so an 8-byte operation moves one line
//! per rank.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::transport::arena::BOARD;

/// Data bytes of one small-message slot.
pub const FAST_BYTES: usize = 16 << 10;
/// Bytes from one slot's start to the next.
const SLOT_STRIDE: usize = 64 + FAST_BYTES;
/// A slot's header: `seq`, the shape (2 words), the bytes posted.
const SLOT_HEADER: usize = 32;
/// Where the extent line starts.
const EXTENTS: usize = std::mem::size_of::<Control>();
/// Where the work line starts.
const WORK: usize = EXTENTS + std::mem::size_of::<Extents>();
/// Where the done line starts.
const DONE: usize = WORK + 64;
/// Where the first slot starts.
const SLOT0: usize = DONE + 64;
/// Device-collective slots per board (a ring indexed by sequence number).
pub const GPU_SLOTS: usize = 16;
/// Where the first device-collective slot starts.
const GPU0: usize = SLOT0 + 2 * SLOT_STRIDE;
/// Slots of the broadcast ring (a ring indexed by broadcast number).
pub const RING_SLOTS: usize = 32;
/// Slots of the broadcast lines, the ring of one-line slots that
/// broadcasts of up to [`LINE_BYTES`] use: deep, so that a root of many
/// tiny broadcasts runs far ahead of its receivers without waiting.
pub const LINE_SLOTS: usize = 2048;
/// Data bytes of one broadcast line (the rest of the line is the header).
pub const LINE_BYTES: usize = 64 - SLOT_HEADER;
/// Where the broadcast line starts.
const BCAST: usize = GPU0 + GPU_SLOTS * std::mem::size_of::<GpuSlot>();
/// Where the broadcast calls start (one 32-byte entry per slot of the
/// deeper ring).
const CALLS: usize = BCAST + 64;
/// Where the first broadcast ring slot starts.
const RING0: usize = CALLS + LINE_SLOTS * 32;
/// Where the first broadcast line starts.
const LINE0: usize = RING0 + RING_SLOTS * SLOT_STRIDE;
const _: () = assert!(LINE0 + LINE_SLOTS * 64 <= BOARD && RING0 % 64 == 0 && LINE0 % 64 == 0);
const _: () = assert!(LINE_SLOTS >= RING_SLOTS);
const _: () = assert!(std::mem::size_of::<GpuSlot>() == 256);
const _: () = assert!(std::mem::size_of::<Control>() == 128);
const _: () = assert!(std::mem::size_of::<Extents>() == 64);
const _: () = assert!(SLOT_HEADER + FAST_BYTES <= SLOT_STRIDE && SLOT0 % 64 == 0);

/// The control line: what a rank tells the others about its current
/// single-copy operation (see `intranode::copy`).
#[repr(C, align(64))]
#[derive(Debug)]
pub struct Control {
    /// `(op << 8) | stage`: the single-copy operation this rank is in and the
    /// last stage it finished (0 = posted its buffers).
    pub stage: AtomicU64,
    /// The operation's send buffer address in the owner's address space.
    pub send: AtomicU64,
    /// The operation's receive buffer address in the owner's address space.
    pub recv: AtomicU64,
    /// The owner's process id (for `process_vm_readv` and liveness checks).
    pub pid: AtomicU64,
    /// Address of a word holding [`PROBE_VALUE`] in the owner's process.
    pub probe_addr: AtomicU64,
    /// 1 when the owner could read every peer's probe word, 2 when not.
    pub probe_ok: AtomicU64,
    /// The shareable allocation holding the send buffer (see
    /// [`Control::publish`]).
    pub send_region: [AtomicU64; 4],
    /// The shareable allocation holding the receive buffer.
    pub recv_region: [AtomicU64; 4],
    /// The operation's PreMulSum scalar (little-endian bytes of the
    /// datatype): scalars may differ per rank, and peers reduce this rank's
    /// input.
    pub scalar: AtomicU64,
    /// One more than the CPU the owner ran on when it posted its current
    /// operation (0 = unknown): ranks that share a CPU leave the work items
    /// to one of them (see `intranode::copy`).
    pub cpu: AtomicU64,
}

impl Control {
    /// Publishes `r` (or "none") in `words`: id, descriptor, base, length.
    pub fn publish(words: &[AtomicU64; 4], r: Option<super::region::Region>) {
        let v = r.map_or([0; 4], |r| [r.id, r.fd as u64, r.base as u64, r.len as u64]);
        for (w, v) in words.iter().zip(v) {
            w.store(v, Ordering::Relaxed);
        }
    }

    /// Reads an allocation published by [`Control::publish`]: (id,
    /// descriptor, base, length), `None` when there is none.
    pub fn region(words: &[AtomicU64; 4]) -> Option<(u64, i32, usize, usize)> {
        let id = words[0].load(Ordering::Relaxed);
        (id != 0).then(|| {
            (
                id,
                words[1].load(Ordering::Relaxed) as i32,
                words[2].load(Ordering::Relaxed) as usize,
                words[3].load(Ordering::Relaxed) as usize,
            )
        })
    }
}

/// The extent line: the lengths of the buffers a rank exposes for its
/// current single-copy operation (their addresses are on the control line)
/// and the call's shape. Peers bound every access to this rank's memory by
/// these extents, and refuse the operation when the shapes disagree.
#[repr(C, align(64))]
#[derive(Debug)]
pub struct Extents {
    /// Bytes of the send buffer at [`Control::send`] this operation uses.
    pub send_len: AtomicU64,
    /// Bytes of the receive buffer at [`Control::recv`].
    pub recv_len: AtomicU64,
    /// The call's [`super::shape::Shape`] words.
    pub shape: [AtomicU64; 2],
}

/// One device collective's slot: what its owner tells the other local
/// ranks about it (see `crate::gpu::peer` for the protocol). Written by the
/// owner only.
#[repr(C, align(64))]
#[derive(Debug)]
pub struct GpuSlot {
    /// The device collective (per-communicator sequence number, from 1)
    /// this slot describes; stored with `Release` after `desc`.
    pub seq: AtomicU64,
    /// `(seq << 8) | phase`: the last phase of `seq` the owner finished.
    pub stage: AtomicU64,
    /// The owner's descriptor of its buffers for `seq`.
    pub desc: [AtomicU64; 30],
}

/// Which of a root's two broadcast rings a broadcast uses: the same on
/// every rank of a well-formed call (it follows from the byte count).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ring {
    /// [`RING_SLOTS`] slots of [`FAST_BYTES`].
    Slots,
    /// [`LINE_SLOTS`] one-line slots of [`LINE_BYTES`].
    Lines,
}

impl Ring {
    /// The ring a broadcast of `bytes` (at most [`FAST_BYTES`]) uses.
    pub fn for_bytes(bytes: usize) -> Self {
        if bytes <= LINE_BYTES {
            Self::Lines
        } else {
            Self::Slots
        }
    }

    /// How many broadcasts apart two uses of one slot are.
    pub fn depth(self) -> u64 {
        match self {
            Self::Slots => RING_SLOTS as u64,
            Self::Lines => LINE_SLOTS as u64,
        }
    }

    /// Data bytes of one slot.
    fn cap(self) -> usize {
        match self {
            Self::Slots => FAST_BYTES,
            Self::Lines => LINE_BYTES,
        }
    }
}

/// The value of the probe word every rank publishes at init.
pub const PROBE_VALUE: u64 = 0x6865_7463_636c_5052; // "hetcclPR"

/// A view of one rank's board.
#[derive(Debug, Clone, Copy)]
pub struct Board {
    base: *mut u8,
}

// SAFETY: the board lives in the shared arena for the communicator's
// lifetime; its words are atomics and its data areas follow the slot
// protocol above.
unsafe impl Send for Board {}
// SAFETY: as above.
unsafe impl Sync for Board {}

impl Board {
    /// Views the board at `base`.
    ///
    /// # Safety
    /// `base` must be a board of the arena (64-byte aligned, [`BOARD`]
    /// bytes) that outlives the view.
    pub unsafe fn at(base: *mut u8) -> Self {
        Self { base }
    }

    /// The control line.
    pub fn control(&self) -> &Control {
        // SAFETY: the first 64 bytes are the control line (zero is a valid
        // value for every field).
        unsafe { &*(self.base as *const Control) }
    }

    /// The extent line.
    pub fn extents(&self) -> &Extents {
        // SAFETY: the extent line lies inside the board, 64-byte aligned;
        // zero is a valid value for every field.
        unsafe { &*(self.base.add(EXTENTS) as *const Extents) }
    }

    /// The claim counter of this rank's home work items (advanced by any
    /// rank with compare-and-swap; monotonic over the communicator's life).
    pub fn claim(&self) -> &AtomicU64 {
        // SAFETY: the work line lies inside the board and starts 8-byte
        // aligned; zero is a valid value.
        unsafe { &*(self.base.add(WORK) as *const AtomicU64) }
    }

    /// The number of single-copy work items this rank has finished
    /// (written by the owner only; monotonic over the communicator's life).
    pub fn done(&self) -> &AtomicU64 {
        // SAFETY: as for `claim`, on the done line.
        unsafe { &*(self.base.add(DONE) as *const AtomicU64) }
    }

    /// The device-collective slot of sequence number `seq`.
    pub fn gpu_slot(&self, seq: u64) -> &GpuSlot {
        let i = seq as usize % GPU_SLOTS;
        // SAFETY: the slots lie inside the board, 64-byte aligned; zero is a
        // valid value for every field.
        unsafe { &*(self.base.add(GPU0 + i * std::mem::size_of::<GpuSlot>()) as *const GpuSlot) }
    }

    fn slot(&self, seq: u64) -> *mut u8 {
        // SAFETY: both slots lie inside the board.
        unsafe { self.base.add(SLOT0 + (seq as usize & 1) * SLOT_STRIDE) }
    }

    fn ring_slot(&self, b: u64, ring: Ring) -> *mut u8 {
        let at = match ring {
            Ring::Slots => RING0 + (b as usize % RING_SLOTS) * SLOT_STRIDE,
            Ring::Lines => LINE0 + (b as usize % LINE_SLOTS) * 64,
        };
        // SAFETY: both rings' slots lie inside the board.
        unsafe { self.base.add(at) }
    }

    /// The sequence word of the slot operation `seq` uses.
    pub fn slot_seq(&self, seq: u64) -> &AtomicU64 {
        // SAFETY: a slot of this board.
        unsafe { seq_at(self.slot(seq)) }
    }

    /// The data area of the slot operation `seq` uses.
    pub fn slot_data(&self, seq: u64) -> *mut u8 {
        // SAFETY: the data follows the header inside the slot.
        unsafe { self.slot(seq).add(SLOT_HEADER) }
    }

    /// Publishes `data` as this rank's input to small operation `seq` of
    /// shape `shape` (the words of [`super::shape::Shape::encode`]).
    ///
    /// The sequence word is stored with `Release` only, not `SeqCst`: a
    /// full fence would stall on the cache line the peers just read. A
    /// waiter that announced its sleep at the same instant may therefore
    /// miss the doorbell and sleep until its bounded timeout (5 ms); that
    /// only happens after it has waited 2 ms already (see `wait.rs`).
    ///
    /// # Safety
    /// Only the board's owner may post, and only once every rank has posted
    /// operation `seq - 1` (so nobody still reads operation `seq - 2`, which
    /// used the same slot). `data` must be at most [`FAST_BYTES`].
    pub unsafe fn post(&self, seq: u64, shape: [u64; 2], data: &[u8]) {
        // SAFETY: per the contract.
        unsafe { post_at(self.slot(seq), FAST_BYTES, seq, shape, data) }
    }

    /// Whether this rank has posted small operation `seq`.
    pub fn posted(&self, seq: u64) -> bool {
        self.slot_seq(seq).load(Ordering::Acquire) == seq
    }

    /// The shape words and byte count the owner posted with small
    /// operation `seq` (after [`Board::posted`] returned true for `seq`, and
    /// before this rank posts `seq + 1`).
    pub fn posted_shape(&self, seq: u64) -> ([u64; 2], usize) {
        // SAFETY: a slot of this board.
        unsafe { header_at(self.slot(seq)) }
    }

    /// The first `len` data bytes of small operation `seq` (after
    /// [`Board::posted`] returned true for `seq`), or `None` when the owner
    /// posted fewer than `len` bytes.
    ///
    /// # Safety
    /// The owner must have posted `seq` and the caller must not have posted
    /// `seq + 1` yet.
    pub unsafe fn data(&self, seq: u64, len: usize) -> Option<&[u8]> {
        // SAFETY: per the contract.
        unsafe { data_at(self.slot(seq), FAST_BYTES, len) }
    }

    /// The highest broadcast number this rank has entered (as root or
    /// receiver; owner-written).
    pub fn bcast_mark(&self) -> &AtomicU64 {
        // SAFETY: the broadcast line lies inside the board, 64-byte aligned;
        // zero is a valid value.
        unsafe { &*(self.base.add(BCAST) as *const AtomicU64) }
    }

    /// The highest broadcast number this rank has finished with: read its
    /// data (receiver) or posted it (root). Owner-written.
    pub fn bcast_done(&self) -> &AtomicU64 {
        // SAFETY: as for `bcast_mark`, the next word.
        unsafe { &*(self.base.add(BCAST + 8) as *const AtomicU64) }
    }

    /// The shape of the last broadcast this rank entered (owner-written,
    /// before [`Board::bcast_mark`]).
    pub fn bcast_shape(&self) -> &[AtomicU64; 2] {
        // SAFETY: as for `bcast_mark`, the third and fourth words.
        unsafe { &*(self.base.add(BCAST + 16) as *const [AtomicU64; 2]) }
    }

    /// The entry of broadcast `b` among the broadcast calls: sequence word
    /// and two shape words.
    fn call_entry(&self, b: u64) -> &[AtomicU64; 3] {
        // SAFETY: the entries lie inside the board, 32 bytes apart, 8-byte
        // aligned; zero is a valid value.
        unsafe {
            &*(self.base.add(CALLS + (b as usize % LINE_SLOTS) * 32) as *const [AtomicU64; 3])
        }
    }

    /// Records that this rank is the root of broadcast `b`, with shape
    /// `shape` (owner only). The final store is `SeqCst`: of two ranks that record
    /// and then read each other's entry with [`Board::call`], at least one
    /// sees the other's.
    pub fn record_call(&self, b: u64, shape: [u64; 2]) {
        let e = self.call_entry(b);
        // A reader that loads the sequence word before and after the shape
        // and finds `b` both times read the shape of `b`.
        e[0].store(0, Ordering::Relaxed);
        std::sync::atomic::fence(Ordering::Release);
        e[1].store(shape[0], Ordering::Relaxed);
        e[2].store(shape[1], Ordering::Relaxed);
        e[0].store(b, Ordering::SeqCst);
    }

    /// The shape this rank recorded for broadcast `b`, if its entry still
    /// holds `b` (entries are reused every [`LINE_SLOTS`] broadcasts).
    pub fn call(&self, b: u64) -> Option<[u64; 2]> {
        let e = self.call_entry(b);
        if e[0].load(Ordering::SeqCst) != b {
            return None;
        }
        let w = [e[1].load(Ordering::Relaxed), e[2].load(Ordering::Relaxed)];
        std::sync::atomic::fence(Ordering::Acquire);
        (e[0].load(Ordering::Relaxed) == b).then_some(w)
    }

    /// Publishes `data` as broadcast `b` of shape `shape` in this rank's
    /// ring `ring` (this rank is its root).
    ///
    /// # Safety
    /// Only the board's owner may post, and only once every rank has
    /// finished broadcast `b - ring.depth()` ([`Board::bcast_done`]), the
    /// last that could use the same slot. `data` must fit a slot of `ring`.
    pub unsafe fn ring_post(&self, b: u64, ring: Ring, shape: [u64; 2], data: &[u8]) {
        // SAFETY: per the contract.
        unsafe { post_at(self.ring_slot(b, ring), ring.cap(), b, shape, data) }
    }

    /// Whether this rank has posted broadcast `b` in its ring `ring`.
    pub fn ring_posted(&self, b: u64, ring: Ring) -> bool {
        // SAFETY: a ring slot of this board.
        unsafe { seq_at(self.ring_slot(b, ring)) }.load(Ordering::Acquire) == b
    }

    /// The shape words and byte count posted with broadcast `b` (after
    /// [`Board::ring_posted`] returned true for `b`, and before the reader
    /// finishes `b`).
    pub fn ring_shape(&self, b: u64, ring: Ring) -> ([u64; 2], usize) {
        // SAFETY: a ring slot of this board.
        unsafe { header_at(self.ring_slot(b, ring)) }
    }

    /// The first `len` data bytes of broadcast `b`, or `None` when the root
    /// posted fewer.
    ///
    /// # Safety
    /// The owner must have posted `b`, and the caller must not have
    /// published that it finished `b` yet.
    pub unsafe fn ring_data(&self, b: u64, ring: Ring, len: usize) -> Option<&[u8]> {
        // SAFETY: per the contract.
        unsafe { data_at(self.ring_slot(b, ring), ring.cap(), len) }
    }
}

/// The sequence word of the slot at `slot`.
///
/// # Safety
/// `slot` must be a slot of a live board.
unsafe fn seq_at<'a>(slot: *mut u8) -> &'a AtomicU64 {
    // SAFETY: a slot starts with an 8-byte aligned word.
    unsafe { &*(slot as *const AtomicU64) }
}

/// The shape words and byte count in the header of the slot at `slot`.
///
/// # Safety
/// `slot` must be a slot of a live board.
unsafe fn header_at(slot: *mut u8) -> ([u64; 2], usize) {
    // SAFETY: three 8-byte aligned words after the sequence word, inside
    // the slot; zero is a valid value.
    let h = unsafe { &*(slot.add(8) as *const [AtomicU64; 3]) };
    (
        [h[0].load(Ordering::Relaxed), h[1].load(Ordering::Relaxed)],
        usize::try_from(h[2].load(Ordering::Relaxed)).unwrap_or(usize::MAX),
    )
}

/// Writes `data`, `shape` and its length into the slot at `slot`, which
/// holds `cap` data bytes, then publishes `seq` with `Release`.
///
/// # Safety
/// `slot` must be a slot of a live board that nobody reads now, and
/// `data` at most `cap` (checked).
unsafe fn post_at(slot: *mut u8, cap: usize, seq: u64, shape: [u64; 2], data: &[u8]) {
    assert!(data.len() <= cap, "a slot holds {cap} B");
    // SAFETY: per the contract, nobody reads this slot now; the length was
    // checked above; the header's words follow the sequence word.
    unsafe {
        std::ptr::copy_nonoverlapping(data.as_ptr(), slot.add(SLOT_HEADER), data.len());
        let h = &*(slot.add(8) as *const [AtomicU64; 3]);
        h[0].store(shape[0], Ordering::Relaxed);
        h[1].store(shape[1], Ordering::Relaxed);
        h[2].store(data.len() as u64, Ordering::Relaxed);
        seq_at(slot).store(seq, Ordering::Release);
    }
}

/// The first `len` data bytes of the slot at `slot`, which holds `cap`
/// data bytes; `None` when its owner posted fewer.
///
/// # Safety
/// `slot` must be a posted slot of a live board that its owner does not
/// rewrite while the returned slice lives.
unsafe fn data_at<'a>(slot: *mut u8, cap: usize, len: usize) -> Option<&'a [u8]> {
    // SAFETY: per the contract.
    let (_, posted) = unsafe { header_at(slot) };
    if len > posted.min(cap) {
        return None;
    }
    // SAFETY: per the contract; `len` is within what was posted, inside the
    // slot.
    Some(unsafe { std::slice::from_raw_parts(slot.add(SLOT_HEADER), len) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_alternate_and_publish_their_sequence() {
        let layout = std::alloc::Layout::from_size_align(BOARD, 64).unwrap();
        // SAFETY: a non-zero size.
        let mem = unsafe { std::alloc::alloc_zeroed(layout) };
        assert!(!mem.is_null());
        // SAFETY: a zeroed, 64-byte aligned buffer standing in for the arena.
        let b = unsafe { Board::at(mem) };
        assert!(!b.posted(1));
        // SAFETY: single-threaded test.
        unsafe { b.post(1, [3, 5], b"abc") };
        assert!(b.posted(1));
        assert!(!b.posted(2));
        assert_eq!(b.posted_shape(1), ([3, 5], 3));
        // SAFETY: posted above.
        assert_eq!(unsafe { b.data(1, 3) }, Some(&b"abc"[..]));
        // SAFETY: posted above.
        assert_eq!(unsafe { b.data(1, 4) }, None, "more than was posted");
        // SAFETY: single-threaded test.
        unsafe { b.post(2, [9, 9], &[7u8; FAST_BYTES]) };
        assert_eq!(
            // SAFETY: posted above.
            unsafe { b.data(1, 3) },
            Some(&b"abc"[..]),
            "op 2 uses the other slot"
        );
        assert_eq!(
            // SAFETY: posted above.
            unsafe { b.data(2, FAST_BYTES) }.map(<[u8]>::len),
            Some(FAST_BYTES)
        );
        assert_ne!(b.slot_data(1), b.slot_data(2));
        assert_eq!(b.slot_data(1), b.slot_data(3));
        assert_eq!(b.control().stage.load(Ordering::Relaxed), 0);
        assert_eq!(b.claim().load(Ordering::Relaxed), 0);
        b.done().store(5, Ordering::Relaxed);
        assert_eq!(b.claim().load(Ordering::Relaxed), 0, "separate lines");
        b.extents().send_len.store(11, Ordering::Relaxed);
        assert_eq!(b.control().cpu.load(Ordering::Relaxed), 0);
        assert_eq!(b.claim().load(Ordering::Relaxed), 0);
        assert!(b.slot_seq(1).load(Ordering::Relaxed) == 1 && !b.posted(4));
        // SAFETY: allocated above with this layout.
        unsafe { std::alloc::dealloc(mem, layout) };
    }

    #[test]
    fn the_broadcast_ring_cycles_through_its_slots() {
        let layout = std::alloc::Layout::from_size_align(BOARD, 64).unwrap();
        // SAFETY: a non-zero size.
        let mem = unsafe { std::alloc::alloc_zeroed(layout) };
        assert!(!mem.is_null());
        // SAFETY: a zeroed, 64-byte aligned buffer standing in for the arena.
        let b = unsafe { Board::at(mem) };
        let k = RING_SLOTS as u64;
        for i in 1..=k {
            assert!(!b.ring_posted(i, Ring::Slots));
            assert_eq!(b.call(i), None, "nothing recorded yet");
            b.record_call(i, [i, 100 + i]);
            // SAFETY: single-threaded test.
            unsafe { b.ring_post(i, Ring::Slots, [i, 100 + i], &[i as u8; 5]) };
        }
        for i in 1..=k {
            assert!(b.ring_posted(i, Ring::Slots));
            assert_eq!(b.call(i), Some([i, 100 + i]));
            assert_eq!(b.ring_shape(i, Ring::Slots), ([i, 100 + i], 5));
            assert_eq!(
                // SAFETY: posted above.
                unsafe { b.ring_data(i, Ring::Slots, 5) },
                Some(&[i as u8; 5][..])
            );
            assert_eq!(
                // SAFETY: posted above.
                unsafe { b.ring_data(i, Ring::Slots, 6) },
                None,
                "more than was posted"
            );
        }
        // Broadcast k + 1 reuses the first slot; call entries go on.
        b.record_call(k + 1, [7, 7]);
        // SAFETY: single-threaded test.
        unsafe { b.ring_post(k + 1, Ring::Slots, [7, 7], &[9; FAST_BYTES]) };
        let posted = |i| b.ring_posted(i, Ring::Slots);
        assert!(!posted(1) && posted(k + 1) && posted(2));
        assert_eq!(
            b.call(1),
            Some([1, 101]),
            "call entries are as deep as the lines"
        );
        assert_eq!(b.call(k + 1), Some([7, 7]));
        // The ring lies apart from the exchange slots and the device slots.
        // SAFETY: single-threaded test.
        unsafe { b.post(1, [1, 1], b"x") };
        b.gpu_slot(15).stage.store(3, Ordering::Relaxed);
        b.bcast_mark().store(4, Ordering::Relaxed);
        b.bcast_done().store(3, Ordering::Relaxed);
        assert_eq!(b.ring_shape(k + 1, Ring::Slots), ([7, 7], FAST_BYTES));
        // SAFETY: posted above.
        assert!(unsafe { b.ring_data(k + 1, Ring::Slots, FAST_BYTES) }
            .unwrap()
            .iter()
            .all(|&x| x == 9));
        assert_eq!(b.call(2), Some([2, 102]));
        assert_eq!(b.bcast_mark().load(Ordering::Relaxed), 4);
        // SAFETY: allocated above with this layout.
        unsafe { std::alloc::dealloc(mem, layout) };
    }

    #[test]
    fn broadcast_lines_are_deep_and_apart_from_the_slots() {
        let layout = std::alloc::Layout::from_size_align(BOARD, 64).unwrap();
        // SAFETY: a non-zero size.
        let mem = unsafe { std::alloc::alloc_zeroed(layout) };
        assert!(!mem.is_null());
        // SAFETY: a zeroed, 64-byte aligned buffer standing in for the arena.
        let b = unsafe { Board::at(mem) };
        assert_eq!(Ring::for_bytes(LINE_BYTES), Ring::Lines);
        assert_eq!(Ring::for_bytes(LINE_BYTES + 1), Ring::Slots);
        let k = LINE_SLOTS as u64;
        for i in 1..=k {
            b.record_call(i, [i, 1]);
            // SAFETY: single-threaded test.
            unsafe { b.ring_post(i, Ring::Lines, [i, 1], &i.to_le_bytes()) };
        }
        for i in 1..=k {
            assert!(b.ring_posted(i, Ring::Lines) && !b.ring_posted(i, Ring::Slots));
            assert_eq!(b.call(i), Some([i, 1]));
            assert_eq!(
                // SAFETY: posted above.
                unsafe { b.ring_data(i, Ring::Lines, 8) },
                Some(&i.to_le_bytes()[..])
            );
            // SAFETY: posted above.
            assert_eq!(unsafe { b.ring_data(i, Ring::Lines, 9) }, None);
        }
        // A full line, then the slot ring beside it: neither touches the other.
        // SAFETY: single-threaded test.
        unsafe { b.ring_post(k + 1, Ring::Lines, [0, 2], &[5; LINE_BYTES]) };
        // SAFETY: single-threaded test.
        unsafe { b.ring_post(k + 1, Ring::Slots, [0, 3], &[6; FAST_BYTES]) };
        assert_eq!(b.ring_shape(k + 1, Ring::Lines), ([0, 2], LINE_BYTES));
        assert!(b.ring_posted(2, Ring::Lines) && !b.ring_posted(1, Ring::Lines));
        assert_eq!(
            // SAFETY: posted above.
            unsafe { b.ring_data(k + 1, Ring::Lines, LINE_BYTES) },
            Some(&[5; LINE_BYTES][..])
        );
        let posted = std::panic::catch_unwind(|| {
            // SAFETY: single-threaded test; the post refuses before writing.
            unsafe { b.ring_post(k + 2, Ring::Lines, [0, 2], &[5; LINE_BYTES + 1]) }
        });
        assert!(posted.is_err(), "a line holds LINE_BYTES");
        // SAFETY: allocated above with this layout.
        unsafe { std::alloc::dealloc(mem, layout) };
    }
}
