/*
 * fake_ibverbs.c: an emulated libibverbs for tests of the verbs transport's
 * GPUDirect paths on machines without an RDMA device. Loaded through
 * HETCCL_IBVERBS_LIB; it exports the entry points nccl-net-plugin/src/ib/
 * ffi.rs resolves and fills the context's ops table (poll_cq, post_send,
 * post_recv) at the offsets of rdma-core's verbs.h.
 *
 * The model: one device ("fake0", or FAKE_IBV_DEV), one active RoCE port
 * with one IPv4-mapped GID. Protection domains, CQs and QPs are plain
 * allocations; QP state changes always succeed. Nothing moves: a posted
 * send completes at once, successfully, on its CQ (so an RDMA read, the
 * GPUDirect flush, completes without touching either buffer); posted
 * receives never complete. ibv_reg_mr and ibv_reg_dmabuf_mr never touch
 * the memory and append their arguments to the file FAKE_IBV_LOG, one line
 * each:
 *   reg_mr addr=0x... len=N access=N
 *   reg_dmabuf_mr offset=N len=N iova=0x... fd=N fd_ok=0|1 access=N
 *   dereg_mr addr=0x... len=N
 * fd_ok says whether the fd was open at the call.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define EXPORT __attribute__((visibility("default")))

struct fake_dev { char name[64]; };

/* struct ibv_context: device, then 32 op pointers, then the fds. */
struct fake_ctx {
    struct fake_dev *device;
    void *ops[32];
    int cmd_fd;
    int async_fd;
    int num_comp_vectors;
    int async_wr; /* the pipe's write end */
};
enum { OP_POLL_CQ = 11, OP_POST_SEND = 25, OP_POST_RECV = 26 };

struct sge { uint64_t addr; uint32_t length; uint32_t lkey; };
struct send_wr {
    uint64_t wr_id;
    struct send_wr *next;
    struct sge *sg_list;
    int num_sge;
    uint32_t opcode;
    uint32_t send_flags;
    uint32_t imm_data;
    uint64_t remote_addr;
    uint32_t rkey;
    uint64_t rest[9];
};
struct recv_wr { uint64_t wr_id; struct recv_wr *next; struct sge *sg_list; int num_sge; };
struct wc {
    uint64_t wr_id;
    uint32_t status, opcode, vendor_err, byte_len, imm_data, qp_num, src_qp, wc_flags;
    uint16_t pkey_index, slid;
    uint8_t sl, dlid_path_bits;
};

#define CQ_MAX 4096
struct fake_cq {
    struct fake_ctx *context; /* first, as in struct ibv_cq */
    pthread_mutex_t mu;
    struct wc q[CQ_MAX];
    int head, n;
};

struct fake_qp { /* the leading fields of struct ibv_qp */
    struct fake_ctx *context;
    void *qp_context;
    void *pd;
    struct fake_cq *send_cq;
    struct fake_cq *recv_cq;
    void *srq;
    uint32_t handle;
    uint32_t qp_num;
};

struct fake_mr { /* struct ibv_mr */
    struct fake_ctx *context;
    void *pd;
    void *addr;
    size_t length;
    uint32_t handle, lkey, rkey;
};

static struct fake_dev g_dev;
static struct fake_dev *g_list[2];
static uint32_t g_next_key = 0x100, g_next_qpn = 0x40;
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;

static void logf_(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void logf_(const char *fmt, ...) {
    const char *path = getenv("FAKE_IBV_LOG");
    if (!path || !*path) return;
    pthread_mutex_lock(&g_mu);
    FILE *f = fopen(path, "a");
    if (f) {
        va_list ap;
        va_start(ap, fmt);
        vfprintf(f, fmt, ap);
        va_end(ap);
        fputc('\n', f);
        fclose(f);
    }
    pthread_mutex_unlock(&g_mu);
}

EXPORT struct fake_dev **ibv_get_device_list(int *n) {
    const char *e = getenv("FAKE_IBV_DEV");
    snprintf(g_dev.name, sizeof g_dev.name, "%s", e && *e ? e : "fake0");
    g_list[0] = &g_dev;
    g_list[1] = NULL;
    if (n) *n = 1;
    return g_list;
}
EXPORT void ibv_free_device_list(struct fake_dev **l) { (void)l; }
EXPORT const char *ibv_get_device_name(struct fake_dev *d) { return d->name; }
EXPORT uint64_t ibv_get_device_guid(struct fake_dev *d) { (void)d; return 0x0102030405060708ull; }

static int poll_cq(struct fake_cq *cq, int n, struct wc *out) {
    pthread_mutex_lock(&cq->mu);
    int k = 0;
    while (k < n && cq->n > 0) {
        out[k++] = cq->q[cq->head];
        cq->head = (cq->head + 1) % CQ_MAX;
        cq->n--;
    }
    pthread_mutex_unlock(&cq->mu);
    return k;
}

static const uint32_t WC_OPCODE[] = {1 /* RDMA_WRITE */, 1, 0 /* SEND */, 0, 2 /* RDMA_READ */};

static int post_send(struct fake_qp *qp, struct send_wr *wr, struct send_wr **bad) {
    for (; wr; wr = wr->next) {
        struct fake_cq *cq = qp->send_cq;
        pthread_mutex_lock(&cq->mu);
        if (cq->n == CQ_MAX) {
            pthread_mutex_unlock(&cq->mu);
            if (bad) *bad = wr;
            return ENOMEM;
        }
        uint32_t len = 0;
        for (int i = 0; i < wr->num_sge; i++) len += wr->sg_list[i].length;
        struct wc c = {.wr_id = wr->wr_id,
                       .opcode = wr->opcode < 5 ? WC_OPCODE[wr->opcode] : 0,
                       .byte_len = len,
                       .qp_num = qp->qp_num};
        cq->q[(cq->head + cq->n) % CQ_MAX] = c;
        cq->n++;
        pthread_mutex_unlock(&cq->mu);
        if (wr->opcode != 4)
            logf_("post_send op=%u qpn=%u addr=0x%llx len=%u lkey=%u inline=%d remote=0x%llx rkey=%u",
                  wr->opcode, qp->qp_num,
                  (unsigned long long)(wr->num_sge ? wr->sg_list[0].addr : 0), len,
                  wr->num_sge ? wr->sg_list[0].lkey : 0, (wr->send_flags & 8) != 0,
                  (unsigned long long)wr->remote_addr, wr->rkey);
        if (wr->opcode == 4)
            logf_("post_send rdma_read qpn=%u local=0x%llx len=%u remote=0x%llx rkey=%u", qp->qp_num,
                  (unsigned long long)(wr->num_sge ? wr->sg_list[0].addr : 0), len,
                  (unsigned long long)wr->remote_addr, wr->rkey);
    }
    return 0;
}

static int post_recv(struct fake_qp *qp, struct recv_wr *wr, struct recv_wr **bad) {
    (void)qp;
    (void)wr;
    (void)bad;
    return 0;
}

EXPORT struct fake_ctx *ibv_open_device(struct fake_dev *d) {
    struct fake_ctx *c = calloc(1, sizeof *c);
    int p[2];
    if (!c || pipe(p) != 0) {
        free(c);
        return NULL;
    }
    c->device = d;
    c->ops[OP_POLL_CQ] = (void *)poll_cq;
    c->ops[OP_POST_SEND] = (void *)post_send;
    c->ops[OP_POST_RECV] = (void *)post_recv;
    c->cmd_fd = -1;
    c->async_fd = p[0];
    c->async_wr = p[1];
    c->num_comp_vectors = 1;
    return c;
}
EXPORT int ibv_close_device(struct fake_ctx *c) {
    close(c->async_fd);
    close(c->async_wr);
    free(c);
    return 0;
}

EXPORT int ibv_query_device(struct fake_ctx *c, unsigned char *attr) {
    (void)c;
    memset(attr, 0, 232);
    int v = 16384;
    memcpy(attr + 112, &v, 4); /* max_qp_wr */
    v = 65536;
    memcpy(attr + 132, &v, 4); /* max_cqe */
    attr[227] = 1;             /* phys_port_cnt */
    return 0;
}

EXPORT int ibv_query_port(struct fake_ctx *c, uint8_t port, unsigned char *attr) {
    (void)c;
    if (port != 1) return EINVAL;
    memset(attr, 0, 52);
    uint32_t u = 4; /* IBV_PORT_ACTIVE */
    memcpy(attr, &u, 4);
    u = 5; /* 4096 */
    memcpy(attr + 4, &u, 4);
    memcpy(attr + 8, &u, 4);
    int tbl = 1;
    memcpy(attr + 12, &tbl, 4);
    attr[43] = 2;  /* 4x */
    attr[44] = 32; /* 25 Gb/s per lane */
    attr[46] = 2;  /* Ethernet */
    return 0;
}

EXPORT int ibv_query_gid(struct fake_ctx *c, uint8_t port, int index, uint8_t *gid) {
    (void)c;
    if (port != 1 || index != 0) return EINVAL;
    static const uint8_t g[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 192, 0, 2, 1};
    memcpy(gid, g, 16);
    return 0;
}

EXPORT void *ibv_alloc_pd(struct fake_ctx *c) {
    void **pd = calloc(1, sizeof(void *));
    if (pd) *pd = c;
    return pd;
}
EXPORT int ibv_dealloc_pd(void *pd) {
    free(pd);
    return 0;
}

static struct fake_mr *new_mr(void *pd, void *addr, size_t len) {
    struct fake_mr *m = calloc(1, sizeof *m);
    if (!m) return NULL;
    pthread_mutex_lock(&g_mu);
    uint32_t k = g_next_key++;
    pthread_mutex_unlock(&g_mu);
    m->context = *(struct fake_ctx **)pd;
    m->pd = pd;
    m->addr = addr;
    m->length = len;
    m->lkey = k;
    m->rkey = k | 0x10000;
    return m;
}

EXPORT struct fake_mr *ibv_reg_mr(void *pd, void *addr, size_t len, int access) {
    logf_("reg_mr addr=%p len=%zu access=%d", addr, len, access);
    return new_mr(pd, addr, len);
}

EXPORT struct fake_mr *ibv_reg_dmabuf_mr(void *pd, uint64_t offset, size_t len, uint64_t iova,
                                         int fd, int access) {
    int ok = fcntl(fd, F_GETFD) != -1;
    logf_("reg_dmabuf_mr offset=%llu len=%zu iova=0x%llx fd=%d fd_ok=%d access=%d",
          (unsigned long long)offset, len, (unsigned long long)iova, fd, ok, access);
    if (!ok) {
        errno = EBADF;
        return NULL;
    }
    return new_mr(pd, (void *)(uintptr_t)iova, len);
}

EXPORT int ibv_dereg_mr(struct fake_mr *m) {
    logf_("dereg_mr addr=%p len=%zu", m->addr, m->length);
    free(m);
    return 0;
}

EXPORT struct fake_cq *ibv_create_cq(struct fake_ctx *c, int cqe, void *cq_ctx, void *ch, int vec) {
    (void)cqe;
    (void)cq_ctx;
    (void)ch;
    (void)vec;
    struct fake_cq *cq = calloc(1, sizeof *cq);
    if (!cq) return NULL;
    cq->context = c;
    pthread_mutex_init(&cq->mu, NULL);
    return cq;
}
EXPORT int ibv_destroy_cq(struct fake_cq *cq) {
    pthread_mutex_destroy(&cq->mu);
    free(cq);
    return 0;
}

struct qp_init_attr { void *qp_context; struct fake_cq *send_cq, *recv_cq; void *srq; };

EXPORT struct fake_qp *ibv_create_qp(void *pd, struct qp_init_attr *a) {
    struct fake_qp *qp = calloc(1, sizeof *qp);
    if (!qp) return NULL;
    qp->context = *(struct fake_ctx **)pd;
    qp->qp_context = a->qp_context;
    qp->pd = pd;
    qp->send_cq = a->send_cq;
    qp->recv_cq = a->recv_cq;
    pthread_mutex_lock(&g_mu);
    qp->qp_num = g_next_qpn++;
    pthread_mutex_unlock(&g_mu);
    return qp;
}
EXPORT int ibv_modify_qp(struct fake_qp *qp, void *attr, int mask) {
    (void)qp;
    (void)attr;
    (void)mask;
    return 0;
}
EXPORT int ibv_destroy_qp(struct fake_qp *qp) {
    free(qp);
    return 0;
}

EXPORT int ibv_get_async_event(struct fake_ctx *c, void *ev) {
    (void)c;
    (void)ev;
    errno = EAGAIN;
    return -1;
}
EXPORT void ibv_ack_async_event(void *ev) { (void)ev; }
EXPORT const char *ibv_wc_status_str(uint32_t s) { return s == 0 ? "success" : "fake error"; }
EXPORT const char *ibv_event_type_str(uint32_t e) {
    (void)e;
    return "fake event";
}
