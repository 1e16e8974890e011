#!/usr/bin/env bash
# The RDMA tests, on Soft-RoCE inside one QEMU guest (scripts/rdma-vm.sh):
#   1. perftest's ibv_rc_pingpong and ib_write_bw between two processes on rxe0
#      (proves the guest's RDMA stack before hetccl is blamed);
#   2. the verbs transport's own tests (nccl-net-plugin's ib::tests) and
#      the net-plugin conformance tests, v8 and v12, with device 0 = rxe0
#      (tests/net_plugin.rs, tests/net_plugin_procs.rs, HETCCL_NET=ib);
#   3. the transport conformance suite over verbs (collectives/tests/transport_conformance.rs);
#   4. the multi-process collectives on 2 host ids (2 and 4 ranks) and the
#      kill -9 fault test over verbs (tests/rdma_mp.rs).
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
unit=$(exes -p nccl-net-plugin --lib)
for x in "$np" "$npp" "$tc" "$mp" "$unit"; do [ -x "$x" ] || { echo "rdma: missing test binary ($x)" >&2; exit 1; }; done
mkdir -p target/tmp

guest=$(cat <<EOF
set -e
export HETCCL_REQUIRE_RDMA=1
echo "== rdma(guest): perftest on rxe0"
ibv_rc_pingpong -d rxe0 -g 1 -n 20 > /tmp/pp.log 2>&1 & sleep 1
timeout 60 ibv_rc_pingpong -d rxe0 -g 1 -n 20 127.0.0.1 | tail -1
wait
ib_write_bw -d rxe0 -x 1 -s 65536 -n 50 -F > /tmp/bw.log 2>&1 & sleep 1
timeout 60 ib_write_bw -d rxe0 -x 1 -s 65536 -n 50 -F 127.0.0.1 | grep -A1 '#bytes'
wait
echo "== rdma(guest): verbs transport unit tests (credits, QPs, registration cache)"
timeout 200 $unit ib::
echo "== rdma(guest): net plugin over verbs"
HETCCL_NET=ib HETCCL_SOCKET_IFNAME==lo timeout 300 $np --test-threads=1
HETCCL_NET=ib HETCCL_SOCKET_IFNAME==lo timeout 300 $npp --test-threads=1 --skip two_network_namespaces
echo "== rdma(guest): transport conformance over verbs"
timeout 200 $tc verbs_transport
echo "== rdma(guest): collectives and kill -9 over verbs"
timeout 500 $mp --nocapture --test-threads=1
EOF
)
t0=$(date +%s)
bash scripts/rdma-vm.sh --timeout "${HETCCL_RDMA_TESTS_TIMEOUT_S:-900}" --tmpfs target/tmp -- "$guest"
echo "== rdma: all in-VM tests passed in $(( $(date +%s) - t0 )) s"
