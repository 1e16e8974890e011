/*
 * Prints the layout facts of NVIDIA's real nccl.h as `key value` lines, one
 * per line, for tests/abi_layout.rs to compare with the hetccl-abi crate.
 * Every key printed here must be computed on the Rust side too; the test
 * fails on a key that either side lacks.
 *
 * Key families:
 *   sizeof.T / alignof.T           the type T
 *   offsetof.T.f / fieldsize.T.f   the field f of struct T
 *   enum.T.NAME                    the value of enumerator NAME of enum T
 *   const.NAME                     a #define
 *   init.T.f                       field f of T's *_INITIALIZER
 *   version.X.Y.Z                  NCCL_VERSION(X,Y,Z)
 */
#include <nccl.h>

#include <stdalign.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#define TYPE(T) \
  printf("sizeof.%s %zu\nalignof.%s %zu\n", #T, sizeof(T), #T, (size_t)alignof(T))
#define FIELD(T, f)                                                   \
  printf("offsetof.%s.%s %zu\nfieldsize.%s.%s %zu\n", #T, #f,         \
         (size_t)offsetof(T, f), #T, #f, sizeof(((T*)0)->f))
#define ENUM(T, v) printf("enum.%s.%s %lld\n", #T, #v, (long long)(v))
#define CONST(v) printf("const.%s %lld\n", #v, (long long)(v))
/* Pointer fields print as 0 (NULL) or 1 (non-NULL). */
#define INIT_INT(T, var, f) printf("init.%s.%s %lld\n", #T, #f, (long long)(var).f)
#define INIT_PTR(T, var, f) printf("init.%s.%s %d\n", #T, #f, (var).f != NULL)
#define VERSION(x, y, z) printf("version.%d.%d.%d %d\n", x, y, z, NCCL_VERSION(x, y, z))

static unsigned int float_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

int main(void) {
  /* ---- handles ---- */
  TYPE(ncclComm_t);
  TYPE(ncclWindow_t);
  TYPE(cudaStream_t);

  /* ---- ncclUniqueId ---- */
  TYPE(ncclUniqueId);
  FIELD(ncclUniqueId, internal);

  /* ---- ncclConfig_t ---- */
  TYPE(ncclConfig_t);
  FIELD(ncclConfig_t, size);
  FIELD(ncclConfig_t, magic);
  FIELD(ncclConfig_t, version);
  FIELD(ncclConfig_t, blocking);
  FIELD(ncclConfig_t, cgaClusterSize);
  FIELD(ncclConfig_t, minCTAs);
  FIELD(ncclConfig_t, maxCTAs);
  FIELD(ncclConfig_t, netName);
  FIELD(ncclConfig_t, splitShare);
  FIELD(ncclConfig_t, trafficClass);
  FIELD(ncclConfig_t, commName);
  FIELD(ncclConfig_t, collnetEnable);
  FIELD(ncclConfig_t, CTAPolicy);
  FIELD(ncclConfig_t, shrinkShare);
  FIELD(ncclConfig_t, nvlsCTAs);
  FIELD(ncclConfig_t, nChannelsPerNetPeer);
  FIELD(ncclConfig_t, nvlinkCentricSched);
  FIELD(ncclConfig_t, graphUsageMode);
  FIELD(ncclConfig_t, numRmaCtx);
  FIELD(ncclConfig_t, maxP2pPeers);
  FIELD(ncclConfig_t, graphStreamOrdering);
  FIELD(ncclConfig_t, launchOrderImplicit);
  FIELD(ncclConfig_t, numRmaSig);
  FIELD(ncclConfig_t, rmaEagerInit);
  FIELD(ncclConfig_t, hostCftMode);
  FIELD(ncclConfig_t, nvlsHostMode);

  {
    ncclConfig_t c = NCCL_CONFIG_INITIALIZER;
    INIT_INT(ncclConfig_t, c, size);
    INIT_INT(ncclConfig_t, c, magic);
    INIT_INT(ncclConfig_t, c, version);
    INIT_INT(ncclConfig_t, c, blocking);
    INIT_INT(ncclConfig_t, c, cgaClusterSize);
    INIT_INT(ncclConfig_t, c, minCTAs);
    INIT_INT(ncclConfig_t, c, maxCTAs);
    INIT_PTR(ncclConfig_t, c, netName);
    INIT_INT(ncclConfig_t, c, splitShare);
    INIT_INT(ncclConfig_t, c, trafficClass);
    INIT_PTR(ncclConfig_t, c, commName);
    INIT_INT(ncclConfig_t, c, collnetEnable);
    INIT_INT(ncclConfig_t, c, CTAPolicy);
    INIT_INT(ncclConfig_t, c, shrinkShare);
    INIT_INT(ncclConfig_t, c, nvlsCTAs);
    INIT_INT(ncclConfig_t, c, nChannelsPerNetPeer);
    INIT_INT(ncclConfig_t, c, nvlinkCentricSched);
    INIT_INT(ncclConfig_t, c, graphUsageMode);
    INIT_INT(ncclConfig_t, c, numRmaCtx);
    INIT_INT(ncclConfig_t, c, maxP2pPeers);
    INIT_INT(ncclConfig_t, c, graphStreamOrdering);
    INIT_INT(ncclConfig_t, c, launchOrderImplicit);
    INIT_INT(ncclConfig_t, c, numRmaSig);
    INIT_INT(ncclConfig_t, c, rmaEagerInit);
    INIT_INT(ncclConfig_t, c, hostCftMode);
    INIT_INT(ncclConfig_t, c, nvlsHostMode);
  }

  /* ---- ncclConfigExt_t (key and val are a nested struct and a union) ---- */
  TYPE(ncclConfigExt_t);
  FIELD(ncclConfigExt_t, next);
  FIELD(ncclConfigExt_t, key.vendorId);
  FIELD(ncclConfigExt_t, key.optionId);
  FIELD(ncclConfigExt_t, val);

  /* ---- ncclCollConfig_t ---- */
  TYPE(ncclCollConfig_t);
  FIELD(ncclCollConfig_t, size);
  FIELD(ncclCollConfig_t, magic);
  FIELD(ncclCollConfig_t, version);
  FIELD(ncclCollConfig_t, ext);
  FIELD(ncclCollConfig_t, minCTAs);
  FIELD(ncclCollConfig_t, maxCTAs);
  FIELD(ncclCollConfig_t, nvlsCTAs);
  FIELD(ncclCollConfig_t, cgaClusterSize);
  FIELD(ncclCollConfig_t, algSelection);
  FIELD(ncclCollConfig_t, forceAlgSelection);
  FIELD(ncclCollConfig_t, CTAPolicy);
  FIELD(ncclCollConfig_t, userProfilerTag);
  FIELD(ncclCollConfig_t, launchCompletionEvent);

  /* ---- ncclSimInfo_t ---- */
  TYPE(ncclSimInfo_t);
  FIELD(ncclSimInfo_t, size);
  FIELD(ncclSimInfo_t, magic);
  FIELD(ncclSimInfo_t, version);
  FIELD(ncclSimInfo_t, estimatedTime);
  {
    ncclSimInfo_t s = NCCL_SIM_INFO_INITIALIZER;
    /* size and version are sizeof and NCCL_VERSION_CODE, checked above. */
    INIT_INT(ncclSimInfo_t, s, magic);
    printf("init.ncclSimInfo_t.estimatedTime.bits 0x%08x\n", float_bits(s.estimatedTime));
  }

  /* ---- ncclWaitSignalDesc_t ---- */
  TYPE(ncclWaitSignalDesc_t);
  FIELD(ncclWaitSignalDesc_t, opCnt);
  FIELD(ncclWaitSignalDesc_t, peer);
  FIELD(ncclWaitSignalDesc_t, sigIdx);
  FIELD(ncclWaitSignalDesc_t, ctx);

  /* ---- ncclResult_t ---- */
  TYPE(ncclResult_t);
  ENUM(ncclResult_t, ncclSuccess);
  ENUM(ncclResult_t, ncclUnhandledCudaError);
  ENUM(ncclResult_t, ncclSystemError);
  ENUM(ncclResult_t, ncclInternalError);
  ENUM(ncclResult_t, ncclInvalidArgument);
  ENUM(ncclResult_t, ncclInvalidUsage);
  ENUM(ncclResult_t, ncclRemoteError);
  ENUM(ncclResult_t, ncclInProgress);
  ENUM(ncclResult_t, ncclTimeout);
  ENUM(ncclResult_t, ncclNumResults);

  /* ---- ncclDataType_t ---- */
  TYPE(ncclDataType_t);
  ENUM(ncclDataType_t, ncclInt8);
  ENUM(ncclDataType_t, ncclChar);
  ENUM(ncclDataType_t, ncclUint8);
  ENUM(ncclDataType_t, ncclInt32);
  ENUM(ncclDataType_t, ncclInt);
  ENUM(ncclDataType_t, ncclUint32);
  ENUM(ncclDataType_t, ncclInt64);
  ENUM(ncclDataType_t, ncclUint64);
  ENUM(ncclDataType_t, ncclFloat16);
  ENUM(ncclDataType_t, ncclHalf);
  ENUM(ncclDataType_t, ncclFloat32);
  ENUM(ncclDataType_t, ncclFloat);
  ENUM(ncclDataType_t, ncclFloat64);
  ENUM(ncclDataType_t, ncclDouble);
  ENUM(ncclDataType_t, ncclBfloat16);
  ENUM(ncclDataType_t, ncclFloat8e4m3);
  ENUM(ncclDataType_t, ncclFloat8e5m2);
  ENUM(ncclDataType_t, ncclNumTypes);

  /* ---- ncclRedOp_t ---- */
  TYPE(ncclRedOp_t);
  ENUM(ncclRedOp_t, ncclSum);
  ENUM(ncclRedOp_t, ncclProd);
  ENUM(ncclRedOp_t, ncclMax);
  ENUM(ncclRedOp_t, ncclMin);
  ENUM(ncclRedOp_t, ncclAvg);
  ENUM(ncclRedOp_t, ncclNumOps);
  ENUM(ncclRedOp_t, ncclMaxRedOp);

  /* ---- ncclScalarResidence_t ---- */
  TYPE(ncclScalarResidence_t);
  ENUM(ncclScalarResidence_t, ncclScalarDevice);
  ENUM(ncclScalarResidence_t, ncclScalarHostImmediate);

  /* ---- ncclCommMemStat_t ---- */
  TYPE(ncclCommMemStat_t);
  ENUM(ncclCommMemStat_t, ncclStatGpuMemSuspend);
  ENUM(ncclCommMemStat_t, ncclStatGpuMemSuspended);
  ENUM(ncclCommMemStat_t, ncclStatGpuMemPersist);
  ENUM(ncclCommMemStat_t, ncclStatGpuMemTotal);

  /* ---- constants ---- */
  CONST(NCCL_UNIQUE_ID_BYTES);
  CONST(NCCL_API_MAGIC);
  CONST(NCCL_CONFIG_UNDEF_INT);
  CONST(NCCL_SPLIT_NOCOLOR);
  printf("const.NCCL_UNDEF_FLOAT.bits 0x%08x\n", float_bits(NCCL_UNDEF_FLOAT));
  CONST(NCCL_SHRINK_DEFAULT);
  CONST(NCCL_SHRINK_ABORT);
  CONST(NCCL_WIN_REQUIRED_ALIGNMENT);

  /* ---- NCCL_VERSION(X,Y,Z): both encodings and the boundary ---- */
  VERSION(2, 8, 4);
  VERSION(2, 9, 0);
  VERSION(2, 19, 3);
  VERSION(2, 28, 0);
  VERSION(2, 32, 3);
  VERSION(3, 0, 0);
  VERSION(1, 8, 9);
  return 0;
}
