// Device helpers every kernel file shares: the 16- and 8-byte word structs,
// a group's lane and index, index loads, page and row arithmetic, the skip
// counters, and vector loads and stores of floats and BF16. The math is in
// kv_formats.h / kv_math.h (twins of src/numerics/formats.rs and math.rs);
// the parameter blocks and the kernel list are in kv_abi.h, every kernel's
// occupancy in kv_occupancy.h.
#pragma once

#ifndef KV_PRELUDE_INCLUDED
#include "prelude.h"
#endif
#include "kv_occupancy.h"
#include "kv_formats.h"
#include "kv_math.h"
#include "kv_abi.h"

struct alignas(16) kv_u32x4 {
    uint32_t x, y, z, w;
};
struct alignas(8) kv_u32x2 {
    uint32_t x, y;
};

// ---- small helpers --------------------------------------------------------

KV_DEVICE unsigned kv_lane() { return kv_tid() & (KV_GROUP_LANES - 1u); }
// The group's token or request index. The block size comes from the flags
// word, not the dispatch: it is already in registers, and the block-size
// query costs scalar registers on AMD.
// Computed in 32 bits (a launch has fewer than 2^32 items: n and the
// request count are each below 2^31, src/operations/ops.rs), which also tells the
// compiler that the index's high word is zero wherever it scales a stride.
KV_DEVICE int64_t kv_group(uint32_t flags) {
    uint32_t log2 = (flags >> KV_F_GROUPS_LOG2_SHIFT) & 7u;
    return (int64_t)((kv_bid() << log2) + kv_tid() / KV_GROUP_LANES);
}

KV_DEVICE int64_t kv_load_index(const void* p, bool is64, int64_t i) {
    return is64 ? ((const int64_t*)p)[i] : (int64_t)((const int32_t*)p)[i];
}

// a / b and a % b for a >= 0, b > 0. Indices almost always fit 32 bits,
// where the division is far cheaper (a 64-bit one is a long software
// sequence on both vendors and costs scalar registers on AMD).
KV_DEVICE int64_t kv_divmod(int64_t a, int64_t b, int64_t* rem) {
    if (((uint64_t)a | (uint64_t)b) <= 0xffffffffull) {
        uint32_t q = (uint32_t)a / (uint32_t)b;
        *rem = (int64_t)((uint32_t)a - q * (uint32_t)b);
        return (int64_t)q;
    }
    int64_t q = a / b;
    *rem = a - q * b;
    return q;
}

// The page (or ring block) of a slot >= 0 and its row there. Page sizes are
// powers of two in practice: the host passes log2(rows) as shift, and a
// shift and a mask replace the division (shift is the launch's, so the
// branch does not diverge).
KV_DEVICE int64_t kv_page_row(int64_t slot, int32_t rows, int32_t shift, int64_t* row) {
    if (shift >= 0) {
        *row = slot & (int64_t)(rows - 1);
        return slot >> shift;
    }
    return kv_divmod(slot, rows, row);
}

// The value bytes (V of them) and scale bytes (S) of the paged record in
// row `row` of `page`, a page of `rows` records: the seed's page-planar
// order (the page's values, then its scales), or with per_token each record
// whole, its scales after its values (vLLM 0.34.0's order). per_token is the
// launch's flag, so the choice never diverges.
template <int V, int S, typename T>
KV_DEVICE void kv_record_at(T* page, int64_t row, int32_t rows, bool per_token, T** values, T** scales) {
    if (per_token) {
        *values = page + row * (V + S);
        *scales = *values + V;
    } else {
        *values = page + row * V;
        *scales = page + (int64_t)rows * V + row * S;
    }
}

KV_DEVICE void kv_count(unsigned* counters, int which, unsigned lane) {
    if (lane == 0u) kv_atomic_add_u32(counters + which, 1u);
}

// N consecutive floats (N a multiple of 4, or 2; 16-byte aligned, 8 for N = 2)
// into registers, and back.
template <int N>
KV_DEVICE void kv_loadNf(const float* p, float v[N]) {
    if constexpr (N % 4 == 0) {
        const kv_u32x4* q = (const kv_u32x4*)p;
#pragma unroll
        for (int i = 0; i < N / 4; ++i) {
            kv_u32x4 w = q[i];
            v[4 * i + 0] = kv_u2f(w.x);
            v[4 * i + 1] = kv_u2f(w.y);
            v[4 * i + 2] = kv_u2f(w.z);
            v[4 * i + 3] = kv_u2f(w.w);
        }
    } else {
        kv_u32x2 w = *(const kv_u32x2*)p;
        v[0] = kv_u2f(w.x);
        v[1] = kv_u2f(w.y);
    }
}

template <int N>
KV_DEVICE void kv_storeNf(float* p, const float v[N]) {
    if constexpr (N % 4 == 0) {
        kv_u32x4* q = (kv_u32x4*)p;
#pragma unroll
        for (int i = 0; i < N / 4; ++i) {
            kv_u32x4 w;
            w.x = kv_f2u(v[4 * i + 0]);
            w.y = kv_f2u(v[4 * i + 1]);
            w.z = kv_f2u(v[4 * i + 2]);
            w.w = kv_f2u(v[4 * i + 3]);
            q[i] = w;
        }
    } else {
        kv_u32x2 w;
        w.x = kv_f2u(v[0]);
        w.y = kv_f2u(v[1]);
        *(kv_u32x2*)p = w;
    }
}

// 16 consecutive BF16 (32 bytes) as bits.
KV_DEVICE void kv_load16h(const uint16_t* p, uint16_t h[16]) {
    const kv_u32x4* q = (const kv_u32x4*)p;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        kv_u32x4 w = q[i];
        uint32_t u[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            h[8 * i + 2 * j] = (uint16_t)(u[j] & 0xffffu);
            h[8 * i + 2 * j + 1] = (uint16_t)(u[j] >> 16);
        }
    }
}

// N consecutive BF16 (N = 4, or a multiple of 8; 2 N bytes, as aligned)
// from bits.
template <int N>
KV_DEVICE void kv_storeNh(uint16_t* p, const uint16_t h[N]) {
    static_assert(N == 4 || N % 8 == 0, "whole 8- or 16-byte stores");
    if constexpr (N == 4) {
        kv_u32x2 w;
        w.x = (uint32_t)h[0] | ((uint32_t)h[1] << 16);
        w.y = (uint32_t)h[2] | ((uint32_t)h[3] << 16);
        *(kv_u32x2*)p = w;
    } else {
        kv_u32x4* q = (kv_u32x4*)p;
#pragma unroll
        for (int i = 0; i < N / 8; ++i) {
            uint32_t u[4];
#pragma unroll
            for (int j = 0; j < 4; ++j) u[j] = (uint32_t)h[8 * i + 2 * j] | ((uint32_t)h[8 * i + 2 * j + 1] << 16);
            kv_u32x4 w;
            w.x = u[0];
            w.y = u[1];
            w.z = u[2];
            w.w = u[3];
            q[i] = w;
        }
    }
}

KV_DEVICE void kv_store16h(uint16_t* p, const uint16_t h[16]) { kv_storeNh<16>(p, h); }

// 16 bytes given as four little-endian words.
KV_DEVICE void kv_store16w(uint8_t* p, const uint32_t u[4]) {
    kv_u32x4 w;
    w.x = u[0];
    w.y = u[1];
    w.z = u[2];
    w.w = u[3];
    *(kv_u32x4*)p = w;
}

// 16 BF16 kept packed two to a register until used: the norm weights are
// loaded long before the norm needs them.
struct KvBf16x16 {
    uint32_t u[8];
};

KV_DEVICE void kv_load_bf16x16(const uint16_t* p, KvBf16x16* w) {
    const kv_u32x4* q = (const kv_u32x4*)p;
    kv_u32x4 a = q[0], b = q[1];
    w->u[0] = a.x;
    w->u[1] = a.y;
    w->u[2] = a.z;
    w->u[3] = a.w;
    w->u[4] = b.x;
    w->u[5] = b.y;
    w->u[6] = b.z;
    w->u[7] = b.w;
}

// Element j as f32 (little-endian: the even element is the low half).
KV_DEVICE float kv_bf16x16_get(const KvBf16x16& w, int j) {
    uint32_t u = w.u[j / 2];
    return kv_u2f((j & 1) ? (u & 0xffff0000u) : (u << 16));
}

// 16 weights as f32: the generic kernels' (WIDE) weights, F32, BF16 or F16
// by the flags, widened when loaded.
struct KvF32x16 {
    float f[16];
};

KV_DEVICE float kv_weight_at(const KvBf16x16& w, int j) { return kv_bf16x16_get(w, j); }
KV_DEVICE float kv_weight_at(const KvF32x16& w, int j) { return w.f[j]; }

// A kernel's weight holder: packed BF16 in the tuned kernels, f32 in the
// generic ones.
template <bool WIDE>
struct KvWeight16 {
    typedef KvBf16x16 T;
};
template <>
struct KvWeight16<true> {
    typedef KvF32x16 T;
};

// Lane `lane`'s 16 weights.
KV_DEVICE void kv_load_weight16(const KvCompressParams& c, unsigned lane, KvBf16x16* w) {
    kv_load_bf16x16(c.weight + 16 * lane, w);
}

KV_DEVICE void kv_load_weight16(const KvCompressParams& c, unsigned lane, KvF32x16* w) {
    if (c.flags & KV_F_W_F32) {
        kv_loadNf<16>((const float*)(const void*)c.weight + 16 * lane, w->f);
        return;
    }
    uint16_t h[16];
    kv_load16h(c.weight + 16 * lane, h);
    const bool f16 = (c.flags & KV_F_W_F16) != 0u;
#pragma unroll
    for (int j = 0; j < 16; ++j) w->f[j] = f16 ? kv_f16_to_f32(h[j]) : kv_bf16_to_f32(h[j]);
}
