#!/usr/bin/env bash
# Runs hetccl's fuzz targets (fuzz/, a cargo-fuzz crate outside the root
# workspace) for a given time each and prints one result line per target.
#
#   scripts/fuzz.sh [SECONDS] [TARGET...]   # libFuzzer, SECONDS per target (default 60)
#   scripts/fuzz.sh --replay                # stable Rust: replay seeds + random inputs
#   scripts/fuzz.sh --list
#
# libFuzzer needs nightly compiler flags (sanitizer coverage). The script
# uses `cargo +nightly` when a nightly toolchain is installed, and otherwise
# the stable toolchain with RUSTC_BOOTSTRAP=1. `cargo install cargo-fuzz
# --locked` once if `cargo fuzz` is missing.
#
# The working corpus of each target grows in fuzz/corpus/<target>/ (ignored
# by git); the committed seeds are fuzz/seeds/<target>/. A crash leaves its
# input in fuzz/artifacts/<target>/; `scripts/fuzz.sh --replay` then
# replays it too (fuzz/tests/replay.rs reads artifacts/).
#
# Environment: FUZZ_JOBS (parallel targets, default 1), FUZZ_MAX_LEN
# (default 4096), FUZZ_TIMEOUT_S (one input running longer is a hang,
# default 10), FUZZ_SANITIZER (address|none, default address).
set -u -o pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root/fuzz" || exit 2

targets_all=(unique_id card card_table frame_recv auth_verify comm_config coll_config
    net_handle net_hello net_frame boot_hello tuning_table engine_tuning_table tune_messages
    pack ib_sender ib_setup_frame)

if [ "${1:-}" = "--list" ]; then
    printf '%s\n' "${targets_all[@]}"
    exit 0
fi

if [ "${1:-}" = "--replay" ]; then
    # Hard limit: the replay is a few seconds of work.
    exec timeout 1200 cargo test --release -- --nocapture
fi

secs=${1:-60}
shift || true
targets=("$@")
[ ${#targets[@]} -eq 0 ] && targets=("${targets_all[@]}")

if rustup toolchain list 2>/dev/null | grep -q '^nightly'; then
    fz=(cargo +nightly fuzz)
else
    fz=(env RUSTC_BOOTSTRAP=1 cargo fuzz)
fi
if ! "${fz[@]}" --version >/dev/null 2>&1; then
    echo "cargo fuzz is missing: cargo install cargo-fuzz --locked" >&2
    exit 2
fi

san=${FUZZ_SANITIZER:-address}
echo "== building ${#targets[@]} targets (${fz[*]}, sanitizer $san)"
build_log=$(mktemp)
if ! timeout 1800 "${fz[@]}" build -O --debug-assertions -s "$san" >"$build_log" 2>&1; then
    tail -30 "$build_log"
    rm -f "$build_log"
    exit 2
fi
rm -f "$build_log"

logdir=$(mktemp -d)
run_one() {
    local t=$1 log=$logdir/$1.log
    mkdir -p "corpus/$t"
    # libFuzzer stops itself after -max_total_time; timeout is the backstop.
    timeout $((secs + 120)) "${fz[@]}" run -O --debug-assertions -s "$san" "$t" \
        "corpus/$t" "seeds/$t" -- \
        -max_total_time="$secs" -max_len="${FUZZ_MAX_LEN:-4096}" \
        -timeout="${FUZZ_TIMEOUT_S:-10}" -rss_limit_mb=2048 -print_final_stats=1 \
        >"$log" 2>&1
    local rc=$?
    local runs corpus
    runs=$(grep -o 'Done [0-9]* runs' "$log" | tail -1 | awk '{print $2}')
    [ -z "$runs" ] && runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | awk '{print $2}' | tail -1)
    corpus=$(ls "corpus/$t" | wc -l)
    if [ $rc -eq 0 ]; then
        printf '%-12s ok      %12s execs in %ss, corpus %s files\n' "$t" "${runs:-?}" "$secs" "$corpus"
    else
        local art
        art=$(grep -o 'artifacts/[^ ]*' "$log" | tail -1)
        printf '%-12s FAILED  rc=%s %s execs, artifact %s (log %s)\n' "$t" "$rc" "${runs:-?}" "${art:-none}" "$log"
        grep -E 'panicked|ERROR|SUMMARY|deadly|timeout' "$log" | head -5 | sed 's/^/             /'
        return 1
    fi
}

fail=0
jobs=${FUZZ_JOBS:-1}
echo "== running each target for ${secs}s ($jobs at a time)"
for t in "${targets[@]}"; do
    if [ "$jobs" -le 1 ]; then
        run_one "$t" || fail=1
    else
        run_one "$t" &
        while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n || fail=1; done
    fi
done
while [ "$(jobs -rp | wc -l)" -gt 0 ]; do wait -n || fail=1; done
[ $fail -eq 0 ] && rm -rf "$logdir"
exit $fail
