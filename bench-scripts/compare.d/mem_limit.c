/* Two-thread memory bandwidth, the memory limit of bench-scripts/compare.
 *
 *   mem_limit [-s BYTES_PER_ARRAY] [-t SECONDS_PER_KERNEL] [-c CPU,CPU]
 *
 * Two threads, pinned one per CPU (default: the first two CPUs this process
 * may run on), each with arrays of their own (default 64 MiB each, far
 * beyond the caches), run two kernels in step:
 *
 *   memcpy  c = a   (glibc memcpy)                    traffic 2 x BYTES per pass
 *   ntcopy  c = a   (stores bypass the caches)        traffic 2 x BYTES per pass
 *   add     c = a + b, float (stores bypass caches)   traffic 3 x BYTES per pass
 *
 * (Stores bypass the caches on x86-64 only; elsewhere ntcopy is memcpy and
 * add a plain loop.) bench-scripts/compare takes the faster of memcpy and
 * ntcopy as the copy bandwidth.
 *
 * Each kernel runs 5 batches of about SECONDS/5; a batch starts with both
 * threads at a barrier and ends when the slower one is done. It prints the
 * median and the fastest batch's traffic, bytes read + bytes written by
 * both threads together, per second (bench-scripts/compare uses the
 * fastest: preemption on a shared machine only ever slows a batch):
 *
 *   # mem_limit threads 2 cpus 0,1 bytes_per_array 67108864
 *   # kernel traffic_bytes_per_s best_traffic_bytes_per_s passes_per_batch
 *   memcpy 1.5195e+10 1.6316e+10 9
 *   ntcopy 2.2043e+10 2.3120e+10 8
 *   add 2.5026e+10 2.7062e+10 6
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#if defined(__x86_64__)
#include <emmintrin.h>
#endif

#include "bench_util.h"

#define THREADS 2
#define BATCHES 5

/* c = a over n floats with streaming stores; as for add. */
static void ntcopy(float *restrict c, const float *restrict a, size_t n) {
#if defined(__x86_64__)
    for (size_t i = 0; i < n; i += 16) {
        __m128 x0 = _mm_load_ps(a + i), x1 = _mm_load_ps(a + i + 4);
        __m128 x2 = _mm_load_ps(a + i + 8), x3 = _mm_load_ps(a + i + 12);
        _mm_stream_ps(c + i, x0);
        _mm_stream_ps(c + i + 4, x1);
        _mm_stream_ps(c + i + 8, x2);
        _mm_stream_ps(c + i + 12, x3);
    }
    _mm_sfence();
#else
    memcpy(c, a, n * sizeof(float));
#endif
}

/* c = a + b over n floats; all three 64-byte aligned, n a multiple of 16. */
static void add(float *restrict c, const float *restrict a, const float *restrict b, size_t n) {
#if defined(__x86_64__)
    for (size_t i = 0; i < n; i += 16) {
        __m128 x0 = _mm_add_ps(_mm_load_ps(a + i), _mm_load_ps(b + i));
        __m128 x1 = _mm_add_ps(_mm_load_ps(a + i + 4), _mm_load_ps(b + i + 4));
        __m128 x2 = _mm_add_ps(_mm_load_ps(a + i + 8), _mm_load_ps(b + i + 8));
        __m128 x3 = _mm_add_ps(_mm_load_ps(a + i + 12), _mm_load_ps(b + i + 12));
        _mm_stream_ps(c + i, x0);
        _mm_stream_ps(c + i + 4, x1);
        _mm_stream_ps(c + i + 8, x2);
        _mm_stream_ps(c + i + 12, x3);
    }
    _mm_sfence();
#else
    for (size_t i = 0; i < n; i++) c[i] = a[i] + b[i];
#endif
}

struct worker {
    pthread_t tid;
    int cpu;
    float *a, *b, *c;
};

static size_t bytes = 64u << 20;
static pthread_barrier_t start_bar, end_bar;
/* Set by the main thread between batches: kernel (0 memcpy, 1 ntcopy,
 * 2 add, -1 quit)
 * and passes per batch. */
static int kernel;
static long passes;

/* Keeps the compiler from eliding work whose result is never read. */
volatile float sink;

static void *run(void *arg) {
    struct worker *w = arg;
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(w->cpu, &set);
    if (pthread_setaffinity_np(pthread_self(), sizeof set, &set) != 0)
        fprintf(stderr, "mem_limit: cannot pin to CPU %d; running unpinned\n", w->cpu);
    /* Touch every page on the thread that uses it. */
    memset(w->a, 1, bytes);
    memset(w->b, 2, bytes);
    memset(w->c, 3, bytes);
    for (;;) {
        pthread_barrier_wait(&start_bar);
        if (kernel < 0) break;
        for (long p = 0; p < passes; p++) {
            if (kernel == 0) memcpy(w->c, w->a, bytes);
            else if (kernel == 1) ntcopy(w->c, w->a, bytes / sizeof(float));
            else add(w->c, w->a, w->b, bytes / sizeof(float));
            __asm__ __volatile__("" ::"r"(w->c) : "memory");
        }
        pthread_barrier_wait(&end_bar);
    }
    sink = w->c[bytes / sizeof(float) - 1];
    return NULL;
}

/* One batch of `p` passes of kernel `k` on both threads; seconds. */
static double batch(int k, long p) {
    kernel = k;
    passes = p;
    double t0 = now();
    pthread_barrier_wait(&start_bar);
    pthread_barrier_wait(&end_bar);
    return now() - t0;
}

int main(int argc, char **argv) {
    double secs = 1.0;
    int cpus[THREADS] = {-1, -1};
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "-s")) bytes = parse_size(argv[i + 1]);
        else if (!strcmp(argv[i], "-t")) secs = atof(argv[i + 1]);
        else if (!strcmp(argv[i], "-c")) {
            if (sscanf(argv[i + 1], "%d,%d", &cpus[0], &cpus[1]) != 2) cpus[0] = -2;
        } else {
            fprintf(stderr, "usage: mem_limit [-s BYTES_PER_ARRAY] [-t SECONDS] [-c CPU,CPU]\n");
            return 64;
        }
    }
    bytes &= ~(size_t)63;
    if (bytes < 4096 || secs <= 0 || cpus[0] == -2) {
        fprintf(stderr, "mem_limit: bad arguments\n");
        return 64;
    }
    if (cpus[0] < 0) { /* the first two CPUs we may run on */
        cpu_set_t set;
        if (sched_getaffinity(0, sizeof set, &set) != 0) CPU_ZERO(&set);
        int k = 0;
        for (int c = 0; c < CPU_SETSIZE && k < THREADS; c++)
            if (CPU_ISSET(c, &set)) cpus[k++] = c;
        if (k < THREADS) {
            fprintf(stderr, "mem_limit: needs 2 CPUs, found %d\n", k);
            return 2;
        }
    }
    struct worker w[THREADS];
    pthread_barrier_init(&start_bar, NULL, THREADS + 1);
    pthread_barrier_init(&end_bar, NULL, THREADS + 1);
    for (int t = 0; t < THREADS; t++) {
        w[t].cpu = cpus[t];
        if (posix_memalign((void **)&w[t].a, 4096, bytes) ||
            posix_memalign((void **)&w[t].b, 4096, bytes) ||
            posix_memalign((void **)&w[t].c, 4096, bytes)) {
            fprintf(stderr, "mem_limit: out of memory\n");
            return 2;
        }
    }
    for (int t = 0; t < THREADS; t++)
        if (pthread_create(&w[t].tid, NULL, run, &w[t]) != 0) {
            fprintf(stderr, "mem_limit: cannot start a thread\n");
            return 2;
        }
    printf("# mem_limit threads %d cpus %d,%d bytes_per_array %zu\n", THREADS, cpus[0], cpus[1],
           bytes);
    printf("# kernel traffic_bytes_per_s best_traffic_bytes_per_s passes_per_batch\n");
    static const char *names[] = {"memcpy", "ntcopy", "add"};
    static const double arrays[] = {2.0, 2.0, 3.0}; /* arrays touched per pass */
    batch(0, 0); /* waits until both threads have touched their pages */
    for (int k = 0; k < 3; k++) {
        /* Calibrate: one pass (also the warm-up), then passes per batch. */
        double dt = batch(k, 1);
        long p = (long)(secs / BATCHES / dt);
        if (p < 1) p = 1;
        double rate[BATCHES];
        for (int b = 0; b < BATCHES; b++)
            rate[b] = arrays[k] * (double)bytes * THREADS * p / batch(k, p);
        qsort(rate, BATCHES, sizeof rate[0], cmp);
        printf("%s %.4e %.4e %ld\n", names[k], rate[BATCHES / 2], rate[BATCHES - 1], p);
        fflush(stdout);
    }
    kernel = -1;
    pthread_barrier_wait(&start_bar);
    for (int t = 0; t < THREADS; t++) pthread_join(w[t].tid, NULL);
    return 0;
}
