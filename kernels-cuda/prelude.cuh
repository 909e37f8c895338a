// Portable device vocabulary for the dsv4-kvcache kernels: the CUDA side.
//
// Same names and semantics as ../kernels-hip/prelude.h; the kernels use only
// these. nvcc pre-includes cuda_runtime.h, so only <stdint.h> is needed here.
//
// Numerics: build.rs compiles with -fmad=false -prec-div=true -prec-sqrt=true
// -ftz=false; the explicit _rn intrinsics below keep that true even if a
// caller's flags differ.
#pragma once

#if defined(__CUDACC_RTC__)
// NVRTC (the CUDA 12.9 build of scripts/install-toolchains.sh: the registry
// has that release's compiler library, not its nvcc) has no C library
// headers: the fixed-width types spelled as glibc's <stdint.h> spells them
// on LP64 (uint64_t is unsigned long), so both builds see the same types.
typedef unsigned char uint8_t;
typedef unsigned short uint16_t;
typedef unsigned int uint32_t;
typedef unsigned long uint64_t;
typedef int int32_t;
typedef long int64_t;
// nvcc's front end takes GCC's __builtin_clz in device code (kv_math.h uses
// it, as clang does for AMD); NVRTC's does not: the same count-leading-zeros
// instruction through the CUDA intrinsic. Every use passes a nonzero value.
#define __builtin_clz(x) __clz((int)(x))
#else
#include <stdint.h>
#endif

#define KV_KERNEL extern "C" __global__
#define KV_DEVICE __device__ __forceinline__
#define KV_SHARED __shared__
#define KV_RESTRICT __restrict__
// KV_BOUNDS(n, sm90, sm100, sm103, sm120): blocks of n threads, and the
// blocks per SM that ptxas must fit (a register cap), on each target; any
// other sm_10x takes sm_100's, a newer major version sm_120's. The kernels'
// variants and why each has its numbers: ../kernels-hip/kv_occupancy.h.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 1200
#define KV_BOUNDS(n, sm90, sm100, sm103, sm120) __launch_bounds__(n, sm120)
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ == 1030
#define KV_BOUNDS(n, sm90, sm100, sm103, sm120) __launch_bounds__(n, sm103)
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 1000
#define KV_BOUNDS(n, sm90, sm100, sm103, sm120) __launch_bounds__(n, sm100)
#else
#define KV_BOUNDS(n, sm90, sm100, sm103, sm120) __launch_bounds__(n, sm90)
#endif

// Compiled by a CUDA 12 compiler (nvcc or NVRTC): kv_occupancy.h's
// exceptions for what its code generation needs.
#if defined(__CUDACC_VER_MAJOR__) && __CUDACC_VER_MAJOR__ < 13
#define KV_CUDA_12 1
#endif

KV_DEVICE unsigned kv_tid() { return threadIdx.x; }
KV_DEVICE unsigned kv_bid() { return blockIdx.x; }
KV_DEVICE unsigned kv_bdim() { return blockDim.x; }
KV_DEVICE unsigned kv_gdim() { return gridDim.x; }
KV_DEVICE void kv_sync() { __syncthreads(); }

// Butterfly exchange with lane ^ mask, mask in {1,2,4,8,16}; the whole warp
// must be active (same contract as the AMD version).
KV_DEVICE uint32_t kv_shfl_xor_u32(uint32_t v, int mask) {
    return __shfl_xor_sync(0xffffffffu, v, mask, 32);
}
KV_DEVICE float kv_shfl_xor(float v, int mask) {
    return __shfl_xor_sync(0xffffffffu, v, mask, 32);
}
// Value of lane src (0..31) of this aligned group of 32 lanes.
KV_DEVICE uint32_t kv_shfl_idx_u32(uint32_t v, unsigned src) {
    return __shfl_sync(0xffffffffu, v, (int)src, 32);
}

// Device-scope relaxed atomic add; returns the old value.
KV_DEVICE unsigned kv_atomic_add_u32(unsigned* p, unsigned v) { return atomicAdd(p, v); }

// A 16-byte store (16-byte aligned) of output nothing reads again, marked
// evict-first in L2 (st.global.cs).
KV_DEVICE void kv_store_16_evict_first(void* p, uint32_t x, uint32_t y, uint32_t z, uint32_t w) {
    __stcs((uint4*)p, make_uint4(x, y, z, w));
}

KV_DEVICE float kv_fmaf(float a, float b, float c) { return __fmaf_rn(a, b, c); }
KV_DEVICE float kv_sqrtf(float x) { return __fsqrt_rn(x); }
KV_DEVICE float kv_divf(float a, float b) { return __fdiv_rn(a, b); }

KV_DEVICE float kv_fabsf(float x) { return fabsf(x); }  // clears the sign bit, exact

// NaN-ignoring max of two values that are each non-negative or NaN (block
// maxima of absolute values): max.f32 returns the non-NaN operand, as
// kv_max_nan_ignoring does, and with no -0 among the operands there is no
// tie to break differently. One instruction instead of a compare-and-select.
KV_DEVICE float kv_fmax_nonneg(float a, float b) { return fmaxf(a, b); }

// NaN-ignoring min of two values that are never +0 and -0 together (the
// one pair where min.f32's tie-break could differ from the select of
// kv_min_nan_ignoring): min.f32 returns the non-NaN operand. One instruction.
KV_DEVICE float kv_fmin_nan_ignoring(float a, float b) { return fminf(a, b); }

KV_DEVICE uint32_t kv_f2u(float f) { return __float_as_uint(f); }
KV_DEVICE float kv_u2f(uint32_t u) { return __uint_as_float(u); }

// Optional hardware conversions. kv_formats.h uses one only where it gives
// the same bits as its software twin on every input the kernels pass it.
//
// e4m3 pair, round to nearest even, saturating (sm_89+): identical to
// kv_e4m3_from_f32 on every non-NaN input (the kernels clamp first, so no NaN
// reaches it; kv_check_hw_formats runs all of them on the device). Result:
// lo in bits 0..7, hi in bits 8..15.
// BF16 pair, round to nearest even, no flushing (sm_80+): identical to
// kv_bf16_from_f32 on every input, infinities and subnormals included and
// every NaN as 0x7FFF (kv_check_hw_formats runs all 2^32 inputs on the
// device; tests/hardware_formats.rs). Result: lo in bits 0..15, hi in bits
// 16..31.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define KV_HW_BF16X2 1
KV_DEVICE uint32_t kv_hw_bf16x2(float lo, float hi) {
    uint32_t r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}
#endif

// Byte permutation of the pair (a, b): result byte i is byte s[4i..4i+4] of
// b:a (bytes 0..3 from a, 4..7 from b).
#define KV_HW_BYTE_PERM 1
KV_DEVICE uint32_t kv_hw_byte_perm(uint32_t a, uint32_t b, uint32_t s) { return __byte_perm(a, b, s); }

// BF16 pair multiplication (sm_90+), used only where both products are
// BF16 numbers, so its rounding never acts.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define KV_HW_BF16X2_MUL 1
KV_DEVICE uint32_t kv_hw_bf16x2_mul(uint32_t a, uint32_t b) {
    uint32_t r;
    asm("mul.rn.bf16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
    return r;
}
#endif

// Packed 16-bit arithmetic (sm_90+, where min.u16x2 is one instruction):
// BF16 pair fma rounded once to nearest even (subnormals kept), BF16 pair
// minimum and maximum that ignore a NaN operand (0x7FFF where both are), the
// unsigned 16-bit pair minimum, and the byte permutation of prmt.b32's
// default mode, in which bit 3 of a selector nibble copies the selected
// byte's top bit over the result byte. The NVFP4 encoder runs on them
// (kv_e2m1x2_of_quotient_bf16x2), held to its Rust twin by the parity tests.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define KV_HW_BF16X2_ARITH 1
KV_DEVICE uint32_t kv_hw_bf16x2_fma(uint32_t a, uint32_t b, uint32_t c) {
    uint32_t r;
    asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(c));
    return r;
}
KV_DEVICE uint32_t kv_hw_bf16x2_min(uint32_t a, uint32_t b) {
    uint32_t r;
    asm("min.bf16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
    return r;
}
KV_DEVICE uint32_t kv_hw_bf16x2_max(uint32_t a, uint32_t b) {
    uint32_t r;
    asm("max.bf16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
    return r;
}
KV_DEVICE uint32_t kv_hw_u16x2_min(uint32_t a, uint32_t b) {
    uint32_t r;
    asm("min.u16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
    return r;
}
KV_DEVICE uint32_t kv_hw_byte_perm_sx(uint32_t a, uint32_t b, uint32_t s) {
    uint32_t r;
    asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(s));
    return r;
}
#endif

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
#define KV_HW_E4M3X2 1
KV_DEVICE uint16_t kv_hw_e4m3x2(float lo, float hi) {
    uint16_t r;
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(hi), "f"(lo));
    return r;
}
#endif
