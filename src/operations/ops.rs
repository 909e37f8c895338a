//! The three operations' arguments, and their validation into launch plans.
//!
//! Validation is shared by every backend, so a bad argument gives the same
//! error everywhere, and it runs before anything is written. A plan holds
//! only offsets, strides and counts (no pointers): each backend binds it to
//! its own memory.

use crate::error::{Error, Result};
use crate::layout::{RecordLayout, RecordOrder, DIM};
use crate::tensor::{DType, Storage, Tensor, TensorDesc, TensorMut};

mod tensors;
pub use tensors::{
    Align, Bound, CompressOp, CompressScalars, CompressTensors, FusedInsertTensors, FusedOp,
    FusedTensors, GatherOp, GatherTensors, IndexerKOp, IndexerKScalars, IndexerKTensors, InsertOp,
    InsertTensors, Operation, RingOp, RingTensors, Role, Spec, COMPRESS, FUSED_INSERT, GATHER,
    INDEXER_K, INSERT, RING, ROW_ALIGN,
};

/// Arguments of `fused_save_compress_norm` (names as in the seed).
pub struct CompressArgs<'a, S: ?Sized> {
    /// FP32 `[tokens, 512]` (CR1) or `[tokens, 1024]` = `[kv | score]` (CR2).
    pub kv_score: Tensor<'a, S>,
    /// I32/I64 `[>= N]` absolute positions.
    pub positions: Tensor<'a, S>,
    /// CR2: FP32 ring `[blocks, capacity, 1024]`. Ignored for CR1.
    pub state_cache: Option<TensorMut<'a, S>>,
    /// I32/I64 `[N]`: ring slots (CR2) or validity marks (CR1, `< 0` skips).
    pub slot_mapping: Tensor<'a, S>,
    /// CR2: I32/I64 `[num_reqs + 1]` token offsets of each request's chunk.
    pub query_start_loc: Option<Tensor<'a, S>>,
    /// CR2: I32/I64 `[>= N]` request of each packed token.
    pub token_to_req_indices: Option<Tensor<'a, S>>,
    /// F32, BF16 or F16 `[512]`, read as its exact f32 values.
    pub rms_norm_weight: Tensor<'a, S>,
    /// RMSNorm epsilon (finite, `>= 0`).
    pub rms_norm_eps: f32,
    /// Group size, 1 or 2.
    pub compress_ratio: u32,
    /// BF16 `[tokens, 512]`, written only at valid group boundaries.
    pub latent_out: TensorMut<'a, S>,
    /// CR2: FP32 `[rows, 1024]` predecessor rows (then the ring is left to
    /// `save_ring_rows`).
    pub prev_rows: Option<Tensor<'a, S>>,
    /// CR2 with `prev_rows`: I32/I64 `[>= num_reqs]`, `-1` reads the ring.
    pub prev_row_indices: Option<Tensor<'a, S>>,
}

/// Arguments of `rope_quant_insert`.
pub struct InsertArgs<'a, S: ?Sized> {
    /// BF16 `[tokens, 512]`, contiguous.
    pub latent: Tensor<'a, S>,
    /// I32/I64 `[>= N]`.
    pub positions: Tensor<'a, S>,
    /// F32, BF16 or F16 `[max_pos, >= 64]`, read as its exact f32 values:
    /// cos in columns 0..32, sin in 32..64.
    pub cos_sin_cache: Tensor<'a, S>,
    /// The cache: U8 `[blocks, block_size, 584 | 528 | 288]` (paged), or
    /// BF16 / F8E4M3 `[blocks, block_size, 512]` (rows; also
    /// `[blocks, block_size, 1, 512]`).
    pub kv_cache: TensorMut<'a, S>,
    /// I32/I64 `[N]` cache slots, `< 0` skips.
    pub slot_mapping: Tensor<'a, S>,
    /// Group size, 1 or 2.
    pub compress_ratio: u32,
    /// F32 `[1]`, required for FP8 rows and only for them.
    pub fp8_scale: Option<Tensor<'a, S>>,
    /// Where a paged record's scales go (row layouts have none).
    pub record_order: RecordOrder,
}

/// Arguments of `save_ring_rows`.
pub struct RingArgs<'a, S: ?Sized> {
    /// FP32 `[N, 1024]`.
    pub rows: Tensor<'a, S>,
    /// I32/I64 `[N]` ring slots, `< 0` skips.
    pub slot_mapping: Tensor<'a, S>,
    /// FP32 `[blocks, capacity, 1024]`.
    pub state_cache: TensorMut<'a, S>,
}

/// Arguments of the fused compress + insert: one launch that does what
/// `fused_save_compress_norm` followed by `rope_quant_insert` does.
pub struct FusedArgs<'a, S: ?Sized> {
    /// The compressor's arguments. Its `latent_out` is still written (the
    /// indexer reads it) unless `skip_latent_out` is set.
    pub compress: CompressArgs<'a, S>,
    /// Do not write `latent_out` (the insert still uses the BF16-rounded
    /// latent, so the cache bytes do not change).
    pub skip_latent_out: bool,
    /// As in [`InsertArgs`].
    pub cos_sin_cache: Tensor<'a, S>,
    /// As in [`InsertArgs`].
    pub kv_cache: TensorMut<'a, S>,
    /// Cache slots (the compressor's `slot_mapping` holds ring slots for CR2).
    pub cache_slot_mapping: Tensor<'a, S>,
    /// As in [`InsertArgs`].
    pub fp8_scale: Option<Tensor<'a, S>>,
    /// As in [`InsertArgs`].
    pub record_order: RecordOrder,
}

// ---- the reader's arguments (validated in `crate::gather`) -------------

/// Which record each output row reads.
pub enum GatherIndex<'a, S: ?Sized> {
    /// Output row `i` reads slot `slot_mapping[i]` (`block * block_size +
    /// row`); a slot `< 0` leaves its row untouched.
    Slots {
        /// I32/I64 `[N]`, contiguous.
        slot_mapping: Tensor<'a, S>,
    },
    /// Request `r` owns output rows `cu_seq_lens[r] .. cu_seq_lens[r + 1]`;
    /// its `i`-th row reads the token at position `seq_starts[r] + i` of the
    /// request (0 + i without `seq_starts`), found through its row of the
    /// block table.
    BlockTable {
        /// I32/I64 `[>= R, max_blocks]` with unit inner stride: the cache
        /// block of each `block_size` positions of each request.
        block_table: Tensor<'a, S>,
        /// I32/I64 `[R + 1]`, contiguous, non-decreasing: each request's
        /// first output row, then the total.
        cu_seq_lens: Tensor<'a, S>,
        /// I32/I64 `[>= R]`, contiguous: the position of each request's
        /// first gathered token (vLLM's `seq_len - gather_len`).
        seq_starts: Option<Tensor<'a, S>>,
    },
}

/// Arguments of `gather_dequant`.
pub struct GatherArgs<'a, S: ?Sized> {
    /// The cache, as `rope_quant_insert` takes it: U8
    /// `[blocks, block_size, 584 | 528 | 288]` (paged), or BF16 / F8_E4M3
    /// `[blocks, block_size, 512]` (rows; also `[blocks, block_size, 1, 512]`).
    pub kv_cache: Tensor<'a, S>,
    /// Which record each output row reads.
    pub index: GatherIndex<'a, S>,
    /// F32 `[1]`, required for an FP8 row cache and only for it: the value
    /// of a byte is `e4m3 × fp8_scale`.
    pub fp8_scale: Option<Tensor<'a, S>>,
    /// BF16 or F32 `[rows, 512]`, unit inner stride, row stride a multiple
    /// of 16 bytes, 16-byte aligned. Slot form: `rows >= N`, rows from `N`
    /// on are untouched. Block-table form: `rows` bounds the output (rows
    /// that no request owns are untouched).
    pub out: TensorMut<'a, S>,
    /// The order the paged records were written in (row layouts have none).
    pub record_order: RecordOrder,
}

/// A 1-D contiguous integer tensor bound into a plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IndexPlan {
    /// Byte offset in its buffer.
    pub offset: usize,
    /// I64 (else I32).
    pub is_i64: bool,
    /// Elements.
    pub len: usize,
}

impl IndexPlan {
    /// Element `i`, read from the buffer `b` the plan was made over.
    #[inline]
    pub fn read(&self, b: &[u8], i: usize) -> i64 {
        if self.is_i64 {
            let o = self.offset + 8 * i;
            i64::from_le_bytes(b[o..o + 8].try_into().expect("8 bytes"))
        } else {
            let o = self.offset + 4 * i;
            i32::from_le_bytes(b[o..o + 4].try_into().expect("4 bytes")) as i64
        }
    }
}

/// A 2-D row tensor bound into a plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RowsPlan {
    /// Byte offset in its buffer.
    pub offset: usize,
    /// Elements between rows.
    pub row_stride: usize,
    /// Rows.
    pub rows: usize,
}

/// The CR2 ring bound into a plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RingPlan {
    /// Byte offset in its buffer.
    pub offset: usize,
    /// Elements between blocks.
    pub block_stride: usize,
    /// Elements between rows of a block.
    pub row_stride: usize,
    /// Blocks.
    pub blocks: usize,
    /// Rows per block (`capacity`).
    pub capacity: usize,
}

/// Validated `fused_save_compress_norm`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CompressPlan {
    /// Tokens processed (`slot_mapping.len()`).
    pub n: usize,
    /// 1 or 2.
    pub compress_ratio: u32,
    /// Epsilon.
    pub eps: f32,
    /// `kv_score` rows.
    pub kv_score: RowsPlan,
    /// Positions.
    pub positions: IndexPlan,
    /// Slots.
    pub slots: IndexPlan,
    /// Weight offset (`[512]`).
    pub weight_offset: usize,
    /// The weight's element type: F32, BF16 or F16.
    pub weight_dtype: DType,
    /// `latent_out` rows (row stride 512).
    pub latent: RowsPlan,
    /// CR2 only.
    pub ring: Option<RingPlan>,
    /// CR2 only.
    pub query_start_loc: Option<IndexPlan>,
    /// CR2 only.
    pub token_to_req: Option<IndexPlan>,
    /// CR2 with `prev_rows`.
    pub prev_rows: Option<RowsPlan>,
    /// CR2 with `prev_rows`.
    pub prev_row_indices: Option<IndexPlan>,
}

impl CompressPlan {
    /// Number of requests (CR2), else 0.
    pub fn num_reqs(&self) -> usize {
        self.query_start_loc.map_or(0, |q| q.len - 1)
    }
}

/// Where records go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CachePlan {
    /// The layout the cache's dtype and width select.
    pub layout: RecordLayout,
    /// Byte offset in its buffer.
    pub offset: usize,
    /// Bytes between blocks.
    pub block_stride: usize,
    /// Bytes between rows of a block (row layouts), or between records' value
    /// bytes (paged: the value width page-planar, the record width per token).
    pub row_stride: usize,
    /// Blocks.
    pub blocks: usize,
    /// Rows per block.
    pub block_size: usize,
    /// Where a paged record's scales go ([`RecordOrder::PagePlanar`] for
    /// row layouts, which have none).
    pub order: RecordOrder,
}

impl CachePlan {
    /// Slots the cache holds; a slot at or above this is skipped and counted.
    pub fn capacity(&self) -> u64 {
        (self.blocks as u64) * (self.block_size as u64)
    }

    /// Byte offsets in the cache's buffer of the record in `row` of
    /// `block`: its value bytes and its scale bytes (for row layouts the
    /// row's bytes, and the same offset for the absent scales).
    pub fn record_offsets(&self, block: usize, row: usize) -> (usize, usize) {
        let page = self.offset + block * self.block_stride;
        if self.layout.is_paged() {
            let (v, s) = self.order.record_offsets(self.layout, self.block_size, row);
            (page + v, page + s)
        } else {
            (page + row * self.row_stride, page + row * self.row_stride)
        }
    }
}

/// Validated `rope_quant_insert`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct InsertPlan {
    /// Tokens processed (`slot_mapping.len()`).
    pub n: usize,
    /// 1 or 2.
    pub compress_ratio: u32,
    /// Latent rows (row stride 512).
    pub latent: RowsPlan,
    /// Positions.
    pub positions: IndexPlan,
    /// Slots.
    pub slots: IndexPlan,
    /// cos/sin table rows.
    pub cos_sin: RowsPlan,
    /// The table's element type: F32, BF16 or F16.
    pub cos_sin_dtype: DType,
    /// The cache.
    pub cache: CachePlan,
    /// FP8 rows: offset of the F32 scale.
    pub fp8_scale_offset: Option<usize>,
}

/// Validated `save_ring_rows`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RingRowsPlan {
    /// Rows processed.
    pub n: usize,
    /// Source rows.
    pub rows: RowsPlan,
    /// Slots.
    pub slots: IndexPlan,
    /// The ring.
    pub ring: RingPlan,
}

/// Validated fused compress + insert.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FusedPlan {
    /// The compressor part.
    pub compress: CompressPlan,
    /// The insert part (its `latent` field mirrors the compressor's).
    pub insert: InsertPlan,
    /// Whether `latent_out` is written.
    pub write_latent: bool,
}

// ---- checks -------------------------------------------------------------

pub(crate) fn shape_err(arg: &'static str, problem: String) -> Error {
    Error::Shape { arg, problem }
}

/// The [`Error::Shape`] for a view not of the `expected` form, naming its
/// shape and strides.
pub(crate) fn view_err(
    arg: &'static str,
    expected: impl std::fmt::Display,
    d: &TensorDesc,
) -> Error {
    shape_err(
        arg,
        format!(
            "{expected}, got shape {:?} strides {:?}",
            d.shape(),
            d.strides()
        ),
    )
}

pub(crate) fn extent<S: Storage + ?Sized>(
    arg: &'static str,
    buf: &S,
    d: &TensorDesc,
) -> Result<()> {
    let needed = d
        .end_byte()
        .ok_or_else(|| shape_err(arg, "view size overflows".into()))?;
    let available = buf.len_bytes() as u64;
    if needed > available {
        return Err(Error::OutOfBounds {
            arg,
            needed,
            available,
        });
    }
    Ok(())
}

/// A request-offsets tensor (`query_start_loc`, `cu_seq_lens`) into its
/// plan: `num_reqs + 1` entries, at most [`MAX_TOKENS`] requests.
pub(crate) fn offsets<S: Storage + ?Sized>(
    s: &'static Spec,
    t: &Tensor<'_, S>,
) -> Result<IndexPlan> {
    let o = index(s, t)?;
    if o.len == 0 || o.len - 1 > MAX_TOKENS {
        return Err(shape_err(
            s.arg,
            format!(
                "has {} entries; needs num_reqs + 1 with 0 <= num_reqs <= {MAX_TOKENS}",
                o.len
            ),
        ));
    }
    Ok(o)
}

pub(crate) fn index<S: Storage + ?Sized>(s: &'static Spec, t: &Tensor<'_, S>) -> Result<IndexPlan> {
    let (arg, d) = (s.arg, &t.desc);
    s.dtype(d)?;
    if d.rank() != 1 || !d.is_contiguous() {
        return Err(view_err(arg, "must be 1-D and contiguous", d));
    }
    s.aligned(d)?;
    extent(arg, t.buf, d)?;
    Ok(IndexPlan {
        offset: d.offset,
        is_i64: d.dtype == DType::I64,
        len: d.shape()[0],
    })
}

/// `[rows, width]` of one of `s`'s element types with unit inner stride,
/// row stride a multiple of `row_align` elements, base aligned as `s` says.
pub(crate) fn rows<S: Storage + ?Sized>(
    s: &'static Spec,
    buf: &S,
    d: &TensorDesc,
    width: usize,
    row_align: usize,
) -> Result<RowsPlan> {
    let arg = s.arg;
    s.dtype(d)?;
    if d.rank() != 2 || d.shape()[1] != width || d.strides()[1] != 1 {
        return Err(view_err(
            arg,
            format!("expected [rows, {width}] with unit inner stride"),
            d,
        ));
    }
    if d.shape()[0] > 1 && d.strides()[0] % row_align != 0 {
        return Err(shape_err(
            arg,
            format!(
                "row stride {} must be a multiple of {row_align} elements ({} bytes)",
                d.strides()[0],
                row_align * d.dtype.size()
            ),
        ));
    }
    if d.shape()[0] > 1 && d.strides()[0] < width {
        return Err(shape_err(
            arg,
            format!("row stride {} overlaps rows of {width}", d.strides()[0]),
        ));
    }
    s.aligned(d)?;
    extent(arg, buf, d)?;
    fits_i32(arg, "row stride", d.strides()[0])?;
    fits_i32(arg, "rows", d.shape()[0])?;
    Ok(RowsPlan {
        offset: d.offset,
        row_stride: if d.shape()[0] > 1 {
            d.strides()[0]
        } else {
            width
        },
        rows: d.shape()[0],
    })
}

/// Strides and counts travel to the kernels as 32-bit integers.
pub(crate) fn fits_i32(arg: &'static str, what: &str, v: usize) -> Result<()> {
    if v > i32::MAX as usize {
        return Err(shape_err(
            arg,
            format!("{what} {v} is above the supported {}", i32::MAX),
        ));
    }
    Ok(())
}

fn ratio(cr: u32) -> Result<()> {
    if cr == 1 || cr == 2 {
        Ok(())
    } else {
        Err(Error::Value {
            arg: "compress_ratio",
            problem: format!("{cr}, expected 1 or 2"),
        })
    }
}

fn ring<S: Storage + ?Sized>(s: &'static Spec, t: &TensorMut<'_, S>) -> Result<RingPlan> {
    let (arg, d) = (s.arg, &t.desc);
    s.dtype(d)?;
    if d.rank() != 3 || d.shape()[2] != 1024 || d.strides()[2] != 1 {
        return Err(view_err(
            arg,
            "expected [blocks, capacity, 1024] with unit inner stride",
            d,
        ));
    }
    let (blocks, cap) = (d.shape()[0], d.shape()[1]);
    if cap == 0 {
        return Err(shape_err(arg, "capacity (dim 1) must be at least 1".into()));
    }
    if cap > 1 && d.strides()[1] % 16 != 0 {
        return Err(shape_err(
            arg,
            format!(
                "row stride {} must be a multiple of 16 elements (64-byte rows)",
                d.strides()[1]
            ),
        ));
    }
    if blocks > 1 && d.strides()[0] % 4 != 0 {
        return Err(shape_err(
            arg,
            format!(
                "block stride {} must be a multiple of 4 elements (16 bytes)",
                d.strides()[0]
            ),
        ));
    }
    // Rows and blocks must not overlap: devices write them concurrently.
    let row_stride = if cap > 1 { d.strides()[1] } else { 1024 };
    if row_stride < 1024 {
        return Err(shape_err(
            arg,
            format!("row stride {row_stride} overlaps rows of 1024"),
        ));
    }
    let block_span = (cap - 1) * row_stride + 1024;
    if blocks > 1 && d.strides()[0] < block_span {
        return Err(shape_err(
            arg,
            format!(
                "block stride {} overlaps blocks spanning {block_span} elements",
                d.strides()[0]
            ),
        ));
    }
    s.aligned(d)?;
    extent(arg, &*t.buf, d)?;
    fits_i32(arg, "block stride", d.strides()[0])?;
    fits_i32(arg, "row stride", row_stride)?;
    fits_i32(arg, "blocks", blocks)?;
    fits_i32(arg, "capacity", cap)?;
    Ok(RingPlan {
        offset: d.offset,
        block_stride: d.strides()[0],
        row_stride: if cap > 1 { d.strides()[1] } else { 1024 },
        blocks,
        capacity: cap,
    })
}

fn n_tokens(n: usize, others: &[(&'static str, usize)]) -> Result<()> {
    for &(arg, len) in others {
        if n > len {
            return Err(shape_err(
                arg,
                format!("has {len} rows but slot_mapping has {n} tokens; N must not exceed it"),
            ));
        }
    }
    // One 32-lane group per token (and per request): 2^24 of each keeps
    // grid x block within the u32 work-item count AMD launches allow.
    if n > MAX_TOKENS {
        return Err(shape_err(
            "slot_mapping",
            format!("{n} tokens, at most {MAX_TOKENS} per call"),
        ));
    }
    Ok(())
}

/// Most tokens (and most requests) one call takes.
pub const MAX_TOKENS: usize = 1 << 24;

/// Validates `fused_save_compress_norm`'s arguments.
pub fn plan_compress<S: Storage + ?Sized>(a: &CompressArgs<'_, S>) -> Result<CompressPlan> {
    ratio(a.compress_ratio)?;
    let cr = a.compress_ratio as usize;
    let c = &COMPRESS;
    let kv_score = rows(&c.kv_score, a.kv_score.buf, &a.kv_score.desc, DIM * cr, 16)?;
    let positions = index(&c.positions, &a.positions)?;
    let slots = index(&c.slot_mapping, &a.slot_mapping)?;
    let w = &a.rms_norm_weight.desc;
    c.rms_norm_weight.dtype(w)?;
    if w.shape() != [DIM] || !w.is_contiguous() {
        return Err(shape_err(
            "rms_norm_weight",
            format!("expected contiguous [512], got {:?}", w.shape()),
        ));
    }
    c.rms_norm_weight.aligned(w)?;
    extent("rms_norm_weight", a.rms_norm_weight.buf, w)?;
    if !a.rms_norm_eps.is_finite() || a.rms_norm_eps < 0.0 {
        return Err(Error::Value {
            arg: "rms_norm_eps",
            problem: format!("{}, expected a finite value >= 0", a.rms_norm_eps),
        });
    }
    let ld = &a.latent_out.desc;
    c.latent_out.dtype(ld)?;
    if ld.shape() != [kv_score.rows, DIM] || !ld.is_contiguous() {
        return Err(shape_err(
            "latent_out",
            format!(
                "expected contiguous [{}, 512] (kv_score's rows), got {:?}",
                kv_score.rows,
                ld.shape()
            ),
        ));
    }
    let latent = rows(&c.latent_out, &*a.latent_out.buf, ld, DIM, 8)?;
    let n = slots.len;
    n_tokens(
        n,
        &[("kv_score", kv_score.rows), ("positions", positions.len)],
    )?;

    let (mut ring_p, mut qsl, mut ttr, mut prev, mut prev_idx) = (None, None, None, None, None);
    if cr == 2 {
        let st = a.state_cache.as_ref().ok_or(Error::Missing {
            arg: "state_cache",
            problem: "required for compress_ratio 2",
        })?;
        ring_p = Some(ring(&c.state_cache, st)?);
        let q = a.query_start_loc.as_ref().ok_or(Error::Missing {
            arg: "query_start_loc",
            problem: "required for compress_ratio 2",
        })?;
        let q = offsets(&c.query_start_loc, q)?;
        qsl = Some(q);
        let t = a.token_to_req_indices.as_ref().ok_or(Error::Missing {
            arg: "token_to_req_indices",
            problem: "required for compress_ratio 2",
        })?;
        let t = index(&c.token_to_req_indices, t)?;
        n_tokens(n, &[("token_to_req_indices", t.len)])?;
        ttr = Some(t);
        match (&a.prev_rows, &a.prev_row_indices) {
            (Some(p), Some(pi)) => {
                prev = Some(rows(&c.prev_rows, p.buf, &p.desc, 1024, 16)?);
                let pi = index(&c.prev_row_indices, pi)?;
                if pi.len < q.len - 1 {
                    return Err(shape_err(
                        "prev_row_indices",
                        format!("has {} entries, needs num_reqs = {}", pi.len, q.len - 1),
                    ));
                }
                prev_idx = Some(pi);
            }
            (Some(_), None) => {
                return Err(Error::Missing {
                    arg: "prev_row_indices",
                    problem: "required when prev_rows is given",
                })
            }
            (None, Some(_)) => {
                return Err(Error::Missing {
                    arg: "prev_rows",
                    problem: "prev_row_indices was given without prev_rows",
                })
            }
            (None, None) => {}
        }
    }
    Ok(CompressPlan {
        n,
        compress_ratio: a.compress_ratio,
        eps: a.rms_norm_eps,
        kv_score,
        positions,
        slots,
        weight_offset: w.offset,
        weight_dtype: w.dtype,
        latent,
        ring: ring_p,
        query_start_loc: qsl,
        token_to_req: ttr,
        prev_rows: prev,
        prev_row_indices: prev_idx,
    })
}

fn cache<S: Storage + ?Sized>(
    s: &'static Spec,
    kv: &TensorMut<'_, S>,
    order: RecordOrder,
) -> Result<CachePlan> {
    cache_view(s, &*kv.buf, &kv.desc, order)
}

/// A cache tensor (written or only read) into its plan.
pub(crate) fn cache_view<S: Storage + ?Sized>(
    s: &'static Spec,
    buf: &S,
    d: &TensorDesc,
    order: RecordOrder,
) -> Result<CachePlan> {
    let arg = s.arg;
    s.dtype(d)?;
    let layout = match d.dtype {
        DType::U8 => {
            let w = *d.shape().last().unwrap_or(&0);
            RecordLayout::from_record_width(w).ok_or_else(|| {
                shape_err(
                    arg,
                    format!("unsupported paged KV record width {w}; expected 584, 528 or 288"),
                )
            })?
        }
        DType::BF16 => RecordLayout::Bf16Rows,
        DType::F8E4M3 => RecordLayout::Fp8Rows,
        _ => return Err(s.dtype_err(d)),
    };
    let esz = d.dtype.size();
    let (blocks, block_size, block_stride, row_stride);
    if layout.is_paged() {
        let w = layout.record_bytes();
        if d.rank() != 3 || d.strides()[2] != 1 || (d.shape()[1] > 1 && d.strides()[1] != w) {
            return Err(view_err(
                arg,
                format!("paged cache must be [blocks, block_size, {w}] with contiguous pages"),
                d,
            ));
        }
        blocks = d.shape()[0];
        block_size = d.shape()[1];
        block_stride = if blocks > 1 {
            d.strides()[0]
        } else {
            block_size * w
        };
        if block_stride < block_size * w {
            return Err(shape_err(
                arg,
                format!(
                    "block stride {block_stride} is below a page of {}",
                    block_size * w
                ),
            ));
        }
        if order == RecordOrder::PerToken && layout == RecordLayout::V4 {
            return Err(Error::Value {
                arg: "record_order",
                problem: "per_token applies to the 528 and 288 B records; the 584 B V4 record is page-planar only (as vLLM and FlashMLA store it; per token it would lose the 16-byte alignment its stores need)".into(),
            });
        }
        // The stride between records' value bytes: a page-planar page's
        // value area is packed, a per-token page holds whole records.
        row_stride = match order {
            RecordOrder::PagePlanar => layout.value_bytes(),
            RecordOrder::PerToken => w,
        };
    } else {
        let ok_rank = d.rank() == 3 || (d.rank() == 4 && d.shape()[2] == 1);
        let last = d.rank().saturating_sub(1);
        if !ok_rank || d.shape()[last] != DIM || d.strides()[last] != 1 {
            return Err(view_err(arg, "row cache must be [blocks, block_size, 512] (or [blocks, block_size, 1, 512]) with unit inner stride", d));
        }
        blocks = d.shape()[0];
        block_size = d.shape()[1];
        row_stride = if block_size > 1 {
            d.strides()[1] * esz
        } else {
            DIM * esz
        };
        block_stride = if blocks > 1 {
            d.strides()[0] * esz
        } else {
            block_size * row_stride
        };
        if blocks > 1 && block_stride < block_size.saturating_sub(1) * row_stride + DIM * esz {
            return Err(shape_err(
                arg,
                format!("block stride {block_stride} B overlaps blocks of {block_size} rows of {row_stride} B"),
            ));
        }
        if block_size > 1 && row_stride < DIM * esz {
            return Err(shape_err(
                arg,
                format!(
                    "row stride {} elements overlaps rows of 512",
                    d.strides()[1]
                ),
            ));
        }
    }
    if block_stride % 16 != 0 || row_stride % 16 != 0 {
        return Err(shape_err(
            arg,
            format!("block stride ({block_stride} B) and row stride ({row_stride} B) must be multiples of 16 bytes"),
        ));
    }
    if block_size == 0 {
        return Err(shape_err(
            arg,
            "block_size (dim 1) must be at least 1".into(),
        ));
    }
    s.aligned(d)?;
    extent(arg, buf, d)?;
    fits_i32(arg, "block stride (bytes)", block_stride)?;
    fits_i32(arg, "row stride (bytes)", row_stride)?;
    fits_i32(arg, "blocks", blocks)?;
    fits_i32(arg, "block_size", block_size)?;
    Ok(CachePlan {
        layout,
        offset: d.offset,
        block_stride,
        row_stride,
        blocks,
        block_size,
        order: if layout.is_paged() {
            order
        } else {
            RecordOrder::PagePlanar
        },
    })
}

pub(crate) fn cos_sin<S: Storage + ?Sized>(
    s: &'static Spec,
    t: &Tensor<'_, S>,
) -> Result<(RowsPlan, DType)> {
    let d = &t.desc;
    s.dtype(d)?;
    if d.rank() != 2 || d.shape()[1] < 64 || d.strides()[1] != 1 {
        return Err(view_err(
            "cos_sin_cache",
            "expected [max_pos, >= 64] with unit inner stride",
            d,
        ));
    }
    s.aligned(d)?;
    extent("cos_sin_cache", t.buf, d)?;
    fits_i32("cos_sin_cache", "row stride", d.strides()[0])?;
    fits_i32("cos_sin_cache", "rows", d.shape()[0])?;
    Ok((
        RowsPlan {
            offset: d.offset,
            row_stride: if d.shape()[0] > 1 {
                d.strides()[0]
            } else {
                d.shape()[1]
            },
            rows: d.shape()[0],
        },
        d.dtype,
    ))
}

pub(crate) fn fp8_scale<S: Storage + ?Sized>(
    s: &'static Spec,
    layout: RecordLayout,
    t: &Option<Tensor<'_, S>>,
) -> Result<Option<usize>> {
    match (layout, t) {
        (RecordLayout::Fp8Rows, Some(t)) => {
            s.dtype(&t.desc)?;
            if t.desc.numel() != 1 {
                return Err(shape_err(
                    "fp8_scale",
                    format!("expected one element, got shape {:?}", t.desc.shape()),
                ));
            }
            s.aligned(&t.desc)?;
            extent("fp8_scale", t.buf, &t.desc)?;
            Ok(Some(t.desc.offset))
        }
        (RecordLayout::Fp8Rows, None) => Err(Error::Missing {
            arg: "fp8_scale",
            problem: "required for an F8_E4M3 row cache",
        }),
        (_, Some(_)) => Err(Error::Missing {
            arg: "fp8_scale",
            problem: "only an F8_E4M3 row cache takes a per-tensor scale",
        }),
        (_, None) => Ok(None),
    }
}

/// Validates `rope_quant_insert`'s arguments.
pub fn plan_insert<S: Storage + ?Sized>(a: &InsertArgs<'_, S>) -> Result<InsertPlan> {
    ratio(a.compress_ratio)?;
    let i = &INSERT;
    i.latent.dtype(&a.latent.desc)?;
    if !a.latent.desc.is_contiguous() {
        return Err(shape_err("latent", "must be contiguous".into()));
    }
    let latent = rows(&i.latent, a.latent.buf, &a.latent.desc, DIM, 8)?;
    let positions = index(&i.positions, &a.positions)?;
    let slots = index(&i.slot_mapping, &a.slot_mapping)?;
    let (cs, cs_dtype) = cos_sin(&i.cos_sin_cache, &a.cos_sin_cache)?;
    let cache = cache(&i.kv_cache, &a.kv_cache, a.record_order)?;
    let fp8 = fp8_scale(&i.fp8_scale, cache.layout, &a.fp8_scale)?;
    n_tokens(
        slots.len,
        &[("latent", latent.rows), ("positions", positions.len)],
    )?;
    Ok(InsertPlan {
        n: slots.len,
        compress_ratio: a.compress_ratio,
        latent,
        positions,
        slots,
        cos_sin: cs,
        cos_sin_dtype: cs_dtype,
        cache,
        fp8_scale_offset: fp8,
    })
}

/// Validates `save_ring_rows`'s arguments.
pub fn plan_ring_rows<S: Storage + ?Sized>(a: &RingArgs<'_, S>) -> Result<RingRowsPlan> {
    let r = rows(&RING.rows, a.rows.buf, &a.rows.desc, 1024, 4)?;
    let slots = index(&RING.slot_mapping, &a.slot_mapping)?;
    if slots.len != r.rows {
        return Err(shape_err(
            "slot_mapping",
            format!(
                "has {} entries, expected one per row of rows ({})",
                slots.len, r.rows
            ),
        ));
    }
    let ring = ring(&RING.state_cache, &a.state_cache)?;
    n_tokens(slots.len, &[])?;
    Ok(RingRowsPlan {
        n: slots.len,
        rows: r,
        slots,
        ring,
    })
}

/// Validates the fused compress + insert.
pub fn plan_fused<S: Storage + ?Sized>(a: &FusedArgs<'_, S>) -> Result<FusedPlan> {
    let compress = plan_compress(&a.compress)?;
    let f = &FUSED_INSERT;
    let slots = index(&f.cache_slot_mapping, &a.cache_slot_mapping)?;
    if slots.len != compress.n {
        return Err(shape_err(
            "cache_slot_mapping",
            format!(
                "has {} entries, expected slot_mapping's {}",
                slots.len, compress.n
            ),
        ));
    }
    let (cs, cs_dtype) = cos_sin(&f.cos_sin_cache, &a.cos_sin_cache)?;
    let cache = cache(&f.kv_cache, &a.kv_cache, a.record_order)?;
    let fp8 = fp8_scale(&f.fp8_scale, cache.layout, &a.fp8_scale)?;
    Ok(FusedPlan {
        insert: InsertPlan {
            n: compress.n,
            compress_ratio: compress.compress_ratio,
            latent: compress.latent,
            positions: compress.positions,
            slots,
            cos_sin: cs,
            cos_sin_dtype: cs_dtype,
            cache,
            fp8_scale_offset: fp8,
        },
        compress,
        write_latent: !a.skip_latent_out,
    })
}

/// Tokens skipped because an index they carry points outside its tensor.
/// Such tokens write nothing; the counts let a caller notice.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SkipCounts {
    /// A slot at or beyond the cache's (or ring's) capacity.
    pub slot_out_of_range: u64,
    /// A negative position, or one whose cos/sin row is beyond the table.
    pub position_out_of_range: u64,
    /// A request index, chunk offset or `prev_row_indices` entry outside
    /// its tensor, or a token that is not inside its request's chunk.
    pub index_out_of_range: u64,
}

impl SkipCounts {
    /// Sum of all counts.
    pub fn total(&self) -> u64 {
        self.slot_out_of_range + self.position_out_of_range + self.index_out_of_range
    }

    /// Adds another set of counts.
    pub fn add(&mut self, o: SkipCounts) {
        self.slot_out_of_range += o.slot_out_of_range;
        self.position_out_of_range += o.position_out_of_range;
        self.index_out_of_range += o.index_out_of_range;
    }
}
