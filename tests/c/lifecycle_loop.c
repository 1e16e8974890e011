/*
 * lifecycle_loop: one rank of a loop of communicator lifetimes, each
 * init -> one AllReduce -> (ncclCommFinalize on odd iterations) -> destroy,
 * with no barrier between a rank's AllReduce and its destroy, so that a
 * rank that finishes first tears its links down while its peers are still
 * inside the same AllReduce (tests/shutdown_loop.rs).
 *
 *   lifecycle_loop --rank R --nranks N --id PATH --iters K --counts a,b
 *
 * Iteration i uses the unique id in PATH.<i> (rank 0 writes it: temporary
 * name, then rename) and the float count counts[i % ncounts]. Every rank
 * checks its result exactly. Prints `lifecycle.iters K`, `origin ...`
 * (where the nccl* functions were bound) and `done 1`; on a failure, the
 * iteration, the call and ncclGetLastError on stderr, and exit status 1.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nccl_test_common.h"

static int g_rank, g_nranks;

static void emit(const char* k, const char* v) { printf("%s %s\n", k, v); }

static void fail(int it, const char* call, ncclResult_t rc) {
  fprintf(stderr, "rank %d iteration %d: %s failed: %d (%s): %s\n", g_rank, it, call, (int)rc,
          ncclGetErrorString(rc), ncclGetLastError(NULL));
  printf("lifecycle.failed_iteration %d\n", it);
  exit(1);
}

static void share_id(const char* base, int it, ncclUniqueId* id) {
  char path[4096], tmp[4200];
  snprintf(path, sizeof path, "%s.%d", base, it);
  if (g_rank == 0) {
    ncclResult_t rc = ncclGetUniqueId(id);
    if (rc != ncclSuccess) fail(it, "ncclGetUniqueId", rc);
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
    FILE* f = fopen(tmp, "wb");
    if (f == NULL || fwrite(id, sizeof *id, 1, f) != 1 || fclose(f) != 0 || rename(tmp, path)) {
      fprintf(stderr, "rank 0: writing %s: %s\n", path, strerror(errno));
      exit(1);
    }
    return;
  }
  double deadline = now_ms() + 60e3;
  for (;;) {
    FILE* f = fopen(path, "rb");
    if (f != NULL) {
      size_t got = fread(id, sizeof *id, 1, f);
      fclose(f);
      if (got == 1) return;
    }
    if (now_ms() > deadline) {
      fprintf(stderr, "rank %d: no unique id in %s\n", g_rank, path);
      exit(1);
    }
    usleep(200);
  }
}

int main(int argc, char** argv) {
  const char* idpath = NULL;
  const char* counts_arg = "65536";
  int iters = 1;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "--rank")) g_rank = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--nranks")) g_nranks = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--id")) idpath = argv[i + 1];
    else if (!strcmp(argv[i], "--iters")) iters = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--counts")) counts_arg = argv[i + 1];
  }
  if (idpath == NULL || g_nranks < 1 || iters < 1) {
    fprintf(stderr, "usage: lifecycle_loop --rank R --nranks N --id PATH --iters K --counts a,b\n");
    return 2;
  }
  size_t counts[16], ncounts = 0, max = 0;
  for (const char* p = counts_arg; *p && ncounts < 16; p = strchr(p, ',') ? strchr(p, ',') + 1 : "") {
    counts[ncounts] = strtoul(p, NULL, 10);
    if (counts[ncounts] > max) max = counts[ncounts];
    ncounts++;
  }
  struct nccl_origin fns[] = {NCCL_ORIGIN(ncclGetUniqueId), NCCL_ORIGIN(ncclCommInitRank),
                              NCCL_ORIGIN(ncclAllReduce), NCCL_ORIGIN(ncclCommFinalize),
                              NCCL_ORIGIN(ncclCommDestroy)};
  nccl_print_origins(fns, sizeof fns / sizeof fns[0], emit);
  float* in = malloc(max * sizeof(float) + 1);
  float* out = malloc(max * sizeof(float) + 1);
  if (in == NULL || out == NULL) return 1;
  for (int it = 0; it < iters; it++) {
    size_t count = counts[it % ncounts];
    ncclUniqueId id;
    share_id(idpath, it, &id);
    ncclComm_t comm;
    ncclResult_t rc = ncclCommInitRank(&comm, g_nranks, id, g_rank);
    if (rc != ncclSuccess) fail(it, "ncclCommInitRank", rc);
    for (size_t k = 0; k < count; k++) in[k] = (float)(g_rank + 1 + (k % 7));
    rc = ncclAllReduce(in, out, count, ncclFloat, ncclSum, comm, NULL);
    if (rc != ncclSuccess) fail(it, "ncclAllReduce", rc);
    if (it % 2 == 1) {
      rc = ncclCommFinalize(comm);
      if (rc != ncclSuccess) fail(it, "ncclCommFinalize", rc);
    }
    rc = ncclCommDestroy(comm);
    if (rc != ncclSuccess) fail(it, "ncclCommDestroy", rc);
    for (size_t k = 0; k < count; k++) {
      float want = (float)(g_nranks * (g_nranks + 1) / 2 + g_nranks * (int)(k % 7));
      if (out[k] != want) {
        fprintf(stderr, "rank %d iteration %d: element %zu is %g, want %g\n", g_rank, it, k,
                (double)out[k], (double)want);
        return 1;
      }
    }
  }
  printf("lifecycle.iters %d\ndone 1\n", iters);
  free(in);
  free(out);
  return 0;
}
