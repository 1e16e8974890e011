/* device_check's modes for CUDA's rules, run against the strict emulated
 * driver: multidev, initgroup, sweep, evict, latepeer and narrow (see
 * device_check.c for what each checks). */
#define _GNU_SOURCE
#include "device_check.h"

static CUcontext primary(int dev) {
  CUdevice d;
  CUcontext c = NULL;
  CU(cuDeviceGet(&d, dev));
  CU(cuDevicePrimaryCtxRetain(&c, d));
  return c;
}

static CUcontext current(void) {
  CUcontext c = NULL;
  CU(cuCtxGetCurrent(&c));
  return c;
}

/* dalloc on stream `st` (of the current context). */
static dbuf dalloc_on(size_t bytes, CUstream st) {
  dbuf b = {0, NULL, bytes};
  CU(cuMemAlloc(&b.d, bytes + TAIL));
  CU(cuMemHostAlloc((void**)&b.h, bytes + TAIL, 0));
  CU(cuMemsetD8Async(b.d, SENTINEL, bytes + TAIL, st));
  CU(cuStreamSynchronize(st));
  return b;
}

static void count_check(void) {
  m_checks++;
  g_checks++;
}

/* Element i of rank r's input, for a communicator of `nw` ranks. */
static float sum_of(int nw, size_t i) {
  float s = 0;
  for (int r = 0; r < nw; r++) s += in_f(r, i);
  return s;
}

void mode_multidev(ncclComm_t comm) {
  (void)comm;
  char path[4096];
  snprintf(path, sizeof path, "%s.wide", g_idpath);
  ncclUniqueId id;
  exchange_id(path, &id);
  const int nw = 2 * g_nranks;
  const size_t n = 30011;
  CUcontext ctx[2] = {primary(0), primary(1)};
  CUstream st[2];
  ncclComm_t w[2] = {NULL, NULL};
  dbuf s[2], r[2], rs[2], rr[2];
  for (int d = 0; d < 2; d++) {
    CU(cuCtxSetCurrent(ctx[d]));
    CU(cuStreamCreate(&st[d], CU_STREAM_NON_BLOCKING));
  }
  /* Both ranks' inits in one group, as ncclCommInitAll does. */
  NC(NULL, ncclGroupStart());
  for (int d = 0; d < 2; d++) {
    CU(cuCtxSetCurrent(ctx[d]));
    NC(NULL, ncclCommInitRank(&w[d], nw, id, 2 * g_rank + d));
  }
  NC(NULL, ncclGroupEnd());
  for (int d = 0; d < 2; d++) {
    int me = 2 * g_rank + d;
    CU(cuCtxSetCurrent(ctx[d]));
    s[d] = dalloc_on(n * 4, st[d]);
    r[d] = dalloc_on(n * 4, st[d]);
    rs[d] = dalloc_on(n * 4, st[d]);
    rr[d] = dalloc_on(n * 4, st[d]);
    fill_f(&s[d], n, me, 0);
    fill_f(&rs[d], n, me, 0);
    CU(cuMemcpyHtoDAsync(s[d].d, s[d].h, n * 4, st[d]));
    CU(cuMemcpyHtoDAsync(rs[d].d, rs[d].h, n * 4, st[d]));
  }
  NC(NULL, ncclGroupStart());
  for (int d = 0; d < 2; d++) {
    int me = 2 * g_rank + d;
    CU(cuCtxSetCurrent(ctx[d]));
    NC(w[d], ncclAllReduce((void*)s[d].d, (void*)r[d].d, n, ncclFloat32, ncclSum, w[d], st[d]));
    NC(w[d], ncclRecv((void*)rr[d].d, n, ncclFloat32, (me + nw - 1) % nw, w[d], st[d]));
    NC(w[d], ncclSend((void*)rs[d].d, n, ncclFloat32, (me + 1) % nw, w[d], st[d]));
  }
  /* The group ends with device 1's context current. */
  NC(NULL, ncclGroupEnd());
  count_check();
  if (current() != ctx[1]) fail("ncclGroupEnd changed the current context");
  for (int d = 0; d < 2; d++) {
    CU(cuCtxSetCurrent(ctx[d]));
    CU(cuMemcpyDtoHAsync(r[d].h, r[d].d, n * 4 + TAIL, st[d]));
    CU(cuMemcpyDtoHAsync(rr[d].h, rr[d].d, n * 4 + TAIL, st[d]));
    CU(cuStreamSynchronize(st[d]));
  }
  for (int d = 0; d < 2; d++) {
    int me = 2 * g_rank + d, prev = (me + nw - 1) % nw;
    count_check();
    for (size_t i = 0; i < n; i++) {
      float got = ((float*)r[d].h)[i], want = sum_of(nw, i);
      if (got != want) {
        fail("device %d: allreduce element %zu is %g, want %g", d, i, (double)got, (double)want);
        break;
      }
    }
    check_f("multidev ring", (float*)rr[d].h, n, want_rank_i, &prev);
    check_tail("multidev allreduce", &r[d], n * 4);
  }
  for (int d = 0; d < 2; d++) {
    CU(cuCtxSetCurrent(ctx[d]));
    dfree(&s[d]), dfree(&r[d]), dfree(&rs[d]), dfree(&rr[d]);
    NC(NULL, ncclCommDestroy(w[d]));
    CU(cuStreamDestroy(st[d]));
  }
  CU(cuCtxSetCurrent(primary(g_device)));
}

void mode_initgroup(ncclComm_t comm) {
  char p1[4096], p2[4096];
  snprintf(p1, sizeof p1, "%s.init1", g_idpath);
  snprintf(p2, sizeof p2, "%s.init2", g_idpath);
  ncclUniqueId id1, id2;
  exchange_id(p1, &id1);
  exchange_id(p2, &id2);
  const size_t n = 20011;
  dbuf s = dalloc(n * 4), r = dalloc(n * 4);
  fill_f(&s, n, g_rank, 0);
  upload(&s, n * 4);
  CUcontext mine = current();
  ncclComm_t c1 = NULL, c2 = NULL;
  NC(NULL, ncclGroupStart());
  NC(NULL, ncclCommInitRank(&c1, g_nranks, id1, g_rank));
  NC(NULL, ncclCommInitRank(&c2, g_nranks, id2, g_rank));
  NC(comm, ncclAllReduce((void*)s.d, (void*)r.d, n, ncclFloat32, ncclSum, comm, g_stream));
  /* The group's work runs where no context is current (as on a helper
   * thread): hetccl must use the stream's context, not device 0's. */
  CU(cuCtxSetCurrent(NULL));
  ncclResult_t rc = ncclGroupEnd();
  CUcontext after = current();
  CU(cuCtxSetCurrent(mine));
  NC(comm, rc);
  count_check();
  if (after != NULL) fail("ncclGroupEnd left a context current (%p)", (void*)after);
  finish_sum("allreduce in a group with two inits", &s, &r, n);
  one_allreduce_f(c1, 1021, 0);
  one_allreduce_f(c2, 4099, 1);
  NC(c1, ncclCommFinalize(c1));
  NC(c2, ncclCommFinalize(c2));
  NC(NULL, ncclCommDestroy(c1));
  NC(NULL, ncclCommDestroy(c2));
}

void mode_sweep(ncclComm_t comm) {
  enum { K = 40, G = 20 };
  static dbuf s[K + G], r[K + G];
  size_t n[K + G];
  for (int k = 0; k < K + G; k++) {
    n[k] = k < K ? 1000 + 2503 * (size_t)k : 777 + 1001 * (size_t)(k - K);
    s[k] = dalloc(n[k] * 4);
    r[k] = dalloc(n[k] * 4);
    fill_f(&s[k], n[k], g_rank, 0);
    upload(&s[k], n[k] * 4);
  }
  /* Twice: the first round finds no pinned buffers of these sizes (they
   * are pinned at the safe point after it), the second takes them from
   * the pool while later calls wait. */
  for (int round = 0; round < 2; round++) {
    for (int k = 0; k < K + G; k++)
      CU(cuMemsetD8Async(r[k].d, SENTINEL, n[k] * 4 + TAIL, g_stream));
    /* Growing sizes: each staged call needs new staging buffers. */
    for (int k = 0; k < K; k++)
      NC(comm, ncclAllReduce((void*)s[k].d, (void*)r[k].d, n[k], ncclFloat32, ncclSum, comm, g_stream));
    /* One group staged together: 2 buffers per call at once. */
    NC(comm, ncclGroupStart());
    for (int k = K; k < K + G; k++)
      NC(comm, ncclAllReduce((void*)s[k].d, (void*)r[k].d, n[k], ncclFloat32, ncclSum, comm, g_stream));
    NC(comm, ncclGroupEnd());
    sync_stream(g_stream);
  }
  for (int k = 0; k < K + G; k++) download(&r[k], 0, n[k] * 4);
  sync_stream(g_stream);
  for (int k = 0; k < K + G; k++) {
    check_f("sweep allreduce", (float*)r[k].h, n[k], want_sum, NULL);
    check_tail("sweep allreduce", &r[k], n[k] * 4);
    dfree(&s[k]);
    dfree(&r[k]);
  }
}

/* Block `src` of an evict AllGather: rank src's input shifted by k. */
struct evict_arg {
  size_t n, k;
};
static float want_evict(size_t i, void* a) {
  const struct evict_arg* e = a;
  return in_f((int)(i / e->n), i % e->n + e->k);
}

void mode_evict(ncclComm_t comm) {
  enum { K = 300 };
  const size_t n = 256;
  static dbuf s[K], r[K];
  for (int k = 0; k < K; k++) {
    s[k] = dalloc(n * 4);
    r[k] = dalloc(n * 4 * (size_t)g_nranks);
    fill_f(&s[k], n, g_rank, (size_t)k);
    upload(&s[k], n * 4);
  }
  /* Fresh buffers each call: two new peer allocations per peer and call,
   * more than the import cache keeps, with every call in flight (more
   * than a slab of stream flags). */
  for (int k = 0; k < K; k++)
    NC(comm, ncclAllGather((void*)s[k].d, (void*)r[k].d, n, ncclFloat32, comm, g_stream));
  for (int k = 0; k < K; k++) download(&r[k], 0, n * 4 * (size_t)g_nranks);
  sync_stream(g_stream);
  for (int k = 0; k < K; k++) {
    struct evict_arg e = {n, (size_t)k};
    check_f("evict allgather", (float*)r[k].h, n * (size_t)g_nranks, want_evict, &e);
    check_tail("evict allgather", &r[k], n * 4 * (size_t)g_nranks);
  }
  for (int k = 0; k < K; k++) dfree(&s[k]), dfree(&r[k]);
}

void mode_latepeer(ncclComm_t comm) {
  const size_t n = 5003;
  dbuf s = dalloc(n * 4), r = dalloc(n * 4);
  fill_f(&s, n, g_rank, 0);
  upload(&s, n * 4);
  sync_stream(g_stream);
  if (g_rank == g_nranks - 1) usleep(3000 * 1000);
  NC(comm, ncclAllReduce((void*)s.d, (void*)r.d, n, ncclFloat32, ncclSum, comm, g_stream));
  finish_sum("allreduce with a late peer", &s, &r, n);
}

/* ------------------------------------------------------ narrow floats */

static const struct {
  ncclDataType_t dt;
  const char* name;
  size_t size;
  uint16_t scalar[2]; /* rank 0's and rank 1's PreMulSum scalars: 1.5, 0.75 */
} NT[] = {
    {ncclFloat16, "float16", 2, {0x3E00, 0x3A00}},
    {ncclBfloat16, "bfloat16", 2, {0x3FC0, 0x3F40}},
    {ncclFloat8e4m3, "e4m3", 1, {0x3C, 0x34}},
    {ncclFloat8e5m2, "e5m2", 1, {0x3E, 0x3A}},
};

/* Whether `v` (bits of NT[t]) is a NaN. */
static int is_nan(int t, unsigned v) {
  switch (t) {
  case 0: return (v & 0x7c00u) == 0x7c00u && (v & 0x3ffu);
  case 1: return (v & 0x7f80u) == 0x7f80u && (v & 0x7fu);
  case 2: return (v & 0x7fu) == 0x7fu;
  default: return (v & 0x7cu) == 0x7cu && (v & 3u);
  }
}

/* Element i's bits of NT[t] for rank r and case c: pseudo-random, with
 * -0 made +0 (max and min of +0 and -0 depend on the operand order). */
static unsigned narrow_in(int t, int r, int c, size_t i) {
  uint64_t x = (uint64_t)i * 0x9E3779B97F4A7C15ull + (uint64_t)(r * 131 + c * 7 + t + 1) * 0xD1B54A32D192ED03ull;
  x ^= x >> 29;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 32;
  unsigned v = (unsigned)(x & (NT[t].size == 2 ? 0xffffu : 0xffu));
  unsigned neg0 = NT[t].size == 2 ? 0x8000u : 0x80u;
  return v == neg0 ? 0 : v;
}

static unsigned get_bits(const unsigned char* p, size_t size, size_t i) {
  return size == 2 ? (unsigned)p[2 * i] | (unsigned)p[2 * i + 1] << 8 : p[i];
}

static void put_bits(unsigned char* p, size_t size, size_t i, unsigned v) {
  if (size == 2) {
    p[2 * i] = (unsigned char)v;
    p[2 * i + 1] = (unsigned char)(v >> 8);
  } else {
    p[i] = (unsigned char)v;
  }
}

/* Runs one collective (0 AllReduce, 1 ReduceScatter, 2 Reduce to rank
 * N-1) of n output elements on `send` -> `recv`, on `st`. */
static void narrow_call(ncclComm_t comm, int kind, void* send, void* recv, size_t n,
                        ncclDataType_t dt, ncclRedOp_t op, CUstream st) {
  if (kind == 0) NC(comm, ncclAllReduce(send, recv, n, dt, op, comm, st));
  else if (kind == 1) NC(comm, ncclReduceScatter(send, recv, n, dt, op, comm, st));
  else NC(comm, ncclReduce(send, recv, n, dt, op, g_nranks - 1, comm, st));
}

void mode_narrow(ncclComm_t comm) {
  static const char* const KIND[3] = {"allreduce", "reducescatter", "reduce"};
  static const char* const OPN[6] = {"sum", "prod", "max", "min", "avg", "premulsum"};
  const size_t n = 4099;
  for (int t = 0; t < (int)(sizeof NT / sizeof NT[0]); t++) {
    size_t es = NT[t].size, sb = n * (size_t)g_nranks * es, rb = n * es;
    dbuf ds = dalloc(sb), dr = dalloc(rb);
    unsigned char *hs = malloc(sb), *hr = malloc(rb);
    if (!hs || !hr) die("malloc");
    uint16_t sc = NT[t].scalar[g_rank % 2];
    ncclRedOp_t pre;
    NC(comm, ncclRedOpCreatePreMulSum(&pre, &sc, NT[t].dt, ncclScalarHostImmediate, comm));
    const ncclRedOp_t ops[6] = {ncclSum, ncclProd, ncclMax, ncclMin, ncclAvg, pre};
    for (int o = 0; o < 6; o++)
      for (int kind = 0; kind < 3; kind++) {
        size_t in_n = kind == 1 ? n * (size_t)g_nranks : n;
        int c = o * 3 + kind;
        for (size_t i = 0; i < in_n; i++) put_bits(ds.h, es, i, narrow_in(t, g_rank, c, i));
        memcpy(hs, ds.h, in_n * es);
        memset(hr, SENTINEL, rb);
        upload(&ds, in_n * es);
        narrow_call(comm, kind, (void*)ds.d, (void*)dr.d, n, NT[t].dt, ops[o], g_stream);
        download(&dr, 0, rb);
        sync_stream(g_stream);
        narrow_call(comm, kind, hs, hr, n, NT[t].dt, ops[o], NULL);
        if (kind == 2 && g_rank != g_nranks - 1) continue;
        count_check();
        for (size_t i = 0; i < n; i++) {
          unsigned a = get_bits(dr.h, es, i), b = get_bits(hr, es, i);
          if (a != b && !(is_nan(t, a) && is_nan(t, b))) {
            fail("%s %s %s: element %zu is %#x on the device, %#x on the host", NT[t].name,
                 KIND[kind], OPN[o], i, a, b);
            break;
          }
        }
      }
    NC(comm, ncclRedOpDestroy(pre, comm));
    dfree(&ds);
    dfree(&dr);
    free(hs);
    free(hr);
  }
}
