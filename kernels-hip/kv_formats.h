// Bit-exact number formats, device side. Twin of src/numerics/formats.rs: every
// function here mirrors the Rust function of the same name without the
// `kv_` prefix, operation for operation. Integer arithmetic on IEEE bits, so
// no vendor conversion instruction (whose NaN and saturation rules differ)
// decides a bit.
#pragma once

// 2^e for -126 <= e <= 127, from the exponent bits.
KV_DEVICE float kv_pow2(int e) { return kv_u2f(((uint32_t)(e + 127)) << 23); }

// f32 -> BF16 bits, round to nearest even; every NaN -> 0x7FFF.
KV_DEVICE uint16_t kv_bf16_from_f32(float x) {
    uint32_t b = kv_f2u(x);
    if ((b & 0x7fffffffu) > 0x7f800000u) return 0x7fff;
    uint32_t lsb = (b >> 16) & 1u;
    return (uint16_t)((b + 0x7fffu + lsb) >> 16);
}

KV_DEVICE float kv_bf16_to_f32(uint16_t h) { return kv_u2f(((uint32_t)h) << 16); }

// IEEE binary16 bits -> f32, exact (twin formats.rs f16_to_f32): a normal
// code's exponent moves by the bias difference 112, a subnormal is its
// integer significand times 2^-24 (a normal f32, so no denormal mode is
// involved), infinities and NaNs keep their payload bits.
KV_DEVICE float kv_f16_to_f32(uint16_t h) {
    uint32_t mag = (uint32_t)h & 0x7fffu;
    uint32_t sign = ((uint32_t)h & 0x8000u) << 16;
    uint32_t bits = mag >= 0x7c00u   ? ((mag << 13) | 0x7f800000u)
                    : mag >= 0x0400u ? ((mag << 13) + (112u << 23))
                                     : kv_f2u((float)mag * 5.9604644775390625e-8f);
    return kv_u2f(bits | sign);
}

// x and y rounded to BF16 (nearest even) and widened back, for callers that
// map every NaN to one value afterwards: a NaN comes out as some NaN, not
// necessarily 0x7FFF. A prelude's hardware pair conversion (KV_HW_BF16X2),
// which rounds finite values and infinities exactly like kv_bf16_from_f32,
// does the pair in one instruction.
KV_DEVICE void kv_bf16_round_pair_any_nan(float x, float y, float* rx, float* ry) {
#if defined(KV_HW_BF16X2)
    uint32_t two = kv_hw_bf16x2(x, y);
    *rx = kv_u2f(two << 16);
    *ry = kv_u2f(two & 0xffff0000u);
#else
    *rx = kv_bf16_to_f32(kv_bf16_from_f32(x));
    *ry = kv_bf16_to_f32(kv_bf16_from_f32(y));
#endif
}

// |x| * 2^9 rounded to nearest even, for |x| < 2^-6 given as abs bits.
KV_DEVICE uint8_t kv_e4m3_subnormal_code(uint32_t a) {
    int e = (int)(a >> 23);
    uint32_t sig = e == 0 ? (a & 0x7fffffu) : ((a & 0x7fffffu) | 0x800000u);
    int e_eff = e == 0 ? 1 : e;
    uint32_t shift = (uint32_t)(127 + 23 - 9 - e_eff);
    if (shift >= 32u) return 0;
    uint32_t q = sig >> shift;
    uint32_t rem = sig & ((1u << shift) - 1u);
    uint32_t half = 1u << (shift - 1u);
    uint32_t up = (rem > half || (rem == half && (q & 1u) == 1u)) ? 1u : 0u;
    return (uint8_t)(q + up);
}

// f32 -> e4m3fn, RNE, saturating to +-448 (infinity too); NaN -> 0x7F.
KV_DEVICE uint8_t kv_e4m3_from_f32(float x) {
    uint32_t b = kv_f2u(x);
    uint8_t sign = (uint8_t)((b >> 24) & 0x80u);
    uint32_t a = b & 0x7fffffffu;
    if (a > 0x7f800000u) return 0x7f;
    if (a >= 0x43e00000u) return (uint8_t)(sign | 0x7eu);
    if (a < 0x3c800000u) return (uint8_t)(sign | kv_e4m3_subnormal_code(a));
    int exp = (int)(a >> 23) - 127 + 7;
    uint32_t man = a & 0x7fffffu;
    uint32_t keep = man >> 20;
    uint32_t rem = man & 0xfffffu;
    uint32_t up = (rem > 0x80000u || (rem == 0x80000u && (keep & 1u) == 1u)) ? 1u : 0u;
    return (uint8_t)(sign | (uint8_t)((((uint32_t)exp) << 3) + keep + up));
}

// e4m3 codes of two non-NaN values, lo's in bits 0..7 and hi's in 8..15:
// the prelude's hardware pair conversion where it has one (held to
// kv_e4m3_from_f32 as kv_e4m3_words_from_f32_x16, below, says), else
// kv_e4m3_from_f32 twice.
KV_DEVICE uint32_t kv_e4m3x2_from_f32_nonnan(float lo, float hi) {
#if defined(KV_HW_E4M3X2)
    return (uint32_t)kv_hw_e4m3x2(lo, hi);
#else
    return (uint32_t)kv_e4m3_from_f32(lo) | ((uint32_t)kv_e4m3_from_f32(hi) << 8);
#endif
}

// e4m3 codes of 16 non-NaN values, as four little-endian words (code j in
// byte j % 4 of word j / 4, the order they are stored in). A prelude may
// supply a hardware pair conversion (KV_HW_E4M3X2) that rounds and
// saturates exactly like kv_e4m3_from_f32 on non-NaN inputs (the parity
// tests hold it to that); two of its results make a word, with no byte
// left to unpack and pack again.
KV_DEVICE void kv_e4m3_words_from_f32_x16(const float v[16], uint32_t w[4]) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
#if defined(KV_HW_E4M3X2)
        w[j] = (uint32_t)kv_hw_e4m3x2(v[4 * j], v[4 * j + 1]) | ((uint32_t)kv_hw_e4m3x2(v[4 * j + 2], v[4 * j + 3]) << 16);
#else
        w[j] = (uint32_t)kv_e4m3_from_f32(v[4 * j]) | ((uint32_t)kv_e4m3_from_f32(v[4 * j + 1]) << 8) |
               ((uint32_t)kv_e4m3_from_f32(v[4 * j + 2]) << 16) | ((uint32_t)kv_e4m3_from_f32(v[4 * j + 3]) << 24);
#endif
    }
}

// Value s of an NVFP4 tile scale code (1..0x7E) and f32(1 / s), without a
// branch: a subnormal code's m 2^-9 is (1 + m/8) 2^-6 - 2^-6, exactly.
KV_DEVICE void kv_nvfp4_scale(uint8_t code, float* s_out, float* y_out) {
    uint32_t e = (code >> 3) & 0xfu;
    uint32_t m = code & 7u;
    float v = kv_u2f((((e > 1u ? e : 1u) + 120u) << 23) | (m << 20));
    float s = e == 0u ? v - kv_u2f(0x3c800000u) : v;
    *s_out = s;
    *y_out = kv_divf(1.0f, s);
}

// e4m3 code of one non-NaN value; a prelude's hardware pair conversion is
// used when it exists (same bits, see kv_e4m3_words_from_f32_x16).
KV_DEVICE uint8_t kv_e4m3_from_f32_nonnan(float x) {
#if defined(KV_HW_E4M3X2)
    return (uint8_t)(kv_hw_e4m3x2(x, 0.0f) & 0xffu);
#else
    return kv_e4m3_from_f32(x);
#endif
}

// e2m1 magnitude code 0..7 of a non-negative q (NaN: 7): min(2q, q + 2,
// q/2 + 4) rounded to the nearest even integer, each line rounded once at
// unit spacing by adding 2^23. Returns the bits of 2^23 + code: the code is
// in the low three bits and bits 3..23 are zero.
KV_DEVICE uint32_t kv_e2m1_magnitude_bits(float q) {
    const float M = 8388608.0f;
    float c1 = kv_fmaf(q, 2.0f, M);
    float c2 = q + (M + 2.0f);
    float c3 = kv_fmaf(q, 0.5f, M + 4.0f);
    return kv_f2u(kv_fmin_nan_ignoring(kv_fmin_nan_ignoring(c1, c2), kv_fmin_nan_ignoring(c3, M + 7.0f)));
}

// ---- decoders (the reader, kv_gather.h) ----------------------------------

// e4m3fn -> f32, exact; 0x7F / 0xFF -> the quiet NaN. The code's exponent
// and mantissa under f32's are a number exactly 2^120 too small (a
// subnormal code lands on an f32 subnormal), so one exact multiplication
// finishes both kinds; the sign rides along (0x80 -> -0).
KV_DEVICE float kv_e4m3_to_f32(uint32_t c) {
    float v = kv_u2f(((c & 0x80u) << 24) | ((c & 0x7fu) << 20)) * kv_pow2(120);
    return (c & 0x7fu) == 0x7fu ? kv_u2f(0x7fc00000u) : v;
}

// e2m1 code (low 4 bits) -> f32, exact, the same construction 2^126 too small.
KV_DEVICE float kv_e2m1_to_f32(uint32_t c) {
    return kv_u2f(((c & 8u) << 28) | ((c & 7u) << 22)) * kv_pow2(126);
}

// UE8M0 -> 2^(b - 127): 1..254 are a normal f32's exponent bits, 0 is the
// subnormal 2^-127, 255 the quiet NaN.
KV_DEVICE float kv_ue8m0_to_f32(uint32_t b) {
    uint32_t bits = b == 0u ? 0x00400000u : (b << 23);
    return kv_u2f(b == 255u ? 0x7fc00000u : bits);
}

// The BF16 written for a BF16 value: itself, every NaN as 0x7FFF
// (= kv_bf16_from_f32(kv_bf16_to_f32(h))).
KV_DEVICE uint32_t kv_bf16_canonical(uint32_t h) { return (h & 0x7fffu) > 0x7f80u ? 0x7fffu : h; }

// kv_bf16_canonical of both halves of w (twin formats.rs bf16x2_canonical).
KV_DEVICE uint32_t kv_bf16x2_canonical(uint32_t w) {
    uint32_t m = ((((w & 0x7fff7fffu) + 0x007f007fu) & 0x80008000u) >> 15) * 0xffffu;
    return (w & ~m) | (0x7fff7fffu & m);
}

// The bits written for an F32 output: x itself, every NaN as 0x7FC00000.
KV_DEVICE uint32_t kv_f32_canonical(float x) {
    uint32_t b = kv_f2u(x);
    return (b & 0x7fffffffu) > 0x7f800000u ? 0x7fc00000u : b;
}

// ---- the reader's shortcuts (formats.rs proves them over their domains) --

// e4m3(c) * 2^(b - 127) for a non-NaN code and 3 <= b <= 134: exact, one
// multiplication by the normal 2^(b - 7), low 16 bits zero.
KV_DEVICE float kv_e4m3_scaled_pow2(uint32_t c, uint32_t b) {
    return kv_u2f(((c & 0x80u) << 24) | ((c & 0x7fu) << 20)) * kv_pow2((int)b - 7);
}

// e4m3(c) * 2^-120 exactly for a non-NaN code: its bits under f32's.
KV_DEVICE float kv_e4m3_bits_f32(uint32_t c) { return kv_u2f(((c & 0x80u) << 24) | ((c & 0x7fu) << 20)); }

// Products of two BF16 pairs where each product is a BF16 number (nothing
// rounds, so every correct multiplier gives these bits): a prelude's
// hardware pair multiplication (KV_HW_BF16X2_MUL) or two f32 ones.
KV_DEVICE uint32_t kv_bf16x2_mul_exact(uint32_t a, uint32_t b) {
#if defined(KV_HW_BF16X2_MUL)
    return kv_hw_bf16x2_mul(a, b);
#else
    float lo = kv_u2f(a << 16) * kv_u2f(b << 16);
    float hi = kv_u2f(a & 0xffff0000u) * kv_u2f(b & 0xffff0000u);
    return (kv_f2u(lo) >> 16) | (kv_f2u(hi) & 0xffff0000u);
#endif
}

// The low halves of a and b as one word (a's in bits 0..15), and the high
// halves: one byte permutation where a prelude has it (KV_HW_BYTE_PERM).
KV_DEVICE uint32_t kv_pack_lo16(uint32_t a, uint32_t b) {
#if defined(KV_HW_BYTE_PERM)
    return kv_hw_byte_perm(a, b, 0x5410u);
#else
    return (a & 0xffffu) | (b << 16);
#endif
}
KV_DEVICE uint32_t kv_pack_hi16(uint32_t a, uint32_t b) {
#if defined(KV_HW_BYTE_PERM)
    return kv_hw_byte_perm(a, b, 0x7632u);
#else
    return (a >> 16) | (b & 0xffff0000u);
#endif
}

// kv_e4m3_scaled_pow2 of the codes in bits 0..7 and 16..23 of p (its other
// bits ignored) as a BF16 pair: the codes' bits under BF16's are their
// values times 2^-120, and one exact pair multiplication by 2^(b - 7)
// finishes both (twin formats.rs e4m3x2_scaled_pow2_bf16x2).
KV_DEVICE uint32_t kv_e4m3x2_scaled_pow2_bf16x2(uint32_t p, uint32_t b) {
    uint32_t bits = ((p & 0x007f007fu) << 4) | ((p & 0x00800080u) << 8);
    uint32_t s = (b + 120u) << 7;
    return kv_bf16x2_mul_exact(bits, s | (s << 16));
}

// The rest of scale byte b's factor past 134 for a pair v of
// kv_e4m3x2_scaled_pow2_bf16x2 at min(b, 134): times 2^(max(b, 134) - 134),
// exact or infinite (twin formats.rs e4m3x2_scale_rest_bf16x2).
KV_DEVICE uint32_t kv_e4m3x2_scale_rest_bf16x2(uint32_t v, uint32_t b) {
    uint32_t s = ((b > 134u ? b : 134u) - 7u) << 7;
    return kv_bf16x2_mul_exact(v, s | (s << 16));
}

// The BF16 pair v of the products of the codes in bits 0..7 and 16..23 of
// p by scale byte b, with each half whose product is a NaN (a NaN code's,
// every one under b = 255) made the canonical NaN (twin formats.rs
// e4m3x2_nan_canonical).
KV_DEVICE uint32_t kv_e4m3x2_nan_canonical(uint32_t v, uint32_t p, uint32_t b) {
    uint32_t y = b == 255u ? 0x00800080u : ((p & 0x007f007fu) + 0x00010001u) & 0x00800080u;
    uint32_t m = (y >> 7) * 0xffffu;
    return (v & ~m) | (0x7fff7fffu & m);
}

// kv_e2m1_to_f32 of the codes in bits 0..3 and 16..19 of p (its other bits
// ignored), times an NVFP4 tile scale given as its BF16 in both halves of
// s2 (a non-NaN e4m3 code: every product is an exact BF16), as a BF16
// pair: the codes' bits under BF16's are their values times 2^-126, and
// two exact pair multiplications (by 2^126, by the scale) finish both.
KV_DEVICE uint32_t kv_e2m1x2_scaled_bf16x2(uint32_t p, uint32_t s2) {
    uint32_t bits = ((p & 0x00070007u) << 6) | ((p & 0x00080008u) << 12);
    return kv_bf16x2_mul_exact(kv_bf16x2_mul_exact(bits, 0x7e807e80u), s2);
}

// BF16 pair of any two values, kv_bf16_from_f32 of each (every NaN as
// 0x7FFF): a prelude's hardware pair conversion, which gives those bits on
// every input (the device's self-check, kv_check_hw_formats, runs all 2^32),
// or kv_bf16_from_f32 twice.
KV_DEVICE uint32_t kv_bf16x2_from_f32(float lo, float hi) {
#if defined(KV_HW_BF16X2)
    return kv_hw_bf16x2(lo, hi);
#else
    return (uint32_t)kv_bf16_from_f32(lo) | ((uint32_t)kv_bf16_from_f32(hi) << 16);
#endif
}

// kv_bf16x2_from_f32 of two values that are BF16 numbers or NaNs (nothing
// to round): the prelude's hardware pair conversion where it has one, else
// their top halves with every NaN made 0x7FFF (kv_bf16x2_canonical), a few
// integer operations instead of two roundings.
KV_DEVICE uint32_t kv_bf16x2_of_bf16_numbers(float lo, float hi) {
#if defined(KV_HW_BF16X2)
    return kv_hw_bf16x2(lo, hi);
#else
    return kv_bf16x2_canonical(kv_pack_hi16(kv_f2u(lo), kv_f2u(hi)));
#endif
}

// BF16 bits of N (even) values, kv_bf16_from_f32 of each: by pairs where the
// prelude has the hardware conversion (one instruction a pair against about
// seven a value on the bits), else one by one.
template <int N>
KV_DEVICE void kv_bf16xN_from_f32(const float v[N], uint16_t out[N]) {
#if defined(KV_HW_BF16X2)
#pragma unroll
    for (int j = 0; j < N; j += 2) {
        uint32_t two = kv_hw_bf16x2(v[j], v[j + 1]);
        out[j] = (uint16_t)(two & 0xffffu);
        out[j + 1] = (uint16_t)(two >> 16);
    }
#else
#pragma unroll
    for (int j = 0; j < N; ++j) out[j] = kv_bf16_from_f32(v[j]);
#endif
}

KV_DEVICE void kv_bf16x16_from_f32(const float v[16], uint16_t out[16]) { kv_bf16xN_from_f32<16>(v, out); }

// Whether a byte of w is an e4m3 NaN: a zero byte of ~w & 0x7F7F7F7F.
KV_DEVICE bool kv_e4m3_nan_in_word(uint32_t w) {
    uint32_t v = ~w & 0x7f7f7f7fu;
    return ((v - 0x01010101u) & 0x80808080u) != 0u;
}

// Whether a BF16 half of w is a NaN (magnitude above 0x7F80).
KV_DEVICE bool kv_bf16_nan_in_word(uint32_t w) { return (((w & 0x7fff7fffu) + 0x007f007fu) & 0x80008000u) != 0u; }
