/* The shape of a 2-rank shm AllReduce item, out of place, on 64 MiB floats:
 * two threads, pinned one per CPU, each handle half the buffer.
 *
 *   gcc -O2 -Wall -pthread -o fused_vs_split fused_vs_split.c && ./fused_vs_split [ROUNDS]
 *
 *   split    hetccl's work item: per 128 KiB item, sum both inputs into a
 *            buffer that stays in L2 (AVX2), then copy the buffer into both
 *            outputs with 16-byte streaming stores
 *   split32  the same with 32-byte streaming stores
 *   fused    one loop: sum, and stream the sum into both outputs (32 bytes)
 *
 * Each operation moves the AllReduce's least traffic, 4 x 64 MiB. Rounds
 * run split, split32, fused in turn (default 15); it prints the median
 * time per operation of each and the medians of the per-round ratios
 * split/fused and split/split32. x86-64 with AVX2 only.
 */
#define _GNU_SOURCE
#include <immintrin.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define BYTES (64u << 20)
#define ITEM (128u << 10)
#define OPS 10 /* operations per timed batch */
#define MODES 3

static float *in_a, *in_b, *out1, *out2;
static int mode;
static pthread_barrier_t start_bar, end_bar;

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n) {
    qsort(v, n, sizeof *v, cmp);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

__attribute__((target("avx2"))) static void split(size_t lo, size_t hi, float *acc, int wide) {
    const size_t n = ITEM / sizeof(float);
    for (size_t c = lo; c < hi; c += n) {
        for (size_t i = 0; i < n; i += 8)
            _mm256_store_ps(acc + i, _mm256_add_ps(_mm256_load_ps(in_a + c + i),
                                                   _mm256_load_ps(in_b + c + i)));
        for (int o = 0; o < 2; o++) {
            float *d = (o ? out2 : out1) + c;
            if (wide)
                for (size_t i = 0; i < n; i += 8) _mm256_stream_ps(d + i, _mm256_load_ps(acc + i));
            else
                for (size_t i = 0; i < n; i += 4) _mm_stream_ps(d + i, _mm_load_ps(acc + i));
        }
        _mm_sfence();
    }
}

__attribute__((target("avx2"))) static void fused(size_t lo, size_t hi) {
    for (size_t i = lo; i < hi; i += 8) {
        __m256 x = _mm256_add_ps(_mm256_load_ps(in_a + i), _mm256_load_ps(in_b + i));
        _mm256_stream_ps(out1 + i, x);
        _mm256_stream_ps(out2 + i, x);
    }
    _mm_sfence();
}

static void *worker(void *arg) {
    long t = (long)arg;
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(t, &set);
    pthread_setaffinity_np(pthread_self(), sizeof set, &set);
    float *acc = aligned_alloc(64, ITEM);
    size_t n = BYTES / sizeof(float), lo = t * n / 2, hi = (t + 1) * n / 2;
    for (;;) {
        pthread_barrier_wait(&start_bar);
        if (mode < 0) break;
        for (int r = 0; r < OPS; r++) {
            if (mode == 2) fused(lo, hi);
            else split(lo, hi, acc, mode == 1);
        }
        pthread_barrier_wait(&end_bar);
    }
    free(acc);
    return NULL;
}

int main(int argc, char **argv) {
    int rounds = argc > 1 ? atoi(argv[1]) : 15;
    if (rounds < 1 || rounds > 1000 || !__builtin_cpu_supports("avx2")) {
        fprintf(stderr, "usage: fused_vs_split [ROUNDS 1..1000] (needs AVX2)\n");
        return 64;
    }
    in_a = aligned_alloc(64, BYTES);
    in_b = aligned_alloc(64, BYTES);
    out1 = aligned_alloc(64, BYTES);
    out2 = aligned_alloc(64, BYTES);
    double *ms = malloc(sizeof(double) * MODES * rounds);
    double *ratio = malloc(sizeof(double) * rounds);
    if (!in_a || !in_b || !out1 || !out2 || !ms || !ratio) {
        fprintf(stderr, "fused_vs_split: out of memory\n");
        return 2;
    }
    memset(in_a, 0, BYTES);
    memset(in_b, 0, BYTES);
    memset(out1, 0, BYTES);
    memset(out2, 0, BYTES);
    pthread_barrier_init(&start_bar, NULL, 3);
    pthread_barrier_init(&end_bar, NULL, 3);
    pthread_t th[2];
    for (long t = 0; t < 2; t++) pthread_create(&th[t], NULL, worker, (void *)t);
    for (int r = 0; r < rounds; r++)
        for (int m = 0; m < MODES; m++) {
            mode = m;
            double t0 = now();
            pthread_barrier_wait(&start_bar);
            pthread_barrier_wait(&end_bar);
            ms[m * rounds + r] = (now() - t0) * 1e3 / OPS;
        }
    mode = -1;
    pthread_barrier_wait(&start_bar);
    for (int t = 0; t < 2; t++) pthread_join(th[t], NULL);
    static const char *names[MODES] = {"split", "split32", "fused"};
    for (int k = 0; k < 2; k++) { /* split/fused, split/split32 */
        for (int r = 0; r < rounds; r++)
            ratio[r] = ms[r] / ms[(k ? 1 : 2) * rounds + r];
        printf("split / %s: %.2f (median of %d rounds)\n", k ? "split32" : "fused",
               median(ratio, rounds), rounds);
    }
    for (int m = 0; m < MODES; m++)
        printf("%-8s %.2f ms per operation (median)\n", names[m], median(ms + m * rounds, rounds));
    return 0;
}
