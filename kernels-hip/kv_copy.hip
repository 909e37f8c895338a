// Entry points of the copy roofline and of the hardware conversions'
// self-check. All entry points: KV_KERNELS in kv_abi.h.
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

// Every f32 bit pattern a of the launch's range goes through each hardware
// pair conversion of the prelude as the pair (a, ~a), so that across the
// whole range each pattern is checked in both halves, against
// kv_bf16_from_f32 (every input) and kv_e4m3_from_f32 (non-NaN inputs, the
// only ones the kernels hand it; a NaN is checked as +0). The kernels use
// the hardware on inputs this proves, so a device that ran it with zero
// mismatches writes the bits of the reference (tests/hardware_formats.rs).
KV_KERNEL KV_LAUNCH_BOUNDS(KV_BLOCK_THREADS) void kv_check_hw_formats(const KvHwCheckParams p) {
    uint64_t stride = (uint64_t)kv_gdim() * kv_bdim();
    unsigned miss_bf16 = 0u, miss_e4m3 = 0u;
    uint32_t bad = 0u;
    for (uint64_t i = (uint64_t)kv_bid() * kv_bdim() + kv_tid(); i < p.count; i += stride) {
        uint32_t a = (uint32_t)(p.first + i);
        float x = kv_u2f(a), y = kv_u2f(~a);
#if defined(KV_HW_BF16X2)
        uint32_t soft = (uint32_t)kv_bf16_from_f32(x) | ((uint32_t)kv_bf16_from_f32(y) << 16);
        if (kv_hw_bf16x2(x, y) != soft) {
            ++miss_bf16;
            bad = a;
        }
#endif
#if defined(KV_HW_E4M3X2)
        float xn = (a & 0x7fffffffu) > 0x7f800000u ? 0.0f : x;
        float yn = (~a & 0x7fffffffu) > 0x7f800000u ? 0.0f : y;
        uint32_t soft8 = (uint32_t)kv_e4m3_from_f32(xn) | ((uint32_t)kv_e4m3_from_f32(yn) << 8);
        if ((uint32_t)kv_hw_e4m3x2(xn, yn) != soft8) {
            ++miss_e4m3;
            bad = a;
        }
#endif
    }
    if (miss_bf16) kv_atomic_add_u32(p.out, miss_bf16);
    if (miss_e4m3) kv_atomic_add_u32(p.out + 1, miss_e4m3);
    if (miss_bf16 || miss_e4m3) p.out[3] = bad;
    if (kv_bid() == 0u && kv_tid() == 0u) {
        uint32_t present = 0u;
#if defined(KV_HW_BF16X2)
        present |= KV_HW_CHECK_BF16X2;
#endif
#if defined(KV_HW_E4M3X2)
        present |= KV_HW_CHECK_E4M3X2;
#endif
        p.out[2] = present;
    }
}
