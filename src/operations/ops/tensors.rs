//! Each operation's tensors, declared once: the argument's name, whether
//! the kernel reads or writes it, the element types it accepts, the
//! alignment its address needs, and (per call) its view (buffer and byte
//! offset). Validation (dtype and alignment checks), the GPU binding
//! (ownership checks on the safe API, address checks on the raw API, the
//! kernels' pointer blocks), the CPU's host spans and the Python binding's
//! reading all walk these tables, in their declared order, so the same bad
//! call fails on the same argument everywhere. Fields are read by name,
//! never by position.

use super::{CompressArgs, FusedArgs, InsertArgs, RingArgs};
use super::{GatherArgs, GatherIndex};
use crate::error::{Error, Result};
use crate::indexer_k::{IndexerKArgs, IndexerKFormat, IndexerKOrder};
use crate::layout::RecordOrder;
use crate::tensor::{DType, Tensor, TensorDesc, TensorMut};

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

/// What a tensor's address (buffer plus view offset) must be a multiple of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Align {
    /// [`ROW_ALIGN`] bytes: the tensor is read or written as 16-byte vectors.
    Row,
    /// Its element size: the tensor is read element by element.
    Elem,
}

impl Align {
    /// The alignment in bytes for elements of `dtype`.
    pub fn bytes(self, dtype: DType) -> u64 {
        match self {
            Align::Row => ROW_ALIGN,
            Align::Elem => dtype.size() as u64,
        }
    }
}

/// One tensor argument as its operation declares it.
#[derive(Debug, PartialEq, Eq)]
pub struct Spec {
    /// The argument's name, as errors report it (and as Python passes it).
    pub arg: &'static str,
    /// Read or written (the `*_raw` safety contracts name the written ones).
    pub role: Role,
    /// The element types it accepts.
    pub dtypes: &'static [DType],
    /// What its address must be a multiple of.
    pub align: Align,
}

impl Spec {
    /// The accepted element types in words (`"I32 or I64"`).
    pub fn expected(&self) -> String {
        let names: Vec<&str> = self.dtypes.iter().map(|d| d.name()).collect();
        match names.split_last() {
            Some((last, rest)) if !rest.is_empty() => format!("{} or {last}", rest.join(", ")),
            _ => names.concat(),
        }
    }

    /// An [`Error::DType`] unless `d`'s element type is one this tensor accepts.
    pub fn dtype(&self, d: &TensorDesc) -> Result<()> {
        if self.dtypes.contains(&d.dtype) {
            return Ok(());
        }
        Err(self.dtype_err(d))
    }

    /// The [`Error::DType`] for `d`'s element type.
    pub fn dtype_err(&self, d: &TensorDesc) -> Error {
        Error::DType {
            arg: self.arg,
            got: d.dtype.to_string(),
            expected: self.expected(),
        }
    }

    /// An [`Error::Shape`] unless the view's byte offset is a multiple of
    /// the tensor's alignment (buffers are allocated at least that aligned;
    /// the raw APIs check the address itself).
    pub fn aligned(&self, d: &TensorDesc) -> Result<()> {
        let bytes = self.align.bytes(d.dtype);
        if d.offset as u64 % bytes != 0 {
            return Err(Error::Shape {
                arg: self.arg,
                problem: format!("byte offset {} must be a multiple of {bytes}", d.offset),
            });
        }
        Ok(())
    }
}

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
    /// The view of `buf` (`None` with it).
    pub desc: Option<TensorDesc>,
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

/// Tensor `s` of a call, bound to its view (`None`: absent or unused).
fn bound<'b, S: ?Sized>(s: &'static Spec, t: Option<(&'b S, &TensorDesc)>) -> Bound<'b, S> {
    Bound {
        arg: s.arg,
        role: s.role,
        buf: t.map(|t| t.0),
        desc: t.map(|t| *t.1),
        offset: t.map_or(0, |t| t.1.offset),
        // Validated views do not overflow.
        end: t.map_or(0, |t| t.1.end_byte().map_or(t.1.offset, |e| e as usize)),
        align: t.map_or(1, |t| s.align.bytes(t.1.dtype)),
    }
}

fn r<'b, S: ?Sized>(t: &'b Tensor<'_, S>) -> Option<(&'b S, &'b TensorDesc)> {
    Some((t.buf, &t.desc))
}

fn w<'b, S: ?Sized>(t: &'b TensorMut<'_, S>) -> Option<(&'b S, &'b TensorDesc)> {
    Some((&*t.buf, &t.desc))
}

/// Declares a table struct whose fields are the tensors, in check order,
/// each with its role, alignment and accepted element types; the static
/// holding the declarations; and the walks over a table.
macro_rules! table {
    ($(#[$m:meta])* $name:ident, $specs:ident {
        $($(#[$fm:meta])* $field:ident: $role:ident, $align:ident, [$($dt:ident),+]),* $(,)?
    }) => {
        $(#[$m])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub struct $name<T> {
            $($(#[$fm])* pub $field: T,)*
        }

        #[doc = concat!("The declarations of [`", stringify!($name), "`]'s tensors.")]
        pub static $specs: $name<Spec> = $name {
            $($field: Spec {
                arg: stringify!($field),
                role: Role::$role,
                dtypes: &[$(DType::$dt),+],
                align: Align::$align,
            },)*
        };

        impl<T> $name<T> {
            /// A table of `f`'s results on each declaration, called in
            /// declared order; stops at the first error.
            pub fn build<E>(mut f: impl FnMut(&'static Spec) -> std::result::Result<T, E>) -> std::result::Result<Self, E> {
                Ok($name { $($field: f(&$specs.$field)?,)* })
            }

            /// Each entry with its declaration through `f`, in declared order.
            pub fn map<U>(self, mut f: impl FnMut(&'static Spec, T) -> U) -> $name<U> {
                $name { $($field: f(&$specs.$field, self.$field),)* }
            }

            /// A table of the entries, each borrowed mutably.
            pub fn as_mut(&mut self) -> $name<&mut T> {
                $name { $($field: &mut self.$field,)* }
            }

            /// Calls `f` on each entry with its declaration, in declared
            /// order; stops at the first error.
            pub fn each<E>(&self, mut f: impl FnMut(&'static Spec, &T) -> std::result::Result<(), E>) -> std::result::Result<(), E> {
                $(f(&$specs.$field, &self.$field)?;)*
                Ok(())
            }

            /// The entries in declared order.
            pub fn list(&self) -> Vec<T>
            where
                T: Copy,
            {
                let mut v = Vec::new();
                let _ = self.each(|_, b| {
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
    CompressTensors, COMPRESS {
        /// Read.
        kv_score: Read, Row, [F32],
        /// Read.
        positions: Read, Elem, [I32, I64],
        /// Read.
        slot_mapping: Read, Elem, [I32, I64],
        /// Read, each value widened exactly to f32 (as the seed's
        /// `.to(float32)`).
        rms_norm_weight: Read, Row, [F32, BF16, F16],
        /// Written.
        latent_out: Written, Row, [BF16],
        /// Written (CR2).
        state_cache: Written, Row, [F32],
        /// Read (CR2).
        query_start_loc: Read, Elem, [I32, I64],
        /// Read (CR2).
        token_to_req_indices: Read, Elem, [I32, I64],
        /// Read (CR2 with predecessor rows).
        prev_rows: Read, Row, [F32],
        /// Read (CR2 with predecessor rows).
        prev_row_indices: Read, Elem, [I32, I64],
    }
}

table! {
    /// `rope_quant_insert`'s tensors.
    InsertTensors, INSERT {
        /// Read.
        latent: Read, Row, [BF16],
        /// Read.
        positions: Read, Elem, [I32, I64],
        /// Read.
        slot_mapping: Read, Elem, [I32, I64],
        /// Read, each value widened exactly to f32.
        cos_sin_cache: Read, Elem, [F32, BF16, F16],
        /// Written: U8 (paged records), BF16 or F8_E4M3 (rows).
        kv_cache: Written, Row, [U8, BF16, F8E4M3],
        /// Read (FP8 rows).
        fp8_scale: Read, Elem, [F32],
    }
}

table! {
    /// `save_ring_rows`'s tensors.
    RingTensors, RING {
        /// Read.
        rows: Read, Row, [F32],
        /// Read.
        slot_mapping: Read, Elem, [I32, I64],
        /// Written.
        state_cache: Written, Row, [F32],
    }
}

table! {
    /// The fused launch's own tensors, after the compressor's.
    FusedInsertTensors, FUSED_INSERT {
        /// Read.
        cache_slot_mapping: Read, Elem, [I32, I64],
        /// Read, each value widened exactly to f32.
        cos_sin_cache: Read, Elem, [F32, BF16, F16],
        /// Written: U8 (paged records), BF16 or F8_E4M3 (rows).
        kv_cache: Written, Row, [U8, BF16, F8E4M3],
        /// Read (FP8 rows).
        fp8_scale: Read, Elem, [F32],
    }
}

table! {
    /// `gather_dequant`'s tensors: the cache, the index tensors of the
    /// addressing form (absent ones `None`), the FP8 scale, the output.
    GatherTensors, GATHER {
        /// Read: U8 (paged records), BF16 or F8_E4M3 (rows).
        kv_cache: Read, Row, [U8, BF16, F8E4M3],
        /// Read (slot form).
        slot_mapping: Read, Elem, [I32, I64],
        /// Read (block-table form).
        block_table: Read, Elem, [I32, I64],
        /// Read (block-table form).
        cu_seq_lens: Read, Elem, [I32, I64],
        /// Read (block-table form, optional).
        seq_starts: Read, Elem, [I32, I64],
        /// Read (FP8 rows).
        fp8_scale: Read, Elem, [F32],
        /// Written.
        out: Written, Row, [BF16, F32],
    }
}

table! {
    /// `indexer_k_norm_rope_store`'s tensors.
    IndexerKTensors, INDEXER_K {
        /// Read (any row stride, so element-aligned).
        k_pre: Read, Elem, [BF16],
        /// Read.
        positions: Read, Elem, [I32, I64],
        /// Read, each value widened exactly to f32.
        cos_sin_cache: Read, Elem, [F32, BF16, F16],
        /// Read, each value widened exactly to f32.
        rms_norm_weight: Read, Elem, [F32, BF16, F16],
        /// Written: the paged 132 or 68 B records.
        k_cache: Written, Row, [U8],
        /// Read.
        kv_slot_mapping: Read, Elem, [I32, I64],
    }
}

/// The fused launch's tensors: the compressor's, then the insert's own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FusedTensors<T> {
    /// The compressor's.
    pub compress: CompressTensors<T>,
    /// The insert's own.
    pub insert: FusedInsertTensors<T>,
}

impl<T> FusedTensors<T> {
    /// As [`CompressTensors::build`]: the compressor's, then the insert's own.
    pub fn build<E>(
        mut f: impl FnMut(&'static Spec) -> std::result::Result<T, E>,
    ) -> std::result::Result<Self, E> {
        Ok(FusedTensors {
            compress: CompressTensors::build(&mut f)?,
            insert: FusedInsertTensors::build(f)?,
        })
    }

    /// As [`CompressTensors::map`].
    pub fn map<U>(self, mut f: impl FnMut(&'static Spec, T) -> U) -> FusedTensors<U> {
        FusedTensors {
            compress: self.compress.map(&mut f),
            insert: self.insert.map(f),
        }
    }

    /// As [`CompressTensors::as_mut`].
    pub fn as_mut(&mut self) -> FusedTensors<&mut T> {
        FusedTensors {
            compress: self.compress.as_mut(),
            insert: self.insert.as_mut(),
        }
    }

    /// As [`CompressTensors::each`].
    pub fn each<E>(
        &self,
        mut f: impl FnMut(&'static Spec, &T) -> std::result::Result<(), E>,
    ) -> std::result::Result<(), E> {
        self.compress.each(&mut f)?;
        self.insert.each(f)
    }

    /// The entries in declared order.
    pub fn list(&self) -> Vec<T>
    where
        T: Copy,
    {
        let mut v = self.compress.list();
        v.extend(self.insert.list());
        v
    }
}

/// One operation seen through its tensor table: the table as a family of
/// types (`Of<T>` holds one `T` per tensor), and the argument struct, made
/// from a table of views and walked as one. Code that treats every
/// operation alike (the Python binding) is written once against this.
pub trait Operation {
    /// The operation's name, as its function is called.
    const NAME: &'static str;
    /// The table holding one `T` per tensor.
    type Of<T>;
    /// The argument struct over storage `S`.
    type Args<'a, S: ?Sized + 'a>;
    /// The arguments that are not tensors.
    type Scalars: Copy + Send + Sync + 'static;

    /// A table of `f`'s results on each declaration, in declared order.
    fn build<T, E>(
        f: impl FnMut(&'static Spec) -> std::result::Result<T, E>,
    ) -> std::result::Result<Self::Of<T>, E>;
    /// Each entry with its declaration through `f`, in declared order.
    fn map<T, U>(t: Self::Of<T>, f: impl FnMut(&'static Spec, T) -> U) -> Self::Of<U>;
    /// A table of the entries, each borrowed mutably.
    fn as_mut<T>(t: &mut Self::Of<T>) -> Self::Of<&mut T>;
    /// Calls `f` on each entry with its declaration, in declared order.
    fn each<T, E>(
        t: &Self::Of<T>,
        f: impl FnMut(&'static Spec, &T) -> std::result::Result<(), E>,
    ) -> std::result::Result<(), E>;
    /// The entries in declared order.
    fn list<T: Copy>(t: &Self::Of<T>) -> Vec<T>;
    /// The arguments from a table of views (`None`: not given) and the
    /// scalars; written tensors stay writable, read ones are reborrowed
    /// shared. A required tensor that is absent is an [`Error::Missing`].
    fn from_table<'a, S: ?Sized + 'a>(
        t: Self::Of<Option<TensorMut<'a, S>>>,
        s: Self::Scalars,
    ) -> Result<Self::Args<'a, S>>;
    /// The tensors the arguments use (as their `tensors()` method).
    fn tensors<'b, 'a: 'b, S: ?Sized + 'a>(a: &'b Self::Args<'a, S>) -> Self::Of<Bound<'b, S>>;
    /// The arguments' scalars, as [`Operation::from_table`] takes them.
    fn scalars<S: ?Sized>(a: &Self::Args<'_, S>) -> Self::Scalars;
}

/// A tensor the operation requires.
fn need<'a, S: ?Sized>(s: &'static Spec, t: Option<TensorMut<'a, S>>) -> Result<TensorMut<'a, S>> {
    t.ok_or(Error::Missing {
        arg: s.arg,
        problem: "required",
    })
}

/// A read tensor, reborrowed shared.
fn ro<S: ?Sized>(t: TensorMut<'_, S>) -> Tensor<'_, S> {
    Tensor::new(t.buf, t.desc)
}

/// Declares an operation's marker type and its [`Operation`] impl: the
/// table's walks delegated to the table, `from_table`'s body, which sees
/// the table as `$t`, the scalars as `$sc` and the declarations as `$s`,
/// and `scalars`' body, which sees the arguments as `$a`.
macro_rules! operation {
    ($(#[$m:meta])* $op:ident = $name:literal: $args:ident, $table:ident, $specs:ident, $scalars:ty,
     |$t:ident, $sc:pat_param, $s:ident| $body:expr, |$a:pat_param| $read:expr) => {
        $(#[$m])*
        #[derive(Debug)]
        pub enum $op {}

        impl Operation for $op {
            const NAME: &'static str = $name;
            type Of<T> = $table<T>;
            type Args<'a, S: ?Sized + 'a> = $args<'a, S>;
            type Scalars = $scalars;

            fn build<T, E>(
                f: impl FnMut(&'static Spec) -> std::result::Result<T, E>,
            ) -> std::result::Result<$table<T>, E> {
                $table::build(f)
            }
            fn map<T, U>(t: $table<T>, f: impl FnMut(&'static Spec, T) -> U) -> $table<U> {
                t.map(f)
            }
            fn as_mut<T>(t: &mut $table<T>) -> $table<&mut T> {
                t.as_mut()
            }
            fn each<T, E>(
                t: &$table<T>,
                f: impl FnMut(&'static Spec, &T) -> std::result::Result<(), E>,
            ) -> std::result::Result<(), E> {
                t.each(f)
            }
            fn list<T: Copy>(t: &$table<T>) -> Vec<T> {
                t.list()
            }
            fn tensors<'b, 'a: 'b, S: ?Sized + 'a>(a: &'b $args<'a, S>) -> $table<Bound<'b, S>> {
                a.tensors()
            }
            fn scalars<S: ?Sized>($a: &$args<'_, S>) -> $scalars {
                $read
            }
            fn from_table<'a, S: ?Sized + 'a>(
                $t: $table<Option<TensorMut<'a, S>>>,
                $sc: $scalars,
            ) -> Result<$args<'a, S>> {
                let $s = &$specs;
                $body
            }
        }
    };
}

operation! {
    /// `rope_quant_insert`; its scalars are `compress_ratio` and the record order.
    InsertOp = "rope_quant_insert": InsertArgs, InsertTensors, INSERT, (u32, RecordOrder),
    |t, (compress_ratio, record_order), s| Ok(InsertArgs {
        compress_ratio,
        latent: ro(need(&s.latent, t.latent)?),
        positions: ro(need(&s.positions, t.positions)?),
        slot_mapping: ro(need(&s.slot_mapping, t.slot_mapping)?),
        cos_sin_cache: ro(need(&s.cos_sin_cache, t.cos_sin_cache)?),
        kv_cache: need(&s.kv_cache, t.kv_cache)?,
        fp8_scale: t.fp8_scale.map(ro),
        record_order,
    }),
    |a| (a.compress_ratio, a.record_order)
}

/// `fused_save_compress_norm`'s scalars.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CompressScalars {
    /// RMSNorm epsilon.
    pub rms_norm_eps: f32,
    /// Group size.
    pub compress_ratio: u32,
}

operation! {
    /// `fused_save_compress_norm`.
    CompressOp = "fused_save_compress_norm": CompressArgs, CompressTensors, COMPRESS, CompressScalars,
    |t, c, s| Ok(CompressArgs {
        rms_norm_eps: c.rms_norm_eps,
        compress_ratio: c.compress_ratio,
        kv_score: ro(need(&s.kv_score, t.kv_score)?),
        positions: ro(need(&s.positions, t.positions)?),
        slot_mapping: ro(need(&s.slot_mapping, t.slot_mapping)?),
        rms_norm_weight: ro(need(&s.rms_norm_weight, t.rms_norm_weight)?),
        latent_out: need(&s.latent_out, t.latent_out)?,
        state_cache: t.state_cache,
        query_start_loc: t.query_start_loc.map(ro),
        token_to_req_indices: t.token_to_req_indices.map(ro),
        prev_rows: t.prev_rows.map(ro),
        prev_row_indices: t.prev_row_indices.map(ro),
    }),
    |a| CompressScalars {
        rms_norm_eps: a.rms_norm_eps,
        compress_ratio: a.compress_ratio,
    }
}

operation! {
    /// `save_ring_rows`.
    RingOp = "save_ring_rows": RingArgs, RingTensors, RING, (),
    |t, (), s| Ok(RingArgs {
        rows: ro(need(&s.rows, t.rows)?),
        slot_mapping: ro(need(&s.slot_mapping, t.slot_mapping)?),
        state_cache: need(&s.state_cache, t.state_cache)?,
    }),
    |_| ()
}

operation! {
    /// The fused compress + insert; its scalars are the compressor's and
    /// `skip_latent_out` and the record order.
    FusedOp = "fused_compress_insert": FusedArgs, FusedTensors, FUSED_INSERT, (CompressScalars, bool, RecordOrder),
    |t, (c, skip_latent_out, record_order), s| Ok(FusedArgs {
        compress: CompressOp::from_table(t.compress, c)?,
        skip_latent_out,
        cache_slot_mapping: ro(need(&s.cache_slot_mapping, t.insert.cache_slot_mapping)?),
        cos_sin_cache: ro(need(&s.cos_sin_cache, t.insert.cos_sin_cache)?),
        kv_cache: need(&s.kv_cache, t.insert.kv_cache)?,
        fp8_scale: t.insert.fp8_scale.map(ro),
        record_order,
    }),
    |a| (CompressOp::scalars(&a.compress), a.skip_latent_out, a.record_order)
}

operation! {
    /// `gather_dequant`. The addressing form is the one whose tensors are
    /// given: exactly one of `slot_mapping` and `block_table` with
    /// `cu_seq_lens` (an [`Error::Value`] otherwise). Its scalar is the record
    /// order.
    GatherOp = "gather_dequant": GatherArgs, GatherTensors, GATHER, RecordOrder,
    |t, record_order, s| Ok(GatherArgs {
        index: gather_index(t.slot_mapping, t.block_table, t.cu_seq_lens, t.seq_starts)?,
        kv_cache: ro(need(&s.kv_cache, t.kv_cache)?),
        fp8_scale: t.fp8_scale.map(ro),
        out: need(&s.out, t.out)?,
        record_order,
    }),
    |a| a.record_order
}

/// `indexer_k_norm_rope_store`'s scalars.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct IndexerKScalars {
    /// RMSNorm epsilon.
    pub rms_norm_eps: f32,
    /// Group size.
    pub compress_ratio: u32,
    /// FP8 or MXFP4 records.
    pub format: IndexerKFormat,
    /// The page order.
    pub order: IndexerKOrder,
    /// FP8 scales as four UE8M0 bytes.
    pub mx_scale: bool,
}

operation! {
    /// `indexer_k_norm_rope_store`, the V4.1 indexer key store.
    IndexerKOp = "indexer_k_norm_rope_store": IndexerKArgs, IndexerKTensors, INDEXER_K, IndexerKScalars,
    |t, c, s| Ok(IndexerKArgs {
        k_pre: ro(need(&s.k_pre, t.k_pre)?),
        positions: ro(need(&s.positions, t.positions)?),
        cos_sin_cache: ro(need(&s.cos_sin_cache, t.cos_sin_cache)?),
        rms_norm_weight: ro(need(&s.rms_norm_weight, t.rms_norm_weight)?),
        rms_norm_eps: c.rms_norm_eps,
        k_cache: need(&s.k_cache, t.k_cache)?,
        kv_slot_mapping: ro(need(&s.kv_slot_mapping, t.kv_slot_mapping)?),
        compress_ratio: c.compress_ratio,
        format: c.format,
        order: c.order,
        mx_scale: c.mx_scale,
    }),
    |a| IndexerKScalars {
        rms_norm_eps: a.rms_norm_eps,
        compress_ratio: a.compress_ratio,
        format: a.format,
        order: a.order,
        mx_scale: a.mx_scale,
    }
}

/// The gather's addressing form from its given index tensors.
fn gather_index<'a, S: ?Sized>(
    slot_mapping: Option<TensorMut<'a, S>>,
    block_table: Option<TensorMut<'a, S>>,
    cu_seq_lens: Option<TensorMut<'a, S>>,
    seq_starts: Option<TensorMut<'a, S>>,
) -> Result<GatherIndex<'a, S>> {
    let value = |arg, problem: &str| Error::Value {
        arg,
        problem: problem.into(),
    };
    let table = block_table.is_some() || cu_seq_lens.is_some() || seq_starts.is_some();
    Ok(match (slot_mapping, block_table, cu_seq_lens) {
        (Some(_), ..) if table => {
            return Err(value(
                "slot_mapping",
                "give either slot_mapping or block_table with cu_seq_lens, not both",
            ))
        }
        (Some(s), ..) => GatherIndex::Slots {
            slot_mapping: ro(s),
        },
        (None, Some(b), Some(c)) => GatherIndex::BlockTable {
            block_table: ro(b),
            cu_seq_lens: ro(c),
            seq_starts: seq_starts.map(ro),
        },
        (None, None, _) if table => {
            return Err(value(
                "block_table",
                "required with cu_seq_lens / seq_starts",
            ))
        }
        (None, Some(_), None) => return Err(value("cu_seq_lens", "required with block_table")),
        (None, None, _) => {
            return Err(value(
                "slot_mapping",
                "give slot_mapping, or block_table with cu_seq_lens",
            ))
        }
    })
}

impl<S: ?Sized> CompressArgs<'_, S> {
    /// The tensors, as validated arguments use them.
    pub fn tensors(&self) -> CompressTensors<Bound<'_, S>> {
        let cr2 = self.compress_ratio == 2;
        let prev = cr2 && self.prev_rows.is_some() && self.prev_row_indices.is_some();
        let s = &COMPRESS;
        CompressTensors {
            kv_score: bound(&s.kv_score, r(&self.kv_score)),
            positions: bound(&s.positions, r(&self.positions)),
            slot_mapping: bound(&s.slot_mapping, r(&self.slot_mapping)),
            rms_norm_weight: bound(&s.rms_norm_weight, r(&self.rms_norm_weight)),
            latent_out: bound(&s.latent_out, w(&self.latent_out)),
            state_cache: bound(
                &s.state_cache,
                self.state_cache.as_ref().filter(|_| cr2).and_then(w),
            ),
            query_start_loc: bound(
                &s.query_start_loc,
                self.query_start_loc.as_ref().filter(|_| cr2).and_then(r),
            ),
            token_to_req_indices: bound(
                &s.token_to_req_indices,
                self.token_to_req_indices
                    .as_ref()
                    .filter(|_| cr2)
                    .and_then(r),
            ),
            prev_rows: bound(
                &s.prev_rows,
                self.prev_rows.as_ref().filter(|_| prev).and_then(r),
            ),
            prev_row_indices: bound(
                &s.prev_row_indices,
                self.prev_row_indices.as_ref().filter(|_| prev).and_then(r),
            ),
        }
    }
}

impl<S: ?Sized> InsertArgs<'_, S> {
    /// The tensors.
    pub fn tensors(&self) -> InsertTensors<Bound<'_, S>> {
        let s = &INSERT;
        InsertTensors {
            latent: bound(&s.latent, r(&self.latent)),
            positions: bound(&s.positions, r(&self.positions)),
            slot_mapping: bound(&s.slot_mapping, r(&self.slot_mapping)),
            cos_sin_cache: bound(&s.cos_sin_cache, r(&self.cos_sin_cache)),
            kv_cache: bound(&s.kv_cache, w(&self.kv_cache)),
            fp8_scale: bound(&s.fp8_scale, self.fp8_scale.as_ref().and_then(r)),
        }
    }
}

impl<S: ?Sized> RingArgs<'_, S> {
    /// The tensors.
    pub fn tensors(&self) -> RingTensors<Bound<'_, S>> {
        let s = &RING;
        RingTensors {
            rows: bound(&s.rows, r(&self.rows)),
            slot_mapping: bound(&s.slot_mapping, r(&self.slot_mapping)),
            state_cache: bound(&s.state_cache, w(&self.state_cache)),
        }
    }
}

impl<S: ?Sized> FusedArgs<'_, S> {
    /// The tensors: the compressor's, then the insert's own.
    pub fn tensors(&self) -> FusedTensors<Bound<'_, S>> {
        let s = &FUSED_INSERT;
        FusedTensors {
            compress: self.compress.tensors(),
            insert: FusedInsertTensors {
                cache_slot_mapping: bound(&s.cache_slot_mapping, r(&self.cache_slot_mapping)),
                cos_sin_cache: bound(&s.cos_sin_cache, r(&self.cos_sin_cache)),
                kv_cache: bound(&s.kv_cache, w(&self.kv_cache)),
                fp8_scale: bound(&s.fp8_scale, self.fp8_scale.as_ref().and_then(r)),
            },
        }
    }
}

impl<S: ?Sized> IndexerKArgs<'_, S> {
    /// The tensors.
    pub fn tensors(&self) -> IndexerKTensors<Bound<'_, S>> {
        let s = &INDEXER_K;
        IndexerKTensors {
            k_pre: bound(&s.k_pre, r(&self.k_pre)),
            positions: bound(&s.positions, r(&self.positions)),
            cos_sin_cache: bound(&s.cos_sin_cache, r(&self.cos_sin_cache)),
            rms_norm_weight: bound(&s.rms_norm_weight, r(&self.rms_norm_weight)),
            k_cache: bound(&s.k_cache, w(&self.k_cache)),
            kv_slot_mapping: bound(&s.kv_slot_mapping, r(&self.kv_slot_mapping)),
        }
    }
}

impl<S: ?Sized> GatherArgs<'_, S> {
    /// The tensors.
    pub fn tensors(&self) -> GatherTensors<Bound<'_, S>> {
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
        let s = &GATHER;
        GatherTensors {
            kv_cache: bound(&s.kv_cache, r(&self.kv_cache)),
            slot_mapping: bound(&s.slot_mapping, slots.and_then(r)),
            block_table: bound(&s.block_table, table.and_then(r)),
            cu_seq_lens: bound(&s.cu_seq_lens, cu.and_then(r)),
            seq_starts: bound(&s.seq_starts, starts.and_then(r)),
            fp8_scale: bound(&s.fp8_scale, self.fp8_scale.as_ref().and_then(r)),
            out: bound(&s.out, w(&self.out)),
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
            record_order: RecordOrder::PagePlanar,
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
            record_order: RecordOrder::PagePlanar,
        };
        let tab = gather_args.tensors();
        assert_eq!(written(tab.list()), ["out"]);
        assert!(tab.block_table.buf.is_none() && tab.slot_mapping.buf.is_some());
    }
}
