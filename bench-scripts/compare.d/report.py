"""The report of bench-scripts/compare: medians and ratios per (config,
collective, size), the memory-limit fractions, the coalescing ratio, the
targets, the markdown tables and the plots."""
import math
import os
import re
import statistics

from tables import (COALESCE_BYTES, COALESCE_MSGS, COLLS, LIBS, LIMIT_SIZE, min_traffic)

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
        if r["lib"] not in LIBS:
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


def mem_launches(res):
    """{round tag: {"copy", "add": GB/s}} per mem_limit launch; the copy
    rate is the faster of memcpy and ntcopy."""
    per = {}
    for r in res["rows"]:
        if r["lib"] == "memlimit" and r["busbw"] is not None:
            per.setdefault(r["launch"], {"tag": r["round"]})[r["collective"]] = r["busbw"]
    out = {}
    for v in per.values():
        copy = max(v.get("memcpy", 0), v.get("ntcopy", 0))
        out[v["tag"]] = {"copy": copy or None, "add": v.get("add")}
    return out


def mem_bw(res):
    """{"copy", "add": GB/s}: medians over every mem_limit launch."""
    per = mem_launches(res).values()
    return {"copy": med([v["copy"] for v in per]), "add": med([v["add"] for v in per]),
            "launches": len(per)}


def limit_tag(cfg, n, coll, rnd):
    """The round tag of the mem_limit launch run right before round `rnd`'s
    hetccl launch of (cfg, n, coll)."""
    return f"{cfg}{n}-{coll}-r{rnd}"


def limits(res, size=LIMIT_SIZE):
    """One dict per shm (nranks, collective) measured at `size`: its least
    traffic, kernel, and per round the limit time (µs) at the bandwidth that
    round's mem_limit launch measured and the fraction limit ÷ hetccl time;
    medians over rounds (rounds without their own mem_limit launch use the
    median bandwidth of all launches)."""
    per = mem_launches(res)
    every = mem_bw(res)
    times = {}
    for r in res["rows"]:
        if (r["lib"] == "hetccl" and r["config"] == "shm" and r["size"] == size
                and r["time_us"]):
            times.setdefault((r["nranks"], r["collective"]), {})[r["round"]] = r["time_us"]
    out = []
    for (n, coll), rounds in sorted(times.items(), key=lambda kv: (kv[0][0],
                                                                  COLLS.index(kv[0][1]))):
        traffic, kern = min_traffic(coll, n, size)
        lim, frac, bws = [], [], []
        for rnd, h in sorted(rounds.items()):
            gbs = per.get(limit_tag("shm", n, coll, rnd), every)[kern]
            if gbs:
                t = traffic / (gbs * 1e9) * 1e6
                lim.append(t)
                frac.append(t / h)
                bws.append(gbs)
        out.append({"collective": coll, "nranks": n, "config": "shm", "size": size,
                    "traffic": traffic, "kernel": kern, "bw_gbs": med(bws),
                    "limit_us": med(lim), "hetccl_us": med(list(rounds.values())),
                    "fraction": med(frac), "fraction_min": min(frac) if frac else None,
                    "fraction_max": max(frac) if frac else None, "rounds": len(frac)})
    return out


def coalescing(res):
    """Medians of the coalescing launches: µs per group off and on, their
    ratio (off / on) and the pairwise ratios' range; None without launches."""
    per = {"off": {}, "on": {}}
    for r in res["rows"]:
        if r["lib"] in ("coalesce-off", "coalesce-on") and r["time_us"]:
            per[r["lib"][9:]][r["round"]] = r["time_us"]
    if not per["off"] or not per["on"]:
        return None
    pairs = [per["off"][k] / per["on"][k] for k in per["off"] if k in per["on"]]
    off, on = med(list(per["off"].values())), med(list(per["on"].values()))
    return {"msgs": COALESCE_MSGS, "bytes": COALESCE_BYTES, "off_us": off, "on_us": on,
            "off_range": [min(per["off"].values()), max(per["off"].values())],
            "on_range": [min(per["on"].values()), max(per["on"].values())],
            "ratio": off / on, "pair_min": min(pairs) if pairs else None,
            "pair_max": max(pairs) if pairs else None, "rounds": len(pairs)}


def targets(summ, lims=(), coal=None):
    """(description, value, goal, holds or None) per target."""
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
    for lim in lims:
        if lim["nranks"] == 2 and lim["collective"] != "broadcast":
            v = lim["fraction"]
            res.append((f"2-rank shm {lim['collective']} 64 MiB: memory limit time ÷ hetccl time",
                        v, "≥ 0.7×", None if v is None else v >= 0.7))
    if coal is not None:
        v = coal["ratio"]
        res.append((f"coalescing: {COALESCE_MSGS} × {COALESCE_BYTES} B sends over TCP, "
                    "time off ÷ on", v, "≥ 5×", v >= 5.0))
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
                 + "".join(f" (-n {meta[k + '_iters']} up to {meta[k + '_max']}, a launch of its own)"
                           for k in ("small", "mid") if meta.get(k + "_iters"))
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
    bw = mem_bw(res)
    lims = limits(res)
    coal = coalescing(res)
    lines.append("")
    lines.append("## Memory limit at 64 MiB (shm)")
    lines.append("")
    lines.append(f"mem_limit, 2 threads pinned one per CPU, one launch right before each "
                 f"round's hetccl launch ({bw['launches']} launches; medians copy "
                 f"{fmt(bw['copy'], 1)} GB/s, add {fmt(bw['add'], 1)} GB/s, bytes read + written "
                 "per second). Least traffic (S = size): allreduce 2·n·S and reducescatter "
                 "(n+1)·S at the add rate, allgather and broadcast (n+1)·S at the copy rate. "
                 "Per round: limit time = traffic ÷ that round's rate, fraction = limit time "
                 "÷ hetccl time (1 = at the limit); medians over rounds.")
    lines.append("")
    lines.append("| collective | ranks | least traffic | kernel | rate GB/s | limit time (µs) | "
                 "hetccl time (µs) | fraction (min–max) |")
    lines.append("|---|---:|---:|---|---:|---:|---:|---:|")
    for lim in lims:
        rng = (f" ({fmt(lim['fraction_min'], 3)}–{fmt(lim['fraction_max'], 3)})"
               if lim["rounds"] > 1 else "")
        lines.append(f"| {lim['collective']} | {lim['nranks']} | "
                     f"{fmt(lim['traffic'] / (1 << 20), 0)} MiB | {lim['kernel']} | "
                     f"{fmt(lim['bw_gbs'], 1)} | {fmt(lim['limit_us'], 0)} | "
                     f"{fmt(lim['hetccl_us'], 0)} | {fmt(lim['fraction'], 3)}{rng} |")
    if not lims:
        lines.append("| (no shm sweep reached 64 MiB) | | | | | | | |")
    lines.append("")
    lines.append("## Coalescing")
    lines.append("")
    if coal:
        lines.append(f"hetccl-perf sendrecv -np 2 --hosts 2 -b {COALESCE_BYTES} -e "
                     f"{COALESCE_BYTES} -m {COALESCE_MSGS} (TCP over loopback), "
                     f"HETCCL_COALESCE_BYTES=0 and default in turn, {coal['rounds']} rounds:")
        lines.append("")
        lines.append("| HETCCL_COALESCE_BYTES | median µs per group | min | max |")
        lines.append("|---|---:|---:|---:|")
        lines.append(f"| 0 (off) | {fmt(coal['off_us'], 0)} | {fmt(coal['off_range'][0], 0)} | "
                     f"{fmt(coal['off_range'][1], 0)} |")
        lines.append(f"| default | {fmt(coal['on_us'], 0)} | {fmt(coal['on_range'][0], 0)} | "
                     f"{fmt(coal['on_range'][1], 0)} |")
        lines.append("")
        lines.append(f"coalescing ratio (off ÷ on, medians): {fmt(coal['ratio'])}× "
                     f"(pairwise {fmt(coal['pair_min'])}–{fmt(coal['pair_max'])})")
    else:
        lines.append("Not measured (--coalesce-rounds 0, or every launch failed).")
    lines.append("")
    lines.append("## Targets (from the medians above)")
    lines.append("")
    lines.append("| target | measured | goal | holds |")
    lines.append("|---|---:|---:|:-:|")
    for what, v, goal, ok in targets(summ, lims, coal):
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
