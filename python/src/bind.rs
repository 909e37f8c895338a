//! One operation's call bound to a backend, written once for all six:
//! the tensors' views, in the operation's table's declared order
//! ([`dsv4_kvcache::ops::Operation`]), bound as a target's memory and run
//! through that target's entry point. It knows nothing of Python
//! arguments (`call` builds a [`Call`]) nor of which target runs
//! it (`device` chooses).

use crate::tensor::{map_err, Dev, SameDevice, View};
use dsv4_kvcache::backend::cpu::RawHost;
#[cfg(any(feature = "cuda", feature = "hip"))]
use dsv4_kvcache::backend::{
    gpu::{Driver, GpuBackend},
    RawDevice, RawStream,
};
use dsv4_kvcache::ops::{
    CompressOp, FusedOp, GatherOp, IndexerKOp, InsertOp, Operation, RingOp, Role,
};
use dsv4_kvcache::tensor::Storage;
use dsv4_kvcache::{Backend, CpuBackend, TensorMut};
use pyo3::prelude::*;
use std::convert::Infallible;

type Res = dsv4_kvcache::Result<()>;

/// Caller memory as one backend's storage type.
pub(crate) trait Mem: Storage + Sized {
    /// The storage behind view `v`.
    fn of(v: &View) -> Self;
    /// After the call, for a tensor the operation declares as `role`
    /// (copies put written bytes back).
    fn finish(&self, _v: &View, _role: Role) {}
}

impl Mem for RawHost {
    fn of(v: &View) -> Self {
        RawHost {
            ptr: v.ptr as *mut u8,
            len: v.len,
        }
    }
}

#[cfg(any(feature = "cuda", feature = "hip"))]
impl Mem for RawDevice {
    fn of(v: &View) -> Self {
        RawDevice::new(v.ptr, v.len)
    }
}

/// A backend's way to run the operations over caller memory: the CPU on
/// host pointers, a GPU on one stream, the reference on copies. Sanitize is
/// each call's argument.
pub(crate) trait Target {
    /// The caller-memory type its entry points take.
    type Mem: Mem;
    /// Runs operation `O`.
    ///
    /// # Safety
    /// The arguments' storage is live memory of this target's device, as
    /// the backend's `*_raw` / `*_host` contracts state.
    unsafe fn run<O: Launch>(&self, a: O::Args<'_, Self::Mem>, sanitize: bool) -> Res;
}

/// How an operation is called through each kind of backend entry point.
pub(crate) trait Launch: Operation {
    /// Through the safe API (sanitize is the backend's setting).
    fn safe(b: &CpuBackend, a: Self::Args<'_, Vec<u8>>) -> Res;
    /// Through the CPU's `*_host` entry point.
    ///
    /// # Safety
    /// As `CpuBackend`'s `*_host` functions.
    unsafe fn host(b: &CpuBackend, a: &Self::Args<'_, RawHost>, sanitize: bool) -> Res;
    /// Through a GPU's `*_raw` entry point on `stream`.
    ///
    /// # Safety
    /// As `GpuBackend`'s `*_raw` functions.
    #[cfg(any(feature = "cuda", feature = "hip"))]
    unsafe fn raw<D: Driver>(
        b: &GpuBackend<D>,
        stream: RawStream,
        a: &Self::Args<'_, RawDevice>,
        sanitize: bool,
    ) -> Res;
}

/// Implements [`Launch`] from each operation's three entry points; `($s)`
/// where the entry points take sanitize.
macro_rules! launch {
    (|$b:ident, $a:ident, $s:ident| $($op:ty: $safe:ident, $host:ident, $raw:ident ($($arg:ident)?);)*) => {$(
        impl Launch for $op {
            fn safe($b: &CpuBackend, $a: Self::Args<'_, Vec<u8>>) -> Res {
                $b.$safe($a)
            }
            unsafe fn host($b: &CpuBackend, $a: &Self::Args<'_, RawHost>, $s: bool) -> Res {
                let _ = $s;
                // SAFETY: the caller's contract, forwarded.
                unsafe { $b.$host($a $(, $arg)?) }
            }
            #[cfg(any(feature = "cuda", feature = "hip"))]
            unsafe fn raw<D: Driver>(
                $b: &GpuBackend<D>,
                stream: RawStream,
                $a: &Self::Args<'_, RawDevice>,
                $s: bool,
            ) -> Res {
                let _ = $s;
                // SAFETY: the caller's contract, forwarded; the counters are
                // the backend's own.
                unsafe { $b.$raw($a, stream, None $(, $arg)?) }
            }
        }
    )*};
}

launch! { |b, a, s|
    InsertOp: rope_quant_insert, rope_quant_insert_host, rope_quant_insert_raw (s);
    CompressOp: fused_save_compress_norm, fused_save_compress_norm_host, fused_save_compress_norm_raw ();
    RingOp: save_ring_rows, save_ring_rows_host, save_ring_rows_raw ();
    FusedOp: fused_compress_insert, fused_compress_insert_host, fused_compress_insert_raw (s);
    GatherOp: gather_dequant, gather_dequant_host, gather_dequant_raw ();
    IndexerKOp: indexer_k_norm_rope_store, indexer_k_norm_rope_store_host, indexer_k_norm_rope_store_raw ();
}

/// One call of operation `O`: its tensors' views and its scalars.
pub(crate) struct Call<O: Operation> {
    /// The views in the table's declared order (`None`: not given).
    views: Vec<Option<View>>,
    scalars: O::Scalars,
}

impl<O: Launch> Call<O> {
    /// A call of the views `views`, in the table's declared order (`None`:
    /// not given), with scalars `scalars`.
    pub fn new(views: Vec<Option<View>>, scalars: O::Scalars) -> Self {
        Call { views, scalars }
    }

    /// The views as the operation's table, each through `f`.
    pub fn table<'v, T>(&'v self, mut f: impl FnMut(&'v View) -> T) -> O::Of<Option<T>> {
        let mut it = self.views.iter();
        O::build(|_| Ok::<_, Infallible>(it.next().and_then(Option::as_ref).map(&mut f)))
            .unwrap_or_else(|e| match e {})
    }

    /// The device of every tensor the call uses (CR1 ignores the ring-side
    /// tensors, as the seed does, wherever they are); mixed devices are a
    /// `ValueError`. The library's own table says which tensors are used,
    /// where the given ones are not all on one device.
    pub fn device(&self) -> PyResult<Dev> {
        let mut given = self.views.iter().flatten();
        let first = given.next().map_or(Dev::Cpu, |v| v.dev);
        if given.all(|v| v.dev == first) {
            return Ok(first);
        }
        let mut views = self.table(|v| *v);
        let table = O::map(O::as_mut(&mut views), |_, v: &mut Option<View>| {
            v.as_mut().map(|v| {
                let d = v.desc;
                TensorMut::new(v, d)
            })
        });
        let args = O::from_table(table, self.scalars).map_err(map_err)?;
        let mut same = SameDevice::default();
        O::each(&O::tensors(&args), |_, b| match b.buf {
            Some(v) => same.add(b.arg, v),
            None => Ok(()),
        })?;
        Ok(same.dev())
    }

    /// Binds the views as `T::Mem` and runs the operation.
    ///
    /// # Safety
    /// The views are live memory of `t`'s device.
    pub unsafe fn run_on<T: Target>(&self, t: &T, sanitize: bool) -> Res {
        let mut mems = self.table(|v| (T::Mem::of(v), v));
        let table = O::map(
            O::as_mut(&mut mems),
            |_, m: &mut Option<(T::Mem, &View)>| m.as_mut().map(|(m, v)| TensorMut::new(m, v.desc)),
        );
        let args = O::from_table(table, self.scalars)?;
        // SAFETY: the caller's contract.
        let r = unsafe { t.run::<O>(args, sanitize) };
        let _ = O::each(&mems, |s, m| {
            if let Some((m, v)) = m {
                m.finish(v, s.role);
            }
            Ok::<(), Infallible>(())
        });
        r
    }
}
