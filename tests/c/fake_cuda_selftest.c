/*
 * fake_cuda_selftest.c: exercises the emulated CUDA driver (tests/c/fake_cuda.c)
 * through the real <cuda.h> and prints `key value` lines, which
 * tests/fake_cuda_selftest.rs checks. Results are printed raw (return codes,
 * flags) so that the Rust side asserts concrete values.
 *
 * Usage: fake_cuda_selftest all        (FAKE_CUDA_DEVICES=2)
 *        fake_cuda_selftest nomemops   (FAKE_CUDA_NO_STREAM_MEMOPS=1)
 *        fake_cuda_selftest nodev      (FAKE_CUDA_DEVICES=0)
 *        fake_cuda_selftest ipc_child <hex handle>   (started by `all`)
 * A call that must succeed and does not makes the program exit 2.
 */
#define _GNU_SOURCE
#include <cuda.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

#define CK(call)                                                                                   \
    do {                                                                                           \
        CUresult r_ = (call);                                                                      \
        if (r_ != CUDA_SUCCESS) {                                                                  \
            fprintf(stderr, "%s:%d: %s -> %d\n", __FILE__, __LINE__, #call, (int)r_);              \
            exit(2);                                                                               \
        }                                                                                          \
    } while (0)

static void kv(const char *k, long long v) { printf("%s %lld\n", k, v); }
static void kvs(const char *k, const char *v) { printf("%s %s\n", k, v ? v : "(null)"); }
static void kv2(const char *k, long long a, long long b) { printf("%s %lld,%lld\n", k, a, b); }

static void sleep_ms(int ms) {
    struct timespec t = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&t, NULL);
}

static void set_flag(volatile uint32_t *f, uint32_t v) {
    __atomic_store_n((uint32_t *)f, v, __ATOMIC_RELEASE);
}

static void fill(unsigned char *p, size_t n, unsigned mul, unsigned add) {
    for (size_t i = 0; i < n; i++) p[i] = (unsigned char)(i * mul + add);
}

static int check(const unsigned char *p, size_t n, unsigned mul, unsigned add) {
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
static volatile uint32_t *new_flag(uint32_t v) {
    void *p;
    CK(cuMemHostAlloc(&p, 64, CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP));
    *(uint32_t *)p = v;
    return p;
}

static CUstream new_stream(void) {
    CUstream s;
    CK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    return s;
}

static CUevent new_event(void) {
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

/* --------------------------------------------------------- stream order */

static void t_fifo(void) {
    enum { N = 4096 };
    static unsigned char src[N];
    CUstream s = new_stream();
    CUevent e = new_event();
    volatile uint32_t *flag = new_flag(0);
    CUdeviceptr a;
    CK(cuMemAlloc(&a, N));
    fill(src, N, 3, 1);
    CK(cuMemcpyHtoD(a, src, N));
    unsigned char *out;
    CK(cuMemHostAlloc((void **)&out, N, 0));
    memset(out, 0, N);

    kv("fifo.wait_rc", cuStreamWaitValue32(s, (CUdeviceptr)(uintptr_t)flag, 1,
                                           CU_STREAM_WAIT_VALUE_GEQ));
    CK(cuMemcpyDtoHAsync(out, a, N, s));
    CK(cuEventRecord(e, s));
    sleep_ms(50);
    kv("fifo.query_pending", cuStreamQuery(s));
    kv("fifo.event_pending", cuEventQuery(e));
    kv("fifo.copy_before", out[1] != 0);
    set_flag(flag, 1);
    CK(cuEventSynchronize(e));
    kv("fifo.copy_after", check(out, N, 3, 1));
    kv("fifo.event_after", cuEventQuery(e));
    CK(cuStreamSynchronize(s));
    kv("fifo.query_after", cuStreamQuery(s));
    /* Only a running op left (the queue itself is empty): still NOT_READY. */
    set_flag(flag, 0);
    CK(cuStreamWaitValue32(s, (CUdeviceptr)(uintptr_t)flag, 1, CU_STREAM_WAIT_VALUE_GEQ));
    sleep_ms(20);
    kv("fifo.query_running", cuStreamQuery(s));
    set_flag(flag, 1);
    CK(cuStreamSynchronize(s));

    /* Each wait-value comparison: blocked by `init`, released by `fin`. */
    static const struct {
        const char *key;
        unsigned flags;
        uint32_t init, value, fin;
    } W[] = {
        {"wv.geq_cyclic", CU_STREAM_WAIT_VALUE_GEQ, 0xFFFFFFFFu, 1, 1},
        {"wv.eq", CU_STREAM_WAIT_VALUE_EQ, 6, 5, 5},
        {"wv.and", CU_STREAM_WAIT_VALUE_AND, 0x0F, 0xF0, 0x10},
        {"wv.nor", CU_STREAM_WAIT_VALUE_NOR, 0xFFFFFFFEu, 1, 0xFFFFFF00u},
        {"wv.geq_flush", CU_STREAM_WAIT_VALUE_GEQ | CU_STREAM_WAIT_VALUE_FLUSH, 0, 2, 3},
    };
    for (size_t i = 0; i < sizeof W / sizeof W[0]; i++) {
        set_flag(flag, W[i].init);
        CK(cuStreamWaitValue32(s, (CUdeviceptr)(uintptr_t)flag, W[i].value, W[i].flags));
        CK(cuEventRecord(e, s));
        sleep_ms(20);
        CUresult pending = cuEventQuery(e);
        set_flag(flag, W[i].fin);
        CK(cuEventSynchronize(e));
        kv2(W[i].key, pending, cuEventQuery(e));
    }
    kv("wv.bad_flags", cuStreamWaitValue32(s, (CUdeviceptr)(uintptr_t)flag, 1, 7));
    kv("wv.unaligned", cuStreamWaitValue32(s, (CUdeviceptr)(uintptr_t)flag + 1, 1, 0));

    /* A flag in device memory, written by a synchronous copy (default stream). */
    uint32_t zero = 0, one = 1;
    CK(cuMemcpyHtoD(a, &zero, 4));
    CK(cuStreamWaitValue32(s, a, 1, CU_STREAM_WAIT_VALUE_EQ));
    CK(cuEventRecord(e, s));
    sleep_ms(20);
    CUresult pending = cuEventQuery(e);
    CK(cuMemcpyHtoD(a, &one, 4));
    CK(cuEventSynchronize(e));
    kv2("wv.devflag", pending, cuEventQuery(e));

    /* A freshly created event is complete; destroying a pending one is safe. */
    CUevent fresh = new_event();
    kv("event.fresh", cuEventQuery(fresh));
    CK(cuEventDestroy(fresh));
    set_flag(flag, 0);
    CUevent doomed = new_event();
    CK(cuStreamWaitValue32(s, (CUdeviceptr)(uintptr_t)flag, 1, CU_STREAM_WAIT_VALUE_GEQ));
    CK(cuEventRecord(doomed, s));
    kv("event.destroy_pending", cuEventDestroy(doomed));
    set_flag(flag, 1);
    kv("event.destroy_pending_sync", cuStreamSynchronize(s));

    /* Freeing memory that queued work still reads: it stays mapped until then. */
    set_flag(flag, 0);
    memset(out, 0, N);
    CK(cuMemcpyHtoD(a, src, N));
    CK(cuStreamWaitValue32(s, (CUdeviceptr)(uintptr_t)flag, 1, CU_STREAM_WAIT_VALUE_GEQ));
    CK(cuMemcpyDtoHAsync(out, a, N, s));
    kv("free.pending_rc", cuMemFree(a));
    set_flag(flag, 1);
    kv("free.pending_sync", cuStreamSynchronize(s));
    kv("free.pending_data", check(out, N, 3, 1));

    CK(cuEventDestroy(e));
    CK(cuStreamDestroy(s));
    CK(cuMemFreeHost(out));
    CK(cuMemFreeHost((void *)flag));
}

/* ------------------------------------------------------- host functions */

static struct {
    pthread_t main;
    char order[8];
    int n, on_worker, saw_copy;
    unsigned char *copied;
    volatile int ran;
} g_hf;

static void hf_one(void *u) {
    (void)u;
    g_hf.order[g_hf.n++] = '1';
    g_hf.on_worker = !pthread_equal(pthread_self(), g_hf.main);
}

static void hf_two(void *u) {
    g_hf.order[g_hf.n++] = (char)(uintptr_t)u;
    g_hf.saw_copy = check(g_hf.copied, 256, 5, 9);
}

static void hf_mark(void *u) {
    (void)u;
    __atomic_store_n(&g_hf.ran, 1, __ATOMIC_RELEASE);
}

static void t_host_funcs(void) {
    static unsigned char src[256];
    fill(src, 256, 5, 9);
    CUstream s = new_stream();
    volatile uint32_t *flag = new_flag(0);
    g_hf.main = pthread_self();
    CK(cuMemHostAlloc((void **)&g_hf.copied, 256, 0));
    CK(cuStreamWaitValue32(s, (CUdeviceptr)(uintptr_t)flag, 1, CU_STREAM_WAIT_VALUE_GEQ));
    CK(cuLaunchHostFunc(s, hf_one, NULL));
    CK(cuMemcpyAsync((CUdeviceptr)(uintptr_t)g_hf.copied, (CUdeviceptr)(uintptr_t)src, 256, s));
    CK(cuLaunchHostFunc(s, hf_two, (void *)(uintptr_t)'2'));
    sleep_ms(20);
    kv("hostfn.ran_before", g_hf.n);
    set_flag(flag, 1);
    CK(cuStreamSynchronize(s));
    kvs("hostfn.order", g_hf.order);
    kv("hostfn.on_worker", g_hf.on_worker);
    kv("hostfn.saw_copy", g_hf.saw_copy);

    /* cuStreamDestroy returns at once; the queued work still runs. */
    set_flag(flag, 0);
    CK(cuStreamWaitValue32(s, (CUdeviceptr)(uintptr_t)flag, 1, CU_STREAM_WAIT_VALUE_GEQ));
    CK(cuLaunchHostFunc(s, hf_mark, NULL));
    kv("destroy.rc", cuStreamDestroy(s));
    kv("destroy.returned_early", __atomic_load_n(&g_hf.ran, __ATOMIC_ACQUIRE) == 0);
    set_flag(flag, 1);
    for (int i = 0; i < 5000 && !__atomic_load_n(&g_hf.ran, __ATOMIC_ACQUIRE); i++) sleep_ms(1);
    kv("destroy.pending_ran", __atomic_load_n(&g_hf.ran, __ATOMIC_ACQUIRE));
}

/* ------------------------------------------------- cross-stream, ctx sync */

static void *set_later(void *arg) {
    sleep_ms(50);
    set_flag(arg, 1);
    return NULL;
}

static void t_cross_stream(void) {
    CUstream s1 = new_stream(), s2 = new_stream();
    CUevent e1 = new_event(), e2 = new_event(), never = new_event();
    volatile uint32_t *flag = new_flag(0);
    static unsigned char src[512], dst[512];
    fill(src, 512, 11, 2);
    CK(cuStreamWaitEvent(s2, never, 0));
    kv("xwait.unrecorded", cuStreamSynchronize(s2));

    CK(cuStreamWaitValue32(s1, (CUdeviceptr)(uintptr_t)flag, 1, CU_STREAM_WAIT_VALUE_GEQ));
    CK(cuEventRecord(e1, s1));
    CK(cuStreamWaitEvent(s2, e1, 0));
    CK(cuMemcpyAsync((CUdeviceptr)(uintptr_t)dst, (CUdeviceptr)(uintptr_t)src, 512, s2));
    CK(cuEventRecord(e2, s2));
    sleep_ms(50);
    kv("xwait.pending", cuEventQuery(e2));
    kv("xwait.copy_before", dst[1] != 0);
    set_flag(flag, 1);
    CK(cuEventSynchronize(e2));
    kv("xwait.done", cuEventQuery(e1));
    kv("xwait.copy_after", check(dst, 512, 11, 2));

    /* cuCtxSynchronize drains every stream of the context. */
    set_flag(flag, 0);
    memset(dst, 0, sizeof dst);
    CK(cuStreamWaitValue32(s1, (CUdeviceptr)(uintptr_t)flag, 1, CU_STREAM_WAIT_VALUE_GEQ));
    CK(cuMemcpyAsync((CUdeviceptr)(uintptr_t)dst, (CUdeviceptr)(uintptr_t)src, 512, s1));
    pthread_t th;
    pthread_create(&th, NULL, set_later, (void *)flag);
    CK(cuCtxSynchronize());
    kv("ctxsync.flag_was_set", __atomic_load_n(flag, __ATOMIC_ACQUIRE) == 1);
    kv("ctxsync.copy_done", check(dst, 512, 11, 2));
    pthread_join(th, NULL);

    CK(cuEventDestroy(e1));
    CK(cuEventDestroy(e2));
    CK(cuEventDestroy(never));
    CK(cuStreamDestroy(s1));
    CK(cuStreamDestroy(s2));
    CK(cuMemFreeHost((void *)flag));
}

/* -------------------------------------------------------------- capture */

static void noop(void *u) { (void)u; }

/* What hetccl does without stream memory operations: block in a host function. */
static void wait_flag_fn(void *u) {
    while (__atomic_load_n((uint32_t *)u, __ATOMIC_ACQUIRE) == 0) sleep_ms(1);
}

static void t_capture(void) {
    CUstream s = new_stream();
    CUevent e = new_event();
    CUstreamCaptureStatus st = (CUstreamCaptureStatus)99;
    CUdeviceptr a;
    CK(cuMemAlloc(&a, 64));
    char buf[64] = {0};
    CK(cuStreamIsCapturing(s, &st));
    kv("capture.before", st);
    kv("capture.begin", cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_RELAXED));
    CK(cuStreamIsCapturing(s, &st));
    kv("capture.active", st);
    kv("capture.begin_again", cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_RELAXED));
    kv("capture.copy", cuMemcpyHtoDAsync(a, buf, 64, s));
    kv("capture.memset", cuMemsetD8Async(a, 1, 64, s));
    kv("capture.record", cuEventRecord(e, s));
    kv("capture.wait_value", cuStreamWaitValue32(s, a, 1, CU_STREAM_WAIT_VALUE_GEQ));
    kv("capture.wait_event", cuStreamWaitEvent(s, e, 0));
    kv("capture.host_func", cuLaunchHostFunc(s, noop, NULL));
    kv("capture.sync", cuStreamSynchronize(s));
    kv("capture.event_untouched", cuEventQuery(e));
    CUgraph g = NULL;
    kv("capture.end", cuStreamEndCapture(s, &g));
    kv("capture.graph_nonnull", g != NULL);
    kv("capture.graph_destroy", cuGraphDestroy(g));
    CK(cuStreamIsCapturing(s, &st));
    kv("capture.after", st);
    kv("capture.end_again", cuStreamEndCapture(s, &g));
    CK(cuStreamIsCapturing(NULL, &st));
    kv("capture.null_stream", st);
    kv("capture.begin_null", cuStreamBeginCapture(NULL, CU_STREAM_CAPTURE_MODE_RELAXED));
    kv("capture.copy_after", cuMemcpyHtoDAsync(a, buf, 64, s));
    CK(cuStreamSynchronize(s));
    CK(cuStreamDestroy(s));
    CK(cuEventDestroy(e));
    CK(cuMemFree(a));
}

/* -------------------------------------------------------------- kernels */

/* Stands in for NVRTC's PTX of collectives/src/gpu/kernels/reduce.cu. */
static const char PTX[] =
    "//\n// Hand-written: only the entry names matter to the fake.\n//\n"
    ".version 8.5\n.target sm_90\n.address_size 64\n\n"
    "\t// .globl\thetccl_reduce_f32_sum\n"
    ".visible .entry hetccl_reduce_f32_sum(\n\t.param .u64 p0,\n\t.param .f32 p4\n)\n{\n\tret;\n}\n"
    ".visible .entry hetccl_reduce_f16_sum(\n)\n{\n\tret;\n}\n"
    ".visible .entry hetccl_reduce_f32_max(\n)\n{\n\tret;\n}\n"
    ".visible .entry hetccl_reduce_f32_avg(\n)\n{\n\tret;\n}\n"
    ".visible .entry hetccl_reduce_i32_prod(\n)\n{\n\tret;\n}\n"
    ".visible .entry hetccl_reduce_u8_sum(\n)\n{\n\tret;\n}\n"
    ".visible .entry hetccl_reduce_i8_max(\n)\n{\n\tret;\n}\n"
    ".visible .entry hetccl_reduce_u64_sum(\n)\n{\n\tret;\n}\n"
    ".visible .entry hetccl_reduce_f64_min(\n)\n{\n\tret;\n}\n"
    ".visible .entry hetccl_premul_f32(\n)\n{\n\tret;\n}\n"
    ".visible .entry hetccl_postdiv_i32(\n)\n{\n\tret;\n}\n"
    ".visible .entry hetccl_reduce_i32_premulsum(\n)\n{\n\tret;\n}\n"
    ".visible .entry hetccl_premul_f64(\n)\n{\n\tret;\n}\n"
    ".visible .entry hetccl_premul_u8(\n)\n{\n\tret;\n}\n"
    ".visible .entry hetccl_postdiv_i64(\n)\n{\n\tret;\n}\n"
    ".visible .entry hetccl_postdiv_u32(\n)\n{\n\tret;\n}\n"
    ".visible .entry hetccl_premul_f16(\n)\n{\n\tret;\n}\n"
    ".visible .entry hetccl_reduce_bf16_avg(\n)\n{\n\tret;\n}\n"
    ".visible .entry hetccl_postdiv_f32(\n)\n{\n\tret;\n}\n";

static CUfunction get_fn(CUmodule m, const char *name) {
    CUfunction f = NULL;
    CK(cuModuleGetFunction(&f, m, name));
    return f;
}

/* The kernels' signature: (T* dst, const T* a, const T* b, u64 n, T s). */
static CUresult launch(CUfunction f, CUdeviceptr d, CUdeviceptr a, CUdeviceptr b, uint64_t n,
                       CUstream s) {
    uint64_t scalar = 0;
    void *params[5] = {&d, &a, &b, &n, &scalar};
    return cuLaunchKernel(f, 4, 1, 1, 256, 1, 1, 0, s, params, NULL);
}

/* `len` bytes that end where a PROT_NONE page begins: reading past them
 * crashes. Freed with unguard(p, len). */
static void *guarded(size_t len) {
    size_t pg = (size_t)sysconf(_SC_PAGESIZE);
    char *m = mmap(NULL, 2 * pg, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED || mprotect(m + pg, pg, PROT_NONE) != 0) {
        perror("guarded");
        exit(2);
    }
    return m + pg - len;
}
static void unguard(void *p, size_t len) {
    size_t pg = (size_t)sysconf(_SC_PAGESIZE);
    munmap((char *)p + len - pg, 2 * pg);
}

/* Launches f with exactly np parameters, the i-th len[i] bytes at val[i].
 * The kernelParams array and every value end at a PROT_NONE page, so a fake
 * that reads one parameter more, or one byte more of a parameter, than the
 * kernel declares crashes this program. */
static CUresult launch_exact(CUfunction f, CUstream s, int np, const void *const *val,
                             const size_t *len) {
    void **params = guarded((size_t)np * sizeof(void *));
    for (int i = 0; i < np; i++) {
        params[i] = guarded(len[i]);
        memcpy(params[i], val[i], len[i]);
    }
    CUresult rc = cuLaunchKernel(f, 2, 1, 1, 128, 1, 1, 0, s, params, NULL);
    for (int i = 0; i < np; i++) unguard(params[i], len[i]);
    unguard(params, (size_t)np * sizeof(void *));
    return rc;
}
/* hetccl_reduce_<dt>_<op>(T* dst, const T* a, const T* b, u64 n, T s); sc: sizeof(T) = ts bytes. */
static CUresult launch_red(CUfunction f, CUdeviceptr d, CUdeviceptr a, CUdeviceptr b, uint64_t n,
                           const void *sc, size_t ts, CUstream s) {
    const void *val[5] = {&d, &a, &b, &n, sc};
    const size_t len[5] = {8, 8, 8, 8, ts};
    return launch_exact(f, s, 5, val, len);
}
/* hetccl_premul_<dt>(T* dst, const T* a, u64 n, T s). */
static CUresult launch_premul(CUfunction f, CUdeviceptr d, CUdeviceptr a, uint64_t n,
                              const void *sc, size_t ts, CUstream s) {
    const void *val[4] = {&d, &a, &n, sc};
    const size_t len[4] = {8, 8, 8, ts};
    return launch_exact(f, s, 4, val, len);
}
/* hetccl_postdiv_<dt>(T* dst, u64 n, u64 d). */
static CUresult launch_postdiv(CUfunction f, CUdeviceptr d, uint64_t n, uint64_t dv, CUstream s) {
    const void *val[3] = {&d, &n, &dv};
    const size_t len[3] = {8, 8, 8};
    return launch_exact(f, s, 3, val, len);
}

/* `key v0,v1,...` with %.9g (float) or %.17g (double) or integers. */
static void kv_f32(const char *k, const float *v, int n) {
    printf("%s ", k);
    for (int i = 0; i < n; i++) printf("%s%.9g", i ? "," : "", (double)v[i]);
    printf("\n");
}
static void kv_f64(const char *k, const double *v, int n) {
    printf("%s ", k);
    for (int i = 0; i < n; i++) printf("%s%.17g", i ? "," : "", v[i]);
    printf("\n");
}
static void kv_i64(const char *k, const int64_t *v, int n) {
    printf("%s ", k);
    for (int i = 0; i < n; i++) printf("%s%lld", i ? "," : "", (long long)v[i]);
    printf("\n");
}

struct nctx_res { CUresult load, launch; CUfunction f; };
static void *no_ctx_thread(void *arg) {
    struct nctx_res *r = arg;
    CUmodule m;
    r->load = cuModuleLoadData(&m, PTX);
    r->launch = launch(r->f, 0, 0, 0, 0, NULL);
    return NULL;
}

static void t_kernels(void) {
    CUmodule m = NULL, junk = NULL;
    CUfunction f = NULL;
    kv("kernel.load_garbage", cuModuleLoadData(&junk, "not a cubin"));
    kv("kernel.load_elf", cuModuleLoadData(&junk, "\177ELF\2\1\1"));
    kv("kernel.load_null", cuModuleLoadData(&junk, NULL));
    kv("kernel.load", cuModuleLoadData(&m, PTX));
    kv("kernel.module_nonnull", m != NULL);
    kv("kernel.get_f32_sum", cuModuleGetFunction(&f, m, "hetccl_reduce_f32_sum"));
    CUfunction again = NULL;
    CK(cuModuleGetFunction(&again, m, "hetccl_reduce_f32_sum"));
    kv("kernel.same_handle", f != NULL && again == f);
    CUfunction g = NULL;
    kv("kernel.get_f16_sum", cuModuleGetFunction(&g, m, "hetccl_reduce_f16_sum"));
    kv("kernel.get_f32_avg", cuModuleGetFunction(&g, m, "hetccl_reduce_f32_avg"));
    kv("kernel.get_premul", cuModuleGetFunction(&g, m, "hetccl_premul_f32"));
    kv("kernel.get_postdiv", cuModuleGetFunction(&g, m, "hetccl_postdiv_i32"));
    CUfunction h = NULL;
    CK(cuModuleGetFunction(&h, m, "hetccl_premul_f32"));
    kv("kernel.premul_own_handle", h != NULL && h != g && h != f);
    kv("kernel.get_f16_premul", cuModuleGetFunction(&g, m, "hetccl_premul_f16"));
    kv("kernel.get_bf16_avg", cuModuleGetFunction(&g, m, "hetccl_reduce_bf16_avg"));
    kv("kernel.get_f32_postdiv", cuModuleGetFunction(&g, m, "hetccl_postdiv_f32"));
    kv("kernel.get_missing", cuModuleGetFunction(&g, m, "hetccl_reduce_i32_sum"));
    kv("kernel.get_prefix", cuModuleGetFunction(&g, m, "hetccl_reduce_f32_su"));
    kv("kernel.get_bad_module", cuModuleGetFunction(&g, NULL, "hetccl_reduce_f32_sum"));

    enum { N = 5 };
    CUstream s = new_stream();
    CUevent e = new_event();
    volatile uint32_t *flag = new_flag(0);
    CUdeviceptr A, B;
    CK(cuMemAlloc(&A, 4096));
    CK(cuMemAlloc(&B, 4096));

    /* f32 sum, dst aliasing a, queued behind a blocked wait-value. The
     * parameter variables change after the launch: the values count. */
    const float fa[N] = {1.5f, -2.0f, 16777216.0f, 0.1f, 3.0f};
    const float fb[N] = {2.25f, 0.5f, 1.0f, 0.2f, -3.0f};
    float fo[N];
    CK(cuMemcpyHtoD(A, fa, sizeof fa));
    CK(cuMemcpyHtoD(B, fb, sizeof fb));
    CK(cuStreamWaitValue32(s, (CUdeviceptr)(uintptr_t)flag, 1, CU_STREAM_WAIT_VALUE_GEQ));
    {
        CUdeviceptr pd = A, pa = A, pb = B;
        uint64_t n = N;
        float sc = 0.0f;
        void *params[5] = {&pd, &pa, &pb, &n, &sc};
        kv("kernel.launch_rc", cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, s, params, NULL));
        pd = pa = pb = 0;
        n = 0;
    }
    CK(cuEventRecord(e, s));
    sleep_ms(30);
    kv("kernel.pending", cuEventQuery(e));
    CK(cuMemcpyDtoH(fo, A, sizeof fo)); /* default stream: not ordered after s */
    kv("kernel.not_run_before_release", memcmp(fo, fa, sizeof fa) == 0);
    set_flag(flag, 1);
    CK(cuEventSynchronize(e));
    CK(cuMemcpyDtoH(fo, A, sizeof fo));
    kv_f32("kernel.f32_sum", fo, N);

    /* f32 max: the non-NaN operand of a NaN pair; dst aliasing b. */
    const float ma[N] = {1.0f, NAN, 3.0f, -7.0f, NAN};
    const float mb[N] = {2.0f, 5.0f, NAN, -8.0f, NAN};
    CK(cuMemcpyHtoD(A, ma, sizeof ma));
    CK(cuMemcpyHtoD(B, mb, sizeof mb));
    kv("kernel.launch_f32_max", launch(get_fn(m, "hetccl_reduce_f32_max"), B, A, B, N, s));
    CK(cuStreamSynchronize(s));
    CK(cuMemcpyDtoH(fo, B, sizeof fo));
    kv_f32("kernel.f32_max", fo, N);

    /* i32 prod, wrapping; a in device memory, b and dst in pinned memory. */
    const int32_t pa_[4] = {INT32_MAX, -3, 65536, 7};
    const int32_t pb_[4] = {2, 5, 65536, INT32_MIN};
    int32_t *hb, *hd;
    CK(cuMemHostAlloc((void **)&hb, 64, 0));
    CK(cuMemHostAlloc((void **)&hd, 64, 0));
    memcpy(hb, pb_, sizeof pb_);
    memset(hd, 0, 64);
    CK(cuMemcpyHtoD(A, pa_, sizeof pa_));
    CK(launch(get_fn(m, "hetccl_reduce_i32_prod"), (CUdeviceptr)(uintptr_t)hd, A,
              (CUdeviceptr)(uintptr_t)hb, 4, s));
    CK(cuStreamSynchronize(s));
    int64_t io[8];
    for (int i = 0; i < 4; i++) io[i] = hd[i];
    kv_i64("kernel.i32_prod", io, 4);

    /* u8 sum, wrapping, at interior (odd) offsets, dst aliasing a. */
    const uint8_t ua[3] = {200, 1, 255}, ub[3] = {100, 2, 255};
    uint8_t uo[5] = {0};
    CK(cuMemsetD8(A, 9, 64));
    CK(cuMemcpyHtoD(A + 17, ua, 3));
    CK(cuMemcpyHtoD(B + 33, ub, 3));
    CK(launch(get_fn(m, "hetccl_reduce_u8_sum"), A + 17, A + 17, B + 33, 3, s));
    CK(cuStreamSynchronize(s));
    CK(cuMemcpyDtoH(uo, A + 16, 5));
    for (int i = 0; i < 5; i++) io[i] = uo[i];
    kv_i64("kernel.u8_sum", io, 5); /* the bytes around are untouched (9) */

    /* i8 max compares signed; u64 sum wraps. */
    const int8_t ia[3] = {-128, 127, -1}, ib[3] = {0, -128, 1};
    int8_t i8o[3];
    CK(cuMemcpyHtoD(A, ia, 3));
    CK(cuMemcpyHtoD(B, ib, 3));
    CK(launch(get_fn(m, "hetccl_reduce_i8_max"), A, A, B, 3, s));
    CK(cuStreamSynchronize(s));
    CK(cuMemcpyDtoH(i8o, A, 3));
    for (int i = 0; i < 3; i++) io[i] = i8o[i];
    kv_i64("kernel.i8_max", io, 3);
    const uint64_t la[2] = {UINT64_MAX, 1ull << 63}, lb[2] = {2, 1ull << 63};
    uint64_t lo[2];
    CK(cuMemcpyHtoD(A, la, sizeof la));
    CK(cuMemcpyHtoD(B, lb, sizeof lb));
    CK(launch(get_fn(m, "hetccl_reduce_u64_sum"), A, A, B, 2, s));
    CK(cuStreamSynchronize(s));
    CK(cuMemcpyDtoH(lo, A, sizeof lo));
    for (int i = 0; i < 2; i++) io[i] = (int64_t)lo[i];
    kv_i64("kernel.u64_sum", io, 2);

    /* f64 min with NaN operands, in double precision (1 + 2^-40 survives). */
    const double da[N] = {NAN, 1.5, -2.0, 1e10, 1.0};
    const double db[N] = {4.0, NAN, 3.0, -1e10, 1.0 + 0x1p-40};
    double dout[N];
    CK(cuMemcpyHtoD(A, da, sizeof da));
    CK(cuMemcpyHtoD(B, db, sizeof db));
    CK(launch(get_fn(m, "hetccl_reduce_f64_min"), A, A, B, N, s));
    CK(cuStreamSynchronize(s));
    CK(cuMemcpyDtoH(dout, A, sizeof dout));
    kv_f64("kernel.f64_min", dout, N);
    CK(cuMemcpyHtoD(A, db, sizeof db)); /* min(1 + 2^-40, 1 + 2^-40) stays exact */
    CK(launch(get_fn(m, "hetccl_reduce_f64_min"), A, A, B, N, s));
    CK(cuStreamSynchronize(s));
    CK(cuMemcpyDtoH(dout, A, sizeof dout));
    kv("kernel.f64_exact", dout[4] == 1.0 + 0x1p-40);

    /* f32 avg, dst = a*s + b with s = 0.25, dst aliasing b: 3*0.25 + 2^24
     * rounds to 2^24 in float. */
    const float va[N] = {4.0f, 1.0f, -8.0f, 0.1f, 3.0f};
    const float vb[N] = {1.0f, 0.5f, 2.0f, 0.2f, 16777216.0f};
    const float quarter = 0.25f;
    CK(cuMemcpyHtoD(A, va, sizeof va));
    CK(cuMemcpyHtoD(B, vb, sizeof vb));
    CK(launch_red(get_fn(m, "hetccl_reduce_f32_avg"), B, A, B, N, &quarter, 4, s));
    CK(cuStreamSynchronize(s));
    CK(cuMemcpyDtoH(fo, B, sizeof fo));
    kv_f32("kernel.f32_avg", fo, N);
    /* a*s + b with a = s = 1 + 2^-12, b = -(1 + 2^-11): the exact product
     * 1 + 2^-11 + 2^-24 rounds (to even) to 1 + 2^-11, so unfused gives 0,
     * fused 2^-24. Both computed here: the double sum is exact. */
    {
        volatile float x = 1.0f + 0x1p-12f, sc = 1.0f + 0x1p-12f, y = -(1.0f + 0x1p-11f);
        volatile float prod = x * sc;
        float unfused = prod + y;
        float fused = (float)((double)x * (double)sc + (double)y);
        kv("kernel.f32_fma_differs", unfused != fused);
        printf("kernel.f32_fma_ref %.9g,%.9g\n", (double)unfused, (double)fused);
        const float one[1] = {x}, other[1] = {y}, scv = sc;
        CK(cuMemcpyHtoD(A, one, 4));
        CK(cuMemcpyHtoD(B, other, 4));
        CK(launch_red(get_fn(m, "hetccl_reduce_f32_avg"), A, A, B, 1, &scv, 4, s));
        CK(cuStreamSynchronize(s));
        CK(cuMemcpyDtoH(fo, A, 4));
        kv_f32("kernel.f32_avg_unfused", fo, 1);
    }

    /* i32 premulsum a*(-3) + b, wrapping; the 5-parameter shape with
     * exactly 5 parameters and a 4-byte s. */
    const int32_t qa[4] = {INT32_MAX, -7, 1 << 30, 5}, qb[4] = {1, 2, 0, INT32_MAX};
    const int32_t m3 = -3;
    int32_t qo[4];
    CK(cuMemcpyHtoD(A, qa, sizeof qa));
    CK(cuMemcpyHtoD(B, qb, sizeof qb));
    kv("kernel.exact_params_reduce",
       launch_red(get_fn(m, "hetccl_reduce_i32_premulsum"), A, A, B, 4, &m3, 4, s));
    CK(cuStreamSynchronize(s));
    CK(cuMemcpyDtoH(qo, A, sizeof qo));
    for (int i = 0; i < 4; i++) io[i] = qo[i];
    kv_i64("kernel.i32_premulsum", io, 4);

    /* f64 premul a*3 into another buffer: 3*(1 + 2^-52) rounds to even. */
    const double pa64[N] = {1.5, -2.0, 0.1, 1e308, 1.0 + 0x1p-52};
    const double three = 3.0;
    CK(cuMemcpyHtoD(A, pa64, sizeof pa64));
    CK(launch_premul(get_fn(m, "hetccl_premul_f64"), B, A, N, &three, 8, s));
    CK(cuStreamSynchronize(s));
    CK(cuMemcpyDtoH(dout, B, sizeof dout));
    kv_f64("kernel.f64_premul", dout, N);

    /* u8 premul a*255 in place at an odd offset, wrapping; the 4-parameter
     * shape with exactly 4 parameters and a 1-byte s. */
    const uint8_t pu[4] = {200, 3, 255, 0};
    const uint8_t u255 = 255;
    uint8_t puo[6];
    CK(cuMemsetD8(A, 9, 64));
    CK(cuMemcpyHtoD(A + 5, pu, 4));
    kv("kernel.exact_params_premul",
       launch_premul(get_fn(m, "hetccl_premul_u8"), A + 5, A + 5, 4, &u255, 1, s));
    CK(cuStreamSynchronize(s));
    CK(cuMemcpyDtoH(puo, A + 4, 6));
    for (int i = 0; i < 6; i++) io[i] = puo[i];
    kv_i64("kernel.u8_premul", io, 6); /* the bytes around are untouched (9) */

    /* i64 postdiv by 2 truncates toward zero; by d = 2^64 - 1, which the
     * kernel divides by as (long long)d = -1 (LLONG_MIN / -1 wraps). */
    const int64_t da64[6] = {-7, 7, -8, INT64_MIN, -1, 9};
    int64_t do64[6];
    CUfunction pdiv = get_fn(m, "hetccl_postdiv_i64");
    CK(cuMemcpyHtoD(A, da64, sizeof da64));
    CK(launch_postdiv(pdiv, A, 6, 2, s));
    CK(cuStreamSynchronize(s));
    CK(cuMemcpyDtoH(do64, A, sizeof do64));
    kv_i64("kernel.i64_postdiv", do64, 6);
    CK(cuMemcpyHtoD(A, da64, sizeof da64));
    CK(launch_postdiv(pdiv, A, 6, UINT64_MAX, s));
    CK(cuStreamSynchronize(s));
    CK(cuMemcpyDtoH(do64, A, sizeof do64));
    kv_i64("kernel.i64_postdiv_dmax", do64, 6);

    /* u32 postdiv by 3; the 3-parameter shape with exactly 3 parameters.
     * Then by 2^32 (a 64-bit divisor: 0, not a division by zero). */
    const uint32_t ua32[4] = {UINT32_MAX, 7, 0, 100};
    uint32_t uo32[4];
    CUfunction udiv = get_fn(m, "hetccl_postdiv_u32");
    CK(cuMemcpyHtoD(A, ua32, sizeof ua32));
    kv("kernel.exact_params_postdiv", launch_postdiv(udiv, A, 4, 3, s));
    CK(cuStreamSynchronize(s));
    CK(cuMemcpyDtoH(uo32, A, sizeof uo32));
    for (int i = 0; i < 4; i++) io[i] = uo32[i];
    kv_i64("kernel.u32_postdiv", io, 4);
    CK(cuMemcpyHtoD(A, ua32, sizeof ua32));
    CK(launch_postdiv(udiv, A, 4, 1ull << 32, s));
    CK(cuStreamSynchronize(s));
    CK(cuMemcpyDtoH(uo32, A, sizeof uo32));
    for (int i = 0; i < 4; i++) io[i] = uo32[i];
    kv_i64("kernel.u32_postdiv_2p32", io, 4);
    /* Division by zero is refused (unless n == 0: nothing is divided). */
    kv("kernel.postdiv_zero", launch_postdiv(udiv, A, 4, 0, s));
    kv("kernel.postdiv_zero_n0", launch_postdiv(udiv, A, 0, 0, s));
    {
        uint64_t n1 = 1;
        void *pp[3] = {&A, &n1, NULL};
        kv("kernel.postdiv_null_param", cuLaunchKernel(udiv, 1, 1, 1, 1, 1, 1, 0, s, pp, NULL));
    }
    CK(cuStreamSynchronize(s));

    /* Errors. */
    void *params[5] = {&A, &A, &B, &(uint64_t){1}, &(uint64_t){0}};
    kv("kernel.launch_null_fn", cuLaunchKernel(NULL, 1, 1, 1, 1, 1, 1, 0, s, params, NULL));
    kv("kernel.launch_grid0", cuLaunchKernel(f, 0, 1, 1, 1, 1, 1, 0, s, params, NULL));
    kv("kernel.launch_block0", cuLaunchKernel(f, 1, 1, 1, 1, 0, 1, 0, s, params, NULL));
    kv("kernel.launch_block_big", cuLaunchKernel(f, 1, 1, 1, 1025, 1, 1, 0, s, params, NULL));
    kv("kernel.launch_no_params", cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, s, NULL, NULL));
    void *extra[] = {CU_LAUNCH_PARAM_END};
    kv("kernel.launch_extra", cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, s, params, extra));
    kv("kernel.launch_overrun", launch(f, A, A, B, 1025, s)); /* 4100 bytes > 4096 */
    kv("kernel.launch_null_ptr", launch(f, 0, A, B, 1, s));
    kv("kernel.launch_n0_null", launch(f, 0, 0, 0, 0, s));
    struct nctx_res r = {0, 0, f};
    pthread_t th;
    pthread_create(&th, NULL, no_ctx_thread, &r);
    pthread_join(th, NULL);
    kv("kernel.load_no_ctx", r.load);
    kv("kernel.launch_no_ctx", r.launch);
    CK(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_RELAXED));
    kv("kernel.launch_capturing", launch(f, A, A, B, 1, s));
    CUgraph gr;
    CK(cuStreamEndCapture(s, &gr));
    CK(cuGraphDestroy(gr));
    CK(cuStreamSynchronize(s));

    kv("kernel.unload", cuModuleUnload(m));
    kv("kernel.unload_again", cuModuleUnload(NULL));
    CK(cuEventDestroy(e));
    CK(cuStreamDestroy(s));
    CK(cuMemFree(A));
    CK(cuMemFree(B));
    CK(cuMemFreeHost(hb));
    CK(cuMemFreeHost(hd));
    CK(cuMemFreeHost((void *)flag));
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
    kv("ipc.child_close", cuIpcCloseMemHandle(p));
    kv("ipc.child_close_again", cuIpcCloseMemHandle(p));
    kv("ipc.child_range_closed", cuMemGetAddressRange(&base, &size, p + 100));
    return 0;
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    const char *mode = argc > 1 ? argv[1] : "all";
    if (strcmp(mode, "ipc_child") == 0 && argc > 2) return ipc_child(argv[2]);
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
    t_errors();
    t_ipc(argv[0]);
    printf("done 1\n");
    return 0;
}
