//! The backend trait and its implementations: the CPU reference, and one
//! GPU backend ([`gpu::GpuBackend`]) over two drivers, CUDA and HIP.
//!
//! A backend owns its buffers (`Backend::Buffer`) and runs validated plans
//! on them. Validation ([`crate::ops`]) is shared, so every backend rejects
//! the same arguments with the same error, before writing anything.

pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod gpu;
#[cfg(feature = "hip")]
pub mod hip;
pub mod raw;

pub use raw::{RawDevice, RawStream};

use crate::error::Result;
use crate::gather::GatherArgs;
use crate::indexer_k::IndexerKArgs;
use crate::ops::{CompressArgs, FusedArgs, InsertArgs, RingArgs, SkipCounts};
use crate::tensor::Storage;

/// One implementation of the three operations (and the fused path), and of
/// the reader, `gather_dequant`.
///
/// Launch methods do not allocate and do not wait for the device; results
/// are visible to [`Backend::read`] (which waits) and to later launches on
/// the same backend. A device launch that fails after validation, or a wait
/// that fails with launches pending, is an
/// [`Error::Driver`](crate::Error::Driver) whose `touched` names the rows
/// those calls may have written; every other row is as it was.
pub trait Backend {
    /// Memory the backend computes on.
    type Buffer: Storage;

    /// A short name: `cpu`, `cuda:0 (NVIDIA H200, sm_90)`, ...
    fn name(&self) -> String;

    /// Whether the safe API's launches sanitize NaNs (see `semantics.md`);
    /// the raw entry points (`*_raw`, `*_host`) take it as an argument.
    fn sanitize(&self) -> bool;

    /// Switches NaN sanitizing on or off for later launches of the safe API.
    /// It takes `&mut self`: a backend shared between threads is not
    /// reconfigured under them, and a caller that needs a per-call choice
    /// uses the raw entry points.
    fn set_sanitize(&mut self, on: bool);

    /// A buffer holding a copy of `bytes`.
    fn upload(&self, bytes: &[u8]) -> Result<Self::Buffer>;

    /// Overwrites the start of `buf` with `bytes`.
    fn write(&self, buf: &mut Self::Buffer, bytes: &[u8]) -> Result<()>;

    /// The buffer's bytes (waits for pending work).
    fn read(&self, buf: &Self::Buffer) -> Result<Vec<u8>>;

    /// `fused_save_compress_norm`.
    fn fused_save_compress_norm(&self, args: CompressArgs<'_, Self::Buffer>) -> Result<()>;

    /// `rope_quant_insert`.
    fn rope_quant_insert(&self, args: InsertArgs<'_, Self::Buffer>) -> Result<()>;

    /// `save_ring_rows`.
    fn save_ring_rows(&self, args: RingArgs<'_, Self::Buffer>) -> Result<()>;

    /// `fused_save_compress_norm` then `rope_quant_insert` in one launch.
    fn fused_compress_insert(&self, args: FusedArgs<'_, Self::Buffer>) -> Result<()>;

    /// `gather_dequant`: gathers the records `args.index` names from
    /// `args.kv_cache` and writes them dequantized (BF16 or F32) into
    /// `args.out` ([`crate::gather`]); out-of-range indices are skipped and
    /// counted ([`Backend::take_skip_counts`]).
    fn gather_dequant(&self, args: GatherArgs<'_, Self::Buffer>) -> Result<()>;

    /// `indexer_k_norm_rope_store`: the V4.1 indexer's keys, normalized,
    /// rotated and stored as FP8 or MXFP4 records in `args.k_cache`
    /// ([`crate::indexer_k`]); out-of-range slots and positions are skipped
    /// and counted.
    fn indexer_k_norm_rope_store(&self, args: IndexerKArgs<'_, Self::Buffer>) -> Result<()>;

    /// Tokens skipped for out-of-range indices since the last call (waits
    /// for pending work), then resets the counts.
    fn take_skip_counts(&self) -> Result<SkipCounts>;

    /// Waits for all launched work.
    fn synchronize(&self) -> Result<()>;
}
