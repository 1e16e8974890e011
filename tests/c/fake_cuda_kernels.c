/*
 * fake_cuda_kernels.c: the emulated CUDA driver's kernels (the model and its
 * limits are described in fake_cuda.c): hetccl's reduction kernels
 * (collectives/src/gpu/kernels/reduce.cu) computed on the host for every
 * datatype, modules loaded from a CUBIN (ELF) or PTX text, each in the
 * current context, and cuLaunchKernel, which queues a kernel on a stream.
 */
#include "fake_cuda_internal.h"

#include <elf.h>

/* ------------------------------------------------- the emulated kernels */

/* The emulated kernels, for these types: hetccl_reduce_<dt>_<op> (op from
 * KO_SUM to KO_PREMULSUM), hetccl_premul_<dt> (KO_PREMUL) and, for the
 * integer types, hetccl_postdiv_<dt> (KO_POSTDIV). */
enum kdt {
    KD_I8, KD_U8, KD_I32, KD_U32, KD_I64, KD_U64, KD_F32, KD_F64,
    KD_F16, KD_BF16, KD_E4M3, KD_E5M2, KD_N
};
static const char *const KDT_NAME[KD_N] = {"i8",  "u8",  "i32", "u32",  "i64",    "u64",
                                           "f32", "f64", "f16", "bf16", "f8e4m3", "f8e5m2"};
static const size_t KDT_SIZE[KD_N] = {1, 1, 4, 4, 8, 8, 4, 8, 2, 2, 1, 1};
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

/* The narrow floats, as reduce.cu computes them: loaded to float exactly,
 * one float operation (round to nearest even), stored back rounding once
 * (fp8: to float16 first, then to fp8, saturating). The conversions are
 * reduce.cu's: h2f/f2h are PTX cvt.f32.f16 and cvt.rn.f16.f32 (a NaN
 * becomes the canonical 0x7fff), f2bf, fp8_to_f and f_to_fp8 its own code
 * (__float2int_rn is rne() here). */
static float bits_f(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static uint32_t f_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
/* x rounded to the nearest integer, ties to even, for 0 <= x < 2^23: in
 * [2^23, 2^24) a float's unit is 1, so the add rounds as wanted. */
static int rne(float x) {
    volatile float t = x + 0x1p23f;
    return (int)(t - 0x1p23f);
}
static float h2f(uint16_t h) {
    uint32_t s = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0x1f) return bits_f(s | 0x7f800000u | m << 13);
    if (e) return bits_f(s | (e + 112) << 23 | m << 13);
    float r = (float)m * 0x1p-24f; /* subnormal (or zero): exact */
    return s ? -r : r;
}
static uint16_t f2h(float f) {
    uint32_t u = f_bits(f), a = u & 0x7fffffffu;
    uint16_t s = (uint16_t)((u >> 16) & 0x8000u);
    if (a > 0x7f800000u) return 0x7fff;
    if (a >= 0x477ff000u) return (uint16_t)(s | 0x7c00u); /* 65520 and up: infinity */
    if (a >= 0x38800000u) { /* a normal half */
        uint32_t r = a - 0x38000000u, h = r >> 13, rem = r & 0x1fffu;
        if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) h++;
        return (uint16_t)(s | h);
    }
    return (uint16_t)(s | (uint16_t)rne(bits_f(a) * 0x1p24f)); /* units of 2^-24 */
}
static float bf2f(uint16_t b) { return bits_f((uint32_t)b << 16); }
static uint16_t f2bf(float f) {
    uint32_t u = f_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
static float pow2(int e) { return bits_f((uint32_t)(e + 127) << 23); }
static float fp8_to_f(uint8_t v, int M, int bias, int fn) {
    uint32_t s = v >> 7;
    int emax = (1 << (7 - M)) - 1, e = (v >> M) & emax, m = v & ((1 << M) - 1);
    float r;
    if (fn && e == emax && m == (1 << M) - 1) r = bits_f(0x7fc00000u);
    else if (!fn && e == emax) r = m ? bits_f(0x7fc00000u) : bits_f(0x7f800000u);
    else if (e == 0) r = (float)m * pow2(1 - bias - M);
    else r = (float)(m + (1 << M)) * pow2(e - bias - M);
    return s ? -r : r;
}
static uint8_t f_to_fp8(float f, int M, int bias, float maxf) {
    uint32_t u = f_bits(f);
    uint8_t s = (uint8_t)((u >> 24) & 0x80u);
    if (f != f) return (uint8_t)(s | 0x7fu);
    float a = bits_f(u & 0x7fffffffu);
    if (a > maxf) a = maxf;
    if (a < pow2(1 - bias)) return (uint8_t)(s | rne(a * pow2(bias - 1 + M)));
    int ex = (int)((f_bits(a) >> 23) & 0xffu) - 127;
    int q = rne(a * pow2(M - ex));
    if (q == (2 << M)) {
        q = 1 << M;
        ex += 1;
    }
    return (uint8_t)(s | ((ex + bias) << M) | (q - (1 << M)));
}
static float ld_f16(uint16_t v) { return h2f(v); }
static uint16_t st_f16(float f) { return f2h(f); }
static float ld_bf16(uint16_t v) { return bf2f(v); }
static uint16_t st_bf16(float f) { return f2bf(f); }
static float ld_e4m3(uint8_t v) { return fp8_to_f(v, 3, 7, 1); }
static uint8_t st_e4m3(float f) { return f_to_fp8(h2f(f2h(f)), 3, 7, 448.0f); }
static float ld_e5m2(uint8_t v) { return fp8_to_f(v, 2, 15, 0); }
static uint8_t st_e5m2(float f) { return f_to_fp8(h2f(f2h(f)), 2, 15, 57344.0f); }
static float fmax_nan(float a, float b) { return a != a ? b : (b != b ? a : (a > b ? a : b)); }
static float fmin_nan(float a, float b) { return a != a ? b : (b != b ? a : (a < b ? a : b)); }

/* Tr<T>::add/mul/mx/mn of reduce.cu's NARROW_TR; avg and premulsum are
 * add(mul(a, s), b), each step rounded to the type. */
#define NARROW_RED(NAME, T)                                                                        \
    static T add_##NAME(T a, T b) { return st_##NAME(ld_##NAME(a) + ld_##NAME(b)); }              \
    static T mul_##NAME(T a, T b) { return st_##NAME(ld_##NAME(a) * ld_##NAME(b)); }              \
    static void red_##NAME(int op, char *d, const char *a, const char *b, size_t n,                \
                           const unsigned char *sc, uint64_t dv) {                                 \
        T s;                                                                                       \
        memcpy(&s, sc, sizeof s);                                                                  \
        (void)dv;                                                                                  \
        switch (op) {                                                                              \
        case KO_SUM: RED_LOOP(T, add_##NAME(x, y))                                                 \
        case KO_PROD: RED_LOOP(T, mul_##NAME(x, y))                                                \
        case KO_MAX: RED_LOOP(T, st_##NAME(fmax_nan(ld_##NAME(x), ld_##NAME(y))))                  \
        case KO_MIN: RED_LOOP(T, st_##NAME(fmin_nan(ld_##NAME(x), ld_##NAME(y))))                  \
        case KO_AVG:                                                                               \
        case KO_PREMULSUM: RED_LOOP(T, add_##NAME(mul_##NAME(x, s), y))                            \
        default: MAP_LOOP(T, mul_##NAME(x, s)) /* KO_PREMUL (no float postdiv) */                  \
        }                                                                                          \
    }

NARROW_RED(f16, uint16_t)
NARROW_RED(bf16, uint16_t)
NARROW_RED(e4m3, uint8_t)
NARROW_RED(e5m2, uint8_t)

static void (*const RED[KD_N])(int, char *, const char *, const char *, size_t,
                               const unsigned char *, uint64_t) = {
    red_i8,  red_u8,  red_i32, red_u32,  red_i64,  red_u64,
    red_f32, red_f64, red_f16, red_bf16, red_e4m3, red_e5m2};

void run_kernel(const struct op *o) {
    RED[o->kdt](o->kop, o->dst, o->src, o->src2, o->n, o->scalar, o->divisor);
}

/* ---------------------------------------------------- modules, launches */

/* A module: its context, the ".entry <name>(" lines of its entry points
 * (the PTX text itself, or built from a CUBIN's symbol table) and the
 * functions handed out, freed by cuModuleUnload. A function records which
 * emulated kernel it is. */
struct fake_func {
    uint32_t magic;
    struct fake_func *next; /* in its module */
    struct fake_module *mod;
    int kdt, kop;
};
struct fake_module {
    uint32_t magic;
    struct fake_ctx *ctx;
    char *ptx;
    struct fake_func *funcs;
};
static pthread_mutex_t g_mod = PTHREAD_MUTEX_INITIALIZER; /* guards every module's funcs */

#define PTX_MARK ".entry hetccl_reduce_"

/* The newest PTX ISA (major*10 + minor) a driver of version `v` (CUDA's
 * 1000*major + 10*minor) compiles: 12.0 -> 8.0, ... 12.5 and 12.6 -> 8.5,
 * 12.8 -> 8.7, 12.9 -> 8.8, 13.0 -> 9.0; 11.x -> 7.x. */
static int max_ptx_isa(int v) {
    int major = v / 1000, minor = v % 1000 / 10;
    if (major >= 13) return 90 + minor;
    if (major == 12) return minor <= 5 ? 80 + minor : minor == 6 ? 85 : 79 + minor;
    return 70 + minor;
}

/* Checks PTX text: its ".version" against the driver's, its ".target
 * sm_XX" against the device's; returns the check's result. */
static CUresult check_ptx(const char *ptx) {
    const char *v = strstr(ptx, ".version ");
    const char *t = strstr(ptx, ".target sm_");
    int major = 0, minor = 0, sm = 0;
    if (!v || sscanf(v, ".version %d.%d", &major, &minor) != 2) return CUDA_ERROR_INVALID_PTX;
    if (t) sm = atoi(t + strlen(".target sm_"));
    if (major * 10 + minor > max_ptx_isa(g_driver_version)) {
        LOG("cuModuleLoadData: PTX ISA %d.%d is newer than driver %d supports", major, minor,
            g_driver_version);
        return CUDA_ERROR_UNSUPPORTED_PTX_VERSION;
    }
    if (sm > DEVICE_SM) return CUDA_ERROR_NO_BINARY_FOR_GPU;
    return CUDA_SUCCESS;
}

/* A CUBIN (an ELF image for EM_CUDA): checks that it is for the device's
 * architecture (e_flags' low byte: sm_XX) and builds ".entry <name>(" lines
 * from its global functions, as *out (malloc'd). The image's extent is
 * not known (cuModuleLoadData gets no size): the headers are trusted. */
static CUresult parse_cubin(const unsigned char *img, char **out) {
    const Elf64_Ehdr *eh = (const Elf64_Ehdr *)img;
    if (eh->e_ident[EI_CLASS] != ELFCLASS64 || eh->e_machine != EM_CUDA ||
        eh->e_shentsize != sizeof(Elf64_Shdr) || eh->e_shoff == 0)
        return CUDA_ERROR_INVALID_IMAGE;
    int sm = (int)(eh->e_flags & 0xffu);
    if (g_reject_cubin || sm != DEVICE_SM) {
        LOG("cuModuleLoadData: a CUBIN for sm_%d refused (device sm_%d%s)", sm, DEVICE_SM,
            g_reject_cubin ? ", FAKE_CUDA_REJECT_CUBIN" : "");
        return CUDA_ERROR_NO_BINARY_FOR_GPU;
    }
    const Elf64_Shdr *sh = (const Elf64_Shdr *)(img + eh->e_shoff);
    size_t cap = 4096, len = 0;
    char *txt = malloc(cap);
    if (!txt) abort();
    txt[0] = 0;
    for (int i = 0; i < eh->e_shnum; i++) {
        if (sh[i].sh_type != SHT_SYMTAB || sh[i].sh_link >= eh->e_shnum) continue;
        const Elf64_Sym *sym = (const Elf64_Sym *)(img + sh[i].sh_offset);
        const char *str = (const char *)img + sh[sh[i].sh_link].sh_offset;
        for (size_t k = 0; k < sh[i].sh_size / sizeof *sym; k++) {
            if (ELF64_ST_TYPE(sym[k].st_info) != STT_FUNC ||
                ELF64_ST_BIND(sym[k].st_info) != STB_GLOBAL)
                continue;
            const char *name = str + sym[k].st_name;
            size_t need = len + strlen(name) + 16;
            if (need > cap) {
                cap = 2 * need;
                txt = realloc(txt, cap);
                if (!txt) abort();
            }
            len += (size_t)sprintf(txt + len, ".entry %s(\n", name);
        }
    }
    if (!strstr(txt, PTX_MARK)) {
        free(txt);
        return CUDA_ERROR_INVALID_IMAGE;
    }
    *out = txt;
    return CUDA_SUCCESS;
}

CUresult cuModuleLoadData(CUmodule *module, const void *image) {
    NEED_INIT();
    NEED_PTR(module);
    NEED_PTR(image);
    NEED_CTX();
    /* A CUBIN for this architecture, or PTX text this driver compiles, of
     * hetccl's reduction kernels. */
    const unsigned char *img = image;
    char *entries = NULL;
    CUresult rc;
    const char *kind = "PTX";
    if (memcmp(img, ELFMAG, SELFMAG) == 0) {
        kind = "CUBIN";
        rc = parse_cubin(img, &entries);
    } else if (!strstr((const char *)image, PTX_MARK)) {
        rc = CUDA_ERROR_INVALID_IMAGE;
    } else {
        rc = check_ptx((const char *)image);
        if (rc == CUDA_SUCCESS) entries = strdup((const char *)image);
        if (rc == CUDA_SUCCESS && !entries) abort();
    }
    if (rc != CUDA_SUCCESS) {
        LOG("cuModuleLoadData(%p, %s) -> %d", image, kind, (int)rc);
        return rc;
    }
    /* Loading a module waits for the context's streams, as on a GPU. */
    quiesce(t_ctx, "cuModuleLoadData");
    struct fake_module *m = calloc(1, sizeof *m);
    if (!m) abort();
    m->ptx = entries;
    m->ctx = t_ctx;
    m->magic = MODULE_MAGIC;
    *module = (CUmodule)m;
    LOG("cuModuleLoadData(%p, %s, %zu bytes of entries) -> %p", image, kind, strlen(m->ptx),
        (void *)m);
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

/* The emulated kernel `name` names: 1 with *dt and *op set, else 0
 * (anything not an entry point of reduce.cu). */
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
    pthread_mutex_unlock(&g_mod);
    if (!fn) {
        /* The first lookup loads the function (CUDA's lazy loading), which
         * waits for the module's context's streams, as on a GPU. */
        quiesce(m->ctx, "cuModuleGetFunction (lazy loading)");
        pthread_mutex_lock(&g_mod);
        fn = m->funcs;
        while (fn && !(fn->kdt == dt && fn->kop == op)) fn = fn->next;
        if (!fn) { /* the same handle for the same name, as in the real driver */
            fn = calloc(1, sizeof *fn);
            if (!fn) abort();
            *fn = (struct fake_func){FUNC_MAGIC, m->funcs, m, dt, op};
            m->funcs = fn;
        }
        pthread_mutex_unlock(&g_mod);
    }
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
    /* As in CUDA: the function's module must be of the current context, and
     * so must the stream. */
    struct fake_ctx *sc = NULL;
    CUresult src = stream_ctx(h, &sc);
    if (src != CUDA_SUCCESS) return src;
    if (fn->mod->ctx != t_ctx) {
        LOG("cuLaunchKernel(%s): the module was loaded in another context", name);
        return CUDA_ERROR_INVALID_CONTEXT;
    }
    if (sc != t_ctx) {
        LOG("cuLaunchKernel(%s): the stream belongs to another context", name);
        return CUDA_ERROR_INVALID_HANDLE;
    }
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
