"""Own Triton baselines, written by this project from shared/spec/semantics.md.

These are NOT the seed's code (the seed document shows only the MXFP8 and
NVFP4 insert kernels in full); they exist so that seed_bench.py can time the
other operations the way anchors.md describes. They follow the spec's layouts
but are timing baselines, not reference implementations (RoPE is written as
plain Triton arithmetic; whether the compiler contracts it into the fma form
of semantics.md is not controlled here).
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
def _own_v4_insert_kernel(
    latent, positions, cos_sin, cache, slots,
    COS_STRIDE: tl.constexpr, CACHE_STRIDE: tl.constexpr, CACHE_BLOCK: tl.constexpr,
    COMPRESS_RATIO: tl.constexpr,
):
    """V4 584 B record: e4m3 of unrotated dims 0..447 (7 blocks of 64, UE8M0
    scales), then dims 448..511 rotated as BF16; scales: 7 bytes + one zero."""
    t = tl.program_id(0)
    slot = tl.load(slots + t)
    if slot < 0:
        return
    position = tl.load(positions + t)
    if (position + 1) % COMPRESS_RATIO != 0:
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
    cs = cos_sin + (position - position % COMPRESS_RATIO) * COS_STRIDE
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
    t = tl.program_id(0)
    slot = tl.load(slots + t)
    if slot < 0:
        return
    position = tl.load(positions + t)
    if (position + 1) % COMPRESS_RATIO != 0:
        return
    d = tl.arange(0, 512)
    cs = cos_sin + (position - position % COMPRESS_RATIO) * COS_STRIDE
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


def norm_cr1(kv_score, slot_mapping, weight, eps, latent_out):
    _own_norm_cr1_kernel[(slot_mapping.numel(),)](
        kv_score, slot_mapping, weight, latent_out, EPS=eps, RAW_STRIDE=kv_score.stride(0), num_warps=4,
    )
