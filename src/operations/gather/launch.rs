//! The reader's launch policy: which kernel runs a gather and in what
//! shape, from the plan and the backend's [`LaunchPolicy`].

use super::GatherPlan;
use crate::kernel_abi::{Geometry, Kernel};
use crate::launch::LaunchPolicy;
use crate::layout::RecordLayout;

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
