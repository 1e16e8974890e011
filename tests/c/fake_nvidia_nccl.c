/*
 * fake_nvidia_nccl: a stand-in for NVIDIA's libnccl.so.2 as hetccl's
 * HETCCL_NCCL_FALLBACK, for tests/gpu_fake_driver.rs (mode "forward" of
 * tests/c/device_check.c). Compiled against NVIDIA's real nccl.h, so every
 * prototype is NVIDIA's. It keeps no real state beyond what the checks need
 * and appends one line per call to the file named by $FAKE_NCCL_LOG:
 *
 *   uniqueid <hex of the first 16 id bytes>
 *   init nranks <N> rank <R> id <hex of the first 16 id bytes>
 *   winreg rank <R> size <bytes> flags <F>
 *   winptr rank <R>
 *   signal rank <R> peer <P>
 *   windereg rank <R>
 *
 * Communicators and windows carry a magic number; a handle hetccl did not
 * get from this library (its own communicator instead of the mirror, say)
 * fails with ncclInvalidArgument. Linked with -Bsymbolic, so the preloaded
 * hetccl never interposes on its internal calls.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <nccl.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define COMM_MAGIC 0x6e76636f6d6d3031ull /* "nvcomm01" */
#define WIN_MAGIC 0x6e7677696e646f77ull  /* "nvwindow" */

struct ncclComm {
  uint64_t magic;
  int nranks, rank;
};

struct ncclWindow_vidmem {
  uint64_t magic;
  struct ncclComm* comm;
  void* buff;
  size_t size;
};

static void log_line(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
static void log_line(const char* fmt, ...) {
  const char* path = getenv("FAKE_NCCL_LOG");
  if (path == NULL) return;
  char line[512];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(line, sizeof line - 1, fmt, ap);
  va_end(ap);
  if (n < 0) return;
  if ((size_t)n > sizeof line - 2) n = sizeof line - 2;
  line[n++] = '\n';
  int fd = open(path, O_WRONLY | O_APPEND | O_CREAT, 0644);
  if (fd < 0) return;
  ssize_t w = write(fd, line, (size_t)n); /* one write: lines from ranks never interleave */
  (void)w;
  close(fd);
}

static void hex16(const ncclUniqueId* id, char out[33]) {
  for (int i = 0; i < 16; i++) snprintf(out + 2 * i, 3, "%02x", (unsigned char)id->internal[i]);
}

static int comm_ok(ncclComm_t c) { return c != NULL && c->magic == COMM_MAGIC; }
static int win_ok(ncclWindow_t w) { return w != NULL && w->magic == WIN_MAGIC; }

ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  if (id == NULL) return ncclInvalidArgument;
  memset(id, 0, sizeof *id);
  uint64_t v = ((uint64_t)getpid() << 32) ^ (uint64_t)(uintptr_t)id ^ 0x9e3779b97f4a7c15ull;
  memcpy(id->internal, "fakenv", 6);
  memcpy(id->internal + 8, &v, sizeof v);
  char h[33];
  hex16(id, h);
  log_line("uniqueid %s", h);
  return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank) {
  if (comm == NULL || nranks < 1 || rank < 0 || rank >= nranks) return ncclInvalidArgument;
  if (memcmp(id.internal, "fakenv", 6) != 0) return ncclInvalidArgument;
  struct ncclComm* c = calloc(1, sizeof *c);
  if (c == NULL) return ncclSystemError;
  c->magic = COMM_MAGIC;
  c->nranks = nranks;
  c->rank = rank;
  char h[33];
  hex16(&id, h);
  log_line("init nranks %d rank %d id %s", nranks, rank, h);
  *comm = c;
  return ncclSuccess;
}

ncclResult_t ncclCommWindowRegister(ncclComm_t comm, void* buff, size_t size, ncclWindow_t* win,
                                    int winFlags) {
  if (!comm_ok(comm) || win == NULL || buff == NULL) return ncclInvalidArgument;
  struct ncclWindow_vidmem* w = calloc(1, sizeof *w);
  if (w == NULL) return ncclSystemError;
  w->magic = WIN_MAGIC;
  w->comm = comm;
  w->buff = buff;
  w->size = size;
  log_line("winreg rank %d size %zu flags %d", comm->rank, size, winFlags);
  *win = w;
  return ncclSuccess;
}

ncclResult_t ncclWinGetUserPtr(ncclComm_t comm, ncclWindow_t win, void** outUserPtr) {
  if (!comm_ok(comm) || !win_ok(win) || win->comm != comm || outUserPtr == NULL)
    return ncclInvalidArgument;
  log_line("winptr rank %d", comm->rank);
  *outUserPtr = win->buff;
  return ncclSuccess;
}

ncclResult_t ncclSignal(int peer, int sigIdx, int ctx, unsigned int flags, ncclComm_t comm,
                        cudaStream_t stream) {
  (void)sigIdx, (void)ctx, (void)flags, (void)stream;
  if (!comm_ok(comm) || peer < 0 || peer >= comm->nranks) return ncclInvalidArgument;
  log_line("signal rank %d peer %d", comm->rank, peer);
  return ncclSuccess;
}

ncclResult_t ncclCommWindowDeregister(ncclComm_t comm, ncclWindow_t win) {
  if (!comm_ok(comm) || !win_ok(win) || win->comm != comm) return ncclInvalidArgument;
  log_line("windereg rank %d", comm->rank);
  win->magic = 0;
  free(win);
  return ncclSuccess;
}

const char* ncclGetLastError(ncclComm_t comm) {
  (void)comm;
  return "fake NVIDIA NCCL: no error recorded";
}
