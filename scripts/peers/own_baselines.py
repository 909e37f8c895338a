"""Own Triton baselines, written by this project from shared/spec/semantics.md.

These are NOT the seed's code (the seed document shows only the MXFP8 and
NVFP4 insert kernels in full); they exist so that seed_bench.py can time the
other operations the way anchors.md describes. They follow the spec's layouts
but are timing baselines, not reference implementations (RoPE is written as
plain Triton arithmetic; whether the compiler contracts it into the fma form
of semantics.md is not controlled here).

Usage: a module, not run by itself; seed_bench.py imports it.
"""

import torch
import triton
import triton.language as tl


@triton.jit
def _own_rotate(src, cs):
    """semantics.md RoPE of one latent row at `src` (512 BF16): pairs k = 0..255,
    (c, s) = cos_sin row entries k-224 and 32+k-224 for k >= 224, else (1, 0);
    returns the rotated [512] f32 vector (even dims from e*c - o*s, odd from o*c + e*s)."""
    k = tl.arange(0, 256)
    in_rope = k >= 224
    j = tl.where(in_rope, k - 224, 0)
    c = tl.where(in_rope, tl.load(cs + j, mask=in_rope), 1.0)
    s = tl.where(in_rope, tl.load(cs + 32 + j, mask=in_rope), 0.0)
    e = tl.load(src + 2 * k).to(tl.float32)
    o = tl.load(src + 2 * k + 1).to(tl.float32)
    return tl.interleave(e * c - o * s, o * c + e * s)


@triton.jit
def _own_token(positions, cos_sin, slots, COS_STRIDE: tl.constexpr, COMPRESS_RATIO: tl.constexpr):
    """This program's token t, its slot, whether the insert skips it (slot < 0,
    or its position does not close a compression group), and its cos/sin row."""
    t = tl.program_id(0)
    slot = tl.load(slots + t)
    position = tl.load(positions + t, mask=slot >= 0, other=0)
    dead = (slot < 0) | ((position + 1) % COMPRESS_RATIO != 0)
    return t, slot, dead, cos_sin + (position - position % COMPRESS_RATIO) * COS_STRIDE


@triton.jit
def _own_v4_insert_kernel(
    latent, positions, cos_sin, cache, slots,
    COS_STRIDE: tl.constexpr, CACHE_STRIDE: tl.constexpr, CACHE_BLOCK: tl.constexpr,
    COMPRESS_RATIO: tl.constexpr,
):
    """V4 584 B record: e4m3 of unrotated dims 0..447 (7 blocks of 64, UE8M0
    scales), then dims 448..511 rotated as BF16; scales: 7 bytes + one zero."""
    t, slot, dead, cs = _own_token(positions, cos_sin, slots, COS_STRIDE, COMPRESS_RATIO)
    if dead:
        return
    row_ptr = latent + t.to(tl.int64) * 512
    rec = cache + (slot // CACHE_BLOCK).to(tl.int64) * CACHE_STRIDE
    value_ptr = rec + (slot % CACHE_BLOCK) * 576
    scale_ptr = rec + CACHE_BLOCK * 576 + (slot % CACHE_BLOCK) * 8

    # NoPE: dims 0..447 unrotated, 7 blocks of 64 (padded to 8 rows, row 7 masked off)
    b = tl.arange(0, 8)[:, None]
    i = tl.arange(0, 64)[None, :]
    nope = b < 7
    v = tl.load(row_ptr + b * 64 + i, mask=nope, other=0.0).to(tl.float32)
    block_max = tl.maximum(tl.max(tl.abs(v), axis=1), 1e-4)
    e = tl.ceil(tl.log2(block_max * (1.0 / 448.0)))
    q = tl.clamp(v * tl.exp2(-e)[:, None], -448.0, 448.0).to(tl.float8e4nv)
    tl.store(value_ptr + b * 64 + i, q.to(tl.uint8, bitcast=True), mask=nope)
    ue8m0 = tl.minimum(tl.maximum(e + 127.0, 0.0), 255.0).to(tl.uint8)
    tl.store(scale_ptr + tl.arange(0, 8), tl.where(tl.arange(0, 8) < 7, ue8m0, 0))

    # RoPE: dims 448..511 rotated, stored as 64 little-endian BF16 after the 448 FP8 bytes
    k = tl.arange(0, 32)
    ev = tl.load(row_ptr + 448 + 2 * k).to(tl.float32)
    od = tl.load(row_ptr + 449 + 2 * k).to(tl.float32)
    c = tl.load(cs + k)
    s = tl.load(cs + 32 + k)
    rot = tl.interleave(ev * c - od * s, od * c + ev * s).to(tl.bfloat16)
    bf16_ptr = (value_ptr + 448).to(tl.pointer_type(tl.uint16))
    tl.store(bf16_ptr + tl.arange(0, 64), rot.to(tl.uint16, bitcast=True))


@triton.jit
def _own_rows_insert_kernel(
    latent, positions, cos_sin, cache, slots, fp8_scale,
    COS_STRIDE: tl.constexpr, CACHE_STRIDE: tl.constexpr, ROW_STRIDE: tl.constexpr,
    CACHE_BLOCK: tl.constexpr, COMPRESS_RATIO: tl.constexpr, STORE_FP8: tl.constexpr,
):
    """Plain [448 NoPE | 64 RoPE] rows: bf16(r), or e4m3(clamp(bf16(r) / fp8_scale))."""
    t, slot, dead, cs = _own_token(positions, cos_sin, slots, COS_STRIDE, COMPRESS_RATIO)
    if dead:
        return
    d = tl.arange(0, 512)
    r = _own_rotate(latent + t.to(tl.int64) * 512, cs).to(tl.bfloat16)
    dst = cache + (slot // CACHE_BLOCK).to(tl.int64) * CACHE_STRIDE + (slot % CACHE_BLOCK) * ROW_STRIDE + d
    if STORE_FP8:
        inv = 1.0 / tl.load(fp8_scale)
        v = tl.clamp(r.to(tl.float32) * inv, -448.0, 448.0)
        tl.store(dst, v.to(tl.float8e4nv))
    else:
        tl.store(dst, r)


@triton.jit
def _own_norm_cr1_kernel(kv_score, slots, weight, latent_out, EPS: tl.constexpr, RAW_STRIDE: tl.constexpr):
    """CR1 save/compress/norm: latent[t] = rmsnorm(kv_score[t]) for slot[t] >= 0."""
    t = tl.program_id(0)
    slot = tl.load(slots + t)
    if slot < 0:
        return
    d = tl.arange(0, 512)
    v = tl.load(kv_score + t.to(tl.int64) * RAW_STRIDE + d)
    var = tl.sum(v * v, 0) / 512.0
    inv = tl.math.div_rn(1.0, tl.sqrt_rn(var + EPS))
    w = tl.load(weight + d).to(tl.float32)
    tl.store(latent_out + t.to(tl.int64) * 512 + d, (v * inv * w).to(tl.bfloat16))


@triton.jit
def _own_exp(x):
    """semantics.md's shared exp, as math::exp defines it: Cody-Waite reduction
    with ln2 split in two, degree-7 Taylor by Horner in fma, 2^n from exponent
    bits (in two steps below 2^-126); +inf above 88.72284, +0 below -103.97208,
    NaN for NaN. Not tl.exp, which is ex2.approx."""
    in_range = (x >= -103.97208) & (x <= 88.72284)
    xr = tl.where(in_range, x, 0.0)
    t = xr * 1.4426950408889634
    n = (t + 12582912.0) - 12582912.0
    r = tl.fma(n, -0.693145751953125, xr)
    r = tl.fma(n, -1.4286067653301870e-06, r)
    p = tl.full(x.shape, 1.0 / 5040.0, tl.float32)
    p = tl.fma(p, r, 1.0 / 720.0)
    p = tl.fma(p, r, 1.0 / 120.0)
    p = tl.fma(p, r, 1.0 / 24.0)
    p = tl.fma(p, r, 1.0 / 6.0)
    p = tl.fma(p, r, 0.5)
    p = tl.fma(p, r, 1.0)
    p = tl.fma(p, r, 1.0)
    ni = n.to(tl.int32)
    lo = ni < -126
    hi = ni > 127
    e1 = tl.where(lo, ni + 100, tl.where(hi, ni - 1, ni))
    m2 = tl.where(lo, 7.888609052210118e-31, tl.where(hi, 2.0, 1.0))
    y = (p * ((e1 + 127) << 23).to(tl.float32, bitcast=True)) * m2
    outside = tl.where(x != x, float("nan"), tl.where(x > 0.0, float("inf"), 0.0))
    return tl.where(in_range, y, outside)


@triton.jit
def _own_pool_norm(older, newer, weight, out, EPS: tl.constexpr):
    """latent = rmsnorm(pool(older, newer)) of two [kv 512 | score 512] rows:
    per dim m = max(s0, s1), w = exp(s - m), (kv0 w0 + kv1 w1) / (w0 + w1),
    IEEE division; the norm as the CR1 baseline computes it."""
    d = tl.arange(0, 512)
    kv0 = tl.load(older + d)
    s0 = tl.load(older + 512 + d)
    kv1 = tl.load(newer + d)
    s1 = tl.load(newer + 512 + d)
    m = tl.maximum(s0, s1)
    w0 = _own_exp(s0 - m)
    w1 = _own_exp(s1 - m)
    v = tl.math.div_rn(kv0 * w0 + kv1 * w1, w0 + w1)
    var = tl.sum(v * v, 0) / 512.0
    inv = tl.math.div_rn(1.0, tl.sqrt_rn(var + EPS))
    w = tl.load(weight + d).to(tl.float32)
    tl.store(out + d, (v * inv * w).to(tl.bfloat16))


@triton.jit
def _own_compress_cr2_kernel(kv_score, positions, slots, qsl, ttr, ring, weight, latent_out, num_reqs, num_tokens,
                             EPS: tl.constexpr, CAP: tl.constexpr):
    """CR2 save/compress/norm without prev_rows, in one launch on the seed
    docstring's grid: programs 0..num_reqs-1 are requests (the first token's
    group, pooled with the ring row of the position before it, then the ring
    stores of the chunk's last CAP tokens, after that read), then one
    program per pair of packed tokens, which pools the group each of its
    two tokens closes inside its chunk (odd position, not the chunk's first
    token): one group a pair where chunks start at even positions."""
    pid = tl.program_id(0)
    if pid < num_reqs:
        start = tl.load(qsl + pid)
        end = tl.load(qsl + pid + 1)
        slot_f = tl.load(slots + start, mask=start < end, other=-1)
        if (start < end) & (slot_f >= 0):
            pos = tl.load(positions + start)
            if pos % 2 == 1:
                older = ring + ((slot_f // CAP) * CAP + (pos - 1) % CAP).to(tl.int64) * 1024
                _own_pool_norm(older, kv_score + start.to(tl.int64) * 1024, weight,
                               latent_out + start.to(tl.int64) * 512, EPS)
            e = tl.arange(0, 1024)
            for u in range(tl.maximum(end - CAP, start), end):
                su = tl.load(slots + u)
                if su >= 0:
                    # int32 offsets: the benchmark's rows and ring stay below 2^31 floats
                    row = tl.load(kv_score + u * 1024 + e)
                    tl.store(ring + su * 1024 + e, row)
    else:
        for j in tl.static_range(2):
            t = 2 * (pid - num_reqs) + j
            if t < num_tokens:
                start = tl.load(qsl + tl.load(ttr + t))
                slot = tl.load(slots + t)
                pos = tl.load(positions + t)
                if (t != start) & (slot >= 0) & (pos % 2 == 1):
                    row = kv_score + t.to(tl.int64) * 1024
                    _own_pool_norm(row - 1024, row, weight, latent_out + t.to(tl.int64) * 512, EPS)


# --------------------------------------------------------------- launchers
def v4_insert(latent, positions, cos_sin, kv_cache, slot_mapping, compress_ratio):
    assert kv_cache.dtype == torch.uint8 and kv_cache.shape[-1] == 584
    _own_v4_insert_kernel[(slot_mapping.numel(),)](
        latent, positions, cos_sin, kv_cache, slot_mapping,
        COS_STRIDE=cos_sin.stride(0), CACHE_STRIDE=kv_cache.stride(0), CACHE_BLOCK=kv_cache.shape[1],
        COMPRESS_RATIO=compress_ratio, num_warps=4,
    )


def rows_insert(latent, positions, cos_sin, kv_cache, slot_mapping, compress_ratio, fp8_scale=None):
    store_fp8 = kv_cache.dtype == torch.float8_e4m3fn
    assert store_fp8 or kv_cache.dtype == torch.bfloat16
    _own_rows_insert_kernel[(slot_mapping.numel(),)](
        latent, positions, cos_sin, kv_cache, slot_mapping, fp8_scale if store_fp8 else None,
        COS_STRIDE=cos_sin.stride(0), CACHE_STRIDE=kv_cache.stride(0), ROW_STRIDE=kv_cache.stride(1),
        CACHE_BLOCK=kv_cache.shape[1], COMPRESS_RATIO=compress_ratio, STORE_FP8=store_fp8, num_warps=4,
    )


def norm_cr1(kv_score, slot_mapping, weight, eps, latent_out, num_warps=4):
    _own_norm_cr1_kernel[(slot_mapping.numel(),)](
        kv_score, slot_mapping, weight, latent_out, EPS=eps, RAW_STRIDE=kv_score.stride(0), num_warps=num_warps,
    )


def compress_cr2(kv_score, positions, slot_mapping, query_start_loc, token_to_req, state_cache, weight, eps,
                 latent_out, num_warps=4):
    """CR2 save/compress/norm, no prev_rows; state_cache is [blocks, capacity, 1024] f32."""
    num_reqs = query_start_loc.numel() - 1
    num_tokens = kv_score.shape[0]
    _own_compress_cr2_kernel[(num_reqs + triton.cdiv(num_tokens, 2),)](
        kv_score, positions, slot_mapping, query_start_loc, token_to_req, state_cache, weight, latent_out,
        num_reqs, num_tokens, EPS=eps, CAP=state_cache.shape[1], num_warps=num_warps,
    )

# The compressor peers' launch widths tried by seed_bench.py (--tune-warps):
# the timed figure of a peer is its best, as a user tuning it would pick.
TUNE_WARPS = (1, 2, 4, 8)
