/*
 * Run by tests/unmap_hook.rs with and without LD_PRELOAD=libhetccl.so.
 * Prints `key value` lines: where munmap/mremap bound, and what they
 * returned (values and errno) on good and bad arguments, so that the test
 * can check the preloaded hooks behave as libc's.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static void origin(const char* name) {
  Dl_info info;
  void* sym = dlsym(RTLD_DEFAULT, name);
  if (sym != NULL && dladdr(sym, &info) != 0 && info.dli_fname != NULL) {
    printf("origin.%s %s\n", name, info.dli_fname);
  } else {
    printf("origin.%s ?\n", name);
  }
}

int main(void) {
  long page = sysconf(_SC_PAGESIZE);
  origin("munmap");
  origin("mremap");

  char* p = mmap(NULL, 4 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return 2;
  memset(p, 7, 4 * page);
  printf("munmap.middle %d\n", munmap(p + page, page));
  /* The rest is still mapped and intact. */
  printf("intact %d\n", p[0] == 7 && p[2 * page] == 7);
  errno = 0;
  int rc = munmap(p + 1, page);
  printf("munmap.unaligned %d %d\n", rc, errno == EINVAL);

  /* Grow the last two pages (may move), then check the contents. */
  char* q = mremap(p + 2 * page, 2 * page, 8 * page, MREMAP_MAYMOVE);
  printf("mremap.ok %d\n", q != MAP_FAILED && q[0] == 7 && q[2 * page - 1] == 7);
  errno = 0;
  void* bad = mremap(p + 1, page, 2 * page, 0);
  printf("mremap.bad %d %d\n", bad == MAP_FAILED, errno == EINVAL);
  printf("munmap.rest %d %d\n", munmap(p, page), munmap(q, 8 * page));

  /* malloc and free of large blocks (mmap'd by the allocator) still work. */
  for (int i = 0; i < 64; i++) {
    char* m = malloc((size_t)(1 + i) << 20);
    if (m == NULL) return 3;
    m[0] = 1;
    free(m);
  }
  printf("malloc ok\n");
  return 0;
}
