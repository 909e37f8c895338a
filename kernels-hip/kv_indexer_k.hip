// Entry points of indexer_k_norm_rope_store: the V4.1 indexer's keys, RMS
// norm, GPT-J RoPE and FP8 (132 B) or MXFP4 (68 B) records in one of three
// page orders. Twin of src/operations/indexer_k/reference.rs; the math is
// kv_math.h's and kv_formats.h's.
//
// A token is a group of 32 lanes; lane l owns dims 4l .. 4l + 3 (two GPT-J
// pairs), so the norm's sum is the lane's four squares in two fmas (vLLM's
// order) and then a five-step xor butterfly (math::sum_squares_128), the FP8 scale a
// 32-lane max and an MXFP4 block's scale an 8-lane one. Lanes 16..31 hold
// the rotated pairs. A lane stores its 4 FP8 bytes (or 2 MXFP4 bytes) at
// the order's address of byte 4l (2l), which every order keeps contiguous.
// All entry points: KV_KERNELS in kv_abi.h.
#include "kv_common.h"

// f32(1/448) and f32(1/6), the seed's constants (docs/numerics.md).
#define KV_IK_INV_448 0x3b124925u
#define KV_IK_INV_6 0x3e2aaaabu

// Byte offset in a page of value byte j of row r, for a record of W value
// bytes (the order is the launch's, so the choice never diverges).
template <int W>
KV_DEVICE int64_t kv_ik_value_at(const KvIndexerKParams& p, int64_t r, unsigned j) {
    if (p.flags & KV_IKF_TILED) {
        return (r >> 4) * (16 * W) + (int64_t)((j >> 4) * 256u + (uint32_t)(r & 15) * 16u + (j & 15u));
    }
    if (p.flags & KV_IKF_PRESHUFFLED) {
        int64_t n = p.n_per_tile;
        int64_t group = r / n;
        int64_t lane = r - group * n;
        return group * (n * W) + (int64_t)(j >> 4) * (n * 16) + lane * 16 + (j & 15u);
    }
    return r * W + j;
}

// Byte offset in a page of scale byte s of row r (after the page's values).
template <int W>
KV_DEVICE int64_t kv_ik_scale_at(const KvIndexerKParams& p, int64_t r, unsigned s) {
    int64_t values = (int64_t)p.block_size * W;
    if (p.flags & KV_IKF_PRESHUFFLED) {
        int64_t n = p.n_per_tile;
        int64_t s_lo = 64 / n;
        int64_t s_hi = 4 / s_lo;
        int64_t group = r / n;
        int64_t lane = r - group * n;
        return values + group * (n * 4) + (int64_t)(s % s_lo) * (n * s_hi) + lane * s_hi + (int64_t)(s / s_lo);
    }
    return values + r * 4 + s;
}

// A value of a table of F32, BF16 or F16 elements (the flags' `bf16` and
// `f16` bits), widened exactly.
KV_DEVICE float kv_ik_widen(const void* base, int64_t i, bool bf16, bool f16) {
    if (bf16) return kv_bf16_to_f32(((const uint16_t*)base)[i]);
    if (f16) return kv_f16_to_f32(((const uint16_t*)base)[i]);
    return ((const float*)base)[i];
}

// The lane's four rotated, BF16-rounded values of token t; false when the
// token writes nothing (skipped, counted when an index is out of range).
KV_DEVICE bool kv_ik_rotated(const KvIndexerKParams& p, int64_t t, unsigned lane, int64_t* slot_out, float r[4]) {
    int64_t slot = kv_load_index(p.slots, (p.flags & KV_F_SLOT_I64) != 0u, t);
    if (slot < 0) return false;
    int64_t pos = kv_load_index(p.positions, (p.flags & KV_F_POS_I64) != 0u, t);
    if (pos < 0) {
        kv_count(p.counters, KV_COUNT_POS, lane);
        return false;
    }
    // compress_ratio is 1 or 2 (validated): boundary iff (pos + 1) % cr == 0.
    bool cr2 = p.compress_ratio == 2u;
    if (cr2 && (pos & 1) == 0) return false;
    int64_t base = cr2 ? (pos & ~(int64_t)1) : pos;
    if (base >= p.cos_rows) {
        kv_count(p.counters, KV_COUNT_POS, lane);
        return false;
    }
    if (slot >= (int64_t)p.num_blocks * p.block_size) {
        kv_count(p.counters, KV_COUNT_SLOT, lane);
        return false;
    }
    *slot_out = slot;

    // k_pre's row stride is any (vLLM asks only for a unit inner stride):
    // one 8-byte load where the lane's four values are aligned for it.
    const uint16_t* row = p.k_pre + t * (int64_t)p.k_row_stride + 4u * lane;
    uint32_t w0, w1;
    if ((((uint64_t)row) & 7u) == 0u) {
        kv_u32x2 v = *(const kv_u32x2*)row;
        w0 = v.x;
        w1 = v.y;
    } else {
        w0 = (uint32_t)row[0] | ((uint32_t)row[1] << 16);
        w1 = (uint32_t)row[2] | ((uint32_t)row[3] << 16);
    }
    float x[4] = {kv_u2f(w0 << 16), kv_u2f(w0 & 0xffff0000u), kv_u2f(w1 << 16), kv_u2f(w1 & 0xffff0000u)};

    // RMS norm in the defined order (math::sum_squares_128, math::inv_rms_128).
    float s = kv_fmaf(x[0], x[0], x[1] * x[1]) + kv_fmaf(x[2], x[2], x[3] * x[3]);
    for (int h = 16; h >= 1; h >>= 1) s = s + kv_shfl_xor(s, h);
    float inv = kv_divf(1.0f, kv_sqrtf(kv_fmaf(s, 1.0f / 128.0f, p.eps)));
    bool w_bf16 = (p.flags & (KV_F_W_F16 | KV_F_W_F32)) == 0u;
    bool w_f16 = (p.flags & KV_F_W_F16) != 0u;
    float y[4];
    for (int j = 0; j < 4; ++j) {
        float w = kv_ik_widen(p.weight, 4 * (int64_t)lane + j, w_bf16, w_f16);
        y[j] = kv_bf16_to_f32(kv_bf16_from_f32(x[j] * inv * w));
    }

    // GPT-J RoPE: pairs 2l and 2l + 1; pairs 32..63 (lanes 16..31) rotate
    // with cos/sin row `base`, the NoPE pairs run the same arithmetic with
    // (1, 0) (math::rope_pair).
    float c[2] = {1.0f, 1.0f}, sn[2] = {0.0f, 0.0f};
    if (lane >= 16u) {
        bool cs_bf16 = (p.flags & KV_F_COS_BF16) != 0u;
        bool cs_f16 = (p.flags & KV_F_COS_F16) != 0u;
        int64_t at = base * (int64_t)p.cos_row_stride + 2 * (int64_t)(lane - 16u);
        for (int m = 0; m < 2; ++m) {
            c[m] = kv_ik_widen(p.cos_sin, at + m, cs_bf16, cs_f16);
            sn[m] = kv_ik_widen(p.cos_sin, at + 32 + m, cs_bf16, cs_f16);
        }
    }
    for (int m = 0; m < 2; ++m) {
        float re, ro;
        kv_rope_pair(y[2 * m], y[2 * m + 1], c[m], sn[m], &re, &ro);
        r[2 * m] = kv_bf16_to_f32(kv_bf16_from_f32(re));
        r[2 * m + 1] = kv_bf16_to_f32(kv_bf16_from_f32(ro));
    }
    return true;
}

// FP8: one power-of-two scale a token (math::block_scale_exponent of
// f32(max(amax, 1e-4) / 448)), four e4m3 bytes a lane.
KV_KERNEL KV_LAUNCH_BOUNDS_8(KV_BLOCK_THREADS) void kv_indexer_k_fp8(const KvIndexerKParams p) {
    int64_t t = kv_group(p.flags);
    if (t >= p.n) return;
    unsigned lane = kv_lane();
    int64_t slot;
    float r[4];
    if (!kv_ik_rotated(p, t, lane, &slot, r)) return;
    float amax = kv_fmax_nonneg(kv_fmax_nonneg(kv_fabsf(r[0]), kv_fabsf(r[1])),
                                kv_fmax_nonneg(kv_fabsf(r[2]), kv_fabsf(r[3])));
    for (int h = 16; h >= 1; h >>= 1) amax = kv_fmax_nonneg(amax, kv_shfl_xor(amax, h));
    amax = kv_fmax_nonneg(amax, 1e-4f);
    int e;
    bool finite = kv_block_scale_exponent(amax * kv_u2f(KV_IK_INV_448), &e);
    float mul = kv_block_scale_multiplier(finite, e);
    uint32_t word = 0u;
    for (int j = 0; j < 4; ++j) word |= (uint32_t)kv_e4m3_from_f32(kv_e4m3_nan_to_max(r[j] * mul)) << (8 * j);

    int64_t row;
    int64_t page = kv_page_row(slot, p.block_size, p.block_shift, &row);
    uint8_t* base = p.cache + page * (int64_t)p.block_stride;
    *(uint32_t*)(base + kv_ik_value_at<128>(p, row, 4u * lane)) = word;
    if (lane == 0u) {
        uint32_t scale;
        if (p.flags & KV_IKF_MX_SCALE) {
            scale = (finite ? (uint32_t)(e + 127) : 255u) * 0x01010101u;
        } else {
            scale = finite ? kv_f2u(kv_pow2(e)) : 0x7f800000u;
        }
        *(uint32_t*)(base + kv_ik_scale_at<128>(p, row, 0u)) = scale;
    }
}

// MXFP4: per 32 dims (8 lanes) a UE8M0 scale, e = ceil(log2f(f32(max(amax,
// 6 2^-126) / 6))) clamped to [-127, 127]; codes e2m1(f32(r 2^-e)), the even
// dim in the low nibble.
KV_KERNEL KV_LAUNCH_BOUNDS_8(KV_BLOCK_THREADS) void kv_indexer_k_mxfp4(const KvIndexerKParams p) {
    int64_t t = kv_group(p.flags);
    if (t >= p.n) return;
    unsigned lane = kv_lane();
    int64_t slot;
    float r[4];
    if (!kv_ik_rotated(p, t, lane, &slot, r)) return;
    float amax = kv_fmax_nonneg(kv_fmax_nonneg(kv_fabsf(r[0]), kv_fabsf(r[1])),
                                kv_fmax_nonneg(kv_fabsf(r[2]), kv_fabsf(r[3])));
    for (int h = 4; h >= 1; h >>= 1) amax = kv_fmax_nonneg(amax, kv_shfl_xor(amax, h));
    amax = kv_fmax_nonneg(amax, kv_u2f(0x01400000u));  // 6 * 2^-126
    int e;
    bool finite = kv_block_scale_exponent(amax * kv_u2f(KV_IK_INV_6), &e);
    e = finite ? (e < -127 ? -127 : (e > 127 ? 127 : e)) : 127;
    // 2^-e exactly; 2^-127 is subnormal, below kv_pow2's range.
    float mul = e == 127 ? kv_u2f(0x00400000u) : kv_pow2(-e);
    uint32_t half = 0u;
    for (int j = 0; j < 4; ++j) {
        float q = r[j] * mul;
        uint32_t sign = (kv_f2u(kv_fmin_nan_ignoring(q, kv_u2f(0x7f800000u))) >> 28) & 8u;
        uint32_t code = kv_e2m1_magnitude_bits(kv_fmax_nonneg(kv_fabsf(q), 0.0f)) | sign;
        half |= code << (4 * j);
    }

    int64_t row;
    int64_t page = kv_page_row(slot, p.block_size, p.block_shift, &row);
    uint8_t* base = p.cache + page * (int64_t)p.block_stride;
    *(uint16_t*)(base + kv_ik_value_at<64>(p, row, 2u * lane)) = (uint16_t)half;
    if ((lane & 7u) == 0u) base[kv_ik_scale_at<64>(p, row, lane >> 3)] = (uint8_t)(e + 127);
}
