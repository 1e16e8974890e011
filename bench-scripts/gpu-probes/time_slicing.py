"""Does a stream parked on a host flag in one process slow another
process's kernels on the same GPU (time-slicing)?"""
import ctypes, subprocess, sys, time
B = "import torch,time;x=torch.zeros(1,device='cuda');torch.cuda.synchronize();t=time.time();n=200\nfor i in range(n):\n x.add_(1);torch.cuda.synchronize()\nprint('other process: %.1f us per kernel+sync' % ((time.time()-t)/n*1e6))"
print("alone:", subprocess.run([sys.executable, "-c", B], capture_output=True, text=True, timeout=60).stdout.strip())
cu = ctypes.CDLL("libcuda.so.1"); cu.cuInit(0)
dev = ctypes.c_int(); cu.cuDeviceGet(ctypes.byref(dev), 0)
ctx = ctypes.c_void_p(); cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev); cu.cuCtxSetCurrent(ctx)
p = ctypes.c_void_p(); cu.cuMemHostAlloc(ctypes.byref(p), 4096, 3)
d = ctypes.c_uint64(); cu.cuMemHostGetDevicePointer_v2(ctypes.byref(d), p, 0)
ctypes.memset(p, 0, 8)
for k in range(int(sys.argv[1]) if len(sys.argv) > 1 else 1):
    s = ctypes.c_void_p(); cu.cuStreamCreate(ctypes.byref(s), 1)
    r = cu.cuStreamWaitValue32_v2(s, ctypes.c_uint64(d.value), ctypes.c_uint32(1), 0)
time.sleep(0.2)
print("while parked:", subprocess.run([sys.executable, "-c", B], capture_output=True, text=True, timeout=60).stdout.strip())
ctypes.c_uint32.from_address(p.value).value = 1
