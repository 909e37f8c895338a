//! Binding the operations' tensor tables ([`crate::ops::tensors`]: one per
//! argument struct, read by field name) to device addresses: the kernels'
//! pointer blocks, and the raw API's address checks.

use super::super::raw::RawDevice;
use crate::error::{Error, Result};
use crate::gather::GatherPtrs;
use crate::indexer_k::IndexerKPtrs;
use crate::kernel_abi::{CompressPtrs, InsertPtrs};
use crate::ops::{
    Bound, CompressTensors, FusedTensors, GatherTensors, IndexerKTensors, InsertTensors,
    RingTensors,
};
use crate::tensor::Storage;

/// Storage with a device address.
pub trait DevAddr: Storage {
    /// The device address of byte 0.
    fn addr(&self) -> u64;
}

impl DevAddr for RawDevice {
    fn addr(&self) -> u64 {
        self.ptr
    }
}

/// The buffer's base address (0 when absent; the plan adds the offset).
fn base<S: DevAddr>(b: &Bound<'_, S>) -> u64 {
    b.buf.map_or(0, |b| b.addr())
}

/// A pointer block: each field the base address of the tensor named after
/// it, then the skip counters.
macro_rules! ptrs {
    ($block:ident, $t:expr, $counters:expr; $($field:ident: $($tensor:ident).+),* $(,)?) => {
        $block {
            $($field: base(&$t.$($tensor).+),)*
            counters: $counters,
        }
    };
}

/// A gather's pointer block.
pub fn gather_ptrs<S: DevAddr>(t: &GatherTensors<Bound<'_, S>>, counters: u64) -> GatherPtrs {
    ptrs!(GatherPtrs, t, counters; cache: kv_cache, slots: slot_mapping,
        block_table: block_table, cu_seq_lens: cu_seq_lens, seq_starts: seq_starts,
        fp8_scale: fp8_scale, out: out)
}

/// The indexer key store's pointer block.
pub fn indexer_k_ptrs<S: DevAddr>(
    t: &IndexerKTensors<Bound<'_, S>>,
    counters: u64,
) -> IndexerKPtrs {
    ptrs!(IndexerKPtrs, t, counters; k_pre: k_pre, positions: positions,
        slots: kv_slot_mapping, cos_sin: cos_sin_cache, weight: rms_norm_weight, cache: k_cache)
}

/// The compressor's pointer block.
pub fn compress_ptrs<S: DevAddr>(t: &CompressTensors<Bound<'_, S>>, counters: u64) -> CompressPtrs {
    ptrs!(CompressPtrs, t, counters; kv_score: kv_score, positions: positions,
        slots: slot_mapping, weight: rms_norm_weight, latent: latent_out, ring: state_cache,
        qsl: query_start_loc, ttr: token_to_req_indices, prev_rows: prev_rows,
        prev_idx: prev_row_indices)
}

/// An insert's pointer block.
pub fn insert_ptrs<S: DevAddr>(t: &InsertTensors<Bound<'_, S>>, counters: u64) -> InsertPtrs {
    ptrs!(InsertPtrs, t, counters; latent: latent, positions: positions, slots: slot_mapping,
        cos_sin: cos_sin_cache, cache: kv_cache, fp8_scale: fp8_scale)
}

/// A `save_ring_rows` launch's three addresses (rows, slots, ring).
pub fn ring_ptrs<S: DevAddr>(t: &RingTensors<Bound<'_, S>>) -> (u64, u64, u64) {
    (base(&t.rows), base(&t.slot_mapping), base(&t.state_cache))
}

/// The fused insert part's pointer block; its latent is the compressor's
/// output and its positions the compressor's (the parameter block links
/// them).
pub fn fused_insert_ptrs<S: DevAddr>(t: &FusedTensors<Bound<'_, S>>, counters: u64) -> InsertPtrs {
    ptrs!(InsertPtrs, t, counters; latent: compress.latent_out, positions: compress.positions,
        slots: insert.cache_slot_mapping, cos_sin: insert.cos_sin_cache,
        cache: insert.kv_cache, fp8_scale: insert.fp8_scale)
}

/// A raw view's address: non-null and aligned as the table says.
pub fn check_raw(b: &Bound<'_, RawDevice>) -> Result<()> {
    match b.buf {
        Some(buf) => aligned(b.arg, buf.ptr, b.offset, b.align),
        None => Ok(()),
    }
}

/// `ptr + offset` is not null and a multiple of `align`.
pub fn aligned(arg: &'static str, ptr: u64, offset: usize, align: u64) -> Result<()> {
    if ptr == 0 {
        return Err(Error::Value {
            arg,
            problem: "null device pointer".into(),
        });
    }
    let addr = ptr.wrapping_add(offset as u64);
    if addr % align != 0 {
        return Err(Error::Shape {
            arg,
            problem: format!(
                "device address {addr:#x} (pointer + view offset) must be a multiple of {align} bytes"
            ),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn null_and_misaligned_addresses_are_errors() {
        assert!(matches!(
            aligned("kv_score", 0, 0, 16),
            Err(Error::Value {
                arg: "kv_score",
                ..
            })
        ));
        assert!(matches!(
            aligned("kv_score", 0x1008, 0, 16),
            Err(Error::Shape {
                arg: "kv_score",
                ..
            })
        ));
        assert!(aligned("kv_score", 0x1008, 8, 16).is_ok());
        assert!(aligned("slot_mapping", 0x1004, 0, 8).is_err());
    }
}
