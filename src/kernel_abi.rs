//! The launch interface of the device kernels, shared by the CUDA and HIP
//! backends: kernel names, `#[repr(C)]` parameter blocks that mirror the
//! structs at the top of `kernels-hip/kvcache.hip` field for field, and the
//! launch geometry.
//!
//! Every kernel takes one parameter block by value. A token (or a request)
//! is handled by a group of [`GROUP_LANES`] threads; [`geometry`] picks how
//! many groups make a block and tells the kernel through the flags word
//! ([`KernelParams::with_geometry`]). The kernels never assume a warp or wavefront width:
//! a group's lanes exchange values only with xor-butterflies of distance
//! below 32, which stay inside one aligned 32-lane group on 32-lane warps and
//! on 64-lane wavefronts alike.

use crate::layout::RecordLayout;
use crate::ops::{CompressPlan, FusedPlan, IndexPlan, InsertPlan, RingRowsPlan};
use std::sync::OnceLock;

/// Threads that handle one token.
pub const GROUP_LANES: u32 = 32;
/// Token groups per block of a large launch (measured on the H200: 4 beat 8
/// for every kernel at 65536 tokens).
pub const GROUPS_PER_BLOCK: u32 = 4;
/// Token groups per block of a small (decode-size) launch: one AMD
/// wavefront, two NVIDIA warps.
pub const SMALL_GROUPS_PER_BLOCK: u32 = 2;
/// Launches of at most this many groups use [`SMALL_GROUPS_PER_BLOCK`].
pub const SMALL_LAUNCH_ITEMS: u64 = 2048;
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
    /// ([`Cr2Shape::screen_tokens`]).
    pub screen_tokens: bool,
    /// Bytes of dynamic shared memory (LDS) per block: the CR2 team kernels'
    /// buffers, 0 for the others.
    pub shared_bytes: u32,
}

/// Launch shape for `items` groups (one token or request each).
///
/// Small launches use blocks of [`SMALL_GROUPS_PER_BLOCK`] groups so that a
/// decode step's few tokens land on separate SMs / CUs instead of queueing on
/// the schedulers of one; large ones use [`GROUPS_PER_BLOCK`]. The
/// environment variable `DSV4_KVCACHE_GROUPS_PER_BLOCK` (2, 4 or 8) forces
/// one size, for benchmarking.
pub fn geometry(items: u64) -> Geometry {
    let gpb = forced_groups_per_block().unwrap_or(if items <= SMALL_LAUNCH_ITEMS {
        SMALL_GROUPS_PER_BLOCK
    } else {
        GROUPS_PER_BLOCK
    });
    Geometry {
        grid: items.div_ceil(gpb as u64).max(1) as u32,
        block_threads: GROUP_LANES * gpb,
        groups_log2: gpb.trailing_zeros(),
        screen_tokens: false,
        shared_bytes: 0,
    }
}

fn forced_groups_per_block() -> Option<u32> {
    static FORCED: OnceLock<Option<u32>> = OnceLock::new();
    *FORCED.get_or_init(|| {
        std::env::var("DSV4_KVCACHE_GROUPS_PER_BLOCK")
            .ok()
            .and_then(|v| v.trim().parse::<u32>().ok())
            .filter(|g| matches!(g, 2 | 4 | 8))
    })
}

/// A benchmarking switch: the environment variable `var` set to `0` or `1`
/// forces a launch choice off or on (read once, into `cell`).
fn forced_switch(cell: &'static OnceLock<Option<bool>>, var: &str) -> Option<bool> {
    *cell.get_or_init(|| match std::env::var(var).as_deref() {
        Ok("0") => Some(false),
        Ok("1") => Some(true),
        _ => None,
    })
}

/// Groups in a CR2 team: one block handles one item, each lane pooling a
/// quarter of its 16 dims (the kernels' `KV_CR2_TEAM`).
pub const CR2_TEAM_GROUPS: u32 = 4;
/// Groups in a CR2 pair, the mid-sized team (the kernels' `KV_CR2_PAIR`):
/// a block of 64 threads, one AMD wavefront.
pub const CR2_PAIR_GROUPS: u32 = 2;
/// Decode batches (at least half the tokens start a chunk, so the request
/// items carry the work, and a lone group's request item is the slowest) of
/// mostly one-token requests up to this many items (requests plus tokens)
/// run in teams of four, larger ones in pairs. H200 at `0a44401`, one-token
/// requests, teams / pairs / lone groups: 8.54 / 10.32 / 11.30 µs at 2048
/// tokens, 15.67 / 15.88 / 18.37 at 4096, 32.95 / 29.89 / 33.37 at 8192.
/// With the coalesced team parts (2026-12-01), screened teams / pairs /
/// lone groups: 27.80 / 25.90 / 33.46 µs at 8192 tokens, 110.01 / 96.29 /
/// 111.26 at 32768, 219.87 / 189.82 / 215.92 at 65536; fused NVFP4 pairs
/// against lone groups 107.94 / 112.26 at 32768 and 213.85 / 212.82 at
/// 65536, fused V4 109.01 / 116.65 and 216.68 / 225.06.
pub const CR2_TEAM_MAX_ITEMS: u64 = 8192;
/// Launches of long chunks (prefill), where the token items carry the
/// work, run unscreened teams up to this many items (and screened teams up
/// to [`CR2_SCREENED_TEAM_MAX_ITEMS_LONG_CHUNKS`]): a team needs four warps
/// per item, and once the teams outnumber what the GPU runs at once, lone
/// groups win. Before the screened teams and the coalesced team parts, H200 at
/// `4a85862`, 4 requests: teams 2.47 µs against 3.35 at 16 tokens, a tie at
/// 1024 (4.25 / 4.13), 5.36 against 4.33 at 2048, 14.67 against 12.51 at
/// 8192. Pairs do not pay there: at `0a44401`, 4 requests of 2048 tokens,
/// 5.99 µs against 4.39 lone; fused NVFP4 slower at every size to 32768.
pub const CR2_TEAM_MAX_ITEMS_LONG_CHUNKS: u64 = 1024;
/// Launches of long chunks above [`CR2_TEAM_MAX_ITEMS_LONG_CHUNKS`] and up to
/// this many items run screened teams: a token block covers four tokens
/// and pools the two that close a group one after the other. H200
/// (2026-12-01, coalesced team parts), 4 requests, unscreened teams /
/// screened teams / lone groups, compress: 3.56 / 3.40 / 3.68 µs at 1024
/// tokens, 4.76 / 4.11 / 4.40 at 2048, 5.74 / 4.95 / 5.16 at 3072 (at 512,
/// unscreened / screened teams: 2.87 / 3.07); fused NVFP4 4.45 / 4.23 /
/// 4.51 at 1024, 6.01 / 5.06 / 5.06 at 2048, 7.48 / 6.12 / 5.92 at 3072
/// (every layout alike).
pub const CR2_SCREENED_TEAM_MAX_ITEMS_LONG_CHUNKS: u64 = 2560;
/// Launches of long chunks above the screened-team limit and up to this
/// many items run one-pass lone groups, above it lone groups pooling by halves
/// ([`Cr2Items::LoneHalves`], four blocks per SM). H200 at `4d6752c`, 4
/// requests, one-pass / halves, compress (fused NVFP4): 3.68 / 3.80 µs
/// (4.54 / 4.77) at 1024 tokens, 4.41 / 4.58 (5.08 / 5.17) at 2048, 4.98 /
/// 5.14 (6.05 / 5.98; fused V4 8.24 / 5.84) at 3072, 7.44 / 5.65 (9.14 /
/// 6.74) at 4096, 84.3 / 75.7 (95.4 / 87.3) at 65536.
pub const CR2_LONE_MAX_ITEMS_LONG_CHUNKS: u64 = 3072;

/// How a CR2 launch spreads an item (a request's first group, or a token's)
/// over the GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cr2Items {
    /// One group (32 lanes, 16 dims each) per item.
    Lone,
    /// A block of [`CR2_PAIR_GROUPS`] groups per item.
    Pairs,
    /// A block of [`CR2_TEAM_GROUPS`] groups per item.
    Teams,
    /// One group per item pooling its dims in two halves, so that the
    /// kernel fits 64 registers (four blocks per SM on sm_90): long chunks.
    LoneHalves,
}

/// How a CR2 launch runs, decided once per launch by [`cr2_shape`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cr2Shape {
    /// Groups per item.
    pub items: Cr2Items,
    /// Teams or pairs whose token blocks check a token per group
    /// (`kv_cr2_token_block`): a block per request, and one per
    /// [`CR2_TEAM_GROUPS`] (or [`CR2_PAIR_GROUPS`]) tokens.
    pub screen_tokens: bool,
    /// The multi-token kernels (`kv_compress_cr2_team_mtp`,
    /// `kv_compress_cr2_pair_mtp`, `kv_fused_cr2_team_mtp_*`), whose request
    /// items also pool a two-token chunk's second token (`kv_cr2_owns_second`
    /// in the kernels).
    pub multi_token: bool,
}

/// The shape of a CR2 launch of `n` tokens in `num_reqs` requests (`fused`:
/// of `fused_compress_insert`).
///
/// Items: at decode sizes a lone group's pooling chain is most of the
/// kernel time, and a team splits it four ways. Decode batches (at least
/// half the tokens start a chunk) of mostly one-token requests run teams up
/// to [`CR2_TEAM_MAX_ITEMS`], then pairs, which leave fewer lanes idle while
/// group 0 norms and emits; other decode batches (speculative decode) run
/// teams. Long chunks (prefill) run teams up to
/// [`CR2_SCREENED_TEAM_MAX_ITEMS_LONG_CHUNKS`], lone groups up to
/// [`CR2_LONE_MAX_ITEMS_LONG_CHUNKS`], then lone groups pooling by halves,
/// which fit more groups on an SM. H200 (2026-12-01, coalesced team parts),
/// two-token requests, screened teams / screened pairs / unscreened teams /
/// lone groups, compress: 21.40 / 23.03 / 31.44 / 35.77 µs at 8192 tokens,
/// 161.26 / 162.67 / 242.81 / 266.83 at 65536; fused NVFP4 32.70 / 33.48 /
/// 34.84 / 38.64 at 8192, 236.72 / 239.16 / 261.08 / 280.00 at 65536.
///
/// Screening ([`Cr2Shape::screen_tokens`]), in teams and pairs: decode
/// batches of mostly one-token requests from [`CR2_SCREEN_MIN_ITEMS`] items,
/// other decode batches from [`CR2_SCREEN_MIN_ITEMS_MULTI`] items, long
/// chunks above [`CR2_TEAM_MAX_ITEMS_LONG_CHUNKS`]; a decode batch's token
/// items mostly pool nothing, and a screened launch runs a quarter (a half,
/// in pairs) of the token blocks. Screened launches that are not mostly
/// one-token requests run the multi-token kernels
/// ([`Cr2Shape::multi_token`]; fused launches have them in teams only), so
/// that a two-token chunk's rows are read once and its token block pools
/// nothing.
///
/// The environment variables `DSV4_KVCACHE_CR2_TEAMS` (`0` lone groups, `1`
/// teams, `2` pairs, `3` lone groups by halves) and `DSV4_KVCACHE_CR2_SCREEN`
/// (`0` or `1`, for teams and pairs) force the choices, for testing and
/// benchmarking.
pub fn cr2_shape(n: u64, num_reqs: u64, fused: bool) -> Cr2Shape {
    static FORCED_ITEMS: OnceLock<Option<Cr2Items>> = OnceLock::new();
    static FORCED_SCREEN: OnceLock<Option<bool>> = OnceLock::new();
    let forced_items =
        *FORCED_ITEMS.get_or_init(
            || match std::env::var("DSV4_KVCACHE_CR2_TEAMS").as_deref() {
                Ok("0") => Some(Cr2Items::Lone),
                Ok("1") => Some(Cr2Items::Teams),
                Ok("2") => Some(Cr2Items::Pairs),
                Ok("3") => Some(Cr2Items::LoneHalves),
                _ => None,
            },
        );
    let items = n + num_reqs;
    let decode = 2 * num_reqs >= n;
    let one_token = mostly_one_token(n, num_reqs);
    let shape = forced_items.unwrap_or(if decode {
        if one_token && items > CR2_TEAM_MAX_ITEMS {
            Cr2Items::Pairs
        } else {
            Cr2Items::Teams
        }
    } else if items <= CR2_SCREENED_TEAM_MAX_ITEMS_LONG_CHUNKS {
        Cr2Items::Teams
    } else if items <= CR2_LONE_MAX_ITEMS_LONG_CHUNKS {
        Cr2Items::Lone
    } else {
        Cr2Items::LoneHalves
    });
    let teams = matches!(shape, Cr2Items::Teams | Cr2Items::Pairs);
    let screen = if !decode {
        items > CR2_TEAM_MAX_ITEMS_LONG_CHUNKS
    } else if one_token {
        items >= CR2_SCREEN_MIN_ITEMS
    } else {
        items >= CR2_SCREEN_MIN_ITEMS_MULTI
    };
    let screen_tokens =
        teams && forced_switch(&FORCED_SCREEN, "DSV4_KVCACHE_CR2_SCREEN").unwrap_or(screen);
    Cr2Shape {
        items: shape,
        screen_tokens,
        multi_token: screen_tokens && !one_token && (shape == Cr2Items::Teams || !fused),
    }
}

/// Shape of a team launch: one block of `groups` groups per item.
pub fn team_geometry(items: u64, groups: u32) -> Geometry {
    Geometry {
        grid: items.max(1) as u32,
        block_threads: GROUP_LANES * groups,
        groups_log2: groups.trailing_zeros(),
        screen_tokens: false,
        shared_bytes: CR2_POOLED_BYTES,
    }
}

/// Shape of a screened team launch of `n` tokens in `num_reqs` requests:
/// a block per request, and a block per `groups` tokens, with a pooled
/// buffer and a closing position (8 bytes) per group.
pub fn screened_team_geometry(n: u64, num_reqs: u64, groups: u32) -> Geometry {
    Geometry {
        screen_tokens: true,
        shared_bytes: groups * (CR2_POOLED_BYTES + 8),
        ..team_geometry(num_reqs + n.div_ceil(groups as u64), groups)
    }
}

/// One token's pooled values in a team's shared memory: 512 f32.
pub const CR2_POOLED_BYTES: u32 = 512 * 4;

/// Whether at most one request in four has more than one token: the token
/// items then mostly pool nothing (a one-token request's group is its
/// request item's).
fn mostly_one_token(n: u64, num_reqs: u64) -> bool {
    4 * n <= 5 * num_reqs
}

/// Decode batches with more multi-token requests screen their tokens from
/// this many items on, on the multi-token kernels
/// ([`Cr2Shape::multi_token`]), whose request items also pool a two-token
/// chunk's second token, so that the token blocks of speculative decode
/// pool nothing either. H200, two tokens per request, unscreened at `4f13280`
/// (the token items pooling) / screened at `41cf728`: 5.73 / 5.45 µs at
/// 1024 tokens (1536 items), 9.75 / 8.88 at 2048, 16.87 / 14.71 at 4096,
/// 34.06 / 27.78 at 8192, 65.25 / 52.60 at 16384, 239.98 / 204.48 at
/// 65536; at 512 tokens (768 items) a development build of the same
/// kernels, screened, took 3.78 against 3.61. Fused launches, with
/// multi-token team kernels of their own (2026-12-01, coalesced team
/// parts), NVFP4 unscreened / screened: 3.02 / 3.47 µs at 16 tokens, 4.91 /
/// 4.63 at 1024, 8.26 / 6.31 at 2048, 13.67 / 10.49 at 4096, 34.87 / 25.07
/// at 8192 (V4 and BF16 within 0.1 µs of these from 1024 tokens).
pub const CR2_SCREEN_MIN_ITEMS_MULTI: u64 = 1536;

/// Decode batches of mostly one-token requests screen their tokens from
/// this many items (requests plus tokens) on ([`cr2_shape`]). H200
/// (2026-12-01), one-token requests, `2533fa0` unscreened / `429936b`
/// screened: 3.11 / 2.94 µs at 256 tokens (512 items), 4.20 / 3.68 at 512,
/// 5.70 / 5.42 at 1024, 8.54 / 8.63 at 2048, 15.68 / 15.30 at 4096, 29.83 /
/// 28.16 at 8192, 56.54 / 53.37 at 16384; a development build gave 2.57 /
/// 2.65 µs at 128 tokens (256 items).
pub const CR2_SCREEN_MIN_ITEMS: u64 = 512;

/// A kernel and the shape to launch it in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Launch {
    /// The kernel's name (one of [`KERNEL_NAMES`]).
    pub kernel: &'static str,
    /// Its grid and blocks.
    pub geometry: Geometry,
}

/// The launch of an insert plan.
///
/// Large CR1 launches run the tile-major kernel where the layout has one
/// ([`insert_uses_tiles`]).
pub fn insert_launch(p: &InsertPlan) -> Launch {
    let tiles = insert_tiles_kernel(p.cache.layout)
        .filter(|_| insert_uses_tiles(p.compress_ratio, p.n as u64));
    Launch {
        kernel: tiles.unwrap_or_else(|| insert_kernel(p.cache.layout)),
        geometry: geometry(p.n as u64),
    }
}

/// Whether an insert of `n` tokens at `compress_ratio` runs a tile-major
/// kernel (where its layout has one): CR1 above [`SMALL_LAUNCH_ITEMS`]
/// tokens. H200, 65536 tokens: NVFP4 40.6 -> 38.7 µs, BF16 42.8 -> 40.6,
/// FP8 42.0 -> 40.7; 8192: 4-10 % faster. At decode sizes the time is one
/// token's latency, and a block's last warp, holding NoPE and RoPE tiles,
/// runs both paths one after the other: BF16 and FP8 were 3-4 % slower at
/// 16 and 128 tokens. CR2 writes only the tokens that close a group, usually
/// every other one, and a warp holding tiles of a written and a skipped
/// token does the full work: CR2 inserts were up to 10 % slower, and the
/// kernels are CR1 only. The environment variable
/// `DSV4_KVCACHE_INSERT_TILES` (0 or 1) forces the choice for CR1, for
/// testing and benchmarking.
pub fn insert_uses_tiles(compress_ratio: u32, n: u64) -> bool {
    static FORCED: OnceLock<Option<bool>> = OnceLock::new();
    let forced = forced_switch(&FORCED, "DSV4_KVCACHE_INSERT_TILES");
    // The tile-major kernels are CR1 only (they skip the compress-ratio test).
    compress_ratio == 1 && forced.unwrap_or(n > SMALL_LAUNCH_ITEMS)
}

/// The launch of a `save_ring_rows` plan.
pub fn ring_rows_launch(p: &RingRowsPlan) -> Launch {
    Launch {
        kernel: "kv_save_ring_rows",
        geometry: geometry(p.n as u64),
    }
}

/// The launch of a compress plan's items (`fused`: of a fused plan): the
/// shape by [`cr2_shape`] for CR2 (one group per item for CR1), and
/// `kernel`, the op's kernel for that shape.
fn compressor_launch(
    p: &CompressPlan,
    fused: bool,
    kernel: impl Fn(Cr2Shape) -> &'static str,
) -> Launch {
    let items = compress_items(p);
    let (n, reqs) = (p.n as u64, p.num_reqs() as u64);
    let shape = if p.compress_ratio == 2 {
        cr2_shape(n, reqs, fused)
    } else {
        Cr2Shape {
            items: Cr2Items::Lone,
            screen_tokens: false,
            multi_token: false,
        }
    };
    let team = |groups| {
        if shape.screen_tokens {
            screened_team_geometry(n, reqs, groups)
        } else {
            team_geometry(items, groups)
        }
    };
    Launch {
        kernel: kernel(shape),
        geometry: match shape.items {
            Cr2Items::Lone | Cr2Items::LoneHalves => geometry(items),
            Cr2Items::Teams => team(CR2_TEAM_GROUPS),
            Cr2Items::Pairs => team(CR2_PAIR_GROUPS),
        },
    }
}

/// The launch of a compress plan (CR2 in teams or pairs at decode sizes,
/// by halves for long chunks).
pub fn compress_launch(p: &CompressPlan) -> Launch {
    compressor_launch(p, false, |shape| match (shape.items, shape.multi_token) {
        (Cr2Items::Lone, _) => compress_kernel(p.compress_ratio),
        (Cr2Items::Teams, true) => "kv_compress_cr2_team_mtp",
        (Cr2Items::Teams, false) => "kv_compress_cr2_team",
        (Cr2Items::Pairs, true) => "kv_compress_cr2_pair_mtp",
        (Cr2Items::Pairs, false) => "kv_compress_cr2_pair",
        (Cr2Items::LoneHalves, _) => "kv_compress_cr2_long",
    })
}

/// The launch of a fused plan (CR2 in teams or pairs at decode sizes, by
/// halves for long chunks).
pub fn fused_launch(p: &FusedPlan) -> Launch {
    let layout = p.insert.cache.layout;
    compressor_launch(&p.compress, true, |shape| {
        match (shape.items, shape.multi_token) {
            (Cr2Items::Lone, _) => fused_kernel(p.compress.compress_ratio, layout),
            (Cr2Items::Teams, true) => fused_team_mtp_kernel(layout),
            (Cr2Items::Teams, false) => fused_team_kernel(layout),
            (Cr2Items::Pairs, _) => fused_pair_kernel(layout),
            (Cr2Items::LoneHalves, _) => fused_long_kernel(layout),
        }
    })
}

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

/// Groups a compress (or fused) launch needs: CR2 adds one per request.
pub fn compress_items(p: &CompressPlan) -> u64 {
    p.n as u64 + p.num_reqs() as u64
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
    fn large_cr1_inserts_run_tile_major_where_the_layout_has_it() {
        // CR2 never, forced or not: the kernels skip the compress-ratio test.
        assert!(!insert_uses_tiles(2, 1 << 20));
        assert!(!insert_uses_tiles(2, 1));
        if std::env::var_os("DSV4_KVCACHE_INSERT_TILES").is_some() {
            eprintln!("DSV4_KVCACHE_INSERT_TILES is set: the default choice is not checked");
            return;
        }
        assert!(!insert_uses_tiles(1, SMALL_LAUNCH_ITEMS));
        assert!(insert_uses_tiles(1, SMALL_LAUNCH_ITEMS + 1));
        assert_eq!(insert_tiles_kernel(RecordLayout::V4), None);
        assert_eq!(insert_tiles_kernel(RecordLayout::Mxfp8), None);
        for l in [
            RecordLayout::Nvfp4,
            RecordLayout::Bf16Rows,
            RecordLayout::Fp8Rows,
        ] {
            assert!(insert_tiles_kernel(l).is_some());
        }
    }

    #[test]
    fn team_launches_are_one_block_of_whole_wavefronts_per_item() {
        for groups in [CR2_TEAM_GROUPS, CR2_PAIR_GROUPS] {
            for items in [1u64, 2, 33, 1 << 20] {
                let g = team_geometry(items, groups);
                assert_eq!(g.grid as u64, items);
                assert_eq!(g.block_threads, GROUP_LANES * groups);
                assert_eq!(1u32 << g.groups_log2, groups);
                assert_eq!(g.block_threads % 64, 0);
                assert!(g.block_threads <= BLOCK_THREADS);
            }
        }
        if std::env::var_os("DSV4_KVCACHE_CR2_TEAMS").is_some() {
            eprintln!("DSV4_KVCACHE_CR2_TEAMS is set: the default choice is not checked");
            return;
        }
        use Cr2Items::*;
        for fused in [false, true] {
            let items = |n, reqs| cr2_shape(n, reqs, fused).items;
            // Decode batches of one-token requests: teams, then pairs.
            let one_token = |t: u64| items(t, t);
            assert_eq!(one_token(1), Teams);
            assert_eq!(one_token(CR2_TEAM_MAX_ITEMS / 2), Teams);
            assert_eq!(one_token(CR2_TEAM_MAX_ITEMS / 2 + 1), Pairs);
            assert_eq!(one_token(1 << 16), Pairs);
            assert_eq!(items(5000, 4000), Pairs);
            // Other decode batches (half the tokens start a chunk): teams
            // at every size.
            assert_eq!(items(4000, 2000), Teams);
            assert_eq!(items(8000, 4000), Teams);
            assert_eq!(items(1 << 16, 1 << 15), Teams);
            // Long chunks: teams (screened above 1024 items) up to their
            // limit, then lone groups, then lone groups by halves; never
            // pairs.
            assert_eq!(items(16, 4), Teams);
            assert_eq!(items(1020, 4), Teams);
            assert_eq!(items(2556, 4), Teams);
            assert_eq!(items(2557, 4), Lone);
            assert_eq!(items(3068, 4), Lone);
            assert_eq!(items(3069, 4), LoneHalves);
            assert_eq!(items(4000, 1999), LoneHalves);
            assert_eq!(items(16384, 4), LoneHalves);
        }
    }

    #[test]
    fn geometry_covers_every_item_with_whole_wavefronts() {
        if forced_groups_per_block().is_some() {
            eprintln!("DSV4_KVCACHE_GROUPS_PER_BLOCK is set: geometry defaults not checked");
            return;
        }
        for items in [0u64, 1, 2, 3, 16, 2047, 2048, 2049, 65536, 1 << 24] {
            let g = geometry(items);
            let gpb = 1u64 << g.groups_log2;
            assert_eq!(g.block_threads as u64, gpb * GROUP_LANES as u64);
            assert_eq!(
                g.block_threads % 64,
                0,
                "a block is whole 64-lane wavefronts"
            );
            assert!(
                g.block_threads <= BLOCK_THREADS,
                "kernels are built for at most {BLOCK_THREADS}"
            );
            assert!(g.grid >= 1);
            // Every item has a group, and no block is wholly idle.
            assert!(g.grid as u64 * gpb >= items);
            assert!((g.grid as u64 - 1) * gpb < items.max(1));
            let small = items <= SMALL_LAUNCH_ITEMS;
            assert_eq!(
                gpb,
                if small {
                    SMALL_GROUPS_PER_BLOCK
                } else {
                    GROUPS_PER_BLOCK
                } as u64
            );
        }
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

    #[test]
    fn screened_team_launches_cover_every_request_and_token() {
        for groups in [CR2_TEAM_GROUPS, CR2_PAIR_GROUPS] {
            for (n, reqs) in [(1u64, 1u64), (512, 512), (513, 500), (1 << 14, 1 << 14)] {
                let g = screened_team_geometry(n, reqs, groups);
                assert!(g.screen_tokens);
                assert_eq!(g.block_threads, GROUP_LANES * groups);
                // A block per request, then one per `groups` tokens; none
                // wholly idle.
                let token_blocks = g.grid as u64 - reqs;
                assert!(token_blocks * groups as u64 >= n);
                assert!((token_blocks - 1) * (groups as u64) < n);
                // A pooled buffer and a closing position per group (the
                // kernel's kv_cr2_token_block), 8-byte aligned.
                assert_eq!(g.shared_bytes, groups * (CR2_POOLED_BYTES + 8));
                assert_eq!((groups * CR2_POOLED_BYTES) % 8, 0);
            }
            assert_eq!(team_geometry(7, groups).shared_bytes, CR2_POOLED_BYTES);
        }
        assert_eq!(geometry(7).shared_bytes, 0);
        if std::env::var_os("DSV4_KVCACHE_CR2_SCREEN").is_some()
            || std::env::var_os("DSV4_KVCACHE_CR2_TEAMS").is_some()
        {
            eprintln!(
                "DSV4_KVCACHE_CR2_SCREEN or _TEAMS is set: the default choice is not checked"
            );
            return;
        }
        for fused in [false, true] {
            let screens = |n, reqs| cr2_shape(n, reqs, fused).screen_tokens;
            // One-token requests from 512 items (256 tokens) on.
            assert!(!screens(255, 255));
            assert!(screens(256, 256));
            assert!(screens(1 << 16, 1 << 16));
            // At most one request in four with a second token: from 512
            // items.
            assert!(screens(1250, 1000));
            assert!(screens(260, 252));
            assert!(!screens(256, 255));
            // Other decode batches from 1536 items on.
            assert!(screens(1251, 1000));
            assert!(screens(1024, 512));
            assert!(screens(2048, 1024));
            assert!(screens(8000, 4000));
            assert!(!screens(1022, 511));
            assert!(!screens(400, 300));
            // Long chunks in screened teams above 1024 items, up to 2560;
            // lone groups never screen.
            assert!(!screens(1020, 4));
            assert!(screens(1021, 4));
            assert!(screens(2556, 4));
            assert!(!screens(2557, 4));
            assert!(!screens(4096, 4));
            assert!(!screens(1 << 16, 4));
        }
        // The multi-token kernels: screened launches that are not mostly
        // one-token requests (fused ones in teams).
        for fused in [false, true] {
            let mtp = |n, reqs| cr2_shape(n, reqs, fused).multi_token;
            assert!(mtp(1024, 512));
            assert!(mtp(1 << 16, 1 << 15));
            assert!(mtp(2048, 4));
            assert!(!mtp(1022, 511));
            assert!(!mtp(1 << 14, 1 << 14));
            assert!(!mtp(1250, 1000));
            assert!(!mtp(4096, 4));
        }
        // Lone groups never screen, whatever is asked.
        for (n, reqs) in [(1u64, 1u64), (1 << 16, 4), (2000, 1500), (1 << 16, 1 << 16)] {
            for fused in [false, true] {
                let s = cr2_shape(n, reqs, fused);
                assert!(matches!(s.items, Cr2Items::Teams | Cr2Items::Pairs) || !s.screen_tokens);
                assert!(s.screen_tokens || !s.multi_token);
            }
        }
    }
}
