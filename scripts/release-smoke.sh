#!/usr/bin/env bash
# The release build, as users and the benchmarks run it: hetccl-perf with
# result checks (-c 1) on 2 ranks over shared memory and on 2 ranks with
# different host ids (TCP), every collective the benchmarks time, sizes on
# both sides of the eager and chunk limits. The test suite runs debug
# builds; this catches what only the optimiser shows (a spawn loop entered
# with a bound of 0 once made every TCP job spawn threads until it failed).
#
#   bash scripts/release-smoke.sh
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TERM_COLOR=never
cargo build --release -q -p hetccl -p hetccl-perf
perf=target/release/hetccl-perf
fail=0
for hosts in 1 2; do
  for coll in all_reduce all_gather reduce_scatter broadcast sendrecv; do
    out=$(timeout 120 "$perf" "$coll" -np 2 --hosts "$hosts" -b 8 -e 4M -f 8 -n 3 -w 1 -c 1 2>&1) || {
      echo "release-smoke: $coll on $hosts host(s) failed:" >&2
      echo "$out" | grep -v '^ *[0-9]*: \|^ *at ' | tail -15 >&2
      fail=1
      continue
    }
    if echo "$out" | grep -q panicked; then
      echo "release-smoke: $coll on $hosts host(s): a thread panicked" >&2
      fail=1
    fi
    wrong=$(echo "$out" | awk '/Out of bounds values/ {print $7}')
    if [ "${wrong:-x}" != 0 ]; then
      echo "release-smoke: $coll on $hosts host(s): wrong values: ${wrong:-no summary}" >&2
      fail=1
    fi
  done
done
[ "$fail" = 0 ] && echo "release-smoke: passed"
exit "$fail"
