#!/usr/bin/env python3
"""GPU acceptance workload for hetccl, run by bench-scripts/gpu-acceptance.sh
under `torchrun --nproc_per_node N`. It is an ordinary PyTorch program: it
does not know whether NVIDIA's NCCL or hetccl (LD_PRELOAD) serves it.

Modes:
  check  every collective the issue lists, on CUDA tensors, in float32,
         bfloat16 and float16, with small integer values so that results are
         exact; any mismatch is an error.
  bench  all_reduce float32 timing over sizes (CUDA events, after warm-up);
         rank 0 prints one JSON line per size.
  smoke  one all_reduce (for the net-plugin run).
  alloc  rank 0 calls all_reduce, then allocates device memory
         (cudaMalloc) and pinned host memory (cudaHostAlloc) while its
         peers, 1 s late, have yet to call: the call must still finish.
         CUDA's programming guide says such allocations keep commands
         issued before and after them on different streams from running
         concurrently; if the driver does so, work the library issues
         after the allocation can wait behind the waiting stream forever
         (the step then times out).

All ranks use one GPU (ACC_DEVICE, default 0). Rank 0 writes a JSON summary
to --out. Exit status 0 only if every check passed.
"""
import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
SIZES = [1, 7, 4096, 1 << 20]


def check(rank, world, dev):
    results = []

    def record(name, dt, n, ok, detail=""):
        results.append({"op": name, "dtype": dt, "count": n, "ok": bool(ok), "detail": detail})
        if not ok:
            print(f"[rank {rank}] FAIL {name} {dt} n={n} {detail}", flush=True)

    for dname, dt in DTYPES.items():
        for n in SIZES:
            full = lambda v, m=n: torch.full((m,), float(v), dtype=dt, device=dev)
            # all_reduce: sum of 1..world
            x = full(rank + 1)
            dist.all_reduce(x)
            exp = world * (world + 1) // 2
            record("all_reduce", dname, n, bool((x == exp).all()), f"got {x[:4].tolist()} want {exp}")
            # all_reduce MAX
            x = full(rank + 1)
            dist.all_reduce(x, op=dist.ReduceOp.MAX)
            record("all_reduce_max", dname, n, bool((x == world).all()), f"got {x[:4].tolist()}")
            # all_gather_into_tensor: block r holds r+1
            out = torch.zeros(n * world, dtype=dt, device=dev)
            dist.all_gather_into_tensor(out, full(rank + 1))
            want = torch.cat([full(r + 1) for r in range(world)])
            record("all_gather_into_tensor", dname, n, bool(torch.equal(out, want)))
            # reduce_scatter_tensor: block j of rank k's input is (k+1)*(j+1)
            inp = torch.cat([full((rank + 1) * (j + 1)) for j in range(world)])
            out = torch.zeros(n, dtype=dt, device=dev)
            dist.reduce_scatter_tensor(out, inp)
            exp = (rank + 1) * world * (world + 1) // 2
            record("reduce_scatter_tensor", dname, n, bool((out == exp).all()), f"got {out[:4].tolist()} want {exp}")
            # broadcast from the last rank
            root = world - 1
            x = full(root + 1) if rank == root else full(0)
            dist.broadcast(x, src=root)
            record("broadcast", dname, n, bool((x == root + 1).all()))
            # all_to_all_single: block j of rank r is r*world + j
            inp = torch.cat([full(rank * world + j) for j in range(world)])
            out = torch.zeros(n * world, dtype=dt, device=dev)
            dist.all_to_all_single(out, inp)
            want = torch.cat([full(j * world + rank) for j in range(world)])
            record("all_to_all_single", dname, n, bool(torch.equal(out, want)))
            # batched isend/irecv around a ring, both directions
            nxt, prv = (rank + 1) % world, (rank - 1) % world
            a, b = full(0), full(0)
            ops = [
                dist.P2POp(dist.isend, full(rank + 1), nxt),
                dist.P2POp(dist.irecv, a, prv),
                dist.P2POp(dist.isend, full(rank + 100), prv),
                dist.P2POp(dist.irecv, b, nxt),
            ]
            for req in dist.batch_isend_irecv(ops):
                req.wait()
            ok = bool((a == prv + 1).all()) and bool((b == nxt + 100).all())
            record("batch_isend_irecv", dname, n, ok, f"got {a[:2].tolist()} {b[:2].tolist()}")
    dist.barrier()
    torch.cuda.synchronize()
    record("barrier", "-", 0, True)
    # Stream semantics: the call returns before the work is done; work queued
    # behind it on the stream sees the result.
    x = torch.full((1 << 22,), 1.0, dtype=torch.float32, device=dev)
    t0 = time.perf_counter()
    dist.all_reduce(x)
    y = x * 2  # ordered after the collective on the current stream
    returned_s = time.perf_counter() - t0
    torch.cuda.synchronize()
    record("stream_order", "float32", 1 << 22, bool((y == 2 * world).all()), f"call returned after {returned_s*1e3:.2f} ms")
    return results


def alloc(rank, world, dev):
    results = []
    keep = []
    exp = world * (world + 1) // 2
    for i, what in enumerate(["device", "pinned", "both"]):
        dist.barrier()
        torch.cuda.synchronize()
        x = torch.full((1 << 20,), float(rank + 1), dtype=torch.float32, device=dev)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        if rank == 0:
            dist.all_reduce(x)  # returns at once; the stream waits for the peers
            # Sizes no cached block holds, so the allocators call CUDA.
            if what in ("device", "both"):
                keep.append(torch.empty((257 + 64 * i) << 20, dtype=torch.uint8, device=dev))
            if what in ("pinned", "both"):
                keep.append(torch.empty((33 + 8 * i) << 20, dtype=torch.uint8, pin_memory=True))
        else:
            time.sleep(1.0)
            dist.all_reduce(x)
        torch.cuda.synchronize()
        ok = bool((x == exp).all())
        results.append({"op": "all_reduce_then_" + what + "_alloc", "dtype": "float32", "count": 1 << 20,
                        "ok": ok, "detail": f"{time.perf_counter() - t0:.2f} s"})
        if not ok:
            print(f"[rank {rank}] FAIL alloc {what}: got {x[:4].tolist()} want {exp}", flush=True)
    return results


def bench(rank, world, dev, iters):
    rows = []
    size = 8
    while size <= (64 << 20):
        n = max(1, size // 4)
        x = torch.ones(n, dtype=torch.float32, device=dev)
        for _ in range(3):
            dist.all_reduce(x)
        torch.cuda.synchronize()
        dist.barrier()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            dist.all_reduce(x)
        end.record()
        torch.cuda.synchronize()
        us = start.elapsed_time(end) * 1e3 / iters
        algbw = (n * 4) / (us * 1e-6) / 1e9
        busbw = algbw * 2 * (world - 1) / world
        row = {"bytes": n * 4, "time_us": round(us, 2), "algbw_GBs": round(algbw, 3), "busbw_GBs": round(busbw, 3)}
        rows.append(row)
        if rank == 0:
            print(json.dumps(row), flush=True)
        size *= 8
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["check", "bench", "smoke", "alloc"])
    ap.add_argument("--out", required=True)
    ap.add_argument("--label", default="")
    ap.add_argument("--iters", type=int, default=20)
    args = ap.parse_args()
    dev = torch.device("cuda", int(os.environ.get("ACC_DEVICE", "0")))
    torch.cuda.set_device(dev)
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.mode == "check":
        res = check(rank, world, dev)
        ok = all(r["ok"] for r in res)
    elif args.mode == "alloc":
        res = alloc(rank, world, dev)
        ok = all(r["ok"] for r in res)
    elif args.mode == "bench":
        res = bench(rank, world, dev, args.iters)
        ok = True
    else:
        x = torch.full((1024,), float(rank + 1), device=dev)
        dist.all_reduce(x)
        torch.cuda.synchronize()
        ok = bool((x == world * (world + 1) // 2).all())
        res = [{"op": "all_reduce", "ok": ok}]
    oks = [None] * world
    dist.all_gather_object(oks, ok)
    if rank == 0:
        with open(args.out, "w") as f:
            json.dump({"label": args.label, "mode": args.mode, "world": world,
                       "torch": torch.__version__, "ok": all(oks), "results": res}, f, indent=1)
        print(f"{args.label} {args.mode}: {'PASS' if all(oks) else 'FAIL'} "
              f"({sum(1 for r in res if r.get('ok', True))}/{len(res)} on rank 0)", flush=True)
    dist.destroy_process_group()
    sys.exit(0 if all(oks) else 1)


if __name__ == "__main__":
    main()
