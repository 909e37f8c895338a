// Portable device vocabulary for the dsv4-kvcache kernels: the HIP side.
//
// The kernels (kvcache.hip) use ONLY the names defined here, never a vendor
// spelling. nvcc gets the same vocabulary from ../kernels-cuda/prelude.cuh.
//
// Two modes:
//   * Real HIP (hipcc / ROCm: KV_HAVE_HIP_RUNTIME defined by build.rs, or
//     __HIPCC__ with <hip/hip_runtime.h> reachable): the real runtime header.
//   * Freestanding (a plain HIP-capable clang with -nogpulib -nogpuinc, e.g.
//     the clang bundled by ziglang; build.rs passes -DKV_FREESTANDING=1 so a
//     HIP header lying in /usr/include cannot switch modes): no headers at all;
//     everything is built on clang builtins and attributes.
//
// Numerics: build.rs compiles with -ffp-contract=off, no denormal flushing and
// correctly rounded f32 division/sqrt; kv_fmaf is the only fused operation.
#pragma once

#if defined(KV_FREESTANDING) && defined(KV_HAVE_HIP_RUNTIME)
#error "KV_FREESTANDING and KV_HAVE_HIP_RUNTIME are mutually exclusive"
#endif
#if !defined(KV_FREESTANDING) && !defined(KV_HAVE_HIP_RUNTIME) && defined(__HIPCC__) && \
    defined(__has_include)
#if __has_include(<hip/hip_runtime.h>)
#define KV_HAVE_HIP_RUNTIME 1
#endif
#endif

#if defined(KV_HAVE_HIP_RUNTIME)
// ---------------------------------------------------------------- real HIP --
#include <hip/hip_runtime.h>
#include <stdint.h>

#define KV_KERNEL extern "C" __global__
#define KV_DEVICE __device__ inline __attribute__((always_inline))
#define KV_SHARED __shared__
#define KV_RESTRICT __restrict__
// The work-group size bound alone: blocks per SM are CUDA's register caps
// (kv_occupancy.h).
#define KV_BOUNDS(n, sm90, sm100, sm103, sm120) __launch_bounds__(n)

KV_DEVICE unsigned kv_tid() { return threadIdx.x; }
KV_DEVICE unsigned kv_bid() { return blockIdx.x; }
KV_DEVICE unsigned kv_bdim() { return blockDim.x; }
KV_DEVICE unsigned kv_gdim() { return gridDim.x; }
KV_DEVICE void kv_sync() { __syncthreads(); }

#else
// ------------------------------------------------------------ freestanding --
typedef __UINT8_TYPE__ uint8_t;
typedef __UINT16_TYPE__ uint16_t;
typedef __UINT32_TYPE__ uint32_t;
typedef __UINT64_TYPE__ uint64_t;
typedef __INT32_TYPE__ int32_t;
typedef __INT64_TYPE__ int64_t;

#define KV_KERNEL extern "C" __attribute__((global))
#define KV_DEVICE __attribute__((device)) inline __attribute__((always_inline))
#define KV_SHARED __attribute__((shared))
#define KV_RESTRICT __restrict__
// Same mapping as hip_runtime.h's __launch_bounds__(n).
#define KV_BOUNDS(n, sm90, sm100, sm103, sm120) __attribute__((amdgpu_flat_work_group_size(1, n)))

KV_DEVICE unsigned kv_tid() { return __builtin_amdgcn_workitem_id_x(); }
KV_DEVICE unsigned kv_bid() { return __builtin_amdgcn_workgroup_id_x(); }
// Work-group size and grid size (in work-items) come from the dispatch packet
// or the implicit kernel arguments, whichever the code object version uses;
// clang's builtins pick the right one.
KV_DEVICE unsigned kv_bdim() { return __builtin_amdgcn_workgroup_size_x(); }
KV_DEVICE unsigned kv_gdim() {
    unsigned b = __builtin_amdgcn_workgroup_size_x();
    return (__builtin_amdgcn_grid_size_x() + b - 1u) / b;
}
// __syncthreads(): release fence, s_barrier, acquire fence, at work-group scope.
KV_DEVICE void kv_sync() {
    __builtin_amdgcn_fence(__ATOMIC_RELEASE, "workgroup");
    __builtin_amdgcn_s_barrier();
    __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "workgroup");
}
#endif

// ------------------------------------------- common to both AMD modes -------

// A 16-byte store (16-byte aligned) of output nothing reads again. CUDA
// marks it evict-first, measured on the H200; without an AMD GPU to measure
// a nontemporal store on, it is a plain one here.
typedef uint32_t kv_u32v4 __attribute__((ext_vector_type(4)));
KV_DEVICE void kv_store_16_evict_first(void* p, uint32_t x, uint32_t y, uint32_t z, uint32_t w) {
    kv_u32v4 v = {x, y, z, w};
    *(kv_u32v4*)p = v;
}

// Lane index within the wavefront (0..63 on wave64, 0..31 on wave32).
KV_DEVICE unsigned kv_lane_id_() {
    return __builtin_amdgcn_mbcnt_hi(~0u, __builtin_amdgcn_mbcnt_lo(~0u, 0u));
}

// Butterfly exchange with lane ^ mask, mask in {1,2,4,8,16}: stays within an
// aligned group of 32 lanes, so wave32, wave64 and CUDA warps agree. All lanes
// of the wave must be active.
KV_DEVICE uint32_t kv_shfl_xor_u32(uint32_t v, int mask) {
    int src = (int)((kv_lane_id_() ^ (unsigned)mask) << 2);
    return (uint32_t)__builtin_amdgcn_ds_bpermute(src, (int)v);
}
KV_DEVICE float kv_shfl_xor(float v, int mask) {
    return __builtin_bit_cast(float, kv_shfl_xor_u32(__builtin_bit_cast(uint32_t, v), mask));
}
// Value of lane src (0..31) of this aligned group of 32 lanes (on wave64 the
// group is the wavefront's lower or upper half, as for kv_shfl_xor).
KV_DEVICE uint32_t kv_shfl_idx_u32(uint32_t v, unsigned src) {
    int from = (int)(((kv_lane_id_() & ~31u) | (src & 31u)) << 2);
    return (uint32_t)__builtin_amdgcn_ds_bpermute(from, (int)v);
}

// Device-scope relaxed atomic add; returns the old value.
KV_DEVICE unsigned kv_atomic_add_u32(unsigned* p, unsigned v) {
    return __hip_atomic_fetch_add(p, v, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_AGENT);
}

// a*b+c with one rounding (v_fma_f32).
KV_DEVICE float kv_fmaf(float a, float b, float c) { return __builtin_fmaf(a, b, c); }
// Correctly rounded (build.rs passes -fhip-fp32-correctly-rounded-divide-sqrt).
KV_DEVICE float kv_sqrtf(float x) { return __builtin_sqrtf(x); }
KV_DEVICE float kv_divf(float a, float b) { return a / b; }

KV_DEVICE float kv_fabsf(float x) { return __builtin_fabsf(x); }  // clears the sign bit, exact

// NaN-ignoring max of two values that are each non-negative or NaN (so no
// +0/-0 tie). LLVM's maxnum returns the non-NaN operand: in IEEE mode it
// first quiets an operand that may be a signaling NaN (a BF16 NaN widened
// to f32 is one; v_max_f32 alone would return NaN for it) with one
// v_max_f32 x, x, and skips that for arithmetic results. A select instead
// costs a compare mask, two SGPRs on wave64, per use: the fused CR2 kernels
// ran out of them.
KV_DEVICE float kv_fmax_nonneg(float a, float b) { return __builtin_fmaxf(a, b); }

// NaN-ignoring min of two values that are never +0 and -0 together: LLVM's
// minnum, as for kv_fmax_nonneg.
KV_DEVICE float kv_fmin_nan_ignoring(float a, float b) { return __builtin_fminf(a, b); }

KV_DEVICE uint32_t kv_f2u(float f) { return __builtin_bit_cast(uint32_t, f); }
KV_DEVICE float kv_u2f(uint32_t u) { return __builtin_bit_cast(float, u); }
