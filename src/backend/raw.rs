//! Caller-owned device memory and streams for the GPU backends' `unsafe`
//! `*_raw` entry points (the checks made on them are in
//! `gpu::bind`).

use crate::tensor::Storage;

/// Device memory the caller owns (a framework's tensor), for the `*_raw`
/// entry points of the CUDA and HIP backends.
///
/// `ptr` is a device address on the backend's device; the tensor descriptors
/// give dtype, shape, strides and a byte offset from `ptr`. `len` is the size
/// of the allocation from `ptr` that the caller vouches for: views are
/// checked against it; `usize::MAX` ([`RawDevice::unbounded`]) when it is
/// unknown (then nothing is bounds-checked). A view's address
/// `ptr + desc.offset` must be aligned as the kernels read it: 16 bytes for
/// `latent`, `kv_score`, `latent_out`, `rms_norm_weight`, rings, `rows`,
/// `prev_rows` and `kv_cache`, the element size for index tensors and
/// `cos_sin_cache`, 4 for `fp8_scale`. The `*_raw` functions check this and
/// reject null pointers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawDevice {
    /// Device address of byte 0.
    pub ptr: u64,
    /// Bytes from `ptr` that may be touched (`usize::MAX`: unknown).
    pub len: usize,
}

impl RawDevice {
    /// `len` bytes at `ptr`.
    pub fn new(ptr: u64, len: usize) -> Self {
        RawDevice { ptr, len }
    }

    /// Memory at `ptr` of unknown size (no bounds checks).
    pub fn unbounded(ptr: u64) -> Self {
        RawDevice {
            ptr,
            len: usize::MAX,
        }
    }
}

impl Storage for RawDevice {
    fn len_bytes(&self) -> usize {
        self.len
    }
}

/// A native stream handle (`CUstream`, `hipStream_t`) as an integer, for
/// the `*_raw` entry points; `RawStream::DEFAULT` (0) is the runtime's
/// default (null) stream. Frameworks pass theirs as they hold it (PyTorch's
/// `torch.cuda.current_stream().cuda_stream`, on CUDA and ROCm alike).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct RawStream(pub usize);

impl RawStream {
    /// The default (null) stream.
    pub const DEFAULT: RawStream = RawStream(0);

    /// The handle as the runtimes declare it.
    pub fn as_ptr(self) -> *mut std::ffi::c_void {
        self.0 as *mut std::ffi::c_void
    }

    /// A stream from its native handle.
    pub fn from_ptr(p: *mut std::ffi::c_void) -> Self {
        RawStream(p as usize)
    }
}
