//! Reading a tensor through torch's DLPack C exchange API
//! (`torch.Tensor.__dlpack_c_exchange_api__`, torch 2.10 and later): one C
//! call fills a `DLTensor` on our stack with the data pointer, device, dtype,
//! shape and strides, where the attribute path makes five Python calls.
//! Nothing is allocated or kept: the `DLTensor` borrows the tensor's own
//! shape and strides for the duration of the read.
//!
//! The layouts below are DLPack 1.x's (`dlpack.h`, major version 1, which
//! keeps them stable across its minor versions).

use pyo3::ffi;
use pyo3::prelude::*;
use std::ffi::{c_int, c_void};

/// `DLDevice`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct DlDevice {
    /// `DLDeviceType`.
    pub device_type: c_int,
    /// The device index.
    pub device_id: i32,
}

/// `DLDataType`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct DlDataType {
    /// `DLDataTypeCode`.
    pub code: u8,
    /// Bits per lane.
    pub bits: u8,
    /// Lanes (1 for scalars).
    pub lanes: u16,
}

/// `DLTensor`.
#[repr(C)]
pub struct DlTensor {
    /// The data pointer (`byte_offset` is added to it).
    pub data: *mut c_void,
    /// Where the data lives.
    pub device: DlDevice,
    /// Number of dimensions.
    pub ndim: i32,
    /// Element type.
    pub dtype: DlDataType,
    /// `ndim` sizes.
    pub shape: *const i64,
    /// `ndim` strides in elements (null before DLPack 1.2 for compact tensors).
    pub strides: *const i64,
    /// Bytes from `data` to the first element.
    pub byte_offset: u64,
}

impl DlTensor {
    fn empty() -> Self {
        DlTensor {
            data: std::ptr::null_mut(),
            device: DlDevice {
                device_type: 0,
                device_id: 0,
            },
            ndim: 0,
            dtype: DlDataType {
                code: 0,
                bits: 0,
                lanes: 0,
            },
            shape: std::ptr::null(),
            strides: std::ptr::null(),
            byte_offset: 0,
        }
    }
}

/// `DLPackDLTensorFromPyObjectNoSync`: 0 on success, -1 with a Python
/// exception set.
type FromPyObject = unsafe extern "C" fn(*mut c_void, *mut DlTensor) -> c_int;

/// `DLPackExchangeAPI` up to the function used here (its header, then the
/// function pointers in declaration order).
#[repr(C)]
struct ExchangeApi {
    major: u32,
    minor: u32,
    prev_api: *const c_void,
    managed_tensor_allocator: *const c_void,
    managed_tensor_from_py_object_no_sync: *const c_void,
    managed_tensor_to_py_object_no_sync: *const c_void,
    dltensor_from_py_object_no_sync: Option<FromPyObject>,
}

/// `kDLCPU`.
pub const DL_CPU: c_int = 1;
/// `kDLCUDA`.
pub const DL_CUDA: c_int = 2;
/// `kDLROCM` (the "cuda" tensors of a ROCm build of torch).
pub const DL_ROCM: c_int = 10;

/// torch's exporter of `DLTensor`s, found once per process (the API table is
/// static in torch and lives as long as the process; the capsule is kept
/// anyway).
pub struct Exchange {
    _capsule: Py<PyAny>,
    from_py_object: FromPyObject,
}

impl Exchange {
    /// The exchange API of `torch.Tensor`, when this torch has one of
    /// DLPack major version 1 with the non-owning export.
    pub fn find(tensor_type: &Bound<'_, PyAny>) -> Option<Exchange> {
        let capsule = tensor_type.getattr("__dlpack_c_exchange_api__").ok()?;
        // SAFETY: a valid object; a non-capsule or another name is an error
        // (cleared below), not undefined behaviour.
        let api =
            unsafe { ffi::PyCapsule_GetPointer(capsule.as_ptr(), c"dlpack_exchange_api".as_ptr()) }
                as *const ExchangeApi;
        if api.is_null() {
            PyErr::take(capsule.py());
            return None;
        }
        // SAFETY: the capsule holds a DLPackExchangeAPI; its header (major,
        // minor, prev_api) is stable across DLPack versions, and the fields
        // after it are read only for major version 1.
        let from_py_object = unsafe {
            if (*api).major != 1 {
                return None;
            }
            (*api).dltensor_from_py_object_no_sync?
        };
        Some(Exchange {
            _capsule: capsule.unbind(),
            from_py_object,
        })
    }

    /// Calls `f` with the `DLTensor` of `o` (a plain `torch.Tensor`, the type
    /// the API came from, or an `nn.Parameter`, which torch unpacks alike),
    /// or returns `None` when torch cannot export it (the Python error it
    /// raised is cleared; the caller reads the tensor the other way, which
    /// reports the problem).
    pub fn with<R>(&self, o: &Bound<'_, PyAny>, f: impl FnOnce(&DlTensor) -> R) -> Option<R> {
        let mut t = DlTensor::empty();
        // SAFETY: `o` is a live tensor of a type torch unpacks (the caller's
        // check); the GIL is held, as the function requires to raise.
        let rc = unsafe { (self.from_py_object)(o.as_ptr().cast(), &mut t) };
        if rc != 0 {
            PyErr::take(o.py());
            return None;
        }
        // The shape and strides borrow `o`'s, which `o` keeps alive while `f` runs.
        Some(f(&t))
    }
}
