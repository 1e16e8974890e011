/* Where the dynamic linker bound a test program's nccl* functions (shared
 * by coll_check.c and device_check*.c; the harness requires the preloaded
 * hetccl for all). Prints `origin <library>` for the first function,
 * `origin.<name> <library>` for any bound elsewhere, and
 * `origin.all_same 0|1`. */
#ifndef NCCL_ORIGINS_H
#define NCCL_ORIGINS_H

#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

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
