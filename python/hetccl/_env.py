"""The environment hetccl needs in a process, as pure functions of a base
environment (no side effects, so that launchers and `hetccl-run --dry-run`
share them)."""

import os

from . import _paths

PRELOAD = "LD_PRELOAD"
LIBRARY_PATH = "LD_LIBRARY_PATH"
NET_PLUGIN = "NCCL_NET_PLUGIN"
FALLBACK = "HETCCL_NCCL_FALLBACK"


def _split_preload(value):
    # ld.so separates LD_PRELOAD entries with colons or white space.
    return value.replace(":", " ").split()


def _same_file(entry, path):
    if entry == path:
        return True
    try:
        return os.path.realpath(entry) == os.path.realpath(path)
    except (OSError, ValueError):
        return False


def _prepend(old, entry, split):
    """`entry` first, then `old` verbatim; `old` unchanged (None returned)
    when it already lists `entry`."""
    if old is None or not old.strip():
        return entry
    if any(_same_file(e, entry) for e in split(old)):
        return None
    return entry + ":" + old


def changes(base, net_plugin=False, fallback=None):
    """The variables to set on top of `base` (a mapping) for hetccl: by
    default libhetccl.so first in LD_PRELOAD (replaces NCCL); with
    `net_plugin`, NCCL_NET_PLUGIN=hetccl and the library directory first in
    LD_LIBRARY_PATH (NVIDIA's NCCL loads libnccl-net-hetccl.so from there);
    with `fallback`, HETCCL_NCCL_FALLBACK. Returns a dict of only the
    variables whose value changes."""
    out = {}
    if net_plugin:
        lib_dir = _paths.lib_dir()
        new = _prepend(base.get(LIBRARY_PATH), lib_dir, lambda v: v.split(":"))
        if new is not None:
            out[LIBRARY_PATH] = new
        out[NET_PLUGIN] = "hetccl"
    else:
        new = _prepend(base.get(PRELOAD), _paths.library_path(), _split_preload)
        if new is not None:
            out[PRELOAD] = new
    if fallback is not None:
        # A path with a directory part is made absolute: workers may run in
        # another directory. A bare name is left to dlopen's search.
        out[FALLBACK] = os.path.abspath(fallback) if "/" in fallback else fallback
    return {k: v for k, v in out.items() if base.get(k) != v}


def apply(base, net_plugin=False, fallback=None):
    """A copy of `base` (os.environ when None) with `changes` applied."""
    env = dict(os.environ if base is None else base)
    env.update(changes(env, net_plugin=net_plugin, fallback=fallback))
    return env
