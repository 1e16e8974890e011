/* OpenMPI counterpart of hetccl-perf for bench-scripts/compare.
 *
 *   mpirun -np N mpi_coll all_reduce|all_gather|reduce_scatter|broadcast \
 *          [-b MIN] [-e MAX] [-f FACTOR] [-n ITERS] [-w WARMUP] [-c CHECK]
 *
 * float sum, out-of-place, host buffers. Prints nccl-tests' table (the
 * in-place columns are printed as N/A: only out-of-place is measured), with
 * nccl-tests' sizes, counts and busbw factors:
 *   all_reduce      count = size/4            busbw = algbw * 2(n-1)/n
 *   all_gather      count = per-rank send     busbw = algbw * (n-1)/n
 *   reduce_scatter  count = per-rank receive  busbw = algbw * (n-1)/n
 *   broadcast       count = size/4 (root 0)   busbw = algbw
 * where per-rank counts are (size/4/n) rounded down to 16 bytes and algbw's
 * numerator is count*4 (times n for all_gather and reduce_scatter).
 *
 * Loop as hetccl-perf / nccl-tests: warm-up of -w operations at every size
 * doubling from -b to -e, then per size: one untimed operation, barrier,
 * -n timed operations (time = mean over ranks of wall-clock / n), then -c
 * checks with fresh data whose exact float sum is order-independent (small
 * integers). #wrong = wrong elements summed over ranks; any makes exit 1.
 */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

enum { AR, AG, RS, BC };
static const char *NAMES[] = {"all_reduce", "all_gather", "reduce_scatter", "broadcast"};

static size_t parse_size(const char *s) {
    char *end;
    double v = strtod(s, &end);
    switch (*end) {
    case 'K': case 'k': v *= 1024.0; break;
    case 'M': case 'm': v *= 1024.0 * 1024.0; break;
    case 'G': case 'g': v *= 1024.0 * 1024.0 * 1024.0; break;
    default: break;
    }
    return (size_t)v;
}

/* nccl-tests' getFloatStr: as many decimals (2, 1, 0) as fit in width. */
static void fstr(char *out, double v, int width) {
    int power = 0;
    for (double val = 1.0; v >= val; val *= 10.0) power++;
    if (power < width - 2) snprintf(out, 32, "%*.2f", width, v);
    else if (power < width - 1) snprintf(out, 32, "%*.1f", width, v);
    else if (power < width + 1) snprintf(out, 32, "%*.0f", width, v);
    else snprintf(out, 32, "%*.1e", width, v);
}

/* Input element i of rank r for check seed s: a small integer, so every sum
 * of n of them is exact in float whatever the order. */
static inline float val(int seed, int r, size_t i) {
    uint32_t x = (uint32_t)(i * 2654435761u) ^ (uint32_t)(seed * 40503u) ^ (uint32_t)(r * 97u);
    x ^= x >> 13;
    return (float)((int)(x % 2001u) - 1000);
}

struct ctx {
    int coll, rank, n;
    size_t count; /* count passed to MPI as in nccl-tests */
    size_t maxbytes; /* -e: the window operations rotate through */
    float *send, *recv;
};

static size_t send_elems(struct ctx *c) { return c->coll == RS ? c->count * c->n : c->count; }
static size_t recv_elems(struct ctx *c) { return c->coll == AG ? c->count * c->n : c->count; }

/* Operation number `iter` of a loop. Like nccl-tests (and hetccl-perf),
 * successive operations use successive windows of the buffers: the window
 * is the operation's larger buffer size, and the buffers hold `maxbytes`,
 * so a small operation does not run on the same cached bytes every time. */
static void op(struct ctx *c, int iter) {
    size_t total = send_elems(c) > recv_elems(c) ? send_elems(c) : recv_elems(c);
    size_t steps = total ? c->maxbytes / (total * sizeof(float)) : 1;
    if (steps < 1) steps = 1;
    size_t shift = total * ((size_t)iter % steps);
    float *send = c->send + shift, *recv = c->recv + shift;
    switch (c->coll) {
    case AR: MPI_Allreduce(send, recv, (int)c->count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD); break;
    case AG: MPI_Allgather(send, (int)c->count, MPI_FLOAT, recv, (int)c->count, MPI_FLOAT, MPI_COMM_WORLD); break;
    case RS: MPI_Reduce_scatter_block(send, recv, (int)c->count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD); break;
    case BC:
        /* out-of-place broadcast, as NCCL's ncclBroadcast(send, recv): the
         * root copies its send buffer into its receive buffer first. */
        if (c->rank == 0) memcpy(recv, send, c->count * sizeof(float));
        MPI_Bcast(recv, (int)c->count, MPI_FLOAT, 0, MPI_COMM_WORLD);
        break;
    }
}

static long check(struct ctx *c, int seed) {
    size_t ns = send_elems(c), nr = recv_elems(c);
    for (size_t i = 0; i < ns; i++) c->send[i] = val(seed, c->rank, i);
    for (size_t i = 0; i < nr; i++) c->recv[i] = -12345.0f;
    op(c, 0);
    long wrong = 0;
    for (size_t i = 0; i < nr; i++) {
        float want = 0.0f;
        switch (c->coll) {
        case AR:
            for (int r = 0; r < c->n; r++) want += val(seed, r, i);
            break;
        case RS:
            for (int r = 0; r < c->n; r++) want += val(seed, r, (size_t)c->rank * c->count + i);
            break;
        case AG: want = val(seed, (int)(i / c->count), i % c->count); break;
        case BC: want = val(seed, 0, i); break;
        }
        if (c->recv[i] != want) wrong++;
    }
    long total = 0;
    MPI_Allreduce(&wrong, &total, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
    return total;
}

static size_t count_for(int coll, size_t bytes, int n) {
    if (coll == AR || coll == BC) return bytes / sizeof(float);
    size_t per = bytes / sizeof(float) / (size_t)n;
    return per / 4 * 4; /* 16-byte multiple of floats */
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    struct ctx c = {0};
    MPI_Comm_rank(MPI_COMM_WORLD, &c.rank);
    MPI_Comm_size(MPI_COMM_WORLD, &c.n);
    size_t minb = 32 << 20, maxb = 32 << 20;
    int factor = 2, iters = 20, warm = 1, checks = 1;
    c.coll = -1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int has = i + 1 < argc;
        if (!strcmp(a, "-b") && has) minb = parse_size(argv[++i]);
        else if (!strcmp(a, "-e") && has) maxb = parse_size(argv[++i]);
        else if (!strcmp(a, "-f") && has) factor = atoi(argv[++i]);
        else if (!strcmp(a, "-n") && has) iters = atoi(argv[++i]);
        else if (!strcmp(a, "-w") && has) warm = atoi(argv[++i]);
        else if (!strcmp(a, "-c") && has) checks = atoi(argv[++i]);
        else {
            for (int k = 0; k < 4; k++)
                if (!strcmp(a, NAMES[k])) c.coll = k;
            if (c.coll < 0) {
                if (c.rank == 0) fprintf(stderr, "mpi_coll: bad argument %s\n", a);
                MPI_Abort(MPI_COMM_WORLD, 64);
            }
        }
    }
    if (c.coll < 0 || factor < 2 || iters < 1 || minb < 1 || maxb < minb) {
        if (c.rank == 0)
            fprintf(stderr, "usage: mpi_coll all_reduce|all_gather|reduce_scatter|broadcast "
                            "[-b MIN] [-e MAX] [-f FACTOR>=2] [-n ITERS] [-w WARMUP] [-c CHECKS]\n");
        MPI_Abort(MPI_COMM_WORLD, 64);
    }
    /* Buffers for the largest size. */
    c.maxbytes = maxb;
    size_t maxcount = count_for(c.coll, maxb, c.n) + 16;
    size_t elems = (c.coll == AG || c.coll == RS) ? maxcount * c.n : maxcount;
    if (posix_memalign((void **)&c.send, 4096, elems * sizeof(float)) ||
        posix_memalign((void **)&c.recv, 4096, elems * sizeof(float))) {
        fprintf(stderr, "mpi_coll: out of memory\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    memset(c.send, 0, elems * sizeof(float));
    memset(c.recv, 0, elems * sizeof(float));

    char ver[MPI_MAX_LIBRARY_VERSION_STRING];
    int vlen = 0;
    MPI_Get_library_version(ver, &vlen);
    char *nl = strchr(ver, '\n');
    if (nl) *nl = 0;
    if (c.rank == 0) {
        printf("# nccl-tests version 2.19.6 (format) mpi_coll lib=%s\n", ver);
        printf("# Collective test starting: %s_perf\n", NAMES[c.coll]);
        printf("# nThread 1 nGpus 1 minBytes %zu maxBytes %zu step: %d(factor) warmup iters: %d "
               "iters: %d agg iters: 1 validation: %d graph: 0 unalign: 0\n",
               minb, maxb, factor, warm, iters, checks);
        printf("#\n# Using devices\n");
    }
    for (int r = 0; r < c.n; r++) {
        if (r == c.rank) {
            char host[64] = "?";
            int hl;
            MPI_Get_processor_name(host, &hl);
            printf("#  Rank %2d Group  0 Pid %6d on %10s device -1 [cpu] host\n", r, (int)getpid(), host);
            fflush(stdout);
        }
        MPI_Barrier(MPI_COMM_WORLD);
    }
    if (c.rank == 0) {
        printf("#\n");
        printf("# %10s  %12s  %8s  %6s  %6s           out-of-place                       in-place          \n",
               "", "", "", "", "");
        printf("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s \n", "size", "count",
               "type", "redop", "root", "time", "algbw", "busbw", "#wrong", "time", "algbw", "busbw", "#wrong");
        printf("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s \n", "(B)", "(elements)",
               "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", "");
        fflush(stdout);
    }
    /* Warm-up: doubling from min to max whatever the factor (as nccl-tests). */
    for (size_t b = minb; b <= maxb; b *= 2) {
        c.count = count_for(c.coll, b, c.n);
        for (int w = 0; w < warm && c.count > 0; w++) op(&c, w);
    }
    MPI_Barrier(MPI_COMM_WORLD);

    long total_wrong = 0;
    double bw_sum = 0;
    int rows = 0;
    int seed = 99;
    for (size_t b = minb; b <= maxb; b *= (size_t)factor) {
        c.count = count_for(c.coll, b, c.n);
        if (c.count == 0) continue;
        op(&c, 0);
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = now();
        for (int it = 0; it < iters; it++) op(&c, it);
        double dt = (now() - t0) / iters, sum = 0;
        MPI_Allreduce(&dt, &sum, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
        double us = sum / c.n * 1e6;
        long wrong = 0;
        for (int k = 0; k < checks; k++) wrong += check(&c, ++seed);
        total_wrong += wrong;
        double bytes = (double)c.count * sizeof(float) * ((c.coll == AG || c.coll == RS) ? c.n : 1);
        double alg = bytes / 1e9 / (us * 1e-6);
        double fac = c.coll == AR ? 2.0 * (c.n - 1) / c.n : (c.coll == BC ? 1.0 : (double)(c.n - 1) / c.n);
        double bus = alg * fac;
        bw_sum += bus;
        rows++;
        if (c.rank == 0) {
            char ts[32], as[32], bs[32];
            fstr(ts, us, 7);
            fstr(as, alg, 6);
            fstr(bs, bus, 6);
            size_t shown = (c.coll == AR || c.coll == BC) ? c.count * 4 : c.count * 4 * c.n;
            printf("%12zu  %12zu  %8s  %6s  %6d  %7s  %6s  %6s  %6ld  %7s  %6s  %6s  %6s\n", shown, c.count, "float",
                   c.coll == AG || c.coll == BC ? "none" : "sum", c.coll == BC ? 0 : -1, ts, as, bs, wrong,
                   "N/A", "N/A", "N/A", "N/A");
            fflush(stdout);
        }
    }
    if (c.rank == 0) {
        printf("# Out of bounds values : %ld %s\n", total_wrong, total_wrong ? "FAILED" : "OK");
        printf("# Avg bus bandwidth    : %g \n", rows ? bw_sum / rows : 0.0);
        printf("#\n# Collective test concluded: %s_perf\n#\n\n", NAMES[c.coll]);
        fflush(stdout);
    }
    free(c.send);
    free(c.recv);
    MPI_Finalize();
    return total_wrong ? 1 : 0;
}
