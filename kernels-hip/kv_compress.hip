// Entry points of the compressor (fused_save_compress_norm without the
// insert) and save_ring_rows. All entry points: KV_KERNELS in kv_abi.h.
#include "kv_compress.h"

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
// (speculative decode, MTP): their
// request items also pool a two-token chunk's second token
// (kv_cr2_owns_second), so that its rows are read once and the token
// blocks pool nothing.
KV_KERNEL KV_LAUNCH_BOUNDS_10(KV_CR2_TEAM * 32) void kv_compress_cr2_team_mtp(const KvCompressParams c) {
    kv_compress_cr2_team<false, 0, KV_CR2_TEAM, true>(c, 0);
}

KV_KERNEL KV_LAUNCH_BOUNDS_16(KV_CR2_PAIR * 32) void kv_compress_cr2_pair_mtp(const KvCompressParams c) {
    kv_compress_cr2_team<false, 0, KV_CR2_PAIR, true>(c, 0);
}

// Large screened launches of these (LaunchPolicy::cr2_shape) run in pairs,
// their token blocks spread in runs among the request blocks
// (kv_spread_item). A kernel of its own, so that smaller launches keep the
// measured code; pairs ran faster than teams here (docs/tuning.md, "Where
// the screened token blocks run").
KV_KERNEL KV_LAUNCH_BOUNDS_16(KV_CR2_PAIR * 32) void kv_compress_cr2_pair_mtp_spread(const KvCompressParams c) {
    kv_compress_cr2_team<false, 0, KV_CR2_PAIR, true, false, false, true>(c, 0);
}

// Screened plain compresses of no more tokens than requests (one-token
// decode): the token blocks swept, a token per lane (kv_cr2_token_sweep).
// Kernels of their own, so that the others keep their registers.
KV_KERNEL KV_LAUNCH_BOUNDS_9(KV_CR2_TEAM * 32) void kv_compress_cr2_team_swept(const KvCompressParams c) {
    kv_compress_cr2_team<false, 0, KV_CR2_TEAM, false, true>(c, 0);
}

KV_KERNEL KV_LAUNCH_BOUNDS_16(KV_CR2_PAIR * 32) void kv_compress_cr2_pair_swept(const KvCompressParams c) {
    kv_compress_cr2_team<false, 0, KV_CR2_PAIR, false, true>(c, 0);
}

// Plain compresses of long chunks in teams (prefill, LaunchPolicy::cr2_shape):
// a block of two tokens (kv_cr2_token_pair) or a screened block reads its
// rows with its chunks' bounds, and a request item its first two ring
// stores' slots with its first token's (EARLY in kv_cr2_token_block and
// kv_cr2_request_item).
KV_KERNEL KV_LAUNCH_BOUNDS_9(KV_CR2_TEAM * 32) void kv_compress_cr2_team_chunks(const KvCompressParams c) {
    kv_compress_cr2_team<false, 0, KV_CR2_TEAM, false, false, true>(c, 0);
}

// The generic kernels: an F32 or F16 weight or an F16 cos/sin table, which
// the tuned kernels do not read (their code stays as measured). One group
// per item (the host picks them whatever else its policy says) and the same
// code as the lone-group kernels, the weight and table read by the flags'
// types; bounds that leave room for 16 f32 weights.
KV_KERNEL KV_LAUNCH_BOUNDS_2(KV_BLOCK_THREADS) void kv_compress_cr1_wide(const KvCompressParams c) {
    kv_compress<false, 0, false, true>(c, 0, 1);
}

KV_KERNEL KV_LAUNCH_BOUNDS_2(KV_BLOCK_THREADS) void kv_compress_cr2_wide(const KvCompressParams c) {
    kv_compress<false, 0, false, true>(c, 0, 2);
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
