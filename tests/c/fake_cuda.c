/*
 * fake_cuda.c: an emulated CUDA driver (libcuda.so.1) for hetccl's tests on
 * machines without a GPU. Built by tests/support/fake_cuda.rs; a test puts
 * its directory first in LD_LIBRARY_PATH, and hetccl (cudarc, dynamic
 * loading) finds it instead of NVIDIA's driver.
 *
 * The model
 * - Devices: FAKE_CUDA_DEVICES of them (default 1; 0 makes cuInit fail with
 *   CUDA_ERROR_NO_DEVICE), compute capability 9.0, unified addressing, UUID
 *   "hetcclfakegpu" zero-padded with the ordinal in its last byte (distinct
 *   per device, the same in every process). One primary context per
 *   device; the current context is thread-local. Calls that allocate, create
 *   or enqueue need one (else CUDA_ERROR_INVALID_CONTEXT, as in the real
 *   driver); queries, synchronisation and frees do not.
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
 *   function, kernel). Stream handles 0, CU_STREAM_LEGACY and
 *   CU_STREAM_PER_THREAD all name one lazily created process-wide default
 *   stream. Synchronous copies and memsets run on the default stream and
 *   wait for it to drain.
 * - Events: pending from cuEventRecord until the worker reaches the record.
 * - IPC: a handle names the owner's pid and memfd; another process opens
 *   /proc/<pid>/fd/<fd> and maps it (same uid, owner still alive).
 * - Kernels: hetccl's reduction kernels (collectives/src/gpu/kernels/
 *   reduce.cu) are emulated on the host. cuModuleLoadData takes NUL-terminated
 *   PTX text containing ".entry hetccl_reduce_" (anything else:
 *   CUDA_ERROR_INVALID_IMAGE) and keeps a copy; cuModuleGetFunction looks the
 *   name up among its ".entry" names (absent: CUDA_ERROR_NOT_FOUND). A launch
 *   copies exactly the kernel's parameters (each with its size; the scalar s
 *   is sizeof(T) bytes) and queues the kernel, run by the stream's worker as
 *   reduce.cu does it, for i < n:
 *     hetccl_reduce_<dt>_<op>(dst, a, b, n, s)  (5 parameters)
 *       sum/prod/max/min: dst[i] = op(a[i], b[i]);
 *       avg, premulsum:   dst[i] = a[i]*s + b[i];
 *     hetccl_premul_<dt>(dst, a, n, s)           (4): dst[i] = a[i]*s;
 *     hetccl_postdiv_<dt>(dst, n, d), integers   (3): dst[i] /= d.
 *   Integer sums and products wrap; float ops are in the type's precision,
 *   each product rounded before the add (no fused multiply-add, as NVRTC's
 *   --fmad=false); float max/min return the non-NaN operand of a NaN pair;
 *   postdiv divides in 64 bits, signed types truncating toward zero with d
 *   taken as a signed 64-bit value (as reduce.cu's (long long)d).
 *
 * Limits (where a test could be misled)
 * - Only the kernels above, for dt in i8 u8 i32 u32 i64 u64 f32 f64 (62
 *   entry points). Every other entry point in the PTX (the f16, bf16 and fp8
 *   types) makes cuModuleGetFunction return CUDA_ERROR_NOT_SUPPORTED: the
 *   fake cannot run them. The PTX is never compiled: the arithmetic is the
 *   fake's own copy of reduce.cu's, and a change to that file is not seen
 *   here. A postdiv by d == 0 with n > 0 fails the launch with
 *   CUDA_ERROR_INVALID_VALUE (the GPU would store unspecified values).
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
 *   and there is one default stream for all contexts.
 * - Enqueuing any work on a capturing stream fails with
 *   CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED (the real driver would record it
 *   into the graph): hetccl must refuse before enqueuing, and this makes a
 *   mistake visible. Capture modes are not emulated.
 * - cuMemFree/cuMemFreeHost do not synchronise; memory that queued work
 *   still uses stays mapped until that work has run (never a crash).
 * - cuStreamDestroy returns at once; the worker drains the queue, then exits
 *   (as the real driver releases a busy stream's resources later).
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
 * MEMOPS=1 makes cuStreamWaitValue32 return CUDA_ERROR_NOT_SUPPORTED; every
 * blocking wait aborts the process after FAKE_CUDA_TIMEOUT_S (default 120)
 * seconds, so that a bug never hangs CI.
 */
#define _GNU_SOURCE
#include <cuda.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* ---------------------------------------------------------------- basics */

#define MAX_DEV 16
#define CTX_MAGIC 0xC7C7C7C7u
#define STREAM_MAGIC 0x57EA5757u
#define EVENT_MAGIC 0xE7E7E7E7u
#define IPC_MAGIC 0x1FCA4E00u
#define MODULE_MAGIC 0x30D030D0u
#define FUNC_MAGIC 0xF0F0F0F0u

static int g_log;          /* FAKE_CUDA_LOG */
static int g_no_memops;    /* FAKE_CUDA_NO_STREAM_MEMOPS */
static int g_no_peer;      /* FAKE_CUDA_NO_PEER_ACCESS */
static int g_timeout_s = 120;
static int g_inited;       /* cuInit succeeded (atomic access) */
static int g_ndev = 1;

__attribute__((format(printf, 1, 2))) static void say(const char *fmt, ...) {
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    fprintf(stderr, "fake_cuda[%d]: %s\n", (int)getpid(), buf);
}

#define LOG(...) do { if (g_log) say(__VA_ARGS__); } while (0)

#define NEED_INIT()                                                                                \
    do {                                                                                           \
        if (!__atomic_load_n(&g_inited, __ATOMIC_ACQUIRE)) return CUDA_ERROR_NOT_INITIALIZED;      \
    } while (0)

#define NEED_PTR(p) do { if ((p) == NULL) return CUDA_ERROR_INVALID_VALUE; } while (0)

static void die_timeout(const char *what) {
    say("%s still waiting after %d s (FAKE_CUDA_TIMEOUT_S); aborting", what, g_timeout_s);
    abort();
}

/* Condition variables use CLOCK_MONOTONIC so that deadlines are immune to clock changes. */
static void cond_init(pthread_cond_t *cv) {
    pthread_condattr_t a;
    pthread_condattr_init(&a);
    pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
    pthread_cond_init(cv, &a);
    pthread_condattr_destroy(&a);
}

static struct timespec deadline(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    t.tv_sec += g_timeout_s;
    return t;
}

static int past(const struct timespec *dl) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec > dl->tv_sec || (t.tv_sec == dl->tv_sec && t.tv_nsec >= dl->tv_nsec);
}

/* One wait on `cv`; aborts the process once `dl` has passed. */
static void wait_until(pthread_cond_t *cv, pthread_mutex_t *mu, const struct timespec *dl,
                       const char *what) {
    if (pthread_cond_timedwait(cv, mu, dl) == ETIMEDOUT) die_timeout(what);
}

static size_t page_round(size_t n) {
    size_t pg = (size_t)sysconf(_SC_PAGESIZE);
    return (n + pg - 1) / pg * pg;
}

/* ------------------------------------------------------------- contexts */

struct fake_ctx {
    uint32_t magic;
    int device;
};
static struct fake_ctx g_ctx[MAX_DEV];
static __thread struct fake_ctx *t_ctx; /* the calling thread's current context */

#define NEED_CTX() do { if (t_ctx == NULL) return CUDA_ERROR_INVALID_CONTEXT; } while (0)

static pthread_cond_t g_ev_cv; /* broadcast whenever an event record completes */

__attribute__((constructor)) static void fake_cuda_load(void) {
    const char *e = getenv("FAKE_CUDA_LOG");
    g_log = e && *e && strcmp(e, "0") != 0;
    e = getenv("FAKE_CUDA_NO_STREAM_MEMOPS");
    g_no_memops = e && *e && strcmp(e, "0") != 0;
    e = getenv("FAKE_CUDA_NO_PEER_ACCESS");
    g_no_peer = e && *e && strcmp(e, "0") != 0;
    e = getenv("FAKE_CUDA_TIMEOUT_S");
    if (e && atoi(e) > 0) g_timeout_s = atoi(e);
    for (int i = 0; i < MAX_DEV; i++) g_ctx[i] = (struct fake_ctx){CTX_MAGIC, i};
    cond_init(&g_ev_cv);
}

/* ----------------------------------------------------- the memory table */

enum kind { K_DEVICE, K_PINNED, K_IPC };
static const char *const KIND_NAME[] = {"device", "pinned", "ipc"};

struct alloc {
    struct alloc *next;
    uintptr_t dev;   /* the address the user sees (the PROT_NONE view, or the pinned memory) */
    char *shadow;    /* the read-write view (== dev for pinned memory) */
    size_t size;     /* as requested */
    size_t maplen;   /* size rounded up to pages */
    int ordinal;     /* device of the allocating context */
    int kind;        /* enum kind */
    int fd;          /* the memfd (K_DEVICE), else -1 */
    int refs;        /* the table's, plus one per queued operation using it */
    uint64_t id;     /* CU_POINTER_ATTRIBUTE_BUFFER_ID: unique for the process's life */
    struct fake_ctx *ctx;
};
static pthread_mutex_t g_mem = PTHREAD_MUTEX_INITIALIZER;
static struct alloc *g_allocs;

static struct alloc *find_locked(uintptr_t a) {
    for (struct alloc *p = g_allocs; p; p = p->next)
        if (a >= p->dev && a - p->dev < p->size) return p;
    return NULL;
}

static void add_alloc(struct alloc *a) {
    static uint64_t next_id;
    a->refs = 1;
    a->id = __atomic_add_fetch(&next_id, 1, __ATOMIC_RELAXED);
    pthread_mutex_lock(&g_mem);
    a->next = g_allocs;
    g_allocs = a;
    pthread_mutex_unlock(&g_mem);
}

static void unref_alloc(struct alloc *a) {
    if (!a) return;
    pthread_mutex_lock(&g_mem);
    int last = --a->refs == 0;
    pthread_mutex_unlock(&g_mem);
    if (!last) return;
    if (a->kind != K_PINNED) munmap((void *)a->dev, a->maplen);
    munmap(a->shadow, a->maplen);
    if (a->fd >= 0) close(a->fd);
    free(a);
}

/* Removes the allocation starting exactly at `p` and of kind `kind` from the
 * table; its memory goes when the last queued operation using it is done. */
static CUresult remove_alloc(uintptr_t p, int kind) {
    pthread_mutex_lock(&g_mem);
    struct alloc **pp = &g_allocs;
    while (*pp && !((*pp)->dev == p && (*pp)->kind == kind)) pp = &(*pp)->next;
    struct alloc *a = *pp;
    if (a) *pp = a->next;
    pthread_mutex_unlock(&g_mem);
    if (!a) return CUDA_ERROR_INVALID_VALUE;
    unref_alloc(a);
    return CUDA_SUCCESS;
}

/* A copy of the entry holding `p` (the fields only), for the attribute calls. */
static int lookup(uintptr_t p, struct alloc *out) {
    pthread_mutex_lock(&g_mem);
    struct alloc *a = find_locked(p);
    if (a) *out = *a;
    pthread_mutex_unlock(&g_mem);
    return a != NULL;
}

/* Translates [addr, addr+n) for the stream worker: a device range to its
 * shadow, holding a reference in *hold until the operation is done; any
 * other address is used as a host address. A range that runs past the end
 * of its allocation is CUDA_ERROR_INVALID_VALUE. */
static CUresult translate(uintptr_t addr, size_t n, char **out, struct alloc **hold) {
    if (addr == 0) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_mem);
    struct alloc *a = find_locked(addr);
    if (a && n > a->size - (addr - a->dev)) {
        pthread_mutex_unlock(&g_mem);
        return CUDA_ERROR_INVALID_VALUE;
    }
    if (a) a->refs++;
    pthread_mutex_unlock(&g_mem);
    *out = a ? a->shadow + (addr - a->dev) : (char *)addr;
    *hold = a;
    return CUDA_SUCCESS;
}

/* Maps `fd` (of `maplen` bytes) twice into a new entry: PROT_NONE + shadow. */
static struct alloc *map_twice(int fd, size_t maplen) {
    void *dev = mmap(NULL, maplen, PROT_NONE, MAP_SHARED, fd, 0);
    if (dev == MAP_FAILED) return NULL;
    void *sh = mmap(NULL, maplen, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (sh == MAP_FAILED) {
        munmap(dev, maplen);
        return NULL;
    }
    struct alloc *a = calloc(1, sizeof *a);
    if (!a) abort();
    a->dev = (uintptr_t)dev;
    a->shadow = sh;
    a->maplen = maplen;
    a->fd = -1;
    a->ctx = t_ctx;
    a->ordinal = t_ctx ? t_ctx->device : 0;
    return a;
}

/* -------------------------------------------------------- streams, events */

struct fake_event {
    uint32_t magic;
    int refs;           /* the user's, plus one per queued operation naming it */
    uint64_t recorded;  /* records requested (the newest record's number) */
    uint64_t completed; /* the highest record number the workers have reached */
};
static pthread_mutex_t g_ev = PTHREAD_MUTEX_INITIALIZER; /* guards every event */

static void unref_event(struct fake_event *e) {
    if (!e) return;
    pthread_mutex_lock(&g_ev);
    int last = --e->refs == 0;
    pthread_mutex_unlock(&g_ev);
    if (last) {
        e->magic = 0;
        free(e);
    }
}

enum op_kind { OP_COPY, OP_SET, OP_RECORD, OP_WAIT_EVENT, OP_WAIT_VALUE, OP_HOST_FN, OP_KERNEL };

/* The emulated kernels, for these types: hetccl_reduce_<dt>_<op> (op from
 * KO_SUM to KO_PREMULSUM), hetccl_premul_<dt> (KO_PREMUL) and, for the
 * integer types, hetccl_postdiv_<dt> (KO_POSTDIV). */
enum kdt { KD_I8, KD_U8, KD_I32, KD_U32, KD_I64, KD_U64, KD_F32, KD_F64, KD_N };
static const char *const KDT_NAME[KD_N] = {"i8", "u8", "i32", "u32", "i64", "u64", "f32", "f64"};
static const size_t KDT_SIZE[KD_N] = {1, 1, 4, 4, 8, 8, 4, 8};
#define KDT_IS_INT(dt) ((dt) < KD_F32)
enum kop { KO_SUM, KO_PROD, KO_MAX, KO_MIN, KO_AVG, KO_PREMULSUM, KO_PREMUL, KO_POSTDIV, KO_N };
#define KO_N_REDUCE (KO_PREMULSUM + 1) /* the ops of hetccl_reduce_<dt>_<op> */
static const char *const KOP_NAME[KO_N] = {"sum", "prod", "max", "min",
                                           "avg", "premulsum", "premul", "postdiv"};
/* Each kernel's parameter count, as declared in reduce.cu:
 * reduce (T* dst, const T* a, const T* b, u64 n, T s), premul (T* dst,
 * const T* a, u64 n, T s), postdiv (T* dst, u64 n, u64 d). */
static int kop_nparams(int op) { return op == KO_PREMUL ? 4 : op == KO_POSTDIV ? 3 : 5; }

struct op {
    struct op *next;
    int kind;
    char *dst;               /* COPY, SET; WAIT_VALUE: the translated address */
    const char *src;         /* COPY; KERNEL: a (postdiv: dst) */
    const char *src2;        /* KERNEL: b (reduce kernels only) */
    size_t n;                /* COPY, SET; KERNEL: elements */
    int kdt, kop;            /* KERNEL: enum kdt, enum kop */
    unsigned char scalar[8]; /* KERNEL: s (its first sizeof(T) bytes; avg, premulsum, premul) */
    uint64_t divisor;        /* KERNEL: d (postdiv) */
    int byte;                /* SET */
    struct fake_event *ev;   /* RECORD, WAIT_EVENT (a reference) */
    uint64_t seq;            /* RECORD: this record; WAIT_EVENT: the record waited for */
    uint32_t value;          /* WAIT_VALUE */
    unsigned flags;          /* WAIT_VALUE */
    CUhostFn fn;             /* HOST_FN */
    void *user;              /* HOST_FN */
    struct alloc *hold[3];   /* allocations kept mapped until the op is done */
};

static struct op *op_new(int kind) {
    struct op *o = calloc(1, sizeof *o);
    if (!o) abort();
    o->kind = kind;
    return o;
}

static void op_free(struct op *o) {
    unref_alloc(o->hold[0]);
    unref_alloc(o->hold[1]);
    unref_alloc(o->hold[2]);
    unref_event(o->ev);
    free(o);
}

struct fake_stream {
    uint32_t magic;
    struct fake_stream *next; /* in g_streams */
    struct fake_ctx *ctx;     /* NULL for the default stream */
    pthread_mutex_t mu;
    pthread_cond_t cv; /* work queued, an op finished, or stop */
    struct op *head, *tail;
    int busy;      /* the worker is running an op */
    int stop;      /* destroyed: drain, then exit */
    int capturing; /* between cuStreamBeginCapture and cuStreamEndCapture */
};
static pthread_mutex_t g_streams_mu = PTHREAD_MUTEX_INITIALIZER;
static struct fake_stream *g_streams; /* every live stream, for cuCtxSynchronize */
static pthread_mutex_t g_default_mu = PTHREAD_MUTEX_INITIALIZER;
static struct fake_stream *g_default;

static int wait_value_ok(uint32_t cur, uint32_t v, unsigned flags) {
    switch (flags & 3u) {
    case CU_STREAM_WAIT_VALUE_GEQ: return (int32_t)(cur - v) >= 0; /* cyclic, like CUDA */
    case CU_STREAM_WAIT_VALUE_EQ: return cur == v;
    case CU_STREAM_WAIT_VALUE_AND: return (cur & v) != 0;
    default: return ~(cur | v) != 0; /* NOR */
    }
}

/* The kernels' arithmetic, as in collectives/src/gpu/kernels/reduce.cu:
 * integer sum/prod (and the a*s + b of avg/premulsum, a*s of premul) in the
 * unsigned type (wrapping), float ops in the type's precision with every
 * product and sum rounded separately (NVRTC runs with --fmad=false and the
 * kernels use __fmul_rn/__fadd_rn), float max/min returning the non-NaN
 * operand; postdiv divides in 64 bits, signed types as long long (C's
 * truncation toward zero, d converted to long long as reduce.cu does).
 * Elements are loaded and stored with memcpy (any alignment); dst may alias
 * a or b. */
#ifdef __clang__
#pragma STDC FP_CONTRACT OFF /* GCC ignores (and warns about) it; the volatiles suffice */
#endif
#define RED_LOOP(T, EXPR)                                                                          \
    for (size_t i = 0; i < n; i++) {                                                               \
        T x, y, r;                                                                                 \
        memcpy(&x, a + i * sizeof(T), sizeof(T));                                                  \
        memcpy(&y, b + i * sizeof(T), sizeof(T));                                                  \
        r = (EXPR);                                                                                \
        memcpy(d + i * sizeof(T), &r, sizeof(T));                                                  \
    }                                                                                              \
    break;

/* One input: premul (a) and postdiv (a is dst). */
#define MAP_LOOP(T, EXPR)                                                                          \
    for (size_t i = 0; i < n; i++) {                                                               \
        T x, r;                                                                                    \
        memcpy(&x, a + i * sizeof(T), sizeof(T));                                                  \
        r = (EXPR);                                                                                \
        memcpy(d + i * sizeof(T), &r, sizeof(T));                                                  \
    }                                                                                              \
    break;

/* reduce.cu's Tr<T>::div: (T)((W)a / (W)d), W long long or unsigned long
 * long. The one quotient C leaves undefined, LLONG_MIN / -1, wraps to
 * LLONG_MIN (two's complement, as the GPU's division routine gives). */
static int64_t sdiv64(int64_t a, uint64_t d) {
    int64_t sd = (int64_t)d; /* d >= 2^63 is negative, as in the kernel */
    if (sd == -1) return (int64_t)(0 - (uint64_t)a);
    return a / sd;
}
static uint64_t udiv64(uint64_t a, uint64_t d) { return a / d; }

/* a*s + b and a*s in float/double without contraction: the product is
 * stored to a volatile, so it is rounded to the type before the add. */
static float mul_add_f32(float a, float s, float b) {
    volatile float p = a * s;
    return p + b;
}
static double mul_add_f64(double a, double s, double b) {
    volatile double p = a * s;
    return p + b;
}

/* d is never 0 here (cuLaunchKernel refuses a postdiv by 0). */
#define INT_RED(NAME, T, U, W, DIV)                                                                \
    static void red_##NAME(int op, char *d, const char *a, const char *b, size_t n,                \
                           const unsigned char *sc, uint64_t dv) {                                 \
        T s;                                                                                       \
        memcpy(&s, sc, sizeof s);                                                                  \
        switch (op) {                                                                              \
        case KO_SUM: RED_LOOP(T, (T)(U)((U)x + (U)y))                                              \
        case KO_PROD: RED_LOOP(T, (T)(U)((U)x * (U)y))                                             \
        case KO_MAX: RED_LOOP(T, x > y ? x : y)                                                    \
        case KO_MIN: RED_LOOP(T, x < y ? x : y)                                                    \
        case KO_AVG:                                                                               \
        case KO_PREMULSUM: RED_LOOP(T, (T)(U)((U)((U)x * (U)s) + (U)y))                            \
        case KO_PREMUL: MAP_LOOP(T, (T)(U)((U)x * (U)s))                                           \
        default: MAP_LOOP(T, (T)DIV((W)x, dv)) /* KO_POSTDIV */                                    \
        }                                                                                          \
    }

#define FLOAT_RED(NAME, T)                                                                         \
    static void red_##NAME(int op, char *d, const char *a, const char *b, size_t n,                \
                           const unsigned char *sc, uint64_t dv) {                                 \
        T s;                                                                                       \
        memcpy(&s, sc, sizeof s);                                                                  \
        (void)dv;                                                                                  \
        switch (op) {                                                                              \
        case KO_SUM: RED_LOOP(T, x + y)                                                            \
        case KO_PROD: RED_LOOP(T, x * y)                                                           \
        case KO_MAX: RED_LOOP(T, x != x ? y : (y != y ? x : (x > y ? x : y)))                      \
        case KO_MIN: RED_LOOP(T, x != x ? y : (y != y ? x : (x < y ? x : y)))                      \
        case KO_AVG:                                                                               \
        case KO_PREMULSUM: RED_LOOP(T, mul_add_##NAME(x, s, y))                                    \
        default: MAP_LOOP(T, x * s) /* KO_PREMUL (no float postdiv) */                             \
        }                                                                                          \
    }

INT_RED(i8, int8_t, uint8_t, int64_t, sdiv64)
INT_RED(u8, uint8_t, uint8_t, uint64_t, udiv64)
INT_RED(i32, int32_t, uint32_t, int64_t, sdiv64)
INT_RED(u32, uint32_t, uint32_t, uint64_t, udiv64)
INT_RED(i64, int64_t, uint64_t, int64_t, sdiv64)
INT_RED(u64, uint64_t, uint64_t, uint64_t, udiv64)
FLOAT_RED(f32, float)
FLOAT_RED(f64, double)

static void (*const RED[KD_N])(int, char *, const char *, const char *, size_t,
                               const unsigned char *, uint64_t) = {
    red_i8, red_u8, red_i32, red_u32, red_i64, red_u64, red_f32, red_f64};

static void run_op(struct op *o) {
    switch (o->kind) {
    case OP_COPY: memmove(o->dst, o->src, o->n); break;
    case OP_SET: memset(o->dst, o->byte, o->n); break;
    case OP_RECORD:
        pthread_mutex_lock(&g_ev);
        if (o->seq > o->ev->completed) o->ev->completed = o->seq;
        pthread_cond_broadcast(&g_ev_cv);
        pthread_mutex_unlock(&g_ev);
        break;
    case OP_WAIT_EVENT: {
        struct timespec dl = deadline();
        pthread_mutex_lock(&g_ev);
        while (o->ev->completed < o->seq) wait_until(&g_ev_cv, &g_ev, &dl, "cuStreamWaitEvent");
        pthread_mutex_unlock(&g_ev);
        break;
    }
    case OP_WAIT_VALUE: {
        struct timespec dl = deadline();
        const struct timespec nap = {0, 20000}; /* 20 us */
        while (!wait_value_ok(__atomic_load_n((uint32_t *)o->dst, __ATOMIC_ACQUIRE), o->value,
                              o->flags)) {
            if (past(&dl)) die_timeout("cuStreamWaitValue32");
            nanosleep(&nap, NULL);
        }
        break;
    }
    case OP_HOST_FN: o->fn(o->user); break;
    case OP_KERNEL:
        if (o->n) RED[o->kdt](o->kop, o->dst, o->src, o->src2, o->n, o->scalar, o->divisor);
        break;
    }
}

static void *worker(void *arg) {
    struct fake_stream *s = arg;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        while (!s->head && !s->stop) pthread_cond_wait(&s->cv, &s->mu); /* idle: no timeout */
        struct op *o = s->head;
        if (!o) break; /* destroyed and drained */
        s->head = o->next;
        if (!s->head) s->tail = NULL;
        s->busy = 1;
        pthread_mutex_unlock(&s->mu);
        run_op(o);
        op_free(o);
        pthread_mutex_lock(&s->mu);
        s->busy = 0;
        pthread_cond_broadcast(&s->cv);
    }
    pthread_mutex_unlock(&s->mu);
    /* cuCtxSynchronize holds g_streams_mu while it drains streams; this one
     * is drained, so it only has to wait for that to finish. */
    pthread_mutex_lock(&g_streams_mu);
    struct fake_stream **pp = &g_streams;
    while (*pp != s) pp = &(*pp)->next;
    *pp = s->next;
    pthread_mutex_unlock(&g_streams_mu);
    s->magic = 0;
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    free(s);
    return NULL;
}

static struct fake_stream *stream_new(struct fake_ctx *ctx) {
    struct fake_stream *s = calloc(1, sizeof *s);
    if (!s) abort();
    s->magic = STREAM_MAGIC;
    s->ctx = ctx;
    pthread_mutex_init(&s->mu, NULL);
    cond_init(&s->cv);
    pthread_mutex_lock(&g_streams_mu);
    s->next = g_streams;
    g_streams = s;
    pthread_mutex_unlock(&g_streams_mu);
    pthread_attr_t at;
    pthread_attr_init(&at);
    pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
    pthread_t th;
    if (pthread_create(&th, &at, worker, s) != 0) {
        say("cannot start a stream worker thread");
        abort();
    }
    pthread_attr_destroy(&at);
    pthread_setname_np(th, "fake-cuda-strm");
    return s;
}

static int is_default(CUstream h) {
    return h == NULL || h == CU_STREAM_LEGACY || h == CU_STREAM_PER_THREAD;
}

static CUresult get_stream(CUstream h, struct fake_stream **out) {
    if (is_default(h)) {
        pthread_mutex_lock(&g_default_mu);
        if (!g_default) g_default = stream_new(NULL);
        *out = g_default;
        pthread_mutex_unlock(&g_default_mu);
        return CUDA_SUCCESS;
    }
    struct fake_stream *s = (struct fake_stream *)h;
    if (s->magic != STREAM_MAGIC) return CUDA_ERROR_INVALID_HANDLE;
    *out = s;
    return CUDA_SUCCESS;
}

/* Appends `o` to stream `h` (ownership passes; freed on failure). An event
 * in o->ev is the caller's: the op takes its own reference only once queued. */
static CUresult submit(CUstream h, struct op *o) {
    struct fake_event *ev = o->ev;
    o->ev = NULL;
    struct fake_stream *s;
    CUresult rc = get_stream(h, &s);
    if (rc != CUDA_SUCCESS) {
        op_free(o);
        return rc;
    }
    pthread_mutex_lock(&s->mu);
    if (__atomic_load_n(&s->capturing, __ATOMIC_ACQUIRE)) {
        pthread_mutex_unlock(&s->mu);
        op_free(o);
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    }
    if (ev) { /* number the record, or fix the record waited for */
        pthread_mutex_lock(&g_ev);
        o->seq = o->kind == OP_RECORD ? ++ev->recorded : ev->recorded;
        ev->refs++;
        o->ev = ev;
        pthread_mutex_unlock(&g_ev);
    }
    o->next = NULL;
    if (s->tail) s->tail->next = o;
    else s->head = o;
    s->tail = o;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return CUDA_SUCCESS;
}

static void drain(struct fake_stream *s, const char *what) {
    struct timespec dl = deadline();
    pthread_mutex_lock(&s->mu);
    while (s->head || s->busy) wait_until(&s->cv, &s->mu, &dl, what);
    pthread_mutex_unlock(&s->mu);
}

/* ---------------------------------------------------------------- copies */

static CUresult copy_async(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream h) {
    NEED_INIT();
    NEED_CTX();
    if (n == 0) return CUDA_SUCCESS;
    struct op *o = op_new(OP_COPY);
    o->n = n;
    CUresult rc = translate(dst, n, &o->dst, &o->hold[0]);
    if (rc == CUDA_SUCCESS) rc = translate(src, n, (char **)&o->src, &o->hold[1]);
    if (rc != CUDA_SUCCESS) {
        op_free(o);
        return rc;
    }
    return submit(h, o);
}

static CUresult memset_async(CUdeviceptr dst, unsigned char c, size_t n, CUstream h) {
    NEED_INIT();
    NEED_CTX();
    if (n == 0) return CUDA_SUCCESS;
    struct op *o = op_new(OP_SET);
    o->n = n;
    o->byte = c;
    CUresult rc = translate(dst, n, &o->dst, &o->hold[0]);
    if (rc != CUDA_SUCCESS) {
        op_free(o);
        return rc;
    }
    return submit(h, o);
}

/* The synchronous calls: enqueue on the default stream, wait for it. */
static CUresult finish_sync(CUresult rc, const char *what) {
    if (rc != CUDA_SUCCESS) return rc;
    struct fake_stream *s;
    get_stream(NULL, &s);
    drain(s, what);
    return CUDA_SUCCESS;
}

#define U(p) ((CUdeviceptr)(uintptr_t)(p))

CUresult cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream h) {
    LOG("cuMemcpyAsync(dst=%#llx, src=%#llx, n=%zu, stream=%p)", dst, src, n, (void *)h);
    return copy_async(dst, src, n, h);
}
CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t n, CUstream h) {
    LOG("cuMemcpyHtoDAsync_v2(dst=%#llx, src=%p, n=%zu, stream=%p)", dst, src, n, (void *)h);
    return copy_async(dst, U(src), n, h);
}
CUresult cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t n, CUstream h) {
    LOG("cuMemcpyDtoHAsync_v2(dst=%p, src=%#llx, n=%zu, stream=%p)", dst, src, n, (void *)h);
    return copy_async(U(dst), src, n, h);
}
CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream h) {
    LOG("cuMemcpyDtoDAsync_v2(dst=%#llx, src=%#llx, n=%zu, stream=%p)", dst, src, n, (void *)h);
    return copy_async(dst, src, n, h);
}
CUresult cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t n) {
    LOG("cuMemcpy(dst=%#llx, src=%#llx, n=%zu)", dst, src, n);
    return finish_sync(copy_async(dst, src, n, NULL), "cuMemcpy");
}
CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t n) {
    LOG("cuMemcpyHtoD_v2(dst=%#llx, src=%p, n=%zu)", dst, src, n);
    return finish_sync(copy_async(dst, U(src), n, NULL), "cuMemcpyHtoD");
}
CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n) {
    LOG("cuMemcpyDtoH_v2(dst=%p, src=%#llx, n=%zu)", dst, src, n);
    return finish_sync(copy_async(U(dst), src, n, NULL), "cuMemcpyDtoH");
}
CUresult cuMemcpyDtoD_v2(CUdeviceptr dst, CUdeviceptr src, size_t n) {
    LOG("cuMemcpyDtoD_v2(dst=%#llx, src=%#llx, n=%zu)", dst, src, n);
    return finish_sync(copy_async(dst, src, n, NULL), "cuMemcpyDtoD");
}
CUresult cuMemsetD8_v2(CUdeviceptr dst, unsigned char c, size_t n) {
    LOG("cuMemsetD8_v2(dst=%#llx, c=%u, n=%zu)", dst, c, n);
    return finish_sync(memset_async(dst, c, n, NULL), "cuMemsetD8");
}
CUresult cuMemsetD8Async(CUdeviceptr dst, unsigned char c, size_t n, CUstream h) {
    LOG("cuMemsetD8Async(dst=%#llx, c=%u, n=%zu, stream=%p)", dst, c, n, (void *)h);
    return memset_async(dst, c, n, h);
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
    LOG("cuDriverGetVersion");
    NEED_PTR(v);
    *v = CUDA_VERSION;
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

CUresult cuDeviceGetAttribute(int *pi, CUdevice_attribute attr, CUdevice dev) {
    LOG("cuDeviceGetAttribute(attr=%d, dev=%d)", (int)attr, dev);
    NEED_INIT();
    NEED_PTR(pi);
    NEED_DEV(dev);
    switch (attr) {
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: *pi = 9; break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: *pi = 0; break;
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

CUresult cuCtxSynchronize(void) {
    LOG("cuCtxSynchronize");
    NEED_INIT();
    NEED_CTX();
    pthread_mutex_lock(&g_streams_mu);
    for (struct fake_stream *s = g_streams; s; s = s->next)
        if (s->ctx == t_ctx || s->ctx == NULL) drain(s, "cuCtxSynchronize");
    pthread_mutex_unlock(&g_streams_mu);
    return CUDA_SUCCESS;
}

/* --------------------------------------------------------------- memory */

CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t size) {
    NEED_INIT();
    NEED_PTR(dptr);
    NEED_CTX();
    if (size == 0) return CUDA_ERROR_INVALID_VALUE;
    size_t maplen = page_round(size);
    /* Each allocation's memfd is named with a serial number that its IPC
     * handles carry, so a handle is unique to its allocation (as the real
     * driver's are) even when a later allocation reuses the fd number. */
    static uint64_t serial;
    char name[64];
    snprintf(name, sizeof name, "fake_cuda_dev-%llu",
             (unsigned long long)__atomic_add_fetch(&serial, 1, __ATOMIC_RELAXED));
    int fd = memfd_create(name, MFD_CLOEXEC);
    if (fd < 0 || ftruncate(fd, (off_t)maplen) != 0) {
        if (fd >= 0) close(fd);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    struct alloc *a = map_twice(fd, maplen);
    if (!a) {
        close(fd);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    a->size = size;
    a->kind = K_DEVICE;
    a->fd = fd;
    add_alloc(a);
    *dptr = a->dev;
    LOG("cuMemAlloc_v2(%zu) -> %#llx (fd %d)", size, *dptr, fd);
    return CUDA_SUCCESS;
}

CUresult cuMemFree_v2(CUdeviceptr p) {
    LOG("cuMemFree_v2(%#llx)", p);
    NEED_INIT();
    return remove_alloc(p, K_DEVICE);
}

CUresult cuMemHostAlloc(void **pp, size_t size, unsigned int flags) {
    NEED_INIT();
    NEED_PTR(pp);
    NEED_CTX();
    if (size == 0) return CUDA_ERROR_INVALID_VALUE;
    size_t maplen = page_round(size);
    void *m = mmap(NULL, maplen, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
    struct alloc *a = calloc(1, sizeof *a);
    if (!a) abort();
    *a = (struct alloc){.dev = (uintptr_t)m, .shadow = m, .size = size, .maplen = maplen,
                        .ordinal = t_ctx->device, .kind = K_PINNED, .fd = -1, .ctx = t_ctx};
    add_alloc(a);
    *pp = m;
    LOG("cuMemHostAlloc(%zu, flags=%#x) -> %p", size, flags, m);
    return CUDA_SUCCESS;
}

CUresult cuMemFreeHost(void *p) {
    LOG("cuMemFreeHost(%p)", p);
    NEED_INIT();
    return remove_alloc((uintptr_t)p, K_PINNED);
}

CUresult cuMemHostGetDevicePointer_v2(CUdeviceptr *pdptr, void *p, unsigned int flags) {
    LOG("cuMemHostGetDevicePointer_v2(%p)", p);
    NEED_INIT();
    NEED_PTR(pdptr);
    struct alloc a;
    if (flags != 0 || !lookup((uintptr_t)p, &a) || a.kind != K_PINNED)
        return CUDA_ERROR_INVALID_VALUE;
    *pdptr = U(p); /* unified addressing: the same address */
    return CUDA_SUCCESS;
}

/* Writes one attribute of `p` (in allocation `a`, or NULL: unknown). */
static void put_attr(CUpointer_attribute at, void *data, const struct alloc *a, CUdeviceptr p) {
    switch (at) {
    case CU_POINTER_ATTRIBUTE_CONTEXT: *(CUcontext *)data = a ? (CUcontext)a->ctx : NULL; break;
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
        *(unsigned *)data = !a ? 0u
                            : a->kind == K_PINNED ? (unsigned)CU_MEMORYTYPE_HOST
                                                  : (unsigned)CU_MEMORYTYPE_DEVICE;
        break;
    case CU_POINTER_ATTRIBUTE_DEVICE_POINTER: *(CUdeviceptr *)data = a ? p : 0; break;
    case CU_POINTER_ATTRIBUTE_HOST_POINTER:
        *(void **)data = a && a->kind == K_PINNED ? (void *)(uintptr_t)p : NULL;
        break;
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL: *(int *)data = a ? a->ordinal : 0; break;
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR: *(CUdeviceptr *)data = a ? a->dev : 0; break;
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE: *(size_t *)data = a ? a->size : 0; break;
    case CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR: *(void **)data = a ? (void *)a->dev : NULL; break;
    case CU_POINTER_ATTRIBUTE_MAPPING_SIZE: *(size_t *)data = a ? a->maplen : 0; break;
    case CU_POINTER_ATTRIBUTE_MAPPED: *(int *)data = a != NULL; break;
    case CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE:
        *(int *)data = a && a->kind == K_DEVICE;
        break;
    case CU_POINTER_ATTRIBUTE_P2P_TOKENS:
        memset(data, 0, sizeof(CUDA_POINTER_ATTRIBUTE_P2P_TOKENS));
        break;
    case CU_POINTER_ATTRIBUTE_BUFFER_ID: *(uint64_t *)data = a ? a->id : 0; break;
    case CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES:
    case CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE:
    case CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID: *(uint64_t *)data = 0; break; /* 8-byte ones */
    default: *(unsigned *)data = 0; break; /* IS_MANAGED (never) and the other 4-byte ones */
    }
}

CUresult cuPointerGetAttribute(void *data, CUpointer_attribute at, CUdeviceptr p) {
    LOG("cuPointerGetAttribute(attr=%d, ptr=%#llx)", (int)at, p);
    NEED_INIT();
    NEED_PTR(data);
    struct alloc a;
    if (!lookup(p, &a)) return CUDA_ERROR_INVALID_VALUE;
    put_attr(at, data, &a, p);
    return CUDA_SUCCESS;
}

CUresult cuPointerGetAttributes(unsigned int num, CUpointer_attribute *ats, void **data,
                                CUdeviceptr p) {
    NEED_INIT();
    if (num == 0 || !ats || !data) return CUDA_ERROR_INVALID_VALUE;
    for (unsigned i = 0; i < num; i++) NEED_PTR(data[i]);
    struct alloc a;
    int known = lookup(p, &a);
    LOG("cuPointerGetAttributes(n=%u, ptr=%#llx) -> %s", num, p,
        known ? KIND_NAME[a.kind] : "unknown");
    /* Like the real driver: an unknown pointer is no error, its values are zero. */
    for (unsigned i = 0; i < num; i++) put_attr(ats[i], data[i], known ? &a : NULL, p);
    return CUDA_SUCCESS;
}

/* -------------------------------------------------------------- streams */

CUresult cuStreamCreate(CUstream *ph, unsigned int flags) {
    NEED_INIT();
    NEED_PTR(ph);
    NEED_CTX();
    *ph = (CUstream)stream_new(t_ctx); /* flags (NON_BLOCKING) change nothing here */
    LOG("cuStreamCreate(flags=%#x) -> %p", flags, (void *)*ph);
    return CUDA_SUCCESS;
}

CUresult cuStreamDestroy_v2(CUstream h) {
    LOG("cuStreamDestroy_v2(%p)", (void *)h);
    NEED_INIT();
    struct fake_stream *s;
    if (is_default(h) || get_stream(h, &s) != CUDA_SUCCESS) return CUDA_ERROR_INVALID_HANDLE;
    pthread_mutex_lock(&s->mu);
    s->stop = 1; /* the worker drains the queue, then frees the stream */
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return CUDA_SUCCESS;
}

CUresult cuStreamSynchronize(CUstream h) {
    LOG("cuStreamSynchronize(%p)", (void *)h);
    NEED_INIT();
    struct fake_stream *s;
    CUresult rc = get_stream(h, &s);
    if (rc != CUDA_SUCCESS) return rc;
    if (__atomic_load_n(&s->capturing, __ATOMIC_ACQUIRE))
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    drain(s, "cuStreamSynchronize");
    return CUDA_SUCCESS;
}

CUresult cuStreamQuery(CUstream h) {
    NEED_INIT();
    struct fake_stream *s;
    CUresult rc = get_stream(h, &s);
    if (rc != CUDA_SUCCESS) return rc;
    pthread_mutex_lock(&s->mu);
    rc = __atomic_load_n(&s->capturing, __ATOMIC_ACQUIRE) ? CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED
         : s->head || s->busy ? CUDA_ERROR_NOT_READY
                              : CUDA_SUCCESS;
    pthread_mutex_unlock(&s->mu);
    LOG("cuStreamQuery(%p) -> %d", (void *)h, (int)rc);
    return rc;
}

CUresult cuStreamWaitEvent(CUstream h, CUevent ev, unsigned int flags) {
    LOG("cuStreamWaitEvent(stream=%p, event=%p, flags=%#x)", (void *)h, (void *)ev, flags);
    NEED_INIT();
    if (!ev) return CUDA_ERROR_INVALID_HANDLE;
    NEED_CTX();
    struct op *o = op_new(OP_WAIT_EVENT);
    o->ev = (struct fake_event *)ev; /* submit takes a reference */
    return submit(h, o);
}

CUresult cuStreamWaitValue32_v2(CUstream h, CUdeviceptr addr, cuuint32_t value,
                                unsigned int flags) {
    LOG("cuStreamWaitValue32_v2(stream=%p, addr=%#llx, value=%u, flags=%#x)", (void *)h, addr,
        value, flags);
    NEED_INIT();
    if (g_no_memops) return CUDA_ERROR_NOT_SUPPORTED;
    NEED_CTX();
    if ((flags & ~(unsigned)CU_STREAM_WAIT_VALUE_FLUSH) > 3u || addr % 4 != 0)
        return CUDA_ERROR_INVALID_VALUE;
    struct op *o = op_new(OP_WAIT_VALUE);
    o->value = value;
    o->flags = flags;
    CUresult rc = translate(addr, 4, &o->dst, &o->hold[0]);
    if (rc != CUDA_SUCCESS) {
        op_free(o);
        return rc;
    }
    return submit(h, o);
}

CUresult cuLaunchHostFunc(CUstream h, CUhostFn fn, void *user) {
    LOG("cuLaunchHostFunc(stream=%p, fn=%p, user=%p)", (void *)h, (void *)(uintptr_t)fn, user);
    NEED_INIT();
    if (!fn) return CUDA_ERROR_INVALID_VALUE;
    NEED_CTX();
    struct op *o = op_new(OP_HOST_FN);
    o->fn = fn;
    o->user = user;
    return submit(h, o);
}

/* ---------------------------------------------------------- graph capture */

static char g_graph; /* the one dummy graph */

CUresult cuStreamIsCapturing(CUstream h, CUstreamCaptureStatus *st) {
    NEED_INIT();
    NEED_PTR(st);
    struct fake_stream *s;
    int cap = !is_default(h) && get_stream(h, &s) == CUDA_SUCCESS &&
              __atomic_load_n(&s->capturing, __ATOMIC_ACQUIRE);
    *st = cap ? CU_STREAM_CAPTURE_STATUS_ACTIVE : CU_STREAM_CAPTURE_STATUS_NONE;
    LOG("cuStreamIsCapturing(%p) -> %d", (void *)h, cap);
    return CUDA_SUCCESS;
}

CUresult cuStreamBeginCapture_v2(CUstream h, CUstreamCaptureMode mode) {
    LOG("cuStreamBeginCapture_v2(%p, mode=%d)", (void *)h, (int)mode);
    NEED_INIT();
    struct fake_stream *s;
    if (is_default(h)) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    if (get_stream(h, &s) != CUDA_SUCCESS) return CUDA_ERROR_INVALID_HANDLE;
    if (__atomic_exchange_n(&s->capturing, 1, __ATOMIC_ACQ_REL)) return CUDA_ERROR_ILLEGAL_STATE;
    return CUDA_SUCCESS;
}

CUresult cuStreamEndCapture(CUstream h, CUgraph *graph) {
    LOG("cuStreamEndCapture(%p)", (void *)h);
    NEED_INIT();
    NEED_PTR(graph);
    struct fake_stream *s;
    if (is_default(h) || get_stream(h, &s) != CUDA_SUCCESS) return CUDA_ERROR_ILLEGAL_STATE;
    if (!__atomic_exchange_n(&s->capturing, 0, __ATOMIC_ACQ_REL)) return CUDA_ERROR_ILLEGAL_STATE;
    *graph = (CUgraph)&g_graph;
    return CUDA_SUCCESS;
}

CUresult cuGraphDestroy(CUgraph g) {
    LOG("cuGraphDestroy(%p)", (void *)g);
    NEED_INIT();
    return g == (CUgraph)&g_graph ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

/* --------------------------------------------------------------- events */

CUresult cuEventCreate(CUevent *ph, unsigned int flags) {
    NEED_INIT();
    NEED_PTR(ph);
    NEED_CTX();
    struct fake_event *e = calloc(1, sizeof *e);
    if (!e) abort();
    e->magic = EVENT_MAGIC;
    e->refs = 1;
    *ph = (CUevent)e;
    LOG("cuEventCreate(flags=%#x) -> %p", flags, (void *)e);
    return CUDA_SUCCESS;
}

CUresult cuEventRecord(CUevent ev, CUstream h) {
    LOG("cuEventRecord(event=%p, stream=%p)", (void *)ev, (void *)h);
    NEED_INIT();
    if (!ev || ((struct fake_event *)ev)->magic != EVENT_MAGIC) return CUDA_ERROR_INVALID_HANDLE;
    NEED_CTX();
    struct op *o = op_new(OP_RECORD);
    o->ev = (struct fake_event *)ev; /* submit takes a reference */
    return submit(h, o);
}

CUresult cuEventQuery(CUevent ev) {
    NEED_INIT();
    if (!ev) return CUDA_ERROR_INVALID_HANDLE;
    struct fake_event *e = (struct fake_event *)ev;
    pthread_mutex_lock(&g_ev);
    CUresult rc = e->completed < e->recorded ? CUDA_ERROR_NOT_READY : CUDA_SUCCESS;
    pthread_mutex_unlock(&g_ev);
    LOG("cuEventQuery(%p) -> %d", (void *)ev, (int)rc);
    return rc;
}

CUresult cuEventSynchronize(CUevent ev) {
    LOG("cuEventSynchronize(%p)", (void *)ev);
    NEED_INIT();
    if (!ev) return CUDA_ERROR_INVALID_HANDLE;
    struct fake_event *e = (struct fake_event *)ev;
    struct timespec dl = deadline();
    pthread_mutex_lock(&g_ev);
    uint64_t want = e->recorded;
    while (e->completed < want) wait_until(&g_ev_cv, &g_ev, &dl, "cuEventSynchronize");
    pthread_mutex_unlock(&g_ev);
    return CUDA_SUCCESS;
}

CUresult cuEventDestroy_v2(CUevent ev) {
    LOG("cuEventDestroy_v2(%p)", (void *)ev);
    NEED_INIT();
    if (!ev) return CUDA_ERROR_INVALID_HANDLE;
    unref_event((struct fake_event *)ev); /* freed once no queued op names it */
    return CUDA_SUCCESS;
}

/* -------------------------------------------------------------- kernels */

/* A module: a copy of the PTX text (names are looked up in it) and the
 * functions handed out, freed by cuModuleUnload. A function records which
 * emulated kernel it is. */
struct fake_func {
    uint32_t magic;
    struct fake_func *next; /* in its module */
    int kdt, kop;
};
struct fake_module {
    uint32_t magic;
    char *ptx;
    struct fake_func *funcs;
};
static pthread_mutex_t g_mod = PTHREAD_MUTEX_INITIALIZER; /* guards every module's funcs */

#define PTX_MARK ".entry hetccl_reduce_"

CUresult cuModuleLoadData(CUmodule *module, const void *image) {
    NEED_INIT();
    NEED_PTR(module);
    NEED_PTR(image);
    NEED_CTX();
    /* Only PTX text of hetccl's reduction kernels (a cubin is ELF: no match). */
    if (!strstr((const char *)image, PTX_MARK)) {
        LOG("cuModuleLoadData(%p) -> not PTX of hetccl's kernels", image);
        return CUDA_ERROR_INVALID_IMAGE;
    }
    struct fake_module *m = calloc(1, sizeof *m);
    if (!m) abort();
    m->ptx = strdup((const char *)image);
    if (!m->ptx) abort();
    m->magic = MODULE_MAGIC;
    *module = (CUmodule)m;
    LOG("cuModuleLoadData(%p, %zu bytes of PTX) -> %p", image, strlen(m->ptx), (void *)m);
    return CUDA_SUCCESS;
}

CUresult cuModuleUnload(CUmodule hmod) {
    LOG("cuModuleUnload(%p)", (void *)hmod);
    NEED_INIT();
    struct fake_module *m = (struct fake_module *)hmod;
    if (!m || m->magic != MODULE_MAGIC) return CUDA_ERROR_INVALID_HANDLE;
    /* Launches already queued copied what they need; the handles die now. */
    pthread_mutex_lock(&g_mod);
    m->magic = 0;
    struct fake_func *f = m->funcs;
    m->funcs = NULL;
    pthread_mutex_unlock(&g_mod);
    while (f) {
        struct fake_func *next = f->next;
        f->magic = 0;
        free(f);
        f = next;
    }
    free(m->ptx);
    free(m);
    return CUDA_SUCCESS;
}

/* Whether `ptx` declares an entry point named exactly `name`. */
static int ptx_has_entry(const char *ptx, const char *name) {
    size_t len = strlen(name);
    for (const char *p = ptx; (p = strstr(p, ".entry")) != NULL; p += 6) {
        const char *q = p + 6;
        if (*q != ' ' && *q != '\t') continue;
        while (*q == ' ' || *q == '\t') q++;
        if (strncmp(q, name, len) != 0) continue;
        char c = q[len]; /* the name must end here */
        if (!(c == '_' || c == '$' || (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') ||
              (c >= 'A' && c <= 'Z')))
            return 1;
    }
    return 0;
}

/* The emulated kernel `name` names: 1 with *dt and *op set, else 0 (f16,
 * bf16 and fp8 types, and anything not an entry point of reduce.cu). */
static int parse_kernel(const char *name, int *dt, int *op) {
    static const char *const prefix[] = {"hetccl_reduce_", "hetccl_premul_", "hetccl_postdiv_"};
    for (int k = 0; k < 3; k++) {
        size_t pl = strlen(prefix[k]);
        if (strncmp(name, prefix[k], pl) != 0) continue;
        const char *r = name + pl;
        for (int d = 0; d < KD_N; d++) {
            size_t l = strlen(KDT_NAME[d]);
            if (strncmp(r, KDT_NAME[d], l) != 0) continue;
            if (k == 1 && r[l] == '\0') { /* hetccl_premul_<dt> */
                *dt = d;
                *op = KO_PREMUL;
                return 1;
            }
            if (k == 2 && r[l] == '\0' && KDT_IS_INT(d)) { /* hetccl_postdiv_<int dt> */
                *dt = d;
                *op = KO_POSTDIV;
                return 1;
            }
            if (k != 0 || r[l] != '_') continue;
            for (int o = 0; o < KO_N_REDUCE; o++) {
                if (strcmp(r + l + 1, KOP_NAME[o]) == 0) {
                    *dt = d;
                    *op = o;
                    return 1;
                }
            }
        }
    }
    return 0;
}

/* The entry point's name of an emulated kernel, for the log. */
static void kernel_name(char *buf, size_t len, int dt, int op) {
    if (op == KO_PREMUL || op == KO_POSTDIV)
        snprintf(buf, len, "hetccl_%s_%s", KOP_NAME[op], KDT_NAME[dt]);
    else
        snprintf(buf, len, "hetccl_reduce_%s_%s", KDT_NAME[dt], KOP_NAME[op]);
}

CUresult cuModuleGetFunction(CUfunction *f, CUmodule hmod, const char *name) {
    LOG("cuModuleGetFunction(%p, %s)", (void *)hmod, name ? name : "(null)");
    NEED_INIT();
    NEED_PTR(f);
    NEED_PTR(name);
    struct fake_module *m = (struct fake_module *)hmod;
    if (!m || m->magic != MODULE_MAGIC) return CUDA_ERROR_INVALID_HANDLE;
    if (!ptx_has_entry(m->ptx, name)) return CUDA_ERROR_NOT_FOUND;
    int dt, op;
    if (!parse_kernel(name, &dt, &op)) {
        LOG("cuModuleGetFunction: the fake cannot run %s", name);
        return CUDA_ERROR_NOT_SUPPORTED;
    }
    pthread_mutex_lock(&g_mod);
    struct fake_func *fn = m->funcs;
    while (fn && !(fn->kdt == dt && fn->kop == op)) fn = fn->next;
    if (!fn) { /* the same handle for the same name, as in the real driver */
        fn = calloc(1, sizeof *fn);
        if (!fn) abort();
        *fn = (struct fake_func){FUNC_MAGIC, m->funcs, dt, op};
        m->funcs = fn;
    }
    pthread_mutex_unlock(&g_mod);
    *f = (CUfunction)fn;
    return CUDA_SUCCESS;
}

CUresult cuLaunchKernel(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,
                        unsigned int bx, unsigned int by, unsigned int bz, unsigned int shmem,
                        CUstream h, void **params, void **extra) {
    NEED_INIT();
    struct fake_func *fn = (struct fake_func *)f;
    if (!fn || fn->magic != FUNC_MAGIC) {
        LOG("cuLaunchKernel(%p): not a function", (void *)f);
        return CUDA_ERROR_INVALID_HANDLE;
    }
    char name[48];
    kernel_name(name, sizeof name, fn->kdt, fn->kop);
    LOG("cuLaunchKernel(%s, grid %ux%ux%u, block %ux%ux%u, shmem %u, stream %p)", name, gx, gy,
        gz, bx, by, bz, shmem, (void *)h);
    NEED_CTX();
    if (extra) return CUDA_ERROR_NOT_SUPPORTED; /* CU_LAUNCH_PARAM_* buffers: not emulated */
    if (!params || !gx || !gy || !gz || !bx || !by || !bz || (uint64_t)bx * by * bz > 1024)
        return CUDA_ERROR_INVALID_VALUE;
    /* Exactly the kernel's parameters, each read with its size, as the real
     * driver does (it knows them from the image): pointers and u64 8 bytes,
     * the scalar s sizeof(T). */
    const int np = kop_nparams(fn->kop);
    for (int i = 0; i < np; i++) NEED_PTR(params[i]);
    const size_t ts = KDT_SIZE[fn->kdt];
    uint64_t dst, pa = 0, pb = 0, n;
    struct op *o = op_new(OP_KERNEL);
    memcpy(&dst, params[0], 8);
    switch (fn->kop) {
    case KO_POSTDIV: /* (T* dst, u64 n, u64 d) */
        memcpy(&n, params[1], 8);
        memcpy(&o->divisor, params[2], 8);
        break;
    case KO_PREMUL: /* (T* dst, const T* a, u64 n, T s) */
        memcpy(&pa, params[1], 8);
        memcpy(&n, params[2], 8);
        memcpy(o->scalar, params[3], ts);
        break;
    default: /* (T* dst, const T* a, const T* b, u64 n, T s) */
        memcpy(&pa, params[1], 8);
        memcpy(&pb, params[2], 8);
        memcpy(&n, params[3], 8);
        memcpy(o->scalar, params[4], ts);
        break;
    }
    o->kdt = fn->kdt;
    o->kop = fn->kop;
    o->n = (size_t)n;
    CUresult rc = CUDA_SUCCESS;
    if (n > SIZE_MAX / ts) rc = CUDA_ERROR_INVALID_VALUE;
    /* Division by zero: the GPU gives an unspecified value; refused here. */
    if (fn->kop == KO_POSTDIV && n && o->divisor == 0) {
        LOG("cuLaunchKernel(%s): division by zero refused", name);
        rc = CUDA_ERROR_INVALID_VALUE;
    }
    size_t bytes = (size_t)n * ts;
    if (rc == CUDA_SUCCESS && n) { /* with n == 0 the kernel touches no memory */
        rc = translate(dst, bytes, &o->dst, &o->hold[0]);
        if (rc == CUDA_SUCCESS && fn->kop == KO_POSTDIV) o->src = o->dst; /* in place */
        if (rc == CUDA_SUCCESS && fn->kop != KO_POSTDIV)
            rc = translate(pa, bytes, (char **)&o->src, &o->hold[1]);
        if (rc == CUDA_SUCCESS && fn->kop < KO_N_REDUCE)
            rc = translate(pb, bytes, (char **)&o->src2, &o->hold[2]);
    }
    if (rc != CUDA_SUCCESS) {
        op_free(o);
        return rc;
    }
    return submit(h, o);
}

/* ------------------------------------------------------ address ranges */

CUresult cuMemGetAddressRange_v2(CUdeviceptr *pbase, size_t *psize, CUdeviceptr p) {
    NEED_INIT();
    struct alloc a;
    if (!lookup(p, &a)) {
        LOG("cuMemGetAddressRange_v2(%#llx) -> not found", p);
        return CUDA_ERROR_NOT_FOUND;
    }
    LOG("cuMemGetAddressRange_v2(%#llx) -> %s %#llx + %zu", p, KIND_NAME[a.kind],
        (unsigned long long)a.dev, a.size);
    if (pbase) *pbase = a.dev;
    if (psize) *psize = a.size;
    return CUDA_SUCCESS;
}

/* ------------------------------------------------------------------ IPC */

struct ipc_handle { /* the first bytes of a CUipcMemHandle */
    uint32_t magic;
    int32_t pid;    /* the exporting process */
    int32_t fd;     /* its memfd */
    int32_t ordinal; /* the allocation's device */
    uint64_t size;   /* the allocation's size */
    uint64_t offset; /* of the exported pointer within it (informational) */
    char name[32];   /* the memfd's name, with the allocation's serial */
};

/* The memfd name behind `fd` of process `pid` ("" when unknown). */
static void fd_name(int pid, int fd, char *out, size_t n) {
    char path[64], link[128];
    snprintf(path, sizeof path, "/proc/%d/fd/%d", pid, fd);
    ssize_t k = readlink(path, link, sizeof link - 1);
    out[0] = 0;
    if (k <= 0) return;
    link[k] = 0;
    /* "/memfd:<name> (deleted)" */
    const char *p = strncmp(link, "/memfd:", 7) == 0 ? link + 7 : link;
    size_t i = 0;
    while (p[i] && p[i] != ' ' && i + 1 < n) {
        out[i] = p[i];
        i++;
    }
    out[i] = 0;
}
_Static_assert(sizeof(struct ipc_handle) <= sizeof(CUipcMemHandle), "handle fits");

CUresult cuIpcGetMemHandle(CUipcMemHandle *h, CUdeviceptr p) {
    LOG("cuIpcGetMemHandle(%#llx)", p);
    NEED_INIT();
    NEED_PTR(h);
    struct alloc a;
    if (!lookup(p, &a) || a.kind != K_DEVICE) return CUDA_ERROR_INVALID_VALUE;
    struct ipc_handle ih = {IPC_MAGIC, (int32_t)getpid(), a.fd, a.ordinal, a.size, p - a.dev, {0}};
    fd_name((int)getpid(), a.fd, ih.name, sizeof ih.name);
    memset(h, 0, sizeof *h);
    memcpy(h->reserved, &ih, sizeof ih);
    return CUDA_SUCCESS;
}

CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *pdptr, CUipcMemHandle h, unsigned int flags) {
    NEED_INIT();
    NEED_PTR(pdptr);
    NEED_CTX();
    struct ipc_handle ih;
    memcpy(&ih, h.reserved, sizeof ih);
    LOG("cuIpcOpenMemHandle_v2(pid %d, fd %d, size %llu, flags %#x)", ih.pid, ih.fd,
        (unsigned long long)ih.size, flags);
    if (ih.magic != IPC_MAGIC || ih.size == 0) return CUDA_ERROR_INVALID_VALUE;
    if (ih.pid == (int32_t)getpid()) return CUDA_ERROR_INVALID_CONTEXT; /* as the real driver */
    if (ih.ordinal != t_ctx->device && g_no_peer) return CUDA_ERROR_PEER_ACCESS_UNSUPPORTED;
    /* A handle of a freed allocation fails, even when the fd number now
     * names a newer allocation. */
    char now[32];
    fd_name(ih.pid, ih.fd, now, sizeof now);
    if (ih.name[0] == 0 || strncmp(now, ih.name, sizeof now) != 0) {
        LOG("cuIpcOpenMemHandle_v2: %s is gone (fd %d is now '%s')", ih.name, ih.fd, now);
        return CUDA_ERROR_INVALID_VALUE;
    }
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/fd/%d", ih.pid, ih.fd);
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0) {
        LOG("cuIpcOpenMemHandle_v2: open %s: %s", path, strerror(errno));
        return CUDA_ERROR_INVALID_VALUE;
    }
    struct stat st;
    size_t maplen = page_round(ih.size);
    struct alloc *a = NULL;
    if (fstat(fd, &st) == 0 && (uint64_t)st.st_size >= maplen) a = map_twice(fd, maplen);
    close(fd); /* the mappings keep the memory */
    if (!a) return CUDA_ERROR_INVALID_VALUE;
    a->size = ih.size;
    a->kind = K_IPC;
    add_alloc(a);
    *pdptr = a->dev;
    return CUDA_SUCCESS;
}

CUresult cuIpcCloseMemHandle(CUdeviceptr p) {
    LOG("cuIpcCloseMemHandle(%#llx)", p);
    NEED_INIT();
    return remove_alloc(p, K_IPC);
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
