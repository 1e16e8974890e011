/*
 * fake_cuda_streams.c: the emulated CUDA driver's streams (the model and
 * its limits are described in fake_cuda.c): the queued operations, the
 * worker thread of each stream that runs them, copies and memsets, waits,
 * host functions, cuCtxSynchronize, graph capture and events.
 */
#include "fake_cuda_internal.h"

/* -------------------------------------------------------- streams, events */

struct fake_event {
    uint32_t magic;
    int refs;           /* the user's, plus one per queued operation naming it */
    uint64_t recorded;  /* records requested (the newest record's number) */
    uint64_t completed; /* the highest record number the workers have reached */
};
static pthread_mutex_t g_ev = PTHREAD_MUTEX_INITIALIZER; /* guards every event */
pthread_cond_t g_ev_cv; /* initialised by fake_cuda_load (fake_cuda.c) */

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

struct op *op_new(int kind) {
    struct op *o = calloc(1, sizeof *o);
    if (!o) abort();
    o->kind = kind;
    return o;
}

void op_free(struct op *o) {
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
        if (o->n) run_kernel(o);
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
CUresult submit(CUstream h, struct op *o) {
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

/* ---------------------------------------------- context synchronisation */

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
