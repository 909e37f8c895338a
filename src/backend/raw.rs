//! Caller-owned device memory for the backends' `unsafe` `*_raw` entry
//! points, and the checks both GPU backends make on it before a launch.

// The checks serve the GPU backends; a CPU-only build keeps the type.
#![cfg_attr(not(any(feature = "cuda", feature = "hip")), allow(dead_code))]

use crate::error::{Error, Result};
use crate::ops::{CompressArgs, FusedArgs, InsertArgs, RingArgs};
use crate::tensor::{Storage, Tensor, TensorDesc};

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

/// The absolute address of a raw view: not null, aligned to `align`.
fn aligned(arg: &'static str, buf: &RawDevice, desc: &TensorDesc, align: u64) -> Result<()> {
    if buf.ptr == 0 {
        return Err(Error::Value {
            arg,
            problem: "null device pointer".into(),
        });
    }
    let addr = buf.ptr.wrapping_add(desc.offset as u64);
    if addr % align != 0 {
        return Err(Error::Shape {
            arg,
            problem: format!("device address {addr:#x} (pointer + view offset) must be a multiple of {align} bytes"),
        });
    }
    Ok(())
}

fn index(arg: &'static str, t: &Tensor<'_, RawDevice>) -> Result<()> {
    aligned(arg, t.buf, &t.desc, t.desc.dtype.size() as u64)
}

fn rows(arg: &'static str, buf: &RawDevice, desc: &TensorDesc) -> Result<()> {
    aligned(arg, buf, desc, 16)
}

/// The tensors a compress launch reads or writes (CR1 ignores the CR2-only
/// arguments, so they are not checked there).
pub(crate) fn check_compress(a: &CompressArgs<'_, RawDevice>) -> Result<()> {
    rows("kv_score", a.kv_score.buf, &a.kv_score.desc)?;
    index("positions", &a.positions)?;
    index("slot_mapping", &a.slot_mapping)?;
    rows(
        "rms_norm_weight",
        a.rms_norm_weight.buf,
        &a.rms_norm_weight.desc,
    )?;
    rows("latent_out", a.latent_out.buf, &a.latent_out.desc)?;
    if a.compress_ratio != 2 {
        return Ok(());
    }
    if let Some(s) = &a.state_cache {
        rows("state_cache", s.buf, &s.desc)?;
    }
    if let Some(t) = &a.query_start_loc {
        index("query_start_loc", t)?;
    }
    if let Some(t) = &a.token_to_req_indices {
        index("token_to_req_indices", t)?;
    }
    if let (Some(p), Some(i)) = (&a.prev_rows, &a.prev_row_indices) {
        rows("prev_rows", p.buf, &p.desc)?;
        index("prev_row_indices", i)?;
    }
    Ok(())
}

fn check_cache_side(
    cos_sin: &Tensor<'_, RawDevice>,
    cache: (&RawDevice, &TensorDesc),
    fp8_scale: &Option<Tensor<'_, RawDevice>>,
) -> Result<()> {
    index("cos_sin_cache", cos_sin)?;
    rows("kv_cache", cache.0, cache.1)?;
    if let Some(t) = fp8_scale {
        aligned("fp8_scale", t.buf, &t.desc, 4)?;
    }
    Ok(())
}

/// The tensors an insert launch reads or writes.
pub(crate) fn check_insert(a: &InsertArgs<'_, RawDevice>) -> Result<()> {
    rows("latent", a.latent.buf, &a.latent.desc)?;
    index("positions", &a.positions)?;
    index("slot_mapping", &a.slot_mapping)?;
    check_cache_side(
        &a.cos_sin_cache,
        (a.kv_cache.buf, &a.kv_cache.desc),
        &a.fp8_scale,
    )
}

/// The tensors a `save_ring_rows` launch reads or writes.
pub(crate) fn check_ring(a: &RingArgs<'_, RawDevice>) -> Result<()> {
    rows("rows", a.rows.buf, &a.rows.desc)?;
    index("slot_mapping", &a.slot_mapping)?;
    rows("state_cache", a.state_cache.buf, &a.state_cache.desc)
}

/// The tensors a fused launch reads or writes.
pub(crate) fn check_fused(a: &FusedArgs<'_, RawDevice>) -> Result<()> {
    check_compress(&a.compress)?;
    index("cache_slot_mapping", &a.cache_slot_mapping)?;
    check_cache_side(
        &a.cos_sin_cache,
        (a.kv_cache.buf, &a.kv_cache.desc),
        &a.fp8_scale,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tensor::DType;

    #[test]
    fn null_and_misaligned_addresses_are_errors() {
        let d = TensorDesc::contiguous(DType::F32, &[2, 1024]);
        assert!(matches!(
            rows("kv_score", &RawDevice::new(0, 1 << 20), &d),
            Err(Error::Value {
                arg: "kv_score",
                ..
            })
        ));
        assert!(matches!(
            rows("kv_score", &RawDevice::new(0x1008, 1 << 20), &d),
            Err(Error::Shape {
                arg: "kv_score",
                ..
            })
        ));
        assert!(rows(
            "kv_score",
            &RawDevice::new(0x1008, 1 << 20),
            &d.with_offset(8)
        )
        .is_ok());
        let i = TensorDesc::contiguous(DType::I64, &[4]);
        assert!(aligned("slot_mapping", &RawDevice::new(0x1004, 64), &i, 8).is_err());
    }
}
