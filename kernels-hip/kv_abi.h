// The launch interface between the host and the kernels, written once:
// the parameter blocks every kernel takes by value, their flag bits and
// constants, and the list of kernels. build.rs reads this file and generates
// the Rust side from it (src/device/kernel_abi.rs includes the result): a
// `#[repr(C)]` struct per parameter block, named without the `Kv` prefix,
// with a `u64` for every pointer, and the `Kernel` enum from KV_KERNELS. It
// also computes each field's offset and checks it at build time against
// both compilers (static_assert here, const asserts in Rust).
//
// So that build.rs can read it, a parameter block is a plain struct of one
// field per line (`type name;`, an optional `//` comment that becomes the
// Rust field's doc), and KV_KERNELS has one `X(name, block)` per line.
#pragma once

// ---- parameter blocks ----------------------------------------------------
// Counts and strides are 32-bit (src/operations/ops.rs checks they fit): on AMD every
// 64-bit kernel argument costs two scalar registers, and the fused kernels
// carry both blocks. Pointers are device addresses; strides in elements
// unless a comment says bytes.

struct KvCompressParams {
    const float* kv_score;    // kv_score
    const void* positions;    // positions (I32 or I64: flags)
    const void* slots;        // slot_mapping (I32 or I64: flags)
    const void* qsl;          // query_start_loc (CR2)
    const void* ttr;          // token_to_req_indices (CR2)
    const uint16_t* weight;   // rms_norm_weight (BF16, or F32 / F16: flags)
    uint16_t* latent;         // latent_out (BF16)
    float* ring;              // state_cache (CR2)
    const float* prev_rows;   // prev_rows (CR2, context parallel)
    const void* prev_idx;     // prev_row_indices
    unsigned* counters;       // skip counters: slot, position, index
    int32_t kv_row_stride;    // kv_score row stride
    int32_t ring_block_stride;  // ring block stride
    int32_t ring_row_stride;  // ring row stride
    int32_t ring_blocks;      // ring blocks
    int32_t ring_capacity;    // ring rows per block
    int32_t prev_row_stride;  // prev_rows row stride
    int32_t prev_rows_n;      // prev_rows rows
    int32_t n;                // tokens
    int32_t num_reqs;         // requests (CR2)
    float eps;                // RMSNorm epsilon
    uint32_t flags;           // flag bits (kernel_abi::flags)
    int32_t ring_shift;       // log2(ring_capacity), or -1 when not a power of two
};

struct KvInsertParams {
    const uint16_t* latent;   // latent (BF16)
    const void* positions;    // positions (I32 or I64: flags)
    const void* slots;        // slot_mapping (I32 or I64: flags)
    const void* cos_sin;      // cos_sin_cache (F32, BF16 or F16: flags)
    uint8_t* cache;           // kv_cache
    const float* fp8_scale;   // fp8_scale (FP8 rows)
    unsigned* counters;       // skip counters: slot, position, index
    int32_t latent_row_stride;  // latent row stride
    int32_t cos_row_stride;   // cos/sin row stride
    int32_t cos_rows;         // cos/sin rows
    int32_t block_stride;     // bytes between cache blocks
    int32_t row_stride;       // bytes between rows (row layouts)
    int32_t num_blocks;       // cache blocks
    int32_t block_size;       // rows per block
    int32_t n;                // tokens
    uint32_t compress_ratio;  // 1 or 2
    uint32_t flags;           // flag bits (kernel_abi::flags)
    int32_t block_shift;      // log2(block_size), or -1 when not a power of two
    uint32_t pad;             // padding to 8 bytes
};

struct KvRingRowsParams {
    const float* rows;        // rows
    const void* slots;        // slot_mapping (I32 or I64: flags)
    float* ring;              // state_cache
    unsigned* counters;       // skip counters: slot, position, index
    int32_t row_stride;       // rows row stride
    int32_t ring_block_stride;  // ring block stride
    int32_t ring_row_stride;  // ring row stride
    int32_t ring_blocks;      // ring blocks
    int32_t ring_capacity;    // ring rows per block
    int32_t n;                // rows
    uint32_t flags;           // flag bits (kernel_abi::flags)
    int32_t ring_shift;       // log2(ring_capacity), or -1 when not a power of two
};

// The bench's roofline: a plain copy of 16-byte units, run on the SMs (CUs)
// like every other kernel here, so it measures what they can move.
struct KvCopyParams {
    const void* src;          // source (16-byte aligned)
    void* dst;                // destination (16-byte aligned)
    uint64_t units;           // 16-byte units to copy
};

// The device's self-check of the prelude's hardware conversions
// (kv_check_hw_formats): the f32 bit patterns [first, first + count), each
// through every hardware conversion the prelude has, against the software
// definition. out[0]: BF16 pair mismatches; out[1]: e4m3 pair mismatches
// (non-NaN inputs); out[2]: the conversions present (the bits below); out[3]:
// an input that mismatched.
struct KvHwCheckParams {
    uint32_t* out;            // four counters, zeroed by the host
    uint64_t first;           // first f32 bit pattern
    uint64_t count;           // patterns to check (at most 2^30 a launch)
};

// out[2] bits of kv_check_hw_formats: which hardware conversions it ran.
#define KV_HW_CHECK_BF16X2 1u
#define KV_HW_CHECK_E4M3X2 2u

struct KvFusedParams {
    KvCompressParams compress;  // the compressor part
    KvInsertParams insert;      // the insert part (its latent is the compressor's)
};

// gather_dequant (src/operations/gather/reference.rs, kv_gather.h): the record each output row
// reads comes from slots (slot form) or block_table, cu_seq_lens and
// seq_starts (block-table form, KV_GF_BLOCK_TABLE).
struct KvGatherParams {
    const uint8_t* cache;     // the cache view's first byte
    const void* slots;        // slot_mapping (I32 or I64: flags)
    const void* block_table;  // block_table (I32 or I64: flags)
    const void* cu_seq_lens;  // cu_seq_lens (I32 or I64: flags)
    const void* seq_starts;   // seq_starts (I32 or I64: flags), null when absent
    const float* fp8_scale;   // fp8_scale (FP8 rows)
    void* out;                // out (BF16 or F32: the kernel)
    unsigned* counters;       // skip counters: slot, position, index
    int32_t out_row_stride;   // out row stride
    int32_t block_stride;     // bytes between cache blocks
    int32_t row_stride;       // bytes between rows (row layouts)
    int32_t num_blocks;       // cache blocks
    int32_t block_size;       // rows per block
    int32_t block_shift;      // log2(block_size), or -1 when not a power of two
    int32_t n;                // output rows processed
    int32_t num_reqs;         // requests (block-table form)
    int32_t table_row_stride;  // block_table row stride
    int32_t max_blocks;       // block_table columns
    uint32_t flags;           // the gather flag bits below, groups per block
    uint32_t pad;             // padding to 8 bytes
};

// indexer_k_norm_rope_store (src/operations/indexer_k/, kv_indexer_k.hip):
// one group of 32 lanes a token, lane l owning dims 4l .. 4l + 3 of the
// 128-dim key.
struct KvIndexerKParams {
    const uint16_t* k_pre;    // k_pre (BF16)
    const void* positions;    // positions (I32 or I64: flags)
    const void* slots;        // the slot mapping (I32 or I64: flags)
    const void* cos_sin;      // cos_sin_cache (F32, BF16 or F16: flags)
    const void* weight;       // rms_norm_weight (F32, BF16 or F16: flags)
    uint8_t* cache;           // k_cache
    unsigned* counters;       // skip counters: slot, position, index
    int32_t k_row_stride;     // k_pre row stride
    int32_t cos_row_stride;   // cos/sin row stride
    int32_t cos_rows;         // cos/sin rows
    int32_t block_stride;     // bytes between cache blocks
    int32_t num_blocks;       // cache blocks
    int32_t block_size;       // rows per block
    int32_t block_shift;      // log2(block_size), or -1 when not a power of two
    int32_t n;                // tokens
    uint32_t compress_ratio;  // 1 or 2
    uint32_t n_per_tile;      // the preshuffled order's N (16, 32 or 64), else 0
    float eps;                // RMSNorm epsilon
    uint32_t flags;           // flag bits: index, table and weight types, and the indexer's own below
};

// ---- flag bits -------------------------------------------------------------

#define KV_F_POS_I64 1u
#define KV_F_SLOT_I64 2u
#define KV_F_QSL_I64 4u
#define KV_F_TTR_I64 8u
#define KV_F_PRI_I64 16u
#define KV_F_HAS_PREV 32u
#define KV_F_WRITE_LATENT 64u
#define KV_F_COS_BF16 128u
#define KV_F_SANITIZE 256u
// CR2 team launches: a token block checks one token per group (kv_cr2_token_block).
#define KV_F_SCREEN_TOKENS 512u
// CR2 team launches: a token block checks one token per lane (kv_cr2_token_sweep).
#define KV_F_SWEEP_TOKENS 65536u
// CR2 team launches of long chunks: a token block covers two tokens (kv_cr2_token_pair).
#define KV_F_TWO_TOKENS 131072u
// Input dtypes only the generic kernels (the `_wide` ones) read: an F16
// cos/sin table (KvInsertParams), an F16 or F32 norm weight
// (KvCompressParams). Without them the table is F32 or BF16 (KV_F_COS_BF16)
// and the weight BF16, as the tuned kernels read them.
#define KV_F_COS_F16 1024u
#define KV_F_W_F16 2048u
#define KV_F_W_F32 32768u
// Bits 12..14: log2 of the groups in a block (the host picks the block size).
#define KV_F_GROUPS_LOG2_SHIFT 12u
// KvInsertParams: the 528 and 288 B records in vLLM 0.34.0's per-token order
// (each record's scales right after its values) instead of the seed's
// page-planar order (kv_record_at); 584 B records are page-planar only.
#define KV_F_PER_TOKEN 262144u

// KvGatherParams.flags (bits 12..14 hold the groups per block, as above).
#define KV_GF_BLOCK_TABLE 1u
#define KV_GF_SLOT_I64 2u
#define KV_GF_TABLE_I64 4u
#define KV_GF_CU_I64 8u
#define KV_GF_STARTS_I64 16u
#define KV_GF_HAS_STARTS 32u
// Each group gathers two consecutive output rows.
#define KV_GF_TWO_ROWS 64u
// The paged records are in the per-token order (KV_F_PER_TOKEN).
#define KV_GF_PER_TOKEN 128u

// KvIndexerKParams.flags, beside KV_F_POS_I64, KV_F_SLOT_I64, KV_F_COS_BF16,
// KV_F_COS_F16, KV_F_W_F16 and KV_F_W_F32 (a BF16 weight without the last
// two), and bits 12..14 (groups per block).
// FP8 keys: the scale as four equal UE8M0 bytes (else an f32).
#define KV_IKF_MX_SCALE 4u
// FP8 keys: ROCm's 16 x 16 tiled value order.
#define KV_IKF_TILED 8u
// MXFP4 keys: AITER's preshuffled order (n_per_tile tokens a run).
#define KV_IKF_PRESHUFFLED 16u

#define KV_LAYOUT_V4 0
#define KV_LAYOUT_MXFP8 1
#define KV_LAYOUT_NVFP4 2
#define KV_LAYOUT_BF16 3
#define KV_LAYOUT_FP8 4

#define KV_COUNT_SLOT 0
#define KV_COUNT_POS 1
#define KV_COUNT_INDEX 2

#define KV_GROUP_LANES 32u
// Groups in a CR2 team and in a CR2 pair (the host sizes their blocks).
#define KV_CR2_TEAM 4
#define KV_CR2_PAIR 2
// The largest block the host launches (src/device/kernel_abi.rs, BLOCK_THREADS).
#define KV_BLOCK_THREADS 256

// ---- the kernels -----------------------------------------------------------
// Every kernel of the code objects and the parameter block it takes, in the
// order of the Rust `Kernel` enum. kvcache.hip declares each one from this
// list after defining them, so a definition taking another block does not
// compile; tests/code_objects.rs checks that the code objects hold exactly
// these kernels.
#define KV_KERNELS(X)                                  \
    X(kv_compress_cr1, KvCompressParams)               \
    X(kv_compress_cr2, KvCompressParams)               \
    X(kv_compress_cr2_team, KvCompressParams)          \
    X(kv_compress_cr2_pair, KvCompressParams)          \
    X(kv_compress_cr2_long, KvCompressParams)          \
    X(kv_compress_cr2_team_mtp, KvCompressParams)      \
    X(kv_compress_cr2_pair_mtp, KvCompressParams)      \
    X(kv_compress_cr2_pair_mtp_spread, KvCompressParams) \
    X(kv_compress_cr2_team_swept, KvCompressParams)    \
    X(kv_compress_cr2_pair_swept, KvCompressParams)    \
    X(kv_compress_cr2_team_chunks, KvCompressParams)   \
    X(kv_save_ring_rows, KvRingRowsParams)             \
    X(kv_insert_v4, KvInsertParams)                    \
    X(kv_insert_mxfp8, KvInsertParams)                 \
    X(kv_insert_nvfp4, KvInsertParams)                 \
    X(kv_insert_bf16, KvInsertParams)                  \
    X(kv_insert_fp8, KvInsertParams)                   \
    X(kv_insert_nvfp4_tiles, KvInsertParams)           \
    X(kv_insert_bf16_tiles, KvInsertParams)            \
    X(kv_insert_fp8_tiles, KvInsertParams)             \
    X(kv_insert_v4_large, KvInsertParams)              \
    X(kv_insert_mxfp8_large, KvInsertParams)           \
    X(kv_fused_cr1_v4, KvFusedParams)                  \
    X(kv_fused_cr1_mxfp8, KvFusedParams)               \
    X(kv_fused_cr1_nvfp4, KvFusedParams)               \
    X(kv_fused_cr1_bf16, KvFusedParams)                \
    X(kv_fused_cr1_fp8, KvFusedParams)                 \
    X(kv_fused_cr2_v4, KvFusedParams)                  \
    X(kv_fused_cr2_mxfp8, KvFusedParams)               \
    X(kv_fused_cr2_nvfp4, KvFusedParams)               \
    X(kv_fused_cr2_bf16, KvFusedParams)                \
    X(kv_fused_cr2_fp8, KvFusedParams)                 \
    X(kv_fused_cr2_team_v4, KvFusedParams)             \
    X(kv_fused_cr2_team_mxfp8, KvFusedParams)          \
    X(kv_fused_cr2_team_nvfp4, KvFusedParams)          \
    X(kv_fused_cr2_team_bf16, KvFusedParams)           \
    X(kv_fused_cr2_team_fp8, KvFusedParams)            \
    X(kv_fused_cr2_pair_v4, KvFusedParams)             \
    X(kv_fused_cr2_pair_mxfp8, KvFusedParams)          \
    X(kv_fused_cr2_pair_nvfp4, KvFusedParams)          \
    X(kv_fused_cr2_pair_bf16, KvFusedParams)           \
    X(kv_fused_cr2_pair_fp8, KvFusedParams)            \
    X(kv_fused_cr2_long_v4, KvFusedParams)             \
    X(kv_fused_cr2_long_mxfp8, KvFusedParams)          \
    X(kv_fused_cr2_long_nvfp4, KvFusedParams)          \
    X(kv_fused_cr2_long_bf16, KvFusedParams)           \
    X(kv_fused_cr2_long_fp8, KvFusedParams)            \
    X(kv_fused_cr2_team_mtp_v4, KvFusedParams)         \
    X(kv_fused_cr2_team_mtp_mxfp8, KvFusedParams)      \
    X(kv_fused_cr2_team_mtp_nvfp4, KvFusedParams)      \
    X(kv_fused_cr2_team_mtp_bf16, KvFusedParams)       \
    X(kv_fused_cr2_team_mtp_fp8, KvFusedParams)        \
    X(kv_copy, KvCopyParams)                           \
    X(kv_check_hw_formats, KvHwCheckParams)            \
    X(kv_gather_v4_bf16, KvGatherParams)               \
    X(kv_gather_v4_f32, KvGatherParams)                \
    X(kv_gather_mxfp8_bf16, KvGatherParams)            \
    X(kv_gather_mxfp8_f32, KvGatherParams)             \
    X(kv_gather_nvfp4_bf16, KvGatherParams)            \
    X(kv_gather_nvfp4_f32, KvGatherParams)             \
    X(kv_gather_bf16_bf16, KvGatherParams)             \
    X(kv_gather_bf16_f32, KvGatherParams)              \
    X(kv_gather_fp8_bf16, KvGatherParams)              \
    X(kv_gather_fp8_f32, KvGatherParams)               \
    X(kv_gather_v4_bf16_slots, KvGatherParams)         \
    X(kv_gather_v4_f32_slots, KvGatherParams)          \
    X(kv_gather_mxfp8_bf16_slots, KvGatherParams)      \
    X(kv_gather_mxfp8_f32_slots, KvGatherParams)       \
    X(kv_gather_nvfp4_bf16_slots, KvGatherParams)      \
    X(kv_gather_nvfp4_f32_slots, KvGatherParams)       \
    X(kv_gather_bf16_bf16_slots, KvGatherParams)       \
    X(kv_gather_bf16_f32_slots, KvGatherParams)        \
    X(kv_gather_fp8_bf16_slots, KvGatherParams)        \
    X(kv_gather_fp8_f32_slots, KvGatherParams)         \
    X(kv_gather_v4_bf16_split, KvGatherParams)         \
    X(kv_gather_v4_f32_split, KvGatherParams)          \
    X(kv_gather_mxfp8_bf16_split, KvGatherParams)      \
    X(kv_gather_mxfp8_f32_split, KvGatherParams)       \
    X(kv_gather_nvfp4_bf16_split, KvGatherParams)      \
    X(kv_gather_nvfp4_f32_split, KvGatherParams)       \
    X(kv_gather_bf16_bf16_split, KvGatherParams)       \
    X(kv_gather_bf16_f32_split, KvGatherParams)        \
    X(kv_gather_fp8_bf16_split, KvGatherParams)        \
    X(kv_gather_fp8_f32_split, KvGatherParams)         \
    X(kv_compress_cr1_wide, KvCompressParams)          \
    X(kv_compress_cr2_wide, KvCompressParams)          \
    X(kv_insert_v4_wide, KvInsertParams)               \
    X(kv_insert_mxfp8_wide, KvInsertParams)            \
    X(kv_insert_nvfp4_wide, KvInsertParams)            \
    X(kv_insert_bf16_wide, KvInsertParams)             \
    X(kv_insert_fp8_wide, KvInsertParams)              \
    X(kv_fused_cr1_v4_wide, KvFusedParams)             \
    X(kv_fused_cr1_mxfp8_wide, KvFusedParams)          \
    X(kv_fused_cr1_nvfp4_wide, KvFusedParams)          \
    X(kv_fused_cr1_bf16_wide, KvFusedParams)           \
    X(kv_fused_cr1_fp8_wide, KvFusedParams)            \
    X(kv_fused_cr2_v4_wide, KvFusedParams)             \
    X(kv_fused_cr2_mxfp8_wide, KvFusedParams)          \
    X(kv_fused_cr2_nvfp4_wide, KvFusedParams)          \
    X(kv_fused_cr2_bf16_wide, KvFusedParams)           \
    X(kv_fused_cr2_fp8_wide, KvFusedParams)             \
    X(kv_indexer_k_fp8, KvIndexerKParams)              \
    X(kv_indexer_k_mxfp4, KvIndexerKParams)

// Field offsets computed by build.rs from the structs above, checked against
// this compiler's layout (the Rust structs are checked against the same
// figures).
#ifdef KV_ABI_LAYOUT_CHECK
#include "kv_abi_layout.h"
#endif
