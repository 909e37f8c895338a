//! The CPU reference from Python: the library's safe API on its own
//! buffers (copies of the tensors' bytes), written back afterwards. Tests
//! compare the plain functions (which bind the tensors' memory directly, on
//! any device) with this path.

use crate::device::{CompressViews, FusedViews, InsertViews, RingViews};
use crate::tensor::{map_err, View};
use dsv4_kvcache::{
    Backend, CompressArgs, CpuBackend, FusedArgs, InsertArgs, RingArgs, SkipCounts, Tensor,
    TensorMut,
};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

/// A view's bytes from its first element to its last, copied.
fn copy_in(arg: &'static str, v: &View) -> PyResult<Vec<u8>> {
    if v.dev != crate::tensor::Dev::Cpu {
        return Err(PyValueError::new_err(format!(
            "{arg}: the reference takes CPU tensors"
        )));
    }
    let n = v.desc.end_byte().unwrap_or(0) as usize;
    if n > v.len {
        return Err(PyValueError::new_err(format!(
            "{arg}: view beyond its storage"
        )));
    }
    if n == 0 {
        return Ok(Vec::new());
    }
    // SAFETY: a CPU tensor's view lies in its storage (checked above), which
    // the calling Python frame keeps alive for the call.
    Ok(unsafe { std::slice::from_raw_parts(v.ptr as *const u8, n) }.to_vec())
}

fn copy_out(v: &View, bytes: &[u8]) {
    if !bytes.is_empty() {
        // SAFETY: as in `copy_in`; `bytes` came from this view.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), v.ptr as *mut u8, bytes.len()) };
    }
}

fn opt(arg: &'static str, v: &Option<View>) -> PyResult<Option<Vec<u8>>> {
    v.as_ref().map(|v| copy_in(arg, v)).transpose()
}

fn backend(sanitize: bool) -> CpuBackend {
    let mut b = CpuBackend::new();
    b.set_sanitize(sanitize);
    b
}

fn done(b: &CpuBackend) -> PyResult<(u64, u64, u64)> {
    let c: SkipCounts = b.take_skip_counts().map_err(map_err)?;
    Ok((
        c.slot_out_of_range,
        c.position_out_of_range,
        c.index_out_of_range,
    ))
}

/// `rope_quant_insert` through the reference.
pub fn insert(v: &InsertViews, sanitize: bool) -> PyResult<(u64, u64, u64)> {
    let (l, p, c, s) = (
        copy_in("latent", &v.latent)?,
        copy_in("positions", &v.positions)?,
        copy_in("cos_sin_cache", &v.cos_sin_cache)?,
        copy_in("slot_mapping", &v.slot_mapping)?,
    );
    let f = opt("fp8_scale", &v.fp8_scale)?;
    let mut k = copy_in("kv_cache", &v.kv_cache)?;
    let b = backend(sanitize);
    b.rope_quant_insert(InsertArgs {
        latent: Tensor::new(&l, v.latent.desc),
        positions: Tensor::new(&p, v.positions.desc),
        cos_sin_cache: Tensor::new(&c, v.cos_sin_cache.desc),
        kv_cache: TensorMut::new(&mut k, v.kv_cache.desc),
        slot_mapping: Tensor::new(&s, v.slot_mapping.desc),
        compress_ratio: v.compress_ratio,
        fp8_scale: f
            .as_ref()
            .zip(v.fp8_scale.as_ref())
            .map(|(b, v)| Tensor::new(b, v.desc)),
    })
    .map_err(map_err)?;
    copy_out(&v.kv_cache, &k);
    done(&b)
}

struct CompressBufs {
    kv: Vec<u8>,
    pos: Vec<u8>,
    st: Option<Vec<u8>>,
    sl: Vec<u8>,
    q: Option<Vec<u8>>,
    t: Option<Vec<u8>>,
    w: Vec<u8>,
    lo: Vec<u8>,
    pr: Option<Vec<u8>>,
    pi: Option<Vec<u8>>,
}

impl CompressBufs {
    fn new(v: &CompressViews) -> PyResult<Self> {
        // CR1 ignores the ring-side arguments, as the seed does.
        let cr2 = v.compress_ratio == 2;
        let o = |a, x: &Option<View>| if cr2 { opt(a, x) } else { Ok(None) };
        Ok(CompressBufs {
            kv: copy_in("kv_score", &v.kv_score)?,
            pos: copy_in("positions", &v.positions)?,
            st: o("state_cache", &v.state_cache)?,
            sl: copy_in("slot_mapping", &v.slot_mapping)?,
            q: o("query_start_loc", &v.query_start_loc)?,
            t: o("token_to_req_indices", &v.token_to_req_indices)?,
            w: copy_in("rms_norm_weight", &v.rms_norm_weight)?,
            lo: copy_in("latent_out", &v.latent_out)?,
            pr: o("prev_rows", &v.prev_rows)?,
            pi: o("prev_row_indices", &v.prev_row_indices)?,
        })
    }

    fn args<'a>(&'a mut self, v: &CompressViews) -> CompressArgs<'a, Vec<u8>> {
        let t = |b: &'a Option<Vec<u8>>, v: &Option<View>| {
            b.as_ref()
                .zip(v.as_ref())
                .map(|(b, v)| Tensor::new(b, v.desc))
        };
        CompressArgs {
            kv_score: Tensor::new(&self.kv, v.kv_score.desc),
            positions: Tensor::new(&self.pos, v.positions.desc),
            state_cache: self
                .st
                .as_mut()
                .zip(v.state_cache.as_ref())
                .map(|(b, v)| TensorMut::new(b, v.desc)),
            slot_mapping: Tensor::new(&self.sl, v.slot_mapping.desc),
            query_start_loc: t(&self.q, &v.query_start_loc),
            token_to_req_indices: t(&self.t, &v.token_to_req_indices),
            rms_norm_weight: Tensor::new(&self.w, v.rms_norm_weight.desc),
            rms_norm_eps: v.rms_norm_eps,
            compress_ratio: v.compress_ratio,
            latent_out: TensorMut::new(&mut self.lo, v.latent_out.desc),
            prev_rows: t(&self.pr, &v.prev_rows),
            prev_row_indices: t(&self.pi, &v.prev_row_indices),
        }
    }

    fn write_back(&self, v: &CompressViews) {
        copy_out(&v.latent_out, &self.lo);
        if let (Some(b), Some(v)) = (&self.st, &v.state_cache) {
            copy_out(v, b);
        }
    }
}

/// `fused_save_compress_norm` through the reference.
pub fn compress(v: &CompressViews) -> PyResult<(u64, u64, u64)> {
    let mut bufs = CompressBufs::new(v)?;
    let b = backend(false);
    b.fused_save_compress_norm(bufs.args(v)).map_err(map_err)?;
    bufs.write_back(v);
    done(&b)
}

/// `save_ring_rows` through the reference.
pub fn ring(v: &RingViews) -> PyResult<(u64, u64, u64)> {
    let (r, s) = (
        copy_in("rows", &v.rows)?,
        copy_in("slot_mapping", &v.slot_mapping)?,
    );
    let mut st = copy_in("state_cache", &v.state_cache)?;
    let b = backend(false);
    b.save_ring_rows(RingArgs {
        rows: Tensor::new(&r, v.rows.desc),
        slot_mapping: Tensor::new(&s, v.slot_mapping.desc),
        state_cache: TensorMut::new(&mut st, v.state_cache.desc),
    })
    .map_err(map_err)?;
    copy_out(&v.state_cache, &st);
    done(&b)
}

/// The fused launch through the reference.
pub fn fused(v: &FusedViews, sanitize: bool) -> PyResult<(u64, u64, u64)> {
    let mut bufs = CompressBufs::new(&v.compress)?;
    let (c, s) = (
        copy_in("cos_sin_cache", &v.cos_sin_cache)?,
        copy_in("cache_slot_mapping", &v.cache_slot_mapping)?,
    );
    let f = opt("fp8_scale", &v.fp8_scale)?;
    let mut k = copy_in("kv_cache", &v.kv_cache)?;
    let b = backend(sanitize);
    b.fused_compress_insert(FusedArgs {
        compress: bufs.args(&v.compress),
        skip_latent_out: v.skip_latent_out,
        cos_sin_cache: Tensor::new(&c, v.cos_sin_cache.desc),
        kv_cache: TensorMut::new(&mut k, v.kv_cache.desc),
        cache_slot_mapping: Tensor::new(&s, v.cache_slot_mapping.desc),
        fp8_scale: f
            .as_ref()
            .zip(v.fp8_scale.as_ref())
            .map(|(b, v)| Tensor::new(b, v.desc)),
    })
    .map_err(map_err)?;
    bufs.write_back(&v.compress);
    copy_out(&v.kv_cache, &k);
    done(&b)
}
