#!/usr/bin/env bash
# The RDMA tests, on Soft-RoCE inside one QEMU guest (scripts/rdma-vm.sh):
#   1. perftest's ibv_rc_pingpong and ib_write_bw between two processes on rxe0
#      (proves the guest's RDMA stack before hetccl is blamed);
#   2. the verbs transport's own tests (nccl-net-plugin's ib::tests) and
#      the net-plugin conformance tests, v8 and v12, with device 0 = rxe0
#      (tests/net_plugin.rs, tests/net_plugin_procs.rs, HETCCL_NET=ib);
#   3. the transport conformance suite over verbs (collectives/tests/transport_conformance.rs);
#   4. the multi-process collectives on 2 host ids (2 and 4 ranks), the same
#      pair with NCCL_IB_DISABLE=1, and the kill -9 fault test over verbs
#      (tests/rdma_mp.rs);
#   5. a revoke reaching ranks blocked over verbs (collectives/tests/revoke_verbs.rs);
#   6. device buffers of the emulated CUDA driver sent and received in place
#      over GPUDirect RDMA (tests/rdma_gdr.rs).
# The steps are in scripts/lib/rdma-tests-guest.sh, each with a time limit.
# Builds the test binaries here first. Fails if the guest cannot boot.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TERM_COLOR=never
echo "== rdma: building the test binaries"
cargo build -q -p hetccl -p hetccl-perf
exes() {
  cargo test --no-run "$@" 2>&1 | sed -n 's/.*Executable .* (\(.*\))$/\1/p'
}
np=$(exes --test net_plugin)
npp=$(exes --test net_plugin_procs)
tc=$(exes -p hetccl-collectives --test transport_conformance)
mp=$(exes --test rdma_mp)
rv=$(exes -p hetccl-collectives --test revoke_verbs)
gd=$(exes --test rdma_gdr)
unit=$(exes -p nccl-net-plugin --lib)
for x in "$np" "$npp" "$tc" "$mp" "$rv" "$gd" "$unit"; do [ -x "$x" ] || { echo "rdma: missing test binary ($x)" >&2; exit 1; }; done
mkdir -p target/tmp

t0=$(date +%s)
bash scripts/rdma-vm.sh --timeout "${HETCCL_RDMA_TESTS_TIMEOUT_S:-840}" --tmpfs target/tmp \
  --env RDMA_UNIT="$unit" --env RDMA_NP="$np" --env RDMA_NPP="$npp" --env RDMA_TC="$tc" \
  --env RDMA_MP="$mp" --env RDMA_RV="$rv" --env RDMA_GDR="$gd" -- bash scripts/lib/rdma-tests-guest.sh
echo "== rdma: all in-VM tests passed in $(( $(date +%s) - t0 )) s"
