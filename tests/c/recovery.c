/*
 * recovery: one process of the shrink-and-grow recovery test
 * (tests/recovery.rs, bench-scripts/recovery).
 *
 *   recovery --rank R --nranks 4 --id PATH --iters K --kill-at J
 *   recovery --joiner --nranks 4 --id PATH --iters K
 *
 * Ranks 0..3 loop AllReduce on their communicator. At iteration J, rank 3
 * records the time and kills itself with SIGKILL. The survivors see the
 * error, shrink with NCCL_SHRINK_ABORT to 3 ranks, and grow back to 4: rank
 * 0 asks the shrunk communicator for a grow id and writes it to PATH.grow;
 * the joiner (a fresh process started with the others) reads it and joins
 * as rank 3. Then all four finish the loop, each result exact. Every
 * process prints `recovery.*` lines; the survivors print the milliseconds
 * from the kill to detection, to the shrunk communicator, and to the first
 * correct AllReduce on the grown one.
 */
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nccl_test_common.h"

static int g_rank = -1;

static void die(const char* what, ncclResult_t rc) {
  fprintf(stderr, "rank %d: %s failed: %d: %s\n", g_rank, what, (int)rc, ncclGetLastError(NULL));
  exit(1);
}

static void write_file(const char* path, const void* data, size_t len) {
  char tmp[4200];
  snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
  FILE* f = fopen(tmp, "wb");
  if (f == NULL || fwrite(data, len, 1, f) != 1 || fclose(f) != 0 || rename(tmp, path) != 0) {
    fprintf(stderr, "rank %d: writing %s failed\n", g_rank, path);
    exit(1);
  }
}

static void read_file(const char* path, void* data, size_t len, double timeout_ms) {
  double deadline = now_ms() + timeout_ms;
  for (;;) {
    FILE* f = fopen(path, "rb");
    if (f != NULL) {
      size_t got = fread(data, len, 1, f);
      fclose(f);
      if (got == 1) return;
    }
    if (now_ms() > deadline) {
      fprintf(stderr, "rank %d: no %s\n", g_rank, path);
      exit(1);
    }
    usleep(500);
  }
}

/* One AllReduce of `count` floats on `comm` of `n` ranks, checked exactly:
 * rank r contributes r + 1 + iteration. Returns the call's code. */
static ncclResult_t step(ncclComm_t comm, int rank, int n, int it, float* a, float* b,
                         size_t count) {
  for (size_t k = 0; k < count; k++) a[k] = (float)(rank + 1 + it);
  ncclResult_t rc = ncclAllReduce(a, b, count, ncclFloat, ncclSum, comm, NULL);
  if (rc != ncclSuccess) return rc;
  float want = (float)(n * (n + 1) / 2 + n * it);
  for (size_t k = 0; k < count; k++)
    if (b[k] != want) {
      fprintf(stderr, "rank %d iteration %d: element %zu is %g, want %g\n", rank, it, k,
              (double)b[k], (double)want);
      exit(2);
    }
  return ncclSuccess;
}

int main(int argc, char** argv) {
  int n = 4, iters = 40, kill_at = 10, joiner = 0;
  const char* id_path = NULL;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--joiner")) joiner = 1;
    else if (i + 1 < argc && !strcmp(argv[i], "--rank")) g_rank = atoi(argv[++i]);
    else if (i + 1 < argc && !strcmp(argv[i], "--nranks")) n = atoi(argv[++i]);
    else if (i + 1 < argc && !strcmp(argv[i], "--id")) id_path = argv[++i];
    else if (i + 1 < argc && !strcmp(argv[i], "--iters")) iters = atoi(argv[++i]);
    else if (i + 1 < argc && !strcmp(argv[i], "--kill-at")) kill_at = atoi(argv[++i]);
  }
  if (id_path == NULL || (!joiner && g_rank < 0)) return 64;
  char grow_path[4200], kill_path[4200];
  snprintf(grow_path, sizeof grow_path, "%s.grow", id_path);
  snprintf(kill_path, sizeof kill_path, "%s.kill", id_path);
  const size_t count = 4096;
  float* a = malloc(count * sizeof(float));
  float* b = malloc(count * sizeof(float));
  ncclResult_t rc;

  if (joiner) {
    g_rank = n - 1;
    ncclUniqueId gid;
    read_file(grow_path, &gid, sizeof gid, 120e3);
    ncclComm_t grown;
    if ((rc = ncclCommGrow(NULL, n, &gid, n - 1, &grown, NULL)) != ncclSuccess) die("ncclCommGrow", rc);
    /* The kill happened before the grow: resume at its iteration. */
    int first = kill_at;
    FILE* f = fopen(kill_path, "rb");
    double killed = 0;
    if (f != NULL) {
      if (fscanf(f, "%lf %d", &killed, &first) != 2) first = kill_at;
      fclose(f);
    }
    for (int it = first; it < iters; it++)
      if ((rc = step(grown, n - 1, n, it, a, b, count)) != ncclSuccess) die("ncclAllReduce (grown)", rc);
    printf("recovery.role joiner\nrecovery.done 1\n");
    ncclCommDestroy(grown);
    return 0;
  }

  ncclUniqueId id;
  if (g_rank == 0) {
    if ((rc = ncclGetUniqueId(&id)) != ncclSuccess) die("ncclGetUniqueId", rc);
    write_file(id_path, &id, sizeof id);
  } else {
    read_file(id_path, &id, sizeof id, 60e3);
  }
  ncclComm_t comm;
  if ((rc = ncclCommInitRank(&comm, n, id, g_rank)) != ncclSuccess) die("ncclCommInitRank", rc);
  int it = 0;
  for (; it < iters; it++) {
    if (g_rank == n - 1 && it == kill_at) {
      char line[64];
      int len = snprintf(line, sizeof line, "%.3f %d\n", now_ms(), it);
      write_file(kill_path, line, (size_t)len);
      raise(SIGKILL);
    }
    rc = step(comm, g_rank, n, it, a, b, count);
    if (rc != ncclSuccess) break;
  }
  if (it == iters) {
    fprintf(stderr, "rank %d: the loop ended without the kill\n", g_rank);
    return 1;
  }
  double detected = now_ms();
  double killed = 0;
  int failed_it = it;
  {
    FILE* f = fopen(kill_path, "rb");
    if (f == NULL || fscanf(f, "%lf", &killed) != 1) {
      fprintf(stderr, "rank %d: AllReduce failed (%d) without the kill\n", g_rank, (int)rc);
      return 1;
    }
    fclose(f);
  }
  int excluded = n - 1;
  ncclComm_t small;
  if ((rc = ncclCommShrink(comm, &excluded, 1, &small, NULL, NCCL_SHRINK_ABORT)) != ncclSuccess)
    die("ncclCommShrink", rc);
  double shrunk = now_ms();
  ncclUniqueId gid;
  ncclComm_t grown;
  if (g_rank == 0) {
    if ((rc = ncclCommGetUniqueId(small, &gid)) != ncclSuccess) die("ncclCommGetUniqueId", rc);
    write_file(grow_path, &gid, sizeof gid);
    rc = ncclCommGrow(small, n, &gid, -1, &grown, NULL);
  } else {
    rc = ncclCommGrow(small, n, NULL, -1, &grown, NULL);
  }
  if (rc != ncclSuccess) die("ncclCommGrow", rc);
  /* The failed iteration runs again on the grown communicator. */
  if ((rc = step(grown, g_rank, n, failed_it, a, b, count)) != ncclSuccess) die("ncclAllReduce (grown)", rc);
  double recovered = now_ms();
  for (it = failed_it + 1; it < iters; it++)
    if ((rc = step(grown, g_rank, n, it, a, b, count)) != ncclSuccess) die("ncclAllReduce (grown)", rc);
  printf("recovery.role survivor\nrecovery.failed_iteration %d\n", failed_it);
  printf("recovery.detect_ms %.1f\nrecovery.shrink_ms %.1f\nrecovery.grow_ms %.1f\n",
         detected - killed, shrunk - detected, recovered - shrunk);
  printf("recovery.total_ms %.1f\nrecovery.done 1\n", recovered - killed);
  ncclCommDestroy(grown);
  ncclCommDestroy(small);
  ncclCommDestroy(comm);
  free(a);
  free(b);
  return 0;
}
