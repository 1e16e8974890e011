/*
 * stall_check: one rank of a stall-limit check (tests/stall_limit.rs).
 * Rank N-1 joins the communicator, runs the warm-up calls, then never joins
 * the next AllReduce: it sleeps for --idle seconds and exits. Every other
 * rank runs that AllReduce of --count floats and prints how long it took to
 * fail: `stall.rc <code>` and `stall.ms <milliseconds>`.
 *
 *   stall_check --rank R --nranks N --id PATH --count C [--warmup K] [--idle S]
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nccl_test_common.h"

int main(int argc, char** argv) {
  int rank = 0, n = 0, warmup = 0, idle = 10;
  size_t count = 1;
  const char* path = NULL;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "--rank")) rank = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--nranks")) n = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--id")) path = argv[i + 1];
    else if (!strcmp(argv[i], "--count")) count = strtoul(argv[i + 1], NULL, 10);
    else if (!strcmp(argv[i], "--warmup")) warmup = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--idle")) idle = atoi(argv[i + 1]);
  }
  if (path == NULL || n < 2) return 2;
  ncclUniqueId id;
  if (rank == 0) {
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE* f = fopen(tmp, "wb");
    if (ncclGetUniqueId(&id) != ncclSuccess || f == NULL || fwrite(&id, sizeof id, 1, f) != 1) return 1;
    fclose(f);
    rename(tmp, path);
  } else {
    double deadline = now_ms() + 60e3;
    FILE* f;
    while ((f = fopen(path, "rb")) == NULL || fread(&id, sizeof id, 1, f) != 1) {
      if (f != NULL) fclose(f);
      if (now_ms() > deadline) return 1;
      usleep(1000);
    }
    fclose(f);
  }
  ncclComm_t comm;
  if (ncclCommInitRank(&comm, n, id, rank) != ncclSuccess) {
    fprintf(stderr, "rank %d: init: %s\n", rank, ncclGetLastError(NULL));
    return 1;
  }
  float* buf = calloc(count, sizeof(float));
  for (int w = 0; w < warmup; w++) {
    ncclResult_t rc = ncclAllReduce(buf, buf, count, ncclFloat, ncclSum, comm, NULL);
    if (rc != ncclSuccess) {
      fprintf(stderr, "rank %d: warm-up: %s\n", rank, ncclGetLastError(NULL));
      return 1;
    }
  }
  if (rank == n - 1) {
    sleep(idle);
    printf("done 1\n");
    return 0;
  }
  double t0 = now_ms();
  ncclResult_t rc = ncclAllReduce(buf, buf, count, ncclFloat, ncclSum, comm, NULL);
  printf("stall.rc %d\nstall.ms %.0f\n", (int)rc, now_ms() - t0);
  printf("stall.error %s\n", ncclGetLastError(NULL));
  ncclCommAbort(comm);
  printf("done 1\n");
  return 0;
}
