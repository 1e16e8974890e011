/* Calls libhetccl.so's ncclTunerPlugin_v6/v5/v4/v3 the way NVIDIA NCCL
 * does: dlopen, dlsym of the table, init with rank and node counts and a
 * logger, getCollInfo with a float[7][3] cost table cast to float** for
 * several collectives and sizes, getChunkSize (v6), finalize.
 *
 * Usage: tuner_check <libhetccl.so> <nRanks> <nNodes>
 *
 * It checks here what holds whatever the table says: every call returns
 * ncclSuccess, and no cost NCCL marked -1.0 changes. It prints `key value`
 * lines for the test to compare with the table it wrote:
 *   v<N>.<coll>.<bytes> <algo>/<proto> nch=<n> changed=<cells changed>
 *   (the winner as NCCL picks it: the smallest cost >= 0, first on ties)
 *   v6.chunk.<algo>/<proto> <chunk size after getChunkSize, from 4096>
 *   log.<i> <level> <message>   (every line the plugin logged)
 * and `ok 1` at the end. Any broken invariant prints FAIL and exits 1. */
#include <dlfcn.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <nccl.h>

/* The tuner ABI, declared here from the layouts in nccl_tuner.h. */
#define NUM_ALGO 7
#define NUM_PROTO 3
typedef void (*logger_t)(int level, unsigned long flags, const char *file, int line, const char *fmt, ...);
typedef struct {
  int nNvlDomains, minRanksPerNvlDomain, maxRanksPerNvlDomain;
} nvl_info_t;
typedef struct {
  double baseLatencies[NUM_ALGO][NUM_PROTO];
  double hwLatencies[3][NUM_ALGO][NUM_PROTO];
  double bws[5][4][3];
} constants_t;
typedef ncclResult_t (*coll_info_fn)(void *, int, size_t, int, float **, int, int, int, int *);
typedef ncclResult_t (*coll_info_v3_fn)(void *, int, size_t, int, float **, int, int, int *);
typedef struct {
  const char *name;
  ncclResult_t (*init)(void **, uint64_t, size_t, size_t, logger_t, nvl_info_t *, constants_t *);
  coll_info_fn getCollInfo;
  ncclResult_t (*finalize)(void *);
  ncclResult_t (*getChunkSize)(void *, int, size_t, int, int, int, size_t *);
} tuner_v6_t; /* v5: the same without getChunkSize */
typedef struct {
  const char *name;
  ncclResult_t (*init)(size_t, size_t, logger_t, void **);
  void *getCollInfo; /* coll_info_fn (v4) or coll_info_v3_fn (v3) */
  ncclResult_t (*destroy)(void *);
} tuner_v4_t;

static const char *ALGOS[NUM_ALGO] = {"tree", "ring", "collnetdirect", "collnetchain", "nvls", "nvlstree", "pat"};
static const char *PROTOS[NUM_PROTO] = {"ll", "ll128", "simple"};
static const struct {
  int func;
  const char *name;
} COLLS[] = {{4, "allreduce"}, {2, "allgather"}, {0, "broadcast"}, {3, "reducescatter"}};
static const size_t SIZES[] = {8, 1024, 65535, 65536, 1048576, 4194304};

static int nlog;
static void logger(int level, unsigned long flags, const char *file, int line, const char *fmt, ...) {
  (void)flags, (void)file, (void)line;
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  for (char *c = buf; *c; c++)
    if (*c == '\n') *c = ' ';
  printf("log.%d %d %s\n", nlog++, level, buf);
}

#define FAIL(...)                  \
  do {                             \
    printf("FAIL " __VA_ARGS__);   \
    printf("\n");                  \
    exit(1);                       \
  } while (0)

/* NCCL's shape of cost table: usable Tree, Ring and PAT rows (Tree/LL128
 * not), CollNet and NVLS rows -1.0; Ring/Simple cheapest. */
static void base_table(float t[NUM_ALGO][NUM_PROTO], size_t bytes) {
  for (int a = 0; a < NUM_ALGO; a++)
    for (int p = 0; p < NUM_PROTO; p++) {
      int usable = (a == 0 || a == 1 || a == 6) && !(a == 0 && p == 1);
      t[a][p] = usable ? 50.0f + (float)abs(a - 1) * 10.0f + (float)(2 - p) * 3.0f + (float)bytes / 1e6f : -1.0f;
    }
}

/* Calls one getCollInfo (v3 when `v3` is set), checks the invariants and
 * prints the winner. */
static void one_call(const char *tag, void *fn, int v3, void *ctx, int func, const char *cname, size_t bytes) {
  float t[NUM_ALGO][NUM_PROTO], before[NUM_ALGO][NUM_PROTO];
  base_table(t, bytes);
  memcpy(before, t, sizeof t);
  int nch = 0;
  ncclResult_t r = v3 ? ((coll_info_v3_fn)fn)(ctx, func, bytes, 1, (float **)t, NUM_ALGO, NUM_PROTO, &nch)
                      : ((coll_info_fn)fn)(ctx, func, bytes, 1, (float **)t, NUM_ALGO, NUM_PROTO, 0, &nch);
  if (r != ncclSuccess) FAIL("%s getCollInfo(%s, %zu) returned %d", tag, cname, bytes, (int)r);
  int changed = 0, best = -1;
  for (int i = 0; i < NUM_ALGO * NUM_PROTO; i++) {
    float b = ((float *)before)[i], a = ((float *)t)[i];
    if (memcmp(&a, &b, sizeof a) != 0) {
      changed++;
      if (b < 0.0f) FAIL("%s %s %zu: unusable cell %d changed from %g to %g", tag, cname, bytes, i, b, a);
    }
    if (a >= 0.0f && (best < 0 || a < ((float *)t)[best])) best = i;
  }
  if (best < 0) FAIL("%s %s %zu: no usable cell left", tag, cname, bytes);
  printf("%s.%s.%zu %s/%s nch=%d changed=%d\n", tag, cname, bytes, ALGOS[best / NUM_PROTO], PROTOS[best % NUM_PROTO],
         nch, changed);
}

static void sweep(const char *tag, void *fn, int v3, void *ctx) {
  for (size_t c = 0; c < sizeof COLLS / sizeof COLLS[0]; c++)
    for (size_t s = 0; s < sizeof SIZES / sizeof SIZES[0]; s++) one_call(tag, fn, v3, ctx, COLLS[c].func, COLLS[c].name, SIZES[s]);
}

int main(int argc, char **argv) {
  if (argc != 4) FAIL("usage: %s <libhetccl.so> <nRanks> <nNodes>", argv[0]);
  size_t nranks = strtoul(argv[2], NULL, 0), nnodes = strtoul(argv[3], NULL, 0);
  setvbuf(stdout, NULL, _IOLBF, 0);
  void *lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (!lib) FAIL("dlopen: %s", dlerror());

  /* v6 and v5 share a layout but for getChunkSize. */
  for (int v = 6; v >= 5; v--) {
    char sym[32], tag[8];
    snprintf(sym, sizeof sym, "ncclTunerPlugin_v%d", v);
    snprintf(tag, sizeof tag, "v%d", v);
    tuner_v6_t *t = (tuner_v6_t *)dlsym(lib, sym);
    if (!t) FAIL("no %s", sym);
    if (strcmp(t->name, "hetccl") != 0) FAIL("%s name %s", sym, t->name);
    nvl_info_t nvl = {1, (int)nranks, (int)nranks};
    constants_t k, k0;
    memset(&k, 0x5a, sizeof k);
    memcpy(&k0, &k, sizeof k);
    void *ctx = NULL;
    if (t->init(&ctx, 0x1234 + (uint64_t)v, nranks, nnodes, logger, &nvl, &k) != ncclSuccess || !ctx)
      FAIL("%s init", sym);
    if (memcmp(&k, &k0, sizeof k) != 0) FAIL("%s init changed the constants", sym);
    sweep(tag, (void *)t->getCollInfo, 0, ctx);
    if (v == 6) {
      if (!t->getChunkSize) FAIL("v6 has no getChunkSize");
      static const int CHUNK_ALGOS[] = {0, 6}; /* tree, pat */
      for (int i = 0; i < 2; i++) {
        int a = CHUNK_ALGOS[i];
        size_t chunk = 4096;
        if (t->getChunkSize(ctx, 4, 65536, a, 2, 4, &chunk) != ncclSuccess) FAIL("getChunkSize");
        printf("v6.chunk.%s/simple %zu\n", ALGOS[a], chunk);
      }
      /* Bad arguments: still ncclSuccess (NCCL would fail the collective),
       * nothing written. */
      int nch = 0;
      if (t->getCollInfo(ctx, 4, 8, 1, NULL, NUM_ALGO, NUM_PROTO, 0, &nch) != ncclSuccess || nch != 0)
        FAIL("getCollInfo(NULL table)");
      if (t->getCollInfo(NULL, 4, 8, 1, NULL, NUM_ALGO, NUM_PROTO, 0, &nch) != ncclSuccess)
        FAIL("getCollInfo(NULL ctx)");
    }
    if (t->finalize(ctx) != ncclSuccess) FAIL("%s finalize", sym);
  }
  for (int v = 4; v >= 3; v--) {
    char sym[32], tag[8];
    snprintf(sym, sizeof sym, "ncclTunerPlugin_v%d", v);
    snprintf(tag, sizeof tag, "v%d", v);
    tuner_v4_t *t = (tuner_v4_t *)dlsym(lib, sym);
    if (!t) FAIL("no %s", sym);
    if (strcmp(t->name, "hetccl") != 0) FAIL("%s name %s", sym, t->name);
    void *ctx = NULL;
    if (t->init(nranks, nnodes, logger, &ctx) != ncclSuccess || !ctx) FAIL("%s init", sym);
    sweep(tag, t->getCollInfo, v == 3, ctx);
    if (t->destroy(ctx) != ncclSuccess) FAIL("%s destroy", sym);
  }
  printf("ok 1\n");
  return 0;
}
