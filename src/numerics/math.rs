//! The math the operations share, written so that every backend computes the
//! same bits: plain IEEE binary32 operations rounded to nearest even, `fma`
//! only where written, no approximate instructions and no platform libm.
//!
//! Each function has a twin of the same name with a `kv_` prefix in
//! `kernels-hip/kv_math.h`; keep the two in step line by line.

use crate::formats::pow2;

/// `f32(1/448)`.
pub const INV_448: f32 = f32::from_bits(0x3b12_4925);
/// `f32(1/6)`.
pub const INV_6: f32 = f32::from_bits(0x3e2a_aaab);
/// `f32(1e-4)`, the floor of an FP8 block's absolute maximum.
pub const AMAX_FLOOR: f32 = f32::from_bits(0x38d1_b717);
/// `2^-9`, the smallest e4m3 subnormal: the floor of an NVFP4 tile scale.
pub const NVFP4_SCALE_MIN: f32 = f32::from_bits(0x3b00_0000);

const LOG2E: f32 = f32::from_bits(0x3fb8_aa3b);
const LN2_HI: f32 = f32::from_bits(0x3f31_7200);
const LN2_LO: f32 = f32::from_bits(0x35bf_be8e);
/// `1.5 * 2^23`: adding and subtracting it rounds to an integer, ties to even.
const ROUND_MAGIC: f32 = 12_582_912.0;

/// `e^x`, the one implementation every backend uses for the pooling weights.
///
/// Cody–Waite reduction `x = n ln2 + r` with `n` rounded to nearest even,
/// then a degree-7 Taylor polynomial on `|r| <= ln2 / 2` by Horner's rule in
/// `fma`, then scaling by `2^n` (in two steps below 2^-126 so that a subnormal
/// result is rounded once). Within 2 ulp of `exp` (tested against f64); NaN
/// in gives the canonical NaN out. The pooling needs it only for `x <= 0`
/// and NaN, where [`exp_nonpos`] (the kernels' `kv_exp_nonpos`) gives the
/// same bits.
#[inline]
pub fn exp(x: f32) -> f32 {
    if x.is_nan() {
        return f32::from_bits(0x7fc0_0000);
    }
    if x > 88.722_84 {
        return f32::INFINITY;
    }
    if x < -103.972_08 {
        return 0.0;
    }
    let (p, n) = exp_reduced(x);
    // 2^n in two exact steps when it leaves the normal range (a subnormal
    // result is then rounded once).
    if n < -126 {
        (p * pow2(n + 100)) * pow2(-100)
    } else if n > 127 {
        (p * pow2(n - 1)) * 2.0
    } else {
        p * pow2(n)
    }
}

/// `e^x = p 2^n` for `x` in exp's range: the Cody–Waite reduction and the
/// polynomial of [`exp`] (the kernels write it out in `kv_exp_nonpos`).
#[inline]
fn exp_reduced(x: f32) -> (f32, i32) {
    let t = x * LOG2E;
    let n = (t + ROUND_MAGIC) - ROUND_MAGIC;
    let r = n.mul_add(-LN2_HI, x);
    let r = n.mul_add(-LN2_LO, r);
    let mut p = f32::from_bits(0x3950_0d01); // 1/5040
    p = p.mul_add(r, f32::from_bits(0x3ab6_0b61)); // 1/720
    p = p.mul_add(r, f32::from_bits(0x3c08_8889)); // 1/120
    p = p.mul_add(r, f32::from_bits(0x3d2a_aaab)); // 1/24
    p = p.mul_add(r, f32::from_bits(0x3e2a_aaab)); // 1/6
    p = p.mul_add(r, 0.5);
    p = p.mul_add(r, 1.0);
    p = p.mul_add(r, 1.0);
    (p, n as i32)
}

/// [`exp`] for `x <= 0` or NaN, the argument of the pooling's one `exp`
/// ([`pool2_terms`]), with the same bits (tests/formats_exhaustive.rs runs
/// every such f32): the same operations without the overflow cases, and
/// without early returns, as the kernels run it (a lane pools several dims,
/// and their chains overlap only when no branch separates them).
#[inline]
pub fn exp_nonpos(x: f32) -> f32 {
    let in_range = x >= -103.972_08; // false for NaN
    let xr = if in_range { x } else { 0.0 };
    let (p, ni) = exp_reduced(xr);
    // 2^n in two exact steps below the normal range; 2^n <= 1 here.
    let lo = ni < -126;
    let e1 = if lo { ni + 100 } else { ni };
    let m2 = if lo { pow2(-100) } else { 1.0 };
    let y = (p * pow2(e1)) * m2;
    // Below the range +0, the quiet NaN for a NaN.
    let ob = if (x.to_bits() & 0x7fff_ffff) > 0x7f80_0000 {
        0x7fc0_0000
    } else {
        0
    };
    if in_range {
        y
    } else {
        f32::from_bits(ob)
    }
}

/// `max` that ignores a NaN operand (NVIDIA `max.f32`): NaN only if both are.
#[inline]
pub fn max_nan_ignoring(a: f32, b: f32) -> f32 {
    if b > a || a.is_nan() {
        b
    } else {
        a
    }
}

/// `min` that ignores a NaN operand (NVIDIA `min.f32`): NaN only if both
/// are. Defined beside the number formats, which round through it.
pub use crate::formats::min_nan_ignoring;

/// The FP8 clamp to `[-448, 448]` as the seed compiles it
/// (`min.xorsign.abs`): `copysign(min(|v|, 448), v)`, where a NaN (always the
/// canonical positive NaN after arithmetic on NVIDIA) becomes `+448`.
#[inline]
pub fn clamp_e4m3(v: f32) -> f32 {
    if v.is_nan() {
        return 448.0;
    }
    let m = if v.abs() < 448.0 { v.abs() } else { 448.0 };
    m.copysign(v)
}

/// [`clamp_e4m3`] reduced to what [`crate::formats::e4m3_from_f32`] leaves
/// undone: the encoder saturates on its own (from 448 up, infinities
/// included), so only a NaN needs replacing by `+448`. The kernels use this
/// (`kv_e4m3_nan_to_max`); `e4m3_from_f32(e4m3_nan_to_max(v)) ==
/// e4m3_from_f32(clamp_e4m3(v))` for every `v` (checked on all 2^32 inputs
/// in `tests/formats_exhaustive.rs`).
#[inline]
pub fn e4m3_nan_to_max(v: f32) -> f32 {
    if v.is_nan() {
        448.0
    } else {
        v
    }
}

/// Scale exponent of an FP8 block: `ceil(log2f(x))` where `log2f` rounds the
/// true `log2` to the nearest f32, for `x = f32(amax * f32(1/448))` (normal,
/// since `amax >= 1e-4`, or `+inf`). Returns `None` for an infinite `x`.
///
/// For `x = (1 + f) 2^k` with `f > 0`, the true log2 lies in `(k, k + 1)` and
/// its rounding is `k` exactly when `log2(1 + f)` is under half an ulp of `k`
/// (an f32 grid spacing of `2^(floor(log2|k|) - 23)`, halved below a negative
/// power of two): then the exponent is `k`, not `k + 1`. That happens for the
/// few mantissas `f = j 2^-23` with `j <= LOG2_ROUNDS_DOWN[q]`, where
/// `2^-q` is that half ulp; the table holds, per `q`, the largest `j` with
/// `log2(1 + j 2^-23) < 2^-q` (computed in exact arithmetic; see the test).
#[inline]
pub fn block_scale_exponent(x: f32) -> Option<i32> {
    let bits = x.to_bits();
    let biased = ((bits >> 23) & 0xff) as i32;
    let k = biased - 127;
    let f = bits & 0x7f_ffff;
    let ak = k.unsigned_abs();
    let fl = 31 - (ak | 1).leading_zeros() as i32; // floor(log2 |k|), 0..=6; k = 0 is decided below
    let q = if k < 0 && ak.is_power_of_two() {
        25 - fl
    } else {
        24 - fl
    };
    let e = if f <= log2_rounds_down(q) { k } else { k + 1 };
    let e = if k == 0 { 1 } else { e };
    let e = if f == 0 { k } else { e };
    (biased != 0xff).then_some(e)
}

/// [`LOG2_ROUNDS_DOWN`]`[q]` as the kernels compute it: `22 >> (q - 18)`.
/// For an infinite `x` (`q` = 17, result unused) the shift amount wraps
/// mod 32, as `kv_log2_rounds_down`'s mask does, where a plain `>>` panics
/// in a debug build.
#[inline]
fn log2_rounds_down(q: i32) -> u32 {
    22u32.wrapping_shr((q - 18) as u32)
}

/// `LOG2_ROUNDS_DOWN[q]`: the largest `j` with `log2(1 + j 2^-23) < 2^-q`,
/// for the `q` that [`block_scale_exponent`] can ask for (18..=25).
pub const LOG2_ROUNDS_DOWN: [u32; 26] = [
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 22, 11, 5, 2, 1, 0, 0, 0,
];

/// The scale byte of an FP8 block (UE8M0): `min(max(e + 127, 0), 255)`, with
/// 254 as the upper bound when sanitizing (255 is UE8M0's NaN). An infinite
/// block gives the upper bound.
#[inline]
pub fn ue8m0_scale_byte(e: Option<i32>, sanitize: bool) -> u8 {
    let hi = if sanitize { 254 } else { 255 };
    match e {
        None => hi as u8,
        Some(e) => (e + 127).clamp(0, hi) as u8,
    }
}

/// `2^-e` as the multiplier of a block's elements; `0` for an infinite block
/// (so its finite elements become ±0 and infinite ones NaN, which the clamp
/// turns into +448).
#[inline]
pub fn block_scale_multiplier(e: Option<i32>) -> f32 {
    match e {
        // |e| <= 127 for every normal x, so 2^-e is exact and normal.
        Some(e) => pow2(-e),
        None => 0.0,
    }
}

/// Sum of the squares of 512 values in the library's one defined order.
///
/// View the input as 32 lanes of 16 consecutive values (lane `i` holds
/// `v[16 i .. 16 i + 16]`). Each lane squares its values (`f32(v * v)`, no
/// fma) and folds them pairwise by halves: `a[j] += a[j + h]` for
/// `h = 8, 4, 2, 1`. Then the lanes fold by a butterfly:
/// `s[i] = s[i] + s[i ^ h]` for `h = 16, 8, 4, 2, 1`. Because f32 addition
/// is commutative, every lane ends with the same bits; that is the sum.
#[inline]
pub fn sum_squares_512(v: &[f32; 512]) -> f32 {
    sum_squares_16_a_lane(v)
}

/// Sum of the squares of the indexer key's 128 values, in vLLM's order
/// for a 16-byte aligned row (Triton's layout of a 128-wide row over one
/// warp, its squares contracted into fmas): lane `i` holds
/// `(a, b, c, d) = v[4 i .. 4 i + 4]` and sums
/// `f32(fma(a, a, f32(b b)) + fma(c, c, f32(d d)))`, then the 32 lane
/// sums fold by the xor butterfly of [`sum_squares_512`].
#[inline]
pub fn sum_squares_128(v: &[f32; 128]) -> f32 {
    let mut s = [0.0f32; 32];
    for (i, lane) in s.iter_mut().enumerate() {
        let (a, b, c, d) = (v[4 * i], v[4 * i + 1], v[4 * i + 2], v[4 * i + 3]);
        *lane = a.mul_add(a, b * b) + c.mul_add(c, d * d);
    }
    butterfly_32(s)
}

/// Sum of the squares of the 512 values, 16 consecutive values a lane
/// folded by halves, then the lanes by [`butterfly_32`].
#[inline]
fn sum_squares_16_a_lane(v: &[f32; 512]) -> f32 {
    let mut s = [0.0f32; 32];
    for (i, lane) in s.iter_mut().enumerate() {
        let mut a = [0.0f32; 16];
        for j in 0..16 {
            let x = v[16 * i + j];
            a[j] = x * x;
        }
        let mut h = 8;
        while h >= 1 {
            for j in 0..h {
                a[j] += a[j + h];
            }
            h /= 2;
        }
        *lane = a[0];
    }
    butterfly_32(s)
}

/// 32 lane sums folded by the xor butterfly `s[i] = s[i] + s[i ^ h]`,
/// `h = 16, 8, 4, 2, 1`: every lane ends with the same bits (f32 addition
/// is commutative); that is the sum.
#[inline]
fn butterfly_32(mut s: [f32; 32]) -> f32 {
    let mut h = 16;
    while h >= 1 {
        let prev = s;
        for i in 0..32 {
            s[i] = prev[i] + prev[i ^ h];
        }
        h /= 2;
    }
    s[0]
}

/// The reciprocal RMS of 512 values: `f32(1 / f32(sqrt(f32(var + eps))))`
/// with `var = f32(sum / 512)`.
#[inline]
pub fn inv_rms_512(v: &[f32; 512], eps: f32) -> f32 {
    let var = sum_squares_512(v) / 512.0;
    1.0 / (var + eps).sqrt()
}

/// The reciprocal RMS of the indexer key's 128 values:
/// `f32(1 / f32(sqrt(fma(sum, 1/128, eps))))` (vLLM's contraction of
/// `sum / 128 + eps`; the square root and the division correctly rounded).
#[inline]
pub fn inv_rms_128(v: &[f32; 128], eps: f32) -> f32 {
    1.0 / sum_squares_128(v).mul_add(1.0 / 128.0, eps).sqrt()
}

/// The smallest MXFP4 block maximum, `6 * 2^-126`: the scale exponent of
/// a block of zeros is then -126.
pub const MXFP4_AMAX_FLOOR: f32 = f32::from_bits(0x0140_0000);

/// The scale exponent of an MXFP4 block of the indexer key:
/// `ceil(log2f(f32(max(amax, 6 * 2^-126) * f32(1/6))))` (the rounding of
/// [`block_scale_exponent`]) clamped to `[-127, 127]`; an infinite block
/// gives 127. Its UE8M0 byte is `e + 127`.
#[inline]
pub fn mxfp4_scale_exponent(amax: f32) -> i32 {
    let a = max_nan_ignoring(amax, MXFP4_AMAX_FLOOR);
    match block_scale_exponent(a * INV_6) {
        Some(e) => e.clamp(-127, 127),
        None => 127,
    }
}

/// `2^-e` exactly for an MXFP4 scale exponent `e` in `[-127, 127]`
/// (`2^-127` is subnormal).
#[inline]
pub fn mxfp4_multiplier(e: i32) -> f32 {
    if e == 127 {
        f32::from_bits(0x0040_0000)
    } else {
        pow2(-e)
    }
}

/// One normalized output: `bf16(f32(f32(v * inv) * w))`, as f32 before the
/// final conversion.
#[inline]
pub fn norm_scale(v: f32, inv: f32, w: f32) -> f32 {
    (v * inv) * w
}

/// Softmax pooling of two rows' values per dim: `m = max(s0, s1)`,
/// `w0 = exp(s0 - m)`, `w1 = exp(s1 - m)`,
/// `f32(f32(f32(kv0 w0) + f32(kv1 w1)) / f32(w0 + w1))`. The kernels have no
/// single twin: they run [`pool2_terms`] (`kv_pool2_terms`) for every dim of
/// a lane, then the divisions (`kv_pool_norm_emit`).
#[inline]
pub fn pool2(kv0: f32, s0: f32, kv1: f32, s1: f32) -> f32 {
    let (num, den) = pool2_terms(kv0, s0, kv1, s1);
    num / den
}

/// The numerator and denominator of [`pool2`]: the kernels compute every
/// dim's terms before the first division (on NVIDIA a division ends in a
/// branch that would hold back the next dim's exps).
///
/// One `exp` per dim is enough. With `m` the larger score, its difference
/// `s - m` is `±0`, whose weight is exactly 1, or NaN (`inf - inf`), which
/// makes the numerator and denominator NaN whatever the other weight. Adding
/// the two differences therefore gives the smaller score's difference (`<= 0`,
/// or NaN where the result is NaN anyway), and its `exp` is that score's
/// weight `e`. With the other weight 1, `kv0 w0 + kv1 w1` is `kv_lo e + kv_hi`
/// and `w0 + w1` is `1 + e` (the sums are commutative, and `kv * 1` is `kv`).
/// A NaN score makes both terms NaN whichever way `m` treats it, and two equal
/// scores give `e = 1` and `kv0 + kv1` whichever is called the smaller; so a
/// plain `max` does. Only NaN payloads can differ from the two-`exp` form, and
/// every encoder maps all NaNs to one code.
#[inline]
pub fn pool2_terms(kv0: f32, s0: f32, kv1: f32, s1: f32) -> (f32, f32) {
    let m = if s0 > s1 { s0 } else { s1 };
    let d0 = s0 - m;
    let e = exp_nonpos(d0 + (s1 - m));
    // A negative sign of d0 means s0 < m: s0 is the smaller score (or d0 is
    // -0 or NaN, where either order gives the same terms).
    let (kv_lo, kv_hi) = if d0.is_sign_negative() {
        (kv0, kv1)
    } else {
        (kv1, kv0)
    };
    (kv_lo * e + kv_hi, 1.0 + e)
}

/// NVFP4 code of `r` in a tile of scale `s` (`y = f32(1 / s)`, from
/// [`nvfp4_scale`](crate::formats::nvfp4_scale)): `e2m1_from_f32(r / s)`
/// with IEEE division, as the kernels compute it without dividing. The
/// magnitude `a = |r|` (a NaN becomes 0, which is code 0) is divided by one
/// product and Markstein's correction, `fma(fma(-q0, s, a), y, q0)` with
/// `q0 = f32(a y)`: that is the correctly rounded `a / s` wherever a code
/// can change (tests/formats_exhaustive.rs), and NaN when `q0` overflowed,
/// which [`e2m1_magnitude_bits`](crate::formats::e2m1_magnitude_bits)
/// saturates like the infinite quotient. The sign is `r`'s, except that a
/// NaN has none: `min(r, inf)` turns a NaN into `+inf` and leaves everything
/// else; it goes to bit 3, above the magnitude bits' zeros.
#[inline]
pub fn e2m1_of_quotient(r: f32, s: f32, y: f32) -> u8 {
    let a = max_nan_ignoring(r.abs(), 0.0);
    let q0 = a * y;
    let q = (-q0).mul_add(s, a).mul_add(y, q0);
    let sign = (min_nan_ignoring(r, f32::INFINITY).to_bits() >> 28) & 8;
    (crate::formats::e2m1_magnitude_bits(q) | sign) as u8
}

/// The NVFP4 tile reciprocal as two BF16 pairs `(yhi, ylo)`, each value in
/// both halves, for [`e2m1x2_of_quotient_bf16x2`]: `yhi = bf16(y)` and
/// `ylo = bf16(f32(fma(-yhi, s, 1) y))`, the residual `1 - yhi s` being exact
/// (`yhi` has 8 significant bits, `s` 4), so `yhi + ylo` is `1 / s` to about
/// 16 bits. `y = f32(1 / s)` as [`nvfp4_scale`](crate::formats::nvfp4_scale)
/// gives it (twin `kv_nvfp4_reciprocal_bf16x2`).
#[inline]
pub fn nvfp4_reciprocal_bf16x2(s: f32, y: f32) -> (u32, u32) {
    use crate::formats::bf16_from_f32;
    let hi = bf16_from_f32(y) as u32;
    let rest = (-f32::from_bits(hi << 16)).mul_add(s, 1.0) * y;
    let lo = bf16_from_f32(rest) as u32;
    (hi | (hi << 16), lo | (lo << 16))
}

/// NVFP4 codes of two values of a tile (f32 bits `x0`, `x1`) as the CUDA
/// kernels compute them, on BF16 pairs (twin `kv_e2m1x2_of_quotient_bf16x2`).
/// Returns `(m, z)`: `m` holds `bf16(128 + code)` of each value's magnitude
/// (the code in bits 0..3 and 16..19, bits 3..8 and 19..24 zero) and `z` a
/// BF16 pair whose sign bits are the codes' sign bits.
///
/// Each value's key is its top half with bit 0 set where the low half is not
/// zero: `|r|` rounded to 8 significant bits by round-to-odd, which compares
/// with every number of at most 7 significant bits as `|r|` does. The grid's
/// decision points `t s` (`t` of 0.25 .. 5 has at most 3 significant bits,
/// the scale `s` 4) are such numbers, so `e2m1(r / s)` is `e2m1(key / s)`.
/// The key's magnitude (a NaN made 0) is divided by `fma(key, yhi, key ylo)`
/// ([`nvfp4_reciprocal_bf16x2`]); that BF16 quotient is the exact `t` where
/// `key = t s` and on the right side of every `t` elsewhere, for every scale
/// code (tests/formats_exhaustive.rs runs every key against every code).
/// The magnitude code is `min(2q, q + 2, q/2 + 4, 7)` rounded at unit
/// spacing, as [`e2m1_magnitude_bits`](crate::formats::e2m1_magnitude_bits)
/// does in f32, here by adding 128 in BF16; an infinite key gives an
/// infinite or NaN quotient (`inf - inf` or `inf × 0` with `ylo`), which the
/// NaN-ignoring minima make code 7. The
/// sign is the key's, with a NaN made `+inf` (code 0 has no sign).
#[inline]
pub fn e2m1x2_of_quotient_bf16x2(x0: u32, x1: u32, yhi: u32, ylo: u32) -> (u32, u32) {
    use crate::formats::{bf16x2_min, byte_perm, u16x2_min};
    let high = byte_perm(x0, x1, 0x7632);
    let low = byte_perm(x0, x1, 0x5410);
    let key = high | u16x2_min(low, 0x0001_0001);
    let m = e2m1x2_magnitudes_bf16x2(bf16x2_magnitude_nonnan(key), yhi, ylo);
    (m, bf16x2_min(key, 0x7f80_7f80))
}

/// `|key|` of both halves of a BF16 pair, a NaN made `+0` (twin
/// `kv_bf16x2_magnitude_nonnan`).
#[inline]
pub fn bf16x2_magnitude_nonnan(key: u32) -> u32 {
    crate::formats::bf16x2_max(key & 0x7fff_7fff, 0)
}

/// `bf16(128 + code)` of the e2m1 magnitude code of both halves of `v`
/// (keys' magnitudes without NaN) in a tile of reciprocal `(yhi, ylo)`: the
/// quotient and the three lines of [`e2m1x2_of_quotient_bf16x2`] (twin
/// `kv_e2m1x2_magnitudes_bf16x2`).
#[inline]
pub fn e2m1x2_magnitudes_bf16x2(v: u32, yhi: u32, ylo: u32) -> u32 {
    use crate::formats::{bf16x2_fma, bf16x2_min};
    let q = bf16x2_fma(v, yhi, bf16x2_fma(v, ylo, 0x8000_8000));
    let c1 = bf16x2_fma(q, 0x4000_4000, 0x4300_4300);
    let c2 = bf16x2_fma(q, 0x3f80_3f80, 0x4302_4302);
    let c3 = bf16x2_fma(q, 0x3f00_3f00, 0x4304_4304);
    bf16x2_min(bf16x2_min(c1, c2), bf16x2_min(c3, 0x4307_4307))
}

/// [`rope_nope_pair`] on a BF16 pair `w` (the even dim in the low half) as
/// the sm_90+ NVFP4 insert runs it: `fma(swap(w), (-0, +0), w)` in BF16.
/// Each half is a BF16 value plus a signed zero (or NaN), exact, so the
/// halves are the BF16 bits of `rope_nope_pair`'s results, which are BF16
/// numbers, up to NaN sign and payload; tests/formats_exhaustive.rs checks
/// all 2^32 pairs (twin `kv_rope_nope_pair_bf16x2`).
#[inline]
pub fn rope_nope_pair_bf16x2(w: u32) -> u32 {
    use crate::formats::{bf16x2_fma, byte_perm};
    bf16x2_fma(byte_perm(w, w, 0x1032), 0x0000_8000, w)
}

/// An NVFP4 NoPE tile from its 16 BF16 latent values as the sm_90+
/// tile-major insert encodes it, without f32 values (twin
/// `kv_quantize_nvfp4_nope_tile_bf16x2`): each pair rotated by
/// [`rope_nope_pair_bf16x2`] is its own key; the amax is the NaN-ignoring
/// maximum of the keys' magnitudes (a NaN made 0: an all-NaN tile's amax is
/// then 0 instead of NaN, and both give the smallest scale); the codes as
/// [`e2m1x2_of_quotient_bf16x2`] gives them. Returns the 8 value bytes and
/// the e4m3 scale byte.
pub fn quantize_nvfp4_nope_tile_bf16x2(h: &[u16; 16]) -> ([u8; 8], u8) {
    use crate::formats::{bf16x2_max, bf16x2_min, e4m3_from_f32, nvfp4_scale};
    let mut v = [0u32; 8];
    let mut z = [0u32; 8];
    for j in 0..8 {
        let key = rope_nope_pair_bf16x2(u32::from(h[2 * j]) | (u32::from(h[2 * j + 1]) << 16));
        v[j] = bf16x2_magnitude_nonnan(key);
        z[j] = bf16x2_min(key, 0x7f80_7f80);
    }
    let a = v.iter().fold(0, |a, &x| bf16x2_max(a, x));
    let amax = max_nan_ignoring(f32::from_bits(a << 16), f32::from_bits(a & 0xffff_0000));
    let t = min_nan_ignoring(max_nan_ignoring(amax * INV_6, NVFP4_SCALE_MIN), 448.0);
    let code = e4m3_from_f32(t);
    let (s, y) = nvfp4_scale(code);
    let (yhi, ylo) = nvfp4_reciprocal_bf16x2(s, y);
    let mut out = [0u8; 8];
    for k in 0..4 {
        let (j, l) = (2 * k, 2 * k + 1);
        let b = e2m1x4_bytes_bf16x2(
            e2m1x2_magnitudes_bf16x2(v[j], yhi, ylo),
            z[j],
            e2m1x2_magnitudes_bf16x2(v[l], yhi, ylo),
            z[l],
        );
        out[2 * k] = b as u8;
        out[2 * k + 1] = (b >> 8) as u8;
    }
    (out, code)
}

/// The NVFP4 bytes of two [`e2m1x2_of_quotient_bf16x2`] results `(ma, za)`
/// (values 0, 1) and `(mb, zb)` (values 2, 3) in bits 0..16: byte 0 is
/// `code0 | code1 << 4`, byte 1 `code2 | code3 << 4`; bits 16..32 are not
/// meaningful. The magnitudes' low bytes and the signs replicated from the
/// high bytes of `z` go to one word, nibbles of one byte in bytes 0 and 2
/// (twin `kv_e2m1x4_bytes_bf16x2`).
#[inline]
pub fn e2m1x4_bytes_bf16x2(ma: u32, za: u32, mb: u32, zb: u32) -> u32 {
    use crate::formats::byte_perm;
    let t = byte_perm(ma, mb, 0x6240) | (byte_perm(za, zb, 0xfbd9) & 0x0808_0808);
    t.wrapping_add(t >> 12)
}

/// GPT-J rotation of one pair: `(fma(e, c, -f32(o s)), fma(o, c, f32(e s)))`.
/// The NoPE pairs run it too with `c = 1, s = 0`.
#[inline]
pub fn rope_pair(e: f32, o: f32, c: f32, s: f32) -> (f32, f32) {
    (e.mul_add(c, -(o * s)), o.mul_add(c, e * s))
}

/// [`rope_pair`] with `(c, s) = (1, 0)`, as the NoPE pairs run it, in one
/// fma per value: `e + -(o 0)` is `e + o (-0)`, both exact before the one
/// rounding, so the same sum and the same sign of zero; NaN where `o` is
/// infinite or NaN. The results equal `rope_pair(e, o, 1, 0)` bit for bit
/// except that two NaNs may differ in sign or payload, which no encoder
/// sees (each maps every NaN to one code). `tests/formats_exhaustive.rs`
/// checks every BF16 value against partners of every class.
#[inline]
pub fn rope_nope_pair(e: f32, o: f32) -> (f32, f32) {
    (o.mul_add(-0.0, e), e.mul_add(0.0, o))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constants_are_the_rounded_values() {
        assert_eq!(INV_448, (1.0f64 / 448.0) as f32);
        assert_eq!(INV_6, (1.0f64 / 6.0) as f32);
        assert_eq!(AMAX_FLOOR, 1e-4f64 as f32);
        assert_eq!(LOG2E, std::f64::consts::LOG2_E as f32);
        assert_eq!(f32::from_bits(0x3950_0d01), (1.0f64 / 5040.0) as f32);
        assert_eq!(f32::from_bits(0x3ab6_0b61), (1.0f64 / 720.0) as f32);
        assert_eq!(f32::from_bits(0x3c08_8889), (1.0f64 / 120.0) as f32);
        assert_eq!(f32::from_bits(0x3d2a_aaab), (1.0f64 / 24.0) as f32);
        // ln2 split: hi has few enough bits that n * hi is exact for |n| <= 150.
        let ln2 = std::f64::consts::LN_2;
        assert!((LN2_HI as f64 + LN2_LO as f64 - ln2).abs() < 1e-13);
        assert_eq!(LN2_HI.to_bits() & 0x1ff, 0);
    }

    #[test]
    fn log2_shift_is_the_table() {
        for q in 18..=25 {
            assert_eq!(log2_rounds_down(q), LOG2_ROUNDS_DOWN[q as usize], "q={q}");
        }
    }

    #[test]
    #[allow(clippy::needless_range_loop)]
    fn log2_table_matches_exact_arithmetic() {
        // log2(1 + j 2^-23) < 2^-q  <=>  (1 + j 2^-23) < 2^(2^-q). Check each
        // table entry j and j + 1 with f64 logs: the margins are far larger
        // than f64's error (the boundary is not near an integer).
        for q in 18..=25 {
            let j = LOG2_ROUNDS_DOWN[q];
            let lg = |j: u32| (1.0 + j as f64 * 2f64.powi(-23)).log2();
            let t = 2f64.powi(-(q as i32));
            if j > 0 {
                assert!(lg(j) < t, "q={q}");
            }
            assert!(lg(j + 1) > t, "q={q}");
        }
    }

    #[test]
    fn scale_exponent_against_f64_log2_rounded_to_f32() {
        // For every k the exponent can take and the first mantissas above a
        // power of two, compare with ceil(f32(log2 in f64)).
        for k in -24..=127i32 {
            for j in 0..64u32 {
                for jj in [j, 0x7f_ffff - j] {
                    let bits = (((k + 127) as u32) << 23) | jj;
                    let x = f32::from_bits(bits);
                    let want = ((x as f64).log2() as f32).ceil() as i32;
                    assert_eq!(block_scale_exponent(x), Some(want), "x={x:e} k={k} j={jj}");
                }
            }
        }
        assert_eq!(block_scale_exponent(f32::INFINITY), None);
    }

    #[test]
    fn exp_is_within_two_ulp() {
        let mut worst = 0u32;
        let mut x = -104.0f32;
        while x < 88.7 {
            let got = exp(x);
            let want = (x as f64).exp() as f32;
            let d = got.to_bits().abs_diff(want.to_bits());
            worst = worst.max(d);
            x += 0.000_731;
        }
        assert!(worst <= 2, "worst ulp distance {worst}");
        assert_eq!(exp(0.0), 1.0);
        assert_eq!(exp(f32::NEG_INFINITY), 0.0);
        assert!(exp(f32::NAN).is_nan());
    }

    #[test]
    fn sum_order_is_a_tree() {
        let mut v = [0.0f32; 512];
        for (i, x) in v.iter_mut().enumerate() {
            *x = (i as f32 * 0.37).sin();
        }
        let exact: f64 = v.iter().map(|&x| (x as f64) * (x as f64)).sum();
        assert!((sum_squares_512(&v) as f64 - exact).abs() < 1e-4);
    }
}
