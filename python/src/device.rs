//! Every call into a backend lives here: the CPU backend over the tensors'
//! own host memory, the CUDA backend on torch's current stream, and the HIP
//! backend on a ROCm build of torch. Backends are created once per device
//! (loading the kernels, allocating the skip counters) and kept; nothing
//! else is cached across calls, so launches can be captured in graphs.

use crate::tensor::{map_err, Dev, Torch, View};
use dsv4_kvcache::backend::cpu::RawHost;
#[cfg(any(feature = "cuda", feature = "hip"))]
use dsv4_kvcache::backend::RawStream;
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
trait Mem: dsv4_kvcache::tensor::Storage + Sized {
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
struct Kept<B> {
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
    use std::sync::Mutex;

    /// One vendor's backends by device index.
    pub type Backends<D> = Mutex<Vec<Option<Kept<GpuBackend<D>>>>>;

    /// Runs `f` on device `index`'s backend (opened with `open` at its first
    /// use) with sanitizing set for this call; the lock serializes calls.
    pub fn with<D: Driver, R>(
        backends: &Backends<D>,
        index: i32,
        sanitize: Option<bool>,
        open: fn(usize) -> dsv4_kvcache::Result<GpuBackend<D>>,
        f: impl FnOnce(&GpuBackend<D>) -> dsv4_kvcache::Result<R>,
    ) -> PyResult<R> {
        let i = usize::try_from(index)
            .map_err(|_| PyRuntimeError::new_err(format!("bad GPU device index {index}")))?;
        let mut g = backends.lock().unwrap_or_else(|e| e.into_inner());
        if g.len() <= i {
            g.resize_with(i + 1, || None);
        }
        if g[i].is_none() {
            let backend = open(i).map_err(map_err)?;
            // The backend starts with the device's automatic setting.
            let auto_sanitize = backend.sanitize();
            g[i] = Some(Kept {
                backend,
                auto_sanitize,
            });
        }
        let k = g[i].as_mut().expect("just set");
        let s = sanitize.unwrap_or(k.auto_sanitize);
        if k.backend.sanitize() != s {
            k.backend.set_sanitize(s);
        }
        f(&k.backend).map_err(map_err)
    }

    /// The skip counts of device `index`'s backend, if it was created.
    pub fn take_skip_counts<D: Driver>(
        backends: &Backends<D>,
        index: usize,
    ) -> Option<PyResult<SkipCounts>> {
        let g = backends.lock().unwrap_or_else(|e| e.into_inner());
        let k = g.get(index)?.as_ref()?;
        Some(k.backend.take_skip_counts().map_err(map_err))
    }
}

#[cfg(feature = "cuda")]
mod cuda {
    use super::*;
    use dsv4_kvcache::backend::cuda::CudaDriver;
    use dsv4_kvcache::CudaBackend;

    pub static BACKENDS: gpus::Backends<CudaDriver> = std::sync::Mutex::new(Vec::new());

    /// [`gpus::with`] for CUDA device `index`.
    pub fn with<R>(
        index: i32,
        sanitize: Option<bool>,
        f: impl FnOnce(&CudaBackend) -> dsv4_kvcache::Result<R>,
    ) -> PyResult<R> {
        use cudarc::driver::result::ctx;
        let before = ctx::get_current().ok().flatten();
        let r = gpus::with(&BACKENDS, index, sanitize, CudaBackend::new, f);
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

    /// [`gpus::with`] for HIP device `index`.
    pub fn with<R>(
        index: i32,
        sanitize: Option<bool>,
        f: impl FnOnce(&HipBackend) -> dsv4_kvcache::Result<R>,
    ) -> PyResult<R> {
        gpus::with(&BACKENDS, index, sanitize, HipBackend::new, f)
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

// ---- the four operations ---------------------------------------------------------

/// `rope_quant_insert` on the tensors' device.
pub fn rope_quant_insert(
    py: Python<'_>,
    t: &Torch,
    dev: Dev,
    v: &InsertViews,
    sanitize: Option<bool>,
) -> PyResult<()> {
    match dev {
        Dev::Cpu => {
            let k = cpu()?;
            let mut m = insert_mems::<RawHost>(v);
            let a = insert_args(v, &mut m);
            // SAFETY: the views are torch tensors' memory, valid for `len`
            // bytes (their storage); the GIL is held, so no Python code
            // touches them during the call.
            unsafe {
                k.backend
                    .rope_quant_insert_host(&a, sanitize.unwrap_or(k.auto_sanitize))
            }
            .map_err(map_err)
        }
        Dev::Cuda(index) => match gpu(py, t, index)? {
            #[cfg(feature = "cuda")]
            Gpu::Cuda(i, stream) => cuda::with(i, sanitize, |b| {
                let mut m = insert_mems(v);
                let a = insert_args(v, &mut m);
                // SAFETY: device memory of torch's tensors on this device
                // (primary context), ordered on torch's current stream.
                unsafe { b.rope_quant_insert_raw(&a, RawStream(stream as usize), None) }
            }),
            #[cfg(feature = "hip")]
            Gpu::Hip(i, stream) => hip::with(i, sanitize, |b| {
                let mut m = insert_mems(v);
                let a = insert_args(v, &mut m);
                // SAFETY: as above, on torch's current HIP stream.
                unsafe { b.rope_quant_insert_raw(&a, RawStream(stream as usize), None) }
            }),
        },
    }
}

/// `fused_save_compress_norm` on the tensors' device.
pub fn fused_save_compress_norm(
    py: Python<'_>,
    t: &Torch,
    dev: Dev,
    v: &CompressViews,
) -> PyResult<()> {
    match dev {
        Dev::Cpu => {
            let k = cpu()?;
            let mut m = compress_mems::<RawHost>(v);
            let a = compress_args(v, &mut m);
            // SAFETY: as in `rope_quant_insert`.
            unsafe { k.backend.fused_save_compress_norm_host(&a) }.map_err(map_err)
        }
        Dev::Cuda(index) => match gpu(py, t, index)? {
            #[cfg(feature = "cuda")]
            Gpu::Cuda(i, stream) => cuda::with(i, None, |b| {
                let mut m = compress_mems(v);
                let a = compress_args(v, &mut m);
                // SAFETY: as in `rope_quant_insert`.
                unsafe { b.fused_save_compress_norm_raw(&a, RawStream(stream as usize), None) }
            }),
            #[cfg(feature = "hip")]
            Gpu::Hip(i, stream) => hip::with(i, None, |b| {
                let mut m = compress_mems(v);
                let a = compress_args(v, &mut m);
                // SAFETY: as in `rope_quant_insert`.
                unsafe { b.fused_save_compress_norm_raw(&a, RawStream(stream as usize), None) }
            }),
        },
    }
}

/// `save_ring_rows` on the tensors' device.
pub fn save_ring_rows(py: Python<'_>, t: &Torch, dev: Dev, v: &RingViews) -> PyResult<()> {
    match dev {
        Dev::Cpu => {
            let k = cpu()?;
            let mut m = Mems::<RawHost, 3>::new(ring_list(v));
            let a = ring_args(v, &mut m);
            // SAFETY: as in `rope_quant_insert`.
            unsafe { k.backend.save_ring_rows_host(&a) }.map_err(map_err)
        }
        Dev::Cuda(index) => match gpu(py, t, index)? {
            #[cfg(feature = "cuda")]
            Gpu::Cuda(i, stream) => cuda::with(i, None, |b| {
                let mut m = Mems::new(ring_list(v));
                let a = ring_args(v, &mut m);
                // SAFETY: as in `rope_quant_insert`.
                unsafe { b.save_ring_rows_raw(&a, RawStream(stream as usize), None) }
            }),
            #[cfg(feature = "hip")]
            Gpu::Hip(i, stream) => hip::with(i, None, |b| {
                let mut m = Mems::new(ring_list(v));
                let a = ring_args(v, &mut m);
                // SAFETY: as in `rope_quant_insert`.
                unsafe { b.save_ring_rows_raw(&a, RawStream(stream as usize), None) }
            }),
        },
    }
}

/// The fused compress + insert on the tensors' device.
pub fn fused_compress_insert(
    py: Python<'_>,
    t: &Torch,
    dev: Dev,
    v: &FusedViews,
    sanitize: Option<bool>,
) -> PyResult<()> {
    match dev {
        Dev::Cpu => {
            let k = cpu()?;
            let (mut c, mut m) = fused_mems::<RawHost>(v);
            let a = fused_args(v, &mut c, &mut m);
            // SAFETY: as in `rope_quant_insert`.
            unsafe {
                k.backend
                    .fused_compress_insert_host(&a, sanitize.unwrap_or(k.auto_sanitize))
            }
            .map_err(map_err)
        }
        Dev::Cuda(index) => match gpu(py, t, index)? {
            #[cfg(feature = "cuda")]
            Gpu::Cuda(i, stream) => cuda::with(i, sanitize, |b| {
                let (mut c, mut m) = fused_mems(v);
                let a = fused_args(v, &mut c, &mut m);
                // SAFETY: as in `rope_quant_insert`.
                unsafe { b.fused_compress_insert_raw(&a, RawStream(stream as usize), None) }
            }),
            #[cfg(feature = "hip")]
            Gpu::Hip(i, stream) => hip::with(i, sanitize, |b| {
                let (mut c, mut m) = fused_mems(v);
                let a = fused_args(v, &mut c, &mut m);
                // SAFETY: as in `rope_quant_insert`.
                unsafe { b.fused_compress_insert_raw(&a, RawStream(stream as usize), None) }
            }),
        },
    }
}

/// `gather_dequant` on the tensors' device.
pub fn gather_dequant(py: Python<'_>, t: &Torch, dev: Dev, v: &GatherViews) -> PyResult<()> {
    match dev {
        Dev::Cpu => {
            let k = cpu()?;
            let mut m = gather_mems::<RawHost>(v);
            let a = gather_args(v, &mut m);
            // SAFETY: as in `rope_quant_insert`.
            unsafe { k.backend.gather_dequant_host(&a) }.map_err(map_err)
        }
        Dev::Cuda(index) => match gpu(py, t, index)? {
            #[cfg(feature = "cuda")]
            Gpu::Cuda(i, stream) => cuda::with(i, None, |b| {
                let mut m = gather_mems(v);
                let a = gather_args(v, &mut m);
                // SAFETY: as in `rope_quant_insert`.
                unsafe { b.gather_dequant_raw(&a, RawStream(stream as usize), None) }
            }),
            #[cfg(feature = "hip")]
            Gpu::Hip(i, stream) => hip::with(i, None, |b| {
                let mut m = gather_mems(v);
                let a = gather_args(v, &mut m);
                // SAFETY: as in `rope_quant_insert`.
                unsafe { b.gather_dequant_raw(&a, RawStream(stream as usize), None) }
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
            Gpu::Cuda(i, _) => cuda::with(i, None, |b| Ok(b.name())),
            #[cfg(feature = "hip")]
            Gpu::Hip(i, _) => hip::with(i, None, |b| Ok(b.name())),
        },
    }
}
