//! Reading torch tensors through their Python attributes (no libtorch), and
//! turning the library's errors into Python exceptions.

use dsv4_kvcache::{DType, Error, TensorDesc};
use pyo3::exceptions::{PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyTuple, PyType};
use pyo3::{intern, PyErr};

/// Where a tensor lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dev {
    /// Host memory.
    Cpu,
    /// A CUDA device of torch (a HIP device on a ROCm build of torch).
    Cuda(i32),
}

impl std::fmt::Display for Dev {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Dev::Cpu => f.write_str("cpu"),
            Dev::Cuda(i) => write!(f, "cuda:{i}"),
        }
    }
}

/// One tensor argument: address of its first element, the bytes its view
/// spans from there, and its view (offset 0 from `ptr`).
#[derive(Debug, Clone, Copy)]
pub struct View {
    /// `data_ptr()`.
    pub ptr: u64,
    /// Bytes the view spans from `ptr` on (torch keeps every view inside its
    /// storage: `as_strided` and `set_` check it).
    pub len: usize,
    /// dtype, shape, strides.
    pub desc: TensorDesc,
    /// Device.
    pub dev: Dev,
}

/// What the module needs from torch, looked up once per process (types and
/// dtype objects are process-wide singletons, so this caches no call state).
pub struct Torch {
    tensor: Py<PyType>,
    dtypes: Vec<(Py<PyAny>, DType)>,
    /// `torch._C._cuda_getCurrentRawStream`, where torch has CUDA/HIP.
    pub raw_stream: Option<Py<PyAny>>,
    /// `torch.version.hip` is set: "cuda" tensors are HIP memory.
    pub is_hip: bool,
    /// Unbound methods (`torch.Tensor.stride`, ...): calling these with the
    /// tensor skips making a bound method per call, a good part of the
    /// per-call host cost under the limited C API.
    stride: Py<PyAny>,
    data_ptr: Py<PyAny>,
    get_device: Py<PyAny>,
}

static TORCH: PyOnceLock<Torch> = PyOnceLock::new();

/// The torch facts, imported at the first call.
pub fn torch(py: Python<'_>) -> PyResult<&'static Torch> {
    TORCH.get_or_try_init(py, || {
        let t = py.import("torch")?;
        let mut dtypes = Vec::new();
        for (name, d) in [
            ("float32", DType::F32),
            ("bfloat16", DType::BF16),
            ("uint8", DType::U8),
            ("float8_e4m3fn", DType::F8E4M3),
            ("int32", DType::I32),
            ("int64", DType::I64),
        ] {
            if let Ok(o) = t.getattr(name) {
                dtypes.push((o.unbind(), d));
            }
        }
        let raw_stream = t
            .getattr("_C")
            .and_then(|c| c.getattr("_cuda_getCurrentRawStream"))
            .ok()
            .map(Bound::unbind);
        let is_hip = t
            .getattr("version")
            .and_then(|v| v.getattr("hip"))
            .map(|h| !h.is_none())
            .unwrap_or(false);
        let tensor = t.getattr("Tensor")?;
        let m = |n: &str| tensor.getattr(n).map(Bound::unbind);
        Ok(Torch {
            stride: m("stride")?,
            data_ptr: m("data_ptr")?,
            get_device: m("get_device")?,
            tensor: tensor.cast_into::<PyType>()?.unbind(),
            dtypes,
            raw_stream,
            is_hip,
        })
    })
}

/// Reads tensor argument `arg`.
pub fn view(py: Python<'_>, t: &Torch, arg: &'static str, o: &Bound<'_, PyAny>) -> PyResult<View> {
    if !o.is_instance(t.tensor.bind(py))? {
        return Err(PyTypeError::new_err(format!(
            "{arg}: expected a torch.Tensor, got {}",
            o.get_type().name()?
        )));
    }
    let dt = o.getattr(intern!(py, "dtype"))?;
    let Some(dtype) = t
        .dtypes
        .iter()
        .find(|(d, _)| d.bind(py).is(&dt))
        .map(|p| p.1)
    else {
        return Err(PyTypeError::new_err(format!(
            "{arg}: dtype {dt}, expected one of float32, bfloat16, uint8, float8_e4m3fn, int32, int64 (see the function's documentation for which)"
        )));
    };
    // get_device() is the CUDA (HIP) index, or -1 for every other device.
    let index: i32 = t.get_device.bind(py).call1((o,))?.extract()?;
    let dev = if index >= 0 {
        Dev::Cuda(index)
    } else if o.getattr(intern!(py, "is_cpu"))?.is_truthy()? {
        Dev::Cpu
    } else {
        return Err(PyValueError::new_err(format!(
            "{arg}: on device {}, expected a CPU or CUDA (ROCm) tensor",
            o.getattr(intern!(py, "device"))?
        )));
    };
    let shape = o.getattr(intern!(py, "shape"))?;
    let shape = shape.cast::<PyTuple>()?;
    let stride = t.stride.bind(py).call1((o,))?;
    let stride = stride.cast::<PyTuple>()?;
    let rank = shape.len();
    if rank > dsv4_kvcache::tensor::MAX_RANK || stride.len() != rank {
        return Err(PyValueError::new_err(format!(
            "{arg}: {rank} dimensions, at most {}",
            dsv4_kvcache::tensor::MAX_RANK
        )));
    }
    let mut sh = [0usize; 4];
    let mut st = [0usize; 4];
    for i in 0..rank {
        let (n, s): (i64, i64) = (
            shape.get_item(i)?.extract()?,
            stride.get_item(i)?.extract()?,
        );
        (sh[i], st[i]) = (
            n as usize,
            usize::try_from(s).map_err(|_| {
                PyValueError::new_err(format!("{arg}: negative stride in dimension {i}"))
            })?,
        );
    }
    let desc = TensorDesc::strided(dtype, &sh[..rank], &st[..rank]).map_err(map_err)?;
    let ptr: u64 = t.data_ptr.bind(py).call1((o,))?.extract()?;
    // The view's own extent: torch keeps views inside their storage, and
    // reading the storage's size costs three calls (and an object) per tensor.
    let len = desc.end_byte().map_or(usize::MAX, |e| e as usize);
    Ok(View {
        ptr,
        len,
        desc,
        dev,
    })
}

/// An optional tensor argument (`None` stays `None`).
pub fn opt_view(
    py: Python<'_>,
    t: &Torch,
    arg: &'static str,
    o: Option<&Bound<'_, PyAny>>,
) -> PyResult<Option<View>> {
    match o {
        Some(o) if !o.is_none() => view(py, t, arg, o).map(Some),
        _ => Ok(None),
    }
}

/// The device every argument is on; mixed devices are a `ValueError` naming
/// the first argument that differs from the first one.
pub fn common_device(views: &[(&'static str, Option<&View>)]) -> PyResult<Dev> {
    let mut first: Option<(&'static str, Dev)> = None;
    for &(arg, v) in views {
        let Some(v) = v else { continue };
        match first {
            None => first = Some((arg, v.dev)),
            Some((a0, d0)) if d0 != v.dev => {
                return Err(PyValueError::new_err(format!(
                    "{arg}: on {}, expected {d0} like {a0} (all tensors must be on one device)",
                    v.dev
                )))
            }
            _ => {}
        }
    }
    Ok(first.map_or(Dev::Cpu, |f| f.1))
}

/// A compress ratio from Python: anything but 1 or 2 is rejected by the
/// library's own check, so out-of-range integers only need to survive the
/// conversion.
pub fn ratio(cr: i64) -> u32 {
    u32::try_from(cr).unwrap_or(u32::MAX)
}

/// The library's errors as Python exceptions: a wrong dtype or a missing
/// argument is a `TypeError`, a wrong shape or value a `ValueError`, a
/// backend that cannot run or a failed driver call a `RuntimeError`.
pub fn map_err(e: Error) -> PyErr {
    match e {
        Error::DType { .. } | Error::Missing { .. } => PyTypeError::new_err(e.to_string()),
        Error::Shape { .. } | Error::OutOfBounds { .. } | Error::Value { .. } => {
            PyValueError::new_err(e.to_string())
        }
        Error::Unavailable { .. } | Error::Driver { .. } | Error::Vectors(_) => {
            PyRuntimeError::new_err(e.to_string())
        }
    }
}
