/*
 * coll_check: one rank of a multi-process check of every host-memory
 * collective, compiled against NVIDIA's real nccl.h and run with
 * LD_PRELOAD=libhetccl.so (tests/collectives_mp.rs, tests/collectives_netns.rs).
 *
 * It is linked against NVIDIA's libnccl.so.2 (as PyTorch is), and the
 * harness preloads libhetccl.so, so every nccl* call must be bound to hetccl
 * by interposition: the program prints where ncclGetUniqueId was bound
 * (`origin`) and `origin.all_same 1` when every nccl* function it calls was
 * bound to the same library (any other is listed as `origin.<name>`).
 * Without a GPU, a call that reached NVIDIA's library would fail.
 *
 *   coll_check --rank R --nranks N --id PATH --mode M[,M...]
 *              [--nonblocking] [--dtypes int8,float32,...]
 *              [--counts 0,1,1021,1048579] [--big-dtypes int32,float32]
 *
 * Counts above 65536 ("big") run only for --big-dtypes (default int8,
 * int32, float32, bfloat16), only with ncclSum, and only with root N-1:
 * they exercise chunking and pipelining, which the op and root do not
 * change, and keep the run short.
 *
 * Rank 0 calls ncclGetUniqueId and writes the 128 bytes to PATH atomically
 * (PATH.tmp.<pid>, then rename); the others poll for PATH. Then every rank
 * calls ncclCommInitRank, or with --nonblocking ncclCommInitRankConfig with
 * config.blocking = 0 and polls ncclCommGetAsyncError (in that mode every
 * call that returns ncclInProgress is polled to completion the same way).
 *
 * Modes (each prints `mode.<m>.checks`, `mode.<m>.wrong`, `mode.<m>.ms`, and
 * `begin <m>` is written to stderr first so a hang is attributable):
 *   allreduce     sum, prod, max, min, avg; out-of-place and in-place
 *   premulsum     ncclRedOpCreatePreMulSum, host-immediate and device (pointer)
 *                 scalars, through AllReduce, Reduce and ReduceScatter
 *   broadcast     ncclBroadcast (out-of-place, in-place) and ncclBcast
 *   reduce        ncclReduce, all ops, roots 0 and N-1, in-place at the root
 *   allgather     in-place: sendbuff = recvbuff + rank*count
 *   reducescatter in-place: recvbuff = sendbuff + rank*count
 *   alltoall      out-of-place
 *   gather        roots 0 and N-1; in-place: sendbuff = recvbuff + root*count
 *   scatter       roots 0 and N-1; in-place: recvbuff = sendbuff + root*count
 *   sendrecv_ring ncclSend/ncclRecv in a group: a ring, two messages per
 *                 peer, receives issued before sends
 *   sendrecv_allpairs  every pair, all receives issued before all sends
 *                 (both deadlock without group semantics)
 *   sendrecv_self a send and a receive to self in a group with a ring message
 *   sendrecv      = the three above
 *   group         several different collectives in one group; nested groups
 *   simulate      ncclGroupSimulateEnd: nothing runs, then a real call works
 *   split         ncclCommSplit: color rank%2 (NCCL_SPLIT_NOCOLOR for the last
 *                 rank when N>=3), key N-rank, then membership and order
 *                 checks inside each child; then one color, key 0
 *   multicomm     the parent and a reversed child (ncclCommSplit) used
 *                 alternately, and together in one group
 *   newcomms      two more comms from new unique ids while the first lives:
 *                 all ranks, and a reversed subset created inside a group
 *   threads       two threads per rank, each driving its own comm at once
 *   shrink        ncclCommShrink(NCCL_SHRINK_DEFAULT) excluding rank N-1,
 *                 which stays alive but calls nothing until rank 0 is done
 *   shrink_abort  ncclCommShrink(NCCL_SHRINK_ABORT) excluding rank N-1,
 *                 which exits right after init (a dead rank)
 *   abort         rank 0 blocks in an AllReduce that no peer joins; another
 *                 thread calls ncclCommAbort; the blocked call must return
 *                 an error promptly
 *   peer_fault    every rank loops AllReduce (float32, 65536, every result
 *                 checked) until a call fails. The victim (rank
 *                 $COLL_CHECK_VICTIM, default N-1) writes its pid to
 *                 PATH.victim after its first call, so that the harness
 *                 (tests/peer_faults.rs) can kill -9 or SIGSTOP it in the
 *                 middle of a collective; with COLL_CHECK_VICTIM_IDLE=1 it
 *                 instead stops calling (alive, idle) until PATH.done.
 *                 Survivors print fault.rc (the failing call's code),
 *                 fault.fail_mono_ms (CLOCK_MONOTONIC when it returned),
 *                 fault.async (ncclCommGetAsyncError), fault.later_rc (one
 *                 more AllReduce) and fault.abort_ms (ncclCommAbort).
 *   mismatch      one AllReduce whose shape differs between ranks (tests/
 *                 mismatch_mp.rs): rank 0 passes $COLL_CHECK_MM_COUNT
 *                 (default 100000) float32, the others twice the count
 *                 ($COLL_CHECK_MM_WHAT=count) or the count in float64
 *                 (=dtype). Buffers end at a PROT_NONE page and start
 *                 after one, with canary bytes in the slack; with
 *                 $COLL_CHECK_MM_ALLOC=memalloc they are ncclMemAlloc
 *                 memory (peers map it whole, so canary bytes fill the
 *                 rest of the allocation instead). The call must fail and
 *                 no canary may change; it prints mismatch.rc,
 *                 mismatch.last_error, mismatch.out_untouched,
 *                 mismatch.in_untouched, mismatch.async, mismatch.later_rc
 *                 (a well-formed AllReduce afterwards) and
 *                 mismatch.destroy_rc, then ends the comm (last mode)
 *   collectives   = allreduce,premulsum,broadcast,reduce,allgather,
 *                   reducescatter,alltoall,gather,scatter,sendrecv_ring,
 *                   sendrecv_allpairs,sendrecv_self,group,simulate
 *
 * Reductions use small integers that every datatype holds exactly, so every
 * result is exact whatever the order of the reduction (see red_input). The
 * one exception is ncclAvg on float types when N is not a power of two:
 * NCCL multiplies each input by 1/N rounded to the datatype, so the result is
 * compared with a tolerance of (N+1) units of the type's epsilon.
 * Data-movement collectives use pseudo-random bytes (any bit pattern must be
 * moved unchanged). Every buffer has guard bytes on both sides, and outputs
 * start as 0xCD bytes, so writes out of bounds and missing writes are caught.
 *
 * Output: `key value` lines on stdout. The process exits 0 only when every
 * check matched (`wrong_total 0`). On any NCCL error it prints nccl_error,
 * nccl_error_call, nccl_last_error and nccl_error_context and exits 3.
 */
#define _GNU_SOURCE
#include <nccl.h>

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "nccl_test_common.h"

/* ------------------------------------------------------------------ state */

static int g_rank = -1, g_nranks = -1;
static const char* g_idpath;
static int g_nonblocking;
static long g_checks, g_wrong;   /* totals */
static long m_checks, m_wrong;   /* current mode */
static const char* g_mode = "init";
static char g_ctx[512] = "init";  /* what is being checked, for messages */
static int g_reported;           /* mismatches printed in this check */

#define NDT 12
static int g_dt_on[NDT];
static int g_big_on[NDT];
static size_t g_counts[16];
static int g_ncounts;
#define BIG_COUNT 65536 /* counts above this only run for --big-dtypes */

static const char* dt_name[NDT] = {"int8",    "uint8",   "int32",    "uint32",
                                   "int64",   "uint64",  "float16",  "float32",
                                   "float64", "bfloat16", "f8e4m3", "f8e5m2"};
static const size_t dt_size[NDT] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1};

static int is_float(ncclDataType_t dt) {
  return dt == ncclFloat16 || dt == ncclFloat32 || dt == ncclFloat64 || dt == ncclBfloat16 ||
         dt == ncclFloat8e4m3 || dt == ncclFloat8e5m2;
}
static int is_unsigned(ncclDataType_t dt) {
  return dt == ncclUint8 || dt == ncclUint32 || dt == ncclUint64;
}
static int is_fp8(ncclDataType_t dt) { return dt == ncclFloat8e4m3 || dt == ncclFloat8e5m2; }

/* Prints `key value` with newlines in the value flattened. */
static void kv_str(const char* key, const char* v) {
  printf("%s ", key);
  for (const char* p = v ? v : "(null)"; *p; p++) putchar(*p == '\n' || *p == '\r' ? ' ' : *p);
  putchar('\n');
  fflush(stdout);
}

static void die_nccl(const char* call, ncclResult_t rc, int line) __attribute__((noreturn));
static void die_nccl(const char* call, ncclResult_t rc, int line) {
  printf("nccl_error %d\n", (int)rc);
  kv_str("nccl_error_call", call);
  printf("nccl_error_line %d\n", line);
  kv_str("nccl_error_string", ncclGetErrorString(rc));
  kv_str("nccl_last_error", ncclGetLastError(NULL));
  kv_str("nccl_error_mode", g_mode);
  kv_str("nccl_error_context", g_ctx);
  fprintf(stderr, "rank %d: %s failed: %d (%s): %s [mode %s: %s]\n", g_rank, call, (int)rc,
          ncclGetErrorString(rc), ncclGetLastError(NULL), g_mode, g_ctx);
  fflush(stdout);
  fflush(stderr);
  exit(3);
}

static void die(const char* what) __attribute__((noreturn));
static void die(const char* what) {
  fprintf(stderr, "rank %d: %s (errno %d: %s) [mode %s: %s]\n", g_rank, what, errno,
          strerror(errno), g_mode, g_ctx);
  kv_str("fatal", what);
  exit(4);
}

static ncclResult_t settle(ncclComm_t comm, ncclResult_t rc) {
  return nccl_settle(comm, rc, g_nonblocking);
}

#define NC(comm, call)                                    \
  do {                                                    \
    ncclResult_t rc_ = settle((comm), (call));            \
    if (rc_ != ncclSuccess) die_nccl(#call, rc_, __LINE__); \
  } while (0)

/* ------------------------------------------------------------ checks */

static void fail(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
static void fail(const char* fmt, ...) {
  m_wrong++;
  g_wrong++;
  if (g_reported++ < 5) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "rank %d MISMATCH [%s: %s] ", g_rank, g_mode, g_ctx);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
  }
}

static void begin_check(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
static void begin_check(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(g_ctx, sizeof g_ctx, fmt, ap);
  va_end(ap);
  g_reported = 0;
  m_checks++;
  g_checks++;
}

/* ------------------------------------------------------ guarded buffers */

#define GUARD 64
#define GUARD_BYTE 0xA5
#define FRESH_BYTE 0xCD

static void* galloc(size_t bytes) {
  unsigned char* p = malloc(bytes + 2 * GUARD);
  if (p == NULL) die("malloc");
  memset(p, GUARD_BYTE, GUARD);
  memset(p + GUARD, FRESH_BYTE, bytes);
  memset(p + GUARD + bytes, GUARD_BYTE, GUARD);
  return p + GUARD;
}

static void gcheck(void* b, size_t bytes, const char* name) {
  unsigned char* p = (unsigned char*)b - GUARD;
  for (size_t i = 0; i < GUARD; i++) {
    if (p[i] != GUARD_BYTE) {
      fail("%s: guard byte %zu before the buffer was overwritten", name, GUARD - i);
      break;
    }
  }
  for (size_t i = 0; i < GUARD; i++) {
    if (p[GUARD + bytes + i] != GUARD_BYTE) {
      fail("%s: guard byte %zu after the buffer (%zu bytes) was overwritten", name, i, bytes);
      break;
    }
  }
}

static void gfree(void* b, size_t bytes, const char* name) {
  gcheck(b, bytes, name);
  free((unsigned char*)b - GUARD);
}

/* ------------------------------------------------- narrow float formats */

/* Encodes v (round to nearest even) in a binary format with `eb` exponent
 * bits and `mb` mantissa bits. Only used for values in range. */
static uint32_t enc_small(double v, int eb, int mb) {
  uint32_t sign = signbit(v) ? 1u : 0u;
  double a = fabs(v);
  int bias = (1 << (eb - 1)) - 1;
  uint32_t bits;
  if (a == 0) return sign << (eb + mb);
  int e;
  (void)frexp(a, &e);
  int E = e - 1; /* a in [2^E, 2^(E+1)) */
  if (E < 1 - bias) {
    bits = (uint32_t)nearbyint(ldexp(a, mb - (1 - bias)));
  } else {
    double r = nearbyint(ldexp(a, mb - E));
    if (r >= ldexp(1, mb + 1)) {
      r /= 2;
      E++;
    }
    bits = ((uint32_t)(E + bias) << mb) | ((uint32_t)r - (1u << mb));
  }
  return bits | (sign << (eb + mb));
}

static double dec_small(uint32_t bits, int eb, int mb, int e4m3) {
  int bias = (1 << (eb - 1)) - 1;
  uint32_t sign = (bits >> (eb + mb)) & 1u;
  uint32_t E = (bits >> mb) & ((1u << eb) - 1);
  uint32_t M = bits & ((1u << mb) - 1);
  double v;
  if (e4m3) {
    if (E == 15 && M == 7) return NAN;
  } else if (E == (1u << eb) - 1) {
    return M ? NAN : (sign ? -INFINITY : INFINITY);
  }
  if (E == 0)
    v = ldexp((double)M, 1 - bias - mb);
  else
    v = ldexp((double)(M + (1u << mb)), (int)E - bias - mb);
  return sign ? -v : v;
}

static void store(void* buf, ncclDataType_t dt, size_t i, double v) {
  switch (dt) {
    case ncclInt8: ((int8_t*)buf)[i] = (int8_t)v; break;
    case ncclUint8: ((uint8_t*)buf)[i] = (uint8_t)v; break;
    case ncclInt32: ((int32_t*)buf)[i] = (int32_t)v; break;
    case ncclUint32: ((uint32_t*)buf)[i] = (uint32_t)v; break;
    case ncclInt64: ((int64_t*)buf)[i] = (int64_t)v; break;
    case ncclUint64: ((uint64_t*)buf)[i] = (uint64_t)v; break;
    case ncclFloat16: ((uint16_t*)buf)[i] = (uint16_t)enc_small(v, 5, 10); break;
    case ncclFloat32: ((float*)buf)[i] = (float)v; break;
    case ncclFloat64: ((double*)buf)[i] = v; break;
    case ncclBfloat16: ((uint16_t*)buf)[i] = (uint16_t)enc_small(v, 8, 7); break;
    case ncclFloat8e4m3: ((uint8_t*)buf)[i] = (uint8_t)enc_small(v, 4, 3); break;
    case ncclFloat8e5m2: ((uint8_t*)buf)[i] = (uint8_t)enc_small(v, 5, 2); break;
    default: die("bad dtype");
  }
}

static double load(const void* buf, ncclDataType_t dt, size_t i) {
  switch (dt) {
    case ncclInt8: return ((const int8_t*)buf)[i];
    case ncclUint8: return ((const uint8_t*)buf)[i];
    case ncclInt32: return ((const int32_t*)buf)[i];
    case ncclUint32: return ((const uint32_t*)buf)[i];
    case ncclInt64: return (double)((const int64_t*)buf)[i];
    case ncclUint64: return (double)((const uint64_t*)buf)[i];
    case ncclFloat16: return dec_small(((const uint16_t*)buf)[i], 5, 10, 0);
    case ncclFloat32: return ((const float*)buf)[i];
    case ncclFloat64: return ((const double*)buf)[i];
    case ncclBfloat16: return dec_small(((const uint16_t*)buf)[i], 8, 7, 0);
    case ncclFloat8e4m3: return dec_small(((const uint8_t*)buf)[i], 4, 3, 1);
    case ncclFloat8e5m2: return dec_small(((const uint8_t*)buf)[i], 5, 2, 0);
    default: die("bad dtype");
  }
  return 0;
}

/* The unit roundoff-ish epsilon of a float type (2^-mantissa bits). */
static double dt_eps(ncclDataType_t dt) {
  switch (dt) {
    case ncclFloat16: return ldexp(1, -10);
    case ncclFloat32: return ldexp(1, -23);
    case ncclFloat64: return ldexp(1, -52);
    case ncclBfloat16: return ldexp(1, -7);
    case ncclFloat8e4m3: return ldexp(1, -3);
    case ncclFloat8e5m2: return ldexp(1, -2);
    default: return 0;
  }
}

/* ------------------------------------------------------- reduction data */

enum { OP_SUM, OP_PROD, OP_MAX, OP_MIN, OP_AVG, OP_PM_HOST, OP_PM_DEV, NOPS };
static const char* op_name[NOPS] = {"sum", "prod", "max", "min", "avg", "premulsum_host",
                                    "premulsum_device"};

/* Rank r's input element i for op. Small integers, chosen so that every
 * partial result of any reduction order is exactly representable in dt:
 * - sum/avg/premulsum: [-1,2] ([0,3] unsigned; {-1,0,1} for fp8, whose
 *   integers are exact only up to 8 (e5m2) or 16 (e4m3));
 * - prod: 1 and 2 (and -1 when signed), at most three 2s over 8 ranks;
 * - max/min: [-3,3] ([0,6] unsigned). */
static double red_input(int op, int r, size_t i, ncclDataType_t dt) {
  int uns = is_unsigned(dt);
  switch (op) {
    case OP_PROD:
      if ((i + (size_t)r) % 3 == 0) return 2;
      if (!uns && (i * 5 + (size_t)r) % 7 == 3) return -1;
      return 1;
    case OP_MAX:
    case OP_MIN: return (double)((i * 5 + (size_t)r * 11) % 7) - (uns ? 0 : 3);
    default:
      if (is_fp8(dt)) return (double)((i * 7 + (size_t)r * 3) % 3) - 1;
      return (double)((i * 7 + (size_t)r * 3) % 4) - (uns ? 0 : 1);
  }
}

/* PreMulSum scalars: host-immediate 2; device-resident 0.5 (floats) or 3. */
static double pm_scalar(int op, ncclDataType_t dt) {
  if (op == OP_PM_HOST) return 2;
  return is_float(dt) ? 0.5 : 3;
}

/* The exact result for element i (ranks 0..n-1) and the tolerance. */
static double red_expect(int op, size_t i, ncclDataType_t dt, int n, double* tol) {
  double acc = 0;
  double sabs = 0;
  *tol = 0;
  for (int r = 0; r < n; r++) {
    double x = red_input(op, r, i, dt);
    if (op == OP_PM_HOST || op == OP_PM_DEV) x *= pm_scalar(op, dt);
    sabs += fabs(x);
    if (r == 0) {
      acc = x;
      continue;
    }
    switch (op) {
      case OP_PROD: acc *= x; break;
      case OP_MAX: acc = x > acc ? x : acc; break;
      case OP_MIN: acc = x < acc ? x : acc; break;
      default: acc += x;
    }
  }
  if (op == OP_AVG) {
    if (!is_float(dt)) {
      acc = trunc(acc / n);
    } else {
      acc = acc / n;
      if ((n & (n - 1)) != 0) *tol = (n + 1) * dt_eps(dt) * (sabs / n + 1e-300) + 1e-300;
    }
  }
  return acc;
}

static ncclRedOp_t builtin_op(int op) {
  switch (op) {
    case OP_SUM: return ncclSum;
    case OP_PROD: return ncclProd;
    case OP_MAX: return ncclMax;
    case OP_MIN: return ncclMin;
    default: return ncclAvg;
  }
}

/* A reduction op for the checks: the built-in one, or a PreMulSum created
 * on comm. For the device-resident scalar, the pointed-to value is first 7
 * and is changed to the real scalar only after creation: NCCL reads a
 * device scalar when the collective runs, not when the op is created. */
typedef struct {
  ncclRedOp_t op;
  int created;
  unsigned char scalar[16];
} redop_t;

static void redop_make(redop_t* o, int op, ncclDataType_t dt, ncclComm_t comm) {
  memset(o, 0, sizeof *o);
  if (op != OP_PM_HOST && op != OP_PM_DEV) {
    o->op = builtin_op(op);
    return;
  }
  if (op == OP_PM_HOST) {
    store(o->scalar, dt, 0, pm_scalar(op, dt));
    NC(comm, ncclRedOpCreatePreMulSum(&o->op, o->scalar, dt, ncclScalarHostImmediate, comm));
    memset(o->scalar, 0, sizeof o->scalar); /* copied at creation: clobbering is harmless */
  } else {
    store(o->scalar, dt, 0, 7);
    NC(comm, ncclRedOpCreatePreMulSum(&o->op, o->scalar, dt, ncclScalarDevice, comm));
    store(o->scalar, dt, 0, pm_scalar(op, dt));
  }
  o->created = 1;
}

static void redop_free(redop_t* o, ncclComm_t comm) {
  if (o->created) NC(comm, ncclRedOpDestroy(o->op, comm));
}

/* Compares element i of buf with want (within tol). */
static int check_elem(const void* buf, ncclDataType_t dt, size_t i, double want, double tol,
                      const char* what) {
  double got = load(buf, dt, i);
  double w = want;
  if (tol == 0) {
    /* Round the expectation through the type (it is exact by construction;
     * this also gives integer types their wrap-around). */
    unsigned char tmp[8];
    store(tmp, dt, 0, want);
    w = load(tmp, dt, 0);
  }
  int ok = tol == 0 ? got == w : fabs(got - w) <= tol;
  if (!ok) fail("%s[%zu] = %.17g, want %.17g (tol %g)", what, i, got, w, tol);
  return ok;
}

/* -------------------------------------------------------- byte patterns */

static inline unsigned char pat(int src, int dst, size_t byte, int salt) {
  uint64_t h = (uint64_t)(src + 1) * 0x9E3779B97F4A7C15ull ^ (uint64_t)(dst + 3) * 0xC2B2AE3D27D4EB4Full ^
               (uint64_t)(salt + 7) * 0x165667B19E3779F9ull ^ (uint64_t)byte * 0x27D4EB2F165667C5ull;
  h ^= h >> 29;
  h *= 0xBF58476D1CE4E5B9ull;
  h ^= h >> 32;
  return (unsigned char)h;
}

static void pat_fill(void* buf, size_t bytes, int src, int dst, int salt) {
  unsigned char* b = buf;
  for (size_t k = 0; k < bytes; k++) b[k] = pat(src, dst, k, salt);
}

/* Checks bytes of buf against the pattern; esz is the element size for the
 * message. */
static void pat_check(const void* buf, size_t bytes, size_t esz, int src, int dst, int salt,
                      const char* what) {
  const unsigned char* b = buf;
  for (size_t k = 0; k < bytes; k++) {
    if (b[k] != pat(src, dst, k, salt)) {
      fail("%s: element %zu byte %zu = 0x%02x, want 0x%02x (data from rank %d for rank %d)", what,
           k / esz, k % esz, b[k], pat(src, dst, k, salt), src, dst);
      /* one message per element */
      k = (k / esz + 1) * esz - 1;
    }
  }
}

static void fresh_check(const void* buf, size_t bytes, const char* what) {
  const unsigned char* b = buf;
  for (size_t k = 0; k < bytes; k++) {
    if (b[k] != FRESH_BYTE) {
      fail("%s: byte %zu = 0x%02x was written, want untouched 0x%02x", what, k, b[k], FRESH_BYTE);
      return;
    }
  }
}

/* -------------------------------------------------------- iteration */

#define FOR_DT(dt) \
  for (int dt_i_ = 0; dt_i_ < NDT; dt_i_++) \
    if (g_dt_on[dt_i_] && ((dt) = (ncclDataType_t)dt_i_, 1))

static int count_on(ncclDataType_t dt, size_t count) {
  return count <= BIG_COUNT || g_big_on[dt];
}

/* Big counts run only with ncclSum and only with root N-1 (they test
 * chunking and pipelining, which do not depend on the op or the root). */
static int big_op_on(int op, size_t count) { return count <= BIG_COUNT || op == OP_SUM; }
static int big_root_on(int root, size_t count) { return count <= BIG_COUNT || root == g_nranks - 1; }

static int salt_seq;

/* --------------------------------------------------------- AllReduce */

static void check_allreduce_one(ncclComm_t comm, int op, ncclDataType_t dt, size_t count,
                                int inplace) {
  size_t es = dt_size[dt], bytes = count * es;
  begin_check("AllReduce %s %s count=%zu %s", op_name[op], dt_name[dt], count,
              inplace ? "in-place" : "out-of-place");
  void* send = galloc(bytes);
  void* recv = inplace ? send : galloc(bytes);
  for (size_t i = 0; i < count; i++) store(send, dt, i, red_input(op, g_rank, i, dt));
  redop_t o;
  redop_make(&o, op, dt, comm);
  NC(comm, ncclAllReduce(send, recv, count, dt, o.op, comm, NULL));
  redop_free(&o, comm);
  for (size_t i = 0; i < count; i++) {
    double tol, want = red_expect(op, i, dt, g_nranks, &tol);
    check_elem(recv, dt, i, want, tol, "recvbuff");
  }
  if (!inplace) {
    for (size_t i = 0; i < count; i++)
      check_elem(send, dt, i, red_input(op, g_rank, i, dt), 0, "sendbuff (must be unchanged)");
    gfree(recv, bytes, "recvbuff");
  }
  gfree(send, bytes, "sendbuff");
}

static void mode_allreduce(ncclComm_t comm, int first_op, int last_op) {
  ncclDataType_t dt;
  for (int c = 0; c < g_ncounts; c++)
    FOR_DT(dt) {
      if (!count_on(dt, g_counts[c])) continue;
      for (int op = first_op; op <= last_op; op++)
        for (int ip = 0; ip < 2 && big_op_on(op, g_counts[c]); ip++)
          check_allreduce_one(comm, op, dt, g_counts[c], ip);
    }
}

/* ------------------------------------------------------------ Reduce */

static void check_reduce_one(ncclComm_t comm, int op, ncclDataType_t dt, size_t count, int root,
                             int inplace) {
  size_t es = dt_size[dt], bytes = count * es;
  begin_check("Reduce %s %s count=%zu root=%d %s", op_name[op], dt_name[dt], count, root,
              inplace ? "in-place" : "out-of-place");
  void* send = galloc(bytes);
  void* recv = inplace ? send : galloc(bytes);
  for (size_t i = 0; i < count; i++) store(send, dt, i, red_input(op, g_rank, i, dt));
  redop_t o;
  redop_make(&o, op, dt, comm);
  NC(comm, ncclReduce(send, recv, count, dt, o.op, root, comm, NULL));
  redop_free(&o, comm);
  if (g_rank == root) {
    for (size_t i = 0; i < count; i++) {
      double tol, want = red_expect(op, i, dt, g_nranks, &tol);
      check_elem(recv, dt, i, want, tol, "recvbuff at root");
    }
  }
  if (!inplace) {
    for (size_t i = 0; i < count; i++)
      check_elem(send, dt, i, red_input(op, g_rank, i, dt), 0, "sendbuff (must be unchanged)");
    gfree(recv, bytes, "recvbuff");
  }
  gfree(send, bytes, "sendbuff");
}

static void mode_reduce(ncclComm_t comm, int first_op, int last_op) {
  ncclDataType_t dt;
  int roots[2] = {0, g_nranks - 1};
  for (int c = 0; c < g_ncounts; c++)
    FOR_DT(dt) {
      if (!count_on(dt, g_counts[c])) continue;
      for (int op = first_op; op <= last_op; op++)
        for (int ri = 0; ri < 2; ri++)
          for (int ip = 0; ip < 2 && big_op_on(op, g_counts[c]) && big_root_on(roots[ri], g_counts[c]); ip++)
            check_reduce_one(comm, op, dt, g_counts[c], roots[ri], ip);
    }
}

/* ----------------------------------------------------- ReduceScatter */

static void check_reducescatter_one(ncclComm_t comm, int op, ncclDataType_t dt, size_t count,
                                    int inplace) {
  size_t es = dt_size[dt], n = (size_t)g_nranks;
  begin_check("ReduceScatter %s %s recvcount=%zu %s", op_name[op], dt_name[dt], count,
              inplace ? "in-place" : "out-of-place");
  void* send = galloc(n * count * es);
  void* recv = inplace ? (char*)send + (size_t)g_rank * count * es : galloc(count * es);
  for (size_t i = 0; i < n * count; i++) store(send, dt, i, red_input(op, g_rank, i, dt));
  redop_t o;
  redop_make(&o, op, dt, comm);
  NC(comm, ncclReduceScatter(send, recv, count, dt, o.op, comm, NULL));
  redop_free(&o, comm);
  for (size_t i = 0; i < count; i++) {
    double tol, want = red_expect(op, (size_t)g_rank * count + i, dt, g_nranks, &tol);
    check_elem(recv, dt, i, want, tol, "recvbuff");
  }
  if (!inplace) {
    for (size_t i = 0; i < n * count; i++)
      check_elem(send, dt, i, red_input(op, g_rank, i, dt), 0, "sendbuff (must be unchanged)");
    gfree(recv, count * es, "recvbuff");
  } else {
    /* The other ranks' blocks of sendbuff are inputs: NCCL leaves them
     * unspecified, so they are not checked. */
  }
  gfree(send, n * count * es, "sendbuff");
}

static void mode_reducescatter(ncclComm_t comm, int first_op, int last_op) {
  ncclDataType_t dt;
  for (int c = 0; c < g_ncounts; c++)
    FOR_DT(dt) {
      if (!count_on(dt, g_counts[c])) continue;
      for (int op = first_op; op <= last_op; op++)
        for (int ip = 0; ip < 2 && big_op_on(op, g_counts[c]); ip++)
          check_reducescatter_one(comm, op, dt, g_counts[c], ip);
    }
}

/* --------------------------------------------------------- Broadcast */

static void check_broadcast_one(ncclComm_t comm, ncclDataType_t dt, size_t count, int root,
                                int variant /* 0 out-of-place, 1 in-place, 2 ncclBcast */) {
  size_t es = dt_size[dt], bytes = count * es;
  int salt = ++salt_seq;
  static const char* vn[3] = {"out-of-place", "in-place", "ncclBcast"};
  begin_check("Broadcast %s count=%zu root=%d %s", dt_name[dt], count, root, vn[variant]);
  void* send = galloc(bytes);
  void* recv = variant ? send : galloc(bytes);
  /* Every rank fills its sendbuff; only the root's may arrive. */
  pat_fill(send, bytes, g_rank, -1, salt);
  if (variant == 2)
    NC(comm, ncclBcast(send, count, dt, root, comm, NULL));
  else
    NC(comm, ncclBroadcast(send, recv, count, dt, root, comm, NULL));
  pat_check(recv, bytes, es, root, -1, salt, "recvbuff");
  if (!variant) {
    pat_check(send, bytes, es, g_rank, -1, salt, "sendbuff (must be unchanged)");
    gfree(recv, bytes, "recvbuff");
  }
  gfree(send, bytes, "sendbuff");
}

static void mode_broadcast(ncclComm_t comm) {
  ncclDataType_t dt;
  int roots[2] = {0, g_nranks - 1};
  for (int c = 0; c < g_ncounts; c++)
    FOR_DT(dt) {
      if (!count_on(dt, g_counts[c])) continue;
      for (int ri = 0; ri < 2; ri++)
        for (int v = 0; v < 3 && big_root_on(roots[ri], g_counts[c]); v++)
          check_broadcast_one(comm, dt, g_counts[c], roots[ri], v);
    }
}

/* --------------------------------------------------------- AllGather */

static void check_allgather_one(ncclComm_t comm, ncclDataType_t dt, size_t count, int inplace) {
  size_t es = dt_size[dt], bytes = count * es, n = (size_t)g_nranks;
  int salt = ++salt_seq;
  begin_check("AllGather %s sendcount=%zu %s", dt_name[dt], count,
              inplace ? "in-place" : "out-of-place");
  void* recv = galloc(n * bytes);
  void* send = inplace ? (char*)recv + (size_t)g_rank * bytes : galloc(bytes);
  pat_fill(send, bytes, g_rank, -1, salt);
  NC(comm, ncclAllGather(send, recv, count, dt, comm, NULL));
  for (int r = 0; r < g_nranks; r++) {
    char what[64];
    snprintf(what, sizeof what, "recvbuff block %d", r);
    pat_check((char*)recv + (size_t)r * bytes, bytes, es, r, -1, salt, what);
  }
  if (!inplace) {
    pat_check(send, bytes, es, g_rank, -1, salt, "sendbuff (must be unchanged)");
    gfree(send, bytes, "sendbuff");
  }
  gfree(recv, n * bytes, "recvbuff");
}

static void mode_allgather(ncclComm_t comm) {
  ncclDataType_t dt;
  for (int c = 0; c < g_ncounts; c++)
    FOR_DT(dt) {
      if (!count_on(dt, g_counts[c])) continue;
      for (int ip = 0; ip < 2; ip++) check_allgather_one(comm, dt, g_counts[c], ip);
    }
}

/* ---------------------------------------------------------- AlltoAll */

static void check_alltoall_one(ncclComm_t comm, ncclDataType_t dt, size_t count) {
  size_t es = dt_size[dt], bytes = count * es, n = (size_t)g_nranks;
  int salt = ++salt_seq;
  begin_check("AlltoAll %s count=%zu out-of-place", dt_name[dt], count);
  void* send = galloc(n * bytes);
  void* recv = galloc(n * bytes);
  for (int j = 0; j < g_nranks; j++) pat_fill((char*)send + (size_t)j * bytes, bytes, g_rank, j, salt);
  NC(comm, ncclAlltoAll(send, recv, count, dt, comm, NULL));
  for (int r = 0; r < g_nranks; r++) {
    char what[64];
    snprintf(what, sizeof what, "recvbuff block %d", r);
    pat_check((char*)recv + (size_t)r * bytes, bytes, es, r, g_rank, salt, what);
  }
  for (int j = 0; j < g_nranks; j++)
    pat_check((char*)send + (size_t)j * bytes, bytes, es, g_rank, j, salt,
              "sendbuff (must be unchanged)");
  gfree(recv, n * bytes, "recvbuff");
  gfree(send, n * bytes, "sendbuff");
}

static void mode_alltoall(ncclComm_t comm) {
  ncclDataType_t dt;
  for (int c = 0; c < g_ncounts; c++)
    FOR_DT(dt) {
      if (!count_on(dt, g_counts[c])) continue;
      check_alltoall_one(comm, dt, g_counts[c]);
    }
}

/* ------------------------------------------------------------ Gather */

static void check_gather_one(ncclComm_t comm, ncclDataType_t dt, size_t count, int root,
                             int inplace) {
  size_t es = dt_size[dt], bytes = count * es, n = (size_t)g_nranks;
  int salt = ++salt_seq;
  int me_root = g_rank == root;
  begin_check("Gather %s count=%zu root=%d %s", dt_name[dt], count, root,
              inplace ? "in-place" : "out-of-place");
  /* recvbuff exists on every rank (NCCL ignores it on non-roots). */
  void* recv = galloc(me_root ? n * bytes : bytes);
  void* send = (inplace && me_root) ? (char*)recv + (size_t)root * bytes : galloc(bytes);
  pat_fill(send, bytes, g_rank, root, salt);
  NC(comm, ncclGather(send, recv, count, dt, root, comm, NULL));
  if (me_root) {
    for (int r = 0; r < g_nranks; r++) {
      char what[64];
      snprintf(what, sizeof what, "recvbuff block %d at root", r);
      pat_check((char*)recv + (size_t)r * bytes, bytes, es, r, root, salt, what);
    }
  } else {
    fresh_check(recv, bytes, "recvbuff on a non-root rank");
  }
  if (!(inplace && me_root)) {
    pat_check(send, bytes, es, g_rank, root, salt, "sendbuff (must be unchanged)");
    gfree(send, bytes, "sendbuff");
  }
  gfree(recv, me_root ? n * bytes : bytes, "recvbuff");
}

static void mode_gather(ncclComm_t comm) {
  ncclDataType_t dt;
  int roots[2] = {0, g_nranks - 1};
  for (int c = 0; c < g_ncounts; c++)
    FOR_DT(dt) {
      if (!count_on(dt, g_counts[c])) continue;
      for (int ri = 0; ri < 2; ri++)
        for (int ip = 0; ip < 2 && big_root_on(roots[ri], g_counts[c]); ip++)
          check_gather_one(comm, dt, g_counts[c], roots[ri], ip);
    }
}

/* ----------------------------------------------------------- Scatter */

static void check_scatter_one(ncclComm_t comm, ncclDataType_t dt, size_t count, int root,
                              int inplace) {
  size_t es = dt_size[dt], bytes = count * es, n = (size_t)g_nranks;
  int salt = ++salt_seq;
  int me_root = g_rank == root;
  begin_check("Scatter %s count=%zu root=%d %s", dt_name[dt], count, root,
              inplace ? "in-place" : "out-of-place");
  void* send = galloc(me_root ? n * bytes : bytes);
  void* recv = (inplace && me_root) ? (char*)send + (size_t)root * bytes : galloc(bytes);
  if (me_root)
    for (int j = 0; j < g_nranks; j++) pat_fill((char*)send + (size_t)j * bytes, bytes, root, j, salt);
  NC(comm, ncclScatter(send, recv, count, dt, root, comm, NULL));
  pat_check(recv, bytes, es, root, g_rank, salt, "recvbuff");
  if (me_root) {
    for (int j = 0; j < g_nranks; j++)
      pat_check((char*)send + (size_t)j * bytes, bytes, es, root, j, salt,
                "sendbuff at root (must be unchanged)");
  } else {
    fresh_check(send, bytes, "sendbuff on a non-root rank (must be unchanged)");
  }
  if (!(inplace && me_root)) gfree(recv, bytes, "recvbuff");
  gfree(send, me_root ? n * bytes : bytes, "sendbuff");
}

static void mode_scatter(ncclComm_t comm) {
  ncclDataType_t dt;
  int roots[2] = {0, g_nranks - 1};
  for (int c = 0; c < g_ncounts; c++)
    FOR_DT(dt) {
      if (!count_on(dt, g_counts[c])) continue;
      for (int ri = 0; ri < 2; ri++)
        for (int ip = 0; ip < 2 && big_root_on(roots[ri], g_counts[c]); ip++)
          check_scatter_one(comm, dt, g_counts[c], roots[ri], ip);
    }
}

/* ---------------------------------------------------------- Send/Recv */

/* Ring: every rank sends two messages (count and count/2+1 elements) to
 * rank+1 and receives two from rank-1; the receives are issued first, which
 * deadlocks every rank without group semantics. */
static void check_ring(ncclComm_t comm, ncclDataType_t dt, size_t count) {
  size_t es = dt_size[dt];
  size_t c2 = count / 2 + 1;
  int salt = ++salt_seq, salt2 = ++salt_seq;
  int next = (g_rank + 1) % g_nranks, prev = (g_rank + g_nranks - 1) % g_nranks;
  begin_check("Send/Recv ring %s count=%zu,%zu (recv first)", dt_name[dt], count, c2);
  void* s1 = galloc(count * es);
  void* s2 = galloc(c2 * es);
  void* r1 = galloc(count * es);
  void* r2 = galloc(c2 * es);
  pat_fill(s1, count * es, g_rank, next, salt);
  pat_fill(s2, c2 * es, g_rank, next, salt2);
  NC(comm, ncclGroupStart());
  NC(comm, ncclRecv(r1, count, dt, prev, comm, NULL));
  NC(comm, ncclRecv(r2, c2, dt, prev, comm, NULL));
  NC(comm, ncclSend(s1, count, dt, next, comm, NULL));
  NC(comm, ncclSend(s2, c2, dt, next, comm, NULL));
  NC(comm, ncclGroupEnd());
  pat_check(r1, count * es, es, prev, g_rank, salt, "first message");
  pat_check(r2, c2 * es, es, prev, g_rank, salt2, "second message");
  pat_check(s1, count * es, es, g_rank, next, salt, "first sendbuff (must be unchanged)");
  gfree(s1, count * es, "sendbuff 1");
  gfree(s2, c2 * es, "sendbuff 2");
  gfree(r1, count * es, "recvbuff 1");
  gfree(r2, c2 * es, "recvbuff 2");
}

/* All pairs (self excluded): all receives (peers in ascending order) are
 * issued before all sends (peers in descending order). */
static void check_allpairs(ncclComm_t comm, ncclDataType_t dt, size_t count) {
  size_t es = dt_size[dt], bytes = count * es, n = (size_t)g_nranks;
  int salt = ++salt_seq;
  begin_check("Send/Recv all pairs %s count=%zu (recvs first)", dt_name[dt], count);
  void* send = galloc(n * bytes);
  void* recv = galloc(n * bytes);
  for (int j = 0; j < g_nranks; j++) pat_fill((char*)send + (size_t)j * bytes, bytes, g_rank, j, salt);
  NC(comm, ncclGroupStart());
  for (int p = 0; p < g_nranks; p++)
    if (p != g_rank) NC(comm, ncclRecv((char*)recv + (size_t)p * bytes, count, dt, p, comm, NULL));
  for (int p = g_nranks - 1; p >= 0; p--)
    if (p != g_rank) NC(comm, ncclSend((char*)send + (size_t)p * bytes, count, dt, p, comm, NULL));
  NC(comm, ncclGroupEnd());
  for (int p = 0; p < g_nranks; p++) {
    char what[64];
    snprintf(what, sizeof what, "message from rank %d", p);
    if (p != g_rank)
      pat_check((char*)recv + (size_t)p * bytes, bytes, es, p, g_rank, salt, what);
    else
      fresh_check((char*)recv + (size_t)p * bytes, bytes, "own block (no self message)");
  }
  gfree(send, n * bytes, "sendbuff");
  gfree(recv, n * bytes, "recvbuff");
}

/* Send/Recv to self, alone and in a group with a ring exchange (NCCL
 * allows peer == rank inside a group). */
static void check_self(ncclComm_t comm, ncclDataType_t dt, size_t count) {
  size_t es = dt_size[dt], bytes = count * es;
  int salt = ++salt_seq;
  int next = (g_rank + 1) % g_nranks, prev = (g_rank + g_nranks - 1) % g_nranks;
  begin_check("Send/Recv to self (recv first) plus a ring message, %s count=%zu", dt_name[dt], count);
  void* s_self = galloc(bytes);
  void* r_self = galloc(bytes);
  void* s_ring = galloc(bytes);
  void* r_ring = galloc(bytes);
  pat_fill(s_self, bytes, g_rank, g_rank, salt);
  pat_fill(s_ring, bytes, g_rank, next, salt);
  NC(comm, ncclGroupStart());
  NC(comm, ncclRecv(r_self, count, dt, g_rank, comm, NULL));
  NC(comm, ncclRecv(r_ring, count, dt, prev, comm, NULL));
  NC(comm, ncclSend(s_ring, count, dt, next, comm, NULL));
  NC(comm, ncclSend(s_self, count, dt, g_rank, comm, NULL));
  NC(comm, ncclGroupEnd());
  pat_check(r_self, bytes, es, g_rank, g_rank, salt, "message from self");
  pat_check(r_ring, bytes, es, prev, g_rank, salt, "ring message");
  gfree(s_self, bytes, "self sendbuff");
  gfree(r_self, bytes, "self recvbuff");
  gfree(s_ring, bytes, "ring sendbuff");
  gfree(r_ring, bytes, "ring recvbuff");
}

static void mode_sendrecv(ncclComm_t comm, int which /* 1 ring, 2 all pairs, 4 self */) {
  ncclDataType_t dt;
  for (int c = 0; c < g_ncounts; c++)
    FOR_DT(dt) {
      if (!count_on(dt, g_counts[c])) continue;
      if (which & 1) check_ring(comm, dt, g_counts[c]);
      if (which & 2) check_allpairs(comm, dt, g_counts[c]);
      if (which & 4) check_self(comm, dt, g_counts[c]);
    }
}

/* ------------------------------------------------------------- group */

static void check_nested_group(ncclComm_t comm);

/* Four different collectives in one group, each on its own buffers. */
static void mode_group(ncclComm_t comm) {
  size_t n = (size_t)g_nranks;
  int root = g_nranks - 1;
  for (int c = 0; c < g_ncounts; c++) {
    size_t count = g_counts[c];
    if (count > BIG_COUNT) continue;
    int salt = ++salt_seq;
    begin_check("group{AllReduce int32 sum, Broadcast float64 root %d, AllGather uint8, "
                "ReduceScatter float32 max} count=%zu",
                root, count);
    int32_t* ar = galloc(count * 4);
    double* bc = galloc(count * 8);
    uint8_t* ags = galloc(count);
    uint8_t* agr = galloc(n * count);
    float* rss = galloc(n * count * 4);
    float* rsr = galloc(count * 4);
    for (size_t i = 0; i < count; i++) store(ar, ncclInt32, i, red_input(OP_SUM, g_rank, i, ncclInt32));
    pat_fill(bc, count * 8, g_rank, -1, salt);
    pat_fill(ags, count, g_rank, -1, salt);
    for (size_t i = 0; i < n * count; i++) store(rss, ncclFloat32, i, red_input(OP_MAX, g_rank, i, ncclFloat32));
    NC(comm, ncclGroupStart());
    NC(comm, ncclAllReduce(ar, ar, count, ncclInt32, ncclSum, comm, NULL));
    NC(comm, ncclBroadcast(bc, bc, count, ncclFloat64, root, comm, NULL));
    NC(comm, ncclAllGather(ags, agr, count, ncclUint8, comm, NULL));
    NC(comm, ncclReduceScatter(rss, rsr, count, ncclFloat32, ncclMax, comm, NULL));
    NC(comm, ncclGroupEnd());
    for (size_t i = 0; i < count; i++) {
      double tol, want = red_expect(OP_SUM, i, ncclInt32, g_nranks, &tol);
      check_elem(ar, ncclInt32, i, want, tol, "allreduce recvbuff");
      want = red_expect(OP_MAX, (size_t)g_rank * count + i, ncclFloat32, g_nranks, &tol);
      check_elem(rsr, ncclFloat32, i, want, tol, "reducescatter recvbuff");
    }
    pat_check(bc, count * 8, 8, root, -1, salt, "broadcast buffer");
    for (int r = 0; r < g_nranks; r++) pat_check(agr + (size_t)r * count, count, 1, r, -1, salt, "allgather recvbuff");
    gfree(ar, count * 4, "allreduce buffer");
    gfree(bc, count * 8, "broadcast buffer");
    gfree(ags, count, "allgather sendbuff");
    gfree(agr, n * count, "allgather recvbuff");
    gfree(rss, n * count * 4, "reducescatter sendbuff");
    gfree(rsr, count * 4, "reducescatter recvbuff");
  }
  check_nested_group(comm);
}

/* Nested groups: only the outermost ncclGroupEnd runs the operations. The
 * receive is queued in an inner group whose end must not block; the send
 * that completes it is issued after. */
static void check_nested_group(ncclComm_t comm) {
  size_t count = 1021, bytes = count * 4;
  int salt = ++salt_seq;
  int next = (g_rank + 1) % g_nranks, prev = (g_rank + g_nranks - 1) % g_nranks;
  begin_check("nested groups: recv in an inner group, send after it, one outer end");
  void* s1 = galloc(bytes);
  void* r1 = galloc(bytes);
  pat_fill(s1, bytes, g_rank, next, salt);
  NC(comm, ncclGroupStart());
  NC(comm, ncclGroupStart());
  NC(comm, ncclRecv(r1, count, ncclInt32, prev, comm, NULL));
  NC(comm, ncclGroupEnd());
  fresh_check(r1, bytes, "recvbuff before the outermost ncclGroupEnd");
  NC(comm, ncclSend(s1, count, ncclInt32, next, comm, NULL));
  NC(comm, ncclGroupEnd());
  pat_check(r1, bytes, 4, prev, g_rank, salt, "message");
  gfree(s1, bytes, "sendbuff");
  gfree(r1, bytes, "recvbuff");
}

/* ---------------------------------------------------------- simulate */

static void mode_simulate(ncclComm_t comm) {
  size_t count = 1021;
  begin_check("ncclGroupSimulateEnd of a group with one AllReduce: nothing runs");
  float* send = galloc(count * 4);
  float* recv = galloc(count * 4);
  for (size_t i = 0; i < count; i++) send[i] = (float)red_input(OP_SUM, g_rank, i, ncclFloat32);
  ncclSimInfo_t sim = NCCL_SIM_INFO_INITIALIZER;
  NC(comm, ncclGroupStart());
  NC(comm, ncclAllReduce(send, recv, count, ncclFloat32, ncclSum, comm, NULL));
  NC(comm, ncclGroupSimulateEnd(&sim));
  printf("simulate.estimated_us %g\n", (double)sim.estimatedTime);
  if (!(sim.estimatedTime >= 0 && isfinite(sim.estimatedTime)))
    fail("estimatedTime = %g, want a finite value >= 0", (double)sim.estimatedTime);
  fresh_check(recv, count * 4, "recvbuff after a simulated group");
  for (size_t i = 0; i < count; i++)
    check_elem(send, ncclFloat32, i, red_input(OP_SUM, g_rank, i, ncclFloat32), 0, "sendbuff");

  begin_check("AllReduce after ncclGroupSimulateEnd");
  NC(comm, ncclAllReduce(send, recv, count, ncclFloat32, ncclSum, comm, NULL));
  for (size_t i = 0; i < count; i++) {
    double tol, want = red_expect(OP_SUM, i, ncclFloat32, g_nranks, &tol);
    check_elem(recv, ncclFloat32, i, want, tol, "recvbuff");
  }
  gfree(send, count * 4, "sendbuff");
  gfree(recv, count * 4, "recvbuff");
}

/* ------------------------------------------------------------- split */

/* Inside a child comm: its size and my rank in it; an int64 sum of
 * 1<<parent_rank gives the member set; an allgather of parent ranks gives
 * the order. `members` lists the parent ranks in expected child order. */
static void check_child(ncclComm_t child, const int* members, int nm, const char* label) {
  int cnt = -1, me = -1, want_me = -1;
  for (int k = 0; k < nm; k++)
    if (members[k] == g_rank) want_me = k;
  begin_check("%s: ncclCommCount/ncclCommUserRank", label);
  NC(child, ncclCommCount(child, &cnt));
  NC(child, ncclCommUserRank(child, &me));
  if (cnt != nm) fail("ncclCommCount = %d, want %d", cnt, nm);
  if (me != want_me) fail("ncclCommUserRank = %d, want %d", me, want_me);
  if (cnt != nm || me != want_me) return;

  begin_check("%s: AllReduce of 1<<parent_rank", label);
  int64_t mask = (int64_t)1 << g_rank, want_mask = 0;
  for (int k = 0; k < nm; k++) want_mask |= (int64_t)1 << members[k];
  NC(child, ncclAllReduce(&mask, &mask, 1, ncclInt64, ncclSum, child, NULL));
  if (mask != want_mask) fail("member mask 0x%llx, want 0x%llx", (long long)mask, (long long)want_mask);

  begin_check("%s: AllGather of parent ranks (order)", label);
  int32_t* all = galloc((size_t)nm * 4);
  int32_t mine = g_rank;
  NC(child, ncclAllGather(&mine, all, 1, ncclInt32, child, NULL));
  for (int k = 0; k < nm; k++)
    if (all[k] != members[k]) fail("child rank %d is parent rank %d, want %d", k, all[k], members[k]);
  gfree(all, (size_t)nm * 4, "allgather recvbuff");
}

static void mode_split(ncclComm_t comm) {
  int n = g_nranks;
  int nocolor_rank = n >= 3 ? n - 1 : -1;
  int color = g_rank == nocolor_rank ? NCCL_SPLIT_NOCOLOR : g_rank % 2;
  int key = n - g_rank;
  ncclComm_t child = NULL;
  NC(comm, ncclCommSplit(comm, color, key, &child, NULL));
  if (color == NCCL_SPLIT_NOCOLOR) {
    begin_check("ncclCommSplit with NCCL_SPLIT_NOCOLOR gives no comm");
    if (child != NULL) fail("newcomm = %p, want NULL", (void*)child);
  } else {
    /* Members: same color, not NOCOLOR, ordered by key = n - rank, i.e. by
     * descending parent rank. */
    int members[64], nm = 0;
    for (int r = n - 1; r >= 0; r--)
      if (r != nocolor_rank && r % 2 == color) members[nm++] = r;
    char label[64];
    snprintf(label, sizeof label, "split color %d key %d", color, key);
    if (child == NULL) {
      begin_check("%s", label);
      fail("newcomm is NULL");
    } else {
      check_child(child, members, nm, label);
      NC(child, ncclCommDestroy(child));
    }
  }

  /* One color, equal keys: the parent's order. */
  child = NULL;
  NC(comm, ncclCommSplit(comm, 0, 0, &child, NULL));
  int all[64];
  for (int r = 0; r < n; r++) all[r] = r;
  if (child == NULL) {
    begin_check("split one color key 0");
    fail("newcomm is NULL");
  } else {
    check_child(child, all, n, "split one color key 0");
    NC(child, ncclCommDestroy(child));
  }

  /* The parent still works. */
  begin_check("parent AllReduce after splits");
  int64_t v = g_rank + 1;
  NC(comm, ncclAllReduce(&v, &v, 1, ncclInt64, ncclSum, comm, NULL));
  if (v != (int64_t)n * (n + 1) / 2) fail("sum %lld, want %lld", (long long)v, (long long)n * (n + 1) / 2);
}

/* ---------------------------------------------------------- multicomm */

/* Two communicators over the same ranks: the parent and a child in reversed
 * order (ncclCommSplit, one color, key N-rank). Collectives alternate
 * between them, then one group holds operations on both. */
static void mode_multicomm(ncclComm_t comm) {
  int n = g_nranks;
  ncclComm_t rev = NULL;
  NC(comm, ncclCommSplit(comm, 0, n - g_rank, &rev, NULL));
  begin_check("reversed child comm exists");
  if (rev == NULL) {
    fail("newcomm is NULL");
    return;
  }
  int rrank = -1;
  NC(rev, ncclCommUserRank(rev, &rrank));
  if (rrank != n - 1 - g_rank) fail("child rank %d, want %d", rrank, n - 1 - g_rank);

  int32_t* pa = galloc((size_t)n * 4);
  int32_t* ca = galloc((size_t)n * 4);
  for (int round = 0; round < 3; round++) {
    begin_check("alternating AllGathers on parent and reversed child, round %d", round);
    int32_t mine = 1000 * round + g_rank;
    NC(comm, ncclAllGather(&mine, pa, 1, ncclInt32, comm, NULL));
    NC(rev, ncclAllGather(&mine, ca, 1, ncclInt32, rev, NULL));
    for (int k = 0; k < n; k++) {
      if (pa[k] != 1000 * round + k) fail("parent block %d = %d, want %d", k, pa[k], 1000 * round + k);
      if (ca[k] != 1000 * round + (n - 1 - k))
        fail("child block %d = %d, want %d", k, ca[k], 1000 * round + (n - 1 - k));
    }
  }

  begin_check("one group: AllReduce on the parent, Broadcast (root 0 = parent rank N-1) on the child");
  size_t count = 1021;
  int64_t* ar = galloc(count * 8);
  int64_t* bc = galloc(count * 8);
  for (size_t i = 0; i < count; i++) {
    ar[i] = (int64_t)red_input(OP_SUM, g_rank, i, ncclInt64);
    bc[i] = g_rank * 100000 + (int64_t)i;
  }
  NC(comm, ncclGroupStart());
  NC(comm, ncclAllReduce(ar, ar, count, ncclInt64, ncclSum, comm, NULL));
  NC(rev, ncclBroadcast(bc, bc, count, ncclInt64, 0, rev, NULL));
  NC(comm, ncclGroupEnd());
  for (size_t i = 0; i < count; i++) {
    double tol, want = red_expect(OP_SUM, i, ncclInt64, n, &tol);
    check_elem(ar, ncclInt64, i, want, tol, "parent allreduce");
    if (bc[i] != (int64_t)(n - 1) * 100000 + (int64_t)i)
      fail("child broadcast[%zu] = %lld, want %lld", i, (long long)bc[i],
           (long long)((n - 1) * 100000 + (int64_t)i));
  }
  gfree(ar, count * 8, "allreduce buffer");
  gfree(bc, count * 8, "broadcast buffer");
  gfree(pa, (size_t)n * 4, "parent allgather");
  gfree(ca, (size_t)n * 4, "child allgather");
  NC(rev, ncclCommDestroy(rev));
}

/* ------------------------------------------------------------ threads */

/* Two comms used at the same time from two threads of every rank: thread A
 * runs AllReduces on the parent while thread B runs AllGathers on a child.
 * Mismatches are counted per thread and added up after the join. */
typedef struct {
  ncclComm_t comm;
  int iters;
  int is_allgather;
  long wrong;
  ncclResult_t rc;
  char err[256];
} thr_ctx;

static void* thr_body(void* p) {
  thr_ctx* t = p;
  int n = g_nranks;
  size_t count = 1021;
  int32_t* buf = malloc((size_t)n * count * 4);
  int32_t* in = malloc(count * 4);
  if (!buf || !in) die("malloc");
  for (int it = 0; it < t->iters && t->rc == ncclSuccess; it++) {
    for (size_t i = 0; i < count; i++) in[i] = (int32_t)(g_rank * 7 + it + (int)i % 5);
    if (t->is_allgather)
      t->rc = ncclAllGather(in, buf, count, ncclInt32, t->comm, NULL);
    else
      t->rc = ncclAllReduce(in, buf, count, ncclInt32, ncclSum, t->comm, NULL);
    if (t->rc != ncclSuccess) {
      snprintf(t->err, sizeof t->err, "%s", ncclGetLastError(NULL));
      break;
    }
    for (size_t i = 0; i < count; i++) {
      if (t->is_allgather) {
        for (int r = 0; r < n; r++)
          if (buf[(size_t)r * count + i] != (int32_t)(r * 7 + it + (int)i % 5)) t->wrong++;
      } else {
        int32_t want = 0;
        for (int r = 0; r < n; r++) want += (int32_t)(r * 7 + it + (int)i % 5);
        if (buf[i] != want) t->wrong++;
      }
    }
  }
  free(buf);
  free(in);
  return NULL;
}

static void mode_threads(ncclComm_t comm) {
  ncclComm_t child = NULL;
  NC(comm, ncclCommSplit(comm, 0, g_rank, &child, NULL));
  begin_check("child comm for the threads mode exists");
  if (child == NULL) {
    fail("newcomm is NULL");
    return;
  }
  thr_ctx a = {comm, 40, 0, 0, ncclSuccess, ""}, b = {child, 40, 1, 0, ncclSuccess, ""};
  pthread_t ta, tb;
  if (pthread_create(&ta, NULL, thr_body, &a) != 0 || pthread_create(&tb, NULL, thr_body, &b) != 0)
    die("pthread_create");
  pthread_join(ta, NULL);
  pthread_join(tb, NULL);
  begin_check("thread A: 40 AllReduces on the parent, concurrent with thread B");
  if (a.rc != ncclSuccess) fail("ncclAllReduce = %d: %s", (int)a.rc, a.err);
  if (a.wrong) fail("%ld wrong elements", a.wrong);
  begin_check("thread B: 40 AllGathers on a child, concurrent with thread A");
  if (b.rc != ncclSuccess) fail("ncclAllGather = %d: %s", (int)b.rc, b.err);
  if (b.wrong) fail("%ld wrong elements", b.wrong);
  if (a.rc == ncclSuccess && b.rc == ncclSuccess) NC(child, ncclCommDestroy(child));
}

/* ------------------------------------------------------- files (sync) */

static void write_file_atomic(const char* path, const void* data, size_t len) {
  char tmp[4096];
  snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
  int fd = open(tmp, O_CREAT | O_EXCL | O_WRONLY, 0600);
  if (fd < 0) die("create the id file");
  if (len && write(fd, data, len) != (ssize_t)len) die("write the id file");
  if (fsync(fd) != 0) die("fsync");
  close(fd);
  if (rename(tmp, path) != 0) die("rename the id file");
}

/* Waits up to timeout_s for path to exist with len bytes and reads them. */
static int wait_file(const char* path, void* data, size_t len, double timeout_s) {
  double deadline = now_ms() + timeout_s * 1e3;
  for (;;) {
    int fd = open(path, O_RDONLY);
    if (fd >= 0) {
      ssize_t got = len ? read(fd, data, len) : 0;
      close(fd);
      if (got == (ssize_t)len) return 0;
    }
    if (now_ms() > deadline) return -1;
    usleep(5000);
  }
}

static double file_timeout_s(void) {
  const char* t = getenv("HETCCL_TIMEOUT_S");
  double v = t ? atof(t) : 0;
  return v > 0 ? v + 30 : 120;
}

static void done_path(char* buf, size_t n) { snprintf(buf, n, "%s.done", g_idpath); }

/* ------------------------------------------------------------ shrink */

static void mode_shrink(ncclComm_t comm, int abort_flag) {
  int excluded = g_nranks - 1;
  char done[4096];
  done_path(done, sizeof done);
  if (g_rank == excluded) {
    if (abort_flag) {
      /* A dead rank: gone without a word. */
      printf("shrink.excluded 1\nchecks %ld\nwrong_total %ld\ndone 1\n", g_checks, g_wrong);
      fflush(stdout);
      _exit(g_wrong == 0 ? 0 : 1);
    }
    /* Alive but calls nothing until the survivors are done. */
    if (wait_file(done, NULL, 0, file_timeout_s()) != 0) die("rank 0 never finished the shrink");
    printf("shrink.excluded 1\n");
    NC(comm, ncclCommDestroy(comm));
    return;
  }
  ncclComm_t child = NULL;
  int ex[1] = {excluded};
  NC(comm, ncclCommShrink(comm, ex, 1, &child, NULL,
                          abort_flag ? NCCL_SHRINK_ABORT : NCCL_SHRINK_DEFAULT));
  int members[64];
  for (int r = 0; r < g_nranks - 1; r++) members[r] = r;
  if (child == NULL) {
    begin_check("ncclCommShrink excluding rank %d", excluded);
    fail("newcomm is NULL");
  } else {
    check_child(child, members, g_nranks - 1, abort_flag ? "shrink (abort)" : "shrink");
    NC(child, ncclCommDestroy(child));
  }
  if (abort_flag)
    NC(comm, ncclCommAbort(comm));
  else
    NC(comm, ncclCommDestroy(comm));
  if (g_rank == 0) write_file_atomic(done, NULL, 0);
}

/* ------------------------------------------------------------- abort */

typedef struct {
  ncclComm_t comm;
  float* buf;
  volatile int returned;
  ncclResult_t rc;
  double t_return;
} abort_ctx;

static void* abort_worker(void* p) {
  abort_ctx* a = p;
  a->rc = ncclAllReduce(a->buf, a->buf, 1024, ncclFloat32, ncclSum, a->comm, NULL);
  a->t_return = now_ms();
  __atomic_store_n(&a->returned, 1, __ATOMIC_SEQ_CST);
  return NULL;
}

static void mode_abort(ncclComm_t comm) {
  char done[4096];
  done_path(done, sizeof done);
  if (g_rank != 0) {
    /* Never joins rank 0's AllReduce. */
    if (wait_file(done, NULL, 0, file_timeout_s()) != 0) die("rank 0 never finished the abort");
    NC(comm, ncclCommAbort(comm));
    return;
  }
  abort_ctx a = {comm, galloc(1024 * 4), 0, ncclSuccess, 0};
  memset(a.buf, 0, 1024 * 4);
  pthread_t th;
  if (pthread_create(&th, NULL, abort_worker, &a) != 0) die("pthread_create");
  usleep(500 * 1000);
  begin_check("AllReduce that no peer joins is still blocked after 500 ms");
  int early = __atomic_load_n(&a.returned, __ATOMIC_SEQ_CST);
  if (early) fail("it returned %d already: %s", (int)a.rc, ncclGetLastError(NULL));
  begin_check("ncclCommAbort from another thread");
  double t0 = now_ms();
  ncclResult_t rc = ncclCommAbort(comm);
  double t_abort = now_ms() - t0;
  printf("abort.rc %d\n", (int)rc);
  printf("abort.abort_ms %.1f\n", t_abort);
  if (rc != ncclSuccess) fail("ncclCommAbort = %d: %s", (int)rc, ncclGetLastError(NULL));
  begin_check("the blocked AllReduce returns an error promptly after ncclCommAbort");
  double deadline = now_ms() + 20e3;
  while (!__atomic_load_n(&a.returned, __ATOMIC_SEQ_CST) && now_ms() < deadline) usleep(1000);
  if (!__atomic_load_n(&a.returned, __ATOMIC_SEQ_CST)) {
    fail("still blocked 20 s after ncclCommAbort");
    printf("abort.worker_returned 0\n");
    write_file_atomic(done, NULL, 0);
    return; /* cannot join; main() exits, killing the thread */
  }
  pthread_join(th, NULL);
  double ms = a.t_return - t0;
  if (early) ms = 0;
  printf("abort.worker_returned 1\n");
  printf("abort.worker_rc %d\n", (int)a.rc);
  printf("abort.return_ms %.1f\n", ms);
  if (a.rc == ncclSuccess) fail("the blocked AllReduce returned ncclSuccess");
  if (ms > 10e3) fail("the blocked AllReduce returned %.0f ms after ncclCommAbort", ms);
  write_file_atomic(done, NULL, 0);
}

/* -------------------------------------------------------- peer_fault */

static double mono_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static void mode_peer_fault(ncclComm_t comm) {
  const char* v = getenv("COLL_CHECK_VICTIM");
  int victim = v ? atoi(v) : g_nranks - 1;
  int idle = getenv("COLL_CHECK_VICTIM_IDLE") && atoi(getenv("COLL_CHECK_VICTIM_IDLE")) == 1;
  char vpath[4096], done[4096];
  snprintf(vpath, sizeof vpath, "%s.victim", g_idpath);
  done_path(done, sizeof done);
  const size_t count = 65536;
  float* buf = galloc(count * 4);
  double limit = now_ms() + file_timeout_s() * 1e3;
  long iter;
  ncclResult_t rc = ncclSuccess;
  for (iter = 0;; iter++) {
    if (g_rank == victim && iter == 1) {
      char pid[32];
      int n = snprintf(pid, sizeof pid, "%d\n", (int)getpid());
      write_file_atomic(vpath, pid, (size_t)n);
      if (idle) {
        /* Alive, but never calls again until the survivors are done. */
        if (wait_file(done, NULL, 0, file_timeout_s()) != 0) die("the survivors never finished");
        printf("fault.victim_idle 1\n");
        NC(comm, ncclCommAbort(comm));
        gfree(buf, count * 4, "peer_fault buffer");
        return;
      }
    }
    for (size_t i = 0; i < count; i++) buf[i] = (float)((g_rank + 1) * (int)(1 + (i + iter) % 5));
    begin_check("peer_fault AllReduce iteration %ld", iter);
    rc = ncclAllReduce(buf, buf, count, ncclFloat32, ncclSum, comm, NULL);
    if (rc != ncclSuccess) break;
    /* sum over r of (r+1)*k = k*N(N+1)/2 */
    for (size_t i = 0; i < count; i++) {
      float want = (float)((int)(1 + (i + iter) % 5) * g_nranks * (g_nranks + 1) / 2);
      if (buf[i] != want) {
        fail("element %zu = %g, want %g", i, (double)buf[i], (double)want);
        break;
      }
    }
    if (now_ms() > limit) {
      fail("no call failed within %.0f s", file_timeout_s());
      break;
    }
  }
  double t_fail = mono_ms();
  printf("fault.iter %ld\n", iter);
  printf("fault.rc %d\n", (int)rc);
  printf("fault.fail_mono_ms %.1f\n", t_fail);
  printf("fault.last_error %s\n", ncclGetLastError(comm));
  ncclResult_t ae = ncclSuccess;
  ncclResult_t grc = ncclCommGetAsyncError(comm, &ae);
  printf("fault.async_rc %d\nfault.async %d\n", (int)grc, (int)ae);
  double t = now_ms();
  ncclResult_t later = ncclAllReduce(buf, buf, count, ncclFloat32, ncclSum, comm, NULL);
  printf("fault.later_rc %d\nfault.later_ms %.1f\n", (int)later, now_ms() - t);
  t = now_ms();
  ncclResult_t arc = ncclCommAbort(comm);
  printf("fault.abort_rc %d\nfault.abort_ms %.1f\n", (int)arc, now_ms() - t);
  fflush(stdout);
  if (g_rank == 0) write_file_atomic(done, NULL, 0);
  gfree(buf, count * 4, "peer_fault buffer");
}

/* ---------------------------------------------------------- mismatch */

#define MM_CANARY 0x3C

/* A buffer of `len` bytes: between two PROT_NONE pages (it ends where the
 * second starts), or at the start of an ncclMemAlloc allocation; canary
 * bytes fill the rest of its pages. */
typedef struct {
  unsigned char *map, *buf;
  size_t map_len, len, page;
  int memalloc;
} mm_buf;

static void mm_alloc(mm_buf* b, size_t len, int memalloc, ncclComm_t comm) {
  b->page = (size_t)sysconf(_SC_PAGESIZE);
  b->len = len;
  b->memalloc = memalloc;
  size_t body = (len + b->page - 1) / b->page * b->page;
  if (body == 0) body = b->page;
  if (memalloc) {
    void* p = NULL;
    b->map_len = body + b->page;
    NC(comm, ncclMemAlloc(&p, b->map_len));
    b->map = b->buf = p;
    memset(b->buf + len, MM_CANARY, b->map_len - len);
  } else {
    b->map_len = body + 2 * b->page;
    void* p = mmap(NULL, b->map_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) die("mmap");
    b->map = p;
    if (mprotect(b->map, b->page, PROT_NONE) != 0 ||
        mprotect(b->map + b->page + body, b->page, PROT_NONE) != 0)
      die("mprotect");
    b->buf = b->map + b->page + body - len;
    memset(b->map + b->page, MM_CANARY, body - len);
  }
  memset(b->buf, FRESH_BYTE, len);
}

/* Whether every canary byte next to the buffer is intact. */
static int mm_canary_ok(const mm_buf* b) {
  const unsigned char* lo = b->memalloc ? b->buf + b->len : b->map + b->page;
  const unsigned char* hi = b->memalloc ? b->map + b->map_len : b->buf;
  for (const unsigned char* p = lo; p < hi; p++)
    if (*p != MM_CANARY) return 0;
  return 1;
}

static void mm_free(mm_buf* b, ncclComm_t comm) {
  if (b->memalloc) NC(comm, ncclMemFree(b->map));
  else munmap(b->map, b->map_len);
}

static void mode_mismatch(ncclComm_t comm) {
  const char* what = getenv("COLL_CHECK_MM_WHAT") ? getenv("COLL_CHECK_MM_WHAT") : "count";
  const char* c = getenv("COLL_CHECK_MM_COUNT");
  const char* alloc = getenv("COLL_CHECK_MM_ALLOC");
  int memalloc = alloc && !strcmp(alloc, "memalloc");
  size_t count = c ? (size_t)strtoull(c, NULL, 10) : 100000;
  ncclDataType_t dt = ncclFloat32;
  int kind_bcast = 0, root = 0;
  ncclRedOp_t op = ncclSum;
  if (strcmp(what, "count") && strcmp(what, "dtype") && strcmp(what, "op") && strcmp(what, "kind") &&
      strcmp(what, "root") && strcmp(what, "reduce") && strcmp(what, "bcount"))
    die("COLL_CHECK_MM_WHAT is count, dtype, op, kind, root, reduce or bcount");
  /* bcount: every rank calls Broadcast from root 0, the others with twice
   * the count. */
  if (g_rank != 0 && (!strcmp(what, "count") || !strcmp(what, "bcount"))) count *= 2;
  if (!strcmp(what, "bcount")) kind_bcast = 1;
  if (g_rank != 0 && !strcmp(what, "dtype")) dt = ncclFloat64;
  if (g_rank != 0 && !strcmp(what, "op")) op = ncclMax;
  /* kind: rank 0 calls AllReduce, the others Broadcast (same buffer sizes);
   * root: every rank calls Broadcast, rank 0 with root 0, the others root 1. */
  if (!strcmp(what, "kind")) kind_bcast = g_rank != 0;
  /* reduce: rank 0 calls AllReduce, the others Reduce to root 0. */
  int kind_reduce = !strcmp(what, "reduce") && g_rank != 0;
  if (!strcmp(what, "root")) {
    kind_bcast = 1;
    root = g_rank != 0;
  }
  size_t bytes = count * dt_size[dt];
  mm_buf s, r;
  mm_alloc(&s, bytes, memalloc, NULL);
  mm_alloc(&r, bytes, memalloc, NULL);
  pat_fill(s.buf, bytes, g_rank, 0, 7);
  begin_check("a mismatched %s (%zu %s, %s buffers) fails", kind_bcast ? "Broadcast" : "AllReduce",
              count, dt_name[dt], memalloc ? "ncclMemAlloc" : "guarded");
  double t = now_ms();
  ncclResult_t rc = kind_bcast    ? ncclBroadcast(s.buf, r.buf, count, dt, root, comm, NULL)
                    : kind_reduce ? ncclReduce(s.buf, r.buf, count, dt, op, 0, comm, NULL)
                                  : ncclAllReduce(s.buf, r.buf, count, dt, op, comm, NULL);
  printf("mismatch.rc %d\nmismatch.ms %.1f\n", (int)rc, now_ms() - t);
  kv_str("mismatch.last_error", ncclGetLastError(comm));
  /* A Reduce's non-root needs nothing from the root, so it may finish; so
   * may a small Broadcast's root ($COLL_CHECK_MM_ROOT_MAY_PASS), which posts
   * and returns without waiting for the receivers. */
  int root_may_pass = kind_bcast && root == g_rank && getenv("COLL_CHECK_MM_ROOT_MAY_PASS");
  if (rc == ncclSuccess && !kind_reduce && !root_may_pass)
    fail("the mismatched AllReduce returned ncclSuccess");
  int untouched = 1;
  for (size_t i = 0; i < bytes && untouched; i++) untouched = r.buf[i] == FRESH_BYTE;
  int in_ok = 1;
  for (size_t i = 0; i < bytes && in_ok; i++) in_ok = s.buf[i] == pat(g_rank, 0, i, 7);
  printf("mismatch.out_untouched %d\nmismatch.in_untouched %d\n", untouched, in_ok);
  begin_check("no byte next to the buffers changed");
  if (!mm_canary_ok(&s)) fail("a canary byte next to the send buffer changed");
  if (!mm_canary_ok(&r)) fail("a canary byte next to the receive buffer changed");
  ncclResult_t ae = ncclSuccess;
  ncclCommGetAsyncError(comm, &ae);
  printf("mismatch.async %d\n", (int)ae);
  float x[4] = {1, 1, 1, 1}, y[4];
  t = now_ms();
  ncclResult_t later = ncclAllReduce(x, y, 4, ncclFloat32, ncclSum, comm, NULL);
  printf("mismatch.later_rc %d\nmismatch.later_ms %.1f\n", (int)later, now_ms() - t);
  kv_str("mismatch.later_error", ncclGetLastError(comm));
  printf("mismatch.destroy_rc %d\n", (int)ncclCommDestroy(comm));
  mm_free(&s, NULL);
  mm_free(&r, NULL);
  fflush(stdout);
}

/* ---------------------------------------------------------- newcomms */

static void exchange_id(const char* path, int creator, ncclUniqueId* id) {
  if (creator) {
    NC(NULL, ncclGetUniqueId(id));
    write_file_atomic(path, id, sizeof *id);
  } else if (wait_file(path, id, sizeof *id, file_timeout_s()) != 0) {
    die("timed out waiting for a unique id");
  }
}

/* More communicators from new unique ids while the first one lives (as
 * PyTorch's new_group does): comm2 over all ranks by ncclCommInitRank;
 * comm3 over ranks 0..N-2 only, in reversed order, created inside a group
 * (N >= 3). Collectives alternate between the comms. */
static void mode_newcomms(ncclComm_t comm) {
  int n = g_nranks;
  char path2[4096], path3[4096];
  snprintf(path2, sizeof path2, "%s.2", g_idpath);
  snprintf(path3, sizeof path3, "%s.3", g_idpath);
  ncclUniqueId id2, id3;
  ncclComm_t comm2 = NULL, comm3 = NULL;
  exchange_id(path2, g_rank == 0, &id2);
  snprintf(g_ctx, sizeof g_ctx, "second ncclCommInitRank");
  NC(NULL, ncclCommInitRank(&comm2, n, id2, g_rank));

  int sub = n >= 3 && g_rank <= n - 2; /* member of comm3 */
  int n3 = n - 1, r3 = n - 2 - g_rank;
  if (n >= 3) {
    /* comm3's rank 0 is parent rank n-2: it creates the id. */
    if (g_rank == n - 1) {
      /* not a member */
    } else {
      exchange_id(path3, g_rank == n - 2, &id3);
      snprintf(g_ctx, sizeof g_ctx, "ncclCommInitRank of a subset inside a group");
      NC(NULL, ncclGroupStart());
      NC(NULL, ncclCommInitRank(&comm3, n3, id3, r3));
      NC(NULL, ncclGroupEnd());
    }
  }

  begin_check("new comms: count and rank");
  int c = -1, r = -1;
  NC(comm2, ncclCommCount(comm2, &c));
  NC(comm2, ncclCommUserRank(comm2, &r));
  if (c != n || r != g_rank) fail("comm2: count %d rank %d, want %d %d", c, r, n, g_rank);
  if (sub) {
    NC(comm3, ncclCommCount(comm3, &c));
    NC(comm3, ncclCommUserRank(comm3, &r));
    if (c != n3 || r != r3) fail("comm3: count %d rank %d, want %d %d", c, r, n3, r3);
  }

  for (int round = 0; round < 3; round++) {
    begin_check("AllReduces alternating over comm, comm2, comm3, round %d", round);
    int64_t v1 = g_rank + 1 + round, v2 = 10 * (g_rank + 1), v3 = 100 * (g_rank + 1);
    NC(comm, ncclAllReduce(&v1, &v1, 1, ncclInt64, ncclSum, comm, NULL));
    if (sub) NC(comm3, ncclAllReduce(&v3, &v3, 1, ncclInt64, ncclSum, comm3, NULL));
    NC(comm2, ncclAllReduce(&v2, &v2, 1, ncclInt64, ncclSum, comm2, NULL));
    int64_t t = (int64_t)n * (n + 1) / 2;
    if (v1 != t + (int64_t)n * round) fail("comm: %lld, want %lld", (long long)v1, (long long)(t + n * round));
    if (v2 != 10 * t) fail("comm2: %lld, want %lld", (long long)v2, (long long)(10 * t));
    if (sub && v3 != 100 * ((int64_t)n3 * (n3 + 1) / 2))
      fail("comm3: %lld, want %lld", (long long)v3, (long long)(100 * ((int64_t)n3 * (n3 + 1) / 2)));
  }
  if (sub) {
    begin_check("comm3 order: AllGather of parent ranks");
    int32_t* all = galloc((size_t)n3 * 4);
    int32_t mine = g_rank;
    NC(comm3, ncclAllGather(&mine, all, 1, ncclInt32, comm3, NULL));
    for (int k = 0; k < n3; k++)
      if (all[k] != n - 2 - k) fail("comm3 rank %d is parent rank %d, want %d", k, all[k], n - 2 - k);
    gfree(all, (size_t)n3 * 4, "allgather recvbuff");
    NC(comm3, ncclCommDestroy(comm3));
  }
  NC(comm2, ncclCommDestroy(comm2));
  if (g_rank == 0) unlink(path2);
  if (g_rank == n - 2) unlink(path3);
}

/* ---------------------------------------------------------- selftest */

/* Checks this program's own encoders and expectations, without NCCL. */
static int selftest(void) {
  struct {
    ncclDataType_t dt;
    double v;
    uint32_t bits;
  } known[] = {
      {ncclFloat16, 1.0, 0x3C00},      {ncclFloat16, -2.0, 0xC000},    {ncclFloat16, 0.5, 0x3800},
      {ncclFloat16, 65504, 0x7BFF},    {ncclFloat16, ldexp(1, -24), 0x0001},
      {ncclBfloat16, 1.0, 0x3F80},     {ncclBfloat16, -3.0, 0xC040},   {ncclBfloat16, 0.5, 0x3F00},
      {ncclFloat8e4m3, 1.0, 0x38},     {ncclFloat8e4m3, 448, 0x7E},    {ncclFloat8e4m3, -0.125, 0xA0},
      {ncclFloat8e4m3, ldexp(1, -9), 0x01}, {ncclFloat8e5m2, 1.0, 0x3C}, {ncclFloat8e5m2, 57344, 0x7B},
      {ncclFloat8e5m2, -0.5, 0xB8},   {ncclFloat8e5m2, ldexp(1, -16), 0x01},
  };
  int bad = 0;
  for (size_t k = 0; k < sizeof known / sizeof known[0]; k++) {
    unsigned char b[8] = {0};
    store(b, known[k].dt, 0, known[k].v);
    uint32_t got = dt_size[known[k].dt] == 1 ? b[0] : (uint32_t)(b[0] | b[1] << 8);
    double back = load(b, known[k].dt, 0);
    if (got != known[k].bits || back != known[k].v) {
      fprintf(stderr, "selftest: %s %g -> 0x%x (want 0x%x) -> %g\n", dt_name[known[k].dt],
              known[k].v, got, known[k].bits, back);
      bad++;
    }
  }
  /* Every input, scalar-multiplied input and exact expectation round-trips
   * through its type, for 1..8 ranks. */
  for (int d = 0; d < NDT; d++)
    for (int op = 0; op < NOPS; op++)
      for (int n = 1; n <= 8; n++)
        for (size_t i = 0; i < 2 * 3 * 5 * 7 * 4; i++) {
          double tol, want = red_expect(op, i, (ncclDataType_t)d, n, &tol);
          double vals[3] = {want, red_input(op, n - 1, i, (ncclDataType_t)d),
                            (op >= OP_PM_HOST ? pm_scalar(op, (ncclDataType_t)d) : 1) *
                                red_input(op, n - 1, i, (ncclDataType_t)d)};
          for (int k = 0; k < 3; k++) {
            if (k == 0 && tol != 0) continue;
            unsigned char b[8];
            store(b, (ncclDataType_t)d, 0, vals[k]);
            if (load(b, (ncclDataType_t)d, 0) != vals[k]) {
              if (bad++ < 10)
                fprintf(stderr, "selftest: %s %s n=%d i=%zu value %g is not exact\n", dt_name[d],
                        op_name[op], n, i, vals[k]);
            }
          }
        }
  printf("selftest.bad %d\n", bad);
  return bad == 0 ? 0 : 1;
}

/* ---------------------------------------------------------- main */

/* Where the dynamic linker bound the nccl* functions this program calls. */
static void print_origins(void) {
  static const struct nccl_origin fns[] = {
      NCCL_ORIGIN(ncclGetUniqueId),     NCCL_ORIGIN(ncclCommInitRank),     NCCL_ORIGIN(ncclCommInitRankConfig),
      NCCL_ORIGIN(ncclCommCount),       NCCL_ORIGIN(ncclCommUserRank),     NCCL_ORIGIN(ncclCommGetAsyncError),
      NCCL_ORIGIN(ncclCommFinalize),    NCCL_ORIGIN(ncclCommDestroy),      NCCL_ORIGIN(ncclCommAbort),
      NCCL_ORIGIN(ncclCommSplit),       NCCL_ORIGIN(ncclCommShrink),       NCCL_ORIGIN(ncclAllReduce),
      NCCL_ORIGIN(ncclBroadcast),       NCCL_ORIGIN(ncclBcast),            NCCL_ORIGIN(ncclReduce),
      NCCL_ORIGIN(ncclAllGather),       NCCL_ORIGIN(ncclReduceScatter),    NCCL_ORIGIN(ncclAlltoAll),
      NCCL_ORIGIN(ncclGather),          NCCL_ORIGIN(ncclScatter),          NCCL_ORIGIN(ncclSend),
      NCCL_ORIGIN(ncclRecv),            NCCL_ORIGIN(ncclGroupStart),       NCCL_ORIGIN(ncclGroupEnd),
      NCCL_ORIGIN(ncclGroupSimulateEnd), NCCL_ORIGIN(ncclRedOpCreatePreMulSum), NCCL_ORIGIN(ncclRedOpDestroy),
      NCCL_ORIGIN(ncclGetLastError),    NCCL_ORIGIN(ncclGetErrorString),  NCCL_ORIGIN(ncclMemAlloc),
      NCCL_ORIGIN(ncclMemFree),
  };
  nccl_print_origins(fns, sizeof fns / sizeof fns[0], kv_str);
}

static void parse_list_dt(const char* s, int* on) {
  memset(on, 0, sizeof(int) * NDT);
  char buf[512];
  snprintf(buf, sizeof buf, "%s", s);
  for (char* tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
    int found = 0;
    for (int d = 0; d < NDT; d++)
      if (strcmp(tok, dt_name[d]) == 0 || strcmp(tok, "all") == 0) on[d] = found = 1;
    if (!found) {
      fprintf(stderr, "unknown dtype %s\n", tok);
      exit(2);
    }
  }
}

static void usage(void) {
  fprintf(stderr,
          "usage: coll_check --rank R --nranks N --id PATH --mode M[,M...] [--nonblocking]\n"
          "       [--dtypes a,b] [--counts 0,1,1021] [--big-dtypes a,b]\n");
  exit(2);
}

static int run_mode(const char* m, ncclComm_t* comm) {
  if (!strcmp(m, "allreduce")) mode_allreduce(*comm, OP_SUM, OP_AVG);
  else if (!strcmp(m, "premulsum")) {
    mode_allreduce(*comm, OP_PM_HOST, OP_PM_DEV);
    mode_reduce(*comm, OP_PM_HOST, OP_PM_DEV);
    mode_reducescatter(*comm, OP_PM_HOST, OP_PM_DEV);
  } else if (!strcmp(m, "broadcast")) mode_broadcast(*comm);
  else if (!strcmp(m, "reduce")) mode_reduce(*comm, OP_SUM, OP_AVG);
  else if (!strcmp(m, "allgather")) mode_allgather(*comm);
  else if (!strcmp(m, "reducescatter")) mode_reducescatter(*comm, OP_SUM, OP_AVG);
  else if (!strcmp(m, "alltoall")) mode_alltoall(*comm);
  else if (!strcmp(m, "gather")) mode_gather(*comm);
  else if (!strcmp(m, "scatter")) mode_scatter(*comm);
  else if (!strcmp(m, "sendrecv")) mode_sendrecv(*comm, 7);
  else if (!strcmp(m, "sendrecv_ring")) mode_sendrecv(*comm, 1);
  else if (!strcmp(m, "sendrecv_allpairs")) mode_sendrecv(*comm, 2);
  else if (!strcmp(m, "sendrecv_self")) mode_sendrecv(*comm, 4);
  else if (!strcmp(m, "group")) mode_group(*comm);
  else if (!strcmp(m, "simulate")) mode_simulate(*comm);
  else if (!strcmp(m, "split")) mode_split(*comm);
  else if (!strcmp(m, "multicomm")) mode_multicomm(*comm);
  else if (!strcmp(m, "threads")) mode_threads(*comm);
  else if (!strcmp(m, "newcomms")) mode_newcomms(*comm);
  else if (!strcmp(m, "shrink") || !strcmp(m, "shrink_abort")) {
    mode_shrink(*comm, !strcmp(m, "shrink_abort"));
    *comm = NULL;
  } else if (!strcmp(m, "abort")) {
    mode_abort(*comm);
    *comm = NULL;
  } else if (!strcmp(m, "peer_fault")) {
    mode_peer_fault(*comm);
    *comm = NULL;
  } else if (!strcmp(m, "mismatch")) {
    mode_mismatch(*comm);
    *comm = NULL;
  } else if (!strcmp(m, "init")) {
    /* nothing beyond the init checks */
  } else {
    fprintf(stderr, "unknown mode %s\n", m);
    exit(2);
  }
  return 0;
}

int main(int argc, char** argv) {
  const char* modes = NULL;
  parse_list_dt("all", g_dt_on);
  parse_list_dt("int8,int32,float32,bfloat16", g_big_on);
  const char* counts = "0,1,1021";
  if (argc == 2 && !strcmp(argv[1], "--selftest")) return selftest();
  for (int i = 1; i < argc; i++) {
    const char* a = argv[i];
    const char* v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "--nonblocking")) {
      g_nonblocking = 1;
      continue;
    }
    if (v == NULL) usage();
    if (!strcmp(a, "--rank")) g_rank = atoi(v);
    else if (!strcmp(a, "--nranks")) g_nranks = atoi(v);
    else if (!strcmp(a, "--id")) g_idpath = v;
    else if (!strcmp(a, "--mode")) modes = v;
    else if (!strcmp(a, "--dtypes")) parse_list_dt(v, g_dt_on);
    else if (!strcmp(a, "--big-dtypes")) parse_list_dt(v, g_big_on);
    else if (!strcmp(a, "--counts")) counts = v;
    else usage();
    i++;
  }
  if (g_rank < 0 || g_nranks < 1 || g_nranks > 62 || g_rank >= g_nranks || !g_idpath || !modes) usage();
  {
    char buf[512];
    snprintf(buf, sizeof buf, "%s", counts);
    for (char* tok = strtok(buf, ","); tok && g_ncounts < 16; tok = strtok(NULL, ","))
      g_counts[g_ncounts++] = (size_t)strtoull(tok, NULL, 10);
  }
  printf("rank %d\nnranks %d\nnonblocking %d\n", g_rank, g_nranks, g_nonblocking);
  print_origins();

  /* The unique id. */
  ncclUniqueId id;
  snprintf(g_ctx, sizeof g_ctx, "unique id exchange through %s", g_idpath);
  if (g_rank == 0) {
    NC(NULL, ncclGetUniqueId(&id));
    write_file_atomic(g_idpath, &id, sizeof id);
  } else if (wait_file(g_idpath, &id, sizeof id, file_timeout_s()) != 0) {
    die("timed out waiting for rank 0's unique id");
  }

  /* The comm. */
  ncclComm_t comm = NULL;
  double t0 = now_ms();
  snprintf(g_ctx, sizeof g_ctx, "%s", g_nonblocking ? "ncclCommInitRankConfig blocking=0" : "ncclCommInitRank");
  if (g_nonblocking) {
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    ncclResult_t rc = ncclCommInitRankConfig(&comm, g_nranks, id, g_rank, &cfg);
    printf("init.first_rc %d\n", (int)rc);
    if (rc != ncclSuccess && rc != ncclInProgress) die_nccl("ncclCommInitRankConfig", rc, __LINE__);
    if (comm == NULL) die_nccl("ncclCommInitRankConfig (comm is NULL)", rc, __LINE__);
    NC(comm, rc);
  } else {
    NC(NULL, ncclCommInitRank(&comm, g_nranks, id, g_rank));
  }
  printf("init.ms %.1f\n", now_ms() - t0);
  {
    int cnt = -1, me = -1;
    g_mode = "init";
    begin_check("ncclCommCount/ncclCommUserRank of the new comm");
    NC(comm, ncclCommCount(comm, &cnt));
    NC(comm, ncclCommUserRank(comm, &me));
    if (cnt != g_nranks) fail("ncclCommCount = %d, want %d", cnt, g_nranks);
    if (me != g_rank) fail("ncclCommUserRank = %d, want %d", me, g_rank);
  }
  fflush(stdout);

  /* The modes. */
  char list[1024];
  if (!strcmp(modes, "collectives"))
    modes = "allreduce,premulsum,broadcast,reduce,allgather,reducescatter,alltoall,gather,scatter,"
            "sendrecv_ring,sendrecv_allpairs,sendrecv_self,group,simulate";
  snprintf(list, sizeof list, "%s", modes);
  char* save = NULL;
  for (char* m = strtok_r(list, ",", &save); m; m = strtok_r(NULL, ",", &save)) {
    if (comm == NULL) {
      fprintf(stderr, "mode %s after a mode that ended the comm\n", m);
      exit(2);
    }
    g_mode = m;
    m_checks = m_wrong = 0;
    fprintf(stderr, "rank %d begin %s\n", g_rank, m);
    double t = now_ms();
    run_mode(m, &comm);
    printf("mode.%s.checks %ld\nmode.%s.wrong %ld\nmode.%s.ms %.0f\n", m, m_checks, m, m_wrong, m,
           now_ms() - t);
    fflush(stdout);
  }

  g_mode = "teardown";
  if (comm != NULL) {
    snprintf(g_ctx, sizeof g_ctx, "ncclCommFinalize/ncclCommDestroy");
    NC(comm, ncclCommFinalize(comm));
    NC(NULL, ncclCommDestroy(comm));
  }
  printf("checks %ld\nwrong_total %ld\ndone 1\n", g_checks, g_wrong);
  fflush(stdout);
  return g_wrong == 0 ? 0 : 1;
}
