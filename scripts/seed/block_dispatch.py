#!/usr/bin/env python3
"""What blocks that do nearly nothing cost a launch (docs/tuning.md, "Two-token
blocks"): a Triton kernel of G programs of four warps, each reading one index
and storing nothing (the index is even), timed in 20-launch CUDA graphs
replayed back to back, best of five, for grids of 20 to 4100 programs.

    python3 scripts/seed/block_dispatch.py
"""
import torch
import triton
import triton.language as tl

GRIDS = (20, 132, 264, 516, 1028, 1540, 2056, 4100)


@triton.jit
def _read_one_index(idx, out):
    pid = tl.program_id(0)
    x = tl.load(idx + pid)
    if x % 2 == 1:
        tl.store(out + pid, x)


def graph_us(fn, launches=20, replays=10, rounds=5):
    """µs a launch: `launches` calls captured in one graph, `replays` replays
    queued between two events, best of `rounds`."""
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        fn()
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(launches):
                fn()
    best = float("inf")
    for _ in range(rounds):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        graph.replay()
        start.record()
        for _ in range(replays):
            graph.replay()
        end.record()
        torch.cuda.synchronize()
        best = min(best, start.elapsed_time(end) * 1000 / (replays * launches))
    return best


def main():
    idx = torch.zeros(1 << 16, dtype=torch.int64, device="cuda")
    out = torch.zeros(1 << 16, dtype=torch.int64, device="cuda")
    for grid in GRIDS:
        us = graph_us(lambda: _read_one_index[(grid,)](idx, out, num_warps=4))
        print(f"{grid:5d} programs of 4 warps: {us:.3f} us a launch")


if __name__ == "__main__":
    main()
