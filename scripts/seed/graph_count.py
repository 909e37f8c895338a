#!/usr/bin/env python3
"""Does a process's kernel-node cost grow with the graphs it has made, and
is torch needed for that? (issue 30, item 3; docs/tuning.md, "What slows a
process's launches: its graphs").

    python3 scripts/seed/graph_count.py [--rounds 2] [--graphs 50] [--json OUT]

No package and no Triton: each mode runs in a fresh Python process that
drives libcuda through ctypes alone. It loads a one-thread store kernel from
PTX text, captures 20 and 100 launches of it in graphs (timing.rs's method:
a non-blocking stream, thread-local capture, instantiate, upload, a warm-up
replay, then 7 replays back to back with events between them), times them,
instantiates --graphs more graphs of 20 launches (each launched once and
destroyed), and times the first graphs and a new one again. The modes differ
only in what the process did before its first graph:

- bare: nothing (the driver's primary context, as the Rust bench uses);
- torch_import: `import torch`, no CUDA call from torch;
- torch_init: `torch.cuda.init()` (torch's runtime on the same primary context);
- torch_alloc: `torch.cuda.init()` and a 64 MiB tensor on the device;
- drv_alloc, drv_alloc_1m: no torch, 64 MiB or 1 MiB from `cuMemAlloc`
  (what torch's caching allocator calls, through `cudaMalloc`);
- drv_alloc_async: no torch, 64 MiB from `cuMemAllocAsync` (the stream-ordered
  pool cudarc, hence the Rust bench, allocates from);
- drv_alloc_first: drv_alloc, but allocated before the kernel's own buffer,
  as the torch and cudart modes allocate;
- torch_sync: `torch.cuda.init()` and `torch.cuda.synchronize()`: torch's
  runtime makes the primary context, nothing is allocated;
- torch_alloc_freed: torch_alloc, then the tensor freed and the cache emptied;
- torch_alloc_nocache, torch_alloc_async: torch_alloc with
  PYTORCH_NO_CUDA_MEMORY_CACHING=1 or with the cudaMallocAsync backend;
- cudart_ctx, cudart_alloc: no torch, the CUDA runtime library torch ships
  (found on sys.path, not imported through torch) makes the context with
  `cudaFree(0)`, then for cudart_alloc takes 64 MiB with `cudaMalloc`.

With --addresses it also times the kernel, in one bare process, storing to
each of a list of offsets into one 64 MiB cuMemAlloc buffer: whether a
kernel node's cost depends on where its store lands.

Without a device (or libcuda) it prints why and exits 0.
"""
import argparse
import ctypes
import json
import os
import statistics
import subprocess
import sys

PTX = r"""
.version 7.8
.target sm_90
.address_size 64
.visible .entry kv_probe_store(.param .u64 p, .param .u32 v)
{
    .reg .b64 %rd<2>;
    .reg .b32 %r<2>;
    ld.param.u64 %rd0, [p];
    ld.param.u32 %r0, [v];
    cvta.to.global.u64 %rd1, %rd0;
    st.global.u32 [%rd1], %r0;
    ret;
}
"""
MODES = ("bare", "torch_import", "torch_init", "torch_alloc", "drv_alloc", "drv_alloc_1m", "drv_alloc_async",
         "torch_sync", "torch_alloc_freed", "torch_alloc_nocache", "torch_alloc_async", "cudart_ctx", "cudart_alloc", "drv_alloc_first")
# Environment a mode's process starts with, for the allocator's switches.
MODE_ENV = {
    "torch_alloc_nocache": {"PYTORCH_NO_CUDA_MEMORY_CACHING": "1"},
    "torch_alloc_async": {"PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync"},
}
REPLAYS = 7


class Cu:
    """libcuda by name; every call checked."""

    def __init__(self):
        self.lib = ctypes.CDLL("libcuda.so.1")

    def __call__(self, name, *args):
        r = getattr(self.lib, name)(*args)
        if r != 0:
            s = ctypes.c_char_p()
            self.lib.cuGetErrorName(r, ctypes.byref(s))
            raise RuntimeError(f"{name}: {s.value.decode() if s.value else r}")

    def new(self, name, *args):
        h = ctypes.c_void_p()
        self(name, ctypes.byref(h), *args)
        return h


class Probe:
    """The store kernel, its buffer and stream, on the primary context."""

    def __init__(self, cu, pre_alloc=0):
        self.cu = cu
        cu("cuInit", 0)
        dev = ctypes.c_int()
        cu("cuDeviceGet", ctypes.byref(dev), 0)
        ctx = cu.new("cuDevicePrimaryCtxRetain", dev)
        cu("cuCtxSetCurrent", ctx)
        if pre_alloc:
            self.pre = ctypes.c_uint64()
            cu("cuMemAlloc_v2", ctypes.byref(self.pre), ctypes.c_size_t(pre_alloc))
        mod = cu.new("cuModuleLoadData", ctypes.c_char_p(PTX.encode()))
        self.fn = cu.new("cuModuleGetFunction", mod, b"kv_probe_store")
        self.buf = ctypes.c_uint64()
        cu("cuMemAlloc_v2", ctypes.byref(self.buf), ctypes.c_size_t(256))
        self.stream = cu.new("cuStreamCreate", 1)  # CU_STREAM_NON_BLOCKING
        self.p = ctypes.c_uint64(self.buf.value)
        self.v = ctypes.c_uint32(7)
        self.args = (ctypes.c_void_p * 2)(ctypes.addressof(self.p), ctypes.addressof(self.v))

    def graph(self, k):
        """K launches captured and instantiated: (graph, exec)."""
        cu, s = self.cu, self.stream
        cu("cuStreamBeginCapture_v2", s, 1)  # CU_STREAM_CAPTURE_MODE_THREAD_LOCAL
        for _ in range(k):
            cu("cuLaunchKernel", self.fn, 1, 1, 1, 1, 1, 1, 0, s, self.args, None)
        g = ctypes.c_void_p()
        cu("cuStreamEndCapture", s, ctypes.byref(g))
        e = cu.new("cuGraphInstantiateWithFlags", g, ctypes.c_ulonglong(0))
        cu("cuGraphUpload", e, s)
        cu("cuStreamSynchronize", s)
        return g, e

    def close(self, ge):
        self.cu("cuGraphExecDestroy", ge[1])
        self.cu("cuGraphDestroy", ge[0])

    def time(self, ge, k):
        """Median µs a launch over REPLAYS back-to-back replays."""
        cu, s = self.cu, self.stream
        ev = [cu.new("cuEventCreate", 0) for _ in range(REPLAYS + 1)]
        cu("cuGraphLaunch", ge[1], s)
        for i, e in enumerate(ev):
            cu("cuEventRecord", e, s)
            if i < REPLAYS:
                cu("cuGraphLaunch", ge[1], s)
        cu("cuStreamSynchronize", s)
        out = []
        for a, b in zip(ev, ev[1:]):
            ms = ctypes.c_float()
            cu("cuEventElapsedTime", ctypes.byref(ms), a, b)
            out.append(ms.value * 1000.0 / k)
        for e in ev:
            cu("cuEventDestroy_v2", e)
        return statistics.median(out)


def cudart():
    """The CUDA runtime library of the nvidia wheels torch depends on, by path."""
    import glob
    for d in sys.path:
        for pat in ("nvidia/cuda_runtime/lib/libcudart.so*", "nvidia/cu*/lib/libcudart.so*", "torch/lib/libcudart*.so*"):
            found = sorted(glob.glob(os.path.join(d, pat)))
            if found:
                return ctypes.CDLL(found[-1])
    return ctypes.CDLL("libcudart.so")


def one(mode, graphs):
    keep = None
    if mode.startswith("torch"):
        import torch
        if mode != "torch_import":
            torch.cuda.init()
        if mode.startswith("torch_alloc"):
            keep = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
        if mode in ("torch_sync",) or mode.startswith("torch_alloc"):
            torch.cuda.synchronize()
        if mode == "torch_alloc_freed":
            keep = None
            torch.cuda.empty_cache()
            torch.cuda.synchronize()
    if mode.startswith("cudart"):
        rt = cudart()
        ptr = ctypes.c_void_p()
        for name, args in (("cudaFree", (None,)), ("cudaMalloc", (ctypes.byref(ptr), ctypes.c_size_t(64 << 20)))):
            if name == "cudaMalloc" and mode != "cudart_alloc":
                break
            r = getattr(rt, name)(*args)
            if r != 0:
                raise RuntimeError(f"{name}: error {r}")
    cu = Cu()
    p = Probe(cu, (64 << 20) if mode == "drv_alloc_first" else 0)
    if mode.startswith("drv_alloc") and mode != "drv_alloc_first":
        ptr = ctypes.c_uint64()
        size = ctypes.c_size_t((1 if mode == "drv_alloc_1m" else 64) << 20)
        if mode == "drv_alloc_async":
            cu("cuMemAllocAsync", ctypes.byref(ptr), size, p.stream)
        else:
            cu("cuMemAlloc_v2", ctypes.byref(ptr), size)
        cu("cuStreamSynchronize", p.stream)
    g20, g100 = p.graph(20), p.graph(100)

    def timing():
        t20 = min(p.time(g20, 20) for _ in range(3))
        t100 = min(p.time(g100, 100) for _ in range(3))
        return t20, (100 * t100 - 20 * t20) / 80

    before = timing()
    for _ in range(graphs):
        ge = p.graph(20)
        cu("cuGraphLaunch", ge[1], p.stream)
        cu("cuStreamSynchronize", p.stream)
        p.close(ge)
    after = timing()
    fresh = p.graph(20)
    new = min(p.time(fresh, 20) for _ in range(3))
    del keep
    return dict(mode=mode, graphs=graphs, before=before, after=after, new=new)


ADDRESS_OFFSETS = [0, 256, 4096, 65536, 1 << 20] + [k << 20 for k in range(2, 64, 3)]


def addresses():
    """µs a launch (graphs of 20, and marginal) for a store to each offset."""
    cu = Cu()
    p = Probe(cu)
    base = ctypes.c_uint64()
    cu("cuMemAlloc_v2", ctypes.byref(base), ctypes.c_size_t(64 << 20))
    rows = []
    for off in ADDRESS_OFFSETS:
        p.p.value = base.value + off
        g20, g100 = p.graph(20), p.graph(100)
        t20 = min(p.time(g20, 20) for _ in range(3))
        t100 = min(p.time(g100, 100) for _ in range(3))
        rows.append(dict(offset=off, address=p.p.value, t20=t20, marginal=(100 * t100 - 20 * t20) / 80))
        p.close(g20)
        p.close(g100)
    return dict(mode="addresses", rows=rows)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--one", choices=MODES + ("addresses",), help="(internal) run one mode in this process")
    ap.add_argument("--addresses", action="store_true", help="also time stores to offsets of one buffer")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--graphs", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--json")
    a = ap.parse_args()
    if a.one:
        print(json.dumps(addresses() if a.one == "addresses" else one(a.one, a.graphs)))
        return
    try:
        Cu()("cuInit", 0)
    except (OSError, RuntimeError) as e:
        print(f"SKIPPED: no CUDA device ({e})")
        return
    print(f"a one-thread store kernel, µs a launch in graphs of 20 (m: marginal, from graphs of 20 and 100), "
          f"before and after {a.graphs} more graphs; a fresh process per row")
    print("| mode | round | before 20 | before m | after 20 | after m | new 20 | after - before (20) |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    rows = []
    for rnd in range(a.rounds):
        for mode in a.modes.split(","):
            cmd = [sys.executable, os.path.abspath(__file__), "--one", mode, "--graphs", str(a.graphs)]
            r = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, **MODE_ENV.get(mode, {})))
            if r.returncode != 0:
                print(f"| {mode} | {rnd} | failed: {r.stderr.strip().splitlines()[-1:]} |", flush=True)
                continue
            d = json.loads(r.stdout.strip().splitlines()[-1])
            rows.append(dict(d, round=rnd))
            b, af = d["before"], d["after"]
            print(f"| {mode} | {rnd} | {b[0]:.3f} | {b[1]:.3f} | {af[0]:.3f} | {af[1]:.3f} | {d['new']:.3f} | "
                  f"{af[0] - b[0]:+.3f} |", flush=True)
    if a.addresses:
        print("\na store to an offset of one 64 MiB buffer, bare process: µs a launch in graphs of 20 (m: marginal)")
        print("| offset | address | 20 | m |")
        print("| ---: | ---: | ---: | ---: |")
        for rnd in range(a.rounds):
            cmd = [sys.executable, os.path.abspath(__file__), "--one", "addresses"]
            r = subprocess.run(cmd, capture_output=True, text=True)
            if r.returncode != 0:
                print(f"| failed: {r.stderr.strip().splitlines()[-1:]} |", flush=True)
                continue
            d = json.loads(r.stdout.strip().splitlines()[-1])
            for x in d["rows"]:
                print(f"| {x['offset']} | {x['address']:#x} | {x['t20']:.3f} | {x['marginal']:.3f} |", flush=True)
            rows.append(dict(d, round=rnd))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
