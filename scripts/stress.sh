#!/usr/bin/env bash
# Peer-fault stress: every scenario of tests/peer_faults.rs (kill -9,
# SIGSTOP and an idle peer in the middle of an AllReduce loop, over shm,
# TCP and two network namespaces) N times in a row (default 20), then the
# net-plugin kill -9 / SIGSTOP trials of tests/peer_faults_net.rs.
# Prints one STRESS line per scenario and a total; exits non-zero if any
# trial hung, crashed, saw a wrong result or a wrong error code.
#   scripts/stress.sh [N]
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-20}
export HETCCL_STRESS_REPS=$N
export HETCCL_REQUIRE_NETNS=${HETCCL_REQUIRE_NETNS:-1}
log=$(mktemp /tmp/hetccl-stress.XXXXXX)
t0=$(date +%s)
rc=0
for t in peer_faults peer_faults_net; do
  [ -f "tests/$t.rs" ] || continue
  timeout 3600 cargo test --test "$t" -- --test-threads=1 --nocapture >"$log.$t" 2>&1 || rc=1
  grep -h '^STRESS\|STRESS ' "$log.$t" | sed 's/^.*STRESS/STRESS/' | tee -a "$log"
  [ $rc = 0 ] || { echo "== $t failed; its output: $log.$t"; }
done
awk '{for(i=1;i<=NF;i++){if($i=="trials")t+=$(i+1);if($i=="hangs")h+=$(i+1);if($i=="crashes")c+=$(i+1);if($i=="wrong")w+=$(i+1);if($i=="bad")b+=$(i+1)}}
     END{printf "TOTAL trials %d hangs %d crashes %d wrong %d bad %d\n",t,h,c,w,b}' "$log"
echo "time $(( $(date +%s) - t0 )) s"
exit $rc
