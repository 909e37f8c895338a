//! One operation's call from Python, written once for all six: its
//! tensors read from the Python arguments named in the operation's table
//! ([`dsv4_kvcache::ops::Operation`]) and put in the table's declared
//! order, its scalars read by name, and the [`Call`] handed to
//! [`crate::device::run`].

use crate::bind::{Call, Launch};
use crate::tensor::{opt_view, ratio, torch, view, Torch, View};
use dsv4_kvcache::ops::{CompressScalars, IndexerKScalars};
use dsv4_kvcache::{IndexerKFormat, IndexerKOrder, RecordOrder};
use pyo3::prelude::*;
use std::convert::Infallible;
use std::sync::OnceLock;

/// A scalar argument as its function received it.
#[derive(Clone, Copy)]
enum Scalar {
    Int(i64),
    Float(f64),
    Flag(bool),
    Choice(Option<bool>),
    Order(RecordOrder),
    /// `k_order`'s value, checked (the preshuffled order's N is an integer
    /// argument of its own).
    KOrder(KOrder),
}

/// The indexer key store's page order without its N.
#[derive(Clone, Copy)]
enum KOrder {
    RowMajor,
    Tiled,
    Preshuffled,
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

/// The string parameters, `record_order` and `k_order`: checked here, so a
/// bad value is a ValueError naming the argument before any tensor is
/// touched.
impl Put for &str {
    fn put(self, g: &mut Given<'_>, arg: &'static str) -> PyResult<()> {
        let bad = |expected: &str| {
            pyo3::exceptions::PyValueError::new_err(format!("{arg}: {self:?}, expected {expected}"))
        };
        let v = if arg == "k_order" {
            Scalar::KOrder(match self {
                "row_major" => KOrder::RowMajor,
                "tiled" => KOrder::Tiled,
                "preshuffled" => KOrder::Preshuffled,
                _ => {
                    return Err(bad(
                        "\"row_major\", \"tiled\" (FP8) or \"preshuffled\" (MXFP4)",
                    ))
                }
            })
        } else {
            Scalar::Order(RecordOrder::from_name(self).ok_or_else(|| {
                bad("\"planar\" (a page's values, then its scales) or \"per_token\" (each record's scales after its values)")
            })?)
        };
        g.scalars.push((arg, v));
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
    pub fn run<O: Launch>(mut self, order: &Order) -> PyResult<()>
    where
        O::Scalars: Scalars,
    {
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
        let call = Call::<O>::new(views, O::Scalars::read(&self));
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

/// `indexer_k_norm_rope_store`'s: `rms_norm_eps`, `compress_ratio`,
/// `use_fp4_cache`, `k_order` with `mxfp4_n_per_tile`, `mx_scale`.
impl Scalars for IndexerKScalars {
    fn read(g: &Given<'_>) -> Self {
        let order = match g.scalar("k_order") {
            Some(Scalar::KOrder(KOrder::Tiled)) => IndexerKOrder::Tiled,
            Some(Scalar::KOrder(KOrder::Preshuffled)) => IndexerKOrder::Preshuffled {
                n_per_tile: ratio(g.int("mxfp4_n_per_tile")),
            },
            _ => IndexerKOrder::RowMajor,
        };
        IndexerKScalars {
            rms_norm_eps: g.float("rms_norm_eps") as f32,
            compress_ratio: ratio(g.int("compress_ratio")),
            format: if g.flag("use_fp4_cache") {
                IndexerKFormat::Mxfp4
            } else {
                IndexerKFormat::Fp8
            },
            order,
            mx_scale: g.flag("mx_scale"),
        }
    }
}

impl Scalars for () {
    fn read(_: &Given<'_>) -> Self {}
}
