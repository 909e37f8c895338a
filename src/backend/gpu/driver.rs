//! The driver layer under [`super::GpuBackend`]: the few things a GPU
//! runtime must do for the backend (memory, copies, the loaded kernels,
//! launches, streams, events, graphs, device facts), implemented once per
//! vendor (`CudaDriver` on cudarc, `HipDriver` on the runtime-loaded HIP
//! bindings) and by test stand-ins.
//!
//! A driver is an opened device: its context (or current device), the
//! embedded kernels loaded as one module, and one stream of its own, which
//! every safe launch, copy, capture and event of the backend uses. Calls
//! that take a [`RawStream`] also run on a caller's stream (the `*_raw`
//! entry points) or on one the driver made ([`Driver::create_stream`]). Every method that can fail returns the crate's
//! [`Error`](crate::Error), naming the runtime call.

use super::super::raw::RawStream;
use crate::detect::SanitizePolicy;
use crate::error::Result;
use crate::kernel_abi::{Geometry, Kernel};
use std::ffi::c_void;

/// A pointer to a kernel's parameter block.
pub type Params = *mut c_void;

/// What a device says about itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceFacts {
    /// The device ordinal in its runtime.
    pub ordinal: usize,
    /// The marketing name (`NVIDIA H200`, `AMD Instinct MI300X`).
    pub name: String,
    /// The architecture as the device reports it (`sm_90`,
    /// `gfx950:sramecc+:xnack-`).
    pub arch: String,
    /// Threads of a warp (32) or wavefront (64).
    pub warp_size: u32,
    /// Device memory in bytes, where the runtime says.
    pub total_memory: Option<usize>,
    /// Streaming multiprocessors (CUDA) or compute units (HIP), where the
    /// driver reads them; sizes the roofline copy's grid.
    pub multiprocessors: Option<u32>,
    /// The embedded kernels this device runs: `sm_90 SASS`, `compute_90
    /// PTX, JIT-compiled by the driver`, `gfx942 code object`.
    pub kernels: String,
}

/// A GPU runtime opened on one device, with the kernels loaded.
///
/// # Safety
/// Implementations promise that a [`Driver::launch`] with a function of
/// this driver, a parameter block matching that kernel and valid device
/// addresses in it runs the kernel, and that the device addresses handed
/// out by [`Driver::alloc`] stay valid while the returned memory lives.
pub unsafe trait Driver: Send + Sync + Sized + 'static {
    /// The backend's short name in errors and names (`cuda`, `hip`).
    const BACKEND: &'static str;
    /// A loaded kernel.
    type Function: Copy + Send + Sync;
    /// A device allocation, freed when dropped.
    type Memory: Send + Sync;
    /// A timing event.
    type Event;
    /// An instantiated graph of captured work, destroyed when dropped.
    type Graph;
    /// A stream made by [`Driver::create_stream`], destroyed when dropped
    /// (work already queued on it still runs).
    type Stream: Send + Sync;

    /// The device's facts.
    fn facts(&self) -> &DeviceFacts;

    /// Whether NaN sanitizing is on under `policy` on this device.
    fn sanitize_for(&self, policy: SanitizePolicy) -> bool;

    /// The driver's own stream.
    fn stream(&self) -> RawStream;

    /// The loaded `kernel` (looked up once per backend, when it is made).
    fn function(&self, kernel: Kernel) -> Result<Self::Function>;

    /// `len` bytes (at least one is allocated) and their device address,
    /// ordered on `stream` (the driver's own when `None`) where the runtime
    /// allocates stream-ordered, so that they are freed in that order too.
    fn alloc(&self, len: usize, stream: Option<&Self::Stream>) -> Result<(Self::Memory, u64)>;

    /// A new stream of the device, not ordered against the driver's own
    /// stream or the default stream, and its handle.
    fn create_stream(&self) -> Result<(Self::Stream, RawStream)>;

    /// Sets `len` bytes at `dst` to `value` on `stream` (no wait).
    ///
    /// # Safety
    /// `dst` holds `len` bytes of this device until the work has run.
    unsafe fn memset(&self, dst: u64, value: u8, len: usize, stream: RawStream) -> Result<()>;

    /// Copies `src` to `dst` on `stream`; `src` may be reused when this
    /// returns only after the stream has been synchronized.
    ///
    /// # Safety
    /// `dst` holds `src.len()` bytes of this device.
    unsafe fn copy_to_device(&self, dst: u64, src: &[u8], stream: RawStream) -> Result<()>;

    /// Copies device bytes at `src` into `dst` on `stream`; `dst` holds them
    /// once the stream has been synchronized.
    ///
    /// # Safety
    /// `src` holds `dst.len()` bytes of this device, and `dst` is not read
    /// before the stream has been synchronized.
    unsafe fn copy_to_host(&self, dst: &mut [u8], src: u64, stream: RawStream) -> Result<()>;

    /// Copies `n` bytes from `src` to `dst` on the device, on `stream`.
    ///
    /// # Safety
    /// Both hold `n` bytes of this device until the copy has run.
    unsafe fn copy_on_device(&self, dst: u64, src: u64, n: usize, stream: RawStream) -> Result<()>;

    /// Free and total bytes of the device's memory, as the runtime reports
    /// them (for the whole device, every process included), where it can.
    fn memory_info(&self) -> Option<(usize, usize)> {
        None
    }

    /// Waits for the work on `stream`.
    fn synchronize(&self, stream: RawStream) -> Result<()>;

    /// Launches `f` on `g.grid` blocks of `g.block_threads` threads with
    /// `g.shared_bytes` of dynamic shared memory, `params` pointing at its
    /// one by-value argument, on stream `s`. Must not allocate, copy or
    /// wait, so that it can be captured.
    ///
    /// # Safety
    /// `params` points at the parameter block `f` expects, whose device
    /// addresses are valid for the kernel's accesses until it has run; `s`
    /// is a stream of this device (or the default stream).
    unsafe fn launch(
        &self,
        f: Self::Function,
        g: &Geometry,
        s: RawStream,
        params: Params,
    ) -> Result<()>;

    /// Starts capturing the driver's stream into a graph (thread-local
    /// mode: only this thread's forbidden calls end it).
    fn begin_capture(&self) -> Result<()>;

    /// Ends the capture begun by [`Driver::begin_capture`]: the captured work
    /// instantiated (and uploaded where the runtime can), or `None` when
    /// nothing was captured.
    fn end_capture(&self) -> Result<Option<Self::Graph>>;

    /// Replays `graph` on the driver's stream (no wait).
    ///
    /// # Safety
    /// Every device address the captured work used is still allocated.
    unsafe fn launch_graph(&self, graph: &Self::Graph) -> Result<()>;

    /// A timing event.
    fn create_event(&self) -> Result<Self::Event>;

    /// Records `event` on the driver's stream.
    fn record_event(&self, event: &Self::Event) -> Result<()>;

    /// Milliseconds between two recorded events (the later one waited for
    /// by the caller).
    fn elapsed_ms(&self, start: &Self::Event, end: &Self::Event) -> Result<f32>;
}
