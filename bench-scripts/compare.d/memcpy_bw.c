/* Single-core memcpy bandwidth, the memory limit line of bench-scripts/compare.
 *
 *   memcpy_bw [-b MIN] [-e MAX] [-f FACTOR] [-t SECONDS_PER_SIZE]
 *
 * For each size S (doubling by FACTOR from MIN to MAX) it copies an S-byte
 * source into an S-byte destination (both page-aligned, touched beforehand)
 * repeatedly, in 5 batches of about SECONDS/5 each, and prints the median
 * batch's copy rate in bytes copied per second (S x copies / seconds; the
 * DRAM traffic is about twice that: read S, write S):
 *
 *   # memcpy_bw size bytes_per_s best_bytes_per_s copies_per_batch
 *   1048576 4.73e+10 4.81e+10 2048
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_util.h"

/* Keeps the compiler from eliding copies whose result is never read. */
volatile unsigned char sink;

int main(int argc, char **argv) {
    size_t minb = 8, maxb = 256u << 20;
    long factor = 2;
    double secs = 0.25;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "-b")) minb = parse_size(argv[i + 1]);
        else if (!strcmp(argv[i], "-e")) maxb = parse_size(argv[i + 1]);
        else if (!strcmp(argv[i], "-f")) factor = atol(argv[i + 1]);
        else if (!strcmp(argv[i], "-t")) secs = atof(argv[i + 1]);
        else {
            fprintf(stderr, "usage: memcpy_bw [-b MIN] [-e MAX] [-f FACTOR] [-t SECONDS]\n");
            return 64;
        }
    }
    if (factor < 2 || minb < 1 || maxb < minb) {
        fprintf(stderr, "memcpy_bw: bad sizes\n");
        return 64;
    }
    unsigned char *src, *dst;
    if (posix_memalign((void **)&src, 4096, maxb) || posix_memalign((void **)&dst, 4096, maxb)) {
        fprintf(stderr, "memcpy_bw: out of memory\n");
        return 2;
    }
    memset(src, 1, maxb);
    memset(dst, 2, maxb);
    printf("# memcpy_bw size bytes_per_s best_bytes_per_s copies_per_batch\n");
    for (size_t s = minb; s <= maxb; s *= (size_t)factor) {
        /* Calibrate: copies per batch so that a batch lasts about secs/5. */
        long reps = 1;
        for (;;) {
            double t0 = now();
            for (long r = 0; r < reps; r++) {
                memcpy(dst, src, s);
                __asm__ __volatile__("" ::"r"(dst) : "memory");
            }
            double dt = now() - t0;
            if (dt > secs / 20 || reps > (1L << 30)) {
                double want = secs / 5 / (dt / reps);
                reps = want < 1 ? 1 : (long)want;
                break;
            }
            reps *= 4;
        }
        double rate[5];
        for (int b = 0; b < 5; b++) {
            double t0 = now();
            for (long r = 0; r < reps; r++) {
                memcpy(dst, src, s);
                __asm__ __volatile__("" ::"r"(dst) : "memory");
            }
            rate[b] = (double)s * reps / (now() - t0);
        }
        sink = dst[s - 1];
        qsort(rate, 5, sizeof rate[0], cmp);
        printf("%zu %.4e %.4e %ld\n", s, rate[2], rate[4], reps);
        fflush(stdout);
    }
    free(src);
    free(dst);
    return 0;
}
