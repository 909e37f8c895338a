//! Binding the operations' tensor tables ([`crate::ops::tensors`]: one per
//! argument struct, read by field name) to device addresses: the kernels'
//! pointer blocks, and the raw API's address checks.

use super::super::raw::RawDevice;
use crate::error::{Error, Result};
use crate::gather::GatherPtrs;
use crate::kernel_abi::{CompressPtrs, InsertPtrs};
use crate::ops::{Bound, CompressTensors, FusedTensors, GatherTensors, InsertTensors, RingTensors};
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

/// A gather's pointer block.
pub fn gather_ptrs<S: DevAddr>(t: &GatherTensors<Bound<'_, S>>, counters: u64) -> GatherPtrs {
    GatherPtrs {
        cache: base(&t.kv_cache),
        slots: base(&t.slot_mapping),
        block_table: base(&t.block_table),
        cu_seq_lens: base(&t.cu_seq_lens),
        seq_starts: base(&t.seq_starts),
        fp8_scale: base(&t.fp8_scale),
        out: base(&t.out),
        counters,
    }
}

/// The compressor's pointer block.
pub fn compress_ptrs<S: DevAddr>(t: &CompressTensors<Bound<'_, S>>, counters: u64) -> CompressPtrs {
    CompressPtrs {
        kv_score: base(&t.kv_score),
        positions: base(&t.positions),
        slots: base(&t.slot_mapping),
        weight: base(&t.rms_norm_weight),
        latent: base(&t.latent_out),
        ring: base(&t.state_cache),
        qsl: base(&t.query_start_loc),
        ttr: base(&t.token_to_req_indices),
        prev_rows: base(&t.prev_rows),
        prev_idx: base(&t.prev_row_indices),
        counters,
    }
}

/// An insert's pointer block.
pub fn insert_ptrs<S: DevAddr>(t: &InsertTensors<Bound<'_, S>>, counters: u64) -> InsertPtrs {
    InsertPtrs {
        latent: base(&t.latent),
        positions: base(&t.positions),
        slots: base(&t.slot_mapping),
        cos_sin: base(&t.cos_sin_cache),
        cache: base(&t.kv_cache),
        fp8_scale: base(&t.fp8_scale),
        counters,
    }
}

/// A `save_ring_rows` launch's three addresses (rows, slots, ring).
pub fn ring_ptrs<S: DevAddr>(t: &RingTensors<Bound<'_, S>>) -> (u64, u64, u64) {
    (base(&t.rows), base(&t.slot_mapping), base(&t.state_cache))
}

/// The fused insert part's pointer block; its latent is the compressor's
/// output and its positions the compressor's (the parameter block links
/// them).
pub fn fused_insert_ptrs<S: DevAddr>(t: &FusedTensors<Bound<'_, S>>, counters: u64) -> InsertPtrs {
    InsertPtrs {
        latent: base(&t.compress.latent_out),
        positions: base(&t.compress.positions),
        slots: base(&t.insert.cache_slot_mapping),
        cos_sin: base(&t.insert.cos_sin_cache),
        cache: base(&t.insert.kv_cache),
        fp8_scale: base(&t.insert.fp8_scale),
        counters,
    }
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
