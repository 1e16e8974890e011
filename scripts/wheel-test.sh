#!/usr/bin/env bash
# Builds the wheel, installs it into a fresh virtual environment and
# exercises it there with the Rust toolchain out of PATH
# (tests/wheel/test_installed.py): hetccl-run in front of NVIDIA-linked C
# and Python programs and of hetccl-perf -np 2, hetccl info / selection,
# --dry-run, exit codes and signals, the shims, the Python API.
#
# Usage: scripts/wheel-test.sh [--profile PROFILE]
#   --profile  cargo profile the wheel is built from (default dev: CI has
#              built it already for cargo test; users' wheels are release)
#
# Work files: ${CARGO_TARGET_DIR:-target}/wheel-test/ (wheel, venv, C programs).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
profile=dev
while [ $# -gt 0 ]; do
    case "$1" in
        --profile) profile=${2:?--profile needs a name}; shift 2 ;;
        -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
        *) echo "wheel-test: unknown argument: $1" >&2; exit 2 ;;
    esac
done
start=$SECONDS
work=${CARGO_TARGET_DIR:-$root/target}/wheel-test
rm -rf "$work"
mkdir -p "$work"

echo "== wheel-test: build the wheel (cargo profile $profile)"
python3 python/backend/hetccl_build.py --profile "$profile" --out "$work/dist"
wheel=$(echo "$work"/dist/hetccl-*.whl)
[ -f "$wheel" ] || { echo "wheel-test: no wheel in $work/dist" >&2; exit 1; }

echo "== wheel-test: C programs against NVIDIA's nccl.h (gcc only)"
bash scripts/fetch-nvidia-headers.sh --env-file "$work/nv.env" >/dev/null
# shellcheck disable=SC1091
. "$work/nv.env"
cflags=(-std=gnu11 -O1 -Wall -Wextra -Werror)
# shellcheck disable=SC2086
gcc "${cflags[@]}" $HETCCL_NVIDIA_CFLAGS tests/c/interpose.c -o "$work/interpose" \
    -L"$HETCCL_NCCL_LIB" -l:libnccl.so.2 -Wl,-rpath,"$HETCCL_NCCL_LIB" -ldl
mkdir -p "$work/fake_cuda"
# shellcheck disable=SC2086
gcc "${cflags[@]}" $HETCCL_NVIDIA_CFLAGS -shared -fPIC -pthread -o "$work/fake_cuda/libcuda.so.1" \
    tests/c/fake_cuda.c tests/c/fake_cuda_memory.c tests/c/fake_cuda_streams.c tests/c/fake_cuda_kernels.c

echo "== wheel-test: fresh venv, install and checks without a Rust toolchain"
python3 -m venv "$work/venv"
clean_path="$work/venv/bin:/usr/bin:/bin"
for tool in cargo rustc rustup; do
    if p=$(PATH=/usr/bin:/bin command -v "$tool"); then
        echo "wheel-test: $p exists, so the Rust toolchain cannot be hidden from PATH" >&2
        exit 1
    fi
done
cd "$work"
env PATH="$clean_path" python -m pip install --no-index --no-deps --disable-pip-version-check -q "$wheel"
env PATH="$clean_path" \
    HETCCL_TEST_WHEEL="$wheel" \
    HETCCL_TEST_INTERPOSE="$work/interpose" \
    HETCCL_TEST_NVIDIA_LIB="$HETCCL_NCCL_LIB" \
    HETCCL_TEST_FAKE_CUDA="$work/fake_cuda" \
    python "$root/tests/wheel/test_installed.py"
echo "wheel-test: passed in $((SECONDS - start)) s"
