"""Where the files of the installed package are."""

import os

_PKG = os.path.dirname(os.path.abspath(__file__))


def lib_dir():
    """The directory holding libhetccl.so and libnccl-net-hetccl.so."""
    return os.path.join(_PKG, "lib")


def library_path():
    """The absolute path of the bundled libhetccl.so."""
    return os.path.join(lib_dir(), "libhetccl.so")


def nccl_dir():
    """A directory holding only libnccl.so.2 (backed by libhetccl.so), for
    programs that find NCCL through LD_LIBRARY_PATH."""
    return os.path.join(lib_dir(), "nccl")


def perf_path():
    """The absolute path of the bundled hetccl-perf binary."""
    return os.path.join(_PKG, "bin", "hetccl-perf")


def include_dir():
    """The directory holding hetccl.h."""
    return os.path.join(_PKG, "include")
