"""GPU time per launch of a torch callable under CUDA-graph replay, as the
Rust bench measures it: `launches` calls captured in one graph (after a
warm-up call on a side stream), `replays` timed replays, the median replay
divided by `launches`, in µs. Shared by the scripts that time the package
beside the bench or the seed's Triton kernels."""

import torch


def graph_times(fn, launches=20, replays=7):
    """Every timed replay's µs per launch, in replay order."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(launches):
            fn()
    g.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(replays):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1000 / launches)
    return times


def graph_us(fn, launches=20, replays=7):
    """The median of graph_times (the upper middle one for an even count)."""
    times = sorted(graph_times(fn, launches, replays))
    return times[len(times) // 2]
