// Entry points of the fused compress+insert (the compressor's items with
// each latent inserted). All entry points: KV_KERNELS in kv_abi.h.
#include "kv_compress.h"

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
KV_FUSED_KERNEL(kv_fused_cr2_nvfp4, 2, KV_LAYOUT_NVFP4, KV_LAUNCH_BOUNDS_2)
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

// The generic fused kernels (an F32 or F16 weight, an F16 cos/sin table),
// as kv_compress_cr1_wide says.
#define KV_FUSED_WIDE_KERNEL(name, CR, LAYOUT)                                        \
    KV_KERNEL KV_LAUNCH_BOUNDS_2(KV_BLOCK_THREADS) void name(const KvFusedParams p) { \
        kv_compress<true, LAYOUT, false, true>(p.compress, &p.insert, CR);          \
    }

KV_FUSED_WIDE_KERNEL(kv_fused_cr1_v4_wide, 1, KV_LAYOUT_V4)
KV_FUSED_WIDE_KERNEL(kv_fused_cr1_mxfp8_wide, 1, KV_LAYOUT_MXFP8)
KV_FUSED_WIDE_KERNEL(kv_fused_cr1_nvfp4_wide, 1, KV_LAYOUT_NVFP4)
KV_FUSED_WIDE_KERNEL(kv_fused_cr1_bf16_wide, 1, KV_LAYOUT_BF16)
KV_FUSED_WIDE_KERNEL(kv_fused_cr1_fp8_wide, 1, KV_LAYOUT_FP8)
KV_FUSED_WIDE_KERNEL(kv_fused_cr2_v4_wide, 2, KV_LAYOUT_V4)
KV_FUSED_WIDE_KERNEL(kv_fused_cr2_mxfp8_wide, 2, KV_LAYOUT_MXFP8)
KV_FUSED_WIDE_KERNEL(kv_fused_cr2_nvfp4_wide, 2, KV_LAYOUT_NVFP4)
KV_FUSED_WIDE_KERNEL(kv_fused_cr2_bf16_wide, 2, KV_LAYOUT_BF16)
KV_FUSED_WIDE_KERNEL(kv_fused_cr2_fp8_wide, 2, KV_LAYOUT_FP8)
