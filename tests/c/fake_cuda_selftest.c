/*
 * fake_cuda_selftest.c: exercises the emulated CUDA driver (tests/c/fake_cuda*.c)
 * through the real <cuda.h> and prints `key value` lines, which
 * tests/fake_cuda_selftest.rs checks. Results are printed raw (return codes,
 * flags) so that the Rust side asserts concrete values.
 *
 * This file has main, the shared helpers and the tests of devices,
 * contexts, copies, pointer attributes, error names and IPC;
 * fake_cuda_selftest_streams.c tests streams, events, waits, host functions
 * and capture, fake_cuda_selftest_kernels.c the emulated kernels,
 * fake_cuda_selftest_strict.c what makes the fake as strict as CUDA
 * (fake_cuda_selftest.h: what they share).
 *
 * Usage: fake_cuda_selftest all        (FAKE_CUDA_DEVICES=2)
 *        fake_cuda_selftest nomemops   (FAKE_CUDA_NO_STREAM_MEMOPS=1)
 *        fake_cuda_selftest nodev      (FAKE_CUDA_DEVICES=0)
 *        fake_cuda_selftest deadlock   (aborts: a free while a stream waits)
 *        fake_cuda_selftest hostfn_wait (aborts: a host function waits)
 *        fake_cuda_selftest alloc_wait, alloc_wait_dev (abort: pinned or
 *                                       device allocation while a stream waits)
 *        fake_cuda_selftest oldcuda    (FAKE_CUDA_DRIVER_VERSION=12020,
 *                                       FAKE_CUDA_REJECT_CUBIN=1)
 *        fake_cuda_selftest narrow <cases> <out>   (the narrow kernels)
 *        fake_cuda_selftest ipc_child <hex handle>   (started by `all`)
 * A call that must succeed and does not makes the program exit 2.
 */
#include "fake_cuda_selftest.h"

extern char **environ;

void kv(const char *k, long long v) { printf("%s %lld\n", k, v); }
void kvs(const char *k, const char *v) { printf("%s %s\n", k, v ? v : "(null)"); }
void kv2(const char *k, long long a, long long b) { printf("%s %lld,%lld\n", k, a, b); }

void sleep_ms(int ms) {
    struct timespec t = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&t, NULL);
}

void set_flag(volatile uint32_t *f, uint32_t v) {
    __atomic_store_n((uint32_t *)f, v, __ATOMIC_RELEASE);
}

void fill(unsigned char *p, size_t n, unsigned mul, unsigned add) {
    for (size_t i = 0; i < n; i++) p[i] = (unsigned char)(i * mul + add);
}

int check(const unsigned char *p, size_t n, unsigned mul, unsigned add) {
    for (size_t i = 0; i < n; i++)
        if (p[i] != (unsigned char)(i * mul + add)) return 0;
    return 1;
}

static CUcontext ctx0, ctx1;

/* The UUID of `dev` as 32 hex digits (in a static buffer). */
static const char *uuid_hex(CUdevice dev) {
    static char hex[33];
    CUuuid u;
    CK(cuDeviceGetUuid_v2(&u, dev));
    for (int i = 0; i < 16; i++) sprintf(hex + 2 * i, "%02x", (unsigned char)u.bytes[i]);
    return hex;
}

/* Pinned memory holding a 32-bit flag (host pointer; same device pointer). */
volatile uint32_t *new_flag(uint32_t v) {
    void *p;
    CK(cuMemHostAlloc(&p, 64, CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP));
    *(uint32_t *)p = v;
    return p;
}

CUstream new_stream(void) {
    CUstream s;
    CK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    return s;
}

CUevent new_event(void) {
    CUevent e;
    CK(cuEventCreate(&e, CU_EVENT_DISABLE_TIMING));
    return e;
}

/* ---------------------------------------------------------------- basics */

static void t_devices(void) {
    int n = -1;
    kv("init.before_init", cuDeviceGetCount(&n));
    CK(cuInit(0));
    CK(cuDeviceGetCount(&n));
    kv("dev.count", n);
    CUdevice d;
    kv("dev.bad_ordinal", cuDeviceGet(&d, n));
    int major = -1, minor = -1, uva = -1, reg = -1;
    CK(cuDeviceGet(&d, 0));
    CK(cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, d));
    CK(cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, d));
    CK(cuDeviceGetAttribute(&uva, CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING, d));
    CK(cuDeviceGetAttribute(&reg, CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM, d));
    printf("dev.cc %d.%d\n", major, minor);
    kv("dev.unified", uva);
    kv("dev.host_ptr_reg", reg);
    char name[64];
    CK(cuDeviceGetName(name, sizeof name, d));
    kvs("dev.name", name);
    size_t mem = 0;
    CK(cuDeviceTotalMem(&mem, d));
    kv("dev.totalmem_gib", (long long)(mem >> 30));
    int ver = 0;
    CK(cuDriverGetVersion(&ver));
    kv("drv.version", ver);

    /* UUIDs: per device, stable, the same from both entry points. */
    CUuuid u0, u0b, u1, u1v1;
    CK(cuDeviceGetUuid_v2(&u0, 0));
    CK(cuDeviceGetUuid_v2(&u0b, 0));
    CK(cuDeviceGetUuid_v2(&u1, 1));
    CK(cuDeviceGetUuid(&u1v1, 1));
    kv("uuid.stable", memcmp(&u0, &u0b, sizeof u0) == 0);
    kv("uuid.differ", memcmp(&u0, &u1, sizeof u0) != 0);
    kv("uuid.v1_same", memcmp(&u1, &u1v1, sizeof u1) == 0);
    kvs("uuid.dev0", uuid_hex(0));
    kvs("uuid.dev1", uuid_hex(1));
    kv("uuid.bad_dev", cuDeviceGetUuid_v2(&u0, n));
    kv("uuid.bad_dev_v1", cuDeviceGetUuid(&u0, -1));
    kv("uuid.null", cuDeviceGetUuid_v2(NULL, 0));

    /* Peer access: between different devices (unless switched off). */
    int can = -1;
    CK(cuDeviceCanAccessPeer(&can, 0, 1));
    kv("peer.0_1", can);
    CK(cuDeviceCanAccessPeer(&can, 1, 1));
    kv("peer.1_1", can);
    kv("peer.bad_dev", cuDeviceCanAccessPeer(&can, 0, n));
}

static void t_contexts(void) {
    CUcontext c = (CUcontext)1;
    CK(cuCtxGetCurrent(&c));
    kv("ctx.none_current", c == NULL);
    CUdevice d = -1;
    kv("ctx.getdevice_none", cuCtxGetDevice(&d));
    CUdeviceptr p;
    kv("ctx.alloc_none", cuMemAlloc(&p, 16));
    int junk;
    kv("ctx.set_bad", cuCtxSetCurrent((CUcontext)&junk));
    CK(cuDevicePrimaryCtxRetain(&ctx0, 0));
    CK(cuDevicePrimaryCtxRetain(&ctx1, 1));
    CK(cuCtxSetCurrent(ctx1));
    CK(cuCtxGetDevice(&d));
    kv("ctx.device", d);
    CK(cuCtxSetCurrent(ctx0));
    kv("args.null_out", cuMemAlloc(NULL, 16));
    kv("args.zero_alloc", cuMemAlloc(&p, 0));
    kv("args.null_event_record", cuEventRecord(NULL, NULL));
    kv("args.null_event_query", cuEventQuery(NULL));
}

/* ---------------------------------------------------------------- copies */

static void t_copies(void) {
    enum { N = 10000 };
    static unsigned char src[N], dst[N];
    CUdeviceptr a, b;
    CK(cuMemAlloc(&a, N));
    CK(cuMemAlloc(&b, N));
    fill(src, N, 7, 3);
    memset(dst, 0, N);
    CK(cuMemcpyHtoD(a, src, N));
    CK(cuMemcpyDtoD(b, a, N));
    CK(cuMemcpyDtoH(dst, b, N));
    kv("copy.roundtrip", memcmp(src, dst, N) == 0);

    /* Async, interior offsets, and the generic cuMemcpyAsync in every direction. */
    CUstream s = new_stream();
    memset(dst, 0, N);
    CK(cuMemsetD8Async(b, 0, N, s));
    CK(cuMemcpyDtoDAsync(b + 100, a + 7, 5000, s));
    CK(cuMemcpyAsync((CUdeviceptr)(uintptr_t)dst, b + 100, 5000, s));
    CK(cuStreamSynchronize(s));
    kv("copy.async_interior", memcmp(dst, src + 7, 5000) == 0);

    CK(cuMemsetD8(b, 0x5A, N));
    CK(cuMemsetD8Async(b + 10, 0x11, 20, s));
    CK(cuStreamSynchronize(s));
    CK(cuMemcpyDtoH(dst, b, N));
    int ok = 1;
    for (int i = 0; i < N; i++) ok &= dst[i] == ((i >= 10 && i < 30) ? 0x11 : 0x5A);
    kv("copy.memset", ok);

    kv("copy.overrun", cuMemcpyHtoD(a + N - 10, src, 11));

    /* The three default-stream handles name one stream. */
    memset(dst, 0, N);
    CK(cuMemcpyDtoHAsync(dst, a, 100, NULL));
    CK(cuMemcpyDtoHAsync(dst + 100, a + 100, 100, CU_STREAM_LEGACY));
    CK(cuMemcpyDtoHAsync(dst + 200, a + 200, 100, CU_STREAM_PER_THREAD));
    CK(cuStreamSynchronize(CU_STREAM_PER_THREAD));
    kv("copy.default_handles", memcmp(dst, src, 300) == 0);
    CK(cuCtxSynchronize());
    CK(cuStreamDestroy(s));
    CK(cuMemFree(a));
    CK(cuMemFree(b));
    kv("copy.double_free", cuMemFree(a));
}

/* ------------------------------------------------------------ attributes */

static CUresult attrs(CUdeviceptr p, uint64_t v[6]) {
    CUpointer_attribute at[6] = {
        CU_POINTER_ATTRIBUTE_MEMORY_TYPE,      CU_POINTER_ATTRIBUTE_IS_MANAGED,
        CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,   CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
        CU_POINTER_ATTRIBUTE_RANGE_SIZE,       CU_POINTER_ATTRIBUTE_CONTEXT,
    };
    void *data[6];
    for (int i = 0; i < 6; i++) {
        v[i] = 0;
        data[i] = &v[i];
    }
    return cuPointerGetAttributes(6, at, data, p);
}

static void t_attributes(void) {
    uint64_t v[6];
    CUdeviceptr d;
    CK(cuCtxSetCurrent(ctx1));
    CK(cuMemAlloc(&d, 10000));
    CK(cuCtxSetCurrent(ctx0));
    kv("attr.dev.rc", attrs(d + 1234, v));
    kv("attr.dev.type", (unsigned)v[0]);
    kv("attr.dev.managed", (unsigned)v[1]);
    kv("attr.dev.ordinal", (int)v[2]);
    kv("attr.dev.start_ok", v[3] == d);
    kv("attr.dev.size", (long long)v[4]);
    kv("attr.dev.ctx_ok", v[5] == (uint64_t)(uintptr_t)ctx1);
    unsigned t = 99;
    kv("attr.dev.single_rc", cuPointerGetAttribute(&t, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, d + 9999));
    kv("attr.dev.single_type", t);
    CUdeviceptr hd;
    kv("attr.dev.hostdevptr", cuMemHostGetDevicePointer(&hd, (void *)(uintptr_t)d, 0));
    CUdeviceptr base = 1;
    size_t size = 1;
    kv("range.dev.rc", cuMemGetAddressRange(&base, &size, d + 1234));
    kv("range.dev.base_ok", base == d);
    kv("range.dev.size", (long long)size);
    base = 1;
    kv("range.dev.last_rc", cuMemGetAddressRange(&base, NULL, d + 9999));
    kv("range.dev.last_base_ok", base == d);
    size = 1;
    kv("range.dev.null_base_rc", cuMemGetAddressRange(NULL, &size, d));
    kv("range.dev.null_base_size", (long long)size);
    kv("range.dev.past_end", cuMemGetAddressRange(&base, &size, d + 10000));

    void *h;
    CK(cuMemHostAlloc(&h, 5000, CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP));
    CK(cuMemHostGetDevicePointer(&hd, (char *)h + 10, 0));
    kv("attr.pinned.devptr_same", hd == (CUdeviceptr)(uintptr_t)h + 10);
    kv("attr.pinned.rc", attrs((CUdeviceptr)(uintptr_t)h + 4999, v));
    kv("attr.pinned.type", (unsigned)v[0]);
    kv("attr.pinned.ordinal", (int)v[2]);
    kv("attr.pinned.start_ok", v[3] == (uint64_t)(uintptr_t)h);
    kv("attr.pinned.size", (long long)v[4]);
    base = 1;
    size = 1;
    kv("range.pinned.rc", cuMemGetAddressRange(&base, &size, (CUdeviceptr)(uintptr_t)h + 4321));
    kv("range.pinned.base_ok", base == (CUdeviceptr)(uintptr_t)h);
    kv("range.pinned.size", (long long)size);

    int local = 0;
    for (int i = 0; i < 6; i++) v[i] = 0x5555;
    CUresult rc = attrs((CUdeviceptr)(uintptr_t)&local, v);
    kv("attr.unknown.rc", rc);
    int zeros = 1;
    for (int i = 0; i < 6; i++) zeros &= v[i] == 0;
    kv("attr.unknown.zeros", zeros);
    kv("attr.unknown.single", cuPointerGetAttribute(&t, CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                                                    (CUdeviceptr)(uintptr_t)&local));
    kv("attr.past_end.type", (attrs(d + 10000, v), (unsigned)v[0]));
    base = 7;
    size = 7;
    kv("range.unknown.rc", cuMemGetAddressRange(&base, &size, (CUdeviceptr)(uintptr_t)&local));
    kv("range.unknown.untouched", base == 7 && size == 7);
    kv("range.null.rc", cuMemGetAddressRange(&base, &size, 0));

    /* Buffer ids: per allocation, never reused, 0 for unknown memory. */
    uint64_t id1 = 0, id2 = 0, id3 = 0, id0 = 7;
    CUdeviceptr d2, d3;
    CK(cuMemAlloc(&d2, 4096));
    CK(cuPointerGetAttribute(&id1, CU_POINTER_ATTRIBUTE_BUFFER_ID, d + 5));
    CK(cuPointerGetAttribute(&id2, CU_POINTER_ATTRIBUTE_BUFFER_ID, d2));
    CK(cuMemFree(d2));
    CK(cuMemAlloc(&d3, 4096));
    CK(cuPointerGetAttribute(&id3, CU_POINTER_ATTRIBUTE_BUFFER_ID, d3));
    CK(cuMemFree(d3));
    CUpointer_attribute bid = CU_POINTER_ATTRIBUTE_BUFFER_ID;
    void *bidp = &id0;
    CK(cuPointerGetAttributes(1, &bid, &bidp, (CUdeviceptr)(uintptr_t)&local));
    kv("bufid.nonzero", id1 != 0 && id2 != 0 && id3 != 0);
    kv("bufid.distinct", id1 != id2 && id2 != id3 && id1 != id3);
    kv("bufid.unknown", (long long)id0);

    /* The PROT_NONE view: a host read of a device pointer faults; pinned is fine. */
    fflush(stdout);
    for (int which = 0; which < 2; which++) {
        volatile char *p = which == 0 ? (volatile char *)(uintptr_t)d : (volatile char *)h;
        pid_t pid = fork();
        if (pid == 0) {
            struct rlimit no_core = {0, 0};
            setrlimit(RLIMIT_CORE, &no_core);
            signal(SIGSEGV, SIG_DFL);
            char c = *p;
            _exit(c == 42 ? 3 : 0);
        }
        int st = 0;
        waitpid(pid, &st, 0);
        kv(which == 0 ? "segv.device_read_signal" : "segv.pinned_read_signal",
           WIFSIGNALED(st) ? WTERMSIG(st) : -WEXITSTATUS(st));
    }
    CK(cuMemFree(d));
    CK(cuMemFreeHost(h));
    kv("attr.freed.type", (attrs(d, v), (unsigned)v[0]));
    kv("range.freed.rc", cuMemGetAddressRange(&base, &size, d + 1));
}

/* --------------------------------------------------------------- errors */

static void t_errors(void) {
    const char *s = NULL;
    CK(cuGetErrorName(CUDA_ERROR_NOT_READY, &s));
    kvs("err.name_600", s);
    CK(cuGetErrorName(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, &s));
    kvs("err.name_900", s);
    CK(cuGetErrorName(CUDA_ERROR_INVALID_CONTEXT, &s));
    kvs("err.name_201", s);
    CK(cuGetErrorName(CUDA_ERROR_INVALID_IMAGE, &s));
    kvs("err.name_200", s);
    CK(cuGetErrorString(CUDA_SUCCESS, &s));
    kvs("err.text_0", s);
    kv("err.unknown", cuGetErrorName((CUresult)12345, &s));
    kv("err.unknown_null", s == NULL);
}

/* ------------------------------------------------------------------ IPC */

static void t_ipc(const char *self) {
    enum { N = 8192 };
    static unsigned char buf[N];
    CUdeviceptr a;
    CK(cuMemAlloc(&a, N));
    fill(buf, N, 7, 3);
    CK(cuMemcpyHtoD(a, buf, N));
    CUipcMemHandle h;
    void *pinned;
    CK(cuMemHostAlloc(&pinned, 64, 0));
    kv("ipc.pinned", cuIpcGetMemHandle(&h, (CUdeviceptr)(uintptr_t)pinned));
    CK(cuMemFreeHost(pinned));
    CK(cuIpcGetMemHandle(&h, a));
    CUdeviceptr mine;
    kv("ipc.same_process", cuIpcOpenMemHandle(&mine, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS));

    char hex[2 * CU_IPC_HANDLE_SIZE + 1];
    for (int i = 0; i < CU_IPC_HANDLE_SIZE; i++)
        sprintf(hex + 2 * i, "%02x", (unsigned char)h.reserved[i]);
    char *argv[] = {(char *)self, "ipc_child", hex, NULL};
    fflush(stdout);
    pid_t pid;
    if (posix_spawn(&pid, "/proc/self/exe", NULL, NULL, argv, environ) != 0) {
        perror("posix_spawn");
        exit(2);
    }
    int st = 0;
    waitpid(pid, &st, 0);
    kv("ipc.child_exit", WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st));
    CK(cuMemcpyDtoH(buf, a, N));
    kv("ipc.parent_sees_child", check(buf, N, 11, 5));
    CK(cuMemFree(a));
}

static int ipc_child(const char *hex) {
    CUipcMemHandle h;
    for (int i = 0; i < CU_IPC_HANDLE_SIZE; i++) {
        unsigned x;
        if (sscanf(hex + 2 * i, "%2x", &x) != 1) return 2;
        h.reserved[i] = (char)x;
    }
    CK(cuInit(0));
    CK(cuDevicePrimaryCtxRetain(&ctx0, 0));
    CK(cuCtxSetCurrent(ctx0));
    enum { N = 8192 };
    static unsigned char buf[N];
    CUdeviceptr p = 0;
    kv("ipc.child_open", cuIpcOpenMemHandle(&p, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS));
    unsigned t = 0;
    CK(cuPointerGetAttribute(&t, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, p + 100));
    kv("ipc.child_memtype", t);
    CUdeviceptr base = 0;
    size_t size = 0;
    kv("ipc.child_range_rc", cuMemGetAddressRange(&base, &size, p + 100));
    kv("ipc.child_range_base_ok", base == p);
    kv("ipc.child_range_size", (long long)size);
    kvs("ipc.child_uuid1", uuid_hex(1));
    CK(cuMemcpyDtoH(buf, p, N));
    kv("ipc.child_read_ok", check(buf, N, 7, 3));
    fill(buf, N, 11, 5);
    CK(cuMemcpyHtoD(p, buf, N));
    /* The close waits, as CUDA's does, until the context's streams are idle. */
    CUstream s = new_stream();
    volatile uint32_t *flag = new_flag(0);
    CK(cuStreamWaitValue32(s, (CUdeviceptr)(uintptr_t)flag, 1, CU_STREAM_WAIT_VALUE_GEQ));
    pthread_t th;
    pthread_create(&th, NULL, set_later, (void *)flag);
    kv("ipc.child_close", cuIpcCloseMemHandle(p));
    kv("ipc.child_close_waited", __atomic_load_n(flag, __ATOMIC_ACQUIRE) == 1);
    pthread_join(th, NULL);
    kv("ipc.child_close_again", cuIpcCloseMemHandle(p));
    kv("ipc.child_range_closed", cuMemGetAddressRange(&base, &size, p + 100));
    return 0;
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    const char *mode = argc > 1 ? argv[1] : "all";
    if (strcmp(mode, "ipc_child") == 0 && argc > 2) return ipc_child(argv[2]);
    if (strcmp(mode, "deadlock") == 0) return m_deadlock();
    if (strcmp(mode, "hostfn_wait") == 0) return m_hostfn_wait();
    if (strcmp(mode, "alloc_wait") == 0) return m_alloc_wait(0);
    if (strcmp(mode, "alloc_wait_dev") == 0) return m_alloc_wait(1);
    if (strcmp(mode, "oldcuda") == 0) return m_oldcuda();
    if (strcmp(mode, "narrow") == 0 && argc > 3) return m_narrow(argv[2], argv[3]);
    if (strcmp(mode, "nodev") == 0) {
        kv("init.rc", cuInit(0));
        int n = -1;
        kv("init.count_after_failure", cuDeviceGetCount(&n));
        return 0;
    }
    if (strcmp(mode, "nomemops") == 0) {
        CK(cuInit(0));
        CK(cuDevicePrimaryCtxRetain(&ctx0, 0));
        CK(cuCtxSetCurrent(ctx0));
        int memops = -1;
        CK(cuDeviceGetAttribute(&memops, CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_MEM_OPS_V1, 0));
        kv("memops.attr", memops);
        CUstream s = new_stream();
        volatile uint32_t *flag = new_flag(0);
        kv("memops.wait", cuStreamWaitValue32(s, (CUdeviceptr)(uintptr_t)flag, 1, 0));
        CUevent e = new_event();
        CK(cuLaunchHostFunc(s, wait_flag_fn, (void *)flag));
        CK(cuEventRecord(e, s));
        sleep_ms(20);
        CUresult pending = cuEventQuery(e);
        set_flag(flag, 1);
        CK(cuEventSynchronize(e));
        kv2("memops.hostfn_wait", pending, cuEventQuery(e));
        printf("done 1\n");
        return 0;
    }
    if (strcmp(mode, "all") != 0) {
        fprintf(stderr, "unknown mode %s\n", mode);
        return 2;
    }
    t_devices();
    t_contexts();
    t_copies();
    t_attributes();
    t_fifo();
    t_host_funcs();
    t_cross_stream();
    t_capture();
    t_kernels();
    CK(cuCtxSetCurrent(ctx0));
    t_strict(ctx0, ctx1);
    t_errors();
    t_ipc(argv[0]);
    printf("done 1\n");
    return 0;
}
