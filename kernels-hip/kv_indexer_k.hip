// Entry points of indexer_k_norm_rope_store: the V4.1 indexer's keys, RMS
// norm, GPT-J RoPE and FP8 (132 B) or MXFP4 (68 B) records in one of three
// page orders. Twin of src/operations/indexer_k/reference.rs; the math is
// kv_math.h's and kv_formats.h's.
//
// A group of 32 lanes holds four tokens, eight lanes each (the host
// launches ceil(N / 4) groups); lane s of a token owns dims 16 s .. 16 s + 15.
// Eight lanes rather than 32 a token: the norm's square root and division,
// the indices and the scale are a lane's per-token cost, and spread over 16
// values instead of 4 they leave a token's instructions under what its
// bytes take from memory (docs/tuning.md, The indexer key store's lanes).
// The norm's sum is defined over 32 virtual lanes of 4 values
// (math::sum_squares_128): a lane holds four of them, so the butterfly's
// distances 16, 8 and 4 cross lanes (xor 4, 2, 1 within the token's eight)
// and 2 and 1 stay in the lane. An FP8 record's scale is an 8-lane maximum,
// an MXFP4 block's a 2-lane one. Lanes 4..7 hold the rotated pairs. A lane
// stores its 16 FP8 bytes (8 MXFP4 bytes) at the order's address of its
// first byte, which every order keeps contiguous.
// All entry points: KV_KERNELS in kv_abi.h.
#include "kv_common.h"

// f32(1/448) and f32(1/6), the seed's constants (docs/numerics.md).
#define KV_IK_INV_448 0x3b124925u
#define KV_IK_INV_6 0x3e2aaaabu
// Lanes a token, and tokens a group of 32 lanes.
#define KV_IK_LANES 8u
#define KV_IK_TOKENS 4

// Byte offset in a page of value byte j of row r, for a record of W value
// bytes (the order is the launch's, so the choice never diverges). A page
// is under 2^31 bytes (its stride is an i32), so 32 bits hold any offset.
template <uint32_t W>
KV_DEVICE uint32_t kv_ik_value_at(const KvIndexerKParams& p, uint32_t r, uint32_t j) {
    if (p.flags & KV_IKF_TILED) return (r >> 4) * (16u * W) + (j >> 4) * 256u + (r & 15u) * 16u + (j & 15u);
    if (p.flags & KV_IKF_PRESHUFFLED) {
        // n_per_tile is 16, 32 or 64 (validated): a power of two.
        uint32_t shift = 31u - (uint32_t)__builtin_clz(p.n_per_tile);
        uint32_t lane = r & (p.n_per_tile - 1u);
        return ((r >> shift) * W << shift) + ((j >> 4) << (shift + 4u)) + lane * 16u + (j & 15u);
    }
    return r * W + j;
}

// Byte offset in a page of scale byte s of row r (after the page's values).
template <uint32_t W>
KV_DEVICE uint32_t kv_ik_scale_at(const KvIndexerKParams& p, uint32_t r, uint32_t s) {
    uint32_t values = (uint32_t)p.block_size * W;
    if (p.flags & KV_IKF_PRESHUFFLED) {
        uint32_t shift = 31u - (uint32_t)__builtin_clz(p.n_per_tile);
        uint32_t lane = r & (p.n_per_tile - 1u);
        // S_LO = 64 / n scale planes of n rows, S_HI = 4 / S_LO bytes a row.
        uint32_t lo_shift = 6u - shift;
        uint32_t hi_shift = 2u - lo_shift;
        uint32_t plane = s & ((1u << lo_shift) - 1u);
        return values + ((r >> shift) << (shift + 2u)) + ((plane << shift) << hi_shift) + (lane << hi_shift) +
               (s >> lo_shift);
    }
    return values + r * 4u + s;
}

// N consecutive values of an F32, BF16 or F16 table (the flags' `bf16` and
// `f16` bits), widened exactly: 16-byte loads where the address allows.
template <int N>
KV_DEVICE void kv_ik_widenN(const void* base, int64_t i, bool bf16, bool f16, float out[N]) {
    if (bf16 || f16) {
        const uint16_t* q = (const uint16_t*)base + i;
        uint16_t h[N];
        if ((((uint64_t)q) & 15u) == 0u) {
#pragma unroll
            for (int k = 0; k < N / 8; ++k) {
                kv_u32x4 w = ((const kv_u32x4*)q)[k];
                uint32_t u[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
                for (int j = 0; j < 4; ++j) {
                    h[8 * k + 2 * j] = (uint16_t)(u[j] & 0xffffu);
                    h[8 * k + 2 * j + 1] = (uint16_t)(u[j] >> 16);
                }
            }
        } else {
#pragma unroll
            for (int j = 0; j < N; ++j) h[j] = q[j];
        }
#pragma unroll
        for (int j = 0; j < N; ++j) out[j] = bf16 ? kv_bf16_to_f32(h[j]) : kv_f16_to_f32(h[j]);
        return;
    }
    const float* q = (const float*)base + i;
    if ((((uint64_t)q) & 15u) == 0u) {
#pragma unroll
        for (int k = 0; k < N / 4; ++k) {
            kv_u32x4 w = ((const kv_u32x4*)q)[k];
            out[4 * k] = kv_u2f(w.x);
            out[4 * k + 1] = kv_u2f(w.y);
            out[4 * k + 2] = kv_u2f(w.z);
            out[4 * k + 3] = kv_u2f(w.w);
        }
    } else {
#pragma unroll
        for (int j = 0; j < N; ++j) out[j] = q[j];
    }
}

// The lane's 16 rotated, BF16-rounded values of token t (lane s of its
// eight), and whether the token writes its record (false: past the last
// token, skipped, or counted when an index is out of range). Every lane of
// the group computes, whatever its token does: the norm's and the scale's
// shuffles need all 32 lanes (a token that writes nothing computes on row
// min(t, n - 1) with (1, 0) for cos/sin, and its results are dropped).
KV_DEVICE bool kv_ik_rotated(const KvIndexerKParams& p, int64_t t, unsigned s, int64_t* slot_out, float r[16]) {
    bool live = t < p.n;
    int64_t tl = live ? t : (int64_t)p.n - 1;
    int64_t slot = kv_load_index(p.slots, (p.flags & KV_F_SLOT_I64) != 0u, tl);
    int64_t pos = kv_load_index(p.positions, (p.flags & KV_F_POS_I64) != 0u, tl);
    // compress_ratio is 1 or 2 (validated): boundary iff (pos + 1) % cr == 0.
    bool cr2 = p.compress_ratio == 2u;
    int64_t base = cr2 ? (pos & ~(int64_t)1) : pos;
    // The reference's order of checks (a negative position is counted even
    // where it would not close a group).
    bool write = live && slot >= 0;
    if (write && pos < 0) {
        kv_count(p.counters, KV_COUNT_POS, s);
        write = false;
    } else if (write && cr2 && (pos & 1) == 0) {
        write = false;
    } else if (write && base >= p.cos_rows) {
        kv_count(p.counters, KV_COUNT_POS, s);
        write = false;
    } else if (write && slot >= (int64_t)p.num_blocks * p.block_size) {
        kv_count(p.counters, KV_COUNT_SLOT, s);
        write = false;
    }
    *slot_out = slot;
    t = tl;

    // k_pre's row stride is any (vLLM asks only for a unit inner stride):
    // two 16-byte loads where the lane's values are aligned for them.
    const uint16_t* row = p.k_pre + t * (int64_t)p.k_row_stride + 16u * s;
    uint16_t h[16];
    if ((((uint64_t)row) & 15u) == 0u) {
        kv_load16h(row, h);
    } else {
#pragma unroll
        for (int j = 0; j < 16; ++j) h[j] = row[j];
    }
    float x[16];
#pragma unroll
    for (int j = 0; j < 16; ++j) x[j] = kv_bf16_to_f32(h[j]);

    // The norm's sum in the defined order (math::sum_squares_128): virtual
    // lane 4 s + v holds x[4 v .. 4 v + 4] of this lane.
    float v[4];
#pragma unroll
    for (int k = 0; k < 4; ++k)
        v[k] = kv_fmaf(x[4 * k], x[4 * k], x[4 * k + 1] * x[4 * k + 1]) +
               kv_fmaf(x[4 * k + 2], x[4 * k + 2], x[4 * k + 3] * x[4 * k + 3]);
    // Butterfly distances 16, 8, 4 between virtual lanes: lanes s ^ 4, 2, 1.
#pragma unroll
    for (int h2 = 4; h2 >= 1; h2 >>= 1) {
#pragma unroll
        for (int k = 0; k < 4; ++k) v[k] = v[k] + kv_shfl_xor(v[k], h2);
    }
    // Distances 2 and 1 inside the lane.
    float w2[4] = {v[0] + v[2], v[1] + v[3], v[2] + v[0], v[3] + v[1]};
    float sum = w2[0] + w2[1];
    float inv = kv_divf(1.0f, kv_sqrtf(kv_fmaf(sum, 1.0f / 128.0f, p.eps)));

    bool w_bf16 = (p.flags & (KV_F_W_F16 | KV_F_W_F32)) == 0u;
    bool w_f16 = (p.flags & KV_F_W_F16) != 0u;
    float w[16];
    kv_ik_widenN<16>(p.weight, 16 * (int64_t)s, w_bf16, w_f16, w);
    float y[16];
#pragma unroll
    for (int j = 0; j < 16; ++j) y[j] = kv_bf16_to_f32(kv_bf16_from_f32(x[j] * inv * w[j]));

    // GPT-J RoPE: this lane's pairs 8 s .. 8 s + 7; pairs 32..63 (lanes
    // 4..7) rotate with cos/sin row `base`, the NoPE pairs run the same
    // arithmetic with (1, 0) (math::rope_pair).
    float c[8], sn[8];
#pragma unroll
    for (int m = 0; m < 8; ++m) {
        c[m] = 1.0f;
        sn[m] = 0.0f;
    }
    if (s >= 4u && write) {
        bool cs_bf16 = (p.flags & KV_F_COS_BF16) != 0u;
        bool cs_f16 = (p.flags & KV_F_COS_F16) != 0u;
        int64_t at = base * (int64_t)p.cos_row_stride + 8 * (int64_t)(s - 4u);
        kv_ik_widenN<8>(p.cos_sin, at, cs_bf16, cs_f16, c);
        kv_ik_widenN<8>(p.cos_sin, at + 32, cs_bf16, cs_f16, sn);
    }
#pragma unroll
    for (int m = 0; m < 8; ++m) {
        float re, ro;
        kv_rope_pair(y[2 * m], y[2 * m + 1], c[m], sn[m], &re, &ro);
        r[2 * m] = kv_bf16_to_f32(kv_bf16_from_f32(re));
        r[2 * m + 1] = kv_bf16_to_f32(kv_bf16_from_f32(ro));
    }
    return write;
}

// The NaN-ignoring maximum of |r| over the lane's 16 values.
KV_DEVICE float kv_ik_amax16(const float r[16]) {
    float a = kv_fabsf(r[0]);
#pragma unroll
    for (int j = 1; j < 16; ++j) a = kv_fmax_nonneg(a, kv_fabsf(r[j]));
    return a;
}

// FP8: one power-of-two scale a token (math::block_scale_exponent of
// f32(max(amax, 1e-4) / 448)), 16 e4m3 bytes a lane.
KV_KERNEL KV_LAUNCH_BOUNDS_4(KV_BLOCK_THREADS) void kv_indexer_k_fp8(const KvIndexerKParams p) {
    unsigned lane = kv_lane();
    unsigned s = lane & (KV_IK_LANES - 1u);
    int64_t t = kv_group(p.flags) * KV_IK_TOKENS + (lane >> 3);
    int64_t slot;
    float r[16];
    bool write = kv_ik_rotated(p, t, s, &slot, r);
    float amax = kv_ik_amax16(r);
    for (int h = 4; h >= 1; h >>= 1) amax = kv_fmax_nonneg(amax, kv_shfl_xor(amax, h));
    amax = kv_fmax_nonneg(amax, 1e-4f);
    int e;
    bool finite = kv_block_scale_exponent(amax * kv_u2f(KV_IK_INV_448), &e);
    float mul = kv_block_scale_multiplier(finite, e);
    // NaN to +448 first (the clamp), then the encoder that takes no NaN
    // (NVIDIA's satfinite pairs where the prelude has them).
    float q[16];
#pragma unroll
    for (int j = 0; j < 16; ++j) q[j] = kv_e4m3_nan_to_max(r[j] * mul);
    uint32_t words[4];
    kv_e4m3_words_from_f32_x16(q, words);

    if (!write) return;
    int64_t row;
    int64_t page = kv_page_row(slot, p.block_size, p.block_shift, &row);
    uint8_t* base = p.cache + page * (int64_t)p.block_stride;
    uint8_t* dst = base + kv_ik_value_at<128>(p, (uint32_t)row, 16u * s);
    if ((((uint64_t)dst) & 15u) == 0u) {
        kv_store16w(dst, words);
    } else {
        // Pages of a block size that is not a multiple of 4 are 4-byte aligned only.
#pragma unroll
        for (int k = 0; k < 4; ++k) ((uint32_t*)dst)[k] = words[k];
    }
    if (s == 0u) {
        uint32_t scale;
        if (p.flags & KV_IKF_MX_SCALE) {
            scale = (finite ? (uint32_t)(e + 127) : 255u) * 0x01010101u;
        } else {
            scale = finite ? kv_f2u(kv_pow2(e)) : 0x7f800000u;
        }
        *(uint32_t*)(base + kv_ik_scale_at<128>(p, (uint32_t)row, 0u)) = scale;
    }
}

// MXFP4: per 32 dims (2 lanes) a UE8M0 scale, e = ceil(log2f(f32(max(amax,
// 6 2^-126) / 6))) clamped to [-127, 127]; codes e2m1(f32(r 2^-e)), the even
// dim in the low nibble.
KV_KERNEL KV_LAUNCH_BOUNDS_4(KV_BLOCK_THREADS) void kv_indexer_k_mxfp4(const KvIndexerKParams p) {
    unsigned lane = kv_lane();
    unsigned s = lane & (KV_IK_LANES - 1u);
    int64_t t = kv_group(p.flags) * KV_IK_TOKENS + (lane >> 3);
    int64_t slot;
    float r[16];
    bool write = kv_ik_rotated(p, t, s, &slot, r);
    float amax = kv_ik_amax16(r);
    amax = kv_fmax_nonneg(amax, kv_shfl_xor(amax, 1));
    amax = kv_fmax_nonneg(amax, kv_u2f(0x01400000u));  // 6 * 2^-126
    int e;
    bool finite = kv_block_scale_exponent(amax * kv_u2f(KV_IK_INV_6), &e);
    e = finite ? (e < -127 ? -127 : (e > 127 ? 127 : e)) : 127;
    // 2^-e exactly; 2^-127 is subnormal, below kv_pow2's range.
    float mul = e == 127 ? kv_u2f(0x00400000u) : kv_pow2(-e);
    uint32_t words[2] = {0u, 0u};
#pragma unroll
    for (int j = 0; j < 16; ++j) {
        float q = r[j] * mul;
        uint32_t sign = (kv_f2u(kv_fmin_nan_ignoring(q, kv_u2f(0x7f800000u))) >> 28) & 8u;
        // The magnitude code is the low three bits of 2^23 + code.
        uint32_t code = (kv_e2m1_magnitude_bits(kv_fmax_nonneg(kv_fabsf(q), 0.0f)) & 7u) | sign;
        words[j >> 3] |= code << (4 * (j & 7));
    }

    if (!write) return;
    int64_t row;
    int64_t page = kv_page_row(slot, p.block_size, p.block_shift, &row);
    uint8_t* base = p.cache + page * (int64_t)p.block_stride;
    uint8_t* dst = base + kv_ik_value_at<64>(p, (uint32_t)row, 8u * s);
    if ((((uint64_t)dst) & 7u) == 0u) {
        kv_u32x2 w;
        w.x = words[0];
        w.y = words[1];
        *(kv_u32x2*)dst = w;
    } else {
        ((uint32_t*)dst)[0] = words[0];
        ((uint32_t*)dst)[1] = words[1];
    }
    if ((s & 1u) == 0u) base[kv_ik_scale_at<64>(p, (uint32_t)row, s >> 1)] = (uint8_t)(e + 127);
}
