//! The control socket of a comm: a non-blocking framed channel driven by the
//! caller's thread.
//!
//! Outgoing: a queue of owned byte runs (headers, inline payloads) and
//! borrowed payloads that are written straight from the caller's buffer.
//! Incoming: a staging buffer that frame headers and inline payloads are
//! parsed from, and a "sink" that receives DATA payloads straight into the
//! destination buffer.
//!
//! Frames are *peeked* into the staging buffer (`MSG_PEEK`) and dropped from
//! the kernel's queue only at the start of the comm's next progress pass
//! ([`Ctrl::release`]). Consuming data that empties the queue is what makes
//! the kernel send a pure ACK on a one-way connection; peeking first moves
//! that ACK (and its processing on the peer's socket, which on loopback or
//! veth runs in our thread) after the caller has acted on the message,
//! typically after it has sent its reply, instead of before.
//!
//! That pays only for frames that fit in one segment: a frame larger than
//! a segment is ACKed as it arrives whatever the reader does, and peeking
//! it costs a second system call (and, for a frame still arriving, a pass
//! per piece). So after an inline message larger than the connection's
//! segment size, the channel reads (consumes) instead of peeking, up to
//! one message of that size at a time, until an inline message that fits
//! in a segment comes again: a stream of messages of one size takes one
//! path.

use std::collections::VecDeque;
use std::net::TcpStream;
use std::time::Instant;

use crate::error::{NetError, Result};
use crate::sock::{discard, try_peek, try_read, try_write, try_write2};
use crate::wire::{decode_frame, Frame, FRAME_BYTES};

/// Frames up to this size (header and inline payload) are assembled and
/// written with one `send`, which costs the kernel less than a gathering
/// `sendmsg`.
const SMALL_FRAME: usize = 256;

/// The largest inline payload either side accepts.
pub(crate) const MAX_INLINE: usize = 64 << 10;
const STAGING: usize = 2 * MAX_INLINE + FRAME_BYTES;
/// A control connection carries data one way only, so every small message
/// would cost a pure ACK packet back (the kernel's "quick ACK" mode), where a
/// single two-way socket piggybacks it. Clearing `TCP_QUICKACK` now and then
/// (the kernel turns it back on when a delayed ACK times out) halves those packets; see
/// docs/net-plugin.md.
const QUICKACK_EVERY: u32 = 64;
/// Owned bytes are merged into one run up to this size.
const MERGE_LIMIT: usize = 256 << 10;

enum Out {
    Bytes(Vec<u8>),
    Borrowed { ptr: usize, len: usize, seq: u64 },
}

/// Something that arrived on the control socket.
#[derive(Debug)]
pub(crate) enum InEvent {
    /// A frame; for an inline MSG, [`Ctrl::lend_payload`] has its bytes
    /// until the next read. After a DATA frame the caller must call
    /// [`Ctrl::set_sink`] before reading on.
    Frame(Frame),
    /// The DATA payload of message `seq` has fully arrived in its sink.
    DataDone(u64),
}

struct Sink {
    ptr: usize,
    remaining: usize,
    seq: u64,
}

/// A comm's control channel.
pub(crate) struct Ctrl {
    sock: TcpStream,
    out: VecDeque<Out>,
    out_off: usize,
    out_since: Instant,
    /// A drained output buffer kept for reuse (no allocation per message).
    spare: Vec<u8>,
    staging: Box<[u8]>,
    st_start: usize,
    st_end: usize,
    sink: Option<Sink>,
    sink_since: Instant,
    need_sink: bool,
    /// The last `peeked` staged bytes, from `peek_at`, are still queued in
    /// the kernel (see [`Ctrl::release`]).
    peeked: usize,
    peek_at: usize,
    /// Releases, to clear TCP_QUICKACK every [`QUICKACK_EVERY`] of them.
    reads: u32,
    /// The connection's segment size: inline messages up to it are peeked.
    mss: usize,
    /// The last inline message's size with its header, when larger than
    /// `mss`: reads then consume instead of peeking (see the module docs),
    /// up to one such message at a time; 0 while peeking.
    consume: usize,
    /// A consuming read completed a frame in this pass: as a peek does,
    /// it ends the pass's reading, so that the next message waits in the
    /// kernel until the caller has posted its receive.
    taken: bool,
    /// Where in `staging` the last inline payload [`Ctrl::next_event`]
    /// returned lies: start and length.
    inline: (usize, usize),
}

/// The staging buffer, lent out with the range of the last inline payload
/// ([`Ctrl::lend_payload`]).
pub(crate) struct Lent {
    buf: Box<[u8]>,
    at: usize,
    len: usize,
}

impl Lent {
    /// The inline payload of the MSG frame just returned (empty for other
    /// events).
    pub(crate) fn payload(&self) -> &[u8] {
        &self.buf[self.at..self.at + self.len]
    }
}

/// The segment size assumed when the kernel does not report one (an
/// Ethernet MTU's).
const DEFAULT_MSS: usize = 1448;

impl Ctrl {
    /// Wraps a connected socket and makes it non-blocking.
    pub(crate) fn new(sock: TcpStream, timeout: std::time::Duration) -> Result<Self> {
        crate::sock::set_liveness(&sock, timeout)?;
        sock.set_nonblocking(true)
            .map_err(|e| NetError::io("O_NONBLOCK", &e))?;
        sock.set_nodelay(true)
            .map_err(|e| NetError::io("TCP_NODELAY", &e))?;
        let mss = crate::sock::mss(&sock).unwrap_or(DEFAULT_MSS);
        Ok(Self {
            sock,
            out: VecDeque::new(),
            out_off: 0,
            out_since: Instant::now(),
            spare: Vec::new(),
            staging: vec![0u8; STAGING].into_boxed_slice(),
            st_start: 0,
            st_end: 0,
            sink: None,
            sink_since: Instant::now(),
            need_sink: false,
            peeked: 0,
            peek_at: 0,
            reads: 0,
            mss,
            consume: 0,
            taken: false,
            inline: (0, 0),
        })
    }

    fn note_out_start(&mut self) {
        if self.out.is_empty() {
            self.out_since = Instant::now();
        }
    }

    /// Queues a frame header followed by `payload` (copied).
    pub(crate) fn push_frame(&mut self, f: &Frame, payload: &[u8]) {
        let hdr = crate::wire::encode_frame(f);
        if let Some(Out::Bytes(v)) = self.out.back_mut() {
            if v.len() + hdr.len() + payload.len() <= MERGE_LIMIT {
                v.extend_from_slice(&hdr);
                v.extend_from_slice(payload);
                return;
            }
        }
        self.note_out_start();
        let mut v = std::mem::take(&mut self.spare);
        v.clear();
        v.extend_from_slice(&hdr);
        v.extend_from_slice(payload);
        self.out.push_back(Out::Bytes(v));
    }

    /// Sends a frame header and `payload` now, straight from the caller's
    /// buffer, when nothing else is queued; whatever the socket does not
    /// take (everything, if output is queued) is queued as by
    /// [`Ctrl::push_frame`]. `Ok(true)` when it all went out.
    pub(crate) fn send_frame(&mut self, f: &Frame, payload: &[u8]) -> Result<bool> {
        if !self.out.is_empty() {
            self.push_frame(f, payload);
            return Ok(false);
        }
        let hdr = crate::wire::encode_frame(f);
        let n = if payload.len() <= SMALL_FRAME - hdr.len() {
            let mut buf = [0u8; SMALL_FRAME];
            buf[..hdr.len()].copy_from_slice(&hdr);
            buf[hdr.len()..hdr.len() + payload.len()].copy_from_slice(payload);
            try_write(&mut self.sock, &buf[..hdr.len() + payload.len()])?.unwrap_or(0)
        } else {
            try_write2(&mut self.sock, &hdr, payload)?.unwrap_or(0)
        };
        if n == hdr.len() + payload.len() {
            return Ok(true);
        }
        self.note_out_start();
        let mut v = std::mem::take(&mut self.spare);
        v.clear();
        if n < hdr.len() {
            v.extend_from_slice(&hdr[n..]);
            v.extend_from_slice(payload);
        } else {
            v.extend_from_slice(&payload[n - hdr.len()..]);
        }
        self.out.push_back(Out::Bytes(v));
        Ok(false)
    }

    /// Queues `len` bytes at `ptr`, written without a copy. [`Ctrl::flush`]
    /// reports `seq` once they are all in the kernel.
    ///
    /// # Safety
    /// `ptr..ptr+len` must stay readable until then or until the comm closes.
    pub(crate) unsafe fn push_borrowed(&mut self, ptr: *const u8, len: usize, seq: u64) {
        self.note_out_start();
        self.out.push_back(Out::Borrowed {
            ptr: ptr as usize,
            len,
            seq,
        });
    }

    /// Writes what the socket takes now; appends the seqs of borrowed
    /// payloads that completed to `done`.
    pub(crate) fn flush(&mut self, done: &mut Vec<u64>) -> Result<()> {
        while let Some(front) = self.out.front() {
            let (slice, seq): (&[u8], Option<u64>) = match front {
                Out::Bytes(v) => (&v[self.out_off..], None),
                // SAFETY: push_borrowed's contract keeps the buffer readable.
                Out::Borrowed { ptr, len, seq } => (
                    unsafe {
                        std::slice::from_raw_parts(
                            (*ptr as *const u8).add(self.out_off),
                            len - self.out_off,
                        )
                    },
                    Some(*seq),
                ),
            };
            if slice.is_empty() {
                self.out.pop_front();
                self.out_off = 0;
                done.extend(seq);
                continue;
            }
            let want = slice.len();
            match try_write(&mut self.sock, slice)? {
                None => break,
                Some(n) => {
                    self.out_since = Instant::now();
                    if n == want {
                        if let Some(Out::Bytes(v)) = self.out.pop_front() {
                            if v.capacity() <= MERGE_LIMIT {
                                self.spare = v;
                            }
                        }
                        self.out_off = 0;
                        done.extend(seq);
                    } else {
                        self.out_off += n;
                        break;
                    }
                }
            }
        }
        Ok(())
    }

    /// Whether queued output or an open sink has made no progress for `timeout`.
    pub(crate) fn stalled(&self, timeout: std::time::Duration) -> bool {
        (!self.out.is_empty() && self.out_since.elapsed() > timeout)
            || (self.sink.is_some() && self.sink_since.elapsed() > timeout)
    }

    /// When queued output last moved, or last started queueing.
    pub(crate) fn last_out(&self) -> Instant {
        self.out_since
    }

    /// Whether output is still queued.
    pub(crate) fn has_output(&self) -> bool {
        !self.out.is_empty()
    }

    /// Directs the next `len` incoming bytes (the payload of the DATA frame
    /// just returned) to `ptr`.
    ///
    /// # Safety
    /// `ptr..ptr+len` must stay writable until the matching `DataDone` or
    /// until the comm closes.
    pub(crate) unsafe fn set_sink(&mut self, ptr: *mut u8, len: usize, seq: u64) {
        self.need_sink = false;
        self.sink_since = Instant::now();
        self.sink = Some(Sink {
            ptr: ptr as usize,
            remaining: len,
            seq,
        });
    }

    /// Starts a progress pass: drops what the last one peeked
    /// ([`Ctrl::release`]), and lets reads go on.
    pub(crate) fn start_pass(&mut self) -> Result<()> {
        self.taken = false;
        self.release()
    }

    /// Drops the bytes peeked in an earlier pass from the kernel's queue
    /// (this is when the kernel may send its ACK). Comms call it at the start
    /// of each progress pass; one syscall when there is something to drop.
    pub(crate) fn release(&mut self) -> Result<()> {
        if self.peeked == 0 {
            return Ok(());
        }
        self.reads = self.reads.wrapping_add(1);
        if self.reads % QUICKACK_EVERY == 1 {
            crate::sock::delay_acks(&self.sock);
        }
        let (at, n) = (self.peek_at, self.peeked);
        let got = discard(&self.sock, &mut self.staging[at..at + n])?;
        if got != n {
            return Err(NetError::Internal(format!(
                "dropped {got} of {n} peeked bytes"
            )));
        }
        self.peeked = 0;
        if self.st_start == self.st_end {
            self.st_start = 0;
            self.st_end = 0;
        }
        Ok(())
    }

    /// Ensures `n` staged bytes; `Ok(false)` if they have not arrived yet,
    /// or, while peeking, if more would need reading while peeked bytes
    /// still await [`Ctrl::release`] (the next pass reads on).
    fn fill(&mut self, n: usize) -> Result<bool> {
        debug_assert!(n <= STAGING);
        if self.st_end - self.st_start >= n {
            return Ok(true);
        }
        if self.peeked > 0 {
            if self.consume == 0 {
                return Ok(false);
            }
            self.release()?;
        }
        if self.taken && self.consume > 0 {
            return Ok(false);
        }
        // Consuming, read up to one message of the last size: what follows
        // stays queued in the kernel, as a peek would leave it.
        let want = n.max(self.consume.min(STAGING));
        if self.st_start + want > STAGING {
            self.staging.copy_within(self.st_start..self.st_end, 0);
            self.st_end -= self.st_start;
            self.st_start = 0;
        }
        while self.st_end - self.st_start < n {
            let at = self.st_end;
            if self.consume > 0 {
                let end = self.st_start + want;
                match try_read(&mut self.sock, &mut self.staging[at..end])? {
                    None => return Ok(false),
                    Some(k) => self.st_end += k,
                }
                self.taken = self.st_end - self.st_start >= n;
                continue;
            }
            match try_peek(&self.sock, &mut self.staging[at..])? {
                None => return Ok(false),
                Some(k) => {
                    self.st_end += k;
                    (self.peek_at, self.peeked) = (at, k);
                    if self.st_end - self.st_start < n {
                        // A partial frame: take it and read on now.
                        self.release()?;
                    }
                }
            }
        }
        Ok(true)
    }

    /// Returns the next event, or `None` when nothing more has arrived. An
    /// inline payload stays in the staging buffer, where
    /// [`Ctrl::lend_payload`] finds it until the next read: it is not
    /// copied on its way to the caller's buffer.
    pub(crate) fn next_event(&mut self, max_inline: usize) -> Result<Option<InEvent>> {
        self.inline = (0, 0);
        if self.need_sink {
            return Err(NetError::Internal("DATA frame without a sink".into()));
        }
        if let Some(sink) = self.sink.as_mut() {
            let staged = (self.st_end - self.st_start).min(sink.remaining);
            if staged > 0 {
                // SAFETY: set_sink's contract; the ranges do not overlap.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        self.staging[self.st_start..].as_ptr(),
                        sink.ptr as *mut u8,
                        staged,
                    )
                };
                self.st_start += staged;
                sink.ptr += staged;
                sink.remaining -= staged;
            }
            if sink.remaining > 0 && self.peeked > 0 {
                // The payload follows the peeked bytes in the kernel's queue.
                self.release()?;
            }
            let Some(sink) = self.sink.as_mut() else {
                return Err(NetError::Internal("sink vanished".into()));
            };
            while sink.remaining > 0 {
                // SAFETY: set_sink's contract.
                let dst =
                    unsafe { std::slice::from_raw_parts_mut(sink.ptr as *mut u8, sink.remaining) };
                match try_read(&mut self.sock, dst)? {
                    None => return Ok(None),
                    Some(k) => {
                        self.sink_since = Instant::now();
                        sink.ptr += k;
                        sink.remaining -= k;
                    }
                }
            }
            let seq = sink.seq;
            self.sink = None;
            return Ok(Some(InEvent::DataDone(seq)));
        }
        if !self.fill(FRAME_BYTES)? {
            return Ok(None);
        }
        let hdr: &[u8; FRAME_BYTES] = self.staging[self.st_start..self.st_start + FRAME_BYTES]
            .try_into()
            .expect("frame bytes");
        let frame = decode_frame(hdr)?;
        match frame {
            Frame::Msg {
                size, inline: true, ..
            } => {
                let size = usize::try_from(size).unwrap_or(usize::MAX);
                if size > max_inline.min(MAX_INLINE) {
                    return Err(NetError::proto(format!("inline payload of {size} bytes")));
                }
                let whole = FRAME_BYTES + size;
                self.consume = if whole > self.mss { whole } else { 0 };
                if !self.fill(FRAME_BYTES + size)? {
                    return Ok(None);
                }
                self.inline = (self.st_start + FRAME_BYTES, size);
                self.st_start += size;
            }
            Frame::Data { len: 0, .. } => return Err(NetError::proto("empty DATA frame")),
            Frame::Data { .. } => self.need_sink = true,
            _ => {}
        }
        self.st_start += FRAME_BYTES;
        if self.st_start == self.st_end && self.peeked == 0 {
            self.st_start = 0;
            self.st_end = 0;
        }
        Ok(Some(InEvent::Frame(frame)))
    }

    /// The inline payload of the MSG frame [`Ctrl::next_event`] just
    /// returned (empty after other events).
    #[cfg(test)]
    pub(crate) fn inline_payload(&self) -> &[u8] {
        let (at, len) = self.inline;
        &self.staging[at..at + len]
    }

    /// Lends the staging buffer out with the last inline payload, so that
    /// the caller can handle it while it changes the rest of its state;
    /// [`Ctrl::restore`] must hand it back before the next read (a read
    /// without it panics on the empty buffer left in its place).
    pub(crate) fn lend_payload(&mut self) -> Lent {
        let (at, len) = self.inline;
        Lent {
            buf: std::mem::take(&mut self.staging),
            at,
            len,
        }
    }

    /// Takes back what [`Ctrl::lend_payload`] lent.
    pub(crate) fn restore(&mut self, lent: Lent) {
        self.staging = lent.buf;
    }

    /// Drops what was peeked, and writes queued output until `deadline`:
    /// the first step of a graceful close. `Ok(true)` when nothing is left
    /// queued.
    pub(crate) fn settle(&mut self, deadline: Instant) -> Result<bool> {
        self.release()?;
        let mut done = Vec::new();
        loop {
            self.flush(&mut done)?;
            if self.out.is_empty() {
                return Ok(true);
            }
            if Instant::now() >= deadline {
                return Ok(false);
            }
            std::thread::sleep(std::time::Duration::from_micros(100));
        }
    }

    /// The socket in `poll(2)` terms: readable when `read` (a frame or
    /// payload the caller waits for), writable while output is queued.
    pub(crate) fn pollfd(&self, read: bool) -> libc::pollfd {
        let mut events = 0;
        if read {
            events |= libc::POLLIN;
        }
        if !self.out.is_empty() {
            events |= libc::POLLOUT;
        }
        libc::pollfd {
            fd: std::os::fd::AsRawFd::as_raw_fd(&self.sock),
            events,
            revents: 0,
        }
    }

    /// The socket (for a graceful close).
    pub(crate) fn sock(&self) -> &TcpStream {
        &self.sock
    }

    /// Shuts the socket down both ways (wakes nothing; the channel is polled).
    pub(crate) fn shutdown(&self) {
        let _ = self.sock.shutdown(std::net::Shutdown::Both);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::net::TcpListener;
    use std::time::Duration;

    /// Frames sent straight from the caller's buffer while the peer is not
    /// reading: once the socket is full they queue (also after a partial
    /// write), and all arrive whole and in order.
    #[test]
    fn direct_sends_fall_back_to_the_queue() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let w = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let t = Duration::from_secs(30);
        let mut r = Ctrl::new(l.accept().unwrap().0, t).unwrap();
        let mut w = Ctrl::new(w, t).unwrap();
        let n = 20_000u64; // 20 MB: more than both socket buffers hold
        let body = |i: u64| vec![(i % 251) as u8; 1000 + (i % 7) as usize];
        let mut direct = 0;
        for i in 0..n {
            let b = body(i);
            let f = Frame::Msg {
                tag: 1,
                seq: i,
                size: b.len() as u64,
                inline: true,
            };
            direct += usize::from(w.send_frame(&f, &b).unwrap());
        }
        assert!(
            direct > 0 && direct < n as usize,
            "{direct} of {n} sent at once"
        );
        let mut got = 0;
        let t0 = Instant::now();
        while got < n {
            assert!(t0.elapsed() < t, "stuck at {got}");
            w.flush(&mut Vec::new()).unwrap();
            r.release().unwrap();
            while let Some(ev) = r.next_event(MAX_INLINE).unwrap() {
                let InEvent::Frame(Frame::Msg { seq, .. }) = ev else {
                    panic!("unexpected {ev:?}");
                };
                assert_eq!((seq, r.inline_payload()), (got, &body(got)[..]));
                got += 1;
            }
        }
        assert!(!w.has_output());
    }

    /// A plain loopback socket (the writer, no delay) and a `Ctrl` on its
    /// peer.
    fn raw_writer_and_ctrl() -> (TcpStream, Ctrl) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let w = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        w.set_nodelay(true).unwrap();
        let c = Ctrl::new(l.accept().unwrap().0, Duration::from_secs(30)).unwrap();
        (w, c)
    }

    /// Frames dribbled in odd-sized pieces, and then all at once, come out
    /// whole and in order through peeking, releasing and a sink.
    #[test]
    fn peeked_frames_split_anywhere() {
        let (mut w, mut c) = raw_writer_and_ctrl();
        let data: Vec<u8> = (0..1000u32).map(|i| (i * 7) as u8).collect();
        let mut bytes = Vec::new();
        for round in 0..2u64 {
            let s = round * 3;
            let msg = |seq| Frame::Msg {
                tag: 5,
                seq,
                size: 8,
                inline: true,
            };
            bytes.extend_from_slice(&crate::wire::encode_frame(&msg(s)));
            bytes.extend_from_slice(&s.to_le_bytes());
            bytes.extend_from_slice(&crate::wire::encode_frame(&Frame::Data {
                seq: s + 1,
                len: data.len() as u64,
            }));
            bytes.extend_from_slice(&data);
            bytes.extend_from_slice(&crate::wire::encode_frame(&msg(s + 2)));
            bytes.extend_from_slice(&(s + 2).to_le_bytes());
        }
        let half = bytes.len() / 2;
        let writer = std::thread::spawn(move || {
            for piece in bytes[..half].chunks(7) {
                w.write_all(piece).unwrap();
                std::thread::sleep(Duration::from_micros(300));
            }
            w.write_all(&bytes[half..]).unwrap();
            w
        });
        let mut sink = vec![0u8; 1000];
        let mut seen = Vec::new();
        let t0 = Instant::now();
        while seen.len() < 6 {
            assert!(
                t0.elapsed() < Duration::from_secs(30),
                "stuck after {seen:?}"
            );
            c.release().unwrap();
            while let Some(ev) = c.next_event(MAX_INLINE).unwrap() {
                match ev {
                    InEvent::Frame(Frame::Msg { seq, .. }) => {
                        assert_eq!(c.inline_payload(), seq.to_le_bytes());
                        seen.push(seq);
                    }
                    InEvent::Frame(Frame::Data { seq, len }) => {
                        assert_eq!(len, 1000);
                        sink.fill(0);
                        // SAFETY: `sink` outlives the DataDone below.
                        unsafe { c.set_sink(sink.as_mut_ptr(), 1000, seq) };
                    }
                    InEvent::DataDone(seq) => {
                        assert_eq!(sink, data);
                        seen.push(seq);
                    }
                    other => panic!("unexpected {other:?}"),
                }
            }
        }
        assert_eq!(seen, [0, 1, 2, 3, 4, 5]);
        // Everything peeked has been dropped from the kernel's queue.
        c.release().unwrap();
        let mut w = writer.join().unwrap();
        w.write_all(&[0xEE; 3]).unwrap();
        let mut got = [0u8; 8];
        let t0 = Instant::now();
        while crate::sock::try_peek(&c.sock, &mut got).unwrap() != Some(3) {
            assert!(t0.elapsed() < Duration::from_secs(30));
        }
        assert_eq!(got[..3], [0xEE; 3]);
    }

    /// After an inline message larger than a segment, the next ones are
    /// read (consumed), not peeked, whether they arrive in pieces or whole;
    /// a small one brings peeking back; and a consuming pass takes one
    /// message, leaving the next queued in the kernel until the next pass.
    #[test]
    fn large_inline_frames_are_consumed_one_per_pass() {
        let (mut w, mut c) = raw_writer_and_ctrl();
        c.mss = 1000; // loopback's segments are 64 KiB
        let sizes = [8usize, 3000, 2999, 8, 5000, 4000, 3500, 3500, 7];
        let body = |i: usize| -> Vec<u8> { (0..sizes[i]).map(|k| (k * 3 + i) as u8).collect() };
        let frame = |i: usize| {
            let mut b = crate::wire::encode_frame(&Frame::Msg {
                tag: 9,
                seq: i as u64,
                size: sizes[i] as u64,
                inline: true,
            })
            .to_vec();
            b.extend_from_slice(&body(i));
            b
        };
        // Messages 0..6 dribble in 7-byte pieces.
        let dribbled: Vec<u8> = (0..6).flat_map(frame).collect();
        let writer = std::thread::spawn(move || {
            for piece in dribbled.chunks(7) {
                w.write_all(piece).unwrap();
                std::thread::sleep(Duration::from_micros(100));
            }
            w
        });
        let mut next = 0;
        let t0 = Instant::now();
        let pass = |c: &mut Ctrl, next: &mut usize| {
            c.start_pass().unwrap();
            let mut got = 0;
            while let Some(ev) = c.next_event(MAX_INLINE).unwrap() {
                let InEvent::Frame(Frame::Msg { seq, .. }) = ev else {
                    panic!("unexpected {ev:?}");
                };
                assert_eq!(
                    (seq as usize, c.inline_payload()),
                    (*next, &body(*next)[..])
                );
                let large = |i: usize| FRAME_BYTES + sizes[i] > 1000;
                assert_eq!(c.consume > 0, large(*next), "message {next}");
                if *next > 0 && large(*next) && large(*next - 1) {
                    assert_eq!(c.peeked, 0, "message {next} was peeked");
                }
                *next += 1;
                got += 1;
            }
            got
        };
        while next < 6 {
            assert!(t0.elapsed() < Duration::from_secs(30), "stuck at {next}");
            pass(&mut c, &mut next);
        }
        // Messages 6..9 arrive whole: one pass each.
        let mut w = writer.join().unwrap();
        let whole: Vec<u8> = (6..9).flat_map(frame).collect();
        w.write_all(&whole).unwrap();
        let mut probe = vec![0u8; whole.len()];
        while crate::sock::try_peek(&c.sock, &mut probe).unwrap() != Some(whole.len()) {
            assert!(t0.elapsed() < Duration::from_secs(30));
        }
        assert_eq!(pass(&mut c, &mut next), 1);
        assert_eq!(pass(&mut c, &mut next), 1);
        assert_eq!(pass(&mut c, &mut next), 1);
        assert_eq!(next, 9);
        assert_eq!(c.consume, 0, "a small message brings peeking back");
    }
}
