//! The V4.1 indexer key store, `indexer_k_norm_rope_store`: per
//! group-closing token, RMS norm of the 128-dim `wk(latent)` row, GPT-J RoPE
//! on its last 64 dims, then an FP8 (132 B) or MXFP4 (68 B) record in the
//! paged indexer cache, in one of three page orders
//! ([`IndexerKOrder`]): row-major (vLLM on CUDA), ROCm's 16 x 16 tiles (FP8)
//! or AITER's preshuffled order (MXFP4). The order is an argument, never a
//! property of the vendor, so one call writes the same bytes everywhere.
//!
//! The exact arithmetic and the byte orders are in `docs/numerics.md`
//! ("The indexer key store") and `docs/layouts.md` ("The indexer key
//! records"). This module holds the operation's arguments, their validation
//! into an [`IndexerKPlan`], the page addressing both the reference and the
//! kernels follow ([`IndexerKCache`]), the CPU [`reference`] and the
//! parameter block ([`abi`]); its tensors are declared with the others'
//! in [`crate::ops`] ([`crate::ops::INDEXER_K`]).

pub mod abi;
pub mod reference;

pub use self::abi::{indexer_k_launch, indexer_k_params, IndexerKPtrs};
pub(crate) use self::reference::indexer_k_reference;

use crate::error::{Error, Result};
use crate::ops::{
    extent, fits_i32, index, rows, shape_err, view_err, IndexPlan, RowsPlan, INDEXER_K,
};
use crate::tensor::{DType, Storage, Tensor, TensorMut};

/// The key's dims.
pub const HEAD_DIM: usize = 128;
/// The rotated dims at the end of the key.
pub const ROPE_DIM: usize = 64;
/// Dims a record's MXFP4 scale covers.
pub const MXFP4_BLOCK: usize = 32;
/// Rows of a tile of the tiled FP8 order, and bytes of its tile row.
pub const TILE: usize = 16;

/// How a record's 128 values are quantized (vLLM's `use_fp4_cache`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IndexerKFormat {
    /// 128 e4m3 bytes and one power-of-two scale (132 B).
    Fp8,
    /// 64 bytes of e2m1 pairs and four UE8M0 scales, one per 32 dims (68 B).
    Mxfp4,
}

impl IndexerKFormat {
    /// Value bytes of a record.
    pub const fn value_bytes(self) -> usize {
        match self {
            IndexerKFormat::Fp8 => 128,
            IndexerKFormat::Mxfp4 => 64,
        }
    }

    /// Scale bytes of a record.
    pub const fn scale_bytes(self) -> usize {
        4
    }

    /// Bytes of a record (the cache's last dim).
    pub const fn record_bytes(self) -> usize {
        self.value_bytes() + self.scale_bytes()
    }

    /// `"fp8"` or `"mxfp4"`.
    pub const fn name(self) -> &'static str {
        match self {
            IndexerKFormat::Fp8 => "fp8",
            IndexerKFormat::Mxfp4 => "mxfp4",
        }
    }
}

/// Where a page's records put their bytes. Every order keeps a page's
/// `block_size` records' values first, then their scales.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IndexerKOrder {
    /// Row `r`'s values at `r * W`, its scales at `block_size * W + 4 r`
    /// (vLLM on CUDA).
    RowMajor,
    /// FP8 only, `block_size % 16 == 0`: each run of 16 rows as
    /// `[8 column tiles][16 rows][16 bytes]`; scales row-major (vLLM on
    /// ROCm, read by AITER's preshuffled FP8 MQA-logits kernel).
    Tiled,
    /// MXFP4 only: each run of `n_per_tile` rows as `[4 chunks of 16 B][n
    /// rows][16 bytes]`, its scales `[64 / n][n rows][4 n / 64]` (AITER's
    /// paged MXFP4 MQA-logits kernel with MFMA N = `n_per_tile`: 16, 32 or
    /// 64, dividing `block_size`).
    Preshuffled {
        /// Rows a run (the MFMA N).
        n_per_tile: u32,
    },
}

impl IndexerKOrder {
    /// `"row_major"`, `"tiled"` or `"preshuffled"` (the Python keyword's
    /// values).
    pub const fn name(self) -> &'static str {
        match self {
            IndexerKOrder::RowMajor => "row_major",
            IndexerKOrder::Tiled => "tiled",
            IndexerKOrder::Preshuffled { .. } => "preshuffled",
        }
    }

    /// The order named `name`, with `n_per_tile` for the preshuffled one
    /// (the others ignore it, as vLLM does off ROCm).
    pub fn from_name(name: &str, n_per_tile: u32) -> Result<Self> {
        Ok(match name {
            "row_major" => IndexerKOrder::RowMajor,
            "tiled" => IndexerKOrder::Tiled,
            "preshuffled" => IndexerKOrder::Preshuffled { n_per_tile },
            other => {
                return Err(Error::Value {
                    arg: "k_order",
                    problem: format!(
                        "{other:?}, expected \"row_major\", \"tiled\" or \"preshuffled\""
                    ),
                })
            }
        })
    }
}

/// Arguments of `indexer_k_norm_rope_store` (names as vLLM's).
pub struct IndexerKArgs<'a, S: ?Sized> {
    /// BF16 `[>= N, 128]`, unit inner stride (any row stride): `wk(latent)`.
    pub k_pre: Tensor<'a, S>,
    /// I32/I64 `[>= N]` absolute positions.
    pub positions: Tensor<'a, S>,
    /// F32, BF16 or F16 `[max_pos, >= 64]`, unit inner stride: cos in
    /// columns 0..32, sin in 32..64, each value widened exactly to f32.
    pub cos_sin_cache: Tensor<'a, S>,
    /// F32, BF16 or F16 `[128]`, read as its exact f32 values.
    pub rms_norm_weight: Tensor<'a, S>,
    /// RMSNorm epsilon (finite, `>= 0`).
    pub rms_norm_eps: f32,
    /// U8 `[blocks, block_size, 132 | 68]` with contiguous pages.
    pub k_cache: TensorMut<'a, S>,
    /// I32/I64 `[N]` cache slots, `< 0` skips.
    pub kv_slot_mapping: Tensor<'a, S>,
    /// Group size, 1 or 2: only tokens with `(position + 1) % ratio == 0`
    /// write.
    pub compress_ratio: u32,
    /// MXFP4 (68 B records) or FP8 (132 B); must match `k_cache`'s width.
    pub format: IndexerKFormat,
    /// The page order.
    pub order: IndexerKOrder,
    /// FP8: the scale as four equal UE8M0 bytes (vLLM's `MX_SCALE`, for
    /// Blackwell's MX-scaled MQA logits) instead of an f32.
    pub mx_scale: bool,
}

/// The indexer cache bound into a plan, and the addressing of its records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IndexerKCache {
    /// Byte offset in its buffer.
    pub offset: usize,
    /// Bytes between blocks (pages).
    pub block_stride: usize,
    /// Blocks.
    pub blocks: usize,
    /// Rows (records) per block.
    pub block_size: usize,
    /// The records' format.
    pub format: IndexerKFormat,
    /// The page order.
    pub order: IndexerKOrder,
    /// FP8 scales as four UE8M0 bytes.
    pub mx_scale: bool,
}

impl IndexerKCache {
    /// Slots the cache holds; a slot at or above this is skipped and counted.
    pub fn capacity(&self) -> u64 {
        (self.blocks as u64) * (self.block_size as u64)
    }

    /// Byte offset, from the page's start, of value byte `j` of row `r`.
    pub fn value_offset(&self, r: usize, j: usize) -> usize {
        let w = self.format.value_bytes();
        match self.order {
            IndexerKOrder::RowMajor => r * w + j,
            IndexerKOrder::Tiled => {
                (r / TILE) * TILE * w + (j / TILE) * TILE * TILE + (r % TILE) * TILE + j % TILE
            }
            IndexerKOrder::Preshuffled { n_per_tile } => {
                let n = n_per_tile as usize;
                (r / n) * n * w + (j / TILE) * n * TILE + (r % n) * TILE + j % TILE
            }
        }
    }

    /// Byte offset, from the page's start, of scale byte `s` of row `r`.
    pub fn scale_offset(&self, r: usize, s: usize) -> usize {
        let values = self.block_size * self.format.value_bytes();
        match self.order {
            IndexerKOrder::Preshuffled { n_per_tile } => {
                let n = n_per_tile as usize;
                let s_lo = 64 / n;
                let s_hi = 4 / s_lo;
                values + (r / n) * n * 4 + (s % s_lo) * n * s_hi + (r % n) * s_hi + s / s_lo
            }
            _ => values + r * 4 + s,
        }
    }

    /// Byte offset in the cache's buffer of the page of `block`.
    pub fn page(&self, block: usize) -> usize {
        self.offset + block * self.block_stride
    }
}

/// Validated `indexer_k_norm_rope_store`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct IndexerKPlan {
    /// Tokens processed (`kv_slot_mapping.len()`).
    pub n: usize,
    /// 1 or 2.
    pub compress_ratio: u32,
    /// Epsilon.
    pub eps: f32,
    /// `k_pre` rows (BF16, any row stride).
    pub k_pre: RowsPlan,
    /// Positions.
    pub positions: IndexPlan,
    /// Slots.
    pub slots: IndexPlan,
    /// cos/sin table rows.
    pub cos_sin: RowsPlan,
    /// The table's element type: F32, BF16 or F16.
    pub cos_sin_dtype: DType,
    /// Weight offset (`[128]`, contiguous).
    pub weight_offset: usize,
    /// The weight's element type: F32, BF16 or F16.
    pub weight_dtype: DType,
    /// The cache.
    pub cache: IndexerKCache,
}

/// Validates `indexer_k_norm_rope_store`'s arguments.
pub fn plan_indexer_k<S: Storage + ?Sized>(a: &IndexerKArgs<'_, S>) -> Result<IndexerKPlan> {
    let s = &INDEXER_K;
    if a.compress_ratio != 1 && a.compress_ratio != 2 {
        return Err(Error::Value {
            arg: "compress_ratio",
            problem: format!("{}, expected 1 or 2", a.compress_ratio),
        });
    }
    if !a.rms_norm_eps.is_finite() || a.rms_norm_eps < 0.0 {
        return Err(Error::Value {
            arg: "rms_norm_eps",
            problem: format!("{}, expected finite and >= 0", a.rms_norm_eps),
        });
    }
    let k_pre = rows(&s.k_pre, a.k_pre.buf, &a.k_pre.desc, HEAD_DIM, 1)?;
    let positions = index(&s.positions, &a.positions)?;
    let slots = index(&s.kv_slot_mapping, &a.kv_slot_mapping)?;
    let (cos_sin, cos_sin_dtype) = crate::ops::cos_sin(&s.cos_sin_cache, &a.cos_sin_cache)?;
    let w = &a.rms_norm_weight.desc;
    s.rms_norm_weight.dtype(w)?;
    if w.rank() != 1 || w.shape()[0] != HEAD_DIM || !w.is_contiguous() {
        return Err(view_err("rms_norm_weight", "expected [128], contiguous", w));
    }
    s.rms_norm_weight.aligned(w)?;
    extent("rms_norm_weight", a.rms_norm_weight.buf, w)?;
    let cache = cache(a)?;
    for (arg, len) in [("k_pre", k_pre.rows), ("positions", positions.len)] {
        if len < slots.len {
            return Err(shape_err(
                arg,
                format!(
                    "has {len} rows, fewer than kv_slot_mapping's {} tokens",
                    slots.len
                ),
            ));
        }
    }
    fits_i32("kv_slot_mapping", "tokens", slots.len)?;
    Ok(IndexerKPlan {
        n: slots.len,
        compress_ratio: a.compress_ratio,
        eps: a.rms_norm_eps,
        k_pre,
        positions,
        slots,
        cos_sin,
        cos_sin_dtype,
        weight_offset: w.offset,
        weight_dtype: w.dtype,
        cache,
    })
}

/// The cache: its width against the format, its strides, the order's
/// conditions.
fn cache<S: Storage + ?Sized>(a: &IndexerKArgs<'_, S>) -> Result<IndexerKCache> {
    let spec = &INDEXER_K.k_cache;
    let d = &a.k_cache.desc;
    spec.dtype(d)?;
    let rec = a.format.record_bytes();
    let w = d.shape().last().copied().unwrap_or(0);
    if d.rank() == 3 && w != rec {
        let other = match a.format {
            IndexerKFormat::Fp8 => IndexerKFormat::Mxfp4,
            IndexerKFormat::Mxfp4 => IndexerKFormat::Fp8,
        };
        let hint = if w == other.record_bytes() {
            format!(
                " ({w} B is the {} record: use_fp4_cache={})",
                other.name(),
                other == IndexerKFormat::Mxfp4
            )
        } else {
            String::new()
        };
        return Err(shape_err(
            "k_cache",
            format!(
                "record width {w} does not match use_fp4_cache={}: expected {rec}{hint}",
                a.format == IndexerKFormat::Mxfp4
            ),
        ));
    }
    if d.rank() != 3 || d.strides()[2] != 1 || (d.shape()[1] > 1 && d.strides()[1] != rec) {
        return Err(view_err(
            "k_cache",
            format!("expected [blocks, block_size, {rec}] with contiguous pages"),
            d,
        ));
    }
    let (blocks, block_size) = (d.shape()[0], d.shape()[1]);
    if block_size == 0 {
        return Err(shape_err(
            "k_cache",
            "block_size (dim 1) must be at least 1".into(),
        ));
    }
    let block_stride = if blocks > 1 {
        d.strides()[0]
    } else {
        block_size * rec
    };
    if block_stride < block_size * rec {
        return Err(shape_err(
            "k_cache",
            format!(
                "block stride {block_stride} is below a page of {}",
                block_size * rec
            ),
        ));
    }
    if block_stride % 4 != 0 {
        return Err(shape_err(
            "k_cache",
            format!("block stride {block_stride} B must be a multiple of 4 bytes"),
        ));
    }
    spec.aligned(d)?;
    extent("k_cache", &*a.k_cache.buf, d)?;
    fits_i32("k_cache", "block stride (bytes)", block_stride)?;
    fits_i32("k_cache", "blocks", blocks)?;
    fits_i32("k_cache", "block_size", block_size)?;
    match (a.format, a.order) {
        (_, IndexerKOrder::RowMajor) => {}
        (IndexerKFormat::Fp8, IndexerKOrder::Tiled) => {
            if block_size % TILE != 0 {
                return Err(shape_err(
                    "k_cache",
                    format!("the tiled order needs block_size % 16 == 0, got {block_size}"),
                ));
            }
        }
        (IndexerKFormat::Mxfp4, IndexerKOrder::Preshuffled { n_per_tile }) => {
            if ![16, 32, 64].contains(&n_per_tile) {
                return Err(Error::Value {
                    arg: "mxfp4_n_per_tile",
                    problem: format!("{n_per_tile}, expected 16, 32 or 64 (the MFMA N)"),
                });
            }
            if block_size % n_per_tile as usize != 0 {
                return Err(Error::Value {
                    arg: "mxfp4_n_per_tile",
                    problem: format!("{n_per_tile} does not divide block_size {block_size}"),
                });
            }
        }
        (f, o) => {
            return Err(Error::Value {
                arg: "k_order",
                problem: format!(
                    "{:?} does not apply to {} records (tiled is FP8's, preshuffled MXFP4's)",
                    o.name(),
                    f.name()
                ),
            })
        }
    }
    if a.mx_scale && a.format == IndexerKFormat::Mxfp4 {
        return Err(Error::Value {
            arg: "mx_scale",
            problem: "applies to FP8 records only (MXFP4 scales are UE8M0 already)".into(),
        });
    }
    Ok(IndexerKCache {
        offset: d.offset,
        block_stride,
        blocks,
        block_size,
        format: a.format,
        order: a.order,
        mx_scale: a.mx_scale,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cache(format: IndexerKFormat, order: IndexerKOrder, bs: usize) -> IndexerKCache {
        IndexerKCache {
            offset: 0,
            block_stride: bs * format.record_bytes(),
            blocks: 1,
            block_size: bs,
            format,
            order,
            mx_scale: false,
        }
    }

    /// Every order is a permutation of the page: each byte of each record
    /// lands once, inside the page.
    #[test]
    fn orders_are_permutations_of_the_page() {
        use IndexerKFormat::*;
        let cases = [
            (Fp8, IndexerKOrder::RowMajor, 64),
            (Fp8, IndexerKOrder::RowMajor, 1),
            (Fp8, IndexerKOrder::Tiled, 64),
            (Fp8, IndexerKOrder::Tiled, 16),
            (Mxfp4, IndexerKOrder::RowMajor, 64),
            (Mxfp4, IndexerKOrder::Preshuffled { n_per_tile: 16 }, 64),
            (Mxfp4, IndexerKOrder::Preshuffled { n_per_tile: 32 }, 64),
            (Mxfp4, IndexerKOrder::Preshuffled { n_per_tile: 64 }, 128),
        ];
        for (f, o, bs) in cases {
            let c = cache(f, o, bs);
            let mut seen = vec![0u8; bs * f.record_bytes()];
            for r in 0..bs {
                for j in 0..f.value_bytes() {
                    seen[c.value_offset(r, j)] += 1;
                }
                for s in 0..4 {
                    let o = c.scale_offset(r, s);
                    assert!(
                        o >= bs * f.value_bytes(),
                        "{f:?} {o:?}: scales after values"
                    );
                    seen[o] += 1;
                }
            }
            assert!(seen.iter().all(|&n| n == 1), "{f:?} {o:?} {bs}");
        }
    }

    /// The preshuffled order with N = 64 puts the scales where the
    /// row-major order does; the tiled order keeps a tile row's 16 bytes
    /// contiguous.
    #[test]
    fn order_landmarks() {
        let pre = cache(
            IndexerKFormat::Mxfp4,
            IndexerKOrder::Preshuffled { n_per_tile: 64 },
            64,
        );
        let row = cache(IndexerKFormat::Mxfp4, IndexerKOrder::RowMajor, 64);
        for r in 0..64 {
            for s in 0..4 {
                assert_eq!(pre.scale_offset(r, s), row.scale_offset(r, s));
            }
        }
        let t = cache(IndexerKFormat::Fp8, IndexerKOrder::Tiled, 64);
        // Row 17, byte 37: run 1 (2048 B), column tile 2 (512 B), row 1 of
        // the run (16 B), byte 5 of the tile row.
        assert_eq!(t.value_offset(17, 37), 2048 + 512 + 16 + 5);
        let p16 = cache(
            IndexerKFormat::Mxfp4,
            IndexerKOrder::Preshuffled { n_per_tile: 16 },
            64,
        );
        // Row 17 (run 1, lane 1), byte 37 (chunk 2, byte 5); scale 3 of row
        // 17: run 1's 64 scale bytes, plane 3 of 16, lane 1.
        assert_eq!(p16.value_offset(17, 37), 1024 + 2 * 256 + 16 + 5);
        assert_eq!(p16.scale_offset(17, 3), 64 * 64 + 64 + 3 * 16 + 1);
    }

    #[test]
    fn order_names_round_trip() {
        for o in [
            IndexerKOrder::RowMajor,
            IndexerKOrder::Tiled,
            IndexerKOrder::Preshuffled { n_per_tile: 32 },
        ] {
            let n = if let IndexerKOrder::Preshuffled { n_per_tile } = o {
                n_per_tile
            } else {
                0
            };
            assert_eq!(IndexerKOrder::from_name(o.name(), n), Ok(o));
        }
        assert!(matches!(
            IndexerKOrder::from_name("tiles", 0),
            Err(Error::Value { arg: "k_order", .. })
        ));
        assert_eq!(
            IndexerKOrder::from_name("row_major", 16),
            Ok(IndexerKOrder::RowMajor)
        );
    }
}
