//! `dsv4_kvcache._native`: the seed's three functions and the fused launch
//! over PyTorch tensors, read through their Python attributes (no libtorch),
//! on the CPU backend (CPU tensors), the CUDA backend (CUDA tensors, torch's
//! current stream) or the HIP backend (ROCm builds of torch).
//!
//! The modules are layers, each using only those listed before it:
//!
//! 1. `dlpack`: the DLPack structs and torch's exchange API (C only).
//! 2. `tensor`: a tensor argument read as a view (address, dtype, shape,
//!    strides, device), and errors as Python exceptions.
//! 3. `bind`: one operation's call over views, bound as a target's memory
//!    and run through its entry point (the CPU's `*_host`, a GPU's
//!    `*_raw`, the safe API).
//! 4. `reference`: the CPU reference target (copies of the tensors) and
//!    `_reference`, which marks the calls it makes for it.
//! 5. `device`: the backends kept per device, and the one choice between
//!    them (CPU, CUDA, HIP or, inside `_reference`, the reference).
//! 6. `call`: the Python arguments of a function, put in its operation's
//!    order and handed to `device`.
//! 7. this file: the functions, each an operation's Python signature
//!    handed to `call`, and the module.

mod bind;
mod call;
mod device;
mod dlpack;
mod reference;
mod tensor;

use call::Given;
use dsv4_kvcache::ops::{CompressOp, FusedOp, GatherOp, IndexerKOp, InsertOp, RingOp};
use pyo3::prelude::*;
use tensor::{torch, Dev};

type Any<'py> = Bound<'py, PyAny>;

/// An operation's function: its signature, each argument handed to
/// [`Given`] under its own name, then the operation run.
macro_rules! op {
    ($op:ty, $(#[$m:meta])* fn $name:ident($($p:ident: $t:ty),* $(,)?)) => {
        #[pyfunction]
        $(#[$m])*
        #[allow(clippy::too_many_arguments)]
        fn $name(py: Python<'_>, $($p: $t),*) -> PyResult<()> {
            static ORDER: call::Order = call::Order::new();
            let mut g = Given::new(py)?;
            $(g.put(stringify!($p), $p)?;)*
            g.run::<$op>(&ORDER)
        }
    };
}

/// An operation whose parameters start with the compressor's ten (its
/// own function and the fused one), spliced before the rest.
macro_rules! compressor_op {
    ($op:ty, $(#[$m:meta])* fn $name:ident($($rest:tt)*)) => {
        op!($op, $(#[$m])* fn $name(
            kv_score: &Any<'_>,
            positions: &Any<'_>,
            state_cache: Option<&Any<'_>>,
            slot_mapping: &Any<'_>,
            query_start_loc: Option<&Any<'_>>,
            token_to_req_indices: Option<&Any<'_>>,
            rms_norm_weight: &Any<'_>,
            rms_norm_eps: f64,
            compress_ratio: i64,
            latent_out: &Any<'_>,
            $($rest)*
        ));
    };
}

compressor_op!(
    CompressOp,
    /// Pool each closed group into a normalized BF16 latent; save FP32 states
    /// (the seed's `fused_save_compress_norm`, same arguments and in-place
    /// semantics).
    #[pyo3(signature = (kv_score, positions, state_cache, slot_mapping, query_start_loc, token_to_req_indices, rms_norm_weight, rms_norm_eps, compress_ratio, latent_out, prev_rows=None, prev_row_indices=None))]
    fn fused_save_compress_norm(
        prev_rows: Option<&Any<'_>>,
        prev_row_indices: Option<&Any<'_>>,
    )
);

op!(
    InsertOp,
    /// Apply GPT-J RoPE and publish a latent to the compressed KV cache (the
    /// seed's `rope_quant_insert`; the layout follows the cache's dtype and last
    /// dimension). `sanitize`: NaN sanitizing, `None` = the device's default.
    /// `record_order`: where a 584/528/288 B record's scales go, `"planar"`
    /// (the seed's: a page's values, then its scales) or `"per_token"` (vLLM
    /// 0.34.0's: each record's scales right after its values).
    #[pyo3(signature = (latent, positions, cos_sin_cache, kv_cache, slot_mapping, compress_ratio, fp8_scale=None, *, sanitize=None, record_order="planar"))]
    fn rope_quant_insert(
        latent: &Any<'_>,
        positions: &Any<'_>,
        cos_sin_cache: &Any<'_>,
        kv_cache: &Any<'_>,
        slot_mapping: &Any<'_>,
        compress_ratio: i64,
        fp8_scale: Option<&Any<'_>>,
        sanitize: Option<bool>,
        record_order: &str,
    )
);

op!(
    RingOp,
    /// Store FP32 [kv, score] rows to their ring slots, skipping slot -1 (the
    /// seed's `save_ring_rows`).
    #[pyo3(signature = (rows, slot_mapping, state_cache))]
    fn save_ring_rows(rows: &Any<'_>, slot_mapping: &Any<'_>, state_cache: &Any<'_>)
);

op!(
    GatherOp,
    /// Read records back: gather them from a paged cache and write them
    /// dequantized (BF16 or F32, `out`'s dtype) into `out [rows, 512]`. Either
    /// `slot_mapping [N]` (row `i` reads slot `slot_mapping[i]`, `< 0` leaves it
    /// untouched), or `block_table [R, max_blocks]` with `cu_seq_lens [R + 1]`
    /// (and optional `seq_starts [R]`): request `r` fills rows
    /// `cu_seq_lens[r] .. cu_seq_lens[r + 1]` with its tokens from position
    /// `seq_starts[r]` on. `fp8_scale` for FP8 row caches only. Out-of-range
    /// indices are skipped and counted. `record_order`: the order the paged
    /// records were written in (`"planar"` or `"per_token"`, as
    /// `rope_quant_insert`'s).
    #[pyo3(signature = (kv_cache, out, slot_mapping=None, *, block_table=None, cu_seq_lens=None, seq_starts=None, fp8_scale=None, record_order="planar"))]
    fn gather_dequant(
        kv_cache: &Any<'_>,
        out: &Any<'_>,
        slot_mapping: Option<&Any<'_>>,
        block_table: Option<&Any<'_>>,
        cu_seq_lens: Option<&Any<'_>>,
        seq_starts: Option<&Any<'_>>,
        fp8_scale: Option<&Any<'_>>,
        record_order: &str,
    )
);

compressor_op!(
    FusedOp,
    /// `fused_save_compress_norm` then `rope_quant_insert` in one launch: the
    /// compressor's arguments, then the insert's (`cache_slot_mapping` are the
    /// cache slots; for CR2 `slot_mapping` holds ring slots). `latent_out` is
    /// still written unless `skip_latent_out`. `record_order` as
    /// `rope_quant_insert`'s.
    #[pyo3(signature = (kv_score, positions, state_cache, slot_mapping, query_start_loc, token_to_req_indices, rms_norm_weight, rms_norm_eps, compress_ratio, latent_out, cos_sin_cache, kv_cache, cache_slot_mapping, fp8_scale=None, prev_rows=None, prev_row_indices=None, *, skip_latent_out=false, sanitize=None, record_order="planar"))]
    fn fused_compress_insert(
        cos_sin_cache: &Any<'_>,
        kv_cache: &Any<'_>,
        cache_slot_mapping: &Any<'_>,
        fp8_scale: Option<&Any<'_>>,
        prev_rows: Option<&Any<'_>>,
        prev_row_indices: Option<&Any<'_>>,
        skip_latent_out: bool,
        sanitize: Option<bool>,
        record_order: &str,
    )
);

op!(
    IndexerKOp,
    /// The V4.1 indexer key store (vLLM's `indexer_k_norm_rope_store`): for
    /// each token that closes a group (`(position + 1) % compress_ratio ==
    /// 0`, slot `>= 0`), RMS norm of its `k_pre` row (BF16 `[>= N, 128]`),
    /// GPT-J RoPE of the last 64 dims at the group's first position, then an
    /// FP8 (132 B, `use_fp4_cache=False`) or MXFP4 (68 B) record in
    /// `k_cache` (U8 `[blocks, block_size, 132 | 68]`). `k_order`: the page
    /// order, `"row_major"` (vLLM on CUDA), `"tiled"` (FP8, ROCm's 16 x 16
    /// tiles) or `"preshuffled"` (MXFP4, AITER's order with N =
    /// `mxfp4_n_per_tile`, which the other orders ignore). `mx_scale`: FP8
    /// scales as four UE8M0 bytes instead of an f32. Out-of-range slots and
    /// positions are skipped and counted.
    #[pyo3(signature = (k_pre, positions, cos_sin_cache, rms_norm_weight, rms_norm_eps, k_cache, kv_slot_mapping, compress_ratio, use_fp4_cache, mxfp4_n_per_tile=0, *, k_order="row_major", mx_scale=false))]
    fn indexer_k_norm_rope_store(
        k_pre: &Any<'_>,
        positions: &Any<'_>,
        cos_sin_cache: &Any<'_>,
        rms_norm_weight: &Any<'_>,
        rms_norm_eps: f64,
        k_cache: &Any<'_>,
        kv_slot_mapping: &Any<'_>,
        compress_ratio: i64,
        use_fp4_cache: bool,
        mxfp4_n_per_tile: i64,
        k_order: &str,
        mx_scale: bool,
    )
);

/// Takes and resets the skip counts of the backend of `device_type`
/// (`"cpu"` or `"cuda"`) device `index`: (slot, position, index) out of
/// range. The caller synchronizes a GPU first.
#[pyfunction]
fn _take_skip_counts(device_type: &str, index: i32) -> PyResult<(u64, u64, u64)> {
    let dev = match device_type {
        "cpu" => Dev::Cpu,
        _ => Dev::Cuda(index),
    };
    let c = device::take_skip_counts(dev)?;
    Ok((
        c.slot_out_of_range,
        c.position_out_of_range,
        c.index_out_of_range,
    ))
}

/// Creates the backend of a device (before a graph capture) and returns its name.
#[pyfunction]
fn _init(py: Python<'_>, device_type: &str, index: i32) -> PyResult<String> {
    let t = torch(py)?;
    let dev = match device_type {
        "cpu" => Dev::Cpu,
        _ => Dev::Cuda(index),
    };
    device::init(py, t, dev)
}

/// Reads every argument as a tensor argument and launches nothing: the
/// per-tensor host cost alone, for scripts/python_host_cost.py.
/// `exchange=False`: through the attributes even where torch has the DLPack
/// exchange API.
#[pyfunction]
#[pyo3(signature = (*tensors, exchange=true))]
fn _read_tensors(
    py: Python<'_>,
    tensors: &Bound<'_, pyo3::types::PyTuple>,
    exchange: bool,
) -> PyResult<()> {
    let t = torch(py)?;
    for o in tensors.iter() {
        tensor::read(py, t, "tensors", &o, exchange)?;
    }
    Ok(())
}

/// What a tensor argument reads as, for the tests: (dtype, device, data
/// pointer, byte extent, shape, strides); `exchange` as in `_read_tensors`.
#[pyfunction]
#[pyo3(signature = (tensor, exchange=true))]
#[allow(clippy::type_complexity)]
fn _read_tensor(
    py: Python<'_>,
    tensor: &Any<'_>,
    exchange: bool,
) -> PyResult<(String, String, u64, usize, Vec<usize>, Vec<usize>)> {
    let t = torch(py)?;
    let v = tensor::read(py, t, "tensor", tensor, exchange)?;
    Ok((
        v.desc.dtype.name().to_string(),
        v.dev.to_string(),
        v.ptr,
        v.len,
        v.desc.shape().to_vec(),
        v.desc.strides().to_vec(),
    ))
}

/// Whether this torch's tensors are read through its DLPack exchange API.
#[pyfunction]
fn _reads_by_exchange(py: Python<'_>) -> PyResult<bool> {
    Ok(tensor::has_exchange(torch(py)?))
}

/// Which backends this build has: (`cuda`, `hip`).
#[pyfunction]
fn _features() -> (bool, bool) {
    (cfg!(feature = "cuda"), cfg!(feature = "hip"))
}

/// A backend's unavailability as one line (the reason alone for `Unavailable`).
#[cfg(any(feature = "cuda", feature = "hip"))]
fn unavailable_line(e: &dsv4_kvcache::Error) -> String {
    match e {
        dsv4_kvcache::Error::Unavailable { reason, .. } => format!("unavailable: {reason}"),
        other => format!("unavailable: {other}"),
    }
}

/// The CUDA driver's devices (`Ok(count)`), or why there are none.
#[cfg(feature = "cuda")]
fn cuda_devices() -> Result<usize, String> {
    match dsv4_kvcache::CudaBackend::device_count() {
        Ok(0) => Err("unavailable: the CUDA driver is present but finds no device".into()),
        Ok(n) => Ok(n),
        Err(e) => Err(unavailable_line(&e)),
    }
}

#[cfg(not(feature = "cuda"))]
fn cuda_devices() -> Result<usize, String> {
    Err("unavailable: this build has no `cuda` feature".into())
}

/// The HIP runtime and its devices (one line each), or why there are none.
#[cfg(feature = "hip")]
fn hip_devices() -> Result<Vec<String>, String> {
    dsv4_kvcache::backend::hip::probe()
        .map(|s| s.lines().map(str::to_string).collect())
        .map_err(|e| unavailable_line(&e))
}

#[cfg(not(feature = "hip"))]
fn hip_devices() -> Result<Vec<String>, String> {
    Err("unavailable: this build has no `hip` feature".into())
}

/// What this build embeds and what it finds at run time, as a dict:
/// `version`; `kernels`, the device code actually embedded per backend
/// (`{"cuda": ["sm_90", "sm_100", "sm_103", "sm_120"], "hip": ["gfx90a",
/// "gfx942", "gfx950"]}`: SASS targets and code objects, an empty list where
/// `build.rs` found no compiler); `targets`, per backend what runs where:
/// for CUDA `sass`, `ptx` (JIT-compiled by GPUs without SASS of their own),
/// `toolkit` (the CUDA release that compiled them) and `min_driver` (each
/// image's oldest Linux NVIDIA driver), for HIP `code_objects` and
/// `code_object_version`; `compilers` (what built them, or
/// None); `missing`, why a backend's kernels are absent; `devices`, per
/// backend the devices found now (lines) or why none; and `backends`, those
/// that can run here now (`"cpu"` always, a GPU backend when it has both
/// kernels and a device). It loads the GPU drivers but creates no backend.
#[pyfunction]
fn info(py: Python<'_>) -> PyResult<Bound<'_, pyo3::types::PyDict>> {
    use dsv4_kvcache::kernels;
    use pyo3::types::PyDict;

    let out = PyDict::new(py);
    out.set_item("version", env!("CARGO_PKG_VERSION"))?;
    let k = PyDict::new(py);
    k.set_item("cuda", kernels::cuda_targets().to_vec())?;
    k.set_item("hip", kernels::hip_targets().to_vec())?;
    out.set_item("kernels", k)?;
    let t = PyDict::new(py);
    let cuda = PyDict::new(py);
    cuda.set_item("sass", kernels::cuda_targets().to_vec())?;
    cuda.set_item("ptx", kernels::cuda_ptx().to_vec())?;
    cuda.set_item("toolkit", kernels::cuda_toolkit())?;
    let drivers = PyDict::new(py);
    for (image, driver) in kernels::cuda_min_drivers() {
        drivers.set_item(image, driver)?;
    }
    cuda.set_item("min_driver", drivers)?;
    t.set_item("cuda", cuda)?;
    let hip = PyDict::new(py);
    hip.set_item("code_objects", kernels::hip_targets().to_vec())?;
    hip.set_item("code_object_version", kernels::HIP_CODE_OBJECT_VERSION)?;
    t.set_item("hip", hip)?;
    out.set_item("targets", t)?;
    let c = PyDict::new(py);
    c.set_item("cuda", kernels::cuda_compiler())?;
    c.set_item("hip", kernels::hip_compiler())?;
    out.set_item("compilers", c)?;
    out.set_item("missing", kernels::missing_reasons().to_vec())?;

    let mut backends = vec!["cpu"];
    let d = PyDict::new(py);
    let threads = std::thread::available_parallelism().map_or(0, |n| n.get());
    d.set_item(
        "cpu",
        vec![format!("the reference, {threads} hardware threads")],
    )?;
    match cuda_devices() {
        Ok(n) => {
            if !kernels::cuda_targets().is_empty() {
                backends.push("cuda");
            }
            d.set_item("cuda", vec![format!("{n} device(s)")])?;
        }
        Err(why) => d.set_item("cuda", why)?,
    }
    match hip_devices() {
        Ok(lines) => {
            if !kernels::hip_targets().is_empty() {
                backends.push("hip");
            }
            d.set_item("hip", lines)?;
        }
        Err(why) => d.set_item("hip", why)?,
    }
    out.set_item("devices", d)?;
    out.set_item("backends", backends)?;
    Ok(out)
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(fused_save_compress_norm, m)?)?;
    m.add_function(wrap_pyfunction!(rope_quant_insert, m)?)?;
    m.add_function(wrap_pyfunction!(save_ring_rows, m)?)?;
    m.add_function(wrap_pyfunction!(fused_compress_insert, m)?)?;
    m.add_function(wrap_pyfunction!(gather_dequant, m)?)?;
    m.add_function(wrap_pyfunction!(indexer_k_norm_rope_store, m)?)?;
    m.add_function(wrap_pyfunction!(_take_skip_counts, m)?)?;
    m.add_function(wrap_pyfunction!(_init, m)?)?;
    m.add_function(wrap_pyfunction!(reference::_reference, m)?)?;
    m.add_function(wrap_pyfunction!(_features, m)?)?;
    m.add_function(wrap_pyfunction!(info, m)?)?;
    m.add_function(wrap_pyfunction!(_read_tensors, m)?)?;
    m.add_function(wrap_pyfunction!(_read_tensor, m)?)?;
    m.add_function(wrap_pyfunction!(_reads_by_exchange, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
