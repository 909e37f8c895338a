// Bit-exact number formats, device side. Twin of src/formats.rs: every
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

// e4m3 codes of 16 non-NaN values. A prelude may supply a hardware pair
// conversion (KV_HW_E4M3X2) that rounds and saturates exactly like
// kv_e4m3_from_f32 on non-NaN inputs; the parity tests hold it to that.
KV_DEVICE void kv_e4m3_from_f32_x16(const float v[16], uint8_t out[16]) {
#if defined(KV_HW_E4M3X2)
#pragma unroll
    for (int j = 0; j < 16; j += 2) {
        uint16_t two = kv_hw_e4m3x2(v[j], v[j + 1]);
        out[j] = (uint8_t)(two & 0xffu);
        out[j + 1] = (uint8_t)(two >> 8);
    }
#else
#pragma unroll
    for (int j = 0; j < 16; ++j) out[j] = kv_e4m3_from_f32(v[j]);
#endif
}

// e4m3fn -> f32 for the finite, positive codes the kernels decode (NVFP4 tile
// scales): exact.
KV_DEVICE float kv_e4m3_to_f32(uint8_t c) {
    uint32_t e = (c >> 3) & 0xfu;
    uint32_t m = c & 7u;
    float sign = (c & 0x80u) ? -1.0f : 1.0f;
    if (e == 0) return sign * (float)m * (1.0f / 512.0f);
    // (8 + m) * 2^(e - 10), built exactly from the bits.
    return sign * kv_u2f(((e + 120u) << 23) | (m << 20));
}

// f32(1 / v) for a positive, finite, non-zero e4m3 code (1..0x7E): table of
// mantissa reciprocals times an exact power of two (see formats::e4m3_recip).
// Selects, not a switch or an array: each lane holds its own tile's code, so
// a switch diverges and an array indexed at run time lands in local memory.
KV_DEVICE float kv_e4m3_recip(uint8_t code) {
    uint32_t e = (code >> 3) & 0xfu;
    uint32_t m = code & 7u;
    // 1 / ((8 + m) / 8) for the normal codes.
    uint32_t n = 0x3f800000u;
    n = m == 1u ? 0x3f638e39u : n;
    n = m == 2u ? 0x3f4ccccdu : n;
    n = m == 3u ? 0x3f3a2e8cu : n;
    n = m == 4u ? 0x3f2aaaabu : n;
    n = m == 5u ? 0x3f1d89d9u : n;
    n = m == 6u ? 0x3f124925u : n;
    n = m == 7u ? 0x3f088889u : n;
    // 1 / m for the subnormal codes (m * 2^-9); m = 0 is not a scale.
    uint32_t d = 0x3f800000u;
    d = m == 2u ? 0x3f000000u : d;
    d = m == 3u ? 0x3eaaaaabu : d;
    d = m == 4u ? 0x3e800000u : d;
    d = m == 5u ? 0x3e4ccccdu : d;
    d = m == 6u ? 0x3e2aaaabu : d;
    d = m == 7u ? 0x3e124925u : d;
    return e == 0u ? kv_u2f(d) * 512.0f : kv_u2f(n) * kv_pow2(7 - (int)e);
}

// e4m3 code of one non-NaN value; a prelude's hardware pair conversion is
// used when it exists (same bits, see kv_e4m3_from_f32_x16).
KV_DEVICE uint8_t kv_e4m3_from_f32_nonnan(float x) {
#if defined(KV_HW_E4M3X2)
    return (uint8_t)(kv_hw_e4m3x2(x, 0.0f) & 0xffu);
#else
    return kv_e4m3_from_f32(x);
#endif
}

// FP4 e2m1 code: magnitudes 0,.5,1,1.5,2,3,4,6 -> 0..7, ties to the even
// code, saturating; bit 3 = sign of q; NaN -> 0.
KV_DEVICE uint8_t kv_e2m1_from_f32(float q) {
    uint32_t sign = (kv_f2u(q) >> 28) & 8u;
    float m = kv_fabsf(q);
    // Below 1 the grid is 0, .5, 1: the code is 2m rounded to an integer
    // (ties to even), read off 2^23 + 2m. From 1 up the codes follow the f32
    // bits: exponent and top mantissa bit, rounded to nearest even on the
    // rest, minus 1.0's bits; then saturated at 7.
    // (2m is exact below 1, so the fma's single rounding is that of the
    // twin's m * 2 + 2^23; above 1 the value is unused.)
    uint32_t sub = kv_f2u(kv_fmaf(m, 2.0f, 8388608.0f)) - 0x4b000000u;
    uint32_t b = kv_f2u(m);
    uint32_t nrm = ((b + 0x1fffffu + ((b >> 22) & 1u)) >> 22) - 252u;
    nrm = nrm < 7u ? nrm : 7u;
    uint32_t code = m < 1.0f ? sub : nrm;
    // A NaN fails the compare and takes the normal branch; it gets code 0 and
    // loses its sign.
    return (uint8_t)((q != q) ? 0u : (sign | code));
}
