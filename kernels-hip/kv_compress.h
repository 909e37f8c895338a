// The compressor (fused_save_compress_norm) as device functions: the RMS
// norm, the CR1 item, the CR2 items alone or in teams (pooling, ring
// stores, the norm and the latent's emission) and the per-launch dispatch
// (kv_compress, kv_compress_cr2_team) that the plain and the fused entry
// points call. The fused kernels insert each latent through kv_record.h.
#pragma once

#include "kv_record.h"

// ---- the norm: math::sum_squares_512 / inv_rms_512 / norm_scale ----------

// math::inv_rms_512 from the sum of squares s (math::sum_squares_512): s / 512
// as its product with 2^-9, the same real, so the same rounded bits
// (tests/formats_exhaustive.rs), without the division's range check (CR1
// 1-2 % faster at decode sizes: docs/tuning.md, The norm).
KV_DEVICE float kv_inv_rms_of_sum(float s, float eps) {
    float var = s * 0.001953125f;
    return kv_divf(1.0f, kv_sqrtf(var + eps));
}

// The inverse RMS of the 512 values whose lane l holds v[16 l .. 16 l + 16):
// squares folded by halves inside the lane, then a butterfly over the 32
// lanes; every lane ends with it.
KV_DEVICE float kv_inv_rms16(const float v[16], float eps) {
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
    return kv_inv_rms_of_sum(s, eps);
}

// math::norm_scale of lane l's 16 values by the inverse and its 16 weights w.
template <class W>
KV_DEVICE void kv_norm_scale16(const float v[16], float inv, const W& w, uint16_t out[16]) {
    float r[16];
#pragma unroll
    for (int j = 0; j < 16; ++j) r[j] = (v[j] * inv) * kv_weight_at(w, j);
    kv_bf16x16_from_f32(r, out);
}

// Lane l holds v[16 l .. 16 l + 16) and w, its 16 weights (the tuned
// kernels' BF16 ones loaded by the caller with its first reads, not after
// them): kv_inv_rms16, then kv_norm_scale16.
template <class W>
KV_DEVICE void kv_rms_norm16(const float v[16], const W& w, float eps, uint16_t out[16]) {
    kv_norm_scale16(v, kv_inv_rms16(v, eps), w, out);
}

// ---- fused_save_compress_norm ----------------------------------------------

// What a compress item does with the latent of token t it produced: store
// it, and in the fused kernels insert it. The item passes the token's
// position (one tensor serves the compressor and the insert), so only the
// cache slot is read here.
// HAVE_SLOT: the caller loaded the insert's cache slot (`slot`).
template <bool FUSED, int LAYOUT, bool WIDE = false, bool HAVE_SLOT = false>
KV_DEVICE void kv_emit_latent(const KvCompressParams& c, const KvInsertParams* ins, int64_t t, unsigned lane,
                              const uint16_t out[16], int64_t pos, int64_t slot = 0) {
    if (!FUSED || (c.flags & KV_F_WRITE_LATENT)) kv_store16h(c.latent + t * 512 + 16 * lane, out);
    if (FUSED) {
        if (!HAVE_SLOT) slot = kv_load_index(ins->slots, (ins->flags & KV_F_SLOT_I64) != 0u, t);
        if (slot < 0) return;
        // The scale only for a slot that is written: the one-group fused CR2
        // kernels sit at AMD's scalar-register limit.
        float fp8_scale = kv_load_fp8_scale<LAYOUT>(*ins);
        int64_t base;
        if (kv_insert_check<false>(*ins, slot, pos, lane, &base))
            kv_write_record<LAYOUT, false, false, WIDE>(*ins, slot, base, lane, out, fp8_scale);
    }
}

// WIDE (the generic kernels): f32 weights, loaded where the norm needs them.
template <bool FUSED, int LAYOUT, bool WIDE = false>
KV_DEVICE void kv_compress_cr1_item(const KvCompressParams& c, const KvInsertParams* ins, int64_t t) {
    unsigned lane = kv_lane();
    // Row, weights and indices in one round trip. nvcc loads data used only
    // past an early exit after that exit, so an item whose skip test came
    // first waited for its indices and then for its row; the test therefore
    // follows the norm (no effect before it; its shuffles keep the loads
    // ahead), and the insert's slot is loaded with the rest. Not in the
    // fused BF16 and FP8 rows, which ran slower that way at 8192 tokens, nor
    // in the generic kernels (docs/tuning.md, The skip test after the norm).
    constexpr bool SKIP_LATE =
        !WIDE && (!FUSED || (LAYOUT != KV_LAYOUT_BF16 && LAYOUT != KV_LAYOUT_FP8));
    float v[16];
    typename KvWeight16<WIDE>::T w;
    kv_loadNf<16>(c.kv_score + t * c.kv_row_stride + 16 * lane, v);
    if constexpr (!WIDE) kv_load_weight16(c, lane, &w);
    int64_t pos = FUSED ? kv_load_index(c.positions, (c.flags & KV_F_POS_I64) != 0u, t) : 0;
    int64_t ins_slot =
        FUSED && SKIP_LATE ? kv_load_index(ins->slots, (ins->flags & KV_F_SLOT_I64) != 0u, t) : 0;
    int64_t slot = kv_load_index(c.slots, (c.flags & KV_F_SLOT_I64) != 0u, t);
    if (!SKIP_LATE && slot < 0) return;
    if constexpr (WIDE) kv_load_weight16(c, lane, &w);
    uint16_t out[16];
    kv_rms_norm16(v, w, c.eps, out);
    if (SKIP_LATE && slot < 0) return;
    kv_emit_latent<FUSED, LAYOUT, WIDE, SKIP_LATE>(c, ins, t, lane, out, pos, ins_slot);
}

// ---- CR2 items, alone or in teams -----------------------------------------
//
// A CR2 item's pooling (an exp and an IEEE division per dim) is a long
// dependent chain per lane, and at decode sizes, with one item per SM, that
// chain is most of the kernel's time. Small launches therefore give each item
// a team of KV_CR2_TEAM groups (one block): each lane pools 16 / KV_CR2_TEAM
// dims (kv_part_offset), the pooled values meet in shared memory, and group 0
// norms and emits them exactly as a lone group does (the sum order of the
// norm is unchanged). In the plain compressor's long-chunk teams
// (kv_compress_cr2_team_chunks), which store the latent as it is, every lane
// norms its own dims in that same order instead (kv_team_norm_store).
// TEAM = 1 is the lone group.
//
// Large decode batches of one-token requests run pairs of groups instead:
// a block of 64 threads, one AMD wavefront, with half the idle lanes of a
// team of four while group 0 norms and emits, so more items run at once
// (see LaunchPolicy::cr2_shape for the measured ranges).

// KV_CR2_TEAM and KV_CR2_PAIR are in kv_abi.h (the host sizes the blocks).

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
// docs/tuning.md, Kernels.) INV_FIRST: the weights after the inverse, so
// that they are not live across its slow-path calls (the spread kernel's
// token blocks: it fit a team kernel in 40 registers, and the pair kernel
// that replaced it was measured with it).
template <bool FUSED, int LAYOUT, bool WIDE = false, bool INV_FIRST = false>
KV_DEVICE void kv_norm_emit(const KvCompressParams& c, const KvInsertParams* ins, int64_t t, int64_t pos,
                            unsigned lane, const float v[16]) {
    uint16_t out[16];
    if constexpr (INV_FIRST) {
        float inv = kv_inv_rms16(v, c.eps);
        typename KvWeight16<WIDE>::T w;
        kv_load_weight16(c, lane, &w);
        kv_norm_scale16(v, inv, w, out);
    } else {
        typename KvWeight16<WIDE>::T w;
        kv_load_weight16(c, lane, &w);
        kv_rms_norm16(v, w, c.eps, out);
    }
    kv_emit_latent<FUSED, LAYOUT, WIDE>(c, ins, t, lane, out, pos);
}

// The norm and the store of a plain compress's latent of token t, pooled by
// a team of four whose lane (g, l) holds v, the N = 4 dims [4 m, 4 m + 4)
// with m = l + 32 g (kv_part_offset): every lane norms and stores its own
// dims, where one group took all 512 after the team's barrier. The sum is
// math::sum_squares_512's tree, bit for bit: its lane i is the four lanes
// m = 4 i + k, whose fold steps a[j] += a[j + h] run across those lanes
// for h = 8, 4 (xor 2, xor 1) and inside each for h = 2, 1; its
// butterfly's first levels, i ^ 16 and i ^ 8 (the bits of i that are g),
// are a fold by halves of the four groups' sums in shared memory (sums: 32
// floats), the rest shuffles (lane xor 16, 8, 4). Every lane of the team
// calls this (one barrier); `emit` gates only the store. (The fused
// kernels' records want a lane's 16 dims: they keep kv_rms_norm16.)
template <int TEAM>
KV_DEVICE void kv_team_norm_store(const KvCompressParams& c, int64_t t, KvTeamLane tl, const float v[16 / TEAM],
                                  float* sums, bool emit) {
    static_assert(TEAM == 4, "teams of four (the long-chunk teams)");
    constexpr int N = 16 / TEAM;
    const unsigned m = tl.l + KV_GROUP_LANES * tl.g;
    // The lane's N weights (BF16, two a word), issued before the sum.
    float wp[N / 2];
    kv_loadNf<N / 2>((const float*)(const void*)(c.weight + N * m), wp);
    float a[N];
#pragma unroll
    for (int j = 0; j < N; ++j) a[j] = v[j] * v[j];
#pragma unroll
    for (int j = 0; j < 4; ++j) a[j] = a[j] + kv_shfl_xor(a[j], 2);  // h = 8
#pragma unroll
    for (int j = 0; j < 4; ++j) a[j] = a[j] + kv_shfl_xor(a[j], 1);  // h = 4
    a[0] = a[0] + a[2];
    a[1] = a[1] + a[3];
    a[0] = a[0] + a[1];
    // Tree lane i = 8 g + l / 4 at sums[4 (l / 4) + g], so that a lane reads
    // its i's four groups' sums in one load.
    if (tl.l % 4u == 0u) sums[tl.l + tl.g] = a[0];
    kv_sync();
    float e[4];
    kv_loadNf<4>(sums + (tl.l - tl.l % 4u), e);
    float s = (e[0] + e[2]) + (e[1] + e[3]);
    s = s + kv_shfl_xor(s, 16);
    s = s + kv_shfl_xor(s, 8);
    s = s + kv_shfl_xor(s, 4);
    float inv = kv_inv_rms_of_sum(s, c.eps);
    if (!emit) return;
    float r[N];
#pragma unroll
    for (int j = 0; j < N; ++j) {
        uint32_t u = kv_f2u(wp[j / 2]);
        r[j] = (v[j] * inv) * kv_u2f((j & 1) ? (u & 0xffff0000u) : (u << 16));
    }
    uint16_t out[N];
    kv_bf16xN_from_f32<N>(r, out);
    kv_storeNh<N>(c.latent + t * 512 + N * m, out);
}

// Pools (older, newer) over the team, then group 0 norms and emits the latent
// of token t (at position `pos`); with TEAM_NORM (the long-chunk teams) the
// whole team norms and stores it (kv_team_norm_store). A team meets at one
// barrier, so every lane
// of the block must call this (the callers' conditions are the same for the
// whole item). The steps of kv_pool_part and kv_norm_emit (the weights'
// load after the pooling included) are written out here: through the
// helpers nvcc schedules five fused team and pair kernels differently (the
// same instructions), and this form keeps the SASS that was measured.
template <bool FUSED, int LAYOUT, int TEAM, bool WIDE = false, bool TEAM_NORM = false>
KV_DEVICE void kv_pool_norm_emit(const KvCompressParams& c, const KvInsertParams* ins, int64_t t, int64_t pos,
                                 KvTeamLane tl, const KvRowPart<16 / TEAM>& older,
                                 const KvRowPart<16 / TEAM>& newer, float* pooled, bool emit = true) {
    constexpr int N = 16 / TEAM;
    float v[16], den[N];
#pragma unroll
    for (int j = 0; j < N; ++j)
        kv_pool2_terms(older.kv[j], older.s[j], newer.kv[j], newer.s[j], &v[j], &den[j]);
#pragma unroll
    for (int j = 0; j < N; ++j) v[j] = kv_divf(v[j], den[j]);
    if constexpr (TEAM_NORM) {
        static_assert(TEAM > 1 && !FUSED && !WIDE, "a plain compress's team");
        kv_team_norm_store<TEAM>(c, t, tl, v, pooled, emit);
        return;
    }
    if (TEAM > 1) {
        kv_storeNf<N>(pooled + kv_part_offset<TEAM>(tl), v);
        kv_sync();
        if (tl.g != 0u) return;
        kv_loadNf<16>(pooled + 16u * tl.l, v);
    }
    if (!emit) return;
    typename KvWeight16<WIDE>::T w;
    kv_load_weight16(c, tl.l, &w);
    uint16_t out[16];
    kv_rms_norm16(v, w, c.eps, out);
    kv_emit_latent<FUSED, LAYOUT, WIDE>(c, ins, t, tl.l, out, pos);
}

// The long-chunk kernels' lone group pools its 16 dims in two halves of 8
// (the dims a pair's two groups would hold), reading each half's rows just
// before pooling it: at most 32 row values live at once instead of 64, so
// the kernel fits 64 registers (four blocks per SM on sm_90) without
// spilling. The halves' values land where the one-pass order puts them.
template <bool FUSED, int LAYOUT, bool WIDE = false>
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
    kv_norm_emit<FUSED, LAYOUT, WIDE>(c, ins, t, pos, lane, v);
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

// Whether token t (its slot, position and request read) passes the tests
// made before its chunk's: a slot, a position (else counted), an odd one
// (it closes a group), a request in range (else counted).
KV_DEVICE bool kv_cr2_token_closes(const KvCompressParams& c, int64_t slot, int64_t pos, int64_t r, KvTeamLane tl) {
    if (slot < 0) return false;
    if (pos < 0) {
        kv_team_count(c.counters, KV_COUNT_POS, tl);
        return false;
    }
    if ((pos & 1) == 0) return false;
    if (r < 0 || r >= c.num_reqs) {
        kv_team_count(c.counters, KV_COUNT_INDEX, tl);
        return false;
    }
    return true;
}

// A token's chunk bounds whose tests are still to be made (open).
struct KvPendingChunk {
    int64_t start;
    int64_t end;
    bool open;
};

// Whether token t lies in the chunk [start, end) (start < 0: malformed).
KV_DEVICE bool kv_cr2_in_chunk(int64_t t, int64_t start, int64_t end) { return start >= 0 && start <= t && t < end; }

// CR2 token item: the group that token t closes inside its chunk. HALVES:
// a lone group pooling by halves (kv_pool_halves_norm_emit). CHECK: only
// the checks; the position of a token that closes a group goes to
// *closing, which the caller set to -1. WIDE: the generic kernels' weights.
// EARLY (long chunks, where nearly every odd position closes a group): the
// rows are read with the chunk's bounds, and the chunk test gates only the
// emission; with CHECK, a token past the first that passes the tests before
// the chunk's goes to *closing at once, and its chunk's bounds to *pending,
// for the caller to test after the pooling (kv_cr2_chunk_owns). TEAM_NORM:
// a plain compress's team norms over all its lanes (kv_team_norm_store).
template <bool FUSED, int LAYOUT, int TEAM, bool HALVES = false, bool CHECK = false, bool OWN2 = false,
          bool WIDE = false, bool EARLY = false, bool TEAM_NORM = false>
KV_DEVICE void kv_cr2_token_item(const KvCompressParams& c, const KvInsertParams* ins, int64_t t, KvTeamLane tl,
                                 float* pooled, int64_t* closing = 0, KvPendingChunk* pending = 0) {
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
    if (!kv_cr2_token_closes(c, slot, pos, r, tl)) return;
    bool q64 = (c.flags & KV_F_QSL_I64) != 0u;
    int64_t start = kv_load_index(c.qsl, q64, r);
    int64_t end = kv_load_index(c.qsl, q64, r + 1);
    if constexpr (EARLY && CHECK) {
        static_assert(!OWN2, "the early screened blocks are written for plain team items");
        if (t > 0) {
            *closing = pos;
            *pending = {start, end, true};
            return;
        }
    }
    if constexpr (EARLY && !CHECK && !HALVES) {
        // The rows in the bounds' round trip instead of after it (row t - 1
        // clamped to row 0, so that the read stays inside kv_score whatever
        // the chunk); the same tests as below, after the pooling.
        const bool inside = kv_cr2_in_chunk(t, start, end);
        const bool own = inside && t != start && !(prev_known && kv_cr2_owns_second(start, end, slot_p, pos_p));
        KvRowPart<16 / TEAM> older, newer;
        kv_load_row_part<TEAM>(c.kv_score + (t > 0 ? t - 1 : 0) * c.kv_row_stride, tl, &older);
        kv_load_row_part<TEAM>(c.kv_score + t * c.kv_row_stride, tl, &newer);
        kv_pool_norm_emit<FUSED, LAYOUT, TEAM, WIDE, TEAM_NORM>(c, ins, t, pos, tl, older, newer, pooled, own);
        if (!inside) kv_team_count(c.counters, KV_COUNT_INDEX, tl);
        return;
    }
    // start < 0: a malformed chunk; t - 1 below would read before kv_score.
    // (kv_cr2_in_chunk's test, written out: through it nvcc compiles every
    // sm_90 CR2 kernel differently.)
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
        kv_pool_halves_norm_emit<FUSED, LAYOUT, WIDE>(c, ins, t, pos, tl.l, c.kv_score + (t - 1) * c.kv_row_stride,
                                                      c.kv_score + t * c.kv_row_stride);
        return;
    }
    KvRowPart<16 / TEAM> older, newer;
    kv_load_row_part<TEAM>(c.kv_score + (t - 1) * c.kv_row_stride, tl, &older);
    kv_load_row_part<TEAM>(c.kv_score + t * c.kv_row_stride, tl, &newer);
    kv_pool_norm_emit<FUSED, LAYOUT, TEAM, WIDE, TEAM_NORM>(c, ins, t, pos, tl, older, newer, pooled);
}

// Whether token t, which passed the tests before its chunk's (an EARLY
// screened block's speculation), closes a group in its chunk: the tests
// kv_cr2_token_item makes on the bounds, counting a token outside them.
KV_DEVICE bool kv_cr2_chunk_owns(const KvCompressParams& c, int64_t t, const KvPendingChunk& p, KvTeamLane tl) {
    if (!kv_cr2_in_chunk(t, p.start, p.end)) {
        kv_team_count(c.counters, KV_COUNT_INDEX, tl);
        return false;
    }
    return t != p.start;
}

// A token block of an unscreened launch of long chunks (KV_F_TWO_TOKENS,
// kv_compress_cr2_team_chunks): tokens 2 b and 2 b + 1. In a long chunk
// every other token closes a group, so a block per token left half the
// blocks with only their indices' round trip, and blocks cost the GPU's
// dispatch (H200: 1028 programs that read one index took 0.22 µs more than
// 516; docs/tuning.md). Both tokens' indices come in one round trip; a
// closing token's rows come with its chunk's bounds (row t - 1 clamped to
// row 0, so the read stays inside kv_score whatever the chunk), and the
// bounds gate only the emission (counted after the pooling). Where
// both tokens close (a chunk ends at an odd position), the second follows
// the first. The tests are the same for the whole block, so every lane
// meets every barrier.
template <int TEAM, bool TEAM_NORM>
KV_DEVICE void kv_cr2_token_pair(const KvCompressParams& c, int64_t b, KvTeamLane tl, float* pooled) {
    const bool s64 = (c.flags & KV_F_SLOT_I64) != 0u;
    const bool p64 = (c.flags & KV_F_POS_I64) != 0u;
    const bool r64 = (c.flags & KV_F_TTR_I64) != 0u;
    const int64_t t0 = 2 * b;
    if (t0 >= c.n) return;
    const bool has1 = t0 + 1 < c.n;
    const int64_t slot0 = kv_load_index(c.slots, s64, t0);
    const int64_t pos0 = kv_load_index(c.positions, p64, t0);
    const int64_t r0 = kv_load_index(c.ttr, r64, t0);
    const int64_t slot1 = has1 ? kv_load_index(c.slots, s64, t0 + 1) : -1;
    const int64_t pos1 = has1 ? kv_load_index(c.positions, p64, t0 + 1) : -1;
    const int64_t r1 = has1 ? kv_load_index(c.ttr, r64, t0 + 1) : -1;
    const bool closes0 = kv_cr2_token_closes(c, slot0, pos0, r0, tl);
    const bool closes1 = kv_cr2_token_closes(c, slot1, pos1, r1, tl);
    const bool q64 = (c.flags & KV_F_QSL_I64) != 0u;
#pragma unroll 1
    for (int k = 0; k < 2; ++k) {
        if (!(k == 0 ? closes0 : closes1)) continue;
        // The first token's pooled values have been read.
        if (k == 1 && closes0) kv_sync();
        const int64_t t = t0 + k;
        const int64_t r = k == 0 ? r0 : r1;
        const int64_t start = kv_load_index(c.qsl, q64, r);
        const int64_t end = kv_load_index(c.qsl, q64, r + 1);
        KvRowPart<16 / TEAM> older, newer;
        kv_load_row_part<TEAM>(c.kv_score + (t > 0 ? t - 1 : 0) * c.kv_row_stride, tl, &older);
        kv_load_row_part<TEAM>(c.kv_score + t * c.kv_row_stride, tl, &newer);
        // kv_cr2_chunk_owns's tests as values, counted after the pooling: a
        // branch on the bounds here would hold the rows' reads behind them.
        const bool inside = kv_cr2_in_chunk(t, start, end);
        kv_pool_norm_emit<false, 0, TEAM, false, TEAM_NORM>(c, 0, t, k == 0 ? pos0 : pos1, tl, older, newer, pooled,
                                                            inside && t != start);
        if (!inside) kv_team_count(c.counters, KV_COUNT_INDEX, tl);
    }
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

// The ring stores of tokens u and u + 1 (their slots, -1 for none, loaded
// by the caller): both rows are read before either is stored, one round
// trip for two tokens.
template <int TEAM>
KV_DEVICE void kv_ring_store_two(const KvCompressParams& c, int32_t u, int64_t slot_a, int64_t slot_b,
                                 KvTeamLane tl) {
    KvRowPart<16 / TEAM> a, b;
    if (slot_a >= 0) kv_load_row_part<TEAM>(c.kv_score + (int64_t)u * c.kv_row_stride, tl, &a);
    if (slot_b >= 0) kv_load_row_part<TEAM>(c.kv_score + (int64_t)(u + 1) * c.kv_row_stride, tl, &b);
    if (slot_a >= 0) kv_ring_store_part<TEAM>(c, slot_a, tl, a);
    if (slot_b >= 0) kv_ring_store_part<TEAM>(c, slot_b, tl, b);
}

// CR2 request item: the group the chunk's first token closes with its
// predecessor (prev_rows or ring), then the ring stores. Each lane reads and
// writes only its own dims, and a ring row is read before any store that
// could overwrite it (the same row only when the capacity is 1), so nothing
// races (with HALVES, each half's older row is read before that half's
// store). WIDE: the generic kernels' weights. EARLY (long chunks): the
// ring stores' first two tokens' slots are read with the first token's,
// and their rows with the pooled group's (kv_ring_store_two), where each
// token's store waited for its slot and then its row. PREV_LATE: the
// KV_F_HAS_PREV test is made again at the ring loop instead of kept across
// the emission, and the second token's ring row is found before the rows'
// loads, not after the first row's store: the spread kernel's (they fit a
// team kernel in 40 registers on sm_90; the pair kernel that replaced it
// was measured with them).
template <bool FUSED, int LAYOUT, int TEAM, bool HALVES = false, bool OWN2 = false, bool WIDE = false,
          bool EARLY = false, bool TEAM_NORM = false, bool PREV_LATE = false>
KV_DEVICE void kv_cr2_request_item(const KvCompressParams& c, const KvInsertParams* ins, int64_t r, KvTeamLane tl,
                                   float* pooled) {
    static_assert(!(EARLY && (HALVES || OWN2)), "the early ring stores are written for plain team items");
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
    // EARLY: the first ring stores' tokens (as the loop below picks them)
    // and their slots.
    int32_t early_u = end;
    int64_t slot_a = -1, slot_b = -1;
    if (EARLY && !has_prev) {
        early_u = end - c.ring_capacity > start ? (int32_t)(end - c.ring_capacity) : start + 1;
        if (early_u < end) slot_a = kv_load_index(c.slots, s64, early_u);
        if (early_u + 1 < end) slot_b = kv_load_index(c.slots, s64, early_u + 1);
    }
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
        if (older) kv_norm_emit<FUSED, LAYOUT, WIDE>(c, ins, start, pos, tl.l, v);
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
        float* ring_s = 0;
        if (PREV_LATE && own2 && !has_prev) {
            int64_t row_s;
            int64_t blk_s = kv_page_row(slot_s, cap, c.ring_shift, &row_s);
            if (blk_s >= c.ring_blocks) {
                kv_team_count(c.counters, KV_COUNT_SLOT, tl);
            } else {
                ring_s = c.ring + blk_s * c.ring_block_stride + row_s * c.ring_row_stride;
            }
        }
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
        if (PREV_LATE) {
            if (ring_s) kv_store_row_part<TEAM>(ring_s, tl, nw);
        } else if (own2 && !has_prev) {
            kv_ring_store_part<TEAM>(c, slot_s, tl, nw);
        }
        // Group 0 goes on alone; the other groups are done with the pooling.
        if (older || own2) {
            kv_pool_norm_emit<FUSED, LAYOUT, TEAM, WIDE, TEAM_NORM>(c, ins, start + (own2 ? 1 : 0), pos, tl, o, nw,
                                                                    pooled);
        }
        // After the pooling (the older row may be a ring row these stores
        // overwrite; before it, sm_100 spilled).
        if (EARLY) kv_ring_store_two<TEAM>(c, early_u, slot_a, slot_b, tl);
    }
    if (PREV_LATE ? (c.flags & KV_F_HAS_PREV) != 0u : has_prev) return;
    // The team's other groups still copy their parts of the ring rows: they
    // returned from kv_pool_norm_emit above, not from this item.
    for (int32_t u = own2 ? end : (EARLY ? early_u + 2 : (from == start ? start + 1 : from)); u < end; ++u) {
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

// One group per item; WIDE: the generic kernels (kv_compress_cr1_item).
template <bool FUSED, int LAYOUT, bool HALVES = false, bool WIDE = false>
KV_DEVICE void kv_compress(const KvCompressParams& c, const KvInsertParams* ins, int cr) {
    int64_t g = kv_group(c.flags);
    if (cr == 1) {
        if (g < c.n) kv_compress_cr1_item<FUSED, LAYOUT, WIDE>(c, ins, g);
        return;
    }
    KvTeamLane tl = {0u, kv_lane()};
    if (g < c.num_reqs) {
        kv_cr2_request_item<FUSED, LAYOUT, 1, HALVES, false, WIDE>(c, ins, g, tl, 0);
    } else if (g - c.num_reqs < c.n) {
        kv_cr2_token_item<FUSED, LAYOUT, 1, HALVES, false, false, WIDE>(c, ins, g - c.num_reqs, tl, 0);
    }
}

// A team's shared memory, sized by the launch (launch::team_geometry):
// one token's pooled values (512 floats) for a team item, and in a
// screened launch (launch::screened_team_geometry) TEAM of them plus
// the TEAM closing positions. Dynamic, so that only screened launches pay
// for the larger size: on gfx942 (64 KB of LDS per CU) 8 KB per team would
// cut the blocks a CU holds.
extern KV_SHARED float kv_team_shared[];

// The team pools the tokens t0 + k (k < TEAM) that close a group
// (closing[k] >= 0), one after the other, each into its own buffer;
// returns whether any did. closing[] is the same for the whole block.
template <int TEAM>
KV_DEVICE bool kv_cr2_pool_round(const KvCompressParams& c, int64_t t0, const int64_t* closing, KvTeamLane tl,
                                 float* pooled) {
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
    return any;
}

// Pools the closing tokens among t0 + k (k < TEAM) with kv_cr2_pool_round,
// and then each closing token's group norms and emits it, the groups at
// once (kv_cr2_token_block's steps after its barrier, for the swept
// blocks); own_pos is closing[g] for the lane's group g. closing[]
// is the same for the whole block, so every lane meets the barrier.
// Returns whether anything was pooled (and the barrier met).
template <bool FUSED, int LAYOUT, int TEAM>
KV_DEVICE bool kv_cr2_pool_closing(const KvCompressParams& c, const KvInsertParams* ins, int64_t t0,
                                   const int64_t* closing, int64_t own_pos, KvTeamLane tl, float* pooled) {
    if (!kv_cr2_pool_round<TEAM>(c, t0, closing, tl, pooled)) return false;
    kv_sync();
    if (own_pos < 0) return true;
    float v[16];
    kv_loadNf<16>(pooled + 512u * tl.g + 16u * tl.l, v);
    kv_norm_emit<FUSED, LAYOUT>(c, ins, t0 + tl.g, own_pos, tl.l, v);
    return true;
}

// A token block of a screened team launch (KV_F_SCREEN_TOKENS: decode
// batches of many requests), covering TEAM tokens: group g checks token
// TEAM b + g, the team pools those that close a group one after the other
// (none for one-token requests, whose first tokens the request items pool),
// each into its own buffer, and then each closing token's group norms and
// emits it, the groups at once. A quarter of the token blocks (a half in
// pairs), each as long as a token item until a second of its tokens closes
// a group. The closing positions and the loop bounds are the same for the
// whole block, so every lane meets every barrier. (The steps after the
// pooling are kv_cr2_pool_closing's, written out: through it nvcc schedules
// four fused pair kernels differently, and this form keeps the measured SASS.)
// EARLY (long chunks): the pooling starts from the tests before the
// chunk's, whose bounds arrive meanwhile and gate the emission
// (kv_cr2_token_item's EARLY CHECK).
template <bool FUSED, int LAYOUT, int TEAM, bool OWN2, bool EARLY = false, bool INV_FIRST = false>
KV_DEVICE void kv_cr2_token_block(const KvCompressParams& c, const KvInsertParams* ins, int64_t b, KvTeamLane tl,
                                  float* pooled) {
    int64_t* closing = (int64_t*)(pooled + TEAM * 512);
    const int64_t t0 = b * TEAM;
    const int64_t t = t0 + tl.g;
    // Each group counts its own token's faults.
    const KvTeamLane own = {0u, tl.l};
    int64_t pos = -1;
    KvPendingChunk pending = {0, 0, false};
    if (t < c.n) kv_cr2_token_item<FUSED, LAYOUT, TEAM, false, true, OWN2, false, EARLY>(c, ins, t, own, 0, &pos,
                                                                                         &pending);
    if (tl.l == 0u) closing[tl.g] = pos;
    kv_sync();
    if (!kv_cr2_pool_round<TEAM>(c, t0, closing, tl, pooled)) return;
    kv_sync();
    if (pos < 0) return;
    if (EARLY && pending.open && !kv_cr2_chunk_owns(c, t, pending, own)) return;
    float v[16];
    kv_loadNf<16>(pooled + 512u * tl.g + 16u * tl.l, v);
    kv_norm_emit<FUSED, LAYOUT, false, INV_FIRST>(c, ins, t, pos, tl.l, v);
}

// A token block of a swept team launch (KV_F_SWEEP_TOKENS: decode batches
// of no more tokens than requests), covering 32 TEAM tokens, one per lane.
// There a token pools a group only where requests are empty, so a block per
// TEAM tokens (kv_cr2_token_block) mostly checks and leaves: 32768 such
// blocks were 10 % of a launch of 65,536 one-token requests on the H200
// (docs/tuning.md, Swept token blocks). Each lane checks its token; the
// groups' "any closes" flags come from a butterfly inside each group of 32
// lanes, so after one barrier the block's test costs TEAM shared reads.
// Where a token closes, the block takes its tokens TEAM at a time through
// kv_cr2_pool_closing, the screened blocks' pooling, in the team's
// register shape (a lone group's pooling here took gfx942's team kernels
// from 48 to 90 VGPRs). Still, a loop around the emission holds the
// parameters' scalars across it (gfx942's team kernels 48 -> 64 VGPRs, the
// fused ones' SGPRs spilled), so only kernels of their own sweep, and only
// for the plain compressor. The closing positions and the loop are the
// same for the whole block: every lane meets every barrier.
template <bool FUSED, int LAYOUT, int TEAM, bool OWN2>
KV_DEVICE void kv_cr2_token_sweep(const KvCompressParams& c, const KvInsertParams* ins, int64_t b, KvTeamLane tl,
                                  float* pooled) {
    constexpr unsigned S = (unsigned)TEAM * KV_GROUP_LANES;
    int64_t* closing = (int64_t*)(pooled + TEAM * 512);
    unsigned* closes = (unsigned*)(closing + S);
    const unsigned i = tl.g * KV_GROUP_LANES + tl.l;
    const int64_t t0 = b * S;
    // Each lane counts its own token's faults.
    const KvTeamLane own = {0u, 0u};
    int64_t pos = -1;
    if (t0 + i < c.n) kv_cr2_token_item<FUSED, LAYOUT, TEAM, false, true, OWN2>(c, ins, t0 + i, own, 0, &pos);
    closing[i] = pos;
    uint32_t any = pos >= 0 ? 1u : 0u;
    any |= kv_shfl_xor_u32(any, 16);
    any |= kv_shfl_xor_u32(any, 8);
    any |= kv_shfl_xor_u32(any, 4);
    any |= kv_shfl_xor_u32(any, 2);
    any |= kv_shfl_xor_u32(any, 1);
    if (tl.l == 0u) closes[tl.g] = any;
    kv_sync();
    uint32_t block_any = 0u;
#pragma unroll
    for (unsigned g = 0; g < (unsigned)TEAM; ++g) block_any |= closes[g];
    if (block_any == 0u) return;
    bool pooled_last = false;
#pragma unroll 1
    for (unsigned k = 0; k < S; k += (unsigned)TEAM) {
        // The previous chunk's groups have read their buffers.
        if (pooled_last) kv_sync();
        pooled_last =
            kv_cr2_pool_closing<FUSED, LAYOUT, TEAM>(c, ins, t0 + k, closing + k, closing[k + tl.g], tl, pooled);
    }
}

// Token blocks per run in a spread launch (kv_spread_item).
#define KV_CR2_SPREAD_RUN 64u

// The item of block kv_bid() in a spread launch of TEAM-token blocks
// (kv_compress_cr2_pair_mtp_spread). The items keep their numbers (the
// requests, then the token blocks), but the grid is laid out as frames, one
// per run of KV_CR2_SPREAD_RUN token blocks (the last one shorter): each
// frame is its share of the request blocks (p or, in the first ones, p + 1)
// and then its run. In two-token decode the token blocks only read
// indices; in item order they ran after every request block, a tail of
// round trips with little memory traffic beside them. Runs, not single
// blocks: one token block in every three blocks gave whole SMs of the first
// wave only token blocks (docs/tuning.md, "Where the screened token blocks
// run").
template <int TEAM>
KV_DEVICE unsigned kv_spread_item(const KvCompressParams& c) {
    constexpr unsigned RUN = KV_CR2_SPREAD_RUN;
    const unsigned i = kv_bid();
    const unsigned b = (unsigned)((c.n + (TEAM - 1)) / TEAM);
    const unsigned r = (unsigned)c.num_reqs;
    if (b == 0u) return i;
    const unsigned runs = (b + RUN - 1u) / RUN;
    const unsigned p = r / runs, rem = r - p * runs;
    // The first rem frames hold p + 1 request blocks, the others p.
    const unsigned long_frames = rem * (p + 1u + RUN);
    unsigned j, k, reqs;  // i's frame, its place in it, the frame's requests
    if (i < long_frames) {
        j = i / (p + 1u + RUN);
        k = i - j * (p + 1u + RUN);
        reqs = p + 1u;
    } else {
        const unsigned f = (i - long_frames) / (p + RUN);
        j = rem + f;
        k = i - long_frames - f * (p + RUN);
        reqs = p;
    }
    return k < reqs ? j * p + (j < rem ? j : rem) + k : r + j * RUN + (k - reqs);
}

// One CR2 item per block of TEAM groups (see "CR2 items, alone or in
// teams"), or in a screened launch TEAM tokens (kv_cr2_token_block), or in
// a swept one (SWEEP kernels only) 32 TEAM tokens (kv_cr2_token_sweep). Every
// lane of the block handles the same item, so the control flow up to the
// team's barriers is the same for all of them. SPREAD: a screened launch's
// blocks in kv_spread_item's order.
template <bool FUSED, int LAYOUT, int TEAM, bool OWN2 = false, bool SWEEP = false, bool EARLY = false,
          bool SPREAD = false>
KV_DEVICE void kv_compress_cr2_team(const KvCompressParams& c, const KvInsertParams* ins) {
    // The long-chunk teams norm over the whole team (kv_team_norm_store);
    // the decode teams, whose one-token launches it slowed, keep group 0's
    // norm (docs/tuning.md, "The norm over the whole team").
    constexpr bool TEAM_NORM = EARLY && !FUSED && TEAM == KV_CR2_TEAM;
    float* pooled = kv_team_shared;
    int64_t item = kv_bid();
    if constexpr (SPREAD) {
        if (c.flags & KV_F_SCREEN_TOKENS) item = kv_spread_item<TEAM>(c);
    }
    KvTeamLane tl = {kv_tid() / KV_GROUP_LANES, kv_lane()};
    if (item < c.num_reqs) {
        kv_cr2_request_item<FUSED, LAYOUT, TEAM, false, OWN2, false, EARLY, TEAM_NORM, SPREAD>(c, ins, item, tl,
                                                                                             pooled);
    } else if (SWEEP && (c.flags & KV_F_SWEEP_TOKENS)) {
        kv_cr2_token_sweep<FUSED, LAYOUT, TEAM, OWN2>(c, ins, item - c.num_reqs, tl, pooled);
    } else if (c.flags & KV_F_SCREEN_TOKENS) {
        kv_cr2_token_block<FUSED, LAYOUT, TEAM, OWN2, EARLY, SPREAD>(c, ins, item - c.num_reqs, tl, pooled);
    } else if (EARLY && (c.flags & KV_F_TWO_TOKENS)) {
        if constexpr (EARLY) {
            static_assert(!FUSED, "the plain compressor's long chunks only");
            kv_cr2_token_pair<TEAM, TEAM_NORM>(c, item - c.num_reqs, tl, pooled);
        }
    } else if (item - c.num_reqs < c.n) {
        kv_cr2_token_item<FUSED, LAYOUT, TEAM, false, false, OWN2, false, EARLY, TEAM_NORM>(c, ins, item - c.num_reqs,
                                                                                          tl, pooled);
    }
}
