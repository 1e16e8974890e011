#!/usr/bin/env python3
"""Driver, parser and reporter of bench-scripts/compare.

    compare.py run    [options]      launches A/B rounds, writes CSV/JSON/plots
    compare.py report RESULTS.json   re-prints tables/targets, redraws plots
    compare.py parse  FILE           nccl-tests table -> JSON rows (stdout)
    compare.py selftest              parses the captured samples in samples/

`bench-scripts/compare` (the entry script) installs, builds, makes the network
namespaces and calls `run`; use it rather than this file directly.

Definitions used everywhere below:
  * busbw, algbw, time: nccl-tests' out-of-place columns (GB = 1e9 B); algbw and
    busbw are recomputed from size and time (the table rounds them to 2
    decimals, which erases small sizes), with nccl-tests' factors.
  * pairwise ratio: round r's hetccl busbw / round r's OpenMPI busbw for the
    same (config, collective, size); launches alternate hetccl, OpenMPI,
    hetccl, OpenMPI, ... so each pair ran seconds apart. The quoted ratio is
    the median over rounds. Latency ratios use time (hetccl / OpenMPI).
  * memory limit: single-core memcpy of the same size, in bytes copied per
    second (memcpy_bw). "÷ mem" = busbw (GB/s) / memcpy (GB/s): the share of
    one core's copy rate the collective's busbw reaches.
"""
import argparse
import csv
import datetime as dt
import json
import math
import os
import platform
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
COLLS = ["allreduce", "allgather", "reducescatter", "broadcast"]
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

# -------------------------------------------------------------- launching ---


def utcnow():
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def load1():
    try:
        with open("/proc/loadavg") as f:
            return float(f.read().split()[0])
    except OSError:
        return None


def sh(cmd):
    return " ".join(shlex.quote(c) for c in cmd)


def size_bytes(s):
    """A size as nccl-tests' -b/-e take it: digits with an optional K, M or
    G (powers of 1024)."""
    s = str(s).strip()
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(s[-1:].upper(), 1)
    return int(s[:-1] if mult > 1 else s) * mult


class Runner:
    def __init__(self, a):
        self.a = a
        self.launches = []
        self.rows = []
        self.n = 0
        os.makedirs(a.logdir, exist_ok=True)

    def _log(self, name, cmds, out, err, rc, secs):
        path = os.path.join(self.a.logdir, f"{self.n:03d}-{name}.log")
        with open(path, "w") as f:
            for c in cmds:
                f.write("$ " + sh(c) + "\n")
            f.write(f"# rc={rc} seconds={secs:.1f}\n")
            f.write(out)
            if err:
                f.write("\n# stderr:\n" + err)
        return path

    def spawn(self, cmds, envs, timeout):
        """Starts every command (each under `timeout`), waits for all; the
        first's stdout is the table. Returns (rc, stdout, stderr)."""
        procs = []
        for cmd, env in zip(cmds, envs):
            full = ["timeout", "-k", "10", str(timeout)] + cmd
            e = dict(os.environ)
            e.update(env)
            procs.append(subprocess.Popen(full, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                          env=e, text=True, start_new_session=True))
        outs, rc = [], 0
        for p in procs:
            try:
                o, er = p.communicate(timeout=timeout + 30)
            except subprocess.TimeoutExpired:  # `timeout` itself stuck: never hang
                os.killpg(p.pid, 9)
                o, er = p.communicate()
                p.returncode = 124
            outs.append((o, er))
            rc = rc or p.returncode
        err = "".join(f"[{i}] {e}" for i, (_, e) in enumerate(outs) if e.strip())
        return rc, outs[0][0], err

    def launch(self, lib, coll, config, nranks, rnd, part):
        a = self.a
        self.n += 1
        cmds, envs = self.commands(lib, coll, config, nranks, part)
        start, l1, t0 = utcnow(), load1(), time.monotonic()
        rc, out, err = self.spawn(cmds, envs, a.timeout)
        secs = time.monotonic() - t0
        log = self._log(f"{config}{nranks}-{coll}-{lib}-r{rnd}", cmds, out, err, rc, secs)
        rows, footer = parse_table(out)
        rows = [r for r in rows if r["size"] > 0]
        for r in rows:  # full precision instead of the table's 2 decimals
            if r["time_us"]:
                r["algbw"] = r["size"] / (r["time_us"] * 1e3)
                r["busbw"] = r["algbw"] * BUSBW_FACTOR[coll](nranks)
        status = "ok" if rc == 0 else ("timeout" if rc in (124, 137) else f"failed rc={rc}")
        wrong = sum(r["wrong"] or 0 for r in rows)
        if rc == 0 and not rows:
            status = "failed: no rows"
        if wrong:
            status = f"WRONG ({wrong} wrong elements)"
        rec = {"launch": self.n, "lib": lib, "collective": coll, "config": config,
               "nranks": nranks, "round": rnd, "start_utc": start, "load1": l1,
               "seconds": round(secs, 2), "rc": rc, "status": status, "rows": len(rows),
               "log": log, "commands": [sh(c) for c in cmds],
               "env": [envs[i] for i in range(len(envs))],
               "out_of_bounds": footer.get("out_of_bounds")}
        self.launches.append(rec)
        for r in rows:
            self.rows.append({"lib": lib, "collective": coll, "config": config,
                              "nranks": nranks, "size": r["size"], "round": rnd,
                              "time_us": r["time_us"], "algbw": r["algbw"],
                              "busbw": r["busbw"], "wrong": r["wrong"], "status": status,
                              "launch": self.n, "start_utc": start, "load1": l1})
        if not rows:
            self.rows.append({"lib": lib, "collective": coll, "config": config,
                              "nranks": nranks, "size": None, "round": rnd, "time_us": None,
                              "algbw": None, "busbw": None, "wrong": None, "status": status,
                              "launch": self.n, "start_utc": start, "load1": l1})
        flag = "" if status == "ok" else f"  <-- {status} (see {rec['log']})"
        print(f"  [{start}] {config}-{nranks} {coll:13s} {lib:7s} round {rnd}: "
              f"{len(rows)} rows, {secs:5.1f} s, load {l1}{flag}", flush=True)
        if err and status != "ok":
            tail = err.strip().splitlines()[-3:]
            for t in tail:
                print(f"      {t}", flush=True)

    def parts(self):
        """The sweep as (min, max, iters) launches: sizes up to --small-max
        with --small-iters (a -n 20 loop of sub-microsecond operations times
        a few microseconds, which one preemption doubles), the rest with
        --iters. One part when --small-iters is 0 or no size is that small."""
        a = self.a
        lo, hi = size_bytes(a.minbytes), size_bytes(a.maxbytes)
        cut = size_bytes(a.small_max)
        if a.small_iters <= 0 or lo > cut:
            return [(a.minbytes, a.maxbytes, a.iters)]
        s = lo
        while s * a.factor <= min(cut, hi):
            s *= a.factor
        if s >= hi:
            return [(a.minbytes, a.maxbytes, a.small_iters)]
        return [(a.minbytes, str(s), a.small_iters), (str(s * a.factor), a.maxbytes, a.iters)]

    def sweep_flags(self, part):
        a = self.a
        lo, hi, iters = part
        return ["-b", lo, "-e", hi, "-f", str(a.factor),
                "-n", str(iters), "-w", str(a.warmup)]

    def commands(self, lib, coll, config, nranks, part):
        a = self.a
        flags = self.sweep_flags(part)
        if lib == "hetccl":
            perf = [a.perf, PERF_NAME[coll]] + flags + ["-T", str(min(a.timeout, 120))]
            if a.lib:
                perf += ["--lib", a.lib]
            if config == "shm":
                env = {"HETCCL_SOCKET_IFNAME": "lo", "NCCL_SOCKET_IFNAME": "lo"}
                return [perf + ["-np", str(nranks)]], [env]
            # tcp: one process per namespace, rendezvous through --id-file
            idf = os.path.join(a.tmpdir, f"perf-{self.n}.id")
            cmds, envs = [], []
            for rank, (ns, ifn) in enumerate([(a.ns_a, a.if_a), (a.ns_b, a.if_b)]):
                cmds.append(["ip", "netns", "exec", ns] + perf + ["--id-file", idf])
                envs.append({"RANK": str(rank), "WORLD_SIZE": "2",
                             "HETCCL_SOCKET_IFNAME": ifn, "NCCL_SOCKET_IFNAME": ifn,
                             "HETCCL_HOST_ID": f"compare-node-{'ab'[rank]}",
                             "NCCL_SHM_DISABLE": "1"})
            return cmds, envs
        mpi = ["mpirun", "--allow-run-as-root", "--mca", "pml", "ob1"]
        prog = [a.mpi_coll, PERF_NAME[coll]] + flags
        env = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
        if config == "shm":
            mpi += ["--mca", "btl", f"{a.shm_btl},self", "--mca", "oob_tcp_if_include", "lo"]
            if nranks > os.cpu_count():
                mpi += ["--oversubscribe", "--bind-to", "none"]
            else:
                mpi += ["--bind-to", "core"]
            return [mpi + ["-np", str(nranks)] + prog], [env]
        net = a.subnet
        # PMIx clients reach the server over TCP; rank 1 lives in namespace B,
        # so mpirun's PMIx server must accept connections on the veth subnet.
        env.update({"PMIX_MCA_ptl_tcp_remote_connections": "1",
                    "PMIX_MCA_ptl_tcp_if_include": net})
        mpi = ["ip", "netns", "exec", a.ns_a] + mpi + [
            "--mca", "btl", "tcp,self", "--mca", "btl_tcp_if_include", net,
            "--mca", "oob_tcp_if_include", net, "--bind-to", "core",
            "-np", "1"] + prog + [":", "-np", "1", "ip", "netns", "exec", a.ns_b] + prog
        return [mpi], [env]

    def memcpy(self, tag):
        a = self.a
        self.n += 1
        cmd = [a.memcpy, "-b", a.mem_minbytes, "-e", a.maxbytes, "-f", "2", "-t", str(a.mem_secs)]
        start, l1, t0 = utcnow(), load1(), time.monotonic()
        rc, out, err = self.spawn([cmd], [{}], a.timeout)
        secs = time.monotonic() - t0
        log = self._log(f"memcpy-{tag}", [cmd], out, err, rc, secs)
        m = parse_memcpy(out)
        status = "ok" if rc == 0 and m else f"failed rc={rc}"
        self.launches.append({"launch": self.n, "lib": "memcpy", "collective": "memcpy",
                              "config": "1core", "nranks": 1, "round": tag, "start_utc": start,
                              "load1": l1, "seconds": round(secs, 2), "rc": rc,
                              "status": status, "rows": len(m), "log": log,
                              "commands": [sh(cmd)], "env": [{}]})
        for size, bps in sorted(m.items()):
            self.rows.append({"lib": "memcpy", "collective": "memcpy", "config": "1core",
                              "nranks": 1, "size": size, "round": tag, "time_us": size / bps * 1e6,
                              "algbw": bps / 1e9, "busbw": bps / 1e9, "wrong": 0,
                              "status": status, "launch": self.n, "start_utc": start,
                              "load1": l1})
        print(f"  [{start}] memcpy {tag}: {len(m)} sizes, {secs:.1f} s, load {l1}"
              + ("" if status == "ok" else f"  <-- {status}"), flush=True)


def cmd_run(a):
    a.tmpdir = tempfile.mkdtemp(prefix="hetccl-compare-")
    r = Runner(a)
    configs = []
    for c in a.configs.split(","):
        kind, n = c.split("-")
        configs.append((kind, int(n)))
    colls = a.colls.split(",")
    t_start = utcnow()
    print(f"# bench-scripts/compare: {len(configs)} configs x {len(colls)} collectives x "
          f"{a.rounds} rounds x (hetccl, OpenMPI); sizes {a.minbytes}..{a.maxbytes} x{a.factor}, "
          f"-n {a.iters} -w {a.warmup}"
          + (f" (-n {a.small_iters} up to {a.small_max})" if len(r.parts()) > 1 else "")
          + f"; started {t_start}", flush=True)
    for ci, (kind, n) in enumerate(configs):
        if kind == "tcp" and not a.ns_a:
            print(f"  skipping {kind}-{n}: no network namespaces", flush=True)
            continue
        r.memcpy(f"before-{kind}{n}")
        for coll in colls:
            for rnd in range(1, a.rounds + 1):
                for part in r.parts():
                    for lib in LIBS:  # A, B, A, B, ...
                        r.launch(lib, coll, kind, n, rnd, part)
    r.memcpy("end")
    meta = {
        "command": a.command, "quick": a.quick, "rounds": a.rounds,
        "sizes": f"{a.minbytes}..{a.maxbytes} x{a.factor}", "iters": a.iters,
        "small_iters": a.small_iters if len(r.parts()) > 1 else None,
        "small_max": a.small_max,
        "warmup": a.warmup, "configs": a.configs, "collectives": a.colls,
        "start_utc": t_start, "end_utc": utcnow(), "host": platform.node(),
        "kernel": platform.release(), "nproc": os.cpu_count(), "cpu": cpu_model(),
        "openmpi": a.ompi_version, "shm_btl": a.shm_btl, "git": a.git,
        "hetccl_perf": a.perf, "lib": a.lib,
        "namespaces": {"a": a.ns_a, "b": a.ns_b, "if_a": a.if_a, "if_b": a.if_b,
                       "subnet": a.subnet},
    }
    res = {"meta": meta, "launches": r.launches, "rows": r.rows}
    base = os.path.join(a.outdir, a.prefix)
    with open(base + ".json", "w") as f:  # one row per line: small and diffable
        f.write('{"meta": ' + json.dumps(meta, indent=1) + ',\n "launches": [\n')
        f.write(",\n".join(json.dumps(x) for x in r.launches))
        f.write('\n ],\n "rows": [\n')
        f.write(",\n".join(json.dumps(x) for x in r.rows))
        f.write("\n ]\n}\n")
    with open(base + ".csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS)
        w.writeheader()
        for row in r.rows:
            w.writerow(row)
    print(f"# wrote {base}.csv and {base}.json ({len(r.rows)} rows, {len(r.launches)} launches)")
    bad = report(res, a.outdir, a.plot_prefix, base + ".md")
    import shutil
    shutil.rmtree(a.tmpdir, ignore_errors=True)
    return 1 if bad else 0


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()

# -------------------------------------------------------------- reporting ---


def med(xs):
    xs = [x for x in xs if x is not None and not (isinstance(x, float) and math.isnan(x))]
    return statistics.median(xs) if xs else None


def human(n):
    for unit, f in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= f and n % f == 0:
            return f"{n // f} {unit}"
    return f"{n} B"


def fmt(v, d=2):
    if v is None:
        return "–"
    if v != 0 and abs(v) < 10 ** -d:
        return f"{v:.{d}g}" if d > 0 else f"{v:.1g}"
    return f"{v:,.{d}f}"


def summarize(res):
    """{(config, nranks, coll): {size: stats}} and {size: memcpy GB/s}."""
    rows = [r for r in res["rows"] if r["size"] is not None and r["busbw"] is not None]
    mem = {}
    for r in rows:
        if r["lib"] == "memcpy":
            mem.setdefault(r["size"], []).append(r["busbw"])
    mem = {s: med(v) for s, v in mem.items()}
    by = {}
    for r in rows:
        if r["lib"] == "memcpy":
            continue
        key = (r["config"], r["nranks"], r["collective"])
        d = by.setdefault(key, {}).setdefault(r["size"], {l: {} for l in LIBS})
        d[r["lib"]][r["round"]] = r
    out = {}
    for key, sizes in by.items():
        for size, d in sorted(sizes.items()):
            h, o = d["hetccl"], d["openmpi"]
            pairs = [k for k in h if k in o]
            bw_ratios = [h[k]["busbw"] / o[k]["busbw"] for k in pairs if o[k]["busbw"]]
            t_ratios = [h[k]["time_us"] / o[k]["time_us"] for k in pairs
                        if o[k]["time_us"] and h[k]["time_us"] is not None]
            hb = med([x["busbw"] for x in h.values()])
            m = mem.get(size)
            out.setdefault(key, {})[size] = {
                "h_busbw": hb, "o_busbw": med([x["busbw"] for x in o.values()]),
                "h_time": med([x["time_us"] for x in h.values()]),
                "o_time": med([x["time_us"] for x in o.values()]),
                "ratio": med(bw_ratios), "ratio_min": min(bw_ratios) if bw_ratios else None,
                "ratio_max": max(bw_ratios) if bw_ratios else None,
                "t_ratio": med(t_ratios), "pairs": len(bw_ratios),
                "mem": m, "h_mem": hb / m if (hb is not None and m) else None,
                "wrong": sum((x["wrong"] or 0) for x in list(h.values()) + list(o.values())),
            }
    return out, mem


def targets(summ):
    """(description, value, goal, holds or None) per issue-5 target."""
    res = []

    def get(cfg, n, coll):
        return summ.get((cfg, n, coll), {})

    def near(tab, size):
        if size in tab:
            return size
        return None

    def bw(cfg, n, coll, size, goal, what):
        tab = get(cfg, n, coll)
        s = near(tab, size)
        v = tab[s]["ratio"] if s else None
        res.append((what, v, f"≥ {goal}×", None if v is None else v >= goal))

    bw("shm", 2, "allreduce", 64 << 20, 2.5, "2-rank shm allreduce 64 MiB busbw ÷ OpenMPI")
    bw("shm", 2, "allreduce", 1 << 20, 1.5, "2-rank shm allreduce 1 MiB busbw ÷ OpenMPI")
    tab = get("shm", 2, "allreduce")
    small = min(tab) if tab else None
    v = tab[small]["t_ratio"] if small is not None else None
    res.append((f"2-rank shm allreduce {human(small) if small else '8 B'} latency ÷ OpenMPI",
                v, "≤ 1×", None if v is None else v <= 1.0))
    tab = get("shm", 4, "allreduce")
    big = [s for s in tab if s >= 1 << 20 and tab[s]["ratio"] is not None]
    v = min(tab[s]["ratio"] for s in big) if big else None
    worst = min(big, key=lambda s: tab[s]["ratio"]) if big else None
    res.append((f"4-rank shm allreduce, every size ≥ 1 MiB: busbw ÷ OpenMPI (worst: "
                f"{human(worst) if worst else '–'})", v, "≥ 1.5×", None if v is None else v >= 1.5))
    sm = [s for s in tab if s <= 4096 and tab[s]["t_ratio"] is not None]
    v = max(tab[s]["t_ratio"] for s in sm) if sm else None
    worst = max(sm, key=lambda s: tab[s]["t_ratio"]) if sm else None
    res.append((f"4-rank shm allreduce, sizes ≤ 4 KiB: latency ÷ OpenMPI (worst: "
                f"{human(worst) if worst else '–'})", v, "≤ 2×", None if v is None else v <= 2.0))
    bw("shm", 2, "allgather", 64 << 20, 1.1, "2-rank shm allgather 64 MiB busbw ÷ OpenMPI")
    bw("shm", 2, "broadcast", 64 << 20, 1.1, "2-rank shm broadcast 64 MiB busbw ÷ OpenMPI")
    bw("shm", 2, "reducescatter", 64 << 20, 3.0, "2-rank shm reducescatter 64 MiB busbw ÷ OpenMPI")
    bw("tcp", 2, "allreduce", 64 << 20, 1.5, "2-rank TCP (netns) allreduce 64 MiB busbw ÷ OpenMPI")
    return res


KEY_SIZES = [8, 1024, 65536, 1 << 20, 16 << 20, 64 << 20, 256 << 20]


def report(res, outdir, plot_prefix, md_path=None):
    summ, mem = summarize(res)
    lines = []
    meta = res["meta"]
    lines.append(f"# bench-scripts/compare results ({'quick' if meta.get('quick') else 'full'} run)")
    lines.append("")
    lines.append(f"Run {meta['start_utc']} – {meta['end_utc']} on {meta['host']} "
                 f"({meta['nproc']} CPUs, {meta['cpu']}, Linux {meta['kernel']}), "
                 f"{meta['openmpi']}, git {meta['git']}. Sizes {meta['sizes']}, "
                 f"-n {meta['iters']}"
                 + (f" (-n {meta['small_iters']} up to {meta['small_max']}, a launch of its own)"
                    if meta.get("small_iters") else "")
                 + f" -w {meta['warmup']}, {meta['rounds']} rounds.")
    lines.append("")
    lines.append(f"Command: `{meta['command']}`")
    lines.append("")
    lines.append("ratio = median over rounds of (hetccl busbw ÷ OpenMPI busbw) of "
                 "consecutive launches; t-ratio the same for time; ÷ mem = hetccl busbw ÷ "
                 "single-core memcpy bytes/s at that size. busbw in GB/s, time in µs.")
    bad = []
    for l in res["launches"]:
        if l["status"] != "ok":
            bad.append(l)
    for (cfg, n, coll), tab in sorted(summ.items(), key=lambda kv: (kv[0][0] != "shm", kv[0][1],
                                                                   COLLS.index(kv[0][2]))):
        lines.append("")
        lines.append(f"## {coll}, {n} ranks, {cfg}")
        lines.append("")
        lines.append("| size | hetccl busbw | OpenMPI busbw | ratio (min–max) | hetccl time | "
                     "OpenMPI time | t-ratio | memcpy GB/s | ÷ mem | pairs |")
        lines.append("|---:|---:|---:|---:|---:|---:|---:|---:|---:|:-:|")
        for size, s in sorted(tab.items()):
            rng = (f" ({fmt(s['ratio_min'])}–{fmt(s['ratio_max'])})"
                   if s["pairs"] > 1 else "")
            wrong = f" **{s['wrong']} wrong**" if s["wrong"] else ""
            lines.append(f"| {human(size)} | {fmt(s['h_busbw'], 3)} | {fmt(s['o_busbw'], 3)} | "
                         f"{fmt(s['ratio'])}{rng} | {fmt(s['h_time'])} | {fmt(s['o_time'])} | "
                         f"{fmt(s['t_ratio'])} | {fmt(s['mem'], 1)} | {fmt(s['h_mem'], 3)} | "
                         f"{s['pairs']}{wrong} |")
    lines.append("")
    lines.append("## Key sizes")
    lines.append("")
    lines.append("h/o = hetccl / OpenMPI medians; ratio = median pairwise ratio (busbw, or "
                 "time for the smallest size); ÷ mem = hetccl busbw ÷ memcpy bytes/s.")
    lines.append("")
    lines.append("| collective | ranks, transport | smallest size: time h/o (µs) | t-ratio | "
                 "64 KiB ratio | 1 MiB busbw h/o | ratio | largest: busbw h/o | ratio | ÷ mem |")
    lines.append("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for (cfg, n, coll), tab in sorted(summ.items(), key=lambda kv: (COLLS.index(kv[0][2]),
                                                                   kv[0][0] != "shm", kv[0][1])):
        lo, hi = min(tab), max(tab)
        a, b, c = tab[lo], tab.get(65536, {}), tab.get(1 << 20, {})
        z = tab[hi]
        lines.append(
            f"| {coll} | {n}, {cfg} | {human(lo)}: {fmt(a['h_time'])} / {fmt(a['o_time'])} | "
            f"{fmt(a['t_ratio'])} | {fmt(b.get('ratio'))} | "
            f"{fmt(c.get('h_busbw'))} / {fmt(c.get('o_busbw'))} | {fmt(c.get('ratio'))} | "
            f"{human(hi)}: {fmt(z['h_busbw'])} / {fmt(z['o_busbw'])} | {fmt(z['ratio'])} | "
            f"{fmt(z['h_mem'], 3)} |")
    lines.append("")
    lines.append("## Targets (from the medians above)")
    lines.append("")
    lines.append("| target | measured | goal | holds |")
    lines.append("|---|---:|---:|:-:|")
    for what, v, goal, ok in targets(summ):
        lines.append(f"| {what} | {fmt(v)}× | {goal} | "
                     f"{'–' if ok is None else ('yes' if ok else '**no**')} |")
    lines.append("")
    if bad:
        lines.append("## Launches that failed or reported wrong results")
        lines.append("")
        for l in bad:
            lines.append(f"* launch {l['launch']} {l['lib']} {l['collective']} {l['config']}-"
                         f"{l['nranks']} round {l['round']}: {l['status']} (log {l['log']})")
    else:
        lines.append("Every launch succeeded and every #wrong was 0.")
    text = "\n".join(lines) + "\n"
    print()
    print(text)
    if md_path:
        with open(md_path, "w") as f:
            f.write(text)
    try:
        plots(summ, mem, outdir, plot_prefix, meta)
    except ImportError as e:
        print(f"# no plots: {e}")
    return bad


def plots(summ, mem, outdir, prefix, meta):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    colors = {("shm", 2): "tab:blue", ("shm", 4): "tab:green", ("tcp", 2): "tab:red"}
    for coll in COLLS:
        keys = [k for k in summ if k[2] == coll]
        if not keys:
            continue
        fig, ax = plt.subplots(figsize=(9, 5.5))
        for cfg, n, _ in sorted(keys):
            tab = summ[(cfg, n, coll)]
            xs = sorted(tab)
            c = colors.get((cfg, n), None)
            for lib, key, style in (("hetccl", "h_busbw", "-o"), ("OpenMPI", "o_busbw", "--s")):
                pts = [(x, tab[x][key]) for x in xs if tab[x][key]]
                if pts:
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], style, color=c,
                            markersize=3.5, label=f"{lib} {cfg} {n} ranks")
        if mem:
            xs = sorted(mem)
            ax.plot(xs, [mem[x] for x in xs], ":", color="black", label="memcpy, 1 core (copied B/s)")
        ax.set_xscale("log", base=2)
        top = max(max(summ[k]) for k in keys)
        ticks = [t for t in (8 << (3 * k) for k in range(10)) if t <= top]
        ax.set_xticks(ticks)
        ax.set_xticklabels([human(t).replace(" ", "") for t in ticks])
        ax.set_yscale("log")
        ax.set_xlabel("message size (bytes)")
        ax.set_ylabel("busbw (GB/s), median over rounds")
        ompi = re.sub(r"^mpirun \((.*)\)", r"\1", meta.get("openmpi", "OpenMPI"))
        ax.set_title(f"{coll}: hetccl vs {ompi}, float sum, busbw "
                     f"({meta['start_utc'][:16]}Z, {meta['rounds']} rounds)")
        ax.grid(True, which="major", alpha=0.4)
        ax.legend(fontsize=8, loc="upper left")
        fig.tight_layout()
        path = os.path.join(outdir, f"{prefix}{coll}.png")
        fig.savefig(path, dpi=90)
        plt.close(fig)
        print(f"# plot {path}")


def cmd_report(a):
    with open(a.results) as f:
        res = json.load(f)
    md = os.path.splitext(a.results)[0] + ".md"
    bad = report(res, a.outdir or os.path.dirname(a.results), a.plot_prefix, md)
    return 1 if bad else 0


def cmd_parse(a):
    with open(a.file) as f:
        rows, footer = parse_table(f.read())
    json.dump({"rows": rows, "footer": footer}, sys.stdout, indent=1)
    print()
    return 0


def cmd_selftest(_a):
    """Parses the captured samples of both programs, as CI does."""
    sdir = os.path.join(HERE, "samples")
    names = sorted(f for f in os.listdir(sdir) if f.endswith(".txt"))
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
    if len(names) < 2:
        print("expected samples of hetccl-perf and mpi_coll")
        ok = False
    return 0 if ok else 1


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--quick", action="store_true")
    r.add_argument("--rounds", type=int, default=3)
    r.add_argument("--configs", default="shm-2,shm-4,tcp-2")
    r.add_argument("--colls", default=",".join(COLLS))
    r.add_argument("--minbytes", default="8")
    r.add_argument("--maxbytes", default="256M")
    r.add_argument("--factor", type=int, default=2)
    r.add_argument("--iters", type=int, default=20)
    r.add_argument("--small-iters", type=int, default=0,
                   help="-n for sizes up to --small-max (0: --iters everywhere)")
    r.add_argument("--small-max", default="4K")
    r.add_argument("--warmup", type=int, default=1)
    r.add_argument("--timeout", type=int, default=300, help="seconds per launch")
    r.add_argument("--perf", required=True)
    r.add_argument("--lib", default=None)
    r.add_argument("--mpi-coll", required=True)
    r.add_argument("--memcpy", required=True)
    r.add_argument("--mem-minbytes", default="8")
    r.add_argument("--mem-secs", type=float, default=0.2)
    r.add_argument("--shm-btl", default="vader")
    r.add_argument("--ompi-version", default="Open MPI")
    r.add_argument("--ns-a", default="")
    r.add_argument("--ns-b", default="")
    r.add_argument("--if-a", default="")
    r.add_argument("--if-b", default="")
    r.add_argument("--subnet", default="")
    r.add_argument("--outdir", required=True)
    r.add_argument("--prefix", default="compare-results")
    r.add_argument("--plot-prefix", default="compare-")
    r.add_argument("--logdir", required=True)
    r.add_argument("--git", default="")
    r.add_argument("--command", default="bench-scripts/compare")
    q = sub.add_parser("report")
    q.add_argument("results")
    q.add_argument("--outdir", default=None)
    q.add_argument("--plot-prefix", default="compare-")
    s = sub.add_parser("parse")
    s.add_argument("file")
    sub.add_parser("selftest")
    a = p.parse_args()
    if a.cmd == "run":
        a.mem_minbytes = a.minbytes
        return cmd_run(a)
    return {"report": cmd_report, "parse": cmd_parse, "selftest": cmd_selftest}[a.cmd](a)


if __name__ == "__main__":
    sys.exit(main())
