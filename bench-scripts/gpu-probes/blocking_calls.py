"""Real-driver facts: stream waits on a host flag, and which driver calls
block while a stream of the same context (or another process) waits."""
import ctypes, subprocess, sys, threading, time
cu = ctypes.CDLL("libcuda.so.1")
def ck(r, what):
    if r:
        raise SystemExit(f"{what} -> CUresult {r}")
ck(cu.cuInit(0), "cuInit")
dev = ctypes.c_int(); ck(cu.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
for attr in (92, 93, 94):
    v = ctypes.c_int(); r = cu.cuDeviceGetAttribute(ctypes.byref(v), attr, dev); print("attr", attr, "r", r, "=", v.value)
ctx = ctypes.c_void_p(); ck(cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "retain"); ck(cu.cuCtxSetCurrent(ctx), "setcur")
p = ctypes.c_void_p(); ck(cu.cuMemHostAlloc(ctypes.byref(p), 4096, 0x1 | 0x2), "cuMemHostAlloc")
d = ctypes.c_uint64(); ck(cu.cuMemHostGetDevicePointer_v2(ctypes.byref(d), p, 0), "devptr")
nonblocking = len(sys.argv) > 1 and sys.argv[1] == "nonblocking"
s = ctypes.c_void_p(); ck(cu.cuStreamCreate(ctypes.byref(s), 1 if nonblocking else 0), "cuStreamCreate")
print("user stream", "NON_BLOCKING" if nonblocking else "default flags (blocking)")
ctypes.memset(p, 0, 8)
ck(cu.cuStreamWaitValue32_v2(s, ctypes.c_uint64(d.value), ctypes.c_uint32(1), 0), "cuStreamWaitValue32")
e = ctypes.c_void_p(); ck(cu.cuEventCreate(ctypes.byref(e), 0), "ev"); ck(cu.cuEventRecord(e, s), "rec")
time.sleep(0.2); print("event while waiting (600=not ready):", cu.cuEventQuery(e))
other = subprocess.run([sys.executable, "-c", "import torch,time;t=time.time();x=torch.ones(1<<20,device='cuda');print('other process: kernel done', float((x*2).sum()), round(time.time()-t,2),'s')"], capture_output=True, text=True, timeout=90)
print(other.stdout.strip(), other.stderr.strip()[-300:])
dp = ctypes.c_uint64(); hp = ctypes.c_void_p(); h = (ctypes.c_char * 64)(); s2 = ctypes.c_void_p(); e2 = ctypes.c_void_p()
buf = (ctypes.c_char * 4096)()
calls = [
    ("cuEventCreate", lambda: cu.cuEventCreate(ctypes.byref(e2), 0)),
    ("cuStreamCreate", lambda: cu.cuStreamCreate(ctypes.byref(s2), 1)),
    ("cuMemAlloc", lambda: cu.cuMemAlloc_v2(ctypes.byref(dp), ctypes.c_size_t(1 << 20))),
    ("cuIpcGetMemHandle", lambda: cu.cuIpcGetMemHandle(h, ctypes.c_uint64(dp.value))),
    ("cuMemcpyHtoDAsync(own nonblocking stream)", lambda: cu.cuMemcpyHtoDAsync_v2(ctypes.c_uint64(dp.value), buf, ctypes.c_size_t(4096), s2)),
    ("cuStreamSynchronize(own stream)", lambda: cu.cuStreamSynchronize(s2)),
    ("cuMemHostAlloc", lambda: cu.cuMemHostAlloc(ctypes.byref(hp), ctypes.c_size_t(1 << 20), 0x1 | 0x2)),
    ("cuMemcpyHtoD (sync)", lambda: cu.cuMemcpyHtoD_v2(ctypes.c_uint64(dp.value), buf, ctypes.c_size_t(4096))),
    ("cuMemFreeHost", lambda: cu.cuMemFreeHost(hp)),
    ("cuMemFree", lambda: cu.cuMemFree_v2(ctypes.c_uint64(dp.value))),
]
blocked = []
for name, f in calls:
    out = {}
    def run():
        cu.cuCtxSetCurrent(ctx); out["r"] = f()
    t = threading.Thread(target=run, daemon=True); t.start(); t.join(4)
    if t.is_alive():
        print(f"BLOCKS while the stream waits: {name}"); blocked.append((name, t)); break
    print(f"ok while the stream waits: {name} -> {out['r']}")
ctypes.c_uint32.from_address(p.value).value = 1
t0 = time.time(); r = cu.cuEventSynchronize(e); print("after the flag: event", r, round(time.time() - t0, 3), "s")
for name, t in blocked:
    t.join(5); print(name, "finished after the flag" if not t.is_alive() else "STILL blocked")
