#!/usr/bin/env python3
"""Writes the seed corpus: a few valid and invalid inputs per fuzz target.

Run from anywhere: python3 fuzz/seeds/make_seeds.py. The formats are those
of collectives/src/bootstrap/{id,card,frame,auth}.rs, api/config_read.rs and
nccl-net-plugin/src/wire.rs and
nccl-net-plugin/src/tuner/table.rs, and
collectives/src/tune/{table,agree}.rs.
"""
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))


def put(target, name, data):
    d = os.path.join(HERE, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(bytes(data))


def unique_id(fam=4, ip=bytes([127, 0, 0, 1]), port=29500, magic=b"HCID", ver=1, tail=b""):
    b = bytearray(128)
    b[0:4] = magic
    b[4] = ver
    b[5] = fam
    b[6:8] = struct.pack(">H", port)
    b[8:8 + len(ip)] = ip
    b[24:56] = bytes(range(32))
    b[56:56 + len(tail)] = tail
    return b


put("unique_id", "valid_v4", unique_id())
put("unique_id", "valid_v6", unique_id(6, bytes(15) + b"\x01"))
put("unique_id", "bad_magic", unique_id(magic=b"NCCL"))
put("unique_id", "port0", unique_id(port=0))
put("unique_id", "reserved_garbage", unique_id(tail=b"\x01"))
put("unique_id", "family9", unique_id(fam=9))
put("unique_id", "short", b"HCID\x01")


def card(rank=0, nranks=2, fam=4, ip=bytes([127, 0, 0, 1]), port=40000, coalesce=65536):
    b = bytearray(52)
    b[0:4] = struct.pack(">I", rank)
    b[4:8] = struct.pack(">I", nranks)
    b[8:16] = struct.pack(">Q", 0x1234567890ABCDEF)
    b[16:20] = struct.pack(">I", 4242)
    b[20:28] = struct.pack(">Q", 77)
    b[28:30] = struct.pack(">H", port)
    b[30] = fam
    b[32:32 + len(ip)] = ip
    b[48:52] = struct.pack(">I", coalesce)
    return b


put("card", "valid_v4", card())
put("card", "valid_v6", card(1, 3, 6, bytes(15) + b"\x01"))
put("card", "rank_ge_nranks", card(2, 2))
put("card", "nranks0", card(0, 0))
put("card", "port0", card(port=0))
put("card", "47_bytes", card()[:47])
put("card", "51_bytes", card()[:51])
put("card", "coalesce_off", card(coalesce=0))

put("card_table", "valid_3", struct.pack("<H", 3) + b"".join(card(r, 3) for r in range(3)))
put("card_table", "valid_1", struct.pack("<H", 1) + card(0, 1))
put("card_table", "out_of_order", struct.pack("<H", 2) + card(1, 2) + card(0, 2))
put("card_table", "size_mismatch", struct.pack("<H", 2) + card(0, 3) + card(1, 3))
put("card_table", "short", struct.pack("<H", 2) + card(0, 2))
put("card_table", "zero_ranks", struct.pack("<H", 0))

# frame_recv: first byte selects max (0,1,7,48,256,4096,MAX_FRAME,usize::MAX).
put("frame_recv", "valid_small", b"\x04" + struct.pack(">I", 5) + b"hello")
put("frame_recv", "valid_empty", b"\x06" + struct.pack(">I", 0))
put("frame_recv", "over_bound", b"\x02" + struct.pack(">I", 8) + b"12345678")
put("frame_recv", "truncated", b"\x06" + struct.pack(">I", 100) + b"abc")
put("frame_recv", "huge_len", b"\x07" + struct.pack(">I", 0xFFFFFFFF))
put("frame_recv", "short_len", b"\x06\x00\x00")

# auth_verify: first byte even = raw forged answer, odd = honest prover.
put("auth_verify", "honest_hello", b"\x01" + b"ROOT" + card())
put("auth_verify", "honest_empty", b"\x01")
put("auth_verify", "honest_too_long", b"\x01" + b"x" * 300)
put("auth_verify", "forged", b"\x00" + struct.pack(">I", 36) + bytes(32) + b"rank")
put("auth_verify", "short_answer", b"\x00" + struct.pack(">I", 4) + b"abcd")
put("auth_verify", "oversized", b"\x00" + struct.pack(">I", 100000))

MAGIC = 0xCAFEBEEF
UNDEF = -2147483648


def comm_config(size=120, magic=MAGIC, ver=23203, blocking=UNDEF, net=0, split=UNDEF, comm=2):
    # size, magic, version, blocking, cga, minCTAs, maxCTAs, netName*,
    # splitShare, trafficClass, commName*, then 16 ints.
    b = struct.pack("<QIIiiiiQiiQ", size, magic, ver, blocking, UNDEF, UNDEF, UNDEF,
                    net, split, UNDEF, comm)
    b += struct.pack("<16i", *([UNDEF] * 16))
    return b[:max(size, 16)] if size <= len(b) else b


put("comm_config", "valid_2_32", comm_config())
put("comm_config", "valid_2_21_size56", comm_config(56, ver=22105, blocking=0))
put("comm_config", "valid_2_14_size40", comm_config(40, ver=21403, net=2))
put("comm_config", "long_string", comm_config(comm=3))
put("comm_config", "unterminated_4096", comm_config(comm=4))
put("comm_config", "bad_magic", comm_config(magic=0))
put("comm_config", "bad_size", comm_config(size=12345))
put("comm_config", "old_version", comm_config(ver=21000))
put("comm_config", "blocking7", comm_config(blocking=7))


def coll_config(size=72, magic=MAGIC, ver=23200, alg=2):
    # size, magic, version, ext*, minCTAs, maxCTAs, nvlsCTAs, cga,
    # algSelection*, forceAlgSelection, CTAPolicy, userProfilerTag, event*.
    return struct.pack("<QIIQiiiiQiiQQ", size, magic, ver, 0, UNDEF, UNDEF, UNDEF, UNDEF,
                       alg, UNDEF, UNDEF, 42, 0)


put("coll_config", "valid", coll_config())
put("coll_config", "valid_no_alg", coll_config(alg=0))
put("coll_config", "empty_alg", coll_config(alg=1))
put("coll_config", "long_alg", coll_config(alg=3))
put("coll_config", "size_16", coll_config(size=16))
put("coll_config", "bad_magic", coll_config(magic=1))
put("coll_config", "size_65536", coll_config(size=65536))
put("coll_config", "size_65544", coll_config(size=65544))


def handle(fam=4, ip=bytes([127, 0, 0, 1]), port=43000, magic=b"HCN1", ver=1):
    b = bytearray(128)
    b[0:4] = magic
    b[4] = ver
    b[5] = fam
    b[6:8] = struct.pack(">H", port)
    b[8:8 + len(ip)] = ip
    b[24:32] = struct.pack("<Q", 0xDEADBEEF)
    b[64:72] = struct.pack("<Q", 5)
    return b


put("net_handle", "valid_v4", handle())
put("net_handle", "valid_v6", handle(6, bytes(15) + b"\x01"))
put("net_handle", "unspecified", handle(ip=bytes(4)))
put("net_handle", "multicast", handle(ip=bytes([224, 0, 0, 1])))
put("net_handle", "port0", handle(port=0))
put("net_handle", "bad_magic", handle(magic=b"XXXX"))


def hello(kind=0, idx=0, nsocks=2, pad=bytes(6)):
    return (b"HCNh" + bytes([1, kind]) + struct.pack("<HH", idx, nsocks) + pad
            + struct.pack("<QQ", 0x1111, 0x2222))


put("net_hello", "ctrl", hello())
put("net_hello", "data1", hello(1, 1, 2))
put("net_hello", "data_idx_ge_nsocks", hello(1, 2, 2))
put("net_hello", "too_many_socks", hello(1, 0, 65))
put("net_hello", "padding_set", hello(pad=b"\x00\x00\x01\x00\x00\x00"))
put("net_hello", "ctrl_idx1", hello(0, 1, 2))


def frame(kind, flags, tag, seq, size, pad=b"\x00\x00"):
    return bytes([kind, flags]) + pad + struct.pack("<iQQ", tag, seq, size)


put("net_frame", "msg_inline", frame(1, 1, 7, 3, 100))
put("net_frame", "msg", frame(1, 0, -1, 0, 1 << 20))
put("net_frame", "data", frame(2, 0, 0, 9, 4096))
put("net_frame", "cts_ctrl", frame(3, 0, 0, 1, 0))
put("net_frame", "cts_lanes", frame(3, 1, 0, 1, 65536))
put("net_frame", "reject", frame(4, 0, 0, 5, 0))
put("net_frame", "too_big", frame(1, 0, 0, 0, (1 << 40) + 1))
put("net_frame", "bad_kind", frame(9, 0, 0, 0, 0))
put("net_frame", "pad_set", frame(1, 0, 0, 0, 0, b"\x01\x00"))


# Bootstrap hellos: rank to rank ("RING"/"HAND" + rank, "DATA" + channel +
# rank, big-endian) and rank to root ("ROOT" + card).
def boot(tag, *words):
    return tag + b"".join(struct.pack(">I", w) for w in words)


put("boot_hello", "ring", boot(b"RING", 3))
put("boot_hello", "handoff", boot(b"HAND", 0))
put("boot_hello", "data", boot(b"DATA", 2, 7))
put("boot_hello", "data_short", boot(b"DATA", 2))
put("boot_hello", "unknown", boot(b"XXXX", 1))
put("boot_hello", "root_v4", b"ROOT" + card())
put("boot_hello", "root_v6", b"ROOT" + card(1, 3, 6, bytes(15) + b"\x01"))
put("boot_hello", "root_short", b"ROOT" + card()[:47])


def tuning(entries, layout='"nranks": 4, "nnodes": 2'):
    return ('{"format": "hetccl-nccl-tuning", "version": 1, "layouts": [{%s, "entries": [%s]}]}'
            % (layout, entries)).encode()


AR = '{"collective": "allreduce", "max_bytes": 65535, "algo": "tree", "proto": "ll"}'
AR2 = ('{"collective": "allreduce", "min_bytes": 65536, "algo": "pat", "proto": "simple",'
       ' "nchannels": 6, "chunk_bytes": 131072}')
put("tuning_table", "valid", tuning(AR + ", " + AR2 + ', {"collective": "broadcast", "algo": "nvls", "proto": "ll128"}'))
put("tuning_table", "overlap", tuning(AR + ", " + AR2.replace("65536", "65535")))
put("tuning_table", "unknown_key", tuning(AR.replace("max_bytes", "max_byte")))
put("tuning_table", "bad_layout", tuning(AR, '"nranks": 2, "nnodes": 3'))
put("tuning_table", "truncated", tuning(AR)[:60])


def engine(entries, layout='"nranks": 4, "nnodes": 2, "transports": ["shm", "tcp"]'):
    return ('{"format": "hetccl-tuning", "version": 1, "meta": {"x": 1}, "layouts": [{%s, "entries": [%s]}]}'
            % (layout, entries)).encode()


RING = '{"collective": "allreduce", "algo": "ring", "points": [[8, 35.2], [65536, 120.0], [1048576, 900.5]]}'
TREE = '{"collective": "broadcast", "algo": "tree", "points": [[1, 2.5]]}'
put("engine_tuning_table", "valid", engine(RING + ", " + TREE))
put("engine_tuning_table", "descending", engine(RING.replace("65536", "7")))
put("engine_tuning_table", "zero_time", engine(TREE.replace("2.5", "0")))
put("engine_tuning_table", "unknown_transport", engine(RING, '"nranks": 4, "nnodes": 2, "transports": ["nvlink"]'))
put("engine_tuning_table", "plugin_format", tuning(AR))
put("engine_tuning_table", "truncated", engine(RING)[:70])


def decision(calibrate=True, budget=50, body=b""):
    flags = (1 if calibrate else 0) | (2 if body else 0)
    return b"HTD1" + bytes([flags]) + struct.pack("<II", budget, len(body)) + body


def times(entries, gamma=-1.0):
    b = b"HTT1" + bytes([len(entries)])
    for cls, rtt, bulk, n in entries:
        b += bytes([cls]) + struct.pack("<ddQ", rtt, bulk, n)
    return b + struct.pack("<d", gamma)


def model(vals):
    return b"HTM1" + b"".join(struct.pack("<d", v) for v in vals)


ONE = engine(RING).decode().replace(', "meta": {"x": 1}', "").encode()
put("tune_messages", "decision", b"\x00" + decision(True, 50, ONE))
put("tune_messages", "decision_empty", b"\x00" + decision(False, 7))
put("tune_messages", "decision_short", b"\x00" + decision()[:9])
put("tune_messages", "times", b"\x01" + times([(1, 3.5, 120.0, 1 << 20), (2, 60.0, 900.0, 1 << 20)], 1e-4))
put("tune_messages", "times_bad_class", b"\x01" + times([(7, 3.5, 120.0, 1 << 20)]))
put("tune_messages", "model", b"\x02" + model([0.2, 5e-5, 1.0, 1e-4, 25.0, 8e-4, 0.5, 1.25e-4, 0.1]))
put("tune_messages", "model_nan", b"\x02" + model([float("nan")] * 9))


# Packs of coalesced messages (collectives/src/transport/pack.rs): the first
# byte picks the limits (fuzz/src/lib.rs; 0x0d: 64 KiB packs of parts up to
# 128 B, 0x03: parts of 1 B), then "HCPK", count, payload
# bytes, the lengths and the payloads, little-endian.
def pack(parts, count=None, payload=None, magic=b"HCPK"):
    n = len(parts) if count is None else count
    p = sum(len(x) for x in parts) if payload is None else payload
    return (magic + struct.pack("<II", n, p) + b"".join(struct.pack("<I", len(x)) for x in parts)
            + b"".join(parts))


put("pack", "valid_3", b"\x0d" + pack([b"a", b"bcd", bytes(range(61))]))
put("pack", "valid_1", b"\x0d" + pack([b"hello"]))
put("pack", "count_too_big", b"\x03" + pack([b"a", b"b"], count=3))
put("pack", "count_zero", b"\x03" + pack([], count=0))
put("pack", "payload_overflow", b"\x03" + pack([b"ab"], payload=0xFFFFFFFF))
put("pack", "part_over_limit", b"\x0d" + pack([bytes(200)]))
put("pack", "bad_magic", b"\x03" + pack([b"x"], magic=b"NCCL"))
put("pack", "truncated", (b"\x03" + pack([b"abc", b"de"]))[:20])


# The verbs sender's control area (nccl-net-plugin/src/ib/{proto,send_check}.rs):
# a 64-byte CTS entry (seq+1, msg, offset, len, addr, rkey|flags, check
# word, seq+1), then the entry wanted, the message's size and covered
# bytes, a flags byte (1 posted, 2 finished, 4 registered, 8 unknown
# message), and a credit counter, credits returned and used.
M64 = (1 << 64) - 1


def cts_check(seq, msg, off, ln, addr, rkey, flags):
    h = 0xCBF29CE484222325
    for w in [seq + 1, msg, off, ln, addr, rkey | flags << 32]:
        h = ((h ^ w) * 0x100000001B3) & M64
        h ^= h >> 29
    return h


def cts(seq, msg=0, off=0, ln=1 << 20, addr=0x10000, rkey=7, flags=0, check=None):
    c = cts_check(seq, msg, off, ln, addr, rkey, flags) if check is None else check
    return struct.pack("<QQQQQIIQQ", seq + 1, msg, off, ln, addr, rkey, flags, c, seq + 1)


def sender(entry, want=0, size=3 << 20, covered=0, f=1, credit=(5, 3, 8)):
    return entry + struct.pack("<QQQB", want, size, covered, f) + struct.pack("<QQQ", *credit)


put("ib_sender", "good", sender(cts(0)))
put("ib_sender", "good_registered", sender(cts(4, off=1 << 20, ln=2 << 20), want=4, covered=1 << 20, f=5))
put("ib_sender", "reject", sender(cts(0, flags=1, off=M64, ln=M64)))
put("ib_sender", "past_end", sender(cts(0, ln=(3 << 20) + 1), f=5))
put("ib_sender", "bad_check", sender(cts(0, check=1)))
put("ib_sender", "bad_flags", sender(cts(0, flags=2)))
put("ib_sender", "unknown_msg", sender(cts(0), f=9))
put("ib_sender", "credits_over", sender(cts(0), credit=(9, 3, 8)))

put("ib_setup_frame", "revoke", b"HRVK" + struct.pack("<I", 3))
put("ib_setup_frame", "bye", b"HBYE" + bytes(4))
put("ib_setup_frame", "bye_prefix", b"HBY")
put("ib_setup_frame", "bye_word", b"HBYE" + struct.pack("<I", 1))
put("ib_setup_frame", "revoke_rank_too_big", b"HRVK" + struct.pack("<I", 1 << 24))
put("ib_setup_frame", "bytes_after", b"HBYE" + bytes(4) + b"H")
