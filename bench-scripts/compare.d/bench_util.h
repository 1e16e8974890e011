/* Helpers shared by the C tools of bench-scripts/compare (memcpy_bw.c,
 * mem_limit.c): a monotonic clock, sizes with K/M/G suffixes, and the
 * comparison qsort needs for medians. */
#ifndef HETCCL_BENCH_UTIL_H
#define HETCCL_BENCH_UTIL_H

#include <stdlib.h>
#include <time.h>

/* Seconds on the monotonic clock. */
static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* "64M", "4k", "1G" or plain bytes. */
static size_t parse_size(const char *s) {
    char *end;
    double v = strtod(s, &end);
    if (*end == 'K' || *end == 'k') v *= 1024.0;
    else if (*end == 'M' || *end == 'm') v *= 1024.0 * 1024.0;
    else if (*end == 'G' || *end == 'g') v *= 1024.0 * 1024.0 * 1024.0;
    return (size_t)v;
}

/* Ascending doubles, for qsort. */
static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

#endif
