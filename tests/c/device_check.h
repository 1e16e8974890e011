/* Shared declarations of device_check (tests/c/device_check*.c): the
 * rank's globals, the buffer and check helpers, and the modes. */
#ifndef DEVICE_CHECK_H
#define DEVICE_CHECK_H

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

#include "nccl_test_common.h"


extern int g_rank, g_nranks, g_nonblocking;
extern const char* g_idpath;
extern const char* g_mode;
extern long g_checks, g_wrong, m_checks, m_wrong;
extern CUstream g_stream, g_stream2;
extern int g_device;

#define SENTINEL 0xCD
#define TAIL 64

#define NC(comm, call)                                             \
  do {                                                             \
    ncclResult_t rc_ = nccl_settle((comm), (call), g_nonblocking); \
    if (rc_ != ncclSuccess) die_nccl(#call, rc_, __LINE__);        \
  } while (0)
#define CU(call)                                  \
  do {                                            \
    CUresult r_ = (call);                         \
    if (r_ != CUDA_SUCCESS) die_cu(#call, r_, __LINE__); \
  } while (0)

/* A device buffer with its pinned host mirror (values in, results out). */
typedef struct {
  CUdeviceptr d;
  unsigned char* h;
  size_t bytes; /* usable bytes; TAIL more are allocated */
} dbuf;

void kv_str(const char* key, const char* v);
dbuf dalloc(size_t bytes);
void dfree(dbuf* b);
void upload(dbuf* b, size_t bytes);
void download(dbuf* b, size_t off, size_t bytes);
float in_f(int r, size_t i);
int32_t in_i(int r, size_t i);
void check_tail(const char* what, const dbuf* b, size_t end);
float want_sum(size_t i, void* a);
float want_rank_i(size_t i, void* a);
float want_gathered(size_t i, void* a);
float want_rs(size_t i, void* a);
float want_a2a(size_t i, void* a);
void fill_f(dbuf* b, size_t n, int r, size_t base);
void check_f(const char* what, const float* got, size_t n, float (*want)(size_t, void*), void* arg);
void sync_stream(CUstream s);
void finish_sum(const char* what, dbuf* s, dbuf* r, size_t n);
void die_nccl(const char* call, ncclResult_t rc, int line) __attribute__((noreturn));
void die_cu(const char* call, CUresult r, int line) __attribute__((noreturn));
void die(const char* what) __attribute__((noreturn));
void fail(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
/* Rank 0 writes a new unique id to `path`; the others wait for it. */
void exchange_id(const char* path, ncclUniqueId* id);

/* device_check_colls.c */
void one_allreduce_f(ncclComm_t comm, size_t n, int in_place);
void one_allreduce_max_i(ncclComm_t comm, size_t n);
void one_rooted(ncclComm_t comm, size_t n, int reduce);
void one_allgather(ncclComm_t comm, size_t n, int in_place);
void one_reducescatter(ncclComm_t comm, size_t n);
void one_alltoall(ncclComm_t comm, size_t n);
void ring_post(ncclComm_t comm, dbuf* s, dbuf* r, size_t n, CUstream st);
void one_ring(ncclComm_t comm, size_t n);
void mode_coll(ncclComm_t comm);
void wait_path(const char* p);
void mode_async(ncclComm_t comm);
void mode_group(ncclComm_t comm);
void mode_avgpremul(ncclComm_t comm);
void mode_coalesced(ncclComm_t comm);
void mode_sendrecv(ncclComm_t comm);

/* device_check_features.c */
void mode_capture(ncclComm_t comm);
void mode_memalloc(ncclComm_t comm);
void mode_pinned(ncclComm_t comm);
void mode_mixed(ncclComm_t comm);
void mode_idle(ncclComm_t comm);
int mode_peerdeath(ncclComm_t comm);
void mode_forward(ncclComm_t comm);
int mode_mismatch(ncclComm_t comm);
int mode_mismatch_p2p(ncclComm_t comm);

/* device_check_strict.c */
void mode_multidev(ncclComm_t comm);
void mode_initgroup(ncclComm_t comm);
void mode_sweep(ncclComm_t comm);
void mode_evict(ncclComm_t comm);
void mode_latepeer(ncclComm_t comm);
void mode_narrow(ncclComm_t comm);

#endif
