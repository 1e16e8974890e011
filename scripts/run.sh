#!/usr/bin/env bash
# The main job: build the release library, lay out dist/, and show it in its
# two roles. (1) A C program compiled against NVIDIA's real nccl.h and linked
# against NVIDIA's libnccl.so.2 is run with LD_PRELOAD=dist/lib/libhetccl.so and
# gets hetccl's answers. (2) The net-plugin tables NCCL looks for are listed.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/dist.sh
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
