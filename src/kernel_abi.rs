//! The binary interface of the device kernels, shared by the CUDA and HIP
//! backends: kernel names, `#[repr(C)]` parameter blocks that mirror the
//! structs at the top of `kernels-hip/kvcache.hip` field for field, and how
//! a launch's shape reaches the kernel. Which kernel runs and in what shape
//! is [`crate::launch`]'s choice.
//!
//! Every kernel takes one parameter block by value. A token (or a request)
//! is handled by a group of [`GROUP_LANES`] threads; the launch policy picks
//! how many groups make a block ([`Geometry`]) and tells the kernel through
//! the flags word ([`KernelParams::with_geometry`]). The kernels never
//! assume a warp or wavefront width:
//! a group's lanes exchange values only with xor-butterflies of distance
//! below 32, which stay inside one aligned 32-lane group on 32-lane warps and
//! on 64-lane wavefronts alike.

use crate::layout::RecordLayout;
use crate::ops::{CompressPlan, FusedPlan, IndexPlan, InsertPlan, RingRowsPlan};

/// Threads that handle one token.
pub const GROUP_LANES: u32 = 32;
/// The most threads per block any kernel is built for (its launch bounds).
pub const BLOCK_THREADS: u32 = 256;
/// Skip counters a kernel may increment: slot, position, index.
pub const NUM_COUNTERS: usize = 3;

/// Every kernel in the code objects.
pub const KERNEL_NAMES: &[&str] = &[
    "kv_compress_cr1",
    "kv_compress_cr2",
    "kv_save_ring_rows",
    "kv_insert_v4",
    "kv_insert_mxfp8",
    "kv_insert_nvfp4",
    "kv_insert_bf16",
    "kv_insert_fp8",
    "kv_fused_cr1_v4",
    "kv_fused_cr1_mxfp8",
    "kv_fused_cr1_nvfp4",
    "kv_fused_cr1_bf16",
    "kv_fused_cr1_fp8",
    "kv_fused_cr2_v4",
    "kv_fused_cr2_mxfp8",
    "kv_fused_cr2_nvfp4",
    "kv_fused_cr2_bf16",
    "kv_fused_cr2_fp8",
    "kv_compress_cr2_team",
    "kv_fused_cr2_team_v4",
    "kv_fused_cr2_team_mxfp8",
    "kv_fused_cr2_team_nvfp4",
    "kv_fused_cr2_team_bf16",
    "kv_fused_cr2_team_fp8",
    "kv_insert_nvfp4_tiles",
    "kv_insert_bf16_tiles",
    "kv_insert_fp8_tiles",
    "kv_compress_cr2_pair",
    "kv_fused_cr2_pair_v4",
    "kv_fused_cr2_pair_mxfp8",
    "kv_fused_cr2_pair_nvfp4",
    "kv_fused_cr2_pair_bf16",
    "kv_fused_cr2_pair_fp8",
    "kv_compress_cr2_long",
    "kv_fused_cr2_long_v4",
    "kv_fused_cr2_long_mxfp8",
    "kv_fused_cr2_long_nvfp4",
    "kv_fused_cr2_long_bf16",
    "kv_fused_cr2_long_fp8",
    "kv_compress_cr2_team_mtp",
    "kv_compress_cr2_pair_mtp",
    "kv_fused_cr2_team_mtp_v4",
    "kv_fused_cr2_team_mtp_mxfp8",
    "kv_fused_cr2_team_mtp_nvfp4",
    "kv_fused_cr2_team_mtp_bf16",
    "kv_fused_cr2_team_mtp_fp8",
];

/// The insert kernel for a layout.
pub fn insert_kernel(layout: RecordLayout) -> &'static str {
    match layout {
        RecordLayout::V4 => "kv_insert_v4",
        RecordLayout::Mxfp8 => "kv_insert_mxfp8",
        RecordLayout::Nvfp4 => "kv_insert_nvfp4",
        RecordLayout::Bf16Rows => "kv_insert_bf16",
        RecordLayout::Fp8Rows => "kv_insert_fp8",
    }
}

/// The tile-major insert kernel of a layout, where it has one: a block's
/// tokens as NoPE tiles first, then their RoPE tiles, so that whole warps
/// skip the RoPE work (see `kv_tile_of_thread` in kernels-hip/kvcache.hip).
/// Only layouts whose 16-dim tiles need no other lane have one.
pub fn insert_tiles_kernel(layout: RecordLayout) -> Option<&'static str> {
    match layout {
        RecordLayout::Nvfp4 => Some("kv_insert_nvfp4_tiles"),
        RecordLayout::Bf16Rows => Some("kv_insert_bf16_tiles"),
        RecordLayout::Fp8Rows => Some("kv_insert_fp8_tiles"),
        RecordLayout::V4 | RecordLayout::Mxfp8 => None,
    }
}

/// The fused kernel for a compress ratio and layout (one group per item).
pub fn fused_kernel(compress_ratio: u32, layout: RecordLayout) -> &'static str {
    let i = layout_index(layout);
    if compress_ratio == 1 {
        KERNEL_NAMES[8 + i]
    } else {
        KERNEL_NAMES[13 + i]
    }
}

/// The fused CR2 kernel that gives each item a team of
/// [`CR2_TEAM_GROUPS`] groups.
pub fn fused_team_kernel(layout: RecordLayout) -> &'static str {
    KERNEL_NAMES[19 + layout_index(layout)]
}

/// The fused CR2 kernel that gives each item a pair of groups
/// ([`CR2_PAIR_GROUPS`]).
pub fn fused_pair_kernel(layout: RecordLayout) -> &'static str {
    KERNEL_NAMES[28 + layout_index(layout)]
}

/// The fused CR2 kernel for long chunks: lone groups pooling by halves
/// ([`Cr2Items::LoneHalves`]).
pub fn fused_long_kernel(layout: RecordLayout) -> &'static str {
    KERNEL_NAMES[34 + layout_index(layout)]
}

/// The fused CR2 team kernel of screened launches that are not mostly
/// one-token requests ([`Cr2Shape::multi_token`]).
pub fn fused_team_mtp_kernel(layout: RecordLayout) -> &'static str {
    KERNEL_NAMES[41 + layout_index(layout)]
}

fn layout_index(layout: RecordLayout) -> usize {
    RecordLayout::ALL
        .iter()
        .position(|l| *l == layout)
        .expect("every layout is in ALL")
}

/// The compress kernel for a compress ratio.
pub fn compress_kernel(compress_ratio: u32) -> &'static str {
    if compress_ratio == 1 {
        "kv_compress_cr1"
    } else {
        "kv_compress_cr2"
    }
}

/// Flag bits of the parameter blocks: which index tensors are I64.
pub mod flags {
    /// `positions` is I64.
    pub const POS_I64: u32 = 1;
    /// `slot_mapping` is I64.
    pub const SLOT_I64: u32 = 2;
    /// `query_start_loc` is I64.
    pub const QSL_I64: u32 = 4;
    /// `token_to_req_indices` is I64.
    pub const TTR_I64: u32 = 8;
    /// `prev_row_indices` is I64.
    pub const PRI_I64: u32 = 16;
    /// `prev_rows` given.
    pub const HAS_PREV: u32 = 32;
    /// `latent_out` written (fused kernels).
    pub const WRITE_LATENT: u32 = 64;
    /// `cos_sin_cache` is BF16.
    pub const COS_BF16: u32 = 128;
    /// NaN sanitizing.
    pub const SANITIZE: u32 = 256;
    /// CR2 team launches: a token block checks one token per group and
    /// pools those that close a group (set at launch from
    /// [`super::Geometry::screen_tokens`]).
    pub const SCREEN_TOKENS: u32 = 512;
    /// Bits 12..14: log2 of the groups per block (set at launch by
    /// [`super::KernelParams::with_geometry`]).
    pub const GROUPS_LOG2_SHIFT: u32 = 12;
    /// Mask of the groups-per-block field.
    pub const GROUPS_LOG2_MASK: u32 = 7 << GROUPS_LOG2_SHIFT;
    // Every other flag sits below the field.
    const _: () = assert!(SCREEN_TOKENS < 1 << GROUPS_LOG2_SHIFT);
}

/// `KvCompressParams`. Pointers are device addresses; strides in elements.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct CompressParams {
    /// `const float*` kv_score.
    pub kv_score: u64,
    /// `const void*` positions.
    pub positions: u64,
    /// `const void*` slot_mapping.
    pub slots: u64,
    /// `const void*` query_start_loc (CR2).
    pub qsl: u64,
    /// `const void*` token_to_req_indices (CR2).
    pub ttr: u64,
    /// `const uint16_t*` rms_norm_weight.
    pub weight: u64,
    /// `uint16_t*` latent_out.
    pub latent: u64,
    /// `float*` state_cache (CR2).
    pub ring: u64,
    /// `const float*` prev_rows.
    pub prev_rows: u64,
    /// `const void*` prev_row_indices.
    pub prev_idx: u64,
    /// `unsigned*` skip counters.
    pub counters: u64,
    /// kv_score row stride.
    pub kv_row_stride: i32,
    /// Ring block stride.
    pub ring_block_stride: i32,
    /// Ring row stride.
    pub ring_row_stride: i32,
    /// Ring blocks.
    pub ring_blocks: i32,
    /// Ring rows per block.
    pub ring_capacity: i32,
    /// prev_rows row stride.
    pub prev_row_stride: i32,
    /// prev_rows rows.
    pub prev_rows_n: i32,
    /// Tokens.
    pub n: i32,
    /// Requests (CR2).
    pub num_reqs: i32,
    /// RMSNorm epsilon.
    pub eps: f32,
    /// [`flags`].
    pub flags: u32,
    /// `log2(ring_capacity)`, or -1 when the capacity is not a power of two
    /// (or there is no ring).
    pub ring_shift: i32,
}

/// `KvInsertParams`. Pointers are device addresses.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct InsertParams {
    /// `const uint16_t*` latent.
    pub latent: u64,
    /// `const void*` positions.
    pub positions: u64,
    /// `const void*` slot_mapping.
    pub slots: u64,
    /// `const void*` cos_sin_cache (F32 or BF16).
    pub cos_sin: u64,
    /// `uint8_t*` kv_cache.
    pub cache: u64,
    /// `const float*` fp8_scale (FP8 rows).
    pub fp8_scale: u64,
    /// `unsigned*` skip counters.
    pub counters: u64,
    /// Latent row stride (elements).
    pub latent_row_stride: i32,
    /// cos/sin row stride (elements).
    pub cos_row_stride: i32,
    /// cos/sin rows.
    pub cos_rows: i32,
    /// Bytes between cache blocks.
    pub block_stride: i32,
    /// Bytes between rows (rows layouts).
    pub row_stride: i32,
    /// Cache blocks.
    pub num_blocks: i32,
    /// Rows per block.
    pub block_size: i32,
    /// Tokens.
    pub n: i32,
    /// 1 or 2.
    pub compress_ratio: u32,
    /// [`flags`].
    pub flags: u32,
    /// `log2(block_size)`, or -1 when the block size is not a power of two.
    pub block_shift: i32,
    /// Padding to 8 bytes.
    pub pad: u32,
}

/// `KvRingRowsParams`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RingRowsParams {
    /// `const float*` rows.
    pub rows: u64,
    /// `const void*` slot_mapping.
    pub slots: u64,
    /// `float*` state_cache.
    pub ring: u64,
    /// `unsigned*` skip counters.
    pub counters: u64,
    /// Row stride of rows.
    pub row_stride: i32,
    /// Ring block stride.
    pub ring_block_stride: i32,
    /// Ring row stride.
    pub ring_row_stride: i32,
    /// Ring blocks.
    pub ring_blocks: i32,
    /// Ring rows per block.
    pub ring_capacity: i32,
    /// Rows.
    pub n: i32,
    /// [`flags`].
    pub flags: u32,
    /// `log2(ring_capacity)`, or -1 when the capacity is not a power of two.
    pub ring_shift: i32,
}

/// `KvFusedParams`: the two blocks one after the other.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct FusedParams {
    /// The compressor part.
    pub compress: CompressParams,
    /// The insert part (its `latent` is the compressor's `latent`).
    pub insert: InsertParams,
}

/// Device base addresses of a compress call's buffers (the plan's view
/// offsets are added by [`compress_params`]).
#[derive(Debug, Clone, Copy, Default)]
#[allow(missing_docs)]
pub struct CompressPtrs {
    pub kv_score: u64,
    pub positions: u64,
    pub slots: u64,
    pub qsl: u64,
    pub ttr: u64,
    pub weight: u64,
    pub latent: u64,
    pub ring: u64,
    pub prev_rows: u64,
    pub prev_idx: u64,
    pub counters: u64,
}

/// Device addresses of an insert call's tensors (the buffers' base
/// addresses; the plan's offsets are added here).
#[derive(Debug, Clone, Copy, Default)]
#[allow(missing_docs)]
pub struct InsertPtrs {
    pub latent: u64,
    pub positions: u64,
    pub slots: u64,
    pub cos_sin: u64,
    pub cache: u64,
    pub fp8_scale: u64,
    pub counters: u64,
}

fn i64_flag(p: &IndexPlan, bit: u32) -> u32 {
    if p.is_i64 {
        bit
    } else {
        0
    }
}

/// Parameter block of a compress plan, given its buffers' base addresses.
pub fn compress_params(p: &CompressPlan, b: &CompressPtrs) -> CompressParams {
    let mut f = i64_flag(&p.positions, flags::POS_I64) | i64_flag(&p.slots, flags::SLOT_I64);
    let mut c = CompressParams {
        kv_score: b.kv_score + p.kv_score.offset as u64,
        positions: b.positions + p.positions.offset as u64,
        slots: b.slots + p.slots.offset as u64,
        weight: b.weight + p.weight_offset as u64,
        latent: b.latent + p.latent.offset as u64,
        counters: b.counters,
        kv_row_stride: p.kv_score.row_stride as i32,
        n: p.n as i32,
        eps: p.eps,
        ring_shift: -1,
        ..Default::default()
    };
    if let (Some(r), Some(q), Some(t)) = (p.ring, p.query_start_loc, p.token_to_req) {
        c.ring = b.ring + r.offset as u64;
        c.ring_block_stride = r.block_stride as i32;
        c.ring_row_stride = r.row_stride as i32;
        c.ring_blocks = r.blocks as i32;
        c.ring_capacity = r.capacity as i32;
        c.ring_shift = pow2_shift(r.capacity);
        c.qsl = b.qsl + q.offset as u64;
        c.ttr = b.ttr + t.offset as u64;
        c.num_reqs = (q.len - 1) as i32;
        f |= i64_flag(&q, flags::QSL_I64) | i64_flag(&t, flags::TTR_I64);
    }
    if let (Some(pr), Some(pi)) = (p.prev_rows, p.prev_row_indices) {
        c.prev_rows = b.prev_rows + pr.offset as u64;
        c.prev_row_stride = pr.row_stride as i32;
        c.prev_rows_n = pr.rows as i32;
        c.prev_idx = b.prev_idx + pi.offset as u64;
        f |= flags::HAS_PREV | i64_flag(&pi, flags::PRI_I64);
    }
    c.flags = f;
    c
}

/// Parameter block of an insert plan.
pub fn insert_params(p: &InsertPlan, b: &InsertPtrs, sanitize: bool) -> InsertParams {
    let mut f = i64_flag(&p.positions, flags::POS_I64) | i64_flag(&p.slots, flags::SLOT_I64);
    if p.cos_sin_bf16 {
        f |= flags::COS_BF16;
    }
    if sanitize {
        f |= flags::SANITIZE;
    }
    InsertParams {
        latent: b.latent + p.latent.offset as u64,
        positions: b.positions + p.positions.offset as u64,
        slots: b.slots + p.slots.offset as u64,
        cos_sin: b.cos_sin + p.cos_sin.offset as u64,
        cache: b.cache + p.cache.offset as u64,
        fp8_scale: p.fp8_scale_offset.map_or(0, |o| b.fp8_scale + o as u64),
        counters: b.counters,
        latent_row_stride: p.latent.row_stride as i32,
        cos_row_stride: p.cos_sin.row_stride as i32,
        cos_rows: p.cos_sin.rows as i32,
        block_stride: p.cache.block_stride as i32,
        row_stride: p.cache.row_stride as i32,
        num_blocks: p.cache.blocks as i32,
        block_size: p.cache.block_size as i32,
        n: p.n as i32,
        compress_ratio: p.compress_ratio,
        flags: f,
        block_shift: pow2_shift(p.cache.block_size),
        pad: 0,
    }
}

/// `log2(rows)` for a power of two, else -1: the kernels find a slot's page
/// (or ring block) and row with a shift and a mask, or else divide.
fn pow2_shift(rows: usize) -> i32 {
    if rows.is_power_of_two() {
        rows.trailing_zeros() as i32
    } else {
        -1
    }
}

/// Parameter block of a `save_ring_rows` plan: `rows`, `slots`, `ring` are
/// base addresses.
pub fn ring_rows_params(
    p: &RingRowsPlan,
    rows: u64,
    slots: u64,
    ring: u64,
    counters: u64,
) -> RingRowsParams {
    RingRowsParams {
        rows: rows + p.rows.offset as u64,
        slots: slots + p.slots.offset as u64,
        ring: ring + p.ring.offset as u64,
        counters,
        row_stride: p.rows.row_stride as i32,
        ring_block_stride: p.ring.block_stride as i32,
        ring_row_stride: p.ring.row_stride as i32,
        ring_blocks: p.ring.blocks as i32,
        ring_capacity: p.ring.capacity as i32,
        n: p.n as i32,
        flags: i64_flag(&p.slots, flags::SLOT_I64),
        ring_shift: pow2_shift(p.ring.capacity),
    }
}

/// Parameter block of a fused plan.
pub fn fused_params(
    p: &FusedPlan,
    c: &CompressPtrs,
    i: &InsertPtrs,
    sanitize: bool,
) -> FusedParams {
    let mut compress = compress_params(&p.compress, c);
    if p.write_latent {
        compress.flags |= flags::WRITE_LATENT;
    }
    let mut insert = insert_params(&p.insert, i, sanitize);
    insert.latent = compress.latent;
    FusedParams { compress, insert }
}

/// The shape of one launch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Geometry {
    /// Blocks in the grid (at least 1).
    pub grid: u32,
    /// Threads per block: a multiple of 64, so a block is whole AMD wavefronts.
    pub block_threads: u32,
    /// log2 of the groups per block (the kernel's group index is
    /// `block << log2 | thread / 32`).
    pub groups_log2: u32,
    /// CR2 teams and pairs: each token block covers one token per group
    /// ([`crate::launch::Cr2Shape::screen_tokens`]).
    pub screen_tokens: bool,
    /// Bytes of dynamic shared memory (LDS) per block: the CR2 team kernels'
    /// buffers, 0 for the others.
    pub shared_bytes: u32,
}

/// Groups in a CR2 team: one block handles one item, each lane pooling a
/// quarter of its 16 dims (the kernels' `KV_CR2_TEAM`).
pub const CR2_TEAM_GROUPS: u32 = 4;
/// Groups in a CR2 pair, the mid-sized team (the kernels' `KV_CR2_PAIR`):
/// a block of 64 threads, one AMD wavefront.
pub const CR2_PAIR_GROUPS: u32 = 2;

/// One token's pooled values in a team's shared memory: 512 f32.
pub const CR2_POOLED_BYTES: u32 = 512 * 4;

/// A kernel parameter block: carries the launch's groups-per-block in its
/// flags word, since the kernels derive a group's index from it.
pub trait KernelParams: Copy {
    /// `self` with `g`'s groups-per-block field set.
    fn with_geometry(self, g: &Geometry) -> Self;
}

fn set_groups(flags: u32, g: &Geometry) -> u32 {
    (flags & !flags::GROUPS_LOG2_MASK) | (g.groups_log2 << flags::GROUPS_LOG2_SHIFT)
}

impl KernelParams for CompressParams {
    fn with_geometry(mut self, g: &Geometry) -> Self {
        self.flags = set_groups(self.flags, g) & !flags::SCREEN_TOKENS;
        if g.screen_tokens {
            self.flags |= flags::SCREEN_TOKENS;
        }
        self
    }
}

impl KernelParams for InsertParams {
    fn with_geometry(mut self, g: &Geometry) -> Self {
        self.flags = set_groups(self.flags, g);
        self
    }
}

impl KernelParams for RingRowsParams {
    fn with_geometry(mut self, g: &Geometry) -> Self {
        self.flags = set_groups(self.flags, g);
        self
    }
}

impl KernelParams for FusedParams {
    // The fused kernels index groups from the compress block's flags.
    fn with_geometry(mut self, g: &Geometry) -> Self {
        self.compress = self.compress.with_geometry(g);
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parameter_blocks_have_the_c_sizes() {
        // The C structs in kernels-hip/kvcache.hip have these sizes: the
        // pointers, then 32-bit counts and strides (validated to fit), with
        // explicit padding to 8 bytes.
        assert_eq!(std::mem::size_of::<CompressParams>(), 11 * 8 + 12 * 4);
        assert_eq!(std::mem::size_of::<InsertParams>(), 7 * 8 + 12 * 4);
        assert_eq!(std::mem::size_of::<RingRowsParams>(), 4 * 8 + 8 * 4);
        assert_eq!(
            std::mem::size_of::<FusedParams>(),
            std::mem::size_of::<CompressParams>() + std::mem::size_of::<InsertParams>()
        );
    }

    #[test]
    fn kernel_lookup_is_consistent() {
        for l in RecordLayout::ALL {
            assert!(KERNEL_NAMES.contains(&insert_kernel(l)));
            assert!(fused_kernel(1, l).starts_with("kv_fused_cr1_"));
            assert!(fused_kernel(2, l).starts_with("kv_fused_cr2_"));
            assert!(fused_kernel(2, l).ends_with(insert_kernel(l).trim_start_matches("kv_insert_")));
            let suffix = insert_kernel(l).trim_start_matches("kv_insert_");
            assert!(KERNEL_NAMES.contains(&fused_team_kernel(l)));
            assert_eq!(fused_team_kernel(l), format!("kv_fused_cr2_team_{suffix}"));
            assert!(KERNEL_NAMES.contains(&fused_pair_kernel(l)));
            assert_eq!(fused_pair_kernel(l), format!("kv_fused_cr2_pair_{suffix}"));
            assert_eq!(fused_long_kernel(l), format!("kv_fused_cr2_long_{suffix}"));
            assert_eq!(
                fused_team_mtp_kernel(l),
                format!("kv_fused_cr2_team_mtp_{suffix}")
            );
            if let Some(k) = insert_tiles_kernel(l) {
                assert!(KERNEL_NAMES.contains(&k));
                assert_eq!(k, format!("{}_tiles", insert_kernel(l)));
            }
        }
        assert!(KERNEL_NAMES.contains(&"kv_compress_cr2_team_mtp"));
        assert!(KERNEL_NAMES.contains(&"kv_compress_cr2_pair_mtp"));
        assert_eq!(KERNEL_NAMES.len(), 46);
        let mut names = KERNEL_NAMES.to_vec();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), KERNEL_NAMES.len(), "kernel names are unique");
    }

    /// The value of `#define name value` in the kernel source.
    fn kernel_define(name: &str) -> u64 {
        const SOURCE: &str = include_str!("../kernels-hip/kvcache.hip");
        let line = SOURCE
            .lines()
            .find(|l| l.split_whitespace().take(2).eq(["#define", name]))
            .unwrap_or_else(|| panic!("kvcache.hip defines {name}"));
        let v = line.split_whitespace().nth(2).expect("a value");
        v.trim_end_matches('u').parse().expect("a number")
    }

    #[test]
    fn host_and_kernel_constants_agree() {
        assert_eq!(kernel_define("KV_CR2_TEAM"), CR2_TEAM_GROUPS as u64);
        assert_eq!(kernel_define("KV_CR2_PAIR"), CR2_PAIR_GROUPS as u64);
        assert_eq!(kernel_define("KV_BLOCK_THREADS"), BLOCK_THREADS as u64);
        assert_eq!(kernel_define("KV_GROUP_LANES"), GROUP_LANES as u64);
        assert_eq!(
            kernel_define("KV_F_GROUPS_LOG2_SHIFT"),
            flags::GROUPS_LOG2_SHIFT as u64
        );
        for (name, v) in [
            ("KV_F_POS_I64", flags::POS_I64),
            ("KV_F_SLOT_I64", flags::SLOT_I64),
            ("KV_F_QSL_I64", flags::QSL_I64),
            ("KV_F_TTR_I64", flags::TTR_I64),
            ("KV_F_PRI_I64", flags::PRI_I64),
            ("KV_F_HAS_PREV", flags::HAS_PREV),
            ("KV_F_WRITE_LATENT", flags::WRITE_LATENT),
            ("KV_F_COS_BF16", flags::COS_BF16),
            ("KV_F_SANITIZE", flags::SANITIZE),
            ("KV_F_SCREEN_TOKENS", flags::SCREEN_TOKENS),
        ] {
            assert_eq!(kernel_define(name), v as u64, "{name}");
        }
    }

    #[test]
    fn pow2_shift_is_log2_or_minus_one() {
        assert_eq!(pow2_shift(64), 6);
        assert_eq!(pow2_shift(1), 0);
        assert_eq!(pow2_shift(48), -1);
    }

    #[test]
    fn geometry_lands_in_the_flags_word_only() {
        let g = Geometry {
            grid: 3,
            block_threads: 128,
            groups_log2: 2,
            screen_tokens: false,
            shared_bytes: 0,
        };
        let p = InsertParams {
            flags: flags::SANITIZE | flags::COS_BF16 | flags::GROUPS_LOG2_MASK,
            n: 5,
            ..Default::default()
        };
        let q = p.with_geometry(&g);
        assert_eq!(
            q.flags,
            flags::SANITIZE | flags::COS_BF16 | (2 << flags::GROUPS_LOG2_SHIFT)
        );
        assert_eq!(
            InsertParams {
                flags: p.flags,
                ..q
            },
            p
        );
        let f = FusedParams {
            compress: CompressParams::default(),
            insert: InsertParams::default(),
        }
        .with_geometry(&g);
        assert_eq!(f.compress.flags >> flags::GROUPS_LOG2_SHIFT, 2);
        assert_eq!(f.compress.flags & flags::SCREEN_TOKENS, 0);
        // A screened launch sets its flag in the compress block, and an
        // unscreened one clears it.
        let screened = Geometry {
            screen_tokens: true,
            ..g
        };
        let c = CompressParams {
            flags: flags::HAS_PREV,
            ..Default::default()
        };
        let on = c.with_geometry(&screened);
        assert_eq!(
            on.flags,
            flags::HAS_PREV | flags::SCREEN_TOKENS | (2 << flags::GROUPS_LOG2_SHIFT)
        );
        assert_eq!(on.with_geometry(&g).flags, c.with_geometry(&g).flags);
        let f = FusedParams {
            compress: c,
            insert: InsertParams::default(),
        }
        .with_geometry(&screened);
        assert_eq!(f.compress.flags, on.flags);
        assert_eq!(f.insert.flags & flags::SCREEN_TOKENS, 0);
    }
}
