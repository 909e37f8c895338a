//! Every call into a backend lives here: the CPU backend over the tensors'
//! own host memory, the CUDA backend on torch's current stream, and the HIP
//! backend on a ROCm build of torch. Backends are created once per device
//! (loading the kernels, allocating the skip counters) and kept; nothing
//! else is cached across calls, so launches can be captured in graphs.

use crate::bind::{Call, Launch, Target};
use crate::tensor::{map_err, Dev, Torch};
use dsv4_kvcache::backend::cpu::RawHost;
#[cfg(any(feature = "cuda", feature = "hip"))]
use dsv4_kvcache::backend::{RawDevice, RawStream};
use dsv4_kvcache::detect::SanitizePolicy;
use dsv4_kvcache::{Backend, CpuBackend, SkipCounts};
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use std::sync::OnceLock;

type Res = dsv4_kvcache::Result<()>;

// ---- backends ------------------------------------------------------------------

/// A backend kept per device, with the sanitize setting its device gets
/// when the caller does not choose (auto: on for gfx950 only, or what
/// `DSV4_KVCACHE_SANITIZE` says).
pub(crate) struct Kept<B> {
    backend: B,
    auto_sanitize: bool,
}

fn env_policy() -> PyResult<SanitizePolicy> {
    SanitizePolicy::from_env().map_err(map_err)
}

static CPU: OnceLock<Kept<CpuBackend>> = OnceLock::new();

fn cpu() -> PyResult<&'static Kept<CpuBackend>> {
    if let Some(k) = CPU.get() {
        return Ok(k);
    }
    let auto_sanitize = env_policy()? == SanitizePolicy::On;
    Ok(CPU.get_or_init(|| Kept {
        backend: CpuBackend::new(),
        auto_sanitize,
    }))
}

/// The backends of one GPU vendor, one per device, each created at its
/// first use and kept (creating one loads the kernels).
#[cfg(any(feature = "cuda", feature = "hip"))]
mod gpus {
    use super::*;
    use dsv4_kvcache::backend::gpu::{Driver, GpuBackend};
    use std::sync::{Arc, Mutex};

    /// One vendor's backends by device index.
    pub type Backends<D> = Mutex<Vec<Option<Arc<Kept<GpuBackend<D>>>>>>;

    /// Device `index`'s backend, opened with `open` at its first use. The
    /// lock covers only the lookup: launches on a kept backend share it
    /// (sanitize is each call's argument, not the backend's state).
    pub fn get<D: Driver>(
        backends: &Backends<D>,
        index: i32,
        open: fn(usize) -> dsv4_kvcache::Result<GpuBackend<D>>,
    ) -> PyResult<Arc<Kept<GpuBackend<D>>>> {
        let i = usize::try_from(index)
            .map_err(|_| PyRuntimeError::new_err(format!("bad GPU device index {index}")))?;
        let mut g = backends.lock().unwrap_or_else(|e| e.into_inner());
        if g.len() <= i {
            g.resize_with(i + 1, || None);
        }
        if g[i].is_none() {
            let backend = open(i).map_err(map_err)?;
            // The device's automatic setting (on for gfx950 only, or what
            // `DSV4_KVCACHE_SANITIZE` says).
            let auto_sanitize = backend.sanitize();
            g[i] = Some(Arc::new(Kept {
                backend,
                auto_sanitize,
            }));
        }
        Ok(g[i].clone().expect("just set"))
    }

    /// Runs `f` on device `index`'s backend (opened with `open` at its
    /// first use) with its automatic sanitize setting.
    pub fn with<D: Driver, R>(
        backends: &Backends<D>,
        index: i32,
        open: fn(usize) -> dsv4_kvcache::Result<GpuBackend<D>>,
        f: impl FnOnce(&GpuBackend<D>, bool) -> dsv4_kvcache::Result<R>,
    ) -> PyResult<R> {
        get(backends, index, open).and_then(|k| f(&k.backend, k.auto_sanitize).map_err(map_err))
    }

    /// The skip counts of device `index`'s backend, if it was created.
    pub fn take_skip_counts<D: Driver>(
        backends: &Backends<D>,
        index: usize,
    ) -> Option<PyResult<SkipCounts>> {
        let k = backends
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(index)?
            .clone()?;
        Some(k.backend.take_skip_counts().map_err(map_err))
    }

    /// One backend on one stream, as a [`Target`].
    pub struct OnStream<'a, D: Driver>(pub &'a GpuBackend<D>, pub RawStream);

    impl<D: Driver> Target for OnStream<'_, D> {
        type Mem = RawDevice;
        unsafe fn run<O: Launch>(&self, a: O::Args<'_, RawDevice>, sanitize: bool) -> Res {
            // SAFETY: the caller's contract, forwarded; the counters are
            // the backend's own.
            unsafe { O::raw(self.0, self.1, &a, sanitize) }
        }
    }

    /// Runs `call` on backend `b` on torch's `stream`, with `sanitize` or
    /// else the device's automatic setting `auto`.
    pub fn launch<O: Launch, D: Driver>(
        b: &GpuBackend<D>,
        auto: bool,
        stream: u64,
        call: &Call<O>,
        sanitize: Option<bool>,
    ) -> Res {
        let on = OnStream(b, RawStream(stream as usize));
        // SAFETY: device memory of torch's tensors on this device (primary
        // context), ordered on torch's current stream there.
        unsafe { call.run_on(&on, sanitize.unwrap_or(auto)) }
    }
}

#[cfg(feature = "cuda")]
mod cuda {
    use super::*;
    use dsv4_kvcache::backend::cuda::CudaDriver;
    use dsv4_kvcache::CudaBackend;

    pub static BACKENDS: gpus::Backends<CudaDriver> = std::sync::Mutex::new(Vec::new());

    /// Runs `f` on CUDA device `index`'s backend with its automatic sanitize
    /// setting, leaving the caller's current context as it was.
    pub fn with<R>(
        index: i32,
        f: impl FnOnce(&CudaBackend, bool) -> dsv4_kvcache::Result<R>,
    ) -> PyResult<R> {
        use cudarc::driver::result::ctx;
        let before = ctx::get_current().ok().flatten();
        let r = gpus::with(&BACKENDS, index, CudaBackend::new, f);
        // Creating the backend and launching make this device's primary
        // context current; torch's current device follows the current
        // context, so put back the one the caller had (a thread-local
        // switch, allowed during capture).
        if let Some(prev) = before {
            if ctx::get_current().ok().flatten() != Some(prev) {
                // SAFETY: `prev` was current on this thread a moment ago and
                // primary contexts stay alive while torch uses them.
                let _ = unsafe { ctx::set_current(prev) };
            }
        }
        r
    }
}

/// The HIP backends.
#[cfg(feature = "hip")]
static HIP: gpus::Backends<dsv4_kvcache::backend::hip::HipDriver> =
    std::sync::Mutex::new(Vec::new());

/// The GPU a "cuda" tensor lives on, and torch's current stream there.
enum Gpu {
    #[cfg(feature = "cuda")]
    Cuda(i32, u64),
    #[cfg(feature = "hip")]
    Hip(i32, u64),
}

fn gpu(py: Python<'_>, t: &Torch, index: i32) -> PyResult<Gpu> {
    let f = t.raw_stream.as_ref().ok_or_else(|| {
        PyRuntimeError::new_err("this torch has no torch._C._cuda_getCurrentRawStream")
    })?;
    let stream: u64 = crate::tensor::call_with(f, index.into_pyobject(py)?.as_any())?.extract()?;
    if t.is_hip {
        #[cfg(feature = "hip")]
        return Ok(Gpu::Hip(index, stream));
        #[cfg(not(feature = "hip"))]
        return Err(PyRuntimeError::new_err(
            "this build of dsv4_kvcache has no HIP backend (feature `hip`), and torch is a ROCm build",
        ));
    }
    #[cfg(feature = "cuda")]
    return Ok(Gpu::Cuda(index, stream));
    #[cfg(not(feature = "cuda"))]
    {
        let _ = stream;
        Err(PyRuntimeError::new_err(
            "this build of dsv4_kvcache has no CUDA backend (feature `cuda`)",
        ))
    }
}

/// The CPU backend over the tensors' own host memory.
struct Host<'a>(&'a CpuBackend);

impl Target for Host<'_> {
    type Mem = RawHost;
    unsafe fn run<O: Launch>(&self, a: O::Args<'_, RawHost>, sanitize: bool) -> Res {
        // SAFETY: the caller's contract, forwarded.
        unsafe { O::host(self.0, &a, sanitize) }
    }
}

/// Runs `call` on the tensors' device: the one place that chooses between
/// the CPU, CUDA and HIP (and, inside `_reference`, the reference).
/// `sanitize`: NaN sanitizing for this call, `None` = the device's default.
/// The GIL is released while the backend works (it reads only the views'
/// addresses, never a Python object).
pub(crate) fn run<O: Launch>(
    py: Python<'_>,
    t: &Torch,
    dev: Dev,
    call: &Call<O>,
    sanitize: Option<bool>,
) -> PyResult<()> {
    if crate::reference::active() {
        return crate::reference::run(py, call, sanitize.unwrap_or(false));
    }
    match dev {
        Dev::Cpu => {
            let k = cpu()?;
            let s = sanitize.unwrap_or(k.auto_sanitize);
            // SAFETY: the views are torch tensors' memory, valid for `len`
            // bytes (their storage), which the caller keeps alive for the
            // call; as with torch's own ops, other threads must not write
            // them meanwhile.
            py.detach(|| unsafe { call.run_on(&Host(&k.backend), s) })
                .map_err(map_err)
        }
        Dev::Cuda(index) => match gpu(py, t, index)? {
            #[cfg(feature = "cuda")]
            Gpu::Cuda(i, stream) => {
                py.detach(|| cuda::with(i, |b, auto| gpus::launch(b, auto, stream, call, sanitize)))
            }
            #[cfg(feature = "hip")]
            Gpu::Hip(i, stream) => {
                let open = dsv4_kvcache::HipBackend::new;
                py.detach(|| {
                    gpus::with(&HIP, i, open, |b, auto| {
                        gpus::launch(b, auto, stream, call, sanitize)
                    })
                })
            }
        },
    }
}

/// Takes (and resets) the skip counts of a device's backend; zeros when no
/// call ran there yet. The caller synchronizes the device first (GPU
/// launches run on torch's streams, the counts' read waits only for the
/// backend's own).
pub fn take_skip_counts(dev: Dev) -> PyResult<SkipCounts> {
    match dev {
        Dev::Cpu => cpu()?.backend.take_skip_counts().map_err(map_err),
        Dev::Cuda(index) => {
            let i = usize::try_from(index).unwrap_or(usize::MAX);
            #[cfg(feature = "cuda")]
            if let Some(c) = gpus::take_skip_counts(&cuda::BACKENDS, i) {
                return c;
            }
            #[cfg(feature = "hip")]
            if let Some(c) = gpus::take_skip_counts(&HIP, i) {
                return c;
            }
            let _ = i;
            Ok(SkipCounts::default())
        }
    }
}

/// Creates the backend of a device now (it loads kernels and allocates, so
/// it must not first happen inside a graph capture), and returns its name.
pub fn init(py: Python<'_>, t: &Torch, dev: Dev) -> PyResult<String> {
    match dev {
        Dev::Cpu => Ok(cpu()?.backend.name()),
        Dev::Cuda(index) => match gpu(py, t, index)? {
            #[cfg(feature = "cuda")]
            Gpu::Cuda(i, _) => cuda::with(i, |b, _| Ok(b.name())),
            #[cfg(feature = "hip")]
            Gpu::Hip(i, _) => {
                gpus::with(&HIP, i, dsv4_kvcache::HipBackend::new, |b, _| Ok(b.name()))
            }
        },
    }
}
