//! The CPU reference from Python: `_reference(name, *args, **kwargs)` calls
//! operation `name` as usual, and the dispatcher runs it on the library's
//! safe API over its own buffers (copies of the tensors' bytes, the written
//! ones copied back afterwards), on a fresh CPU backend with sanitizing as
//! the call says (off by default). Tests compare the plain functions (which
//! bind the tensors' memory directly, on any device) with this path.

use crate::bind::{Call, Launch, Mem, Target};
use crate::tensor::{map_err, Dev, View};
use dsv4_kvcache::ops::Role;
use dsv4_kvcache::{Backend, CpuBackend, SkipCounts};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};
use std::cell::Cell;

thread_local! {
    /// Inside `_reference`: `Some`, holding the skip counts of the call the
    /// dispatcher ran on the reference.
    static REFERENCE: Cell<Option<Option<SkipCounts>>> = const { Cell::new(None) };
}

/// Whether the dispatcher runs calls on the reference (inside `_reference`).
pub fn active() -> bool {
    REFERENCE.with(|r| r.get().is_some())
}

/// A copy of a CPU view's bytes, from its first element to its last.
impl Mem for Vec<u8> {
    fn of(v: &View) -> Self {
        let n = v.desc.end_byte().unwrap_or(0) as usize;
        if n == 0 {
            return Vec::new();
        }
        // SAFETY: a CPU tensor's view (checked by `run`) lies in its storage,
        // which the calling Python frame keeps alive for the call.
        unsafe { std::slice::from_raw_parts(v.ptr as *const u8, n) }.to_vec()
    }

    fn finish(&self, v: &View, role: Role) {
        if role == Role::Written && !self.is_empty() {
            // SAFETY: as in `of`; the bytes came from this view.
            unsafe { std::ptr::copy_nonoverlapping(self.as_ptr(), v.ptr as *mut u8, self.len()) };
        }
    }
}

/// The safe API of a CPU backend, on copies.
struct Safe(CpuBackend);

impl Target for Safe {
    type Mem = Vec<u8>;
    unsafe fn run<O: Launch>(
        &self,
        a: O::Args<'_, Vec<u8>>,
        _sanitize: bool,
    ) -> dsv4_kvcache::Result<()> {
        O::safe(&self.0, a)
    }
}

/// Runs `call` on the reference and leaves its skip counts for `_reference`.
pub fn run<O: Launch>(py: Python<'_>, call: &Call<O>, sanitize: bool) -> PyResult<()> {
    O::each(&call.table(|v| v), |s, v| match v {
        Some(v) if v.dev != Dev::Cpu => Err(PyValueError::new_err(format!(
            "{}: the reference takes CPU tensors",
            s.arg
        ))),
        _ => Ok(()),
    })?;
    let mut b = CpuBackend::new();
    b.set_sanitize(sanitize);
    let t = Safe(b);
    // SAFETY: CPU tensors' memory (checked above), read and written only
    // through copies made while the caller keeps the tensors alive.
    py.detach(|| unsafe { call.run_on(&t, sanitize) })
        .map_err(map_err)?;
    let c = t.0.take_skip_counts().map_err(map_err)?;
    REFERENCE.with(|r| r.set(Some(Some(c))));
    Ok(())
}

/// Calls operation `name` with `args` and `kwargs` on the CPU reference
/// (see the module's documentation) and returns its skip counts: (slot,
/// position, index) out of range.
#[pyfunction]
#[pyo3(pass_module, signature = (name, *args, **kwargs))]
pub fn _reference(
    m: &Bound<'_, PyModule>,
    name: &str,
    args: &Bound<'_, PyTuple>,
    kwargs: Option<&Bound<'_, PyDict>>,
) -> PyResult<(u64, u64, u64)> {
    let f = m.getattr(name)?;
    let before = REFERENCE.with(|r| r.replace(Some(None)));
    let called = f.call(args, kwargs);
    let ran = REFERENCE.with(|r| r.replace(before));
    called?;
    let c = ran
        .flatten()
        .ok_or_else(|| PyValueError::new_err(format!("name: {name} is not an operation")))?;
    Ok((
        c.slot_out_of_range,
        c.position_out_of_range,
        c.index_out_of_range,
    ))
}
