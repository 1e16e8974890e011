/* device_check's collective modes: coll, async, group, avgpremul and
 * coalesced (see device_check.c for what each checks). */
#define _GNU_SOURCE
#include "device_check.h"

void one_allreduce_f(ncclComm_t comm, size_t n, int in_place) {
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

void one_allreduce_max_i(ncclComm_t comm, size_t n) {
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

void one_rooted(ncclComm_t comm, size_t n, int reduce) {
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

void one_allgather(ncclComm_t comm, size_t n, int in_place) {
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

void one_reducescatter(ncclComm_t comm, size_t n) {
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

void one_alltoall(ncclComm_t comm, size_t n) {
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
void ring_post(ncclComm_t comm, dbuf* s, dbuf* r, size_t n, CUstream st) {
  int next = (g_rank + 1) % g_nranks, prev = (g_rank + g_nranks - 1) % g_nranks;
  NC(comm, ncclRecv((void*)r->d, n, ncclFloat32, prev, comm, st));
  NC(comm, ncclSend((void*)s->d, n, ncclFloat32, next, comm, st));
}

void one_ring(ncclComm_t comm, size_t n) {
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

void mode_coll(ncclComm_t comm) {
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
void wait_path(const char* p) {
  double deadline = now_ms() + 60e3;
  while (access(p, F_OK) != 0) {
    if (now_ms() > deadline) die("timed out waiting for the go file");
    usleep(1000);
  }
}

void mode_async(ncclComm_t comm) {
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
  finish_sum("allreduce issued before the peers", &s, &r, n);
}

void mode_group(ncclComm_t comm) {
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

void mode_avgpremul(ncclComm_t comm) {
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

void mode_coalesced(ncclComm_t comm) {
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

/* Sends and receives in groups: every ordered pair (self included), all
 * receives issued before all sends, and two messages to each peer in one
 * group (matched in order); values say who sent which message. */
void mode_sendrecv(ncclComm_t comm) {
  size_t n = 20011;
  int N = g_nranks;
  dbuf* s = calloc((size_t)N * 2, sizeof(dbuf));
  dbuf* r = calloc((size_t)N * 2, sizeof(dbuf));
  if (s == NULL || r == NULL) die("calloc");
  for (int p = 0; p < N; p++)
    for (int j = 0; j < 2; j++) {
      dbuf* b = &s[p * 2 + j];
      *b = dalloc(n * 4);
      /* message j from g_rank to p: in_f(g_rank, i + base) */
      fill_f(b, n, g_rank, (size_t)(p * 2 + j) * 7);
      upload(b, n * 4);
      r[p * 2 + j] = dalloc(n * 4);
    }
  NC(comm, ncclGroupStart());
  for (int p = 0; p < N; p++)
    for (int j = 0; j < 2; j++)
      NC(comm, ncclRecv((void*)r[p * 2 + j].d, n, ncclFloat32, p, comm, g_stream));
  for (int p = 0; p < N; p++)
    for (int j = 0; j < 2; j++)
      NC(comm, ncclSend((void*)s[p * 2 + j].d, n, ncclFloat32, p, comm, g_stream));
  NC(comm, ncclGroupEnd());
  for (int p = 0; p < N; p++)
    for (int j = 0; j < 2; j++) download(&r[p * 2 + j], 0, n * 4);
  sync_stream(g_stream);
  for (int p = 0; p < N; p++)
    for (int j = 0; j < 2; j++) {
      /* from p, its message j to me: in_f(p, i + (me*2+j)*7) */
      size_t base = (size_t)(g_rank * 2 + j) * 7;
      m_checks++;
      g_checks++;
      const float* got = (const float*)r[p * 2 + j].h;
      for (size_t i = 0; i < n; i++)
        if (got[i] != in_f(p, i + base)) {
          fail("message %d from rank %d: element %zu is %g, want %g", j, p, i, (double)got[i],
               (double)in_f(p, i + base));
          break;
        }
      check_tail("sendrecv", &r[p * 2 + j], n * 4);
    }
  for (int i = 0; i < N * 2; i++) dfree(&s[i]), dfree(&r[i]);
  free(s);
  free(r);
}
