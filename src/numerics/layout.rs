//! Cache record layouts: where every byte of a token's record goes, and the
//! decoders that read records back to f32.
//!
//! Paged layouts (`kv_cache` of bytes, `[blocks, block_size, W]`) place a
//! record's `V` value bytes and `S` scale bytes in its block's page in one of
//! two orders ([`RecordOrder`]): the seed's page-planar order (all records'
//! value bytes first, `page + row * V`, then all records' scale bytes,
//! `page + block_size * V + row * S`) or vLLM 0.34.0's per-token order (each
//! record whole, `page + row * W`, its scales right after its values).
//! `docs/layouts.md` draws every byte.

use crate::formats::{bf16_to_f32, e2m1_to_f32, e4m3_to_f32, ue8m0_to_f32};

/// Dimensions of a latent.
pub const DIM: usize = 512;
/// Leading dims that get no rotation.
pub const NOPE_DIM: usize = 448;
/// Trailing dims rotated by RoPE (32 pairs).
pub const ROPE_DIM: usize = 64;
/// First RoPE pair index.
pub const FIRST_ROPE_PAIR: usize = NOPE_DIM / 2;

/// The record layouts of `rope_quant_insert`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RecordLayout {
    /// V4, 584 B: e4m3 of the unrotated dims 0..448 in 7 blocks of 64, the
    /// rotated dims 448..512 as BF16; 7 UE8M0 scales and a zero byte.
    V4,
    /// V4.1 MXFP8, 528 B: e4m3 of all 512 rotated dims in 16 blocks of 32;
    /// 16 UE8M0 scales.
    Mxfp8,
    /// V4.1 NVFP4, 288 B: e2m1 pairs of the rotated dims; 32 e4m3 scales,
    /// one per 16 dims.
    Nvfp4,
    /// Plain BF16 rows `[.., 512]`.
    Bf16Rows,
    /// Plain FP8 e4m3 rows `[.., 512]` with a per-tensor scale.
    Fp8Rows,
}

impl RecordLayout {
    /// Every layout, in a fixed order.
    pub const ALL: [RecordLayout; 5] = [
        RecordLayout::V4,
        RecordLayout::Mxfp8,
        RecordLayout::Nvfp4,
        RecordLayout::Bf16Rows,
        RecordLayout::Fp8Rows,
    ];

    /// The paged layout whose record is `width` bytes, if any.
    pub fn from_record_width(width: usize) -> Option<Self> {
        match width {
            584 => Some(RecordLayout::V4),
            528 => Some(RecordLayout::Mxfp8),
            288 => Some(RecordLayout::Nvfp4),
            _ => None,
        }
    }

    /// Whether records live in a paged byte cache (values then scales).
    pub fn is_paged(self) -> bool {
        matches!(
            self,
            RecordLayout::V4 | RecordLayout::Mxfp8 | RecordLayout::Nvfp4
        )
    }

    /// Whether the layout's records can be stored in either [`RecordOrder`]
    /// (the V4.1 records, 528 and 288 B); the others are page-planar (V4)
    /// or have no scales (rows).
    pub fn has_record_orders(self) -> bool {
        matches!(self, RecordLayout::Mxfp8 | RecordLayout::Nvfp4)
    }

    /// Value bytes per record `V` (for rows: the row's bytes).
    pub fn value_bytes(self) -> usize {
        match self {
            RecordLayout::V4 => 576,
            RecordLayout::Mxfp8 => 512,
            RecordLayout::Nvfp4 => 256,
            RecordLayout::Bf16Rows => 1024,
            RecordLayout::Fp8Rows => 512,
        }
    }

    /// Scale bytes per record `S` (0 for rows).
    pub fn scale_bytes(self) -> usize {
        match self {
            RecordLayout::V4 => 8,
            RecordLayout::Mxfp8 => 16,
            RecordLayout::Nvfp4 => 32,
            RecordLayout::Bf16Rows | RecordLayout::Fp8Rows => 0,
        }
    }

    /// Bytes a token occupies in the cache.
    pub fn record_bytes(self) -> usize {
        self.value_bytes() + self.scale_bytes()
    }

    /// Short name used by the CLI, test vectors and benchmarks.
    pub fn name(self) -> &'static str {
        match self {
            RecordLayout::V4 => "v4",
            RecordLayout::Mxfp8 => "mxfp8",
            RecordLayout::Nvfp4 => "nvfp4",
            RecordLayout::Bf16Rows => "bf16",
            RecordLayout::Fp8Rows => "fp8",
        }
    }

    /// Inverse of [`RecordLayout::name`].
    pub fn from_name(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|l| l.name() == s)
    }
}

/// Where a paged record's scale bytes go relative to its value bytes.
///
/// The arithmetic of a record is the same in both orders; only the byte
/// positions inside a page differ. The per-token order applies to the V4.1
/// records (528 and 288 B); the 584 B V4 record is page-planar only (vLLM
/// 0.34.0 and FlashMLA store it so, and per token its 576 value bytes would
/// lose their 16-byte alignment), and asking for it per token is an error.
/// Row layouts have no scales, so both orders are the same bytes there. A cache written in one order and read in
/// the other is garbage without any error, so the order is always an
/// explicit argument.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum RecordOrder {
    /// The seed's order: a page holds the value bytes of all its records,
    /// then the scale bytes of all its records.
    #[default]
    PagePlanar,
    /// vLLM 0.34.0's order of the 528 and 288 B records (FlashMLA's V4.1
    /// readers): each record's scale bytes follow its own value bytes,
    /// records `W` bytes apart.
    PerToken,
}

impl RecordOrder {
    /// Both orders, the default first.
    pub const ALL: [RecordOrder; 2] = [RecordOrder::PagePlanar, RecordOrder::PerToken];

    /// The name the Python package, the CLI and the test vectors use:
    /// `planar` or `per_token`.
    pub fn name(self) -> &'static str {
        match self {
            RecordOrder::PagePlanar => "planar",
            RecordOrder::PerToken => "per_token",
        }
    }

    /// Inverse of [`RecordOrder::name`] (`per-token` is accepted too).
    pub fn from_name(s: &str) -> Option<Self> {
        match s {
            "planar" => Some(RecordOrder::PagePlanar),
            "per_token" | "per-token" => Some(RecordOrder::PerToken),
            _ => None,
        }
    }

    /// The order a cache of `layout` takes when a caller asks for this one
    /// for every layout (the CLI's `--record-order`): itself for the V4.1
    /// records, the page-planar order for the others (V4 has only that one,
    /// rows have no scales).
    pub fn for_layout(self, layout: RecordLayout) -> RecordOrder {
        if layout.has_record_orders() {
            self
        } else {
            RecordOrder::PagePlanar
        }
    }

    /// Byte offsets, from the start of its page, of the value bytes and the
    /// scale bytes of the record in row `row` of a paged cache of `layout`
    /// with `block_size` rows per block.
    pub fn record_offsets(
        self,
        layout: RecordLayout,
        block_size: usize,
        row: usize,
    ) -> (usize, usize) {
        let (v, s) = (layout.value_bytes(), layout.scale_bytes());
        match self {
            RecordOrder::PagePlanar => (row * v, block_size * v + row * s),
            RecordOrder::PerToken => (row * (v + s), row * (v + s) + v),
        }
    }
}

impl std::fmt::Display for RecordOrder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Decodes one record back to 512 f32 values: the rotated vector (V4's
/// NoPE part is the unrotated latent, which equals its rotation up to the
/// sign of zero). `values` are the record's `V` value bytes, `scales` its
/// `S` scale bytes (empty for rows); `fp8_scale` is the per-tensor scale of
/// FP8 rows.
pub fn decode_record(
    layout: RecordLayout,
    values: &[u8],
    scales: &[u8],
    fp8_scale: f32,
) -> [f32; DIM] {
    let mut out = [0.0f32; DIM];
    match layout {
        RecordLayout::V4 => {
            for (i, o) in out[..NOPE_DIM].iter_mut().enumerate() {
                *o = e4m3_to_f32(values[i]) * ue8m0_to_f32(scales[i / 64]);
            }
            for (i, o) in out[NOPE_DIM..].iter_mut().enumerate() {
                let b = NOPE_DIM + 2 * i;
                *o = bf16_to_f32(u16::from_le_bytes([values[b], values[b + 1]]));
            }
        }
        RecordLayout::Mxfp8 => {
            for (i, o) in out.iter_mut().enumerate() {
                *o = e4m3_to_f32(values[i]) * ue8m0_to_f32(scales[i / 32]);
            }
        }
        RecordLayout::Nvfp4 => {
            for (i, o) in out.iter_mut().enumerate() {
                let byte = values[i / 2];
                let code = if i % 2 == 0 { byte & 0xf } else { byte >> 4 };
                *o = e2m1_to_f32(code) * e4m3_to_f32(scales[i / 16]);
            }
        }
        RecordLayout::Bf16Rows => {
            for (i, o) in out.iter_mut().enumerate() {
                *o = bf16_to_f32(u16::from_le_bytes([values[2 * i], values[2 * i + 1]]));
            }
        }
        RecordLayout::Fp8Rows => {
            for (i, o) in out.iter_mut().enumerate() {
                *o = e4m3_to_f32(values[i]) * fp8_scale;
            }
        }
    }
    out
}
