"""Two (or more) ranks of an AllReduce through NCCL's C API from Python, as
a PyTorch process reaches NCCL: by the name libnccl.so.2, nothing hetccl in
the code. Run by tests/wheel/test_installed.py as `hetccl-run python
allreduce_ranks.py`: only interposition can make the calls reach hetccl.

The parent starts the ranks with subprocess (they inherit its environment,
as a launcher's workers do), passes the unique id through a file, and exits
with the first nonzero status of a rank.

Each rank loads libnccl.so.2 by name with RTLD_GLOBAL (found where the
caller's LD_LIBRARY_PATH points: NVIDIA's wheel) and resolves the nccl*
functions in the global scope (ctypes.CDLL(None)), which is how the dynamic
linker binds a program linked to libnccl.so.2: LD_PRELOAD'ed libraries come
first there. (dlsym on libnccl.so.2's own handle would skip them.)

Prints `key value` lines: `origin.<rank> PATH` (the file ncclAllReduce was
bound to), `int32.<rank> ok`, `float64.<rank> ok`. `--origin-only` prints
the origin in this process and stops before any NCCL call.
"""

import argparse
import ctypes
import os
import subprocess
import sys
import tempfile
import time

NCCL_INT32, NCCL_FLOAT64, NCCL_SUM = 2, 8, 0
DEADLINE_S = 120


class UniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_char * 128)]


class DlInfo(ctypes.Structure):
    _fields_ = [
        ("dli_fname", ctypes.c_char_p),
        ("dli_fbase", ctypes.c_void_p),
        ("dli_sname", ctypes.c_char_p),
        ("dli_saddr", ctypes.c_void_p),
    ]


def bind():
    """libnccl.so.2 loaded by name, the nccl* functions from the global scope."""
    ctypes.CDLL("libnccl.so.2", mode=ctypes.RTLD_GLOBAL)
    g = ctypes.CDLL(None)
    g.dladdr.argtypes = [ctypes.c_void_p, ctypes.POINTER(DlInfo)]
    g.ncclGetErrorString.restype = ctypes.c_char_p
    g.ncclGetUniqueId.argtypes = [ctypes.POINTER(UniqueId)]
    g.ncclCommInitRank.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int, UniqueId, ctypes.c_int]
    g.ncclAllReduce.argtypes = [
        ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
        ctypes.c_void_p, ctypes.c_void_p,
    ]
    g.ncclCommDestroy.argtypes = [ctypes.c_void_p]
    return g


def origin(g, fn):
    info = DlInfo()
    if g.dladdr(ctypes.cast(fn, ctypes.c_void_p), ctypes.byref(info)) == 0:
        return "?"
    return os.path.realpath(info.dli_fname.decode())


def check(g, what, rc):
    if rc != 0:
        sys.exit("%s failed: %d (%s)" % (what, rc, g.ncclGetErrorString(rc).decode()))


def rank_main(rank, nranks, id_file, count):
    g = bind()
    print("origin.%d %s" % (rank, origin(g, g.ncclAllReduce)), flush=True)
    uid = UniqueId()
    if rank == 0:
        check(g, "ncclGetUniqueId", g.ncclGetUniqueId(ctypes.byref(uid)))
        with open(id_file + ".part", "wb") as f:
            f.write(bytes(uid))  # the 128 raw bytes (the field reads stop at a NUL)
        os.replace(id_file + ".part", id_file)
    else:
        deadline = time.monotonic() + DEADLINE_S
        while not os.path.exists(id_file):
            if time.monotonic() > deadline:
                sys.exit("rank %d: no unique id from rank 0 after %d s" % (rank, DEADLINE_S))
            time.sleep(0.05)
        with open(id_file, "rb") as f:
            ctypes.memmove(ctypes.byref(uid), f.read(128), 128)
    comm = ctypes.c_void_p()
    check(g, "ncclCommInitRank", g.ncclCommInitRank(ctypes.byref(comm), nranks, uid, rank))

    send = (ctypes.c_int32 * count)(*[(rank + 1) * 1000 + i for i in range(count)])
    recv = (ctypes.c_int32 * count)()
    check(g, "ncclAllReduce int32", g.ncclAllReduce(send, recv, count, NCCL_INT32, NCCL_SUM, comm, None))
    base = 1000 * nranks * (nranks + 1) // 2
    bad = [i for i in range(count) if recv[i] != base + nranks * i]
    if bad:
        sys.exit("rank %d: int32 sum wrong at %d elements, first %d: %d" % (rank, len(bad), bad[0], recv[bad[0]]))
    print("int32.%d ok" % rank, flush=True)

    # In place, float64: halves and integers add exactly.
    buf = (ctypes.c_double * count)(*[rank + 0.5 * i for i in range(count)])
    check(g, "ncclAllReduce float64", g.ncclAllReduce(buf, buf, count, NCCL_FLOAT64, NCCL_SUM, comm, None))
    fbase = nranks * (nranks - 1) / 2
    bad = [i for i in range(count) if buf[i] != fbase + nranks * 0.5 * i]
    if bad:
        sys.exit("rank %d: float64 sum wrong at %d elements, first %d: %r" % (rank, len(bad), bad[0], buf[bad[0]]))
    print("float64.%d ok" % rank, flush=True)
    check(g, "ncclCommDestroy", g.ncclCommDestroy(comm))
    return 0


def parent_main(nranks, count):
    with tempfile.TemporaryDirectory(prefix="hetccl-ranks-") as tmp:
        id_file = os.path.join(tmp, "id")
        procs = [
            subprocess.Popen(
                [sys.executable, __file__, "--rank", str(r), "--nranks", str(nranks),
                 "--id-file", id_file, "--count", str(count)],
                stdout=subprocess.PIPE,
                text=True,
            )
            for r in range(nranks)
        ]
        status = 0
        deadline = time.monotonic() + DEADLINE_S
        for p in procs:
            try:
                out, _ = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                for q in procs:
                    q.kill()
                sys.exit("ranks still running after %d s" % DEADLINE_S)
            sys.stdout.write(out)
            if p.returncode != 0 and status == 0:
                status = p.returncode if p.returncode > 0 else 128 - p.returncode
        return status


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--origin-only", action="store_true")
    ap.add_argument("--nranks", type=int, default=2)
    ap.add_argument("--count", type=int, default=4099)
    ap.add_argument("--rank", type=int)
    ap.add_argument("--id-file")
    a = ap.parse_args()
    if a.origin_only:
        g = bind()
        print("origin %s" % origin(g, g.ncclAllReduce))
        return 0
    if a.rank is None:
        return parent_main(a.nranks, a.count)
    return rank_main(a.rank, a.nranks, a.id_file, a.count)


if __name__ == "__main__":
    sys.exit(main())
