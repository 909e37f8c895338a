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
#define KV_BOUNDS(n, sm90, sm100, sm103, sm120)

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

#if defined(KV_HOST_BF16X2_ARITH)
// sm_90's hardware vocabulary (kernels-cuda/prelude.cuh: the BF16 pair
// conversion and arithmetic, byte permutes, e4m3 pairs) built on the host
// as the Rust twins in src/numerics/formats.rs define it (bf16_fma,
// bf16x2_min/max, u16x2_min, byte_perm), so that the host-kernel tests run
// the kernels' sm_90 code paths (the NVFP4 encoder on BF16 pairs among
// them) on machines without a GPU.
#define KV_HW_BF16X2 1
#define KV_HW_BF16X2_ARITH 1

KV_DEVICE float kv_host_bf16_to_f32(uint16_t h) { return kv_u2f((uint32_t)h << 16); }

// cvt.rn.bf16x2.f32: the definition twice (kv_formats.h, declared here),
// which the device's self-check shows it equals on every input.
KV_DEVICE uint16_t kv_bf16_from_f32(float x);
KV_DEVICE uint32_t kv_hw_bf16x2(float lo, float hi) {
    return (uint32_t)kv_bf16_from_f32(lo) | ((uint32_t)kv_bf16_from_f32(hi) << 16);
}

// BF16 nearest-even rounding of the real s + err (formats.rs bf16_round).
KV_DEVICE uint16_t kv_host_bf16_round(double s, double err) {
    uint16_t sign = signbit(s) ? 0x8000u : 0u;
    double a = fabs(s);
    if (s < 0.0) err = -err;
    if (a == 0.0) return (uint16_t)(kv_f2u((float)s) >> 16);
    uint64_t bits;
    memcpy(&bits, &a, 8);
    int e = (int)(bits >> 52) - 1023;
    if (e < -126) e = -126;
    double ulp = ldexp(1.0, e - 7);
    double n = a / ulp;
    double fl = floor(n);
    double frac = n - fl;
    bool up = frac > 0.5 || (frac == 0.5 && (err > 0.0 || (err == 0.0 && fmod(fl, 2.0) == 1.0)));
    double r = (up ? fl + 1.0 : fl) * ulp;
    return (uint16_t)(sign | (kv_f2u((float)r) >> 16));
}

// a b + c rounded once (formats.rs bf16_fma: the product is exact in f64,
// the sum's error recovered by two-sum).
KV_DEVICE uint16_t kv_host_bf16_fma(uint16_t a, uint16_t b, uint16_t c) {
    double p = (double)kv_host_bf16_to_f32(a) * (double)kv_host_bf16_to_f32(b);
    double cc = (double)kv_host_bf16_to_f32(c);
    double s = p + cc;
    if (!isfinite(s)) return isnan(s) ? 0x7fffu : (uint16_t)(kv_f2u((float)s) >> 16);
    double bb = s - p;
    double err = (p - (s - bb)) + (cc - bb);
    return kv_host_bf16_round(s, err);
}

// NaN-ignoring minimum or maximum (formats.rs bf16_min_max).
KV_DEVICE uint16_t kv_host_bf16_min_max(uint16_t a, uint16_t b, bool max) {
    float x = kv_host_bf16_to_f32(a), y = kv_host_bf16_to_f32(b);
    if (isnan(x) && isnan(y)) return 0x7fffu;
    if (isnan(x)) return b;
    if (isnan(y)) return a;
    return ((y > x) == max && y != x) ? b : a;
}

KV_DEVICE uint32_t kv_hw_bf16x2_fma(uint32_t a, uint32_t b, uint32_t c) {
    return (uint32_t)kv_host_bf16_fma((uint16_t)a, (uint16_t)b, (uint16_t)c) |
           ((uint32_t)kv_host_bf16_fma((uint16_t)(a >> 16), (uint16_t)(b >> 16), (uint16_t)(c >> 16)) << 16);
}
// mul.rn.bf16x2: the fma with a -0 addend, which keeps the product's sign of zero.
#define KV_HW_BF16X2_MUL 1
KV_DEVICE uint32_t kv_hw_bf16x2_mul(uint32_t a, uint32_t b) { return kv_hw_bf16x2_fma(a, b, 0x80008000u); }
KV_DEVICE uint32_t kv_hw_bf16x2_min(uint32_t a, uint32_t b) {
    return (uint32_t)kv_host_bf16_min_max((uint16_t)a, (uint16_t)b, false) |
           ((uint32_t)kv_host_bf16_min_max((uint16_t)(a >> 16), (uint16_t)(b >> 16), false) << 16);
}
KV_DEVICE uint32_t kv_hw_bf16x2_max(uint32_t a, uint32_t b) {
    return (uint32_t)kv_host_bf16_min_max((uint16_t)a, (uint16_t)b, true) |
           ((uint32_t)kv_host_bf16_min_max((uint16_t)(a >> 16), (uint16_t)(b >> 16), true) << 16);
}
KV_DEVICE uint32_t kv_hw_u16x2_min(uint32_t a, uint32_t b) {
    uint32_t lo = (a & 0xffffu) < (b & 0xffffu) ? (a & 0xffffu) : (b & 0xffffu);
    uint32_t hi = (a & 0xffff0000u) < (b & 0xffff0000u) ? (a & 0xffff0000u) : (b & 0xffff0000u);
    return lo | hi;
}
// __byte_perm (the selector's low three bits a byte) and e4m3 pairs
// (cvt.rn.satfinite.e4m3x2.f32, which the kernels give no NaN): the
// software encoder twice, so that the kernels' paths through the pair
// conversion run here too.
#define KV_HW_BYTE_PERM 1
KV_DEVICE uint32_t kv_hw_byte_perm_sx(uint32_t a, uint32_t b, uint32_t s);
KV_DEVICE uint32_t kv_hw_byte_perm(uint32_t a, uint32_t b, uint32_t s) { return kv_hw_byte_perm_sx(a, b, s & 0x7777u); }
#define KV_HW_E4M3X2 1
KV_DEVICE uint8_t kv_e4m3_from_f32(float x);
KV_DEVICE uint16_t kv_hw_e4m3x2(float lo, float hi) {
    return (uint16_t)(kv_e4m3_from_f32(lo) | (kv_e4m3_from_f32(hi) << 8));
}
// prmt.b32's default mode (formats.rs byte_perm).
KV_DEVICE uint32_t kv_hw_byte_perm_sx(uint32_t a, uint32_t b, uint32_t s) {
    uint64_t src = ((uint64_t)b << 32) | a;
    uint32_t w = 0;
    for (int i = 0; i < 4; ++i) {
        uint32_t n = (s >> (4 * i)) & 0xfu;
        uint32_t byte = (uint32_t)((src >> (8 * (n & 7u))) & 0xffu);
        if (n & 8u) byte = 0xffu * (byte >> 7);
        w |= byte << (8 * i);
    }
    return w;
}
#endif
