/* What the multi-process C test programs (coll_check.c, device_check*.c)
 * share: a monotonic clock, settling a nonblocking call, and the report of
 * where the dynamic linker bound their nccl* functions (the harness
 * requires the preloaded hetccl for all). */
#ifndef NCCL_TEST_COMMON_H
#define NCCL_TEST_COMMON_H

#include <dlfcn.h>
#include <nccl.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* Milliseconds on the monotonic clock. */
static inline double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* In nonblocking mode a call may answer ncclInProgress: poll the comm's
 * async error until it is no longer in progress (at most 120 s). */
static inline ncclResult_t nccl_settle(ncclComm_t comm, ncclResult_t rc, int nonblocking) {
  if (!nonblocking || comm == NULL || (rc != ncclInProgress && rc != ncclSuccess)) return rc;
  double deadline = now_ms() + 120e3;
  for (;;) {
    ncclResult_t st = ncclInProgress;
    ncclResult_t r = ncclCommGetAsyncError(comm, &st);
    if (r != ncclSuccess) return r;
    if (st != ncclInProgress) return st;
    if (now_ms() > deadline) return ncclInProgress;
    usleep(50);
  }
}

/* Prints `origin <library>` for the first function, `origin.<name>
 * <library>` for any bound elsewhere, and `origin.all_same 0|1`. */
/* One function: its name and address. */
struct nccl_origin {
  const char* name;
  void* sym;
};

#define NCCL_ORIGIN(f) {#f, (void*)&f}

static inline const char* nccl_origin_of(void* sym) {
  Dl_info info;
  if (sym != NULL && dladdr(sym, &info) != 0 && info.dli_fname != NULL) return info.dli_fname;
  return "?";
}

/* `emit(key, value)` prints one line (newlines in the value flattened). */
static inline void nccl_print_origins(const struct nccl_origin* fns, size_t n,
                                      void (*emit)(const char*, const char*)) {
  const char* first = nccl_origin_of(fns[0].sym);
  int same = 1;
  emit("origin", first);
  for (size_t k = 1; k < n; k++) {
    const char* o = nccl_origin_of(fns[k].sym);
    if (strcmp(o, first) != 0) {
      char key[96];
      snprintf(key, sizeof key, "origin.%s", fns[k].name);
      emit(key, o);
      same = 0;
    }
  }
  printf("origin.all_same %d\n", same);
  fflush(stdout);
}

#endif
