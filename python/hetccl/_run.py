"""`hetccl-run [OPTIONS] CMD [ARGS...]`: runs CMD with hetccl interposed.

The command replaces this process (exec), so it keeps this PID, receives
the signals sent to it and its exit status is the caller's. Launchers such
as torchrun, srun and mpirun pass the environment on to every worker, so
`hetccl-run torchrun ...` interposes hetccl in all of them.
"""

import os
import shlex
import sys

from . import _env

USAGE = """\
usage: hetccl-run [--net-plugin] [--fallback PATH] [--dry-run] [--] CMD [ARGS...]

Runs CMD with hetccl interposed, in place of this process (exec).

  (default)        libhetccl.so first in LD_PRELOAD: hetccl replaces NCCL
  --net-plugin     keep NVIDIA's NCCL and give it hetccl's network plugin:
                   NCCL_NET_PLUGIN=hetccl, hetccl's library directory first
                   in LD_LIBRARY_PATH
  --fallback PATH  HETCCL_NCCL_FALLBACK=PATH (the real NCCL for what hetccl
                   forwards)
  --dry-run        print the variables that would change (KEY=VALUE, shell
                   quoted) and the command; run nothing
  --version        print the version and exit
  -h, --help       print this help and exit
"""


def _fail(msg, code=2):
    sys.stderr.write("hetccl-run: %s\n" % msg)
    if code == 2:
        sys.stderr.write(USAGE)
    return code


def parse(argv):
    """Splits argv (without the program name) into options and the command.
    Options end at the first argument that is not one (or at `--`)."""
    opts = {"net_plugin": False, "fallback": None, "dry_run": False}
    i = 0
    while i < len(argv):
        a = argv[i]
        if a == "--":
            i += 1
            break
        if not a.startswith("-") or a == "-":
            break
        if a == "--net-plugin":
            opts["net_plugin"] = True
        elif a == "--dry-run":
            opts["dry_run"] = True
        elif a == "--fallback":
            if i + 1 >= len(argv):
                raise ValueError("--fallback needs a PATH")
            i += 1
            opts["fallback"] = argv[i]
        elif a.startswith("--fallback="):
            opts["fallback"] = a[len("--fallback="):]
        elif a in ("-h", "--help"):
            opts["help"] = True
        elif a == "--version":
            opts["version"] = True
        else:
            raise ValueError("unknown option %s" % a)
        i += 1
    if opts["fallback"] == "":
        raise ValueError("--fallback needs a non-empty PATH")
    return opts, argv[i:]


def dry_run_text(changes, cmd):
    """The `--dry-run` output: one `KEY=VALUE` line per changed variable
    (sorted, value shell-quoted), then the command, shell-quoted."""
    lines = ["%s=%s" % (k, shlex.quote(v)) for k, v in sorted(changes.items())]
    if cmd:
        lines.append(" ".join(shlex.quote(a) for a in cmd))
    return "".join(line + "\n" for line in lines)


def main(argv=None):
    """Entry point of `hetccl-run`."""
    argv = sys.argv[1:] if argv is None else argv
    try:
        opts, cmd = parse(argv)
    except ValueError as e:
        return _fail(str(e))
    if opts.get("help"):
        sys.stdout.write(USAGE)
        return 0
    if opts.get("version"):
        from . import __version__

        sys.stdout.write("hetccl-run %s\n" % __version__)
        return 0
    if not cmd and not opts["dry_run"]:
        return _fail("no command given")
    base = dict(os.environ)
    changes = _env.changes(base, net_plugin=opts["net_plugin"], fallback=opts["fallback"])
    if opts["dry_run"]:
        sys.stdout.write(dry_run_text(changes, cmd))
        return 0
    env = dict(base)
    env.update(changes)
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execvpe(cmd[0], cmd, env)
    except FileNotFoundError:
        return _fail("%s: command not found" % cmd[0], 127)
    except PermissionError as e:
        return _fail("%s: %s" % (cmd[0], e.strerror or e), 126)
    except OSError as e:
        return _fail("%s: cannot run: %s" % (cmd[0], e.strerror or e), 126)
    return 126  # not reached: execvpe returns only by raising


if __name__ == "__main__":
    sys.exit(main())
