// hetccl's reduction kernels, compiled at run time by NVRTC (see
// collectives/src/gpu/kernels.rs and docs/gpu.md).
//
// Semantics follow the host kernels (collectives/src/reduce/), which follow
// NCCL: integer sum and product wrap; float max/min return the non-NaN
// operand when exactly one is NaN; float16/bfloat16 results are rounded once
// (to nearest even); fp8 results are rounded to float16, then to fp8 with
// saturation to the largest finite value.
//
// No headers are included: the narrow float types travel as their bits and
// are converted in software or with one PTX instruction, so NVRTC needs
// nothing but this file, and the CPU-only CI test compiles exactly what runs.
//
// Entry points (all extern "C", grid-stride loops over n elements):
//   hetccl_reduce_<dt>_<op>(T* dst, const T* a, const T* b, u64 n, T s)
//       op in sum, prod, max, min: dst[i] = op(a[i], b[i]) (s unused);
//       op in avg, premulsum:      dst[i] = a[i]*s + b[i] (a is the local
//       input, b the partial from a peer; for integer avg the host passes
//       s = 1 and divides at the end)
//   hetccl_premul_<dt>(T* dst, const T* a, u64 n, T s):  dst[i] = a[i]*s
//   hetccl_postdiv_<dt>(T* dst, u64 n, u64 d):           dst[i] /= d (integers)
// dst may alias a or b.

typedef unsigned long long u64;

struct f16_t { unsigned short x; };
struct bf16_t { unsigned short x; };
struct e4m3_t { unsigned char x; };
struct e5m2_t { unsigned char x; };

#define DEV static __device__ __forceinline__

DEV float h2f(unsigned short h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}
DEV unsigned short f2h(float f) {
    unsigned short h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}
DEV float bf2f(unsigned short b) { return __uint_as_float(((unsigned)b) << 16); }
DEV unsigned short f2bf(float f) {
    unsigned u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (unsigned short)(u >> 16);
}

// 2^e as a float, for the exponents fp8 needs (normal float range).
DEV float pow2(int e) { return __uint_as_float((unsigned)(e + 127) << 23); }

// fp8 with M mantissa bits and the given bias. fn: the "FN" encoding of
// e4m3 (no infinity, S.1111.111 is NaN); otherwise IEEE-like (e5m2).
DEV float fp8_to_f(unsigned char v, int M, int bias, bool fn) {
    const unsigned nan = 0x7fc00000u;
    unsigned s = v >> 7;
    int emax = (1 << (7 - M)) - 1;
    int e = (v >> M) & emax;
    int m = v & ((1 << M) - 1);
    float r;
    if (fn && e == emax && m == (1 << M) - 1) {
        r = __uint_as_float(nan);
    } else if (!fn && e == emax) {
        r = m ? __uint_as_float(nan) : __uint_as_float(0x7f800000u);
    } else if (e == 0) {
        r = (float)m * pow2(1 - bias - M);
    } else {
        r = (float)(m + (1 << M)) * pow2(e - bias - M);
    }
    return s ? -r : r;
}

// Round to nearest even, saturating (NaN stays NaN, infinities saturate).
DEV unsigned char f_to_fp8(float f, int M, int bias, float maxf) {
    unsigned u = __float_as_uint(f);
    unsigned char s = (unsigned char)((u >> 24) & 0x80u);
    if (f != f) return (unsigned char)(s | 0x7fu);
    float a = __uint_as_float(u & 0x7fffffffu);
    if (a > maxf) a = maxf;
    if (a < pow2(1 - bias)) {
        // Subnormal (or zero): units of 2^(1-bias-M); 2^M is the smallest normal.
        int q = __float2int_rn(a * pow2(bias - 1 + M));
        return (unsigned char)(s | q);
    }
    int ex = (int)((__float_as_uint(a) >> 23) & 0xffu) - 127;
    int q = __float2int_rn(a * pow2(M - ex));
    if (q == (2 << M)) {
        q = 1 << M;
        ex += 1;
    }
    return (unsigned char)(s | ((ex + bias) << M) | (q - (1 << M)));
}

// fp8 results go through float16 first, as NCCL computes fp8 in __half.
DEV float e4m3_load(e4m3_t v) { return fp8_to_f(v.x, 3, 7, true); }
DEV e4m3_t e4m3_store(float f) { e4m3_t r; r.x = f_to_fp8(h2f(f2h(f)), 3, 7, 448.0f); return r; }
DEV float e5m2_load(e5m2_t v) { return fp8_to_f(v.x, 2, 15, false); }
DEV e5m2_t e5m2_store(float f) { e5m2_t r; r.x = f_to_fp8(h2f(f2h(f)), 2, 15, 57344.0f); return r; }
DEV float f16_load(f16_t v) { return h2f(v.x); }
DEV f16_t f16_store(float f) { f16_t r; r.x = f2h(f); return r; }
DEV float bf16_load(bf16_t v) { return bf2f(v.x); }
DEV bf16_t bf16_store(float f) { bf16_t r; r.x = f2bf(f); return r; }

template <typename T> DEV T fmax_nan(T a, T b) { return a != a ? b : (b != b ? a : (a > b ? a : b)); }
template <typename T> DEV T fmin_nan(T a, T b) { return a != a ? b : (b != b ? a : (a < b ? a : b)); }

template <typename T> struct Tr;

// Integers: sum and product in the unsigned type (wrapping), W for division.
#define INT_TR(T, U, W)                                                       \
    template <> struct Tr<T> {                                                \
        DEV T add(T a, T b) { return (T)(U)((U)a + (U)b); }                   \
        DEV T mul(T a, T b) { return (T)(U)((U)a * (U)b); }                   \
        DEV T mx(T a, T b) { return a > b ? a : b; }                          \
        DEV T mn(T a, T b) { return a < b ? a : b; }                          \
        DEV T div(T a, u64 d) { return (T)((W)a / (W)d); }                    \
    };
INT_TR(signed char, unsigned char, long long)
INT_TR(unsigned char, unsigned char, unsigned long long)
INT_TR(int, unsigned int, long long)
INT_TR(unsigned int, unsigned int, unsigned long long)
INT_TR(long long, unsigned long long, long long)
INT_TR(unsigned long long, unsigned long long, unsigned long long)

template <> struct Tr<float> {
    DEV float add(float a, float b) { return __fadd_rn(a, b); }
    DEV float mul(float a, float b) { return __fmul_rn(a, b); }
    DEV float mx(float a, float b) { return fmax_nan(a, b); }
    DEV float mn(float a, float b) { return fmin_nan(a, b); }
};
template <> struct Tr<double> {
    DEV double add(double a, double b) { return __dadd_rn(a, b); }
    DEV double mul(double a, double b) { return __dmul_rn(a, b); }
    DEV double mx(double a, double b) { return fmax_nan(a, b); }
    DEV double mn(double a, double b) { return fmin_nan(a, b); }
};

// Narrow floats: compute in float (exact for one product; one rounding for
// a sum, see collectives/src/reduce/narrow.rs), round once on store.
#define NARROW_TR(T, P)                                                                  \
    template <> struct Tr<T> {                                                           \
        DEV T add(T a, T b) { return P##_store(__fadd_rn(P##_load(a), P##_load(b))); }   \
        DEV T mul(T a, T b) { return P##_store(__fmul_rn(P##_load(a), P##_load(b))); }   \
        DEV T mx(T a, T b) { return P##_store(fmax_nan(P##_load(a), P##_load(b))); }     \
        DEV T mn(T a, T b) { return P##_store(fmin_nan(P##_load(a), P##_load(b))); }     \
    };
NARROW_TR(f16_t, f16)
NARROW_TR(bf16_t, bf16)
NARROW_TR(e4m3_t, e4m3)
NARROW_TR(e5m2_t, e5m2)

#define GRID_LOOP(i, n)                                                            \
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < (n);              \
         i += (u64)gridDim.x * blockDim.x)

#define BINARY(NAME, T, OPNAME, EXPR)                                                       \
    extern "C" __global__ void hetccl_reduce_##NAME##_##OPNAME(T* dst, const T* a,          \
                                                               const T* b, u64 n, T s) {    \
        GRID_LOOP(i, n) { dst[i] = EXPR; }                                                  \
    }

#define KERNELS(NAME, T)                                                           \
    BINARY(NAME, T, sum, Tr<T>::add(a[i], b[i]))                                   \
    BINARY(NAME, T, prod, Tr<T>::mul(a[i], b[i]))                                  \
    BINARY(NAME, T, max, Tr<T>::mx(a[i], b[i]))                                    \
    BINARY(NAME, T, min, Tr<T>::mn(a[i], b[i]))                                    \
    BINARY(NAME, T, avg, Tr<T>::add(Tr<T>::mul(a[i], s), b[i]))                    \
    BINARY(NAME, T, premulsum, Tr<T>::add(Tr<T>::mul(a[i], s), b[i]))              \
    extern "C" __global__ void hetccl_premul_##NAME(T* dst, const T* a, u64 n, T s) { \
        GRID_LOOP(i, n) { dst[i] = Tr<T>::mul(a[i], s); }                          \
    }

#define POSTDIV(NAME, T)                                                         \
    extern "C" __global__ void hetccl_postdiv_##NAME(T* dst, u64 n, u64 d) {     \
        GRID_LOOP(i, n) { dst[i] = Tr<T>::div(dst[i], d); }                      \
    }

KERNELS(i8, signed char)
KERNELS(u8, unsigned char)
KERNELS(i32, int)
KERNELS(u32, unsigned int)
KERNELS(i64, long long)
KERNELS(u64, unsigned long long)
KERNELS(f16, f16_t)
KERNELS(f32, float)
KERNELS(f64, double)
KERNELS(bf16, bf16_t)
KERNELS(f8e4m3, e4m3_t)
KERNELS(f8e5m2, e5m2_t)

POSTDIV(i8, signed char)
POSTDIV(u8, unsigned char)
POSTDIV(i32, int)
POSTDIV(u32, unsigned int)
POSTDIV(i64, long long)
POSTDIV(u64, unsigned long long)
