// Entry point of the copy roofline. All entry points: KV_KERNELS in kv_abi.h.
#include "kv_common.h"

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
