//! The CUDA driver under [`GpuBackend`]: the embedded fatbin's kernels,
//! launched through the CUDA driver API ([`cudarc`]'s `driver` safe and
//! result layers), with the driver library (`libcuda`) loaded at run time.
//! [`CudaBackend`] is the GPU backend over it.
//!
//! # Availability
//!
//! The binary starts without a driver. [`CudaBackend::new`] and
//! [`CudaBackend::device_count`] return [`Error::Unavailable`] when
//!
//! * no `libcuda` can be loaded: cudarc's own loader panics in that case, so
//!   the library is probed first with `cudarc::driver::sys::is_culib_present`
//!   (which only tries to open the candidate names), and every driver symbol
//!   this driver calls is then looked up once (a driver older than the CUDA
//!   13.0 bindings may lack one, which cudarc would also turn into a panic on
//!   first call); as a last guard, construction runs under
//!   [`std::panic::catch_unwind`];
//! * `cuInit` fails (no device, the toolkit's stub library, a driver too old),
//!   or the ordinal is not that of a device;
//! * this build has no fatbin (nvcc was not found at build time:
//!   [`crate::kernels::missing_reasons`] says why; run
//!   `scripts/install-toolchains.sh` and rebuild), or it has neither SASS
//!   for the device's architecture nor PTX it can JIT-compile
//!   ([`crate::targets::cuda_image_for`], decided before the fatbin is
//!   loaded), or the driver is too old for that PTX.
//!
//! Launches, buffers, graphs and timing are [`GpuBackend`]'s; the CR2 team
//! kernels get their dynamic shared memory through `cuLaunchKernel`.

use super::gpu::driver::Params;
use super::gpu::{DeviceFacts, Driver, GpuBackend};
use super::raw::RawStream;
use crate::detect::{sanitize_for_cuda, SanitizePolicy};
use crate::error::{Error, Result};
use crate::kernel_abi::{Geometry, Kernel};
use crate::kernels;
use cudarc::driver::{
    result as cu, sys, CudaContext, CudaEvent, CudaGraph, CudaSlice, CudaStream, DevicePtr,
    DriverError,
};
use std::ffi::{c_void, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, OnceLock};

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
    "cuMemGetInfo_v2",
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
struct Probe {
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
    move |e| Error::driver(BACKEND, call, describe(e))
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
fn probe() -> Result<&'static Probe> {
    static PROBE: OnceLock<std::result::Result<Probe, String>> = OnceLock::new();
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
            Ok(Probe { elapsed })
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

/// The CUDA backend on one device.
pub type CudaBackend = GpuBackend<CudaDriver>;

/// Device memory owned by a [`CudaBackend`].
pub type CudaBuffer = super::gpu::DeviceBuffer<CudaDriver>;

pub use super::raw::RawDevice;

/// The loaded fatbin.
struct Module {
    raw: sys::CUmodule,
    ctx: Arc<CudaContext>,
}

// SAFETY: a module handle is a plain driver handle, usable from any thread
// once the context is current; it is only read after loading.
unsafe impl Send for Module {}
// SAFETY: as above.
unsafe impl Sync for Module {}

impl Drop for Module {
    fn drop(&mut self) {
        self.ctx.record_err(self.ctx.bind_to_thread());
        // SAFETY: loaded once in `CudaDriver::open`, unloaded once here; the
        // backend holding its functions is being dropped.
        self.ctx.record_err(unsafe { cu::module::unload(self.raw) });
    }
}

/// A kernel of the loaded fatbin.
#[derive(Debug, Clone, Copy)]
pub struct CudaFunction(sys::CUfunction);

// SAFETY: a function handle is a plain driver handle, valid on any thread
// while its module is loaded.
unsafe impl Send for CudaFunction {}
// SAFETY: as above.
unsafe impl Sync for CudaFunction {}

/// The CUDA driver on one device: its primary context, a non-blocking stream
/// and the embedded fatbin loaded as a module.
pub struct CudaDriver {
    module: Module,
    stream: Arc<CudaStream>,
    ctx: Arc<CudaContext>,
    facts: DeviceFacts,
    cc: (i32, i32),
    elapsed: Option<ElapsedFn>,
}

impl CudaDriver {
    /// Opens device `ordinal`. Returns [`Error::Unavailable`] (never panics)
    /// without a driver, without that device, or without kernels for it.
    pub fn open(ordinal: usize) -> Result<Self> {
        let probe = probe()?;
        guarded(|| Self::create(ordinal, probe))
    }

    /// Whether a CUDA driver library can be loaded on this machine (it may
    /// still have no device).
    pub fn library_present() -> bool {
        probe().is_ok()
    }

    fn create(ordinal: usize, probe: &Probe) -> Result<Self> {
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
        // Every buffer of the backend is used on its one stream (the raw
        // entry points on the caller's, which the caller orders), so cudarc's
        // cross-stream event tracking is not needed; without it no event is
        // recorded behind a launch, which keeps launches capturable.
        // SAFETY: set before this context object allocates anything.
        unsafe { ctx.disable_event_tracking() };
        let device_name = ctx.name().map_err(drv("cuDeviceGetName"))?;
        let cc = ctx
            .compute_capability()
            .map_err(drv("cuDeviceGetAttribute"))?;
        // Which embedded image the driver will pick, decided here so that a
        // device with none gets one sentence naming its architecture and the
        // images, before anything is loaded or launched.
        let image = crate::targets::cuda_image_for(
            (cc.0.max(0) as u32, cc.1.max(0) as u32),
            kernels::cuda_targets(),
            kernels::cuda_ptx(),
        )
        .map_err(|why| unavailable(format!("{device_name}: {why}")))?;
        let forced_jit = std::env::var("CUDA_FORCE_PTX_JIT").is_ok_and(|v| v.trim() == "1");
        let image_text = match image {
            crate::targets::CudaImage::Sass(_) if forced_jit => match kernels::cuda_ptx().first() {
                Some(p) => format!("{p} PTX, JIT-compiled by the driver (CUDA_FORCE_PTX_JIT=1)"),
                None => format!("{image}"),
            },
            _ => image.to_string(),
        };
        let warp_size = ctx
            .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_WARP_SIZE)
            .map_err(drv("cuDeviceGetAttribute"))?;
        let multiprocessors = ctx
            .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .ok()
            .and_then(|n| u32::try_from(n).ok())
            .filter(|&n| n > 0);
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
            Err(DriverError(sys::CUresult::CUDA_ERROR_UNSUPPORTED_PTX_VERSION)) => {
                let ptx = kernels::cuda_ptx().first().copied().unwrap_or("PTX");
                let need = crate::targets::cuda_min_driver(kernels::cuda_toolkit().unwrap_or_default(), ptx)
                    .map_or_else(|| "a newer driver".to_string(), |d| format!("driver >= {d}"));
                return Err(unavailable(format!(
                    "{device_name} (sm_{}{}) has no SASS in this build and runs its {ptx} PTX, which this NVIDIA \
                     driver is too old to JIT-compile (CUDA_ERROR_UNSUPPORTED_PTX_VERSION: the PTX is from CUDA \
                     {}; it needs {need}). Update the driver, or rebuild with DSV4_KVCACHE_CUDA_ARCHS=sm_{}{}",
                    cc.0,
                    cc.1,
                    kernels::cuda_toolkit().unwrap_or("?"),
                    cc.0,
                    cc.1
                )));
            }
            Err(e) => return Err(drv("cuModuleLoadData")(e)),
        };
        Ok(CudaDriver {
            module: Module {
                raw,
                ctx: ctx.clone(),
            },
            facts: DeviceFacts {
                ordinal,
                name: device_name,
                arch: format!("sm_{}{}", cc.0, cc.1),
                warp_size: warp_size.max(0) as u32,
                total_memory: ctx.total_mem().ok(),
                multiprocessors,
                kernels: image_text,
            },
            stream,
            ctx,
            cc,
            elapsed: probe.elapsed,
        })
    }

    /// The driver's stream (cudarc's handle).
    pub fn cuda_stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// The driver's context (the device's primary context).
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
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
}

/// Runs `f`, turning a panic inside cudarc into [`Error::Unavailable`].
fn guarded<T>(f: impl FnOnce() -> Result<T>) -> Result<T> {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|p| {
        Err(unavailable(format!(
            "the CUDA driver call panicked: {}",
            panic_text(&*p)
        )))
    })
}

fn cu_stream(s: RawStream) -> sys::CUstream {
    s.0 as sys::CUstream
}

// SAFETY: launches go through `cuLaunchKernel` with the caller's parameter
// block; allocations are cudarc slices, valid while they live.
unsafe impl Driver for CudaDriver {
    const BACKEND: &'static str = BACKEND;
    type Function = CudaFunction;
    type Memory = CudaSlice<u8>;
    type Event = CudaEvent;
    type Graph = CudaGraph;
    type Stream = Arc<CudaStream>;

    fn facts(&self) -> &DeviceFacts {
        &self.facts
    }

    fn sanitize_for(&self, policy: SanitizePolicy) -> bool {
        sanitize_for_cuda(policy)
    }

    fn stream(&self) -> RawStream {
        RawStream(self.stream.cu_stream() as usize)
    }

    fn function(&self, kernel: Kernel) -> Result<CudaFunction> {
        let name = kernel.name();
        let c = CString::new(name).expect("kernel names have no NUL");
        self.bind()?;
        // SAFETY: the module is loaded.
        unsafe { cu::module::get_function(self.module.raw, c) }
            .map(CudaFunction)
            .map_err(|e| {
                Error::driver(
                    BACKEND,
                    "cuModuleGetFunction",
                    format!(
                        "kernel {name} is not in the embedded fatbin ({}); rebuild with the current kernels-hip sources",
                        describe(e)
                    ),
                )
            })
    }

    fn alloc(&self, len: usize, stream: Option<&Arc<CudaStream>>) -> Result<(CudaSlice<u8>, u64)> {
        let stream = stream.unwrap_or(&self.stream);
        // A zero-byte allocation is not a valid driver request: allocate one.
        // SAFETY: the bytes are uninitialized until written; callers write
        // them (or the buffer is read back as whatever the device holds).
        let slice = unsafe { stream.alloc::<u8>(len.max(1)) }.map_err(drv("cuMemAlloc"))?;
        let ptr = slice.device_ptr(stream).0;
        Ok((slice, ptr))
    }

    fn create_stream(&self) -> Result<(Arc<CudaStream>, RawStream)> {
        let s = self.ctx.new_stream().map_err(drv("cuStreamCreate"))?;
        let raw = RawStream(s.cu_stream() as usize);
        Ok((s, raw))
    }

    unsafe fn memset(&self, dst: u64, value: u8, len: usize, stream: RawStream) -> Result<()> {
        self.bind()?;
        cu::memset_d8_async(dst, value, len, cu_stream(stream)).map_err(drv("cuMemsetD8Async"))
    }

    unsafe fn copy_to_device(&self, dst: u64, src: &[u8], stream: RawStream) -> Result<()> {
        self.bind()?;
        cu::memcpy_htod_async(dst, src, cu_stream(stream)).map_err(drv("cuMemcpyHtoDAsync"))
    }

    unsafe fn copy_to_host(&self, dst: &mut [u8], src: u64, stream: RawStream) -> Result<()> {
        self.bind()?;
        cu::memcpy_dtoh_async(dst, src, cu_stream(stream)).map_err(drv("cuMemcpyDtoHAsync"))
    }

    unsafe fn copy_on_device(&self, dst: u64, src: u64, n: usize, stream: RawStream) -> Result<()> {
        self.bind()?;
        cu::memcpy_dtod_async(dst, src, n, cu_stream(stream)).map_err(drv("cuMemcpyDtoDAsync"))
    }

    fn memory_info(&self) -> Option<(usize, usize)> {
        self.bind().ok()?;
        cu::mem_get_info().ok()
    }

    fn synchronize(&self, stream: RawStream) -> Result<()> {
        self.bind()?;
        // SAFETY: the stream is the driver's own or one the caller vouched for.
        unsafe { cu::stream::synchronize(cu_stream(stream)) }
            .map_err(drv("cuStreamSynchronize"))?;
        // Errors cudarc deferred from drops (frees) surface here.
        self.ctx.check_err().map_err(drv("a deferred driver call"))
    }

    unsafe fn launch(
        &self,
        f: CudaFunction,
        g: &Geometry,
        s: RawStream,
        params: Params,
    ) -> Result<()> {
        self.bind()?;
        let mut args = [params];
        cu::launch_kernel(
            f.0,
            (g.grid, 1, 1),
            (g.block_threads, 1, 1),
            g.shared_bytes,
            cu_stream(s),
            &mut args,
        )
        .map_err(drv("cuLaunchKernel"))
    }

    fn begin_capture(&self) -> Result<()> {
        self.bind()?;
        self.stream
            .begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .map_err(drv("cuStreamBeginCapture"))
    }

    fn end_capture(&self) -> Result<Option<CudaGraph>> {
        let g = self
            .stream
            .end_capture(sys::CUgraphInstantiate_flags(0))
            .map_err(drv("cuStreamEndCapture"))?;
        if let Some(g) = &g {
            g.upload().map_err(drv("cuGraphUpload"))?;
        }
        Ok(g)
    }

    unsafe fn launch_graph(&self, graph: &CudaGraph) -> Result<()> {
        graph.launch().map_err(drv("cuGraphLaunch"))
    }

    fn create_event(&self) -> Result<CudaEvent> {
        self.ctx
            .new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(drv("cuEventCreate"))
    }

    fn record_event(&self, event: &CudaEvent) -> Result<()> {
        event.record(&self.stream).map_err(drv("cuEventRecord"))
    }

    fn elapsed_ms(&self, start: &CudaEvent, end: &CudaEvent) -> Result<f32> {
        let elapsed = self.elapsed.ok_or_else(|| {
            Error::driver(
                BACKEND,
                "cuEventElapsedTime",
                "the driver library has neither cuEventElapsedTime_v2 nor cuEventElapsedTime",
            )
        })?;
        let mut ms = 0.0f32;
        // SAFETY: both events are live events of this context.
        unsafe { elapsed(&mut ms, start.cu_event(), end.cu_event()) }
            .result()
            .map_err(drv("cuEventElapsedTime"))?;
        Ok(ms)
    }
}

impl GpuBackend<CudaDriver> {
    /// The backend on device `ordinal`: the device's primary context, a new
    /// (non-blocking) stream, the embedded fatbin loaded as a module with
    /// every kernel looked up, the zeroed skip counters, and the sanitize and
    /// launch policies of the environment ([`GpuBackend::from_driver`]).
    ///
    /// Returns [`Error::Unavailable`] (never panics) without a driver, without
    /// that device, or without kernels for it.
    pub fn new(ordinal: usize) -> Result<Self> {
        let d = CudaDriver::open(ordinal)?;
        guarded(|| GpuBackend::from_driver(d))
    }

    /// Number of CUDA devices: `Ok(0)` when the driver finds none,
    /// [`Error::Unavailable`] when there is no driver.
    pub fn device_count() -> Result<usize> {
        probe()?;
        guarded(|| {
            if !init_driver()? {
                return Ok(0);
            }
            let n = cu::device::get_count().map_err(drv("cuDeviceGetCount"))?;
            Ok(n.max(0) as usize)
        })
    }

    /// The device's compute capability (major, minor), e.g. `(9, 0)`.
    pub fn compute_capability(&self) -> (i32, i32) {
        self.driver().cc
    }

    /// The backend's context (the device's primary context).
    pub fn context(&self) -> &Arc<CudaContext> {
        self.driver().context()
    }
}
