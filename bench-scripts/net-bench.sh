#!/usr/bin/env bash
# Benchmark of the NCCL net plugin's TCP transport against iperf3 and a
# plain TCP ping-pong, over loopback and over a veth pair between two network
# namespaces. Runs A,B,A,B rounds and reports medians of pairwise ratios.
#
# usage: bench-scripts/net-bench.sh [ROUNDS]        (default 5)
#        bench-scripts/net-bench.sh --tune [ROUNDS] (socket/thread sweep, 64 MiB)
# Needs root (network namespaces, apt-get). Writes docs/benchmarks/net-*.
set -euo pipefail

TUNE=0
if [[ "${1:-}" == "--tune" ]]; then TUNE=1; shift; fi
ROUNDS=${1:-5}
cd "$(dirname "$0")/.."
ROOT=$PWD
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
OUT=$ROOT/docs/benchmarks
mkdir -p "$OUT"

command -v iperf3 >/dev/null || { apt-get update -qq && apt-get install -y -qq iperf3 >/dev/null; }
python3 -c 'import matplotlib' 2>/dev/null || python3 -m pip install -q matplotlib

cargo build --release -p hetccl -q
BIN=$(cargo test --release -p hetccl --test net_plugin_bench --no-run --message-format=json 2>/dev/null |
    python3 -c 'import sys,json
for l in sys.stdin:
    m=json.loads(l)
    if m.get("reason")=="compiler-artifact" and m.get("executable") and m["target"]["name"]=="net_plugin_bench": print(m["executable"])')
export HETCCL_LIB=$CARGO_TARGET_DIR/release/libhetccl.so
[[ -x "$BIN" && -f "$HETCCL_LIB" ]] || { echo "build failed" >&2; exit 1; }

# Namespaces with a veth pair; addresses never leave the machine.
NS_A=hcnb$$a; NS_B=hcnb$$b; ADDR_A=10.231.251.1; ADDR_B=10.231.251.2
cleanup() { ip netns del "$NS_A" 2>/dev/null || true; ip netns del "$NS_B" 2>/dev/null || true; }
trap cleanup EXIT
ip netns add "$NS_A"; ip netns add "$NS_B"
ip link add "$NS_A" type veth peer name "$NS_B"
ip link set "$NS_A" netns "$NS_A"; ip link set "$NS_B" netns "$NS_B"
ip -n "$NS_A" addr add $ADDR_A/24 dev "$NS_A"; ip -n "$NS_B" addr add $ADDR_B/24 dev "$NS_B"
for n in "$NS_A" "$NS_B"; do ip -n "$n" link set "$n" up; ip -n "$n" link set lo up; done

STAMP=$(date -u +%Y%m%dT%H%M%SZ)
RAW=$OUT/net-raw-$STAMP.txt
: >"$RAW"
echo "# $(date -u) $(uname -r) nproc=$(nproc) rounds=$ROUNDS tune=$TUNE" | tee -a "$RAW"

c2c() { # placement hint: load average
    cut -d' ' -f1 /proc/loadavg
}

# plugin LINK WHAT SIZES -> RESULT lines tagged with the link
plugin() {
    local link=$1 what=$2 sizes=$3 envs=()
    if [[ $link == veth ]]; then
        envs=(BENCH_NETNS=$NS_A,$NS_B BENCH_IFS=$NS_A,$NS_B)
    fi
    env "${envs[@]}" BENCH_MODE=plugin BENCH_WHAT=$what BENCH_SIZES=$sizes \
        timeout 600 "$BIN" --ignored --nocapture --exact net_bench 2>/dev/null | grep '^RESULT' || echo "RESULT failed"
}

# tcplat LINK [SOCKS]: SOCKS=2 replies on a second connection, like a
# plugin's separate send and receive comms.
tcplat() {
    local link=$1 envs=(BENCH_ADDRS=127.0.0.1 BENCH_TCP_SOCKS=${2:-1})
    if [[ $link == veth ]]; then
        envs=(BENCH_NETNS=$NS_A,$NS_B BENCH_ADDRS=$ADDR_A BENCH_TCP_SOCKS=${2:-1})
    fi
    env "${envs[@]}" BENCH_MODE=tcp timeout 300 "$BIN" --ignored --nocapture --exact net_bench 2>/dev/null |
        grep '^RESULT' || echo "RESULT failed"
}

# iperf3 LINK STREAMS [EXTRA...] -> bytes/s received
iperf() {
    local link=$1 p=$2
    shift 2
    local port=$((20000 + RANDOM % 20000)) addr=127.0.0.1
    local srv=() cli=()
    if [[ $link == veth ]]; then
        srv=(ip netns exec "$NS_A"); cli=(ip netns exec "$NS_B"); addr=$ADDR_A
    fi
    "${srv[@]}" iperf3 -s -1 -B $addr -p $port >/dev/null 2>&1 &
    local spid=$! json="" tries
    for tries in $(seq 50); do # wait (at most 5 s) until the server listens
        "${srv[@]}" ss -Hltn "sport = :$port" 2>/dev/null | grep -q . && break
        sleep 0.1
    done
    json=$("${cli[@]}" iperf3 -c $addr -p $port -P "$p" -t 3 -J "$@" 2>/dev/null) || true
    kill $spid 2>/dev/null || true
    wait $spid 2>/dev/null || true
    python3 -c 'import sys,json
try: print("%.0f" % (json.load(sys.stdin)["end"]["sum_received"]["bits_per_second"] / 8))
except Exception: print("nan")' <<<"$json"
}

log() { echo "$*" | tee -a "$RAW"; }

if [[ $TUNE == 1 ]]; then
    # NCCL_SOCKET_NTHREADS x NCCL_NSOCKS_PERTHREAD (0 threads: the caller drives
    # the sockets), 1 MiB and 64 MiB throughput, configurations interleaved.
    for r in $(seq 1 "$ROUNDS"); do
        for link in lo veth; do
            for cfg in 0x0 0x1 0x2 0x4 1x1 2x1 1x2 4x1 2x2; do
                t=${cfg%x*}; s=${cfg#*x}
                while read -r res; do
                    log "round=$r link=$link load=$(c2c) tune=$cfg $res"
                done < <(NCCL_SOCKET_NTHREADS=$t NCCL_NSOCKS_PERTHREAD=$s plugin $link tput 1048576,67108864)
            done
        done
    done
    python3 "$ROOT/bench-scripts/net-summarize.py" --tune "$RAW" "$OUT"
    exit 0
fi

# iperf3 gets as many streams as the plugin has data sockets: NCCL_SOCKET_NTHREADS
# x NCCL_NSOCKS_PERTHREAD, else the defaults tcp::AUTO_NTHREADS x AUTO_NSOCKS_PERTHREAD.
STREAMS=$(( ${NCCL_SOCKET_NTHREADS:-4} * ${NCCL_NSOCKS_PERTHREAD:-1} ))
for r in $(seq 1 "$ROUNDS"); do
    for link in lo veth; do
        while read -r line; do log "round=$r link=$link load=$(c2c) $line"; done < <(plugin $link tput 4096,65536,262144,1048576,4194304,16777216,67108864)
        log "round=$r link=$link load=$(c2c) RESULT iperf3 streams=$STREAMS bytes_per_s=$(iperf $link "$STREAMS")"
        log "round=$r link=$link load=$(c2c) RESULT iperf3_l1m streams=$STREAMS bytes_per_s=$(iperf $link "$STREAMS" -l 1M)"
        while read -r line; do log "round=$r link=$link load=$(c2c) $line"; done < <(plugin $link lat 8)
        log "round=$r link=$link load=$(c2c) $(tcplat $link)"
        log "round=$r link=$link load=$(c2c) $(tcplat $link 2)"
    done
done
python3 "$ROOT/bench-scripts/net-summarize.py" "$RAW" "$OUT"
