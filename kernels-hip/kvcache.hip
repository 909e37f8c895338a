// dsv4-kvcache device kernels: fused_save_compress_norm, rope_quant_insert,
// save_ring_rows and the fused compress+insert. One source for HIP (gfx942,
// gfx950) and CUDA (sm_90, sm_100); vendor spellings live in the preludes.
//
// Work split: a token (or a CR2 request) is handled by a group of 32 lanes;
// lane l owns dims [16 l, 16 l + 16) of a 512-vector (tile l). The
// tile-major inserts at the end map a block's threads to tiles differently
// (kv_tile_of_thread), and there the tile index plays the lane's part; CR2
// teams (kv_part_offset) and save_ring_rows, whose lanes move values that
// no norm or record of theirs reads in place, give each group contiguous
// bytes instead.
// Lanes talk only through kv_shfl_xor (distances below 32) and kv_shfl_idx_u32 (a lane of the same
// group), which stay inside an aligned 32-lane group on 32-lane warps and on
// 64-lane wavefronts, so nothing here depends on the hardware's width. The
// host picks how many groups make a block (src/launch.rs, LaunchPolicy::geometry) and
// passes it in the flags word. Groups never wait for each other, so a group
// whose token is skipped simply returns; the one exception is the CR2 team
// kernels, where a block of four groups shares one item and meets at one
// barrier that the item's control flow brings every lane to.
//
// Every result is bit-identical to the CPU reference (src/reference.rs,
// src/backend/cpu.rs): the math is in kv_formats.h / kv_math.h, twins of
// src/formats.rs / src/math.rs.
#ifndef KV_PRELUDE_INCLUDED
#include "prelude.h"
#endif
#include "kv_formats.h"
#include "kv_math.h"
#include "kv_abi.h"

struct alignas(16) kv_u32x4 {
    uint32_t x, y, z, w;
};
struct alignas(8) kv_u32x2 {
    uint32_t x, y;
};

// ---- small helpers --------------------------------------------------------

KV_DEVICE unsigned kv_lane() { return kv_tid() & (KV_GROUP_LANES - 1u); }
// The group's token or request index. The block size comes from the flags
// word, not the dispatch: it is already in registers, and the block-size
// query costs scalar registers on AMD.
// Computed in 32 bits (a launch has fewer than 2^32 items: n and the
// request count are each below 2^31, src/ops.rs), which also tells the
// compiler that the index's high word is zero wherever it scales a stride.
KV_DEVICE int64_t kv_group(uint32_t flags) {
    uint32_t log2 = (flags >> KV_F_GROUPS_LOG2_SHIFT) & 7u;
    return (int64_t)((kv_bid() << log2) + kv_tid() / KV_GROUP_LANES);
}

KV_DEVICE int64_t kv_load_index(const void* p, bool is64, int64_t i) {
    return is64 ? ((const int64_t*)p)[i] : (int64_t)((const int32_t*)p)[i];
}

// a / b and a % b for a >= 0, b > 0. Indices almost always fit 32 bits,
// where the division is far cheaper (a 64-bit one is a long software
// sequence on both vendors and costs scalar registers on AMD).
KV_DEVICE int64_t kv_divmod(int64_t a, int64_t b, int64_t* rem) {
    if (((uint64_t)a | (uint64_t)b) <= 0xffffffffull) {
        uint32_t q = (uint32_t)a / (uint32_t)b;
        *rem = (int64_t)((uint32_t)a - q * (uint32_t)b);
        return (int64_t)q;
    }
    int64_t q = a / b;
    *rem = a - q * b;
    return q;
}

// The page (or ring block) of a slot >= 0 and its row there. Page sizes are
// powers of two in practice: the host passes log2(rows) as shift, and a
// shift and a mask replace the division (shift is the launch's, so the
// branch does not diverge).
KV_DEVICE int64_t kv_page_row(int64_t slot, int32_t rows, int32_t shift, int64_t* row) {
    if (shift >= 0) {
        *row = slot & (int64_t)(rows - 1);
        return slot >> shift;
    }
    return kv_divmod(slot, rows, row);
}

KV_DEVICE void kv_count(unsigned* counters, int which, unsigned lane) {
    if (lane == 0u) kv_atomic_add_u32(counters + which, 1u);
}

// N consecutive floats (N a multiple of 4, or 2; 16-byte aligned, 8 for N = 2)
// into registers, and back.
template <int N>
KV_DEVICE void kv_loadNf(const float* p, float v[N]) {
    if constexpr (N % 4 == 0) {
        const kv_u32x4* q = (const kv_u32x4*)p;
#pragma unroll
        for (int i = 0; i < N / 4; ++i) {
            kv_u32x4 w = q[i];
            v[4 * i + 0] = kv_u2f(w.x);
            v[4 * i + 1] = kv_u2f(w.y);
            v[4 * i + 2] = kv_u2f(w.z);
            v[4 * i + 3] = kv_u2f(w.w);
        }
    } else {
        kv_u32x2 w = *(const kv_u32x2*)p;
        v[0] = kv_u2f(w.x);
        v[1] = kv_u2f(w.y);
    }
}

template <int N>
KV_DEVICE void kv_storeNf(float* p, const float v[N]) {
    if constexpr (N % 4 == 0) {
        kv_u32x4* q = (kv_u32x4*)p;
#pragma unroll
        for (int i = 0; i < N / 4; ++i) {
            kv_u32x4 w;
            w.x = kv_f2u(v[4 * i + 0]);
            w.y = kv_f2u(v[4 * i + 1]);
            w.z = kv_f2u(v[4 * i + 2]);
            w.w = kv_f2u(v[4 * i + 3]);
            q[i] = w;
        }
    } else {
        kv_u32x2 w;
        w.x = kv_f2u(v[0]);
        w.y = kv_f2u(v[1]);
        *(kv_u32x2*)p = w;
    }
}

// 16 consecutive BF16 (32 bytes) as bits.
KV_DEVICE void kv_load16h(const uint16_t* p, uint16_t h[16]) {
    const kv_u32x4* q = (const kv_u32x4*)p;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        kv_u32x4 w = q[i];
        uint32_t u[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            h[8 * i + 2 * j] = (uint16_t)(u[j] & 0xffffu);
            h[8 * i + 2 * j + 1] = (uint16_t)(u[j] >> 16);
        }
    }
}

KV_DEVICE void kv_store16h(uint16_t* p, const uint16_t h[16]) {
    kv_u32x4* q = (kv_u32x4*)p;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        uint32_t u[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) u[j] = (uint32_t)h[8 * i + 2 * j] | ((uint32_t)h[8 * i + 2 * j + 1] << 16);
        kv_u32x4 w;
        w.x = u[0];
        w.y = u[1];
        w.z = u[2];
        w.w = u[3];
        q[i] = w;
    }
}

// 16 bytes given as four little-endian words.
KV_DEVICE void kv_store16w(uint8_t* p, const uint32_t u[4]) {
    kv_u32x4 w;
    w.x = u[0];
    w.y = u[1];
    w.z = u[2];
    w.w = u[3];
    *(kv_u32x4*)p = w;
}

// 16 BF16 kept packed two to a register until used: the norm weights are
// loaded long before the norm needs them.
struct KvBf16x16 {
    uint32_t u[8];
};

KV_DEVICE void kv_load_bf16x16(const uint16_t* p, KvBf16x16* w) {
    const kv_u32x4* q = (const kv_u32x4*)p;
    kv_u32x4 a = q[0], b = q[1];
    w->u[0] = a.x;
    w->u[1] = a.y;
    w->u[2] = a.z;
    w->u[3] = a.w;
    w->u[4] = b.x;
    w->u[5] = b.y;
    w->u[6] = b.z;
    w->u[7] = b.w;
}

// Element j as f32 (little-endian: the even element is the low half).
KV_DEVICE float kv_bf16x16_get(const KvBf16x16& w, int j) {
    uint32_t u = w.u[j / 2];
    return kv_u2f((j & 1) ? (u & 0xffff0000u) : (u << 16));
}

// ---- the norm: math::sum_squares_512 / inv_rms_512 / norm_scale ----------

// Lane l holds v[16 l .. 16 l + 16) and w, its 16 BF16 weights (loaded by
// the caller with its first reads, not after them): squares folded by halves
// inside the lane, then a butterfly over the 32 lanes; every lane ends with
// the sum.
KV_DEVICE void kv_rms_norm16(const float v[16], const KvBf16x16& w, float eps, uint16_t out[16]) {
    float a[16];
#pragma unroll
    for (int j = 0; j < 16; ++j) a[j] = v[j] * v[j];
    // Folds written out: a run-time fold distance would index `a` dynamically
    // and push it to local memory.
#pragma unroll
    for (int j = 0; j < 8; ++j) a[j] = a[j] + a[j + 8];
#pragma unroll
    for (int j = 0; j < 4; ++j) a[j] = a[j] + a[j + 4];
    a[0] = a[0] + a[2];
    a[1] = a[1] + a[3];
    a[0] = a[0] + a[1];
    float s = a[0];
    s = s + kv_shfl_xor(s, 16);
    s = s + kv_shfl_xor(s, 8);
    s = s + kv_shfl_xor(s, 4);
    s = s + kv_shfl_xor(s, 2);
    s = s + kv_shfl_xor(s, 1);
    // A division, although s * 2^-9 gives the same bits: compress CR1 ran
    // slower with the product (docs/tuning.md, Kernels).
    float var = kv_divf(s, 512.0f);
    float inv = kv_divf(1.0f, kv_sqrtf(var + eps));
#pragma unroll
    for (int j = 0; j < 16; ++j) out[j] = kv_bf16_from_f32((v[j] * inv) * kv_bf16x16_get(w, j));
}

// ---- rope_quant_insert: one token's record ---------------------------------

// cos and sin of RoPE pairs 224 + 8 (k - 28) .. + 8, for RoPE tile k, from
// row `base`.
KV_DEVICE void kv_load_cos_sin8(const KvInsertParams& p, int64_t base, unsigned k, float c[8], float s[8]) {
    int64_t k0 = 8 * (int64_t)(k - 28u);
    if (p.flags & KV_F_COS_BF16) {
        const uint16_t* row = (const uint16_t*)p.cos_sin + base * p.cos_row_stride;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            c[j] = kv_bf16_to_f32(row[k0 + j]);
            s[j] = kv_bf16_to_f32(row[32 + k0 + j]);
        }
    } else {
        const float* row = (const float*)p.cos_sin + base * p.cos_row_stride;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            c[j] = row[k0 + j];
            s[j] = row[32 + k0 + j];
        }
    }
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
// paths would cost such a warp both.
template <bool TILES>
KV_DEVICE void kv_rotate16(const KvInsertParams& p, int64_t base, unsigned k, const uint16_t h[16], float r[16]) {
    float c[8], s[8];
    if (TILES) {
        if (k < 28u) {
#pragma unroll
            for (int j = 0; j < 8; ++j)
                kv_rope_nope_pair(kv_bf16_to_f32(h[2 * j]), kv_bf16_to_f32(h[2 * j + 1]), &r[2 * j], &r[2 * j + 1]);
            return;
        }
        kv_load_cos_sin8(p, base, k, c, s);
    } else if (k >= 28u) {
        kv_load_cos_sin8(p, base, k, c, s);
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

// cos and sin of RoPE pair 224 + k from row `base` (k < 32).
KV_DEVICE void kv_cos_sin_at(const KvInsertParams& p, int64_t base, unsigned k, float* c, float* s) {
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

// One NVFP4 tile (the lane's 16 dims): 8 bytes of e2m1 pairs; returns the
// e4m3 scale byte.
KV_DEVICE uint8_t kv_quantize_nvfp4_tile(const float r[16], uint8_t out[8]) {
    float amax = kv_amax16(r);
    float t = kv_min_nan_ignoring(kv_fmax_nonneg(amax * KV_INV_6, KV_NVFP4_SCALE_MIN), 448.0f);
    uint8_t code = kv_e4m3_from_f32_nonnan(t);  // t is finite: in [2^-9, 448]
    float scale, y;
    kv_nvfp4_scale(code, &scale, &y);
#pragma unroll
    for (int k = 0; k < 8; ++k) {
        uint8_t lo = kv_e2m1_of_quotient(r[2 * k], scale, y);
        uint8_t hi = kv_e2m1_of_quotient(r[2 * k + 1], scale, y);
        out[k] = (uint8_t)(lo + (hi << 4));
    }
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

// Writes token's record from its BF16 latent: the 16 dims of tile `tile`
// (dims 16 tile .. 16 tile + 16). A group's lane l holds tile l; the
// tile-major inserts below map threads to tiles differently, and V4, whose
// RoPE pairs cross lanes, always runs on groups. FP8 rows take the
// per-tensor scale the caller loaded with its first reads. PAIR_LOADED (V4
// inserts, whose latent is in memory): `pair` is the lane's RoPE pair,
// loaded with the latent, instead of gathered from the other lanes.
template <int LAYOUT, bool TILES, bool PAIR_LOADED = false>
KV_DEVICE void kv_write_record(const KvInsertParams& p, int64_t slot, int64_t base, unsigned tile,
                               const uint16_t h[16], float fp8_scale, uint32_t pair = 0u) {
    const bool sanitize = (p.flags & KV_F_SANITIZE) != 0u;
    // V4's RoPE pair first, while the latent is still packed: the fused CR2
    // kernels sit at their register limit.
    uint32_t v4_pair = LAYOUT != KV_LAYOUT_V4 ? 0u : PAIR_LOADED ? pair : kv_gather_rope_pair(h, tile);
    float x[16], r[16];
    if (LAYOUT == KV_LAYOUT_V4) {
#pragma unroll
        for (int j = 0; j < 16; ++j) x[j] = kv_bf16_to_f32(h[j]);
    } else {
        kv_rotate16<TILES>(p, base, tile, h, r);  // V4 rotates by pairs below
    }
    int64_t row;
    int64_t block = kv_page_row(slot, p.block_size, p.block_shift, &row);
    uint8_t* page = p.cache + block * p.block_stride;

    if (LAYOUT == KV_LAYOUT_V4) {
        uint8_t* values = page + row * 576;
        uint8_t* scales = page + p.block_size * 576 + row * 8;
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
        // RoPE part: one GPT-J pair per lane (pair 224 + lane, dims
        // 448 + 2 lane and 449 + 2 lane), gathered from lanes 28..31, which
        // hold those dims, or loaded (PAIR_LOADED); one lane rotating 16 dims
        // while the others waited was most of this kernel's time.
        uint32_t rope = v4_pair;
        float c, sn;
        kv_cos_sin_at(p, base, tile, &c, &sn);
        float re, ro;
        kv_rope_pair(kv_bf16_to_f32((uint16_t)(rope & 0xffffu)), kv_bf16_to_f32((uint16_t)(rope >> 16)), c, sn,
                     &re, &ro);
        uint32_t out = (uint32_t)kv_bf16_from_f32(kv_sanitized(re, sanitize)) |
                       ((uint32_t)kv_bf16_from_f32(kv_sanitized(ro, sanitize)) << 16);
        *(uint32_t*)(values + 448 + 4 * tile) = out;
    } else if (LAYOUT == KV_LAYOUT_MXFP8) {
        uint8_t* values = page + row * 512;
        uint8_t* scales = page + p.block_size * 512 + row * 16;
        // A uniform branch: with sanitizing off (the default) the tile pays
        // nothing for it.
        if (sanitize) {
#pragma unroll
            for (int j = 0; j < 16; ++j) r[j] = kv_sanitized(r[j], sanitize);
        }
        uint32_t q[4];
        uint8_t sb = kv_quantize_fp8_part(r, 2, sanitize, q);
        kv_store16w(values + 16 * tile, q);
        if ((tile & 1u) == 0u) scales[tile / 2u] = sb;
    } else if (LAYOUT == KV_LAYOUT_NVFP4) {
        uint8_t* values = page + row * 256;
        uint8_t* scales = page + p.block_size * 256 + row * 32;
        // No sanitizing pass: it cannot change an NVFP4 byte. A NaN and the
        // +0 it would become both give code 0 and both leave the tile's
        // NaN-ignoring amax alone (an all-NaN tile and an all-zero one both
        // clamp to the 2^-9 scale). The parity tests cover both settings.
        uint8_t q[8];
        uint8_t sb = kv_quantize_nvfp4_tile(r, q);
        kv_u32x2 w;
        w.x = (uint32_t)q[0] | ((uint32_t)q[1] << 8) | ((uint32_t)q[2] << 16) | ((uint32_t)q[3] << 24);
        w.y = (uint32_t)q[4] | ((uint32_t)q[5] << 8) | ((uint32_t)q[6] << 16) | ((uint32_t)q[7] << 24);
        *(kv_u32x2*)(values + 8 * tile) = w;
        scales[tile] = sb;
    } else if (LAYOUT == KV_LAYOUT_BF16) {
        uint16_t o[16];
#pragma unroll
        for (int j = 0; j < 16; ++j) o[j] = kv_bf16_from_f32(r[j]);
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

template <int LAYOUT, bool TILES>
KV_DEVICE void kv_insert_token(const KvInsertParams& p, int64_t t, unsigned tile) {
    // The latent row is loaded with the indices (t < n, so it exists): a
    // skipped token costs 1 KB of reads, a written one a round trip less.
    uint16_t h[16];
    const uint16_t* row = p.latent + t * p.latent_row_stride;
    kv_load16h(row + 16 * tile, h);
    // V4: the lane's RoPE pair (dims 448 + 2 lane, 449 + 2 lane) from the
    // same row, a cached 4-byte load in place of eight shuffles (rows are
    // 16-byte aligned, so the word is aligned).
    uint32_t pair = LAYOUT == KV_LAYOUT_V4 ? *(const uint32_t*)(row + 448 + 2 * tile) : 0u;
    float fp8_scale = kv_load_fp8_scale<LAYOUT>(p);
    int64_t slot = kv_load_index(p.slots, (p.flags & KV_F_SLOT_I64) != 0u, t);
    int64_t pos = kv_load_index(p.positions, (p.flags & KV_F_POS_I64) != 0u, t);
    int64_t base;
    if (!kv_insert_check<TILES>(p, slot, pos, tile, &base)) return;
    kv_write_record<LAYOUT, TILES, LAYOUT == KV_LAYOUT_V4>(p, slot, base, tile, h, fp8_scale, pair);
}

// ---- fused_save_compress_norm ----------------------------------------------

// What a compress item does with the latent of token t it produced: store
// it, and in the fused kernels insert it. The item passes the token's
// position (one tensor serves the compressor and the insert), so only the
// cache slot is read here.
template <bool FUSED, int LAYOUT>
KV_DEVICE void kv_emit_latent(const KvCompressParams& c, const KvInsertParams* ins, int64_t t, unsigned lane,
                              const uint16_t out[16], int64_t pos) {
    if (!FUSED || (c.flags & KV_F_WRITE_LATENT)) kv_store16h(c.latent + t * 512 + 16 * lane, out);
    if (FUSED) {
        int64_t slot = kv_load_index(ins->slots, (ins->flags & KV_F_SLOT_I64) != 0u, t);
        if (slot < 0) return;
        // The scale only for a slot that is written: the one-group fused CR2
        // kernels sit at AMD's scalar-register limit.
        float fp8_scale = kv_load_fp8_scale<LAYOUT>(*ins);
        int64_t base;
        if (kv_insert_check<false>(*ins, slot, pos, lane, &base))
            kv_write_record<LAYOUT, false>(*ins, slot, base, lane, out, fp8_scale);
    }
}

template <bool FUSED, int LAYOUT>
KV_DEVICE void kv_compress_cr1_item(const KvCompressParams& c, const KvInsertParams* ins, int64_t t) {
    unsigned lane = kv_lane();
    // Row, weights and slot in one round trip.
    float v[16];
    KvBf16x16 w;
    kv_loadNf<16>(c.kv_score + t * c.kv_row_stride + 16 * lane, v);
    kv_load_bf16x16(c.weight + 16 * lane, &w);
    int64_t pos = FUSED ? kv_load_index(c.positions, (c.flags & KV_F_POS_I64) != 0u, t) : 0;
    if (kv_load_index(c.slots, (c.flags & KV_F_SLOT_I64) != 0u, t) < 0) return;
    uint16_t out[16];
    kv_rms_norm16(v, w, c.eps, out);
    kv_emit_latent<FUSED, LAYOUT>(c, ins, t, lane, out, pos);
}

// ---- CR2 items, alone or in teams -----------------------------------------
//
// A CR2 item's pooling (an exp and an IEEE division per dim) is a long
// dependent chain per lane, and at decode sizes, with one item per SM, that
// chain is most of the kernel's time. Small launches therefore give each item
// a team of KV_CR2_TEAM groups (one block): each lane pools 16 / KV_CR2_TEAM
// dims (kv_part_offset), the pooled values meet in shared memory, and group 0
// norms and emits them exactly as a lone group does (the sum order of the
// norm is unchanged). TEAM = 1 is the lone group.
//
// Large decode batches of one-token requests run pairs of groups instead:
// a block of 64 threads, one AMD wavefront, with half the idle lanes of a
// team of four while group 0 norms and emits, so more items run at once
// (see LaunchPolicy::cr2_shape for the measured ranges).

#define KV_CR2_TEAM 4
#define KV_CR2_PAIR 2

// A lane's part (N = 16 / TEAM dims) of the kv and score halves of a row.
template <int N>
struct KvRowPart {
    float kv[N];
    float s[N];
};

// A lane of a team: its group, and its lane in the group.
struct KvTeamLane {
    unsigned g;  // group in the team
    unsigned l;  // lane in the group
};

// Where a team lane's part of N = 16 / TEAM dims starts in a 512-dim half.
// Group g holds the g-th TEAM-th of the half, lane l the l-th N of that,
// so that a group's loads and stores cover contiguous bytes. Only group 0's
// norm needs lane l to hold dims [16 l, 16 l + 16), and it reads them from
// the team's shared memory. NORM_ORDER: lane l's own 16 dims, group (here:
// half) g the g-th N of them, for a lone group pooling by halves.
template <int TEAM, bool NORM_ORDER = false>
KV_DEVICE unsigned kv_part_offset(KvTeamLane tl) {
    return NORM_ORDER ? 16u * tl.l + (16u / TEAM) * tl.g : (16u / TEAM) * tl.l + (512u / TEAM) * tl.g;
}

// Counts once per item (team lane 0).
KV_DEVICE void kv_team_count(unsigned* counters, int which, KvTeamLane tl) {
    if (tl.g == 0u) kv_count(counters, which, tl.l);
}

template <int TEAM, bool NORM_ORDER = false>
KV_DEVICE void kv_load_row_part(const float* row, KvTeamLane tl, KvRowPart<16 / TEAM>* r) {
    unsigned o = kv_part_offset<TEAM, NORM_ORDER>(tl);
    kv_loadNf<16 / TEAM>(row + o, r->kv);
    kv_loadNf<16 / TEAM>(row + 512 + o, r->s);
}

template <int TEAM, bool NORM_ORDER = false>
KV_DEVICE void kv_store_row_part(float* row, KvTeamLane tl, const KvRowPart<16 / TEAM>& r) {
    unsigned o = kv_part_offset<TEAM, NORM_ORDER>(tl);
    kv_storeNf<16 / TEAM>(row + o, r.kv);
    kv_storeNf<16 / TEAM>(row + 512 + o, r.s);
}

// Pools a lane's part of N dims: every dim's exp first, then the
// divisions: on NVIDIA each IEEE division ends in a branch (its range
// check), and a dim's exp after one would wait for it (teams and lone
// groups both run faster in this order; docs/tuning.md, Kernels).
template <int N>
KV_DEVICE void kv_pool_part(const KvRowPart<N>& older, const KvRowPart<N>& newer, float v[N]) {
    float den[N];
#pragma unroll
    for (int j = 0; j < N; ++j)
        kv_pool2_terms(older.kv[j], older.s[j], newer.kv[j], newer.s[j], &v[j], &den[j]);
#pragma unroll
    for (int j = 0; j < N; ++j) v[j] = kv_divf(v[j], den[j]);
}

// Norms lane l's 16 pooled dims and emits the latent of token t (at
// position `pos`). The weights are loaded here, not with the rows: the CR2
// kernels are limited by how many groups their registers let run at once,
// and the weights (1 KB, shared by every token) come from cache. (Issuing
// them, and the insert's slot, with the rows' reads was no faster:
// docs/tuning.md, Kernels.)
template <bool FUSED, int LAYOUT>
KV_DEVICE void kv_norm_emit(const KvCompressParams& c, const KvInsertParams* ins, int64_t t, int64_t pos,
                            unsigned lane, const float v[16]) {
    KvBf16x16 w;
    kv_load_bf16x16(c.weight + 16 * lane, &w);
    uint16_t out[16];
    kv_rms_norm16(v, w, c.eps, out);
    kv_emit_latent<FUSED, LAYOUT>(c, ins, t, lane, out, pos);
}

// Pools (older, newer) over the team, then group 0 norms and emits the latent
// of token t (at position `pos`). A team meets at one barrier, so every lane
// of the block must call this (the callers' conditions are the same for the
// whole item). The steps of kv_pool_part and kv_norm_emit (the weights'
// load after the pooling included) are written out here: through the
// helpers nvcc schedules five fused team and pair kernels differently (the
// same instructions), and this form keeps the SASS that was measured.
template <bool FUSED, int LAYOUT, int TEAM>
KV_DEVICE void kv_pool_norm_emit(const KvCompressParams& c, const KvInsertParams* ins, int64_t t, int64_t pos,
                                 KvTeamLane tl, const KvRowPart<16 / TEAM>& older,
                                 const KvRowPart<16 / TEAM>& newer, float* pooled) {
    constexpr int N = 16 / TEAM;
    float v[16], den[N];
#pragma unroll
    for (int j = 0; j < N; ++j)
        kv_pool2_terms(older.kv[j], older.s[j], newer.kv[j], newer.s[j], &v[j], &den[j]);
#pragma unroll
    for (int j = 0; j < N; ++j) v[j] = kv_divf(v[j], den[j]);
    if (TEAM > 1) {
        kv_storeNf<N>(pooled + kv_part_offset<TEAM>(tl), v);
        kv_sync();
        if (tl.g != 0u) return;
        kv_loadNf<16>(pooled + 16u * tl.l, v);
    }
    KvBf16x16 w;
    kv_load_bf16x16(c.weight + 16 * tl.l, &w);
    uint16_t out[16];
    kv_rms_norm16(v, w, c.eps, out);
    kv_emit_latent<FUSED, LAYOUT>(c, ins, t, tl.l, out, pos);
}

// The long-chunk kernels' lone group pools its 16 dims in two halves of 8
// (the dims a pair's two groups would hold), reading each half's rows just
// before pooling it: at most 32 row values live at once instead of 64, so
// the kernel fits 64 registers (four blocks per SM on sm_90) without
// spilling. The halves' values land where the one-pass order puts them.
template <bool FUSED, int LAYOUT>
KV_DEVICE void kv_pool_halves_norm_emit(const KvCompressParams& c, const KvInsertParams* ins, int64_t t,
                                        int64_t pos, unsigned lane, const float* older, const float* newer) {
    float v[16];
#pragma unroll
    for (unsigned h = 0; h < 2u; ++h) {
        const KvTeamLane hl = {h, lane};
        KvRowPart<8> o, n;
        kv_load_row_part<2, true>(older, hl, &o);
        kv_load_row_part<2, true>(newer, hl, &n);
        kv_pool_part<8>(o, n, v + 8 * h);
    }
    kv_norm_emit<FUSED, LAYOUT>(c, ins, t, pos, lane, v);
}

// Whether the request item of chunk [start, end) (end as query_start_loc
// holds it) pools the group its second token closes, given the first
// token's slot and position: in a chunk of exactly two tokens whose first
// token closes no group (decode with one speculative token), the request
// item, which reads both rows for the ring anyway, pools the second token
// too. The token item of the second token tests the same, on the same
// values, and leaves it to the request item. Only in the OWN2 kernels
// (kv_compress_cr2_team_mtp, kv_compress_cr2_pair_mtp,
// kv_fused_cr2_team_mtp_*), which screened launches of more than one
// multi-token request in four run (launch::Cr2Shape::multi_token):
// built into every team kernel, the longer request item slows one-token
// decode (docs/tuning.md, Kernels), and the lone groups'
// fused kernels spill with the second row live (80 registers).
KV_DEVICE bool kv_cr2_owns_second(int64_t start, int64_t end, int64_t slot0, int64_t pos0) {
    return end - start == 2 && slot0 >= 0 && (pos0 < 0 || (pos0 & 1) == 0);
}

// CR2 token item: the group that token t closes inside its chunk. HALVES:
// a lone group pooling by halves (kv_pool_halves_norm_emit). CHECK: only
// the checks; the position of a token that closes a group goes to
// *closing, which the caller set to -1.
template <bool FUSED, int LAYOUT, int TEAM, bool HALVES = false, bool CHECK = false, bool OWN2 = false>
KV_DEVICE void kv_cr2_token_item(const KvCompressParams& c, const KvInsertParams* ins, int64_t t, KvTeamLane tl,
                                 float* pooled, int64_t* closing = 0) {
    // Slot, position and request in one round trip (the request index is
    // read even for tokens the position check then drops: 4 or 8 bytes
    // against a round trip on every pooled token).
    int64_t slot = kv_load_index(c.slots, (c.flags & KV_F_SLOT_I64) != 0u, t);
    int64_t pos = kv_load_index(c.positions, (c.flags & KV_F_POS_I64) != 0u, t);
    int64_t r = kv_load_index(c.ttr, (c.flags & KV_F_TTR_I64) != 0u, t);
    // The previous token's slot and position, for kv_cr2_owns_second.
    const bool prev_known = OWN2 && t > 0;
    int64_t slot_p = prev_known ? kv_load_index(c.slots, (c.flags & KV_F_SLOT_I64) != 0u, t - 1) : -1;
    int64_t pos_p = prev_known ? kv_load_index(c.positions, (c.flags & KV_F_POS_I64) != 0u, t - 1) : 0;
    if (slot < 0) return;
    if (pos < 0) {
        kv_team_count(c.counters, KV_COUNT_POS, tl);
        return;
    }
    if ((pos & 1) == 0) return;
    if (r < 0 || r >= c.num_reqs) {
        kv_team_count(c.counters, KV_COUNT_INDEX, tl);
        return;
    }
    bool q64 = (c.flags & KV_F_QSL_I64) != 0u;
    int64_t start = kv_load_index(c.qsl, q64, r);
    int64_t end = kv_load_index(c.qsl, q64, r + 1);
    // start < 0: a malformed chunk; t - 1 below would read before kv_score.
    if (start < 0 || !(start <= t && t < end)) {
        kv_team_count(c.counters, KV_COUNT_INDEX, tl);
        return;
    }
    if (t == start) return;  // the request item owns a chunk's first token
    // ... and the second of a chunk of two, where the first closes no group.
    if (prev_known && kv_cr2_owns_second(start, end, slot_p, pos_p)) return;
    if (CHECK) {
        *closing = pos;
        return;
    }
    if (HALVES) {
        kv_pool_halves_norm_emit<FUSED, LAYOUT>(c, ins, t, pos, tl.l, c.kv_score + (t - 1) * c.kv_row_stride,
                                                c.kv_score + t * c.kv_row_stride);
        return;
    }
    KvRowPart<16 / TEAM> older, newer;
    kv_load_row_part<TEAM>(c.kv_score + (t - 1) * c.kv_row_stride, tl, &older);
    kv_load_row_part<TEAM>(c.kv_score + t * c.kv_row_stride, tl, &newer);
    kv_pool_norm_emit<FUSED, LAYOUT, TEAM>(c, ins, t, pos, tl, older, newer, pooled);
}

// Stores a team lane's part of a row to the ring row of `slot` (>= 0), or
// counts a slot outside the ring.
template <int TEAM>
KV_DEVICE void kv_ring_store_part(const KvCompressParams& c, int64_t slot, KvTeamLane tl,
                                  const KvRowPart<16 / TEAM>& v) {
    int64_t row;
    int64_t blk = kv_page_row(slot, c.ring_capacity, c.ring_shift, &row);
    if (blk >= c.ring_blocks) {
        kv_team_count(c.counters, KV_COUNT_SLOT, tl);
        return;
    }
    kv_store_row_part<TEAM>(c.ring + blk * c.ring_block_stride + row * c.ring_row_stride, tl, v);
}

// CR2 request item: the group the chunk's first token closes with its
// predecessor (prev_rows or ring), then the ring stores. Each lane reads and
// writes only its own dims, and a ring row is read before any store that
// could overwrite it (the same row only when the capacity is 1), so nothing
// races (with HALVES, each half's older row is read before that half's
// store).
template <bool FUSED, int LAYOUT, int TEAM, bool HALVES = false, bool OWN2 = false>
KV_DEVICE void kv_cr2_request_item(const KvCompressParams& c, const KvInsertParams* ins, int64_t r, KvTeamLane tl,
                                   float* pooled) {
    bool q64 = (c.flags & KV_F_QSL_I64) != 0u;
    bool s64 = (c.flags & KV_F_SLOT_I64) != 0u;
    const bool has_prev = (c.flags & KV_F_HAS_PREV) != 0u;
    // The chunk and the prev_rows index in one round trip.
    int64_t start64 = kv_load_index(c.qsl, q64, r);
    int64_t end64 = kv_load_index(c.qsl, q64, r + 1);
    int64_t j = has_prev ? kv_load_index(c.prev_idx, (c.flags & KV_F_PRI_I64) != 0u, r) : -1;
    // A chunk of two, by query_start_loc's end as the token items see it
    // (not past n, so the clamp below leaves it).
    const bool two = OWN2 && start64 >= 0 && end64 - start64 == 2 && end64 <= c.n;
    if (end64 > c.n) end64 = c.n;
    if (start64 < 0 || start64 >= end64) return;
    // Now 0 <= start < end <= n < 2^31: 32-bit from here on (registers).
    const int32_t start = (int32_t)start64;
    const int32_t end = (int32_t)end64;
    int64_t slot_f = kv_load_index(c.slots, s64, start);
    int64_t pos = kv_load_index(c.positions, (c.flags & KV_F_POS_I64) != 0u, start);
    int64_t owner = kv_load_index(c.ttr, (c.flags & KV_F_TTR_I64) != 0u, start);
    // The second token's, for kv_cr2_owns_second.
    int64_t slot_s = two ? kv_load_index(c.slots, s64, start + 1) : -1;
    int64_t pos_s = two ? kv_load_index(c.positions, (c.flags & KV_F_POS_I64) != 0u, start + 1) : -1;
    int64_t owner_s = two ? kv_load_index(c.ttr, (c.flags & KV_F_TTR_I64) != 0u, start + 1) : -1;
    if (slot_f < 0) return;
    // The second token's group, where the token item leaves it to this item
    // (all of its own checks pass; kv_cr2_owns_second); it excludes the
    // first token's (older, below: an odd position). Its position then
    // stands for the first token's, which no longer matters.
    const bool own2 = two && kv_cr2_owns_second(start, end, slot_f, pos) && slot_s >= 0 && pos_s >= 0 &&
                      (pos_s & 1) == 1 && owner_s == r;
    const int64_t cap = c.ring_capacity;
    int64_t row_f;
    int64_t blk_f = kv_page_row(slot_f, cap, c.ring_shift, &row_f);
    const float* older = 0;
    if (pos >= 0 && (pos & 1) == 1 && owner == r) {
        if (j >= 0) {
            if (j >= c.prev_rows_n) {
                kv_team_count(c.counters, KV_COUNT_INDEX, tl);
            } else {
                older = c.prev_rows + j * c.prev_row_stride;
            }
        } else {
            int64_t prow;
            kv_page_row(pos - 1, cap, c.ring_shift, &prow);
            if (blk_f >= c.ring_blocks) {
                kv_team_count(c.counters, KV_COUNT_SLOT, tl);
            } else {
                older = c.ring + blk_f * c.ring_block_stride + prow * c.ring_row_stride;
            }
        }
    }
    if (own2) pos = pos_s;
    // The ring stores' first token (the chunk's last `capacity` tokens),
    // set after the rows' reads are issued.
    int32_t from;
    if (HALVES) {
        // The first token's ring row (in a chunk no longer than the ring),
        // then per half: its rows, its ring store, its pooling. (The else
        // branch repeats the ring-row test after its loads: a shared helper
        // changed the SASS of every CR2 kernel that was measured.)
        from = end - c.ring_capacity > start ? end - c.ring_capacity : start;
        float* ring_first = 0;
        if (!has_prev && from == start) {
            if (blk_f >= c.ring_blocks) {
                kv_team_count(c.counters, KV_COUNT_SLOT, tl);
            } else {
                ring_first = c.ring + blk_f * c.ring_block_stride + row_f * c.ring_row_stride;
            }
        }
        float v[16];
#pragma unroll
        for (unsigned h = 0; h < 2u; ++h) {
            const KvTeamLane hl = {h, tl.l};
            KvRowPart<8> f, o;
            kv_load_row_part<2, true>(c.kv_score + (int64_t)start * c.kv_row_stride, hl, &f);
            if (older) kv_load_row_part<2, true>(older, hl, &o);
            if (ring_first) kv_store_row_part<2, true>(ring_first, hl, f);
            if (older) kv_pool_part<8>(o, f, v + 8 * h);
        }
        if (older) kv_norm_emit<FUSED, LAYOUT>(c, ins, start, pos, tl.l, v);
    } else {
        // The pooled group's (older, newer) rows in one round trip: the ring
        // or prev_rows row and the first token's, or (own2) the first and
        // the second token's. The rows' addresses are picked, not their
        // values, so that one copy of the pooling and the norm serves both
        // groups in the registers of one (a copy per group took gfx942's
        // pair kernels from 50 to 84-90 VGPRs; selecting the values spilled
        // on sm_90). The first row is also, in a chunk no longer than the
        // ring, a ring store: that one goes out from registers, after the
        // older row's read.
        const float* first_row = c.kv_score + (int64_t)start * c.kv_row_stride;
        KvRowPart<16 / TEAM> o, nw;
        kv_load_row_part<TEAM>(own2 ? first_row + c.kv_row_stride : first_row, tl, &nw);
        if (older || own2) kv_load_row_part<TEAM>(own2 ? first_row : older, tl, &o);
        from = end - c.ring_capacity > start ? end - c.ring_capacity : start;
        if (!has_prev && from == start) {
            if (blk_f >= c.ring_blocks) {
                kv_team_count(c.counters, KV_COUNT_SLOT, tl);
            } else {
                float* ring_row = c.ring + blk_f * c.ring_block_stride + row_f * c.ring_row_stride;
                if (own2) {
                    kv_store_row_part<TEAM>(ring_row, tl, o);
                } else {
                    kv_store_row_part<TEAM>(ring_row, tl, nw);
                }
            }
        }
        // The second row is the ring loop's only token (end = start + 2);
        // it goes out from registers too.
        if (own2 && !has_prev) kv_ring_store_part<TEAM>(c, slot_s, tl, nw);
        // Group 0 goes on alone; the other groups are done with the pooling.
        if (older || own2) {
            kv_pool_norm_emit<FUSED, LAYOUT, TEAM>(c, ins, start + (own2 ? 1 : 0), pos, tl, o, nw, pooled);
        }
    }
    if (has_prev) return;
    // The team's other groups still copy their parts of the ring rows: they
    // returned from kv_pool_norm_emit above, not from this item.
    for (int32_t u = own2 ? end : (from == start ? start + 1 : from); u < end; ++u) {
        int64_t slot = kv_load_index(c.slots, s64, u);
        if (slot < 0) continue;
        int64_t row;
        int64_t blk = kv_page_row(slot, cap, c.ring_shift, &row);
        if (blk >= c.ring_blocks) {
            kv_team_count(c.counters, KV_COUNT_SLOT, tl);
            continue;
        }
        KvRowPart<16 / TEAM> v;
        kv_load_row_part<TEAM>(c.kv_score + (int64_t)u * c.kv_row_stride, tl, &v);
        kv_store_row_part<TEAM>(c.ring + blk * c.ring_block_stride + row * c.ring_row_stride, tl, v);
    }
}

template <bool FUSED, int LAYOUT, bool HALVES = false>
KV_DEVICE void kv_compress(const KvCompressParams& c, const KvInsertParams* ins, int cr) {
    int64_t g = kv_group(c.flags);
    if (cr == 1) {
        if (g < c.n) kv_compress_cr1_item<FUSED, LAYOUT>(c, ins, g);
        return;
    }
    KvTeamLane tl = {0u, kv_lane()};
    if (g < c.num_reqs) {
        kv_cr2_request_item<FUSED, LAYOUT, 1, HALVES>(c, ins, g, tl, 0);
    } else if (g - c.num_reqs < c.n) {
        kv_cr2_token_item<FUSED, LAYOUT, 1, HALVES>(c, ins, g - c.num_reqs, tl, 0);
    }
}

// A team's shared memory, sized by the launch (launch::team_geometry):
// one token's pooled values (512 floats) for a team item, and in a
// screened launch (launch::screened_team_geometry) TEAM of them plus
// the TEAM closing positions. Dynamic, so that only screened launches pay
// for the larger size: on gfx942 (64 KB of LDS per CU) 8 KB per team would
// cut the blocks a CU holds.
extern KV_SHARED float kv_team_shared[];

// A token block of a screened team launch (KV_F_SCREEN_TOKENS: decode
// batches of many requests), covering TEAM tokens: group g checks token
// TEAM b + g, the team pools those that close a group one after the other
// (none for one-token requests, whose first tokens the request items pool),
// each into its own buffer, and then each closing token's group norms and
// emits it, the groups at once. A quarter of the token blocks (a half in
// pairs), each as long as a token item until a second of its tokens closes
// a group. The closing positions and the loop bounds are the same for the
// whole block, so every lane meets every barrier.
template <bool FUSED, int LAYOUT, int TEAM, bool OWN2>
KV_DEVICE void kv_cr2_token_block(const KvCompressParams& c, const KvInsertParams* ins, int64_t b, KvTeamLane tl,
                                  float* pooled) {
    int64_t* closing = (int64_t*)(pooled + TEAM * 512);
    const int64_t t0 = b * TEAM;
    const int64_t t = t0 + tl.g;
    // Each group counts its own token's faults.
    const KvTeamLane own = {0u, tl.l};
    int64_t pos = -1;
    if (t < c.n) kv_cr2_token_item<FUSED, LAYOUT, TEAM, false, true, OWN2>(c, ins, t, own, 0, &pos);
    if (tl.l == 0u) closing[tl.g] = pos;
    kv_sync();
    bool any = false;
#pragma unroll 1
    for (unsigned k = 0; k < (unsigned)TEAM; ++k) {
        if (closing[k] < 0) continue;
        any = true;
        int64_t tk = t0 + k;
        KvRowPart<16 / TEAM> older, newer;
        kv_load_row_part<TEAM>(c.kv_score + (tk - 1) * c.kv_row_stride, tl, &older);
        kv_load_row_part<TEAM>(c.kv_score + tk * c.kv_row_stride, tl, &newer);
        float v[16 / TEAM];
        kv_pool_part<16 / TEAM>(older, newer, v);
        kv_storeNf<16 / TEAM>(pooled + 512u * k + kv_part_offset<TEAM>(tl), v);
    }
    if (!any) return;
    kv_sync();
    if (pos < 0) return;
    float v[16];
    kv_loadNf<16>(pooled + 512u * tl.g + 16u * tl.l, v);
    kv_norm_emit<FUSED, LAYOUT>(c, ins, t, pos, tl.l, v);
}

// One CR2 item per block of TEAM groups (see "CR2 items, alone or in
// teams"), or in a screened launch TEAM tokens (kv_cr2_token_block). Every
// lane of the block handles the same item, so the control flow up to the
// team's barriers is the same for all of them.
template <bool FUSED, int LAYOUT, int TEAM, bool OWN2 = false>
KV_DEVICE void kv_compress_cr2_team(const KvCompressParams& c, const KvInsertParams* ins) {
    float* pooled = kv_team_shared;
    int64_t item = kv_bid();
    KvTeamLane tl = {kv_tid() / KV_GROUP_LANES, kv_lane()};
    if (item < c.num_reqs) {
        kv_cr2_request_item<FUSED, LAYOUT, TEAM, false, OWN2>(c, ins, item, tl, pooled);
    } else if (c.flags & KV_F_SCREEN_TOKENS) {
        kv_cr2_token_block<FUSED, LAYOUT, TEAM, OWN2>(c, ins, item - c.num_reqs, tl, pooled);
    } else if (item - c.num_reqs < c.n) {
        kv_cr2_token_item<FUSED, LAYOUT, TEAM, false, false, OWN2>(c, ins, item - c.num_reqs, tl, pooled);
    }
}

// ---- entry points ------------------------------------------------------------

KV_KERNEL KV_LAUNCH_BOUNDS_6(KV_BLOCK_THREADS) void kv_compress_cr1(const KvCompressParams c) {
    kv_compress<false, 0>(c, 0, 1);
}

KV_KERNEL KV_LAUNCH_BOUNDS(KV_BLOCK_THREADS) void kv_compress_cr2(const KvCompressParams c) {
    kv_compress<false, 0>(c, 0, 2);
}

// Long chunks (prefill): lone groups pooling by halves, at four blocks per
// SM on sm_90 (LaunchPolicy::cr2_shape picks it above 3072 items when
// fewer than half the tokens start a chunk).
KV_KERNEL KV_LAUNCH_BOUNDS_4(KV_BLOCK_THREADS) void kv_compress_cr2_long(const KvCompressParams c) {
    kv_compress<false, 0, true>(c, 0, 2);
}

KV_KERNEL KV_LAUNCH_BOUNDS_9(KV_CR2_TEAM * 32) void kv_compress_cr2_team(const KvCompressParams c) {
    kv_compress_cr2_team<false, 0, KV_CR2_TEAM>(c, 0);
}

// Pairs take 56-70 registers uncapped, at most 64 here (KV_LAUNCH_BOUNDS_16).
KV_KERNEL KV_LAUNCH_BOUNDS_16(KV_CR2_PAIR * 32) void kv_compress_cr2_pair(const KvCompressParams c) {
    kv_compress_cr2_team<false, 0, KV_CR2_PAIR>(c, 0);
}

// Screened plain compresses of more than one multi-token request in four
// (speculative decode, MTP; also long chunks of up to 2560 items): their
// request items also pool a two-token chunk's second token
// (kv_cr2_owns_second), so that its rows are read once and the token
// blocks pool nothing.
KV_KERNEL KV_LAUNCH_BOUNDS_10(KV_CR2_TEAM * 32) void kv_compress_cr2_team_mtp(const KvCompressParams c) {
    kv_compress_cr2_team<false, 0, KV_CR2_TEAM, true>(c, 0);
}

KV_KERNEL KV_LAUNCH_BOUNDS_16(KV_CR2_PAIR * 32) void kv_compress_cr2_pair_mtp(const KvCompressParams c) {
    kv_compress_cr2_team<false, 0, KV_CR2_PAIR, true>(c, 0);
}

KV_KERNEL KV_LAUNCH_BOUNDS(KV_BLOCK_THREADS) void kv_save_ring_rows(const KvRingRowsParams p) {
    int64_t i = kv_group(p.flags);
    if (i >= p.n) return;
    unsigned lane = kv_lane();
    int64_t slot = kv_load_index(p.slots, (p.flags & KV_F_SLOT_I64) != 0u, i);
    if (slot < 0) return;
    int64_t row;
    int64_t blk = kv_page_row(slot, p.ring_capacity, p.ring_shift, &row);
    if (blk >= p.ring_blocks) {
        kv_count(p.counters, KV_COUNT_SLOT, lane);
        return;
    }
    const float* src = p.rows + i * p.row_stride;
    float* dst = p.ring + blk * p.ring_block_stride + row * p.ring_row_stride;
    // Lane l copies the row's 16-byte pieces l + 32 k, so that each of the
    // group's loads and stores covers 512 contiguous bytes.
    float v[8][4];
#pragma unroll
    for (int k = 0; k < 8; ++k) kv_loadNf<4>(src + 4 * (lane + 32 * k), v[k]);
#pragma unroll
    for (int k = 0; k < 8; ++k) kv_storeNf<4>(dst + 4 * (lane + 32 * k), v[k]);
}

// Tile-major: a block's G tokens (G = its groups) as 28 G NoPE tiles, token
// by token, then their 4 G RoPE tiles. Only the RoPE tiles read cos/sin and
// run the two-step rotation, so with this order whole warps / wavefronts are
// NoPE and take one path; with a token per group every warp would run both.
// For layouts whose tiles need no other lane (NVFP4, BF16 and FP8 rows).
KV_DEVICE void kv_tile_of_thread(uint32_t flags, int64_t* t, unsigned* tile) {
    uint32_t log2 = (flags >> KV_F_GROUPS_LOG2_SHIFT) & 7u;
    uint32_t nope = 28u << log2;  // NoPE tiles in the block
    uint32_t i = kv_tid();
    uint32_t tok = i < nope ? i / 28u : (i - nope) >> 2;
    *tile = i < nope ? i - 28u * tok : 28u + (i & 3u);
    *t = (int64_t)((kv_bid() << log2) + tok);
}

#define KV_INSERT_KERNEL(name, LAYOUT)                                              \
    KV_KERNEL KV_LAUNCH_BOUNDS_6(KV_BLOCK_THREADS) void name(const KvInsertParams p) { \
        int64_t t = kv_group(p.flags);                                              \
        if (t < p.n) kv_insert_token<LAYOUT, false>(p, t, kv_lane());               \
    }

#define KV_INSERT_TILES_KERNEL(name, LAYOUT)                                        \
    KV_KERNEL KV_LAUNCH_BOUNDS_6(KV_BLOCK_THREADS) void name(const KvInsertParams p) { \
        int64_t t;                                                                  \
        unsigned tile;                                                              \
        kv_tile_of_thread(p.flags, &t, &tile);                                      \
        if (t < p.n) kv_insert_token<LAYOUT, true>(p, t, tile);                     \
    }

KV_INSERT_KERNEL(kv_insert_v4, KV_LAYOUT_V4)
KV_INSERT_KERNEL(kv_insert_mxfp8, KV_LAYOUT_MXFP8)
KV_INSERT_KERNEL(kv_insert_nvfp4, KV_LAYOUT_NVFP4)
KV_INSERT_KERNEL(kv_insert_bf16, KV_LAYOUT_BF16)
KV_INSERT_KERNEL(kv_insert_fp8, KV_LAYOUT_FP8)

// The host runs these for CR1 launches above 2048 tokens (src/launch.rs,
// insert_uses_tiles), and only for CR1: they skip the compress-ratio test.
// At decode sizes a block's mixed warp runs both paths within one token's
// latency, and with CR2 only every other token is usually written, while a
// warp of tiles from several tokens does the full work when any one of them
// is written (a token per group: a skipped token's warp simply ends). V4
// gathers its RoPE pairs across a group's lanes and MXFP8 shares a scale
// between two lanes (a shuffle, which every lane of a warp must join): both
// keep a token per group always.
KV_INSERT_TILES_KERNEL(kv_insert_nvfp4_tiles, KV_LAYOUT_NVFP4)
KV_INSERT_TILES_KERNEL(kv_insert_bf16_tiles, KV_LAYOUT_BF16)
KV_INSERT_TILES_KERNEL(kv_insert_fp8_tiles, KV_LAYOUT_FP8)

#define KV_FUSED_KERNEL(name, CR, LAYOUT, BOUNDS)                       \
    KV_KERNEL BOUNDS(KV_BLOCK_THREADS) void name(const KvFusedParams p) { \
        kv_compress<true, LAYOUT>(p.compress, &p.insert, CR);             \
    }

KV_FUSED_KERNEL(kv_fused_cr1_v4, 1, KV_LAYOUT_V4, KV_LAUNCH_BOUNDS_5)
KV_FUSED_KERNEL(kv_fused_cr1_mxfp8, 1, KV_LAYOUT_MXFP8, KV_LAUNCH_BOUNDS_5)
KV_FUSED_KERNEL(kv_fused_cr1_nvfp4, 1, KV_LAYOUT_NVFP4, KV_LAUNCH_BOUNDS_5)
KV_FUSED_KERNEL(kv_fused_cr1_bf16, 1, KV_LAYOUT_BF16, KV_LAUNCH_BOUNDS_5)
KV_FUSED_KERNEL(kv_fused_cr1_fp8, 1, KV_LAYOUT_FP8, KV_LAUNCH_BOUNDS_5)
KV_FUSED_KERNEL(kv_fused_cr2_v4, 2, KV_LAYOUT_V4, KV_LAUNCH_BOUNDS_2)
KV_FUSED_KERNEL(kv_fused_cr2_mxfp8, 2, KV_LAYOUT_MXFP8, KV_LAUNCH_BOUNDS)
KV_FUSED_KERNEL(kv_fused_cr2_nvfp4, 2, KV_LAYOUT_NVFP4, KV_LAUNCH_BOUNDS)
KV_FUSED_KERNEL(kv_fused_cr2_bf16, 2, KV_LAYOUT_BF16, KV_LAUNCH_BOUNDS)
KV_FUSED_KERNEL(kv_fused_cr2_fp8, 2, KV_LAYOUT_FP8, KV_LAUNCH_BOUNDS)

// Long chunks: the fused kernels' lone groups pooling by halves (see
// kv_compress_cr2_long), at four blocks per SM on sm_90; V4, whose insert
// holds more state, spills 4 bytes at 64 registers and takes three.
#define KV_FUSED_LONG_KERNEL(name, LAYOUT, BOUNDS)                       \
    KV_KERNEL BOUNDS(KV_BLOCK_THREADS) void name(const KvFusedParams p) { \
        kv_compress<true, LAYOUT, true>(p.compress, &p.insert, 2);         \
    }

KV_FUSED_LONG_KERNEL(kv_fused_cr2_long_v4, KV_LAYOUT_V4, KV_LAUNCH_BOUNDS)
KV_FUSED_LONG_KERNEL(kv_fused_cr2_long_mxfp8, KV_LAYOUT_MXFP8, KV_LAUNCH_BOUNDS_4)
KV_FUSED_LONG_KERNEL(kv_fused_cr2_long_nvfp4, KV_LAYOUT_NVFP4, KV_LAUNCH_BOUNDS_4)
KV_FUSED_LONG_KERNEL(kv_fused_cr2_long_bf16, KV_LAYOUT_BF16, KV_LAUNCH_BOUNDS_4)
KV_FUSED_LONG_KERNEL(kv_fused_cr2_long_fp8, KV_LAYOUT_FP8, KV_LAUNCH_BOUNDS_4)

// OWN2: the multi-token team kernels (kv_cr2_owns_second).
#define KV_FUSED_TEAM_KERNEL(name, LAYOUT, OWN2)                                    \
    KV_KERNEL KV_LAUNCH_BOUNDS_9(KV_CR2_TEAM * 32) void name(const KvFusedParams p) { \
        kv_compress_cr2_team<true, LAYOUT, KV_CR2_TEAM, OWN2>(p.compress, &p.insert); \
    }
#define KV_FUSED_PAIR_KERNEL(name, LAYOUT)                                        \
    KV_KERNEL KV_LAUNCH_BOUNDS_16(KV_CR2_PAIR * 32) void name(const KvFusedParams p) { \
        kv_compress_cr2_team<true, LAYOUT, KV_CR2_PAIR>(p.compress, &p.insert);     \
    }

KV_FUSED_TEAM_KERNEL(kv_fused_cr2_team_v4, KV_LAYOUT_V4, false)
KV_FUSED_TEAM_KERNEL(kv_fused_cr2_team_mxfp8, KV_LAYOUT_MXFP8, false)
KV_FUSED_TEAM_KERNEL(kv_fused_cr2_team_nvfp4, KV_LAYOUT_NVFP4, false)
KV_FUSED_TEAM_KERNEL(kv_fused_cr2_team_bf16, KV_LAYOUT_BF16, false)
KV_FUSED_TEAM_KERNEL(kv_fused_cr2_team_fp8, KV_LAYOUT_FP8, false)

KV_FUSED_PAIR_KERNEL(kv_fused_cr2_pair_v4, KV_LAYOUT_V4)
KV_FUSED_PAIR_KERNEL(kv_fused_cr2_pair_mxfp8, KV_LAYOUT_MXFP8)
KV_FUSED_PAIR_KERNEL(kv_fused_cr2_pair_nvfp4, KV_LAYOUT_NVFP4)
KV_FUSED_PAIR_KERNEL(kv_fused_cr2_pair_bf16, KV_LAYOUT_BF16)
KV_FUSED_PAIR_KERNEL(kv_fused_cr2_pair_fp8, KV_LAYOUT_FP8)

// Screened fused launches of more than one multi-token request in four
// (kv_compress_cr2_team_mtp's request items, with the insert).
KV_FUSED_TEAM_KERNEL(kv_fused_cr2_team_mtp_v4, KV_LAYOUT_V4, true)
KV_FUSED_TEAM_KERNEL(kv_fused_cr2_team_mtp_mxfp8, KV_LAYOUT_MXFP8, true)
KV_FUSED_TEAM_KERNEL(kv_fused_cr2_team_mtp_nvfp4, KV_LAYOUT_NVFP4, true)
KV_FUSED_TEAM_KERNEL(kv_fused_cr2_team_mtp_bf16, KV_LAYOUT_BF16, true)
KV_FUSED_TEAM_KERNEL(kv_fused_cr2_team_mtp_fp8, KV_LAYOUT_FP8, true)

// The SM copy roofline (the bench's ceiling): each thread moves four 16-byte
// units per pass, all four loads issued before the stores, over a grid-stride
// loop, so that enough bytes are in flight to saturate the memory. The units
// pass through 32-bit words: whole-struct temporaries gave the AMD build a
// stack frame.
KV_KERNEL KV_LAUNCH_BOUNDS(KV_BLOCK_THREADS) void kv_copy(const KvCopyParams p) {
    const kv_u32x4* src = (const kv_u32x4*)p.src;
    kv_u32x4* dst = (kv_u32x4*)p.dst;
    uint64_t stride = (uint64_t)kv_gdim() * kv_bdim();
    uint64_t i = (uint64_t)kv_bid() * kv_bdim() + kv_tid();
    for (; i + 3u * stride < p.units; i += 4u * stride) {
        uint32_t v[16];
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            kv_u32x4 w = src[i + k * stride];
            v[4 * k] = w.x;
            v[4 * k + 1] = w.y;
            v[4 * k + 2] = w.z;
            v[4 * k + 3] = w.w;
        }
#pragma unroll
        for (int k = 0; k < 4; ++k)
            dst[i + k * stride] = kv_u32x4{v[4 * k], v[4 * k + 1], v[4 * k + 2], v[4 * k + 3]};
    }
    for (; i < p.units; i += stride) dst[i] = src[i];
}

// The reader (gather_dequant).
#include "kv_gather.h"

// Every kernel of the list (kv_abi.h) declared again with its parameter
// block: a definition above that takes another block does not compile.
#define KV_DECLARE_KERNEL(name, params) KV_KERNEL void name(const params p);
KV_KERNELS(KV_DECLARE_KERNEL)
#undef KV_DECLARE_KERNEL
