// Entry points of the reader (gather_dequant): every layout and output
// dtype in three forms (kv_gather.h). All entry points: KV_KERNELS in kv_abi.h.
#include "kv_gather.h"

#define KV_GATHER_KERNEL(name, LAYOUT, F32, FORM)                                     \
    KV_KERNEL KV_LAUNCH_BOUNDS_6(KV_BLOCK_THREADS) void name(const KvGatherParams p) { \
        kv_gather<LAYOUT, F32, FORM>(p);                                              \
    }

// Every form and rows per group (flags), then the slot form with a row per
// group, then with a row per two groups.
KV_GATHER_KERNEL(kv_gather_v4_bf16, KV_LAYOUT_V4, false, KV_GATHER_GENERAL)
KV_GATHER_KERNEL(kv_gather_v4_f32, KV_LAYOUT_V4, true, KV_GATHER_GENERAL)
KV_GATHER_KERNEL(kv_gather_mxfp8_bf16, KV_LAYOUT_MXFP8, false, KV_GATHER_GENERAL)
KV_GATHER_KERNEL(kv_gather_mxfp8_f32, KV_LAYOUT_MXFP8, true, KV_GATHER_GENERAL)
KV_GATHER_KERNEL(kv_gather_nvfp4_bf16, KV_LAYOUT_NVFP4, false, KV_GATHER_GENERAL)
KV_GATHER_KERNEL(kv_gather_nvfp4_f32, KV_LAYOUT_NVFP4, true, KV_GATHER_GENERAL)
KV_GATHER_KERNEL(kv_gather_bf16_bf16, KV_LAYOUT_BF16, false, KV_GATHER_GENERAL)
KV_GATHER_KERNEL(kv_gather_bf16_f32, KV_LAYOUT_BF16, true, KV_GATHER_GENERAL)
KV_GATHER_KERNEL(kv_gather_fp8_bf16, KV_LAYOUT_FP8, false, KV_GATHER_GENERAL)
KV_GATHER_KERNEL(kv_gather_fp8_f32, KV_LAYOUT_FP8, true, KV_GATHER_GENERAL)
KV_GATHER_KERNEL(kv_gather_v4_bf16_slots, KV_LAYOUT_V4, false, KV_GATHER_SLOTS)
KV_GATHER_KERNEL(kv_gather_v4_f32_slots, KV_LAYOUT_V4, true, KV_GATHER_SLOTS)
KV_GATHER_KERNEL(kv_gather_mxfp8_bf16_slots, KV_LAYOUT_MXFP8, false, KV_GATHER_SLOTS)
KV_GATHER_KERNEL(kv_gather_mxfp8_f32_slots, KV_LAYOUT_MXFP8, true, KV_GATHER_SLOTS)
KV_GATHER_KERNEL(kv_gather_nvfp4_bf16_slots, KV_LAYOUT_NVFP4, false, KV_GATHER_SLOTS)
KV_GATHER_KERNEL(kv_gather_nvfp4_f32_slots, KV_LAYOUT_NVFP4, true, KV_GATHER_SLOTS)
KV_GATHER_KERNEL(kv_gather_bf16_bf16_slots, KV_LAYOUT_BF16, false, KV_GATHER_SLOTS)
KV_GATHER_KERNEL(kv_gather_bf16_f32_slots, KV_LAYOUT_BF16, true, KV_GATHER_SLOTS)
KV_GATHER_KERNEL(kv_gather_fp8_bf16_slots, KV_LAYOUT_FP8, false, KV_GATHER_SLOTS)
KV_GATHER_KERNEL(kv_gather_fp8_f32_slots, KV_LAYOUT_FP8, true, KV_GATHER_SLOTS)
KV_GATHER_KERNEL(kv_gather_v4_bf16_split, KV_LAYOUT_V4, false, KV_GATHER_SPLIT)
KV_GATHER_KERNEL(kv_gather_v4_f32_split, KV_LAYOUT_V4, true, KV_GATHER_SPLIT)
KV_GATHER_KERNEL(kv_gather_mxfp8_bf16_split, KV_LAYOUT_MXFP8, false, KV_GATHER_SPLIT)
KV_GATHER_KERNEL(kv_gather_mxfp8_f32_split, KV_LAYOUT_MXFP8, true, KV_GATHER_SPLIT)
KV_GATHER_KERNEL(kv_gather_nvfp4_bf16_split, KV_LAYOUT_NVFP4, false, KV_GATHER_SPLIT)
KV_GATHER_KERNEL(kv_gather_nvfp4_f32_split, KV_LAYOUT_NVFP4, true, KV_GATHER_SPLIT)
KV_GATHER_KERNEL(kv_gather_bf16_bf16_split, KV_LAYOUT_BF16, false, KV_GATHER_SPLIT)
KV_GATHER_KERNEL(kv_gather_bf16_f32_split, KV_LAYOUT_BF16, true, KV_GATHER_SPLIT)
KV_GATHER_KERNEL(kv_gather_fp8_bf16_split, KV_LAYOUT_FP8, false, KV_GATHER_SPLIT)
KV_GATHER_KERNEL(kv_gather_fp8_f32_split, KV_LAYOUT_FP8, true, KV_GATHER_SPLIT)
