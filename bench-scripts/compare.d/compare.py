#!/usr/bin/env python3
"""Driver, parser and reporter of bench-scripts/compare.

    compare.py run    [options]      launches A/B rounds, writes CSV/JSON/plots
    compare.py report RESULTS.json   re-prints tables/targets, redraws plots
    compare.py parse  FILE           nccl-tests table -> JSON rows (stdout)
    compare.py selftest              parses the captured samples in samples/

The parsers and formulas are in tables.py, the report in report.py, the
self-test in selftest.py (all in this directory).

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
  * ÷ mem: busbw (GB/s) / single-core memcpy of the same size (memcpy_bw,
    bytes copied per second): the share of one core's copy rate the
    collective's busbw reaches.
  * memory limit (mem_limit.c): 2 threads, one per CPU, copy (the faster of
    memcpy and a streaming-store copy) and float add c = a + b, as bytes read
    + written per second, measured right before each round's hetccl launch
    of every shm sweep that reaches 64 MiB. A collective's limit time is its
    least memory traffic (tables.min_traffic) at that round's rate of its
    kernel; the fraction is limit time / hetccl time (1 = at the memory
    limit), median over rounds.
  * coalescing ratio: a group of 64 ncclSend of 64 B (and the 64 matching
    ncclRecv) between 2 ranks over TCP on loopback, time per group with
    HETCCL_COALESCE_BYTES=0 / time with the default, medians over rounds
    (the same measurement as bench-scripts/coalesce).
"""
import argparse
import csv
import datetime as dt
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time

from report import coalescing, limit_tag, limits, report
from tables import (BUSBW_FACTOR, COALESCE_BYTES, COALESCE_MSGS, COLLS, FIELDS, LIBS,
                    LIMIT_SIZE, PERF_NAME, group_time_us, parse_mem_limit, parse_memcpy,
                    parse_table)

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
        a few microseconds, which one preemption doubles), sizes up to
        --mid-max with --mid-iters (a -n 20 loop of 64 KiB calls still
        lasts about 100 us, and the first calls on fresh buffers weigh),
        the rest with --iters. A bucket whose -n is 0 is left out; one part
        when no size falls in a bucket."""
        a = self.a
        buckets = [(size_bytes(cut), n) for cut, n in
                   ((a.small_max, a.small_iters), (a.mid_max, a.mid_iters)) if n > 0]

        def iters_for(size):
            return next((n for cut, n in buckets if size <= cut), a.iters)

        out = []
        for size in self.sizes():
            n = iters_for(size)
            if out and out[-1][2] == n:
                out[-1][1] = size
            else:
                out.append([size, size, n])
        if len(out) == 1:
            return [(a.minbytes, a.maxbytes, out[0][2])]
        return [(str(lo), str(hi), n) for lo, hi, n in out]

    def iters_note(self):
        """How the sweep's -n differs by size, for the headers."""
        a = self.a
        notes = [f"-n {n} up to {cut}" for cut, n in
                 ((a.small_max, a.small_iters), (a.mid_max, a.mid_iters)) if n > 0]
        return f" ({', '.join(notes)})" if notes and len(self.parts()) > 1 else ""

    def sizes(self):
        """Every size of the sweep (nccl-tests' -b/-e/-f steps)."""
        lo, hi = size_bytes(self.a.minbytes), size_bytes(self.a.maxbytes)
        out = []
        while lo <= hi:
            out.append(lo)
            lo *= self.a.factor
        return out

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
            # tcp: one process per namespace, rendezvous through --id-file,
            # each pinned to its own core as mpirun pins OpenMPI's ranks
            idf = os.path.join(a.tmpdir, f"perf-{self.n}.id")
            cmds, envs = [], []
            for rank, (ns, ifn) in enumerate([(a.ns_a, a.if_a), (a.ns_b, a.if_b)]):
                cmds.append(["ip", "netns", "exec", ns] + perf
                            + ["--id-file", idf, "--bind-to", "core"])
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


    def mem_limit(self, tag):
        """Runs mem_limit once; rows lib=memlimit, collective=kernel, busbw
        = traffic GB/s."""
        a = self.a
        self.n += 1
        cmd = [a.mem_limit, "-t", str(a.mem_limit_secs)]
        start, l1, t0 = utcnow(), load1(), time.monotonic()
        rc, out, err = self.spawn([cmd], [{}], a.timeout)
        secs = time.monotonic() - t0
        log = self._log(f"mem_limit-{tag}", [cmd], out, err, rc, secs)
        m, per_array = parse_mem_limit(out)
        ok = rc == 0 and "add" in m and ("memcpy" in m or "ntcopy" in m)
        status = "ok" if ok else f"failed rc={rc}"
        self.launches.append({"launch": self.n, "lib": "memlimit", "collective": "memlimit",
                              "config": "2threads", "nranks": 2, "round": tag,
                              "start_utc": start, "load1": l1, "seconds": round(secs, 2),
                              "rc": rc, "status": status, "rows": len(m), "log": log,
                              "commands": [sh(cmd)], "env": [{}]})
        for kern, bps in sorted(m.items()):
            self.rows.append({"lib": "memlimit", "collective": kern, "config": "2threads",
                              "nranks": 2, "size": per_array, "round": tag, "time_us": None,
                              "algbw": bps / 1e9, "busbw": bps / 1e9, "wrong": 0,
                              "status": status, "launch": self.n, "start_utc": start,
                              "load1": l1})
        desc = ", ".join(f"{k} {v / 1e9:.1f}" for k, v in sorted(m.items()))
        print(f"  [{start}] mem_limit {tag}: {desc} GB/s, {secs:.1f} s, load {l1}"
              + ("" if status == "ok" else f"  <-- {status}"), flush=True)

    def coalesce(self, rnd, setting):
        """One launch of the coalescing benchmark, `setting` off or on; row
        lib=coalesce-<setting>, time_us = µs per group."""
        a = self.a
        self.n += 1
        cmd = [a.perf, "sendrecv", "-np", "2", "--hosts", "2", "-b", str(COALESCE_BYTES),
               "-e", str(COALESCE_BYTES), "-m", str(COALESCE_MSGS), "-n", str(a.coalesce_iters),
               "-w", "5", "-T", str(min(a.timeout, 120))]
        if a.lib:
            cmd += ["--lib", a.lib]
        env = {"HETCCL_SOCKET_IFNAME": "lo", "NCCL_SOCKET_IFNAME": "lo"}
        if setting == "off":
            env["HETCCL_COALESCE_BYTES"] = "0"
        start, l1, t0 = utcnow(), load1(), time.monotonic()
        rc, out, err = self.spawn([cmd], [env], a.timeout)
        secs = time.monotonic() - t0
        log = self._log(f"coalesce-{setting}-r{rnd}", [cmd], out, err, rc, secs)
        t, wrong = group_time_us(out, COALESCE_BYTES, COALESCE_MSGS)
        status = "ok" if rc == 0 and t is not None else (
            "timeout" if rc in (124, 137) else f"failed rc={rc}")
        if wrong:
            status = f"WRONG ({wrong} wrong elements)"
        lib = f"coalesce-{setting}"
        self.launches.append({"launch": self.n, "lib": lib, "collective": "sendrecv",
                              "config": "tcp-lo", "nranks": 2, "round": rnd,
                              "start_utc": start, "load1": l1, "seconds": round(secs, 2),
                              "rc": rc, "status": status, "rows": 0 if t is None else 1,
                              "log": log, "commands": [sh(cmd)], "env": [env]})
        self.rows.append({"lib": lib, "collective": "sendrecv", "config": "tcp-lo",
                          "nranks": 2, "size": COALESCE_BYTES, "round": rnd, "time_us": t,
                          "algbw": None, "busbw": None, "wrong": wrong, "status": status,
                          "launch": self.n, "start_utc": start, "load1": l1})
        flag = "" if status == "ok" else f"  <-- {status} (see {log})"
        print(f"  [{start}] coalesce {setting:3s} round {rnd}: "
              f"{'–' if t is None else f'{t:.0f}'} us per group, {secs:5.1f} s, "
              f"load {l1}{flag}", flush=True)


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
          + r.iters_note()
          + f"; started {t_start}", flush=True)
    for ci, (kind, n) in enumerate(configs):
        if kind == "tcp" and not a.ns_a:
            print(f"  skipping {kind}-{n}: no network namespaces", flush=True)
            continue
        r.memcpy(f"before-{kind}{n}")
        for coll in colls:
            for rnd in range(1, a.rounds + 1):
                if kind == "shm" and LIMIT_SIZE in r.sizes():
                    r.mem_limit(limit_tag(kind, n, coll, rnd))
                for part in r.parts():
                    for lib in LIBS:  # A, B, A, B, ...
                        r.launch(lib, coll, kind, n, rnd, part)
    for rnd in range(1, a.coalesce_rounds + 1):
        for setting in ("off", "on"):
            r.coalesce(rnd, setting)
    r.memcpy("end")
    meta = {
        "command": a.command, "quick": a.quick, "rounds": a.rounds,
        "sizes": f"{a.minbytes}..{a.maxbytes} x{a.factor}", "iters": a.iters,
        "small_iters": a.small_iters if len(r.parts()) > 1 else None,
        "small_max": a.small_max,
        "mid_iters": a.mid_iters if len(r.parts()) > 1 else None,
        "mid_max": a.mid_max,
        "warmup": a.warmup, "configs": a.configs, "collectives": a.colls,
        "start_utc": t_start, "end_utc": utcnow(), "host": platform.node(),
        "kernel": platform.release(), "nproc": os.cpu_count(), "cpu": cpu_model(),
        "openmpi": a.ompi_version, "shm_btl": a.shm_btl, "git": a.git,
        "hetccl_perf": a.perf, "lib": a.lib, "coalesce_rounds": a.coalesce_rounds,
        "coalesce_iters": a.coalesce_iters,
        "namespaces": {"a": a.ns_a, "b": a.ns_b, "if_a": a.if_a, "if_b": a.if_b,
                       "subnet": a.subnet},
    }
    res = {"meta": meta, "launches": r.launches, "rows": r.rows}
    derived = {"memory_limit": limits(res), "coalesce": coalescing(res)}
    base = os.path.join(a.outdir, a.prefix)
    with open(base + ".json", "w") as f:  # one row per line: small and diffable
        f.write('{"meta": ' + json.dumps(meta, indent=1) + ',\n')
        for k, v in derived.items():
            f.write(f' "{k}": ' + json.dumps(v) + ',\n')
        f.write(' "launches": [\n')
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
    r.add_argument("--mid-iters", type=int, default=0,
                   help="-n for sizes above --small-max up to --mid-max (0: --iters)")
    r.add_argument("--mid-max", default="1M")
    r.add_argument("--warmup", type=int, default=1)
    r.add_argument("--timeout", type=int, default=300, help="seconds per launch")
    r.add_argument("--perf", required=True)
    r.add_argument("--lib", default=None)
    r.add_argument("--mpi-coll", required=True)
    r.add_argument("--memcpy", required=True)
    r.add_argument("--mem-minbytes", default="8")
    r.add_argument("--mem-secs", type=float, default=0.2)
    r.add_argument("--mem-limit", required=True, help="the mem_limit program")
    r.add_argument("--mem-limit-secs", type=float, default=0.5, help="seconds per kernel")
    r.add_argument("--coalesce-rounds", type=int, default=5,
                   help="rounds of the coalescing benchmark (0: skip)")
    r.add_argument("--coalesce-iters", type=int, default=500)
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
    if a.cmd == "selftest":
        import selftest
        return selftest.run()
    return {"report": cmd_report, "parse": cmd_parse}[a.cmd](a)


if __name__ == "__main__":
    sys.exit(main())
