"""The self-test of bench-scripts/compare's parsers and formulas
(`compare.py selftest`, run by tests/compare_parse.rs): parses the captured
samples in samples/ and checks the memory-limit fractions and the
coalescing ratio that the report derives from them."""
import os
import sys
import tempfile

from report import coalescing, limit_tag, limits, mem_bw, report
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
    ok &= check("mem_limit memcpy", m.get("memcpy"), 1.6910e10)
    ok &= check("mem_limit ntcopy", m.get("ntcopy"), 2.2920e10)
    ok &= check("mem_limit add", m.get("add"), 1.3472e10)
    ok &= check("mem_limit bytes_per_array", per_array, 64 << 20)
    with open(os.path.join(sdir, "coalesce-sendrecv.txt")) as f:
        t, wrong = group_time_us(f.read(), COALESCE_BYTES, COALESCE_MSGS)
    ok &= check("coalesce-sendrecv.txt µs per group", t, 1.14 * 64) and wrong == 0
    # A run with two rounds of a 2-rank shm allreduce and one of an
    # allgather at 64 MiB, each hetccl launch after its own mem_limit launch
    # (the sample's rates; the allreduce's second round at twice those), and
    # two coalescing rounds.
    S = LIMIT_SIZE
    rows = []

    def row(lib, coll, rnd, us, launch):
        algbw = S / (us * 1e3)
        rows.append({"lib": lib, "collective": coll, "config": "shm", "nranks": 2, "size": S,
                     "round": rnd, "time_us": us, "algbw": algbw,
                     "busbw": algbw * BUSBW_FACTOR[coll](2), "wrong": 0, "status": "ok",
                     "launch": launch})

    launch = 0
    for coll, rnd, scale, h_us in (("allreduce", 1, 1.0, 40000.0),
                                   ("allreduce", 2, 2.0, 30000.0),
                                   ("allgather", 1, 1.0, 20000.0)):
        launch += 1
        rows += [{"lib": "memlimit", "collective": k, "config": "2threads", "nranks": 2,
                  "size": per_array, "round": limit_tag("shm", 2, coll, rnd), "time_us": None,
                  "algbw": v * scale / 1e9, "busbw": v * scale / 1e9, "wrong": 0,
                  "status": "ok", "launch": launch} for k, v in m.items()]
        row("hetccl", coll, rnd, h_us, launch + 100)
        row("openmpi", coll, rnd, 2 * h_us, launch + 200)
    for rnd, off, on in ((1, 600.0, 100.0), (2, 900.0, 120.0)):
        for lib, us in (("coalesce-off", off), ("coalesce-on", on)):
            rows.append({"lib": lib, "collective": "sendrecv", "config": "tcp-lo", "nranks": 2,
                         "size": COALESCE_BYTES, "round": rnd, "time_us": us, "algbw": None,
                         "busbw": None, "wrong": 0, "status": "ok", "launch": 300})
    res = {"rows": rows, "launches": [], "meta": {
        "quick": True, "start_utc": "2026-01-01T00:00:00Z", "end_utc": "2026-01-01T00:01:00Z",
        "host": "selftest", "nproc": 2, "cpu": "-", "kernel": "-", "openmpi": "-", "git": "-",
        "sizes": "-", "iters": 1, "warmup": 1, "rounds": 2, "command": "selftest"}}
    ok &= check("copy GB/s = max(memcpy, ntcopy)", mem_bw(res)["copy"], 22.920)
    lims = {x["collective"]: x for x in limits(res)}
    # allreduce: 2·2·S bytes at the add rate, per round; allgather: 3·S at
    # the copy rate.
    ok &= check("allreduce least traffic", lims["allreduce"]["traffic"], 4 * S)
    f1 = 4 * S / 13.472e9 * 1e6 / 40000.0
    f2 = 4 * S / 26.944e9 * 1e6 / 30000.0
    ok &= check("allreduce fraction", lims["allreduce"]["fraction"], (f1 + f2) / 2)
    ok &= check("allreduce fraction range", lims["allreduce"]["fraction_min"], min(f1, f2))
    ok &= check("allgather fraction", lims["allgather"]["fraction"],
                3 * S / 22.920e9 * 1e6 / 20000.0)
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
    lim_us = (4 * S / 13.472e3 + 4 * S / 26.944e3) / 2
    want = [f"| allreduce | 2 | 256 MiB | add | 20.2 | {lim_us:,.0f} | 35,000 | "
            f"{(f1 + f2) / 2:.3f} ({min(f1, f2):.3f}–{max(f1, f2):.3f}) |",
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
