//! The indexer key store's rows: decode-shaped calls (every token closes a
//! group, CR 1, one token a request) into a cache of twice as many slots,
//! in each format and order.

use crate::timing::{median_f32, Timing};
use dsv4_kvcache::formats::bf16_from_f32;
use dsv4_kvcache::testkit::Rng;
use dsv4_kvcache::{
    Backend, DType, IndexerKArgs, IndexerKFormat, IndexerKOrder, Result, Tensor, TensorDesc,
    TensorMut,
};

/// The rows: label, format, order.
pub(super) const ROWS: [(&str, IndexerKFormat, IndexerKOrder); 4] = [
    (
        "indexer_k fp8",
        IndexerKFormat::Fp8,
        IndexerKOrder::RowMajor,
    ),
    (
        "indexer_k fp8 tiled",
        IndexerKFormat::Fp8,
        IndexerKOrder::Tiled,
    ),
    (
        "indexer_k mxfp4",
        IndexerKFormat::Mxfp4,
        IndexerKOrder::RowMajor,
    ),
    (
        "indexer_k mxfp4 preshuffled",
        IndexerKFormat::Mxfp4,
        IndexerKOrder::Preshuffled { n_per_tile: 16 },
    ),
];

/// Rows of a cache block.
const BLOCK_SIZE: usize = 64;

/// Bytes a call of `t` tokens moves, each tensor once: the BF16 key rows,
/// I64 positions and slots, each token's BF16 cos/sin row (distinct
/// positions), the F32 weight, and the records written.
pub(super) fn bytes(t: usize, format: IndexerKFormat) -> u64 {
    (t * (256 + 8 + 8 + 128 + format.record_bytes()) + 512) as u64
}

/// Median µs per launch of row (`format`, `order`) at `t` tokens.
pub(super) fn time<B: Backend, T: Timing<B>>(
    b: &B,
    timing: &T,
    t: usize,
    format: IndexerKFormat,
    order: IndexerKOrder,
    launches: usize,
    replays: usize,
) -> Result<f64> {
    let mut rng = Rng::new(0x1dc5 + t as u64);
    let k: Vec<u8> = (0..t * 128)
        .flat_map(|_| bf16_from_f32(rng.normal()).to_le_bytes())
        .collect();
    // Decode: each token its own request at a distinct position.
    let positions: Vec<u8> = (0..t as i64).flat_map(|p| p.to_le_bytes()).collect();
    let blocks = (2 * t).div_ceil(BLOCK_SIZE);
    let perm = rng.permutation(blocks * BLOCK_SIZE);
    let slots: Vec<u8> = perm[..t]
        .iter()
        .flat_map(|&s| (s as i64).to_le_bytes())
        .collect();
    let cos: Vec<u8> = (0..t * 64)
        .flat_map(|i| bf16_from_f32((i as f32 * 0.37).sin()).to_le_bytes())
        .collect();
    let w: Vec<u8> = (0..128)
        .flat_map(|i| (1.0f32 + i as f32 / 256.0).to_le_bytes())
        .collect();
    let rec = format.record_bytes();
    let (kb, pb, sb, cb, wb) = (
        b.upload(&k)?,
        b.upload(&positions)?,
        b.upload(&slots)?,
        b.upload(&cos)?,
        b.upload(&w)?,
    );
    let mut cache = b.upload(&vec![0u8; blocks * BLOCK_SIZE * rec])?;
    let us = timing.per_launch_us(b, launches, replays, &mut |b| {
        b.indexer_k_norm_rope_store(IndexerKArgs {
            k_pre: Tensor::new(&kb, TensorDesc::contiguous(DType::BF16, &[t, 128])),
            positions: Tensor::new(&pb, TensorDesc::contiguous(DType::I64, &[t])),
            cos_sin_cache: Tensor::new(&cb, TensorDesc::contiguous(DType::BF16, &[t, 64])),
            rms_norm_weight: Tensor::new(&wb, TensorDesc::contiguous(DType::F32, &[128])),
            rms_norm_eps: 1e-6,
            k_cache: TensorMut::new(
                &mut cache,
                TensorDesc::contiguous(DType::U8, &[blocks, BLOCK_SIZE, rec]),
            ),
            kv_slot_mapping: Tensor::new(&sb, TensorDesc::contiguous(DType::I64, &[t])),
            compress_ratio: 1,
            format,
            order,
            mx_scale: false,
        })
    })?;
    Ok(median_f32(&us) as f64)
}
