#!/usr/bin/env bash
# hetccl's verbs transport against perftest, both on Soft-RoCE (rxe0) in the
# same QEMU guest (scripts/rdma-vm.sh), so only the ratios mean anything:
#   - ib_write_bw at 8 B, 64 KiB, 1 MiB, 16 MiB, ib_send_lat at 8 B, and
#     ib_write_bw -b (both directions at once) at 1 MiB and 16 MiB;
#   - the net plugin (tests/net_plugin_bench.rs through the v12 table,
#     regMr'd buffers as NCCL passes them, 4 sends in flight) at the same
#     sizes, and its 8-byte round trip;
#   - hetccl-perf's 2-rank AllReduce over verbs (two HETCCL_HOST_IDs), busbw,
#     against ib_write_bw and against half of ib_write_bw -b: each rank of a
#     2-rank AllReduce sends and receives the whole size at once, so half
#     the bidirectional total is its limit.
# Rounds alternate perftest and hetccl (HETCCL_BENCH_ROUNDS, default 3) and the
# medians are printed as a table. Release build.
#
#   bash bench-scripts/rdma-bench.sh [--quick]
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${HETCCL_BENCH_ROUNDS:-3}
[ "${1:-}" = --quick ] && rounds=1
export CARGO_TERM_COLOR=never
cargo build --release -q -p hetccl -p hetccl-perf
bench=$PWD/$(cargo test --release --no-run --test net_plugin_bench 2>&1 | sed -n 's/.*Executable .* (\(.*\))$/\1/p')
[ -f "$bench" ] && [ -x "$bench" ] || { echo "rdma-bench: no bench binary" >&2; exit 1; }
perf=$PWD/target/release/hetccl-perf
sizes="8 65536 1048576 16777216"

guest=$(cat <<EOF
set -e
cd /tmp
# pt TOOL ARGS...: a perftest server and its client on 127.0.0.1; the
# client's output. The server may not listen yet when the client starts
# (TCG is slow): up to 3 tries, the server killed after a failed one.
pt() {
  local try spid out
  for try in 1 2 3; do
    timeout 150 "\$@" > /tmp/pt.srv 2>&1 & spid=\$!
    sleep 2
    if out=\$(timeout 120 "\$@" 127.0.0.1 2>&1); then
      wait \$spid || true
      echo "\$out"
      return 0
    fi
    kill \$spid 2>/dev/null || true
    wait \$spid 2>/dev/null || true
  done
  echo "rdma-bench: \$1 failed 3 times: \$out" >&2
  return 1
}
pt_bw() { # size -> MB/s (perftest's MB = 2^20 B)
  local n=\$(( \$1 >= 1048576 ? 40 : 400 ))
  pt ib_write_bw -d rxe0 -x 1 -s \$1 -n \$n -F | awk -v s=\$1 '\$1==s {print \$4}'
}
pt_bibw() { # size -> MB/s, both directions together
  pt ib_write_bw -d rxe0 -x 1 -s \$1 -n 40 -F -b | awk -v s=\$1 '\$1==s {print \$4}'
}
pt_lat() {
  pt ib_send_lat -d rxe0 -x 1 -s 8 -n 2000 -F | awk '\$1==8 {print \$5}'
}
plugin() { # RESULT lines
  HETCCL_NET=ib HETCCL_SOCKET_IFNAME==lo BENCH_MODE=plugin BENCH_WHAT=both BENCH_REG=1 \
    BENCH_SIZES=\$(echo $sizes | tr ' ' ,) BENCH_BYTES=33554432 BENCH_ITERS=2000 \
    timeout 300 $bench --ignored --nocapture --exact net_bench > /tmp/plugin.log 2>&1 \
    || { tail -20 /tmp/plugin.log >&2; return 1; }
  grep '^RESULT' /tmp/plugin.log
}
allreduce() { # size -> busbw GB/s of a 2-rank AllReduce on two host ids
  # (from the out-of-place time: busbw = algbw = size / time at 2 ranks;
  # the busbw column has too few digits at TCG speeds)
  local id=/tmp/ar.id; rm -f \$id
  for r in 0 1; do
    HETCCL_PERF_RANK=\$r HETCCL_PERF_NRANKS=2 HETCCL_HOST_ID=node\$r HETCCL_NET=ib \
      HETCCL_SOCKET_IFNAME==lo $perf all_reduce --id-file \$id -b \$1 -e \$1 -n 10 -w 2 -c 0 \
      > /tmp/ar.\$r 2>&1 &
  done
  wait
  awk -v s=\$1 '\$1==s {printf "%.6f\\n", s / \$6 / 1000}' /tmp/ar.0 | head -1
}
for round in \$(seq $rounds); do
  for s in $sizes; do echo "PT bw \$s \$(pt_bw \$s)"; done
  for s in 1048576 16777216; do echo "PT bibw \$s \$(pt_bibw \$s)"; done
  echo "PT lat 8 \$(pt_lat)"
  plugin | sed 's/^/HC /'
  for s in 1048576 16777216; do echo "AR \$s \$(allreduce \$s)"; done
done
EOF
)
out=$(mktemp)
bash scripts/rdma-vm.sh --timeout 1500 -- "$guest" | tee "$out"
python3 - "$out" <<'PY'
import re, statistics, sys
pt_bw, pt_bibw, pt_lat, hc_bw, hc_lat, ar = {}, {}, [], {}, [], {}
for line in open(sys.argv[1]):
    f = line.split()
    if line.startswith("PT bw") and len(f) == 4:
        pt_bw.setdefault(int(f[2]), []).append(float(f[3]) * 2**20)
    elif line.startswith("PT bibw") and len(f) == 4:
        pt_bibw.setdefault(int(f[2]), []).append(float(f[3]) * 2**20)
    elif line.startswith("PT lat") and len(f) == 4:
        pt_lat.append(float(f[3]))
    elif line.startswith("HC RESULT tput"):
        d = dict(x.split("=") for x in f[3:])
        hc_bw.setdefault(int(d["size"]), []).append(float(d["bytes_per_s"]))
    elif line.startswith("HC RESULT lat"):
        d = dict(x.split("=") for x in f[3:])
        hc_lat.append(float(d["p50_us"]) / 2)
    elif line.startswith("AR") and len(f) == 3:
        ar.setdefault(int(f[1]), []).append(float(f[2]) * 1e9)
med = lambda v: statistics.median(v) if v else float("nan")
print("\n| size | ib_write_bw MB/s | plugin MB/s | ratio |")
print("|---|---|---|---|")
for s in sorted(pt_bw):
    a, b = med(pt_bw[s]) / 1e6, med(hc_bw.get(s, [])) / 1e6
    print(f"| {s} | {a:.2f} | {b:.2f} | {b / a:.2f} |")
a, b = med(pt_lat), med(hc_lat)
print(f"\n8 B latency: ib_send_lat typical {a:.1f} us, plugin half round trip (p50) {b:.1f} us, ratio {b / a:.2f}")
for s in sorted(ar):
    base = med(pt_bw.get(s, [])) / 1e6
    bus = med(ar[s]) / 1e6
    half = med(pt_bibw.get(s, [])) / 2e6
    print(f"AllReduce 2 ranks {s} B: busbw {bus:.2f} MB/s, {bus / base:.2f} x ib_write_bw at that size, "
          f"{bus / half:.2f} x half of ib_write_bw -b ({half:.2f} MB/s)")
PY
rm -f "$out"
