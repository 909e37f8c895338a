//! Each operation's tensors, listed once: (argument, read or written,
//! buffer, view offset, the alignment its device address needs). Ownership
//! checks (safe API), address checks (raw API) and the kernels' pointer
//! blocks all come from these tables, in this order, so the same bad call
//! fails on the same argument everywhere.

use super::super::raw::RawDevice;
use crate::error::{Error, Result};
use crate::gather::{GatherArgs, GatherIndex, GatherPtrs};
use crate::kernel_abi::{CompressPtrs, InsertPtrs};
use crate::ops::{CompressArgs, CompressPlan, FusedArgs, FusedPlan, InsertArgs, RingArgs};
use crate::tensor::{Storage, Tensor, TensorMut};

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

/// Whether a kernel reads or writes a tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Read only.
    Read,
    /// Written (and possibly read).
    Written,
}

/// One tensor of a launch; `buf` is `None` for an absent optional tensor
/// (or one the plan does not use, such as CR2-only tensors under CR1).
#[derive(Debug)]
pub struct Bound<'b, S> {
    /// The argument's name, as errors report it.
    pub arg: &'static str,
    /// Read or written (the `*_raw` safety contracts name the written ones).
    #[cfg_attr(not(test), allow(dead_code))]
    pub role: Role,
    /// The buffer.
    pub buf: Option<&'b S>,
    /// The view's byte offset in `buf`.
    pub offset: usize,
    /// What `buf`'s address plus `offset` must be a multiple of.
    pub align: u64,
}

impl<S> Clone for Bound<'_, S> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<S> Copy for Bound<'_, S> {}

impl<S: DevAddr> Bound<'_, S> {
    /// The buffer's base address (0 when absent; the plan adds the offset).
    pub fn base(&self) -> u64 {
        self.buf.map_or(0, |b| b.addr())
    }
}

/// Rows, rings and caches: read as 16-byte vectors.
const ROWS: u64 = 16;

fn rows<'b, S>(arg: &'static str, role: Role, t: Option<(&'b S, usize)>) -> Bound<'b, S> {
    Bound {
        arg,
        role,
        buf: t.map(|t| t.0),
        offset: t.map_or(0, |t| t.1),
        align: ROWS,
    }
}

/// Index tensors, the cos/sin table and the FP8 scale: read by element.
fn elems<'b, S>(arg: &'static str, t: Option<&'b Tensor<'_, S>>) -> Bound<'b, S> {
    Bound {
        arg,
        role: Role::Read,
        buf: t.map(|t| t.buf),
        offset: t.map_or(0, |t| t.desc.offset),
        align: t.map_or(1, |t| t.desc.dtype.size() as u64),
    }
}

fn r<'b, S>(t: &'b Tensor<'_, S>) -> Option<(&'b S, usize)> {
    Some((t.buf, t.desc.offset))
}

fn w<'b, S>(t: &'b TensorMut<'_, S>) -> Option<(&'b S, usize)> {
    Some((&*t.buf, t.desc.offset))
}

/// The tensors of a compress launch (CR2-only ones only under CR2, the
/// predecessor rows only when given).
pub fn compress<'b, S>(a: &'b CompressArgs<'_, S>, p: &CompressPlan) -> [Bound<'b, S>; 10] {
    let cr2 = p.ring.is_some();
    let prev = p.prev_rows.is_some();
    [
        rows("kv_score", Role::Read, r(&a.kv_score)),
        elems("positions", Some(&a.positions)),
        elems("slot_mapping", Some(&a.slot_mapping)),
        rows("rms_norm_weight", Role::Read, r(&a.rms_norm_weight)),
        rows("latent_out", Role::Written, w(&a.latent_out)),
        rows(
            "state_cache",
            Role::Written,
            a.state_cache.as_ref().filter(|_| cr2).and_then(w),
        ),
        elems(
            "query_start_loc",
            a.query_start_loc.as_ref().filter(|_| cr2),
        ),
        elems(
            "token_to_req_indices",
            a.token_to_req_indices.as_ref().filter(|_| cr2),
        ),
        rows(
            "prev_rows",
            Role::Read,
            a.prev_rows.as_ref().filter(|_| prev).and_then(r),
        ),
        elems(
            "prev_row_indices",
            a.prev_row_indices.as_ref().filter(|_| prev),
        ),
    ]
}

/// The tensors of an insert launch.
pub fn insert<'b, S>(a: &'b InsertArgs<'_, S>) -> [Bound<'b, S>; 6] {
    [
        rows("latent", Role::Read, r(&a.latent)),
        elems("positions", Some(&a.positions)),
        elems("slot_mapping", Some(&a.slot_mapping)),
        elems("cos_sin_cache", Some(&a.cos_sin_cache)),
        rows("kv_cache", Role::Written, w(&a.kv_cache)),
        elems("fp8_scale", a.fp8_scale.as_ref()),
    ]
}

/// The tensors of a `save_ring_rows` launch.
pub fn ring<'b, S>(a: &'b RingArgs<'_, S>) -> [Bound<'b, S>; 3] {
    [
        rows("rows", Role::Read, r(&a.rows)),
        elems("slot_mapping", Some(&a.slot_mapping)),
        rows("state_cache", Role::Written, w(&a.state_cache)),
    ]
}

/// The tensors of a fused launch: the compressor's, then the insert's own.
pub fn fused<'b, S>(a: &'b FusedArgs<'_, S>, p: &FusedPlan) -> [Bound<'b, S>; 14] {
    let c = compress(&a.compress, &p.compress);
    [
        c[0],
        c[1],
        c[2],
        c[3],
        c[4],
        c[5],
        c[6],
        c[7],
        c[8],
        c[9],
        elems("cache_slot_mapping", Some(&a.cache_slot_mapping)),
        elems("cos_sin_cache", Some(&a.cos_sin_cache)),
        rows("kv_cache", Role::Written, w(&a.kv_cache)),
        elems("fp8_scale", a.fp8_scale.as_ref()),
    ]
}

/// The tensors of a `gather_dequant` launch, in [`GatherArgs`]' order: the
/// cache, the index tensors of the addressing form (absent ones `None`),
/// the FP8 scale, the output.
pub fn gather<'b, S>(a: &'b GatherArgs<'_, S>) -> [Bound<'b, S>; 7] {
    let (slots, table, cu, starts) = match &a.index {
        GatherIndex::Slots { slot_mapping } => (Some(slot_mapping), None, None, None),
        GatherIndex::BlockTable {
            block_table,
            cu_seq_lens,
            seq_starts,
        } => (
            None,
            Some(block_table),
            Some(cu_seq_lens),
            seq_starts.as_ref(),
        ),
    };
    [
        rows("kv_cache", Role::Read, r(&a.kv_cache)),
        elems("slot_mapping", slots),
        elems("block_table", table),
        elems("cu_seq_lens", cu),
        elems("seq_starts", starts),
        elems("fp8_scale", a.fp8_scale.as_ref()),
        rows("out", Role::Written, w(&a.out)),
    ]
}

/// A gather's pointer block from its table ([`gather`]'s order).
pub fn gather_ptrs<S: DevAddr>(t: &[Bound<'_, S>; 7], counters: u64) -> GatherPtrs {
    GatherPtrs {
        cache: t[0].base(),
        slots: t[1].base(),
        block_table: t[2].base(),
        cu_seq_lens: t[3].base(),
        seq_starts: t[4].base(),
        fp8_scale: t[5].base(),
        out: t[6].base(),
        counters,
    }
}

/// The compressor's pointer block from its table ([`compress`]'s order).
pub fn compress_ptrs<S: DevAddr>(t: &[Bound<'_, S>], counters: u64) -> CompressPtrs {
    CompressPtrs {
        kv_score: t[0].base(),
        positions: t[1].base(),
        slots: t[2].base(),
        weight: t[3].base(),
        latent: t[4].base(),
        ring: t[5].base(),
        qsl: t[6].base(),
        ttr: t[7].base(),
        prev_rows: t[8].base(),
        prev_idx: t[9].base(),
        counters,
    }
}

/// An insert's pointer block from its table ([`insert`]'s order).
pub fn insert_ptrs<S: DevAddr>(t: &[Bound<'_, S>; 6], counters: u64) -> InsertPtrs {
    InsertPtrs {
        latent: t[0].base(),
        positions: t[1].base(),
        slots: t[2].base(),
        cos_sin: t[3].base(),
        cache: t[4].base(),
        fp8_scale: t[5].base(),
        counters,
    }
}

/// The fused insert part's pointer block ([`fused`]'s order); its latent is
/// the compressor's (the parameter block links them).
pub fn fused_insert_ptrs<S: DevAddr>(t: &[Bound<'_, S>; 14], counters: u64) -> InsertPtrs {
    InsertPtrs {
        latent: t[4].base(),
        positions: t[1].base(),
        slots: t[10].base(),
        cos_sin: t[11].base(),
        cache: t[12].base(),
        fp8_scale: t[13].base(),
        counters,
    }
}

/// Raw views: every present address non-null and aligned, in table order.
pub fn check_raw(table: &[Bound<'_, RawDevice>]) -> Result<()> {
    for b in table {
        if let Some(buf) = b.buf {
            aligned(b.arg, buf.ptr, b.offset, b.align)?;
        }
    }
    Ok(())
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
    use crate::tensor::{DType, TensorDesc};

    #[test]
    fn written_tensors_are_the_documented_outputs() {
        let buf = RawDevice::unbounded(0x1000);
        let (mut a, mut b) = (buf, buf);
        let d = TensorDesc::contiguous(DType::I32, &[1]);
        let t = || Tensor::new(&buf, d);
        let args = InsertArgs {
            latent: t(),
            positions: t(),
            cos_sin_cache: t(),
            kv_cache: TensorMut::new(&mut a, d),
            slot_mapping: t(),
            compress_ratio: 1,
            fp8_scale: Some(t()),
        };
        let written = |tab: &[Bound<'_, RawDevice>]| -> Vec<&'static str> {
            tab.iter()
                .filter(|b| b.role == Role::Written)
                .map(|b| b.arg)
                .collect()
        };
        assert_eq!(written(&insert(&args)), ["kv_cache"]);
        let ring_args = RingArgs {
            rows: t(),
            slot_mapping: t(),
            state_cache: TensorMut::new(&mut b, d),
        };
        assert_eq!(written(&ring(&ring_args)), ["state_cache"]);
        let mut o = buf;
        let gather_args = GatherArgs {
            kv_cache: t(),
            index: GatherIndex::Slots { slot_mapping: t() },
            fp8_scale: None,
            out: TensorMut::new(&mut o, d),
        };
        assert_eq!(written(&gather(&gather_args)), ["out"]);
    }

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
