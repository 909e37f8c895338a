#!/usr/bin/env python3
"""CPU self-test of the seed scripts' own parts (no GPU needed).

Usage:
    TRITON_INTERPRET=1 python3 scripts/peers/selftest_cpu.py [--seed-doc PATH]

1. e2m1 (pure numpy): the compare chain used by the Triton helper against an
   independent nearest-value model, over every tie point, every code value,
   their f32 neighbours, +-0, +-inf, NaNs and random values; plus the expected
   codes at the ties written out by hand.
2. The Triton helper `_fp32x2_to_fp4x2` itself, run by Triton's interpreter.
3. Seed extraction: both kernels are found, parse, and compile under the
   interpreter.
4. Plumbing: the seed kernels under the interpreter, with the interpreter's
   float8/bf16 conversions replaced by exact ones (its own are approximate),
   compared byte for byte with spec_ref.py (RoPE without fma, as the
   interpreter computes it). Rows with NaN are expected to differ (numpy
   min/max propagate NaN where NVIDIA's ignore it) and are listed separately.
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

import seedlib  # noqa: E402
import spec_ref  # noqa: E402
from seedlib import _fp32x2_to_fp4x2  # noqa: E402

FAIL = []


def check(cond, msg):
    print(("ok   " if cond else "FAIL ") + msg)
    if not cond:
        FAIL.append(msg)


def e2m1_points():
    pts = [0.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
           7.0, 100.0, 3.4e38, 1e-45, 1e-38]
    out = []
    for p in pts:
        p = np.float32(p)
        out += [p, np.nextafter(p, np.float32(0)), np.nextafter(p, np.float32(np.inf))]
    out = np.array(out, np.float32)
    out = np.concatenate([out, -out, np.array([np.inf, -np.inf], np.float32)])
    nans = np.array([0x7FC00000, 0xFFC00000, 0x7F800001, 0xFFFFFFFF], np.uint32).view(np.float32)
    rng = np.random.default_rng(1)
    rnd = (rng.standard_normal(20000) * 3).astype(np.float32)
    return np.concatenate([out, nans, rnd])


def test_e2m1_numpy():
    x = e2m1_points()
    a = seedlib.e2m1_code_np(x)
    b = spec_ref.e2m1_code(x)
    check(np.array_equal(a, b), f"e2m1 compare chain == nearest-even model on {x.size} points")
    hand = {0.25: 0, 0.75: 2, 1.25: 2, 1.75: 4, 2.5: 4, 3.5: 6, 5.0: 6, 6.0: 7, 1e30: 7, 0.0: 0,
            0.5: 1, 1.0: 2, 1.5: 3, 2.0: 4, 3.0: 5, 4.0: 6}
    xs = np.array(list(hand), np.float32)
    want = np.array(list(hand.values()), np.uint8)
    check(np.array_equal(seedlib.e2m1_code_np(xs), want), "e2m1 ties go to the even code")
    check(np.array_equal(seedlib.e2m1_code_np(-xs), want | 8), "e2m1 sign bit for negatives (-0 -> 8)")
    specials = np.array([np.inf, -np.inf, np.nan, -np.nan], np.float32)
    check(list(seedlib.e2m1_code_np(specials)) == [7, 15, 0, 0], "e2m1 +-inf -> +-6, NaN -> 0")
    return x


@triton.jit
def _fp4_test_kernel(lo_ptr, hi_ptr, out_ptr, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = i < n
    lo = tl.load(lo_ptr + i, m, other=0.0)
    hi = tl.load(hi_ptr + i, m, other=0.0)
    tl.store(out_ptr + i, _fp32x2_to_fp4x2(lo, hi), m)


def test_e2m1_triton(x):
    import torch

    n = x.size
    lo = torch.from_numpy(x.copy())
    hi = torch.from_numpy(np.roll(x, 7).copy())
    out = torch.zeros(n, dtype=torch.uint8)
    _fp4_test_kernel[(triton.cdiv(n, 1024),)](lo, hi, out, n, BLOCK=1024)
    want = spec_ref.e2m1_code(lo.numpy()) | (spec_ref.e2m1_code(hi.numpy()) << 4)
    check(np.array_equal(out.numpy(), want), f"Triton _fp32x2_to_fp4x2 (interpreter) on {n} pairs")


def patch_interpreter_conversions():
    import triton.language as tl
    from triton.runtime import interpreter as it

    orig = it._convert_float

    def conv(data, src, dst, rounding_mode):
        if src == tl.bfloat16 and dst == tl.float32:
            return (np.asarray(data).view(np.uint16).astype(np.uint32) << 16).view(np.float32)
        if src == tl.float32 and dst == tl.bfloat16:
            return seedlib.bf16_bits_from_f32(np.asarray(data).view(np.float32))
        if src == tl.float32 and dst == tl.float8e4nv:
            v = np.asarray(data).view(np.float32)
            nan = np.isnan(v)
            sat = np.clip(np.where(nan, 0, v), -448, 448).astype(np.float32)
            return np.where(nan, np.uint8(0x7F), spec_ref.e4m3_encode(sat)).astype(np.uint8)
        if src == tl.float8e4nv and dst == tl.float32:
            return spec_ref.e4m3_decode(np.asarray(data).view(np.uint8)).astype(np.float32)
        return orig(data, src, dst, rounding_mode)

    it._convert_float = conv


def test_plumbing(seed_doc, tokens):
    import torch
    import seed_vectors as sv

    kernels, hashes = seedlib.load_seed_kernels(seed_doc)
    check(set(kernels) == set(seedlib.SEED_KERNELS), f"extracted {sorted(hashes)}")
    patch_interpreter_conversions()
    inp = sv.Inputs(tokens).build()
    lat, pos, cs, slots, nb = inp.tensors()
    check(lat.shape == (tokens, 512) and pos.shape == (tokens,) and slots.shape == (tokens,),
          "input shapes")
    valid = slots[slots >= 0]
    check(len(np.unique(valid)) == len(valid) and valid.max() < nb * 64, "slots distinct and in range")
    check(pos.min() == 0 and (pos % 2 == 0).any() and (pos % 2 == 1).any(), "positions mix odd/even, include 0")
    nan_cats = {"nan_single", "nan_block32", "nan_tile16", "nan_row", "nan_and_inf", "inf_single",
                "inf_pair_in_block", "huge"}
    for layout in ("mxfp8", "nvfp4"):
        w = seedlib.RECORD_WIDTH[layout]
        k = kernels[seedlib.KERNEL_FOR_LAYOUT[layout]]
        for cr in (1, 2):
            for san in (False, True):
                cin = sv.canary_cache(nb, w, 7)
                cdev = torch.from_numpy(cin.copy())
                seedlib.launch_seed(k, torch.from_numpy(lat.view(np.int16).copy()).view(torch.bfloat16),
                                    torch.from_numpy(pos), torch.from_numpy(cs), cdev,
                                    torch.from_numpy(slots), cr, san)
                ref, idx = spec_ref.rope_quant_insert_ref(lat, pos, cs, slots, cin, layout, cr, san, fma=False)
                rep = spec_ref.compare(ref, cdev.numpy(), slots, layout, inp.category_of, limit=50)
                other = {c: n for c, n in rep["by_category"].items() if c not in nan_cats}
                untouched = np.ones(nb * 64, bool)
                untouched[slots[idx]] = False
                same = (spec_ref.record_bytes(cin, layout)[untouched]
                        == spec_ref.record_bytes(cdev.numpy(), layout)[untouched]).all()
                check(same, f"{layout} cr{cr} san={san}: {untouched.sum()} unwritten records keep the canary")
                check(not other, f"{layout} cr{cr} san={san}: interpreter == spec_ref outside NaN/inf rows "
                      f"({len(idx)} records; differing by category {rep['by_category']})")


def test_own_baselines(T=200):
    """Own baselines (seed_bench.py) against spec_ref on random normal inputs."""
    import torch
    import own_baselines as ob

    rng = np.random.default_rng(3)
    lat = seedlib.bf16_bits_from_f32(rng.standard_normal((T, 512)).astype(np.float32))
    pos = rng.integers(0, 300, T).astype(np.int64)
    cs = seedlib.rope_table(300)
    nb = -(-T // 64) + 1
    slots = rng.permutation(nb * 64)[:T].astype(np.int64)
    slots[::17] = -1
    lat_t = torch.from_numpy(lat.view(np.int16).copy()).view(torch.bfloat16)
    args = (lat_t, torch.from_numpy(pos), torch.from_numpy(cs))
    for cr in (1, 2):
        ok = (slots >= 0) & ((pos + 1) % cr == 0)
        idx = np.nonzero(ok)[0]
        x, r = spec_ref.rope_rows(lat, pos, cs, cr, fma=False)
        # V4
        cin = np.random.default_rng(5).integers(0, 256, (nb, 64, 584), dtype=np.uint8)
        c = torch.from_numpy(cin.copy())
        ob.v4_insert(*args, c, torch.from_numpy(slots), cr)
        vals, scs = spec_ref.v4_record(x[idx], r[idx])
        ref = cin.reshape(nb, -1).copy()
        blk, row = slots[idx] // 64, slots[idx] % 64
        ref[blk[:, None], row[:, None] * 576 + np.arange(576)] = vals
        ref[blk[:, None], 64 * 576 + row[:, None] * 8 + np.arange(8)] = scs
        check(np.array_equal(ref, c.numpy().reshape(nb, -1)), f"own V4 insert == spec_ref (cr{cr})")
        # BF16 rows
        c = torch.full((nb, 64, 512), -7.0, dtype=torch.bfloat16)
        ob.rows_insert(*args, c, torch.from_numpy(slots), cr)
        got = c.view(torch.int16).numpy().view(np.uint16).reshape(nb * 64, 512)
        want = np.full((nb * 64, 512), 0xC0E0, np.uint16)
        want[slots[idx]] = seedlib.bf16_bits_from_f32(r[idx])
        check(np.array_equal(got, want), f"own BF16-rows insert == bf16(rope) (cr{cr})")
        # FP8 rows, fp8_scale 1/16 (exact reciprocal)
        c = torch.zeros((nb, 64, 512), dtype=torch.uint8).view(torch.float8_e4m3fn)
        ob.rows_insert(*args, c, torch.from_numpy(slots), cr, torch.tensor([0.0625], dtype=torch.float32))
        got = c.view(torch.uint8).numpy().reshape(nb * 64, 512)
        want = np.zeros((nb * 64, 512), np.uint8)
        rb = seedlib.f32_from_bf16_bits(seedlib.bf16_bits_from_f32(r[idx])) * np.float32(16.0)
        want[slots[idx]] = spec_ref.e4m3_encode(np.clip(rb, -448, 448).astype(np.float32))
        check(np.array_equal(got, want), f"own FP8-rows insert == e4m3(bf16(rope)*16) (cr{cr})")
    # CR1 norm (summation order is the compiler's: allow 1 bf16 ulp)
    kv = rng.standard_normal((T, 512)).astype(np.float32)
    w = seedlib.bf16_bits_from_f32((1 + 0.1 * rng.standard_normal(512)).astype(np.float32))
    out = torch.zeros(T, 512, dtype=torch.bfloat16)
    ob.norm_cr1(torch.from_numpy(kv), torch.from_numpy(slots), torch.from_numpy(w.view(np.int16).copy())
                .view(torch.bfloat16), 1e-6, out)
    got = out.view(torch.int16).numpy().view(np.uint16).astype(np.int32)
    k64 = kv.astype(np.float64)
    ref = k64 / np.sqrt((k64 ** 2).mean(1, keepdims=True) + 1e-6) * seedlib.f32_from_bf16_bits(w)
    want = seedlib.bf16_bits_from_f32(ref.astype(np.float32)).astype(np.int32)
    v = slots >= 0
    check(np.abs(got[v] - want[v]).max() <= 1 and (got[~v] == 0).all(), "own CR1 norm within 1 bf16 ulp")
    test_own_cr2(rng, w)


def test_own_cr2(rng, w, cap=2):
    """Own CR2 baseline against a float64 model of semantics.md: chunks of
    several lengths (one empty, one longer than the ring), positions
    continuing each request's history, some slots < 0 (a chunk's first token
    among them); latents within 1 bf16 ulp, ring stores bit copies read after
    the first token's ring read, every other latent row and ring row kept."""
    import torch
    import own_baselines as ob

    sizes = [1, 3, 0, 5, 2, 1, 4]
    qsl = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    T, R = int(qsl[-1]), len(sizes)
    start_pos = rng.integers(0, 9, R)
    pos = np.concatenate([start_pos[r] + np.arange(n) for r, n in enumerate(sizes)]).astype(np.int64)
    ttr = np.concatenate([np.full(n, r) for r, n in enumerate(sizes)]).astype(np.int64)
    slots = np.array([ttr[t] * cap + pos[t] % cap for t in range(T)], np.int64)
    slots[[4, 9]] = -1  # the first token of request 3, and a later token of request 3
    kv = rng.standard_normal((T, 1024)).astype(np.float32)
    ring_in = rng.standard_normal((R, cap, 1024)).astype(np.float32)
    lat_in = np.full((T, 512), 0x4049, np.uint16)
    wf = seedlib.f32_from_bf16_bits(w).astype(np.float64)

    def pooled_norm(older, newer):
        o, n = older.astype(np.float64), newer.astype(np.float64)
        m = np.maximum(o[512:], n[512:])
        w0, w1 = np.exp(o[512:] - m), np.exp(n[512:] - m)
        v = (o[:512] * w0 + n[:512] * w1) / (w0 + w1)
        return v / np.sqrt((v ** 2).mean() + 1e-6) * wf

    want_lat = lat_in.astype(np.int32).copy()
    want_ring = ring_in.copy()
    for r in range(R):
        s_, e_ = qsl[r], qsl[r + 1]
        for t in range(s_, e_):
            if slots[t] < 0 or pos[t] % 2 == 0:
                continue
            older = ring_in.reshape(R * cap, 1024)[(slots[s_] // cap) * cap + (pos[t] - 1) % cap] if t == s_ \
                else kv[t - 1]
            want_lat[t] = seedlib.bf16_bits_from_f32(pooled_norm(older, kv[t]).astype(np.float32))
        if s_ < e_ and slots[s_] >= 0:
            for u in range(max(e_ - cap, s_), e_):
                if slots[u] >= 0:
                    want_ring.reshape(R * cap, 1024)[slots[u]] = kv[u]
    ring_t = torch.from_numpy(ring_in.copy())
    lat_t = torch.from_numpy(lat_in.view(np.int16).copy()).view(torch.bfloat16)
    ob.compress_cr2(torch.from_numpy(kv), torch.from_numpy(pos), torch.from_numpy(slots), torch.from_numpy(qsl),
                    torch.from_numpy(ttr), ring_t, torch.from_numpy(w.view(np.int16).copy()).view(torch.bfloat16),
                    1e-6, lat_t)
    got = lat_t.view(torch.int16).numpy().view(np.uint16).astype(np.int32)
    written = (got != 0x4049).any(1)
    expect_written = (want_lat != 0x4049).any(1)
    check(np.array_equal(written, expect_written) and expect_written.sum() >= 4,
          f"own CR2 writes the latents of the {expect_written.sum()} closing tokens, and only those")
    check(np.abs(got - want_lat).max() <= 1, "own CR2 latents within 1 bf16 ulp of the float64 model")
    check(np.array_equal(ring_t.numpy(), want_ring), "own CR2 ring: the chunks' last tokens copied, after the read")


def _round_f32_exact(q):
    """Correctly rounded f32 of a Fraction (ties to even), by exact comparison."""
    from fractions import Fraction
    f = np.float32(float(q))
    cands = [np.nextafter(f, np.float32(-np.inf)), f, np.nextafter(f, np.float32(np.inf))]
    best = None
    for c in cands:
        if not np.isfinite(c):
            continue
        d = abs(Fraction(float(c)) - q)
        key = (d, int(np.array(c, np.float32).view(np.uint32)) & 1)
        if best is None or key < best[0]:
            best = (key, c)
    return best[1]


def test_fma_model(n=4000):
    """spec_ref's fma (float64 + round-to-odd) against exact rational arithmetic,
    on random and near-midpoint cases."""
    from fractions import Fraction
    rng = np.random.default_rng(11)
    e = seedlib.f32_from_bf16_bits(seedlib.bf16_bits_from_f32(rng.standard_normal(n).astype(np.float32)))
    c = rng.standard_normal(n).astype(np.float32)
    p = (rng.standard_normal(n) * np.exp2(rng.integers(-40, 10, n))).astype(np.float32)
    # near-midpoint cases: p = -(e*c rounded) + tiny, so the sum's bits fall below f32 precision
    prod = (e.astype(np.float64) * c.astype(np.float64))
    p[: n // 2] = (-prod[: n // 2] * (1 + 2.0 ** -25)).astype(np.float32)
    # double-rounding traps: e*c exactly an f32 midpoint (e = 3, c with an odd
    # 24-bit significand), p a tiny nudge far below float64 resolution of the sum
    q4 = n // 4
    e[q4:2 * q4] = 3.0
    cm = (np.float32(1.0) + rng.integers(0, 1 << 22, q4).astype(np.float32) * np.float32(2.0 ** -22)
          + np.float32(2.0 ** -23))
    c[q4:2 * q4] = cm
    prod = (e.astype(np.float64) * c.astype(np.float64))
    p[q4:2 * q4] = (prod[q4:2 * q4] * np.exp2(-rng.integers(30, 70, q4))
                    * np.where(rng.random(q4) < 0.5, -1, 1)).astype(np.float32)
    got = spec_ref._fma_exact_prod_plus_f32(prod, p)
    bad = 0
    for i in range(n):
        q = Fraction(float(e[i])) * Fraction(float(c[i])) + Fraction(float(p[i]))
        if _round_f32_exact(q) != got[i]:
            bad += 1
    check(bad == 0, f"spec_ref fma model == exact rounding on {n} cases ({bad} differ)")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed-doc", default=seedlib.DEFAULT_SEED_DOC)
    ap.add_argument("--tokens", type=int, default=640)
    args = ap.parse_args()
    if not seedlib.interpreting():
        sys.exit("run with TRITON_INTERPRET=1")
    x = test_e2m1_numpy()
    test_fma_model()
    test_e2m1_triton(x)
    test_plumbing(args.seed_doc, args.tokens)
    test_own_baselines()
    print("FAILED: %d" % len(FAIL) if FAIL else "all passed")
    sys.exit(1 if FAIL else 0)


if __name__ == "__main__":
    main()
