// The kernels' vocabulary on the host, for tests/gather_host_kernels.rs and
// tests/insert_host_kernels.rs: kernels whose lanes never talk run one
// work-item at a time (a sequential loop over the grid runs them exactly),
// and with KV_HOST_LANES every work-item of a block runs on a thread of its
// own, so that a group's lanes can exchange values (the shuffles). The
// block barrier exists only so that the whole kernel source compiles;
// calling it aborts.
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

#if defined(KV_HOST_LANES)
// Every work-item of a block on its own host thread (lanes.h runs them), so
// that the 32 lanes of a group can exchange values: kernels whose groups
// talk only among their own lanes, every lane of a group reaching every
// exchange, run exactly.
extern thread_local unsigned kv_host_tid;
extern unsigned kv_host_bid, kv_host_bdim, kv_host_gdim;
uint32_t kv_host_exchange(uint32_t v, unsigned from);
KV_DEVICE uint32_t kv_shfl_xor_u32(uint32_t v, int mask) { return kv_host_exchange(v, kv_host_tid ^ (unsigned)mask); }
KV_DEVICE float kv_shfl_xor(float v, int mask) {
    uint32_t u;
    memcpy(&u, &v, 4);
    u = kv_shfl_xor_u32(u, mask);
    float f;
    memcpy(&f, &u, 4);
    return f;
}
KV_DEVICE uint32_t kv_shfl_idx_u32(uint32_t v, unsigned src) {
    return kv_host_exchange(v, (kv_host_tid & ~31u) | (src & 31u));
}
#else
extern unsigned kv_host_tid, kv_host_bid, kv_host_bdim, kv_host_gdim;
KV_DEVICE uint32_t kv_shfl_xor_u32(uint32_t, int) { abort(); }
KV_DEVICE float kv_shfl_xor(float, int) { abort(); }
KV_DEVICE uint32_t kv_shfl_idx_u32(uint32_t, unsigned) { abort(); }
#endif
KV_DEVICE unsigned kv_tid() { return kv_host_tid; }
KV_DEVICE unsigned kv_bid() { return kv_host_bid; }
KV_DEVICE unsigned kv_bdim() { return kv_host_bdim; }
KV_DEVICE unsigned kv_gdim() { return kv_host_gdim; }
KV_DEVICE void kv_sync() { abort(); }
KV_DEVICE unsigned kv_atomic_add_u32(unsigned* p, unsigned v) {
    unsigned old = *p;
    *p = old + v;
    return old;
}
KV_DEVICE void kv_store_16_evict_first(void* p, uint32_t x, uint32_t y, uint32_t z, uint32_t w) {
    const uint32_t v[4] = {x, y, z, w};
    memcpy(p, v, 16);
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
