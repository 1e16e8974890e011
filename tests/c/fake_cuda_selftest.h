/*
 * fake_cuda_selftest.h: what the files of the emulated CUDA driver's
 * self-test share (fake_cuda_selftest.c has main and describes the
 * program): CK, the `key value` printers, small helpers, and the test
 * groups and modes of fake_cuda_selftest_streams.c,
 * fake_cuda_selftest_kernels.c and fake_cuda_selftest_strict.c.
 */
#ifndef FAKE_CUDA_SELFTEST_H
#define FAKE_CUDA_SELFTEST_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <cuda.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define CK(call)                                                                                   \
    do {                                                                                           \
        CUresult r_ = (call);                                                                      \
        if (r_ != CUDA_SUCCESS) {                                                                  \
            fprintf(stderr, "%s:%d: %s -> %d\n", __FILE__, __LINE__, #call, (int)r_);              \
            exit(2);                                                                               \
        }                                                                                          \
    } while (0)

/* `key value` lines on stdout (kv2: `key a,b`). */
void kv(const char *k, long long v);
void kvs(const char *k, const char *v);
void kv2(const char *k, long long a, long long b);

void sleep_ms(int ms);
/* Stores `v` into a flag that a stream polls. */
void set_flag(volatile uint32_t *f, uint32_t v);
/* p[i] = i*mul + add (mod 256); check(): whether p holds that. */
void fill(unsigned char *p, size_t n, unsigned mul, unsigned add);
int check(const unsigned char *p, size_t n, unsigned mul, unsigned add);
/* Pinned memory holding a 32-bit flag (host pointer; same device pointer). */
volatile uint32_t *new_flag(uint32_t v);
CUstream new_stream(void);
CUevent new_event(void);

/* fake_cuda_selftest_streams.c */
/* Sets the flag at `arg` to 1 after 50 ms (a thread's body). */
void *set_later(void *arg);
void t_fifo(void);
void t_host_funcs(void);
void t_cross_stream(void);
void t_capture(void);
/* What hetccl does without stream memory operations: block in a host function. */
void wait_flag_fn(void *u);

/* fake_cuda_selftest_kernels.c */
void t_kernels(void);

/* fake_cuda_selftest_strict.c */
void t_strict(CUcontext c0, CUcontext c1);
int m_deadlock(void);
int m_hostfn_wait(void);
int m_alloc_wait(int device);
int m_oldcuda(void);
int m_narrow(const char *in, const char *out);

#endif /* FAKE_CUDA_SELFTEST_H */
