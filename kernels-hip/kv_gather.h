// The reader, gather_dequant: records gathered from a cache and written back
// dequantized, BF16 or F32, one 512-value row per record. Twin of
// src/operations/gather/reference.rs (GatherIn::locate, gather_reference); docs/layouts.md
// ("Reading records back") defines which record each output row reads.
//
// Work split: a group of 32 lanes gathers one output row (or two
// consecutive rows with KV_GF_TWO_ROWS, all their loads issued before the
// first conversion), or a block of two groups does one (the split kernels,
// one row a block: the 64 threads are one AMD wavefront). A row's
// output is cut into 16-byte units (8 dims of BF16, 4 of F32) and lane l of
// its L lanes (32 or 64) does units l, l + L, ...: every store instruction
// of a group writes 512 contiguous bytes, and every load instruction reads
// contiguous bytes of the record (the unit's 2 to 16 input bytes). No lane
// talks to another, so nothing depends on the warp or wavefront width.
//
// The reader's device functions; its entry points are in kv_gather.hip.
// The helpers it uses (kv_group, kv_page_row, kv_load_index, kv_count) are
// kv_common.h's, the decoders kv_formats.h's; the parameter block
// KvGatherParams and its flag bits are in kv_abi.h.
#pragma once

#include "kv_common.h"

KV_DEVICE int64_t kv_gather_cu(const KvGatherParams& p, int64_t i) {
    return kv_load_index(p.cu_seq_lens, (p.flags & KV_GF_CU_I64) != 0u, i);
}

// The slot kernels' row location (I64 slots, a power-of-two page and a
// cache of at least one block: GatherPlan::slot_kernels), without a
// branch, so that the row's loads leave right after its slot's: a group
// past the last row reads the last slot, and a slot outside the cache
// locates row 0 of block 0. Whether row o is written (the return) and
// whether its slot is beyond the cache (*missed, counted by the caller
// after the loads) are settled beside them.
// With EXACT, the grid holds no group past the last row (the split
// kernels).
template <bool EXACT>
KV_DEVICE bool kv_gather_locate_slot(const KvGatherParams& p, int64_t o, int64_t* block, int64_t* row,
                                     bool* missed) {
    const int64_t last = (int64_t)p.n - 1;
    const bool here = EXACT || o < p.n;
    const int64_t slot = ((const int64_t*)p.slots)[EXACT || o < last ? o : last];
    const bool in = (uint64_t)slot < (uint64_t)((int64_t)p.num_blocks * p.block_size);
    *block = in ? slot >> p.block_shift : 0;
    *row = in ? slot & (int64_t)(p.block_size - 1) : 0;
    *missed = here && slot >= 0 && !in;
    return here && in;
}

// Where output row o's record is (its cache block and row), for the
// general kernels; false, after counting the skip as gather_reference
// does, when there is none. Every lane of the group computes the same;
// lane 0 counts.
KV_DEVICE bool kv_gather_locate(const KvGatherParams& p, int64_t o, unsigned lane, int64_t* block, int64_t* row) {
    if ((p.flags & KV_GF_BLOCK_TABLE) == 0u) {
        int64_t slot = kv_load_index(p.slots, (p.flags & KV_GF_SLOT_I64) != 0u, o);
        if (slot < 0) return false;
        if (slot >= (int64_t)p.num_blocks * p.block_size) {
            kv_count(p.counters, KV_COUNT_SLOT, lane);
            return false;
        }
        *block = kv_page_row(slot, p.block_size, p.block_shift, row);
        return true;
    }
    const int32_t reqs = p.num_reqs;
    // Once per call: a total beyond out's rows leaves tokens ungathered.
    if (o == 0 && kv_gather_cu(p, reqs) > (int64_t)p.n) kv_count(p.counters, KV_COUNT_INDEX, lane);
    if (reqs == 0) return false;
    // The request search (GatherIn::request_of): on a non-decreasing
    // cu_seq_lens, the last request that starts at or before row o.
    int32_t lo = 0, hi = reqs;
    while (hi - lo > 1) {
        int32_t mid = lo + (hi - lo) / 2;
        if (kv_gather_cu(p, mid) <= o)
            lo = mid;
        else
            hi = mid;
    }
    int64_t c0 = kv_gather_cu(p, lo);
    if (!(c0 <= o && o < kv_gather_cu(p, lo + 1))) return false;
    int64_t start = (p.flags & KV_GF_HAS_STARTS)
                        ? kv_load_index(p.seq_starts, (p.flags & KV_GF_STARTS_I64) != 0u, lo)
                        : 0;
    // The row's index in its request, exact in 64 unsigned bits (c0 may be
    // far below 0); a position past INT64_MAX is past the table too.
    uint64_t i = (uint64_t)o - (uint64_t)c0;
    if (start < 0 || i > 0x7fffffffffffffffull - (uint64_t)start) {
        kv_count(p.counters, KV_COUNT_POS, lane);
        return false;
    }
    int64_t j = kv_page_row(start + (int64_t)i, p.block_size, p.block_shift, row);
    if (j >= p.max_blocks) {
        kv_count(p.counters, KV_COUNT_POS, lane);
        return false;
    }
    int64_t b = kv_load_index(p.block_table, (p.flags & KV_GF_TABLE_I64) != 0u,
                              (int64_t)lo * p.table_row_stride + j);
    if (b < 0 || b >= p.num_blocks) {
        kv_count(p.counters, KV_COUNT_SLOT, lane);
        return false;
    }
    *block = b;
    return true;
}

// N bytes (2, 4, 8 or 16, naturally aligned) as little-endian words.
template <int N>
KV_DEVICE void kv_load_raw(const uint8_t* q, uint32_t w[4]) {
    if constexpr (N == 16) {
        kv_u32x4 v = *(const kv_u32x4*)q;
        w[0] = v.x;
        w[1] = v.y;
        w[2] = v.z;
        w[3] = v.w;
    } else if constexpr (N == 8) {
        kv_u32x2 v = *(const kv_u32x2*)q;
        w[0] = v.x;
        w[1] = v.y;
    } else if constexpr (N == 4) {
        w[0] = *(const uint32_t*)q;
    } else {
        w[0] = *(const uint16_t*)q;
    }
}

// Output dims per 16-byte unit and units per lane.
template <bool F32>
struct KvGatherShape {
    static constexpr int DIMS = F32 ? 4 : 8;
    static constexpr int STEPS = 512 / (32 * DIMS);
};

// Whether a unit starting at dim d0 holds BF16 values in the record (BF16
// rows, V4's RoPE dims) rather than codes.
template <int LAYOUT>
KV_DEVICE bool kv_gather_unit_is_bf16(int d0) {
    return LAYOUT == KV_LAYOUT_BF16 || (LAYOUT == KV_LAYOUT_V4 && d0 >= 448);
}

// One lane's share of a row's record: the unit at dim d0's bytes and its
// scale byte (paged layouts).
template <int LAYOUT, bool F32>
KV_DEVICE void kv_gather_load_unit(const uint8_t* values, const uint8_t* scales, int d0, uint32_t w[4],
                                   uint32_t* sc) {
    constexpr int DIMS = KvGatherShape<F32>::DIMS;
    if (kv_gather_unit_is_bf16<LAYOUT>(d0)) {
        // V4: dim d >= 448 at bytes 448 + 2 (d - 448).
        int at = LAYOUT == KV_LAYOUT_V4 ? 2 * d0 - 448 : 2 * d0;
        kv_load_raw<2 * DIMS>(values + at, w);
        return;
    }
    if (LAYOUT == KV_LAYOUT_NVFP4) {
        kv_load_raw<DIMS / 2>(values + d0 / 2, w);
        *sc = scales[(unsigned)d0 / 16u];
    } else {
        kv_load_raw<DIMS>(values + d0, w);
        if (LAYOUT == KV_LAYOUT_V4) *sc = scales[(unsigned)d0 / 64u];
        if (LAYOUT == KV_LAYOUT_MXFP8) *sc = scales[(unsigned)d0 / 32u];
    }
}

// Per-launch constants of the FP8 rows decoder: the multiplier of
// kv_fp8_rows_multiplier (fast is false where there is none).
struct KvGatherFp8 {
    float scale;
    float mul;
    bool fast;
};

// Twin of formats.rs fp8_rows_multiplier: s * 2^120, exact for finite |s| < 2^8.
KV_DEVICE KvGatherFp8 kv_fp8_rows_multiplier(float s) {
    KvGatherFp8 f;
    f.scale = s;
    f.fast = kv_fabsf(s) < 256.0f;
    f.mul = f.fast ? s * kv_pow2(120) : 0.0f;
    return f;
}

// Code k of a unit (8-bit codes; 4-bit for NVFP4).
template <int LAYOUT>
KV_DEVICE uint32_t kv_gather_code(const uint32_t w[4], int k) {
    if (LAYOUT == KV_LAYOUT_NVFP4) return (w[k / 8] >> (4 * (k % 8))) & 0xfu;
    return (w[k / 4] >> (8 * (k % 4))) & 0xffu;
}

// The decoded value of element k of a code unit (layout::decode_record):
// code times scale, one f32 multiplication; every path below equals it.
template <int LAYOUT>
KV_DEVICE float kv_gather_value(const uint32_t w[4], int k, uint32_t sc, float fp8_scale) {
    uint32_t code = kv_gather_code<LAYOUT>(w, k);
    if (LAYOUT == KV_LAYOUT_NVFP4) return kv_e2m1_to_f32(code) * kv_e4m3_to_f32(sc);
    float scale = LAYOUT == KV_LAYOUT_FP8 ? fp8_scale : kv_ue8m0_to_f32(sc);
    return kv_e4m3_to_f32(code) * scale;
}

// The same value for a unit that passed kv_gather_finite (no NaN code, a
// scale that is no NaN), without the NaN selects: V4 and MXFP8 as the
// code's bits times 2^120 times the scale (both exact, then one rounding),
// FP8 rows as the code's bits times the folded multiplier, NVFP4 as the
// code times its tile scale.
template <int LAYOUT>
KV_DEVICE float kv_gather_finite_value(const uint32_t w[4], int k, uint32_t sc, float nvfp4_scale,
                                       const KvGatherFp8& fp8) {
    uint32_t code = kv_gather_code<LAYOUT>(w, k);
    if (LAYOUT == KV_LAYOUT_NVFP4) return kv_e2m1_to_f32(code) * nvfp4_scale;
    if (LAYOUT == KV_LAYOUT_FP8) return kv_e4m3_bits_f32(code) * fp8.mul;
    return kv_e4m3_bits_f32(code) * kv_pow2(120) * kv_ue8m0_to_f32(sc);
}

// Whether an F32 code unit's four products are exact with their low 16
// bits zero (kv_e4m3_scaled_pow2's domain): V4 and MXFP8 with a scale byte
// in 3..134 and no NaN code. Almost every unit of a written cache.
template <int LAYOUT>
KV_DEVICE bool kv_gather_exact_f32(const uint32_t w[4], uint32_t sc) {
    if (LAYOUT != KV_LAYOUT_V4 && LAYOUT != KV_LAYOUT_MXFP8) return false;
    return !kv_e4m3_nan_in_word(w[0]) & (sc - 3u <= 131u);
}

// Whether no product of a code unit is a NaN, so that the NaN selects can
// go: no NaN code and a scale that is no NaN (V4, MXFP8: not 255; NVFP4:
// the tile scale not 0x7F/0xFF; FP8 rows: a multiplier exists).
template <int LAYOUT, bool F32>
KV_DEVICE bool kv_gather_finite(const uint32_t w[4], uint32_t sc, const KvGatherFp8& fp8) {
    if (LAYOUT == KV_LAYOUT_NVFP4) return (sc & 0x7fu) != 0x7fu;
    bool nan = F32 ? kv_e4m3_nan_in_word(w[0]) : kv_e4m3_nan_in_word(w[0]) | kv_e4m3_nan_in_word(w[1]);
    if (LAYOUT == KV_LAYOUT_FP8) return !nan & fp8.fast;
    return !nan & (sc != 255u);
}

KV_DEVICE kv_u32x4 kv_u32x4_of(const uint32_t o[4]) {
    kv_u32x4 v;
    v.x = o[0];
    v.y = o[1];
    v.z = o[2];
    v.w = o[3];
    return v;
}

// FP8 rows' BF16 words o of a unit's codes w by the finite path, with each
// half whose code is a NaN made the canonical NaN (the finite path reads
// such a code's bits as a number): word k holds codes 2k and 2k + 1.
KV_DEVICE void kv_gather_fp8_nan_canonical(const uint32_t w[4], uint32_t o[4]) {
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        const uint32_t c = w[k / 2] >> (16 * (k % 2));
        o[k] = kv_e4m3x2_nan_canonical(o[k], (c & 0xffu) | ((c << 8) & 0x00ff0000u), 0u);
    }
}

// A code unit's BF16 words on its common path, and whether they are its
// values (the path's domain): V4 and MXFP8 by pair multiplications for
// every scale byte from 3 (kv_e4m3x2_scaled_pow2_bf16x2, then with
// PAIR_REST the rest past 134 and canonical NaNs in a short branch,
// kv_e4m3x2_scale_rest_bf16x2 and kv_e4m3x2_nan_canonical; without it
// the domain is scale bytes 3..134 and no NaN code), NVFP4 and FP8 rows
// by the finite path (kv_gather_finite).
// The words come before the test and do not wait on it, so that a written
// cache's unit meets no branch until it is done.
template <int LAYOUT, bool PAIR_REST>
KV_DEVICE bool kv_gather_codes_bf16_common(const uint32_t w[4], uint32_t sc, const KvGatherFp8& fp8, uint32_t o[4]) {
    if (LAYOUT == KV_LAYOUT_V4 || LAYOUT == KV_LAYOUT_MXFP8) {
        // A word's even and odd codes each scaled as a pair by
        // 2^(min(b, 134) - 7), then interleaved.
        const uint32_t b = sc < 134u ? sc : 134u;
        uint32_t even[2], odd[2];
#pragma unroll
        for (int k = 0; k < 2; ++k) {
            even[k] = kv_e4m3x2_scaled_pow2_bf16x2(w[k], b);
            odd[k] = kv_e4m3x2_scaled_pow2_bf16x2(w[k] >> 8, b);
        }
        if (PAIR_REST && ((sc > 134u) | kv_e4m3_nan_in_word(w[0]) | kv_e4m3_nan_in_word(w[1]))) {
#pragma unroll
            for (int k = 0; k < 2; ++k) {
                even[k] = kv_e4m3x2_nan_canonical(kv_e4m3x2_scale_rest_bf16x2(even[k], sc), w[k], sc);
                odd[k] = kv_e4m3x2_nan_canonical(kv_e4m3x2_scale_rest_bf16x2(odd[k], sc), w[k] >> 8, sc);
            }
        }
#pragma unroll
        for (int k = 0; k < 2; ++k) {
            o[2 * k] = kv_pack_lo16(even[k], odd[k]);
            o[2 * k + 1] = kv_pack_hi16(even[k], odd[k]);
        }
        if (PAIR_REST) return sc >= 3u;
        return !(kv_e4m3_nan_in_word(w[0]) | kv_e4m3_nan_in_word(w[1])) & (sc - 3u <= 131u);
    }
    if (LAYOUT == KV_LAYOUT_NVFP4) {
        // Every NVFP4 product is exact in BF16 (formats.rs,
        // reader_shortcuts_are_exact): codes j and j + 4 by pair
        // multiplications, then interleaved.
        uint32_t s = kv_f2u(kv_e4m3_to_f32(sc)) >> 16;
        uint32_t r[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) r[j] = kv_e2m1x2_scaled_bf16x2(w[0] >> (4 * j), s | (s << 16));
        o[0] = kv_pack_lo16(r[0], r[1]);
        o[1] = kv_pack_lo16(r[2], r[3]);
        o[2] = kv_pack_hi16(r[0], r[1]);
        o[3] = kv_pack_hi16(r[2], r[3]);
    } else {
#pragma unroll
        for (int k = 0; k < 4; ++k)
            o[k] = kv_bf16x2_from_f32(kv_gather_finite_value<LAYOUT>(w, 2 * k, sc, 0.0f, fp8),
                                      kv_gather_finite_value<LAYOUT>(w, 2 * k + 1, sc, 0.0f, fp8));
    }
    return kv_gather_finite<LAYOUT, false>(w, sc, fp8);
}

// A code unit's BF16 words outside its common path's domain (V4 and
// MXFP8: scale bytes 0..2, whose products may round to BF16 subnormals):
// V4 and MXFP8 by the finite path where no product is a NaN, FP8 rows
// with a multiplier by the finite path and their NaN codes made canonical
// (kv_gather_fp8_nan_canonical), else every layout by the definition, each
// value rounded as any pair (a NaN to some NaN) and every NaN half then
// made the canonical one (kv_bf16_from_f32 of each value).
template <int LAYOUT>
KV_DEVICE void kv_gather_codes_bf16_rest(const uint32_t w[4], uint32_t sc, const KvGatherFp8& fp8, uint32_t o[4]) {
    const bool fp8_fast = LAYOUT == KV_LAYOUT_FP8 && fp8.fast;
    const bool pow2 = LAYOUT == KV_LAYOUT_V4 || LAYOUT == KV_LAYOUT_MXFP8;
    if (fp8_fast || (pow2 && kv_gather_finite<LAYOUT, false>(w, sc, fp8))) {
#pragma unroll
        for (int k = 0; k < 4; ++k)
            o[k] = kv_bf16x2_from_f32(kv_gather_finite_value<LAYOUT>(w, 2 * k, sc, 0.0f, fp8),
                                      kv_gather_finite_value<LAYOUT>(w, 2 * k + 1, sc, 0.0f, fp8));
        if (fp8_fast) kv_gather_fp8_nan_canonical(w, o);
        return;
    }
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        float a, b;
        kv_bf16_round_pair_any_nan(kv_gather_value<LAYOUT>(w, 2 * k, sc, fp8.scale),
                                   kv_gather_value<LAYOUT>(w, 2 * k + 1, sc, fp8.scale), &a, &b);
        o[k] = kv_bf16x2_canonical((kv_f2u(a) >> 16) | (kv_f2u(b) & 0xffff0000u));
    }
}

// A BF16-in-record unit's words: kept (widened for F32), and whether they
// are its values (no NaN in it).
template <bool F32>
KV_DEVICE bool kv_gather_bf16_words(const uint32_t w[4], uint32_t o[4]) {
    bool nan = kv_bf16_nan_in_word(w[0]) | kv_bf16_nan_in_word(w[1]);
    if (!F32) nan = nan | kv_bf16_nan_in_word(w[2]) | kv_bf16_nan_in_word(w[3]);
#pragma unroll
    for (int k = 0; k < 4; ++k) o[k] = F32 ? (w[k / 2] >> (16 * (k % 2))) << 16 : w[k];
    return !nan;
}

// The same unit's values where it holds a NaN: each one canonical (BF16
// output a word at a time).
template <bool F32>
KV_DEVICE void kv_gather_bf16_canonical_words(const uint32_t w[4], uint32_t o[4]) {
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        if (F32)
            o[k] = kv_f32_canonical(kv_bf16_to_f32((uint16_t)((w[k / 2] >> (16 * (k % 2))) & 0xffffu)));
        else
            o[k] = kv_bf16x2_canonical(w[k]);
    }
}

// A V4 or MXFP8 F32 code unit's words where kv_gather_exact_f32 holds.
template <int LAYOUT>
KV_DEVICE void kv_gather_f32_pow2_words(const uint32_t w[4], uint32_t sc, uint32_t o[4]) {
#pragma unroll
    for (int k = 0; k < 4; ++k) o[k] = kv_f2u(kv_e4m3_scaled_pow2(kv_gather_code<LAYOUT>(w, k), sc));
}

// An F32 code unit's words by the finite path (kv_gather_finite holds).
template <int LAYOUT>
KV_DEVICE void kv_gather_f32_finite_words(const uint32_t w[4], uint32_t sc, const KvGatherFp8& fp8, uint32_t o[4]) {
    float ns = LAYOUT == KV_LAYOUT_NVFP4 ? kv_e4m3_to_f32(sc) : 0.0f;
#pragma unroll
    for (int k = 0; k < 4; ++k) o[k] = kv_f2u(kv_gather_finite_value<LAYOUT>(w, k, sc, ns, fp8));
}

// An F32 code unit's words by the definition, every NaN canonical.
template <int LAYOUT>
KV_DEVICE void kv_gather_f32_definition_words(const uint32_t w[4], uint32_t sc, const KvGatherFp8& fp8,
                                              uint32_t o[4]) {
#pragma unroll
    for (int k = 0; k < 4; ++k) o[k] = kv_f32_canonical(kv_gather_value<LAYOUT>(w, k, sc, fp8.scale));
}

// One unit's 16 output bytes as words.
template <int LAYOUT, bool F32>
KV_DEVICE kv_u32x4 kv_gather_convert_unit(const uint32_t w[4], uint32_t sc, int d0, const KvGatherFp8& fp8) {
    uint32_t o[4];
    if (kv_gather_unit_is_bf16<LAYOUT>(d0)) {
        // BF16 in the record: kept (widened for F32), except that a NaN
        // becomes the canonical one.
        if (kv_gather_bf16_words<F32>(w, o)) return kv_u32x4_of(o);
        kv_gather_bf16_canonical_words<F32>(w, o);
    } else if (!F32) {
        if (!kv_gather_codes_bf16_common<LAYOUT, true>(w, sc, fp8, o)) kv_gather_codes_bf16_rest<LAYOUT>(w, sc, fp8, o);
    } else if (kv_gather_exact_f32<LAYOUT>(w, sc)) {
        kv_gather_f32_pow2_words<LAYOUT>(w, sc, o);
    } else if (kv_gather_finite<LAYOUT, true>(w, sc, fp8)) {
        kv_gather_f32_finite_words<LAYOUT>(w, sc, fp8, o);
    } else {
        kv_gather_f32_definition_words<LAYOUT>(w, sc, fp8, o);
    }
    return kv_u32x4_of(o);
}

// The split kernels' unit, for the fewest rows, where a jump on the way to
// the store costs most: its words on the straight path (the one every unit
// of a written cache takes) and whether they are its values. No lane jumps
// there: a V4 lane computes both unit kinds and keeps its own.
template <int LAYOUT, bool F32>
KV_DEVICE bool kv_gather_split_straight(const uint32_t w[4], uint32_t sc, int d0, const KvGatherFp8& fp8,
                                        uint32_t o[4]) {
    uint32_t ob[4], oc[4];
    const bool tb = kv_gather_bf16_words<F32>(w, ob);
    if (LAYOUT == KV_LAYOUT_BF16) {
#pragma unroll
        for (int k = 0; k < 4; ++k) o[k] = ob[k];
        return tb;
    }
    bool tc;
    if (!F32) {
        tc = kv_gather_codes_bf16_common<LAYOUT, false>(w, sc, fp8, oc);
    } else if (LAYOUT == KV_LAYOUT_V4 || LAYOUT == KV_LAYOUT_MXFP8) {
        tc = kv_gather_exact_f32<LAYOUT>(w, sc);
        kv_gather_f32_pow2_words<LAYOUT>(w, sc, oc);
    } else {
        tc = kv_gather_finite<LAYOUT, true>(w, sc, fp8);
        kv_gather_f32_finite_words<LAYOUT>(w, sc, fp8, oc);
    }
    const bool bf16 = kv_gather_unit_is_bf16<LAYOUT>(d0);
#pragma unroll
    for (int k = 0; k < 4; ++k) o[k] = bf16 ? ob[k] : oc[k];
    return bf16 ? tb : tc;
}

// The values of a split kernel's unit off its straight path, from its
// straight words o.
template <int LAYOUT, bool F32>
KV_DEVICE void kv_gather_split_rest(const uint32_t w[4], uint32_t sc, int d0, const KvGatherFp8& fp8, uint32_t o[4]) {
    const bool pow2 = LAYOUT == KV_LAYOUT_V4 || LAYOUT == KV_LAYOUT_MXFP8;
    if (kv_gather_unit_is_bf16<LAYOUT>(d0)) {
        kv_gather_bf16_canonical_words<F32>(w, o);
    } else if (!F32 && pow2 && sc >= 3u) {
        // The interleave undone (o[2k], o[2k + 1] hold word k's even and
        // odd pairs' halves), the rest of the pair path, and redone.
#pragma unroll
        for (int k = 0; k < 2; ++k) {
            uint32_t even = kv_pack_lo16(o[2 * k], o[2 * k + 1]);
            uint32_t odd = kv_pack_hi16(o[2 * k], o[2 * k + 1]);
            even = kv_e4m3x2_nan_canonical(kv_e4m3x2_scale_rest_bf16x2(even, sc), w[k], sc);
            odd = kv_e4m3x2_nan_canonical(kv_e4m3x2_scale_rest_bf16x2(odd, sc), w[k] >> 8, sc);
            o[2 * k] = kv_pack_lo16(even, odd);
            o[2 * k + 1] = kv_pack_hi16(even, odd);
        }
    } else if (!F32) {
        kv_gather_codes_bf16_rest<LAYOUT>(w, sc, fp8, o);
    } else if (pow2 && kv_gather_finite<LAYOUT, true>(w, sc, fp8)) {
        kv_gather_f32_finite_words<LAYOUT>(w, sc, fp8, o);
    } else {
        kv_gather_f32_definition_words<LAYOUT>(w, sc, fp8, o);
    }
}

// Kernel forms. GENERAL: every addressing form, one or two rows per group
// (KV_GF_BLOCK_TABLE, KV_GF_TWO_ROWS). SLOTS: I64 slots on power-of-two
// pages with a row per group, fixed at compile time (the block-table
// search, the other index variants and the second row gone, and the row
// located without a branch, kv_gather_locate_slot, so the path to the
// row's loads is short and straight). SPLIT: the same slots with
// each row split over two groups, one 16-byte unit a lane (BF16), for the
// fewest rows, where a group's chain of conversions is most of the launch
// (docs/tuning.md, "The reader"): a row a block of 64 threads on a grid of
// exactly n, and each unit on its straight path stored before its test.
#define KV_GATHER_GENERAL 0
#define KV_GATHER_SLOTS 1
#define KV_GATHER_SPLIT 2

// An output unit's store. NVFP4's rows go out marked evict-first: its
// records are the smallest, so the 1024 output bytes a row otherwise push
// its neighbours' scale sectors out of L2 before they are read.
template <int LAYOUT>
KV_DEVICE void kv_gather_store(kv_u32x4* p, kv_u32x4 v) {
    if (LAYOUT == KV_LAYOUT_NVFP4)
        kv_store_16_evict_first(p, v.x, v.y, v.z, v.w);
    else
        *p = v;
}

template <int LAYOUT, bool F32, int FORM>
KV_DEVICE void kv_gather(const KvGatherParams& p) {
    constexpr int DIMS = KvGatherShape<F32>::DIMS;
    // Lanes a row and units a lane.
    constexpr int ROW_LANES = FORM == KV_GATHER_SPLIT ? 64 : 32;
    constexpr int STEPS = 512 / (ROW_LANES * DIMS);
    constexpr int V = LAYOUT == KV_LAYOUT_V4 ? 576 : LAYOUT == KV_LAYOUT_MXFP8 ? 512 : 256;
    constexpr int S = LAYOUT == KV_LAYOUT_V4 ? 8 : LAYOUT == KV_LAYOUT_MXFP8 ? 16 : 32;
    constexpr bool PAGED = LAYOUT == KV_LAYOUT_V4 || LAYOUT == KV_LAYOUT_MXFP8 || LAYOUT == KV_LAYOUT_NVFP4;
    // A split row is a block of 64 threads, one row a block on a grid of
    // exactly n (gather_launch), so its index and lanes come straight from
    // the dispatch, without the flags or a clamp.
    const bool split = FORM == KV_GATHER_SPLIT;
    const int64_t g = split ? (int64_t)kv_bid() : kv_group(p.flags);
    const unsigned lane = split ? kv_tid() : kv_lane();
    const bool two = FORM == KV_GATHER_GENERAL && (p.flags & KV_GF_TWO_ROWS) != 0u;
    const int64_t first = two ? 2 * g : g;
    const KvGatherFp8 fp8 = kv_fp8_rows_multiplier(LAYOUT == KV_LAYOUT_FP8 ? *p.fp8_scale : 1.0f);

    bool ok[2];
    bool missed = false;
    const uint8_t* values[2];
    const uint8_t* scales[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        int64_t o = first + r;
        int64_t block = 0, row = 0;
        if (FORM != KV_GATHER_GENERAL)
            ok[r] = r == 0 && kv_gather_locate_slot<split>(p, o, &block, &row, &missed);
        else
            ok[r] = (r == 0 || two) && o < p.n && kv_gather_locate(p, o, lane, &block, &row);
        const uint8_t* page = p.cache + block * p.block_stride;
        // V4 records are page-planar only (RecordOrder::PerToken).
        const bool per_token = LAYOUT != KV_LAYOUT_V4 && (p.flags & KV_GF_PER_TOKEN) != 0u;
        kv_record_at<V, S>(page, row, p.block_size, per_token, &values[r], &scales[r]);
        if (!PAGED) values[r] = page + row * p.row_stride;
    }

    // 16-byte units: 8 BF16 or 4 F32 elements.
    kv_u32x4* out[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) out[r] = (kv_u32x4*)((uint8_t*)p.out + (first + r) * p.out_row_stride * (F32 ? 4 : 2)) + lane;

    uint32_t w[2][STEPS][4];
    uint32_t sc[2][STEPS];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        // The slot kernels load their row whether or not it is written.
        if (FORM == KV_GATHER_GENERAL ? !ok[r] : r == 1) continue;
#pragma unroll
        for (int s = 0; s < STEPS; ++s) {
            // A split V4 code unit's words past its own are zero: they are
            // tested as BF16 there, and the result discarded.
            if (split && LAYOUT == KV_LAYOUT_V4) w[r][s][2] = w[r][s][3] = 0u;
            kv_gather_load_unit<LAYOUT, F32>(values[r], scales[r], DIMS * (int)(lane + ROW_LANES * s), w[r][s],
                                             &sc[r][s]);
        }
    }
    if (missed) kv_count(p.counters, KV_COUNT_SLOT, lane);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        if (!ok[r]) continue;
#pragma unroll
        for (int s = 0; s < STEPS; ++s) {
            const int d0 = DIMS * ((int)lane + ROW_LANES * s);
            if (FORM != KV_GATHER_SPLIT) {
                kv_gather_store<LAYOUT>(out[r] + ROW_LANES * s,
                                        kv_gather_convert_unit<LAYOUT, F32>(w[r][s], sc[r][s], d0, fp8));
                continue;
            }
            // The straight words go out before their test, so that a unit
            // on that path meets no jump between its loads' arrival and its
            // store; any other stores its values over them.
            uint32_t o[4];
            const bool straight = kv_gather_split_straight<LAYOUT, F32>(w[r][s], sc[r][s], d0, fp8, o);
            kv_gather_store<LAYOUT>(out[r] + ROW_LANES * s, kv_u32x4_of(o));
            if (straight) continue;
            kv_gather_split_rest<LAYOUT, F32>(w[r][s], sc[r][s], d0, fp8, o);
            kv_gather_store<LAYOUT>(out[r] + ROW_LANES * s, kv_u32x4_of(o));
        }
    }
}
