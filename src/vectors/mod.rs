//! Test vectors: named input and output tensors of one operation, in a
//! safetensors file, that any backend can replay and compare byte for byte.
//!
//! # Format (`dsv4-kvcache-vectors/1`)
//!
//! A safetensors file whose tensors are the operation's inputs, named
//! `in.<argument>` with the seed's argument names, and its expected outputs,
//! `out.kv_cache`, `out.latent_out` and `out.state_cache` (each the whole
//! tensor after the call, starting from the matching `in.` tensor).
//!
//! | input | op | dtype, shape |
//! | --- | --- | --- |
//! | `in.latent` | insert | BF16 `[T, 512]` |
//! | `in.positions` | all but ring rows | I64 (or I32) `[T]` |
//! | `in.cos_sin` | inserts | F32 (or BF16, F16) `[P, 64]` (cos 0..32, sin 32..64) |
//! | `in.slot_mapping` | all | I64 (or I32) `[N]` |
//! | `in.kv_cache` | inserts | U8 `[B, bs, 584 \| 528 \| 288]`, BF16 or F8_E4M3 (or U8) `[B, bs, 512]` |
//! | `in.fp8_scale` | FP8 rows | F32 `[1]` |
//! | `in.kv_score` | compress | F32 `[T, 512 \| 1024]` |
//! | `in.state_cache` | CR2, ring rows | F32 `[B, capacity, 1024]` |
//! | `in.query_start_loc` | CR2 | I64 `[R + 1]` |
//! | `in.token_to_req_indices` | CR2 | I64 `[T]` |
//! | `in.rms_norm_weight` | compress | BF16 (or F32, F16) `[512]` |
//! | `in.latent_out` | compress | BF16 `[T, 512]` |
//! | `in.prev_rows`, `in.prev_row_indices` | CR2 (optional) | F32 `[R', 1024]`, I64 `[R]` |
//! | `in.rows` | ring rows | F32 `[N, 1024]` |
//! | `in.cache_slot_mapping` | fused | I64 `[N]` |
//!
//! String metadata: `format` = `dsv4-kvcache-vectors/1`; `op`
//! (`rope_quant_insert`, `fused_save_compress_norm`, `save_ring_rows`,
//! `fused_compress_insert`); `layout` (`v4`, `mxfp8`, `nvfp4`, `bf16`, `fp8`;
//! the insert ops); `compress_ratio` (`1` or `2`); `sanitize` (`true` or
//! `false`); `rms_norm_eps` (the exact decimal value of the f32) and
//! `rms_norm_eps_bits` (its bits, `0x` and 8 hex digits, which win when both
//! are present); optionally `skip_latent_out` (`true`, fused only);
//! optionally `record_order` (`planar`, the default, or `per_token`: where a
//! paged record's scales go, for the inserts and the reader); `source`
//! and `description` (free text, often JSON).
//!
//! The seed harness (`scripts/peers/seed_vectors.py`) writes exactly these
//! names. [`VectorFile::replay`] runs a file on any [`Backend`](crate::Backend);
//! [`VectorFile::capture_reference`] fills in the outputs from the CPU
//! reference; [`crate::testkit`] builds the inputs of typical cases.
//!
//! The parts: [`format`](self) (the file, its tensors and metadata), replay
//! (uploading a file to a backend and running it) and the diff report (which
//! byte of which record differs).

mod format;
mod replay;
mod report;
#[cfg(test)]
mod tests;

pub use format::{f32_exact_decimal, Op, VTensor, VectorFile, FORMAT, OUTPUT_NAMES};
pub use replay::{Buf, Executed, Prepared};
pub use report::{
    scale_field, value_field, Mismatch, ReplayReport, TensorCount, MAX_RECORDED_MISMATCHES,
};
