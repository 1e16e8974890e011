#!/usr/bin/env bash
# Fetches NVIDIA's NVRTC (the CUDA runtime compiler) from its PyPI wheel into
# a cache outside the repository, for the CPU-only kernel compile test
# (collectives/tests/gpu_nvrtc.rs). NVRTC compiles CUDA C++ to PTX without a
# GPU, so a syntax or type error in hetccl's kernels fails CI on any machine.
#
# Usage: scripts/fetch-nvrtc.sh [--env-file FILE]
#
# Cache: ${HETCCL_CACHE:-$HOME/.cache/hetccl}/nvrtc
#   the wheel's nvidia/cuda_nvrtc/lib/ (libnvrtc.so.12, libnvrtc-builtins.so.*)
#
# Prints on stdout (and to FILE with --env-file) one line:
#   HETCCL_NVRTC_LIB=<path of libnvrtc.so.12>
# Idempotent; concurrent runs serialise on a lock file. Exits non-zero if
# anything fails.
set -euo pipefail

env_file=""
while [ $# -gt 0 ]; do
    case "$1" in
        --env-file) env_file="${2:?--env-file needs a path}"; shift 2 ;;
        -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
        *) echo "fetch-nvrtc: unknown argument: $1" >&2; exit 2 ;;
    esac
done

# Pinned: the wheel's libnvrtc.so.12 is what the test compiles with.
NAME=nvidia-cuda-nvrtc-cu12
VERSION=12.9.86
PREFIX=nvidia_cuda_nvrtc_cu12

cache="${HETCCL_CACHE:-$HOME/.cache/hetccl}"
wheels="$cache/wheels"
dest="$cache/nvrtc"
mkdir -p "$wheels" "$dest"
PY="${PYTHON:-python3}"
command -v "$PY" >/dev/null || { echo "fetch-nvrtc: $PY not found" >&2; exit 1; }

if command -v flock >/dev/null; then
    exec 9>"$cache/.fetch-nvrtc.lock"
    flock 9
fi

shopt -s nullglob
. "$(dirname "$0")/lib/wheel.sh"
wheel=$(fetch_wheel fetch-nvrtc "$NAME" "$VERSION" "$PREFIX" "$wheels")
stamp="$dest/.extracted-${PREFIX}-${VERSION}"
if [ ! -e "$stamp" ]; then
    echo "fetch-nvrtc: extracting the libraries of ${wheel##*/}" >&2
    # Only the shared libraries: the wheel also carries headers we do not need.
    "$PY" - "$wheel" "$dest" <<'PYEOF'
import sys, zipfile
whl, dest = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(whl) as z:
    names = [n for n in z.namelist() if "/lib/" in n and ".so" in n]
    if not names:
        sys.exit("fetch-nvrtc: no shared libraries in " + whl)
    for n in names:
        z.extract(n, dest)
PYEOF
    touch "$stamp"
fi

lib="$dest/nvidia/cuda_nvrtc/lib/libnvrtc.so.12"
[ -e "$lib" ] || { echo "fetch-nvrtc: expected $lib after extraction; remove $dest to retry" >&2; exit 1; }
out="HETCCL_NVRTC_LIB=$lib"
printf '%s\n' "$out"
if [ -n "$env_file" ]; then
    printf '%s\n' "$out" >"$env_file"
fi
