#!/usr/bin/env bash
# Builds hetccl's wheel: dist/hetccl-<version>-py3-none-manylinux_<glibc>_<arch>.whl
# holding libhetccl.so, its libnccl-net-hetccl.so and libnccl.so.2 shims,
# hetccl-perf, hetccl.h and the hetccl Python package (hetccl-run, hetccl).
#
# Usage: scripts/wheel.sh [--profile PROFILE] [--no-build] [--out DIR]
#   --profile  cargo profile (default release; CI's wheel test uses dev)
#   --no-build pack what cargo already built for that profile
#   --out      output directory (default dist/)
#
# Needs cargo, a C compiler (cc, for the two shims) and readelf on the build
# machine; the wheel needs none of them. Install: pip install dist/hetccl-*.whl
# See docs/packaging.md.
set -euo pipefail
cd "$(dirname "$0")/.."
exec "${PYTHON:-python3}" python/backend/hetccl_build.py "$@"
