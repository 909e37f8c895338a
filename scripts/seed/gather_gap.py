#!/usr/bin/env python3
"""Where the package's few-row gather loses 0.2-0.25 µs a launch against the
Rust bench (issue 30, item 3): the same gathers on the bench's own tensors,
timed by harnesses that differ from each other in one thing at a time.

    PYTHONPATH=SITE python3 scripts/seed/gather_gap.py probe --bin BIN     # first, in a fresh process
    PYTHONPATH=SITE python3 scripts/seed/gather_gap.py table --bin BIN [--rounds 3] [--json OUT]
    PYTHONPATH=SITE python3 scripts/seed/gather_gap.py table --bin BIN --dry-run   # CPU: plumbing only
    PYTHONPATH=SITE python3 scripts/seed/gather_gap.py isolate --bin BIN           # a process per suspect step
    PYTHONPATH=SITE python3 scripts/seed/gather_gap.py fresh --bin BIN [--n 1,16] [--layouts mxfp8]  # a process per gather

Inputs. `BIN capture --op gather_dequant --requests 0 [--written]` writes
the inputs the bench builds for its "gather L" (written cache) and "gather L,
random bytes" rows at T = N (seed 0xbe4c + N, 16-row blocks, 2N rows, I64
slots a random permutation), with the CPU reference's output; every variant
below gathers from those bytes and is checked against that output first.

Harnesses (columns), K launches captured in one graph, 7 timed replays after
one warm-up replay, the median per launch, best of --rounds interleaved
rounds; "m" columns are marginal launches ((100 t100 - 20 t20) / 80), where
any per-replay cost drops out:

- rust: `BIN bench --backend cuda --only gather --launches K`, the bench's
  own row on the same bytes (its own process, buffers from cuMemAllocAsync).
- drv: the bench's method exactly, driven through libcuda from Python: a
  new non-blocking stream, thread-local capture of K calls of the package,
  instantiate (flags 0), upload, warm-up replay, then replays back to back
  with an event recorded between consecutive ones (timing.rs replay_ms);
  torch's tensors. `drv/ma`: the same on copies in buffers from
  cuMemAllocAsync (the bench's allocation).
- tb2b: torch.cuda.graph capture (its pool, its side stream), replayed on
  torch's current stream back to back with events between (the Rust
  method on a torch graph); `tb2b/s`: replayed on a torch side stream.
- tiso: scripts/graph_timing.py before issue 30 (and gather_baseline.py's
  numbers in the issue): each replay alone between two events and waited
  for, so the host's submission of the replay falls inside its window.

So along a row: tiso - tb2b is the timing method, tb2b - drv torch's graph
and stream, drv - rust the process and the tensors' placement, drv/ma - drv
the allocation. K = 1 columns show the per-replay cost directly.

`probe` (run it first in its own process): graphs captured once and kept
(driver and torch) are re-timed after each thing a torch harness does
(side streams, eager launches, torch.cuda.graph captures with their
empty_cache, graph_us, a Triton launch), to find what, if anything, makes a
process's later timings slower than its first (docs/tuning.md, "Measuring
the reader").

`isolate` runs every suspect step of `probe` in a fresh process of its own
(plus a few the probe does not take): each child builds the bench's MXFP8
gather at N = 16 on the written cache, times driver graphs of 20 and 100
launches (timing.rs's method) before the step and after it, and again after
a fresh driver capture, so a step that slows the process's later launches
shows as after - before in its own row, with the "none" and "repeat" rows as
the noise and the drift of timing alone.

A table row also lists the graph's node types once (torch's capture and the
driver's), so an extra node (memset, event record) would show.
"""

import argparse
import ctypes
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "python", "tests"))

import torch  # noqa: E402

import dsv4_kvcache as kv  # noqa: E402
from cases import load_vectors  # noqa: E402
from graph_timing import capture, replay_times  # noqa: E402

try:  # only the probe's Triton step and gather_baseline.py's tensors need it
    import triton
    import triton.language as tl

    @triton.jit
    def _fill(x):
        tl.store(x + tl.arange(0, 64), tl.arange(0, 64))
except ImportError:
    triton = None

LAYOUTS = ["mxfp8", "nvfp4", "v4", "bf16", "fp8"]
REPLAYS = 7

# ---- libcuda through ctypes: the Rust bench's driver calls -------------------------

CU_STREAM_NON_BLOCKING = 1
CU_STREAM_CAPTURE_MODE_THREAD_LOCAL = 1
NODE_TYPES = {0: "kernel", 1: "memcpy", 2: "memset", 3: "host", 4: "graph", 5: "empty", 6: "wait_event",
              7: "event_record", 8: "ext_sem_signal", 9: "ext_sem_wait", 10: "mem_alloc", 11: "mem_free",
              12: "batch_mem_op", 13: "conditional"}


class Cu:
    """The driver calls timing.rs and cudarc make, by name from libcuda."""

    def __init__(self):
        self.lib = ctypes.CDLL("libcuda.so.1")
        vp, u64, pvp = ctypes.c_void_p, ctypes.c_uint64, ctypes.POINTER(ctypes.c_void_p)
        sig = {
            "cuGetErrorName": [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)],
            "cuCtxGetCurrent": [pvp],
            "cuStreamCreate": [pvp, ctypes.c_uint],
            "cuStreamDestroy_v2": [vp],
            "cuStreamSynchronize": [vp],
            "cuStreamBeginCapture_v2": [vp, ctypes.c_int],
            "cuStreamEndCapture": [vp, pvp],
            "cuGraphInstantiateWithFlags": [pvp, vp, ctypes.c_ulonglong],
            "cuGraphUpload": [vp, vp],
            "cuGraphLaunch": [vp, vp],
            "cuGraphExecDestroy": [vp],
            "cuGraphDestroy": [vp],
            "cuGraphGetNodes": [vp, pvp, ctypes.POINTER(ctypes.c_size_t)],
            "cuGraphNodeGetType": [vp, ctypes.POINTER(ctypes.c_int)],
            "cuEventCreate": [pvp, ctypes.c_uint],
            "cuEventRecord": [vp, vp],
            "cuEventDestroy_v2": [vp],
            "cuEventElapsedTime": [ctypes.POINTER(ctypes.c_float), vp, vp],
            "cuEventElapsedTime_v2": [ctypes.POINTER(ctypes.c_float), vp, vp],
            "cuMemAllocAsync": [ctypes.POINTER(u64), ctypes.c_size_t, vp],
            "cuMemFreeAsync": [u64, vp],
            "cuMemcpyDtoDAsync_v2": [u64, u64, ctypes.c_size_t, vp],
        }
        self.f = {}
        for name, args in sig.items():
            fn = getattr(self.lib, name, None)
            if fn is None:
                continue
            fn.argtypes, fn.restype = args, ctypes.c_int
            self.f[name] = fn
        self.elapsed = self.f.get("cuEventElapsedTime_v2") or self.f["cuEventElapsedTime"]

    def __call__(self, name, *args):
        r = (self.elapsed if name == "elapsed" else self.f[name])(*args)
        if r != 0:
            s = ctypes.c_char_p()
            self.f["cuGetErrorName"](r, ctypes.byref(s))
            raise RuntimeError(f"{name}: {s.value.decode() if s.value else r}")

    def new(self, name, *args):
        h = ctypes.c_void_p()
        self(name, ctypes.byref(h), *args)
        return h

    def node_types(self, graph):
        """The graph's nodes by type, e.g. {'kernel': 20}."""
        n = ctypes.c_size_t(0)
        self("cuGraphGetNodes", graph, None, ctypes.byref(n))
        nodes = (ctypes.c_void_p * n.value)()
        self("cuGraphGetNodes", graph, nodes, ctypes.byref(n))
        out = {}
        for h in nodes:
            t = ctypes.c_int()
            self("cuGraphNodeGetType", ctypes.c_void_p(h), ctypes.byref(t))
            k = NODE_TYPES.get(t.value, str(t.value))
            out[k] = out.get(k, 0) + 1
        return out


class DriverGraph:
    """K calls of fn captured as timing.rs does (its own non-blocking stream,
    thread-local capture, flags 0, upload), kept until close()."""

    def __init__(self, cu, fn, k, stream=None):
        self.cu, self.k = cu, k
        self.own_stream = stream is None
        self.stream = cu.new("cuStreamCreate", CU_STREAM_NON_BLOCKING) if stream is None else stream
        ext = torch.cuda.ExternalStream(self.stream.value)
        with torch.cuda.stream(ext):
            cu("cuStreamBeginCapture_v2", self.stream, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            try:
                for _ in range(k):
                    fn()
            finally:
                g = ctypes.c_void_p()
                cu("cuStreamEndCapture", self.stream, ctypes.byref(g))
        self.graph = g
        self.nodes = cu.node_types(g)
        self.exec = cu.new("cuGraphInstantiateWithFlags", g, 0)
        cu("cuGraphUpload", self.exec, self.stream)
        cu("cuStreamSynchronize", self.stream)

    def times(self, replays=REPLAYS):
        """timing.rs replay_ms: a warm-up replay, then events between
        back-to-back replays; µs per launch of each replay."""
        cu = self.cu
        ev = [cu.new("cuEventCreate", 0) for _ in range(replays + 1)]
        cu("cuGraphLaunch", self.exec, self.stream)
        for i, e in enumerate(ev):
            cu("cuEventRecord", e, self.stream)
            if i < replays:
                cu("cuGraphLaunch", self.exec, self.stream)
        cu("cuStreamSynchronize", self.stream)
        out = []
        for a, b in zip(ev, ev[1:]):
            ms = ctypes.c_float()
            cu("elapsed", ctypes.byref(ms), a, b)
            out.append(ms.value * 1000.0 / self.k)
        for e in ev:
            cu("cuEventDestroy_v2", e)
        return out

    def close(self):
        self.cu("cuStreamSynchronize", self.stream)
        self.cu("cuGraphExecDestroy", self.exec)
        self.cu("cuGraphDestroy", self.graph)
        if self.own_stream:
            self.cu("cuStreamDestroy_v2", self.stream)


class AsyncCopies:
    """Copies of torch tensors in buffers from cuMemAllocAsync (the default
    pool, as cudarc allocates the bench's buffers), as torch tensors."""

    def __init__(self, cu):
        self.cu, self.ptrs = cu, []
        self.stream = cu.new("cuStreamCreate", CU_STREAM_NON_BLOCKING)

    def copy(self, t):
        t = t.contiguous()
        n = t.numel() * t.element_size()
        p = ctypes.c_uint64()
        self.cu("cuMemAllocAsync", ctypes.byref(p), max(n, 1), self.stream)
        torch.cuda.synchronize()
        self.cu("cuMemcpyDtoDAsync_v2", p, ctypes.c_uint64(t.data_ptr()), n, self.stream)
        self.cu("cuStreamSynchronize", self.stream)
        self.ptrs.append(p)

        class Cai:
            __cuda_array_interface__ = {"shape": (n,), "typestr": "|u1", "data": (p.value, False), "version": 3,
                                        "strides": None, "stream": None}
        raw = torch.as_tensor(Cai(), device=t.device)
        return raw.view(t.dtype).reshape(t.shape)

    def close(self):
        for p in self.ptrs:
            self.cu("cuMemFreeAsync", p, self.stream)
        self.cu("cuStreamSynchronize", self.stream)
        self.cu("cuStreamDestroy_v2", self.stream)


# ---- torch's graphs -----------------------------------------------------------------

def torch_graph(fn, k, keep=False):
    """K calls of fn in a torch.cuda.graph (scripts/graph_timing.py's capture)."""
    return capture(fn, k, keep_graph=keep)


def torch_b2b(g, k, replays=REPLAYS, stream=None):
    """The Rust method on a torch graph (scripts/graph_timing.py): events
    between back-to-back replays on the current stream (or `stream`)."""
    if stream is None:
        return replay_times(g, k, replays)
    with torch.cuda.stream(stream):
        return replay_times(g, k, replays)


def torch_iso(g, k, replays=REPLAYS):
    """Each replay alone: event, replay, event, wait (graph_timing.py before
    issue 30, so the replay's host submission is inside the window)."""
    g.replay()
    torch.cuda.synchronize()
    out = []
    for _ in range(replays):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b) * 1000.0 / k)
    return out


def med(v):
    return statistics.median(v) if v else float("nan")


def marginal(t20, t100):
    return (100 * t100 - 20 * t20) / 80


# ---- inputs -----------------------------------------------------------------------

def capture_file(binary, tmp, op, layout, n, written):
    """The bench row's inputs (and the CPU reference's outputs) at T = N."""
    path = os.path.join(tmp, f"{op}_{layout}_{n}_{'w' if written else 'r'}.safetensors")
    if not os.path.exists(path):
        cmd = [binary, "capture", "--op", op, "--layout", layout, "--tokens", str(n), "--seed", str(0xBE4C + n),
               "--ring-capacity", "2", "--out", path]
        if op == "gather_dequant":
            cmd += ["--requests", "0"] + (["--written"] if written else [])
        else:
            cmd += ["--requests", "4"]
        subprocess.run(cmd, check=True, capture_output=True)
    return path


class Case:
    """One bench row's tensors on `dev`, the call, and its check."""

    def __init__(self, path, dev, op="gather_dequant"):
        meta, f = load_vectors(path)
        self.op, self.meta = op, meta
        self.t = {k[3:]: v.to(dev) for k, v in f.items() if k.startswith("in.")}
        self.written = "out" if op == "gather_dequant" else "kv_cache"
        self.want = f["out." + self.written]
        self.dev = dev

    def call_on(self, t):
        if self.op == "gather_dequant":
            return lambda: kv.gather_dequant(t["kv_cache"], t["out"], t["slot_mapping"], fp8_scale=t.get("fp8_scale"))
        cr = int(self.meta["compress_ratio"])
        return lambda: kv.rope_quant_insert(t["latent"], t["positions"], t["cos_sin"], t["kv_cache"],
                                            t["slot_mapping"], cr, fp8_scale=t.get("fp8_scale"), sanitize=False)

    def check(self, t):
        """Bytes of one call's output that differ from the CPU reference's
        (an insert writes into the file's canary cache, so it runs on a copy)."""
        if self.op == "gather_dequant":
            t["out"].zero_()
            dst = t
        else:
            dst = dict(t, kv_cache=t["kv_cache"].clone())
        self.call_on(dst)()
        got = dst[self.written].cpu().contiguous().view(torch.uint8)
        return int((got != self.want.contiguous().view(torch.uint8)).sum())


# ---- the Rust bench -----------------------------------------------------------------

def rust_rows(binary, ns, launches, dry, only="gather,insert mxfp8"):
    """{(label, N): µs} from one `bench` process."""
    if dry:
        return {}
    out = subprocess.run([binary, "bench", "--backend", "cuda", "--only", only, "--tokens",
                          ",".join(map(str, ns)), "--copy-mib", "64", "--launches", str(launches)],
                         check=True, capture_output=True, text=True).stdout
    rows = {}
    for line in out.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) > 2 and cells[0].startswith(("gather ", "insert ")) and cells[1].isdigit():
            rows[(cells[0], int(cells[1]))] = float(cells[2])
    return rows


def bench_label(layout, written):
    return f"gather {layout}" + ("" if written else ", random bytes")


# ---- the table ----------------------------------------------------------------------

COLS = ["rust", "rust m", "rust K1", "drv", "drv/ma", "drv m", "drv K1", "tb2b", "tb2b/s", "tiso", "tiso m", "tiso K1"]


def time_case(cu, case, t_torch, t_async, rounds):
    """Every harness on one case, `rounds` rounds, the order rotating; the
    best median of each."""
    fn = case.call_on(t_torch)
    fa = case.call_on(t_async) if t_async is not None else None
    side = torch.cuda.Stream()
    jobs = {
        ("drv", 20): lambda: _drv(cu, fn, 20), ("drv", 100): lambda: _drv(cu, fn, 100),
        ("drv", 1): lambda: _drv(cu, fn, 1),
        ("tb2b", 20): lambda: torch_b2b(torch_graph(fn, 20), 20),
        ("tb2b/s", 20): lambda: torch_b2b(torch_graph(fn, 20), 20, stream=side),
        ("tiso", 20): lambda: torch_iso(torch_graph(fn, 20), 20),
        ("tiso", 100): lambda: torch_iso(torch_graph(fn, 100), 100),
        ("tiso", 1): lambda: torch_iso(torch_graph(fn, 1), 1),
    }
    if fa is not None:
        jobs[("drv/ma", 20)] = lambda: _drv(cu, fa, 20)
    keys = list(jobs)
    best = {}
    for r in range(rounds):
        order = keys[r % len(keys):] + keys[:r % len(keys)]
        if r % 2:
            order.reverse()
        for key in order:
            best[key] = min(best.get(key, float("inf")), med(jobs[key]()))
    return best


def _drv(cu, fn, k):
    g = DriverGraph(cu, fn, k)
    try:
        return g.times()
    finally:
        g.close()


def node_report(cu, fn):
    """Node types of a 20-call graph: the driver capture's and torch's."""
    g = DriverGraph(cu, fn, 20)
    d = g.nodes
    g.close()
    try:
        tg = torch_graph(fn, 20, keep=True)
        t = cu.node_types(ctypes.c_void_p(tg.raw_cuda_graph()))
    except Exception as e:  # older torch: no keep_graph / raw_cuda_graph
        t = f"unavailable ({e!r})"
    return d, t


def table(a):
    dev = "cpu" if a.dry_run else "cuda"
    print("backend:", kv.init(dev), "| torch", torch.__version__,
          "|", torch.cuda.get_device_name() if dev == "cuda" else "CPU dry run (no timing)")
    ns = [int(x) for x in a.n.split(",")]
    layouts = a.layouts.split(",")
    tmp = tempfile.mkdtemp()
    rust = {}
    for k in (1, 20, 100):
        for _ in range(a.rounds if not a.dry_run else 1):
            for key, us in rust_rows(a.bin, ns, k, a.dry_run).items():
                rust[(key, k)] = min(rust.get((key, k), float("inf")), us)
    cu = None if a.dry_run else Cu()
    results = []
    nodes_done = False
    sections = [("gather_dequant", w, layouts)
                for w in ([True, False] if a.contents == "both" else [a.contents == "written"])]
    if a.insert_layouts:
        sections.append(("rope_quant_insert", True, a.insert_layouts.split(",")))
    for op, written, lays in sections:
        print()
        print("## " + {("gather_dequant", True): "gather, written cache (the bench's rows 'gather L')",
                       ("gather_dequant", False): "gather, random bytes ('gather L, random bytes')",
                       ("rope_quant_insert", True): "control: the insert ('insert L'), CR1"}[(op, written)])
        print("| layout | N | " + " | ".join(COLS) + " | diff |")
        print("| --- | ---: |" + " ---: |" * (len(COLS) + 1))
        for layout in lays:
            for n in ns:
                case = Case(capture_file(a.bin, tmp, op, layout, n, written), dev, op)
                t_async = None
                copies = None
                bad = case.check(case.t)
                if not a.dry_run:
                    copies = AsyncCopies(cu)
                    t_async = {k: copies.copy(v) for k, v in case.t.items()}
                    bad += case.check(t_async)
                    if not nodes_done:
                        d, t = node_report(cu, case.call_on(case.t))
                        print(f"graph nodes of 20 calls ({layout} N={n}): driver capture {d}, torch.cuda.graph {t}")
                        nodes_done = True
                    best = time_case(cu, case, case.t, t_async, a.rounds)
                else:
                    best = {}
                lab = bench_label(layout, written) if op == "gather_dequant" else f"insert {layout}"
                r20, r100 = rust.get(((lab, n), 20), float("nan")), rust.get(((lab, n), 100), float("nan"))
                nan = float("nan")
                row = {
                    "rust": r20, "rust m": marginal(r20, r100),
                    "rust K1": rust.get(((lab, n), 1), nan),
                    "drv": best.get(("drv", 20), nan), "drv/ma": best.get(("drv/ma", 20), nan),
                    "drv m": marginal(best.get(("drv", 20), nan), best.get(("drv", 100), nan)),
                    "drv K1": best.get(("drv", 1), nan),
                    "tb2b": best.get(("tb2b", 20), nan), "tb2b/s": best.get(("tb2b/s", 20), nan),
                    "tiso": best.get(("tiso", 20), nan),
                    "tiso m": marginal(best.get(("tiso", 20), nan), best.get(("tiso", 100), nan)),
                    "tiso K1": best.get(("tiso", 1), nan),
                }
                print(f"| {layout} | {n} | " + " | ".join(f"{row[c]:.2f}" for c in COLS) + f" | {bad} |", flush=True)
                results.append(dict(op=op, layout=layout, n=n, written=written, mismatches=bad, **row))
                if copies is not None:
                    del t_async
                    torch.cuda.synchronize()
                    copies.close()
    print()
    print("diff: output bytes differing from the CPU reference (torch tensors + cuMemAllocAsync copies); must be 0")
    print("attribution (µs a launch, K = 20): method = tiso - tb2b, torch graph/stream = tb2b - drv, "
          "process/tensors = drv - rust, allocation = drv/ma - drv")
    print("| case | layout | N | tiso - rust | method | torch graph | process/tensors | allocation |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in results:
        what = "insert" if r["op"] != "gather_dequant" else "written" if r["written"] else "random"
        print(f"| {what} | {r['layout']} | {r['n']} | {r['tiso'] - r['rust']:.2f} | "
              f"{r['tiso'] - r['tb2b']:.2f} | {r['tb2b'] - r['drv']:.2f} | {r['drv'] - r['rust']:.2f} | "
              f"{r['drv/ma'] - r['drv']:.2f} |")
    if not a.dry_run and a.baseline:
        baseline_tensors(cu, ns, a.rounds)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"torch": torch.__version__, "rows": results}, f, indent=1)
        print("wrote", a.json)
    bad = sum(r["mismatches"] for r in results)
    if bad:
        print(f"FAIL: {bad} output bytes differ from the CPU reference")
        sys.exit(1)


def baseline_tensors(cu, ns, rounds):
    """gather_baseline.py's tensors (64-row blocks, 2 max(N, 64) rows written
    by rope_quant_insert, torch.randperm slots): the issue's table's inputs,
    in the same harnesses, to tie its figures to the rows above."""
    sys.path.insert(0, HERE)
    from gather_baseline import make_cache  # noqa: E402  (imports triton)
    print()
    print("## gather_baseline.py's tensors (64-row blocks, written by the package), K = 20")
    print("| layout | N | drv | tb2b | tiso | tiso - drv |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for layout in ("mxfp8", "nvfp4"):
        for n in ns:
            rows = max(n, 64) * 2
            cache = make_cache(layout, rows, "cuda", True)
            slots = torch.randperm(rows, device="cuda")[:n].to(torch.int64)
            out = torch.empty(n, 512, dtype=torch.bfloat16, device="cuda")
            fn = lambda: kv.gather_dequant(cache, out, slots)  # noqa: E731
            fn()
            best = {}
            for r in range(rounds):
                for name in (["drv", "tb2b", "tiso"] if r % 2 == 0 else ["tiso", "tb2b", "drv"]):
                    if name == "drv":
                        v = med(_drv(cu, fn, 20))
                    elif name == "tb2b":
                        v = med(torch_b2b(torch_graph(fn, 20), 20))
                    else:
                        v = med(torch_iso(torch_graph(fn, 20), 20))
                    best[name] = min(best.get(name, float("inf")), v)
            print(f"| {layout} | {n} | {best['drv']:.2f} | {best['tb2b']:.2f} | {best['tiso']:.2f} | "
                  f"{best['tiso'] - best['drv']:.2f} |", flush=True)


# ---- the probe ----------------------------------------------------------------------

def probe(a):
    """Kept graphs re-timed after each step a torch harness takes."""
    print("backend:", kv.init("cuda"), "| torch", torch.__version__, "|", torch.cuda.get_device_name())
    tmp = tempfile.mkdtemp()
    cu = Cu()

    def graph_us(fn, k=20, replays=7):
        """gather_baseline.py's timer before issue 30: a fresh capture, lone replays."""
        return med(torch_iso(torch_graph(fn, k), k, replays))

    cases = {}
    for layout in a.probe_layouts.split(","):
        case = Case(capture_file(a.bin, tmp, "gather_dequant", layout, a.probe_n, True), "cuda")
        assert case.check(case.t) == 0, f"{layout}: output differs from the CPU reference"
        cases[layout] = dict(fn=case.call_on(case.t), keep=case)
    first = next(iter(cases.values()))["fn"]
    # The process's first timing, in the old torch harness (the claim under test:
    # a process's first timing runs at the bench's speed, later ones do not).
    print(f"first timing of the process (old torch harness, {next(iter(cases))}): {graph_us(first):.2f} µs; "
          f"second: {graph_us(first):.2f} µs")
    for c in cases.values():
        # Driver graphs before any torch graph is kept.
        c["d20"], c["d100"] = DriverGraph(cu, c["fn"], 20), DriverGraph(cu, c["fn"], 100)
    print("driver graphs before any kept torch graph: " + ", ".join(
        f"{l} {min(med(c['d20'].times()) for _ in range(3)):.2f} µs" for l, c in cases.items()))
    for c in cases.values():
        c["t20"] = torch_graph(c["fn"], 20)
    cols = []
    for layout in cases:
        cols += [f"{layout} drv", f"{layout} drv m", f"{layout} tg b2b", f"{layout} tg iso", f"{layout} new drv"]
    print(f"N = {a.probe_n}, written cache; kept graphs re-timed after each step; best median of 3 timings, "
          "µs a launch; 'new drv': a fresh driver capture at that point")
    print("| step | " + " | ".join(cols) + " |")
    print("| --- |" + " ---: |" * len(cols))
    s_keep = []
    t_keep = []

    def row(label):
        cells = []
        for c in cases.values():
            d20 = min(med(c["d20"].times()) for _ in range(3))
            d100 = min(med(c["d100"].times()) for _ in range(3))
            b2b = min(med(torch_b2b(c["t20"], 20)) for _ in range(3))
            iso = min(med(torch_iso(c["t20"], 20)) for _ in range(3))
            new = min(med(_drv(cu, c["fn"], 20)) for _ in range(2))
            cells += [d20, marginal(d20, d100), b2b, iso, new]
        print(f"| {label} | " + " | ".join(f"{x:.2f}" for x in cells) + " |", flush=True)

    def timed(k):
        return lambda: "graph_us " + ", ".join(f"{graph_us(first):.2f}" for _ in range(k))

    steps = [
        ("start", lambda: None),
        ("again (noise)", lambda: None),
        ("3 torch.cuda.Stream()", lambda: s_keep.extend(torch.cuda.Stream() for _ in range(3))),
        ("eager call on a side stream", lambda: _side_call(first)),
        ("1 torch.cuda.graph capture, dropped", lambda: torch_graph(first, 20).replay()),
        ("1 torch.cuda.graph capture, kept", lambda: t_keep.append(torch_graph(first, 20))),
        ("torch.cuda.empty_cache()", torch.cuda.empty_cache),
        ("graph_us x1", timed(1)),
        ("graph_us x3", timed(3)),
        ("a Triton launch", _triton_launch),
        ("graph_us x10", timed(10)),
        ("again (end)", lambda: None),
    ]
    for label, step in steps:
        try:
            said = step()
            torch.cuda.synchronize()
            if isinstance(said, str):
                label += f" ({said})"
        except Exception as e:  # a step that cannot run here is reported, the rest go on
            label += f" (failed: {e!r})"
        row(label)
    for c in cases.values():
        c["d20"].close()
        c["d100"].close()


def _side_call(fn):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)


def _triton_launch():
    x = torch.empty(64, dtype=torch.int32, device="cuda")
    _fill[(1,)](x)


# ---- isolate: one fresh process per suspect step -------------------------------------

def _trivial_torch_graph(keep):
    x = torch.zeros(64, device="cuda")
    g = torch.cuda.CUDAGraph(keep_graph=keep)
    with torch.cuda.graph(g):
        x.add_(1)
    g.replay()
    return g, x


def _driver_alloc(cu, nbytes):
    s = cu.new("cuStreamCreate", CU_STREAM_NON_BLOCKING)
    p = ctypes.c_uint64()
    cu("cuMemAllocAsync", ctypes.byref(p), nbytes, s)
    cu("cuStreamSynchronize", s)
    return p, s


ISOLATE_STEPS = {
    "none": "nothing (noise)",
    "repeat": "the driver graphs timed 30 more times (drift of timing alone)",
    "sleep": "3 s idle",
    "streams": "3 torch.cuda.Stream()",
    "eager": "one eager call of the package on a torch side stream",
    "torch_graph": "torch.cuda.graph of 20 package calls, kept (graph_timing.capture)",
    "torch_graph_dropped": "the same, dropped and collected",
    "torch_graph_replayed": "the same, kept and replayed 8 times",
    "trivial_graph": "torch.cuda.graph of one x.add_(1), kept",
    "trivial_graph_keep": "the same with keep_graph=True",
    "graph_pool": "torch.cuda.graph_pool_handle(), kept",
    "empty_cache": "torch.cuda.empty_cache()",
    "alloc_1g": "a 1 GiB torch tensor, kept",
    "alloc_16g": "a 16 GiB torch tensor, kept",
    "drv_alloc_16g": "16 GiB from cuMemAllocAsync, kept",
    "driver_graph": "a second driver graph of the same 20 calls, kept and replayed 8 times",
    "triton": "a Triton launch",
    "ops_all": "one call of every package op and layout (CR1/CR2 compress, inserts, fused, ring rows)",
    "graphs_50": "50 torch.cuda.graph captures of the package call, each dropped",
    "triton_10": "10 distinct Triton kernels compiled and launched",
    "seed_bench_1024": "seed_bench.py's ops at T = 1024 (--ours --tune-warps) each timed once",
    "graphs_10": "10 torch.cuda.graph captures of the package call, each dropped",
    "graphs_25": "25 torch.cuda.graph captures of the package call, each dropped",
    "graphs_50_kept": "50 torch.cuda.graph captures of the package call, all kept",
    "drv_graphs_50": "50 driver graphs of the package call (timing.rs's capture), each destroyed",
    "drv_graphs_50_one_stream": "the same, all captured on one stream",
    "streams_12": "12 torch.cuda.Stream(), kept",
    "drv_streams_50": "50 driver streams created and destroyed",
    "graphs_50_maxconn32": "graphs_50 in a process with CUDA_DEVICE_MAX_CONNECTIONS=32",
    "graphs_50_maxconn1": "graphs_50 in a process with CUDA_DEVICE_MAX_CONNECTIONS=1",
    "graphs_50_eager": "graphs_50 in a process with CUDA_MODULE_LOADING=EAGER",
}


def _ops_all():
    from cases import LAYOUTS as CASE_LAYOUTS, compress_case, fused_case, insert_case, ring_case

    def on_gpu(d):
        return {k: (v.cuda() if isinstance(v, torch.Tensor) else v) for k, v in d.items()}

    for cr in (1, 2):
        kv.fused_save_compress_norm(**on_gpu(compress_case(cr)))
        for layout in CASE_LAYOUTS:
            i = on_gpu(insert_case(layout, cr))
            kv.rope_quant_insert(**i)
            kv.fused_compress_insert(**on_gpu(fused_case(layout, cr)))
            out = torch.empty(4, 512, dtype=torch.bfloat16, device="cuda")
            kv.gather_dequant(i["kv_cache"], out, torch.arange(4, device="cuda"), fp8_scale=i.get("fp8_scale"))
    kv.save_ring_rows(**on_gpu(ring_case()))


def _triton_many(k):
    if triton is None:
        raise RuntimeError("no triton")

    @triton.jit
    def _scaled(x, C: tl.constexpr):
        tl.store(x + tl.arange(0, 64), tl.arange(0, 64) * C)

    x = torch.empty(64, dtype=torch.int32, device="cuda")
    for c in range(2, 2 + k):
        _scaled[(1,)](x, C=c)


def _seed_bench_ops(t):
    sys.path.insert(0, HERE)
    import seed_bench
    import seedlib

    seed_bench.KERNELS.update(seedlib.load_seed_kernels(os.environ.get("SEED_DOC", seedlib.DEFAULT_SEED_DOC))[0])

    for _label, (_kind, fn) in seed_bench.build_ops(t, torch.device("cuda"), True, True, True).items():
        seed_bench.time_graph(fn)


def isolate_one(a):
    """In this process: time, take one step, time again (JSON on stdout's last line)."""
    kv.init("cuda")
    cu = Cu()
    case = Case(a.case, "cuda")
    assert case.check(case.t) == 0, "output differs from the CPU reference"
    fn = case.call_on(case.t)
    d20, d100 = DriverGraph(cu, fn, 20), DriverGraph(cu, fn, 100)
    tri = None
    if triton is not None:
        x = torch.empty(64, dtype=torch.int32, device="cuda")
        _fill[(1,)](x)
        tri = DriverGraph(cu, lambda: _fill[(1,)](x), 20)

    def timing():
        t20 = min(med(d20.times()) for _ in range(3))
        t100 = min(med(d100.times()) for _ in range(3))
        tt = min(med(tri.times()) for _ in range(3)) if tri is not None else float("nan")
        return t20, marginal(t20, t100), tt

    before = timing()
    tg = torch_graph(fn, 20)
    torch_b2b_us = min(med(torch_b2b(tg, 20)) for _ in range(3))
    del tg
    keep = []
    step = a.step
    if step == "repeat":
        for _ in range(30):
            timing()
    elif step == "sleep":
        time.sleep(3)
    elif step == "streams":
        keep += [torch.cuda.Stream() for _ in range(3)]
    elif step == "eager":
        _side_call(fn)
    elif step in ("torch_graph", "torch_graph_dropped", "torch_graph_replayed"):
        g = torch_graph(fn, 20)
        if step == "torch_graph_replayed":
            for _ in range(8):
                g.replay()
        if step == "torch_graph_dropped":
            del g
            import gc
            gc.collect()
        else:
            keep.append(g)
    elif step in ("trivial_graph", "trivial_graph_keep"):
        keep.append(_trivial_torch_graph(step == "trivial_graph_keep"))
    elif step == "graph_pool":
        keep.append(torch.cuda.graph_pool_handle())
    elif step == "empty_cache":
        torch.cuda.empty_cache()
    elif step in ("alloc_1g", "alloc_16g"):
        keep.append(torch.empty((1 if step == "alloc_1g" else 16) << 30, dtype=torch.uint8, device="cuda"))
    elif step == "drv_alloc_16g":
        keep.append(_driver_alloc(cu, 16 << 30))
    elif step == "driver_graph":
        d = DriverGraph(cu, fn, 20)
        d.times(8)
        keep.append(d)
    elif step == "triton":
        _triton_launch()
    elif step == "ops_all":
        _ops_all()
    elif step == "drv_graphs_50_one_stream":
        one = cu.new("cuStreamCreate", CU_STREAM_NON_BLOCKING)
        for _ in range(50):
            DriverGraph(cu, fn, 20, stream=one).close()
    elif step == "streams_12":
        keep += [torch.cuda.Stream() for _ in range(12)]
    elif step == "drv_streams_50":
        for _ in range(50):
            cu("cuStreamDestroy_v2", cu.new("cuStreamCreate", CU_STREAM_NON_BLOCKING))
    elif step in ("graphs_10", "graphs_25", "graphs_50", "graphs_50_maxconn32", "graphs_50_maxconn1",
                  "graphs_50_eager"):
        for _ in range(int(step.split("_")[1])):
            torch_graph(fn, 20).replay()
    elif step == "graphs_50_kept":
        for _ in range(50):
            keep.append(torch_graph(fn, 20))
            keep[-1].replay()
    elif step == "drv_graphs_50":
        for _ in range(50):
            DriverGraph(cu, fn, 20).close()
    elif step == "triton_10":
        _triton_many(10)
    elif step == "seed_bench_1024":
        _seed_bench_ops(1024)
    elif step != "none":
        sys.exit(f"unknown step {step}")
    torch.cuda.synchronize()
    after = timing()
    fresh = DriverGraph(cu, fn, 20)
    new = min(med(fresh.times()) for _ in range(3))
    print(json.dumps(dict(step=step, before=before, after=after, new=new, torch_graph=torch_b2b_us)))


def isolate(a):
    """A child process per step; the table of before / after."""
    tmp = tempfile.mkdtemp()
    path = capture_file(a.bin, tmp, "gather_dequant", "mxfp8", a.probe_n, True)
    steps = a.steps.split(",") if a.steps else list(ISOLATE_STEPS)
    print(f"MXFP8 gather, N = {a.probe_n}, written cache; a fresh process per step; driver graphs (timing.rs's "
          "method), best median of 3 timings, µs a launch; m: marginal ((100 t100 - 20 t20) / 80); "
          "new: a driver capture made after the step")
    print("| step | before 20 | before m | after 20 | after m | new 20 | after - before (20) | Triton store, before / after |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    rows = []
    for rnd in range(a.rounds):
        for step in steps:
            cmd = [sys.executable, os.path.abspath(__file__), "isolate-one", "--bin", a.bin, "--case", path,
                   "--step", step]
            env = dict(os.environ)
            if "_maxconn" in step:
                env["CUDA_DEVICE_MAX_CONNECTIONS"] = step.rsplit("maxconn", 1)[1]
            if step.endswith("_eager"):
                env["CUDA_MODULE_LOADING"] = "EAGER"
            p = subprocess.run(cmd, capture_output=True, text=True, env=env)
            if p.returncode != 0:
                print(f"| {step} | failed: {p.stderr.strip().splitlines()[-1:]} |", flush=True)
                continue
            r = json.loads(p.stdout.strip().splitlines()[-1])
            rows.append(dict(r, round=rnd))
            b, af = r["before"], r["after"]
            print(f"| {step}: {ISOLATE_STEPS.get(step, step)} | {b[0]:.2f} | {b[1]:.2f} | {af[0]:.2f} | {af[1]:.2f} | "
                  f"{r['new']:.2f} | {af[0] - b[0]:+.2f} | {b[2]:.2f} / {af[2]:.2f} |", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)


def fresh(a):
    """Every (layout, N) gather timed in a process of its own, before it has
    made the ~10 graphs that slow a process's launches, beside the bench's
    row on the same inputs."""
    tmp = tempfile.mkdtemp()
    ns = [int(x) for x in a.n.split(",")]
    layouts = a.layouts.split(",")
    rust = {}
    for _ in range(a.rounds):
        for k, v in rust_rows(a.bin, ns, 20, False, only="gather").items():
            rust[k] = min(rust.get(k, v), v)
    print("written cache, µs a launch in 20-launch graphs (best of --rounds): the Rust bench's row; the package's "
          "call in a fresh process as a driver graph (timing.rs's method) and as a torch.cuda.graph replayed back "
          "to back")
    print("| layout | N | bench | package, driver graph | package, torch graph | package - bench |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    rows = []
    for layout in layouts:
        for n in ns:
            path = capture_file(a.bin, tmp, "gather_dequant", layout, n, True)
            best = None
            for _ in range(a.rounds):
                cmd = [sys.executable, os.path.abspath(__file__), "isolate-one", "--bin", a.bin, "--case", path]
                p = subprocess.run(cmd, capture_output=True, text=True)
                if p.returncode != 0:
                    print(f"| {layout} | {n} | failed: {p.stderr.strip().splitlines()[-1:]} |", flush=True)
                    break
                r = json.loads(p.stdout.strip().splitlines()[-1])
                cell = (r["before"][0], r["torch_graph"])
                best = cell if best is None else (min(best[0], cell[0]), min(best[1], cell[1]))
            if best is None:
                continue
            b = rust.get((bench_label(layout, True), n), float("nan"))
            rows.append(dict(layout=layout, n=n, bench=b, driver=best[0], torch=best[1]))
            print(f"| {layout} | {n} | {b:.2f} | {best[0]:.2f} | {best[1]:.2f} | {best[0] - b:+.2f} |", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=["table", "probe", "isolate", "isolate-one", "fresh"])
    ap.add_argument("--bin", required=True, help="the dsv4-kvcache binary (capture, bench)")
    ap.add_argument("--n", default="1,16,128,1024")
    ap.add_argument("--layouts", default=",".join(LAYOUTS))
    ap.add_argument("--contents", choices=["written", "random", "both"], default="both")
    ap.add_argument("--insert-layouts", default="mxfp8",
                    help="the control: inserts timed alike (empty: none)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--no-baseline", dest="baseline", action="store_false",
                    help="skip gather_baseline.py's tensors (they need triton)")
    ap.add_argument("--probe-n", type=int, default=16)
    ap.add_argument("--probe-layouts", default="mxfp8,nvfp4")
    ap.add_argument("--json", default=None)
    ap.add_argument("--steps", default="", help="isolate: the steps to run (default: all)")
    ap.add_argument("--case", default=None, help="isolate-one: the captured inputs")
    ap.add_argument("--step", default="none", help="isolate-one: the step")
    ap.add_argument("--dry-run", action="store_true",
                    help="CPU tensors: captures, loads and checks every case, times nothing")
    a = ap.parse_args()
    t0 = time.time()
    if a.what == "probe":
        if a.dry_run:
            sys.exit("probe needs a CUDA GPU")
        probe(a)
    elif a.what == "isolate":
        isolate(a)
    elif a.what == "fresh":
        fresh(a)
    elif a.what == "isolate-one":
        isolate_one(a)
        return
    else:
        table(a)
    print(f"gather_gap {a.what}: {time.time() - t0:.1f} s")


if __name__ == "__main__":
    main()
