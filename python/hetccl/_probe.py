"""Probes of this machine for `hetccl info` that need no library state:
shared memory, RDMA ports and the CUDA driver."""

import ctypes
import os
import tempfile

SHM_DIR = "/dev/shm"
IB_DIR = "/sys/class/infiniband"


def shm(directory=SHM_DIR):
    """(ok, detail): whether a file can be created in /dev/shm, as the shm
    transport does."""
    if not os.path.isdir(directory):
        return False, "%s does not exist" % directory
    try:
        with tempfile.NamedTemporaryFile(dir=directory, prefix="hetccl-info-"):
            pass
    except OSError as e:
        return False, "%s is not writable (%s)" % (directory, e.strerror or e)
    return True, "%s is writable" % directory


def _read(path):
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return "?"


def rdma_ports(directory=IB_DIR):
    """One "device/port state link_layer" string per RDMA port under
    /sys/class/infiniband; empty when there is none."""
    out = []
    try:
        devices = sorted(os.listdir(directory))
    except OSError:
        return out
    for dev in devices:
        ports_dir = os.path.join(directory, dev, "ports")
        try:
            ports = sorted(os.listdir(ports_dir), key=lambda p: (len(p), p))
        except OSError:
            continue
        for p in ports:
            state = _read(os.path.join(ports_dir, p, "state"))
            layer = _read(os.path.join(ports_dir, p, "link_layer"))
            # state reads like "4: ACTIVE".
            out.append("%s/%s %s %s" % (dev, p, state.split(":")[-1].strip(), layer))
    return out


def cuda(libname="libcuda.so.1"):
    """A dict describing the CUDA driver: `driver` False when libcuda.so.1
    cannot be loaded; else `error` (cuInit's code, 0 when it succeeded),
    `version` (cuDriverGetVersion) and `devices` (names)."""
    try:
        lib = ctypes.CDLL(libname)
    except OSError as e:
        return {"driver": False, "detail": str(e)}
    out = {"driver": True, "version": None, "devices": [], "error": 0}
    v = ctypes.c_int(0)
    if lib.cuDriverGetVersion(ctypes.byref(v)) == 0:
        out["version"] = v.value
    rc = lib.cuInit(0)
    if rc != 0:
        out["error"] = rc
        return out
    n = ctypes.c_int(0)
    rc = lib.cuDeviceGetCount(ctypes.byref(n))
    if rc != 0:
        out["error"] = rc
        return out
    for i in range(n.value):
        dev = ctypes.c_int(0)
        name = ctypes.create_string_buffer(256)
        if lib.cuDeviceGet(ctypes.byref(dev), i) != 0:
            out["devices"].append("?")
            continue
        if lib.cuDeviceGetName(name, len(name), dev) != 0:
            out["devices"].append("?")
            continue
        out["devices"].append(name.value.decode(errors="replace"))
    return out


def format_cuda_version(v):
    """12080 -> "12.8"."""
    return "%d.%d" % (v // 1000, v % 1000 // 10)
