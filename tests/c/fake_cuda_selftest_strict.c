/*
 * fake_cuda_selftest_strict.c: the self-test of the emulated driver's
 * strictness (see fake_cuda_selftest.c): the contexts of events, streams
 * and kernels; the calls that wait for idle streams; the shared
 * host-function worker; CUBIN and PTX images; the watchdogs (modes
 * `deadlock` and `hostfn_wait`, which must abort); an old driver (mode
 * `oldcuda`); and the narrow-float kernels on the cases that
 * tests/fake_cuda_selftest.rs writes (mode `narrow`).
 */
#include "fake_cuda_selftest.h"

#include <elf.h>

static const char PTX_TMPL[] = ".version %s\n.target sm_%d\n.address_size 64\n";

/* PTX text of ISA `ver` for sm_`sm` with entries `names` (malloc'd). */
static char *make_ptx(const char *ver, int sm, const char *const *names, int n) {
    size_t cap = 256;
    for (int i = 0; i < n; i++) cap += strlen(names[i]) + 64;
    char *p = malloc(cap);
    if (!p) exit(2);
    size_t len = (size_t)snprintf(p, cap, PTX_TMPL, ver, sm);
    for (int i = 0; i < n; i++)
        len += (size_t)snprintf(p + len, cap - len, ".visible .entry %s(\n)\n{\n\tret;\n}\n", names[i]);
    return p;
}

/* A minimal CUBIN: an ELF image for EM_CUDA whose e_flags' low byte is
 * `sm`, with a symbol table of global functions `names` (malloc'd). */
static unsigned char *make_cubin(int sm, const char *const *names, int n) {
    size_t strsz = 1;
    for (int i = 0; i < n; i++) strsz += strlen(names[i]) + 1;
    size_t symoff = sizeof(Elf64_Ehdr), symsz = (size_t)(n + 1) * sizeof(Elf64_Sym);
    size_t stroff = symoff + symsz, shoff = (stroff + strsz + 7) & ~(size_t)7;
    unsigned char *img = calloc(1, shoff + 3 * sizeof(Elf64_Shdr));
    if (!img) exit(2);
    Elf64_Ehdr *eh = (Elf64_Ehdr *)img;
    memcpy(eh->e_ident, ELFMAG, SELFMAG);
    eh->e_ident[EI_CLASS] = ELFCLASS64;
    eh->e_ident[EI_DATA] = ELFDATA2LSB;
    eh->e_ident[EI_VERSION] = EV_CURRENT;
    eh->e_type = ET_EXEC;
    eh->e_machine = EM_CUDA;
    eh->e_version = EV_CURRENT;
    eh->e_flags = (unsigned)sm | (unsigned)sm << 16;
    eh->e_ehsize = sizeof *eh;
    eh->e_shoff = shoff;
    eh->e_shentsize = sizeof(Elf64_Shdr);
    eh->e_shnum = 3;
    Elf64_Sym *sym = (Elf64_Sym *)(img + symoff);
    char *str = (char *)img + stroff;
    size_t at = 1;
    for (int i = 0; i < n; i++) {
        sym[i + 1].st_name = (unsigned)at;
        sym[i + 1].st_info = ELF64_ST_INFO(STB_GLOBAL, STT_FUNC);
        strcpy(str + at, names[i]);
        at += strlen(names[i]) + 1;
    }
    Elf64_Shdr *sh = (Elf64_Shdr *)(img + shoff);
    sh[1] = (Elf64_Shdr){.sh_type = SHT_SYMTAB, .sh_offset = symoff, .sh_size = symsz, .sh_link = 2,
                         .sh_entsize = sizeof(Elf64_Sym)};
    sh[2] = (Elf64_Shdr){.sh_type = SHT_STRTAB, .sh_offset = stroff, .sh_size = strsz};
    return img;
}

static const char *const F32_SUM[] = {"hetccl_reduce_f32_sum", "hetccl_premul_f16"};

/* ---------------------------------------------------------- host functions */

static struct {
    pthread_t a, b;
    volatile int64_t a_end, b_start;
    CUresult nested;
    CUevent ev;
} g_sh;

static int64_t now_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000 + t.tv_nsec / 1000;
}

static void hf_a(void *u) {
    (void)u;
    g_sh.a = pthread_self();
    sleep_ms(100);
    g_sh.a_end = now_us();
}

static void hf_b(void *u) {
    (void)u;
    g_sh.b = pthread_self();
    g_sh.b_start = now_us();
}

static void hf_cuda(void *u) {
    (void)u;
    g_sh.nested = cuEventQuery(g_sh.ev);
}

/* Contexts, quiesce, host functions, images; ctx0 current on entry. */
void t_strict(CUcontext c0, CUcontext c1) {
    CK(cuCtxSetCurrent(c1));
    CUstream s1 = new_stream();
    CUevent e1 = new_event();
    CK(cuCtxSetCurrent(c0));
    CUstream s0 = new_stream();
    CUevent e0 = new_event();

    /* Streams and events carry their context. */
    CUcontext got = NULL;
    CK(cuStreamGetCtx(s1, &got));
    kv("ctxrule.stream_ctx", got == c1);
    CK(cuStreamGetCtx(NULL, &got));
    kv("ctxrule.default_stream_ctx", got == c0);
    kv("ctxrule.record_other_ctx", cuEventRecord(e1, s0));
    kv("ctxrule.record_other_default", cuEventRecord(e1, NULL));
    kv("ctxrule.record_same", cuEventRecord(e0, s0));
    kv("ctxrule.record_own_stream_other_current", cuEventRecord(e1, s1));
    kv("ctxrule.wait_event_cross", cuStreamWaitEvent(s0, e1, 0));
    static unsigned char src[64], dst[64];
    fill(src, 64, 3, 7);
    kv("ctxrule.copy_other_ctx_stream",
       cuMemcpyAsync((CUdeviceptr)(uintptr_t)dst, (CUdeviceptr)(uintptr_t)src, 64, s1));
    CK(cuStreamSynchronize(s0));
    CK(cuStreamSynchronize(s1));

    /* Kernels: the module's context, the stream's, and the current one. */
    char *ptx = make_ptx("8.5", 90, F32_SUM, 1);
    CUmodule m;
    CK(cuModuleLoadData(&m, ptx));
    CUfunction f;
    CK(cuModuleGetFunction(&f, m, "hetccl_reduce_f32_sum"));
    CUdeviceptr d;
    CK(cuMemAlloc(&d, 64));
    uint64_t n1 = 1;
    float sc = 0;
    void *params[5] = {&d, &d, &d, &n1, &sc};
    kv("ctxrule.launch_other_stream", cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, s1, params, NULL));
    CK(cuCtxSetCurrent(c1));
    kv("ctxrule.launch_other_module", cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, s1, params, NULL));
    CK(cuCtxSetCurrent(c0));
    kv("ctxrule.launch_same", cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, s0, params, NULL));
    CK(cuStreamSynchronize(s0));

    /* Frees wait for idle streams: device memory for its context's,
     * pinned memory for every context's; a module load for its context's. */
    volatile uint32_t *flag = new_flag(0);
    void *h; /* allocated before the wait: an allocation during it aborts */
    CK(cuMemHostAlloc(&h, 64, 0));
    CK(cuStreamWaitValue32(s1, (CUdeviceptr)(uintptr_t)flag, 1, CU_STREAM_WAIT_VALUE_GEQ));
    kv("quiesce.free_other_ctx", cuMemFree(d));
    kv("quiesce.free_other_ctx_did_not_wait", cuStreamQuery(s1) == CUDA_ERROR_NOT_READY);
    pthread_t th;
    pthread_create(&th, NULL, set_later, (void *)flag);
    kv("quiesce.freehost", cuMemFreeHost(h));
    kv("quiesce.freehost_waited", __atomic_load_n(flag, __ATOMIC_ACQUIRE) == 1);
    pthread_join(th, NULL);
    set_flag(flag, 0);
    CK(cuStreamWaitValue32(s0, (CUdeviceptr)(uintptr_t)flag, 1, CU_STREAM_WAIT_VALUE_GEQ));
    pthread_create(&th, NULL, set_later, (void *)flag);
    CUmodule m2;
    kv("quiesce.load", cuModuleLoadData(&m2, ptx));
    kv("quiesce.load_waited", __atomic_load_n(flag, __ATOMIC_ACQUIRE) == 1);
    pthread_join(th, NULL);
    CK(cuModuleUnload(m2));

    /* One worker for every host function, in order; no CUDA inside. */
    CK(cuLaunchHostFunc(s0, hf_a, NULL));
    sleep_ms(20);
    CK(cuLaunchHostFunc(s1, hf_b, NULL));
    CK(cuStreamSynchronize(s0));
    CK(cuStreamSynchronize(s1));
    kv("hostfn.shared_thread", pthread_equal(g_sh.a, g_sh.b) != 0);
    kv("hostfn.serialised", g_sh.b_start >= g_sh.a_end);
    g_sh.ev = e0;
    CK(cuLaunchHostFunc(s0, hf_cuda, NULL));
    CK(cuStreamSynchronize(s0));
    kv("hostfn.cuda_call", g_sh.nested);

    /* Images: a CUBIN for the device's architecture (sm_90) loads and its
     * global functions are the entries; another architecture's does not;
     * PTX of a newer ISA than the driver's, or for a newer target, does not. */
    unsigned char *cb = make_cubin(90, F32_SUM, 2);
    CUmodule mc;
    kv("cubin.load", cuModuleLoadData(&mc, cb));
    CUfunction g;
    kv("cubin.get_f32_sum", cuModuleGetFunction(&g, mc, "hetccl_reduce_f32_sum"));
    kv("cubin.get_f16_premul", cuModuleGetFunction(&g, mc, "hetccl_premul_f16"));
    kv("cubin.get_absent", cuModuleGetFunction(&g, mc, "hetccl_reduce_f32_max"));
    {
        const float a[2] = {1.25f, 2.0f};
        float out[2] = {0};
        CK(cuModuleGetFunction(&g, mc, "hetccl_reduce_f32_sum"));
        CUdeviceptr A;
        CK(cuMemAlloc(&A, 8));
        CK(cuMemcpyHtoD(A, a, 8));
        uint64_t n2 = 2;
        void *p2[5] = {&A, &A, &A, &n2, &sc};
        CK(cuLaunchKernel(g, 1, 1, 1, 32, 1, 1, 0, s0, p2, NULL));
        CK(cuStreamSynchronize(s0));
        CK(cuMemcpyDtoH(out, A, 8));
        kv("cubin.runs", out[0] == 2.5f && out[1] == 4.0f);
        CK(cuMemFree(A));
    }
    CK(cuModuleUnload(mc));
    unsigned char *c80 = make_cubin(80, F32_SUM, 1);
    kv("cubin.other_arch", cuModuleLoadData(&mc, c80));
    char *p99 = make_ptx("9.9", 90, F32_SUM, 1), *p100 = make_ptx("8.0", 100, F32_SUM, 1);
    kv("ptx.newer_isa", cuModuleLoadData(&mc, p99));
    kv("ptx.newer_target", cuModuleLoadData(&mc, p100));
    free(cb), free(c80), free(p99), free(p100);

    CK(cuModuleUnload(m));
    free(ptx);
    CK(cuStreamSynchronize(s1));
    CK(cuEventDestroy(e0));
    CK(cuEventDestroy(e1));
    CK(cuStreamDestroy(s0));
    CK(cuStreamDestroy(s1));
    CK(cuMemFreeHost((void *)flag));
}

/* -------------------------------------------------------- other modes */

static CUcontext setup(void) {
    CUcontext c;
    CK(cuInit(0));
    CK(cuDevicePrimaryCtxRetain(&c, 0));
    CK(cuCtxSetCurrent(c));
    return c;
}

/* A free while a stream waits for a flag nobody sets: must abort. */
int m_deadlock(void) {
    setup();
    CUstream s = new_stream();
    volatile uint32_t *flag = new_flag(0), *other = new_flag(0);
    CK(cuStreamWaitValue32(s, (CUdeviceptr)(uintptr_t)flag, 1, CU_STREAM_WAIT_VALUE_GEQ));
    printf("freeing 1\n");
    fflush(stdout);
    CK(cuMemFreeHost((void *)other));
    printf("returned 1\n");
    return 0;
}

/* An allocation (pinned host memory, or device memory when `device`)
 * while a stream waits on a flag nobody has set yet: must abort, at once;
 * one after the flag is set must not. */
int m_alloc_wait(int device) {
    setup();
    CUstream s = new_stream();
    volatile uint32_t *flag = new_flag(0);
    CK(cuStreamWaitValue32(s, (CUdeviceptr)(uintptr_t)flag, 1, CU_STREAM_WAIT_VALUE_GEQ));
    set_flag(flag, 1);
    CK(cuStreamSynchronize(s));
    void *h;
    CUdeviceptr d;
    CK(cuMemHostAlloc(&h, 64, 0)); /* the wait is over */
    set_flag(flag, 0);
    CK(cuStreamWaitValue32(s, (CUdeviceptr)(uintptr_t)flag, 1, CU_STREAM_WAIT_VALUE_GEQ));
    printf("allocating 1\n");
    fflush(stdout);
    if (device)
        CK(cuMemAlloc(&d, 64));
    else
        CK(cuMemHostAlloc(&h, 64, 0));
    printf("returned 1\n");
    return 0;
}

static void hf_sleep(void *u) {
    (void)u;
    sleep_ms(5000);
}

/* A host function that waits past FAKE_CUDA_HOSTFN_LIMIT_S: must abort. */
int m_hostfn_wait(void) {
    setup();
    CUstream s = new_stream();
    CK(cuLaunchHostFunc(s, hf_sleep, NULL));
    printf("waiting 1\n");
    fflush(stdout);
    CK(cuStreamSynchronize(s));
    printf("returned 1\n");
    return 0;
}

/* FAKE_CUDA_DRIVER_VERSION=12020 and FAKE_CUDA_REJECT_CUBIN=1. */
int m_oldcuda(void) {
    setup();
    int v = 0;
    CK(cuDriverGetVersion(&v));
    kv("old.version", v);
    CUmodule m;
    char *p85 = make_ptx("8.5", 90, F32_SUM, 1), *p82 = make_ptx("8.2", 90, F32_SUM, 1);
    kv("old.ptx_8_5", cuModuleLoadData(&m, p85));
    kv("old.ptx_8_2", cuModuleLoadData(&m, p82));
    unsigned char *cb = make_cubin(90, F32_SUM, 1);
    kv("old.cubin_rejected", cuModuleLoadData(&m, cb));
    free(p85), free(p82), free(cb);
    printf("done 1\n");
    return 0;
}

/* Runs the cases of `in` (records: u32 name length, name, u32 element
 * size, u64 n, 8 scalar bytes, a and b of n elements) through the
 * emulated kernels (hetccl_premul_*: dst = a*s; the others dst = op(a, b)
 * or a*s + b) and writes each dst to `out`. */
int m_narrow(const char *in, const char *out) {
    setup();
    FILE *fi = fopen(in, "rb"), *fo = fopen(out, "wb");
    if (!fi || !fo) return 2;
    CUstream s = new_stream();
    int cases = 0;
    for (;;) {
        uint32_t nl, es;
        uint64_t n;
        unsigned char scalar[8];
        char name[64];
        if (fread(&nl, 4, 1, fi) != 1) break;
        if (nl >= sizeof name || fread(name, 1, nl, fi) != nl || fread(&es, 4, 1, fi) != 1 ||
            fread(&n, 8, 1, fi) != 1 || fread(scalar, 8, 1, fi) != 1)
            return 2;
        name[nl] = 0;
        size_t bytes = (size_t)n * es;
        unsigned char *a = malloc(bytes), *b = malloc(bytes), *d = malloc(bytes);
        if (!a || !b || !d || fread(a, 1, bytes, fi) != bytes || fread(b, 1, bytes, fi) != bytes)
            return 2;
        const char *names[2] = {name, "hetccl_reduce_f32_sum"}; /* a module of hetccl's */
        char *ptx = make_ptx("8.5", 90, names, 2);
        CUmodule m;
        CUfunction f;
        CK(cuModuleLoadData(&m, ptx));
        CK(cuModuleGetFunction(&f, m, name));
        CUdeviceptr A, B, D;
        CK(cuMemAlloc(&A, bytes));
        CK(cuMemAlloc(&B, bytes));
        CK(cuMemAlloc(&D, bytes));
        CK(cuMemcpyHtoD(A, a, bytes));
        CK(cuMemcpyHtoD(B, b, bytes));
        void *p5[5] = {&D, &A, &B, &n, scalar}, *p4[4] = {&D, &A, &n, scalar};
        int premul = strncmp(name, "hetccl_premul_", 14) == 0;
        CK(cuLaunchKernel(f, 64, 1, 1, 256, 1, 1, 0, s, premul ? p4 : p5, NULL));
        CK(cuStreamSynchronize(s));
        CK(cuMemcpyDtoH(d, D, bytes));
        if (fwrite(d, 1, bytes, fo) != bytes) return 2;
        CK(cuMemFree(A));
        CK(cuMemFree(B));
        CK(cuMemFree(D));
        CK(cuModuleUnload(m));
        free(ptx), free(a), free(b), free(d);
        cases++;
    }
    if (fclose(fo) != 0) return 2;
    fclose(fi);
    kv("narrow.cases", cases);
    printf("done 1\n");
    return 0;
}
