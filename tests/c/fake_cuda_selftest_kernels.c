/*
 * fake_cuda_selftest_kernels.c: the self-test of the emulated reduction
 * kernels (see fake_cuda_selftest.c): modules and function lookup, exact
 * results (wrap-around, NaN, no FMA contraction), launches that read
 * exactly the kernel's parameters, and the launch errors.
 */
#include "fake_cuda_selftest.h"

/* -------------------------------------------------------------- kernels */

/* Stands in for NVRTC's PTX of collectives/src/gpu/kernels/reduce.cu. */
static const char PTX[] =
    "//\n// Hand-written: only the entry names matter to the fake.\n//\n"
    ".version 8.5\n.target sm_90\n.address_size 64\n\n"
    "\t// .globl\thetccl_reduce_f32_sum\n"
    ".visible .entry hetccl_reduce_f32_sum(\n\t.param .u64 p0,\n\t.param .f32 p4\n)\n{\n\tret;\n}\n"
    ".visible .entry hetccl_reduce_f16_sum(\n)\n{\n\tret;\n}\n"
    ".visible .entry hetccl_reduce_f32_max(\n)\n{\n\tret;\n}\n"
    ".visible .entry hetccl_reduce_f32_avg(\n)\n{\n\tret;\n}\n"
    ".visible .entry hetccl_reduce_i32_prod(\n)\n{\n\tret;\n}\n"
    ".visible .entry hetccl_reduce_u8_sum(\n)\n{\n\tret;\n}\n"
    ".visible .entry hetccl_reduce_i8_max(\n)\n{\n\tret;\n}\n"
    ".visible .entry hetccl_reduce_u64_sum(\n)\n{\n\tret;\n}\n"
    ".visible .entry hetccl_reduce_f64_min(\n)\n{\n\tret;\n}\n"
    ".visible .entry hetccl_premul_f32(\n)\n{\n\tret;\n}\n"
    ".visible .entry hetccl_postdiv_i32(\n)\n{\n\tret;\n}\n"
    ".visible .entry hetccl_reduce_i32_premulsum(\n)\n{\n\tret;\n}\n"
    ".visible .entry hetccl_premul_f64(\n)\n{\n\tret;\n}\n"
    ".visible .entry hetccl_premul_u8(\n)\n{\n\tret;\n}\n"
    ".visible .entry hetccl_postdiv_i64(\n)\n{\n\tret;\n}\n"
    ".visible .entry hetccl_postdiv_u32(\n)\n{\n\tret;\n}\n"
    ".visible .entry hetccl_premul_f16(\n)\n{\n\tret;\n}\n"
    ".visible .entry hetccl_reduce_bf16_avg(\n)\n{\n\tret;\n}\n"
    ".visible .entry hetccl_postdiv_f32(\n)\n{\n\tret;\n}\n";

static CUfunction get_fn(CUmodule m, const char *name) {
    CUfunction f = NULL;
    CK(cuModuleGetFunction(&f, m, name));
    return f;
}

/* The kernels' signature: (T* dst, const T* a, const T* b, u64 n, T s). */
static CUresult launch(CUfunction f, CUdeviceptr d, CUdeviceptr a, CUdeviceptr b, uint64_t n,
                       CUstream s) {
    uint64_t scalar = 0;
    void *params[5] = {&d, &a, &b, &n, &scalar};
    return cuLaunchKernel(f, 4, 1, 1, 256, 1, 1, 0, s, params, NULL);
}

/* `len` bytes that end where a PROT_NONE page begins: reading past them
 * crashes. Freed with unguard(p, len). */
static void *guarded(size_t len) {
    size_t pg = (size_t)sysconf(_SC_PAGESIZE);
    char *m = mmap(NULL, 2 * pg, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED || mprotect(m + pg, pg, PROT_NONE) != 0) {
        perror("guarded");
        exit(2);
    }
    return m + pg - len;
}
static void unguard(void *p, size_t len) {
    size_t pg = (size_t)sysconf(_SC_PAGESIZE);
    munmap((char *)p + len - pg, 2 * pg);
}

/* Launches f with exactly np parameters, the i-th len[i] bytes at val[i].
 * The kernelParams array and every value end at a PROT_NONE page, so a fake
 * that reads one parameter more, or one byte more of a parameter, than the
 * kernel declares crashes this program. */
static CUresult launch_exact(CUfunction f, CUstream s, int np, const void *const *val,
                             const size_t *len) {
    void **params = guarded((size_t)np * sizeof(void *));
    for (int i = 0; i < np; i++) {
        params[i] = guarded(len[i]);
        memcpy(params[i], val[i], len[i]);
    }
    CUresult rc = cuLaunchKernel(f, 2, 1, 1, 128, 1, 1, 0, s, params, NULL);
    for (int i = 0; i < np; i++) unguard(params[i], len[i]);
    unguard(params, (size_t)np * sizeof(void *));
    return rc;
}
/* hetccl_reduce_<dt>_<op>(T* dst, const T* a, const T* b, u64 n, T s); sc: sizeof(T) = ts bytes. */
static CUresult launch_red(CUfunction f, CUdeviceptr d, CUdeviceptr a, CUdeviceptr b, uint64_t n,
                           const void *sc, size_t ts, CUstream s) {
    const void *val[5] = {&d, &a, &b, &n, sc};
    const size_t len[5] = {8, 8, 8, 8, ts};
    return launch_exact(f, s, 5, val, len);
}
/* hetccl_premul_<dt>(T* dst, const T* a, u64 n, T s). */
static CUresult launch_premul(CUfunction f, CUdeviceptr d, CUdeviceptr a, uint64_t n,
                              const void *sc, size_t ts, CUstream s) {
    const void *val[4] = {&d, &a, &n, sc};
    const size_t len[4] = {8, 8, 8, ts};
    return launch_exact(f, s, 4, val, len);
}
/* hetccl_postdiv_<dt>(T* dst, u64 n, u64 d). */
static CUresult launch_postdiv(CUfunction f, CUdeviceptr d, uint64_t n, uint64_t dv, CUstream s) {
    const void *val[3] = {&d, &n, &dv};
    const size_t len[3] = {8, 8, 8};
    return launch_exact(f, s, 3, val, len);
}

/* `key v0,v1,...` with %.9g (float) or %.17g (double) or integers. */
static void kv_f32(const char *k, const float *v, int n) {
    printf("%s ", k);
    for (int i = 0; i < n; i++) printf("%s%.9g", i ? "," : "", (double)v[i]);
    printf("\n");
}
static void kv_f64(const char *k, const double *v, int n) {
    printf("%s ", k);
    for (int i = 0; i < n; i++) printf("%s%.17g", i ? "," : "", v[i]);
    printf("\n");
}
static void kv_i64(const char *k, const int64_t *v, int n) {
    printf("%s ", k);
    for (int i = 0; i < n; i++) printf("%s%lld", i ? "," : "", (long long)v[i]);
    printf("\n");
}

struct nctx_res { CUresult load, launch; CUfunction f; };
static void *no_ctx_thread(void *arg) {
    struct nctx_res *r = arg;
    CUmodule m;
    r->load = cuModuleLoadData(&m, PTX);
    r->launch = launch(r->f, 0, 0, 0, 0, NULL);
    return NULL;
}

void t_kernels(void) {
    CUmodule m = NULL, junk = NULL;
    CUfunction f = NULL;
    kv("kernel.load_garbage", cuModuleLoadData(&junk, "not a cubin"));
    static const unsigned char not_cuda[64] = {0x7f, 'E', 'L', 'F', 2, 1, 1};
    kv("kernel.load_elf", cuModuleLoadData(&junk, not_cuda)); /* ELF, but not EM_CUDA */
    kv("kernel.load_null", cuModuleLoadData(&junk, NULL));
    kv("kernel.load", cuModuleLoadData(&m, PTX));
    kv("kernel.module_nonnull", m != NULL);
    kv("kernel.get_f32_sum", cuModuleGetFunction(&f, m, "hetccl_reduce_f32_sum"));
    CUfunction again = NULL;
    CK(cuModuleGetFunction(&again, m, "hetccl_reduce_f32_sum"));
    kv("kernel.same_handle", f != NULL && again == f);
    CUfunction g = NULL;
    kv("kernel.get_f16_sum", cuModuleGetFunction(&g, m, "hetccl_reduce_f16_sum"));
    kv("kernel.get_f32_avg", cuModuleGetFunction(&g, m, "hetccl_reduce_f32_avg"));
    kv("kernel.get_premul", cuModuleGetFunction(&g, m, "hetccl_premul_f32"));
    kv("kernel.get_postdiv", cuModuleGetFunction(&g, m, "hetccl_postdiv_i32"));
    CUfunction h = NULL;
    CK(cuModuleGetFunction(&h, m, "hetccl_premul_f32"));
    kv("kernel.premul_own_handle", h != NULL && h != g && h != f);
    kv("kernel.get_f16_premul", cuModuleGetFunction(&g, m, "hetccl_premul_f16"));
    kv("kernel.get_bf16_avg", cuModuleGetFunction(&g, m, "hetccl_reduce_bf16_avg"));
    kv("kernel.get_f32_postdiv", cuModuleGetFunction(&g, m, "hetccl_postdiv_f32"));
    kv("kernel.get_missing", cuModuleGetFunction(&g, m, "hetccl_reduce_i32_sum"));
    kv("kernel.get_prefix", cuModuleGetFunction(&g, m, "hetccl_reduce_f32_su"));
    kv("kernel.get_bad_module", cuModuleGetFunction(&g, NULL, "hetccl_reduce_f32_sum"));

    enum { N = 5 };
    CUstream s = new_stream();
    CUevent e = new_event();
    volatile uint32_t *flag = new_flag(0);
    CUdeviceptr A, B;
    CK(cuMemAlloc(&A, 4096));
    CK(cuMemAlloc(&B, 4096));

    /* f32 sum, dst aliasing a, queued behind a blocked wait-value. The
     * parameter variables change after the launch: the values count. */
    const float fa[N] = {1.5f, -2.0f, 16777216.0f, 0.1f, 3.0f};
    const float fb[N] = {2.25f, 0.5f, 1.0f, 0.2f, -3.0f};
    float fo[N];
    CK(cuMemcpyHtoD(A, fa, sizeof fa));
    CK(cuMemcpyHtoD(B, fb, sizeof fb));
    CK(cuStreamWaitValue32(s, (CUdeviceptr)(uintptr_t)flag, 1, CU_STREAM_WAIT_VALUE_GEQ));
    {
        CUdeviceptr pd = A, pa = A, pb = B;
        uint64_t n = N;
        float sc = 0.0f;
        void *params[5] = {&pd, &pa, &pb, &n, &sc};
        kv("kernel.launch_rc", cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, s, params, NULL));
        pd = pa = pb = 0;
        n = 0;
    }
    CK(cuEventRecord(e, s));
    sleep_ms(30);
    kv("kernel.pending", cuEventQuery(e));
    CK(cuMemcpyDtoH(fo, A, sizeof fo)); /* default stream: not ordered after s */
    kv("kernel.not_run_before_release", memcmp(fo, fa, sizeof fa) == 0);
    set_flag(flag, 1);
    CK(cuEventSynchronize(e));
    CK(cuMemcpyDtoH(fo, A, sizeof fo));
    kv_f32("kernel.f32_sum", fo, N);

    /* f32 max: the non-NaN operand of a NaN pair; dst aliasing b. */
    const float ma[N] = {1.0f, NAN, 3.0f, -7.0f, NAN};
    const float mb[N] = {2.0f, 5.0f, NAN, -8.0f, NAN};
    CK(cuMemcpyHtoD(A, ma, sizeof ma));
    CK(cuMemcpyHtoD(B, mb, sizeof mb));
    kv("kernel.launch_f32_max", launch(get_fn(m, "hetccl_reduce_f32_max"), B, A, B, N, s));
    CK(cuStreamSynchronize(s));
    CK(cuMemcpyDtoH(fo, B, sizeof fo));
    kv_f32("kernel.f32_max", fo, N);

    /* i32 prod, wrapping; a in device memory, b and dst in pinned memory. */
    const int32_t pa_[4] = {INT32_MAX, -3, 65536, 7};
    const int32_t pb_[4] = {2, 5, 65536, INT32_MIN};
    int32_t *hb, *hd;
    CK(cuMemHostAlloc((void **)&hb, 64, 0));
    CK(cuMemHostAlloc((void **)&hd, 64, 0));
    memcpy(hb, pb_, sizeof pb_);
    memset(hd, 0, 64);
    CK(cuMemcpyHtoD(A, pa_, sizeof pa_));
    CK(launch(get_fn(m, "hetccl_reduce_i32_prod"), (CUdeviceptr)(uintptr_t)hd, A,
              (CUdeviceptr)(uintptr_t)hb, 4, s));
    CK(cuStreamSynchronize(s));
    int64_t io[8];
    for (int i = 0; i < 4; i++) io[i] = hd[i];
    kv_i64("kernel.i32_prod", io, 4);

    /* u8 sum, wrapping, at interior (odd) offsets, dst aliasing a. */
    const uint8_t ua[3] = {200, 1, 255}, ub[3] = {100, 2, 255};
    uint8_t uo[5] = {0};
    CK(cuMemsetD8(A, 9, 64));
    CK(cuMemcpyHtoD(A + 17, ua, 3));
    CK(cuMemcpyHtoD(B + 33, ub, 3));
    CK(launch(get_fn(m, "hetccl_reduce_u8_sum"), A + 17, A + 17, B + 33, 3, s));
    CK(cuStreamSynchronize(s));
    CK(cuMemcpyDtoH(uo, A + 16, 5));
    for (int i = 0; i < 5; i++) io[i] = uo[i];
    kv_i64("kernel.u8_sum", io, 5); /* the bytes around are untouched (9) */

    /* i8 max compares signed; u64 sum wraps. */
    const int8_t ia[3] = {-128, 127, -1}, ib[3] = {0, -128, 1};
    int8_t i8o[3];
    CK(cuMemcpyHtoD(A, ia, 3));
    CK(cuMemcpyHtoD(B, ib, 3));
    CK(launch(get_fn(m, "hetccl_reduce_i8_max"), A, A, B, 3, s));
    CK(cuStreamSynchronize(s));
    CK(cuMemcpyDtoH(i8o, A, 3));
    for (int i = 0; i < 3; i++) io[i] = i8o[i];
    kv_i64("kernel.i8_max", io, 3);
    const uint64_t la[2] = {UINT64_MAX, 1ull << 63}, lb[2] = {2, 1ull << 63};
    uint64_t lo[2];
    CK(cuMemcpyHtoD(A, la, sizeof la));
    CK(cuMemcpyHtoD(B, lb, sizeof lb));
    CK(launch(get_fn(m, "hetccl_reduce_u64_sum"), A, A, B, 2, s));
    CK(cuStreamSynchronize(s));
    CK(cuMemcpyDtoH(lo, A, sizeof lo));
    for (int i = 0; i < 2; i++) io[i] = (int64_t)lo[i];
    kv_i64("kernel.u64_sum", io, 2);

    /* f64 min with NaN operands, in double precision (1 + 2^-40 survives). */
    const double da[N] = {NAN, 1.5, -2.0, 1e10, 1.0};
    const double db[N] = {4.0, NAN, 3.0, -1e10, 1.0 + 0x1p-40};
    double dout[N];
    CK(cuMemcpyHtoD(A, da, sizeof da));
    CK(cuMemcpyHtoD(B, db, sizeof db));
    CK(launch(get_fn(m, "hetccl_reduce_f64_min"), A, A, B, N, s));
    CK(cuStreamSynchronize(s));
    CK(cuMemcpyDtoH(dout, A, sizeof dout));
    kv_f64("kernel.f64_min", dout, N);
    CK(cuMemcpyHtoD(A, db, sizeof db)); /* min(1 + 2^-40, 1 + 2^-40) stays exact */
    CK(launch(get_fn(m, "hetccl_reduce_f64_min"), A, A, B, N, s));
    CK(cuStreamSynchronize(s));
    CK(cuMemcpyDtoH(dout, A, sizeof dout));
    kv("kernel.f64_exact", dout[4] == 1.0 + 0x1p-40);

    /* f32 avg, dst = a*s + b with s = 0.25, dst aliasing b: 3*0.25 + 2^24
     * rounds to 2^24 in float. */
    const float va[N] = {4.0f, 1.0f, -8.0f, 0.1f, 3.0f};
    const float vb[N] = {1.0f, 0.5f, 2.0f, 0.2f, 16777216.0f};
    const float quarter = 0.25f;
    CK(cuMemcpyHtoD(A, va, sizeof va));
    CK(cuMemcpyHtoD(B, vb, sizeof vb));
    CK(launch_red(get_fn(m, "hetccl_reduce_f32_avg"), B, A, B, N, &quarter, 4, s));
    CK(cuStreamSynchronize(s));
    CK(cuMemcpyDtoH(fo, B, sizeof fo));
    kv_f32("kernel.f32_avg", fo, N);
    /* a*s + b with a = s = 1 + 2^-12, b = -(1 + 2^-11): the exact product
     * 1 + 2^-11 + 2^-24 rounds (to even) to 1 + 2^-11, so unfused gives 0,
     * fused 2^-24. Both computed here: the double sum is exact. */
    {
        volatile float x = 1.0f + 0x1p-12f, sc = 1.0f + 0x1p-12f, y = -(1.0f + 0x1p-11f);
        volatile float prod = x * sc;
        float unfused = prod + y;
        float fused = (float)((double)x * (double)sc + (double)y);
        kv("kernel.f32_fma_differs", unfused != fused);
        printf("kernel.f32_fma_ref %.9g,%.9g\n", (double)unfused, (double)fused);
        const float one[1] = {x}, other[1] = {y}, scv = sc;
        CK(cuMemcpyHtoD(A, one, 4));
        CK(cuMemcpyHtoD(B, other, 4));
        CK(launch_red(get_fn(m, "hetccl_reduce_f32_avg"), A, A, B, 1, &scv, 4, s));
        CK(cuStreamSynchronize(s));
        CK(cuMemcpyDtoH(fo, A, 4));
        kv_f32("kernel.f32_avg_unfused", fo, 1);
    }

    /* i32 premulsum a*(-3) + b, wrapping; the 5-parameter shape with
     * exactly 5 parameters and a 4-byte s. */
    const int32_t qa[4] = {INT32_MAX, -7, 1 << 30, 5}, qb[4] = {1, 2, 0, INT32_MAX};
    const int32_t m3 = -3;
    int32_t qo[4];
    CK(cuMemcpyHtoD(A, qa, sizeof qa));
    CK(cuMemcpyHtoD(B, qb, sizeof qb));
    kv("kernel.exact_params_reduce",
       launch_red(get_fn(m, "hetccl_reduce_i32_premulsum"), A, A, B, 4, &m3, 4, s));
    CK(cuStreamSynchronize(s));
    CK(cuMemcpyDtoH(qo, A, sizeof qo));
    for (int i = 0; i < 4; i++) io[i] = qo[i];
    kv_i64("kernel.i32_premulsum", io, 4);

    /* f64 premul a*3 into another buffer: 3*(1 + 2^-52) rounds to even. */
    const double pa64[N] = {1.5, -2.0, 0.1, 1e308, 1.0 + 0x1p-52};
    const double three = 3.0;
    CK(cuMemcpyHtoD(A, pa64, sizeof pa64));
    CK(launch_premul(get_fn(m, "hetccl_premul_f64"), B, A, N, &three, 8, s));
    CK(cuStreamSynchronize(s));
    CK(cuMemcpyDtoH(dout, B, sizeof dout));
    kv_f64("kernel.f64_premul", dout, N);

    /* u8 premul a*255 in place at an odd offset, wrapping; the 4-parameter
     * shape with exactly 4 parameters and a 1-byte s. */
    const uint8_t pu[4] = {200, 3, 255, 0};
    const uint8_t u255 = 255;
    uint8_t puo[6];
    CK(cuMemsetD8(A, 9, 64));
    CK(cuMemcpyHtoD(A + 5, pu, 4));
    kv("kernel.exact_params_premul",
       launch_premul(get_fn(m, "hetccl_premul_u8"), A + 5, A + 5, 4, &u255, 1, s));
    CK(cuStreamSynchronize(s));
    CK(cuMemcpyDtoH(puo, A + 4, 6));
    for (int i = 0; i < 6; i++) io[i] = puo[i];
    kv_i64("kernel.u8_premul", io, 6); /* the bytes around are untouched (9) */

    /* i64 postdiv by 2 truncates toward zero; by d = 2^64 - 1, which the
     * kernel divides by as (long long)d = -1 (LLONG_MIN / -1 wraps). */
    const int64_t da64[6] = {-7, 7, -8, INT64_MIN, -1, 9};
    int64_t do64[6];
    CUfunction pdiv = get_fn(m, "hetccl_postdiv_i64");
    CK(cuMemcpyHtoD(A, da64, sizeof da64));
    CK(launch_postdiv(pdiv, A, 6, 2, s));
    CK(cuStreamSynchronize(s));
    CK(cuMemcpyDtoH(do64, A, sizeof do64));
    kv_i64("kernel.i64_postdiv", do64, 6);
    CK(cuMemcpyHtoD(A, da64, sizeof da64));
    CK(launch_postdiv(pdiv, A, 6, UINT64_MAX, s));
    CK(cuStreamSynchronize(s));
    CK(cuMemcpyDtoH(do64, A, sizeof do64));
    kv_i64("kernel.i64_postdiv_dmax", do64, 6);

    /* u32 postdiv by 3; the 3-parameter shape with exactly 3 parameters.
     * Then by 2^32 (a 64-bit divisor: 0, not a division by zero). */
    const uint32_t ua32[4] = {UINT32_MAX, 7, 0, 100};
    uint32_t uo32[4];
    CUfunction udiv = get_fn(m, "hetccl_postdiv_u32");
    CK(cuMemcpyHtoD(A, ua32, sizeof ua32));
    kv("kernel.exact_params_postdiv", launch_postdiv(udiv, A, 4, 3, s));
    CK(cuStreamSynchronize(s));
    CK(cuMemcpyDtoH(uo32, A, sizeof uo32));
    for (int i = 0; i < 4; i++) io[i] = uo32[i];
    kv_i64("kernel.u32_postdiv", io, 4);
    CK(cuMemcpyHtoD(A, ua32, sizeof ua32));
    CK(launch_postdiv(udiv, A, 4, 1ull << 32, s));
    CK(cuStreamSynchronize(s));
    CK(cuMemcpyDtoH(uo32, A, sizeof uo32));
    for (int i = 0; i < 4; i++) io[i] = uo32[i];
    kv_i64("kernel.u32_postdiv_2p32", io, 4);
    /* Division by zero is refused (unless n == 0: nothing is divided). */
    kv("kernel.postdiv_zero", launch_postdiv(udiv, A, 4, 0, s));
    kv("kernel.postdiv_zero_n0", launch_postdiv(udiv, A, 0, 0, s));
    {
        uint64_t n1 = 1;
        void *pp[3] = {&A, &n1, NULL};
        kv("kernel.postdiv_null_param", cuLaunchKernel(udiv, 1, 1, 1, 1, 1, 1, 0, s, pp, NULL));
    }
    CK(cuStreamSynchronize(s));

    /* Errors. */
    void *params[5] = {&A, &A, &B, &(uint64_t){1}, &(uint64_t){0}};
    kv("kernel.launch_null_fn", cuLaunchKernel(NULL, 1, 1, 1, 1, 1, 1, 0, s, params, NULL));
    kv("kernel.launch_grid0", cuLaunchKernel(f, 0, 1, 1, 1, 1, 1, 0, s, params, NULL));
    kv("kernel.launch_block0", cuLaunchKernel(f, 1, 1, 1, 1, 0, 1, 0, s, params, NULL));
    kv("kernel.launch_block_big", cuLaunchKernel(f, 1, 1, 1, 1025, 1, 1, 0, s, params, NULL));
    kv("kernel.launch_no_params", cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, s, NULL, NULL));
    void *extra[] = {CU_LAUNCH_PARAM_END};
    kv("kernel.launch_extra", cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, s, params, extra));
    kv("kernel.launch_overrun", launch(f, A, A, B, 1025, s)); /* 4100 bytes > 4096 */
    kv("kernel.launch_null_ptr", launch(f, 0, A, B, 1, s));
    kv("kernel.launch_n0_null", launch(f, 0, 0, 0, 0, s));
    struct nctx_res r = {0, 0, f};
    pthread_t th;
    pthread_create(&th, NULL, no_ctx_thread, &r);
    pthread_join(th, NULL);
    kv("kernel.load_no_ctx", r.load);
    kv("kernel.launch_no_ctx", r.launch);
    CK(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_RELAXED));
    kv("kernel.launch_capturing", launch(f, A, A, B, 1, s));
    CUgraph gr;
    CK(cuStreamEndCapture(s, &gr));
    CK(cuGraphDestroy(gr));
    CK(cuStreamSynchronize(s));

    kv("kernel.unload", cuModuleUnload(m));
    kv("kernel.unload_again", cuModuleUnload(NULL));
    CK(cuEventDestroy(e));
    CK(cuStreamDestroy(s));
    CK(cuMemFree(A));
    CK(cuMemFree(B));
    CK(cuMemFreeHost(hb));
    CK(cuMemFreeHost(hd));
    CK(cuMemFreeHost((void *)flag));
}
