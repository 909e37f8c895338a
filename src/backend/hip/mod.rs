//! The HIP driver under [`GpuBackend`] (AMD Instinct MI300 = gfx942, MI350 =
//! gfx950): the embedded AMDGPU code objects, launched through the HIP
//! runtime, which is loaded at run time. [`HipBackend`] is the GPU backend
//! over it.
//!
//! # Runtime loading
//!
//! `libamdhip64` is opened with `dlopen` when a backend is created, so the
//! crate builds, links and starts on machines without ROCm. A copy the
//! process already holds is used first: the loaded objects are searched
//! (`dl_iterate_phdr`) for a file named `libamdhip64.so[.N...]` and that copy
//! is reopened with `RTLD_NOLOAD`, since a ROCm torch wheel loads its own from
//! `torch/lib` and a second runtime would not know torch's streams, devices
//! or memory. Otherwise the names tried are `libamdhip64.so`,
//! `libamdhip64.so.6`, `libamdhip64.so.7`, `$ROCM_PATH/lib/libamdhip64.so`,
//! `/opt/rocm/lib/libamdhip64.so`; where none loads, [`HipBackend::new`]
//! returns [`Error::Unavailable`] naming the paths it tried. The file used
//! (symbolic links resolved) is in `info`, in [`HipBackend::runtime_path`]
//! and in every HIP error.
//!
//! # The caller's current device
//!
//! Everything that selects a device (opening, allocating, copying,
//! launching, synchronizing, events, graphs) makes it current only for the
//! call and then makes the caller's device current again (`hipGetDevice`
//! before, `hipSetDevice` after), as the CUDA backend restores the caller's
//! context: a call on a tensor of device 1 leaves torch's device 0 current.
//!
//! This file is the driver (opening a device, the [`Driver`] methods);
//! beside it, `runtime` finds and loads the runtime (with `loaded`, the
//! process's loaded objects), `ffi` is its symbol table, `device` asks it
//! about devices, and `handles` holds the objects it returns.
//!
//! The bindings are this crate's own (`hip/ffi.rs`, about thirty C entry
//! points over `libloading`) rather than `cubecl-hip-sys`: the backend needs
//! only a handful of long-stable symbols of the module API (`hipModuleLoadData`,
//! `hipModuleLaunchKernel`, memory, streams, events, graphs); they need no
//! build script and no ROCm headers; and they do not pin a HIP version,
//! whereas `cubecl-hip-sys` selects one generated binding per HIP release
//! through Cargo features, which would tie a binary to the ROCm release it
//! was built for. The one structure whose layout changed between releases,
//! `hipDeviceProp_t`, is read defensively (see below), and everything else
//! goes through handles and scalars.
//!
//! # Device properties
//!
//! The architecture string (`gcnArchName`, e.g. `gfx950:sramecc+:xnack-`) has
//! no `hipDeviceGetAttribute` equivalent, so it is read from the properties
//! struct: `hipGetDevicePropertiesR0600` (ROCm 6 and 7) into an 8 KiB
//! zeroed buffer, the field read at its documented offset (1160), and, if
//! that is not a well-formed architecture name, the struct is searched for
//! a NUL-terminated `gfx...` string that parses as one. On ROCm 5, which
//! only has the legacy `hipGetDeviceProperties` (R0000 layout), the same is
//! done from offset 396. Everything else (name, memory) comes from
//! `hipDeviceGetName` and `hipDeviceTotalMem`, which have no layout.
//!
//! # Launches
//!
//! Launches, buffers, graphs and timing are [`GpuBackend`]'s: the parameter
//! block goes by value as the kernel's one argument through
//! `hipModuleLaunchKernel`, with the dynamic shared memory (LDS) the CR2
//! team kernels need, on the backend's stream or the caller's.

mod device;
mod ffi;
mod handles;
mod loaded;
mod runtime;

pub use self::device::probe;
use self::device::{device_arch, device_count, device_name, init_runtime, total_mem};
use self::ffi::{Api, HipError, Stream, HIP_SUCCESS};
use self::handles::DeviceGuard;
pub use self::handles::{Handle, HipEvent, HipGraphExec, HipMemory, HipOwned, HipStream};
use super::gpu::driver::Params;
use super::gpu::{DeviceFacts, Driver, GpuBackend};
use super::raw::RawStream;
use crate::detect::{sanitize_for, AmdArch, SanitizePolicy};
use crate::error::{Error, Result};
use crate::kernel_abi::{Geometry, Kernel};
use std::ffi::{c_int, c_void, CString};
use std::ptr::null_mut;
use std::sync::Arc;

const BACKEND: &str = "hip";

fn unavailable(reason: impl Into<String>) -> Error {
    Error::Unavailable {
        backend: BACKEND,
        reason: reason.into(),
    }
}

/// The HIP backend on one device.
pub type HipBackend = GpuBackend<HipDriver>;

/// Memory the HIP backend computes on: a `hipMalloc` allocation.
pub type HipBuffer = super::gpu::DeviceBuffer<HipDriver>;

/// A HIP graph captured on a [`HipBackend`]'s stream.
pub type HipGraph<'a> = super::gpu::CapturedGraph<'a, HipDriver>;

pub use super::raw::RawDevice;

/// The HIP runtime on one device: its stream and the embedded code object
/// for its architecture loaded as a module.
pub struct HipDriver {
    api: Arc<Api>,
    facts: DeviceFacts,
    arch: AmdArch,
    target: &'static str,
    stream: Handle,
    module: Handle,
}

impl std::fmt::Debug for HipDriver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HipDriver")
            .field("device", &self.facts)
            .field("target", &self.target)
            .field("runtime", &self.api.path)
            .finish()
    }
}

impl HipDriver {
    /// Opens HIP device `device`: loads the runtime, reads the device's
    /// architecture, creates a stream and loads the embedded code object
    /// for it. Any failure is an [`Error::Unavailable`] naming what was
    /// looked for and where.
    pub fn open(device: usize) -> Result<Self> {
        let api = init_runtime()?;
        let count = device_count(&api)?;
        if device >= count {
            return Err(unavailable(format!(
                "HIP device {device} was requested but the HIP runtime {} sees {count} device(s)",
                api.path
            )));
        }
        let ordinal = device as c_int;
        // The stream and the module belong to the device current while they
        // are created; the caller's device is current again on return.
        let _current = DeviceGuard::select(&api, ordinal)
            .map_err(|e| unavailable(format!("{e} (for device {device})")))?;
        let name = device_name(&api, ordinal)?;
        let arch = device_arch(&api, ordinal)?;
        let target = arch.code_object_target().map_err(|e| match e {
            Error::Unavailable { backend, reason } => Error::Unavailable {
                backend,
                reason: format!(
                    "{reason} (HIP device {device}, {name}, runtime {})",
                    api.path
                ),
            },
            other => other,
        })?;
        let image = crate::kernels::hip_code_object(target).ok_or_else(|| {
            unavailable(format!(
                "this build lists {target} as a target but has no code object for it"
            ))
        })?;
        let mut d = HipDriver {
            facts: DeviceFacts {
                ordinal: device,
                name,
                arch: arch.to_string(),
                // CDNA (gfx9) runs 64-lane wavefronts only.
                warp_size: if arch.to_string().starts_with("gfx9") {
                    64
                } else {
                    32
                },
                total_memory: total_mem(&api, ordinal),
                // Not read yet (hipDeviceGetAttribute is not bound): the
                // roofline copy then sizes its grid from the buffer.
                multiprocessors: None,
                kernels: format!("{target} code object"),
            },
            api: api.clone(),
            arch,
            target,
            stream: Handle::NULL,
            module: Handle::NULL,
        };
        // From here on, Drop releases whatever was created.
        let mut s: Stream = null_mut();
        // SAFETY: valid out-pointer.
        setup(
            &api,
            "hipStreamCreate",
            unsafe { (api.stream_create)(&mut s) },
            "",
        )?;
        d.stream = Handle(s);
        let mut m = null_mut();
        // SAFETY: image is a complete AMDGPU code object (ELF) that lives for 'static.
        let code = unsafe { (api.module_load_data)(&mut m, image.as_ptr() as *const c_void) };
        setup(
            &api,
            "hipModuleLoadData",
            code,
            &format!(
                "loading the embedded {target} code object ({} bytes) on {}",
                image.len(),
                d.arch
            ),
        )?;
        d.module = Handle(m);
        Ok(d)
    }

    /// Whether a HIP runtime library can be loaded on this machine (it may
    /// still have no device).
    pub fn library_present() -> bool {
        runtime::load().is_ok()
    }

    /// The device's architecture, as it reports it.
    pub fn arch(&self) -> &AmdArch {
        &self.arch
    }

    /// The embedded code object target in use (`gfx942`, `gfx950`).
    pub fn target(&self) -> &'static str {
        self.target
    }

    /// Where the HIP runtime was loaded from.
    pub fn runtime_path(&self) -> &str {
        &self.api.path
    }

    fn check(&self, call: &'static str, code: HipError) -> Result<()> {
        check(&self.api, call, code)
    }

    /// Makes the device current on this thread until the guard drops, when
    /// the caller's device is current again: a null stream means the
    /// thread's current device, and allocations go to it (a thread-local
    /// setting; it neither allocates nor waits).
    fn select_device(&self) -> Result<DeviceGuard<'_>> {
        DeviceGuard::select(&self.api, self.facts.ordinal as c_int)
    }

    fn memcpy(
        &self,
        dst: *mut c_void,
        src: *const c_void,
        len: usize,
        kind: c_int,
        stream: RawStream,
    ) -> Result<()> {
        let _current = self.select_device()?;
        // SAFETY: the callers vouch for both ranges (see the Driver methods).
        let code = unsafe { (self.api.memcpy_async)(dst, src, len, kind, stream.as_ptr()) };
        self.check("hipMemcpyAsync", code)
    }

    fn graph_api(&self) -> Result<()> {
        let a = &self.api;
        if a.stream_begin_capture.is_some()
            && a.stream_end_capture.is_some()
            && a.graph_instantiate.is_some()
            && a.graph_launch.is_some()
        {
            Ok(())
        } else {
            Err(unavailable(format!(
                "the HIP runtime {} lacks the graph API (hipStreamBeginCapture, hipStreamEndCapture, \
                 hipGraphInstantiate, hipGraphLaunch)",
                a.path
            )))
        }
    }
}

impl Drop for HipDriver {
    fn drop(&mut self) {
        let api = &self.api;
        // SAFETY: each handle was created by this driver and is released
        // once; errors cannot be reported from drop.
        unsafe {
            if !self.stream.0.is_null() {
                (api.stream_synchronize)(self.stream.0);
            }
            if !self.module.0.is_null() {
                (api.module_unload)(self.module.0);
            }
            if !self.stream.0.is_null() {
                (api.stream_destroy)(self.stream.0);
            }
        }
    }
}

// SAFETY: launches go through `hipModuleLaunchKernel` with the caller's
// parameter block; allocations are hipMalloc'd and freed only on drop.
unsafe impl Driver for HipDriver {
    const BACKEND: &'static str = BACKEND;
    type Function = Handle;
    type Memory = HipMemory;
    type Event = HipEvent;
    type Graph = HipGraphExec;
    type Stream = HipStream;

    fn facts(&self) -> &DeviceFacts {
        &self.facts
    }

    fn sanitize_for(&self, policy: SanitizePolicy) -> bool {
        sanitize_for(&self.arch, policy)
    }

    fn stream(&self) -> RawStream {
        RawStream::from_ptr(self.stream.0)
    }

    fn function(&self, kernel: Kernel) -> Result<Handle> {
        let name = kernel.name();
        let c = CString::new(name).expect("kernel names have no NUL");
        let mut f = null_mut();
        // SAFETY: the module is loaded; c is NUL-terminated.
        let code = unsafe { (self.api.module_get_function)(&mut f, self.module.0, c.as_ptr()) };
        setup(
            &self.api,
            "hipModuleGetFunction",
            code,
            &format!(
                "for kernel {name} in the embedded {} code object (rebuild with the current kernels-hip \
                 sources)",
                self.target
            ),
        )?;
        Ok(Handle(f))
    }

    fn create_stream(&self) -> Result<(HipStream, RawStream)> {
        let _current = self.select_device()?;
        let mut s: Stream = null_mut();
        // SAFETY: valid out-pointer.
        self.check("hipStreamCreate", unsafe {
            (self.api.stream_create)(&mut s)
        })?;
        let stream = HipOwned::new(&self.api, s, self.api.stream_destroy);
        Ok((stream, RawStream::from_ptr(s)))
    }

    /// `hipMalloc` is not stream-ordered: `stream` does not matter.
    fn alloc(&self, len: usize, _stream: Option<&HipStream>) -> Result<(HipMemory, u64)> {
        let _current = self.select_device()?;
        let mut p = null_mut();
        // A zero-byte request returns null: allocate one byte.
        // SAFETY: valid out-pointer.
        self.check("hipMalloc", unsafe {
            (self.api.malloc)(&mut p, len.max(1))
        })?;
        Ok((HipOwned::new(&self.api, p, self.api.free), p as u64))
    }

    unsafe fn memset(&self, dst: u64, value: u8, len: usize, stream: RawStream) -> Result<()> {
        let _current = self.select_device()?;
        let code =
            (self.api.memset_async)(dst as *mut c_void, c_int::from(value), len, stream.as_ptr());
        self.check("hipMemsetAsync", code)
    }

    unsafe fn copy_to_device(&self, dst: u64, src: &[u8], stream: RawStream) -> Result<()> {
        self.memcpy(
            dst as *mut c_void,
            src.as_ptr() as *const c_void,
            src.len(),
            ffi::MEMCPY_H2D,
            stream,
        )
    }

    unsafe fn copy_to_host(&self, dst: &mut [u8], src: u64, stream: RawStream) -> Result<()> {
        self.memcpy(
            dst.as_mut_ptr() as *mut c_void,
            src as *const c_void,
            dst.len(),
            ffi::MEMCPY_D2H,
            stream,
        )
    }

    unsafe fn copy_on_device(&self, dst: u64, src: u64, n: usize, stream: RawStream) -> Result<()> {
        self.memcpy(
            dst as *mut c_void,
            src as *const c_void,
            n,
            ffi::MEMCPY_D2D,
            stream,
        )
    }

    fn memory_info(&self) -> Option<(usize, usize)> {
        let f = self.api.mem_get_info?;
        let _current = self.select_device().ok()?;
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: valid out-pointers.
        (unsafe { f(&mut free, &mut total) } == HIP_SUCCESS).then_some((free, total))
    }

    fn synchronize(&self, stream: RawStream) -> Result<()> {
        let _current = self.select_device()?;
        // SAFETY: the stream is the driver's own or one the caller vouched for.
        self.check("hipStreamSynchronize", unsafe {
            (self.api.stream_synchronize)(stream.as_ptr())
        })
    }

    unsafe fn launch(&self, f: Handle, g: &Geometry, s: RawStream, params: Params) -> Result<()> {
        let _current = self.select_device()?;
        let mut args = [params];
        let code = (self.api.module_launch_kernel)(
            f.0,
            g.grid,
            1,
            1,
            g.block_threads,
            1,
            1,
            g.shared_bytes,
            s.as_ptr(),
            args.as_mut_ptr(),
            null_mut(),
        );
        self.check("hipModuleLaunchKernel", code)
    }

    fn begin_capture(&self) -> Result<()> {
        self.graph_api()?;
        let begin = self.api.stream_begin_capture.expect("checked");
        // SAFETY: the stream is live.
        self.check("hipStreamBeginCapture", unsafe {
            begin(self.stream.0, ffi::CAPTURE_MODE_THREAD_LOCAL)
        })
    }

    fn end_capture(&self) -> Result<Option<HipGraphExec>> {
        self.graph_api()?;
        let _current = self.select_device()?;
        let (end, inst) = (
            self.api.stream_end_capture.expect("checked"),
            self.api.graph_instantiate.expect("checked"),
        );
        let mut graph = null_mut();
        // SAFETY: ends the capture begun on this stream.
        let code = unsafe { end(self.stream.0, &mut graph) };
        let mut g = HipGraphExec {
            graph: Handle(graph),
            exec: Handle::NULL,
            api: self.api.clone(),
        };
        self.check("hipStreamEndCapture", code)?;
        if graph.is_null() {
            return Ok(None);
        }
        let mut exec = null_mut();
        // SAFETY: graph is a captured graph; no error node or log requested.
        self.check("hipGraphInstantiate", unsafe {
            inst(&mut exec, graph, null_mut(), null_mut(), 0)
        })?;
        g.exec = Handle(exec);
        Ok(Some(g))
    }

    unsafe fn launch_graph(&self, graph: &HipGraphExec) -> Result<()> {
        self.graph_api()?;
        let _current = self.select_device()?;
        let launch = self.api.graph_launch.expect("checked");
        self.check("hipGraphLaunch", launch(graph.exec.0, self.stream.0))
    }

    fn create_event(&self) -> Result<HipEvent> {
        let _current = self.select_device()?;
        let mut e = null_mut();
        // SAFETY: valid out-pointer.
        self.check("hipEventCreate", unsafe { (self.api.event_create)(&mut e) })?;
        Ok(HipOwned::new(&self.api, e, self.api.event_destroy))
    }

    fn record_event(&self, event: &HipEvent) -> Result<()> {
        // SAFETY: the event and the stream are live.
        self.check("hipEventRecord", unsafe {
            (self.api.event_record)(event.handle.0, self.stream.0)
        })
    }

    fn elapsed_ms(&self, start: &HipEvent, end: &HipEvent) -> Result<f32> {
        let mut ms = 0f32;
        // SAFETY: both events are live and recorded.
        self.check("hipEventElapsedTime", unsafe {
            (self.api.event_elapsed_time)(&mut ms, start.handle.0, end.handle.0)
        })?;
        Ok(ms)
    }
}

impl GpuBackend<HipDriver> {
    /// Opens HIP device `device` ([`HipDriver::open`]) with the sanitize and
    /// launch policies of the environment ([`GpuBackend::from_driver`]);
    /// a bad `DSV4_KVCACHE_SANITIZE` or override variable is an
    /// [`Error::Value`].
    pub fn new(device: usize) -> Result<Self> {
        GpuBackend::from_driver(HipDriver::open(device)?)
    }

    /// As [`HipBackend::new`], with the sanitize policy given and the
    /// measured launch heuristics (the environment is not read).
    pub fn with_policy(device: usize, policy: SanitizePolicy) -> Result<Self> {
        GpuBackend::with_policies(
            HipDriver::open(device)?,
            policy,
            crate::launch::LaunchPolicy::MEASURED,
        )
    }

    /// The device's architecture, as it reports it.
    pub fn arch(&self) -> &AmdArch {
        self.driver().arch()
    }

    /// The embedded code object target in use (`gfx942`, `gfx950`).
    pub fn target(&self) -> &'static str {
        self.driver().target()
    }

    /// The HIP device ordinal.
    pub fn device(&self) -> usize {
        self.ordinal()
    }

    /// Where the HIP runtime was loaded from.
    pub fn runtime_path(&self) -> &str {
        self.driver().runtime_path()
    }
}

/// `Ok` for `hipSuccess`, else an [`Error::Driver`] naming `call`.
fn check(api: &Api, call: &'static str, code: HipError) -> Result<()> {
    if code == HIP_SUCCESS {
        Ok(())
    } else {
        Err(Error::driver(
            BACKEND,
            call,
            format!("{} (HIP runtime {})", api.error_message(code), api.path),
        ))
    }
}

/// As [`check`], but an [`Error::Unavailable`] that says where the runtime
/// came from (setup failures).
fn setup(api: &Api, call: &'static str, code: HipError, what: &str) -> Result<()> {
    if code == HIP_SUCCESS {
        Ok(())
    } else {
        Err(unavailable(format!(
            "{call} failed {what}: {} (HIP runtime {})",
            api.error_message(code),
            api.path
        )))
    }
}
