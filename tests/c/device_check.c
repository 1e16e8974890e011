/*
 * device_check: one rank of a multi-process check of hetccl's CUDA-buffer
 * path (collectives/src/gpu/stream.rs), compiled against NVIDIA's real
 * nccl.h and cuda.h and run by tests/gpu_fake_driver.rs with
 * LD_PRELOAD=libhetccl.so. It uses only the CUDA driver API; the tests run
 * it against the emulated driver of tests/c/fake_cuda.c (no GPU here), and
 * it would run unchanged against a real libcuda.so.1.
 *
 *   device_check --rank R --nranks N --id PATH --mode M[,M...] [--nonblocking]
 *
 * Rank 0 writes the unique id to PATH (atomically); the others poll for it.
 * Before init every rank makes the primary context of device
 * $DEVICE_CHECK_DEVICE (default 0) current, as cudaSetDevice would, so
 * several ranks may share one device. Every buffer the collectives see is
 * cuMemAlloc memory (or ncclMemAlloc / pinned memory where a mode says so),
 * filled with cuMemcpyHtoDAsync on the rank's own stream right before the
 * call and read back with cuMemcpyDtoHAsync right after it, with one
 * cuStreamSynchronize at the end: the results are only right if the call
 * is ordered on that stream. Output buffers are pre-set to 0xCD, and the
 * 64 bytes after each output region must still hold 0xCD afterwards.
 *
 * Modes (each prints mode.<m>.checks and mode.<m>.wrong):
 *   coll       allreduce (float32 sum, int32 max; out of place and in
 *              place), broadcast (root N-1), reduce (root 0), allgather
 *              (out of place and in place), reducescatter, alltoall and a
 *              send/recv ring in a group, for counts 1, 1021, 262147 and
 *              600001
 *   async      rank 0's AllReduce must return before any other rank has
 *              called: it checks cuStreamQuery == CUDA_ERROR_NOT_READY, then
 *              writes PATH.go, which the other ranks wait for before their
 *              call. A call that waited for its peers would time out.
 *   group      an AllReduce on one stream and an AllGather plus a send/recv
 *              ring on a second stream, all in one ncclGroupStart/End
 *   avgpremul  AllReduce with ncclAvg on int32 (and float32 when N is a
 *              power of two, where 1/N is exact), and AllReduce and
 *              ReduceScatter with a PreMulSum op whose host scalar differs
 *              per rank (rank+1), exact
 *   coalesced  an AllReduce and a ReduceScatter on one stream and an
 *              AllGather and a Broadcast on a second, in one group without
 *              sends or receives (hetccl runs such groups call by call, each
 *              through CUDA IPC when it can)
 *   capture    during cuStreamBeginCapture an AllReduce returns
 *              ncclInvalidUsage naming graph capture; after the capture
 *              ends the same call works
 *   memalloc   ncclMemAlloc gives device memory (cuPointerGetAttribute),
 *              usable by an AllReduce; ncclCommCuDevice names the device
 *   pinned     cuMemHostAlloc buffers (pinned host memory) take the same
 *              stream-ordered path
 *   mixed      a host send buffer with a device receive buffer is refused
 *              with ncclInvalidUsage
 *   idle       an AllReduce, 10.5 s without calls (hetccl's GPU proxy thread
 *              ends after 10 s idle), another AllReduce: the second must
 *              still be right (and take the same path; the harness counts)
 *   peerdeath  rank N-1 exits right after init; the others' AllReduce on
 *              device buffers must release their streams (cuStreamSynchronize
 *              returns) and then report ncclRemoteError through both
 *              ncclCommGetAsyncError and the next call, within the timeout;
 *              then they abort the communicator (last mode)
 *   forward    with HETCCL_NCCL_FALLBACK naming tests/c/fake_nvidia_nccl.c:
 *              ncclCommWindowRegister on a device buffer gives a window,
 *              ncclWinGetUserPtr returns the buffer, ncclSignal to the next
 *              rank and ncclCommWindowDeregister succeed (the harness reads
 *              the fallback's call log for the mirror communicator)
 */
#define _GNU_SOURCE
#include <cuda.h>
#include <dlfcn.h>
#include <errno.h>
#include <nccl.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static int g_rank = -1, g_nranks = -1, g_nonblocking;
static const char* g_idpath;
static const char* g_mode = "init";
static long g_checks, g_wrong, m_checks, m_wrong;
static CUstream g_stream, g_stream2;
static int g_device;

#define SENTINEL 0xCD
#define TAIL 64

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static void kv_str(const char* key, const char* v) {
  printf("%s ", key);
  for (const char* p = v ? v : "(null)"; *p; p++) putchar(*p == '\n' ? ' ' : *p);
  putchar('\n');
  fflush(stdout);
}

static void die_nccl(const char* call, ncclResult_t rc, int line) __attribute__((noreturn));
static void die_nccl(const char* call, ncclResult_t rc, int line) {
  printf("nccl_error %d\n", (int)rc);
  kv_str("nccl_error_call", call);
  printf("nccl_error_line %d\n", line);
  kv_str("nccl_last_error", ncclGetLastError(NULL));
  kv_str("nccl_error_mode", g_mode);
  fprintf(stderr, "rank %d: %s failed: %d: %s [mode %s]\n", g_rank, call, (int)rc,
          ncclGetLastError(NULL), g_mode);
  exit(3);
}

static void die_cu(const char* call, CUresult r, int line) __attribute__((noreturn));
static void die_cu(const char* call, CUresult r, int line) {
  const char* name = "?";
  cuGetErrorName(r, &name);
  printf("fatal %s = %s (line %d)\n", call, name, line);
  fprintf(stderr, "rank %d: %s failed: %s (line %d) [mode %s]\n", g_rank, call, name, line, g_mode);
  exit(4);
}

static void die(const char* what) __attribute__((noreturn));
static void die(const char* what) {
  kv_str("fatal", what);
  fprintf(stderr, "rank %d: %s (errno %d) [mode %s]\n", g_rank, what, errno, g_mode);
  exit(4);
}

/* In nonblocking mode a call may answer ncclInProgress: poll to the end. */
static ncclResult_t settle(ncclComm_t comm, ncclResult_t rc) {
  if (!g_nonblocking || comm == NULL || (rc != ncclInProgress && rc != ncclSuccess)) return rc;
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

#define NC(comm, call)                                      \
  do {                                                      \
    ncclResult_t rc_ = settle((comm), (call));              \
    if (rc_ != ncclSuccess) die_nccl(#call, rc_, __LINE__); \
  } while (0)
#define CU(call)                                  \
  do {                                            \
    CUresult r_ = (call);                         \
    if (r_ != CUDA_SUCCESS) die_cu(#call, r_, __LINE__); \
  } while (0)

static void fail(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
static void fail(const char* fmt, ...) {
  m_wrong++;
  g_wrong++;
  if (m_wrong <= 5) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "rank %d MISMATCH [%s] ", g_rank, g_mode);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
  }
}

/* ------------------------------------------------------------ buffers */

/* A device buffer with its pinned host mirror (values in, results out). */
typedef struct {
  CUdeviceptr d;
  unsigned char* h;
  size_t bytes; /* usable bytes; TAIL more are allocated */
} dbuf;

static dbuf dalloc(size_t bytes) {
  dbuf b = {0, NULL, bytes};
  CU(cuMemAlloc(&b.d, bytes + TAIL));
  CU(cuMemHostAlloc((void**)&b.h, bytes + TAIL, 0));
  /* Finished before any stream uses the buffer (the group mode uses a
   * second stream, which this stream does not order). */
  CU(cuMemsetD8Async(b.d, SENTINEL, bytes + TAIL, g_stream));
  CU(cuStreamSynchronize(g_stream));
  return b;
}

static void dfree(dbuf* b) {
  CU(cuMemFree(b->d));
  CU(cuMemFreeHost(b->h));
}

/* Host mirror -> device, on the stream (not synchronised). */
static void upload(dbuf* b, size_t bytes) { CU(cuMemcpyHtoDAsync(b->d, b->h, bytes, g_stream)); }

/* Device -> host mirror (output region plus the tail), on the stream. */
static void download(dbuf* b, size_t off, size_t bytes) {
  size_t n = bytes + TAIL;
  if (off + n > b->bytes + TAIL) n = b->bytes + TAIL - off;
  CU(cuMemcpyDtoHAsync(b->h + off, b->d + off, n, g_stream));
}

static float in_f(int r, size_t i) { return (float)(r * 1000 + (int)(i % 997)); }
static int32_t in_i(int r, size_t i) { return (int32_t)((r * 7919 + (int)i * 31) % 100003) - 50000; }

static void check_f(const char* what, const float* got, size_t n, float (*want)(size_t, void*),
                    void* arg) {
  m_checks++;
  g_checks++;
  for (size_t i = 0; i < n; i++) {
    float w = want(i, arg);
    if (got[i] != w) {
      fail("%s: element %zu is %g, want %g", what, i, (double)got[i], (double)w);
      return;
    }
  }
}

static void check_tail(const char* what, const dbuf* b, size_t end) {
  size_t stop = end + TAIL <= b->bytes + TAIL ? end + TAIL : b->bytes + TAIL;
  for (size_t i = end; i < stop; i++)
    if (b->h[i] != SENTINEL) {
      fail("%s: byte %zu past the output (%zu bytes) was overwritten", what, i - end, end);
      return;
    }
}

static float want_sum(size_t i, void* a) {
  (void)a;
  float s = 0;
  for (int r = 0; r < g_nranks; r++) s += in_f(r, i);
  return s;
}
static float want_rank_i(size_t i, void* a) { return in_f(*(int*)a, i); }
/* Element i of a gathered buffer of n-per-rank blocks. */
static float want_gathered(size_t i, void* a) {
  size_t n = *(size_t*)a;
  return in_f((int)(i / n), i % n);
}
static float want_rs(size_t i, void* a) {
  size_t off = *(size_t*)a;
  return want_sum(off + i, NULL);
}
/* Alltoall: block r of my output came from rank r, its block g_rank. */
static float want_a2a(size_t i, void* a) {
  size_t n = *(size_t*)a;
  int src = (int)(i / n);
  return in_f(src, (size_t)g_rank * n + i % n);
}

static void fill_f(dbuf* b, size_t n, int r, size_t base) {
  float* h = (float*)b->h;
  for (size_t i = 0; i < n; i++) h[i] = in_f(r, base + i);
}

static void sync_stream(CUstream s) { CU(cuStreamSynchronize(s)); }

/* ------------------------------------------------------------ modes */

static void one_allreduce_f(ncclComm_t comm, size_t n, int in_place) {
  dbuf s = dalloc(n * 4), r = dalloc(n * 4);
  dbuf* in = in_place ? &r : &s;
  fill_f(in, n, g_rank, 0);
  upload(in, n * 4);
  NC(comm, ncclAllReduce((void*)in->d, (void*)r.d, n, ncclFloat32, ncclSum, comm, g_stream));
  download(&r, 0, n * 4);
  sync_stream(g_stream);
  check_f(in_place ? "allreduce in place" : "allreduce", (float*)r.h, n, want_sum, NULL);
  check_tail("allreduce", &r, n * 4);
  dfree(&s);
  dfree(&r);
}

static void one_allreduce_max_i(ncclComm_t comm, size_t n) {
  dbuf s = dalloc(n * 4), r = dalloc(n * 4);
  int32_t* h = (int32_t*)s.h;
  for (size_t i = 0; i < n; i++) h[i] = in_i(g_rank, i);
  upload(&s, n * 4);
  NC(comm, ncclAllReduce((void*)s.d, (void*)r.d, n, ncclInt32, ncclMax, comm, g_stream));
  download(&r, 0, n * 4);
  sync_stream(g_stream);
  m_checks++;
  g_checks++;
  for (size_t i = 0; i < n; i++) {
    int32_t w = in_i(0, i);
    for (int k = 1; k < g_nranks; k++)
      if (in_i(k, i) > w) w = in_i(k, i);
    if (((int32_t*)r.h)[i] != w) {
      fail("allreduce max int32: element %zu is %d, want %d", i, ((int32_t*)r.h)[i], w);
      break;
    }
  }
  dfree(&s);
  dfree(&r);
}

static void one_rooted(ncclComm_t comm, size_t n, int reduce) {
  int root = reduce ? 0 : g_nranks - 1;
  dbuf s = dalloc(n * 4), r = dalloc(n * 4);
  fill_f(&s, n, g_rank, 0);
  upload(&s, n * 4);
  if (reduce)
    NC(comm, ncclReduce((void*)s.d, (void*)r.d, n, ncclFloat32, ncclSum, root, comm, g_stream));
  else
    NC(comm, ncclBroadcast((void*)s.d, (void*)r.d, n, ncclFloat32, root, comm, g_stream));
  download(&r, 0, n * 4);
  sync_stream(g_stream);
  if (!reduce)
    check_f("broadcast", (float*)r.h, n, want_rank_i, &root);
  else if (g_rank == root)
    check_f("reduce", (float*)r.h, n, want_sum, NULL);
  if (!reduce || g_rank == root) check_tail(reduce ? "reduce" : "broadcast", &r, n * 4);
  dfree(&s);
  dfree(&r);
}

static void one_allgather(ncclComm_t comm, size_t n, int in_place) {
  size_t total = n * (size_t)g_nranks;
  dbuf s = dalloc(n * 4), r = dalloc(total * 4);
  if (in_place) {
    fill_f(&r, total, 0, 0); /* overwritten below for my block only */
    float* mine = (float*)r.h + (size_t)g_rank * n;
    for (size_t i = 0; i < n; i++) mine[i] = in_f(g_rank, i);
    CU(cuMemcpyHtoDAsync(r.d + (size_t)g_rank * n * 4, mine, n * 4, g_stream));
    NC(comm, ncclAllGather((void*)(r.d + (size_t)g_rank * n * 4), (void*)r.d, n, ncclFloat32, comm,
                           g_stream));
  } else {
    fill_f(&s, n, g_rank, 0);
    upload(&s, n * 4);
    NC(comm, ncclAllGather((void*)s.d, (void*)r.d, n, ncclFloat32, comm, g_stream));
  }
  download(&r, 0, total * 4);
  sync_stream(g_stream);
  check_f(in_place ? "allgather in place" : "allgather", (float*)r.h, total, want_gathered, &n);
  check_tail("allgather", &r, total * 4);
  dfree(&s);
  dfree(&r);
}

static void one_reducescatter(ncclComm_t comm, size_t n) {
  size_t total = n * (size_t)g_nranks, off = (size_t)g_rank * n;
  dbuf s = dalloc(total * 4), r = dalloc(n * 4);
  fill_f(&s, total, g_rank, 0);
  upload(&s, total * 4);
  NC(comm, ncclReduceScatter((void*)s.d, (void*)r.d, n, ncclFloat32, ncclSum, comm, g_stream));
  download(&r, 0, n * 4);
  sync_stream(g_stream);
  check_f("reducescatter", (float*)r.h, n, want_rs, &off);
  check_tail("reducescatter", &r, n * 4);
  dfree(&s);
  dfree(&r);
}

static void one_alltoall(ncclComm_t comm, size_t n) {
  size_t total = n * (size_t)g_nranks;
  dbuf s = dalloc(total * 4), r = dalloc(total * 4);
  fill_f(&s, total, g_rank, 0);
  upload(&s, total * 4);
  NC(comm, ncclAlltoAll((void*)s.d, (void*)r.d, n, ncclFloat32, comm, g_stream));
  download(&r, 0, total * 4);
  sync_stream(g_stream);
  check_f("alltoall", (float*)r.h, total, want_a2a, &n);
  check_tail("alltoall", &r, total * 4);
  dfree(&s);
  dfree(&r);
}

/* A ring: send to rank+1, receive from rank-1, on `st`, inside a group the
 * caller opened (or alone in its own group). */
static void ring_post(ncclComm_t comm, dbuf* s, dbuf* r, size_t n, CUstream st) {
  int next = (g_rank + 1) % g_nranks, prev = (g_rank + g_nranks - 1) % g_nranks;
  NC(comm, ncclRecv((void*)r->d, n, ncclFloat32, prev, comm, st));
  NC(comm, ncclSend((void*)s->d, n, ncclFloat32, next, comm, st));
}

static void one_ring(ncclComm_t comm, size_t n) {
  dbuf s = dalloc(n * 4), r = dalloc(n * 4);
  int prev = (g_rank + g_nranks - 1) % g_nranks;
  fill_f(&s, n, g_rank, 0);
  upload(&s, n * 4);
  NC(comm, ncclGroupStart());
  ring_post(comm, &s, &r, n, g_stream);
  NC(comm, ncclGroupEnd());
  download(&r, 0, n * 4);
  sync_stream(g_stream);
  check_f("send/recv ring", (float*)r.h, n, want_rank_i, &prev);
  check_tail("send/recv ring", &r, n * 4);
  dfree(&s);
  dfree(&r);
}

static void mode_coll(ncclComm_t comm) {
  /* 600001 float32 elements exceed two of hetccl's 1 MiB staging pieces:
   * staged AllReduce, Broadcast and Reduce calls that large are pipelined. */
  const size_t counts[] = {1, 1021, 262147, 600001};
  for (size_t k = 0; k < sizeof counts / sizeof counts[0]; k++) {
    size_t n = counts[k];
    one_allreduce_f(comm, n, 0);
    one_allreduce_f(comm, n, 1);
    one_allreduce_max_i(comm, n);
    one_rooted(comm, n, 0);
    one_rooted(comm, n, 1);
    one_allgather(comm, n, 0);
    one_allgather(comm, n, 1);
    one_reducescatter(comm, n);
    one_alltoall(comm, n);
    one_ring(comm, n);
  }
}

/* Waits (bounded) for a file to exist. */
static void wait_path(const char* p) {
  double deadline = now_ms() + 60e3;
  while (access(p, F_OK) != 0) {
    if (now_ms() > deadline) die("timed out waiting for the go file");
    usleep(1000);
  }
}

static void mode_async(ncclComm_t comm) {
  size_t n = 4099;
  char go[4096];
  snprintf(go, sizeof go, "%s.go", g_idpath);
  dbuf s = dalloc(n * 4), r = dalloc(n * 4);
  fill_f(&s, n, g_rank, 0);
  upload(&s, n * 4);
  sync_stream(g_stream); /* so that only the collective can be pending */
  if (g_rank != 0) wait_path(go);
  double t = now_ms();
  NC(comm, ncclAllReduce((void*)s.d, (void*)r.d, n, ncclFloat32, ncclSum, comm, g_stream));
  printf("async.call_ms %.1f\n", now_ms() - t);
  if (g_rank == 0) {
    m_checks++;
    g_checks++;
    CUresult q = cuStreamQuery(g_stream);
    if (q != CUDA_ERROR_NOT_READY)
      fail("the stream is not pending right after the call (cuStreamQuery = %d), although no "
           "peer has called yet",
           (int)q);
    FILE* f = fopen(go, "w");
    if (f == NULL) die("cannot create the go file");
    fclose(f);
  }
  download(&r, 0, n * 4);
  sync_stream(g_stream);
  check_f("allreduce issued before the peers", (float*)r.h, n, want_sum, NULL);
  dfree(&s);
  dfree(&r);
}

static void mode_group(ncclComm_t comm) {
  size_t n = 70001;
  dbuf a = dalloc(n * 4), ar = dalloc(n * 4), g = dalloc(n * 4),
       gr = dalloc(n * 4 * (size_t)g_nranks), rs = dalloc(n * 4), rr = dalloc(n * 4);
  fill_f(&a, n, g_rank, 0);
  upload(&a, n * 4);
  fill_f(&g, n, g_rank, 0);
  CU(cuMemcpyHtoDAsync(g.d, g.h, n * 4, g_stream2));
  fill_f(&rs, n, g_rank, 0);
  CU(cuMemcpyHtoDAsync(rs.d, rs.h, n * 4, g_stream2));
  NC(comm, ncclGroupStart());
  NC(comm, ncclAllReduce((void*)a.d, (void*)ar.d, n, ncclFloat32, ncclSum, comm, g_stream));
  NC(comm, ncclAllGather((void*)g.d, (void*)gr.d, n, ncclFloat32, comm, g_stream2));
  ring_post(comm, &rs, &rr, n, g_stream2);
  NC(comm, ncclGroupEnd());
  download(&ar, 0, n * 4);
  CU(cuMemcpyDtoHAsync(gr.h, gr.d, n * 4 * (size_t)g_nranks, g_stream2));
  CU(cuMemcpyDtoHAsync(rr.h, rr.d, n * 4, g_stream2));
  sync_stream(g_stream);
  sync_stream(g_stream2);
  int prev = (g_rank + g_nranks - 1) % g_nranks;
  check_f("group allreduce", (float*)ar.h, n, want_sum, NULL);
  check_f("group allgather", (float*)gr.h, n * (size_t)g_nranks, want_gathered, &n);
  check_f("group ring", (float*)rr.h, n, want_rank_i, &prev);
  dfree(&a), dfree(&ar), dfree(&g), dfree(&gr), dfree(&rs), dfree(&rr);
}

static void mode_avgpremul(ncclComm_t comm) {
  size_t n = 30011;
  int pow2 = (g_nranks & (g_nranks - 1)) == 0;
  /* int32 avg: the sum divided by N, truncated toward zero. */
  {
    dbuf sb = dalloc(n * 4), rb = dalloc(n * 4);
    int32_t* h = (int32_t*)sb.h;
    for (size_t i = 0; i < n; i++) h[i] = in_i(g_rank, i);
    upload(&sb, n * 4);
    NC(comm, ncclAllReduce((void*)sb.d, (void*)rb.d, n, ncclInt32, ncclAvg, comm, g_stream));
    download(&rb, 0, n * 4);
    sync_stream(g_stream);
    m_checks++;
    g_checks++;
    for (size_t i = 0; i < n; i++) {
      int64_t sum = 0;
      for (int r = 0; r < g_nranks; r++) sum += in_i(r, i);
      int32_t w = (int32_t)(sum / g_nranks);
      if (((int32_t*)rb.h)[i] != w) {
        fail("allreduce avg int32: element %zu is %d, want %d", i, ((int32_t*)rb.h)[i], w);
        break;
      }
    }
    dfree(&sb);
    dfree(&rb);
  }
  if (pow2) {
    dbuf sb = dalloc(n * 4), rb = dalloc(n * 4);
    fill_f(&sb, n, g_rank, 0);
    upload(&sb, n * 4);
    NC(comm, ncclAllReduce((void*)sb.d, (void*)rb.d, n, ncclFloat32, ncclAvg, comm, g_stream));
    download(&rb, 0, n * 4);
    sync_stream(g_stream);
    m_checks++;
    g_checks++;
    for (size_t i = 0; i < n; i++) {
      float w = want_sum(i, NULL) / (float)g_nranks;
      if (((float*)rb.h)[i] != w) {
        fail("allreduce avg float32: element %zu is %g, want %g", i, (double)((float*)rb.h)[i], (double)w);
        break;
      }
    }
    dfree(&sb);
    dfree(&rb);
  }
  /* PreMulSum with a per-rank host scalar: sum of (r+1) * input_r. */
  float scalar = (float)(g_rank + 1);
  ncclRedOp_t op;
  NC(comm, ncclRedOpCreatePreMulSum(&op, &scalar, ncclFloat32, ncclScalarHostImmediate, comm));
  for (int rs = 0; rs < 2; rs++) {
    size_t total = rs ? n * (size_t)g_nranks : n;
    size_t off = rs ? (size_t)g_rank * n : 0;
    dbuf sb = dalloc(total * 4), rb = dalloc(n * 4);
    fill_f(&sb, total, g_rank, 0);
    upload(&sb, total * 4);
    if (rs)
      NC(comm, ncclReduceScatter((void*)sb.d, (void*)rb.d, n, ncclFloat32, op, comm, g_stream));
    else
      NC(comm, ncclAllReduce((void*)sb.d, (void*)rb.d, n, ncclFloat32, op, comm, g_stream));
    download(&rb, 0, n * 4);
    sync_stream(g_stream);
    m_checks++;
    g_checks++;
    for (size_t i = 0; i < n; i++) {
      float w = 0;
      for (int r = 0; r < g_nranks; r++) w += (float)(r + 1) * in_f(r, off + i);
      if (((float*)rb.h)[i] != w) {
        fail("%s premulsum: element %zu is %g, want %g", rs ? "reducescatter" : "allreduce", i,
             (double)((float*)rb.h)[i], (double)w);
        break;
      }
    }
    dfree(&sb);
    dfree(&rb);
  }
  NC(comm, ncclRedOpDestroy(op, comm));
}

static void mode_coalesced(ncclComm_t comm) {
  size_t n = 40009;
  size_t total = n * (size_t)g_nranks;
  size_t off = (size_t)g_rank * n;
  int root = g_nranks - 1;
  dbuf a = dalloc(n * 4), ar = dalloc(n * 4), rs = dalloc(total * 4), rsr = dalloc(n * 4),
       g = dalloc(n * 4), gr = dalloc(total * 4), bc = dalloc(n * 4), bcr = dalloc(n * 4);
  fill_f(&a, n, g_rank, 0);
  upload(&a, n * 4);
  fill_f(&rs, total, g_rank, 0);
  upload(&rs, total * 4);
  fill_f(&g, n, g_rank, 0);
  CU(cuMemcpyHtoDAsync(g.d, g.h, n * 4, g_stream2));
  fill_f(&bc, n, g_rank, 0);
  CU(cuMemcpyHtoDAsync(bc.d, bc.h, n * 4, g_stream2));
  NC(comm, ncclGroupStart());
  NC(comm, ncclAllReduce((void*)a.d, (void*)ar.d, n, ncclFloat32, ncclSum, comm, g_stream));
  NC(comm, ncclReduceScatter((void*)rs.d, (void*)rsr.d, n, ncclFloat32, ncclSum, comm, g_stream));
  NC(comm, ncclAllGather((void*)g.d, (void*)gr.d, n, ncclFloat32, comm, g_stream2));
  NC(comm, ncclBroadcast((void*)bc.d, (void*)bcr.d, n, ncclFloat32, root, comm, g_stream2));
  NC(comm, ncclGroupEnd());
  download(&ar, 0, n * 4);
  download(&rsr, 0, n * 4);
  CU(cuMemcpyDtoHAsync(gr.h, gr.d, total * 4, g_stream2));
  CU(cuMemcpyDtoHAsync(bcr.h, bcr.d, n * 4, g_stream2));
  sync_stream(g_stream);
  sync_stream(g_stream2);
  check_f("coalesced allreduce", (float*)ar.h, n, want_sum, NULL);
  check_f("coalesced reducescatter", (float*)rsr.h, n, want_rs, &off);
  check_f("coalesced allgather", (float*)gr.h, total, want_gathered, &n);
  check_f("coalesced broadcast", (float*)bcr.h, n, want_rank_i, &root);
  dfree(&a), dfree(&ar), dfree(&rs), dfree(&rsr), dfree(&g), dfree(&gr), dfree(&bc), dfree(&bcr);
}

static void mode_capture(ncclComm_t comm) {
  size_t n = 512;
  dbuf s = dalloc(n * 4), r = dalloc(n * 4);
  fill_f(&s, n, g_rank, 0);
  upload(&s, n * 4);
  sync_stream(g_stream);
  CU(cuStreamBeginCapture(g_stream, CU_STREAM_CAPTURE_MODE_RELAXED));
  ncclResult_t rc = ncclAllReduce((void*)s.d, (void*)r.d, n, ncclFloat32, ncclSum, comm, g_stream);
  const char* msg = ncclGetLastError(comm);
  CUgraph graph = NULL;
  CU(cuStreamEndCapture(g_stream, &graph));
  if (graph != NULL) CU(cuGraphDestroy(graph));
  m_checks++;
  g_checks++;
  if (rc != ncclInvalidUsage) fail("AllReduce during capture returned %d, want ncclInvalidUsage", (int)rc);
  if (msg == NULL || strstr(msg, "graph capture") == NULL)
    fail("ncclGetLastError after the refused capture does not name graph capture: %s", msg ? msg : "(null)");
  printf("capture.rc %d\n", (int)rc);
  kv_str("capture.message", msg);
  NC(comm, ncclAllReduce((void*)s.d, (void*)r.d, n, ncclFloat32, ncclSum, comm, g_stream));
  download(&r, 0, n * 4);
  sync_stream(g_stream);
  check_f("allreduce after the capture", (float*)r.h, n, want_sum, NULL);
  dfree(&s);
  dfree(&r);
}

static void mode_memalloc(ncclComm_t comm) {
  size_t n = 33333;
  void *s = NULL, *r = NULL;
  NC(comm, ncclMemAlloc(&s, n * 4));
  NC(comm, ncclMemAlloc(&r, n * 4));
  unsigned int type = 0;
  CU(cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, (CUdeviceptr)s));
  m_checks++;
  g_checks++;
  if (type != CU_MEMORYTYPE_DEVICE) fail("ncclMemAlloc memory has type %u, want device", type);
  int dev = -1;
  NC(comm, ncclCommCuDevice(comm, &dev));
  printf("memalloc.cudevice %d\n", dev);
  m_checks++;
  g_checks++;
  if (dev != g_device) fail("ncclCommCuDevice = %d, want %d", dev, g_device);
  float* h = NULL;
  CU(cuMemHostAlloc((void**)&h, n * 4, 0));
  for (size_t i = 0; i < n; i++) h[i] = in_f(g_rank, i);
  CU(cuMemcpyHtoDAsync((CUdeviceptr)s, h, n * 4, g_stream));
  NC(comm, ncclAllReduce(s, r, n, ncclFloat32, ncclSum, comm, g_stream));
  CU(cuMemcpyDtoHAsync(h, (CUdeviceptr)r, n * 4, g_stream));
  sync_stream(g_stream);
  check_f("allreduce on ncclMemAlloc memory", h, n, want_sum, NULL);
  CU(cuMemFreeHost(h));
  NC(comm, ncclMemFree(s));
  NC(comm, ncclMemFree(r));
}

static void mode_pinned(ncclComm_t comm) {
  size_t n = 12345;
  float *s = NULL, *r = NULL;
  CU(cuMemHostAlloc((void**)&s, n * 4, 0));
  CU(cuMemHostAlloc((void**)&r, n * 4, 0));
  for (size_t i = 0; i < n; i++) s[i] = in_f(g_rank, i), r[i] = -1;
  NC(comm, ncclAllReduce(s, r, n, ncclFloat32, ncclSum, comm, g_stream));
  sync_stream(g_stream);
  check_f("allreduce on pinned host memory", r, n, want_sum, NULL);
  CU(cuMemFreeHost(s));
  CU(cuMemFreeHost(r));
}

static void mode_mixed(ncclComm_t comm) {
  size_t n = 256;
  float* host = calloc(n, 4);
  dbuf r = dalloc(n * 4);
  ncclResult_t rc = ncclAllReduce(host, (void*)r.d, n, ncclFloat32, ncclSum, comm, g_stream);
  m_checks++;
  g_checks++;
  if (rc != ncclInvalidUsage) fail("host send with device recv returned %d, want ncclInvalidUsage", (int)rc);
  kv_str("mixed.message", ncclGetLastError(comm));
  sync_stream(g_stream);
  free(host);
  dfree(&r);
}

static void mode_idle(ncclComm_t comm) {
  one_allreduce_f(comm, 5003, 0);
  usleep(10500 * 1000);
  one_allreduce_f(comm, 5003, 1);
}

/* Returns 1 when the communicator was aborted (no teardown). */
static int mode_peerdeath(ncclComm_t comm) {
  if (g_rank == g_nranks - 1) {
    printf("mode.peerdeath.checks 0\nmode.peerdeath.wrong 0\nchecks %ld\nwrong_total %ld\ndone 1\n",
           g_checks, g_wrong);
    fflush(stdout);
    _exit(0); /* dead without a word: no finalize, no abort */
  }
  size_t n = 70001;
  dbuf s = dalloc(n * 4), r = dalloc(n * 4);
  fill_f(&s, n, g_rank, 0);
  upload(&s, n * 4);
  double t = now_ms();
  ncclResult_t rc = ncclAllReduce((void*)s.d, (void*)r.d, n, ncclFloat32, ncclSum, comm, g_stream);
  CUresult q = cuStreamSynchronize(g_stream);
  ncclResult_t st = ncclSuccess;
  ncclResult_t arc = ncclCommGetAsyncError(comm, &st);
  ncclResult_t again = ncclAllReduce((void*)s.d, (void*)r.d, n, ncclFloat32, ncclSum, comm, g_stream);
  printf("peerdeath.call_rc %d\npeerdeath.sync %d\npeerdeath.async %d\npeerdeath.again %d\npeerdeath.ms %.0f\n",
         (int)rc, (int)q, (int)st, (int)again, now_ms() - t);
  kv_str("peerdeath.last_error", ncclGetLastError(comm));
  m_checks++;
  g_checks++;
  if (q != CUDA_SUCCESS) fail("cuStreamSynchronize after the failed call returned %d", (int)q);
  if (arc != ncclSuccess) fail("ncclCommGetAsyncError returned %d", (int)arc);
  /* The call itself may succeed (it only enqueues); once the stream is
   * released, the failure must be visible. */
  if (rc != ncclSuccess && rc != ncclRemoteError) fail("the call returned %d", (int)rc);
  if (st != ncclRemoteError) fail("ncclCommGetAsyncError after the stream: %d, want 6", (int)st);
  if (again != ncclRemoteError) fail("the next call returned %d, want 6", (int)again);
  sync_stream(g_stream);
  dfree(&s);
  dfree(&r);
  NC(NULL, ncclCommAbort(comm));
  return 1;
}

static void mode_forward(ncclComm_t comm) {
  dbuf b = dalloc(4096);
  ncclWindow_t win = NULL;
  NC(comm, ncclCommWindowRegister(comm, (void*)b.d, 4096, &win, 0));
  void* user = NULL;
  NC(comm, ncclWinGetUserPtr(comm, win, &user));
  m_checks++;
  g_checks++;
  if (win == NULL) fail("ncclCommWindowRegister gave a NULL window");
  if (user != (void*)b.d) fail("ncclWinGetUserPtr = %p, want %p", user, (void*)b.d);
  NC(comm, ncclSignal((g_rank + 1) % g_nranks, 0, 0, 0, comm, g_stream));
  NC(comm, ncclCommWindowDeregister(comm, win));
  sync_stream(g_stream);
  dfree(&b);
}

/* ------------------------------------------------------------ main */

static const char* origin_of(void* sym) {
  Dl_info info;
  if (sym != NULL && dladdr(sym, &info) != 0 && info.dli_fname != NULL) return info.dli_fname;
  return "?";
}

/* Where the nccl* functions this program calls were bound (the harness
 * requires the preloaded hetccl for all). */
static void print_origins(void) {
#define ORIGIN(f) {#f, (void*)&f}
  struct {
    const char* name;
    void* sym;
  } fns[] = {
      ORIGIN(ncclGetUniqueId), ORIGIN(ncclCommInitRank), ORIGIN(ncclCommInitRankConfig),
      ORIGIN(ncclAllReduce),   ORIGIN(ncclBroadcast),    ORIGIN(ncclReduce),
      ORIGIN(ncclAllGather),   ORIGIN(ncclReduceScatter), ORIGIN(ncclAlltoAll),
      ORIGIN(ncclSend),        ORIGIN(ncclRecv),         ORIGIN(ncclGroupStart),
      ORIGIN(ncclGroupEnd),    ORIGIN(ncclMemAlloc),     ORIGIN(ncclMemFree),
      ORIGIN(ncclCommCuDevice), ORIGIN(ncclGetLastError), ORIGIN(ncclCommDestroy),
      ORIGIN(ncclCommWindowRegister), ORIGIN(ncclWinGetUserPtr), ORIGIN(ncclSignal),
      ORIGIN(ncclCommWindowDeregister), ORIGIN(ncclRedOpCreatePreMulSum), ORIGIN(ncclRedOpDestroy),
  };
#undef ORIGIN
  const char* first = origin_of(fns[0].sym);
  int same = 1;
  kv_str("origin", first);
  for (size_t k = 1; k < sizeof fns / sizeof fns[0]; k++) {
    const char* o = origin_of(fns[k].sym);
    if (strcmp(o, first) != 0) {
      char key[96];
      snprintf(key, sizeof key, "origin.%s", fns[k].name);
      kv_str(key, o);
      same = 0;
    }
  }
  printf("origin.all_same %d\n", same);
}

static void exchange_id(ncclUniqueId* id) {
  if (g_rank == 0) {
    NC(NULL, ncclGetUniqueId(id));
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", g_idpath, (int)getpid());
    FILE* f = fopen(tmp, "wb");
    if (f == NULL || fwrite(id, sizeof *id, 1, f) != 1 || fclose(f) != 0) die("writing the id");
    if (rename(tmp, g_idpath) != 0) die("renaming the id file");
    return;
  }
  double deadline = now_ms() + 60e3;
  for (;;) {
    FILE* f = fopen(g_idpath, "rb");
    if (f != NULL) {
      size_t got = fread(id, sizeof *id, 1, f);
      fclose(f);
      if (got == 1) return;
    }
    if (now_ms() > deadline) die("timed out waiting for rank 0's unique id");
    usleep(2000);
  }
}

static void usage(void) {
  fprintf(stderr, "usage: device_check --rank R --nranks N --id PATH --mode M[,M...] [--nonblocking]\n");
  exit(2);
}

int main(int argc, char** argv) {
  const char* modes = NULL;
  for (int i = 1; i < argc; i++) {
    const char* a = argv[i];
    if (!strcmp(a, "--nonblocking")) {
      g_nonblocking = 1;
      continue;
    }
    if (i + 1 >= argc) usage();
    const char* v = argv[++i];
    if (!strcmp(a, "--rank")) g_rank = atoi(v);
    else if (!strcmp(a, "--nranks")) g_nranks = atoi(v);
    else if (!strcmp(a, "--id")) g_idpath = v;
    else if (!strcmp(a, "--mode")) modes = v;
    else usage();
  }
  if (g_rank < 0 || g_nranks < 1 || g_rank >= g_nranks || !g_idpath || !modes) usage();
  const char* dv = getenv("DEVICE_CHECK_DEVICE");
  g_device = dv ? atoi(dv) : 0;
  printf("rank %d\nnranks %d\ndevice %d\n", g_rank, g_nranks, g_device);
  print_origins();

  CUcontext ctx = NULL;
  CUdevice dev = 0;
  CU(cuInit(0));
  CU(cuDeviceGet(&dev, g_device));
  CU(cuDevicePrimaryCtxRetain(&ctx, dev));
  CU(cuCtxSetCurrent(ctx));
  CU(cuStreamCreate(&g_stream, CU_STREAM_NON_BLOCKING));
  CU(cuStreamCreate(&g_stream2, CU_STREAM_NON_BLOCKING));

  ncclUniqueId id;
  exchange_id(&id);
  ncclComm_t comm = NULL;
  if (g_nonblocking) {
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    ncclResult_t rc = ncclCommInitRankConfig(&comm, g_nranks, id, g_rank, &cfg);
    if (comm == NULL) die_nccl("ncclCommInitRankConfig (comm is NULL)", rc, __LINE__);
    NC(comm, rc);
  } else {
    NC(NULL, ncclCommInitRank(&comm, g_nranks, id, g_rank));
  }

  char list[1024];
  snprintf(list, sizeof list, "%s", modes);
  char* save = NULL;
  int aborted = 0;
  for (char* m = strtok_r(list, ",", &save); m && !aborted; m = strtok_r(NULL, ",", &save)) {
    g_mode = m;
    m_checks = m_wrong = 0;
    fprintf(stderr, "rank %d begin %s\n", g_rank, m);
    if (!strcmp(m, "coll")) mode_coll(comm);
    else if (!strcmp(m, "async")) mode_async(comm);
    else if (!strcmp(m, "group")) mode_group(comm);
    else if (!strcmp(m, "coalesced")) mode_coalesced(comm);
    else if (!strcmp(m, "avgpremul")) mode_avgpremul(comm);
    else if (!strcmp(m, "capture")) mode_capture(comm);
    else if (!strcmp(m, "memalloc")) mode_memalloc(comm);
    else if (!strcmp(m, "pinned")) mode_pinned(comm);
    else if (!strcmp(m, "mixed")) mode_mixed(comm);
    else if (!strcmp(m, "forward")) mode_forward(comm);
    else if (!strcmp(m, "idle")) mode_idle(comm);
    else if (!strcmp(m, "peerdeath")) aborted = mode_peerdeath(comm);
    else {
      fprintf(stderr, "unknown mode %s\n", m);
      exit(2);
    }
    printf("mode.%s.checks %ld\nmode.%s.wrong %ld\n", m, m_checks, m, m_wrong);
    fflush(stdout);
  }

  g_mode = "teardown";
  if (!aborted) {
    NC(comm, ncclCommFinalize(comm));
    NC(NULL, ncclCommDestroy(comm));
  }
  CU(cuStreamDestroy(g_stream));
  CU(cuStreamDestroy(g_stream2));
  printf("checks %ld\nwrong_total %ld\ndone 1\n", g_checks, g_wrong);
  fflush(stdout);
  return g_wrong == 0 ? 0 : 1;
}
