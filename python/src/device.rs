//! Every call into a backend lives here: the CPU backend over the tensors'
//! own host memory, the CUDA backend on torch's current stream, and the HIP
//! backend on a ROCm build of torch. Backends are created once per device
//! (loading the kernels, allocating the skip counters) and kept; nothing
//! else is cached across calls, so launches can be captured in graphs.

use crate::tensor::{map_err, Dev, Torch, View};
use dsv4_kvcache::backend::cpu::RawHost;
#[cfg(any(feature = "cuda", feature = "hip"))]
use dsv4_kvcache::backend::{RawDevice, RawStream};
use dsv4_kvcache::detect::SanitizePolicy;
use dsv4_kvcache::{
    Backend, CompressArgs, CpuBackend, FusedArgs, GatherArgs, GatherIndex, InsertArgs, RingArgs,
    SkipCounts, Tensor, TensorMut,
};
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use std::sync::OnceLock;

// ---- the arguments of each op, as read from Python ---------------------------

/// `rope_quant_insert`'s tensors.
pub struct InsertViews {
    pub latent: View,
    pub positions: View,
    pub cos_sin_cache: View,
    pub kv_cache: View,
    pub slot_mapping: View,
    pub fp8_scale: Option<View>,
    pub compress_ratio: u32,
}

/// `fused_save_compress_norm`'s tensors.
pub struct CompressViews {
    pub kv_score: View,
    pub positions: View,
    pub state_cache: Option<View>,
    pub slot_mapping: View,
    pub query_start_loc: Option<View>,
    pub token_to_req_indices: Option<View>,
    pub rms_norm_weight: View,
    pub rms_norm_eps: f32,
    pub compress_ratio: u32,
    pub latent_out: View,
    pub prev_rows: Option<View>,
    pub prev_row_indices: Option<View>,
}

/// `save_ring_rows`'s tensors.
pub struct RingViews {
    pub rows: View,
    pub slot_mapping: View,
    pub state_cache: View,
}

/// The fused launch's tensors.
pub struct FusedViews {
    pub compress: CompressViews,
    pub skip_latent_out: bool,
    pub cos_sin_cache: View,
    pub kv_cache: View,
    pub cache_slot_mapping: View,
    pub fp8_scale: Option<View>,
}

/// `gather_dequant`'s tensors: the slot form (`slot_mapping`) or the
/// block-table form (`block_table`, `cu_seq_lens`, optional `seq_starts`).
pub struct GatherViews {
    pub kv_cache: View,
    pub slot_mapping: Option<View>,
    pub block_table: Option<View>,
    pub cu_seq_lens: Option<View>,
    pub seq_starts: Option<View>,
    pub fp8_scale: Option<View>,
    pub out: View,
}

/// Caller memory as one backend's raw storage type.
pub(crate) trait Mem: dsv4_kvcache::tensor::Storage + Sized {
    fn of(v: &View) -> Self;
}

impl Mem for RawHost {
    fn of(v: &View) -> Self {
        RawHost {
            ptr: v.ptr as *mut u8,
            len: v.len,
        }
    }
}

#[cfg(any(feature = "cuda", feature = "hip"))]
impl Mem for dsv4_kvcache::backend::RawDevice {
    fn of(v: &View) -> Self {
        dsv4_kvcache::backend::RawDevice::new(v.ptr, v.len)
    }
}

/// Storage for every tensor of a call (`None` for absent optionals).
struct Mems<M, const N: usize>([Option<M>; N]);

impl<M: Mem, const N: usize> Mems<M, N> {
    fn new(v: [Option<&View>; N]) -> Self {
        Mems(v.map(|v| v.map(M::of)))
    }
}

fn ro<'a, M>(m: &'a Option<M>, v: &View) -> Tensor<'a, M> {
    Tensor::new(m.as_ref().expect("present"), v.desc)
}

fn ro_opt<'a, M>(m: &'a Option<M>, v: &Option<View>) -> Option<Tensor<'a, M>> {
    m.as_ref()
        .zip(v.as_ref())
        .map(|(m, v)| Tensor::new(m, v.desc))
}

fn rw<'a, M>(m: &'a mut Option<M>, v: &View) -> TensorMut<'a, M> {
    TensorMut::new(m.as_mut().expect("present"), v.desc)
}

fn rw_opt<'a, M>(m: &'a mut Option<M>, v: &Option<View>) -> Option<TensorMut<'a, M>> {
    m.as_mut()
        .zip(v.as_ref())
        .map(|(m, v)| TensorMut::new(m, v.desc))
}

fn insert_mems<M: Mem>(v: &InsertViews) -> Mems<M, 6> {
    Mems::new([
        Some(&v.latent),
        Some(&v.positions),
        Some(&v.cos_sin_cache),
        Some(&v.kv_cache),
        Some(&v.slot_mapping),
        v.fp8_scale.as_ref(),
    ])
}

fn insert_args<'a, M>(v: &InsertViews, m: &'a mut Mems<M, 6>) -> InsertArgs<'a, M> {
    let [a, b, c, d, e, f] = &mut m.0;
    InsertArgs {
        latent: ro(a, &v.latent),
        positions: ro(b, &v.positions),
        cos_sin_cache: ro(c, &v.cos_sin_cache),
        kv_cache: rw(d, &v.kv_cache),
        slot_mapping: ro(e, &v.slot_mapping),
        compress_ratio: v.compress_ratio,
        fp8_scale: ro_opt(f, &v.fp8_scale),
    }
}

fn compress_mems<M: Mem>(v: &CompressViews) -> Mems<M, 10> {
    Mems::new([
        Some(&v.kv_score),
        Some(&v.positions),
        v.state_cache.as_ref(),
        Some(&v.slot_mapping),
        v.query_start_loc.as_ref(),
        v.token_to_req_indices.as_ref(),
        Some(&v.rms_norm_weight),
        Some(&v.latent_out),
        v.prev_rows.as_ref(),
        v.prev_row_indices.as_ref(),
    ])
}

fn compress_args<'a, M>(v: &CompressViews, m: &'a mut Mems<M, 10>) -> CompressArgs<'a, M> {
    let [a, b, c, d, e, f, g, h, i, j] = &mut m.0;
    CompressArgs {
        kv_score: ro(a, &v.kv_score),
        positions: ro(b, &v.positions),
        state_cache: rw_opt(c, &v.state_cache),
        slot_mapping: ro(d, &v.slot_mapping),
        query_start_loc: ro_opt(e, &v.query_start_loc),
        token_to_req_indices: ro_opt(f, &v.token_to_req_indices),
        rms_norm_weight: ro(g, &v.rms_norm_weight),
        rms_norm_eps: v.rms_norm_eps,
        compress_ratio: v.compress_ratio,
        latent_out: rw(h, &v.latent_out),
        prev_rows: ro_opt(i, &v.prev_rows),
        prev_row_indices: ro_opt(j, &v.prev_row_indices),
    }
}

fn ring_list(v: &RingViews) -> [Option<&View>; 3] {
    [Some(&v.rows), Some(&v.slot_mapping), Some(&v.state_cache)]
}

fn ring_args<'a, M>(v: &RingViews, m: &'a mut Mems<M, 3>) -> RingArgs<'a, M> {
    let [a, b, c] = &mut m.0;
    RingArgs {
        rows: ro(a, &v.rows),
        slot_mapping: ro(b, &v.slot_mapping),
        state_cache: rw(c, &v.state_cache),
    }
}

fn fused_args<'a, M>(
    v: &FusedViews,
    c: &'a mut Mems<M, 10>,
    m: &'a mut Mems<M, 4>,
) -> FusedArgs<'a, M> {
    let [a, b, d, e] = &mut m.0;
    FusedArgs {
        compress: compress_args(&v.compress, c),
        skip_latent_out: v.skip_latent_out,
        cos_sin_cache: ro(a, &v.cos_sin_cache),
        kv_cache: rw(b, &v.kv_cache),
        cache_slot_mapping: ro(d, &v.cache_slot_mapping),
        fp8_scale: ro_opt(e, &v.fp8_scale),
    }
}

fn fused_mems<M: Mem>(v: &FusedViews) -> (Mems<M, 10>, Mems<M, 4>) {
    (
        compress_mems(&v.compress),
        Mems::new([
            Some(&v.cos_sin_cache),
            Some(&v.kv_cache),
            Some(&v.cache_slot_mapping),
            v.fp8_scale.as_ref(),
        ]),
    )
}

// ---- backends ------------------------------------------------------------------

/// A backend kept per device, with the sanitize setting its device gets
/// when the caller does not choose (auto: on for gfx950 only, or what
/// `DSV4_KVCACHE_SANITIZE` says).
pub(crate) struct Kept<B> {
    backend: B,
    auto_sanitize: bool,
}

fn gather_mems<M: Mem>(v: &GatherViews) -> Mems<M, 7> {
    Mems::new([
        Some(&v.kv_cache),
        v.slot_mapping.as_ref(),
        v.block_table.as_ref(),
        v.cu_seq_lens.as_ref(),
        v.seq_starts.as_ref(),
        v.fp8_scale.as_ref(),
        Some(&v.out),
    ])
}

/// The arguments; the caller (`lib.rs`) checked that exactly one
/// addressing form is given.
fn gather_args<'a, M>(v: &GatherViews, m: &'a mut Mems<M, 7>) -> GatherArgs<'a, M> {
    let [a, b, c, d, e, f, g] = &mut m.0;
    let index = match &v.slot_mapping {
        Some(s) => GatherIndex::Slots {
            slot_mapping: ro(b, s),
        },
        None => GatherIndex::BlockTable {
            block_table: ro(c, v.block_table.as_ref().expect("checked")),
            cu_seq_lens: ro(d, v.cu_seq_lens.as_ref().expect("checked")),
            seq_starts: ro_opt(e, &v.seq_starts),
        },
    };
    GatherArgs {
        kv_cache: ro(a, &v.kv_cache),
        index,
        fp8_scale: ro_opt(f, &v.fp8_scale),
        out: rw(g, &v.out),
    }
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

    // SAFETY (all methods): the caller's contract, forwarded; the counters
    // are the backend's own.
    impl<D: Driver> Target for OnStream<'_, D> {
        type Mem = RawDevice;
        unsafe fn insert(&self, a: &InsertArgs<'_, RawDevice>, s: bool) -> Res {
            self.0.rope_quant_insert_raw(a, self.1, None, s)
        }
        unsafe fn compress(&self, a: &CompressArgs<'_, RawDevice>) -> Res {
            self.0.fused_save_compress_norm_raw(a, self.1, None)
        }
        unsafe fn ring(&self, a: &RingArgs<'_, RawDevice>) -> Res {
            self.0.save_ring_rows_raw(a, self.1, None)
        }
        unsafe fn fused(&self, a: &FusedArgs<'_, RawDevice>, s: bool) -> Res {
            self.0.fused_compress_insert_raw(a, self.1, None, s)
        }
        unsafe fn gather(&self, a: &GatherArgs<'_, RawDevice>) -> Res {
            self.0.gather_dequant_raw(a, self.1, None)
        }
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
        let r = gpus::get(&BACKENDS, index, CudaBackend::new)
            .and_then(|k| f(&k.backend, k.auto_sanitize).map_err(map_err));
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

#[cfg(feature = "hip")]
mod hip {
    use super::*;
    use dsv4_kvcache::backend::hip::HipDriver;
    use dsv4_kvcache::HipBackend;

    pub static BACKENDS: gpus::Backends<HipDriver> = std::sync::Mutex::new(Vec::new());

    /// Runs `f` on HIP device `index`'s backend with its automatic sanitize
    /// setting.
    pub fn with<R>(
        index: i32,
        f: impl FnOnce(&HipBackend, bool) -> dsv4_kvcache::Result<R>,
    ) -> PyResult<R> {
        gpus::get(&BACKENDS, index, HipBackend::new)
            .and_then(|k| f(&k.backend, k.auto_sanitize).map_err(map_err))
    }
}

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

// ---- the operations, dispatched once ---------------------------------------------

type Res = dsv4_kvcache::Result<()>;

/// A backend's way to run the five operations over caller memory: the CPU
/// on host pointers, a GPU on one stream. Sanitize is each call's argument.
pub(crate) trait Target {
    /// The caller-memory type its entry points take.
    type Mem: Mem;
    /// # Safety
    /// The views are live memory of this target's device, as the backend's
    /// `*_raw` / `*_host` contracts state.
    unsafe fn insert(&self, a: &InsertArgs<'_, Self::Mem>, sanitize: bool) -> Res;
    /// # Safety
    /// As for [`Target::insert`].
    unsafe fn compress(&self, a: &CompressArgs<'_, Self::Mem>) -> Res;
    /// # Safety
    /// As for [`Target::insert`].
    unsafe fn ring(&self, a: &RingArgs<'_, Self::Mem>) -> Res;
    /// # Safety
    /// As for [`Target::insert`].
    unsafe fn fused(&self, a: &FusedArgs<'_, Self::Mem>, sanitize: bool) -> Res;
    /// # Safety
    /// As for [`Target::insert`].
    unsafe fn gather(&self, a: &GatherArgs<'_, Self::Mem>) -> Res;
}

/// The CPU backend over the tensors' own host memory.
struct Host<'a>(&'a CpuBackend);

// SAFETY (all methods): the caller's contract, forwarded.
impl Target for Host<'_> {
    type Mem = RawHost;
    unsafe fn insert(&self, a: &InsertArgs<'_, RawHost>, s: bool) -> Res {
        self.0.rope_quant_insert_host(a, s)
    }
    unsafe fn compress(&self, a: &CompressArgs<'_, RawHost>) -> Res {
        self.0.fused_save_compress_norm_host(a)
    }
    unsafe fn ring(&self, a: &RingArgs<'_, RawHost>) -> Res {
        self.0.save_ring_rows_host(a)
    }
    unsafe fn fused(&self, a: &FusedArgs<'_, RawHost>, s: bool) -> Res {
        self.0.fused_compress_insert_host(a, s)
    }
    unsafe fn gather(&self, a: &GatherArgs<'_, RawHost>) -> Res {
        self.0.gather_dequant_host(a)
    }
}

/// An operation's tensors as read from Python, run on any [`Target`].
pub(crate) trait Op: Sync {
    /// Binds the views as `T::Mem` and runs the operation.
    ///
    /// # Safety
    /// The views are live memory of `t`'s device.
    unsafe fn run_on<T: Target>(&self, t: &T, sanitize: bool) -> Res;
}

impl Op for InsertViews {
    unsafe fn run_on<T: Target>(&self, t: &T, sanitize: bool) -> Res {
        let mut m = insert_mems::<T::Mem>(self);
        t.insert(&insert_args(self, &mut m), sanitize)
    }
}

impl Op for CompressViews {
    unsafe fn run_on<T: Target>(&self, t: &T, _sanitize: bool) -> Res {
        let mut m = compress_mems::<T::Mem>(self);
        t.compress(&compress_args(self, &mut m))
    }
}

impl Op for RingViews {
    unsafe fn run_on<T: Target>(&self, t: &T, _sanitize: bool) -> Res {
        let mut m = Mems::<T::Mem, 3>::new(ring_list(self));
        t.ring(&ring_args(self, &mut m))
    }
}

impl Op for FusedViews {
    unsafe fn run_on<T: Target>(&self, t: &T, sanitize: bool) -> Res {
        let (mut c, mut m) = fused_mems::<T::Mem>(self);
        t.fused(&fused_args(self, &mut c, &mut m), sanitize)
    }
}

impl Op for GatherViews {
    unsafe fn run_on<T: Target>(&self, t: &T, _sanitize: bool) -> Res {
        let mut m = gather_mems::<T::Mem>(self);
        t.gather(&gather_args(self, &mut m))
    }
}

/// Runs `op` on the tensors' device: the one place that chooses between the
/// CPU, CUDA and HIP. `sanitize`: NaN sanitizing for this call, `None` = the
/// device's default. The GIL is released while the backend works (it reads
/// only the views' addresses, never a Python object).
pub(crate) fn run(
    py: Python<'_>,
    t: &Torch,
    dev: Dev,
    op: &impl Op,
    sanitize: Option<bool>,
) -> PyResult<()> {
    match dev {
        Dev::Cpu => {
            let k = cpu()?;
            let s = sanitize.unwrap_or(k.auto_sanitize);
            // SAFETY: the views are torch tensors' memory, valid for `len`
            // bytes (their storage), which the caller keeps alive for the
            // call; as with torch's own ops, other threads must not write
            // them meanwhile.
            py.detach(|| unsafe { op.run_on(&Host(&k.backend), s) })
                .map_err(map_err)
        }
        Dev::Cuda(index) => match gpu(py, t, index)? {
            #[cfg(feature = "cuda")]
            Gpu::Cuda(i, stream) => py.detach(|| {
                cuda::with(i, |b, auto| {
                    let on = gpus::OnStream(b, RawStream(stream as usize));
                    // SAFETY: device memory of torch's tensors on this device
                    // (primary context), ordered on torch's current stream.
                    unsafe { op.run_on(&on, sanitize.unwrap_or(auto)) }
                })
            }),
            #[cfg(feature = "hip")]
            Gpu::Hip(i, stream) => py.detach(|| {
                hip::with(i, |b, auto| {
                    let on = gpus::OnStream(b, RawStream(stream as usize));
                    // SAFETY: as above, on torch's current HIP stream.
                    unsafe { op.run_on(&on, sanitize.unwrap_or(auto)) }
                })
            }),
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
            if let Some(c) = gpus::take_skip_counts(&hip::BACKENDS, i) {
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
            Gpu::Hip(i, _) => hip::with(i, |b, _| Ok(b.name())),
        },
    }
}
