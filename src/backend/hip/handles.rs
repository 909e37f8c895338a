//! The runtime's objects as Rust values: handles, the objects released on
//! drop (allocations, streams, events, graphs), and the guard that makes
//! the caller's device current again.

use super::check;
use super::ffi::{Api, HipError};
use crate::error::Result;
use std::ffi::{c_int, c_void};
use std::ptr::null_mut;
use std::sync::Arc;

/// A HIP handle (stream, module, function, event, graph).
#[derive(Debug, Clone, Copy)]
pub struct Handle(pub(super) *mut c_void);

// SAFETY: HIP handles are process-wide identifiers; the runtime's calls on
// them are thread-safe.
unsafe impl Send for Handle {}
// SAFETY: as above.
unsafe impl Sync for Handle {}

impl Handle {
    pub(super) const NULL: Handle = Handle(null_mut());
}

/// The caller's current HIP device, made current again on drop (as the
/// CUDA backend restores the caller's context): a ROCm torch process keeps
/// its own current device, which a call on a tensor of another device must
/// not change.
pub(super) struct DeviceGuard<'a> {
    api: &'a Api,
    /// The device to restore, when `select` changed it.
    previous: Option<c_int>,
}

impl<'a> DeviceGuard<'a> {
    /// Makes `device` current on this thread (no call when it already is).
    pub(super) fn select(api: &'a Api, device: c_int) -> Result<Self> {
        let mut current: c_int = -1;
        // SAFETY: valid out-pointer.
        check(api, "hipGetDevice", unsafe {
            (api.get_device)(&mut current)
        })?;
        if current == device {
            return Ok(DeviceGuard {
                api,
                previous: None,
            });
        }
        // SAFETY: plain C call; an invalid ordinal is an error code.
        check(api, "hipSetDevice", unsafe { (api.set_device)(device) })?;
        Ok(DeviceGuard {
            api,
            previous: Some(current),
        })
    }
}

impl Drop for DeviceGuard<'_> {
    fn drop(&mut self) {
        if let Some(d) = self.previous {
            // SAFETY: d was current a moment ago, so it is a valid ordinal;
            // an error cannot be reported from drop.
            unsafe { (self.api.set_device)(d) };
        }
    }
}

/// A runtime object (an allocation, a stream, an event) released on drop
/// by the call that frees it; an error there cannot be reported.
pub struct HipOwned {
    pub(super) handle: Handle,
    release: unsafe extern "C" fn(*mut c_void) -> HipError,
    /// Keeps the library, and so `release`, loaded.
    _api: Arc<Api>,
}

impl HipOwned {
    pub(super) fn new(
        api: &Arc<Api>,
        handle: *mut c_void,
        release: unsafe extern "C" fn(*mut c_void) -> HipError,
    ) -> Self {
        HipOwned {
            handle: Handle(handle),
            release,
            _api: api.clone(),
        }
    }
}

impl Drop for HipOwned {
    fn drop(&mut self) {
        // SAFETY: the handle came from the call `release` undoes and is
        // released once; queued work on a stream still completes.
        unsafe { (self.release)(self.handle.0) };
    }
}

/// A `hipMalloc` allocation, freed (`hipFree`) on drop.
pub type HipMemory = HipOwned;

/// A `hipStreamCreate` stream, destroyed on drop.
pub type HipStream = HipOwned;

/// A HIP event, destroyed on drop.
pub type HipEvent = HipOwned;

/// A captured graph and its executable instance, destroyed on drop.
pub struct HipGraphExec {
    pub(super) graph: Handle,
    pub(super) exec: Handle,
    pub(super) api: Arc<Api>,
}

impl Drop for HipGraphExec {
    fn drop(&mut self) {
        // SAFETY: handles created by end_capture, released once.
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
