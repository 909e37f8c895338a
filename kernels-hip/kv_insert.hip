// Entry points of rope_quant_insert, a token per group and tile-major.
// All entry points: KV_KERNELS in kv_abi.h.
#include "kv_record.h"

template <int LAYOUT, bool TILES, bool WIDE = false, bool TIGHT = false>
KV_DEVICE void kv_insert_token(const KvInsertParams& p, int64_t t, unsigned tile) {
    // The latent row is loaded with the indices (t < n, so it exists). ptxas
    // still issues it after the checks on sm_90; pinning it there cost more
    // than the round trip (docs/tuning.md, The skip test after the norm).
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
    kv_write_record<LAYOUT, TILES, LAYOUT == KV_LAYOUT_V4, WIDE, TIGHT>(p, slot, base, tile, h, fp8_scale, pair);
}

// Tile-major: a block's G tokens (G = its groups) as 28 G NoPE tiles, token
// by token, then their 4 G RoPE tiles. Only the RoPE tiles read cos/sin and
// run the two-step rotation, so with this order whole warps / wavefronts are
// NoPE and take one path; with a token per group every warp would run both.
// For the BF16 and FP8 rows, whose tiles need no other lane (NVFP4's map is
// kv_tile_of_thread_runs, below).
KV_DEVICE void kv_tile_of_thread(uint32_t flags, int64_t* t, unsigned* tile) {
    uint32_t log2 = (flags >> KV_F_GROUPS_LOG2_SHIFT) & 7u;
    uint32_t nope = 28u << log2;  // NoPE tiles in the block
    uint32_t i = kv_tid();
    uint32_t tok = i < nope ? i / 28u : (i - nope) >> 2;
    *tile = i < nope ? i - 28u * tok : 28u + (i & 3u);
    *t = (int64_t)((kv_bid() << log2) + tok);
}

// NVFP4's tile-major map: runs of 8 tokens over 256 threads (a block of 8
// groups, 2 of 4 or 4 of 2), threads 0 .. 223 of a run taking the NoPE tiles
// token by token and the last 32 the RoPE tiles. Every 32-lane warp then
// holds tiles of one kind: NVFP4's NoPE tiles run an encoder of their own
// (kv_quantize_nvfp4_nope_tile_bf16x2), which a mixed warp would run beside
// the RoPE tiles' one. LaunchPolicy::insert_launch sizes the grid in runs.
KV_DEVICE void kv_tile_of_thread_runs(uint32_t flags, int64_t* t, unsigned* tile) {
    uint32_t log2 = (flags >> KV_F_GROUPS_LOG2_SHIFT) & 7u;
    uint64_t i = ((uint64_t)kv_bid() << (5u + log2)) + kv_tid();
    uint32_t j = (uint32_t)i & 255u;
    uint32_t tok = j < 224u ? j / 28u : (j - 224u) >> 2;
    *tile = j < 224u ? j - 28u * tok : 28u + (j & 3u);
    *t = (int64_t)((i >> 8) << 3) + tok;
}

#define KV_INSERT_KERNEL(name, LAYOUT, BOUNDS)                                      \
    KV_KERNEL BOUNDS(KV_BLOCK_THREADS) void name(const KvInsertParams p) {          \
        int64_t t = kv_group(p.flags);                                              \
        if (t < p.n) kv_insert_token<LAYOUT, false>(p, t, kv_lane());               \
    }

#define KV_INSERT_TILES_KERNEL(name, LAYOUT, BOUNDS)                                \
    KV_KERNEL BOUNDS(KV_BLOCK_THREADS) void name(const KvInsertParams p) {          \
        int64_t t;                                                                  \
        unsigned tile;                                                              \
        if (LAYOUT == KV_LAYOUT_NVFP4)                                              \
            kv_tile_of_thread_runs(p.flags, &t, &tile);                             \
        else                                                                        \
            kv_tile_of_thread(p.flags, &t, &tile);                                  \
        if (t < p.n) kv_insert_token<LAYOUT, true>(p, t, tile);                     \
    }

KV_INSERT_KERNEL(kv_insert_v4, KV_LAYOUT_V4, KV_LAUNCH_BOUNDS_6)
KV_INSERT_KERNEL(kv_insert_mxfp8, KV_LAYOUT_MXFP8, KV_LAUNCH_BOUNDS_6)
KV_INSERT_KERNEL(kv_insert_nvfp4, KV_LAYOUT_NVFP4, KV_LAUNCH_BOUNDS_6)
KV_INSERT_KERNEL(kv_insert_bf16, KV_LAYOUT_BF16, KV_LAUNCH_BOUNDS_6)
KV_INSERT_KERNEL(kv_insert_fp8, KV_LAYOUT_FP8, KV_LAUNCH_BOUNDS_6)

// The token-per-group V4 and MXFP8 inserts at 32 registers (64 warps an SM),
// for launches of more than LARGE_INSERT_TOKENS (src/device/launch.rs,
// insert_uses_large): the work ordered to fit (kv_write_record's TIGHT).
// At 65,536 tokens on the H200 they take 12.6 and 6.9 % less time than the
// kernels above, but up to 16,384 tokens they are no faster, V4 up to 3.7 %
// slower (docs/tuning.md, Occupancy caps).
#define KV_INSERT_LARGE_KERNEL(name, LAYOUT)                                        \
    KV_KERNEL KV_LAUNCH_BOUNDS_8(KV_BLOCK_THREADS) void name(const KvInsertParams p) { \
        int64_t t = kv_group(p.flags);                                              \
        if (t < p.n) kv_insert_token<LAYOUT, false, false, true>(p, t, kv_lane());  \
    }

KV_INSERT_LARGE_KERNEL(kv_insert_v4_large, KV_LAYOUT_V4)
KV_INSERT_LARGE_KERNEL(kv_insert_mxfp8_large, KV_LAYOUT_MXFP8)

// The host runs these for CR1 launches above 2048 tokens (src/device/launch.rs,
// insert_uses_tiles), and only for CR1: they skip the compress-ratio test.
// At decode sizes a block's mixed warp runs both paths within one token's
// latency, and with CR2 only every other token is usually written, while a
// warp of tiles from several tokens does the full work when any one of them
// is written (a token per group: a skipped token's warp simply ends). V4
// gathers its RoPE pairs across a group's lanes and MXFP8 shares a scale
// between two lanes (a shuffle, which every lane of a warp must join): both
// keep a token per group always. NVFP4 and FP8 rows run at 32 registers (64
// warps an SM); BF16 rows at 40, as they were 6-10 % slower at 32 from 8192
// tokens on (docs/tuning.md, Occupancy caps).
KV_INSERT_TILES_KERNEL(kv_insert_nvfp4_tiles, KV_LAYOUT_NVFP4, KV_LAUNCH_BOUNDS_8)
KV_INSERT_TILES_KERNEL(kv_insert_bf16_tiles, KV_LAYOUT_BF16, KV_LAUNCH_BOUNDS_6)
KV_INSERT_TILES_KERNEL(kv_insert_fp8_tiles, KV_LAYOUT_FP8, KV_LAUNCH_BOUNDS_8)

// The generic inserts (an F16 cos/sin table): a token per group, as
// kv_compress_cr1_wide says.
#define KV_INSERT_WIDE_KERNEL(name, LAYOUT)                                           \
    KV_KERNEL KV_LAUNCH_BOUNDS_2(KV_BLOCK_THREADS) void name(const KvInsertParams p) { \
        int64_t t = kv_group(p.flags);                                                \
        if (t < p.n) kv_insert_token<LAYOUT, false, true>(p, t, kv_lane());           \
    }

KV_INSERT_WIDE_KERNEL(kv_insert_v4_wide, KV_LAYOUT_V4)
KV_INSERT_WIDE_KERNEL(kv_insert_mxfp8_wide, KV_LAYOUT_MXFP8)
KV_INSERT_WIDE_KERNEL(kv_insert_nvfp4_wide, KV_LAYOUT_NVFP4)
KV_INSERT_WIDE_KERNEL(kv_insert_bf16_wide, KV_LAYOUT_BF16)
KV_INSERT_WIDE_KERNEL(kv_insert_fp8_wide, KV_LAYOUT_FP8)
