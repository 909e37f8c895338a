"""dsv4_kvcache against vLLM's own Triton kernels, byte for byte, on one GPU.

Usage:

    python scripts/peers/vllm_kernels.py --vllm ../shared/seed/vllm \
        [--vllm-old ../shared/seed/vllm-d444c3d] [--out report.json]

vLLM's module files are imported at run time from the release tree given
(they are never copied into this repository), under a temporary package
``vllm`` whose other parts are small stand-ins: ``vllm.platforms`` (CUDA),
``vllm.triton_utils`` (triton itself) and, on GPUs without Blackwell's
``cvt.rn.satfinite.e2m1x2``, ``fused_indexer_q._fp32x2_to_fp4x2`` as a
software e2m1 with this library's definition (docs/numerics.md: nearest,
ties to the even code, saturating at 6, the sign from the sign bit, NaN to
code 0). Both sides run on the same CUDA tensors (python/tests/cases.py's
random and adversarial builders, with indices kept in range: vLLM's kernels
do not check them). Each function is called as vLLM calls it; ours gets the
record order vLLM's kernels write (0.34.0: 528 and 288 B per token, 584 B
page-planar) and vLLM's sanitize setting (``_ON_GFX950``, forced on and off).

Prints one line per case: MATCH, or the differing bytes with the first one;
for the compressor's BF16 latents and F32 ring rows the count of differing
elements and the largest distance in units in the last place. Exit status 1
when an insert or ring-row case differs (their arithmetic is exact on both
sides), else 0.
"""

import argparse
import json
import os
import sys
import tempfile

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python", "tests"))

from cases import compress_case, fused_case, insert_case, ring_case  # noqa: E402

OPS = "vllm/models/deepseek_v41/common/ops/fused_compress_quant_cache.py"

PLATFORM = """
class _Cuda:
    # is_cuda() False: vLLM then launches without the launch_pdl keyword
    # (it passes launch_pdl=False on CUDA), which older Triton lacks.
    def is_rocm(self):
        return False

    def is_cuda(self):
        return False


current_platform = _Cuda()
"""

TRITON_UTILS = "import triton\nimport triton.language as tl\n"

# The library's e2m1 (formats::e2m1_from_f32) in Triton, for GPUs whose PTX
# has no e2m1 conversion.
SOFT_E2M1 = '''
import triton
import triton.language as tl


@triton.jit
def _e2m1(x):
    a = tl.abs(x)
    c = tl.where(a <= 0.25, 0, tl.where(a < 0.75, 1, tl.where(a <= 1.25, 2, tl.where(
        a < 1.75, 3, tl.where(a <= 2.5, 4, tl.where(a < 3.5, 5, tl.where(a <= 5.0, 6, 7)))))))
    sign = (x.to(tl.uint32, bitcast=True) >> 28) & 8
    code = tl.where(x == x, c.to(tl.uint32) | sign, 0)
    return code


@triton.jit
def _fp32x2_to_fp4x2(x_lo, x_hi):
    return (_e2m1(x_lo) | (_e2m1(x_hi) << 4)).to(tl.uint8)
'''


def stand_in_tree(root, release):
    """A package ``vllm`` under ``root``: vLLM's ops module from ``release``
    (a symbolic link) beside the stand-ins."""
    for d in ("vllm/platforms", "vllm/models/deepseek_v4/common/ops",
              "vllm/models/deepseek_v41/common/ops"):
        os.makedirs(os.path.join(root, d), exist_ok=True)
    for d in ("vllm", "vllm/models", "vllm/models/deepseek_v4", "vllm/models/deepseek_v4/common",
              "vllm/models/deepseek_v4/common/ops", "vllm/models/deepseek_v41",
              "vllm/models/deepseek_v41/common", "vllm/models/deepseek_v41/common/ops"):
        open(os.path.join(root, d, "__init__.py"), "w").close()
    with open(os.path.join(root, "vllm/platforms/__init__.py"), "w") as f:
        f.write(PLATFORM)
    with open(os.path.join(root, "vllm/triton_utils.py"), "w") as f:
        f.write(TRITON_UTILS)
    with open(os.path.join(root, "vllm/models/deepseek_v4/common/ops/fused_indexer_q.py"), "w") as f:
        f.write(SOFT_E2M1)
    os.symlink(os.path.abspath(os.path.join(release, OPS)), os.path.join(root, OPS))


def load(release, tag):
    """vLLM's ops module of ``release``, as a fresh package ``vllm``."""
    for name in [n for n in sys.modules if n == "vllm" or n.startswith("vllm.")]:
        del sys.modules[name]
    root = tempfile.mkdtemp(prefix=f"vllm-{tag}-")
    stand_in_tree(root, release)
    sys.path.insert(0, root)
    try:
        import importlib

        return importlib.import_module("vllm.models.deepseek_v41.common.ops.fused_compress_quant_cache")
    finally:
        sys.path.remove(root)


def cuda(d):
    return {k: (v.cuda() if isinstance(v, torch.Tensor) else v) for k, v in d.items()}


def clone(d):
    return {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in d.items()}


def in_range_insert(c):
    """Out-of-range slots become -1 and positions stay inside the table
    (vLLM's kernels do not check them; the library's skip them)."""
    cache = c["kv_cache"]
    cap = cache.shape[0] * cache.shape[1]
    s = c["slot_mapping"].clone()
    s[s >= cap] = -1
    c["slot_mapping"] = s
    c["positions"] = c["positions"].clamp(0, c["cos_sin_cache"].shape[0] - 1)
    return c


def in_range_compress(c):
    if c.get("state_cache") is not None:
        cap = c["state_cache"].shape[0] * c["state_cache"].shape[1]
        s = c["slot_mapping"].clone()
        s[s >= cap] = -1
        c["slot_mapping"] = s
    return c


def first_diff(a, b):
    x, y = a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8)
    d = (x != y).nonzero()
    if d.numel() == 0:
        return None
    i = int(d[0])
    return {"bytes": int(d.numel()), "first": i, "vllm": int(x[i]), "ours": int(y[i])}


def ulp_report(a, b, bits):
    """Differing elements of two BF16 or F32 tensors and the largest
    distance between them in units in the last place (sign-magnitude
    order; NaN payloads count as differing)."""
    ia = a.reshape(-1).view(torch.int16 if bits == 16 else torch.int32).to(torch.int64)
    ib = b.reshape(-1).view(torch.int16 if bits == 16 else torch.int32).to(torch.int64)
    if bits == 16:
        ia, ib = ia & 0xFFFF, ib & 0xFFFF
    else:
        ia, ib = ia & 0xFFFFFFFF, ib & 0xFFFFFFFF
    sign = 1 << (bits - 1)

    def ordered(v):
        return torch.where(v & sign != 0, -(v & (sign - 1)), v)

    diff = ia != ib
    n = int(diff.sum())
    if n == 0:
        return {"elements": 0, "of": int(ia.numel())}
    dist = (ordered(ia) - ordered(ib)).abs()[diff]
    return {"elements": n, "of": int(ia.numel()), "max_ulp": int(dist.max())}


ORDER_OF = {584: "planar", 528: "per_token", 288: "per_token"}


def run_insert(mod, dk, layout, cr, adversarial, sanitize, seed):
    c = cuda(in_range_insert(insert_case(layout, cr, t=64, seed=seed, adversarial=adversarial,
                                         blocks=6, bs=16)))
    theirs, ours = clone(c), clone(c)
    mod._ON_GFX950 = sanitize
    err = None
    try:
        mod.rope_quant_insert(**theirs)
    except Exception as e:  # noqa: BLE001  (a layout this vLLM lacks)
        err = f"{type(e).__name__}: {e}"
    width = c["kv_cache"].shape[-1]
    kw = {"sanitize": sanitize}
    if c["kv_cache"].dtype == torch.uint8:
        kw["record_order"] = ORDER_OF[width]
    dk.rope_quant_insert(**ours, **kw)
    torch.cuda.synchronize()
    if err:
        return {"status": "not comparable", "why": err}
    d = first_diff(theirs["kv_cache"], ours["kv_cache"])
    return {"status": "MATCH" if d is None else "DIFF", "diff": d, "order": kw.get("record_order")}


def run_compress(mod, dk, cr, adversarial, prev, seed, params):
    c = cuda(in_range_compress(compress_case(cr, t=48, reqs=4, seed=seed, adversarial=adversarial,
                                             prev=prev)))
    if prev and "prev_rows" not in params:
        return {"status": "not comparable", "why": "this vLLM has no prev_rows"}
    theirs, ours = clone(c), clone(c)
    mod.fused_save_compress_norm(**theirs)
    dk.fused_save_compress_norm(**ours)
    torch.cuda.synchronize()
    out = {"latent_out": ulp_report(theirs["latent_out"], ours["latent_out"], 16)}
    if cr == 2:
        out["state_cache"] = ulp_report(theirs["state_cache"], ours["state_cache"], 32)
    same = all(v["elements"] == 0 for v in out.values())
    return {"status": "MATCH" if same else "DIFF", **out}


def run_ring(mod, dk, adversarial, seed):
    c = ring_case(seed=seed, adversarial=adversarial)
    cap = c["state_cache"].shape[0] * c["state_cache"].shape[1]
    c["slot_mapping"][c["slot_mapping"] >= cap] = -1
    c = cuda(c)
    theirs, ours = clone(c), clone(c)
    mod.save_ring_rows(**theirs)
    dk.save_ring_rows(**ours)
    torch.cuda.synchronize()
    d = first_diff(theirs["state_cache"], ours["state_cache"])
    return {"status": "MATCH" if d is None else "DIFF", "diff": d}


def compare(release, tag, dk):
    import inspect

    mod = load(release, tag)
    results = []
    names = [n for n in ("fused_save_compress_norm", "rope_quant_insert", "save_ring_rows") if hasattr(mod, n)]
    print(f"== vLLM {tag} ({release}): {', '.join(names)}")
    params = inspect.signature(mod.fused_save_compress_norm).parameters
    for layout in ("v4", "mxfp8", "nvfp4", "bf16", "fp8"):
        for cr in (1, 2):
            for adversarial in (False, True):
                for sanitize in (False, True):
                    for seed in range(2):
                        r = run_insert(mod, dk, layout, cr, adversarial, sanitize, 100 * seed + cr)
                        case = f"rope_quant_insert {layout} CR{cr} adversarial={adversarial} sanitize={sanitize} seed={seed}"
                        results.append({"vllm": tag, "case": case, **r})
    for cr, prev in ((1, False), (2, False), (2, True)):
        for adversarial in (False, True):
            for seed in range(3):
                r = run_compress(mod, dk, cr, adversarial, prev, 7 * seed + cr, params)
                case = f"fused_save_compress_norm CR{cr} prev_rows={prev} adversarial={adversarial} seed={seed}"
                results.append({"vllm": tag, "case": case, **r})
    if hasattr(mod, "save_ring_rows"):
        for adversarial in (False, True):
            r = run_ring(mod, dk, adversarial, 3)
            results.append({"vllm": tag, "case": f"save_ring_rows adversarial={adversarial}", **r})
    for r in results:
        extra = {k: v for k, v in r.items() if k not in ("vllm", "case", "status")}
        print(f"{r['status']:<15} {r['case']}  {json.dumps(extra) if r['status'] != 'MATCH' else ''}")
    return results


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vllm", required=True, help="vLLM 0.34.0's release tree (holds vllm/models/...)")
    ap.add_argument("--vllm-old", help="an older tree (commit d444c3d) to compare too")
    ap.add_argument("--out", help="write every case's result as JSON here")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("SKIPPED: no CUDA device (torch.cuda.is_available() is False)")
        return 0
    import dsv4_kvcache as dk
    import triton

    print(f"GPU {torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}, "
          f"dsv4_kvcache {dk.__version__}")
    results = compare(a.vllm, "0.34.0", dk)
    if a.vllm_old:
        results += compare(a.vllm_old, "d444c3d", dk)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(results, f, indent=1)
    exact = [r for r in results if r["status"] == "DIFF" and not r["case"].startswith("fused_save")]
    print(f"{sum(r['status'] == 'MATCH' for r in results)} match, "
          f"{sum(r['status'] == 'DIFF' for r in results)} differ "
          f"({len(exact)} of them inserts or ring rows), "
          f"{sum(r['status'] == 'not comparable' for r in results)} not comparable")
    return 1 if exact else 0


if __name__ == "__main__":
    sys.exit(main())
