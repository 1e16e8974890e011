/*
 * fake_cuda_kernels.c: the emulated CUDA driver's kernels (the model and its
 * limits are described in fake_cuda.c): hetccl's reduction kernels
 * (collectives/src/gpu/kernels/reduce.cu) computed on the host, modules
 * loaded from their PTX text, and cuLaunchKernel, which queues a kernel on
 * a stream.
 */
#include "fake_cuda_internal.h"

/* ------------------------------------------------- the emulated kernels */

/* The emulated kernels, for these types: hetccl_reduce_<dt>_<op> (op from
 * KO_SUM to KO_PREMULSUM), hetccl_premul_<dt> (KO_PREMUL) and, for the
 * integer types, hetccl_postdiv_<dt> (KO_POSTDIV). */
enum kdt { KD_I8, KD_U8, KD_I32, KD_U32, KD_I64, KD_U64, KD_F32, KD_F64, KD_N };
static const char *const KDT_NAME[KD_N] = {"i8", "u8", "i32", "u32", "i64", "u64", "f32", "f64"};
static const size_t KDT_SIZE[KD_N] = {1, 1, 4, 4, 8, 8, 4, 8};
#define KDT_IS_INT(dt) ((dt) < KD_F32)
enum kop { KO_SUM, KO_PROD, KO_MAX, KO_MIN, KO_AVG, KO_PREMULSUM, KO_PREMUL, KO_POSTDIV, KO_N };
#define KO_N_REDUCE (KO_PREMULSUM + 1) /* the ops of hetccl_reduce_<dt>_<op> */
static const char *const KOP_NAME[KO_N] = {"sum", "prod", "max", "min",
                                           "avg", "premulsum", "premul", "postdiv"};
/* Each kernel's parameter count, as declared in reduce.cu:
 * reduce (T* dst, const T* a, const T* b, u64 n, T s), premul (T* dst,
 * const T* a, u64 n, T s), postdiv (T* dst, u64 n, u64 d). */
static int kop_nparams(int op) { return op == KO_PREMUL ? 4 : op == KO_POSTDIV ? 3 : 5; }

/* The kernels' arithmetic, as in collectives/src/gpu/kernels/reduce.cu:
 * integer sum/prod (and the a*s + b of avg/premulsum, a*s of premul) in the
 * unsigned type (wrapping), float ops in the type's precision with every
 * product and sum rounded separately (NVRTC runs with --fmad=false and the
 * kernels use __fmul_rn/__fadd_rn), float max/min returning the non-NaN
 * operand; postdiv divides in 64 bits, signed types as long long (C's
 * truncation toward zero, d converted to long long as reduce.cu does).
 * Elements are loaded and stored with memcpy (any alignment); dst may alias
 * a or b. */
#ifdef __clang__
#pragma STDC FP_CONTRACT OFF /* GCC ignores (and warns about) it; the volatiles suffice */
#endif
#define RED_LOOP(T, EXPR)                                                                          \
    for (size_t i = 0; i < n; i++) {                                                               \
        T x, y, r;                                                                                 \
        memcpy(&x, a + i * sizeof(T), sizeof(T));                                                  \
        memcpy(&y, b + i * sizeof(T), sizeof(T));                                                  \
        r = (EXPR);                                                                                \
        memcpy(d + i * sizeof(T), &r, sizeof(T));                                                  \
    }                                                                                              \
    break;

/* One input: premul (a) and postdiv (a is dst). */
#define MAP_LOOP(T, EXPR)                                                                          \
    for (size_t i = 0; i < n; i++) {                                                               \
        T x, r;                                                                                    \
        memcpy(&x, a + i * sizeof(T), sizeof(T));                                                  \
        r = (EXPR);                                                                                \
        memcpy(d + i * sizeof(T), &r, sizeof(T));                                                  \
    }                                                                                              \
    break;

/* reduce.cu's Tr<T>::div: (T)((W)a / (W)d), W long long or unsigned long
 * long. The one quotient C leaves undefined, LLONG_MIN / -1, wraps to
 * LLONG_MIN (two's complement, as the GPU's division routine gives). */
static int64_t sdiv64(int64_t a, uint64_t d) {
    int64_t sd = (int64_t)d; /* d >= 2^63 is negative, as in the kernel */
    if (sd == -1) return (int64_t)(0 - (uint64_t)a);
    return a / sd;
}
static uint64_t udiv64(uint64_t a, uint64_t d) { return a / d; }

/* a*s + b and a*s in float/double without contraction: the product is
 * stored to a volatile, so it is rounded to the type before the add. */
static float mul_add_f32(float a, float s, float b) {
    volatile float p = a * s;
    return p + b;
}
static double mul_add_f64(double a, double s, double b) {
    volatile double p = a * s;
    return p + b;
}

/* d is never 0 here (cuLaunchKernel refuses a postdiv by 0). */
#define INT_RED(NAME, T, U, W, DIV)                                                                \
    static void red_##NAME(int op, char *d, const char *a, const char *b, size_t n,                \
                           const unsigned char *sc, uint64_t dv) {                                 \
        T s;                                                                                       \
        memcpy(&s, sc, sizeof s);                                                                  \
        switch (op) {                                                                              \
        case KO_SUM: RED_LOOP(T, (T)(U)((U)x + (U)y))                                              \
        case KO_PROD: RED_LOOP(T, (T)(U)((U)x * (U)y))                                             \
        case KO_MAX: RED_LOOP(T, x > y ? x : y)                                                    \
        case KO_MIN: RED_LOOP(T, x < y ? x : y)                                                    \
        case KO_AVG:                                                                               \
        case KO_PREMULSUM: RED_LOOP(T, (T)(U)((U)((U)x * (U)s) + (U)y))                            \
        case KO_PREMUL: MAP_LOOP(T, (T)(U)((U)x * (U)s))                                           \
        default: MAP_LOOP(T, (T)DIV((W)x, dv)) /* KO_POSTDIV */                                    \
        }                                                                                          \
    }

#define FLOAT_RED(NAME, T)                                                                         \
    static void red_##NAME(int op, char *d, const char *a, const char *b, size_t n,                \
                           const unsigned char *sc, uint64_t dv) {                                 \
        T s;                                                                                       \
        memcpy(&s, sc, sizeof s);                                                                  \
        (void)dv;                                                                                  \
        switch (op) {                                                                              \
        case KO_SUM: RED_LOOP(T, x + y)                                                            \
        case KO_PROD: RED_LOOP(T, x * y)                                                           \
        case KO_MAX: RED_LOOP(T, x != x ? y : (y != y ? x : (x > y ? x : y)))                      \
        case KO_MIN: RED_LOOP(T, x != x ? y : (y != y ? x : (x < y ? x : y)))                      \
        case KO_AVG:                                                                               \
        case KO_PREMULSUM: RED_LOOP(T, mul_add_##NAME(x, s, y))                                    \
        default: MAP_LOOP(T, x * s) /* KO_PREMUL (no float postdiv) */                             \
        }                                                                                          \
    }

INT_RED(i8, int8_t, uint8_t, int64_t, sdiv64)
INT_RED(u8, uint8_t, uint8_t, uint64_t, udiv64)
INT_RED(i32, int32_t, uint32_t, int64_t, sdiv64)
INT_RED(u32, uint32_t, uint32_t, uint64_t, udiv64)
INT_RED(i64, int64_t, uint64_t, int64_t, sdiv64)
INT_RED(u64, uint64_t, uint64_t, uint64_t, udiv64)
FLOAT_RED(f32, float)
FLOAT_RED(f64, double)

static void (*const RED[KD_N])(int, char *, const char *, const char *, size_t,
                               const unsigned char *, uint64_t) = {
    red_i8, red_u8, red_i32, red_u32, red_i64, red_u64, red_f32, red_f64};

void run_kernel(const struct op *o) {
    RED[o->kdt](o->kop, o->dst, o->src, o->src2, o->n, o->scalar, o->divisor);
}

/* ---------------------------------------------------- modules, launches */

/* A module: a copy of the PTX text (names are looked up in it) and the
 * functions handed out, freed by cuModuleUnload. A function records which
 * emulated kernel it is. */
struct fake_func {
    uint32_t magic;
    struct fake_func *next; /* in its module */
    int kdt, kop;
};
struct fake_module {
    uint32_t magic;
    char *ptx;
    struct fake_func *funcs;
};
static pthread_mutex_t g_mod = PTHREAD_MUTEX_INITIALIZER; /* guards every module's funcs */

#define PTX_MARK ".entry hetccl_reduce_"

CUresult cuModuleLoadData(CUmodule *module, const void *image) {
    NEED_INIT();
    NEED_PTR(module);
    NEED_PTR(image);
    NEED_CTX();
    /* Only PTX text of hetccl's reduction kernels (a cubin is ELF: no match). */
    if (!strstr((const char *)image, PTX_MARK)) {
        LOG("cuModuleLoadData(%p) -> not PTX of hetccl's kernels", image);
        return CUDA_ERROR_INVALID_IMAGE;
    }
    struct fake_module *m = calloc(1, sizeof *m);
    if (!m) abort();
    m->ptx = strdup((const char *)image);
    if (!m->ptx) abort();
    m->magic = MODULE_MAGIC;
    *module = (CUmodule)m;
    LOG("cuModuleLoadData(%p, %zu bytes of PTX) -> %p", image, strlen(m->ptx), (void *)m);
    return CUDA_SUCCESS;
}

CUresult cuModuleUnload(CUmodule hmod) {
    LOG("cuModuleUnload(%p)", (void *)hmod);
    NEED_INIT();
    struct fake_module *m = (struct fake_module *)hmod;
    if (!m || m->magic != MODULE_MAGIC) return CUDA_ERROR_INVALID_HANDLE;
    /* Launches already queued copied what they need; the handles die now. */
    pthread_mutex_lock(&g_mod);
    m->magic = 0;
    struct fake_func *f = m->funcs;
    m->funcs = NULL;
    pthread_mutex_unlock(&g_mod);
    while (f) {
        struct fake_func *next = f->next;
        f->magic = 0;
        free(f);
        f = next;
    }
    free(m->ptx);
    free(m);
    return CUDA_SUCCESS;
}

/* Whether `ptx` declares an entry point named exactly `name`. */
static int ptx_has_entry(const char *ptx, const char *name) {
    size_t len = strlen(name);
    for (const char *p = ptx; (p = strstr(p, ".entry")) != NULL; p += 6) {
        const char *q = p + 6;
        if (*q != ' ' && *q != '\t') continue;
        while (*q == ' ' || *q == '\t') q++;
        if (strncmp(q, name, len) != 0) continue;
        char c = q[len]; /* the name must end here */
        if (!(c == '_' || c == '$' || (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') ||
              (c >= 'A' && c <= 'Z')))
            return 1;
    }
    return 0;
}

/* The emulated kernel `name` names: 1 with *dt and *op set, else 0 (f16,
 * bf16 and fp8 types, and anything not an entry point of reduce.cu). */
static int parse_kernel(const char *name, int *dt, int *op) {
    static const char *const prefix[] = {"hetccl_reduce_", "hetccl_premul_", "hetccl_postdiv_"};
    for (int k = 0; k < 3; k++) {
        size_t pl = strlen(prefix[k]);
        if (strncmp(name, prefix[k], pl) != 0) continue;
        const char *r = name + pl;
        for (int d = 0; d < KD_N; d++) {
            size_t l = strlen(KDT_NAME[d]);
            if (strncmp(r, KDT_NAME[d], l) != 0) continue;
            if (k == 1 && r[l] == '\0') { /* hetccl_premul_<dt> */
                *dt = d;
                *op = KO_PREMUL;
                return 1;
            }
            if (k == 2 && r[l] == '\0' && KDT_IS_INT(d)) { /* hetccl_postdiv_<int dt> */
                *dt = d;
                *op = KO_POSTDIV;
                return 1;
            }
            if (k != 0 || r[l] != '_') continue;
            for (int o = 0; o < KO_N_REDUCE; o++) {
                if (strcmp(r + l + 1, KOP_NAME[o]) == 0) {
                    *dt = d;
                    *op = o;
                    return 1;
                }
            }
        }
    }
    return 0;
}

/* The entry point's name of an emulated kernel, for the log. */
static void kernel_name(char *buf, size_t len, int dt, int op) {
    if (op == KO_PREMUL || op == KO_POSTDIV)
        snprintf(buf, len, "hetccl_%s_%s", KOP_NAME[op], KDT_NAME[dt]);
    else
        snprintf(buf, len, "hetccl_reduce_%s_%s", KDT_NAME[dt], KOP_NAME[op]);
}

CUresult cuModuleGetFunction(CUfunction *f, CUmodule hmod, const char *name) {
    LOG("cuModuleGetFunction(%p, %s)", (void *)hmod, name ? name : "(null)");
    NEED_INIT();
    NEED_PTR(f);
    NEED_PTR(name);
    struct fake_module *m = (struct fake_module *)hmod;
    if (!m || m->magic != MODULE_MAGIC) return CUDA_ERROR_INVALID_HANDLE;
    if (!ptx_has_entry(m->ptx, name)) return CUDA_ERROR_NOT_FOUND;
    int dt, op;
    if (!parse_kernel(name, &dt, &op)) {
        LOG("cuModuleGetFunction: the fake cannot run %s", name);
        return CUDA_ERROR_NOT_SUPPORTED;
    }
    pthread_mutex_lock(&g_mod);
    struct fake_func *fn = m->funcs;
    while (fn && !(fn->kdt == dt && fn->kop == op)) fn = fn->next;
    if (!fn) { /* the same handle for the same name, as in the real driver */
        fn = calloc(1, sizeof *fn);
        if (!fn) abort();
        *fn = (struct fake_func){FUNC_MAGIC, m->funcs, dt, op};
        m->funcs = fn;
    }
    pthread_mutex_unlock(&g_mod);
    *f = (CUfunction)fn;
    return CUDA_SUCCESS;
}

CUresult cuLaunchKernel(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,
                        unsigned int bx, unsigned int by, unsigned int bz, unsigned int shmem,
                        CUstream h, void **params, void **extra) {
    NEED_INIT();
    struct fake_func *fn = (struct fake_func *)f;
    if (!fn || fn->magic != FUNC_MAGIC) {
        LOG("cuLaunchKernel(%p): not a function", (void *)f);
        return CUDA_ERROR_INVALID_HANDLE;
    }
    char name[48];
    kernel_name(name, sizeof name, fn->kdt, fn->kop);
    LOG("cuLaunchKernel(%s, grid %ux%ux%u, block %ux%ux%u, shmem %u, stream %p)", name, gx, gy,
        gz, bx, by, bz, shmem, (void *)h);
    NEED_CTX();
    if (extra) return CUDA_ERROR_NOT_SUPPORTED; /* CU_LAUNCH_PARAM_* buffers: not emulated */
    if (!params || !gx || !gy || !gz || !bx || !by || !bz || (uint64_t)bx * by * bz > 1024)
        return CUDA_ERROR_INVALID_VALUE;
    /* Exactly the kernel's parameters, each read with its size, as the real
     * driver does (it knows them from the image): pointers and u64 8 bytes,
     * the scalar s sizeof(T). */
    const int np = kop_nparams(fn->kop);
    for (int i = 0; i < np; i++) NEED_PTR(params[i]);
    const size_t ts = KDT_SIZE[fn->kdt];
    uint64_t dst, pa = 0, pb = 0, n;
    struct op *o = op_new(OP_KERNEL);
    memcpy(&dst, params[0], 8);
    switch (fn->kop) {
    case KO_POSTDIV: /* (T* dst, u64 n, u64 d) */
        memcpy(&n, params[1], 8);
        memcpy(&o->divisor, params[2], 8);
        break;
    case KO_PREMUL: /* (T* dst, const T* a, u64 n, T s) */
        memcpy(&pa, params[1], 8);
        memcpy(&n, params[2], 8);
        memcpy(o->scalar, params[3], ts);
        break;
    default: /* (T* dst, const T* a, const T* b, u64 n, T s) */
        memcpy(&pa, params[1], 8);
        memcpy(&pb, params[2], 8);
        memcpy(&n, params[3], 8);
        memcpy(o->scalar, params[4], ts);
        break;
    }
    o->kdt = fn->kdt;
    o->kop = fn->kop;
    o->n = (size_t)n;
    CUresult rc = CUDA_SUCCESS;
    if (n > SIZE_MAX / ts) rc = CUDA_ERROR_INVALID_VALUE;
    /* Division by zero: the GPU gives an unspecified value; refused here. */
    if (fn->kop == KO_POSTDIV && n && o->divisor == 0) {
        LOG("cuLaunchKernel(%s): division by zero refused", name);
        rc = CUDA_ERROR_INVALID_VALUE;
    }
    size_t bytes = (size_t)n * ts;
    if (rc == CUDA_SUCCESS && n) { /* with n == 0 the kernel touches no memory */
        rc = translate(dst, bytes, &o->dst, &o->hold[0]);
        if (rc == CUDA_SUCCESS && fn->kop == KO_POSTDIV) o->src = o->dst; /* in place */
        if (rc == CUDA_SUCCESS && fn->kop != KO_POSTDIV)
            rc = translate(pa, bytes, (char **)&o->src, &o->hold[1]);
        if (rc == CUDA_SUCCESS && fn->kop < KO_N_REDUCE)
            rc = translate(pb, bytes, (char **)&o->src2, &o->hold[2]);
    }
    if (rc != CUDA_SUCCESS) {
        op_free(o);
        return rc;
    }
    return submit(h, o);
}
