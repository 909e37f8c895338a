//! One operation's call, written once for all five: its tensors read from
//! the Python arguments named in the operation's table
//! ([`dsv4_kvcache::ops::Operation`]), bound as a backend's memory in the
//! table's declared order, and run through that backend's entry point.

use crate::tensor::{map_err, opt_view, ratio, torch, view, Dev, SameDevice, Torch, View};
use dsv4_kvcache::backend::cpu::RawHost;
#[cfg(any(feature = "cuda", feature = "hip"))]
use dsv4_kvcache::backend::{
    gpu::{Driver, GpuBackend},
    RawDevice, RawStream,
};
use dsv4_kvcache::ops::{
    CompressOp, CompressScalars, FusedOp, GatherOp, InsertOp, Operation, RingOp, Role,
};
use dsv4_kvcache::tensor::Storage;
use dsv4_kvcache::{Backend, CpuBackend, RecordOrder, TensorMut};
use pyo3::prelude::*;
use std::convert::Infallible;
use std::sync::OnceLock;

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
pub(crate) trait Launch: Operation<Scalars: Scalars> {
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
}

/// A scalar argument as its function received it.
#[derive(Clone, Copy)]
enum Scalar {
    Int(i64),
    Float(f64),
    Flag(bool),
    Choice(Option<bool>),
    Order(RecordOrder),
}

/// A call's arguments as its function received them: each tensor read at
/// once (in the signature's order, so the first bad one is the one
/// reported), the scalars kept by name.
pub(crate) struct Given<'py> {
    py: Python<'py>,
    torch: &'static Torch,
    tensors: Vec<(&'static str, Option<View>)>,
    scalars: Vec<(&'static str, Scalar)>,
}

/// Where each of an operation's tensors, in its table's declared order,
/// stands among its function's tensor parameters (`None`: not one of
/// them); found by name at the function's first call.
pub(crate) type Order = OnceLock<Vec<Option<usize>>>;

/// A value a function passes to [`Given::put`].
pub(crate) trait Put {
    /// Records the value of argument `arg`.
    fn put(self, g: &mut Given<'_>, arg: &'static str) -> PyResult<()>;
}

impl Put for &Bound<'_, PyAny> {
    fn put(self, g: &mut Given<'_>, arg: &'static str) -> PyResult<()> {
        let v = view(g.py, g.torch, arg, self)?;
        g.tensors.push((arg, Some(v)));
        Ok(())
    }
}

impl Put for Option<&Bound<'_, PyAny>> {
    fn put(self, g: &mut Given<'_>, arg: &'static str) -> PyResult<()> {
        let v = opt_view(g.py, g.torch, arg, self)?;
        g.tensors.push((arg, v));
        Ok(())
    }
}

/// Scalar parameter types, each kept as its [`Scalar`].
macro_rules! put_scalar {
    ($($t:ty => $k:ident),*) => {$(
        impl Put for $t {
            fn put(self, g: &mut Given<'_>, arg: &'static str) -> PyResult<()> {
                g.scalars.push((arg, Scalar::$k(self)));
                Ok(())
            }
        }
    )*};
}

put_scalar!(i64 => Int, f64 => Float, bool => Flag, Option<bool> => Choice);

/// The one string parameter, `record_order`: checked here, so a bad value
/// is a ValueError naming the argument before any tensor is touched.
impl Put for &str {
    fn put(self, g: &mut Given<'_>, arg: &'static str) -> PyResult<()> {
        let order = RecordOrder::from_name(self).ok_or_else(|| {
            pyo3::exceptions::PyValueError::new_err(format!(
                "{arg}: {self:?}, expected \"planar\" (a page's values, then its scales) or \"per_token\" (each record's scales after its values)"
            ))
        })?;
        g.scalars.push((arg, Scalar::Order(order)));
        Ok(())
    }
}

impl<'py> Given<'py> {
    /// An empty set of arguments.
    pub fn new(py: Python<'py>) -> PyResult<Self> {
        Ok(Given {
            py,
            torch: torch(py)?,
            tensors: Vec::with_capacity(16),
            scalars: Vec::new(),
        })
    }

    /// Records argument `arg`.
    pub fn put(&mut self, arg: &'static str, v: impl Put) -> PyResult<()> {
        v.put(self, arg)
    }

    fn scalar(&self, arg: &str) -> Option<Scalar> {
        self.scalars.iter().find(|s| s.0 == arg).map(|s| s.1)
    }

    /// Integer argument `arg` (0 when the function has none).
    fn int(&self, arg: &str) -> i64 {
        match self.scalar(arg) {
            Some(Scalar::Int(v)) => v,
            _ => 0,
        }
    }

    /// Float argument `arg` (0 when the function has none).
    fn float(&self, arg: &str) -> f64 {
        match self.scalar(arg) {
            Some(Scalar::Float(v)) => v,
            _ => 0.0,
        }
    }

    /// Flag argument `arg` (false when the function has none).
    fn flag(&self, arg: &str) -> bool {
        matches!(self.scalar(arg), Some(Scalar::Flag(true)))
    }

    /// Record order argument `arg` (the seed's page-planar order when the
    /// function has none).
    fn order(&self, arg: &str) -> RecordOrder {
        match self.scalar(arg) {
            Some(Scalar::Order(o)) => o,
            _ => RecordOrder::PagePlanar,
        }
    }

    /// Optional flag argument `arg` (`None` when the function has none).
    fn choice(&self, arg: &str) -> Option<bool> {
        match self.scalar(arg) {
            Some(Scalar::Choice(v)) => v,
            _ => None,
        }
    }

    /// Runs operation `O` on the given arguments, on their device;
    /// `order` is the calling function's own.
    pub fn run<O: Launch>(mut self, order: &Order) -> PyResult<()> {
        let order = order.get_or_init(|| {
            let mut v = Vec::new();
            let walk = O::build(|s| {
                v.push(self.tensors.iter().position(|t| t.0 == s.arg));
                Ok::<(), Infallible>(())
            });
            let _: O::Of<()> = walk.unwrap_or_else(|e| match e {});
            v
        });
        let views = order
            .iter()
            .map(|i| i.and_then(|i| self.tensors[i].1.take()))
            .collect();
        let call = Call::<O> {
            views,
            scalars: O::Scalars::read(&self),
        };
        let dev = call.device()?;
        crate::device::run(self.py, self.torch, dev, &call, self.choice("sanitize"))
    }
}

/// An operation's non-tensor arguments, read by name.
pub(crate) trait Scalars: Sized {
    /// The values from `g`.
    fn read(g: &Given<'_>) -> Self;
}

/// `rope_quant_insert`'s: `compress_ratio` and `record_order`.
impl Scalars for (u32, RecordOrder) {
    fn read(g: &Given<'_>) -> Self {
        (ratio(g.int("compress_ratio")), g.order("record_order"))
    }
}

impl Scalars for CompressScalars {
    fn read(g: &Given<'_>) -> Self {
        CompressScalars {
            rms_norm_eps: g.float("rms_norm_eps") as f32,
            compress_ratio: ratio(g.int("compress_ratio")),
        }
    }
}

/// The fused launch's: the compressor's, `skip_latent_out` and
/// `record_order`.
impl Scalars for (CompressScalars, bool, RecordOrder) {
    fn read(g: &Given<'_>) -> Self {
        (
            CompressScalars::read(g),
            g.flag("skip_latent_out"),
            g.order("record_order"),
        )
    }
}

/// `gather_dequant`'s: `record_order`.
impl Scalars for RecordOrder {
    fn read(g: &Given<'_>) -> Self {
        g.order("record_order")
    }
}

impl Scalars for () {
    fn read(_: &Given<'_>) -> Self {}
}

/// One call of operation `O`: its tensors' views and its scalars.
pub(crate) struct Call<O: Operation> {
    /// The views in the table's declared order (`None`: not given).
    views: Vec<Option<View>>,
    scalars: O::Scalars,
}

impl<O: Launch> Call<O> {
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
    fn device(&self) -> PyResult<Dev> {
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
