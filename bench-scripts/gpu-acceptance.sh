#!/usr/bin/env bash
# GPU acceptance run for hetccl's device-buffer support, on ONE
# machine with one NVIDIA GPU, PyTorch and the nvidia-nccl-cu13 wheel
# installed, and no network. Needs no cargo: it uses the prebuilt, carried
# dist/ of scripts/dist.sh (dist/lib/libhetccl.so, dist/bin/hetccl-perf;
# target/release/hetccl-perf is taken first when present).
#
# Usage: bash bench-scripts/gpu-acceptance.sh [--check] [OUTDIR]
#   OUTDIR     where results go (default: $OUT if set, else ./gpu-acceptance-out)
#   --check    only check the prerequisites (GPU, torch, libraries) and exit:
#              0 when a run could start, 2 (with the reason) when not.
#
# Steps, each under its own `timeout`, all within GPU_ACCEPTANCE_BUDGET_S
# (default 450 s; a step that would pass it gets only what is left, and one
# with under 10 s left is skipped and counted as failed):
#   a) hetccl under an unmodified PyTorch program: torchrun --nproc_per_node 4
#      on one GPU with LD_PRELOAD=libhetccl.so; all_reduce (sum, max),
#      all_gather_into_tensor, reduce_scatter_tensor, broadcast,
#      all_to_all_single, batch_isend_irecv, barrier on CUDA tensors in
#      float32/bfloat16/float16 with exact checks, plus a stream-order check;
#      every rank must log its reduction kernels loaded as a CUBIN.
#   a2) allocations (cudaMalloc, cudaHostAlloc) on rank 0 while its stream
#      waits for peers 1 s late, 2 ranks, through hetccl and NVIDIA's NCCL
#      (see gpu_acceptance.py's alloc mode).
#   b) performance: hetccl-perf all_reduce on device buffers (--alloc device,
#      calls on a stream per rank) with 2 and 4 ranks on the GPU, for hetccl
#      and for NVIDIA's NCCL (--lib), NCCL_MULTI_RANK_GPU_ENABLE=1; then the
#      PyTorch all_reduce timing on CUDA tensors through both, 2 and 4 ranks.
#   c) NVIDIA's NCCL with hetccl as its network plugin: NCCL_NET_PLUGIN=hetccl
#      (libnccl-net-hetccl.so from dist/lib), P2P and SHM disabled, 2 ranks; the
#      NCCL_DEBUG=INFO log must show the hetccl net in use.
# Writes OUTDIR/results.txt (one PASS/FAIL line per step, then a summary),
# the per-step logs and JSON. Exit status 0 only if every step passed.
set -uo pipefail

check_only=0
outdir=""
for a in "$@"; do
    case "$a" in
        --check) check_only=1 ;;
        -h|--help) sed -n '2,33p' "$0"; exit 0 ;;
        -*) echo "gpu-acceptance: unknown option $a" >&2; exit 2 ;;
        *) outdir="$a" ;;
    esac
done
root="$(cd "$(dirname "$0")/.." && pwd)"
outdir="${outdir:-${OUT:-$root/gpu-acceptance-out}}"
PY="${PYTHON:-python3}"
LIB="$root/dist/lib/libhetccl.so"
NETLIB="$root/dist/lib/libnccl-net-hetccl.so"
# The plugin is libhetccl.so itself; dist/'s link may not have been carried.
[ -e "$NETLIB" ] || NETLIB="$LIB"
PERF="$root/target/release/hetccl-perf"
[ -x "$PERF" ] || PERF="$root/dist/bin/hetccl-perf"
WORK="$root/bench-scripts/gpu_acceptance.py"

die_prereq() { echo "gpu-acceptance: cannot run: $*" >&2; exit 2; }

# ---- prerequisites (also the --check dry mode) ----
for f in "$LIB" "$NETLIB" "$WORK"; do
    [ -e "$f" ] || die_prereq "$f is missing (build with scripts/dist.sh and carry dist/)"
done
[ -x "$PERF" ] || die_prereq "no hetccl-perf in target/release or dist/bin"
command -v "$PY" >/dev/null || die_prereq "$PY not found"
command -v nvidia-smi >/dev/null || die_prereq "nvidia-smi not found: no NVIDIA driver/GPU on this machine"
nvidia-smi -L >/dev/null 2>&1 || die_prereq "nvidia-smi -L failed: no usable GPU"
timeout 120 "$PY" -c 'import torch,sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null \
    || die_prereq "PyTorch is missing or sees no CUDA device"
command -v torchrun >/dev/null && RUN=(torchrun) || RUN=("$PY" -m torch.distributed.run)
NV_NCCL="${NVIDIA_NCCL_LIB:-$("$PY" - <<'PYEOF' 2>/dev/null
import importlib.util, os
s = importlib.util.find_spec("nvidia.nccl")
print(os.path.join(list(s.submodule_search_locations)[0], "lib", "libnccl.so.2") if s else "")
PYEOF
)}"
[ -n "$NV_NCCL" ] && [ -e "$NV_NCCL" ] || die_prereq "NVIDIA's libnccl.so.2 not found (pip nvidia-nccl-cu13, or set NVIDIA_NCCL_LIB)"
# NVRTC for hetccl's reduction kernels: PyTorch's CUDA wheels ship it under
# site-packages/nvidia; without it device reductions stage through host memory.
if [ -z "${HETCCL_NVRTC_LIB:-}" ]; then
    HETCCL_NVRTC_LIB="$("$PY" - <<'PYEOF' 2>/dev/null
import glob, os, site
roots = site.getsitepackages() + [site.getusersitepackages()]
hits = sorted(p for r in roots for p in glob.glob(os.path.join(r, "nvidia", "**", "libnvrtc.so.1[23]"), recursive=True))
print(hits[-1] if hits else "")
PYEOF
)"
fi
[ -n "$HETCCL_NVRTC_LIB" ] && export HETCCL_NVRTC_LIB
if [ "$check_only" = 1 ]; then
    echo "gpu-acceptance: prerequisites OK (hetccl: $LIB; NVIDIA NCCL: $NV_NCCL; NVRTC: ${HETCCL_NVRTC_LIB:-none}; $(nvidia-smi -L | head -1))"
    exit 0
fi

mkdir -p "$outdir"
results="$outdir/results.txt"
: >"$results"
fails=0
log() { echo "$*" | tee -a "$results"; }
budget=${GPU_ACCEPTANCE_BUDGET_S:-450}
step() { # step NAME SECONDS CMD... : runs with a timeout, logs to OUTDIR/NAME.log
    local name=$1 secs=$2; shift 2
    local t0=$SECONDS left=$((budget - SECONDS - 10))
    if [ "$left" -lt 10 ]; then
        log "FAIL $name (skipped: the ${budget}s budget is spent)"
        fails=$((fails + 1))
        return 1
    fi
    [ "$secs" -le "$left" ] || secs=$left
    timeout --kill-after=10 "$secs" "$@" >"$outdir/$name.log" 2>&1
    local rc=$?
    local verdict=PASS
    [ $rc -eq 0 ] || { verdict=FAIL; fails=$((fails + 1)); }
    [ $rc -eq 124 ] && verdict="FAIL (timeout ${secs}s)"
    log "$verdict $name rc=$rc $((SECONDS - t0))s"
    return $rc
}

# Loopback only; nothing leaves the machine.
export HETCCL_SOCKET_IFNAME=lo NCCL_SOCKET_IFNAME=lo HETCCL_TIMEOUT_S=120
export NCCL_MULTI_RANK_GPU_ENABLE=1 ACC_DEVICE=0 OMP_NUM_THREADS=1
log "# hetccl GPU acceptance $(date -u +%FT%TZ) on $(nvidia-smi -L | head -1)"
log "# hetccl: $LIB ($(nm -D "$LIB" 2>/dev/null | grep -c ' T nccl') nccl symbols); NVIDIA NCCL: $NV_NCCL"

# a) PyTorch on hetccl, 4 ranks on one GPU.
log "# NVRTC for the reduction kernels: ${HETCCL_NVRTC_LIB:-not found (reductions stage through host memory)}"
step a_torch_hetccl_4ranks 150 env LD_PRELOAD="$LIB" NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,COLL \
    "${RUN[@]}" --standalone --nproc_per_node 4 "$WORK" check --label hetccl --out "$outdir/a_check.json"
if grep -q "device buffers use the stream path" "$outdir/a_torch_hetccl_4ranks.log"; then
    log "PASS a_hetccl_served_device_buffers (hetccl's CUDA path logged)"
else
    log "FAIL a_hetccl_served_device_buffers (no hetccl CUDA log line: was LD_PRELOAD effective?)"
    fails=$((fails + 1))
fi

# Which way hetccl ran the calls: CUDA IPC or staged through host memory.
log "# a) paths: $(grep -c ': CUDA IPC$' "$outdir/a_torch_hetccl_4ranks.log") calls through CUDA IPC, $(grep -c ': staged through host memory$' "$outdir/a_torch_hetccl_4ranks.log") staged"
# How the reduction kernels loaded (CUBIN or PTX), or the WARN why not.
log "# a) kernels: $(grep -hoE 'GPU reduction kernels (loaded|could not be loaded|unavailable)[^;]*' "$outdir/a_torch_hetccl_4ranks.log" | sort -u | head -2 | tr '\n' ' ')"
cubin=$(grep -c 'GPU reduction kernels loaded on device [0-9]* as CUBIN sm_' "$outdir/a_torch_hetccl_4ranks.log")
if [ "$cubin" -ge 4 ]; then
    log "PASS a_kernels_loaded_as_cubin ($cubin ranks)"
else
    log "FAIL a_kernels_loaded_as_cubin ($cubin of 4 ranks logged a CUBIN load; see the kernels line above)"
    fails=$((fails + 1))
fi
log "# a) hetccl WARN lines: $(grep -c 'NCCL WARN' "$outdir/a_torch_hetccl_4ranks.log")"

# a2) allocations while a stream waits for late peers, through hetccl and,
# to show the workload itself is sound, through NVIDIA's NCCL.
for lib in hetccl nvidia; do
    [ "$lib" = hetccl ] && pre="$LIB" || pre="$NV_NCCL"
    step "a2_alloc_while_waiting_$lib" 60 env LD_PRELOAD="$pre" \
        "${RUN[@]}" --standalone --nproc_per_node 2 "$WORK" alloc --label "$lib" --out "$outdir/a2_alloc_$lib.json"
done

# b) performance.
for n in 2 4; do
    step "b_perf_hetccl_${n}ranks" 40 "$PERF" all_reduce -np "$n" -b 8 -e 16M -f 8 -n 20 -w 5 \
        --alloc device --lib "$LIB"
    step "b_perf_nvidia_${n}ranks" 40 "$PERF" all_reduce -np "$n" -b 8 -e 16M -f 8 -n 20 -w 5 \
        --alloc device --lib "$NV_NCCL"
done
for n in 2 4; do
    step "b_torch_bench_hetccl_${n}ranks" 40 env LD_PRELOAD="$LIB" \
        "${RUN[@]}" --standalone --nproc_per_node "$n" "$WORK" bench --label hetccl --out "$outdir/b_bench_hetccl_$n.json"
    step "b_torch_bench_nvidia_${n}ranks" 40 env LD_PRELOAD="$NV_NCCL" \
        "${RUN[@]}" --standalone --nproc_per_node "$n" "$WORK" bench --label nvidia --out "$outdir/b_bench_nvidia_$n.json"
done

# c) NVIDIA's NCCL over hetccl's net plugin. The plugin is found by name
# (NCCL_NET_PLUGIN=hetccl -> libnccl-net-hetccl.so) in a directory holding
# only that link, so that dist/lib's libnccl.so.2 cannot shadow NVIDIA's.
plugdir="$outdir/netplugin"
mkdir -p "$plugdir"
ln -sf "$NETLIB" "$plugdir/libnccl-net-hetccl.so"
step c_nvidia_with_nccl_net_plugin 90 env NCCL_NET_PLUGIN=hetccl LD_LIBRARY_PATH="$plugdir:${LD_LIBRARY_PATH:-}" \
    LD_PRELOAD="$NV_NCCL" NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET \
    "${RUN[@]}" --standalone --nproc_per_node 2 "$WORK" smoke --label nvidia+nccl-net-plugin --out "$outdir/c_smoke.json"
if grep -Eiq "Using network hetccl|NET/hetccl|net plugin.*hetccl|Loaded net plugin hetccl" "$outdir/c_nvidia_with_nccl_net_plugin.log"; then
    log "PASS c_hetccl_net_in_use: $(grep -Eio 'Using network hetccl|Loaded net plugin hetccl[^ ]*' "$outdir/c_nvidia_with_nccl_net_plugin.log" | sort -u | tr '\n' ' ')"
else
    log "FAIL c_hetccl_net_in_use (NCCL's log does not show the hetccl net)"
    fails=$((fails + 1))
fi

log "# summary: $fails failed; logs and JSON in $outdir"
[ "$fails" -eq 0 ]
