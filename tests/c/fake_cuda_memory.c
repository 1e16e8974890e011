/*
 * fake_cuda_memory.c: the emulated CUDA driver's memory (the model and its
 * limits are described in fake_cuda.c): the table of allocations, with the
 * address translation the stream workers use; device and pinned
 * allocations; pointer attributes; address ranges; DMA-BUF handles (a
 * dup of the allocation's memfd); IPC handles. Frees and IPC closes
 * synchronise as CUDA's do: they wait (quiesce) until the streams are
 * idle.
 */
#include "fake_cuda_internal.h"

/* ----------------------------------------------------- the memory table */

enum kind { K_DEVICE, K_PINNED, K_IPC };
static const char *const KIND_NAME[] = {"device", "pinned", "ipc"};

struct alloc {
    struct alloc *next;
    uintptr_t dev;   /* the address the user sees (the PROT_NONE view, or the pinned memory) */
    char *shadow;    /* the read-write view (== dev for pinned memory) */
    size_t size;     /* as requested */
    size_t maplen;   /* size rounded up to pages */
    int ordinal;     /* device of the allocating context */
    int kind;        /* enum kind */
    int fd;          /* the memfd (K_DEVICE), else -1 */
    int refs;        /* the table's, plus one per queued operation using it */
    uint64_t id;     /* CU_POINTER_ATTRIBUTE_BUFFER_ID: unique for the process's life */
    struct fake_ctx *ctx;
};
static pthread_mutex_t g_mem = PTHREAD_MUTEX_INITIALIZER;
static struct alloc *g_allocs;

static struct alloc *find_locked(uintptr_t a) {
    for (struct alloc *p = g_allocs; p; p = p->next)
        if (a >= p->dev && a - p->dev < p->size) return p;
    return NULL;
}

static void add_alloc(struct alloc *a) {
    static uint64_t next_id;
    a->refs = 1;
    a->id = __atomic_add_fetch(&next_id, 1, __ATOMIC_RELAXED);
    pthread_mutex_lock(&g_mem);
    a->next = g_allocs;
    g_allocs = a;
    pthread_mutex_unlock(&g_mem);
}

void unref_alloc(struct alloc *a) {
    if (!a) return;
    pthread_mutex_lock(&g_mem);
    int last = --a->refs == 0;
    pthread_mutex_unlock(&g_mem);
    if (!last) return;
    if (a->kind != K_PINNED) munmap((void *)a->dev, a->maplen);
    munmap(a->shadow, a->maplen);
    if (a->fd >= 0) close(a->fd);
    free(a);
}

/* Removes the allocation starting exactly at `p` and of kind `kind` from the
 * table; its memory goes when the last queued operation using it is done. */
static CUresult remove_alloc(uintptr_t p, int kind) {
    pthread_mutex_lock(&g_mem);
    struct alloc **pp = &g_allocs;
    while (*pp && !((*pp)->dev == p && (*pp)->kind == kind)) pp = &(*pp)->next;
    struct alloc *a = *pp;
    if (a) *pp = a->next;
    pthread_mutex_unlock(&g_mem);
    if (!a) return CUDA_ERROR_INVALID_VALUE;
    unref_alloc(a);
    return CUDA_SUCCESS;
}

/* The allocation starting exactly at `p` of kind `kind`: whether there is
 * one, and its context. */
static int find_start(uintptr_t p, int kind, struct fake_ctx **ctx) {
    pthread_mutex_lock(&g_mem);
    struct alloc *a = g_allocs;
    while (a && !(a->dev == p && a->kind == kind)) a = a->next;
    if (a) *ctx = a->ctx;
    pthread_mutex_unlock(&g_mem);
    return a != NULL;
}

/* A free or close of the allocation at `p`: waits, as CUDA's frees do,
 * until the streams of `all ? every context : its context` are idle, then
 * removes it. */
static CUresult sync_remove(uintptr_t p, int kind, int all, const char *what) {
    struct fake_ctx *ctx = NULL;
    if (!find_start(p, kind, &ctx)) return CUDA_ERROR_INVALID_VALUE;
    quiesce(all ? NULL : ctx, what);
    return remove_alloc(p, kind);
}

/* A copy of the entry holding `p` (the fields only), for the attribute calls. */
static int lookup(uintptr_t p, struct alloc *out) {
    pthread_mutex_lock(&g_mem);
    struct alloc *a = find_locked(p);
    if (a) *out = *a;
    pthread_mutex_unlock(&g_mem);
    return a != NULL;
}

/* Translates [addr, addr+n) for the stream worker: a device range to its
 * shadow, holding a reference in *hold until the operation is done; any
 * other address is used as a host address. A range that runs past the end
 * of its allocation is CUDA_ERROR_INVALID_VALUE. */
CUresult translate(uintptr_t addr, size_t n, char **out, struct alloc **hold) {
    if (addr == 0) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_mem);
    struct alloc *a = find_locked(addr);
    if (a && n > a->size - (addr - a->dev)) {
        pthread_mutex_unlock(&g_mem);
        return CUDA_ERROR_INVALID_VALUE;
    }
    if (a) a->refs++;
    pthread_mutex_unlock(&g_mem);
    *out = a ? a->shadow + (addr - a->dev) : (char *)addr;
    *hold = a;
    return CUDA_SUCCESS;
}

/* Maps `fd` (of `maplen` bytes) twice into a new entry: PROT_NONE + shadow. */
static struct alloc *map_twice(int fd, size_t maplen) {
    /* PROT_NONE: a host access crashes, as on a GPU; with FAKE_CUDA_PEERMEM
     * read-write, so that a real RDMA device can pin it (ibv_reg_mr). */
    int prot = g_peermem ? PROT_READ | PROT_WRITE : PROT_NONE;
    void *dev = mmap(NULL, maplen, prot, MAP_SHARED, fd, 0);
    if (dev == MAP_FAILED) return NULL;
    void *sh = mmap(NULL, maplen, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (sh == MAP_FAILED) {
        munmap(dev, maplen);
        return NULL;
    }
    struct alloc *a = calloc(1, sizeof *a);
    if (!a) abort();
    a->dev = (uintptr_t)dev;
    a->shadow = sh;
    a->maplen = maplen;
    a->fd = -1;
    a->ctx = t_ctx;
    a->ordinal = t_ctx ? t_ctx->device : 0;
    return a;
}

/* --------------------------------------------------------------- memory */

CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t size) {
    NEED_INIT();
    NEED_PTR(dptr);
    NEED_CTX();
    if (size == 0) return CUDA_ERROR_INVALID_VALUE;
    no_alloc_while_waiting("cuMemAlloc");
    size_t maplen = page_round(size);
    /* Each allocation's memfd is named with a serial number that its IPC
     * handles carry, so a handle is unique to its allocation (as the real
     * driver's are) even when a later allocation reuses the fd number. */
    static uint64_t serial;
    char name[64];
    snprintf(name, sizeof name, "fake_cuda_dev-%llu",
             (unsigned long long)__atomic_add_fetch(&serial, 1, __ATOMIC_RELAXED));
    int fd = memfd_create(name, MFD_CLOEXEC);
    if (fd < 0 || ftruncate(fd, (off_t)maplen) != 0) {
        if (fd >= 0) close(fd);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    struct alloc *a = map_twice(fd, maplen);
    if (!a) {
        close(fd);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    a->size = size;
    a->kind = K_DEVICE;
    a->fd = fd;
    add_alloc(a);
    *dptr = a->dev;
    LOG("cuMemAlloc_v2(%zu) -> %#llx (fd %d)", size, *dptr, fd);
    return CUDA_SUCCESS;
}

CUresult cuMemFree_v2(CUdeviceptr p) {
    LOG("cuMemFree_v2(%#llx)", p);
    NEED_INIT();
    return sync_remove(p, K_DEVICE, 0, "cuMemFree");
}

CUresult cuMemHostAlloc(void **pp, size_t size, unsigned int flags) {
    NEED_INIT();
    NEED_PTR(pp);
    NEED_CTX();
    if (size == 0) return CUDA_ERROR_INVALID_VALUE;
    no_alloc_while_waiting("cuMemHostAlloc");
    size_t maplen = page_round(size);
    void *m = mmap(NULL, maplen, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
    struct alloc *a = calloc(1, sizeof *a);
    if (!a) abort();
    *a = (struct alloc){.dev = (uintptr_t)m, .shadow = m, .size = size, .maplen = maplen,
                        .ordinal = t_ctx->device, .kind = K_PINNED, .fd = -1, .ctx = t_ctx};
    add_alloc(a);
    *pp = m;
    LOG("cuMemHostAlloc(%zu, flags=%#x) -> %p", size, flags, m);
    return CUDA_SUCCESS;
}

/* Pinned memory is mapped in every context: its free waits for all. */
CUresult cuMemFreeHost(void *p) {
    LOG("cuMemFreeHost(%p)", p);
    NEED_INIT();
    return sync_remove((uintptr_t)p, K_PINNED, 1, "cuMemFreeHost");
}

CUresult cuMemHostGetDevicePointer_v2(CUdeviceptr *pdptr, void *p, unsigned int flags) {
    LOG("cuMemHostGetDevicePointer_v2(%p)", p);
    NEED_INIT();
    NEED_PTR(pdptr);
    struct alloc a;
    if (flags != 0 || !lookup((uintptr_t)p, &a) || a.kind != K_PINNED)
        return CUDA_ERROR_INVALID_VALUE;
    *pdptr = U(p); /* unified addressing: the same address */
    return CUDA_SUCCESS;
}

/* Writes one attribute of `p` (in allocation `a`, or NULL: unknown). */
static void put_attr(CUpointer_attribute at, void *data, const struct alloc *a, CUdeviceptr p) {
    switch (at) {
    case CU_POINTER_ATTRIBUTE_CONTEXT: *(CUcontext *)data = a ? (CUcontext)a->ctx : NULL; break;
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
        *(unsigned *)data = !a ? 0u
                            : a->kind == K_PINNED ? (unsigned)CU_MEMORYTYPE_HOST
                                                  : (unsigned)CU_MEMORYTYPE_DEVICE;
        break;
    case CU_POINTER_ATTRIBUTE_DEVICE_POINTER: *(CUdeviceptr *)data = a ? p : 0; break;
    case CU_POINTER_ATTRIBUTE_HOST_POINTER:
        *(void **)data = a && a->kind == K_PINNED ? (void *)(uintptr_t)p : NULL;
        break;
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL: *(int *)data = a ? a->ordinal : 0; break;
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR: *(CUdeviceptr *)data = a ? a->dev : 0; break;
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE: *(size_t *)data = a ? a->size : 0; break;
    case CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR: *(void **)data = a ? (void *)a->dev : NULL; break;
    case CU_POINTER_ATTRIBUTE_MAPPING_SIZE: *(size_t *)data = a ? a->maplen : 0; break;
    case CU_POINTER_ATTRIBUTE_MAPPED: *(int *)data = a != NULL; break;
    case CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE:
        *(int *)data = a && a->kind == K_DEVICE;
        break;
    case CU_POINTER_ATTRIBUTE_P2P_TOKENS:
        memset(data, 0, sizeof(CUDA_POINTER_ATTRIBUTE_P2P_TOKENS));
        break;
    case CU_POINTER_ATTRIBUTE_BUFFER_ID: *(uint64_t *)data = a ? a->id : 0; break;
    case CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES:
    case CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE:
    case CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID: *(uint64_t *)data = 0; break; /* 8-byte ones */
    default: *(unsigned *)data = 0; break; /* IS_MANAGED (never) and the other 4-byte ones */
    }
}

CUresult cuPointerGetAttribute(void *data, CUpointer_attribute at, CUdeviceptr p) {
    LOG("cuPointerGetAttribute(attr=%d, ptr=%#llx)", (int)at, p);
    NEED_INIT();
    NEED_PTR(data);
    struct alloc a;
    if (!lookup(p, &a)) return CUDA_ERROR_INVALID_VALUE;
    put_attr(at, data, &a, p);
    return CUDA_SUCCESS;
}

CUresult cuPointerGetAttributes(unsigned int num, CUpointer_attribute *ats, void **data,
                                CUdeviceptr p) {
    NEED_INIT();
    if (num == 0 || !ats || !data) return CUDA_ERROR_INVALID_VALUE;
    for (unsigned i = 0; i < num; i++) NEED_PTR(data[i]);
    struct alloc a;
    int known = lookup(p, &a);
    LOG("cuPointerGetAttributes(n=%u, ptr=%#llx) -> %s", num, p,
        known ? KIND_NAME[a.kind] : "unknown");
    /* Like the real driver: an unknown pointer is no error, its values are zero. */
    for (unsigned i = 0; i < num; i++) put_attr(ats[i], data[i], known ? &a : NULL, p);
    return CUDA_SUCCESS;
}

/* ------------------------------------------------------ address ranges */

CUresult cuMemGetAddressRange_v2(CUdeviceptr *pbase, size_t *psize, CUdeviceptr p) {
    NEED_INIT();
    struct alloc a;
    if (!lookup(p, &a)) {
        LOG("cuMemGetAddressRange_v2(%#llx) -> not found", p);
        return CUDA_ERROR_NOT_FOUND;
    }
    LOG("cuMemGetAddressRange_v2(%#llx) -> %s %#llx + %zu", p, KIND_NAME[a.kind],
        (unsigned long long)a.dev, a.size);
    if (pbase) *pbase = a.dev;
    if (psize) *psize = a.size;
    return CUDA_SUCCESS;
}

/* A DMA-BUF fd for a device range (whole pages of one device allocation):
 * here a duplicate of the allocation's memfd; the caller closes it. */
CUresult cuMemGetHandleForAddressRange(void *handle, CUdeviceptr p, size_t size,
                                       CUmemRangeHandleType type, unsigned long long flags) {
    NEED_INIT();
    NEED_PTR(handle);
    struct alloc a;
    if (type != CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD || flags != 0 || !lookup(p, &a) ||
        a.kind != K_DEVICE || size == 0 || size > a.maplen - (p - a.dev)) {
        LOG("cuMemGetHandleForAddressRange(%#llx, %zu, type %d) -> invalid", p, size, (int)type);
        return CUDA_ERROR_INVALID_VALUE;
    }
    int fd = dup(a.fd);
    if (fd < 0) return CUDA_ERROR_OUT_OF_MEMORY;
    LOG("cuMemGetHandleForAddressRange(%#llx, %zu) -> fd %d", p, size, fd);
    *(int *)handle = fd;
    return CUDA_SUCCESS;
}

/* ------------------------------------------------------------------ IPC */

struct ipc_handle { /* the first bytes of a CUipcMemHandle */
    uint32_t magic;
    int32_t pid;    /* the exporting process */
    int32_t fd;     /* its memfd */
    int32_t ordinal; /* the allocation's device */
    uint64_t size;   /* the allocation's size */
    uint64_t offset; /* of the exported pointer within it (informational) */
    char name[32];   /* the memfd's name, with the allocation's serial */
};

/* The memfd name behind `fd` of process `pid` ("" when unknown). */
static void fd_name(int pid, int fd, char *out, size_t n) {
    char path[64], link[128];
    snprintf(path, sizeof path, "/proc/%d/fd/%d", pid, fd);
    ssize_t k = readlink(path, link, sizeof link - 1);
    out[0] = 0;
    if (k <= 0) return;
    link[k] = 0;
    /* "/memfd:<name> (deleted)" */
    const char *p = strncmp(link, "/memfd:", 7) == 0 ? link + 7 : link;
    size_t i = 0;
    while (p[i] && p[i] != ' ' && i + 1 < n) {
        out[i] = p[i];
        i++;
    }
    out[i] = 0;
}
_Static_assert(sizeof(struct ipc_handle) <= sizeof(CUipcMemHandle), "handle fits");

CUresult cuIpcGetMemHandle(CUipcMemHandle *h, CUdeviceptr p) {
    LOG("cuIpcGetMemHandle(%#llx)", p);
    NEED_INIT();
    NEED_PTR(h);
    struct alloc a;
    if (!lookup(p, &a) || a.kind != K_DEVICE) return CUDA_ERROR_INVALID_VALUE;
    struct ipc_handle ih = {IPC_MAGIC, (int32_t)getpid(), a.fd, a.ordinal, a.size, p - a.dev, {0}};
    fd_name((int)getpid(), a.fd, ih.name, sizeof ih.name);
    memset(h, 0, sizeof *h);
    memcpy(h->reserved, &ih, sizeof ih);
    return CUDA_SUCCESS;
}

CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *pdptr, CUipcMemHandle h, unsigned int flags) {
    NEED_INIT();
    NEED_PTR(pdptr);
    NEED_CTX();
    struct ipc_handle ih;
    memcpy(&ih, h.reserved, sizeof ih);
    LOG("cuIpcOpenMemHandle_v2(pid %d, fd %d, size %llu, flags %#x)", ih.pid, ih.fd,
        (unsigned long long)ih.size, flags);
    if (ih.magic != IPC_MAGIC || ih.size == 0) return CUDA_ERROR_INVALID_VALUE;
    if (ih.pid == (int32_t)getpid()) return CUDA_ERROR_INVALID_CONTEXT; /* as the real driver */
    if (ih.ordinal != t_ctx->device && g_no_peer) return CUDA_ERROR_PEER_ACCESS_UNSUPPORTED;
    /* A handle of a freed allocation fails, even when the fd number now
     * names a newer allocation. */
    char now[32];
    fd_name(ih.pid, ih.fd, now, sizeof now);
    if (ih.name[0] == 0 || strncmp(now, ih.name, sizeof now) != 0) {
        LOG("cuIpcOpenMemHandle_v2: %s is gone (fd %d is now '%s')", ih.name, ih.fd, now);
        return CUDA_ERROR_INVALID_VALUE;
    }
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/fd/%d", ih.pid, ih.fd);
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0) {
        LOG("cuIpcOpenMemHandle_v2: open %s: %s", path, strerror(errno));
        return CUDA_ERROR_INVALID_VALUE;
    }
    struct stat st;
    size_t maplen = page_round(ih.size);
    struct alloc *a = NULL;
    if (fstat(fd, &st) == 0 && (uint64_t)st.st_size >= maplen) a = map_twice(fd, maplen);
    close(fd); /* the mappings keep the memory */
    if (!a) return CUDA_ERROR_INVALID_VALUE;
    a->size = ih.size;
    a->kind = K_IPC;
    add_alloc(a);
    *pdptr = a->dev;
    return CUDA_SUCCESS;
}

CUresult cuIpcCloseMemHandle(CUdeviceptr p) {
    LOG("cuIpcCloseMemHandle(%#llx)", p);
    NEED_INIT();
    return sync_remove(p, K_IPC, 0, "cuIpcCloseMemHandle");
}
