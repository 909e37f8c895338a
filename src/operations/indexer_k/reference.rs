//! The indexer key store's reference: one token's key ([`rotated_key`]), its
//! two encodings ([`quantize_fp8_key`], [`quantize_mxfp4_key`]), and the
//! batch over a validated plan that every backend's bytes are held to. The
//! kernels (`kernels-hip/kv_indexer_k.hip`) compute the same with the twins
//! in `kv_formats.h` and `kv_math.h`.

// Index loops mirror the kernels lane by lane.
#![allow(clippy::needless_range_loop)]

use super::{IndexerKArgs, IndexerKFormat, IndexerKPlan, HEAD_DIM, MXFP4_BLOCK, ROPE_DIM};
use crate::formats::e4m3_from_f32;
use crate::formats::{bf16_from_f32, bf16_to_f32, e2m1_from_f32, f16_to_f32, pow2};
use crate::math::{
    block_scale_exponent, block_scale_multiplier, clamp_e4m3, inv_rms_128, max_nan_ignoring,
    mxfp4_multiplier, mxfp4_scale_exponent, norm_scale, rope_pair, AMAX_FLOOR, INV_448,
};
use crate::ops::SkipCounts;
use crate::tensor::{DType, Storage};
use rayon::prelude::*;

/// The pairs before the rotated ones.
const FIRST_ROPE_PAIR: usize = (HEAD_DIM - ROPE_DIM) / 2;

/// One key, normalized and rotated: `x` the BF16 bits of `k_pre`'s row, `w`
/// the weight's f32 values, `cos`/`sin` the table row of the group's first
/// position. Each output is a BF16 value (rounded after the norm and again
/// after the rotation).
pub fn rotated_key(
    x: &[u16; HEAD_DIM],
    w: &[f32; HEAD_DIM],
    eps: f32,
    cos: &[f32; 32],
    sin: &[f32; 32],
) -> [f32; HEAD_DIM] {
    let mut v = [0.0f32; HEAD_DIM];
    for i in 0..HEAD_DIM {
        v[i] = bf16_to_f32(x[i]);
    }
    let inv = inv_rms_128(&v, eps);
    let mut y = [0.0f32; HEAD_DIM];
    for i in 0..HEAD_DIM {
        y[i] = bf16_to_f32(bf16_from_f32(norm_scale(v[i], inv, w[i])));
    }
    let mut r = [0.0f32; HEAD_DIM];
    for k in 0..HEAD_DIM / 2 {
        let (c, s) = if k >= FIRST_ROPE_PAIR {
            (cos[k - FIRST_ROPE_PAIR], sin[k - FIRST_ROPE_PAIR])
        } else {
            (1.0, 0.0)
        };
        let (a, b) = rope_pair(y[2 * k], y[2 * k + 1], c, s);
        r[2 * k] = bf16_to_f32(bf16_from_f32(a));
        r[2 * k + 1] = bf16_to_f32(bf16_from_f32(b));
    }
    r
}

/// The FP8 record of a key: 128 e4m3 bytes and the scale exponent (`None`
/// for an infinite key, whose scale is `+inf`).
pub fn quantize_fp8_key(r: &[f32; HEAD_DIM]) -> ([u8; 128], Option<i32>) {
    let mut amax = AMAX_FLOOR;
    for &v in r {
        amax = max_nan_ignoring(amax, v.abs());
    }
    let e = block_scale_exponent(amax * INV_448);
    let mult = block_scale_multiplier(e);
    let mut out = [0u8; 128];
    for i in 0..HEAD_DIM {
        out[i] = e4m3_from_f32(clamp_e4m3(r[i] * mult));
    }
    (out, e)
}

/// The FP8 record's four scale bytes: the f32 `2^e` (little-endian; `+inf`
/// for an infinite key), or with `mx_scale` four equal UE8M0 bytes
/// `e + 127` (255 for an infinite key).
pub fn fp8_key_scale_bytes(e: Option<i32>, mx_scale: bool) -> [u8; 4] {
    match (e, mx_scale) {
        (Some(e), false) => pow2(e).to_le_bytes(),
        (None, false) => f32::INFINITY.to_le_bytes(),
        (Some(e), true) => [(e + 127) as u8; 4],
        (None, true) => [255; 4],
    }
}

/// The MXFP4 record of a key: 64 bytes of e2m1 pairs (the even dim in the
/// low nibble) and four UE8M0 scale bytes, one per 32 dims.
pub fn quantize_mxfp4_key(r: &[f32; HEAD_DIM]) -> ([u8; 64], [u8; 4]) {
    let mut values = [0u8; 64];
    let mut scales = [0u8; 4];
    for b in 0..HEAD_DIM / MXFP4_BLOCK {
        let block = &r[b * MXFP4_BLOCK..(b + 1) * MXFP4_BLOCK];
        let mut amax = block[0].abs();
        for &v in &block[1..] {
            amax = max_nan_ignoring(amax, v.abs());
        }
        let e = mxfp4_scale_exponent(amax);
        let mult = mxfp4_multiplier(e);
        scales[b] = (e + 127) as u8;
        for p in 0..MXFP4_BLOCK / 2 {
            let lo = e2m1_from_f32(block[2 * p] * mult);
            let hi = e2m1_from_f32(block[2 * p + 1] * mult);
            values[b * MXFP4_BLOCK / 2 + p] = lo | (hi << 4);
        }
    }
    (values, scales)
}

/// A value of an F32, BF16 or F16 table, widened exactly.
fn widen(b: &[u8], offset: usize, dtype: DType, i: usize) -> f32 {
    match dtype {
        DType::BF16 => bf16_to_f32(u16::from_le_bytes([
            b[offset + 2 * i],
            b[offset + 2 * i + 1],
        ])),
        DType::F16 => f16_to_f32(u16::from_le_bytes([
            b[offset + 2 * i],
            b[offset + 2 * i + 1],
        ])),
        _ => f32::from_le_bytes(
            b[offset + 4 * i..offset + 4 * i + 4]
                .try_into()
                .expect("4 bytes"),
        ),
    }
}

/// What one token does.
enum Token {
    /// Nothing (a slot `< 0`, a position inside a group).
    Nothing,
    /// Nothing, counted.
    Skip(SkipCounts),
    /// Its record's bytes at these cache offsets.
    Write(Vec<(usize, u8)>),
}

/// The reference `indexer_k_norm_rope_store` on a validated plan: tokens in
/// parallel on the current rayon pool, their writes applied in token order
/// (a later token writing the same slot wins, as on the device where no two
/// tokens of a call should share a slot). Returns the skip counts.
pub(crate) fn indexer_k_reference<S>(p: &IndexerKPlan, a: IndexerKArgs<'_, S>) -> SkipCounts
where
    S: Storage + AsRef<[u8]> + AsMut<[u8]> + ?Sized,
{
    let k = a.k_pre.buf.as_ref();
    let (pos_b, slot_b) = (a.positions.buf.as_ref(), a.kv_slot_mapping.buf.as_ref());
    let (cs_b, w_b) = (a.cos_sin_cache.buf.as_ref(), a.rms_norm_weight.buf.as_ref());
    let mut w = [0.0f32; HEAD_DIM];
    for (i, x) in w.iter_mut().enumerate() {
        *x = widen(w_b, p.weight_offset, p.weight_dtype, i);
    }
    let c = &p.cache;
    let one = |t: usize| -> Token {
        let skip = |slot, pos| {
            Token::Skip(SkipCounts {
                slot_out_of_range: slot,
                position_out_of_range: pos,
                index_out_of_range: 0,
            })
        };
        let slot = p.slots.read(slot_b, t);
        if slot < 0 {
            return Token::Nothing;
        }
        let pos = p.positions.read(pos_b, t);
        if pos < 0 {
            return skip(0, 1);
        }
        let cr = p.compress_ratio as i64;
        if pos % cr != cr - 1 {
            return Token::Nothing;
        }
        let base = (pos / cr) * cr;
        if base as u64 >= p.cos_sin.rows as u64 {
            return skip(0, 1);
        }
        if slot as u64 >= c.capacity() {
            return skip(1, 0);
        }
        let mut x = [0u16; HEAD_DIM];
        let off = p.k_pre.offset + 2 * t * p.k_pre.row_stride;
        for (i, h) in x.iter_mut().enumerate() {
            *h = u16::from_le_bytes([k[off + 2 * i], k[off + 2 * i + 1]]);
        }
        let row = p.cos_sin.offset / p.cos_sin_dtype.size() + base as usize * p.cos_sin.row_stride;
        let (mut cos, mut sin) = ([0.0f32; 32], [0.0f32; 32]);
        for j in 0..32 {
            cos[j] = widen(cs_b, 0, p.cos_sin_dtype, row + j);
            sin[j] = widen(cs_b, 0, p.cos_sin_dtype, row + 32 + j);
        }
        let r = rotated_key(&x, &w, p.eps, &cos, &sin);
        let (block, row) = (
            (slot / c.block_size as i64) as usize,
            (slot % c.block_size as i64) as usize,
        );
        let page = c.page(block);
        let mut out = Vec::with_capacity(c.format.record_bytes());
        match c.format {
            IndexerKFormat::Fp8 => {
                let (v, e) = quantize_fp8_key(&r);
                for (j, &b) in v.iter().enumerate() {
                    out.push((page + c.value_offset(row, j), b));
                }
                for (s, b) in fp8_key_scale_bytes(e, c.mx_scale).into_iter().enumerate() {
                    out.push((page + c.scale_offset(row, s), b));
                }
            }
            IndexerKFormat::Mxfp4 => {
                let (v, sc) = quantize_mxfp4_key(&r);
                for (j, &b) in v.iter().enumerate() {
                    out.push((page + c.value_offset(row, j), b));
                }
                for (s, b) in sc.into_iter().enumerate() {
                    out.push((page + c.scale_offset(row, s), b));
                }
            }
        }
        Token::Write(out)
    };
    let results: Vec<Token> = (0..p.n).into_par_iter().map(one).collect();
    let cache = a.k_cache.buf.as_mut();
    let mut counts = SkipCounts::default();
    for t in results {
        match t {
            Token::Write(bytes) => {
                for (o, b) in bytes {
                    cache[o] = b;
                }
            }
            Token::Skip(s) => counts.add(s),
            Token::Nothing => {}
        }
    }
    counts
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::formats::{e2m1_to_f32, e4m3_to_f32};

    fn key(f: impl Fn(usize) -> f32) -> [f32; HEAD_DIM] {
        std::array::from_fn(|i| bf16_to_f32(bf16_from_f32(f(i))))
    }

    /// The FP8 record decodes within half a step of every value, and its
    /// scale is the smallest power of two that keeps the maximum under 448.
    #[test]
    fn fp8_key_round_trip() {
        let r = key(|i| (i as f32 - 60.0) * 0.37);
        let (v, e) = quantize_fp8_key(&r);
        let e = e.expect("finite");
        let amax = r.iter().fold(0.0f32, |m, x| m.max(x.abs()));
        assert!(amax / pow2(e) <= 448.0 && amax / pow2(e - 1) > 448.0);
        for i in 0..HEAD_DIM {
            let back = e4m3_to_f32(v[i]) * pow2(e);
            assert!(
                (back - r[i]).abs() <= r[i].abs() / 16.0 + pow2(e - 9),
                "{i}"
            );
        }
        assert_eq!(fp8_key_scale_bytes(Some(e), true), [(e + 127) as u8; 4]);
        assert_eq!(fp8_key_scale_bytes(Some(e), false), pow2(e).to_le_bytes());
    }

    /// MXFP4: each block's scale keeps its maximum within 6, codes decode
    /// within one step, the even dim sits in the low nibble.
    #[test]
    fn mxfp4_key_round_trip() {
        let r = key(|i| ((i * 37 % 101) as f32 - 50.0) * (1 << (i / 32)) as f32 * 0.01);
        let (v, s) = quantize_mxfp4_key(&r);
        for b in 0..4 {
            let scale = pow2(s[b] as i32 - 127);
            for i in 32 * b..32 * b + 32 {
                let byte = v[i / 2];
                let code = if i % 2 == 0 { byte & 15 } else { byte >> 4 };
                let back = e2m1_to_f32(code) * scale;
                assert!((back - r[i]).abs() <= scale, "{i}: {back} vs {}", r[i]);
            }
        }
    }

    /// Zeros, infinities and NaNs take the defined codes.
    #[test]
    fn special_keys() {
        let zeros = [0.0f32; HEAD_DIM];
        let (v, s) = quantize_mxfp4_key(&zeros);
        assert_eq!(s, [1; 4], "a block of zeros has exponent -126");
        assert!(v.iter().all(|&b| b == 0));
        let (v, e) = quantize_fp8_key(&zeros);
        assert_eq!(e, block_scale_exponent(AMAX_FLOOR * INV_448));
        assert!(v.iter().all(|&b| b == 0));

        let mut r = key(|i| i as f32);
        r[3] = f32::INFINITY;
        r[40] = f32::NAN;
        let (v, e) = quantize_fp8_key(&r);
        assert_eq!(e, None);
        assert_eq!(fp8_key_scale_bytes(e, false), f32::INFINITY.to_le_bytes());
        assert_eq!(fp8_key_scale_bytes(e, true), [255; 4]);
        assert_eq!(v[3], 0x7e, "inf * 0 = NaN -> +448");
        assert_eq!(v[40], 0x7e, "NaN -> +448");
        assert_eq!(v[5], 0x00, "finite * 0 = +0");
        let (v, s) = quantize_mxfp4_key(&r);
        assert_eq!(s[0], 254, "an infinite block has exponent 127");
        assert_eq!(v[1] >> 4, 7, "inf * 2^-127 = inf -> 6");
        assert_eq!(v[20] & 15, 0, "NaN -> code 0");
        assert_eq!(s[1], (mxfp4_scale_exponent(63.0) + 127) as u8);
    }

    /// The norm and the rotation: with cos = 1 and sin = 0 everywhere the
    /// key is the normalized row; a rotation by a quarter turn swaps a
    /// rotated pair with a sign.
    #[test]
    fn norm_and_rotation() {
        let x: [u16; HEAD_DIM] = std::array::from_fn(|i| bf16_from_f32(1.0 + i as f32 / 64.0));
        let w = [1.0f32; HEAD_DIM];
        let (c1, s0) = ([1.0f32; 32], [0.0f32; 32]);
        let r = rotated_key(&x, &w, 1e-6, &c1, &s0);
        let v: [f32; HEAD_DIM] = std::array::from_fn(|i| bf16_to_f32(x[i]));
        let inv = inv_rms_128(&v, 1e-6);
        for i in 0..HEAD_DIM {
            assert_eq!(r[i], bf16_to_f32(bf16_from_f32(v[i] * inv)));
        }
        let (c0, s1) = ([0.0f32; 32], [1.0f32; 32]);
        let q = rotated_key(&x, &w, 1e-6, &c0, &s1);
        assert_eq!(q[..64], r[..64]);
        for k in 32..64 {
            assert_eq!(q[2 * k], -r[2 * k + 1]);
            assert_eq!(q[2 * k + 1], r[2 * k]);
        }
    }
}
