#!/usr/bin/env bash
# The long soak: tests/soak/ in release mode with many operations, and a
# summary of the figures (trials, hangs, crashes, wrong results, fds, shm,
# RSS).
#
#   scripts/soak.sh [N] [SEED]
#
# N random collectives per run (default 10000; HETCCL_SOAK_N), SEED the
# shared seed (default: the tests' own). Three runs, one line each:
#   threads      4 ranks as threads of one process (shm)
#   threads-tcp  the same with NCCL_SHM_DISABLE=1 (TCP on loopback)
#   processes    4 processes as 2 emulated nodes x 2 (shm + TCP)
# SOAK_MODES picks some of them (e.g. SOAK_MODES="threads processes").
# Every run has a hard timeout (SOAK_TIMEOUT_S, default 3600 s); a run killed
# by a signal counts as a crash, one that reaches the timeout as a hang.
# Exit status: 0 when every run passed.
set -u -o pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root" || exit 2
n=${1:-${HETCCL_SOAK_N:-10000}}
seed=${2:-${HETCCL_SOAK_SEED:-}}
modes=${SOAK_MODES:-threads threads-tcp processes}
limit=${SOAK_TIMEOUT_S:-3600}

echo "== building tests/soak/ (release)"
bin=$(cargo test --release --test soak --no-run --message-format=json 2>/dev/null |
    sed -n 's/.*"executable":"\([^"]*soak-[^"]*\)".*/\1/p' | tail -1)
if [ -z "$bin" ] || [ ! -x "$bin" ]; then
    cargo test --release --test soak --no-run
    echo "could not build the soak test" >&2
    exit 2
fi

total_trials=0 total_hangs=0 total_crashes=0 total_wrong=0 failed=0
for mode in $modes; do
    case $mode in
    threads) test=soak_threads envs=() ;;
    threads-tcp) test=soak_threads envs=(NCCL_SHM_DISABLE=1) ;;
    processes) test=soak_processes envs=() ;;
    *) echo "unknown mode $mode" >&2; exit 2 ;;
    esac
    log=$(mktemp)
    start=$(date +%s)
    env ${envs[@]+"${envs[@]}"} HETCCL_SOAK_N="$n" ${seed:+HETCCL_SOAK_SEED=$seed} \
        timeout -k 10 "$limit" "$bin" --exact "$test" --nocapture --test-threads=1 >"$log" 2>&1
    rc=$?
    secs=$(($(date +%s) - start))
    line=$(grep -o 'SOAK mode=.*' "$log" | tail -1)
    get() { sed -n "s/.* $1=\([^ ]*\).*/\1/p" <<<"$line"; }
    trials=$(get trials) hangs=$(get hangs) crashes=$(get crashes) wrong=$(get wrong)
    trials=${trials:-0} hangs=${hangs:-0} crashes=${crashes:-0} wrong=${wrong:-0}
    if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
        hangs=$((hangs + 1))
    elif [ $rc -gt 128 ]; then
        crashes=$((crashes + 1))
    fi
    status=ok
    [ $rc -ne 0 ] && status="FAILED (rc $rc)"
    printf '%-12s %s  %s  [%ss]\n' "$mode" "$status" "${line#SOAK }" "$secs"
    if [ $rc -ne 0 ]; then
        failed=1
        grep -v 'SOAK mode=' "$log" | grep -E 'failed|error|mismatch|hang|panicked|wrong|grew|left' |
            head -20 | sed 's/^/    /'
        echo "    (full log: $log)"
    else
        rm -f "$log"
    fi
    total_trials=$((total_trials + trials)) total_hangs=$((total_hangs + hangs))
    total_crashes=$((total_crashes + crashes)) total_wrong=$((total_wrong + wrong))
done
echo "== total: trials=$total_trials hangs=$total_hangs crashes=$total_crashes wrong=$total_wrong"
exit $failed
