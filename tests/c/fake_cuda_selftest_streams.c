/*
 * fake_cuda_selftest_streams.c: the self-test's stream groups (see
 * fake_cuda_selftest.c): stream order, events and wait-values, host
 * functions, cross-stream waits and cuCtxSynchronize, graph capture.
 */
#include "fake_cuda_selftest.h"

/* --------------------------------------------------------- stream order */

/* Sets the flag at `arg` to 1 after 50 ms. */
void *set_later(void *arg) {
    sleep_ms(50);
    set_flag(arg, 1);
    return NULL;
}

void t_fifo(void) {
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

    /* Freeing memory that queued work still reads waits, as CUDA's frees
     * do, until the context's streams are idle: here until a thread sets
     * the flag the stream waits on. */
    set_flag(flag, 0);
    memset(out, 0, N);
    CK(cuMemcpyHtoD(a, src, N));
    CK(cuStreamWaitValue32(s, (CUdeviceptr)(uintptr_t)flag, 1, CU_STREAM_WAIT_VALUE_GEQ));
    CK(cuMemcpyDtoHAsync(out, a, N, s));
    pthread_t th;
    pthread_create(&th, NULL, set_later, (void *)flag);
    kv("free.pending_rc", cuMemFree(a));
    kv("free.waited_for_stream", __atomic_load_n(flag, __ATOMIC_ACQUIRE) == 1);
    kv("free.pending_data", check(out, N, 3, 1));
    pthread_join(th, NULL);
    kv("free.pending_sync", cuStreamSynchronize(s));

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

void t_host_funcs(void) {
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

void t_cross_stream(void) {
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
void wait_flag_fn(void *u) {
    while (__atomic_load_n((uint32_t *)u, __ATOMIC_ACQUIRE) == 0) sleep_ms(1);
}

void t_capture(void) {
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
