"""Numpy model of `rope_quant_insert` for the V4.1 layouts, written from
shared/spec/semantics.md (own code, not the seed's).

seed_vectors.py uses it only to *report* how the seed's bytes compare with the
spec, so that a run on the GPU immediately says whether semantics.md and the
seed agree on the generated inputs. It never changes what is written.

Rounding is modelled exactly:
- products of a bf16 and an f32 are exact in float64, then rounded once;
- fma(a, b, c) = round_f32(a*b + c): a*b exact in float64, the float64 sum is
  made round-to-odd with a TwoSum error term, and round-to-odd at 53 bits
  followed by one rounding to 24 bits is a correct single rounding;
- IEEE f32 division is numpy's float32 divide.

Usage: a module, not run by itself; seed_vectors.py and selftest_cpu.py import it.
"""

import numpy as np

F32_1_448 = np.float32(1.0 / 448.0)
F32_1_6 = np.float32(1.0 / 6.0)
F32_1EM4 = np.float32(1e-4)


# ---------------------------------------------------------------- e4m3 (fn)
def _e4m3_table():
    vals = np.zeros(127, dtype=np.float64)  # codes 0..126 (0x7F is NaN)
    for c in range(127):
        e, m = c >> 3, c & 7
        vals[c] = (m / 8.0) * 2.0 ** -6 if e == 0 else (1 + m / 8.0) * 2.0 ** (e - 7)
    return vals


E4M3_VALUES = _e4m3_table()


def e4m3_decode(b):
    b = np.asarray(b, dtype=np.uint8)
    mag = b & 0x7F
    v = E4M3_VALUES[np.minimum(mag, 126)]
    v = np.where(mag == 0x7F, np.nan, v)
    return np.where(b & 0x80, -v, v)


def e4m3_encode(x):
    """Round-to-nearest-even to e4m3fn. Inputs must be finite with |x| <= 448
    (the callers clamp first); the sign bit is kept, so -0 gives 0x80."""
    x = np.asarray(x, dtype=np.float32)
    a = np.abs(x).astype(np.float64)
    assert np.all(a <= 448.0), "e4m3_encode: clamp first"
    hi = np.searchsorted(E4M3_VALUES, a, side="left")  # first value >= a
    hi = np.minimum(hi, 126)
    lo = np.maximum(hi - 1, 0)
    dlo = a - E4M3_VALUES[lo]
    dhi = E4M3_VALUES[hi] - a
    pick_hi = (dhi < dlo) | ((dhi == dlo) & (hi % 2 == 0))
    code = np.where(pick_hi, hi, lo)
    code = np.where(E4M3_VALUES[hi] == a, hi, code).astype(np.uint8)
    sign = (np.signbit(x)).astype(np.uint8) << 7
    return code | sign


# ---------------------------------------------------------------- rounding
def _round_f32(x64):
    with np.errstate(over="ignore"):
        return np.asarray(x64, dtype=np.float64).astype(np.float32)


def _fma_exact_prod_plus_f32(prod64, c32):
    """round_f32(prod64 + c32) with prod64 exact (a product of a bf16 and an f32)."""
    a = prod64
    b = np.asarray(c32, dtype=np.float32).astype(np.float64)
    with np.errstate(all="ignore"):
        s = a + b
        bb = s - a
        err = (a - (s - bb)) + (b - bb)
    err = np.where(np.isfinite(s), err, 0.0)
    bits = s.view(np.uint64).copy()
    need = (err != 0) & ((bits & 1) == 0)
    up = need & ((err > 0) == (s > 0))  # move |s| toward the exact value
    down = need & ~up
    bits = np.where(up, bits + 1, np.where(down, bits - 1, bits))
    return _round_f32(bits.view(np.float64))


def rope(x32, c32, s32, fma=True):
    """GPT-J rotation of pairs; x32 [n,512] f32, c32/s32 [n,256] f32."""
    e = x32[:, 0::2].astype(np.float64)
    o = x32[:, 1::2].astype(np.float64)
    c = c32.astype(np.float64)
    s = s32.astype(np.float64)
    with np.errstate(all="ignore"):
        if fma:
            os_ = _round_f32(o * s)
            es_ = _round_f32(e * s)
            r_even = _fma_exact_prod_plus_f32(e * c, -os_)
            r_odd = _fma_exact_prod_plus_f32(o * c, es_)
        else:
            r_even = _round_f32(_round_f32(e * c).astype(np.float64) - _round_f32(o * s))
            r_odd = _round_f32(_round_f32(o * c).astype(np.float64) + _round_f32(e * s))
    r = np.empty_like(x32)
    r[:, 0::2] = r_even
    r[:, 1::2] = r_odd
    return r


def _cos_sin_rows(cos_sin, base):
    n = base.shape[0]
    c = np.ones((n, 256), dtype=np.float32)
    s = np.zeros((n, 256), dtype=np.float32)
    c[:, 224:] = cos_sin[base, 0:32]
    s[:, 224:] = cos_sin[base, 32:64]
    return c, s


# ---------------------------------------------------------------- layouts
def mxfp8_record(r, sanitize):
    """r [n,512] f32 -> (values [n,512] u8, scales [n,16] u8)."""
    values, scales = ue8m0_blocks(r.reshape(-1, 16, 32), sanitize)
    return values.reshape(-1, 512), scales


def ue8m0_blocks(q, sanitize):
    """q [n,B,L] f32 -> (e4m3 bytes [n,B,L], UE8M0 scale bytes [n,B]) (V4 and MXFP8 rule)."""
    with np.errstate(all="ignore"):
        amax = np.fmax.reduce(np.abs(q), axis=2)  # NaN-ignoring (all-NaN -> NaN)
        amax = np.fmax(amax, F32_1EM4)
        x = _round_f32(amax.astype(np.float64) * np.float64(F32_1_448))
        lg = _round_f32(np.log2(x.astype(np.float64)))  # log2f: nearest f32 of the true log2
        e = np.ceil(lg).astype(np.float64)
        scaled = _round_f32(q.astype(np.float64) * np.exp2(-e)[:, :, None])
    nan = np.isnan(scaled)
    clamped = np.where(nan, np.float32(448.0), np.copysign(np.fmin(np.abs(scaled), np.float32(448.0)), scaled))
    values = e4m3_encode(clamped.astype(np.float32))
    hi = 254.0 if sanitize else 255.0
    with np.errstate(invalid="ignore"):
        enc = np.minimum(np.maximum(e + 127.0, 0.0), hi)
    return values, enc.astype(np.uint8)


def v4_record(x, r):
    """V4 584 B record (no sanitizing): x unrotated, r rotated, both [n,512] f32."""
    import seedlib
    vals, sc = ue8m0_blocks(x[:, :448].reshape(-1, 7, 64), False)
    rope = seedlib.bf16_bits_from_f32(r[:, 448:]).astype("<u2").view(np.uint8).reshape(-1, 128)
    values = np.concatenate([vals.reshape(-1, 448), rope], axis=1)
    scales = np.concatenate([sc, np.zeros((sc.shape[0], 1), np.uint8)], axis=1)
    return values, scales


def rope_rows(latent_bits, positions, cos_sin, cr, fma=True):
    """(x, r) f32 [n,512] for every token (no slot / boundary filtering)."""
    x = (latent_bits.astype(np.uint32) << 16).view(np.float32)
    base = (positions.astype(np.int64) // cr) * cr
    c, s = _cos_sin_rows(cos_sin, base)
    return x, rope(x, c, s, fma=fma)


def e2m1_code(q):
    q = np.asarray(q, dtype=np.float32)
    a = np.abs(q)
    mags = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6], dtype=np.float64)
    with np.errstate(invalid="ignore"):
        a64 = np.minimum(a.astype(np.float64), 6.0)
        d = np.abs(a64[..., None] - mags)
        best = np.min(d, axis=-1, keepdims=True)
        cand = d == best
        # among equally near codes take the even one (there are at most two)
        even = cand & (np.arange(8) % 2 == 0)
        code = np.where(even.any(-1), np.argmax(even, -1), np.argmax(cand, -1)).astype(np.uint8)
    code = np.where(np.isnan(q), 0, code).astype(np.uint8)
    sign = np.where(np.isnan(q), 0, np.signbit(q)).astype(np.uint8)
    return code | (sign << 3)


def nvfp4_record(r):
    """r [n,512] f32 -> (values [n,256] u8, scales [n,32] u8)."""
    t = r.reshape(-1, 32, 16)
    with np.errstate(all="ignore"):
        amax = np.fmax.reduce(np.abs(t), axis=2)
        y = _round_f32(amax.astype(np.float64) * np.float64(F32_1_6))
        y = np.fmin(np.fmax(y, np.float32(2.0 ** -9)), np.float32(448.0))  # NaN-ignoring
        sbyte = e4m3_encode(y)
        sval = e4m3_decode(sbyte).astype(np.float32)
        q = (t / sval[:, :, None]).astype(np.float32)
    codes = e2m1_code(q).reshape(-1, 512)
    values = (codes[:, 0::2] | (codes[:, 1::2] << 4)).astype(np.uint8)
    return values, sbyte


def rope_quant_insert_ref(latent_bits, positions, cos_sin, slots, cache_in, layout, cr, sanitize, fma=True):
    """Returns (cache_out, written_token_indices)."""
    cache = cache_in.copy()
    nb, bs, w = cache.shape
    n = slots.shape[0]
    slots = slots.astype(np.int64)
    positions = positions.astype(np.int64)
    ok = (slots[:n] >= 0) & ((positions[:n] + 1) % cr == 0)
    idx = np.nonzero(ok)[0]
    if idx.size == 0:
        return cache, idx
    assert np.all(slots[idx] < nb * bs), "reference: slot out of range"
    x = (latent_bits[idx].astype(np.uint32) << 16).view(np.float32)
    base = (positions[idx] // cr) * cr
    c, s = _cos_sin_rows(cos_sin, base)
    r = rope(x, c, s, fma=fma)
    if sanitize:
        r = np.where(np.isnan(r), np.float32(0.0), r).astype(np.float32)
    if layout == "mxfp8":
        values, scales = mxfp8_record(r, sanitize)
        V, S = 512, 16
    elif layout == "nvfp4":
        values, scales = nvfp4_record(r)
        V, S = 256, 32
    else:
        raise ValueError(layout)
    assert w == V + S
    flat = cache.reshape(nb, bs * w)
    blk = slots[idx] // bs
    row = slots[idx] % bs
    vofs = row[:, None] * V + np.arange(V)[None, :]
    sofs = bs * V + row[:, None] * S + np.arange(S)[None, :]
    flat[blk[:, None], vofs] = values
    flat[blk[:, None], sofs] = scales
    return flat.reshape(nb, bs, w), idx


def record_bytes(cache, layout):
    """[blocks, bs, W] paged cache -> [blocks*bs, W] (each slot's value bytes then its scale bytes)."""
    nb, bs, w = cache.shape
    V, S = (512, 16) if layout == "mxfp8" else (256, 32)
    flat = cache.reshape(nb, bs * w)
    vals = flat[:, :bs * V].reshape(nb * bs, V)
    scs = flat[:, bs * V:].reshape(nb * bs, S)
    return np.concatenate([vals, scs], axis=1)


def compare(cache_ref, cache_dev, slots, layout, row_category=None, limit=12):
    """Byte comparison report (dict) of a reference cache against a device cache."""
    nb, bs, w = cache_ref.shape
    V, S = (512, 16) if layout == "mxfp8" else (256, 32)
    diff = cache_ref.reshape(nb, -1) != cache_dev.reshape(nb, -1)
    rep = {"bytes_total": int(diff.size), "bytes_differing": int(diff.sum())}
    # map each differing byte to (slot, part)
    bad_value_slots, bad_scale_slots = set(), set()
    for b, off in zip(*np.nonzero(diff)):
        if off < bs * V:
            bad_value_slots.add(int(b) * bs + int(off) // V)
        else:
            bad_scale_slots.add(int(b) * bs + (int(off) - bs * V) // S)
    slot_to_token = {int(s): t for t, s in enumerate(slots.tolist()) if s >= 0}
    bad = sorted(bad_value_slots | bad_scale_slots)
    rep["records_differing"] = len(bad)
    rep["records_value_bytes_differing"] = len(bad_value_slots)
    rep["records_scale_bytes_differing"] = len(bad_scale_slots)
    examples = []
    by_cat = {}
    for sl in bad:
        t = slot_to_token.get(sl)
        cat = row_category(t) if (row_category and t is not None) else None
        by_cat[str(cat)] = by_cat.get(str(cat), 0) + 1
        if len(examples) < limit:
            examples.append({"slot": sl, "token": t, "category": cat,
                             "values": sl in bad_value_slots, "scales": sl in bad_scale_slots})
    rep["by_category"] = by_cat
    rep["examples"] = examples
    return rep
