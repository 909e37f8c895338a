//! # dsv4-kvcache
//!
//! DeepSeek V4 / V4.1 compressed KV-cache records, written bit-identically by
//! a CPU reference, AMD GPUs (HIP: gfx90a, gfx942, gfx950) and NVIDIA GPUs
//! (CUDA: SASS for sm_90, sm_100, sm_103, sm_120, and compute_90 PTX for
//! later GPUs).
//!
//! The three operations of the seed module are implemented with the exact
//! semantics of `semantics.md`:
//! - `fused_save_compress_norm`: pool each closed group of rows into an
//!   RMS-normalized BF16 latent (CR1, or CR2 through a ring of FP32 rows);
//! - `rope_quant_insert`: rotate a latent (GPT-J RoPE) and write its record in
//!   one of five layouts ([`layout::RecordLayout`]);
//! - `save_ring_rows`: store FP32 rows into their ring slots.
//!
//! and records are read back, gathered and dequantized to BF16 or F32, by
//! `gather_dequant` ([`gather`]). Beside the compressed KV, V4.1's indexer
//! keys are normalized, rotated and stored as FP8 or MXFP4 records by
//! `indexer_k_norm_rope_store` ([`indexer_k`]).
//!
//! Every backend implements [`backend::Backend`]; arguments are validated once,
//! in [`ops`], for all of them.
//!
//! # Threads
//!
//! Backends are `Send + Sync` and their calls take `&self`: one value shared
//! across threads (`&CpuBackend`, `Arc<CudaBackend>`) gives the bytes of the
//! same calls made one after another (`tests/concurrency.rs`). Written
//! tensors are borrowed mutably, so no two calls write one buffer at once
//! (the raw entry points leave that to the caller). GPU safe calls share the
//! backend's one stream, in submission order, unless a thread takes a stream
//! of its own (`GpuBackend::create_stream` and `on_stream`, a view that is a
//! `Backend` too, with its own sanitize setting); raw calls order on the
//! stream given. Skip counts are the backend's, across threads and streams.
//! A failed launch or wait names the rows it may have written
//! ([`Touched`]). NaN sanitizing is
//! not shared mutable state: changing it takes `&mut self`. A graph capture
//! records whatever is launched on the backend's stream meanwhile, so no
//! other thread may launch on it during one.

#![warn(missing_docs)]

// The layers, top to bottom: backend → device → operations → numerics.
pub mod backend;
pub mod device;
pub mod error;
pub mod numerics;
pub mod operations;
pub mod testkit;
pub mod vectors;

// Each module also at the crate root, where callers have always named it.
pub use device::{detect, kernel_abi, kernels, launch, targets};
pub use numerics::{formats, layout, math, reference};
pub use operations::{gather, indexer_k, ops, tensor};

pub use backend::cpu::CpuBackend;
#[cfg(feature = "cuda")]
pub use backend::cuda::CudaBackend;
#[cfg(feature = "hip")]
pub use backend::hip::HipBackend;
pub use backend::Backend;
pub use error::{Error, IndexValues, Result, Rows, Touched, TouchedRows};
pub use gather::{GatherArgs, GatherIndex};
pub use indexer_k::{IndexerKArgs, IndexerKFormat, IndexerKOrder};
pub use launch::LaunchPolicy;
pub use layout::{RecordLayout, RecordOrder};
pub use ops::{CompressArgs, FusedArgs, InsertArgs, RingArgs, SkipCounts};
pub use tensor::{DType, Tensor, TensorDesc, TensorMut};
