/* device_check's modes for the API around the collectives: capture,
 * memalloc, pinned, mixed, idle, peerdeath, forward, mismatch and
 * mismatch_p2p (see device_check.c for what each checks). */
#define _GNU_SOURCE
#include "device_check.h"

void mode_capture(ncclComm_t comm) {
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
  finish_sum("allreduce after the capture", &s, &r, n);
}

void mode_memalloc(ncclComm_t comm) {
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

void mode_pinned(ncclComm_t comm) {
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

void mode_mixed(ncclComm_t comm) {
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

void mode_idle(ncclComm_t comm) {
  one_allreduce_f(comm, 5003, 0);
  usleep(10500 * 1000);
  one_allreduce_f(comm, 5003, 1);
}

/* Returns 1 when the communicator was aborted (no teardown). */
int mode_peerdeath(ncclComm_t comm) {
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

void mode_forward(ncclComm_t comm) {
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

/* After a call whose shapes differ between ranks (`rc` from enqueueing it):
 * the stream is released, the failure is ncclInvalidUsage, `out` (of
 * `out_bytes`) and its tail are untouched, the next call fails and its
 * message contains `word`; then the comm is aborted. */
static int mismatch_report(const char* m, ncclComm_t comm, ncclResult_t rc, dbuf* s, dbuf* out,
                           size_t out_bytes, const char* word) {
  CUresult q = cuStreamSynchronize(g_stream);
  ncclResult_t st = ncclSuccess;
  ncclResult_t arc = ncclCommGetAsyncError(comm, &st);
  download(out, 0, out_bytes);
  sync_stream(g_stream);
  int untouched = 1;
  for (size_t i = 0; i < out_bytes + TAIL && untouched; i++) untouched = out->h[i] == SENTINEL;
  ncclResult_t again = ncclAllGather((void*)s->d, (void*)out->d, 1, ncclFloat32, comm, g_stream);
  const char* msg = ncclGetLastError(comm);
  printf("%s.call_rc %d\n%s.sync %d\n%s.async %d\n%s.again %d\n%s.untouched %d\n", m, (int)rc, m,
         (int)q, m, (int)st, m, (int)again, m, untouched);
  kv_str("mismatch.last_error", msg);
  m_checks++;
  g_checks++;
  if (q != CUDA_SUCCESS) fail("cuStreamSynchronize after the mismatched call returned %d", (int)q);
  if (arc != ncclSuccess) fail("ncclCommGetAsyncError returned %d", (int)arc);
  /* The call itself only enqueues; once the stream is released the
   * failure must be visible. */
  if (rc != ncclSuccess && rc != ncclInvalidUsage) fail("the call returned %d", (int)rc);
  if (st != ncclInvalidUsage) fail("ncclCommGetAsyncError after the stream: %d, want 5", (int)st);
  if (again == ncclSuccess) fail("the next call on the failed comm succeeded");
  if (msg == NULL || strstr(msg, word) == NULL)
    fail("the next call's message does not contain \"%s\": %s", word, msg ? msg : "(null)");
  if (!untouched) fail("the mismatched call wrote the output");
  dfree(s);
  dfree(out);
  NC(NULL, ncclCommAbort(comm));
  return 1;
}

int mode_mismatch(ncclComm_t comm) {
  size_t n = g_rank == 0 ? 1000 : 2000;
  dbuf s = dalloc(n * 4), r = dalloc(n * 4 * g_nranks);
  fill_f(&s, n, g_rank, 0);
  upload(&s, n * 4);
  ncclResult_t rc = ncclAllGather((void*)s.d, (void*)r.d, n, ncclFloat32, comm, g_stream);
  return mismatch_report("mismatch", comm, rc, &s, &r, n * 4 * g_nranks, "disagree");
}

int mode_mismatch_p2p(ncclComm_t comm) {
  size_t n = g_rank == 0 ? 1000 : 2000;
  int to = (g_rank + 1) % g_nranks, from = (g_rank + g_nranks - 1) % g_nranks;
  dbuf s = dalloc(n * 4), r = dalloc(n * 4);
  fill_f(&s, n, g_rank, 0);
  upload(&s, n * 4);
  NC(comm, ncclGroupStart());
  NC(comm, ncclRecv((void*)r.d, n, ncclFloat32, from, comm, g_stream));
  NC(comm, ncclSend((void*)s.d, n, ncclFloat32, to, comm, g_stream));
  ncclResult_t rc = ncclGroupEnd();
  return mismatch_report("mismatch_p2p", comm, rc, &s, &r, n * 4, "mismatched");
}
