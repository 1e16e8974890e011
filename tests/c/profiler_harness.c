/*
 * Drives libhetccl.so's NCCL profiler plugin tables the way NCCL does:
 * dlopen, dlsym("ncclProfiler_v6") then "ncclProfiler_v5", init with the
 * activation mask, a group with a collective, a proxy operation with one
 * step (and a state change), a send, for version 6 a copy-engine
 * collective, stop everything, finalize.
 *
 * usage: profiler_harness LIBHETCCL
 * prints "name hetccl", "mask_v6 N", "mask_v5 N" and "result ok"; the
 * plugin writes the files (HETCCL_TRACE_FILE) that tests/profiler_plugin.rs
 * reads.
 *
 * The structs below mirror NCCL's profiler interface (versions 5 and 6;
 * version 6 adds the last three members of the union). nccl.h supplies
 * ncclResult_t.
 */
#include <dlfcn.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <nccl.h>

typedef struct {
    uint64_t type;
    void *parentObj;
    int rank;
    union {
        struct { bool graphCaptured; int groupDepth; } groupApi;
        struct { const char *func; size_t count; const char *datatype; int root; void *stream; bool graphCaptured; } collApi;
        struct { const char *func; size_t count; const char *datatype; void *stream; bool graphCaptured; } p2pApi;
        struct { void *stream; } kernelLaunch;
        struct {
            uint64_t seqNumber; const char *func; const void *sendBuff; void *recvBuff; size_t count; int root;
            const char *datatype; uint8_t nChannels; uint8_t nWarps; const char *algo; const char *proto; void *parentGroup;
        } coll;
        struct { const char *func; void *buff; const char *datatype; size_t count; int peer; uint8_t nChannels; void *parentGroup; } p2p;
        struct { pid_t pid; uint8_t channelId; int peer; int nSteps; int chunkSize; int isSend; } proxyOp;
        struct { int step; } proxyStep;
        struct { uint8_t channelId; uint64_t pTimer; } kernelCh;
        struct { int64_t id; void *data; } netPlugin;
        struct {
            uint64_t seqNumber; const char *func; const void *sendBuff; void *recvBuff; size_t count; int root;
            const char *datatype; const char *syncStrategy; bool intraBatchSync; uint32_t batchSize; uint32_t numBatches;
            uint32_t ceSeqNum; void *stream;
        } ceColl;
        struct { bool isComplete; int nRanks; } ceCollSync;
        struct { int numOps; size_t totalBytes; bool useIntraSync; } ceCollBatch;
    };
} descr_t;

typedef union {
    struct { size_t transSize; } proxyStep;
    struct { int appendedProxyOps; } proxyCtrl;
    struct { void *data; } netPlugin;
    struct { uint64_t pTimer; } kernelCh;
} state_args_t;

typedef struct {
    const char *name;
    ncclResult_t (*init)(void **context, uint64_t commId, int *eActivationMask, const char *commName, int nNodes,
                         int nranks, int rank, void *logfn);
    ncclResult_t (*startEvent)(void *context, void **eHandle, descr_t *eDescr);
    ncclResult_t (*stopEvent)(void *eHandle);
    ncclResult_t (*recordEventState)(void *eHandle, int eState, state_args_t *eStateArgs);
    ncclResult_t (*finalize)(void *context);
} profiler_t;

enum { GROUP = 1 << 0, COLL = 1 << 1, P2P = 1 << 2, PROXY_OP = 1 << 3, PROXY_STEP = 1 << 4, CE_COLL = 1 << 12 };
enum { STEP_SEND_WAIT = 9 };

#define CHECK(x)                                                                 \
    do {                                                                         \
        ncclResult_t r_ = (x);                                                   \
        if (r_ != ncclSuccess) {                                                 \
            fprintf(stderr, "%s:%d: %s returned %d\n", __FILE__, __LINE__, #x, r_); \
            exit(1);                                                             \
        }                                                                        \
    } while (0)

static void *start(profiler_t *p, void *ctx, uint64_t type, void *parent, int rank, descr_t *d) {
    d->type = type;
    d->parentObj = parent;
    d->rank = rank;
    void *h = NULL;
    CHECK(p->startEvent(ctx, &h, d));
    return h;
}

static void drive(profiler_t *p, const char *ver, uint64_t comm_id, int rank, bool ce) {
    void *ctx = NULL;
    int mask = -1;
    CHECK(p->init(&ctx, comm_id, &mask, "harness", 1, 2, rank, NULL));
    printf("mask_%s %d\n", ver, mask);
    if (mask == 0)
        return;
    descr_t d;
    memset(&d, 0, sizeof d);
    void *group = start(p, ctx, GROUP, NULL, rank, &d);

    memset(&d, 0, sizeof d);
    d.coll.seqNumber = 7;
    d.coll.func = "AllReduce";
    d.coll.count = 1024;
    d.coll.datatype = "ncclFloat32";
    d.coll.nChannels = 2;
    d.coll.nWarps = 8;
    d.coll.algo = "RING";
    d.coll.proto = "SIMPLE";
    d.coll.parentGroup = group;
    void *coll = start(p, ctx, COLL, group, rank, &d);

    memset(&d, 0, sizeof d);
    d.proxyOp.pid = getpid();
    d.proxyOp.channelId = 1;
    d.proxyOp.peer = 1 - rank;
    d.proxyOp.nSteps = 2;
    d.proxyOp.chunkSize = 4096;
    d.proxyOp.isSend = 1;
    void *op = start(p, ctx, PROXY_OP, coll, rank, &d);

    memset(&d, 0, sizeof d);
    d.proxyStep.step = 0;
    void *step = start(p, ctx, PROXY_STEP, op, rank, &d);
    state_args_t a;
    memset(&a, 0, sizeof a);
    a.proxyStep.transSize = 4096;
    CHECK(p->recordEventState(step, STEP_SEND_WAIT, &a));
    usleep(1000);
    CHECK(p->stopEvent(step));
    CHECK(p->stopEvent(op));
    CHECK(p->stopEvent(coll));

    memset(&d, 0, sizeof d);
    d.p2p.func = "Send";
    d.p2p.datatype = "ncclInt8";
    d.p2p.count = 16;
    d.p2p.peer = 1 - rank;
    d.p2p.nChannels = 1;
    d.p2p.parentGroup = group;
    CHECK(p->stopEvent(start(p, ctx, P2P, group, rank, &d)));

    if (ce) {
        memset(&d, 0, sizeof d);
        d.ceColl.seqNumber = 8;
        d.ceColl.func = "AllGather";
        d.ceColl.count = 64;
        d.ceColl.datatype = "ncclInt32";
        d.ceColl.numBatches = 3;
        CHECK(p->stopEvent(start(p, ctx, CE_COLL, group, rank, &d)));
    }
    CHECK(p->stopEvent(group));
    CHECK(p->finalize(ctx));
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s LIBHETCCL\n", argv[0]);
        return 2;
    }
    void *lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        fprintf(stderr, "dlopen: %s\n", dlerror());
        return 1;
    }
    profiler_t *v6 = dlsym(lib, "ncclProfiler_v6");
    profiler_t *v5 = dlsym(lib, "ncclProfiler_v5");
    if (!v6 || !v5) {
        fprintf(stderr, "missing profiler tables\n");
        return 1;
    }
    printf("name %s\n", v6->name);
    drive(v6, "v6", 0x1234, 0, true);
    drive(v5, "v5", 0x5678, 1, false);
    printf("result ok\n");
    return 0;
}
