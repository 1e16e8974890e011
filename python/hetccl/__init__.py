"""hetccl: a drop-in replacement for NVIDIA's NCCL, packaged for PyTorch users.

The package carries the native library (libhetccl.so), the hetccl-perf
benchmark and three commands: `hetccl-run CMD...` (runs CMD with hetccl
interposed), `hetccl` (info, perf, selection) and `hetccl-perf`.

For launchers that build worker environments themselves::

    import subprocess, hetccl
    subprocess.run(cmd, env=hetccl.preload_env(worker_env))
"""

from . import _env, _paths



def __getattr__(name):
    # `__version__` is looked up lazily: importlib.metadata scans sys.path,
    # which hetccl-run (on every worker's start) does not need.
    if name == "__version__":
        try:
            from importlib.metadata import version

            return version("hetccl")
        except Exception:  # not installed as a distribution
            return "0+unknown"
    raise AttributeError("module 'hetccl' has no attribute %r" % name)


__all__ = [
    "__version__",
    "library_path",
    "lib_dir",
    "nccl_dir",
    "perf_path",
    "include_dir",
    "preload_env",
    "net_plugin_env",
]

library_path = _paths.library_path
lib_dir = _paths.lib_dir
nccl_dir = _paths.nccl_dir
perf_path = _paths.perf_path
include_dir = _paths.include_dir


def preload_env(base=None, fallback=None):
    """The environment a launcher should give a process so that hetccl
    replaces NCCL in it: a copy of `base` (os.environ when None) with
    libhetccl.so first in LD_PRELOAD (entries already there are kept; none
    is added twice) and, with `fallback`, HETCCL_NCCL_FALLBACK set."""
    return _env.apply(base, fallback=fallback)


def net_plugin_env(base=None, fallback=None):
    """Like `preload_env`, but NVIDIA's NCCL stays and loads hetccl as its
    network plugin: NCCL_NET_PLUGIN=hetccl, library directory first in
    LD_LIBRARY_PATH."""
    return _env.apply(base, net_plugin=True, fallback=fallback)
