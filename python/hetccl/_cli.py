"""The `hetccl` command (also `python -m hetccl`) and the `hetccl-perf`
wrapper."""

import argparse
import json
import os
import sys

from . import _native, _paths, _probe

DESCRIPTION = """\
hetccl, a drop-in replacement for NCCL.

  hetccl info          what hetccl finds on this machine: library, API level,
                       transports (shm, TCP interfaces, RDMA ports, CUDA) and
                       the effective configuration
  hetccl perf ARGS     the bundled hetccl-perf benchmark (nccl-tests flags)
  hetccl selection     the algorithm table for --nranks N on --nodes M

Run a program with hetccl: hetccl-run CMD [ARGS...]
"""


def _exec_perf(args):
    path = _paths.perf_path()
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execv(path, [path] + list(args))
    except OSError as e:
        sys.stderr.write("hetccl: cannot run %s: %s\n" % (path, e.strerror or e))
        return 126
    return 126  # not reached


def perf_main():
    """Entry point of the `hetccl-perf` command: the bundled binary, exec'd
    (it finds libhetccl.so next to itself, in ../lib)."""
    return _exec_perf(sys.argv[1:])


def _collect():
    """Everything `hetccl info` shows, as one dict."""
    from . import __version__

    lib = _native.info()
    shm_ok, shm_detail = _probe.shm()
    return {
        "package": __version__,
        "library": _paths.library_path(),
        "version": lib["version"],
        "nccl_api": _native.api_version(),
        "hetccl": lib,
        "shm": {"ok": shm_ok, "detail": shm_detail, "disabled": lib["shm_disable"]},
        "rdma": _probe.rdma_ports(),
        "cuda": _probe.cuda(),
    }


def _info_text(d):
    lib = d["hetccl"]
    rows = [d["version"]]

    def add(key, value):
        rows.append("  %-11s %s" % (key, value))

    add("package", d["package"])
    add("library", d["library"])
    add("nccl api", "%d (%s)" % (d["nccl_api"], _native.format_api(d["nccl_api"])))
    rows.append("transports")
    shm = d["shm"]
    if shm["disabled"]:
        add("shm", "disabled by NCCL_SHM_DISABLE (%s)" % shm["detail"])
    elif shm["ok"]:
        add("shm", "available: %s" % shm["detail"])
    else:
        add("shm", "unavailable: %s" % shm["detail"])
    if lib["interfaces"]:
        for i in lib["interfaces"]:
            kind = "loopback, " if i["loopback"] else ""
            add("tcp", "%s %s (%s%d Mbps)" % (i["name"], i["addr"], kind, i["speed_mbps"]))
    else:
        add("tcp", "none: no interface passes the filter")
    if lib["socket_ifname"] is not None:
        add("tcp filter", "%s (HETCCL_SOCKET_IFNAME, else NCCL_SOCKET_IFNAME)" % lib["socket_ifname"])
    for port in d["rdma"] or ["none"]:
        add("rdma", port)
    cu = d["cuda"]
    if not cu["driver"]:
        add("cuda", "no driver (libcuda.so.1 cannot be loaded)")
    else:
        ver = "driver %s" % (
            _probe.format_cuda_version(cu["version"]) if cu["version"] else "?"
        )
        if cu["error"]:
            add("cuda", "%s, cuInit or cuDeviceGetCount failed (CUresult %d)" % (ver, cu["error"]))
        else:
            names = ", ".join(cu["devices"])
            add("cuda", "%s, %d device(s)%s" % (ver, len(cu["devices"]), ": " + names if names else ""))
    rows.append("configuration")
    for line in lib["config"]:
        rows.append("  " + line)
    return "".join(r + "\n" for r in rows)


def _cmd_info(args):
    d = _collect()
    if args.json:
        sys.stdout.write(json.dumps(d, indent=2, sort_keys=True) + "\n")
    else:
        sys.stdout.write(_info_text(d))
    return 0


def _cmd_selection(args):
    if args.nranks < 1:
        raise SystemExit("hetccl selection: --nranks must be at least 1")
    if not 1 <= args.nodes <= args.nranks:
        raise SystemExit("hetccl selection: --nodes must be between 1 and --nranks")
    if args.algo is not None:
        # Read by the library on its first call, which comes below.
        os.environ["NCCL_ALGO"] = args.algo
    sys.stdout.write(_native.selection_table(args.nranks, args.nodes))
    return 0


def _parser():
    p = argparse.ArgumentParser(
        prog="hetccl",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--version", action="store_true", help="print the version and exit")
    sub = p.add_subparsers(dest="command", metavar="{info,perf,selection}")
    info = sub.add_parser("info", help="library, transports and configuration found here")
    info.add_argument("--json", action="store_true", help="print one JSON object")
    info.set_defaults(run=_cmd_info)
    sub.add_parser("perf", help="run the bundled hetccl-perf (all arguments are its own)")
    sel = sub.add_parser(
        "selection",
        help="the algorithm table for a rank count and node count",
        description="The algorithm hetccl's cost model picks per collective and message-size "
        "range, for NRANKS ranks placed in contiguous blocks on NODES nodes.",
    )
    sel.add_argument("--nranks", type=int, required=True, help="number of ranks")
    sel.add_argument("--nodes", type=int, default=1, help="number of nodes (default 1)")
    sel.add_argument("--algo", help="an NCCL_ALGO restriction to apply (default: $NCCL_ALGO)")
    sel.set_defaults(run=_cmd_selection)
    return p


def main(argv=None):
    """Entry point of `hetccl`."""
    argv = sys.argv[1:] if argv is None else argv
    # `perf` hands every argument, --help included, to hetccl-perf.
    if argv and argv[0] == "perf":
        return _exec_perf(argv[1:])
    p = _parser()
    args = p.parse_args(argv)
    if args.version:
        from . import __version__

        api = _native.format_api(_native.api_version())
        sys.stdout.write("hetccl %s (NCCL API %s)\n" % (__version__, api))
        return 0
    if args.command is None:
        p.print_help()
        return 2
    try:
        return args.run(args)
    except _native.NcclError as e:
        sys.stderr.write("hetccl: %s\n" % e)
        return 1
