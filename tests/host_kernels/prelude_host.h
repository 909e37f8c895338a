// The kernels' vocabulary on the host, for tests/gather_host_kernels.rs: the
// gather kernels run one work-item at a time (they never talk across lanes
// or wait for each other), so a sequential loop over the grid runs them
// exactly. The cross-lane and barrier names exist only so that the whole
// kernel source compiles; calling one aborts.
#pragma once

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define KV_KERNEL extern "C"
#define KV_DEVICE static inline
#define KV_SHARED
#define KV_RESTRICT __restrict__
#define KV_LAUNCH_BOUNDS(n)
#define KV_LAUNCH_BOUNDS_2(n)
#define KV_LAUNCH_BOUNDS_4(n)
#define KV_LAUNCH_BOUNDS_5(n)
#define KV_LAUNCH_BOUNDS_6(n)
#define KV_LAUNCH_BOUNDS_9(n)
#define KV_LAUNCH_BOUNDS_10(n)
#define KV_LAUNCH_BOUNDS_16(n)

extern unsigned kv_host_tid, kv_host_bid, kv_host_bdim, kv_host_gdim;
KV_DEVICE unsigned kv_tid() { return kv_host_tid; }
KV_DEVICE unsigned kv_bid() { return kv_host_bid; }
KV_DEVICE unsigned kv_bdim() { return kv_host_bdim; }
KV_DEVICE unsigned kv_gdim() { return kv_host_gdim; }
KV_DEVICE void kv_sync() { abort(); }
KV_DEVICE uint32_t kv_shfl_xor_u32(uint32_t, int) { abort(); }
KV_DEVICE float kv_shfl_xor(float, int) { abort(); }
KV_DEVICE uint32_t kv_shfl_idx_u32(uint32_t, unsigned) { abort(); }
KV_DEVICE unsigned kv_atomic_add_u32(unsigned* p, unsigned v) {
    unsigned old = *p;
    *p = old + v;
    return old;
}
KV_DEVICE float kv_fmaf(float a, float b, float c) { return fmaf(a, b, c); }
KV_DEVICE float kv_sqrtf(float x) { return sqrtf(x); }
KV_DEVICE float kv_divf(float a, float b) { return a / b; }
KV_DEVICE float kv_fabsf(float x) { return fabsf(x); }
KV_DEVICE float kv_fmax_nonneg(float a, float b) { return fmaxf(a, b); }
KV_DEVICE float kv_fmin_nan_ignoring(float a, float b) { return fminf(a, b); }
KV_DEVICE uint32_t kv_f2u(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
KV_DEVICE float kv_u2f(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}
