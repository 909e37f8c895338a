// The shared math, device side. Twin of src/numerics/math.rs: each kv_name mirrors
// math::name operation for operation (build.rs turns off FP contraction, so
// only kv_fmaf fuses). No libm: the kernels are built with -nogpulib.
#pragma once

#define KV_INV_448 kv_u2f(0x3b124925u)
#define KV_INV_6 kv_u2f(0x3e2aaaabu)
#define KV_AMAX_FLOOR kv_u2f(0x38d1b717u)
#define KV_NVFP4_SCALE_MIN kv_u2f(0x3b000000u)
#define KV_LOG2E kv_u2f(0x3fb8aa3bu)
#define KV_LN2_HI kv_u2f(0x3f317200u)
#define KV_LN2_LO kv_u2f(0x35bfbe8eu)
#define KV_ROUND_MAGIC 12582912.0f

// NaN test on the bits (as a float self-compare it costs the fused AMD kernels
// scalar registers they do not have); the sign-bit clear is a free operand
// modifier on both vendors.
KV_DEVICE bool kv_isnan(float x) { return (kv_f2u(x) & 0x7fffffffu) > 0x7f800000u; }
KV_DEVICE float kv_fabs(float x) { return kv_fabsf(x); }
KV_DEVICE float kv_copysign(float m, float s) {
    return kv_u2f((kv_f2u(m) & 0x7fffffffu) | (kv_f2u(s) & 0x80000000u));
}

// e^x for x <= 0 or NaN (math::exp_nonpos, the same bits as math::exp
// there): Cody-Waite reduction, degree-7 Taylor by Horner in fma, scaling by
// 2^n. Straight-line: where math::exp returns early this computes on a
// harmless stand-in and selects at the end (same values). A lane pools
// several dims, and their chains overlap only when no branch separates them
// (what that gains CR2 at decode and prefill sizes: docs/tuning.md,
// Kernels).
KV_DEVICE float kv_exp_nonpos(float x) {
    bool in_range = x >= -103.97208f;  // false for NaN
    float xr = in_range ? x : 0.0f;    // keeps the conversion below defined
    float t = xr * KV_LOG2E;
    float n = (t + KV_ROUND_MAGIC) - KV_ROUND_MAGIC;
    float r = kv_fmaf(n, -KV_LN2_HI, xr);
    r = kv_fmaf(n, -KV_LN2_LO, r);
    float p = kv_u2f(0x39500d01u);           // 1/5040
    p = kv_fmaf(p, r, kv_u2f(0x3ab60b61u));  // 1/720
    p = kv_fmaf(p, r, kv_u2f(0x3c088889u));  // 1/120
    p = kv_fmaf(p, r, kv_u2f(0x3d2aaaabu));  // 1/24
    p = kv_fmaf(p, r, kv_u2f(0x3e2aaaabu));  // 1/6
    p = kv_fmaf(p, r, 0.5f);
    p = kv_fmaf(p, r, 1.0f);
    p = kv_fmaf(p, r, 1.0f);
    int ni = (int)n;
    // 2^n in two exact steps below the normal range (a subnormal result is
    // then rounded once); 2^n <= 1 here.
    bool lo = ni < -126;
    int e1 = lo ? ni + 100 : ni;
    float m2 = lo ? kv_pow2(-100) : 1.0f;
    float y = (p * kv_pow2(e1)) * m2;
    // Below the range +0, the quiet NaN for a NaN; an integer select on the
    // bits (float compares here became branches).
    uint32_t ob = (kv_f2u(x) & 0x7fffffffu) > 0x7f800000u ? 0x7fc00000u : 0u;
    return in_range ? y : kv_u2f(ob);
}

// min ignoring a NaN operand (NVIDIA min.f32), as one select: b when b is
// below a or a is NaN, else a (math::min_nan_ignoring case by case).
KV_DEVICE float kv_min_nan_ignoring(float a, float b) { return (b < a || a != a) ? b : a; }

// The FP8 clamp (math::clamp_e4m3, copysign(min(|v|, 448), v), NaN -> +448)
// reduced to what the e4m3 encoders leave undone: both saturate on their own
// (kv_e4m3_from_f32 gives 0x7E or 0xFE from 448 up, infinities included, and
// so does NVIDIA's satfinite conversion), so only a NaN needs replacing.
// e4m3(kv_e4m3_nan_to_max(v)) == e4m3(clamp_e4m3(v)) for every v
// (tests/formats_exhaustive.rs checks all 2^32 inputs). Written as
// min(v, 448), one NaN-ignoring min instead of a compare and a select (the
// inserts are issue-bound): a NaN gives 448, values from 448 up (+inf too)
// give 448, whose code the encoders' own saturation gives them anyway, and
// no +0/-0 pair meets.
KV_DEVICE float kv_e4m3_nan_to_max(float v) { return kv_fmin_nan_ignoring(v, 448.0f); }

// Largest j with log2(1 + j 2^-23) < 2^-q, for q = 18..25: 22 >> (q - 18)
// (math::LOG2_ROUNDS_DOWN, tested equal to it). An infinite block max asks
// for q = 17 and discards the result; the shift amount is taken mod 32, as
// math::log2_rounds_down's wrapping_shr does, so that no shift is by 32 or
// more (undefined in C++). The mask costs no instruction: nvcc takes the
// wrapping shift (SHF.R.W) for it, and AMD's shifts read five bits only.
KV_DEVICE uint32_t kv_log2_rounds_down(int q) { return 22u >> ((uint32_t)(q - 18) & 31u); }

// ceil(log2f(x)) for the block scale; returns false for an infinite x.
// Selects rather than early exits: it sits on every block's critical path.
KV_DEVICE bool kv_block_scale_exponent(float x, int* out) {
    uint32_t bits = kv_f2u(x);
    int biased = (int)((bits >> 23) & 0xffu);
    int k = biased - 127;
    uint32_t f = bits & 0x7fffffu;
    uint32_t ak = (uint32_t)(k < 0 ? -k : k);
    int fl = 31 - __builtin_clz(ak | 1u);  // | 1: k = 0 is decided below
    bool pow2 = (ak & (ak - 1u)) == 0u;
    int q = (k < 0 && pow2) ? 25 - fl : 24 - fl;
    int e = f <= kv_log2_rounds_down(q) ? k : k + 1;
    e = k == 0 ? 1 : e;
    *out = f == 0u ? k : e;
    return biased != 0xff;
}

KV_DEVICE uint8_t kv_ue8m0_scale_byte(bool finite, int e, bool sanitize) {
    int hi = sanitize ? 254 : 255;
    if (!finite) return (uint8_t)hi;
    int v = e + 127;
    v = v < 0 ? 0 : (v > hi ? hi : v);
    return (uint8_t)v;
}

KV_DEVICE float kv_block_scale_multiplier(bool finite, int e) {
    return finite ? kv_pow2(-e) : 0.0f;
}

// Softmax pooling of two rows' values for one dim: the numerator and the
// denominator (math::pool2_terms; the kernels divide in kv_pool_norm_emit,
// after every dim's terms, as math::pool2 does per dim). One exp per dim: the larger score's difference is +-0 (weight 1) or NaN
// (everything NaN), so the sum of the two differences is the smaller score's,
// whose weight e is the only exp; a plain max does (see math::pool2_terms).
// The sign of d0 says whether s0 is the smaller score; the values are picked
// with bit masks, not a select, whose per-dim lane masks would live in SGPR
// pairs on AMD (gfx942's fused CR2 kernels reached 106 SGPRs and spilled).
KV_DEVICE void kv_pool2_terms(float kv0, float s0, float kv1, float s1, float* num, float* den) {
    float m = s0 > s1 ? s0 : s1;
    float d0 = s0 - m;
    float e = kv_exp_nonpos(d0 + (s1 - m));
    uint32_t lo = (uint32_t)((int32_t)kv_f2u(d0) >> 31);  // all ones if d0 < 0
    float kv_lo = kv_u2f((kv_f2u(kv0) & lo) | (kv_f2u(kv1) & ~lo));
    float kv_hi = kv_u2f((kv_f2u(kv1) & lo) | (kv_f2u(kv0) & ~lo));
    *num = kv_lo * e + kv_hi;
    *den = 1.0f + e;
}

// NVFP4 code of r in a tile of scale s, y = f32(1 / s): e2m1(f32(r / s))
// without dividing (see math::e2m1_of_quotient): |r| with NaN -> 0, one
// product and Markstein's correction (NaN, hence code 7, if it overflowed),
// the sign of min(r, inf), which a NaN does not have. The sign is added
// above the magnitude's three bits, which are followed by zeros.
KV_DEVICE uint8_t kv_e2m1_of_quotient(float r, float s, float y) {
    float a = kv_fmax_nonneg(kv_fabsf(r), 0.0f);
    float q0 = a * y;
    float q = kv_fmaf(kv_fmaf(-q0, s, a), y, q0);
    uint32_t sign = (kv_f2u(kv_fmin_nan_ignoring(r, kv_u2f(0x7f800000u))) >> 28) & 8u;
    return (uint8_t)(kv_e2m1_magnitude_bits(q) | sign);
}

// The NVFP4 encoder on BF16 pairs, where a prelude has the packed 16-bit
// arithmetic (sm_90+): two values per instruction, no f32 quotient
// (math::e2m1x2_of_quotient_bf16x2 says why it is exact; tests/
// formats_exhaustive.rs proves it for every input and scale code).
#if defined(KV_HW_BF16X2_ARITH) && defined(KV_HW_BF16X2)
#define KV_E2M1_BF16X2 1

// (yhi, ylo): bf16(y) and bf16(f32(fma(-yhi, s, 1) y)) in both halves
// (math::nvfp4_reciprocal_bf16x2); the residual is exact.
KV_DEVICE void kv_nvfp4_reciprocal_bf16x2(float s, float y, uint32_t* yhi, uint32_t* ylo) {
    uint32_t hi = kv_hw_bf16x2(y, y);
    float rest = kv_fmaf(-kv_u2f(hi << 16), s, 1.0f) * y;
    *yhi = hi;
    *ylo = kv_hw_bf16x2(rest, rest);
}

// |key| of both halves with a NaN made +0 (math::bf16x2_magnitude_nonnan).
KV_DEVICE uint32_t kv_bf16x2_magnitude_nonnan(uint32_t key) { return kv_hw_bf16x2_max(key & 0x7fff7fffu, 0u); }

// bf16(128 + magnitude code) of both halves of v, keys' magnitudes with no
// NaN (math::e2m1x2_magnitudes_bf16x2).
KV_DEVICE uint32_t kv_e2m1x2_magnitudes_bf16x2(uint32_t v, uint32_t yhi, uint32_t ylo) {
    uint32_t q = kv_hw_bf16x2_fma(v, yhi, kv_hw_bf16x2_fma(v, ylo, 0x80008000u));
    uint32_t c1 = kv_hw_bf16x2_fma(q, 0x40004000u, 0x43004300u);
    uint32_t c2 = kv_hw_bf16x2_fma(q, 0x3f803f80u, 0x43024302u);
    uint32_t c3 = kv_hw_bf16x2_fma(q, 0x3f003f00u, 0x43044304u);
    return kv_hw_bf16x2_min(kv_hw_bf16x2_min(c1, c2), kv_hw_bf16x2_min(c3, 0x43074307u));
}

// The NoPE rotation (kv_rope_nope_pair) of the BF16 pair w (even dim low) on
// the pair itself: fma(swap(w), (-0, +0), w). Both sums are exact (a BF16
// value plus a signed zero, or NaN), so the halves are the f32 rotation's
// results, which are BF16 numbers, up to NaN payloads
// (math::rope_nope_pair_bf16x2).
KV_DEVICE uint32_t kv_rope_nope_pair_bf16x2(uint32_t w) {
    return kv_hw_bf16x2_fma(kv_hw_byte_perm_sx(w, w, 0x1032u), 0x00008000u, w);
}

// Codes of the values with f32 bits x0, x1 (math::e2m1x2_of_quotient_bf16x2):
// *m = bf16(128 + magnitude code) of each, *z the signs (a NaN's cleared).
// The key is the top half with bit 0 set where the low half is not zero
// (|r| rounded to odd at 8 bits), the quotient key (yhi + ylo) in BF16.
KV_DEVICE void kv_e2m1x2_of_quotient_bf16x2(uint32_t x0, uint32_t x1, uint32_t yhi, uint32_t ylo, uint32_t* m,
                                             uint32_t* z) {
    uint32_t sticky = kv_hw_u16x2_min(kv_hw_byte_perm_sx(x0, x1, 0x5410u), 0x00010001u);
    uint32_t key = kv_hw_byte_perm_sx(x0, x1, 0x7632u) | sticky;
    *m = kv_e2m1x2_magnitudes_bf16x2(kv_bf16x2_magnitude_nonnan(key), yhi, ylo);
    *z = kv_hw_bf16x2_min(key, 0x7f807f80u);
}

// Bytes code0 | code1 << 4 and code2 | code3 << 4 of two pairs' (m, z) in
// bits 0..16 (math::e2m1x4_bytes_bf16x2): nibbles of one byte in bytes 0
// and 2, signs replicated from z's high bytes, then t + (t >> 12).
KV_DEVICE uint32_t kv_e2m1x4_bytes_bf16x2(uint32_t ma, uint32_t za, uint32_t mb, uint32_t zb) {
    uint32_t t = kv_hw_byte_perm_sx(ma, mb, 0x6240u) | (kv_hw_byte_perm_sx(za, zb, 0xfbd9u) & 0x08080808u);
    return t + (t >> 12);
}
#endif

// GPT-J rotation of one pair.
KV_DEVICE void kv_rope_pair(float e, float o, float c, float s, float* re, float* ro) {
    *re = kv_fmaf(e, c, -(o * s));
    *ro = kv_fmaf(o, c, e * s);
}

// kv_rope_pair with (c, s) = (1, 0), as the NoPE pairs run it, in one fma
// per value: e + -(o 0) is e + o (-0), both exact before the one rounding
// (the same sum, so the same sign of zero; NaN where o is infinite or NaN).
// Every NaN is equal here: each encoder maps them all to one code.
KV_DEVICE void kv_rope_nope_pair(float e, float o, float* re, float* ro) {
    *re = kv_fmaf(o, -0.0f, e);
    *ro = kv_fmaf(e, 0.0f, o);
}

// The NoPE rotation of the BF16 pair w (even dim low) as a BF16 pair, where
// a NaN may come out as any NaN: on the pair (kv_rope_nope_pair_bf16x2)
// where the prelude has BF16 arithmetic, else in f32, whose results are
// BF16 numbers (tests/formats_exhaustive.rs proves it on every pair), so
// their top halves are exact.
KV_DEVICE uint32_t kv_rope_nope_pair_bf16x2_any_nan(uint32_t w) {
#if defined(KV_E2M1_BF16X2)
    return kv_rope_nope_pair_bf16x2(w);
#else
    float re, ro;
    kv_rope_nope_pair(kv_u2f(w << 16), kv_u2f(w & 0xffff0000u), &re, &ro);
    return kv_pack_hi16(kv_f2u(re), kv_f2u(ro));
#endif
}
