#!/usr/bin/env bash
# Lays out the install tree (see README.md):
#   dist/lib/libhetccl.so            the library (soname libhetccl.so)
#   dist/lib/libnccl-net-hetccl.so   -> libhetccl.so  (NCCL_NET_PLUGIN=hetccl)
#   dist/lib/libnccl.so.2            -> libhetccl.so  (LD_LIBRARY_PATH users)
#   dist/include/hetccl.h            hetccl's own additions (cbindgen)
#   dist/bin/hetccl-perf             the benchmark
# Usage: scripts/dist.sh [--no-build] [DEST]   (DEST defaults to ./dist)
set -euo pipefail
cd "$(dirname "$0")/.."
build=1
if [ "${1:-}" = "--no-build" ]; then build=0; shift; fi
dest=${1:-dist}
target=${CARGO_TARGET_DIR:-target}
if [ "$build" = 1 ]; then cargo build --release -p hetccl -p hetccl-perf; fi
mkdir -p "$dest/lib" "$dest/include" "$dest/bin"
install -m 0755 "$target/release/libhetccl.so" "$dest/lib/libhetccl.so"
ln -sfn libhetccl.so "$dest/lib/libnccl-net-hetccl.so"
ln -sfn libhetccl.so "$dest/lib/libnccl.so.2"
install -m 0644 include/hetccl.h "$dest/include/hetccl.h"
if [ -x "$target/release/hetccl-perf" ]; then
  install -m 0755 "$target/release/hetccl-perf" "$dest/bin/hetccl-perf"
fi
echo "installed into $dest:"
ls -l "$dest/lib" "$dest/include"
