#!/usr/bin/env python3
"""Summarises bench-scripts/net-bench.sh output: medians, medians of pairwise
(same round, same link) ratios, a markdown table, a JSON file and a PNG plot.

usage: net-summarize.py [--tune] RAW_FILE OUT_DIR
"""
import json
import os
import statistics
import sys
from collections import defaultdict


def parse(path):
    rows = []
    for line in open(path):
        if "RESULT" not in line or line.startswith("#"):
            continue
        head, res = line.split("RESULT", 1)
        kv = dict(x.split("=", 1) for x in head.split() if "=" in x)
        parts = res.split()
        if not parts or parts[0] == "failed":
            continue
        kv["kind"] = parts[0]
        kv.update(dict(x.split("=", 1) for x in parts[1:] if "=" in x))
        rows.append(kv)
    return rows


def med(v):
    v = [x for x in v if x == x]
    return statistics.median(v) if v else float("nan")


def gbs(x):
    return x / 1e9


def summarize(rows, out):
    by = defaultdict(dict)  # (round, link) -> metrics
    sweep = defaultdict(lambda: defaultdict(list))  # link -> size -> [B/s]
    loads = []
    for r in rows:
        key = (r["round"], r["link"])
        k = r["kind"]
        if k == "tput":
            sweep[r["link"]][int(r["size"])].append(float(r["bytes_per_s"]))
            if int(r["size"]) == 64 << 20:
                by[key]["plugin"] = float(r["bytes_per_s"])
        elif k in ("iperf3", "iperf3_l1m"):
            by[key][k] = float(r["bytes_per_s"])
            by[key]["streams"] = int(r["streams"])
        elif k in ("lat", "tcplat", "tcplat2"):
            by[key][k] = float(r["rtt_us"])
            if "p50_us" in r:
                by[key][k + "_p50"] = float(r["p50_us"])
        if "load" in r:
            loads.append(float(r["load"]))
    result = {"links": {}}
    lines = [
        "| link | plugin 64 MiB (GB/s) | iperf3 -P n (GB/s) | ratio | iperf3 -P n -l 1M (GB/s) | ratio "
        "| plugin 8 B RTT (µs) | TCP ping-pong, 1 socket (µs) | ratio | TCP ping-pong, 2 sockets (µs) | ratio | rounds |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for link in sorted({k[1] for k in by}):
        ms = [m for (rd, l), m in sorted(by.items()) if l == link]
        def vals(name):
            return [m[name] for m in ms if name in m]
        def ratios(a, b):
            return [m[a] / m[b] for m in ms if a in m and b in m and m[b] > 0]
        d = {
            "plugin_Bps": med(vals("plugin")),
            "iperf3_Bps": med(vals("iperf3")),
            "iperf3_l1m_Bps": med(vals("iperf3_l1m")),
            "tput_ratio_vs_iperf3": med(ratios("plugin", "iperf3")),
            "tput_ratio_vs_iperf3_l1m": med(ratios("plugin", "iperf3_l1m")),
            "plugin_rtt_us": med(vals("lat")),
            "tcp_rtt_us": med(vals("tcplat")),
            "lat_ratio_vs_tcp": med(ratios("lat", "tcplat")),
            "tcp2_rtt_us": med(vals("tcplat2")),
            "lat_ratio_vs_tcp2": med(ratios("lat", "tcplat2")),
            "plugin_p50_us": med(vals("lat_p50")),
            "tcp_p50_us": med(vals("tcplat_p50")),
            "tcp2_p50_us": med(vals("tcplat2_p50")),
            "p50_ratio_vs_tcp": med(ratios("lat_p50", "tcplat_p50")),
            "p50_ratio_vs_tcp2": med(ratios("lat_p50", "tcplat2_p50")),
            "streams": (vals("streams") or [0])[0],
            "rounds": len(ms),
            "per_round": ms,
            "sweep_Bps": {str(s): med(v) for s, v in sorted(sweep[link].items())},
        }
        result["links"][link] = d
        lines.append(
            f"| {link} | {gbs(d['plugin_Bps']):.2f} | {gbs(d['iperf3_Bps']):.2f} | **{d['tput_ratio_vs_iperf3']:.2f}** "
            f"| {gbs(d['iperf3_l1m_Bps']):.2f} | {d['tput_ratio_vs_iperf3_l1m']:.2f} "
            f"| {d['plugin_rtt_us']:.1f} | {d['tcp_rtt_us']:.1f} | **{d['lat_ratio_vs_tcp']:.2f}** "
            f"| {d['tcp2_rtt_us']:.1f} | {d['lat_ratio_vs_tcp2']:.2f} | {d['rounds']} |"
        )
    p50 = ["", "8-byte round trip, median of the individual round trips (robust to the "
           "preemptions that dominate the batch means above under load; µs):", "",
           "| link | plugin | TCP, 1 socket | ratio | TCP, 2 one-way connections | ratio | rounds |",
           "|---|---:|---:|---:|---:|---:|---:|"]
    for link, d in sorted(result["links"].items()):
        p50.append(f"| {link} | {d['plugin_p50_us']:.1f} | {d['tcp_p50_us']:.1f} | **{d['p50_ratio_vs_tcp']:.2f}** "
                   f"| {d['tcp2_p50_us']:.1f} | {d['p50_ratio_vs_tcp2']:.2f} | {d['rounds']} |")
    if loads:
        result["load_average"] = {"min": min(loads), "median": med(loads), "max": max(loads)}
        p50 += ["", f"1-minute load average during the run (2 vCPUs): min {min(loads):.1f}, "
                f"median {med(loads):.1f}, max {max(loads):.1f}."]
    lines += p50
    sw = ["", "Throughput by message size (median over rounds, GB/s):", "",
          "| size | " + " | ".join(sorted(sweep)) + " |", "|---:|" + "---:|" * len(sweep)]
    sizes = sorted({s for l in sweep for s in sweep[l]})
    for s in sizes:
        sw.append(f"| {s} | " + " | ".join(f"{gbs(med(sweep[l].get(s, []))):.2f}" for l in sorted(sweep)) + " |")
    md = "\n".join(lines + sw) + "\n"
    with open(os.path.join(out, "net-results.md"), "w") as f:
        f.write(md)
    with open(os.path.join(out, "net-results.json"), "w") as f:
        json.dump(result, f, indent=1)
    print(md)
    plot(sweep, result, os.path.join(out, "net-throughput.png"))


def plot(sweep, result, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib missing: no plot")
        return
    fig, ax = plt.subplots(figsize=(7, 4.2))
    colors = {"lo": "tab:blue", "veth": "tab:orange"}
    for link in sorted(sweep):
        xs = sorted(sweep[link])
        ax.plot(xs, [gbs(med(sweep[link][x])) for x in xs], "o-", color=colors.get(link), label=f"hetccl plugin ({link})")
        d = result["links"].get(link, {})
        if d.get("iperf3_Bps") == d.get("iperf3_Bps"):
            ax.axhline(gbs(d["iperf3_Bps"]), color=colors.get(link), ls="--", lw=1,
                       label=f"iperf3 -P {d.get('streams')} ({link})")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("throughput (GB/s)")
    ax.set_title("NCCL net plugin over TCP, 2 processes, 4 messages in flight")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print("wrote", path)


def tune(rows, out):
    per = defaultdict(list)  # (link, size, cfg) -> [(round, B/s)]
    base = defaultdict(dict)  # (round, link, size) -> cfg -> B/s
    for r in rows:
        if r["kind"] != "tput":
            continue
        size = int(r["size"])
        per[(r["link"], size, r["tune"])].append(float(r["bytes_per_s"]))
        base[(r["round"], r["link"], size)][r["tune"]] = float(r["bytes_per_s"])
    ref = "0x0"
    lines = [
        "Throughput by data-socket setup: `t x s` = NCCL_SOCKET_NTHREADS x NCCL_NSOCKS_PERTHREAD "
        "(0 threads: the caller's progress drives s sockets; 0x0: everything on the control socket).",
        "",
        f"| link | size | t x s | median (GB/s) | median ratio to {ref} (same round) | rounds |",
        "|---|---:|---|---:|---:|---:|",
    ]
    def order(c):
        t, s_ = (int(x) for x in c.split("x"))
        return (t > 0, t * max(s_, 1) if t else s_, c)
    for (link, size) in sorted({(k[0], k[1]) for k in per}):
        for cfg in sorted({k[2] for k in per if k[0] == link and k[1] == size}, key=order):
            v = per[(link, size, cfg)]
            rat = [b[cfg] / b[ref] for (rd, l, sz), b in base.items() if l == link and sz == size and cfg in b and ref in b]
            lines.append(f"| {link} | {size} | {cfg} | {gbs(med(v)):.2f} | {med(rat):.2f} | {len(v)} |")
    md = "\n".join(lines) + "\n"
    with open(os.path.join(out, "net-tune.md"), "w") as f:
        f.write(md)
    print(md)


if __name__ == "__main__":
    args = sys.argv[1:]
    t = args and args[0] == "--tune"
    if t:
        args = args[1:]
    rows = parse(args[0])
    (tune if t else summarize)(rows, args[1])
