#!/usr/bin/env bash
# The main job: build the release library and benchmark, lay out dist/, and
# show hetccl in its roles. (1) A C program compiled against NVIDIA's real
# nccl.h and linked against NVIDIA's libnccl.so.2 is run with
# LD_PRELOAD=dist/lib/libhetccl.so and gets hetccl's answers. (2) The
# net-plugin tables NCCL looks for are listed. (3) A local multi-rank
# benchmark: hetccl-perf (nccl-tests' table) runs allreduce on 2 and 4 ranks
# over shared memory and on 2 ranks over TCP, checking every result.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cargo build --release -p hetccl -p hetccl-perf
bash scripts/dist.sh --no-build
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
bash scripts/fetch-nvidia-headers.sh --env-file "$tmp/env" >/dev/null
# shellcheck disable=SC1091
source "$tmp/env"
gcc -O1 -o "$tmp/interpose" tests/c/interpose.c $HETCCL_NVIDIA_CFLAGS -L"$HETCCL_NCCL_LIB" -l:libnccl.so.2 -Wl,-rpath,"$HETCCL_NCCL_LIB"
echo "== without hetccl (NVIDIA's libnccl.so.2):"
"$tmp/interpose" || true
echo "== with LD_PRELOAD=dist/lib/libhetccl.so:"
LD_PRELOAD="$PWD/dist/lib/libhetccl.so" "$tmp/interpose" hetccl
echo "== net plugin tables exported for NCCL_NET_PLUGIN=hetccl:"
nm -D --defined-only dist/lib/libhetccl.so | grep -E ' ncclNetPlugin_v[0-9]+$' || echo "(none yet)"
echo "== hetccl-perf: local multi-rank allreduce (shared memory, then TCP)"
perf=dist/bin/hetccl-perf
export HETCCL_SOCKET_IFNAME=${HETCCL_SOCKET_IFNAME:-lo}
"$perf" all_reduce -np 2 -b 8 -e 64M -f 8 -n 10 -w 2
"$perf" all_reduce -np 4 -b 8 -e 64M -f 8 -n 5 -w 1
NCCL_SHM_DISABLE=1 "$perf" all_reduce -np 2 -b 8 -e 64M -f 8 -n 5 -w 1
