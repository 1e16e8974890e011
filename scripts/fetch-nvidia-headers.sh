#!/usr/bin/env bash
# Fetches NVIDIA's real NCCL 2.32.3 headers and libnccl.so.2 (plus the CUDA
# headers nccl.h includes) from PyPI into a cache outside the repository, for
# the C tests: tests/abi_layout.rs and tests/interpose.rs.
#
# Usage: scripts/fetch-nvidia-headers.sh [--env-file FILE]
#
# Cache: ${HETCCL_CACHE:-$HOME/.cache/hetccl}
#   wheels/  the .whl files from `pip download --no-deps`
#   ext/     the wheels unzipped on top of each other (ext/nvidia/<pkg>/...)
#
# Prints, on stdout and nothing else, KEY=VALUE lines (also written to FILE
# with --env-file, in a form `source` accepts):
#   HETCCL_NCCL_INCLUDE, HETCCL_CUDA_RUNTIME_INCLUDE, HETCCL_CUDA_NVCC_INCLUDE,
#   HETCCL_CUDA_CCCL_INCLUDE   the four include dirs `#include <nccl.h>` needs
#   HETCCL_NVIDIA_CFLAGS       the same as -I flags
#   HETCCL_NCCL_LIB            the dir holding NVIDIA's libnccl.so.2
#   HETCCL_NCCL_VERSION        2.32.3
#
# Idempotent: a wheel already downloaded is not downloaded again, and a wheel
# already extracted (stamp file in ext/) is not extracted again. Concurrent
# runs serialise on a lock file. Exits non-zero if anything fails.
set -euo pipefail

env_file=""
while [ $# -gt 0 ]; do
    case "$1" in
        --env-file) env_file="${2:?--env-file needs a path}"; shift 2 ;;
        -h|--help) sed -n '2,22p' "$0"; exit 0 ;;
        *) echo "fetch-nvidia-headers: unknown argument: $1" >&2; exit 2 ;;
    esac
done

NCCL_VERSION=2.32.3
# pip name, version, wheel file-name prefix
PKGS=(
    "nvidia-nccl-cu12 ${NCCL_VERSION} nvidia_nccl_cu12"
    "nvidia-cuda-runtime-cu12 12.9.79 nvidia_cuda_runtime_cu12"
    "nvidia-cuda-nvcc-cu12 12.9.86 nvidia_cuda_nvcc_cu12"
    "nvidia-cuda-cccl-cu12 12.9.27 nvidia_cuda_cccl_cu12"
)

cache="${HETCCL_CACHE:-$HOME/.cache/hetccl}"
wheels="$cache/wheels"
ext="$cache/ext"
mkdir -p "$wheels" "$ext"

PY="${PYTHON:-python3}"
command -v "$PY" >/dev/null || { echo "fetch-nvidia-headers: $PY not found" >&2; exit 1; }

# Serialise concurrent runs (parallel test binaries) when flock exists.
if command -v flock >/dev/null; then
    exec 9>"$cache/.fetch.lock"
    flock 9
fi

shopt -s nullglob
. "$(dirname "$0")/lib/wheel.sh"
for entry in "${PKGS[@]}"; do
    read -r name version prefix <<<"$entry"
    wheel=$(fetch_wheel fetch-nvidia-headers "$name" "$version" "$prefix" "$wheels")
    stamp="$ext/.extracted-${prefix}-${version}"
    if [ ! -e "$stamp" ]; then
        echo "fetch-nvidia-headers: extracting ${wheel##*/}" >&2
        "$PY" -m zipfile -e "$wheel" "$ext"
        touch "$stamp"
    fi
done

nv="$ext/nvidia"
NCCL_INCLUDE="$nv/nccl/include"
CUDA_RUNTIME_INCLUDE="$nv/cuda_runtime/include"
CUDA_NVCC_INCLUDE="$nv/cuda_nvcc/include"
CUDA_CCCL_INCLUDE="$nv/cuda_cccl/include"
NCCL_LIB="$nv/nccl/lib"

for f in "$NCCL_INCLUDE/nccl.h" "$CUDA_RUNTIME_INCLUDE/cuda_runtime.h" \
         "$CUDA_NVCC_INCLUDE/crt/host_defines.h" "$CUDA_CCCL_INCLUDE/cuda" \
         "$NCCL_LIB/libnccl.so.2"; do
    if [ ! -e "$f" ]; then
        echo "fetch-nvidia-headers: expected $f after extraction; remove $ext to retry" >&2
        exit 1
    fi
done

out="HETCCL_NCCL_INCLUDE=$NCCL_INCLUDE
HETCCL_CUDA_RUNTIME_INCLUDE=$CUDA_RUNTIME_INCLUDE
HETCCL_CUDA_NVCC_INCLUDE=$CUDA_NVCC_INCLUDE
HETCCL_CUDA_CCCL_INCLUDE=$CUDA_CCCL_INCLUDE
HETCCL_NVIDIA_CFLAGS=\"-I$NCCL_INCLUDE -I$CUDA_RUNTIME_INCLUDE -I$CUDA_NVCC_INCLUDE -I$CUDA_CCCL_INCLUDE\"
HETCCL_NCCL_LIB=$NCCL_LIB
HETCCL_NCCL_VERSION=$NCCL_VERSION"

printf '%s\n' "$out"
if [ -n "$env_file" ]; then
    printf '%s\n' "$out" >"$env_file"
fi
