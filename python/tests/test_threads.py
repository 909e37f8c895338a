"""Many Python threads calling the library at once get the bytes of the
same calls made one after another: 8 threads, every function (the four
writers and gather_dequant), every layout, CR1 and CR2, sanitize on, off
and default, special values; each call on its own tensors. The skip counts
of all threads add up to those of the sequential run. On the CPU, and on
CUDA when torch sees a GPU."""

import random
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

import dsv4_kvcache as dk

from cases import LAYOUTS, WIDTH, canary, clone, compress_case, fused_case, gen, insert_case, ring_case

THREADS = 8
CALLS = 240

OUTS = {
    "rope_quant_insert": ["kv_cache"],
    "fused_save_compress_norm": ["latent_out", "state_cache"],
    "save_ring_rows": ["state_cache"],
    "fused_compress_insert": ["latent_out", "state_cache", "kv_cache"],
    "gather_dequant": ["out"],
}


def gather_case(layout, seed, out_dtype):
    g = gen(seed)
    dtype, w = WIDTH[layout]
    cache = canary((3, 16, w), dtype, g)  # random bytes: every code, NaNs included
    n = 20
    slots = torch.randint(-1, 3 * 16 + 4, (n,), generator=g)
    out = canary((n, 512), out_dtype, g)
    d = dict(kv_cache=cache, out=out, slot_mapping=slots)
    if layout == "fp8":
        d["fp8_scale"] = torch.tensor([0.5])
    return d


def calls(seed):
    """A fixed list of (function name, arguments) drawn from `seed`."""
    r = random.Random(seed)
    out = []
    for i in range(CALLS):
        name = r.choice(list(OUTS))
        layout, cr, adv = r.choice(LAYOUTS), r.choice([1, 2]), r.random() < 0.3
        s = seed * 10_000 + i
        if name == "rope_quant_insert":
            case = insert_case(layout, cr, t=r.randint(1, 40), seed=s, adversarial=adv)
        elif name == "fused_save_compress_norm":
            case = compress_case(cr, t=r.randint(4, 30), seed=s, adversarial=adv, prev=r.random() < 0.3)
        elif name == "save_ring_rows":
            case = ring_case(seed=s, adversarial=adv)
        elif name == "fused_compress_insert":
            case = fused_case(layout, cr, seed=s, adversarial=adv)
        else:
            case = gather_case(layout, s, r.choice([torch.bfloat16, torch.float32]))
        if name in ("rope_quant_insert", "fused_compress_insert"):
            case["sanitize"] = r.choice([True, False, None])
        out.append((name, case))
    return out


def on(device, case):
    return {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in case.items()}


def run(device, name, case):
    """Calls `name` on a copy of `case`; the outputs' bytes on the host."""
    c = on(device, clone(case))
    getattr(dk, name)(**c)
    return [c[o].cpu().contiguous().view(torch.uint8).clone() if c.get(o) is not None else None
            for o in OUTS[name]]


def check(device, own_streams=False):
    work = [calls(t) for t in range(THREADS)]
    dk.take_skip_counts(device)
    sequential = [[run(device, n, c) for n, c in w] for w in work]
    seq_skips = tuple(dk.take_skip_counts(device))
    def thread(w):
        if not own_streams:
            return [run(device, n, c) for n, c in w]
        with torch.cuda.stream(torch.cuda.Stream()):
            return [run(device, n, c) for n, c in w]

    with ThreadPoolExecutor(THREADS) as pool:
        futures = [pool.submit(thread, w) for w in work]
        threaded = [f.result() for f in futures]
    thr_skips = tuple(dk.take_skip_counts(device))
    for t in range(THREADS):
        for i, (a, b) in enumerate(zip(sequential[t], threaded[t])):
            for o, x, y in zip(OUTS[work[t][i][0]], a, b):
                assert (x is None) == (y is None)
                assert x is None or torch.equal(x, y), f"{device}: thread {t} call {i} ({work[t][i][0]}): {o} differs"
    assert seq_skips == thr_skips
    assert sum(seq_skips) > 0, "the adversarial calls skip tokens"


def test_threads_cpu():
    check("cpu")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU: torch.cuda.is_available() is False")
@pytest.mark.parametrize("own_streams", [False, True])
def test_threads_cuda(own_streams):
    dk.init("cuda")
    check("cuda", own_streams)
