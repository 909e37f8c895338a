#!/usr/bin/env python3
"""Compile every kernel the seed scripts launch for sm_90 without a GPU, and
check what the compiler made of the parts semantics.md is precise about.

Usage:
    python3 scripts/peers/aot_check.py [--seed-doc PATH] [--ptx-dir DIR]

(no TRITON_INTERPRET; needs only the triton wheel, whose bundled ptxas turns
the PTX into a cubin, so a compile error on the GPU host shows up here first.)

Reports, for the seed's MXFP8 / NVFP4 kernels (extracted at run time):
- the RoPE: which products are fused (`fma.rn.f32`) and which stay `mul.f32`;
- the NaN-ignoring max / clamp instructions (`max.f32`, `min.xorsign.abs.f32`);
- the scale exponent: whether `tl.log2` became libdevice's `__nv_log2f`
  (a polynomial with the constants checked below) or `lg2.approx`; then, with
  that polynomial emulated bit-exactly in numpy, whether
  ceil(__nv_log2f(x)) equals ceil(correctly rounded log2(x)) near every power
  of two that the MXFP8 scale can reach and on random x.
"""

import argparse
import math
import os
import re
import sys
from fractions import Fraction

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
    sys.exit("run without TRITON_INTERPRET")

import numpy as np  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

import own_baselines as ob  # noqa: E402
import seedlib  # noqa: E402
import spec_ref  # noqa: E402

TARGET = GPUTarget("cuda", 90, 32)

# __nv_log2f as Triton 3.6 inlines it (seen in the PTX): x = 2^e * m with
# m in [sqrt(1/2), sqrt(2)), t = m - 1, polynomial in t by fma (ftz), then
# e + fma(t, 1/ln2, t*(t*p)).
LOG2_SPLIT = 0x3F3504F3
LOG2_COEFFS = [0x3DC6B27F, 0xBE2C7F30, 0x3E2FCF2A, 0xBE374E43, 0x3E520BF4, 0xBE763C8B,
               0x3E93BF99, 0xBEB8AA49, 0x3EF6384A, 0xBF38AA3B]
LOG2_INV_LN2 = 0x3FB8AA3B


def _h(bits):
    return np.array([bits], np.uint32).view(np.float32)[0]


def _fma(a, b, c):
    a = np.asarray(a, np.float32).astype(np.float64)
    b = np.asarray(b, np.float32).astype(np.float64)
    return spec_ref._fma_exact_prod_plus_f32(a * b, c)


def nv_log2f(x):
    """Bit-exact numpy emulation of the __nv_log2f sequence above (finite x > 0)."""
    x = np.asarray(x, np.float32).copy()
    sub = x < _h(0x00800000)
    off = np.where(sub, np.float32(-23), np.float32(0)).astype(np.float32)
    x = np.where(sub, (np.where(sub, x, 0).astype(np.float64) * 2.0 ** 23).astype(np.float32), x)
    bits = x.view(np.int32)
    ebits = (bits - np.int32(LOG2_SPLIT)) & np.int32(-8388608)
    m = (bits - ebits).view(np.float32)
    e = _fma(ebits.astype(np.float32), np.full_like(x, _h(0x34000000)), off)
    t = (m.astype(np.float64) - 1.0).astype(np.float32)
    p = _fma(np.full_like(x, _h(LOG2_COEFFS[0])), t, np.full_like(x, _h(LOG2_COEFFS[1])))
    for c in LOG2_COEFFS[2:]:
        p = _fma(p, t, np.full_like(x, _h(c)))
    tp = (t.astype(np.float64) * p).astype(np.float32)
    ttp = (t.astype(np.float64) * tp).astype(np.float32)
    r = _fma(t, np.full_like(x, _h(LOG2_INV_LN2)), ttp)
    return (e.astype(np.float64) + r).astype(np.float32)


def exact_ceil_log2(x):
    fx = Fraction(float(x))
    e = math.floor(math.log2(float(x)))
    while Fraction(2) ** e < fx:
        e += 1
    while Fraction(2) ** (e - 1) >= fx:
        e -= 1
    return e


def compile_one(fn, sig, constexprs, name, ptx_dir):
    k = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=constexprs), target=TARGET,
                       options={"num_warps": 4})
    ptx = k.asm["ptx"]
    if ptx_dir:
        with open(os.path.join(ptx_dir, name + ".ptx"), "w") as f:
            f.write(ptx)
    ops = {}
    for m in re.finditer(r"^\s*([a-z][a-z0-9]*(?:\.[a-z0-9]+)*)\s", ptx, re.M):
        ops[m.group(1)] = ops.get(m.group(1), 0) + 1
    print(f"ok   compiled {name} for sm_90 (cubin {len(k.asm['cubin'])} B)")
    return ptx, ops


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed-doc", default=seedlib.DEFAULT_SEED_DOC)
    ap.add_argument("--ptx-dir", default=None)
    args = ap.parse_args()
    if args.ptx_dir:
        os.makedirs(args.ptx_dir, exist_ok=True)
    kernels, _ = seedlib.load_seed_kernels(args.seed_doc)
    seed_sig = {"latent": "*bf16", "positions": "*i64", "cos_sin": "*fp32", "cache": "*u8",
                "cache_slots": "*i64", "COS_STRIDE": "constexpr", "CACHE_STRIDE": "constexpr",
                "CACHE_BLOCK": "constexpr", "COMPRESS_RATIO": "constexpr", "SANITIZE_CACHE_NANS": "constexpr"}
    ptxs = {}
    for layout, kname in seedlib.KERNEL_FOR_LAYOUT.items():
        for cr in (1, 2):
            for san in (False, True):
                w = seedlib.RECORD_WIDTH[layout]
                ptx, ops = compile_one(kernels[kname], seed_sig,
                                       {"COS_STRIDE": 64, "CACHE_STRIDE": 64 * w, "CACHE_BLOCK": 64,
                                        "COMPRESS_RATIO": cr, "SANITIZE_CACHE_NANS": san},
                                       f"seed_{layout}_cr{cr}_{'san' if san else 'nosan'}", args.ptx_dir)
                ptxs[(layout, cr, san)] = (ptx, ops)
    rows_sig = {"latent": "*bf16", "positions": "*i64", "cos_sin": "*fp32", "cache": "*bf16", "slots": "*i64",
                "fp8_scale": "constexpr", "COS_STRIDE": "constexpr", "CACHE_STRIDE": "constexpr",
                "ROW_STRIDE": "constexpr", "CACHE_BLOCK": "constexpr", "COMPRESS_RATIO": "constexpr",
                "STORE_FP8": "constexpr"}
    rows_c = {"COS_STRIDE": 64, "CACHE_STRIDE": 64 * 512, "ROW_STRIDE": 512, "CACHE_BLOCK": 64,
              "COMPRESS_RATIO": 1}
    compile_one(ob._own_rows_insert_kernel, rows_sig, dict(rows_c, STORE_FP8=False, fp8_scale=None),
                "own_rows_bf16", args.ptx_dir)
    compile_one(ob._own_rows_insert_kernel, dict(rows_sig, cache="*fp8e4nv", fp8_scale="*fp32"),
                dict(rows_c, STORE_FP8=True), "own_rows_fp8", args.ptx_dir)
    compile_one(ob._own_v4_insert_kernel,
                {"latent": "*bf16", "positions": "*i64", "cos_sin": "*fp32", "cache": "*u8", "slots": "*i64",
                 "COS_STRIDE": "constexpr", "CACHE_STRIDE": "constexpr", "CACHE_BLOCK": "constexpr",
                 "COMPRESS_RATIO": "constexpr"},
                {"COS_STRIDE": 64, "CACHE_STRIDE": 64 * 584, "CACHE_BLOCK": 64, "COMPRESS_RATIO": 1},
                "own_v4", args.ptx_dir)
    compile_one(ob._own_norm_cr1_kernel,
                {"kv_score": "*fp32", "slots": "*i64", "weight": "*bf16", "latent_out": "*bf16",
                 "EPS": "constexpr", "RAW_STRIDE": "constexpr"}, {"EPS": 1e-6, "RAW_STRIDE": 512},
                "own_norm_cr1", args.ptx_dir)

    print()
    for (layout, cr, san), (ptx, ops) in ptxs.items():
        if cr != 1 or san:
            continue
        keys = ["fma.rn.f32", "mul.f32", "max.f32", "min.f32", "min.xorsign.abs.f32", "div.rn.f32",
                "div.full.f32", "lg2.approx.f32", "lg2.approx.ftz.f32", "ex2.approx.ftz.f32",
                "cvt.rn.satfinite.e4m3x2.f32", "cvt.rpi.ftz.f32.f32", "fma.rn.ftz.f32"]
        print(f"{layout}: " + ", ".join(f"{k} x{ops[k]}" for k in keys if k in ops))
    ptx = ptxs[("mxfp8", 1, False)][0]
    # RoPE: fma(e, c, -(o*s)) and fma(o, c, e*s)
    rope_fma = re.findall(r"neg\.f32\s+(%r\d+), (%r\d+);\s*\n\s*fma\.rn\.f32\s+%r\d+, %r\d+, %r\d+, \1;", ptx)
    print(f"mxfp8 RoPE: {len(rope_fma)} x `neg(mul) -> fma.rn.f32` (fma(e, c, -f32(o*s)) form)")
    lib = all(f"0f{c:08X}" in ptx for c in LOG2_COEFFS) and str(-LOG2_SPLIT) in ptx
    approx = "lg2.approx" in ptx
    print(f"mxfp8 log2: __nv_log2f polynomial found: {lib}; lg2.approx used: {approx}")

    # ceil(log2f) vs ceil(correctly rounded log2)
    xs = []
    for j in range(-23, 121):
        p = np.float32(2.0 ** j)
        xs.append(p)
        u = d = p
        for _ in range(64):
            u = np.nextafter(u, np.float32(np.inf))
            d = np.nextafter(d, np.float32(0))
            xs += [u, d]
    xs = np.array(xs, np.float32)
    a = nv_log2f(xs)
    b = np.log2(xs.astype(np.float64)).astype(np.float32)
    ex = np.array([exact_ceil_log2(v) for v in xs])
    print(f"near powers of two ({xs.size} x, 2^-23..2^120, +-64 ulps): ceil(__nv_log2f) != ceil(rn log2): "
          f"{int((np.ceil(a) != np.ceil(b)).sum())}; __nv_log2f != rn log2: {int((a != b).sum())}; "
          f"ceil(rn log2) != exact ceil: {int((np.ceil(b) != ex).sum())}")
    rng = np.random.default_rng(0)
    r = np.exp2(rng.uniform(-23, 120, 1_000_000)).astype(np.float32)
    a = nv_log2f(r)
    b = np.log2(r.astype(np.float64)).astype(np.float32)
    print(f"random x ({r.size}): ceil differs {int((np.ceil(a) != np.ceil(b)).sum())}; "
          f"value differs (1 ulp) {int((a != b).sum())}")
    bf = (np.arange(1, 0x7F80, dtype=np.uint32) << 16).view(np.float32)
    x = (np.maximum(bf, spec_ref.F32_1EM4).astype(np.float64) * np.float64(spec_ref.F32_1_448)).astype(np.float32)
    a = nv_log2f(x)
    b = np.log2(x.astype(np.float64)).astype(np.float32)
    print(f"every positive bf16 amax ({x.size}): ceil differs {int((np.ceil(a) != np.ceil(b)).sum())}; "
          f"value differs {int((a != b).sum())}")


if __name__ == "__main__":
    main()
