//! The reader's parameter block: [`GatherParams`] (generated from
//! `kernels-hip/kv_abi.h`) filled from a plan, its buffers' addresses and
//! the launch shape.

use super::{GatherAddressing, GatherLaunch, GatherPlan, GatherRows};
use crate::kernel_abi::{
    flags as abi_flags, i64_flag, pow2_shift, GatherParams, Geometry, KernelParams,
};
use crate::layout::RecordOrder;

/// Flag bits of [`GatherParams::flags`] (`KV_GF_*` in kv_abi.h); bits
/// 12..14 hold the groups per block as for every kernel
/// ([`crate::kernel_abi::flags::GROUPS_LOG2_SHIFT`]).
pub mod gather_flags {
    use crate::kernel_abi::defines;

    /// The block-table form (else the slot form).
    pub const BLOCK_TABLE: u32 = defines::KV_GF_BLOCK_TABLE;
    /// `slot_mapping` is I64.
    pub const SLOT_I64: u32 = defines::KV_GF_SLOT_I64;
    /// `block_table` is I64.
    pub const TABLE_I64: u32 = defines::KV_GF_TABLE_I64;
    /// `cu_seq_lens` is I64.
    pub const CU_I64: u32 = defines::KV_GF_CU_I64;
    /// `seq_starts` is I64.
    pub const STARTS_I64: u32 = defines::KV_GF_STARTS_I64;
    /// `seq_starts` given.
    pub const HAS_STARTS: u32 = defines::KV_GF_HAS_STARTS;
    /// Each group gathers two consecutive rows ([`super::GatherLaunch`]).
    pub const TWO_ROWS: u32 = defines::KV_GF_TWO_ROWS;
    /// The paged records are in the per-token order.
    pub const PER_TOKEN: u32 = defines::KV_GF_PER_TOKEN;
    const _: () = assert!(TWO_ROWS < 1 << crate::kernel_abi::flags::GROUPS_LOG2_SHIFT);
    const _: () = assert!(PER_TOKEN < 1 << crate::kernel_abi::flags::GROUPS_LOG2_SHIFT);
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
        block_shift: pow2_shift(p.cache.block_size),
        n: p.n as i32,
        ..Default::default()
    };
    let mut f = if launch.rows == GatherRows::Two {
        gather_flags::TWO_ROWS
    } else {
        0
    };
    if p.cache.order == RecordOrder::PerToken {
        f |= gather_flags::PER_TOKEN;
    }
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
