//! Bit-exact number formats: BF16, F16 (decoded only), FP8 e4m3fn, FP4 e2m1
//! and UE8M0.
//!
//! Every encoder and decoder here has a line-by-line twin in
//! `kernels-hip/kv_formats.h` (`bf16_from_f32` ↔ `kv_bf16_from_f32`, and so
//! on). They are written with integer operations on the IEEE bits so that
//! no platform conversion instruction (whose NaN and saturation rules differ
//! between vendors) is involved.

/// f32 → BF16 bits, round to nearest even. Overflow rounds to ±infinity.
///
/// Every NaN becomes `0x7FFF`, the canonical NaN that NVIDIA's
/// `cvt.rn.bf16.f32` writes, so a record never depends on a NaN's payload
/// (which arithmetic does not preserve the same way on every vendor).
/// `half::bf16::from_f32` differs only there: it keeps the sign and payload.
#[inline]
pub fn bf16_from_f32(x: f32) -> u16 {
    let b = x.to_bits();
    if (b & 0x7fff_ffff) > 0x7f80_0000 {
        return 0x7fff;
    }
    let lsb = (b >> 16) & 1;
    (b.wrapping_add(0x7fff + lsb) >> 16) as u16
}

/// BF16 bits → f32 (exact).
#[inline]
pub fn bf16_to_f32(h: u16) -> f32 {
    f32::from_bits((h as u32) << 16)
}

/// IEEE binary16 bits → f32 (exact; twin `kv_f16_to_f32`), as torch's
/// `.to(float32)` widens an F16 weight or cos/sin table. Normal codes move
/// their exponent by the bias difference (112), subnormals are their integer
/// significand times 2^-24 (exact, and a normal f32, so no platform's
/// denormal mode is involved), infinities and NaNs keep their payload bits.
#[inline]
pub fn f16_to_f32(h: u16) -> f32 {
    let mag = (h & 0x7fff) as u32;
    let sign = ((h & 0x8000) as u32) << 16;
    let bits = if mag >= 0x7c00 {
        (mag << 13) | 0x7f80_0000
    } else if mag >= 0x0400 {
        (mag << 13) + (112 << 23)
    } else {
        (mag as f32 * F16_SUBNORMAL_STEP).to_bits()
    };
    f32::from_bits(bits | sign)
}

/// The value of F16's smallest subnormal, 2^-24.
const F16_SUBNORMAL_STEP: f32 = 1.0 / 16_777_216.0;

/// Largest finite e4m3fn magnitude.
pub const E4M3_MAX: f32 = 448.0;

/// f32 → FP8 e4m3fn (OCP "fn": no infinities, `S.1111.111` is NaN), round to
/// nearest even, saturating: every magnitude at or above 448 (infinity
/// included) gives ±448, as `cvt.rn.satfinite` does. A NaN gives `0x7F`.
/// Subnormals (steps of 2^-9) are produced, never flushed.
#[inline]
pub fn e4m3_from_f32(x: f32) -> u8 {
    let b = x.to_bits();
    let sign = ((b >> 24) & 0x80) as u8;
    let a = b & 0x7fff_ffff;
    if a > 0x7f80_0000 {
        return 0x7f;
    }
    if a >= 0x43e0_0000 {
        // |x| >= 448: 448 itself, ties at 464 round to the even 448, above saturate.
        return sign | 0x7e;
    }
    if a < 0x3c80_0000 {
        // |x| < 2^-6: subnormal e4m3, a multiple of 2^-9 (code 8 is 2^-6, the
        // smallest normal, which the carry produces naturally).
        return sign | e4m3_subnormal_code(a);
    }
    // Normal: keep 3 of the 23 mantissa bits, round to nearest even; a carry
    // out of the mantissa correctly bumps the exponent.
    let exp = (a >> 23) as i32 - 127 + 7;
    let man = a & 0x7f_ffff;
    let keep = man >> 20;
    let rem = man & 0xf_ffff;
    let up = (rem > 0x8_0000 || (rem == 0x8_0000 && (keep & 1) == 1)) as u32;
    sign | (((exp as u32) << 3) + keep + up) as u8
}

/// `|x| * 2^9` rounded to nearest even, for `|x| < 2^-6` given as abs bits:
/// the e4m3 subnormal code (0..=8).
#[inline]
fn e4m3_subnormal_code(a: u32) -> u8 {
    // Value = 1.m * 2^(E-127) for normal f32 (or 0.m * 2^-126). Scaled by 2^9,
    // the integer part sits (127 - 9 - E + 23) bits down in the significand.
    let e = (a >> 23) as i32;
    let sig = if e == 0 {
        a & 0x7f_ffff
    } else {
        (a & 0x7f_ffff) | 0x80_0000
    };
    let e_eff = if e == 0 { 1 } else { e };
    // value * 2^9 = sig * 2^(e_eff - 127 - 23 + 9) = sig >> shift
    let shift = (127 + 23 - 9 - e_eff) as u32; // >= 21 because |x| < 2^-6
    if shift >= 32 {
        return 0; // far below half of 2^-9
    }
    let q = sig >> shift;
    let rem = sig & ((1u32 << shift) - 1);
    let half = 1u32 << (shift - 1);
    let up = (rem > half || (rem == half && (q & 1) == 1)) as u32;
    (q + up) as u8
}

/// FP8 e4m3fn → f32 (exact). `0x7F` and `0xFF` are NaN (`f32::NAN`).
///
/// Built from the bits, as `kv_e4m3_to_f32` does: the code's exponent and
/// mantissa moved under f32's read as a number exactly 2^120 too small (a
/// subnormal code lands on an f32 subnormal, so both kinds share the
/// formula), then one exact multiplication by 2^120. The sign rides along,
/// so `0x80` gives `-0.0`.
#[inline]
pub fn e4m3_to_f32(c: u8) -> f32 {
    let c = c as u32;
    if c & 0x7f == 0x7f {
        return f32::NAN;
    }
    f32::from_bits(((c & 0x80) << 24) | ((c & 0x7f) << 20)) * pow2(120)
}

/// The value `s` of an NVFP4 tile scale code (a positive, finite, non-zero
/// e4m3 code, 1..=0x7E) and `f32(1 / s)`, as `kv_nvfp4_scale` computes them:
/// the value without a branch (a subnormal code's `m 2^-9` is
/// `(1 + m/8) 2^-6 - 2^-6`, an exact difference, so both kinds share one
/// formula), the reciprocal by one correctly rounded division per tile.
#[inline]
pub fn nvfp4_scale(code: u8) -> (f32, f32) {
    let e = ((code >> 3) & 0xf) as u32;
    let m = (code & 7) as u32;
    let v = f32::from_bits(((e.max(1) + 120) << 23) | (m << 20));
    let s = if e == 0 {
        v - f32::from_bits(0x3c80_0000)
    } else {
        v
    };
    (s, 1.0 / s)
}

/// `min` that ignores a NaN operand (NVIDIA `min.f32`): NaN only if both are.
#[inline]
pub fn min_nan_ignoring(a: f32, b: f32) -> f32 {
    if b < a || a.is_nan() {
        b
    } else {
        a
    }
}

/// The e2m1 magnitude nearest a non-negative `q` (ties to the even code,
/// saturating at 6; a NaN gives code 7), as the bits of `2^23 + code`: the code
/// 0..=7 is in the low three bits, bits 3..=22 are zero. The grid `0, .5, 1,
/// 1.5, 2, 3, 4, 6` is where `min(2q, q + 2, q/2 + 4)` takes the integers
/// 0..=6, and that concave function crosses half-integers exactly at the
/// grid's midpoints, so the code is it rounded to the nearest even integer.
/// Each line is rounded once by adding 2^23 (exact multiplications by 2 and
/// 1/2, then one rounding at unit spacing); rounding commutes with `min`.
#[inline]
pub fn e2m1_magnitude_bits(q: f32) -> u32 {
    const M: f32 = 8_388_608.0;
    let c1 = q.mul_add(2.0, M);
    let c2 = q + (M + 2.0);
    let c3 = q.mul_add(0.5, M + 4.0);
    min_nan_ignoring(min_nan_ignoring(c1, c2), min_nan_ignoring(c3, M + 7.0)).to_bits()
}

/// FP4 e2m1 code of `q`: magnitudes `0, .5, 1, 1.5, 2, 3, 4, 6` are codes
/// 0..=7, rounding to nearest with ties to the even code, saturating at 6
/// (infinity included); bit 3 is the sign of `q`, so `-0.0` (and anything
/// that rounds to a negative zero) gives 8. A NaN gives code 0.
#[inline]
pub fn e2m1_from_f32(q: f32) -> u8 {
    if q.is_nan() {
        return 0;
    }
    let sign = (q.to_bits() >> 28) & 8;
    (sign | (e2m1_magnitude_bits(q.abs()) & 7)) as u8
}

/// FP4 e2m1 code (low 4 bits) → f32 (exact; code 8 is `-0.0`).
///
/// As [`e4m3_to_f32`], from the bits (twin `kv_e2m1_to_f32`): the two
/// exponent bits and the mantissa bit moved under f32's are a number 2^126
/// too small (codes 0 and 1 an f32 subnormal), then one exact
/// multiplication.
#[inline]
pub fn e2m1_to_f32(c: u8) -> f32 {
    let c = c as u32;
    f32::from_bits(((c & 8) << 28) | ((c & 7) << 22)) * pow2(126)
}

/// UE8M0 scale byte → f32: `2^(b - 127)`; 255 is NaN (`f32::NAN`).
///
/// Bytes 1..=254 are the exponent bits of a normal f32, byte 0 is the
/// subnormal 2^-127 (twin `kv_ue8m0_to_f32`).
#[inline]
pub fn ue8m0_to_f32(b: u8) -> f32 {
    match b {
        0 => f32::from_bits(0x0040_0000),
        255 => f32::NAN,
        _ => f32::from_bits((b as u32) << 23),
    }
}

/// The BF16 that the reader writes for a BF16 value `h`:
/// `bf16_from_f32(bf16_to_f32(h))`, i.e. `h` itself, or `0x7FFF` for every
/// NaN (twin `kv_bf16_canonical`).
#[inline]
pub fn bf16_canonical(h: u16) -> u16 {
    if h & 0x7fff > 0x7f80 {
        0x7fff
    } else {
        h
    }
}

/// [`bf16_canonical`] of both halves of `w` at once: a half's magnitude
/// plus `0x7F` reaches bit 15 exactly when it is a NaN, and that bit times
/// `0xFFFF` masks the half (twin `kv_bf16x2_canonical`).
#[inline]
pub fn bf16x2_canonical(w: u32) -> u32 {
    let nan = (((w & 0x7fff_7fff) + 0x007f_007f) & 0x8000_8000) >> 15;
    let m = nan * 0xffff;
    (w & !m) | (0x7fff_7fff & m)
}

/// The bits the reader writes for an F32 output value `x`: `x` itself, or
/// `0x7FC0_0000` (`f32::NAN`, the library's quiet NaN) for every NaN, so
/// that no output depends on how a vendor's arithmetic propagates a NaN's
/// sign and payload (twin `kv_f32_canonical`).
#[inline]
pub fn f32_canonical(x: f32) -> u32 {
    let b = x.to_bits();
    if b & 0x7fff_ffff > 0x7f80_0000 {
        0x7fc0_0000
    } else {
        b
    }
}

// ---- the reader's shortcuts (kernels-hip/kv_gather.h) -------------------
//
// The reader's values are defined by the decoders above and one BF16
// rounding (`bf16_from_f32`). Where a product is exact and its low 16 bits
// are zero, that rounding is the upper half of the f32, and the kernels
// take these shortcuts; `tests` below prove them equal to the definition
// over their whole domains.

/// `e4m3_to_f32(c) × ue8m0_to_f32(b)` for a non-NaN code `c` and
/// `3 <= b <= 134`, by one multiplication: the code's bits under f32's
/// (as in [`e4m3_to_f32`]) times `2^(b - 7)`, a normal power of two for those
/// `b`. The product is exact (at most four significant bits, no overflow)
/// and, since `b >= 3`, a multiple of `2^-133`: its low 16 bits are zero
/// (twin `kv_e4m3_scaled_pow2`).
#[inline]
pub fn e4m3_scaled_pow2(c: u8, b: u8) -> f32 {
    let c = c as u32;
    f32::from_bits(((c & 0x80) << 24) | ((c & 0x7f) << 20)) * pow2(b as i32 - 7)
}

/// The f32 whose sign, exponent and mantissa bits are those of e4m3 code
/// `c` shifted under f32's: `e4m3(c) × 2^-120` exactly for a non-NaN code
/// (a subnormal code lands on an f32 subnormal), the first step of
/// [`e4m3_to_f32`] (twin `kv_e4m3_bits_f32`).
#[inline]
pub fn e4m3_bits_f32(c: u8) -> f32 {
    let c = c as u32;
    f32::from_bits(((c & 0x80) << 24) | ((c & 0x7f) << 20))
}

/// The products of two BF16 pairs (low and high halves of `a` and `b`)
/// where each product is a BF16 number, so nothing rounds and every
/// correct multiplier gives these bits: here two f32 multiplications of
/// the widened halves (twin `kv_bf16x2_mul_exact`, which a prelude may
/// give a hardware pair multiplication).
#[inline]
pub fn bf16x2_mul_exact(a: u32, b: u32) -> u32 {
    let lo = f32::from_bits(a << 16) * f32::from_bits(b << 16);
    let hi = f32::from_bits(a & 0xffff_0000) * f32::from_bits(b & 0xffff_0000);
    (lo.to_bits() >> 16) | (hi.to_bits() & 0xffff_0000)
}

/// BF16 `fma(a, b, c)` rounded once to nearest even, as `fma.rn.bf16x2`
/// computes each half (subnormals kept, overflow to infinity, a NaN result
/// the canonical `0x7FFF`).
///
/// The product of two BF16 is exact in f64 (16 significant bits); the sum
/// with `c` is rounded to f64 and its error recovered exactly (Knuth's
/// two-sum), which decides a sum that lands on a BF16 midpoint.
#[inline]
pub fn bf16_fma(a: u16, b: u16, c: u16) -> u16 {
    let p = bf16_to_f32(a) as f64 * bf16_to_f32(b) as f64;
    let c = bf16_to_f32(c) as f64;
    let s = p + c;
    if !s.is_finite() {
        return if s.is_nan() {
            0x7fff
        } else {
            bf16_from_f32(s as f32)
        };
    }
    let bb = s - p;
    let err = (p - (s - bb)) + (c - bb);
    bf16_round(s, err)
}

/// BF16 nearest-even rounding of the real `s + err`, `s` a finite f64 and
/// `|err|` at most half an ulp of `s`.
fn bf16_round(s: f64, err: f64) -> u16 {
    let sign = if s.is_sign_negative() { 0x8000u16 } else { 0 };
    let a = s.abs();
    // Towards larger magnitude where err points away from zero.
    let err = if s < 0.0 { -err } else { err };
    if a == 0.0 {
        return bf16_from_f32(s as f32);
    }
    let e = ((a.to_bits() >> 52) as i32 - 1023).max(-126);
    let ulp = 2f64.powi(e - 7);
    let n = a / ulp;
    let fl = n.floor();
    let frac = n - fl;
    let up = frac > 0.5 || (frac == 0.5 && (err > 0.0 || (err == 0.0 && fl % 2.0 == 1.0)));
    let r = (if up { fl + 1.0 } else { fl }) * ulp;
    sign | (((r as f32).to_bits() >> 16) as u16)
}

/// [`bf16_fma`] on both halves of three BF16 pairs.
#[inline]
pub fn bf16x2_fma(a: u32, b: u32, c: u32) -> u32 {
    let lo = bf16_fma(a as u16, b as u16, c as u16) as u32;
    let hi = bf16_fma((a >> 16) as u16, (b >> 16) as u16, (c >> 16) as u16) as u32;
    lo | (hi << 16)
}

/// NaN-ignoring minimum (`MAX = false`) or maximum of two BF16, as
/// `min.bf16x2` and `max.bf16x2` give each half: the non-NaN operand where
/// one is NaN, `0x7FFF` where both are; never called with `+0` against `-0`.
fn bf16_min_max<const MAX: bool>(a: u16, b: u16) -> u16 {
    let (x, y) = (bf16_to_f32(a), bf16_to_f32(b));
    match (x.is_nan(), y.is_nan()) {
        (true, true) => 0x7fff,
        (true, false) => b,
        (false, true) => a,
        _ => {
            if (y > x) == MAX && y != x {
                b
            } else {
                a
            }
        }
    }
}

/// NaN-ignoring minimum on both halves (`min.bf16x2`; see `bf16_min_max`).
#[inline]
pub fn bf16x2_min(a: u32, b: u32) -> u32 {
    let lo = bf16_min_max::<false>(a as u16, b as u16) as u32;
    lo | ((bf16_min_max::<false>((a >> 16) as u16, (b >> 16) as u16) as u32) << 16)
}

/// NaN-ignoring maximum on both halves (`max.bf16x2`; see `bf16_min_max`).
#[inline]
pub fn bf16x2_max(a: u32, b: u32) -> u32 {
    let lo = bf16_min_max::<true>(a as u16, b as u16) as u32;
    lo | ((bf16_min_max::<true>((a >> 16) as u16, (b >> 16) as u16) as u32) << 16)
}

/// Unsigned minimum of each 16-bit half (`min.u16x2`).
#[inline]
pub fn u16x2_min(a: u32, b: u32) -> u32 {
    (a & 0xffff).min(b & 0xffff) | (a & 0xffff_0000).min(b & 0xffff_0000)
}

/// Byte permutation of `b:a` (bytes 0..4 of `a`, 4..8 of `b`) as PTX's
/// `prmt.b32` in its default mode: result byte `i` is the byte that bits
/// `4i..4i+3` of `s` select, or, where bit `4i + 3` is set, that byte's top
/// bit copied over all eight.
#[inline]
pub fn byte_perm(a: u32, b: u32, s: u32) -> u32 {
    let src = ((b as u64) << 32) | a as u64;
    (0..4).fold(0u32, |w, i| {
        let n = (s >> (4 * i)) & 0xf;
        let byte = ((src >> (8 * (n & 7))) & 0xff) as u32;
        let byte = if n & 8 != 0 { 0xff * (byte >> 7) } else { byte };
        w | (byte << (8 * i))
    })
}

/// [`e4m3_scaled_pow2`] of two codes at once, as a BF16 pair: `p` holds a
/// code in bits 0..8 and one in bits 16..24 (neither NaN; the other bits
/// are ignored), `3 <= b <= 134`.
/// Each code's bits under BF16's (BF16 has f32's exponent) are its value
/// times `2^-120`, so one exact pair multiplication by `2^(b - 7)` gives
/// both products (twin `kv_e4m3x2_scaled_pow2_bf16x2`).
#[inline]
pub fn e4m3x2_scaled_pow2_bf16x2(p: u32, b: u8) -> u32 {
    let bits = ((p & 0x007f_007f) << 4) | ((p & 0x0080_0080) << 8);
    let s = (b as u32 + 120) << 7;
    bf16x2_mul_exact(bits, s | (s << 16))
}

/// The rest of scale byte `b`'s factor past [`e4m3x2_scaled_pow2_bf16x2`]'s
/// 134, for a pair `v` that function gave for `min(b, 134)`: one more pair
/// multiplication by `2^(max(b, 134) - 134)`, 1 for `b <= 134`. Its
/// products are exact or, past BF16's range as past f32's, infinite, so
/// the two give `e4m3_to_f32(c) × ue8m0_to_f32(b)` for every non-NaN code
/// and `3 <= b <= 254` (twin `kv_e4m3x2_scale_rest_bf16x2`).
#[inline]
pub fn e4m3x2_scale_rest_bf16x2(v: u32, b: u8) -> u32 {
    let s = (b.max(134) as u32 - 7) << 7;
    bf16x2_mul_exact(v, s | (s << 16))
}

/// The BF16 pair `v` of two e4m3 codes' products by UE8M0 scale `b`
/// (codes in bits 0..8 and 16..24 of `p`, the other bits ignored), with
/// each half whose product is a NaN, a NaN code's or every one under
/// `b = 255`, made the canonical NaN (twin `kv_e4m3x2_nan_canonical`).
#[inline]
pub fn e4m3x2_nan_canonical(v: u32, p: u32, b: u8) -> u32 {
    // Bit 7 of a half is set where its code's low seven bits are all ones.
    let y = if b == 255 {
        0x0080_0080
    } else {
        ((p & 0x007f_007f) + 0x0001_0001) & 0x0080_0080
    };
    let m = (y >> 7) * 0xffff;
    (v & !m) | (0x7fff_7fff & m)
}

/// `e2m1_to_f32(c) × s` for two codes at once, as a BF16 pair: `p` holds a
/// code in bits 0..4 and one in bits 16..20 (the other bits are ignored),
/// `s2` an NVFP4 tile scale's BF16 (a non-NaN e4m3 code, whose products
/// with every code are exact BF16 numbers) in both halves. Each code's
/// bits under BF16's are its value times `2^-126`; two exact pair
/// multiplications, by `2^126` and by the scale, finish both (twin
/// `kv_e2m1x2_scaled_bf16x2`).
#[inline]
pub fn e2m1x2_scaled_bf16x2(p: u32, s2: u32) -> u32 {
    let bits = ((p & 0x0007_0007) << 6) | ((p & 0x0008_0008) << 12);
    bf16x2_mul_exact(bf16x2_mul_exact(bits, 0x7e80_7e80), s2)
}

/// The multiplier that turns [`e4m3_bits_f32`] into `e4m3_to_f32(c) × s`
/// with one rounding: `s × 2^120`, exact for a finite `|s| < 2^8` (else
/// `None`). The product of two f32 rounds the exact real `e4m3(c) × s`
/// once, as `e4m3_to_f32(c) * s` does (twin `kv_fp8_rows_multiplier`).
#[inline]
pub fn fp8_rows_multiplier(s: f32) -> Option<f32> {
    (s.abs() < 256.0).then(|| s * pow2(120))
}

/// Whether one of the four bytes of `w` is an e4m3 NaN (`0x7F` or `0xFF`):
/// the NaN bytes are the zero bytes of `!w & 0x7F7F7F7F`, and with every
/// byte below `0x80` a zero byte is the one that borrows into its bit 7
/// (twin `kv_e4m3_nan_in_word`).
#[inline]
pub fn e4m3_nan_in_word(w: u32) -> bool {
    let v = !w & 0x7f7f_7f7f;
    v.wrapping_sub(0x0101_0101) & 0x8080_8080 != 0
}

/// Whether one of the two BF16 halves of `w` is a NaN: a half's magnitude
/// plus `0x7F` reaches bit 15 exactly when it is above `0x7F80`, and cannot
/// carry into the other half (twin `kv_bf16_nan_in_word`).
#[inline]
pub fn bf16_nan_in_word(w: u32) -> bool {
    ((w & 0x7fff_7fff) + 0x007f_007f) & 0x8000_8000 != 0
}

/// `2^e` for `-126 <= e <= 127`, built from the exponent bits.
#[inline]
pub fn pow2(e: i32) -> f32 {
    debug_assert!((-126..=127).contains(&e));
    f32::from_bits(((e + 127) as u32) << 23)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bf16_known_values() {
        assert_eq!(bf16_from_f32(1.0), 0x3f80);
        assert_eq!(bf16_from_f32(-0.0), 0x8000);
        // 1 + 2^-8 is a tie between 1 and 1 + 2^-7: even mantissa wins.
        assert_eq!(bf16_from_f32(1.0 + 1.0 / 256.0), 0x3f80);
        assert_eq!(bf16_from_f32(1.0 + 3.0 / 256.0), 0x3f82);
        assert_eq!(bf16_from_f32(f32::MAX), 0x7f80);
        assert_eq!(bf16_from_f32(f32::NAN), 0x7fff);
        assert_eq!(bf16_from_f32(f32::from_bits(0xffc0_0001)), 0x7fff);
    }

    #[test]
    fn f16_known_values() {
        assert_eq!(f16_to_f32(0x3c00), 1.0);
        assert_eq!(f16_to_f32(0xc000), -2.0);
        assert_eq!(f16_to_f32(0x7bff), 65504.0);
        assert_eq!(f16_to_f32(0x0001), 2.0f32.powi(-24));
        assert_eq!(f16_to_f32(0x03ff), 1023.0 * 2.0f32.powi(-24));
        assert_eq!(f16_to_f32(0x0400), 2.0f32.powi(-14));
        assert_eq!(f16_to_f32(0x8000).to_bits(), 0x8000_0000);
        assert_eq!(f16_to_f32(0x7c00), f32::INFINITY);
        assert_eq!(f16_to_f32(0xfc00), f32::NEG_INFINITY);
        assert_eq!(f16_to_f32(0x7e00).to_bits(), 0x7fc0_0000);
        assert_eq!(f16_to_f32(0xfc01).to_bits(), 0xff80_2000);
    }

    #[test]
    fn e4m3_known_values() {
        assert_eq!(e4m3_from_f32(448.0), 0x7e);
        assert_eq!(e4m3_from_f32(-448.0), 0xfe);
        assert_eq!(e4m3_from_f32(464.0), 0x7e);
        assert_eq!(e4m3_from_f32(1e9), 0x7e);
        assert_eq!(e4m3_from_f32(f32::INFINITY), 0x7e);
        assert_eq!(e4m3_from_f32(f32::NEG_INFINITY), 0xfe);
        assert_eq!(e4m3_from_f32(f32::NAN), 0x7f);
        assert_eq!(e4m3_from_f32(1.0), 0x38);
        assert_eq!(e4m3_from_f32(-0.0), 0x80);
        assert_eq!(e4m3_from_f32(1.0 / 512.0), 0x01);
        // Half of the smallest subnormal is a tie with zero: goes to 0.
        assert_eq!(e4m3_from_f32(1.0 / 1024.0), 0x00);
        assert_eq!(e4m3_from_f32(3.0 / 1024.0), 0x02);
        assert_eq!(e4m3_from_f32(2.0f32.powi(-6)), 0x08);
        assert!(e4m3_to_f32(0x7f).is_nan());
        assert_eq!(e4m3_to_f32(0x7e), 448.0);
    }

    #[test]
    fn bf16_fma_rounds_the_exact_value_once() {
        // (1.5)(1 + 2^-7) = 1.5 + 2^-7 + 2^-8 lies halfway between two BF16;
        // a tiny addend, lost in the f64 sum, decides the direction.
        let (a, b) = (0x3fc0, 0x3f81);
        assert_eq!(bf16_fma(a, b, 0x0000), 0x3fc2, "tie to even");
        assert_eq!(bf16_fma(a, b, 0x0d80), 0x3fc2, "just above the tie");
        assert_eq!(bf16_fma(a, b, 0x8d80), 0x3fc1, "just below the tie");
        assert_eq!(bf16_fma(0x7f80, 0x3f80, 0xff80), 0x7fff, "inf - inf");
        assert_eq!(bf16_fma(0x7f7f, 0x4000, 0x0000), 0x7f80, "overflow");
        assert_eq!(
            bf16_fma(0x0001, 0x3f00, 0x0000),
            0x0000,
            "half the least subnormal, a tie to 0"
        );
        assert_eq!(
            bf16_fma(0x0003, 0x3f00, 0x0000),
            0x0002,
            "1.5 subnormal steps, a tie to even"
        );
        // Where the exact value is an f32, one rounding of that f32.
        let mut x = 0x1234_5678u32;
        for _ in 0..200_000 {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            let (a, b, c) = (x as u16, (x >> 16) as u16, (x >> 8) as u16 ^ 0x5a5a);
            let (p, cd) = (
                bf16_to_f32(a) as f64 * bf16_to_f32(b) as f64,
                bf16_to_f32(c) as f64,
            );
            // Within 2^30 of each other, the sum of a 16-bit and an 8-bit
            // number is exact in f64.
            let close = p == 0.0 || cd == 0.0 || (p / cd).abs().log2().abs() < 30.0;
            let exact = p + cd;
            if close && exact.is_finite() && (exact as f32) as f64 == exact {
                assert_eq!(
                    bf16_fma(a, b, c),
                    bf16_from_f32(exact as f32),
                    "{a:#06x} {b:#06x} {c:#06x}"
                );
            }
        }
    }

    #[test]
    fn byte_perm_selects_and_replicates_signs() {
        assert_eq!(byte_perm(0x4433_2211, 0x8877_6655, 0x7632), 0x8877_4433);
        assert_eq!(byte_perm(0x4433_2211, 0x8877_6655, 0x5410), 0x6655_2211);
        assert_eq!(byte_perm(0x0080_7f00, 0x8000_0000, 0xfbd9), 0xff00_0000);
        assert_eq!(byte_perm(0x8000_0080, 0x0080_8000, 0x9e8f), 0x00ff_ff00);
    }

    #[test]
    fn nvfp4_scale_is_the_value_and_its_rounded_reciprocal() {
        for code in 1u8..=0x7e {
            let v = e4m3_to_f32(code);
            let (s, y) = nvfp4_scale(code);
            assert_eq!(s.to_bits(), v.to_bits(), "code {code:#04x}");
            assert_eq!(y.to_bits(), (1.0 / v).to_bits(), "code {code:#04x}");
        }
    }

    /// The bit constructions give the values of the plain definitions
    /// (`sign × (1 + m/8) × 2^(e-7)`, `m × 2^-9` for subnormals), bit for bit.
    #[test]
    fn decoders_match_their_definitions() {
        for c in 0..=255u8 {
            let sign = if c & 0x80 != 0 { -1.0f64 } else { 1.0 };
            let (e, m) = (((c >> 3) & 0xf) as i32, (c & 7) as f64);
            let got = e4m3_to_f32(c);
            if c & 0x7f == 0x7f {
                assert_eq!(got.to_bits(), f32::NAN.to_bits());
                continue;
            }
            let want = if e == 0 {
                sign * m / 512.0
            } else {
                sign * (1.0 + m / 8.0) * 2f64.powi(e - 7)
            };
            assert_eq!(got.to_bits(), (want as f32).to_bits(), "e4m3 {c:#04x}");
        }
        const E2M1: [f32; 8] = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];
        for c in 0..=255u8 {
            let m = E2M1[(c & 7) as usize];
            let want = if c & 8 != 0 { -m } else { m };
            assert_eq!(e2m1_to_f32(c).to_bits(), want.to_bits(), "e2m1 {c:#04x}");
        }
        for b in 0..=254u8 {
            let want = 2f64.powi(b as i32 - 127) as f32;
            assert_eq!(ue8m0_to_f32(b).to_bits(), want.to_bits(), "ue8m0 {b}");
        }
        assert_eq!(ue8m0_to_f32(255).to_bits(), f32::NAN.to_bits());
    }

    /// FP8 rows: one multiplication of the code's bits by the folded
    /// multiplier rounds like the definition, for every code and scale.
    #[test]
    fn fp8_rows_multiplier_rounds_once() {
        let mut scales = vec![
            0.0f32,
            -0.0,
            f32::from_bits(1),
            f32::from_bits(0x8000_0001),
            f32::from_bits(0x007f_ffff),
            f32::MIN_POSITIVE,
            0.0125,
            1.0,
            -3.0e-3,
            255.99998,
            -255.99998,
            1.0e-30,
        ];
        let mut x = 0x9e37_79b9u32;
        while scales.len() < 2000 {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            let s = f32::from_bits(x);
            if s.abs() < 256.0 {
                scales.push(s);
            }
        }
        for s in scales {
            let m = fp8_rows_multiplier(s).expect("finite and below 256");
            for c in 0..=255u8 {
                if c & 0x7f == 0x7f {
                    continue;
                }
                let want = e4m3_to_f32(c) * s;
                let got = e4m3_bits_f32(c) * m;
                assert_eq!(got.to_bits(), want.to_bits(), "code {c:#04x} scale {s:e}");
            }
        }
        for s in [
            256.0f32,
            -256.0,
            1.0e30,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
        ] {
            assert_eq!(fp8_rows_multiplier(s), None, "{s}");
        }
    }

    /// The reader's shortcuts equal the definition over their domains.
    #[test]
    fn reader_shortcuts_are_exact() {
        for c in 0..=255u8 {
            if c & 0x7f == 0x7f {
                continue;
            }
            for b in 3..=134u8 {
                let want = e4m3_to_f32(c) * ue8m0_to_f32(b);
                let got = e4m3_scaled_pow2(c, b);
                assert_eq!(got.to_bits(), want.to_bits(), "code {c:#04x} scale {b}");
                assert_eq!(got.to_bits() & 0xffff, 0, "code {c:#04x} scale {b}");
                assert_eq!(bf16_from_f32(got), (got.to_bits() >> 16) as u16);
            }
        }
        // Pairs: every two codes at every scale from 3, the NaN ones made
        // canonical after (garbage bits above each code, which the
        // kernels' shifted words carry, ignored).
        for c0 in 0..=255u8 {
            for c1 in 0..=255u8 {
                let p = c0 as u32 | ((c1 as u32) << 16) | 0xa500_5a00;
                let nan = c0 & 0x7f == 0x7f || c1 & 0x7f == 0x7f;
                for b in 3..=255u8 {
                    let want = |c: u8| bf16_from_f32(e4m3_to_f32(c) * ue8m0_to_f32(b)) as u32;
                    let want = want(c0) | (want(c1) << 16);
                    let first = e4m3x2_scaled_pow2_bf16x2(p, b.min(134));
                    if !nan && b <= 134 {
                        assert_eq!(first, want, "codes {c0:#04x} {c1:#04x} scale {b}");
                    }
                    let got = e4m3x2_scale_rest_bf16x2(first, b);
                    if !nan && b < 255 {
                        assert_eq!(got, want, "codes {c0:#04x} {c1:#04x} scale {b}");
                    }
                    let got = e4m3x2_nan_canonical(got, p, b);
                    assert_eq!(got, want, "codes {c0:#04x} {c1:#04x} scale {b}, NaNs");
                }
            }
        }
        // NVFP4: every product of a code and a non-NaN scale is exact in BF16.
        for s in 0..=255u8 {
            if s & 0x7f == 0x7f {
                continue;
            }
            for c in 0..16u8 {
                let v = e2m1_to_f32(c) * e4m3_to_f32(s);
                assert_eq!(v.to_bits() & 0xffff, 0, "code {c} scale {s:#04x}");
                assert_eq!(bf16_from_f32(v), (v.to_bits() >> 16) as u16);
                assert_eq!(
                    f64::from(v),
                    f64::from(e2m1_to_f32(c)) * f64::from(e4m3_to_f32(s))
                );
            }
        }
        // NVFP4 pairs: every two codes at every non-NaN tile scale.
        for sc in 0..=255u8 {
            if sc & 0x7f == 0x7f {
                continue;
            }
            let s = e4m3_to_f32(sc).to_bits() >> 16;
            for c0 in 0..16u32 {
                for c1 in 0..16u32 {
                    let got = e2m1x2_scaled_bf16x2(c0 | (c1 << 16) | 0xfff0_fff0, s | (s << 16));
                    let want =
                        |c: u32| bf16_from_f32(e2m1_to_f32(c as u8) * e4m3_to_f32(sc)) as u32;
                    assert_eq!(
                        got,
                        want(c0) | (want(c1) << 16),
                        "codes {c0} {c1} scale {sc:#04x}"
                    );
                }
            }
        }
        for h in 0..=u16::MAX as u32 {
            for other in [0u32, 0x7f80, 0x7f81, 0x8000, 0xff80, 0xffff, 0x7fff, 0x3f80] {
                let want = |x: u32| bf16_canonical(x as u16) as u32;
                for w in [h | (other << 16), other | (h << 16)] {
                    let got = bf16x2_canonical(w);
                    assert_eq!(got, want(w & 0xffff) | (want(w >> 16) << 16), "{w:#010x}");
                }
            }
        }
        let nan_byte = |b: u32| b & 0x7f == 0x7f;
        for a in 0..=255u32 {
            for b in [0u32, 0x01, 0x7e, 0x7f, 0x80, 0xfe, 0xff] {
                for (i, j) in [(0, 1), (1, 2), (2, 3), (3, 0), (0, 3)] {
                    let w = (a << (8 * i)) | (b << (8 * j));
                    let want = (0..4).any(|k| nan_byte((w >> (8 * k)) & 0xff));
                    assert_eq!(e4m3_nan_in_word(w), want, "{w:#010x}");
                }
            }
        }
        for h in 0..=u16::MAX as u32 {
            for other in [0u32, 0x7f80, 0x7f81, 0x8000, 0xff80, 0xffff, 0x7fff] {
                for w in [h | (other << 16), other | (h << 16)] {
                    let want = [w & 0xffff, w >> 16]
                        .iter()
                        .any(|&x| bf16_to_f32(x as u16).is_nan());
                    assert_eq!(bf16_nan_in_word(w), want, "{w:#010x}");
                }
            }
        }
    }

    #[test]
    fn canonical_outputs() {
        for h in 0..=u16::MAX {
            assert_eq!(bf16_canonical(h), bf16_from_f32(bf16_to_f32(h)), "{h:#06x}");
        }
        assert_eq!(f32_canonical(-0.0), 0x8000_0000);
        assert_eq!(f32_canonical(f32::INFINITY), 0x7f80_0000);
        assert_eq!(f32_canonical(f32::from_bits(1)), 1);
        for nan in [0x7f80_0001u32, 0x7fff_ffff, 0xffc0_0000, 0xff80_0001] {
            assert_eq!(f32_canonical(f32::from_bits(nan)), 0x7fc0_0000);
        }
    }

    #[test]
    fn e2m1_known_values() {
        assert_eq!(e2m1_from_f32(-0.0), 8);
        assert_eq!(e2m1_from_f32(0.25), 0);
        assert_eq!(e2m1_from_f32(0.75), 2);
        assert_eq!(e2m1_from_f32(1.25), 2);
        assert_eq!(e2m1_from_f32(1.75), 4);
        assert_eq!(e2m1_from_f32(2.5), 4);
        assert_eq!(e2m1_from_f32(3.5), 6);
        assert_eq!(e2m1_from_f32(5.0), 6);
        assert_eq!(e2m1_from_f32(-5.0001), 15);
        assert_eq!(e2m1_from_f32(f32::NEG_INFINITY), 15);
        assert_eq!(e2m1_from_f32(f32::NAN), 0);
        assert_eq!(e2m1_from_f32(-f32::NAN), 0);
    }
}
