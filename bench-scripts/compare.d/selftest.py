"""The self-test of bench-scripts/compare's parsers and formulas
(`compare.py selftest`, run by tests/compare_parse.rs): parses the captured
samples in samples/ and checks the memory-limit fractions and the
coalescing ratio that the report derives from them."""
import os
import sys
import tempfile

from report import coalescing, limits, mem_bw, report, summarize
from tables import (BUSBW_FACTOR, COALESCE_BYTES, COALESCE_MSGS, LIMIT_SIZE, group_time_us,
                    parse_mem_limit, parse_table)

HERE = os.path.dirname(os.path.abspath(__file__))


def selftest_tables(sdir):
    """The nccl-tests tables of hetccl-perf and mpi_coll (hetccl-*, openmpi-*)."""
    names = sorted(f for f in os.listdir(sdir)
                   if f.endswith(".txt") and f.startswith(("hetccl-", "openmpi-")))
    ok = True
    for name in names:
        with open(os.path.join(sdir, name)) as f:
            rows, footer = parse_table(f.read())
        good = (len(rows) >= 3 and footer.get("out_of_bounds") == 0
                and all(r["wrong"] == 0 and r["busbw"] is not None and r["time_us"] > 0
                        for r in rows)
                and all(b["size"] > a["size"] for a, b in zip(rows, rows[1:])))
        print(f"{name}: {len(rows)} rows, footer {footer}: {'ok' if good else 'FAILED'}")
        ok &= good
    if {n.split("-")[0] for n in names} != {"hetccl", "openmpi"}:
        print("expected samples of hetccl-perf and mpi_coll")
        ok = False
    return ok


def check(what, got, want, tol=1e-9):
    """Prints and returns whether `got` equals `want` (relative `tol`)."""
    good = (got is not None and want is not None
            and abs(got - want) <= tol * max(abs(want), 1e-300))
    print(f"{what}: {got!r} (want {want!r}): {'ok' if good else 'FAILED'}")
    return good


def selftest_limit(sdir):
    """mem_limit's output, the coalescing table, and the limit and ratio
    computed from them through the report."""
    ok = True
    with open(os.path.join(sdir, "mem_limit.txt")) as f:
        m, per_array = parse_mem_limit(f.read())
    print(f"mem_limit.txt: {m} bytes_per_array {per_array}")
    ok &= check("mem_limit memcpy", m.get("memcpy"), 1.6777e10)
    ok &= check("mem_limit ntcopy", m.get("ntcopy"), 2.1189e10)
    ok &= check("mem_limit add", m.get("add"), 1.2580e10)
    ok &= check("mem_limit bytes_per_array", per_array, 64 << 20)
    with open(os.path.join(sdir, "coalesce-sendrecv.txt")) as f:
        t, wrong = group_time_us(f.read(), COALESCE_BYTES, COALESCE_MSGS)
    ok &= check("coalesce-sendrecv.txt µs per group", t, 1.14 * 64) and wrong == 0
    # A run with that mem_limit launch, one 2-rank shm allreduce and one
    # allgather at 64 MiB, and two coalescing rounds.
    S = LIMIT_SIZE
    rows = [{"lib": "memlimit", "collective": k, "config": "2threads", "nranks": 2,
             "size": per_array, "round": "end", "time_us": None, "algbw": v / 1e9,
             "busbw": v / 1e9, "wrong": 0, "status": "ok", "launch": 1} for k, v in m.items()]
    for lib, coll, us in (("hetccl", "allreduce", 40000.0), ("openmpi", "allreduce", 80000.0),
                          ("hetccl", "allgather", 20000.0), ("openmpi", "allgather", 30000.0)):
        algbw = S / (us * 1e3)
        rows.append({"lib": lib, "collective": coll, "config": "shm", "nranks": 2, "size": S,
                     "round": 1, "time_us": us, "algbw": algbw,
                     "busbw": algbw * BUSBW_FACTOR[coll](2), "wrong": 0, "status": "ok",
                     "launch": 2})
    for rnd, off, on in ((1, 600.0, 100.0), (2, 900.0, 120.0)):
        for lib, us in (("coalesce-off", off), ("coalesce-on", on)):
            rows.append({"lib": lib, "collective": "sendrecv", "config": "tcp-lo", "nranks": 2,
                         "size": COALESCE_BYTES, "round": rnd, "time_us": us, "algbw": None,
                         "busbw": None, "wrong": 0, "status": "ok", "launch": 3})
    res = {"rows": rows, "launches": [], "meta": {
        "quick": True, "start_utc": "2026-01-01T00:00:00Z", "end_utc": "2026-01-01T00:01:00Z",
        "host": "selftest", "nproc": 2, "cpu": "-", "kernel": "-", "openmpi": "-", "git": "-",
        "sizes": "-", "iters": 1, "warmup": 1, "rounds": 1, "command": "selftest"}}
    bw = mem_bw(res)
    ok &= check("copy GB/s = max(memcpy, ntcopy)", bw["copy"], 21.189)
    lims = {x["collective"]: x for x in limits(summarize(res)[0], bw)}
    # allreduce: 2·2·S bytes at the add rate; allgather: 3·S at the copy rate
    ok &= check("allreduce least traffic", lims["allreduce"]["traffic"], 4 * S)
    ok &= check("allreduce fraction", lims["allreduce"]["fraction"],
                4 * S / 12.580e9 * 1e6 / 40000.0)
    ok &= check("allgather fraction", lims["allgather"]["fraction"],
                3 * S / 21.189e9 * 1e6 / 20000.0)
    coal = coalescing(res)
    ok &= check("coalescing ratio", coal["ratio"], 750.0 / 110.0)
    with tempfile.TemporaryDirectory() as d:
        md = os.path.join(d, "r.md")
        with open(os.devnull, "w") as null:
            old, sys.stdout = sys.stdout, null
            try:
                report(res, d, "x-", md)
            finally:
                sys.stdout = old
        with open(md) as f:
            text = f.read()
    want = [f"| allreduce | 2 | 256 MiB | add | {4 * S / 12.580e3:,.0f} | 40,000 | "
            f"{4 * S / 12.580e3 / 40000.0:.3f} |",
            "coalescing ratio (off ÷ on, medians): 6.82×"]
    for w in want:
        good = w in text
        print(f"report line {w!r}: {'ok' if good else 'FAILED'}")
        ok &= good
    return ok


def run():
    """Parses the captured samples in samples/ (both programs' tables,
    mem_limit, the coalescing table) and checks the limit and the ratio
    the report derives from them."""
    sdir = os.path.join(HERE, "samples")
    ok = selftest_tables(sdir)
    ok &= selftest_limit(sdir)
    return 0 if ok else 1
