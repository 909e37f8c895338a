//! Each operation's tensors, declared once: the argument's name, whether
//! the kernel reads or writes it, the alignment its address needs, and its
//! view (buffer and byte offset). The GPU binding (ownership checks on the
//! safe API, address checks on the raw API, the kernels' pointer blocks),
//! the CPU's host spans and the Python binding's reading all walk these
//! tables, in their declared order, so the same bad call fails on the same
//! argument everywhere. Fields are read by name, never by position.

use super::{CompressArgs, FusedArgs, InsertArgs, RingArgs};
use super::{GatherArgs, GatherIndex};
use crate::tensor::{Tensor, TensorDesc, TensorMut};

/// Whether a kernel reads or writes a tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Read only.
    Read,
    /// Written (and possibly read).
    Written,
}

/// Rows, rings, caches and the norm weight are read as 16-byte vectors.
pub const ROW_ALIGN: u64 = 16;

/// One tensor of a call; `buf` is `None` for an absent optional tensor (or
/// one the call does not use, such as CR2-only tensors under CR1).
#[derive(Debug)]
pub struct Bound<'b, S: ?Sized> {
    /// The argument's name, as errors report it.
    pub arg: &'static str,
    /// Read or written (the `*_raw` safety contracts name the written ones).
    pub role: Role,
    /// The buffer.
    pub buf: Option<&'b S>,
    /// The view's byte offset in `buf`.
    pub offset: usize,
    /// One past the last byte of `buf` the view touches (`offset` when it
    /// is empty or absent).
    pub end: usize,
    /// What `buf`'s address plus `offset` must be a multiple of.
    pub align: u64,
}

impl<S: ?Sized> Clone for Bound<'_, S> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<S: ?Sized> Copy for Bound<'_, S> {}

/// A row-like tensor (16-byte vectors).
fn rows<'b, S: ?Sized>(
    arg: &'static str,
    role: Role,
    t: Option<(&'b S, &TensorDesc)>,
) -> Bound<'b, S> {
    Bound {
        arg,
        role,
        buf: t.map(|t| t.0),
        offset: t.map_or(0, |t| t.1.offset),
        end: t.map_or(0, |t| end(t.1)),
        align: ROW_ALIGN,
    }
}

/// The view's end in its buffer (validated views do not overflow).
fn end(d: &TensorDesc) -> usize {
    d.end_byte().map_or(d.offset, |e| e as usize)
}

/// Index tensors, the cos/sin table and the FP8 scale: read by element.
fn elems<'b, S: ?Sized>(arg: &'static str, t: Option<&'b Tensor<'_, S>>) -> Bound<'b, S> {
    Bound {
        arg,
        role: Role::Read,
        buf: t.map(|t| t.buf),
        offset: t.map_or(0, |t| t.desc.offset),
        end: t.map_or(0, |t| end(&t.desc)),
        align: t.map_or(1, |t| t.desc.dtype.size() as u64),
    }
}

fn r<'b, S: ?Sized>(t: &'b Tensor<'_, S>) -> Option<(&'b S, &'b TensorDesc)> {
    Some((t.buf, &t.desc))
}

fn w<'b, S: ?Sized>(t: &'b TensorMut<'_, S>) -> Option<(&'b S, &'b TensorDesc)> {
    Some((&*t.buf, &t.desc))
}

/// Declares a table struct whose fields are the tensors, in check order,
/// and its walk over them.
macro_rules! table {
    ($(#[$m:meta])* $name:ident { $($(#[$fm:meta])* $field:ident),* $(,)? }) => {
        $(#[$m])*
        #[derive(Debug)]
        pub struct $name<'b, S: ?Sized> {
            $($(#[$fm])* pub $field: Bound<'b, S>,)*
        }

        impl<'b, S: ?Sized> $name<'b, S> {
            /// Calls `f` on each tensor in declared order; stops at the
            /// first error.
            pub fn each<E>(&self, mut f: impl FnMut(&Bound<'b, S>) -> Result<(), E>) -> Result<(), E> {
                $(f(&self.$field)?;)*
                Ok(())
            }

            /// The tensors in declared order.
            pub fn list(&self) -> Vec<Bound<'b, S>> {
                let mut v = Vec::new();
                let _ = self.each(|b| {
                    v.push(*b);
                    Ok::<(), ()>(())
                });
                v
            }
        }
    };
}

table! {
    /// `fused_save_compress_norm`'s tensors (CR2-only ones only under CR2,
    /// the predecessor rows only when given).
    CompressTensors {
        /// Read.
        kv_score,
        /// Read.
        positions,
        /// Read.
        slot_mapping,
        /// Read.
        rms_norm_weight,
        /// Written.
        latent_out,
        /// Written (CR2).
        state_cache,
        /// Read (CR2).
        query_start_loc,
        /// Read (CR2).
        token_to_req_indices,
        /// Read (CR2 with predecessor rows).
        prev_rows,
        /// Read (CR2 with predecessor rows).
        prev_row_indices,
    }
}

table! {
    /// `rope_quant_insert`'s tensors.
    InsertTensors {
        /// Read.
        latent,
        /// Read.
        positions,
        /// Read.
        slot_mapping,
        /// Read.
        cos_sin_cache,
        /// Written.
        kv_cache,
        /// Read (FP8 rows).
        fp8_scale,
    }
}

table! {
    /// `save_ring_rows`'s tensors.
    RingTensors {
        /// Read.
        rows,
        /// Read.
        slot_mapping,
        /// Written.
        state_cache,
    }
}

table! {
    /// The fused launch's own tensors, after the compressor's.
    FusedInsertTensors {
        /// Read.
        cache_slot_mapping,
        /// Read.
        cos_sin_cache,
        /// Written.
        kv_cache,
        /// Read (FP8 rows).
        fp8_scale,
    }
}

table! {
    /// `gather_dequant`'s tensors: the cache, the index tensors of the
    /// addressing form (absent ones `None`), the FP8 scale, the output.
    GatherTensors {
        /// Read.
        kv_cache,
        /// Read (slot form).
        slot_mapping,
        /// Read (block-table form).
        block_table,
        /// Read (block-table form).
        cu_seq_lens,
        /// Read (block-table form, optional).
        seq_starts,
        /// Read (FP8 rows).
        fp8_scale,
        /// Written.
        out,
    }
}

/// The fused launch's tensors: the compressor's, then the insert's own.
#[derive(Debug)]
pub struct FusedTensors<'b, S: ?Sized> {
    /// The compressor's.
    pub compress: CompressTensors<'b, S>,
    /// The insert's own.
    pub insert: FusedInsertTensors<'b, S>,
}

impl<'b, S: ?Sized> FusedTensors<'b, S> {
    /// Calls `f` on each tensor in declared order; stops at the first error.
    pub fn each<E>(&self, mut f: impl FnMut(&Bound<'b, S>) -> Result<(), E>) -> Result<(), E> {
        self.compress.each(&mut f)?;
        self.insert.each(f)
    }

    /// The tensors in declared order.
    pub fn list(&self) -> Vec<Bound<'b, S>> {
        let mut v = self.compress.list();
        v.extend(self.insert.list());
        v
    }
}

impl<S: ?Sized> CompressArgs<'_, S> {
    /// The tensors, as validated arguments use them.
    pub fn tensors(&self) -> CompressTensors<'_, S> {
        let cr2 = self.compress_ratio == 2;
        let prev = cr2 && self.prev_rows.is_some() && self.prev_row_indices.is_some();
        CompressTensors {
            kv_score: rows("kv_score", Role::Read, r(&self.kv_score)),
            positions: elems("positions", Some(&self.positions)),
            slot_mapping: elems("slot_mapping", Some(&self.slot_mapping)),
            rms_norm_weight: rows("rms_norm_weight", Role::Read, r(&self.rms_norm_weight)),
            latent_out: rows("latent_out", Role::Written, w(&self.latent_out)),
            state_cache: rows(
                "state_cache",
                Role::Written,
                self.state_cache.as_ref().filter(|_| cr2).and_then(w),
            ),
            query_start_loc: elems(
                "query_start_loc",
                self.query_start_loc.as_ref().filter(|_| cr2),
            ),
            token_to_req_indices: elems(
                "token_to_req_indices",
                self.token_to_req_indices.as_ref().filter(|_| cr2),
            ),
            prev_rows: rows(
                "prev_rows",
                Role::Read,
                self.prev_rows.as_ref().filter(|_| prev).and_then(r),
            ),
            prev_row_indices: elems(
                "prev_row_indices",
                self.prev_row_indices.as_ref().filter(|_| prev),
            ),
        }
    }
}

impl<S: ?Sized> InsertArgs<'_, S> {
    /// The tensors.
    pub fn tensors(&self) -> InsertTensors<'_, S> {
        InsertTensors {
            latent: rows("latent", Role::Read, r(&self.latent)),
            positions: elems("positions", Some(&self.positions)),
            slot_mapping: elems("slot_mapping", Some(&self.slot_mapping)),
            cos_sin_cache: elems("cos_sin_cache", Some(&self.cos_sin_cache)),
            kv_cache: rows("kv_cache", Role::Written, w(&self.kv_cache)),
            fp8_scale: elems("fp8_scale", self.fp8_scale.as_ref()),
        }
    }
}

impl<S: ?Sized> RingArgs<'_, S> {
    /// The tensors.
    pub fn tensors(&self) -> RingTensors<'_, S> {
        RingTensors {
            rows: rows("rows", Role::Read, r(&self.rows)),
            slot_mapping: elems("slot_mapping", Some(&self.slot_mapping)),
            state_cache: rows("state_cache", Role::Written, w(&self.state_cache)),
        }
    }
}

impl<S: ?Sized> FusedArgs<'_, S> {
    /// The tensors: the compressor's, then the insert's own.
    pub fn tensors(&self) -> FusedTensors<'_, S> {
        FusedTensors {
            compress: self.compress.tensors(),
            insert: FusedInsertTensors {
                cache_slot_mapping: elems("cache_slot_mapping", Some(&self.cache_slot_mapping)),
                cos_sin_cache: elems("cos_sin_cache", Some(&self.cos_sin_cache)),
                kv_cache: rows("kv_cache", Role::Written, w(&self.kv_cache)),
                fp8_scale: elems("fp8_scale", self.fp8_scale.as_ref()),
            },
        }
    }
}

impl<S: ?Sized> GatherArgs<'_, S> {
    /// The tensors.
    pub fn tensors(&self) -> GatherTensors<'_, S> {
        let (slots, table, cu, starts) = match &self.index {
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
        GatherTensors {
            kv_cache: rows("kv_cache", Role::Read, r(&self.kv_cache)),
            slot_mapping: elems("slot_mapping", slots),
            block_table: elems("block_table", table),
            cu_seq_lens: elems("cu_seq_lens", cu),
            seq_starts: elems("seq_starts", starts),
            fp8_scale: elems("fp8_scale", self.fp8_scale.as_ref()),
            out: rows("out", Role::Written, w(&self.out)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tensor::{DType, TensorDesc};

    fn written<S: ?Sized>(list: Vec<Bound<'_, S>>) -> Vec<&'static str> {
        list.iter()
            .filter(|b| b.role == Role::Written)
            .map(|b| b.arg)
            .collect()
    }

    #[test]
    fn written_tensors_are_the_documented_outputs() {
        let buf = vec![0u8; 64];
        let (mut a, mut b, mut o) = (buf.clone(), buf.clone(), buf.clone());
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
        let tab = args.tensors();
        assert_eq!(written(tab.list()), ["kv_cache"]);
        let ring_args = RingArgs {
            rows: t(),
            slot_mapping: t(),
            state_cache: TensorMut::new(&mut b, d),
        };
        let tab = ring_args.tensors();
        assert_eq!(written(tab.list()), ["state_cache"]);
        let gather_args = GatherArgs {
            kv_cache: t(),
            index: GatherIndex::Slots { slot_mapping: t() },
            fp8_scale: None,
            out: TensorMut::new(&mut o, d),
        };
        let tab = gather_args.tensors();
        assert_eq!(written(tab.list()), ["out"]);
        assert!(tab.block_table.buf.is_none() && tab.slot_mapping.buf.is_some());
    }
}
