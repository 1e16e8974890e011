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
 * The modes live in device_check_colls.c (the collectives) and
 * device_check_features.c (the API around them); device_check.h declares
 * what they share.
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
 *   sendrecv   one group of sends and receives between every ordered pair,
 *              self included, two messages per pair (matched in order), all
 *              receives issued before all sends
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
 *   mismatch   rank 0's AllGather passes half the count of the others'
 *              (CUDA IPC path): once the stream is released every rank's
 *              ncclCommGetAsyncError is ncclInvalidUsage, the output and
 *              its tail are untouched, the next call fails naming the
 *              disagreement; then the comm is aborted (last mode)
 *   mismatch_p2p  the same for a send/recv ring whose sizes differ between
 *              each sender and its receiver
 *   forward    with HETCCL_NCCL_FALLBACK naming tests/c/fake_nvidia_nccl.c:
 *              ncclCommWindowRegister on a device buffer gives a window,
 *              ncclWinGetUserPtr returns the buffer, ncclSignal to the next
 *              rank and ncclCommWindowDeregister succeed (the harness reads
 *              the fallback's call log for the mirror communicator)
 *
 * The modes of CUDA's rules (device_check_strict.c), for the strict
 * emulated driver:
 *   multidev   (2 devices) one thread drives two ranks of a second
 *              communicator of 2N ranks, rank 2p on device 0 and 2p+1 on
 *              device 1: both inits in one group (helper threads), then an
 *              AllReduce and a send/recv ring of both ranks in one group,
 *              each on its device's buffers and stream, ended with device
 *              1's context current; results exact, the context unchanged
 *   initgroup  (2 devices, the rank on device 1) a group holding the init
 *              of two new communicators and an AllReduce on the first,
 *              ended on a thread with no current context; the result is
 *              exact, no context is current afterwards, and the new
 *              communicators work
 *   sweep      (NCCL_P2P_DISABLE=1: staged) 40 AllReduces of growing sizes
 *              back to back, then one group of 20, all in flight before
 *              one synchronisation (more staging buffers than the pinned
 *              pool keeps); twice, the second round on the buffers pinned
 *              after the first; results exact
 *   evict      300 AllGathers through CUDA IPC on fresh buffers, all in
 *              flight (more peer allocations than the import cache keeps,
 *              more batches than a slab has flags); results exact
 *   latepeer   rank N-1 calls an AllReduce 3 s after the others (with
 *              FAKE_CUDA_NO_STREAM_MEMOPS=1 and FAKE_CUDA_HOSTFN_LIMIT_S=2
 *              a host function that waited for it would be caught)
 *   narrow     AllReduce, ReduceScatter and Reduce of float16, bfloat16,
 *              fp8 e4m3 and e5m2 with sum, prod, max, min, avg and a
 *              per-rank PreMulSum on pseudo-random bit patterns (2 ranks,
 *              so any folding order gives the same bits): the device
 *              result equals, bit for bit (NaN as NaN), the same call on
 *              host buffers (hetccl's host kernels)
 */
#define _GNU_SOURCE
#include "device_check.h"

int g_rank = -1, g_nranks = -1, g_nonblocking;
const char* g_idpath;
const char* g_mode = "init";
long g_checks, g_wrong, m_checks, m_wrong;
CUstream g_stream, g_stream2;
int g_device;


void kv_str(const char* key, const char* v) {
  printf("%s ", key);
  for (const char* p = v ? v : "(null)"; *p; p++) putchar(*p == '\n' ? ' ' : *p);
  putchar('\n');
  fflush(stdout);
}

void die_nccl(const char* call, ncclResult_t rc, int line) __attribute__((noreturn));
void die_nccl(const char* call, ncclResult_t rc, int line) {
  printf("nccl_error %d\n", (int)rc);
  kv_str("nccl_error_call", call);
  printf("nccl_error_line %d\n", line);
  kv_str("nccl_last_error", ncclGetLastError(NULL));
  kv_str("nccl_error_mode", g_mode);
  fprintf(stderr, "rank %d: %s failed: %d: %s [mode %s]\n", g_rank, call, (int)rc,
          ncclGetLastError(NULL), g_mode);
  exit(3);
}

void die_cu(const char* call, CUresult r, int line) __attribute__((noreturn));
void die_cu(const char* call, CUresult r, int line) {
  const char* name = "?";
  cuGetErrorName(r, &name);
  printf("fatal %s = %s (line %d)\n", call, name, line);
  fprintf(stderr, "rank %d: %s failed: %s (line %d) [mode %s]\n", g_rank, call, name, line, g_mode);
  exit(4);
}

void die(const char* what) __attribute__((noreturn));
void die(const char* what) {
  kv_str("fatal", what);
  fprintf(stderr, "rank %d: %s (errno %d) [mode %s]\n", g_rank, what, errno, g_mode);
  exit(4);
}




void fail(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
void fail(const char* fmt, ...) {
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



dbuf dalloc(size_t bytes) {
  dbuf b = {0, NULL, bytes};
  CU(cuMemAlloc(&b.d, bytes + TAIL));
  CU(cuMemHostAlloc((void**)&b.h, bytes + TAIL, 0));
  /* Finished before any stream uses the buffer (the group mode uses a
   * second stream, which this stream does not order). */
  CU(cuMemsetD8Async(b.d, SENTINEL, bytes + TAIL, g_stream));
  CU(cuStreamSynchronize(g_stream));
  return b;
}

void dfree(dbuf* b) {
  CU(cuMemFree(b->d));
  CU(cuMemFreeHost(b->h));
}

/* Host mirror -> device, on the stream (not synchronised). */
void upload(dbuf* b, size_t bytes) { CU(cuMemcpyHtoDAsync(b->d, b->h, bytes, g_stream)); }

/* Device -> host mirror (output region plus the tail), on the stream. */
void download(dbuf* b, size_t off, size_t bytes) {
  size_t n = bytes + TAIL;
  if (off + n > b->bytes + TAIL) n = b->bytes + TAIL - off;
  CU(cuMemcpyDtoHAsync(b->h + off, b->d + off, n, g_stream));
}

float in_f(int r, size_t i) { return (float)(r * 1000 + (int)(i % 997)); }
int32_t in_i(int r, size_t i) { return (int32_t)((r * 7919 + (int)i * 31) % 100003) - 50000; }

void check_f(const char* what, const float* got, size_t n, float (*want)(size_t, void*),
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

void check_tail(const char* what, const dbuf* b, size_t end) {
  size_t stop = end + TAIL <= b->bytes + TAIL ? end + TAIL : b->bytes + TAIL;
  for (size_t i = end; i < stop; i++)
    if (b->h[i] != SENTINEL) {
      fail("%s: byte %zu past the output (%zu bytes) was overwritten", what, i - end, end);
      return;
    }
}

float want_sum(size_t i, void* a) {
  (void)a;
  float s = 0;
  for (int r = 0; r < g_nranks; r++) s += in_f(r, i);
  return s;
}
float want_rank_i(size_t i, void* a) { return in_f(*(int*)a, i); }
/* Element i of a gathered buffer of n-per-rank blocks. */
float want_gathered(size_t i, void* a) {
  size_t n = *(size_t*)a;
  return in_f((int)(i / n), i % n);
}
float want_rs(size_t i, void* a) {
  size_t off = *(size_t*)a;
  return want_sum(off + i, NULL);
}
/* Alltoall: block r of my output came from rank r, its block g_rank. */
float want_a2a(size_t i, void* a) {
  size_t n = *(size_t*)a;
  int src = (int)(i / n);
  return in_f(src, (size_t)g_rank * n + i % n);
}

void fill_f(dbuf* b, size_t n, int r, size_t base) {
  float* h = (float*)b->h;
  for (size_t i = 0; i < n; i++) h[i] = in_f(r, base + i);
}

void sync_stream(CUstream s) { CU(cuStreamSynchronize(s)); }

/* Reads `r` back after everything on the stream, checks it holds the sum
 * over ranks of in_f, and frees both buffers. */
void finish_sum(const char* what, dbuf* s, dbuf* r, size_t n) {
  download(r, 0, n * 4);
  sync_stream(g_stream);
  check_f(what, (float*)r->h, n, want_sum, NULL);
  dfree(s);
  dfree(r);
}

/* ------------------------------------------------------------ main */

/* Where the nccl* functions this program calls were bound. */
static void print_origins(void) {
  static const struct nccl_origin fns[] = {
      NCCL_ORIGIN(ncclGetUniqueId), NCCL_ORIGIN(ncclCommInitRank), NCCL_ORIGIN(ncclCommInitRankConfig),
      NCCL_ORIGIN(ncclAllReduce),   NCCL_ORIGIN(ncclBroadcast),    NCCL_ORIGIN(ncclReduce),
      NCCL_ORIGIN(ncclAllGather),   NCCL_ORIGIN(ncclReduceScatter), NCCL_ORIGIN(ncclAlltoAll),
      NCCL_ORIGIN(ncclSend),        NCCL_ORIGIN(ncclRecv),         NCCL_ORIGIN(ncclGroupStart),
      NCCL_ORIGIN(ncclGroupEnd),    NCCL_ORIGIN(ncclMemAlloc),     NCCL_ORIGIN(ncclMemFree),
      NCCL_ORIGIN(ncclCommCuDevice), NCCL_ORIGIN(ncclGetLastError), NCCL_ORIGIN(ncclCommDestroy),
      NCCL_ORIGIN(ncclCommWindowRegister), NCCL_ORIGIN(ncclWinGetUserPtr), NCCL_ORIGIN(ncclSignal),
      NCCL_ORIGIN(ncclCommWindowDeregister), NCCL_ORIGIN(ncclRedOpCreatePreMulSum), NCCL_ORIGIN(ncclRedOpDestroy),
  };
  nccl_print_origins(fns, sizeof fns / sizeof fns[0], kv_str);
}

void exchange_id(const char* path, ncclUniqueId* id) {
  if (g_rank == 0) {
    NC(NULL, ncclGetUniqueId(id));
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
    FILE* f = fopen(tmp, "wb");
    if (f == NULL || fwrite(id, sizeof *id, 1, f) != 1 || fclose(f) != 0) die("writing the id");
    if (rename(tmp, path) != 0) die("renaming the id file");
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
  exchange_id(g_idpath, &id);
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
    else if (!strcmp(m, "sendrecv")) mode_sendrecv(comm);
    else if (!strcmp(m, "avgpremul")) mode_avgpremul(comm);
    else if (!strcmp(m, "capture")) mode_capture(comm);
    else if (!strcmp(m, "memalloc")) mode_memalloc(comm);
    else if (!strcmp(m, "pinned")) mode_pinned(comm);
    else if (!strcmp(m, "mixed")) mode_mixed(comm);
    else if (!strcmp(m, "forward")) mode_forward(comm);
    else if (!strcmp(m, "idle")) mode_idle(comm);
    else if (!strcmp(m, "peerdeath")) aborted = mode_peerdeath(comm);
    else if (!strcmp(m, "mismatch")) aborted = mode_mismatch(comm);
    else if (!strcmp(m, "mismatch_p2p")) aborted = mode_mismatch_p2p(comm);
    else if (!strcmp(m, "multidev")) mode_multidev(comm);
    else if (!strcmp(m, "initgroup")) mode_initgroup(comm);
    else if (!strcmp(m, "sweep")) mode_sweep(comm);
    else if (!strcmp(m, "evict")) mode_evict(comm);
    else if (!strcmp(m, "latepeer")) mode_latepeer(comm);
    else if (!strcmp(m, "narrow")) mode_narrow(comm);
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
