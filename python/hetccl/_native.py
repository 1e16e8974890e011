"""ctypes bindings to the bundled libhetccl.so: what `hetccl info` and
`hetccl selection` ask the library itself."""

import ctypes
import json

from . import _paths

_LIB = None


def load():
    """The bundled libhetccl.so, loaded once (by path: this process does not
    need LD_PRELOAD to ask it questions)."""
    global _LIB
    if _LIB is None:
        lib = ctypes.CDLL(_paths.library_path())
        lib.ncclGetVersion.argtypes = [ctypes.POINTER(ctypes.c_int)]
        lib.ncclGetVersion.restype = ctypes.c_int
        lib.ncclGetErrorString.argtypes = [ctypes.c_int]
        lib.ncclGetErrorString.restype = ctypes.c_char_p
        lib.ncclGetLastError.argtypes = [ctypes.c_void_p]
        lib.ncclGetLastError.restype = ctypes.c_char_p
        lib.hetcclGetVersionString.argtypes = []
        lib.hetcclGetVersionString.restype = ctypes.c_char_p
        sized = [ctypes.c_char_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_size_t)]
        lib.hetcclInfoJson.argtypes = sized
        lib.hetcclInfoJson.restype = ctypes.c_int
        lib.hetcclSelectionTableFor.argtypes = [ctypes.c_int, ctypes.c_int] + sized
        lib.hetcclSelectionTableFor.restype = ctypes.c_int
        _LIB = lib
    return _LIB


class NcclError(RuntimeError):
    """A call into the library returned an error code."""


def _check(lib, name, rc):
    if rc != 0:
        last = lib.ncclGetLastError(None) or b""
        raise NcclError(
            "%s failed: %s (%d): %s"
            % (name, lib.ncclGetErrorString(rc).decode(), rc, last.decode(errors="replace"))
        )


def _sized_text(lib, name, fn, *args):
    """Calls an snprintf-style export twice (length, then text)."""
    need = ctypes.c_size_t(0)
    _check(lib, name, fn(*args, None, 0, ctypes.byref(need)))
    buf = ctypes.create_string_buffer(need.value + 1)
    _check(lib, name, fn(*args, buf, len(buf), ctypes.byref(need)))
    return buf.value.decode("utf-8", errors="replace")


def api_version():
    """ncclGetVersion's code, e.g. 22800 for NCCL API 2.28.0."""
    lib = load()
    v = ctypes.c_int(-1)
    _check(lib, "ncclGetVersion", lib.ncclGetVersion(ctypes.byref(v)))
    return v.value


def version_string():
    """hetcclGetVersionString()."""
    return load().hetcclGetVersionString().decode()


def info():
    """hetcclInfoJson(), parsed."""
    lib = load()
    return json.loads(_sized_text(lib, "hetcclInfoJson", lib.hetcclInfoJson))


def selection_table(nranks, nnodes):
    """hetcclSelectionTableFor(nranks, nnodes)."""
    lib = load()
    return _sized_text(
        lib, "hetcclSelectionTableFor", lib.hetcclSelectionTableFor, nranks, nnodes
    )


def format_api(code):
    """22800 -> "2.28.0" (NCCL_VERSION's encoding since 2.9)."""
    return "%d.%d.%d" % (code // 10000, code // 100 % 100, code % 100)
