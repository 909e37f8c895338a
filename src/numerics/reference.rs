//! The per-token computations of the reference, on plain arrays: what one
//! token's latent and one token's record are. The CPU backend drives these
//! over a batch; the kernels of `kernels-hip/` (`kvcache.hip` and the files
//! it includes) compute the same thing with the twins in
//! `kernels-hip/kv_formats.h` and `kernels-hip/kv_math.h`.

// Index loops mirror the kernels lane by lane, which is the point of this file.
#![allow(clippy::needless_range_loop)]

use crate::formats::{bf16_from_f32, bf16_to_f32, e2m1_from_f32, e4m3_from_f32, e4m3_to_f32};
use crate::layout::{RecordLayout, DIM, FIRST_ROPE_PAIR, NOPE_DIM};
use crate::math::{
    block_scale_exponent, block_scale_multiplier, clamp_e4m3, inv_rms_512, max_nan_ignoring,
    min_nan_ignoring, norm_scale, pool2, rope_pair, ue8m0_scale_byte, AMAX_FLOOR, INV_448, INV_6,
    NVFP4_SCALE_MIN,
};

/// RMS-normalizes a pooled 512-vector with a weight (its exact f32 values,
/// whatever type it came in) into BF16 bits.
pub fn rms_norm(v: &[f32; DIM], weight: &[f32; DIM], eps: f32) -> [u16; DIM] {
    let inv = inv_rms_512(v, eps);
    let mut out = [0u16; DIM];
    for i in 0..DIM {
        out[i] = bf16_from_f32(norm_scale(v[i], inv, weight[i]));
    }
    out
}

/// Pools two `[kv 512 | score 512]` rows (older first) per dim.
pub fn pool_rows(older: &[f32], newer: &[f32]) -> [f32; DIM] {
    let mut out = [0.0f32; DIM];
    for i in 0..DIM {
        out[i] = pool2(older[i], older[DIM + i], newer[i], newer[DIM + i]);
    }
    out
}

/// The rotated vector of a BF16 latent: GPT-J RoPE on the last 32 pairs
/// with `cos[k]`, `sin[k]`; the NoPE pairs run the same arithmetic with
/// `(1, 0)`.
pub fn rotate(latent: &[u16; DIM], cos: &[f32; 32], sin: &[f32; 32]) -> [f32; DIM] {
    let mut r = [0.0f32; DIM];
    for k in 0..DIM / 2 {
        let (c, s) = if k >= FIRST_ROPE_PAIR {
            (cos[k - FIRST_ROPE_PAIR], sin[k - FIRST_ROPE_PAIR])
        } else {
            (1.0, 0.0)
        };
        let (a, b) = rope_pair(
            bf16_to_f32(latent[2 * k]),
            bf16_to_f32(latent[2 * k + 1]),
            c,
            s,
        );
        r[2 * k] = a;
        r[2 * k + 1] = b;
    }
    r
}

/// NaN → 0 when sanitizing.
#[inline]
fn sanitized(v: f32, sanitize: bool) -> f32 {
    if sanitize && v.is_nan() {
        0.0
    } else {
        v
    }
}

/// Quantizes one FP8 block (V4: 64 dims, MXFP8: 32) into `out`; returns its
/// UE8M0 scale byte.
pub fn quantize_fp8_block(q: &[f32], out: &mut [u8], sanitize: bool) -> u8 {
    let mut amax = AMAX_FLOOR;
    for &v in q {
        amax = max_nan_ignoring(amax, v.abs());
    }
    let e = block_scale_exponent(amax * INV_448);
    let mult = block_scale_multiplier(e);
    for (o, &v) in out.iter_mut().zip(q) {
        *o = e4m3_from_f32(clamp_e4m3(v * mult));
    }
    ue8m0_scale_byte(e, sanitize)
}

/// Quantizes one NVFP4 tile of 16 dims into 8 bytes of e2m1 pairs; returns
/// its e4m3 scale byte.
pub fn quantize_nvfp4_tile(r: &[f32], out: &mut [u8]) -> u8 {
    let mut amax = r[0].abs();
    for &v in &r[1..16] {
        amax = max_nan_ignoring(amax, v.abs());
    }
    // tl.clamp(x, 2^-9, 448) compiles to a NaN-ignoring max with the lower
    // bound, then min with the upper: an all-NaN tile gets the 2^-9 scale.
    let t = min_nan_ignoring(max_nan_ignoring(amax * INV_6, NVFP4_SCALE_MIN), 448.0);
    let code = e4m3_from_f32(t);
    let scale = e4m3_to_f32(code);
    for k in 0..8 {
        let lo = e2m1_from_f32(r[2 * k] / scale);
        let hi = e2m1_from_f32(r[2 * k + 1] / scale);
        out[k] = lo | (hi << 4);
    }
    code
}

/// One token's record: `values[..V]` and `scales[..S]` of its layout.
#[derive(Clone)]
pub struct Record {
    /// Value bytes (the first `layout.value_bytes()` are meaningful).
    pub values: [u8; 1024],
    /// Scale bytes (the first `layout.scale_bytes()` are meaningful).
    pub scales: [u8; 32],
}

/// Encodes a BF16 latent into `layout`'s record. `inv_fp8_scale` is
/// `f32(1 / fp8_scale)` (FP8 rows only).
pub fn encode_record(
    layout: RecordLayout,
    latent: &[u16; DIM],
    cos: &[f32; 32],
    sin: &[f32; 32],
    sanitize: bool,
    inv_fp8_scale: f32,
) -> Record {
    let r = rotate(latent, cos, sin);
    let mut rec = Record {
        values: [0; 1024],
        scales: [0; 32],
    };
    match layout {
        RecordLayout::V4 => {
            let mut x = [0.0f32; NOPE_DIM];
            for (i, v) in x.iter_mut().enumerate() {
                *v = bf16_to_f32(latent[i]);
            }
            for b in 0..7 {
                rec.scales[b] = quantize_fp8_block(
                    &x[64 * b..64 * b + 64],
                    &mut rec.values[64 * b..64 * b + 64],
                    sanitize,
                );
            }
            rec.scales[7] = 0;
            for i in NOPE_DIM..DIM {
                let h = bf16_from_f32(sanitized(r[i], sanitize)).to_le_bytes();
                let o = NOPE_DIM + 2 * (i - NOPE_DIM);
                rec.values[o..o + 2].copy_from_slice(&h);
            }
        }
        RecordLayout::Mxfp8 => {
            let r = r.map(|v| sanitized(v, sanitize));
            for b in 0..16 {
                rec.scales[b] = quantize_fp8_block(
                    &r[32 * b..32 * b + 32],
                    &mut rec.values[32 * b..32 * b + 32],
                    sanitize,
                );
            }
        }
        RecordLayout::Nvfp4 => {
            let r = r.map(|v| sanitized(v, sanitize));
            for t in 0..32 {
                rec.scales[t] =
                    quantize_nvfp4_tile(&r[16 * t..16 * t + 16], &mut rec.values[8 * t..8 * t + 8]);
            }
        }
        RecordLayout::Bf16Rows => {
            for i in 0..DIM {
                rec.values[2 * i..2 * i + 2].copy_from_slice(&bf16_from_f32(r[i]).to_le_bytes());
            }
        }
        RecordLayout::Fp8Rows => {
            for i in 0..DIM {
                let v = bf16_to_f32(bf16_from_f32(r[i])) * inv_fp8_scale;
                rec.values[i] = e4m3_from_f32(clamp_e4m3(v));
            }
        }
    }
    rec
}
