/*
 * Linked against NVIDIA's libnccl.so.2 (real nccl.h), run by
 * tests/interpose.rs once as is and once with LD_PRELOAD=libhetccl.so.
 * Prints `key value` lines; the Rust test decides what they must be.
 *
 * Without a GPU, NVIDIA's library answers ncclGetVersion and the string
 * functions, so the plain run shows NVIDIA's answers and the preloaded run
 * must show hetccl's. Steps that need hetccl (ncclMemAlloc of host memory)
 * are only run when argv[1] is "hetccl", because NVIDIA's library would need
 * a GPU for them.
 */
#define _GNU_SOURCE
#include <nccl.h>

#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

/* Where the dynamic linker bound `sym` for this program. */
static void print_origin(const char* name, void* sym) {
  Dl_info info;
  if (sym != NULL && dladdr(sym, &info) != 0 && info.dli_fname != NULL) {
    printf("origin.%s %s\n", name, info.dli_fname);
  } else {
    printf("origin.%s ?\n", name);
  }
}

static const char* or_null(const char* s) { return s != NULL ? s : "(null)"; }

int main(int argc, char** argv) {
  int hetccl = argc > 1 && strcmp(argv[1], "hetccl") == 0;
  int v = -1;
  ncclResult_t rc;

  printf("header_version %d\n", NCCL_VERSION_CODE);
  print_origin("ncclGetVersion", (void*)&ncclGetVersion);
  print_origin("ncclGetErrorString", (void*)&ncclGetErrorString);
  print_origin("ncclMemAlloc", (void*)&ncclMemAlloc);

  rc = ncclGetVersion(&v);
  printf("getversion.rc %d\n", (int)rc);
  printf("getversion.version %d\n", v);

  printf("errstr.invalid_usage %s\n", or_null(ncclGetErrorString(ncclInvalidUsage)));
  printf("errstr.invalid_argument %s\n", or_null(ncclGetErrorString(ncclInvalidArgument)));
  printf("errstr.internal %s\n", or_null(ncclGetErrorString(ncclInternalError)));
  fflush(stdout);

  if (!hetccl) return 0;

  /* Invalid arguments: each must fail with hetccl's code and leave hetccl's
   * message for ncclGetLastError(NULL). */
  rc = ncclGetVersion(NULL);
  printf("getversion_null.rc %d\n", (int)rc);
  printf("getversion_null.lasterror %s\n", or_null(ncclGetLastError(NULL)));

  void* p = (void*)0x1;
  rc = ncclMemAlloc(&p, 0);
  printf("memalloc0.rc %d\n", (int)rc);
  printf("memalloc0.lasterror %s\n", or_null(ncclGetLastError(NULL)));

  static int not_ours;
  rc = ncclMemFree(&not_ours);
  printf("memfree_foreign.rc %d\n", (int)rc);
  printf("memfree_foreign.lasterror %s\n", or_null(ncclGetLastError(NULL)));

  /* A real allocation: usable host memory. */
  void* buf = NULL;
  rc = ncclMemAlloc(&buf, 4096);
  printf("memalloc4096.rc %d\n", (int)rc);
  printf("memalloc4096.nonnull %d\n", buf != NULL);
  if (rc == ncclSuccess && buf != NULL) {
    unsigned char* b = buf;
    for (int i = 0; i < 4096; i++) b[i] = (unsigned char)(i * 7 + 1);
    int ok = 1;
    for (int i = 0; i < 4096; i++) ok &= b[i] == (unsigned char)(i * 7 + 1);
    printf("memalloc4096.rw %d\n", ok);
    printf("memalloc4096.align4096 %d\n", ((uintptr_t)buf % 4096) == 0);
    rc = ncclMemFree(buf);
    printf("memfree4096.rc %d\n", (int)rc);
    rc = ncclMemFree(buf);
    printf("memfree4096_again.rc %d\n", (int)rc);
  }
  printf("done 1\n");
  return 0;
}
