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
//! It follows the writer's seams: the arguments live with the others in
//! [`crate::ops`]; this module validates them into a [`GatherPlan`];
//! [`reference`] is the CPU implementation (run by [`crate::CpuBackend`];
//! every backend implements [`crate::Backend::gather_dequant`]); [`launch`]
//! chooses the kernel and the launch shape; [`abi`] fills the parameter
//! block (`KvGatherParams` of `kernels-hip/kv_abi.h`, generated into
//! [`crate::kernel_abi::GatherParams`]).

pub mod abi;
pub mod launch;
pub mod reference;

pub use self::abi::{gather_flags, gather_params, GatherPtrs};
pub use self::launch::{
    gather_kernel, gather_launch, gather_launch_kernel, gather_split_max_rows, GatherLaunch,
    GatherRows,
};
pub(crate) use self::reference::gather_reference;
pub use crate::ops::{GatherArgs, GatherIndex};

use crate::error::Result;
use crate::layout::DIM;
use crate::ops::{
    cache_view, extent, fits_i32, fp8_scale, index, offsets, rows, shape_err, view_err, CachePlan,
    IndexPlan, RowsPlan, GATHER, MAX_TOKENS,
};
use crate::tensor::{DType, Storage, Tensor};

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
    let s = &GATHER.block_table;
    let (arg, d) = (s.arg, &t.desc);
    s.dtype(d)?;
    if d.rank() != 2 || (d.shape()[1] > 1 && d.strides()[1] != 1) {
        return Err(view_err(
            arg,
            "expected [requests, max_blocks] with unit inner stride",
            d,
        ));
    }
    s.aligned(d)?;
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
    let g = &GATHER;
    let cache = cache_view(
        &g.kv_cache,
        a.kv_cache.buf,
        &a.kv_cache.desc,
        a.record_order,
    )?;
    let fp8 = fp8_scale(&g.fp8_scale, cache.layout, &a.fp8_scale)?;
    let od = &a.out.desc;
    g.out.dtype(od)?;
    let out_f32 = od.dtype == DType::F32;
    // 16-byte rows: 8 BF16 or 4 F32 elements.
    let out = rows(&g.out, &*a.out.buf, od, DIM, if out_f32 { 4 } else { 8 })?;
    if out.rows > MAX_TOKENS {
        return Err(shape_err(
            "out",
            format!("{} rows, at most {MAX_TOKENS} per call", out.rows),
        ));
    }
    let (n, addressing) = match &a.index {
        GatherIndex::Slots { slot_mapping } => {
            let s = index(&g.slot_mapping, slot_mapping)?;
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
            let cu = offsets(&g.cu_seq_lens, cu_seq_lens)?;
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
                    let s = index(&g.seq_starts, t)?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel_abi::GatherParams;
    use crate::launch::LaunchPolicy;
    use crate::layout::RecordLayout;

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
        let line = include_str!("../../../kernels-hip/kv_abi.h")
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
