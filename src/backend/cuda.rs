//! The CUDA backend: the embedded fatbin's kernels, launched through the CUDA
//! driver API ([`cudarc`]'s `driver` safe and result layers), with the driver
//! library (`libcuda`) loaded at run time.
//!
//! # Availability
//!
//! The binary starts without a driver. [`CudaBackend::new`] and
//! [`CudaBackend::device_count`] return [`Error::Unavailable`] when
//!
//! * no `libcuda` can be loaded: cudarc's own loader panics in that case, so
//!   the library is probed first with `cudarc::driver::sys::is_culib_present`
//!   (which only tries to open the candidate names), and every driver symbol
//!   this backend calls is then looked up once (a driver older than the CUDA
//!   13.0 bindings may lack one, which cudarc would also turn into a panic on
//!   first call); as a last guard, construction runs under
//!   [`std::panic::catch_unwind`];
//! * `cuInit` fails (no device, the toolkit's stub library, a driver too old),
//!   or the ordinal is not that of a device;
//! * this build has no fatbin (nvcc was not found at build time:
//!   [`crate::kernels::missing_reasons`] says why; run
//!   `scripts/install-toolchains.sh` and rebuild), or it has no SASS for the
//!   device's architecture.
//!
//! # Launches
//!
//! Every launch validates its arguments with the shared `plan_*` functions,
//! builds the `#[repr(C)]` parameter block of [`crate::kernel_abi`] from the
//! buffers' device addresses and passes it by value as the kernel's single
//! argument, in the shape [`kernel_abi::geometry`] picks for the launch's
//! groups (small blocks at decode sizes), no dynamic shared memory, on the backend's stream. A launch allocates nothing,
//! copies nothing between host and device and never waits for the device, so
//! launches can be captured into a CUDA graph ([`CudaBackend::capture`],
//! [`CudaBackend::time_graph`]). A launch with no token (`N == 0`) launches
//! nothing.
//!
//! Buffers ([`CudaBuffer`]) belong to the backend (and stream) that made them;
//! passing one to another backend is an error. Frameworks that own their
//! memory use the `unsafe` `*_raw` entry points over [`RawDevice`] pointers
//! and their own stream.

use super::Backend;
use crate::error::{Error, Result};
use crate::kernel_abi::{
    self, CompressPtrs, InsertPtrs, Kernel, KernelParams, Launch, NUM_COUNTERS,
};
use crate::kernels;
use crate::ops::{
    plan_compress, plan_fused, plan_insert, plan_ring_rows, CompressArgs, CompressPlan, FusedArgs,
    FusedPlan, InsertArgs, InsertPlan, RingArgs, RingRowsPlan, SkipCounts,
};
use crate::tensor::{Storage, Tensor, TensorMut};
use cudarc::driver::{
    result as cu, sys, CudaContext, CudaGraph, CudaSlice, CudaStream, DevicePtr, DriverError,
};
use std::ffi::{c_void, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

const BACKEND: &str = "cuda";

/// Driver entry points this backend (through cudarc) calls. Each is looked up
/// once before the first call, so a driver that lacks one is reported as
/// unavailable instead of panicking inside cudarc.
const REQUIRED_SYMBOLS: &[&str] = &[
    "cuInit",
    "cuGetErrorName",
    "cuGetErrorString",
    "cuDeviceGetCount",
    "cuDeviceGet",
    "cuDeviceGetName",
    "cuDeviceGetAttribute",
    "cuDevicePrimaryCtxRetain",
    "cuDevicePrimaryCtxRelease_v2",
    "cuCtxGetCurrent",
    "cuCtxSetCurrent",
    "cuCtxSynchronize",
    "cuStreamCreate",
    "cuStreamDestroy_v2",
    "cuStreamSynchronize",
    "cuStreamBeginCapture_v2",
    "cuStreamEndCapture",
    "cuGraphInstantiateWithFlags",
    "cuGraphUpload",
    "cuGraphLaunch",
    "cuGraphExecDestroy",
    "cuGraphDestroy",
    "cuModuleLoadData",
    "cuModuleGetFunction",
    "cuModuleUnload",
    "cuMemAlloc_v2",
    "cuMemFree_v2",
    "cuMemAllocAsync",
    "cuMemFreeAsync",
    "cuMemsetD8Async",
    "cuMemcpyHtoDAsync_v2",
    "cuMemcpyDtoHAsync_v2",
    "cuMemcpyDtoDAsync_v2",
    "cuLaunchKernel",
    "cuEventCreate",
    "cuEventRecord",
    "cuEventSynchronize",
    "cuEventDestroy_v2",
];

/// `cuEventElapsedTime` (`_v2` since CUDA 12.8; same signature).
type ElapsedFn = unsafe extern "C" fn(*mut f32, sys::CUevent, sys::CUevent) -> sys::CUresult;

/// What the one-time driver probe found.
struct Driver {
    elapsed: Option<ElapsedFn>,
}

fn unavailable(reason: impl Into<String>) -> Error {
    Error::Unavailable {
        backend: BACKEND,
        reason: reason.into(),
    }
}

/// The driver's name and description of an error.
fn describe(e: DriverError) -> String {
    let name = e
        .error_name()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|_| format!("{:?}", e.0));
    match e.error_string() {
        Ok(s) => format!("{name} ({})", s.to_string_lossy()),
        Err(_) => name,
    }
}

/// Maps a driver error of `call` to [`Error::Driver`].
fn drv(call: &'static str) -> impl Fn(DriverError) -> Error {
    move |e| Error::Driver {
        backend: BACKEND,
        call,
        message: describe(e),
    }
}

fn panic_text(p: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "unknown panic".to_string()
    }
}

/// Why this build has no CUDA kernels, with how to get nvcc.
fn no_kernels_reason() -> String {
    let from_build: Vec<&str> = kernels::missing_reasons()
        .iter()
        .copied()
        .filter(|r| r.contains("CUDA") || r.contains("nvcc"))
        .collect();
    let mut s = if from_build.is_empty() {
        "this build has no CUDA kernels (no fatbin was embedded)".to_string()
    } else {
        from_build.join("; ")
    };
    if !s.contains("install-toolchains") {
        s.push_str(
            ". Fix: run scripts/install-toolchains.sh (installs nvcc into .toolchains/), or set NVCC=/path/to/nvcc; \
             then rebuild",
        );
    }
    s
}

/// Loads the driver library and checks its symbols, once per process.
fn driver() -> Result<&'static Driver> {
    static PROBE: OnceLock<std::result::Result<Driver, String>> = OnceLock::new();
    PROBE
        .get_or_init(|| {
            // SAFETY: only tries to open the candidate library names.
            if !unsafe { sys::is_culib_present() } {
                let mut names = cudarc::get_lib_name_candidates("cuda");
                let mut seen = std::collections::HashSet::new();
                names.retain(|n| seen.insert(n.clone()));
                return Err(format!(
                    "no CUDA driver library: none of {} could be loaded (install the NVIDIA driver, or put the \
                     directory holding libcuda.so.1 on LD_LIBRARY_PATH)",
                    names.join(", ")
                ));
            }
            let lib = catch_unwind(|| {
                // SAFETY: opens the library cudarc will use for every call.
                unsafe { sys::culib() }
            })
            .map_err(|p| format!("loading the CUDA driver library failed: {}", panic_text(&*p)))?;
            let missing: Vec<&str> = REQUIRED_SYMBOLS
                .iter()
                .copied()
                // SAFETY: a lookup only; the symbol is not called here.
                .filter(|s| unsafe { lib.get::<unsafe extern "C" fn()>(s.as_bytes()) }.is_err())
                .collect();
            if !missing.is_empty() {
                return Err(format!(
                    "the CUDA driver library lacks {} (the driver is too old for this build; update the NVIDIA \
                     driver)",
                    missing.join(", ")
                ));
            }
            // SAFETY: both symbols have the signature of `ElapsedFn`; the
            // library stays loaded for the life of the process.
            let elapsed = unsafe {
                lib.get::<ElapsedFn>(b"cuEventElapsedTime_v2")
                    .or_else(|_| lib.get::<ElapsedFn>(b"cuEventElapsedTime"))
                    .ok()
                    .map(|s| *s)
            };
            Ok(Driver { elapsed })
        })
        .as_ref()
        .map_err(|r| {
            let mut r = r.clone();
            if kernels::cuda_fatbin().is_none() {
                r.push_str("; also, ");
                r.push_str(&no_kernels_reason());
            }
            unavailable(r)
        })
}

/// Initializes the driver: `Ok(false)` when it reports no device.
fn init_driver() -> Result<bool> {
    match cu::init() {
        Ok(()) => Ok(true),
        Err(DriverError(sys::CUresult::CUDA_ERROR_NO_DEVICE)) => Ok(false),
        Err(e) => Err(unavailable(format!("cuInit failed: {}", describe(e)))),
    }
}

// ---- buffers ---------------------------------------------------------------

/// Device memory owned by a [`CudaBackend`].
#[derive(Debug)]
pub struct CudaBuffer {
    slice: CudaSlice<u8>,
    ptr: u64,
    len: usize,
}

impl CudaBuffer {
    /// The device address of the first byte.
    pub fn device_ptr(&self) -> u64 {
        self.ptr
    }

    /// Size in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The cudarc allocation (at least one byte, even for an empty buffer).
    pub fn as_cuda_slice(&self) -> &CudaSlice<u8> {
        &self.slice
    }
}

impl Storage for CudaBuffer {
    fn len_bytes(&self) -> usize {
        self.len
    }
}

pub use super::raw::RawDevice;

/// A device address of a buffer of either kind.
trait DevAddr: Storage {
    fn addr(&self) -> u64;
}

impl DevAddr for CudaBuffer {
    fn addr(&self) -> u64 {
        self.ptr
    }
}

impl DevAddr for RawDevice {
    fn addr(&self) -> u64 {
        self.ptr
    }
}

fn base<S: DevAddr>(t: &Option<Tensor<'_, S>>) -> u64 {
    t.as_ref().map_or(0, |t| t.buf.addr())
}

fn base_mut<S: DevAddr>(t: &Option<TensorMut<'_, S>>) -> u64 {
    t.as_ref().map_or(0, |t| t.buf.addr())
}

fn compress_ptrs<S: DevAddr>(a: &CompressArgs<'_, S>, counters: u64) -> CompressPtrs {
    CompressPtrs {
        kv_score: a.kv_score.buf.addr(),
        positions: a.positions.buf.addr(),
        slots: a.slot_mapping.buf.addr(),
        qsl: base(&a.query_start_loc),
        ttr: base(&a.token_to_req_indices),
        weight: a.rms_norm_weight.buf.addr(),
        latent: a.latent_out.buf.addr(),
        ring: base_mut(&a.state_cache),
        prev_rows: base(&a.prev_rows),
        prev_idx: base(&a.prev_row_indices),
        counters,
    }
}

fn insert_ptrs<S: DevAddr>(a: &InsertArgs<'_, S>, counters: u64) -> InsertPtrs {
    InsertPtrs {
        latent: a.latent.buf.addr(),
        positions: a.positions.buf.addr(),
        slots: a.slot_mapping.buf.addr(),
        cos_sin: a.cos_sin_cache.buf.addr(),
        cache: a.kv_cache.buf.addr(),
        fp8_scale: base(&a.fp8_scale),
        counters,
    }
}

fn fused_insert_ptrs<S: DevAddr>(a: &FusedArgs<'_, S>, counters: u64) -> InsertPtrs {
    InsertPtrs {
        // Replaced by the compressor's latent in `fused_params`.
        latent: a.compress.latent_out.buf.addr(),
        positions: a.compress.positions.buf.addr(),
        slots: a.cache_slot_mapping.buf.addr(),
        cos_sin: a.cos_sin_cache.buf.addr(),
        cache: a.kv_cache.buf.addr(),
        fp8_scale: base(&a.fp8_scale),
        counters,
    }
}

/// One buffer a launch touches: argument name, buffer, and the alignment its
/// device address needs (the plan checks the view offset's alignment).
type Use<'b, S> = (&'static str, Option<&'b S>, u64);

fn ix<'b, S>(arg: &'static str, t: &'b Tensor<'_, S>) -> Use<'b, S> {
    (arg, Some(t.buf), t.desc.dtype.size() as u64)
}

fn ix_opt<'b, S>(arg: &'static str, t: Option<&'b Tensor<'_, S>>) -> Use<'b, S> {
    (
        arg,
        t.map(|t| t.buf),
        t.map_or(1, |t| t.desc.dtype.size() as u64),
    )
}

fn compress_uses<'b, S>(a: &'b CompressArgs<'_, S>, p: &CompressPlan) -> [Use<'b, S>; 10] {
    let cr2 = p.ring.is_some();
    let prev = p.prev_rows.is_some();
    [
        ("kv_score", Some(a.kv_score.buf), 16),
        ix("positions", &a.positions),
        ix("slot_mapping", &a.slot_mapping),
        ("rms_norm_weight", Some(a.rms_norm_weight.buf), 16),
        ("latent_out", Some(&*a.latent_out.buf), 16),
        (
            "state_cache",
            a.state_cache.as_ref().filter(|_| cr2).map(|t| &*t.buf),
            16,
        ),
        ix_opt(
            "query_start_loc",
            a.query_start_loc.as_ref().filter(|_| cr2),
        ),
        ix_opt(
            "token_to_req_indices",
            a.token_to_req_indices.as_ref().filter(|_| cr2),
        ),
        (
            "prev_rows",
            a.prev_rows.as_ref().filter(|_| prev).map(|t| t.buf),
            16,
        ),
        ix_opt(
            "prev_row_indices",
            a.prev_row_indices.as_ref().filter(|_| prev),
        ),
    ]
}

fn insert_uses<'b, S>(a: &'b InsertArgs<'_, S>) -> [Use<'b, S>; 6] {
    [
        ("latent", Some(a.latent.buf), 16),
        ix("positions", &a.positions),
        ix("slot_mapping", &a.slot_mapping),
        ix("cos_sin_cache", &a.cos_sin_cache),
        ("kv_cache", Some(&*a.kv_cache.buf), 16),
        ix_opt("fp8_scale", a.fp8_scale.as_ref()),
    ]
}

fn ring_uses<'b, S>(a: &'b RingArgs<'_, S>) -> [Use<'b, S>; 3] {
    [
        ("rows", Some(a.rows.buf), 16),
        ix("slot_mapping", &a.slot_mapping),
        ("state_cache", Some(&*a.state_cache.buf), 16),
    ]
}

fn fused_extra_uses<'b, S>(a: &'b FusedArgs<'_, S>) -> [Use<'b, S>; 4] {
    [
        ix("cos_sin_cache", &a.cos_sin_cache),
        ("kv_cache", Some(&*a.kv_cache.buf), 16),
        ix("cache_slot_mapping", &a.cache_slot_mapping),
        ix_opt("fp8_scale", a.fp8_scale.as_ref()),
    ]
}

// ---- module ----------------------------------------------------------------

/// The loaded fatbin and its kernels.
struct Module {
    raw: sys::CUmodule,
    functions: Vec<sys::CUfunction>,
    ctx: Arc<CudaContext>,
}

// SAFETY: module and function handles are plain driver handles, usable from
// any thread once the context is current; they are only read after loading.
unsafe impl Send for Module {}
// SAFETY: as above.
unsafe impl Sync for Module {}

impl Drop for Module {
    fn drop(&mut self) {
        self.ctx.record_err(self.ctx.bind_to_thread());
        // SAFETY: loaded once in `CudaBackend::new`, unloaded once here; the
        // backend holding the functions is being dropped.
        self.ctx.record_err(unsafe { cu::module::unload(self.raw) });
    }
}

// ---- the backend -----------------------------------------------------------

/// The CUDA backend on one device.
pub struct CudaBackend {
    /// The 3 skip counters (slot, position, index), zeroed; kept for its
    /// allocation (launches use `counters_ptr`).
    _counters: CudaSlice<u32>,
    counters_ptr: u64,
    module: Module,
    stream: Arc<CudaStream>,
    ctx: Arc<CudaContext>,
    ordinal: usize,
    device_name: String,
    cc: (i32, i32),
    sanitize: bool,
    elapsed: Option<ElapsedFn>,
}

impl std::fmt::Debug for CudaBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaBackend")
            .field("ordinal", &self.ordinal)
            .field("device", &self.device_name)
            .field("compute_capability", &self.cc)
            .field("sanitize", &self.sanitize)
            .finish()
    }
}

impl CudaBackend {
    /// The backend on device `ordinal`: the device's primary context, a new
    /// (non-blocking) stream, the embedded fatbin loaded as a module with all
    /// of [`Kernel::ALL`] looked up, and the zeroed skip counters.
    ///
    /// Returns [`Error::Unavailable`] (never panics) without a driver, without
    /// that device, or without kernels for it.
    pub fn new(ordinal: usize) -> Result<Self> {
        let drv_info = driver()?;
        match catch_unwind(AssertUnwindSafe(|| Self::create(ordinal, drv_info))) {
            Ok(r) => r,
            Err(p) => Err(unavailable(format!(
                "the CUDA driver call panicked: {}",
                panic_text(&*p)
            ))),
        }
    }

    fn create(ordinal: usize, drv_info: &Driver) -> Result<Self> {
        if !init_driver()? {
            return Err(unavailable(
                "the CUDA driver found no device (cuInit: CUDA_ERROR_NO_DEVICE)",
            ));
        }
        let count = cu::device::get_count().map_err(drv("cuDeviceGetCount"))?;
        if ordinal >= count.max(0) as usize {
            return Err(unavailable(format!(
                "no CUDA device {ordinal}: the driver reports {count} device(s)"
            )));
        }
        let Some(fatbin) = kernels::cuda_fatbin() else {
            return Err(unavailable(no_kernels_reason()));
        };
        let ctx = CudaContext::new(ordinal).map_err(drv("cuDevicePrimaryCtxRetain"))?;
        // Every buffer of this backend is used on its one stream (the raw
        // entry points on the caller's, which the caller orders), so cudarc's
        // cross-stream event tracking is not needed; without it no event is
        // recorded behind a launch, which keeps launches capturable.
        // SAFETY: set before this context object allocates anything.
        unsafe { ctx.disable_event_tracking() };
        let device_name = ctx.name().map_err(drv("cuDeviceGetName"))?;
        let cc = ctx
            .compute_capability()
            .map_err(drv("cuDeviceGetAttribute"))?;
        let stream = ctx.new_stream().map_err(drv("cuStreamCreate"))?;

        ctx.bind_to_thread().map_err(drv("cuCtxSetCurrent"))?;
        // SAFETY: the fatbin is a complete image embedded for the life of the
        // process.
        let raw = match unsafe { cu::module::load_data(fatbin.as_ptr() as *const c_void) } {
            Ok(m) => m,
            Err(DriverError(sys::CUresult::CUDA_ERROR_NO_BINARY_FOR_GPU)) => {
                return Err(unavailable(format!(
                    "this build's CUDA fatbin has code for {} only, not for {device_name} (sm_{}{}); rebuild with \
                     DSV4_KVCACHE_CUDA_ARCHS=sm_{}{}",
                    kernels::cuda_targets().join(", "),
                    cc.0,
                    cc.1,
                    cc.0,
                    cc.1
                )))
            }
            Err(e) => return Err(drv("cuModuleLoadData")(e)),
        };
        let mut module = Module {
            raw,
            functions: Vec::with_capacity(Kernel::ALL.len()),
            ctx: ctx.clone(),
        };
        for k in Kernel::ALL {
            let name = k.name();
            let c = CString::new(name).expect("kernel names have no NUL");
            // SAFETY: `raw` is the module just loaded.
            let f = unsafe { cu::module::get_function(raw, c) }.map_err(|e| Error::Driver {
                backend: BACKEND,
                call: "cuModuleGetFunction",
                message: format!(
                    "kernel {name} is not in the embedded fatbin ({}); rebuild with the current kernels-hip sources",
                    describe(e)
                ),
            })?;
            module.functions.push(f);
        }
        let counters = stream
            .alloc_zeros::<u32>(NUM_COUNTERS)
            .map_err(drv("cuMemAlloc"))?;
        let counters_ptr = counters.device_ptr(&stream).0;
        stream.synchronize().map_err(drv("cuStreamSynchronize"))?;
        Ok(CudaBackend {
            _counters: counters,
            counters_ptr,
            module,
            stream,
            ctx,
            ordinal,
            device_name,
            cc,
            sanitize: false,
            elapsed: drv_info.elapsed,
        })
    }

    /// Number of CUDA devices: `Ok(0)` when the driver finds none,
    /// [`Error::Unavailable`] when there is no driver.
    pub fn device_count() -> Result<usize> {
        driver()?;
        catch_unwind(|| {
            if !init_driver()? {
                return Ok(0);
            }
            let n = cu::device::get_count().map_err(drv("cuDeviceGetCount"))?;
            Ok(n.max(0) as usize)
        })
        .unwrap_or_else(|p| {
            Err(unavailable(format!(
                "the CUDA driver call panicked: {}",
                panic_text(&*p)
            )))
        })
    }

    /// The device ordinal.
    pub fn ordinal(&self) -> usize {
        self.ordinal
    }

    /// The device's name, e.g. `NVIDIA H200`.
    pub fn device_name(&self) -> &str {
        &self.device_name
    }

    /// The device's compute capability (major, minor), e.g. `(9, 0)`.
    pub fn compute_capability(&self) -> (i32, i32) {
        self.cc
    }

    /// The backend's stream: every safe launch, copy and graph replay runs on
    /// it. Capture it (or use [`CudaBackend::capture`]) to put launches in a
    /// CUDA graph.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// The backend's context (the device's primary context).
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// Device address of the backend's 3 `u32` skip counters (slot,
    /// position, index).
    pub fn counters_ptr(&self) -> u64 {
        self.counters_ptr
    }

    /// A zeroed buffer of `len` bytes (waits for the memset).
    pub fn alloc_zeroed(&self, len: usize) -> Result<CudaBuffer> {
        let b = self.alloc(len)?;
        // SAFETY: `b` holds at least `len` bytes.
        unsafe { cu::memset_d8_async(b.ptr, 0, len, self.stream.cu_stream()) }
            .map_err(drv("cuMemsetD8Async"))?;
        self.stream
            .synchronize()
            .map_err(drv("cuStreamSynchronize"))?;
        Ok(b)
    }

    /// Copies `len` bytes from `src` to `dst` on the stream (device to device;
    /// no wait). Capturable.
    pub fn copy(&self, src: &CudaBuffer, dst: &mut CudaBuffer, len: usize) -> Result<()> {
        self.own("src", src)?;
        self.own("dst", dst)?;
        for (arg, b) in [("src", src.len), ("dst", dst.len)] {
            if len > b {
                return Err(Error::OutOfBounds {
                    arg,
                    needed: len as u64,
                    available: b as u64,
                });
            }
        }
        if len == 0 {
            return Ok(());
        }
        self.bind()?;
        // SAFETY: both buffers hold `len` bytes and live on this stream.
        unsafe { cu::memcpy_dtod_async(dst.ptr, src.ptr, len, self.stream.cu_stream()) }
            .map_err(drv("cuMemcpyDtoDAsync"))
    }

    fn alloc(&self, len: usize) -> Result<CudaBuffer> {
        // A zero-byte allocation is not a valid driver request: allocate one.
        // SAFETY: the bytes are uninitialized until written; callers write
        // them (or the buffer is read back as whatever the device holds).
        let slice = unsafe { self.stream.alloc::<u8>(len.max(1)) }.map_err(drv("cuMemAlloc"))?;
        let ptr = slice.device_ptr(&self.stream).0;
        Ok(CudaBuffer { slice, ptr, len })
    }

    /// Makes the context current on this thread (a thread-local lookup, no
    /// stream work, so it is allowed during capture).
    fn bind(&self) -> Result<()> {
        let want = self.ctx.cu_ctx();
        if cu::ctx::get_current().map_err(drv("cuCtxGetCurrent"))? != Some(want) {
            // SAFETY: the context is alive (held by `self.ctx`).
            unsafe { cu::ctx::set_current(want) }.map_err(drv("cuCtxSetCurrent"))?;
        }
        Ok(())
    }

    /// Checks that `b` was made by this backend (so it is ordered on its stream).
    fn own(&self, arg: &'static str, b: &CudaBuffer) -> Result<()> {
        if Arc::ptr_eq(b.slice.stream(), &self.stream) {
            Ok(())
        } else {
            Err(Error::Value {
                arg,
                problem: format!(
                    "buffer was made by another CUDA backend (device {}); use buffers with the backend that \
                     created them",
                    b.slice.ordinal()
                ),
            })
        }
    }

    fn own_all(&self, uses: &[Use<'_, CudaBuffer>]) -> Result<()> {
        for &(arg, b, _) in uses {
            if let Some(b) = b {
                self.own(arg, b)?;
            }
        }
        Ok(())
    }

    fn function(&self, kernel: Kernel) -> sys::CUfunction {
        // Every kernel was looked up when the module was loaded.
        self.module.functions[kernel.index()]
    }

    /// Launches `l` (kernel and shape) with `params` by value.
    ///
    /// # Safety
    /// `params` must be the parameter block `kernel` expects, and every
    /// address in it must be valid device memory of this context for the
    /// extents the plan it came from describes, until the kernel has run.
    unsafe fn launch<P: KernelParams>(
        &self,
        l: Launch,
        params: &P,
        stream: sys::CUstream,
    ) -> Result<()> {
        let f = self.function(l.kernel);
        self.bind()?;
        let g = l.geometry;
        let block = params.with_geometry(&g);
        let mut args = [&block as *const P as *mut c_void];
        cu::launch_kernel(
            f,
            (g.grid, 1, 1),
            (g.block_threads, 1, 1),
            g.shared_bytes,
            stream,
            &mut args,
        )
        .map_err(drv("cuLaunchKernel"))
    }

    fn compress_on<S: DevAddr>(
        &self,
        a: &CompressArgs<'_, S>,
        p: &CompressPlan,
        counters: u64,
        stream: sys::CUstream,
    ) -> Result<()> {
        if p.n == 0 {
            return Ok(());
        }
        let params = kernel_abi::compress_params(p, &compress_ptrs(a, counters));
        // SAFETY: the plan validated every view against its buffer's length;
        // the buffers are the caller's (raw) or this backend's.
        unsafe { self.launch(kernel_abi::compress_launch(p), &params, stream) }
    }

    fn insert_on<S: DevAddr>(
        &self,
        a: &InsertArgs<'_, S>,
        p: &InsertPlan,
        counters: u64,
        stream: sys::CUstream,
    ) -> Result<()> {
        if p.n == 0 {
            return Ok(());
        }
        let params = kernel_abi::insert_params(p, &insert_ptrs(a, counters), self.sanitize);
        // SAFETY: as in `compress_on`.
        unsafe { self.launch(kernel_abi::insert_launch(p), &params, stream) }
    }

    fn ring_on<S: DevAddr>(
        &self,
        a: &RingArgs<'_, S>,
        p: &RingRowsPlan,
        counters: u64,
        stream: sys::CUstream,
    ) -> Result<()> {
        if p.n == 0 {
            return Ok(());
        }
        let params = kernel_abi::ring_rows_params(
            p,
            a.rows.buf.addr(),
            a.slot_mapping.buf.addr(),
            a.state_cache.buf.addr(),
            counters,
        );
        // SAFETY: as in `compress_on`.
        unsafe { self.launch(kernel_abi::ring_rows_launch(p), &params, stream) }
    }

    fn fused_on<S: DevAddr>(
        &self,
        a: &FusedArgs<'_, S>,
        p: &FusedPlan,
        counters: u64,
        stream: sys::CUstream,
    ) -> Result<()> {
        if p.compress.n == 0 {
            return Ok(());
        }
        let params = kernel_abi::fused_params(
            p,
            &compress_ptrs(&a.compress, counters),
            &fused_insert_ptrs(a, counters),
            self.sanitize,
        );
        // SAFETY: as in `compress_on`.
        unsafe { self.launch(kernel_abi::fused_launch(p), &params, stream) }
    }

    // ---- the raw API -------------------------------------------------------

    /// `rope_quant_insert` over caller-owned device memory on the caller's
    /// stream. Skipped tokens are counted at `raw_counters` (3 `u32`: slot,
    /// position, index) or, when `None`, in this backend's counters.
    ///
    /// Arguments are validated exactly as in the safe API (dtypes, shapes,
    /// strides, offsets and, against each [`RawDevice::len`], extents), and
    /// each address must be non-null and aligned to what its view's offset
    /// must be aligned to (16 bytes for rows and caches, the element size for
    /// index tensors and the cos/sin table, 4 for the FP8 scale). Nothing is
    /// allocated, copied or waited for, so the call can be captured.
    ///
    /// # Safety
    /// * every `ptr` is a device address in this backend's context (the
    ///   device's primary context) of an allocation at least `len` bytes long
    ///   (or long enough for its view, when `len` is `usize::MAX`), that stays
    ///   allocated until the kernel has finished (or, when captured, for as
    ///   long as the graph may be replayed);
    /// * `stream` is a valid stream of that context (or null, the legacy
    ///   default stream), and the caller orders the kernel against other work
    ///   touching the same memory: the launch is ordered on `stream` only;
    /// * written tensors (`kv_cache`) do not overlap any tensor the kernel reads;
    /// * `raw_counters`, when given, points to 3 writable `u32` of that
    ///   context; when `None`, the caller synchronizes `stream` before
    ///   [`Backend::take_skip_counts`] (which waits for the backend's stream
    ///   only) and does not launch concurrently with it.
    pub unsafe fn rope_quant_insert_raw(
        &self,
        args: &InsertArgs<'_, RawDevice>,
        stream: sys::CUstream,
        raw_counters: Option<u64>,
    ) -> Result<()> {
        let p = plan_insert(args)?;
        super::raw::check_insert(args)?;
        self.insert_on(args, &p, self.raw_counters(raw_counters)?, stream)
    }

    /// `fused_save_compress_norm` over caller-owned device memory on the
    /// caller's stream; see [`CudaBackend::rope_quant_insert_raw`].
    ///
    /// # Safety
    /// As for [`CudaBackend::rope_quant_insert_raw`]; the written tensors are
    /// `latent_out` and (CR2) `state_cache`.
    pub unsafe fn fused_save_compress_norm_raw(
        &self,
        args: &CompressArgs<'_, RawDevice>,
        stream: sys::CUstream,
        raw_counters: Option<u64>,
    ) -> Result<()> {
        let p = plan_compress(args)?;
        super::raw::check_compress(args)?;
        self.compress_on(args, &p, self.raw_counters(raw_counters)?, stream)
    }

    /// `save_ring_rows` over caller-owned device memory on the caller's
    /// stream; see [`CudaBackend::rope_quant_insert_raw`].
    ///
    /// # Safety
    /// As for [`CudaBackend::rope_quant_insert_raw`]; the written tensor is
    /// `state_cache`.
    pub unsafe fn save_ring_rows_raw(
        &self,
        args: &RingArgs<'_, RawDevice>,
        stream: sys::CUstream,
        raw_counters: Option<u64>,
    ) -> Result<()> {
        let p = plan_ring_rows(args)?;
        super::raw::check_ring(args)?;
        self.ring_on(args, &p, self.raw_counters(raw_counters)?, stream)
    }

    /// The fused compress + insert over caller-owned device memory on the
    /// caller's stream; see [`CudaBackend::rope_quant_insert_raw`].
    ///
    /// # Safety
    /// As for [`CudaBackend::rope_quant_insert_raw`]; the written tensors are
    /// `latent_out` (unless skipped), (CR2) `state_cache` and `kv_cache`.
    pub unsafe fn fused_compress_insert_raw(
        &self,
        args: &FusedArgs<'_, RawDevice>,
        stream: sys::CUstream,
        raw_counters: Option<u64>,
    ) -> Result<()> {
        let p = plan_fused(args)?;
        super::raw::check_fused(args)?;
        self.fused_on(args, &p, self.raw_counters(raw_counters)?, stream)
    }

    fn raw_counters(&self, c: Option<u64>) -> Result<u64> {
        match c {
            None => Ok(self.counters_ptr),
            Some(0) => Err(Error::Value {
                arg: "raw_counters",
                problem: "null device pointer".into(),
            }),
            Some(p) if p % 4 != 0 => Err(Error::Shape {
                arg: "raw_counters",
                problem: format!("device pointer {p:#x} must be a multiple of 4 bytes"),
            }),
            Some(p) => Ok(p),
        }
    }

    // ---- graphs and timing ---------------------------------------------------

    /// Captures `calls` calls of `f` (which launches on this backend's stream)
    /// into a CUDA graph, without running them. The capture is thread-local:
    /// anything `f` does that a capture forbids (an allocation, a copy from
    /// the host, a wait) fails.
    pub fn capture<F: FnMut() -> Result<()>>(
        &self,
        calls: usize,
        mut f: F,
    ) -> Result<CapturedGraph<'_>> {
        self.bind()?;
        self.stream
            .begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .map_err(drv("cuStreamBeginCapture"))?;
        // Ends the capture on every exit (error or panic in `f`), so the
        // stream is usable afterwards.
        struct Guard<'a>(Option<&'a Arc<CudaStream>>);
        impl Drop for Guard<'_> {
            fn drop(&mut self) {
                if let Some(s) = self.0.take() {
                    // Drops (destroys) the partial graph, if any.
                    let _ = s.end_capture(sys::CUgraphInstantiate_flags(0));
                }
            }
        }
        let mut guard = Guard(Some(&self.stream));
        for _ in 0..calls {
            f()?;
        }
        guard.0 = None;
        let graph = self
            .stream
            .end_capture(sys::CUgraphInstantiate_flags(0))
            .map_err(drv("cuStreamEndCapture"))?
            .ok_or_else(|| Error::Driver {
                backend: BACKEND,
                call: "cuStreamEndCapture",
                message: "the capture recorded no work".into(),
            })?;
        graph.upload().map_err(drv("cuGraphUpload"))?;
        Ok(CapturedGraph {
            graph,
            calls,
            _backend: std::marker::PhantomData,
        })
    }

    fn timing_event(&self) -> Result<cudarc::driver::CudaEvent> {
        self.ctx
            .new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(drv("cuEventCreate"))
    }

    /// Replays `graph` `replays` times back to back (after one warm-up
    /// replay), with an event between replays; the milliseconds of each.
    ///
    /// # Safety
    /// As for [`CapturedGraph::launch`].
    unsafe fn replay_ms(&self, graph: &CapturedGraph<'_>, replays: usize) -> Result<Vec<f32>> {
        let elapsed = self.elapsed.ok_or(Error::Driver {
            backend: BACKEND,
            call: "cuEventElapsedTime",
            message: "the driver library has neither cuEventElapsedTime_v2 nor cuEventElapsedTime"
                .into(),
        })?;
        let events = (0..=replays)
            .map(|_| self.timing_event())
            .collect::<Result<Vec<_>>>()?;
        graph.launch()?;
        for (i, e) in events.iter().enumerate() {
            e.record(&self.stream).map_err(drv("cuEventRecord"))?;
            if i < replays {
                graph.launch()?;
            }
        }
        self.stream
            .synchronize()
            .map_err(drv("cuStreamSynchronize"))?;
        events
            .windows(2)
            .map(|w| {
                let mut ms = 0.0f32;
                elapsed(&mut ms, w[0].cu_event(), w[1].cu_event())
                    .result()
                    .map_err(drv("cuEventElapsedTime"))?;
                Ok(ms)
            })
            .collect()
    }

    /// GPU time per launch: captures `launches_per_graph` calls of `f` into a
    /// CUDA graph on the backend's stream, replays it `replays` times (after
    /// one warm-up replay) and returns, for each replay, its event-measured
    /// time divided by `launches_per_graph`, in microseconds.
    ///
    /// The launches rewrite the same outputs on every replay (and CR2 rings
    /// see the previous replay's stores), which does not change their cost.
    pub fn time_graph<F: FnMut() -> Result<()>>(
        &self,
        launches_per_graph: usize,
        replays: usize,
        f: F,
    ) -> Result<Vec<f32>> {
        if launches_per_graph == 0 {
            return Err(Error::Value {
                arg: "launches_per_graph",
                problem: "must be at least 1".into(),
            });
        }
        // `f` (and whatever it owns or borrows) stays alive until the replays
        // have been waited for.
        let mut f = f;
        let graph = self.capture(launches_per_graph, &mut f)?;
        // SAFETY: the buffers the captured launches use are owned or borrowed
        // by `f`, which outlives the replays (waited for in `replay_ms`).
        let ms = unsafe { self.replay_ms(&graph, replays)? };
        Ok(ms
            .into_iter()
            .map(|m| m * 1000.0 / launches_per_graph as f32)
            .collect())
    }

    /// Device-to-device copy bandwidth, the roofline of the kernels: one
    /// `bytes`-byte copy captured in a graph, replayed `replays` times (after
    /// a warm-up) with events; returns the bytes read plus written per
    /// second (`2 * bytes / t`) at the median replay time `t`.
    pub fn time_copy(&self, bytes: usize, replays: usize) -> Result<f64> {
        if bytes == 0 || replays == 0 {
            return Err(Error::Value {
                arg: if bytes == 0 { "bytes" } else { "replays" },
                problem: "must be at least 1".into(),
            });
        }
        let src = self.alloc_zeroed(bytes)?;
        let mut dst = self.alloc_zeroed(bytes)?;
        let graph = self.capture(1, || self.copy(&src, &mut dst, bytes))?;
        // SAFETY: `src` and `dst` outlive the replays, which are waited for.
        let mut ms = unsafe { self.replay_ms(&graph, replays)? };
        ms.sort_by(|a, b| a.total_cmp(b));
        let t = f64::from(ms[ms.len() / 2]) / 1000.0;
        Ok(2.0 * bytes as f64 / t.max(1e-9))
    }

    /// Host cost of launching: calls `f` (eager launches on this backend)
    /// `calls` times after one warm-up call, and returns the mean host time
    /// per call in microseconds, not counting the final wait for the device.
    /// (GPU time is [`CudaBackend::time_graph`]'s.)
    pub fn host_launch_cost<F: FnMut() -> Result<()>>(
        &self,
        calls: usize,
        mut f: F,
    ) -> Result<f64> {
        if calls == 0 {
            return Err(Error::Value {
                arg: "calls",
                problem: "must be at least 1".into(),
            });
        }
        f()?;
        self.synchronize()?;
        let t0 = Instant::now();
        for _ in 0..calls {
            f()?;
        }
        let us = t0.elapsed().as_secs_f64() * 1e6 / calls as f64;
        self.synchronize()?;
        Ok(us)
    }
}

/// A CUDA graph of launches captured on a [`CudaBackend`]'s stream.
pub struct CapturedGraph<'b> {
    graph: CudaGraph,
    calls: usize,
    /// The graph's kernels live in the backend's module.
    _backend: std::marker::PhantomData<&'b CudaBackend>,
}

impl CapturedGraph<'_> {
    /// How many calls of the capture closure it holds.
    pub fn calls(&self) -> usize {
        self.calls
    }

    /// Replays the graph on the backend's stream (no wait). It reads and
    /// writes the buffers' current contents.
    ///
    /// # Safety
    /// Every buffer (and raw device pointer) the captured launches used must
    /// still be allocated: a graph holds device addresses, not borrows.
    pub unsafe fn launch(&self) -> Result<()> {
        self.graph.launch().map_err(drv("cuGraphLaunch"))
    }
}

// The backend and its buffers can be shared across threads (the driver
// serializes work on the one stream).
const _: () = {
    const fn send_sync<T: Send + Sync>() {}
    send_sync::<CudaBackend>();
    send_sync::<CudaBuffer>();
};

impl Backend for CudaBackend {
    type Buffer = CudaBuffer;

    fn name(&self) -> String {
        format!(
            "cuda:{} ({}, sm_{}{})",
            self.ordinal, self.device_name, self.cc.0, self.cc.1
        )
    }

    fn sanitize(&self) -> bool {
        self.sanitize
    }

    fn set_sanitize(&mut self, on: bool) {
        self.sanitize = on;
    }

    fn upload(&self, bytes: &[u8]) -> Result<CudaBuffer> {
        let mut b = self.alloc(bytes.len())?;
        self.write(&mut b, bytes)?;
        Ok(b)
    }

    fn write(&self, buf: &mut CudaBuffer, bytes: &[u8]) -> Result<()> {
        self.own("write", buf)?;
        if bytes.len() > buf.len {
            return Err(Error::OutOfBounds {
                arg: "write",
                needed: bytes.len() as u64,
                available: buf.len as u64,
            });
        }
        if bytes.is_empty() {
            return Ok(());
        }
        self.bind()?;
        // SAFETY: `buf` holds at least `bytes.len()` bytes; from pageable
        // host memory the driver has staged the bytes when the call returns.
        unsafe { cu::memcpy_htod_async(buf.ptr, bytes, self.stream.cu_stream()) }
            .map_err(drv("cuMemcpyHtoDAsync"))?;
        self.stream
            .synchronize()
            .map_err(drv("cuStreamSynchronize"))
    }

    fn read(&self, buf: &CudaBuffer) -> Result<Vec<u8>> {
        self.own("read", buf)?;
        let mut out = vec![0u8; buf.len];
        self.bind()?;
        if !out.is_empty() {
            // SAFETY: `buf` holds `out.len()` bytes; the stream is waited for
            // before `out` is used.
            unsafe { cu::memcpy_dtoh_async(&mut out, buf.ptr, self.stream.cu_stream()) }
                .map_err(drv("cuMemcpyDtoHAsync"))?;
        }
        self.synchronize()?;
        Ok(out)
    }

    fn fused_save_compress_norm(&self, a: CompressArgs<'_, CudaBuffer>) -> Result<()> {
        let p = plan_compress(&a)?;
        self.own_all(&compress_uses(&a, &p))?;
        self.compress_on(&a, &p, self.counters_ptr, self.stream.cu_stream())
    }

    fn rope_quant_insert(&self, a: InsertArgs<'_, CudaBuffer>) -> Result<()> {
        let p = plan_insert(&a)?;
        self.own_all(&insert_uses(&a))?;
        self.insert_on(&a, &p, self.counters_ptr, self.stream.cu_stream())
    }

    fn save_ring_rows(&self, a: RingArgs<'_, CudaBuffer>) -> Result<()> {
        let p = plan_ring_rows(&a)?;
        self.own_all(&ring_uses(&a))?;
        self.ring_on(&a, &p, self.counters_ptr, self.stream.cu_stream())
    }

    fn fused_compress_insert(&self, a: FusedArgs<'_, CudaBuffer>) -> Result<()> {
        let p = plan_fused(&a)?;
        self.own_all(&compress_uses(&a.compress, &p.compress))?;
        self.own_all(&fused_extra_uses(&a))?;
        self.fused_on(&a, &p, self.counters_ptr, self.stream.cu_stream())
    }

    fn take_skip_counts(&self) -> Result<SkipCounts> {
        self.synchronize()?;
        let mut c = [0u32; NUM_COUNTERS];
        let s = self.stream.cu_stream();
        // SAFETY: the counters hold NUM_COUNTERS u32; the stream is waited for
        // before `c` is read.
        unsafe { cu::memcpy_dtoh_async(&mut c, self.counters_ptr, s) }
            .map_err(drv("cuMemcpyDtoHAsync"))?;
        self.stream
            .synchronize()
            .map_err(drv("cuStreamSynchronize"))?;
        // SAFETY: as above; ordered before any later launch on the stream.
        unsafe { cu::memset_d8_async(self.counters_ptr, 0, 4 * NUM_COUNTERS, s) }
            .map_err(drv("cuMemsetD8Async"))?;
        Ok(SkipCounts {
            slot_out_of_range: u64::from(c[0]),
            position_out_of_range: u64::from(c[1]),
            index_out_of_range: u64::from(c[2]),
        })
    }

    fn synchronize(&self) -> Result<()> {
        self.stream
            .synchronize()
            .map_err(drv("cuStreamSynchronize"))?;
        // Errors cudarc deferred from drops (frees) surface here.
        self.ctx.check_err().map_err(drv("a deferred driver call"))
    }
}
