"""A straightforward Triton gather (one program per output row, the seed's
insert style) for MXFP8 and NVFP4, written by this project from
docs/layouts.md: the reader's baseline in docs/benchmarks.md, tuned as a
user would tune it: its num_warps the best of 1, 2, 4 and 8 at every N.
Then ours (dsv4_kvcache.gather_dequant, CUDA graph of 20 launches timed as
the Rust bench times it, scripts/graph_timing.py; four rounds, ours and each
Triton width in turn, ours first in every other one, best of each) vs it at
N = 1, 16, 128, 1024, 8192, 65536 with a random slot permutation; ours is
checked against the CPU reference on the same tensors first.

Usage:
    python scripts/peers/gather_baseline.py [written|random ...]   # on the H200 (torch + triton)
    GATHER_BASELINE_N=1,16 python scripts/peers/gather_baseline.py written   # some sizes only
    GATHER_BASELINE_ROUNDS=8 python scripts/peers/gather_baseline.py        # more rounds (4)
    GATHER_BASELINE_WARPS=4 python scripts/peers/gather_baseline.py         # Triton widths tried (1,2,4,8)

Two caches: "written" (every row the record of a normally distributed
latent, written by dsv4_kvcache.rope_quant_insert: what a serving cache
holds) and "random" (random code bytes, scale bytes in 100..140: every
decoder path of ours, NaN codes included).

Timing baseline only: its scale is exp2(b - 127) (255 gives inf, not NaN),
which the random caches here avoid by drawing scale bytes in 100..140.
"""

import os
import sys

import torch
import triton
import triton.language as tl

import dsv4_kvcache as kv

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from graph_timing import graph_us  # noqa: E402


@triton.jit
def _slot_page(cache, slots, bs, page_bytes):
    """This program's output row i, its slot s, and the slot's row r and page
    in the cache (meaningful only where s >= 0)."""
    i = tl.program_id(0)
    s = tl.load(slots + i)
    return i, s, s % bs, cache + (s // bs) * page_bytes


@triton.jit
def _mxfp8_gather(cache, slots, out, bs, page_bytes):
    i, s, r, page = _slot_page(cache, slots, bs, page_bytes)
    if s >= 0:
        d = tl.arange(0, 512)
        codes = tl.load(page + r * 512 + d).to(tl.float8e4nv, bitcast=True).to(tl.float32)
        sb = tl.load(page + bs * 512 + r * 16 + d // 32).to(tl.float32)
        tl.store(out + i * 512 + d, (codes * tl.exp2(sb - 127.0)).to(tl.bfloat16))


@triton.jit
def _nvfp4_gather(cache, slots, out, bs, page_bytes):
    i, s, r, page = _slot_page(cache, slots, bs, page_bytes)
    if s >= 0:
        d = tl.arange(0, 512)
        byte = tl.load(page + r * 256 + d // 2).to(tl.int32)
        nib = tl.where(d % 2 == 0, byte & 15, byte >> 4)
        mag = nib & 7
        e = mag >> 1
        m = (mag & 1).to(tl.float32)
        v = tl.where(e == 0, 0.5 * m, (1.0 + 0.5 * m) * tl.exp2((e - 1).to(tl.float32)))
        v = tl.where(nib >= 8, -v, v)
        sc = tl.load(page + bs * 256 + r * 32 + d // 16).to(tl.float8e4nv, bitcast=True).to(tl.float32)
        tl.store(out + i * 512 + d, (v * sc).to(tl.bfloat16))


KERNELS = {"mxfp8": (_mxfp8_gather, 528, 512, 16), "nvfp4": (_nvfp4_gather, 288, 256, 32)}
BS = 64
# The bench's graph: 20 launches, here the median of 50 replays.
LAUNCHES, REPLAYS = 20, 50
ROUNDS = int(os.environ.get("GATHER_BASELINE_ROUNDS", "4"))
# The Triton gather's launch widths; its figure is the best of them.
WARPS = [int(w) for w in os.environ.get("GATHER_BASELINE_WARPS", "1,2,4,8").split(",")]


def write_records(c, rows, dev, fp8_scale=None):
    """Every one of cache c's rows the record of a normally distributed
    latent (rope_quant_insert, CR 1, a real RoPE table)."""
    g = torch.Generator(device=dev).manual_seed(rows)
    latent = torch.randn(rows, 512, device=dev, generator=g).to(torch.bfloat16)
    pos = torch.arange(rows, device=dev, dtype=torch.int64)
    theta = 10000.0 ** (-2.0 * torch.arange(32, dtype=torch.float64) / 64.0)
    ang = torch.arange(rows, dtype=torch.float64)[:, None] * theta[None, :]
    cos_sin = torch.cat([ang.cos(), ang.sin()], 1).to(torch.float32).to(dev)
    kv.rope_quant_insert(latent, pos, cos_sin, c, pos, 1, fp8_scale)


def make_cache(layout, rows, dev, written):
    w, v, sb = KERNELS[layout][1:]
    blocks = rows // BS
    c = torch.randint(0, 256, (blocks, BS, w), dtype=torch.uint8, device=dev)
    if written:
        write_records(c, rows, dev)
        return c
    flat = c.view(blocks, -1)
    if layout == "mxfp8":
        flat[:, BS * v:] = torch.randint(100, 141, (blocks, BS * sb), dtype=torch.uint8, device=dev)
    else:  # e4m3 tile scales without NaN codes
        flat[:, BS * v:] &= 0x77
    return c


def main():
    dev = "cuda"
    print("backend:", kv.init(dev))
    modes = sys.argv[1:] or ["written", "random"]
    for mode, layout in [(m, l) for m in modes for l in ["mxfp8", "nvfp4"]]:
        kern, w = KERNELS[layout][0], KERNELS[layout][1]
        sizes = os.environ.get("GATHER_BASELINE_N")
        for n in [int(x) for x in sizes.split(",")] if sizes else [1, 16, 128, 1024, 8192, 65536]:
            rows = max(n, BS) * 2
            rows += (-rows) % BS
            cache = make_cache(layout, rows, dev, mode == "written")
            slots = torch.randperm(rows, device=dev)[:n].to(torch.int64)
            ours = torch.empty(n, 512, dtype=torch.bfloat16, device=dev)
            base = torch.empty_like(ours)
            kv.gather_dequant(cache, ours, slots)
            ref = torch.empty(n, 512, dtype=torch.bfloat16)
            kv.gather_dequant(cache.cpu(), ref, slots.cpu())
            torch.cuda.synchronize()
            bad = int((ours.cpu().view(torch.int16) != ref.view(torch.int16)).sum())
            # ROUNDS rounds, ours and every Triton width in turn, ours first
            # in every other round, the best of each: nothing is timed only first.
            t_ours = float("inf")
            t_base = {nw: float("inf") for nw in WARPS}
            for r in range(ROUNDS):
                sides = [None] + WARPS if r % 2 == 0 else WARPS[::-1] + [None]
                for nw in sides:
                    if nw is None:
                        t_ours = min(t_ours, graph_us(lambda: kv.gather_dequant(cache, ours, slots), LAUNCHES,
                                                      REPLAYS))
                    else:
                        t_base[nw] = min(t_base[nw], graph_us(
                            lambda: kern[(n,)](cache, slots, base, BS, BS * w, num_warps=nw), LAUNCHES, REPLAYS))
            best_nw = min(t_base, key=t_base.get)
            t_best = t_base[best_nw]
            moved = n * (w + 8 + 1024)  # record + slot read, BF16 row written
            widths = ", ".join(f"{nw}: {t:.2f}" for nw, t in t_base.items())
            print(f"{mode} {layout} N={n:6d}: ours {t_ours:8.2f} us ({moved / t_ours / 1e3:7.1f} GB/s), "
                  f"triton {t_best:8.2f} us at num_warps {best_nw} ({moved / t_best / 1e3:7.1f} GB/s; {widths}), "
                  f"ours / triton {t_ours / t_best:.3f}, bytes {moved}, mismatches vs CPU {bad}", flush=True)


if __name__ == "__main__":
    main()
