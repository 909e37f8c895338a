"""Host cost of one eager call of the Python package's functions: wall time
per call over many calls (no synchronization between them), best of several
rounds, at T = 1. Runs on the CPU (the CPU backend's own work at T = 1 is
included) or with --device cuda (launches only; the GPU runs behind).

Rows: each function called positionally and with keywords, its
torch.library operator, the positional call at T = 0 (every argument read
and validated, nothing computed or launched: the package's own cost), the reading of one tensor argument alone
(`_native._read_tensors`, which reads its arguments as every function does
and launches nothing), and two floors: an empty native call and
torch.add(out=) on a tiny tensor.

Usage:
    python scripts/python_host_cost.py [--device cuda] [--site SITE]

The package comes from --site (a wheel unpacked there) or the environment.
"""

import argparse
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu", help="cpu or cuda[:N]")
    ap.add_argument("--site", default=None, help="a folder with the unpacked wheel (else the environment's)")
    ap.add_argument("--calls", type=int, default=20000, help="calls per round")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--out", default=None, help="write the numbers as JSON here")
    a = ap.parse_args()
    if a.site:
        sys.path.insert(0, os.path.abspath(a.site))
    sys.path.insert(0, os.path.join(ROOT, "python", "tests"))
    import torch
    import dsv4_kvcache as dk
    from dsv4_kvcache import _native
    from cases import compress_case, insert_case, ring_case

    dev = torch.device(a.device)
    cuda = dev.type == "cuda"
    if cuda and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    name = torch.cuda.get_device_name(dev) if cuda else "CPU"
    print(f"# {name}, torch {torch.__version__}, Python {sys.version.split()[0]}, "
          f"dsv4_kvcache {dk.__version__}, backend {dk.init(dev)}")

    def to(d):
        return {k: (v.to(dev) if isinstance(v, torch.Tensor) else v) for k, v in d.items()}

    def per_call_us(fn):
        fn()
        sync()
        best = float("inf")
        for _ in range(a.rounds):
            t0 = time.perf_counter()
            for _ in range(a.calls):
                fn()
            best = min(best, (time.perf_counter() - t0) / a.calls * 1e6)
            sync()
        return best

    # T = 1 everywhere: one token, one request.
    ins = to(insert_case("mxfp8", 1, t=1, blocks=4, bs=64))
    ins.pop("fp8_scale")
    comp = to(compress_case(2, t=1, reqs=1))
    i2 = to(insert_case("mxfp8", 2, t=1, blocks=4, bs=64))
    fused = dict(comp, cos_sin_cache=i2["cos_sin_cache"], kv_cache=i2["kv_cache"],
                 cache_slot_mapping=i2["slot_mapping"])
    fused["positions"] = fused["positions"].clamp(max=40)
    ring = to(ring_case(n=1))
    orders = {
        "rope_quant_insert": ["latent", "positions", "cos_sin_cache", "kv_cache", "slot_mapping", "compress_ratio"],
        "fused_save_compress_norm": ["kv_score", "positions", "state_cache", "slot_mapping", "query_start_loc",
                                     "token_to_req_indices", "rms_norm_weight", "rms_norm_eps", "compress_ratio",
                                     "latent_out"],
        "save_ring_rows": ["rows", "slot_mapping", "state_cache"],
        "fused_compress_insert": ["kv_score", "positions", "state_cache", "slot_mapping", "query_start_loc",
                                  "token_to_req_indices", "rms_norm_weight", "rms_norm_eps", "compress_ratio",
                                  "latent_out", "cos_sin_cache", "kv_cache", "cache_slot_mapping"],
    }
    cases = {"rope_quant_insert": ins, "fused_save_compress_norm": comp, "save_ring_rows": ring,
             "fused_compress_insert": fused}

    # The same calls with no token: the per-token tensors cut to 0 rows.
    per_token = {"latent", "positions", "slot_mapping", "kv_score", "token_to_req_indices", "latent_out",
                 "cache_slot_mapping", "rows"}

    def empty(d):
        e = {k: (v[:0] if k in per_token else v) for k, v in d.items()}
        if isinstance(e.get("query_start_loc"), torch.Tensor):
            e["query_start_loc"] = torch.zeros_like(e["query_start_loc"])
        return e

    rows = []
    for op, order in orders.items():
        kw = {k: cases[op][k] for k in order}
        pos = [kw[k] for k in order]
        e = empty(kw)
        pos0 = [e[k] for k in order]
        plain = getattr(dk, op)
        reg = getattr(torch.ops.dsv4_kvcache, op)
        ntens = sum(isinstance(v, torch.Tensor) for v in pos)
        rows.append((op, ntens, per_call_us(lambda: plain(*pos)), per_call_us(lambda: plain(**kw)),
                     per_call_us(lambda: reg(*pos)), per_call_us(lambda: plain(*pos0))))

    extra = {}
    t1 = ins["latent"]
    if hasattr(_native, "_read_tensors"):
        ten = [t1] * 10
        r0 = per_call_us(lambda: _native._read_tensors())
        r10 = per_call_us(lambda: _native._read_tensors(*ten))
        extra["read_0_tensors"] = r0
        extra["read_one_tensor"] = (r10 - r0) / 10
        if getattr(_native, "_reads_by_exchange", lambda: False)():
            # The same through the attributes (torch without the exchange API).
            r10a = per_call_us(lambda: _native._read_tensors(*ten, exchange=False))
            extra["read_one_tensor_by_attributes"] = (r10a - r0) / 10
    extra["empty_native_call"] = per_call_us(_native._features)
    small = torch.zeros(16, device=dev)
    extra["torch_add_out"] = per_call_us(lambda: torch.add(small, small, out=small))
    if cuda:
        extra["raw_stream"] = per_call_us(lambda: torch._C._cuda_getCurrentRawStream(dev.index))

    print(f"host cost per eager call, us (best of {a.rounds} x {a.calls} calls, T = 1, {dev}):")
    print("| op | tensors | plain, positional | plain, keywords | torch.ops | plain, T = 0 |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for op, n, p, k, o, z in rows:
        print(f"| {op} | {n} | {p:.2f} | {k:.2f} | {o:.2f} | {z:.2f} |")
    for k, v in extra.items():
        print(f"| {k} | | {v:.2f} | | | |")
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"device": name, "torch": torch.__version__, "rows": rows, "extra": extra}, f, indent=1)


if __name__ == "__main__":
    main()
