//! Tensor descriptions: element type, shape and strides over a buffer.
//!
//! A [`TensorDesc`] says how to read a buffer; it owns no memory and never
//! allocates, so describing the arguments of a launch costs nothing on the
//! host.

use crate::error::{Error, Result};
use std::fmt;

/// Element types the operations accept.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DType {
    /// IEEE binary32.
    F32,
    /// bfloat16.
    BF16,
    /// IEEE binary16.
    F16,
    /// Raw bytes (paged record caches).
    U8,
    /// FP8 e4m3fn.
    F8E4M3,
    /// Signed 32-bit integer.
    I32,
    /// Signed 64-bit integer.
    I64,
}

impl DType {
    /// Bytes per element.
    pub const fn size(self) -> usize {
        match self {
            DType::F32 | DType::I32 => 4,
            DType::BF16 | DType::F16 => 2,
            DType::U8 | DType::F8E4M3 => 1,
            DType::I64 => 8,
        }
    }

    /// The safetensors / PyTorch-style name.
    pub const fn name(self) -> &'static str {
        match self {
            DType::F32 => "F32",
            DType::BF16 => "BF16",
            DType::F16 => "F16",
            DType::U8 => "U8",
            DType::F8E4M3 => "F8_E4M3",
            DType::I32 => "I32",
            DType::I64 => "I64",
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Most dimensions a tensor argument has.
pub const MAX_RANK: usize = 4;

/// Element type, shape, strides (in elements) and byte offset of a view.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TensorDesc {
    /// Element type.
    pub dtype: DType,
    rank: u8,
    shape: [usize; MAX_RANK],
    strides: [usize; MAX_RANK],
    /// Byte offset of element 0 from the start of the buffer.
    pub offset: usize,
}

impl TensorDesc {
    /// A contiguous row-major view of `shape` at offset 0.
    ///
    /// # Panics
    /// If `shape` has more than [`MAX_RANK`] dimensions (a programming error).
    pub fn contiguous(dtype: DType, shape: &[usize]) -> Self {
        assert!(shape.len() <= MAX_RANK, "rank above {MAX_RANK}");
        let mut s = [0; MAX_RANK];
        let mut st = [0; MAX_RANK];
        let mut acc = 1usize;
        for i in (0..shape.len()).rev() {
            s[i] = shape[i];
            st[i] = acc;
            acc = acc.saturating_mul(shape[i].max(1));
        }
        TensorDesc {
            dtype,
            rank: shape.len() as u8,
            shape: s,
            strides: st,
            offset: 0,
        }
    }

    /// A view with explicit strides (in elements).
    pub fn strided(dtype: DType, shape: &[usize], strides: &[usize]) -> Result<Self> {
        if shape.len() != strides.len() || shape.len() > MAX_RANK {
            return Err(Error::Shape {
                arg: "tensor",
                problem: format!(
                    "shape {:?} and strides {:?} must have the same rank, at most {MAX_RANK}",
                    shape, strides
                ),
            });
        }
        let mut d = Self::contiguous(dtype, shape);
        d.strides[..strides.len()].copy_from_slice(strides);
        Ok(d)
    }

    /// The same view starting `bytes` further into the buffer.
    pub fn with_offset(mut self, bytes: usize) -> Self {
        self.offset = bytes;
        self
    }

    /// Number of dimensions.
    pub fn rank(&self) -> usize {
        self.rank as usize
    }

    /// The shape.
    pub fn shape(&self) -> &[usize] {
        &self.shape[..self.rank()]
    }

    /// The strides in elements.
    pub fn strides(&self) -> &[usize] {
        &self.strides[..self.rank()]
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.shape().iter().product()
    }

    /// One past the last byte the view touches (`offset` if it is empty).
    pub fn end_byte(&self) -> Option<u64> {
        if self.numel() == 0 {
            return Some(self.offset as u64);
        }
        let mut last = 0u64;
        for (&n, &s) in self.shape().iter().zip(self.strides()) {
            last = last.checked_add((n as u64 - 1).checked_mul(s as u64)?)?;
        }
        (last + 1)
            .checked_mul(self.dtype.size() as u64)?
            .checked_add(self.offset as u64)
    }

    /// Whether the strides are those of a contiguous row-major tensor.
    pub fn is_contiguous(&self) -> bool {
        let mut acc = 1usize;
        for i in (0..self.rank()).rev() {
            if self.shape[i] != 1 && self.strides[i] != acc {
                return false;
            }
            acc = acc.saturating_mul(self.shape[i]);
        }
        true
    }
}

/// Anything that holds the bytes a [`TensorDesc`] points into.
pub trait Storage {
    /// Size in bytes.
    fn len_bytes(&self) -> usize;
}

impl Storage for Vec<u8> {
    fn len_bytes(&self) -> usize {
        self.len()
    }
}

impl Storage for [u8] {
    fn len_bytes(&self) -> usize {
        self.len()
    }
}

/// A read-only tensor argument: storage plus a view of it.
#[derive(Debug)]
pub struct Tensor<'a, S: ?Sized> {
    /// The buffer.
    pub buf: &'a S,
    /// How to read it.
    pub desc: TensorDesc,
}

impl<S: ?Sized> Clone for Tensor<'_, S> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<S: ?Sized> Copy for Tensor<'_, S> {}

/// A tensor argument that is written.
#[derive(Debug)]
pub struct TensorMut<'a, S: ?Sized> {
    /// The buffer.
    pub buf: &'a mut S,
    /// How to read and write it.
    pub desc: TensorDesc,
}

impl<'a, S: ?Sized> Tensor<'a, S> {
    /// A view `desc` of `buf`.
    pub fn new(buf: &'a S, desc: TensorDesc) -> Self {
        Tensor { buf, desc }
    }
}

impl<'a, S: ?Sized> TensorMut<'a, S> {
    /// A writable view `desc` of `buf`.
    pub fn new(buf: &'a mut S, desc: TensorDesc) -> Self {
        TensorMut { buf, desc }
    }

    /// A shorter-lived writable view of the same tensor.
    pub fn reborrow(&mut self) -> TensorMut<'_, S> {
        TensorMut {
            buf: &mut *self.buf,
            desc: self.desc,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extents() {
        let d = TensorDesc::contiguous(DType::F32, &[3, 1024]);
        assert_eq!(d.end_byte(), Some(3 * 1024 * 4));
        assert!(d.is_contiguous());
        let d = TensorDesc::strided(DType::BF16, &[2, 512], &[640, 1])
            .unwrap()
            .with_offset(8);
        assert_eq!(d.end_byte(), Some(8 + (640 + 512) * 2));
        assert!(!d.is_contiguous());
    }
}
