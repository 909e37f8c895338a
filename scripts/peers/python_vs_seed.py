"""On a CUDA GPU: the Python package against the seed's
Triton kernels on the same torch tensors, graph capture, host cost and
GPU time per launch. Prints a compact report (and --out JSON).

The seed's two insert kernels are cut out of the seed document at run time
(seedlib, as the other seed scripts do); nothing of the seed is stored here.
The package comes from a wheel unpacked into --site (see the report's
command), or from the environment.

Usage:
    PYTHONPATH=SITE python3 scripts/peers/python_vs_seed.py --seed-doc seed.txt --site SITE [--calls N] [--out JSON]
"""

import argparse
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed-doc", default="../shared/seed/000_4510e2324b17d15c.txt")
    ap.add_argument("--site", default=os.path.join(ROOT, ".dev", "py", "site"))
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    if os.path.isdir(a.site):
        sys.path.insert(0, a.site)
    sys.path.insert(0, HERE)
    sys.path.insert(0, os.path.join(ROOT, "python", "tests"))
    import torch
    import dsv4_kvcache as dk
    import seedlib
    from cases import LAYOUTS, clone, compress_case, fused_case, insert_case, ring_case

    dev = torch.device("cuda", torch.cuda.current_device())
    print(f"# {torch.cuda.get_device_name(dev)}, torch {torch.__version__}, dsv4_kvcache {dk.__version__}, "
          f"backend {dk.init(dev)}")
    kernels, hashes = seedlib.load_seed_kernels(a.seed_doc)
    report = {"device": torch.cuda.get_device_name(dev), "torch": torch.__version__, "seed_sha256": hashes}
    fails = []

    def to(d, device):
        return {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in d.items()}

    def eq(x, y):
        return torch.equal(x.detach().cpu().contiguous().view(torch.uint8), y.detach().cpu().contiguous().view(torch.uint8))

    # 1. MXFP8 / NVFP4 inserts: ours vs the seed's Triton, same tensors.
    seed_rows = []
    for layout in ("mxfp8", "nvfp4"):
        k = kernels[seedlib.KERNEL_FOR_LAYOUT[layout]]
        for cr in (1, 2):
            for adv in (False, True):
                for san in (False, True):
                    # The seed reads cos_sin_cache through .to(float32): every
                    # table type (float32 at every size, the others at two).
                    runs = [(t, cs) for t in (1, 37, 640, 8192) for cs in (torch.float32, torch.bfloat16, torch.float16)
                            if cs == torch.float32 or t in (37, 640)]
                    for t, cs in runs:
                        c = insert_case(layout, cr, t=t, seed=t + cr, adversarial=adv, blocks=(t // 16) + 4, bs=64)
                        c["cos_sin_cache"] = c["cos_sin_cache"].to(cs)
                        cap = c["kv_cache"].shape[0] * 64
                        # The seed does not bound-check: keep indices in range for it.
                        c["slot_mapping"][c["slot_mapping"] >= cap] = -1
                        c["positions"] = c["positions"].clamp(max=c["cos_sin_cache"].shape[0] - 2)
                        g = to(c, dev)
                        ours, seed = clone_gpu(g), clone_gpu(g)
                        dk.rope_quant_insert(**ours, sanitize=san)
                        seedlib.launch_seed(k, seed["latent"], seed["positions"], seed["cos_sin_cache"],
                                            seed["kv_cache"], seed["slot_mapping"], cr, san)
                        torch.cuda.synchronize()
                        ok = eq(ours["kv_cache"], seed["kv_cache"])
                        seed_rows.append((layout, cr, adv, san, t, str(cs), ok))
                        if not ok:
                            nbad = int((ours["kv_cache"].view(torch.uint8) != seed["kv_cache"].view(torch.uint8)).sum())
                            fails.append(f"seed {layout} cr{cr} adv={adv} san={san} T={t} cos_sin {cs}: {nbad} bytes differ")
    print(f"seed Triton vs ours (MXFP8, NVFP4; CR1/2; random/adversarial; sanitize off/on; T=1,37,640,8192; "
          f"cos_sin float32, and bfloat16/float16 at T=37,640): {sum(r[-1] for r in seed_rows)}/{len(seed_rows)} identical")
    report["seed_parity"] = seed_rows

    # 2. Every op on the GPU against our CPU path (the reference).
    n_ok = n = 0
    for name, make in [
        ("rope_quant_insert", lambda s, adv: [insert_case(l, cr, seed=s, adversarial=adv) for l in LAYOUTS for cr in (1, 2)]),
        ("fused_save_compress_norm", lambda s, adv: [compress_case(cr, seed=s, adversarial=adv, prev=p) for cr in (1, 2) for p in (False, True)]),
        ("save_ring_rows", lambda s, adv: [ring_case(seed=s, adversarial=adv)]),
        ("fused_compress_insert", lambda s, adv: [fused_case(l, cr, seed=s, adversarial=adv) for l in LAYOUTS for cr in (1, 2)]),
    ]:
        for s in range(3):
            for adv in (False, True):
                for c in (v for c0 in make(s, adv) for v in input_type_variants(c0)):
                    cpu, gpu = clone(c), to(c, dev)
                    getattr(dk, name)(**cpu)
                    getattr(dk, name)(**gpu)
                    torch.cuda.synchronize()
                    for k2 in ("kv_cache", "latent_out", "state_cache"):
                        if isinstance(cpu.get(k2), torch.Tensor):
                            n += 1
                            if eq(cpu[k2], gpu[k2]):
                                n_ok += 1
                            else:
                                fails.append(f"{name} seed={s} adv={adv}: {k2} differs from the CPU")
    print(f"GPU vs CPU reference, all four ops (5 layouts, CR1/2, prev_rows, random/adversarial, weight/table types "
          f"bf16/f32, f32/f16, f16/bf16): {n_ok}/{n} outputs identical")
    report["gpu_vs_cpu"] = [n_ok, n]

    # 3. Graph capture and replay vs eager (compress CR2 through the ring, then insert).
    c = fused_case("nvfp4", 2, seed=5)
    g0 = to(c, dev)

    def step(x, op):
        op.fused_save_compress_norm(x["kv_score"], x["positions"], x["state_cache"], x["slot_mapping"],
                                    x["query_start_loc"], x["token_to_req_indices"], x["rms_norm_weight"],
                                    x["rms_norm_eps"], 2, x["latent_out"])
        op.rope_quant_insert(x["latent_out"], x["positions"], x["cos_sin_cache"], x["kv_cache"],
                             x["cache_slot_mapping"], 2)
        op.fused_compress_insert(**{k: v for k, v in x.items() if k != "kv2"} | {"kv_cache": x["kv2"]})

    g0["kv2"] = g0["kv_cache"].clone()
    graph_ok = True
    for op in (dk, dk.ops):
        eager, cap = clone_gpu(g0), clone_gpu(g0)
        step(eager, op)
        gr = torch.cuda.CUDAGraph()
        st = torch.cuda.Stream()
        st.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(st), torch.cuda.graph(gr):
            step(cap, op)
        gr.replay()
        torch.cuda.synchronize()
        for k2 in ("latent_out", "state_cache", "kv_cache", "kv2"):
            if not eq(eager[k2], cap[k2]):
                graph_ok = False
                fails.append(f"graph replay ({'ops' if op is dk.ops else 'plain'}): {k2} differs from eager")
    print(f"torch.cuda.graph capture + replay == eager (plain and torch.ops): {graph_ok}")
    report["graph"] = graph_ok

    # 4. Host cost of one eager call (many calls, no sync in between).
    def host_us(fn, calls=a.calls):
        fn()
        torch.cuda.synchronize()
        best = float("inf")
        for _ in range(5):
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            best = min(best, (time.perf_counter() - t0) / calls * 1e6)
            torch.cuda.synchronize()
        return best

    x = to(fused_case("mxfp8", 2, seed=1), dev)
    ic = to(insert_case("mxfp8", 1, t=1, blocks=4, bs=64), dev)
    ic_nv = to(insert_case("nvfp4", 1, t=1, blocks=4, bs=64), dev)
    ring = to(ring_case(n=1), dev)
    comp = {k: x[k] for k in ("kv_score", "positions", "state_cache", "slot_mapping", "query_start_loc",
                               "token_to_req_indices", "rms_norm_weight", "rms_norm_eps", "compress_ratio", "latent_out")}
    ins_kw = {k: ic[k] for k in ("latent", "positions", "cos_sin_cache", "kv_cache", "slot_mapping", "compress_ratio")}
    rows = []
    for name, args in [("rope_quant_insert", ins_kw), ("fused_save_compress_norm", comp),
                       ("save_ring_rows", ring), ("fused_compress_insert", x)]:
        plain = getattr(dk, name)
        op = getattr(torch.ops.dsv4_kvcache, name)
        rows.append((name, host_us(lambda: plain(**args)), host_us(lambda: op(**args))))
    seed_mx = host_us(lambda: seedlib.launch_seed(kernels["_rope_quant_insert_mxfp8_kernel"], ic["latent"], ic["positions"],
                                                  ic["cos_sin_cache"], ic["kv_cache"], ic["slot_mapping"], 1, False))
    seed_nv = host_us(lambda: seedlib.launch_seed(kernels["_rope_quant_insert_nvfp4_kernel"], ic_nv["latent"], ic_nv["positions"],
                                                  ic_nv["cos_sin_cache"], ic_nv["kv_cache"], ic_nv["slot_mapping"], 1, False))
    a1 = torch.zeros(1024, device=dev)
    add = host_us(lambda: torch.add(a1, a1, out=a1))
    raw = host_us(lambda: torch._C._cuda_getCurrentRawStream(dev.index))
    print("host cost per eager call (us, best of 5 x %d calls):" % a.calls)
    print("| op | plain | torch.ops | seed Triton |")
    print("| --- | ---: | ---: | ---: |")
    for name, p, o in rows:
        s = {"rope_quant_insert": f"{seed_mx:.1f} (MXFP8), {seed_nv:.1f} (NVFP4)"}.get(name, "-")
        print(f"| {name} | {p:.1f} | {o:.1f} | {s} |")
    print(f"| torch.add(out=) | {add:.1f} | | |\n| _cuda_getCurrentRawStream | {raw:.2f} | | |")
    report["host_us"] = {"rows": rows, "seed_mxfp8": seed_mx, "seed_nvfp4": seed_nv, "torch_add": add, "raw_stream": raw}

    # 5. GPU time per launch under graph replay.
    def graph_us(fn, per_graph=20, replays=50):
        fn()
        torch.cuda.synchronize()
        gr = torch.cuda.CUDAGraph()
        st = torch.cuda.Stream()
        st.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(st), torch.cuda.graph(gr):
            for _ in range(per_graph):
                fn()
        gr.replay()
        torch.cuda.synchronize()
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        for _ in range(replays):
            gr.replay()
        e1.record()
        torch.cuda.synchronize()
        return e0.elapsed_time(e1) * 1e3 / (per_graph * replays)

    print("GPU us per launch under graph replay (rope_quant_insert, CR1, all tokens valid):")
    print("| T | MXFP8 ours | MXFP8 seed | NVFP4 ours | NVFP4 seed |")
    print("| ---: | ---: | ---: | ---: | ---: |")
    gt = []
    for t in (1, 128, 1024, 8192, 65536):
        r = [t]
        for layout in ("mxfp8", "nvfp4"):
            c = to(insert_case(layout, 1, t=t, seed=3, blocks=t // 64 + 2, bs=64), dev)
            c["slot_mapping"] = torch.randperm(t, device=dev)
            c["positions"] = torch.randint(0, 40, (t,), device=dev)
            kw = {k: c[k] for k in ("latent", "positions", "cos_sin_cache", "kv_cache", "slot_mapping", "compress_ratio")}
            k = kernels[seedlib.KERNEL_FOR_LAYOUT[layout]]
            r.append(graph_us(lambda: dk.rope_quant_insert(**kw)))
            r.append(graph_us(lambda: seedlib.launch_seed(k, c["latent"], c["positions"], c["cos_sin_cache"],
                                                          c["kv_cache"], c["slot_mapping"], 1, False)))
        gt.append(r)
        print("| %d | %.2f | %.2f | %.2f | %.2f |" % tuple(r))
    report["graph_us"] = gt

    report["failures"] = fails
    print("FAILURES:" if fails else "all parity checks passed")
    for f in fails[:40]:
        print("  " + f)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(report, f, indent=1, default=str)
    return 1 if fails else 0


def input_type_variants(c):
    """The case as it is, and with other weight / table types the seed accepts
    (it reads both through .to(float32)): F32 weight (values bfloat16 cannot
    hold) with an F16 table, F16 weight with a BF16 table."""
    import torch

    yield c
    for w, cs in ((torch.float32, torch.float16), (torch.float16, torch.bfloat16)):
        v = dict(c)
        if "rms_norm_weight" in v:
            v["rms_norm_weight"] = (v["rms_norm_weight"].float() + 1e-3).to(w)
        if "cos_sin_cache" in v:
            v["cos_sin_cache"] = v["cos_sin_cache"].to(cs)
        if "rms_norm_weight" in v or "cos_sin_cache" in v:
            yield v


def clone_gpu(d):
    return {k: (v.clone() if hasattr(v, "clone") else v) for k, v in d.items()}


if __name__ == "__main__":
    sys.exit(main())
