"""GPU time per launch of a torch callable under CUDA-graph replay, as the
Rust bench measures it (src/backend/gpu/timing.rs, `replay_ms`): `launches`
calls captured in one graph (after a warm-up call on a side stream), one
warm-up replay, then `replays` replays queued back to back on the current
stream with an event recorded between consecutive ones; each replay's time
divided by `launches`, in µs. Shared by the scripts that time the package
beside the bench or the seed's Triton kernels.

Usage: a module, not run by itself; `from graph_timing import graph_us`
after putting scripts/ on sys.path (scripts/peers/gather_baseline.py does).

Queued replays keep the host's submission of a replay out of its window; a
replay timed alone (event, replay, event, wait) also counts the time the
device waits for the host to submit it, which the bench never sees
(scripts/seed/gather_gap.py of commit 0a6f0c3 measured both)."""

import torch


def capture(fn, launches=20, keep_graph=False):
    """`launches` calls of fn in a torch.cuda.graph, after a warm-up call on a
    side stream (`keep_graph`: keep the captured graph for inspection)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph(keep_graph=True) if keep_graph else torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(launches):
            fn()
    return g


def replay_times(g, launches, replays=7):
    """A warm-up replay of g, then `replays` replays back to back on the
    current stream, an event between consecutive ones; µs per launch of each."""
    events = [torch.cuda.Event(enable_timing=True) for _ in range(replays + 1)]
    g.replay()
    for i, e in enumerate(events):
        e.record()
        if i < replays:
            g.replay()
    torch.cuda.synchronize()
    return [a.elapsed_time(b) * 1000 / launches for a, b in zip(events, events[1:])]


def graph_times(fn, launches=20, replays=7):
    """Every timed replay's µs per launch, in replay order."""
    return replay_times(capture(fn, launches), launches, replays)


def graph_us(fn, launches=20, replays=7):
    """The median of graph_times (the upper middle one for an even count)."""
    times = sorted(graph_times(fn, launches, replays))
    return times[len(times) // 2]
