#!/usr/bin/env bash
# Installs what hetccl's build, tests and benchmarks need on a fresh Debian
# machine. Idempotent: installs only what is missing.
set -euo pipefail
need=()
for pair in gcc:gcc nm:binutils readelf:binutils ip:iproute2 python3:python3 pip3:python3-pip valgrind:valgrind; do
  cmd=${pair%%:*}; pkg=${pair#*:}
  command -v "$cmd" >/dev/null 2>&1 || need+=("$pkg")
done
# venv with pip (Debian splits ensurepip out) for scripts/wheel-test.sh.
python3 -c 'import ensurepip, venv' 2>/dev/null || need+=(python3-venv)
# hwloc (topology) for the hwloc2 crate, found through pkg-config.
pkg-config --exists hwloc 2>/dev/null || need+=(libhwloc-dev pkg-config)
if [ ${#need[@]} -gt 0 ]; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
command -v cargo >/dev/null || { echo "setup: cargo (rustup) is required" >&2; exit 1; }
rustup component list --installed 2>/dev/null | grep -q clippy || rustup component add clippy rustfmt 2>/dev/null || true
# NVIDIA's real headers and libnccl.so.2 for the ABI tests, cached outside the repo.
bash "$(dirname "$0")/fetch-nvidia-headers.sh" >/dev/null
# NVIDIA NVRTC (PyPI wheel) for the CPU-only GPU kernel compile test.
bash "$(dirname "$0")/fetch-nvrtc.sh" >/dev/null
