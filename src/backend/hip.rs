//! The HIP backend (AMD Instinct MI300 = gfx942, MI350 = gfx950): the
//! embedded AMDGPU code objects, launched through the HIP runtime, which is
//! loaded at run time.
//!
//! # Runtime loading
//!
//! `libamdhip64` is opened with `dlopen` when a backend is created (names
//! tried: `libamdhip64.so`, `libamdhip64.so.6`, `libamdhip64.so.7`,
//! `$ROCM_PATH/lib/libamdhip64.so`, `/opt/rocm/lib/libamdhip64.so`), so the
//! crate builds, links and starts on machines without ROCm; there,
//! [`HipBackend::new`] returns [`Error::Unavailable`] naming the paths it
//! tried.
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
//! Every launch validates its arguments with [`crate::ops`], builds the
//! kernel's parameter block with [`crate::kernel_abi`], and calls
//! `hipModuleLaunchKernel` in the shape [`crate::kernel_abi`] picks (small
//! blocks at decode sizes, and the CR2 teams' shared memory) with the
//! parameter block by value as the only kernel
//! argument, on the backend's stream (or the caller's, in the `*_raw`
//! functions). Nothing is allocated and nothing waits inside a launch, so
//! launches can be captured in a HIP graph ([`HipBackend::capture`]).

mod ffi;

use self::ffi::{Api, Event, Function, HipError, Stream, HIP_ERROR_NO_DEVICE, HIP_SUCCESS};
use super::Backend;
use crate::detect::{sanitize_for, AmdArch, SanitizePolicy};
use crate::error::{Error, Result};
use crate::kernel_abi::{
    compress_launch, compress_params, fused_launch, fused_params, insert_launch, insert_params,
    ring_rows_launch, ring_rows_params, CompressPtrs, InsertPtrs, Kernel, KernelParams, Launch,
    NUM_COUNTERS,
};
use crate::ops::{
    plan_compress, plan_fused, plan_insert, plan_ring_rows, CompressArgs, FusedArgs, InsertArgs,
    RingArgs, SkipCounts,
};
use crate::tensor::{Storage, Tensor};
use std::ffi::{c_char, c_int, c_void, CString};
use std::marker::PhantomData;
use std::ptr::null_mut;
use std::sync::Arc;

const BACKEND: &str = "hip";

fn unavailable(reason: impl Into<String>) -> Error {
    Error::Unavailable {
        backend: BACKEND,
        reason: reason.into(),
    }
}

/// A HIP handle (stream, module, function, device pointer).
#[derive(Clone, Copy)]
struct Handle(*mut c_void);

// SAFETY: HIP handles are process-wide identifiers; the runtime's calls on
// them are thread-safe.
unsafe impl Send for Handle {}
unsafe impl Sync for Handle {}

impl Handle {
    const NULL: Handle = Handle(null_mut());
}

pub use super::raw::RawDevice;

/// Memory the HIP backend computes on: a `hipMalloc` allocation, freed on drop.
pub struct HipBuffer {
    ptr: u64,
    len: usize,
    api: Arc<Api>,
}

impl HipBuffer {
    /// The device address of byte 0 (0 for an empty buffer).
    pub fn device_ptr(&self) -> u64 {
        self.ptr
    }

    /// The same memory as a [`RawDevice`] (borrowed: it must not outlive
    /// this buffer).
    pub fn as_raw(&self) -> RawDevice {
        RawDevice {
            ptr: self.ptr,
            len: self.len,
        }
    }
}

impl std::fmt::Debug for HipBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "HipBuffer {{ ptr: {:#x}, len: {} }}", self.ptr, self.len)
    }
}

impl Storage for HipBuffer {
    fn len_bytes(&self) -> usize {
        self.len
    }
}

impl Drop for HipBuffer {
    fn drop(&mut self) {
        if self.ptr != 0 {
            // SAFETY: ptr came from hipMalloc and is freed once. An error
            // here (e.g. a device lost) cannot be reported from drop.
            unsafe { (self.api.free)(self.ptr as *mut c_void) };
        }
    }
}

/// Storage that has a device address.
trait DevicePtr: Storage {
    fn device_ptr(&self) -> u64;
}

impl DevicePtr for HipBuffer {
    fn device_ptr(&self) -> u64 {
        self.ptr
    }
}

impl DevicePtr for RawDevice {
    fn device_ptr(&self) -> u64 {
        self.ptr
    }
}

fn dptr<S: DevicePtr + ?Sized>(t: &Tensor<'_, S>) -> u64 {
    t.buf.device_ptr()
}

fn opt_dptr<S: DevicePtr + ?Sized>(t: &Option<Tensor<'_, S>>) -> u64 {
    t.as_ref().map_or(0, |t| t.buf.device_ptr())
}

/// A HIP device with the embedded kernels loaded: one stream, one module,
/// every kernel of `kernel_abi::Kernel::ALL` and the skip counters.
pub struct HipBackend {
    api: Arc<Api>,
    device: usize,
    device_name: String,
    arch: AmdArch,
    target: &'static str,
    policy: SanitizePolicy,
    sanitize: bool,
    stream: Handle,
    module: Handle,
    /// `Kernel::ALL[i]`'s function.
    functions: Vec<Handle>,
    /// `NUM_COUNTERS` u32 on the device: slot, position, index.
    counters: Handle,
}

impl std::fmt::Debug for HipBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HipBackend")
            .field("device", &self.device)
            .field("name", &self.device_name)
            .field("arch", &self.arch.to_string())
            .field("target", &self.target)
            .field("sanitize", &self.sanitize)
            .finish()
    }
}

/// Runs `f` and turns a non-success code into an [`Error::Driver`].
fn check(api: &Api, call: &'static str, code: HipError) -> Result<()> {
    if code == HIP_SUCCESS {
        Ok(())
    } else {
        Err(Error::Driver {
            backend: BACKEND,
            call,
            message: api.error_message(code),
        })
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

/// Loads the runtime and runs `hipInit`, with the no-device case spelled out.
fn init_runtime() -> Result<Arc<Api>> {
    let api = ffi::load().map_err(unavailable)?;
    // SAFETY: plain C call.
    let code = unsafe { (api.init)(0) };
    if code == HIP_ERROR_NO_DEVICE {
        return Err(unavailable(format!(
            "the HIP runtime {} found no AMD GPU (hipInit: {}); check that the amdgpu driver is loaded, /dev/kfd \
             is accessible and HIP_VISIBLE_DEVICES / ROCR_VISIBLE_DEVICES do not hide the devices",
            api.path,
            api.error_message(code)
        )));
    }
    setup(&api, "hipInit", code, "")?;
    Ok(api)
}

fn device_count(api: &Api) -> Result<usize> {
    let mut n: c_int = 0;
    // SAFETY: n is a valid out-pointer.
    let code = unsafe { (api.get_device_count)(&mut n) };
    if code == HIP_ERROR_NO_DEVICE {
        return Ok(0);
    }
    setup(api, "hipGetDeviceCount", code, "")?;
    Ok(n.max(0) as usize)
}

fn device_name(api: &Api, device: c_int) -> Result<String> {
    let mut dev: c_int = 0;
    // SAFETY: valid out-pointer.
    setup(
        api,
        "hipDeviceGet",
        unsafe { (api.device_get)(&mut dev, device) },
        "",
    )?;
    let mut buf = [0 as c_char; 256];
    // SAFETY: buf holds 256 chars; the runtime writes a NUL-terminated name.
    setup(
        api,
        "hipDeviceGetName",
        unsafe { (api.device_get_name)(buf.as_mut_ptr(), buf.len() as c_int, dev) },
        "",
    )?;
    let bytes: Vec<u8> = buf
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    Ok(String::from_utf8_lossy(&bytes).trim().to_string())
}

/// The device's `gcnArchName` (see the module docs for how it is read).
fn device_arch(api: &Api, device: c_int) -> Result<AmdArch> {
    let (f, call, offset) = match (api.get_device_properties_r0600, api.get_device_properties) {
        (Some(f), _) => (
            f,
            "hipGetDevicePropertiesR0600",
            ffi::GCN_ARCH_NAME_OFFSET_R0600,
        ),
        (None, Some(f)) => (f, "hipGetDeviceProperties", ffi::GCN_ARCH_NAME_OFFSET_R0000),
        (None, None) => {
            return Err(unavailable(format!(
            "the HIP runtime {} has neither hipGetDevicePropertiesR0600 nor hipGetDeviceProperties",
            api.path
        )))
        }
    };
    // u64 elements: 8-byte alignment, as the C struct has.
    let mut props = vec![0u64; ffi::DEVICE_PROP_BYTES / 8];
    // SAFETY: the buffer is larger than any hipDeviceProp_t layout.
    setup(
        api,
        call,
        unsafe { f(props.as_mut_ptr() as *mut c_void, device) },
        &format!("for device {device}"),
    )?;
    let bytes: Vec<u8> = props.iter().flat_map(|w| w.to_ne_bytes()).collect();
    let name = ffi::find_arch_name(&bytes, offset).ok_or_else(|| {
        unavailable(format!(
            "{call} for device {device} returned no gcnArchName (looked at offset {offset}, then for any gfx... \
             string; HIP runtime {})",
            api.path
        ))
    })?;
    AmdArch::parse(&name).map_err(|e| unavailable(format!("device {device}: {e}")))
}

fn total_mem(api: &Api, device: c_int) -> Option<usize> {
    let f = api.device_total_mem?;
    let mut bytes = 0usize;
    // SAFETY: valid out-pointer.
    (unsafe { f(&mut bytes, device) } == HIP_SUCCESS).then_some(bytes)
}

fn version(f: Option<unsafe extern "C" fn(*mut c_int) -> HipError>) -> Option<String> {
    let mut v: c_int = 0;
    // SAFETY: valid out-pointer.
    (unsafe { f?(&mut v) } == HIP_SUCCESS).then(|| {
        // HIP_VERSION = major * 10^7 + minor * 10^5 + patch.
        format!("{}.{}.{}", v / 10_000_000, (v / 100_000) % 100, v % 100_000)
    })
}

impl HipBackend {
    /// Opens HIP device `device`, with the sanitize policy of the environment
    /// (`DSV4_KVCACHE_SANITIZE`, see [`crate::detect`]).
    ///
    /// Loads the runtime, reads the device's architecture, loads the
    /// embedded code object for it, resolves every kernel and allocates the
    /// skip counters. Any failure is an [`Error::Unavailable`] naming what was
    /// looked for and where; a bad `DSV4_KVCACHE_SANITIZE` is an
    /// [`Error::Value`].
    pub fn new(device: usize) -> Result<Self> {
        Self::with_policy(device, SanitizePolicy::from_env()?)
    }

    /// As [`HipBackend::new`], with the sanitize policy given (the
    /// environment is not read).
    pub fn with_policy(device: usize, policy: SanitizePolicy) -> Result<Self> {
        let api = init_runtime()?;
        let count = device_count(&api)?;
        if device >= count {
            return Err(unavailable(format!(
                "HIP device {device} was requested but the HIP runtime {} sees {count} device(s)",
                api.path
            )));
        }
        let ordinal = device as c_int;
        // SAFETY: plain C call with a valid ordinal.
        setup(
            &api,
            "hipSetDevice",
            unsafe { (api.set_device)(ordinal) },
            &format!("for device {device}"),
        )?;
        let device_name = device_name(&api, ordinal)?;
        let arch = device_arch(&api, ordinal)?;
        let target = arch.code_object_target().map_err(|e| match e {
            Error::Unavailable { backend, reason } => Error::Unavailable {
                backend,
                reason: format!(
                    "{reason} (HIP device {device}, {device_name}, runtime {})",
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
        let mut b = HipBackend {
            api: api.clone(),
            device,
            device_name,
            sanitize: sanitize_for(&arch, policy),
            arch,
            target,
            policy,
            stream: Handle::NULL,
            module: Handle::NULL,
            functions: Vec::with_capacity(Kernel::ALL.len()),
            counters: Handle::NULL,
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
        b.stream = Handle(s);
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
                b.arch
            ),
        )?;
        b.module = Handle(m);
        for k in Kernel::ALL {
            let name = k.name();
            let c = CString::new(name).expect("kernel names have no NUL");
            let mut f: Function = null_mut();
            // SAFETY: the module is loaded; c is NUL-terminated.
            let code = unsafe { (api.module_get_function)(&mut f, m, c.as_ptr()) };
            setup(
                &api,
                "hipModuleGetFunction",
                code,
                &format!(
                    "for kernel {name} in the embedded {target} code object (rebuild with the current \
                     kernels-hip sources)"
                ),
            )?;
            b.functions.push(Handle(f));
        }
        let mut c = null_mut();
        // SAFETY: valid out-pointer.
        setup(
            &api,
            "hipMalloc",
            unsafe { (api.malloc)(&mut c, NUM_COUNTERS * 4) },
            "for the skip counters",
        )?;
        b.counters = Handle(c);
        // SAFETY: c holds NUM_COUNTERS * 4 bytes; the stream is ours.
        setup(
            &api,
            "hipMemsetAsync",
            unsafe { (api.memset_async)(c, 0, NUM_COUNTERS * 4, s) },
            "",
        )?;
        setup(
            &api,
            "hipStreamSynchronize",
            unsafe { (api.stream_synchronize)(s) },
            "",
        )?;
        Ok(b)
    }

    /// The device's architecture, as it reports it.
    pub fn arch(&self) -> &AmdArch {
        &self.arch
    }

    /// The embedded code object target in use (`gfx942`, `gfx950`).
    pub fn target(&self) -> &'static str {
        self.target
    }

    /// The HIP device ordinal.
    pub fn device(&self) -> usize {
        self.device
    }

    /// The device's marketing name (`AMD Instinct MI300X`).
    pub fn device_name(&self) -> &str {
        &self.device_name
    }

    /// The sanitize policy the backend was opened with.
    pub fn policy(&self) -> SanitizePolicy {
        self.policy
    }

    /// Where the HIP runtime was loaded from.
    pub fn runtime_path(&self) -> &str {
        &self.api.path
    }

    /// The backend's `hipStream_t`, for ordering the caller's own work with it.
    pub fn stream(&self) -> *mut c_void {
        self.stream.0
    }

    fn check(&self, call: &'static str, code: HipError) -> Result<()> {
        check(&self.api, call, code)
    }

    fn select_device(&self) -> Result<()> {
        // SAFETY: plain C call with the ordinal opened in new().
        self.check("hipSetDevice", unsafe {
            (self.api.set_device)(self.device as c_int)
        })
    }

    /// A zero-filled buffer of `len` bytes.
    pub fn alloc_zeroed(&self, len: usize) -> Result<HipBuffer> {
        let buf = self.alloc(len)?;
        if len > 0 {
            // SAFETY: buf holds len bytes; the stream is ours.
            let code =
                unsafe { (self.api.memset_async)(buf.ptr as *mut c_void, 0, len, self.stream.0) };
            self.check("hipMemsetAsync", code)?;
            self.synchronize()?;
        }
        Ok(buf)
    }

    /// Copies `len` bytes from `src` to `dst` on the device, on the backend's
    /// stream (does not wait).
    pub fn copy(&self, src: &HipBuffer, dst: &mut HipBuffer, len: usize) -> Result<()> {
        if len > src.len || len > dst.len {
            return Err(Error::OutOfBounds {
                arg: "copy",
                needed: len as u64,
                available: src.len.min(dst.len) as u64,
            });
        }
        if len == 0 {
            return Ok(());
        }
        // SAFETY: both buffers are live allocations of this device holding at
        // least len bytes; the stream is ours.
        let code = unsafe {
            (self.api.memcpy_async)(
                dst.ptr as *mut c_void,
                src.ptr as *const c_void,
                len,
                ffi::MEMCPY_D2D,
                self.stream.0,
            )
        };
        self.check("hipMemcpyAsync", code)
    }

    /// Device-to-device copy rate in bytes per second (bytes read plus bytes
    /// written), the median of `replays` copies of `bytes`, timed by events.
    pub fn time_copy(&self, bytes: usize, replays: usize) -> Result<f64> {
        let src = self.alloc_zeroed(bytes)?;
        let mut dst = self.alloc_zeroed(bytes)?;
        self.copy(&src, &mut dst, bytes)?; // warm-up
        let mut ms = Vec::new();
        for _ in 0..replays.max(1) {
            ms.push(self.time_ms(|b| b.copy(&src, &mut dst, bytes))?);
        }
        ms.sort_by(|a, b| a.total_cmp(b));
        let median = ms[ms.len() / 2] as f64 / 1e3;
        Ok(2.0 * bytes as f64 / median.max(1e-12))
    }

    fn alloc(&self, len: usize) -> Result<HipBuffer> {
        let mut p = null_mut();
        if len > 0 {
            self.select_device()?;
            // SAFETY: valid out-pointer.
            self.check("hipMalloc", unsafe { (self.api.malloc)(&mut p, len) })?;
        }
        Ok(HipBuffer {
            ptr: p as u64,
            len,
            api: self.api.clone(),
        })
    }

    fn function(&self, kernel: Kernel) -> Function {
        // Every kernel was looked up when the module was loaded.
        self.functions[kernel.index()].0
    }

    /// Launches `l` (kernel and shape) with `params` as its one argument.
    ///
    /// # Safety
    /// The addresses in `params` must be valid device memory for the kernel's
    /// accesses, and `stream` a stream of this device (or null).
    unsafe fn launch<P: KernelParams>(&self, l: Launch, params: &P, stream: Stream) -> Result<()> {
        let f = self.function(l.kernel);
        // The launch goes to the stream's device, but a null stream means
        // the calling thread's current device: make that ours (a
        // thread-local setting; it neither allocates nor waits).
        self.select_device()?;
        let g = l.geometry;
        let mut block = params.with_geometry(&g);
        let mut args = [&mut block as *mut P as *mut c_void];
        let code = (self.api.module_launch_kernel)(
            f,
            g.grid,
            1,
            1,
            g.block_threads,
            1,
            1,
            g.shared_bytes,
            stream,
            args.as_mut_ptr(),
            null_mut(),
        );
        self.check("hipModuleLaunchKernel", code)
    }

    unsafe fn compress_on<S: DevicePtr + ?Sized>(
        &self,
        a: &CompressArgs<'_, S>,
        stream: Stream,
    ) -> Result<()> {
        let p = plan_compress(a)?;
        if p.n == 0 {
            return Ok(());
        }
        let ptrs = compress_ptrs(a, self.counters.0 as u64);
        let params = compress_params(&p, &ptrs);
        self.launch(compress_launch(&p), &params, stream)
    }

    unsafe fn insert_on<S: DevicePtr + ?Sized>(
        &self,
        a: &InsertArgs<'_, S>,
        stream: Stream,
    ) -> Result<()> {
        let p = plan_insert(a)?;
        if p.n == 0 {
            return Ok(());
        }
        let ptrs = InsertPtrs {
            latent: dptr(&a.latent),
            positions: dptr(&a.positions),
            slots: dptr(&a.slot_mapping),
            cos_sin: dptr(&a.cos_sin_cache),
            cache: a.kv_cache.buf.device_ptr(),
            fp8_scale: opt_dptr(&a.fp8_scale),
            counters: self.counters.0 as u64,
        };
        let params = insert_params(&p, &ptrs, self.sanitize);
        self.launch(insert_launch(&p), &params, stream)
    }

    unsafe fn ring_rows_on<S: DevicePtr + ?Sized>(
        &self,
        a: &RingArgs<'_, S>,
        stream: Stream,
    ) -> Result<()> {
        let p = plan_ring_rows(a)?;
        if p.n == 0 {
            return Ok(());
        }
        let params = ring_rows_params(
            &p,
            dptr(&a.rows),
            dptr(&a.slot_mapping),
            a.state_cache.buf.device_ptr(),
            self.counters.0 as u64,
        );
        self.launch(ring_rows_launch(&p), &params, stream)
    }

    unsafe fn fused_on<S: DevicePtr + ?Sized>(
        &self,
        a: &FusedArgs<'_, S>,
        stream: Stream,
    ) -> Result<()> {
        let fp = plan_fused(a)?;
        if fp.compress.n == 0 {
            return Ok(());
        }
        let counters = self.counters.0 as u64;
        let cptrs = compress_ptrs(&a.compress, counters);
        let iptrs = InsertPtrs {
            latent: cptrs.latent,
            positions: cptrs.positions,
            slots: dptr(&a.cache_slot_mapping),
            cos_sin: dptr(&a.cos_sin_cache),
            cache: a.kv_cache.buf.device_ptr(),
            fp8_scale: opt_dptr(&a.fp8_scale),
            counters,
        };
        let params = fused_params(&fp, &cptrs, &iptrs, self.sanitize);
        self.launch(fused_launch(&fp), &params, stream)
    }

    /// `rope_quant_insert` over caller-owned device memory, on `stream`.
    ///
    /// Validation is the same as the safe API's (plus the address checks of
    /// [`RawDevice`]); nothing is allocated and nothing waits, so the call
    /// can be captured in a graph. Skipped tokens count into this backend's
    /// counters: synchronize `stream` before [`Backend::take_skip_counts`],
    /// which waits only for the backend's own stream.
    ///
    /// # Safety
    /// Every [`RawDevice`] must be memory of this backend's device, valid for
    /// its `len` bytes until the launch completes, with no other work
    /// writing it meanwhile; `stream` must be a `hipStream_t` of this device
    /// or null (HIP's null stream).
    pub unsafe fn rope_quant_insert_raw(
        &self,
        args: &InsertArgs<'_, RawDevice>,
        stream: *mut c_void,
    ) -> Result<()> {
        super::raw::check_insert(args)?;
        self.insert_on(args, stream)
    }

    /// `fused_save_compress_norm` over caller-owned device memory, on `stream`.
    ///
    /// # Safety
    /// As [`HipBackend::rope_quant_insert_raw`].
    pub unsafe fn fused_save_compress_norm_raw(
        &self,
        args: &CompressArgs<'_, RawDevice>,
        stream: *mut c_void,
    ) -> Result<()> {
        super::raw::check_compress(args)?;
        self.compress_on(args, stream)
    }

    /// `save_ring_rows` over caller-owned device memory, on `stream`.
    ///
    /// # Safety
    /// As [`HipBackend::rope_quant_insert_raw`].
    pub unsafe fn save_ring_rows_raw(
        &self,
        args: &RingArgs<'_, RawDevice>,
        stream: *mut c_void,
    ) -> Result<()> {
        super::raw::check_ring(args)?;
        self.ring_rows_on(args, stream)
    }

    /// The fused compress + insert over caller-owned device memory, on `stream`.
    ///
    /// # Safety
    /// As [`HipBackend::rope_quant_insert_raw`].
    pub unsafe fn fused_compress_insert_raw(
        &self,
        args: &FusedArgs<'_, RawDevice>,
        stream: *mut c_void,
    ) -> Result<()> {
        super::raw::check_fused(args)?;
        self.fused_on(args, stream)
    }

    /// GPU time of the work `f` launches on the backend's stream, in
    /// milliseconds, from two HIP events (waits for the work).
    pub fn time_ms(&self, f: impl FnOnce(&Self) -> Result<()>) -> Result<f32> {
        let api = &self.api;
        let mut ev: [Event; 2] = [null_mut(); 2];
        for e in ev.iter_mut() {
            // SAFETY: valid out-pointer.
            if let Err(err) = self.check("hipEventCreate", unsafe { (api.event_create)(e) }) {
                destroy_events(api, &ev);
                return Err(err);
            }
        }
        let run = || -> Result<f32> {
            // SAFETY: the events and the stream are live.
            self.check("hipEventRecord", unsafe {
                (api.event_record)(ev[0], self.stream.0)
            })?;
            f(self)?;
            self.check("hipEventRecord", unsafe {
                (api.event_record)(ev[1], self.stream.0)
            })?;
            self.check("hipEventSynchronize", unsafe {
                (api.event_synchronize)(ev[1])
            })?;
            let mut ms = 0f32;
            self.check("hipEventElapsedTime", unsafe {
                (api.event_elapsed_time)(&mut ms, ev[0], ev[1])
            })?;
            Ok(ms)
        };
        let r = run();
        destroy_events(api, &ev);
        r
    }

    /// Captures the launches `f` makes on the backend's stream into a HIP
    /// graph (thread-local capture mode), to be replayed with
    /// [`HipGraph::launch`]. The buffers the launches use must outlive the
    /// graph's replays.
    pub fn capture(&self, f: impl FnOnce(&Self) -> Result<()>) -> Result<HipGraph<'_>> {
        let api = &self.api;
        let missing = || {
            unavailable(format!(
                "the HIP runtime {} lacks the graph API (hipStreamBeginCapture, hipStreamEndCapture, \
                 hipGraphInstantiate, hipGraphLaunch)",
                api.path
            ))
        };
        let (begin, end, inst) = match (
            api.stream_begin_capture,
            api.stream_end_capture,
            api.graph_instantiate,
        ) {
            (Some(b), Some(e), Some(i)) if api.graph_launch.is_some() => (b, e, i),
            _ => return Err(missing()),
        };
        let s = self.stream.0;
        // SAFETY: the stream is live and idle-or-capturable.
        self.check("hipStreamBeginCapture", unsafe {
            begin(s, ffi::CAPTURE_MODE_THREAD_LOCAL)
        })?;
        let body = f(self);
        let mut graph = null_mut();
        // SAFETY: ends the capture begun above, whatever f did.
        let end_code = unsafe { end(s, &mut graph) };
        let mut g = HipGraph {
            api: api.clone(),
            stream: self.stream,
            graph: Handle(graph),
            exec: Handle::NULL,
            _backend: PhantomData,
        };
        body?;
        self.check("hipStreamEndCapture", end_code)?;
        let mut exec = null_mut();
        // SAFETY: graph is a captured graph; no error node / log requested.
        self.check("hipGraphInstantiate", unsafe {
            inst(&mut exec, graph, null_mut(), null_mut(), 0)
        })?;
        g.exec = Handle(exec);
        Ok(g)
    }

    /// Counters on the device (for tests): slot, position, index.
    fn read_counters(&self) -> Result<[u32; NUM_COUNTERS]> {
        let mut host = [0u32; NUM_COUNTERS];
        // SAFETY: counters holds NUM_COUNTERS u32; host likewise; the copy
        // completes before the synchronize returns.
        unsafe {
            self.check(
                "hipMemcpyAsync",
                (self.api.memcpy_async)(
                    host.as_mut_ptr() as *mut c_void,
                    self.counters.0,
                    NUM_COUNTERS * 4,
                    ffi::MEMCPY_D2H,
                    self.stream.0,
                ),
            )?;
            self.check(
                "hipMemsetAsync",
                (self.api.memset_async)(self.counters.0, 0, NUM_COUNTERS * 4, self.stream.0),
            )?;
        }
        self.synchronize()?;
        Ok(host)
    }
}

fn destroy_events(api: &Api, ev: &[Event]) {
    for &e in ev {
        if !e.is_null() {
            // SAFETY: e came from hipEventCreate.
            unsafe { (api.event_destroy)(e) };
        }
    }
}

fn compress_ptrs<S: DevicePtr + ?Sized>(a: &CompressArgs<'_, S>, counters: u64) -> CompressPtrs {
    CompressPtrs {
        kv_score: dptr(&a.kv_score),
        positions: dptr(&a.positions),
        slots: dptr(&a.slot_mapping),
        qsl: opt_dptr(&a.query_start_loc),
        ttr: opt_dptr(&a.token_to_req_indices),
        weight: dptr(&a.rms_norm_weight),
        latent: a.latent_out.buf.device_ptr(),
        ring: a.state_cache.as_ref().map_or(0, |t| t.buf.device_ptr()),
        prev_rows: opt_dptr(&a.prev_rows),
        prev_idx: opt_dptr(&a.prev_row_indices),
        counters,
    }
}

impl Drop for HipBackend {
    fn drop(&mut self) {
        let api = &self.api;
        // SAFETY: each handle was created by this backend and is released
        // once; errors cannot be reported from drop.
        unsafe {
            if !self.stream.0.is_null() {
                (api.stream_synchronize)(self.stream.0);
            }
            if !self.counters.0.is_null() {
                (api.free)(self.counters.0);
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

/// An instantiated HIP graph of captured launches ([`HipBackend::capture`]);
/// it borrows the backend, whose stream it replays on.
pub struct HipGraph<'a> {
    api: Arc<Api>,
    stream: Handle,
    graph: Handle,
    exec: Handle,
    _backend: PhantomData<&'a HipBackend>,
}

impl HipGraph<'_> {
    /// Replays the graph on the backend's stream (does not wait).
    pub fn launch(&self) -> Result<()> {
        let f = self
            .api
            .graph_launch
            .ok_or_else(|| unavailable("hipGraphLaunch is missing"))?;
        // SAFETY: exec is an instantiated graph; the stream is the backend's,
        // alive while the graph borrows the backend.
        check(&self.api, "hipGraphLaunch", unsafe {
            f(self.exec.0, self.stream.0)
        })
    }
}

impl Drop for HipGraph<'_> {
    fn drop(&mut self) {
        // SAFETY: handles created by capture(), released once.
        unsafe {
            if let (false, Some(f)) = (self.exec.0.is_null(), self.api.graph_exec_destroy) {
                f(self.exec.0);
            }
            if let (false, Some(f)) = (self.graph.0.is_null(), self.api.graph_destroy) {
                f(self.graph.0);
            }
        }
    }
}

impl Backend for HipBackend {
    type Buffer = HipBuffer;

    fn name(&self) -> String {
        format!("hip:{} ({}, {})", self.device, self.device_name, self.arch)
    }

    fn sanitize(&self) -> bool {
        self.sanitize
    }

    fn set_sanitize(&mut self, on: bool) {
        self.sanitize = on;
    }

    fn upload(&self, bytes: &[u8]) -> Result<HipBuffer> {
        let mut buf = self.alloc(bytes.len())?;
        self.write(&mut buf, bytes)?;
        Ok(buf)
    }

    fn write(&self, buf: &mut HipBuffer, bytes: &[u8]) -> Result<()> {
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
        // SAFETY: buf holds at least bytes.len() bytes; the host slice stays
        // borrowed until the synchronize below returns.
        let code = unsafe {
            (self.api.memcpy_async)(
                buf.ptr as *mut c_void,
                bytes.as_ptr() as *const c_void,
                bytes.len(),
                ffi::MEMCPY_H2D,
                self.stream.0,
            )
        };
        self.check("hipMemcpyAsync", code)?;
        self.synchronize()
    }

    fn read(&self, buf: &HipBuffer) -> Result<Vec<u8>> {
        let mut out = vec![0u8; buf.len];
        if buf.len == 0 {
            return Ok(out);
        }
        // SAFETY: out holds buf.len bytes and outlives the synchronize below.
        let code = unsafe {
            (self.api.memcpy_async)(
                out.as_mut_ptr() as *mut c_void,
                buf.ptr as *const c_void,
                buf.len,
                ffi::MEMCPY_D2H,
                self.stream.0,
            )
        };
        self.check("hipMemcpyAsync", code)?;
        self.synchronize()?;
        Ok(out)
    }

    fn fused_save_compress_norm(&self, args: CompressArgs<'_, HipBuffer>) -> Result<()> {
        // SAFETY: HipBuffers are live allocations of this device, borrowed
        // by args for the call; the stream is ours.
        unsafe { self.compress_on(&args, self.stream.0) }
    }

    fn rope_quant_insert(&self, args: InsertArgs<'_, HipBuffer>) -> Result<()> {
        // SAFETY: as above.
        unsafe { self.insert_on(&args, self.stream.0) }
    }

    fn save_ring_rows(&self, args: RingArgs<'_, HipBuffer>) -> Result<()> {
        // SAFETY: as above.
        unsafe { self.ring_rows_on(&args, self.stream.0) }
    }

    fn fused_compress_insert(&self, args: FusedArgs<'_, HipBuffer>) -> Result<()> {
        // SAFETY: as above.
        unsafe { self.fused_on(&args, self.stream.0) }
    }

    fn take_skip_counts(&self) -> Result<SkipCounts> {
        let c = self.read_counters()?;
        Ok(SkipCounts {
            slot_out_of_range: c[0] as u64,
            position_out_of_range: c[1] as u64,
            index_out_of_range: c[2] as u64,
        })
    }

    fn synchronize(&self) -> Result<()> {
        // SAFETY: the stream is live.
        self.check("hipStreamSynchronize", unsafe {
            (self.api.stream_synchronize)(self.stream.0)
        })
    }
}

/// What HIP runtime and devices this process can use, one line each, or why
/// none (an [`Error::Unavailable`]), for `dsv4-kvcache info`.
pub fn probe() -> std::result::Result<String, Error> {
    let api = init_runtime()?;
    let count = device_count(&api)?;
    let runtime = version(api.runtime_get_version).unwrap_or_else(|| "?".into());
    let driver = version(api.driver_get_version).unwrap_or_else(|| "?".into());
    if count == 0 {
        return Err(unavailable(format!(
            "the HIP runtime {runtime} ({}) sees no AMD GPU",
            api.path
        )));
    }
    let policy = SanitizePolicy::from_env();
    let mut out = format!(
        "HIP runtime {runtime} (driver {driver}) from {}, {count} device(s); embedded code objects: {}",
        api.path,
        if crate::kernels::hip_targets().is_empty() {
            "none".to_string()
        } else {
            crate::kernels::hip_targets().join(", ")
        }
    );
    for d in 0..count {
        let ordinal = d as c_int;
        let name =
            device_name(&api, ordinal).unwrap_or_else(|e| format!("(name unavailable: {e})"));
        let mem = total_mem(&api, ordinal).map_or(String::new(), |b| format!(", {} GiB", b >> 30));
        let line = match device_arch(&api, ordinal) {
            Err(e) => format!("hip:{d} {name}{mem}: {e}"),
            Ok(arch) => {
                let target = match arch.code_object_target() {
                    Ok(t) => format!("code object {t}"),
                    Err(Error::Unavailable { reason, .. }) => format!("NOT USABLE: {reason}"),
                    Err(e) => format!("NOT USABLE: {e}"),
                };
                let sanitize = match &policy {
                    Ok(p) => format!(
                        "sanitize {} (policy {p})",
                        if sanitize_for(&arch, *p) { "on" } else { "off" }
                    ),
                    Err(e) => format!("sanitize policy invalid: {e}"),
                };
                format!("hip:{d} {name}, {arch}{mem}, {target}, {sanitize}")
            }
        };
        out.push_str("\n  ");
        out.push_str(&line);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_decode() {
        unsafe extern "C" fn v(out: *mut c_int) -> HipError {
            *out = 60_443_483;
            HIP_SUCCESS
        }
        assert_eq!(version(Some(v)).as_deref(), Some("6.4.43483"));
        assert_eq!(version(None), None);
    }
}
