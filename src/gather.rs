//! The reader, `gather_dequant`: records gathered from a cache and written
//! back dequantized, BF16 or F32, one 512-value row per record, in the two
//! addressing forms serving stacks use:
//!
//! * a flat slot list, `slot_mapping [N]` → `out [N, 512]` (vLLM's slot
//!   gather of the DeepSeek V4 cache);
//! * a block table, `block_table [R, max_blocks]`, `cu_seq_lens [R + 1]` and
//!   optional `seq_starts [R]` → one contiguous `out [total, 512]` (AITER's
//!   `gather_and_maybe_dequant_cache`, vLLM's `cp_gather_cache`).
//!
//! Every value is the CPU decoder's ([`crate::layout::decode_record`]),
//! rounded once to BF16 ([`crate::formats::bf16_from_f32`]) or written as
//! F32 with one canonical NaN ([`crate::formats::f32_canonical`]). Which
//! output row reads which record, and what is skipped and counted, is
//! defined in `docs/layouts.md` ("Reading records back"); what every code
//! decodes to in `docs/numerics.md` ("Decoding").
//!
//! This module holds the arguments, their validation into a [`GatherPlan`],
//! the reference implementation (run by [`crate::CpuBackend`]; every backend
//! implements [`crate::Backend::gather_dequant`]), and the
//! device launch interface: the kernels ([`gather_kernel`]), the parameter
//! block ([`gather_params`] fills `KvGatherParams` of `kernels-hip/kv_abi.h`,
//! generated into [`crate::kernel_abi::GatherParams`]), and the launch shape.

use crate::backend::cpu::rd_index;
use crate::error::Result;
use crate::formats::{bf16_from_f32, f32_canonical};
use crate::kernel_abi::{flags as abi_flags, GatherParams, Geometry, Kernel, KernelParams};
use crate::launch::LaunchPolicy;
use crate::layout::{decode_record, RecordLayout, DIM};
use crate::ops::{
    aligned, cache_view, dtype, extent, fits_i32, fp8_scale, index, rows, shape_err, CachePlan,
    IndexPlan, RowsPlan, SkipCounts, MAX_TOKENS,
};
use crate::tensor::{DType, Storage, Tensor, TensorMut};
use rayon::prelude::*;

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
}

/// A 2-D index tensor (the block table) bound into a plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TablePlan {
    /// Byte offset in its buffer.
    pub offset: usize,
    /// I64 (else I32).
    pub is_i64: bool,
    /// Elements between rows.
    pub row_stride: usize,
    /// Rows (at least the number of requests).
    pub rows: usize,
    /// Columns: logical blocks per request.
    pub cols: usize,
}

/// The addressing form of a validated gather.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GatherAddressing {
    /// `slot_mapping`.
    Slots(IndexPlan),
    /// `block_table`, `cu_seq_lens`, `seq_starts`.
    BlockTable {
        /// The block table.
        table: TablePlan,
        /// `cu_seq_lens` (`num_reqs + 1` entries).
        cu_seq_lens: IndexPlan,
        /// `seq_starts`, if given.
        seq_starts: Option<IndexPlan>,
    },
}

/// Validated `gather_dequant`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GatherPlan {
    /// The cache.
    pub cache: CachePlan,
    /// FP8 rows: offset of the F32 scale.
    pub fp8_scale_offset: Option<usize>,
    /// The output rows.
    pub out: RowsPlan,
    /// Whether `out` is F32 (else BF16).
    pub out_f32: bool,
    /// Output rows processed: `N` (slot form) or `out`'s rows (block-table
    /// form); each is one item of the launch.
    pub n: usize,
    /// How rows find their records.
    pub addressing: GatherAddressing,
}

impl GatherPlan {
    /// Whether the slot form's own kernels (`_slots`, `_split`) serve this
    /// gather: I64 slots on a cache of at least one block whose blocks hold
    /// a power of two of rows, what vLLM and SGLang pass. Their row address
    /// is then one load, a shift and a mask, and a row whose slot is
    /// outside the cache loads row 0 of block 0 before it is skipped (no
    /// branch before the loads); other slot lists run the general kernels.
    pub fn slot_kernels(&self) -> bool {
        matches!(self.addressing, GatherAddressing::Slots(s) if s.is_i64)
            && self.cache.blocks > 0
            && self.cache.block_size.is_power_of_two()
    }

    /// Requests of the block-table form, else 0.
    pub fn num_reqs(&self) -> usize {
        match self.addressing {
            GatherAddressing::Slots(_) => 0,
            GatherAddressing::BlockTable { cu_seq_lens, .. } => cu_seq_lens.len - 1,
        }
    }
}

impl TablePlan {
    /// Entry `(r, j)` of the table in `b`.
    fn at(&self, b: &[u8], r: usize, j: usize) -> i64 {
        let e = self.offset + (r * self.row_stride + j) * if self.is_i64 { 8 } else { 4 };
        if self.is_i64 {
            i64::from_le_bytes(b[e..e + 8].try_into().expect("8 bytes"))
        } else {
            i32::from_le_bytes(b[e..e + 4].try_into().expect("4 bytes")) as i64
        }
    }
}

fn block_table<S: Storage + ?Sized>(t: &Tensor<'_, S>) -> Result<TablePlan> {
    let arg = "block_table";
    let d = &t.desc;
    dtype(arg, d, &[DType::I32, DType::I64], "I32 or I64")?;
    if d.rank() != 2 || (d.shape()[1] > 1 && d.strides()[1] != 1) {
        return Err(shape_err(
            arg,
            format!(
                "expected [requests, max_blocks] with unit inner stride, got shape {:?} strides {:?}",
                d.shape(),
                d.strides()
            ),
        ));
    }
    aligned(arg, d, d.dtype.size())?;
    extent(arg, t.buf, d)?;
    let (rows, cols) = (d.shape()[0], d.shape()[1]);
    fits_i32(arg, "rows", rows)?;
    fits_i32(arg, "max_blocks (dim 1)", cols)?;
    fits_i32(arg, "row stride", d.strides()[0])?;
    Ok(TablePlan {
        offset: d.offset,
        is_i64: d.dtype == DType::I64,
        row_stride: d.strides()[0],
        rows,
        cols,
    })
}

/// Validates `gather_dequant`'s arguments.
pub fn plan_gather<S: Storage + ?Sized>(a: &GatherArgs<'_, S>) -> Result<GatherPlan> {
    let cache = cache_view(a.kv_cache.buf, &a.kv_cache.desc)?;
    let fp8 = fp8_scale(cache.layout, &a.fp8_scale)?;
    let od = &a.out.desc;
    dtype("out", od, &[DType::BF16, DType::F32], "BF16 or F32")?;
    let out_f32 = od.dtype == DType::F32;
    // 16-byte rows: 8 BF16 or 4 F32 elements.
    let out = rows("out", &*a.out.buf, od, DIM, if out_f32 { 4 } else { 8 })?;
    if out.rows > MAX_TOKENS {
        return Err(shape_err(
            "out",
            format!("{} rows, at most {MAX_TOKENS} per call", out.rows),
        ));
    }
    let (n, addressing) = match &a.index {
        GatherIndex::Slots { slot_mapping } => {
            let s = index("slot_mapping", slot_mapping)?;
            if s.len > out.rows {
                return Err(shape_err(
                    "out",
                    format!(
                        "has {} rows but slot_mapping has {} entries; it needs one row per entry",
                        out.rows, s.len
                    ),
                ));
            }
            (s.len, GatherAddressing::Slots(s))
        }
        GatherIndex::BlockTable {
            block_table: bt,
            cu_seq_lens,
            seq_starts,
        } => {
            let cu = index("cu_seq_lens", cu_seq_lens)?;
            if cu.len == 0 || cu.len - 1 > MAX_TOKENS {
                return Err(shape_err(
                    "cu_seq_lens",
                    format!(
                        "has {} entries; needs num_reqs + 1 with 0 <= num_reqs <= {MAX_TOKENS}",
                        cu.len
                    ),
                ));
            }
            let reqs = cu.len - 1;
            let table = block_table(bt)?;
            if table.rows < reqs {
                return Err(shape_err(
                    "block_table",
                    format!(
                        "has {} rows, needs one per request ({reqs}, from cu_seq_lens)",
                        table.rows
                    ),
                ));
            }
            let starts = match seq_starts {
                Some(t) => {
                    let s = index("seq_starts", t)?;
                    if s.len < reqs {
                        return Err(shape_err(
                            "seq_starts",
                            format!(
                                "has {} entries, needs one per request ({reqs}, from cu_seq_lens)",
                                s.len
                            ),
                        ));
                    }
                    Some(s)
                }
                None => None,
            };
            (
                out.rows,
                GatherAddressing::BlockTable {
                    table,
                    cu_seq_lens: cu,
                    seq_starts: starts,
                },
            )
        }
    };
    Ok(GatherPlan {
        cache,
        fp8_scale_offset: fp8,
        out,
        out_f32,
        n,
        addressing,
    })
}

// ---- the reference ------------------------------------------------------

/// Where an output row's record is, or why there is none.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Located {
    /// Block and row of the cache.
    Record { block: usize, row: usize },
    /// Nothing to read, nothing counted (a slot `< 0`, a row no request owns).
    Nothing,
    /// Nothing to read, counted.
    Skip(SkipCounts),
}

fn skip(slot: u64, pos: u64, idx: u64) -> Located {
    Located::Skip(SkipCounts {
        slot_out_of_range: slot,
        position_out_of_range: pos,
        index_out_of_range: idx,
    })
}

/// `gather_dequant`'s inputs bound to their bytes.
struct GatherIn<'a> {
    p: &'a GatherPlan,
    cache: &'a [u8],
    fp8_scale: f32,
    slots: &'a [u8],
    table: &'a [u8],
    cu: &'a [u8],
    starts: &'a [u8],
}

impl GatherIn<'_> {
    /// The request search of `docs/layouts.md`: a binary search that, on a
    /// non-decreasing `cu_seq_lens`, finds the last request starting at or
    /// before row `o`. Written once, as the kernels run it, so that any
    /// `cu_seq_lens` gives the same rows everywhere.
    fn request_of(&self, cu: &IndexPlan, reqs: usize, o: i64) -> usize {
        let (mut lo, mut hi) = (0usize, reqs);
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            if rd_index(self.cu, cu, mid) <= o {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        lo
    }

    fn locate(&self, o: usize) -> Located {
        let c = &self.p.cache;
        let bs = c.block_size as i64;
        match &self.p.addressing {
            GatherAddressing::Slots(s) => {
                let slot = rd_index(self.slots, s, o);
                if slot < 0 {
                    return Located::Nothing;
                }
                if slot as u64 >= c.capacity() {
                    return skip(1, 0, 0);
                }
                Located::Record {
                    block: (slot / bs) as usize,
                    row: (slot % bs) as usize,
                }
            }
            GatherAddressing::BlockTable {
                table,
                cu_seq_lens: cu,
                seq_starts,
            } => {
                let reqs = cu.len - 1;
                if reqs == 0 {
                    return Located::Nothing;
                }
                let o = o as i64;
                let r = self.request_of(cu, reqs, o);
                let (c0, c1) = (rd_index(self.cu, cu, r), rd_index(self.cu, cu, r + 1));
                if !(c0 <= o && o < c1) {
                    return Located::Nothing;
                }
                let start = seq_starts.map_or(0, |s| rd_index(self.starts, &s, r));
                // o - c0 < 2^24 and fits; a position past i64 is past the table.
                let Some(pos) = (start >= 0).then(|| start.checked_add(o - c0)).flatten() else {
                    return skip(0, 1, 0);
                };
                let j = pos / bs;
                if j as u64 >= table.cols as u64 {
                    return skip(0, 1, 0);
                }
                let block = table.at(self.table, r, j as usize);
                if block < 0 || block as u64 >= c.blocks as u64 {
                    return skip(1, 0, 0);
                }
                Located::Record {
                    block: block as usize,
                    row: (pos % bs) as usize,
                }
            }
        }
    }

    /// The once-per-call check of the block-table form: a total beyond
    /// `out`'s rows leaves tokens ungathered.
    fn total_check(&self) -> SkipCounts {
        let mut k = SkipCounts::default();
        if let GatherAddressing::BlockTable {
            cu_seq_lens: cu, ..
        } = &self.p.addressing
        {
            if self.p.n > 0 && rd_index(self.cu, cu, cu.len - 1) > self.p.n as i64 {
                k.index_out_of_range = 1;
            }
        }
        k
    }

    /// Output row `o` into `out` (its `512 × element` bytes).
    fn row(&self, o: usize, out: &mut [u8]) -> SkipCounts {
        let (block, row) = match self.locate(o) {
            Located::Record { block, row } => (block, row),
            Located::Nothing => return SkipCounts::default(),
            Located::Skip(k) => return k,
        };
        let c = &self.p.cache;
        let l = c.layout;
        let page = c.offset + block * c.block_stride;
        let (values, scales) = if l.is_paged() {
            (
                page + row * l.value_bytes(),
                page + c.block_size * l.value_bytes() + row * l.scale_bytes(),
            )
        } else {
            (page + row * c.row_stride, 0)
        };
        let v = decode_record(
            l,
            &self.cache[values..values + l.value_bytes()],
            &self.cache[scales..scales + l.scale_bytes()],
            self.fp8_scale,
        );
        if self.p.out_f32 {
            for (d, x) in out.chunks_exact_mut(4).zip(v) {
                d.copy_from_slice(&f32_canonical(x).to_le_bytes());
            }
        } else {
            for (d, x) in out.chunks_exact_mut(2).zip(v) {
                d.copy_from_slice(&bf16_from_f32(x).to_le_bytes());
            }
        }
        SkipCounts::default()
    }
}

fn sum_counts(mut a: SkipCounts, b: SkipCounts) -> SkipCounts {
    a.add(b);
    a
}

/// The reference `gather_dequant` on a validated plan: rows in parallel on
/// the current rayon pool (each output row is written by one index at most,
/// so the order does not matter). Returns the skip counts.
pub(crate) fn gather_reference<S>(p: &GatherPlan, a: GatherArgs<'_, S>) -> SkipCounts
where
    S: Storage + AsRef<[u8]> + AsMut<[u8]> + ?Sized,
{
    let (slots, table, cu, starts): (&[u8], &[u8], &[u8], &[u8]) = match &a.index {
        GatherIndex::Slots { slot_mapping } => (slot_mapping.buf.as_ref(), &[], &[], &[]),
        GatherIndex::BlockTable {
            block_table,
            cu_seq_lens,
            seq_starts,
        } => (
            &[],
            block_table.buf.as_ref(),
            cu_seq_lens.buf.as_ref(),
            seq_starts.as_ref().map_or(&[][..], |t| t.buf.as_ref()),
        ),
    };
    let src = GatherIn {
        p,
        cache: a.kv_cache.buf.as_ref(),
        fp8_scale: match (p.fp8_scale_offset, &a.fp8_scale) {
            (Some(o), Some(t)) => {
                f32::from_le_bytes(t.buf.as_ref()[o..o + 4].try_into().expect("4 bytes"))
            }
            _ => 1.0,
        },
        slots,
        table,
        cu,
        starts,
    };
    let mut counts = src.total_check();
    if p.n == 0 {
        return counts;
    }
    let esz = if p.out_f32 { 4 } else { 2 };
    let (stride, row_bytes) = (p.out.row_stride * esz, DIM * esz);
    let start = p.out.offset;
    let end = start + (p.n - 1) * stride + row_bytes;
    let rows = a.out.buf.as_mut()[start..end]
        .par_chunks_mut(stride)
        .enumerate()
        .map(|(o, chunk)| src.row(o, &mut chunk[..row_bytes]))
        .reduce(SkipCounts::default, sum_counts);
    counts.add(rows);
    counts
}

// ---- the device launch interface ------------------------------------------

/// How a gather launch maps output rows to groups (of 32 lanes), each with
/// kernels of its own ([`gather_kernel`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GatherRows {
    /// Two consecutive rows a group (the general kernels, `KV_GF_TWO_ROWS`):
    /// only where the launch policy forces it.
    Two,
    /// A row a group: the slot form's `_slots` kernels, the general kernels
    /// for the block-table form.
    One,
    /// A row over two groups, one 16-byte output unit a lane (`_split`, the
    /// slot form's own kernels only): launches of at most
    /// [`gather_split_max_rows`] rows. One row a block of 64 threads, on a
    /// grid of exactly one block a row, whatever the policy's block size.
    Split,
}

/// The gather kernel for a layout, output type, addressing form and row
/// mapping. The slot form has kernels of its own (`slots`: I64 slots on
/// power-of-two pages, [`GatherPlan::slot_kernels`]) for a row a group
/// (`_slots`: neither the block-table search nor the second row, so a
/// launch reaches its loads sooner) and a row over two groups (`_split`);
/// the general kernels serve every form with one or two rows a group
/// (`KV_GF_BLOCK_TABLE`, `KV_GF_TWO_ROWS`).
pub fn gather_kernel(layout: RecordLayout, out_f32: bool, slots: bool, rows: GatherRows) -> Kernel {
    use Kernel::*;
    let general = [
        [GatherV4Bf16, GatherV4F32],
        [GatherMxfp8Bf16, GatherMxfp8F32],
        [GatherNvfp4Bf16, GatherNvfp4F32],
        [GatherBf16Bf16, GatherBf16F32],
        [GatherFp8Bf16, GatherFp8F32],
    ];
    let slot_rows = [
        [GatherV4Bf16Slots, GatherV4F32Slots],
        [GatherMxfp8Bf16Slots, GatherMxfp8F32Slots],
        [GatherNvfp4Bf16Slots, GatherNvfp4F32Slots],
        [GatherBf16Bf16Slots, GatherBf16F32Slots],
        [GatherFp8Bf16Slots, GatherFp8F32Slots],
    ];
    let split = [
        [GatherV4Bf16Split, GatherV4F32Split],
        [GatherMxfp8Bf16Split, GatherMxfp8F32Split],
        [GatherNvfp4Bf16Split, GatherNvfp4F32Split],
        [GatherBf16Bf16Split, GatherBf16F32Split],
        [GatherFp8Bf16Split, GatherFp8F32Split],
    ];
    let l = match layout {
        RecordLayout::V4 => 0,
        RecordLayout::Mxfp8 => 1,
        RecordLayout::Nvfp4 => 2,
        RecordLayout::Bf16Rows => 3,
        RecordLayout::Fp8Rows => 4,
    };
    let table = match (slots, rows) {
        (true, GatherRows::One) => &slot_rows,
        (true, GatherRows::Split) => &split,
        _ => &general,
    };
    table[l][usize::from(out_f32)]
}

/// The kernel that runs `launch` of plan `p` ([`gather_kernel`]; the slot
/// form's own where [`GatherPlan::slot_kernels`]).
pub fn gather_launch_kernel(p: &GatherPlan, launch: &GatherLaunch) -> Kernel {
    gather_kernel(p.cache.layout, p.out_f32, p.slot_kernels(), launch.rows)
}

/// Flag bits of [`GatherParams::flags`] (`KV_GF_*` in kv_abi.h); bits
/// 12..14 hold the groups per block as for every kernel
/// ([`crate::kernel_abi::flags::GROUPS_LOG2_SHIFT`]).
pub mod gather_flags {
    /// The block-table form (else the slot form).
    pub const BLOCK_TABLE: u32 = 1;
    /// `slot_mapping` is I64.
    pub const SLOT_I64: u32 = 2;
    /// `block_table` is I64.
    pub const TABLE_I64: u32 = 4;
    /// `cu_seq_lens` is I64.
    pub const CU_I64: u32 = 8;
    /// `seq_starts` is I64.
    pub const STARTS_I64: u32 = 16;
    /// `seq_starts` given.
    pub const HAS_STARTS: u32 = 32;
    /// Each group gathers two consecutive rows ([`super::GatherLaunch`]).
    pub const TWO_ROWS: u32 = 64;
    const _: () = assert!(TWO_ROWS < 1 << crate::kernel_abi::flags::GROUPS_LOG2_SHIFT);
}

impl KernelParams for GatherParams {
    fn with_geometry(mut self, g: &Geometry) -> Self {
        self.flags = (self.flags & !abi_flags::GROUPS_LOG2_MASK)
            | (g.groups_log2 << abi_flags::GROUPS_LOG2_SHIFT);
        self
    }
}

/// Device base addresses of a gather's buffers (the plan's view offsets
/// are added by [`gather_params`]); 0 for tensors the call does not have.
#[derive(Debug, Clone, Copy, Default)]
#[allow(missing_docs)]
pub struct GatherPtrs {
    pub cache: u64,
    pub slots: u64,
    pub block_table: u64,
    pub cu_seq_lens: u64,
    pub seq_starts: u64,
    pub fp8_scale: u64,
    pub out: u64,
    pub counters: u64,
}

/// Slot-form launches of at most this many rows of `layout` split each row
/// over two groups ([`GatherRows::Split`]) unless the launch policy says
/// otherwise ([`LaunchPolicy::gather_split_rows`]): there a group's chain
/// of loads and conversions is most of the launch, and halving it gains
/// more than the second group costs. V4 and MXFP8, whose code units take
/// the most instructions, gain up to 512 rows; the other layouts up to 256
/// (docs/tuning.md, "The reader").
pub fn gather_split_max_rows(layout: RecordLayout) -> usize {
    match layout {
        RecordLayout::V4 | RecordLayout::Mxfp8 => 512,
        _ => 256,
    }
}

/// The shape of one gather launch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GatherLaunch {
    /// Grid and block ([`LaunchPolicy::geometry`] of the groups).
    pub geometry: Geometry,
    /// How rows map to groups.
    pub rows: GatherRows,
}

/// The launch for `n` rows of `layout` under `policy`, `slots` when the
/// slot form's own kernels serve it ([`GatherPlan::slot_kernels`]): a row
/// a group, two where [`LaunchPolicy::gather_two_rows`] forces it, and a
/// row over two groups for slot-kernel launches of at most
/// [`gather_split_max_rows`] rows (or as
/// [`LaunchPolicy::gather_split_rows`] forces). `None` when there is
/// nothing to launch.
pub fn gather_launch(
    policy: &LaunchPolicy,
    layout: RecordLayout,
    n: usize,
    slots: bool,
) -> Option<GatherLaunch> {
    if n == 0 {
        return None;
    }
    let rows = if policy.gather_two_rows.unwrap_or(false) {
        GatherRows::Two
    } else if slots
        && policy
            .gather_split_rows
            .unwrap_or(n <= gather_split_max_rows(layout))
    {
        GatherRows::Split
    } else {
        GatherRows::One
    };
    let geometry = match rows {
        GatherRows::Two => policy.geometry(n.div_ceil(2) as u64),
        GatherRows::One => policy.geometry(n as u64),
        // A row a block (its two groups), on a grid of exactly n: the split
        // kernels take their row from the block index.
        GatherRows::Split => LaunchPolicy::geometry_of_blocks(2, 2 * n as u64),
    };
    Some(GatherLaunch { geometry, rows })
}

fn i64_flag(p: &IndexPlan, bit: u32) -> u32 {
    if p.is_i64 {
        bit
    } else {
        0
    }
}

/// Parameter block of a gather plan for `launch`, given its buffers' base
/// addresses.
pub fn gather_params(p: &GatherPlan, b: &GatherPtrs, launch: &GatherLaunch) -> GatherParams {
    let mut g = GatherParams {
        cache: b.cache + p.cache.offset as u64,
        fp8_scale: p.fp8_scale_offset.map_or(0, |o| b.fp8_scale + o as u64),
        out: b.out + p.out.offset as u64,
        counters: b.counters,
        out_row_stride: p.out.row_stride as i32,
        block_stride: p.cache.block_stride as i32,
        row_stride: p.cache.row_stride as i32,
        num_blocks: p.cache.blocks as i32,
        block_size: p.cache.block_size as i32,
        block_shift: if p.cache.block_size.is_power_of_two() {
            p.cache.block_size.trailing_zeros() as i32
        } else {
            -1
        },
        n: p.n as i32,
        ..Default::default()
    };
    let mut f = if launch.rows == GatherRows::Two {
        gather_flags::TWO_ROWS
    } else {
        0
    };
    match p.addressing {
        GatherAddressing::Slots(s) => {
            g.slots = b.slots + s.offset as u64;
            f |= i64_flag(&s, gather_flags::SLOT_I64);
        }
        GatherAddressing::BlockTable {
            table,
            cu_seq_lens,
            seq_starts,
        } => {
            g.block_table = b.block_table + table.offset as u64;
            g.table_row_stride = table.row_stride as i32;
            g.max_blocks = table.cols as i32;
            g.cu_seq_lens = b.cu_seq_lens + cu_seq_lens.offset as u64;
            g.num_reqs = (cu_seq_lens.len - 1) as i32;
            f |= gather_flags::BLOCK_TABLE | i64_flag(&cu_seq_lens, gather_flags::CU_I64);
            if table.is_i64 {
                f |= gather_flags::TABLE_I64;
            }
            if let Some(s) = seq_starts {
                g.seq_starts = b.seq_starts + s.offset as u64;
                f |= gather_flags::HAS_STARTS | i64_flag(&s, gather_flags::STARTS_I64);
            }
        }
    }
    g.flags = f;
    g.with_geometry(&launch.geometry)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernels_take_the_gather_block_and_are_named_by_layout() {
        for l in RecordLayout::ALL {
            for f32 in [false, true] {
                for slots in [false, true] {
                    for rows in [GatherRows::Two, GatherRows::One, GatherRows::Split] {
                        let k = gather_kernel(l, f32, slots, rows);
                        assert_eq!(k.param_block(), GatherParams::C_NAME);
                        let out = if f32 { "f32" } else { "bf16" };
                        let form = match (slots, rows) {
                            (true, GatherRows::One) => "_slots",
                            (true, GatherRows::Split) => "_split",
                            _ => "",
                        };
                        assert_eq!(k.name(), format!("kv_gather_{}_{out}{form}", l.name()));
                    }
                }
            }
        }
    }

    /// The value of `#define name value` in kv_abi.h.
    fn abi_define(name: &str) -> u32 {
        let line = include_str!("../kernels-hip/kv_abi.h")
            .lines()
            .find(|l| l.split_whitespace().take(2).eq(["#define", name]))
            .unwrap_or_else(|| panic!("kv_abi.h defines {name}"));
        let v = line.split_whitespace().nth(2).expect("a value");
        v.trim_end_matches('u').parse().expect("a number")
    }

    #[test]
    fn host_and_kernel_flags_agree() {
        use gather_flags::*;
        for (name, v) in [
            ("KV_GF_BLOCK_TABLE", BLOCK_TABLE),
            ("KV_GF_SLOT_I64", SLOT_I64),
            ("KV_GF_TABLE_I64", TABLE_I64),
            ("KV_GF_CU_I64", CU_I64),
            ("KV_GF_STARTS_I64", STARTS_I64),
            ("KV_GF_HAS_STARTS", HAS_STARTS),
            ("KV_GF_TWO_ROWS", TWO_ROWS),
        ] {
            assert_eq!(abi_define(name), v, "{name}");
        }
    }

    #[test]
    fn launches_cover_every_row() {
        for slots in [false, true] {
            assert_eq!(
                gather_launch(&LaunchPolicy::default(), RecordLayout::Mxfp8, 0, slots),
                None
            );
        }
        for layout in RecordLayout::ALL {
            let split = gather_split_max_rows(layout);
            for n in [
                1usize,
                2,
                3,
                64,
                65,
                split,
                split + 1,
                2047,
                2048,
                4097,
                65537,
            ] {
                for two in [None, Some(false), Some(true)] {
                    for force in [None, Some(false), Some(true)] {
                        for slots in [false, true] {
                            let pol = LaunchPolicy {
                                gather_two_rows: two,
                                gather_split_rows: force,
                                ..LaunchPolicy::default()
                            };
                            let l = gather_launch(&pol, layout, n, slots).unwrap();
                            let groups = u64::from(l.geometry.grid) << l.geometry.groups_log2;
                            let rows = match l.rows {
                                GatherRows::Two => 2 * groups,
                                GatherRows::One => groups,
                                // A row a block of two groups, a block a row.
                                GatherRows::Split => {
                                    assert_eq!(l.geometry.groups_log2, 1);
                                    assert_eq!(l.geometry.grid as usize, n);
                                    groups / 2
                                }
                            };
                            assert!(rows >= n as u64, "n {n} {two:?} {force:?}");
                            assert_eq!(l.geometry.block_threads, 32 << l.geometry.groups_log2);
                            let want = if two == Some(true) {
                                GatherRows::Two
                            } else if slots && force.unwrap_or(n <= split) {
                                GatherRows::Split
                            } else {
                                GatherRows::One
                            };
                            assert_eq!(
                                l.rows, want,
                                "{layout:?} n {n} {two:?} {force:?} slots {slots}"
                            );
                        }
                    }
                }
            }
        }
        // The split's block is its own whatever the policy's block size.
        for gpb in [2, 4, 8] {
            let pol = LaunchPolicy {
                groups_per_block: Some(gpb),
                ..LaunchPolicy::default()
            };
            for n in [1usize, 3, 256] {
                let l = gather_launch(&pol, RecordLayout::Mxfp8, n, true).unwrap();
                assert_eq!(l.rows, GatherRows::Split);
                assert_eq!((l.geometry.grid, l.geometry.block_threads), (n as u32, 64));
            }
        }
        // The split stops at 512 rows for V4 and MXFP8, at 256 for the rest.
        assert_eq!(gather_split_max_rows(RecordLayout::V4), 512);
        assert_eq!(gather_split_max_rows(RecordLayout::Nvfp4), 256);
    }
}
