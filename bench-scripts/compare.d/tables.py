"""Formats and formulas of bench-scripts/compare: the collectives, the
busbw factors, the parsers of the programs' output (nccl-tests tables of
hetccl-perf and mpi_coll, memcpy_bw and mem_limit lines) and the least
memory traffic of each collective (see compare.py's docstring and
docs/benchmarks.md)."""
import re

COLLS = ["allreduce", "allgather", "reducescatter", "broadcast"]
# The coalescing group: 64 ncclSend of 64 B (and the 64 matching ncclRecv).
COALESCE_MSGS, COALESCE_BYTES = 64, 64
PERF_NAME = {"allreduce": "all_reduce", "allgather": "all_gather",
             "reducescatter": "reduce_scatter", "broadcast": "broadcast"}
LIBS = ("hetccl", "openmpi")
# nccl-tests' busbw factors; the printed size is algbw's numerator for these four.
BUSBW_FACTOR = {"allreduce": lambda n: 2 * (n - 1) / n, "allgather": lambda n: (n - 1) / n,
                "reducescatter": lambda n: (n - 1) / n, "broadcast": lambda n: 1.0}
FIELDS = ["lib", "collective", "config", "nranks", "size", "round", "time_us",
          "algbw", "busbw", "wrong", "status", "launch", "start_utc", "load1"]

# ---------------------------------------------------------------- parsing ---

ROW = re.compile(r"^\s*(\d+)\s+(\d+)\s+(\S+)\s+(\S+)\s+(-?\d+)\s+(.*)$")


def num(s):
    """A table cell as float; None for N/A or anything unparsable."""
    try:
        return float(s)
    except ValueError:
        return None


def parse_table(text):
    """Rows of an nccl-tests table (hetccl-perf or mpi_coll), out-of-place.

    Returns (rows, footer) where rows are dicts with size, count, type,
    redop, root, time_us, algbw, busbw, wrong (None when N/A) and footer has
    out_of_bounds / avg_busbw when those lines were printed."""
    rows, footer = [], {}
    for line in text.splitlines():
        if line.startswith("#"):
            m = re.match(r"#\s*Out of bounds values\s*:\s*(\d+)", line)
            if m:
                footer["out_of_bounds"] = int(m.group(1))
            m = re.match(r"#\s*Avg bus bandwidth\s*:\s*(\S+)", line)
            if m:
                footer["avg_busbw"] = num(m.group(1))
            continue
        m = ROW.match(line)
        if not m:
            continue
        rest = m.group(6).split()
        if len(rest) < 4:
            continue
        rows.append({
            "size": int(m.group(1)), "count": int(m.group(2)), "type": m.group(3),
            "redop": m.group(4), "root": int(m.group(5)),
            "time_us": num(rest[0]), "algbw": num(rest[1]), "busbw": num(rest[2]),
            "wrong": None if rest[3] == "N/A" else int(float(rest[3])),
        })
    return rows, footer


def parse_mem_limit(text):
    """{kernel: bytes read + written per second} from mem_limit's lines (the
    fastest batch: a limit, and preemption only ever slows a batch), and the
    bytes per array from its header."""
    out, per_array = {}, None
    for line in text.splitlines():
        m = re.match(r"#\s*mem_limit .*bytes_per_array (\d+)", line)
        if m:
            per_array = int(m.group(1))
        if line.startswith("#") or not line.strip():
            continue
        p = line.split()
        if len(p) >= 3 and p[0] in ("memcpy", "ntcopy", "add"):
            v = num(p[2])
            if v is not None and v > 0:
                out[p[0]] = v
    return out, per_array


def group_time_us(text, size, msgs):
    """Time per group of `msgs` point-to-point operations (µs) from a
    hetccl-perf sendrecv table (time per operation x msgs) and #wrong; None
    when the row of `size` is missing."""
    rows, _ = parse_table(text)
    for r in rows:
        if r["size"] == size and r["time_us"] is not None:
            return r["time_us"] * msgs, r["wrong"] or 0
    return None, 0


# The memory limit: the least memory traffic (bytes read + written, all ranks
# together) of a single-copy algorithm on shared memory, for `size` as
# nccl-tests prints it (AllReduce, Broadcast: one rank's buffer; AllGather:
# one rank's output; ReduceScatter: one rank's input), and the kernel whose
# bandwidth bounds it. Every byte an output depends on is read once and every
# output byte written once:
#   AllReduce      n·S read (every input), n·S written (every output)  add
#   ReduceScatter  n·S read, S written (n outputs of S/n)              add
#   AllGather      S read (n blocks of S/n), n·S written               copy
#   Broadcast      S read (the root's buffer), n·S written             copy
def min_traffic(coll, n, size):
    """(bytes, kernel) of the memory limit of one operation."""
    return {"allreduce": (2 * n * size, "add"), "reducescatter": ((n + 1) * size, "add"),
            "allgather": ((n + 1) * size, "copy"), "broadcast": ((n + 1) * size, "copy")}[coll]


LIMIT_SIZE = 64 << 20


def parse_memcpy(text):
    out = {}
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        p = line.split()
        try:
            out[int(p[0])] = float(p[1])
        except (ValueError, IndexError):
            pass
    return out
