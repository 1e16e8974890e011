/*
 * fake_cuda_internal.h: what the files of the emulated CUDA driver share
 * (tests/c/fake_cuda.c describes the model and its limits): the handle
 * magics, the switches, the logging and argument-check macros, the timed
 * waits and the watchdogs, the current context, the two memory-table calls
 * the streams and kernels use, the queued operation (struct op) with its
 * calls, and quiesce() (what a synchronising call waits for).
 *
 * Everything declared here is hidden: the shared library exports only the
 * CUDA API (tests/fake_cuda_selftest.rs checks the list).
 */
#ifndef FAKE_CUDA_INTERNAL_H
#define FAKE_CUDA_INTERNAL_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
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

#pragma GCC visibility push(hidden)

/* ------------------------------------------------- basics (fake_cuda.c) */

#define MAX_DEV 16
#define CTX_MAGIC 0xC7C7C7C7u
#define STREAM_MAGIC 0x57EA5757u
#define EVENT_MAGIC 0xE7E7E7E7u
#define IPC_MAGIC 0x1FCA4E00u
#define MODULE_MAGIC 0x30D030D0u
#define FUNC_MAGIC 0xF0F0F0F0u

extern int g_log;            /* FAKE_CUDA_LOG */
extern int g_no_memops;      /* FAKE_CUDA_NO_STREAM_MEMOPS */
extern int g_no_peer;        /* FAKE_CUDA_NO_PEER_ACCESS */
extern int g_peermem;        /* FAKE_CUDA_PEERMEM: device memory mapped read-write */
extern int g_reject_cubin;   /* FAKE_CUDA_REJECT_CUBIN */
extern int g_driver_version; /* FAKE_CUDA_DRIVER_VERSION, else CUDA_VERSION */
extern int g_deadlock_s;     /* FAKE_CUDA_DEADLOCK_S */
extern int g_hostfn_limit_s; /* FAKE_CUDA_HOSTFN_LIMIT_S */
extern int g_inited;         /* cuInit succeeded (atomic access) */
extern __thread int t_in_hostfn; /* this thread is running a host function */

/* The emulated devices' compute capability (9.0) as sm_XX's number. */
#define DEVICE_SM 90

__attribute__((format(printf, 1, 2))) void say(const char *fmt, ...);

#define LOG(...) do { if (g_log) say(__VA_ARGS__); } while (0)

/* Every call but cuInit, the version and the error names: initialised,
 * and not from inside a host function (CUDA forbids CUDA calls there). */
#define NEED_INIT()                                                                                \
    do {                                                                                           \
        if (t_in_hostfn) return CUDA_ERROR_NOT_PERMITTED;                                          \
        if (!__atomic_load_n(&g_inited, __ATOMIC_ACQUIRE)) return CUDA_ERROR_NOT_INITIALIZED;      \
    } while (0)

#define NEED_PTR(p) do { if ((p) == NULL) return CUDA_ERROR_INVALID_VALUE; } while (0)

#define U(p) ((CUdeviceptr)(uintptr_t)(p))

/* Aborts the process: `what` has waited FAKE_CUDA_TIMEOUT_S. */
void die_timeout(const char *what);
/* Condition variables use CLOCK_MONOTONIC so that deadlines are immune to clock changes. */
void cond_init(pthread_cond_t *cv);
/* FAKE_CUDA_TIMEOUT_S from now; past(): whether that time has come. */
struct timespec deadline(void);
/* `s` seconds from now. */
struct timespec deadline_in(int s);
int past(const struct timespec *dl);
/* One wait on `cv`; aborts the process once `dl` has passed. */
void wait_until(pthread_cond_t *cv, pthread_mutex_t *mu, const struct timespec *dl,
                const char *what);
/* n rounded up to whole pages. */
size_t page_round(size_t n);

/* ----------------------------------------------- contexts (fake_cuda.c) */

struct fake_ctx {
    uint32_t magic;
    int device;
};
extern __thread struct fake_ctx *t_ctx; /* the calling thread's current context */
extern struct fake_ctx g_ctx[MAX_DEV];  /* the primary contexts, one per device */

#define NEED_CTX() do { if (t_ctx == NULL) return CUDA_ERROR_INVALID_CONTEXT; } while (0)

/* -------------------------------- the memory table (fake_cuda_memory.c) */

struct alloc; /* an entry of the table */

/* Drops a reference taken by translate() (NULL: nothing). */
void unref_alloc(struct alloc *a);
/* [addr, addr+n) as the worker reads or writes it: a device range's
 * shadow (a reference to its allocation in *hold), else the host address. */
CUresult translate(uintptr_t addr, size_t n, char **out, struct alloc **hold);

/* ------------------------------ queued operations (fake_cuda_streams.c) */

struct fake_event;
extern pthread_cond_t g_ev_cv; /* broadcast whenever an event record completes */

enum op_kind { OP_COPY, OP_SET, OP_RECORD, OP_WAIT_EVENT, OP_WAIT_VALUE, OP_HOST_FN, OP_KERNEL };

struct op {
    struct op *next;
    int kind;
    char *dst;               /* COPY, SET; WAIT_VALUE: the translated address */
    const char *src;         /* COPY; KERNEL: a (postdiv: dst) */
    const char *src2;        /* KERNEL: b (reduce kernels only) */
    size_t n;                /* COPY, SET; KERNEL: elements */
    int kdt, kop;            /* KERNEL: enum kdt, enum kop (fake_cuda_kernels.c) */
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

struct op *op_new(int kind);
/* Drops the op's references to allocations and its event, then frees it. */
void op_free(struct op *o);
/* Appends `o` to stream `h` (ownership passes; freed on failure). */
CUresult submit(CUstream h, struct op *o);
/* The context of stream `h` (a default stream: the current context; NULL
 * with CUDA_ERROR_INVALID_CONTEXT when none is current). */
CUresult stream_ctx(CUstream h, struct fake_ctx **out);
/* What a synchronising call (a free, an IPC close, a module load) does:
 * waits until every stream of `ctx` (NULL: of every context) has run what
 * was queued before the call. A wait past FAKE_CUDA_DEADLOCK_S aborts the
 * process naming `what` and the operation a stream is stuck on: the caller
 * would deadlock on a GPU. */
void quiesce(struct fake_ctx *ctx, const char *what);
/* Aborts when a stream waits on cuStreamWaitValue32: called by the page-
 * locked host and device memory allocations (see fake_cuda.c). */
void no_alloc_while_waiting(const char *what);

/* ---------------------------------------- kernels (fake_cuda_kernels.c) */

/* Runs the emulated kernel of `o` (an OP_KERNEL with n > 0). */
void run_kernel(const struct op *o);

#pragma GCC visibility pop

#endif /* FAKE_CUDA_INTERNAL_H */
