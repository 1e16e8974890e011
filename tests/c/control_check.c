/*
 * control_check: one rank of the control API tests (tests/control_mp.rs).
 * Every AllReduce is checked exactly; hetccl's own functions are found with
 * dlsym (the program links NVIDIA's libnccl.so.2, hetccl is preloaded).
 *
 *   control_check --rank R --nranks N --id PATH --mode MODE [--count C]
 *                 [--iters K] [--set-tune]
 *
 * Modes:
 *   set       K AllReduces in each phase; between phases every rank sets
 *             algo.allreduce=tree, algo.allreduce=ring, algo=direct,
 *             algo.allreduce=default, algo=default (phases 0..5), printing
 *             `phase.P.get <value>` after each; then compress, tune and
 *             chunk_bytes (with a large ring AllReduce under 64K chunks).
 *   mismatch  rank 0 sets algo.allreduce=ring, the others tree: prints
 *             `mismatch.rc` and `mismatch.error`; then every rank sets
 *             algo.allreduce=rung (`bad.rc`); then one checked AllReduce.
 *   online    K AllReduces (with --set-tune, every rank first sets
 *             tune=online); prints `online.first_ms` and `online.second_ms`,
 *             the time of each half of the loop.
 * Always prints `wrong <n>` and `done 1` at the end.
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hetccl.h"
#include "nccl_test_common.h"

static __typeof__(&hetcclCommSetOption) set_opt;
static __typeof__(&hetcclCommGetOption) get_opt;

static int rank, nranks;
static size_t count = 16384;
static long wrong;
static int calls;

static void die(const char* what, ncclResult_t rc) {
  printf("fatal %s: rc %d: %s\n", what, (int)rc, ncclGetLastError(NULL));
  fflush(stdout);
  exit(1);
}

/* One AllReduce of `n` floats, checked exactly. */
static void allreduce(ncclComm_t comm, size_t n) {
  float* s = calloc(n, sizeof(float));
  float* r = calloc(n, sizeof(float));
  for (size_t i = 0; i < n; i++) s[i] = (float)((rank + 1) * ((i + calls) % 5 + 1));
  ncclResult_t rc = ncclAllReduce(s, r, n, ncclFloat, ncclSum, comm, NULL);
  if (rc != ncclSuccess) die("allreduce", rc);
  float tri = (float)(nranks * (nranks + 1) / 2);
  for (size_t i = 0; i < n; i++) {
    if (r[i] != tri * (float)((i + calls) % 5 + 1)) wrong++;
  }
  calls++;
  free(s);
  free(r);
}

static void set_ok(ncclComm_t comm, const char* k, const char* v) {
  ncclResult_t rc = set_opt(comm, k, v);
  if (rc != ncclSuccess) die(k, rc);
}

static void print_get(ncclComm_t comm, const char* label, const char* k) {
  char buf[256];
  size_t need = 0;
  ncclResult_t rc = get_opt(comm, k, buf, sizeof buf, &need);
  if (rc != ncclSuccess) die("get", rc);
  printf("%s %s\n", label, buf);
  /* snprintf-style: a 2-byte buffer holds one character and the NUL. */
  char small[2] = {'x', 'x'};
  size_t need2 = 0;
  rc = get_opt(comm, k, small, sizeof small, &need2);
  if (rc != ncclSuccess || need2 != strlen(buf) || need != strlen(buf) || small[1] != 0 ||
      small[0] != buf[0]) {
    printf("get.truncation_wrong %s\n", k);
    wrong++;
  }
}

static void mode_set(ncclComm_t comm, int iters) {
  static const char* phases[][2] = {
      {NULL, NULL},
      {"algo.allreduce", "tree"},
      {"algo.allreduce", "ring"},
      {"algo", "direct"},
      {"algo.allreduce", "default"},
      {"algo", "default"},
  };
  for (int p = 0; p < 6; p++) {
    if (phases[p][0] != NULL) {
      set_ok(comm, phases[p][0], phases[p][1]);
      char label[64];
      snprintf(label, sizeof label, "phase.%d.get", p);
      print_get(comm, label, phases[p][0]);
    }
    for (int i = 0; i < iters; i++) allreduce(comm, count);
  }
  printf("set.calls_per_phase %d\n", iters);
  set_ok(comm, "compress", "bf16");
  print_get(comm, "get.compress", "compress");
  set_ok(comm, "compress", "off");
  print_get(comm, "get.tune", "tune");
  set_ok(comm, "algo.allreduce", "ring");
  set_ok(comm, "chunk_bytes", "64K");
  print_get(comm, "get.chunk_bytes", "chunk_bytes");
  allreduce(comm, 300007);
  set_ok(comm, "chunk_bytes", "default");
  print_get(comm, "get.chunk_default", "chunk_bytes");
  allreduce(comm, 300007);
}

static void mode_mismatch(ncclComm_t comm) {
  ncclResult_t rc = set_opt(comm, "algo.allreduce", rank == 0 ? "ring" : "tree");
  printf("mismatch.rc %d\n", (int)rc);
  printf("mismatch.error %s\n", ncclGetLastError(NULL));
  print_get(comm, "mismatch.get", "algo.allreduce");
  rc = set_opt(comm, "algo.allreduce", "rung");
  printf("bad.rc %d\n", (int)rc);
  printf("bad.error %s\n", ncclGetLastError(NULL));
  allreduce(comm, count);
}

static void mode_online(ncclComm_t comm, int iters, int set_tune) {
  if (set_tune) set_ok(comm, "tune", "online");
  print_get(comm, "online.tune", "tune");
  double t0 = now_ms(), mid = t0;
  for (int i = 0; i < iters; i++) {
    if (i == iters / 2) mid = now_ms();
    allreduce(comm, count);
  }
  double end = now_ms();
  printf("online.first_ms %.1f\nonline.second_ms %.1f\n", mid - t0, end - mid);
}

int main(int argc, char** argv) {
  int iters = 3, set_tune = 0;
  const char* path = NULL;
  const char* mode = "set";
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--set-tune")) { set_tune = 1; continue; }
    if (i + 1 >= argc) break;
    if (!strcmp(argv[i], "--rank")) rank = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--nranks")) nranks = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--id")) path = argv[++i];
    else if (!strcmp(argv[i], "--mode")) mode = argv[++i];
    else if (!strcmp(argv[i], "--count")) count = strtoul(argv[++i], NULL, 10);
    else if (!strcmp(argv[i], "--iters")) iters = atoi(argv[++i]);
  }
  if (path == NULL || nranks < 1) return 2;
  set_opt = (__typeof__(set_opt))dlsym(RTLD_DEFAULT, "hetcclCommSetOption");
  get_opt = (__typeof__(get_opt))dlsym(RTLD_DEFAULT, "hetcclCommGetOption");
  if (set_opt == NULL || get_opt == NULL) {
    printf("fatal hetcclCommSetOption/GetOption not found\n");
    return 1;
  }
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
  ncclResult_t rc = ncclCommInitRank(&comm, nranks, id, rank);
  if (rc != ncclSuccess) die("init", rc);
  if (!strcmp(mode, "set")) mode_set(comm, iters);
  else if (!strcmp(mode, "mismatch")) mode_mismatch(comm);
  else if (!strcmp(mode, "online")) mode_online(comm, iters, set_tune);
  else {
    printf("fatal unknown mode %s\n", mode);
    return 2;
  }
  rc = ncclCommDestroy(comm);
  if (rc != ncclSuccess) die("destroy", rc);
  printf("wrong %ld\ndone 1\n", wrong);
  fflush(stdout);
  return 0;
}
