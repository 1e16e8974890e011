/*
 * fake_cuda_streams.c: the emulated CUDA driver's streams (the model and
 * its limits are described in fake_cuda.c): the queued operations, the
 * worker thread of each stream that runs them, the one shared worker that
 * runs every host function (with its watchdog), quiesce() for the
 * synchronising calls (with the deadlock watchdog), copies and memsets,
 * waits, cuCtxSynchronize, graph capture and events.
 */
#include "fake_cuda_internal.h"

/* -------------------------------------------------------- streams, events */

struct fake_event {
    uint32_t magic;
    struct fake_ctx *ctx; /* the context it was created in */
    int refs;             /* the user's, plus one per queued operation naming it */
    uint64_t recorded;    /* records requested (the newest record's number) */
    uint64_t completed;   /* the highest record number the workers have reached */
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

/* A stream. Its memory is never freed (a destroyed stream leaves the list
 * and loses its magic), so that quiesce() may wait on one that ends. */
struct fake_stream {
    uint32_t magic;
    struct fake_stream *next; /* in g_streams */
    struct fake_ctx *ctx;     /* its context (a default stream's too) */
    pthread_mutex_t mu;
    pthread_cond_t cv; /* work queued, an op finished, or stop */
    struct op *head, *tail;
    uint64_t nsub, ndone; /* ops queued, ops run (for quiesce) */
    int busy;      /* the worker is running an op */
    int running;   /* that op's kind */
    struct op *cur; /* that op (for no_alloc_while_waiting) */
    int stop;      /* destroyed: drain, then exit */
    int capturing; /* between cuStreamBeginCapture and cuStreamEndCapture */
};
static pthread_mutex_t g_streams_mu = PTHREAD_MUTEX_INITIALIZER;
static struct fake_stream *g_streams; /* every live stream */
static pthread_mutex_t g_default_mu = PTHREAD_MUTEX_INITIALIZER;
static struct fake_stream *g_default[MAX_DEV]; /* per primary context */

/* ------------------------------------------- the shared host-function worker */

/* As in CUDA, every host function of the process runs on one thread, in
 * the order the streams reach them; a stream waits for its function. One
 * that runs longer than FAKE_CUDA_HOSTFN_LIMIT_S aborts the process: it
 * waits for something, which stalls every other host function. */
struct hf_job {
    struct hf_job *next;
    CUhostFn fn;
    void *user;
    int done;
};
static pthread_mutex_t g_hf_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_hf_cv; /* a job queued or done */
static struct hf_job *g_hf_head, *g_hf_tail;
static int64_t g_hf_since; /* when the running function started (ns); 0: none */
static pthread_once_t g_hf_once = PTHREAD_ONCE_INIT;

static int64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

static void *hf_worker(void *arg) {
    (void)arg;
    pthread_mutex_lock(&g_hf_mu);
    for (;;) {
        while (!g_hf_head) pthread_cond_wait(&g_hf_cv, &g_hf_mu); /* idle: no timeout */
        struct hf_job *j = g_hf_head;
        g_hf_head = j->next;
        if (!g_hf_head) g_hf_tail = NULL;
        __atomic_store_n(&g_hf_since, now_ns(), __ATOMIC_RELEASE);
        pthread_mutex_unlock(&g_hf_mu);
        t_in_hostfn = 1;
        j->fn(j->user);
        t_in_hostfn = 0;
        pthread_mutex_lock(&g_hf_mu);
        __atomic_store_n(&g_hf_since, 0, __ATOMIC_RELEASE);
        j->done = 1;
        pthread_cond_broadcast(&g_hf_cv);
    }
    return NULL;
}

static void *hf_watchdog(void *arg) {
    (void)arg;
    const struct timespec nap = {0, 50000000}; /* 50 ms */
    for (;;) {
        nanosleep(&nap, NULL);
        int64_t t = __atomic_load_n(&g_hf_since, __ATOMIC_ACQUIRE);
        if (t && now_ns() - t > (int64_t)g_hostfn_limit_s * 1000000000) {
            say("a host function has run for %d s (FAKE_CUDA_HOSTFN_LIMIT_S): host functions must "
                "not wait (CUDA runs every one of them on one thread, so a waiting one stalls the "
                "others and can deadlock); aborting",
                g_hostfn_limit_s);
            abort();
        }
    }
    return NULL;
}

static void start_thread(void *(*fn)(void *), void *arg, const char *name) {
    pthread_attr_t at;
    pthread_attr_init(&at);
    pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
    pthread_t th;
    if (pthread_create(&th, &at, fn, arg) != 0) {
        say("cannot start a worker thread");
        abort();
    }
    pthread_attr_destroy(&at);
    pthread_setname_np(th, name);
}

static void hf_start(void) {
    cond_init(&g_hf_cv);
    start_thread(hf_worker, NULL, "fake-cuda-hostfn");
    start_thread(hf_watchdog, NULL, "fake-cuda-hfdog");
}

/* Runs fn(user) on the shared worker and waits for it (the stream's turn). */
static void run_host_fn(CUhostFn fn, void *user) {
    pthread_once(&g_hf_once, hf_start);
    struct hf_job j = {NULL, fn, user, 0};
    pthread_mutex_lock(&g_hf_mu);
    if (g_hf_tail) g_hf_tail->next = &j;
    else g_hf_head = &j;
    g_hf_tail = &j;
    pthread_cond_broadcast(&g_hf_cv);
    while (!j.done) pthread_cond_wait(&g_hf_cv, &g_hf_mu); /* bounded by the watchdog */
    pthread_mutex_unlock(&g_hf_mu);
}

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
    case OP_HOST_FN: run_host_fn(o->fn, o->user); break;
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
        s->running = o->kind;
        s->cur = o;
        pthread_mutex_unlock(&s->mu);
        run_op(o);
        pthread_mutex_lock(&s->mu);
        s->cur = NULL;
        pthread_mutex_unlock(&s->mu);
        op_free(o);
        pthread_mutex_lock(&s->mu);
        s->busy = 0;
        s->ndone++;
        pthread_cond_broadcast(&s->cv);
    }
    pthread_mutex_unlock(&s->mu);
    pthread_mutex_lock(&g_streams_mu);
    struct fake_stream **pp = &g_streams;
    while (*pp != s) pp = &(*pp)->next;
    *pp = s->next;
    pthread_mutex_unlock(&g_streams_mu);
    s->magic = 0; /* the memory stays (see struct fake_stream) */
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
    start_thread(worker, s, "fake-cuda-strm");
    return s;
}

static int is_default(CUstream h) {
    return h == NULL || h == CU_STREAM_LEGACY || h == CU_STREAM_PER_THREAD;
}

/* The stream `h` names; the default handles name the current context's
 * default stream (none current: CUDA_ERROR_INVALID_CONTEXT). */
static CUresult get_stream(CUstream h, struct fake_stream **out) {
    if (is_default(h)) {
        if (t_ctx == NULL) return CUDA_ERROR_INVALID_CONTEXT;
        pthread_mutex_lock(&g_default_mu);
        struct fake_stream **d = &g_default[t_ctx - g_ctx];
        if (!*d) *d = stream_new(t_ctx);
        *out = *d;
        pthread_mutex_unlock(&g_default_mu);
        return CUDA_SUCCESS;
    }
    struct fake_stream *s = (struct fake_stream *)h;
    if (s->magic != STREAM_MAGIC) return CUDA_ERROR_INVALID_HANDLE;
    *out = s;
    return CUDA_SUCCESS;
}

CUresult stream_ctx(CUstream h, struct fake_ctx **out) {
    *out = NULL;
    if (is_default(h)) {
        if (t_ctx == NULL) return CUDA_ERROR_INVALID_CONTEXT;
        *out = t_ctx;
        return CUDA_SUCCESS;
    }
    struct fake_stream *s = (struct fake_stream *)h;
    if (s->magic != STREAM_MAGIC) return CUDA_ERROR_INVALID_HANDLE;
    *out = s->ctx;
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
    s->nsub++;
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

static const char *op_name(int kind) {
    switch (kind) {
    case OP_COPY: return "a copy";
    case OP_SET: return "a memset";
    case OP_RECORD: return "an event record";
    case OP_WAIT_EVENT: return "cuStreamWaitEvent";
    case OP_WAIT_VALUE: return "cuStreamWaitValue32 (a flag nobody has set)";
    case OP_HOST_FN: return "a host function";
    default: return "a kernel";
    }
}

/* Waits until every stream of `ctx` (NULL: all) has run what was queued
 * on it when the call began. After `secs` (0: FAKE_CUDA_TIMEOUT_S) a
 * deadlock report (deadlock) or die_timeout. */
static void wait_streams(struct fake_ctx *ctx, const char *what, int secs, int deadlock) {
    struct target {
        struct fake_stream *s;
        uint64_t n;
    } *t = NULL;
    size_t n = 0, cap = 0;
    pthread_mutex_lock(&g_streams_mu);
    for (struct fake_stream *s = g_streams; s; s = s->next) {
        if (ctx && s->ctx != ctx) continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 16;
            t = realloc(t, cap * sizeof *t);
            if (!t) abort();
        }
        pthread_mutex_lock(&s->mu);
        t[n++] = (struct target){s, s->nsub};
        pthread_mutex_unlock(&s->mu);
    }
    pthread_mutex_unlock(&g_streams_mu);
    struct timespec dl = secs ? deadline_in(secs) : deadline();
    for (size_t i = 0; i < n; i++) {
        struct fake_stream *s = t[i].s;
        pthread_mutex_lock(&s->mu);
        while (s->ndone < t[i].n) {
            if (pthread_cond_timedwait(&s->cv, &s->mu, &dl) != ETIMEDOUT) continue;
            if (!deadlock) die_timeout(what);
            say("%s: deadlock: the call waits until every stream of the context is idle, but "
                "stream %p (device %d) has been stuck for %d s (FAKE_CUDA_DEADLOCK_S) on %s; on a "
                "GPU the call would never return; aborting",
                what, (void *)s, s->ctx ? s->ctx->device : -1, secs,
                op_name(s->busy ? s->running : s->head ? s->head->kind : -1));
            abort();
        }
        pthread_mutex_unlock(&s->mu);
    }
    free(t);
}

void no_alloc_while_waiting(const char *what) {
    struct fake_stream *w = NULL;
    pthread_mutex_lock(&g_streams_mu);
    for (struct fake_stream *s = g_streams; s && !w; s = s->next) {
        pthread_mutex_lock(&s->mu);
        /* A wait not yet satisfied, running or queued. */
        for (struct op *o = s->cur ? s->cur : s->head; o && !w; o = o == s->cur ? s->head : o->next)
            if (o->kind == OP_WAIT_VALUE &&
                !wait_value_ok(__atomic_load_n((uint32_t *)o->dst, __ATOMIC_ACQUIRE), o->value,
                               o->flags))
                w = s;
        pthread_mutex_unlock(&s->mu);
    }
    pthread_mutex_unlock(&g_streams_mu);
    if (!w) return;
    say("%s while stream %p (device %d) waits on cuStreamWaitValue32: CUDA's implicit "
        "synchronisation keeps commands issued before and after an allocation on different "
        "streams from running concurrently, so work issued after it may never start; aborting",
        what, (void *)w, w->ctx ? w->ctx->device : -1);
    abort();
}

void quiesce(struct fake_ctx *ctx, const char *what) {
    LOG("%s: waiting for the streams of %s to go idle", what,
        ctx ? "its context" : "every context");
    wait_streams(ctx, what, g_deadlock_s, 1);
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
    wait_streams(t_ctx, "cuCtxSynchronize", 0, 0);
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

CUresult cuStreamGetCtx(CUstream h, CUcontext *pctx) {
    NEED_INIT();
    NEED_PTR(pctx);
    struct fake_ctx *c;
    CUresult rc = stream_ctx(h, &c);
    *pctx = (CUcontext)c;
    LOG("cuStreamGetCtx(%p) -> %p", (void *)h, (void *)c);
    return rc;
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
    e->ctx = t_ctx;
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
    /* As in CUDA: the event and the stream must belong to one context. */
    struct fake_ctx *sc;
    CUresult rc = stream_ctx(h, &sc);
    if (rc != CUDA_SUCCESS) return rc;
    if (sc != ((struct fake_event *)ev)->ctx) {
        LOG("cuEventRecord: the event's context is not the stream's");
        return CUDA_ERROR_INVALID_HANDLE;
    }
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
