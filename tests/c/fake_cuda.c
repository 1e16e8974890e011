/*
 * fake_cuda.c: an emulated CUDA driver (libcuda.so.1) for hetccl's tests on
 * machines without a GPU. Built by testkit/src/fake_cuda.rs; a test puts
 * its directory first in LD_LIBRARY_PATH, and hetccl (cudarc, dynamic
 * loading) finds it instead of NVIDIA's driver.
 *
 * The files: fake_cuda.c (this one: the model, the switches, init, devices,
 * contexts, error names), fake_cuda_memory.c (the allocation table, device
 * and pinned allocations, pointer attributes, address ranges, IPC),
 * fake_cuda_streams.c (streams and their worker threads, the shared
 * host-function worker, quiesce and the watchdogs, copies, memsets, waits,
 * cuCtxSynchronize, graph capture, events), fake_cuda_kernels.c (modules,
 * CUBIN and PTX images, and the emulated kernels) and fake_cuda_internal.h
 * (what they share, all of it hidden: the library exports only the CUDA
 * API).
 *
 * The model
 * - Devices: FAKE_CUDA_DEVICES of them (default 1; 0 makes cuInit fail with
 *   CUDA_ERROR_NO_DEVICE), compute capability 9.0, unified addressing, UUID
 *   "hetcclfakegpu" zero-padded with the ordinal in its last byte (distinct
 *   per device, the same in every process). One primary context per
 *   device; the current context is thread-local. Calls that allocate, create
 *   or enqueue need one (else CUDA_ERROR_INVALID_CONTEXT, as in the real
 *   driver); queries, synchronisation and frees do not. cuDriverGetVersion
 *   reports FAKE_CUDA_DRIVER_VERSION (default: the CUDA_VERSION of cuda.h).
 * - Device memory (cuMemAlloc) is a memfd mapped twice: a PROT_NONE view whose
 *   address is the CUdeviceptr, so a host access of a device pointer faults
 *   as on a real GPU, and a read-write "shadow" view that the fake copies
 *   through. Pinned host memory (cuMemHostAlloc) is plain RW memory whose
 *   device pointer is its host address. Every address given to a copy,
 *   memset, wait-value or kernel is translated: inside a device range -> the
 *   shadow; anywhere else -> used as a host address. cuMemGetAddressRange
 *   knows device, IPC-mapped and pinned allocations (else NOT_FOUND).
 * - Streams: each has a worker thread running a FIFO of operations (copy,
 *   memset, event record, wait for an event, wait for a 32-bit value, host
 *   function, kernel), and a context. Stream handles 0, CU_STREAM_LEGACY
 *   and CU_STREAM_PER_THREAD all name the current context's default stream
 *   (none current: CUDA_ERROR_INVALID_CONTEXT). Synchronous copies and
 *   memsets run on it and wait for it to drain.
 * - Events: created in the current context; pending from cuEventRecord
 *   until the worker reaches the record.
 * - Contexts, as CUDA's rules say: an event recorded on a stream of another
 *   context is CUDA_ERROR_INVALID_HANDLE; a kernel launched while its
 *   module's context is not current is CUDA_ERROR_INVALID_CONTEXT, on a
 *   stream of another context CUDA_ERROR_INVALID_HANDLE. Copies, waits for
 *   events and host functions may use any context's stream.
 * - Synchronising calls wait, as on a GPU, until the streams have run what
 *   was queued before the call: cuMemFree and cuIpcCloseMemHandle those of
 *   the allocation's context, cuMemFreeHost those of every context,
 *   cuModuleLoadData and a function's first cuModuleGetFunction (CUDA's
 *   lazy loading) those of the current or the module's context. A wait
 *   past FAKE_CUDA_DEADLOCK_S (default 30) aborts the process naming the
 *   call and what the stream is stuck on: on a GPU it would never return.
 * - Allocations: cuMemAlloc and cuMemHostAlloc abort the process while a
 *   stream waits on cuStreamWaitValue32. CUDA's programming guide says such
 *   an allocation keeps commands issued before and after it on different
 *   streams from running concurrently, so work issued after it could stay
 *   behind the wait for good.
 * - Host functions: all of them run on one shared worker thread, in the
 *   order their streams reach them (the stream waits for its function). A
 *   CUDA call from inside one returns CUDA_ERROR_NOT_PERMITTED; one that
 *   runs past FAKE_CUDA_HOSTFN_LIMIT_S (default 10) aborts the process.
 * - IPC: a handle names the owner's pid and memfd; another process opens
 *   /proc/<pid>/fd/<fd> and maps it (same uid, owner still alive).
 * - Kernels: hetccl's reduction kernels (collectives/src/gpu/kernels/
 *   reduce.cu) are emulated on the host, for all 12 datatypes (90 entry
 *   points). cuModuleLoadData takes a CUBIN (an ELF image for EM_CUDA whose
 *   e_flags name sm_90; its global functions are the entries; another
 *   architecture, or any CUBIN under FAKE_CUDA_REJECT_CUBIN=1:
 *   CUDA_ERROR_NO_BINARY_FOR_GPU) or NUL-terminated PTX text (its .version
 *   at most what the driver version compiles, else
 *   CUDA_ERROR_UNSUPPORTED_PTX_VERSION; its .target at most sm_90), either
 *   holding an entry "hetccl_reduce_..." (anything else:
 *   CUDA_ERROR_INVALID_IMAGE); cuModuleGetFunction looks the name up among
 *   its entries (absent: CUDA_ERROR_NOT_FOUND). A launch copies exactly the
 *   kernel's parameters (each with its size; the scalar s is sizeof(T)
 *   bytes) and queues the kernel, run by the stream's worker as reduce.cu
 *   does it, for i < n:
 *     hetccl_reduce_<dt>_<op>(dst, a, b, n, s)  (5 parameters)
 *       sum/prod/max/min: dst[i] = op(a[i], b[i]);
 *       avg, premulsum:   dst[i] = a[i]*s + b[i];
 *     hetccl_premul_<dt>(dst, a, n, s)           (4): dst[i] = a[i]*s;
 *     hetccl_postdiv_<dt>(dst, n, d), integers   (3): dst[i] /= d.
 *   Integer sums and products wrap; float ops are in the type's precision,
 *   each product rounded before the add (no fused multiply-add, as NVRTC's
 *   --fmad=false); float max/min return the non-NaN operand of a NaN pair;
 *   postdiv divides in 64 bits, signed types truncating toward zero with d
 *   taken as a signed 64-bit value (as reduce.cu's (long long)d). float16,
 *   bfloat16 and fp8 compute one float operation on the exactly loaded
 *   values and round once on store, to nearest even (fp8 through float16,
 *   saturating), with reduce.cu's conversions.
 *
 * Limits (where a test could be misled)
 * - The images are never run: the arithmetic is the fake's own copy of
 *   reduce.cu's, and a change to that file is not seen here. A NaN stored
 *   as float16 is 0x7fff (as PTX cvt.rn.f16.f32 is taken to give). A
 *   postdiv by d == 0 with n > 0 fails the launch with
 *   CUDA_ERROR_INVALID_VALUE (the GPU would store unspecified values). A
 *   CUBIN's size is not known to cuModuleLoadData: its headers are trusted.
 * - A launch ignores grid and block sizes (they must be >= 1, at most 1024
 *   threads a block; the real kernels are grid-stride loops) and shared
 *   memory; `extra` (CU_LAUNCH_PARAM_*) is CUDA_ERROR_NOT_SUPPORTED. A buffer
 *   running past the end of its device allocation fails the launch with
 *   CUDA_ERROR_INVALID_VALUE (a GPU would fault later, at run time); host
 *   addresses are not checked. A NULL among the kernel's parameter pointers
 *   is CUDA_ERROR_INVALID_VALUE; a kernelParams array shorter than the
 *   kernel's parameter list is not detected (nor by the real driver).
 * - The legacy default stream does not synchronise with other streams (the
 *   real one waits for, and blocks, every blocking stream of its context),
 *   and the per-thread default stream is the legacy one.
 * - A synchronising call waits for the streams only: it takes no lock that
 *   blocks other threads' CUDA calls meanwhile (a real driver may), and
 *   allocations (cuMemAlloc, cuMemHostAlloc, cuIpcOpenMemHandle) do not
 *   wait at all.
 * - Enqueuing any work on a capturing stream fails with
 *   CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED (the real driver would record it
 *   into the graph): hetccl must refuse before enqueuing, and this makes a
 *   mistake visible. Capture modes are not emulated.
 * - cuStreamDestroy returns at once; the worker drains the queue, then exits
 *   (as the real driver releases a busy stream's resources later). A
 *   stream's memory is never freed.
 * - A re-recorded event completes when any of its records does: a wait for
 *   an older record may be released by a newer one finishing first.
 * - cuIpcOpenMemHandle returns the base of the exported allocation (as the
 *   real driver does) even when the handle was taken of an interior pointer.
 * - Copies do not check that their direction matches the function's name;
 *   host addresses are not checked at all (a bad one crashes the worker).
 * - Fork after use is unsupported, as in the real driver: a child must exec.
 * - IPC needs the opener to be allowed to open /proc/<pid>/fd of the owner
 *   (same uid, ptrace read access); the owner must not have freed the memory.
 * - A copy into a device flag that another stream polls is a plain memmove
 *   racing with the poll (ThreadSanitizer reports it; a GPU has the same race).
 *
 * FAKE_CUDA_LOG=1 prints one line per call to stderr; FAKE_CUDA_NO_STREAM_
 * MEMOPS=1 makes cuStreamWaitValue32 return CUDA_ERROR_NOT_SUPPORTED;
 * FAKE_CUDA_NO_PEER_ACCESS=1 turns peer access off; FAKE_CUDA_PEERMEM=1 maps
 * device memory readable and writable (as nvidia-peermem lets a NIC pin it:
 * a real RDMA device can then register it; a host access no longer crashes);
 * FAKE_CUDA_DRIVER_VERSION,
 * FAKE_CUDA_REJECT_CUBIN, FAKE_CUDA_DEADLOCK_S and FAKE_CUDA_HOSTFN_LIMIT_S
 * are above; every other blocking wait aborts the process after
 * FAKE_CUDA_TIMEOUT_S (default 120) seconds, so that a bug never hangs CI.
 */
#include "fake_cuda_internal.h"

/* ---------------------------------------------------------------- basics */

int g_log;                 /* FAKE_CUDA_LOG */
int g_no_memops;           /* FAKE_CUDA_NO_STREAM_MEMOPS */
int g_no_peer;             /* FAKE_CUDA_NO_PEER_ACCESS */
int g_peermem;             /* FAKE_CUDA_PEERMEM */
int g_reject_cubin;        /* FAKE_CUDA_REJECT_CUBIN */
int g_driver_version = CUDA_VERSION; /* FAKE_CUDA_DRIVER_VERSION */
int g_deadlock_s = 30;     /* FAKE_CUDA_DEADLOCK_S */
int g_hostfn_limit_s = 10; /* FAKE_CUDA_HOSTFN_LIMIT_S */
static int g_timeout_s = 120;
int g_inited;              /* cuInit succeeded (atomic access) */
__thread int t_in_hostfn;  /* set by the host-function worker around each call */
static int g_ndev = 1;

__attribute__((format(printf, 1, 2))) void say(const char *fmt, ...) {
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    fprintf(stderr, "fake_cuda[%d]: %s\n", (int)getpid(), buf);
}

void die_timeout(const char *what) {
    say("%s still waiting after %d s (FAKE_CUDA_TIMEOUT_S); aborting", what, g_timeout_s);
    abort();
}

/* Condition variables use CLOCK_MONOTONIC so that deadlines are immune to clock changes. */
void cond_init(pthread_cond_t *cv) {
    pthread_condattr_t a;
    pthread_condattr_init(&a);
    pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
    pthread_cond_init(cv, &a);
    pthread_condattr_destroy(&a);
}

struct timespec deadline_in(int s) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    t.tv_sec += s;
    return t;
}

struct timespec deadline(void) { return deadline_in(g_timeout_s); }

int past(const struct timespec *dl) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec > dl->tv_sec || (t.tv_sec == dl->tv_sec && t.tv_nsec >= dl->tv_nsec);
}

/* One wait on `cv`; aborts the process once `dl` has passed. */
void wait_until(pthread_cond_t *cv, pthread_mutex_t *mu, const struct timespec *dl,
                const char *what) {
    if (pthread_cond_timedwait(cv, mu, dl) == ETIMEDOUT) die_timeout(what);
}

size_t page_round(size_t n) {
    size_t pg = (size_t)sysconf(_SC_PAGESIZE);
    return (n + pg - 1) / pg * pg;
}

/* ------------------------------------------------------------- contexts */

struct fake_ctx g_ctx[MAX_DEV];
__thread struct fake_ctx *t_ctx; /* the calling thread's current context */

/* A positive integer from the environment, or `dflt`. */
static int env_int(const char *name, int dflt) {
    const char *e = getenv(name);
    return e && atoi(e) > 0 ? atoi(e) : dflt;
}

__attribute__((constructor)) static void fake_cuda_load(void) {
    const char *e = getenv("FAKE_CUDA_LOG");
    g_log = e && *e && strcmp(e, "0") != 0;
    e = getenv("FAKE_CUDA_NO_STREAM_MEMOPS");
    g_no_memops = e && *e && strcmp(e, "0") != 0;
    e = getenv("FAKE_CUDA_NO_PEER_ACCESS");
    g_no_peer = e && *e && strcmp(e, "0") != 0;
    e = getenv("FAKE_CUDA_PEERMEM");
    g_peermem = e && *e && strcmp(e, "0") != 0;
    e = getenv("FAKE_CUDA_REJECT_CUBIN");
    g_reject_cubin = e && *e && strcmp(e, "0") != 0;
    g_timeout_s = env_int("FAKE_CUDA_TIMEOUT_S", g_timeout_s);
    g_deadlock_s = env_int("FAKE_CUDA_DEADLOCK_S", g_deadlock_s);
    g_hostfn_limit_s = env_int("FAKE_CUDA_HOSTFN_LIMIT_S", g_hostfn_limit_s);
    g_driver_version = env_int("FAKE_CUDA_DRIVER_VERSION", g_driver_version);
    for (int i = 0; i < MAX_DEV; i++) g_ctx[i] = (struct fake_ctx){CTX_MAGIC, i};
    cond_init(&g_ev_cv);
}

/* ------------------------------------------------------- init, devices */

CUresult cuInit(unsigned int flags) {
    LOG("cuInit(%u)", flags);
    if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
    const char *e = getenv("FAKE_CUDA_DEVICES");
    int n = e && *e ? atoi(e) : 1;
    if (n <= 0) return CUDA_ERROR_NO_DEVICE;
    g_ndev = n > MAX_DEV ? MAX_DEV : n;
    __atomic_store_n(&g_inited, 1, __ATOMIC_RELEASE);
    return CUDA_SUCCESS;
}

CUresult cuDriverGetVersion(int *v) {
    LOG("cuDriverGetVersion -> %d", g_driver_version);
    NEED_PTR(v);
    *v = g_driver_version;
    return CUDA_SUCCESS;
}

/* The driver's private export tables. NVIDIA's NVRTC opens libcuda.so.1
 * when it is on the library path and asks for one; without this symbol it
 * dereferences NULL. The fake has none: NVRTC then works without it. */
CUresult cuGetExportTable(const void **table, const CUuuid *id) {
    LOG("cuGetExportTable: none in the fake");
    (void)id;
    if (table != NULL) *table = NULL;
    return CUDA_ERROR_NOT_SUPPORTED;
}

#define NEED_DEV(d) do { if ((d) < 0 || (d) >= g_ndev) return CUDA_ERROR_INVALID_DEVICE; } while (0)

CUresult cuDeviceGet(CUdevice *dev, int ordinal) {
    LOG("cuDeviceGet(%d)", ordinal);
    NEED_INIT();
    NEED_PTR(dev);
    NEED_DEV(ordinal);
    *dev = ordinal;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetCount(int *count) {
    LOG("cuDeviceGetCount");
    NEED_INIT();
    NEED_PTR(count);
    *count = g_ndev;
    return CUDA_SUCCESS;
}

/* The PCI address matches CU_DEVICE_ATTRIBUTE_PCI_BUS_ID: bus 0x10 + ordinal. */
CUresult cuDeviceGetPCIBusId(char *out, int len, CUdevice dev) {
    LOG("cuDeviceGetPCIBusId(dev=%d)", dev);
    NEED_INIT();
    NEED_PTR(out);
    NEED_DEV(dev);
    if (len < 13) return CUDA_ERROR_INVALID_VALUE;
    snprintf(out, (size_t)len, "0000:%02x:00.0", 0x10 + dev);
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetAttribute(int *pi, CUdevice_attribute attr, CUdevice dev) {
    LOG("cuDeviceGetAttribute(attr=%d, dev=%d)", (int)attr, dev);
    NEED_INIT();
    NEED_PTR(pi);
    NEED_DEV(dev);
    switch (attr) {
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: *pi = DEVICE_SM / 10; break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: *pi = DEVICE_SM % 10; break;
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK: *pi = 1024; break;
    case CU_DEVICE_ATTRIBUTE_WARP_SIZE: *pi = 32; break;
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: *pi = 132; break;
    case CU_DEVICE_ATTRIBUTE_PCI_BUS_ID: *pi = 0x10 + dev; break;
    case CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY:
    case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING:
    case CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM: *pi = 1; break;
    case CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_MEM_OPS_V1:
    case CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_WAIT_VALUE_NOR: *pi = !g_no_memops; break;
    default: *pi = 0; break;
    }
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetName(char *name, int len, CUdevice dev) {
    LOG("cuDeviceGetName(dev=%d)", dev);
    NEED_INIT();
    NEED_PTR(name);
    NEED_DEV(dev);
    if (len <= 0) return CUDA_ERROR_INVALID_VALUE;
    snprintf(name, (size_t)len, "hetccl fake GPU");
    return CUDA_SUCCESS;
}

CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev) {
    LOG("cuDeviceTotalMem_v2(dev=%d)", dev);
    NEED_INIT();
    NEED_PTR(bytes);
    NEED_DEV(dev);
    *bytes = (size_t)80 << 30;
    return CUDA_SUCCESS;
}

/* "hetcclfakegpu", zero-padded, the ordinal in the last byte: distinct per
 * device, the same in every process. */
static CUresult get_uuid(const char *fn, CUuuid *uuid, CUdevice dev) {
    LOG("%s(dev=%d)", fn, dev);
    NEED_INIT();
    NEED_PTR(uuid);
    NEED_DEV(dev);
    static const char tag[] = "hetcclfakegpu";
    _Static_assert(sizeof tag <= sizeof uuid->bytes - 1, "tag fits");
    memset(uuid->bytes, 0, sizeof uuid->bytes);
    memcpy(uuid->bytes, tag, sizeof tag - 1);
    uuid->bytes[sizeof uuid->bytes - 1] = (char)dev;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetUuid(CUuuid *uuid, CUdevice dev) {
    return get_uuid("cuDeviceGetUuid", uuid, dev);
}

CUresult cuDeviceGetUuid_v2(CUuuid *uuid, CUdevice dev) {
    return get_uuid("cuDeviceGetUuid_v2", uuid, dev);
}

/* Peer access between two devices: always, unless FAKE_CUDA_NO_PEER_ACCESS
 * is set (then never, and IPC handles of another device's memory cannot be
 * opened). */
CUresult cuDeviceCanAccessPeer(int *can, CUdevice dev, CUdevice peer) {
    LOG("cuDeviceCanAccessPeer(%d, %d)", dev, peer);
    NEED_INIT();
    NEED_PTR(can);
    NEED_DEV(dev);
    NEED_DEV(peer);
    *can = dev != peer && !g_no_peer;
    return CUDA_SUCCESS;
}

/* ------------------------------------------------------------- contexts */

CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev) {
    LOG("cuDevicePrimaryCtxRetain(dev=%d)", dev);
    NEED_INIT();
    NEED_PTR(pctx);
    NEED_DEV(dev);
    *pctx = (CUcontext)&g_ctx[dev];
    return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
    LOG("cuDevicePrimaryCtxRelease_v2(dev=%d)", dev);
    NEED_INIT();
    NEED_DEV(dev);
    return CUDA_SUCCESS; /* primary contexts live as long as the process */
}

CUresult cuCtxGetCurrent(CUcontext *pctx) {
    LOG("cuCtxGetCurrent -> %p", (void *)t_ctx);
    NEED_INIT();
    NEED_PTR(pctx);
    *pctx = (CUcontext)t_ctx;
    return CUDA_SUCCESS;
}

CUresult cuCtxSetCurrent(CUcontext ctx) {
    LOG("cuCtxSetCurrent(%p)", (void *)ctx);
    NEED_INIT();
    struct fake_ctx *c = (struct fake_ctx *)ctx;
    if (c && (c < g_ctx || c >= g_ctx + g_ndev || c->magic != CTX_MAGIC))
        return CUDA_ERROR_INVALID_CONTEXT;
    t_ctx = c;
    return CUDA_SUCCESS;
}

CUresult cuCtxGetDevice(CUdevice *dev) {
    LOG("cuCtxGetDevice");
    NEED_INIT();
    NEED_PTR(dev);
    NEED_CTX();
    *dev = t_ctx->device;
    return CUDA_SUCCESS;
}

/* --------------------------------------------------------------- errors */

static const struct {
    CUresult code;
    const char *name, *text;
} ERRORS[] = {
#define E(c, t) {c, #c, t}
    E(CUDA_SUCCESS, "no error"),
    E(CUDA_ERROR_INVALID_VALUE, "invalid argument"),
    E(CUDA_ERROR_OUT_OF_MEMORY, "out of memory"),
    E(CUDA_ERROR_NOT_INITIALIZED, "initialization error"),
    E(CUDA_ERROR_NO_DEVICE, "no CUDA-capable device is detected"),
    E(CUDA_ERROR_INVALID_DEVICE, "invalid device ordinal"),
    E(CUDA_ERROR_INVALID_CONTEXT, "invalid device context"),
    E(CUDA_ERROR_INVALID_HANDLE, "invalid resource handle"),
    E(CUDA_ERROR_ILLEGAL_STATE, "the operation cannot be performed in the present state"),
    E(CUDA_ERROR_INVALID_IMAGE, "device kernel image is invalid"),
    E(CUDA_ERROR_NO_BINARY_FOR_GPU, "no kernel image is available for execution on the device"),
    E(CUDA_ERROR_UNSUPPORTED_PTX_VERSION, "the provided PTX was compiled with an unsupported toolchain"),
    E(CUDA_ERROR_NOT_PERMITTED, "operation not permitted"),
    E(CUDA_ERROR_INVALID_PTX, "a PTX JIT compilation failed"),
    E(CUDA_ERROR_PEER_ACCESS_UNSUPPORTED, "peer access is not supported between these two devices"),
    E(CUDA_ERROR_NOT_FOUND, "named symbol not found"),
    E(CUDA_ERROR_NOT_READY, "device not ready"),
    E(CUDA_ERROR_NOT_SUPPORTED, "operation not supported"),
    E(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "operation not permitted when stream is capturing"),
#undef E
};

static CUresult error_lookup(CUresult e, const char **p, int text) {
    NEED_PTR(p);
    for (size_t i = 0; i < sizeof ERRORS / sizeof ERRORS[0]; i++) {
        if (ERRORS[i].code == e) {
            *p = text ? ERRORS[i].text : ERRORS[i].name;
            return CUDA_SUCCESS;
        }
    }
    *p = NULL;
    return CUDA_ERROR_INVALID_VALUE;
}

CUresult cuGetErrorName(CUresult e, const char **p) {
    LOG("cuGetErrorName(%d)", (int)e);
    return error_lookup(e, p, 0);
}

CUresult cuGetErrorString(CUresult e, const char **p) {
    LOG("cuGetErrorString(%d)", (int)e);
    return error_lookup(e, p, 1);
}
