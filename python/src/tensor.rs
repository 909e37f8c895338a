//! Reading torch tensors without libtorch, and turning the library's errors
//! into Python exceptions.
//!
//! Reading the tensor arguments is most of an eager call's host cost, so a
//! plain tensor is read through torch's DLPack exchange API where torch has
//! one (one C call, [`crate::dlpack`]); anything else, or anything that
//! export cannot describe, through its Python attributes (five or six
//! calls), which also word every error. Both read every call afresh.

use crate::dlpack::{DlTensor, Exchange, DL_CPU, DL_CUDA, DL_ROCM};
use dsv4_kvcache::{DType, Error, TensorDesc};
use pyo3::exceptions::{PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyString, PyType};
use pyo3::{ffi, intern, PyErr};

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

/// What the module needs from torch, looked up once per process (types,
/// dtype objects, unbound methods and attribute names are process-wide
/// singletons, so this caches no call state).
pub struct Torch {
    tensor: Py<PyType>,
    /// `torch.nn.Parameter`, read like a tensor by the exchange API.
    parameter: Option<Py<PyType>>,
    /// torch's DLPack C exchange API, where this torch has it.
    exchange: Option<Exchange>,
    /// The dtype objects in [`DTYPES`] order (`None` where this torch lacks one).
    dtypes: [Option<Py<PyAny>>; DTYPES.len()],
    /// `torch._C._cuda_getCurrentRawStream`, where torch has CUDA/HIP.
    pub raw_stream: Option<Py<PyAny>>,
    /// `torch.version.hip` is set: "cuda" tensors are HIP memory.
    pub is_hip: bool,
    /// Unbound methods (`torch.Tensor.stride`, ...): calling these with the
    /// tensor skips making a bound method per call.
    stride: Py<PyAny>,
    data_ptr: Py<PyAny>,
    get_device: Py<PyAny>,
    dtype: Attr,
    shape: Attr,
    is_cpu: Attr,
}

/// A data attribute of `torch.Tensor` (`dtype`, `shape`, ...): its interned
/// name, and (Python 3.10+, where the limited API reads a static type's
/// slots) its data descriptor with its `__get__`, which an exact
/// `torch.Tensor` is read through without the attribute lookup.
struct Attr {
    name: Py<PyString>,
    get: Option<(Py<PyAny>, ffi::descrgetfunc)>,
}

impl Attr {
    fn new(tensor: &Bound<'_, PyAny>, name: &str) -> Self {
        let py = tensor.py();
        let get = (py.version_info() >= (3, 10))
            .then(|| tensor.getattr(name).ok())
            .flatten()
            .and_then(|d| {
                let ty = d.get_type();
                // SAFETY: valid type object; from 3.10 on any type's slots can
                // be read, and a missing slot is null.
                let (get, set) = unsafe {
                    (
                        ffi::PyType_GetSlot(ty.as_type_ptr(), ffi::Py_tp_descr_get),
                        ffi::PyType_GetSlot(ty.as_type_ptr(), ffi::Py_tp_descr_set),
                    )
                };
                // Only a data descriptor (both slots) wins over an instance's
                // __dict__, so only then is calling it what getattr does.
                (!get.is_null() && !set.is_null()).then(|| {
                    // SAFETY: the Py_tp_descr_get slot holds a descrgetfunc.
                    let f: ffi::descrgetfunc = unsafe { std::mem::transmute(get) };
                    (d.unbind(), f)
                })
            });
        Attr {
            name: PyString::intern(py, name).unbind(),
            get,
        }
    }

    /// `getattr(o, name)`; `exact`: `o` is a `torch.Tensor`, not a subclass
    /// (which may define its own attribute).
    fn of<'py>(&self, o: &Bound<'py, PyAny>, exact: bool) -> PyResult<Bound<'py, PyAny>> {
        let p = match &self.get {
            // SAFETY: the descriptor and its own __get__, called as the
            // attribute lookup would, with valid objects while the GIL is held.
            Some((d, f)) if exact => unsafe {
                f(d.as_ptr(), o.as_ptr(), ffi::Py_TYPE(o.as_ptr()).cast())
            },
            // SAFETY: valid objects while the GIL is held.
            _ => unsafe { ffi::PyObject_GetAttr(o.as_ptr(), self.name.as_ptr()) },
        };
        owned(o.py(), p)
    }
}

/// The dtypes the operations take, by torch name.
const DTYPES: [(&str, DType); 7] = [
    ("bfloat16", DType::BF16),
    ("float32", DType::F32),
    ("float16", DType::F16),
    ("int64", DType::I64),
    ("uint8", DType::U8),
    ("int32", DType::I32),
    ("float8_e4m3fn", DType::F8E4M3),
];

static TORCH: PyOnceLock<Torch> = PyOnceLock::new();

/// The torch facts, imported at the first call.
pub fn torch(py: Python<'_>) -> PyResult<&'static Torch> {
    TORCH.get_or_try_init(py, || {
        let t = py.import("torch")?;
        let dtypes = DTYPES.map(|(name, _)| t.getattr(name).ok().map(Bound::unbind));
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
        let parameter = t
            .getattr("nn")
            .and_then(|n| n.getattr("Parameter"))
            .ok()
            .and_then(|p| p.cast_into::<PyType>().ok())
            .map(Bound::unbind);
        Ok(Torch {
            exchange: Exchange::find(&tensor),
            parameter,
            dtype: Attr::new(&tensor, "dtype"),
            shape: Attr::new(&tensor, "shape"),
            is_cpu: Attr::new(&tensor, "is_cpu"),
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

// The reading below goes through the C API directly: the Python calls
// themselves are most of a call's host cost, and PyO3's general helpers add
// a tuple per method call (no vectorcall under abi3 before 3.12) and a
// reference count pair per tuple item on top of them.

/// A new reference from the C API, or the Python error it set.
fn owned<'py>(py: Python<'py>, p: *mut ffi::PyObject) -> PyResult<Bound<'py, PyAny>> {
    // SAFETY: `p` is a new reference (or null with an exception set).
    unsafe { Bound::from_owned_ptr_or_err(py, p) }
}

/// `f(o)`, without an argument tuple (`PyObject_CallFunctionObjArgs`
/// passes its arguments on the stack).
pub fn call_with<'py>(f: &Py<PyAny>, o: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
    // SAFETY: both are valid objects while the GIL is held; the argument list
    // ends with a null pointer as the function requires.
    owned(o.py(), unsafe {
        ffi::PyObject_CallFunctionObjArgs(
            f.as_ptr(),
            o.as_ptr(),
            std::ptr::null_mut::<ffi::PyObject>(),
        )
    })
}

/// `int(x)` as an `i64`.
fn as_i64(x: &Bound<'_, PyAny>) -> PyResult<i64> {
    // SAFETY: `x` is a valid object while the GIL is held.
    let v = unsafe { ffi::PyLong_AsLongLong(x.as_ptr()) };
    if v == -1 {
        if let Some(e) = PyErr::take(x.py()) {
            return Err(e);
        }
    }
    Ok(v)
}

/// The length of tuple `x` (torch.Size included).
fn tuple_len(x: &Bound<'_, PyAny>) -> PyResult<usize> {
    // SAFETY: `x` is a valid object while the GIL is held; a non-tuple is an
    // error, not undefined behaviour.
    let n = unsafe { ffi::PyTuple_Size(x.as_ptr()) };
    usize::try_from(n).map_err(|_| PyErr::fetch(x.py()))
}

/// `x[i]` of tuple `x` as an `i64`, for `i` below its length.
fn tuple_i64(x: &Bound<'_, PyAny>, i: usize) -> PyResult<i64> {
    // SAFETY: `x` is a valid tuple while the GIL is held and `i` is in range
    // (checked again by the call); the item is borrowed from `x`, which
    // outlives this use.
    let item = unsafe { ffi::PyTuple_GetItem(x.as_ptr(), i as ffi::Py_ssize_t) };
    if item.is_null() {
        return Err(PyErr::fetch(x.py()));
    }
    // SAFETY: as above.
    let v = unsafe { ffi::PyLong_AsLongLong(item) };
    if v == -1 {
        if let Some(e) = PyErr::take(x.py()) {
            return Err(e);
        }
    }
    Ok(v)
}

/// Reads tensor argument `arg`.
pub fn view(py: Python<'_>, t: &Torch, arg: &'static str, o: &Bound<'_, PyAny>) -> PyResult<View> {
    read(py, t, arg, o, true)
}

/// Whether this torch is read through its DLPack exchange API.
pub fn has_exchange(t: &Torch) -> bool {
    t.exchange.is_some()
}

/// Reads tensor argument `arg`, through the DLPack exchange API when
/// `exchange` and torch has one (and `o` is a plain tensor or parameter),
/// else (or when the export fails or shows anything the checks below must
/// word) through its attributes.
pub fn read(
    py: Python<'_>,
    t: &Torch,
    arg: &'static str,
    o: &Bound<'_, PyAny>,
    exchange: bool,
) -> PyResult<View> {
    let tensor = t.tensor.bind(py);
    let ty = o.get_type();
    let exact = ty.is(tensor);
    if let Some(x) = t.exchange.as_ref().filter(|_| exchange) {
        // Subclasses other than Parameter may wrap another tensor (fake,
        // functional, distributed tensors): their attributes answer for them.
        let plain = exact || t.parameter.as_ref().is_some_and(|p| ty.is(p.bind(py)));
        if plain {
            if let Some(Some(v)) = x.with(o, exported) {
                return Ok(v);
            }
        }
    }
    // An exact torch.Tensor needs no subclass walk.
    if !exact && !o.is_instance(tensor)? {
        return Err(PyTypeError::new_err(format!(
            "{arg}: expected a torch.Tensor, got {}",
            o.get_type().name()?
        )));
    }
    let dt = t.dtype.of(o, exact)?;
    let found = t
        .dtypes
        .iter()
        .zip(DTYPES)
        .find(|(d, _)| d.as_ref().is_some_and(|d| d.as_ptr() == dt.as_ptr()));
    let Some((_, (_, dtype))) = found else {
        return Err(PyTypeError::new_err(format!(
            "{arg}: dtype {dt}, expected one of float32, bfloat16, float16, uint8, float8_e4m3fn, int32, int64 (see the function's documentation for which)"
        )));
    };
    // get_device() is the CUDA (HIP) index, or -1 for every other device.
    let index = as_i64(&call_with(&t.get_device, o)?)?;
    let dev = if index >= 0 {
        Dev::Cuda(i32::try_from(index).unwrap_or(i32::MAX))
    } else if t.is_cpu.of(o, exact)?.is_truthy()? {
        Dev::Cpu
    } else {
        return Err(PyValueError::new_err(format!(
            "{arg}: on device {}, expected a CPU or CUDA (ROCm) tensor",
            o.getattr(intern!(py, "device"))?
        )));
    };
    let shape = t.shape.of(o, exact)?;
    let stride = call_with(&t.stride, o)?;
    let rank = tuple_len(&shape)?;
    if rank > dsv4_kvcache::tensor::MAX_RANK || tuple_len(&stride)? != rank {
        return Err(PyValueError::new_err(format!(
            "{arg}: {rank} dimensions, at most {}",
            dsv4_kvcache::tensor::MAX_RANK
        )));
    }
    let mut sh = [0usize; 4];
    let mut st = [0usize; 4];
    for i in 0..rank {
        let (n, s) = (tuple_i64(&shape, i)?, tuple_i64(&stride, i)?);
        (sh[i], st[i]) = (
            n as usize,
            usize::try_from(s).map_err(|_| {
                PyValueError::new_err(format!("{arg}: negative stride in dimension {i}"))
            })?,
        );
    }
    let desc = TensorDesc::strided(dtype, &sh[..rank], &st[..rank]).map_err(map_err)?;
    let ptr = call_with(&t.data_ptr, o)?;
    // SAFETY: `ptr` is a valid object while the GIL is held.
    let ptr = unsafe { ffi::PyLong_AsUnsignedLongLong(ptr.as_ptr()) };
    if ptr == u64::MAX {
        if let Some(e) = PyErr::take(py) {
            return Err(e);
        }
    }
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

/// The view a `DLTensor` describes, or `None` for anything the attribute
/// path must judge and word the error for (another dtype or device, a rank
/// above [`MAX_RANK`](dsv4_kvcache::tensor::MAX_RANK), missing strides).
fn exported(d: &DlTensor) -> Option<View> {
    let dtype = match (d.dtype.code, d.dtype.bits, d.dtype.lanes) {
        // kDLBfloat, kDLFloat, kDLInt, kDLUInt, kDLFloat8_e4m3fn.
        (4, 16, 1) => DType::BF16,
        (2, 32, 1) => DType::F32,
        (2, 16, 1) => DType::F16,
        (0, 64, 1) => DType::I64,
        (1, 8, 1) => DType::U8,
        (0, 32, 1) => DType::I32,
        (10, 8, 1) => DType::F8E4M3,
        _ => return None,
    };
    let dev = match d.device.device_type {
        DL_CPU => Dev::Cpu,
        DL_CUDA | DL_ROCM => Dev::Cuda(d.device.device_id),
        _ => return None,
    };
    let rank = usize::try_from(d.ndim).ok()?;
    if rank > dsv4_kvcache::tensor::MAX_RANK
        || (rank > 0 && (d.shape.is_null() || d.strides.is_null()))
    {
        return None;
    }
    let mut sh = [0usize; 4];
    let mut st = [0usize; 4];
    for i in 0..rank {
        // SAFETY: `rank` entries each, checked non-null, alive while the
        // tensor is (`Exchange::with`).
        let (n, s) = unsafe { (*d.shape.add(i), *d.strides.add(i)) };
        (sh[i], st[i]) = (usize::try_from(n).ok()?, usize::try_from(s).ok()?);
    }
    let desc = TensorDesc::strided(dtype, &sh[..rank], &st[..rank]).ok()?;
    let ptr = (d.data as u64).checked_add(d.byte_offset)?;
    let len = desc.end_byte().map_or(usize::MAX, |e| e as usize);
    Some(View {
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

/// The device every argument is on, gathered one argument at a time;
/// mixed devices are a `ValueError` naming the first argument that differs
/// from the first one.
#[derive(Default)]
pub struct SameDevice(Option<(&'static str, Dev)>);

impl SameDevice {
    /// Adds argument `arg`'s view.
    pub fn add(&mut self, arg: &'static str, v: &View) -> PyResult<()> {
        match self.0 {
            None => self.0 = Some((arg, v.dev)),
            Some((a0, d0)) if d0 != v.dev => {
                return Err(PyValueError::new_err(format!(
                    "{arg}: on {}, expected {d0} like {a0} (all tensors must be on one device)",
                    v.dev
                )))
            }
            _ => {}
        }
        Ok(())
    }

    /// The device (the CPU when no tensor was added).
    pub fn dev(&self) -> Dev {
        self.0.map_or(Dev::Cpu, |f| f.1)
    }
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
