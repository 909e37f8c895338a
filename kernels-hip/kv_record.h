// One token's record (rope_quant_insert's work, shared with the fused
// kernels): the RoPE rotation, the FP8 and NVFP4 quantizers, the insert
// rule's checks and kv_write_record, which encodes a tile of any layout.
#pragma once

#include "kv_common.h"

// ---- rope_quant_insert: one token's record ---------------------------------

// cos and sin of the N RoPE pairs 224 + k0 .. 224 + k0 + N from row `base`.
// WIDE: the generic kernels, which also read an F16 table.
template <int N, bool WIDE = false>
KV_DEVICE void kv_load_cos_sin(const KvInsertParams& p, int64_t base, int64_t k0, float c[N], float s[N]) {
    if constexpr (WIDE) {
        if (p.flags & KV_F_COS_F16) {
            const uint16_t* row = (const uint16_t*)p.cos_sin + base * p.cos_row_stride;
#pragma unroll
            for (int j = 0; j < N; ++j) {
                c[j] = kv_f16_to_f32(row[k0 + j]);
                s[j] = kv_f16_to_f32(row[32 + k0 + j]);
            }
            return;
        }
    }
    if (p.flags & KV_F_COS_BF16) {
        const uint16_t* row = (const uint16_t*)p.cos_sin + base * p.cos_row_stride;
#pragma unroll
        for (int j = 0; j < N; ++j) {
            c[j] = kv_bf16_to_f32(row[k0 + j]);
            s[j] = kv_bf16_to_f32(row[32 + k0 + j]);
        }
    } else {
        const float* row = (const float*)p.cos_sin + base * p.cos_row_stride;
#pragma unroll
        for (int j = 0; j < N; ++j) {
            c[j] = row[k0 + j];
            s[j] = row[32 + k0 + j];
        }
    }
}

// cos and sin of RoPE tile k's pairs 224 + 8 (k - 28) .. + 8.
template <bool WIDE = false>
KV_DEVICE void kv_load_cos_sin8(const KvInsertParams& p, int64_t base, unsigned k, float c[8], float s[8]) {
    kv_load_cos_sin<8, WIDE>(p, base, 8 * (int64_t)(k - 28u), c, s);
}

// The rotated 16 dims of tile k (dims 16 k .. 16 k + 16) from the latent's
// BF16 bits: NoPE tiles (k < 28) run the rotation with (c, s) = (1, 0),
// RoPE tiles with the cos/sin row `base`.
//
// TILES (the tile-major inserts, where a warp's tiles are almost all of one
// kind): NoPE tiles take their own path, one fma per value, and the BF16
// bits are widened inside each path (those kernels sit at their register
// limit). Otherwise (a token per group: lanes 28..31 of every warp rotate)
// both kinds run the one sequence, NoPE lanes with constant (1, 0); two
// paths would cost such a warp both. TIGHT (the 32-register inserts): the
// cos/sin by halves, four pairs live instead of eight.
template <bool TILES, bool WIDE = false, bool TIGHT = false>
KV_DEVICE void kv_rotate16(const KvInsertParams& p, int64_t base, unsigned k, const uint16_t h[16], float r[16]) {
    float c[8], s[8];
    if (TILES && k < 28u) {
#pragma unroll
        for (int j = 0; j < 8; ++j)
            kv_rope_nope_pair(kv_bf16_to_f32(h[2 * j]), kv_bf16_to_f32(h[2 * j + 1]), &r[2 * j], &r[2 * j + 1]);
        return;
    }
    if (TILES || TIGHT) {
        // Four pairs at a time; a tile-major NoPE tile has returned above.
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            if (k >= 28u) {
                kv_load_cos_sin<4, WIDE>(p, base, 8 * (int64_t)(k - 28u) + 4 * half, c, s);
            } else {
#pragma unroll
                for (int j = 0; j < 4; ++j) {
                    c[j] = 1.0f;
                    s[j] = 0.0f;
                }
            }
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                int i = 4 * half + j;
                kv_rope_pair(kv_bf16_to_f32(h[2 * i]), kv_bf16_to_f32(h[2 * i + 1]), c[j], s[j], &r[2 * i],
                             &r[2 * i + 1]);
            }
        }
        return;
    }
    if (k >= 28u) {
        kv_load_cos_sin8<WIDE>(p, base, k, c, s);
    } else {
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            c[j] = 1.0f;
            s[j] = 0.0f;
        }
    }
#pragma unroll
    for (int j = 0; j < 8; ++j)
        kv_rope_pair(kv_bf16_to_f32(h[2 * j]), kv_bf16_to_f32(h[2 * j + 1]), c[j], s[j], &r[2 * j], &r[2 * j + 1]);
}

// Tile k of a row layout (BF16 or FP8 rows, the tile-major inserts) rotated
// and rounded to BF16, pair j in w[j] (even dim low): what BF16 rows store
// and FP8 rows scale. The RoPE pairs load their cos/sin four at a time; the
// NoPE pairs' rotation by (1, 0) gives BF16 numbers, so they need no
// rounding, only the canonical NaN (kv_bf16x2_of_bf16_numbers), and not
// even that with ANY_NAN (FP8 rows, whose encoder maps every NaN to 448).
// At most 8 words and 4 cos/sin pairs are live, so that the FP8 rows' kernel
// fits 32 registers (KV_LAUNCH_BOUNDS_8).
template <bool ANY_NAN>
KV_DEVICE void kv_rotate16_bf16x2(const KvInsertParams& p, int64_t base, unsigned k, const uint16_t h[16],
                                  uint32_t w[8]) {
    if (k < 28u) {
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            uint32_t pair = (uint32_t)h[2 * j] | ((uint32_t)h[2 * j + 1] << 16);
            if (ANY_NAN) {
                w[j] = kv_rope_nope_pair_bf16x2_any_nan(pair);
            } else {
                float re, ro;
                kv_rope_nope_pair(kv_u2f(pair << 16), kv_u2f(pair & 0xffff0000u), &re, &ro);
                w[j] = kv_bf16x2_of_bf16_numbers(re, ro);
            }
        }
        return;
    }
#pragma unroll
    for (int half = 0; half < 2; ++half) {
        float c[4], s[4];
        kv_load_cos_sin<4>(p, base, 8 * (int64_t)(k - 28u) + 4 * half, c, s);
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            int i = 4 * half + j;
            float re, ro;
            kv_rope_pair(kv_bf16_to_f32(h[2 * i]), kv_bf16_to_f32(h[2 * i + 1]), c[j], s[j], &re, &ro);
            w[i] = kv_bf16x2_from_f32(re, ro);
        }
    }
}

// FP8 rows' codes of 16 BF16 values (pairs in w, even dim low) under the
// per-tensor scale: e4m3 of each value times its reciprocal, every NaN
// product 448 (kv_e4m3_nan_to_max), as four little-endian words.
KV_DEVICE void kv_fp8_row_codes(const uint32_t w[8], float fp8_scale, uint32_t q[4]) {
    float inv = kv_divf(1.0f, fp8_scale);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        uint32_t a = w[2 * j], b = w[2 * j + 1];
        q[j] = kv_e4m3x2_from_f32_nonnan(kv_e4m3_nan_to_max(kv_u2f(a << 16) * inv),
                                         kv_e4m3_nan_to_max(kv_u2f(a & 0xffff0000u) * inv)) |
               (kv_e4m3x2_from_f32_nonnan(kv_e4m3_nan_to_max(kv_u2f(b << 16) * inv),
                                          kv_e4m3_nan_to_max(kv_u2f(b & 0xffff0000u) * inv))
                << 16);
    }
}

// cos and sin of RoPE pair 224 + k from row `base` (k < 32); WIDE as in
// kv_load_cos_sin8.
template <bool WIDE = false>
KV_DEVICE void kv_cos_sin_at(const KvInsertParams& p, int64_t base, unsigned k, float* c, float* s) {
    if constexpr (WIDE) {
        if (p.flags & KV_F_COS_F16) {
            const uint16_t* row = (const uint16_t*)p.cos_sin + base * p.cos_row_stride;
            *c = kv_f16_to_f32(row[k]);
            *s = kv_f16_to_f32(row[32 + k]);
            return;
        }
    }
    if (p.flags & KV_F_COS_BF16) {
        const uint16_t* row = (const uint16_t*)p.cos_sin + base * p.cos_row_stride;
        *c = kv_bf16_to_f32(row[k]);
        *s = kv_bf16_to_f32(row[32 + k]);
    } else {
        const float* row = (const float*)p.cos_sin + base * p.cos_row_stride;
        *c = row[k];
        *s = row[32 + k];
    }
}

// The BF16 bits of dims 448 + 2 lane (low half) and 449 + 2 lane (high half):
// lane 28 + lane / 8 holds them as its pair lane % 8. Every lane offers each
// of its eight pairs in turn and keeps the one it needs.
KV_DEVICE uint32_t kv_gather_rope_pair(const uint16_t h[16], unsigned lane) {
    unsigned src = 28u + (lane >> 3);
    uint32_t got = 0u;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
        uint32_t w = (uint32_t)h[2 * j] | ((uint32_t)h[2 * j + 1] << 16);
        uint32_t v = kv_shfl_idx_u32(w, src);
        got = (lane & 7u) == (unsigned)j ? v : got;
    }
    return got;
}

// NaN-ignoring max of |v| over 16 values, as a tree: the max is associative
// and commutative (NaN only if all are), so this equals the sequential fold
// of math.rs while cutting the dependent chain from 16 steps to 4. The
// operands are absolute values, so the preludes' kv_fmax_nonneg applies.
KV_DEVICE float kv_amax16(const float v[16]) {
    float a[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) a[j] = kv_fmax_nonneg(kv_fabs(v[j]), kv_fabs(v[j + 8]));
#pragma unroll
    for (int j = 0; j < 4; ++j) a[j] = kv_fmax_nonneg(a[j], a[j + 4]);
    a[0] = kv_fmax_nonneg(a[0], a[2]);
    a[1] = kv_fmax_nonneg(a[1], a[3]);
    return kv_fmax_nonneg(a[0], a[1]);
}

// Quantizes 16 values of an FP8 block spread over `lanes_per_block` lanes
// (V4: 4, MXFP8: 2) into their codes as words (kv_e4m3_words_from_f32_x16);
// returns the block's UE8M0 byte (same on its lanes).
KV_DEVICE uint8_t kv_quantize_fp8_part(const float q[16], int lanes_per_block, bool sanitize, uint32_t out[4]) {
    float amax = kv_fmax_nonneg(KV_AMAX_FLOOR, kv_amax16(q));
    for (int h = 1; h < lanes_per_block; h *= 2) amax = kv_fmax_nonneg(amax, kv_shfl_xor(amax, h));
    int e = 0;
    bool finite = kv_block_scale_exponent(amax * KV_INV_448, &e);
    float mult = kv_block_scale_multiplier(finite, e);
    float c[16];
#pragma unroll
    for (int j = 0; j < 16; ++j) c[j] = kv_e4m3_nan_to_max(q[j] * mult);
    kv_e4m3_words_from_f32_x16(c, out);
    return kv_ue8m0_scale_byte(finite, e, sanitize);
}

// The e4m3 scale code of an NVFP4 tile whose NaN-ignoring amax is amax
// (a NaN or 0 where every value is NaN: either gives the smallest scale).
KV_DEVICE uint8_t kv_nvfp4_scale_code(float amax) {
    float t = kv_min_nan_ignoring(kv_fmax_nonneg(amax * KV_INV_6, KV_NVFP4_SCALE_MIN), 448.0f);
    return kv_e4m3_from_f32_nonnan(t);  // t is finite: in [2^-9, 448]
}

#if defined(KV_E2M1_BF16X2)
// The BF16-pair reciprocal (yhi, ylo) of the NVFP4 scale of e4m3 code `code`.
KV_DEVICE void kv_nvfp4_code_reciprocal_bf16x2(uint8_t code, uint32_t* yhi, uint32_t* ylo) {
    float scale, y;
    kv_nvfp4_scale(code, &scale, &y);
    kv_nvfp4_reciprocal_bf16x2(scale, y, yhi, ylo);
}

// A NoPE tile of NVFP4 straight from the latent's BF16 pairs (the
// tile-major inserts on sm_90+): the rotation by (1, 0) on each pair
// (kv_rope_nope_pair_bf16x2), whose halves are BF16 numbers and so their
// own encoder keys; the amax as the NaN-ignoring maximum of the keys'
// magnitudes (a NaN made 0, which changes no scale code); then the codes
// as kv_quantize_nvfp4_tile's. No f32 value is formed.
KV_DEVICE uint8_t kv_quantize_nvfp4_nope_tile_bf16x2(const uint16_t h[16], uint32_t out[2]) {
    uint32_t v[8], z[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
        uint32_t key = kv_rope_nope_pair_bf16x2((uint32_t)h[2 * j] | ((uint32_t)h[2 * j + 1] << 16));
        v[j] = kv_bf16x2_magnitude_nonnan(key);
        z[j] = kv_hw_bf16x2_min(key, 0x7f807f80u);
    }
    uint32_t a[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) a[j] = kv_hw_bf16x2_max(v[j], v[j + 4]);
    a[0] = kv_hw_bf16x2_max(kv_hw_bf16x2_max(a[0], a[2]), kv_hw_bf16x2_max(a[1], a[3]));
    float amax = kv_fmax_nonneg(kv_u2f(a[0] << 16), kv_u2f(a[0] & 0xffff0000u));
    uint8_t code = kv_nvfp4_scale_code(amax);
    uint32_t yhi, ylo;
    kv_nvfp4_code_reciprocal_bf16x2(code, &yhi, &ylo);
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
        uint32_t b[2];
#pragma unroll
        for (int g = 0; g < 2; ++g) {
            int j = 4 * hh + 2 * g;
            b[g] = kv_e2m1x4_bytes_bf16x2(kv_e2m1x2_magnitudes_bf16x2(v[j], yhi, ylo), z[j],
                                          kv_e2m1x2_magnitudes_bf16x2(v[j + 1], yhi, ylo), z[j + 1]);
        }
        out[hh] = kv_hw_byte_perm_sx(b[0], b[1], 0x5410u);
    }
    return code;
}
#endif

// One NVFP4 tile (the lane's 16 dims): 8 bytes of e2m1 pairs as two
// little-endian words; returns the e4m3 scale byte.
KV_DEVICE uint8_t kv_quantize_nvfp4_tile(const float r[16], uint32_t out[2]) {
    float amax = kv_amax16(r);
    uint8_t code = kv_nvfp4_scale_code(amax);
#if defined(KV_E2M1_BF16X2)
    uint32_t yhi, ylo;
    kv_nvfp4_code_reciprocal_bf16x2(code, &yhi, &ylo);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        uint32_t b[2];
#pragma unroll
        for (int g = 0; g < 2; ++g) {
            const float* v = r + 8 * h + 4 * g;
            uint32_t ma, za, mb, zb;
            kv_e2m1x2_of_quotient_bf16x2(kv_f2u(v[0]), kv_f2u(v[1]), yhi, ylo, &ma, &za);
            kv_e2m1x2_of_quotient_bf16x2(kv_f2u(v[2]), kv_f2u(v[3]), yhi, ylo, &mb, &zb);
            b[g] = kv_e2m1x4_bytes_bf16x2(ma, za, mb, zb);
        }
        out[h] = kv_hw_byte_perm_sx(b[0], b[1], 0x5410u);
    }
#else
    float scale, y;
    kv_nvfp4_scale(code, &scale, &y);
    uint8_t q[8];
#pragma unroll
    for (int k = 0; k < 8; ++k) {
        uint8_t lo = kv_e2m1_of_quotient(r[2 * k], scale, y);
        uint8_t hi = kv_e2m1_of_quotient(r[2 * k + 1], scale, y);
        q[k] = (uint8_t)(lo + (hi << 4));
    }
    out[0] = (uint32_t)q[0] | ((uint32_t)q[1] << 8) | ((uint32_t)q[2] << 16) | ((uint32_t)q[3] << 24);
    out[1] = (uint32_t)q[4] | ((uint32_t)q[5] << 8) | ((uint32_t)q[6] << 16) | ((uint32_t)q[7] << 24);
#endif
    return code;
}

KV_DEVICE float kv_sanitized(float v, bool sanitize) { return (sanitize && kv_isnan(v)) ? 0.0f : v; }

// The insert rule's checks for token t, given its slot and position
// (counting skips); on success sets the cos/sin row.
// CR1_ONLY: the caller's launch is CR1 (the tile-major inserts), and the
// compress-ratio test compiles away.
template <bool CR1_ONLY>
KV_DEVICE bool kv_insert_check(const KvInsertParams& p, int64_t slot, int64_t pos, unsigned tile,
                               int64_t* base_out) {
    if (slot < 0) return false;
    if (pos < 0) {
        kv_count(p.counters, KV_COUNT_POS, tile);
        return false;
    }
    // compress_ratio is 1 or 2 (validated): boundary iff (pos + 1) % cr == 0.
    bool cr2 = !CR1_ONLY && p.compress_ratio == 2u;
    if (cr2 && (pos & 1) == 0) return false;
    int64_t base = cr2 ? (pos & ~(int64_t)1) : pos;
    if (base >= p.cos_rows) {
        kv_count(p.counters, KV_COUNT_POS, tile);
        return false;
    }
    if (slot >= (int64_t)p.num_blocks * p.block_size) {
        kv_count(p.counters, KV_COUNT_SLOT, tile);
        return false;
    }
    *base_out = base;
    return true;
}

// V4's RoPE word of lane `tile`: its pair (dims 448 + 2 tile, 449 + 2 tile,
// BF16 bits, even dim low) rotated with cos/sin row `base`, as BF16.
template <bool WIDE>
KV_DEVICE uint32_t kv_v4_rope_word(const KvInsertParams& p, int64_t base, unsigned tile, uint32_t pair,
                                   bool sanitize) {
    float c, sn;
    kv_cos_sin_at<WIDE>(p, base, tile, &c, &sn);
    float re, ro;
    kv_rope_pair(kv_bf16_to_f32((uint16_t)(pair & 0xffffu)), kv_bf16_to_f32((uint16_t)(pair >> 16)), c, sn, &re,
                 &ro);
    return kv_bf16x2_from_f32(kv_sanitized(re, sanitize), kv_sanitized(ro, sanitize));
}

// Whether the launch writes the paged records in the per-token order.
KV_DEVICE bool kv_per_token(const KvInsertParams& p) {
    return (p.flags & KV_F_PER_TOKEN) != 0u;
}

// Stores an NVFP4 tile's 8 bytes and its scale byte into slot's record.
KV_DEVICE void kv_store_nvfp4_tile(const KvInsertParams& p, int64_t slot, unsigned tile, const uint32_t q[2],
                                   uint8_t sb) {
    int64_t row;
    int64_t block = kv_page_row(slot, p.block_size, p.block_shift, &row);
    uint8_t *values, *scales;
    kv_record_at<256, 32>(p.cache + block * p.block_stride, row, p.block_size, kv_per_token(p), &values, &scales);
    kv_u32x2 w;
    w.x = q[0];
    w.y = q[1];
    *(kv_u32x2*)(values + 8 * tile) = w;
    scales[tile] = sb;
}

// An MXFP8 record's codes and scales in its page (row `row` of
// `page`).
KV_DEVICE void kv_mxfp8_row(const KvInsertParams& p, uint8_t* page, int64_t row, uint8_t** values, uint8_t** scales) {
    kv_record_at<512, 16>(page, row, p.block_size, kv_per_token(p), values, scales);
}

// Writes token's record from its BF16 latent: the 16 dims of tile `tile`
// (dims 16 tile .. 16 tile + 16). A group's lane l holds tile l; the
// tile-major inserts below map threads to tiles differently, and V4, whose
// RoPE pairs cross lanes, always runs on groups. FP8 rows take the
// per-tensor scale the caller loaded with its first reads. PAIR_LOADED (V4
// inserts, whose latent is in memory): `pair` is the lane's RoPE pair,
// loaded with the latent, instead of gathered from the other lanes. WIDE:
// the generic kernels' table types (kv_load_cos_sin8). TIGHT: the
// 32-register inserts of large launches (kv_insert_v4_large,
// kv_insert_mxfp8_large), which order the work to fit: the rotation's
// cos/sin by halves, V4's RoPE pair before its FP8 part, MXFP8's page after
// its codes. Every other writer keeps the order measured fastest at its
// own register cap (docs/tuning.md, Occupancy caps).
template <int LAYOUT, bool TILES, bool PAIR_LOADED = false, bool WIDE = false, bool TIGHT = false>
KV_DEVICE void kv_write_record(const KvInsertParams& p, int64_t slot, int64_t base, unsigned tile,
                               const uint16_t h[16], float fp8_scale, uint32_t pair = 0u) {
    const bool sanitize = (p.flags & KV_F_SANITIZE) != 0u;
#if defined(KV_E2M1_BF16X2)
    // Tile-major NoPE tiles of NVFP4 (whole warps of them) skip the f32 values.
    if (LAYOUT == KV_LAYOUT_NVFP4 && TILES && tile < 28u) {
        uint32_t q[2];
        uint8_t sb = kv_quantize_nvfp4_nope_tile_bf16x2(h, q);
        kv_store_nvfp4_tile(p, slot, tile, q, sb);
        return;
    }
#endif
    if ((LAYOUT == KV_LAYOUT_BF16 || LAYOUT == KV_LAYOUT_FP8) && TILES) {
        uint32_t w[8];
        kv_rotate16_bf16x2<LAYOUT == KV_LAYOUT_FP8>(p, base, tile, h, w);
        int64_t row;
        int64_t block = kv_page_row(slot, p.block_size, p.block_shift, &row);
        uint8_t* dst = p.cache + block * p.block_stride + row * p.row_stride;
        if (LAYOUT == KV_LAYOUT_BF16) {
            kv_store16w(dst + 32 * tile, w);
            kv_store16w(dst + 32 * tile + 16, w + 4);
        } else {
            uint32_t q[4];
            kv_fp8_row_codes(w, fp8_scale, q);
            kv_store16w(dst + 16 * tile, q);
        }
        return;
    }
    // V4's RoPE pair first, while the latent is still packed: the fused CR2
    // kernels sit at their register limit.
    uint32_t v4_pair = LAYOUT != KV_LAYOUT_V4 ? 0u : PAIR_LOADED ? pair : kv_gather_rope_pair(h, tile);
    float x[16], r[16];
    if (LAYOUT == KV_LAYOUT_V4) {
#pragma unroll
        for (int j = 0; j < 16; ++j) x[j] = kv_bf16_to_f32(h[j]);
    } else {
        kv_rotate16<TILES, WIDE, TIGHT>(p, base, tile, h, r);  // V4 rotates by pairs below
    }
    // The record's page and row; the TIGHT MXFP8 path finds them after its
    // codes, every other path here.
    constexpr bool PAGE_LATE = TIGHT && LAYOUT == KV_LAYOUT_MXFP8;
    int64_t row;
    uint8_t* page;
    if (!PAGE_LATE) {
        int64_t block = kv_page_row(slot, p.block_size, p.block_shift, &row);
        page = p.cache + block * p.block_stride;
    }

    if (LAYOUT == KV_LAYOUT_V4) {
        // Page-planar only (RecordOrder: a 584 B record is 8-byte aligned).
        uint8_t* values = page + row * 576;
        uint8_t* scales = page + p.block_size * 576 + row * 8;
        // RoPE part: one GPT-J pair per lane (pair 224 + lane, dims
        // 448 + 2 lane and 449 + 2 lane), gathered from lanes 28..31, which
        // hold those dims, or loaded (PAIR_LOADED); one lane rotating 16 dims
        // while the others waited was most of this kernel's time.
        uint32_t out = TIGHT ? kv_v4_rope_word<WIDE>(p, base, tile, v4_pair, sanitize) : 0u;
        // NoPE: the unrotated latent, blocks of 64 dims = 4 lanes. Every lane
        // joins the shuffles; lanes 0..27 write the FP8 part.
        uint32_t q[4];
        uint8_t sb = kv_quantize_fp8_part(x, 4, sanitize, q);
        if (tile < 28u) {
            kv_store16w(values + 16 * tile, q);
            if ((tile & 3u) == 0u) scales[tile / 4u] = sb;
        } else if (tile == 28u) {
            scales[7] = 0;
        }
        if (!TIGHT) out = kv_v4_rope_word<WIDE>(p, base, tile, v4_pair, sanitize);
        *(uint32_t*)(values + 448 + 4 * tile) = out;
    } else if (LAYOUT == KV_LAYOUT_MXFP8) {
        uint8_t *values, *scales;
        if (!PAGE_LATE) kv_mxfp8_row(p, page, row, &values, &scales);
        // A uniform branch: with sanitizing off (the default) the tile pays
        // nothing for it.
        if (sanitize) {
#pragma unroll
            for (int j = 0; j < 16; ++j) r[j] = kv_sanitized(r[j], sanitize);
        }
        uint32_t q[4];
        uint8_t sb = kv_quantize_fp8_part(r, 2, sanitize, q);
        if (PAGE_LATE) {
            int64_t block = kv_page_row(slot, p.block_size, p.block_shift, &row);
            kv_mxfp8_row(p, p.cache + block * p.block_stride, row, &values, &scales);
        }
        kv_store16w(values + 16 * tile, q);
        if ((tile & 1u) == 0u) scales[tile / 2u] = sb;
    } else if (LAYOUT == KV_LAYOUT_NVFP4) {
        uint8_t *values, *scales;
        kv_record_at<256, 32>(page, row, p.block_size, kv_per_token(p), &values, &scales);
        // No sanitizing pass: it cannot change an NVFP4 byte. A NaN and the
        // +0 it would become both give code 0 and both leave the tile's
        // NaN-ignoring amax alone (an all-NaN tile and an all-zero one both
        // clamp to the 2^-9 scale). The parity tests cover both settings.
        uint32_t q[2];
        uint8_t sb = kv_quantize_nvfp4_tile(r, q);
        if (TILES) {
            kv_store_nvfp4_tile(p, slot, tile, q, sb);
        } else {
            // The page and row computed above: through kv_store_nvfp4_tile
            // ptxas schedules every fused NVFP4 kernel differently, and the
            // fused CR2 rows measured 1-2.4 % slower (docs/tuning.md, "One store
            // helper for every NVFP4 writer").
            kv_u32x2 w;
            w.x = q[0];
            w.y = q[1];
            *(kv_u32x2*)(values + 8 * tile) = w;
            scales[tile] = sb;
        }
    } else if (LAYOUT == KV_LAYOUT_BF16) {
        uint16_t o[16];
        kv_bf16x16_from_f32(r, o);
        kv_store16h((uint16_t*)(page + row * p.row_stride) + 16 * tile, o);
    } else {
        float inv = kv_divf(1.0f, fp8_scale);
        uint32_t q[4];
        float c[16];
#pragma unroll
        for (int j = 0; j < 16; j += 2) {
            // The BF16 rounding's NaN is some NaN; kv_e4m3_nan_to_max maps
            // every NaN product to 448.
            float b0, b1;
            kv_bf16_round_pair_any_nan(r[j], r[j + 1], &b0, &b1);
            c[j] = kv_e4m3_nan_to_max(b0 * inv);
            c[j + 1] = kv_e4m3_nan_to_max(b1 * inv);
        }
        kv_e4m3_words_from_f32_x16(c, q);
        kv_store16w(page + row * p.row_stride + 16 * tile, q);
    }
}

// FP8 rows' per-tensor scale (the plan guarantees it exists for that layout).
template <int LAYOUT>
KV_DEVICE float kv_load_fp8_scale(const KvInsertParams& p) {
    return LAYOUT == KV_LAYOUT_FP8 ? *p.fp8_scale : 1.0f;
}
