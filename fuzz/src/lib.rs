//! Fuzz targets for every hetccl decoder that is reachable without a
//! network peer. Each `pub fn` takes the raw fuzz input, must never panic,
//! crash or hang on any input, and checks what it can about the result
//! (round trips, bounds). The same functions are driven three ways:
//!
//! - by libFuzzer, through `fuzz_targets/<name>.rs` (`cargo fuzz run <name>`,
//!   see `scripts/fuzz.sh`);
//! - by `tests/replay.rs`, which feeds every file of `seeds/<name>/`, every
//!   file of `corpus/<name>/` and `artifacts/<name>/` if present, and a few
//!   thousand pseudo-random and mutated inputs to each (plain `cargo test`,
//!   works on stable Rust without libFuzzer's instrumentation);
//! - by [`run`], from anything else that links this crate.
//!
//! The decoders: the unique id (`bootstrap::id`), a rank's card and the
//! card table (`bootstrap::card`), bootstrap frames read from a socket
//! (`bootstrap::frame::recv`), the acceptor's side of authentication
//! (`bootstrap::auth::verify`), the `ncclConfig_t` and `ncclCollConfig_t`
//! readers (`api::config_read`), and the net plugin's connect handle, hello
//! and frame header (`nccl_net_plugin::wire`), the tuner plugin's
//! tuning table (`nccl_net_plugin::tuner::table`), the engine's tuning
//! table and rank-0 messages (`hetccl_collectives::tune::{table, agree}`),
//! the packs of coalesced point-to-point messages (`transport::pack`),
//! and the verbs sender's checks on its control area (`ib::send_check`).

use std::io::Write;
use std::mem::offset_of;
use std::net::{Shutdown, TcpStream};
use std::os::unix::io::{FromRawFd, IntoRawFd};
use std::os::unix::net::UnixStream;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use hetccl_abi::{ncclCollConfig_t, ncclConfig_t, ncclUniqueId};
use hetccl_collectives::api::config_read::{read_coll_config, read_comm_config};
use hetccl_collectives::bootstrap::card::{self, Card, CARD_BYTES};
use hetccl_collectives::bootstrap::id::UniqueId;
use hetccl_collectives::bootstrap::{self, auth, frame, root};
use nccl_net_plugin::wire;

/// The names of all targets, as `fuzz_targets/` and `seeds/` name them.
pub const TARGETS: [&str; 17] = [
    "unique_id",
    "card",
    "card_table",
    "frame_recv",
    "auth_verify",
    "comm_config",
    "coll_config",
    "net_handle",
    "net_hello",
    "net_frame",
    "boot_hello",
    "tuning_table",
    "engine_tuning_table",
    "tune_messages",
    "pack",
    "ib_sender",
    "ib_setup_frame",
];

/// Runs target `name` on `data`; false for an unknown name.
pub fn run(name: &str, data: &[u8]) -> bool {
    match name {
        "unique_id" => unique_id(data),
        "card" => card(data),
        "card_table" => card_table(data),
        "frame_recv" => frame_recv(data),
        "auth_verify" => auth_verify(data),
        "comm_config" => comm_config(data),
        "coll_config" => coll_config(data),
        "net_handle" => net_handle(data),
        "net_hello" => net_hello(data),
        "net_frame" => net_frame(data),
        "boot_hello" => boot_hello(data),
        "tuning_table" => tuning_table(data),
        "engine_tuning_table" => engine_tuning_table(data),
        "tune_messages" => tune_messages(data),
        "pack" => pack(data),
        "ib_sender" => ib_sender(data),
        "ib_setup_frame" => ib_setup_frame(data),
        _ => return false,
    }
    true
}

/// The two bootstrap hellos: `bootstrap::parse_hello` (rank to rank) and
/// `root::parse_root_hello` (rank to root) on the fuzz bytes. A peer hello
/// that parses re-encodes to the same bytes; a root hello that parses holds
/// a card that re-encodes and decodes to itself.
pub fn boot_hello(data: &[u8]) {
    if let Ok((purpose, rank)) = bootstrap::parse_hello(data) {
        assert_eq!(bootstrap::hello(purpose, rank), data);
    }
    if let Ok(c) = root::parse_root_hello(data) {
        let again = Card::decode(&c.encode()).expect("an encoded card decodes");
        assert_eq!(again, c);
    }
}

/// `data` as a fixed-size array: truncated, or padded with zeros.
fn fixed<const N: usize>(data: &[u8]) -> [u8; N] {
    let mut b = [0u8; N];
    let n = data.len().min(N);
    b[..n].copy_from_slice(&data[..n]);
    b
}

// ------------------------------------------------------------ bootstrap

/// `UniqueId::decode` on 128 bytes; a decoded id re-encodes to an id that
/// decodes to the same value.
pub fn unique_id(data: &[u8]) {
    let raw = ncclUniqueId {
        internal: fixed(data),
    };
    if let Ok(id) = UniqueId::decode(&raw) {
        let again = UniqueId::decode(&id.encode()).expect("re-encoded id decodes");
        assert_eq!(again, id);
        assert_ne!(id.root.port(), 0);
    }
}

/// `Card::decode` on input of any length; a decoded card round-trips.
pub fn card(data: &[u8]) {
    if let Ok(c) = Card::decode(data) {
        assert_eq!(data.len(), CARD_BYTES);
        assert!(c.rank < c.nranks);
        assert_eq!(Card::decode(&c.encode()).expect("round trip"), c);
    }
}

/// `decode_table` with `nranks` from the first two bytes (the rest is the
/// table); a decoded table has `nranks` cards in rank order and its
/// re-encoding decodes to the same cards.
pub fn card_table(data: &[u8]) {
    if data.len() < 2 {
        return;
    }
    let nranks = usize::from(u16::from_le_bytes([data[0], data[1]]));
    let table = &data[2..];
    if let Ok(cards) = card::decode_table(table, nranks) {
        assert_eq!(cards.len(), nranks);
        for (i, c) in cards.iter().enumerate() {
            assert_eq!(c.rank as usize, i);
        }
        // Not byte-exact: the card format has padding the decoder ignores
        // (byte 31, and bytes 36..48 of an IPv4 card).
        let again = card::decode_table(&card::encode_table(&cards), nranks).expect("round trip");
        assert_eq!(again, cards);
    }
}

/// A connected pair of stream sockets (client, server) for the decoders
/// that read from a `TcpStream`: a Unix socketpair wrapped as `TcpStream`s.
/// `read`, `write`, `shutdown` and the `SO_RCVTIMEO`/`SO_SNDTIMEO` timeouts
/// the bootstrap uses behave the same on it, and unlike loopback TCP it
/// leaves no TIME_WAIT ports behind at thousands of executions a second.
fn tcp_pair() -> (TcpStream, TcpStream) {
    let (a, b) = UnixStream::pair().expect("socketpair");
    // SAFETY: each fd is owned by exactly one stream from here on.
    unsafe {
        (
            TcpStream::from_raw_fd(a.into_raw_fd()),
            TcpStream::from_raw_fd(b.into_raw_fd()),
        )
    }
}

/// `frame::recv` reading the fuzz bytes from a socket. The first byte picks
/// the bound `max`; the rest is what the peer sent, then it closes its side.
/// A received frame must be the prefix the length announced, within `max`.
pub fn frame_recv(data: &[u8]) {
    let Some((&sel, wire_bytes)) = data.split_first() else {
        return;
    };
    let max = [0, 1, 7, 48, 256, 4096, frame::MAX_FRAME, usize::MAX][usize::from(sel % 8)];
    let (mut c, mut s) = tcp_pair();
    // Inputs are small (libFuzzer's -max_len), so they fit the socket
    // buffer: write all, then close, then read.
    c.write_all(wire_bytes).expect("write to loopback");
    c.shutdown(Shutdown::Write).expect("shutdown");
    let dl = Instant::now() + Duration::from_secs(2);
    let t0 = Instant::now();
    let r = frame::recv(&mut s, max, dl);
    assert!(
        t0.elapsed() < Duration::from_millis(1500),
        "recv waited for the deadline although the peer had closed"
    );
    if let Ok(payload) = r {
        let len = u32::from_be_bytes(fixed(wire_bytes)) as usize;
        assert_eq!(payload.len(), len);
        assert!(len <= max.min(frame::MAX_FRAME));
        assert_eq!(&payload[..], &wire_bytes[4..4 + len]);
    }
}

/// `auth::verify` against the fuzz bytes. First byte even: the bytes are the
/// peer's raw answer (a forged tag and hello), which must be refused unless
/// it is a correct HMAC (it never is). First byte odd: an honest peer runs
/// `auth::prove` with the rest as its hello, which must come out intact
/// (or be refused if longer than `MAX_HELLO`).
pub fn auth_verify(data: &[u8]) {
    let Some((&sel, rest)) = data.split_first() else {
        return;
    };
    let secret = b"fuzz-secret-0123456789abcdef0123";
    let (mut c, mut s) = tcp_pair();
    let dl = Instant::now() + Duration::from_secs(2);
    if sel & 1 == 0 {
        c.write_all(rest).expect("write to loopback");
        c.shutdown(Shutdown::Write).expect("shutdown");
        let r = auth::verify(&mut s, secret, dl);
        assert!(r.is_err(), "a forged answer was accepted");
    } else {
        let hello = rest.to_vec();
        let h = std::thread::spawn(move || {
            let r = auth::prove(&mut c, secret, &hello, dl);
            drop(c);
            r
        });
        let r = auth::verify(&mut s, secret, dl);
        let _ = h.join().expect("prover thread");
        match r {
            Ok(h) => assert_eq!(h, rest),
            Err(_) => assert!(rest.len() > auth::MAX_HELLO, "an honest hello was refused"),
        }
    }
}

// ------------------------------------------------------------ config structs

/// The strings a fuzzed pointer field may point to (selected by the fuzz
/// byte at the field), so that no fuzzed value is ever dereferenced:
/// NULL, "", a name, a NUL-terminated string longer than the reader's 4096
/// limit, and 4096 bytes without a NUL (the reader's strnlen stops there).
fn string_choices() -> &'static [usize; 5] {
    static S: OnceLock<[usize; 5]> = OnceLock::new();
    S.get_or_init(|| {
        let leak = |v: Vec<u8>| Box::leak(v.into_boxed_slice()).as_ptr() as usize;
        let mut long = vec![b'a'; 5000];
        long.push(0);
        [
            0,
            leak(vec![0]),
            leak(b"hetccl\0".to_vec()),
            leak(long),
            leak(vec![b'b'; 4096]),
        ]
    })
}

/// Largest `size` the readers accept (`config_read::MAX_SIZE`, 64 KiB).
const READER_MAX_SIZE: usize = 64 * 1024;

/// Builds the struct memory for the config readers: an 8-aligned,
/// zero-filled buffer of READER_MAX_SIZE + 64 bytes with the fuzz bytes at
/// its start, and every pointer field (at `ptr_offsets`) replaced by one of
/// [`string_choices`].
///
/// Why no read can go out of bounds: the readers read the 16-byte header,
/// refuse any `size` above 64 KiB, and read only fields that end within
/// `size`; the buffer holds 64 KiB + 64 bytes whatever `size` says. The only
/// pointers they follow are the string fields, which point to our strings.
fn config_buffer(data: &[u8], ptr_offsets: &[usize]) -> Vec<u64> {
    let mut buf = vec![0u64; (READER_MAX_SIZE + 64) / 8];
    // SAFETY: the u64 buffer viewed as bytes.
    let bytes =
        unsafe { std::slice::from_raw_parts_mut(buf.as_mut_ptr() as *mut u8, buf.len() * 8) };
    let n = data.len().min(bytes.len());
    bytes[..n].copy_from_slice(&data[..n]);
    let choices = string_choices();
    for &off in ptr_offsets {
        let sel = usize::from(bytes[off]) % choices.len();
        bytes[off..off + 8].copy_from_slice(&choices[sel].to_ne_bytes());
    }
    buf
}

/// `read_comm_config` on fuzzed struct memory (see [`config_buffer`]).
pub fn comm_config(data: &[u8]) {
    let buf = config_buffer(
        data,
        &[
            offset_of!(ncclConfig_t, netName),
            offset_of!(ncclConfig_t, commName),
        ],
    );
    // SAFETY: see config_buffer: every read the reader may make is inside
    // the buffer or one of our strings.
    if let Ok(c) = unsafe { read_comm_config(buf.as_ptr() as *const ncclConfig_t) } {
        assert!(c.header_version >= 21400);
        for s in [&c.net_name, &c.comm_name].into_iter().flatten() {
            assert!(s.len() < 4096);
        }
    }
}

/// `read_coll_config` on fuzzed struct memory (see [`config_buffer`]).
pub fn coll_config(data: &[u8]) {
    let buf = config_buffer(
        data,
        &[
            offset_of!(ncclCollConfig_t, ext),
            offset_of!(ncclCollConfig_t, algSelection),
            offset_of!(ncclCollConfig_t, launchCompletionEvent),
        ],
    );
    // SAFETY: as in comm_config.
    if let Ok(c) = unsafe { read_coll_config(buf.as_ptr() as *const ncclCollConfig_t) } {
        if let Some(s) = &c.alg_selection {
            assert!(!s.is_empty() && s.len() < 4096);
        }
    }
}

// ------------------------------------------------------------ net plugin wire

/// `wire::decode_handle` on 128 bytes; a decoded handle re-encodes to one
/// that decodes to the same value; the token accessors round-trip.
pub fn net_handle(data: &[u8]) {
    let mut h: [u8; wire::HANDLE_BYTES] = fixed(data);
    if let Ok(info) = wire::decode_handle(&h) {
        let mut out = [0u8; wire::HANDLE_BYTES];
        wire::encode_handle(&info, &mut out);
        assert_eq!(wire::decode_handle(&out).expect("round trip"), info);
        assert_ne!(info.addr.port(), 0);
    }
    let t = wire::handle_token(&h);
    wire::set_handle_token(&mut h, t.rotate_left(7));
    assert_eq!(wire::handle_token(&h), t.rotate_left(7));
}

/// `wire::decode_hello` on 32 bytes; a decoded hello round-trips exactly.
pub fn net_hello(data: &[u8]) {
    let b: [u8; wire::HELLO_BYTES] = fixed(data);
    if let Ok(h) = wire::decode_hello(&b) {
        assert!(usize::from(h.nsocks) <= wire::MAX_SOCKS);
        assert_eq!(
            wire::decode_hello(&wire::encode_hello(&h)).expect("round trip"),
            h
        );
    }
}

/// `wire::decode_frame` on 24 bytes; a decoded frame re-encodes to the very
/// same bytes (the format has no slack).
pub fn net_frame(data: &[u8]) {
    let b: [u8; wire::FRAME_BYTES] = fixed(data);
    if let Ok(f) = wire::decode_frame(&b) {
        assert_eq!(wire::encode_frame(&f), b, "{f:?}");
    }
}

/// The verbs sender's checks on its control area
/// (`nccl_net_plugin::ib::send_check`): bytes 0..64 are a CTS slot as a
/// receiver wrote it; then, little-endian u64s: the entry wanted, the
/// message's size and bytes covered, a flags byte (posted, finished,
/// registered), and a credit counter, the credits returned and used. A
/// taken piece starts where the last ended and lies inside the message
/// (inside a bounce chunk when unregistered); taken credits never exceed
/// those used.
pub fn ib_sender(data: &[u8]) {
    use nccl_net_plugin::ib::proto::{CTS_BYTES, CTS_REJECT};
    use nccl_net_plugin::ib::send_check::{credits, cts, MsgState};
    const CHUNK: usize = 1 << 20;
    const EAGER: usize = 8192;
    let b: [u8; CTS_BYTES + 57] = fixed(data);
    let u = |i: usize| {
        let o = CTS_BYTES + 8 * i + usize::from(i >= 3);
        u64::from_le_bytes(b[o..o + 8].try_into().expect("8"))
    };
    let raw: [u8; CTS_BYTES] = b[..CTS_BYTES].try_into().expect("64");
    let (want, size) = (u(0), u(1) % (1 << 41));
    let covered = u(2) % (size + 1);
    let f = b[CTS_BYTES + 24];
    let st = MsgState {
        size,
        rendezvous: size > EAGER as u64 || f & 16 != 0,
        posted: f & 1 != 0,
        finished: f & 2 != 0,
        covered,
        registered: f & 4 != 0,
    };
    if let Ok(Some(c)) = cts(&raw, want, CHUNK, |_| (f & 8 == 0).then_some(st)) {
        assert_eq!(c.seq, want);
        assert!(st.posted && !st.finished && st.rendezvous, "{c:?} {st:?}");
        if c.flags & CTS_REJECT == 0 {
            assert!(c.offset == covered && c.len > 0, "{c:?} {st:?}");
            assert!(
                c.offset.checked_add(c.len).is_some_and(|e| e <= size),
                "{c:?}"
            );
            assert!(st.registered || c.len <= CHUNK as u64, "{c:?}");
        }
    }
    let (a, returned, used) = (u(3), u(4), u(5));
    if let Ok(Some(n)) = credits(0, a, a, returned, used) {
        assert!(n > returned && n <= used);
    }
}

// ------------------------------------------------------------ engine wire

/// `transport::pack::decode` on the fuzz bytes after the first, which picks
/// the pack and per-message limits. A decoded pack holds non-empty
/// sub-messages within the limits that tile the bytes after the header and
/// lengths, in order, and re-encodes to the very same bytes; its header's
/// stated length is the pack's.
pub fn pack(data: &[u8]) {
    use hetccl_collectives::transport::pack;
    let Some((&sel, b)) = data.split_first() else {
        return;
    };
    let max_pack = [16, 64, 1024, 65536, usize::MAX][usize::from(sel % 5)];
    let max_part = [1, 8, 128, usize::MAX][usize::from(sel / 5 % 4)];
    let Ok(parts) = pack::decode(b, max_pack, max_part) else {
        return;
    };
    assert!(!parts.is_empty() && b.len() <= max_pack);
    assert_eq!(pack::stated_len(b, max_pack), Ok(b.len()));
    let mut at = pack::HEADER + 4 * parts.len();
    for r in &parts {
        assert!(r.start == at && !r.is_empty() && r.len() <= max_part);
        at = r.end;
    }
    assert_eq!(at, b.len());
    let slices: Vec<&[u8]> = parts.iter().map(|r| &b[r.clone()]).collect();
    let mut again = Vec::new();
    pack::encode(&slices, &mut again);
    assert_eq!(again, b);
}

// ------------------------------------------------------------ tuner

/// `Table::parse` on the fuzz bytes. A table that parses has distinct
/// layouts with valid counts and sorted, non-overlapping ranges, and
/// applying each entry to a cost table of NCCL's shape never writes a
/// -1.0 cell and makes the entry's pair win whenever it was usable.
pub fn tuning_table(data: &[u8]) {
    use nccl_net_plugin::tuner::{cost, table::Table};
    let Ok(t) = Table::parse(data) else {
        return;
    };
    for (i, l) in t.layouts.iter().enumerate() {
        assert!(1 <= l.nnodes && l.nnodes <= l.nranks);
        assert!(t.layouts[..i]
            .iter()
            .all(|o| (o.nranks, o.nnodes) != (l.nranks, l.nnodes)));
        for w in l.entries.windows(2) {
            assert!((w[0].collective, w[0].min_bytes) <= (w[1].collective, w[1].min_bytes));
            assert!(w[0].collective != w[1].collective || w[0].max_bytes < w[1].min_bytes);
        }
        for e in &l.entries {
            assert!(e.min_bytes <= e.max_bytes && e.algo < 7 && e.proto < 3);
            assert_eq!(l.lookup(e.collective, e.min_bytes), Some(e));
            let mut cells = [-1.0_f32; 21];
            for (k, c) in cells.iter_mut().enumerate() {
                if k % 4 != 1 {
                    *c = (k as f32 * 7.0) % 11.0;
                }
            }
            let before = cells;
            let usable = before[e.algo * 3 + e.proto] >= 0.0;
            cost::prefer(&mut cells, 3, e.algo, e.proto);
            for k in 0..21 {
                if before[k] < 0.0 {
                    assert_eq!(cells[k].to_bits(), before[k].to_bits());
                }
            }
            assert_eq!(usable, cost::winner(&cells, 3) == Some((e.algo, e.proto)));
        }
    }
}

// ------------------------------------------------------------ engine tuning

/// The engine's `tune::table::Table::parse` on the fuzz bytes. A table
/// that parses has valid layouts and strictly ascending points, every
/// entry interpolates to a finite positive time inside its range and to
/// nothing outside, and each layout round-trips through its JSON.
pub fn engine_tuning_table(data: &[u8]) {
    use hetccl_collectives::tune::table::Table;
    let Ok(t) = Table::parse(data) else {
        return;
    };
    for l in &t.layouts {
        assert!(1 <= l.nnodes && l.nnodes <= l.nranks);
        for e in &l.entries {
            assert!(!e.points.is_empty());
            assert!(e.points.windows(2).all(|w| w[0].0 < w[1].0));
            let (lo, hi) = (e.points[0].0, e.points[e.points.len() - 1].0);
            assert_eq!(e.time_at(lo - 1), None);
            assert_eq!(
                e.time_at(hi.saturating_add(1)),
                (hi == u64::MAX).then(|| e.points[e.points.len() - 1].1)
            );
            for b in [lo, lo + (hi - lo) / 3, hi] {
                let t = e.time_at(b).expect("inside the curve");
                assert!(t.is_finite() && t > 0.0);
            }
        }
        let again = Table::parse(l.to_json().as_bytes()).expect("a layout's JSON parses");
        assert_eq!(again.layouts, vec![l.clone()]);
    }
}

/// The decoders of `tune::agree` (rank 0's decision and model, a peer's
/// probe times) on the fuzz bytes, the first byte choosing which; what
/// decodes re-encodes to a message that decodes to the same value.
pub fn tune_messages(data: &[u8]) {
    use hetccl_collectives::tune::agree;
    let Some((&which, rest)) = data.split_first() else {
        return;
    };
    match which % 3 {
        0 => {
            if let Ok(d) = agree::decode_decision(rest, 4, 2) {
                let (b, fits) = agree::encode_decision(&d);
                assert!(fits);
                assert_eq!(agree::decode_decision(&b, 4, 2).expect("re-encoded"), d);
            }
        }
        1 => {
            if let Ok((t, g)) = agree::decode_times(rest) {
                let b = agree::encode_times(&t, g);
                assert_eq!(agree::decode_times(&b).expect("re-encoded"), (t, g));
            }
        }
        _ => {
            if let Ok(m) = agree::decode_model(rest) {
                assert_eq!(agree::encode_model(&m), rest);
            }
        }
    }
}

/// What a verbs comm peeks on its peer's setup socket (a revoke or BYE
/// frame, a prefix of one, or garbage): the decoder never panics, accepts
/// only whole frames of exactly 8 bytes (a revoke naming a rank in range,
/// a BYE carrying 0) and prefixes of them, and a frame it accepts encodes
/// back to the same bytes.
pub fn ib_setup_frame(data: &[u8]) {
    use nccl_net_plugin::ib::setup_frame::{
        decode, encode, encode_bye, SetupFrame, FRAME_BYTES, MAX_RANKS,
    };
    if data.is_empty() {
        return;
    }
    match decode(data) {
        Ok(Some(SetupFrame::Revoke(by))) => {
            assert!(by < MAX_RANKS);
            assert_eq!(data, &encode(by)[..]);
        }
        Ok(Some(SetupFrame::Bye)) => assert_eq!(data, &encode_bye()[..]),
        Ok(None) => {
            assert!(data.len() < FRAME_BYTES);
            let (r, b) = (encode(0), encode_bye());
            assert!(
                data[..data.len().min(4)] == r[..data.len().min(4)]
                    || data[..data.len().min(4)] == b[..data.len().min(4)]
            );
        }
        Err(_) => {}
    }
    let _ = nccl_net_plugin::ib::setup_frame::check_peeked(Some(data), "fuzz");
}
