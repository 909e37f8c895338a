//! The indexer key store's launch and parameter block:
//! [`IndexerKParams`] (generated from `kernels-hip/kv_abi.h`) filled from a
//! plan and its buffers' addresses.

use super::{IndexerKFormat, IndexerKOrder, IndexerKPlan};
use crate::kernel_abi::{
    cos_sin_flags, flags as abi_flags, i64_flag, pow2_shift, set_groups, Geometry, IndexerKParams,
    Kernel, KernelParams,
};
use crate::launch::{Launch, LaunchPolicy};
use crate::tensor::DType;

/// Flag bits of [`IndexerKParams::flags`] of this operation's own (`KV_IKF_*`
/// in kv_abi.h), beside the shared input-type bits.
pub mod indexer_k_flags {
    use crate::kernel_abi::defines;

    /// FP8 scales as four UE8M0 bytes.
    pub const MX_SCALE: u32 = defines::KV_IKF_MX_SCALE;
    /// FP8 values in ROCm's 16 x 16 tiles.
    pub const TILED: u32 = defines::KV_IKF_TILED;
    /// MXFP4 in AITER's preshuffled order.
    pub const PRESHUFFLED: u32 = defines::KV_IKF_PRESHUFFLED;
    const _: () = assert!(PRESHUFFLED < 1 << crate::kernel_abi::flags::GROUPS_LOG2_SHIFT);
}

impl KernelParams for IndexerKParams {
    fn with_geometry(mut self, g: &Geometry) -> Self {
        self.flags = set_groups(self.flags, g);
        self
    }
}

/// Device base addresses of a call's buffers (the plan's view offsets are
/// added by [`indexer_k_params`]).
#[derive(Debug, Clone, Copy, Default)]
#[allow(missing_docs)]
pub struct IndexerKPtrs {
    pub k_pre: u64,
    pub positions: u64,
    pub slots: u64,
    pub cos_sin: u64,
    pub weight: u64,
    pub cache: u64,
    pub counters: u64,
}

/// Tokens a group of 32 lanes handles (eight lanes a token).
pub const TOKENS_PER_GROUP: usize = 4;

/// The launch of a plan: four tokens a group of 32 lanes, the format's kernel.
pub fn indexer_k_launch(policy: &LaunchPolicy, p: &IndexerKPlan) -> Launch {
    Launch {
        kernel: match p.cache.format {
            IndexerKFormat::Fp8 => Kernel::IndexerKFp8,
            IndexerKFormat::Mxfp4 => Kernel::IndexerKMxfp4,
        },
        // Four tokens a group of 32 lanes (kv_indexer_k.hip).
        geometry: policy.geometry(p.n.div_ceil(TOKENS_PER_GROUP) as u64),
    }
}

/// Parameter block of a plan, given its buffers' base addresses.
pub fn indexer_k_params(p: &IndexerKPlan, b: &IndexerKPtrs) -> IndexerKParams {
    let mut f =
        i64_flag(&p.positions, abi_flags::POS_I64) | i64_flag(&p.slots, abi_flags::SLOT_I64);
    f |= cos_sin_flags(p.cos_sin_dtype);
    f |= match p.weight_dtype {
        DType::F16 => abi_flags::W_F16,
        DType::F32 => abi_flags::W_F32,
        _ => 0,
    };
    if p.cache.mx_scale {
        f |= indexer_k_flags::MX_SCALE;
    }
    let n_per_tile = match p.cache.order {
        IndexerKOrder::RowMajor => 0,
        IndexerKOrder::Tiled => {
            f |= indexer_k_flags::TILED;
            0
        }
        IndexerKOrder::Preshuffled { n_per_tile } => {
            f |= indexer_k_flags::PRESHUFFLED;
            n_per_tile
        }
    };
    IndexerKParams {
        k_pre: b.k_pre + p.k_pre.offset as u64,
        positions: b.positions + p.positions.offset as u64,
        slots: b.slots + p.slots.offset as u64,
        cos_sin: b.cos_sin + p.cos_sin.offset as u64,
        weight: b.weight + p.weight_offset as u64,
        cache: b.cache + p.cache.offset as u64,
        counters: b.counters,
        k_row_stride: p.k_pre.row_stride as i32,
        cos_row_stride: p.cos_sin.row_stride as i32,
        cos_rows: p.cos_sin.rows as i32,
        block_stride: p.cache.block_stride as i32,
        num_blocks: p.cache.blocks as i32,
        block_size: p.cache.block_size as i32,
        block_shift: pow2_shift(p.cache.block_size),
        n: p.n as i32,
        compress_ratio: p.compress_ratio,
        n_per_tile,
        eps: p.eps,
        flags: f,
    }
}
