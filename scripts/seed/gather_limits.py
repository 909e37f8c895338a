"""What bounds the reader on a CUDA GPU (issue 17): ours beside Triton
kernels that move the same bytes with no decoding, in one CUDA-graph
harness (scripts/graph_timing.py).

    python scripts/seed/gather_limits.py few     # N = 1..1024: marginal launch times
    python scripts/seed/gather_limits.py bulk    # read : write mixes, then N = 8192, 65536, against the copy

GATHER_LIMITS_N, GATHER_LIMITS_LAYOUTS and GATHER_LIMITS_BS (rows a cache
block, 64) choose the cases.

"few": for each N, the marginal time of one launch in a graph ((time of
HI launches - time of LO launches) / (HI - LO), where the graph's
per-replay cost drops out) of ours, the straightforward Triton gather of
scripts/seed/gather_baseline.py, a Triton kernel that only reads its slot
and writes the row ("touch": one dependent load, then the stores) and an
empty Triton kernel of the same grid (the launch floor).

"bulk": streaming kernels that read and write contiguous words in the
ratios 1 : 1 to 1 : 4 (and writes only), then ours, each as a fraction of
torch's device copy of 64 MiB in the same run: what the memory does with a
reader's mix of reads and writes (NVFP4 reads 296 bytes a row and writes
1024, V4 592 and 1024).
"""

import os
import sys

import torch
import triton
import triton.language as tl

import dsv4_kvcache as kv

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)
from graph_timing import graph_us  # noqa: E402
from gather_baseline import KERNELS, write_records  # noqa: E402

# Rows a cache block (the Triton comparison's; the Rust bench's caches
# have 16).
BS = int(os.environ.get("GATHER_LIMITS_BS", "64"))
# Layout: record bytes a row, value bytes, scale bytes (0: unpaged rows).
GEOMETRY = {"v4": (584, 576, 8), "mxfp8": (528, 512, 16), "nvfp4": (288, 256, 32), "bf16": (1024, 1024, 0),
            "fp8": (512, 512, 0)}


@triton.jit
def _empty(slots):
    pass


@triton.jit
def _touch(slots, out):
    i = tl.program_id(0)
    s = tl.load(slots + i)
    tl.store(out + i * 512 + tl.arange(0, 512), s.to(tl.bfloat16))


@triton.jit
def _stream(src, dst, RW: tl.constexpr, BLOCK: tl.constexpr, READ: tl.constexpr):
    # BLOCK words read (when READ) and RW * BLOCK words written, contiguous.
    i = tl.program_id(0)
    j = tl.arange(0, BLOCK)
    if READ:
        x = tl.load(src + i * BLOCK + j)
    else:
        x = j
    for k in tl.static_range(RW):
        tl.store(dst + (i * RW + k) * BLOCK + j, x + k)


def marginal_us(fn, lo=20, hi=80, replays=15):
    a, b = graph_us(fn, lo, replays), graph_us(fn, hi, replays)
    return (b * hi - a * lo) / (hi - lo), a


def written_cache(layout, rows, dev):
    """Every row the record of a normally distributed latent."""
    w = GEOMETRY[layout][0]
    dtype = {"bf16": torch.bfloat16, "fp8": torch.float8_e4m3fn}.get(layout, torch.uint8)
    elems = w if dtype == torch.uint8 else 512
    c = torch.zeros(rows // BS, BS, elems, dtype=dtype, device=dev)
    scale = torch.tensor([0.37], device=dev) if layout == "fp8" else None
    write_records(c, rows, dev, scale)
    return c, scale


def few(dev):
    print("| layout | N | ours | Triton gather | touch | empty | ours, 20 a graph | Triton, 20 a graph |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for layout in os.environ.get("GATHER_LIMITS_LAYOUTS", "mxfp8,nvfp4,v4,bf16,fp8").split(","):
        for n in [int(x) for x in os.environ.get("GATHER_LIMITS_N", "1,16,128,1024").split(",")]:
            rows = max(n, BS) * 2
            rows += (-rows) % BS
            cache, scale = written_cache(layout, rows, dev)
            slots = torch.randperm(rows, device=dev)[:n].to(torch.int64)
            out = torch.empty(n, 512, dtype=torch.bfloat16, device=dev)
            ours, ours20 = marginal_us(lambda: kv.gather_dequant(cache, out, slots, fp8_scale=scale))
            if layout in KERNELS:
                kern, w = KERNELS[layout][0], KERNELS[layout][1]
                tri, tri20 = marginal_us(lambda: kern[(n,)](cache, slots, out, BS, BS * w, num_warps=4))
            else:
                tri = tri20 = float("nan")
            touch, _ = marginal_us(lambda: _touch[(n,)](slots, out, num_warps=4))
            empty, _ = marginal_us(lambda: _empty[(n,)](slots, num_warps=4))
            print(f"| {layout} | {n} | {ours:.2f} | {tri:.2f} | {touch:.2f} | {empty:.2f} | {ours20:.2f} | {tri20:.2f} |")


def bulk(dev):
    src = torch.empty(64 << 20, dtype=torch.uint8, device=dev)
    dst = torch.empty_like(src)
    t_copy = graph_us(lambda: dst.copy_(src), 20, 7)
    roof = 2 * (64 << 20) / t_copy / 1e3
    print(f"torch copy of 64 MiB: {t_copy:.2f} us, {roof:.1f} GB/s (the roofline below)")
    print("| stream (read : write) | µs | GB/s | % |")
    print("| --- | ---: | ---: | ---: |")
    block = 1024
    for read, rw in [(1, 1), (1, 2), (1, 3), (1, 4), (0, 1)]:
        programs = (96 << 20) // ((read + rw) * block * 4)
        a = torch.empty(programs * block, dtype=torch.int32, device=dev)
        b = torch.empty(programs * block * rw, dtype=torch.int32, device=dev)
        t = graph_us(lambda: _stream[(programs,)](a, b, rw, block, read == 1, num_warps=4), 20, 7)
        moved = programs * block * 4 * (read + rw)
        print(f"| {read} : {rw} | {t:.2f} | {moved / t / 1e3:.1f} | {moved / t / 1e3 / roof * 100:.1f} |")
    print("| layout | N | ours µs | GB/s | % |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for layout in ["v4", "mxfp8", "nvfp4", "bf16", "fp8"]:
        w = GEOMETRY[layout][0]
        for n in [int(x) for x in os.environ.get("GATHER_LIMITS_N", "8192,65536").split(",")]:
            cache, scale = written_cache(layout, 2 * n, dev)
            slots = torch.randperm(2 * n, device=dev)[:n].to(torch.int64)
            out = torch.empty(n, 512, dtype=torch.bfloat16, device=dev)
            ours = graph_us(lambda: kv.gather_dequant(cache, out, slots, fp8_scale=scale), 20, 7)
            moved = n * (w + 8 + 1024)
            print(f"| {layout} | {n} | {ours:.2f} | {moved / ours / 1e3:.1f} | {moved / ours / 1e3 / roof * 100:.1f} |")


def main():
    dev = "cuda"
    print("backend:", kv.init(dev), "|", torch.cuda.get_device_name(), "| torch", torch.__version__,
          "| triton", triton.__version__)
    for m in sys.argv[1:] or ["few", "bulk"]:
        {"few": few, "bulk": bulk}[m](dev)


if __name__ == "__main__":
    main()
