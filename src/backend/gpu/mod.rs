//! The GPU backend, written once over a [`Driver`]: pointer binding from the
//! validated plans, launch choice ([`LaunchPolicy`]), the safe
//! [`Backend`] implementation and the `unsafe` `*_raw` entry points, graph
//! capture and replay, timing, the skip counters, the sanitize policy and
//! buffer ownership. `CudaBackend` and `HipBackend` are this type over their
//! vendor's driver.
//!
//! # Launches
//!
//! Every launch validates its arguments with the shared `plan_*` functions
//! (so a bad argument gives the same error as on the CPU), lists the
//! operation's tensors once (`bind`), checks them (safe API: the buffers
//! belong to this backend; raw API: addresses non-null and aligned), builds
//! the `#[repr(C)]` parameter block of [`crate::kernel_abi`] and passes it
//! by value as the kernel's one argument, in the shape the backend's
//! [`LaunchPolicy`] picks, with the dynamic shared memory the CR2 team
//! kernels need. A launch allocates nothing, copies nothing between host and
//! device and never waits, so launches can be captured into a graph
//! ([`GpuBackend::capture`], [`GpuBackend::time_graph`]). A launch with no
//! token launches nothing.
//!
//! # Buffers
//!
//! A [`DeviceBuffer`] belongs to the backend that made it (and is ordered on
//! its stream); passing it to another backend is an [`Error::Value`] naming
//! the argument. Frameworks that own their memory use the `*_raw` entry
//! points over [`RawDevice`] pointers on their own [`RawStream`].
//!
//! # Streams
//!
//! The safe API runs on the backend's own stream, or on a [`Stream`] the
//! backend made ([`GpuBackend::create_stream`]) through the view
//! [`GpuBackend::on_stream`], which is a [`Backend`] too: threads sharing a
//! backend each launch on a stream of their own. A [`Stream`]'s handle
//! ([`Stream::raw`]) also serves the `*_raw` entry points, and
//! [`GpuBackend::synchronize_stream`] waits for it.

pub(crate) mod bind;
pub mod driver;
mod selfcheck;
mod streams;
mod timing;
mod touched;

pub use driver::{DeviceFacts, Driver};
pub use selfcheck::HwFormatCheck;
pub use streams::{OnStream, Stream};
pub use timing::{CapturedGraph, SmCopyRate};

use self::bind::DevAddr;
use self::touched::{CallRows, PendingCalls};
use super::raw::{RawDevice, RawStream};
use super::Backend;
use crate::detect::SanitizePolicy;
use crate::error::{Error, Result};
use crate::gather::{
    gather_launch, gather_launch_kernel, gather_params, plan_gather, GatherArgs, GatherPlan,
};
use crate::indexer_k::{
    indexer_k_launch, indexer_k_params, plan_indexer_k, IndexerKArgs, IndexerKPlan,
};
use crate::kernel_abi::{self, Kernel, KernelParams, NUM_COUNTERS};
use crate::launch::{Launch, LaunchPolicy};
use crate::ops::{
    plan_compress, plan_fused, plan_insert, plan_ring_rows, Bound, CompressArgs, CompressPlan,
    CompressTensors, FusedArgs, FusedPlan, FusedTensors, GatherTensors, IndexerKTensors,
    InsertArgs, InsertPlan, InsertTensors, RingArgs, RingRowsPlan, RingTensors, SkipCounts,
};
use crate::tensor::Storage;
use std::ffi::c_void;
use std::sync::atomic::{AtomicU64, Ordering};

/// Device memory owned by a [`GpuBackend`], freed on drop.
pub struct DeviceBuffer<D: Driver> {
    _mem: D::Memory,
    ptr: u64,
    len: usize,
    /// [`GpuBackend`]'s id of the backend that made it.
    owner: u64,
}

impl<D: Driver> DeviceBuffer<D> {
    /// The device address of the first byte.
    pub fn device_ptr(&self) -> u64 {
        self.ptr
    }

    /// Size in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The same memory as a [`RawDevice`] (it must not outlive this buffer).
    pub fn as_raw(&self) -> RawDevice {
        RawDevice::new(self.ptr, self.len)
    }
}

impl<D: Driver> std::fmt::Debug for DeviceBuffer<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "DeviceBuffer {{ backend: {}, ptr: {:#x}, len: {} }}",
            D::BACKEND,
            self.ptr,
            self.len
        )
    }
}

impl<D: Driver> Storage for DeviceBuffer<D> {
    fn len_bytes(&self) -> usize {
        self.len
    }
}

impl<D: Driver> DevAddr for DeviceBuffer<D> {
    fn addr(&self) -> u64 {
        self.ptr
    }
}

/// One `unsafe` entry point of the raw API (its docs given): `$plan`
/// validates the arguments, `raw_go` checks the addresses and the counters,
/// and `$on` launches on the caller's stream (with the call's `sanitize`
/// where the kernel takes one); `$n` reads the plan's token count.
macro_rules! raw_op {
    ($(#[$doc:meta])* $name:ident($args:ident, $plan:ident, $on:ident, |$p:ident| $n:expr $(, $sanitize:ident)?);) => {
        $(#[$doc])*
        pub unsafe fn $name(
            &self,
            args: &$args<'_, RawDevice>,
            stream: RawStream,
            raw_counters: Option<u64>,
            $($sanitize: bool,)?
        ) -> Result<()> {
            let ($p, t) = ($plan(args)?, args.tensors());
            let launch = |c| self.$on(&$p, &t, c, stream $(, $sanitize)?);
            self.raw_go($n, |f| t.each(|_, b| f(b)), raw_counters, launch)
        }
    };
}

/// Each operation's launch on a stream from its plan and tensor table,
/// with the skip counters at `$c` (and the call's `sanitize` where the
/// kernel takes one): `$body` gives the launch, the parameter block and the
/// rows the call writes, or returns early when nothing is launched; it sees
/// the backend as `$g`.
macro_rules! on_stream {
    (|$g:ident, $p:ident, $t:ident, $c:ident| $($name:ident($plan:ty, $table:ident $(, $s:ident)?) => $body:expr;)*) => {$(
        /// # Safety
        /// The table's buffers are this device's memory, valid for the
        /// plan's extents until the kernel has run.
        unsafe fn $name<S: DevAddr>(
            &self,
            $p: &$plan,
            $t: &$table<Bound<'_, S>>,
            $c: u64,
            stream: RawStream,
            $($s: bool,)?
        ) -> Result<CallRows> {
            let $g = self;
            let (launch, params, call) = $body;
            self.launch(launch, &params, stream, call)
        }
    )*};
}

/// Proves for every driver that the backend, its buffers and its streams
/// can be shared across threads (the runtime orders work on each stream).
#[allow(dead_code)]
const fn shareable<D: Driver>() {
    const fn send_sync<T: Send + Sync>() {}
    send_sync::<GpuBackend<D>>();
    send_sync::<DeviceBuffer<D>>();
    send_sync::<Stream<D>>();
}

/// Distinguishes backends, for buffer ownership.
static NEXT_BACKEND_ID: AtomicU64 = AtomicU64::new(1);

/// A GPU backend on one device of driver `D`.
pub struct GpuBackend<D: Driver> {
    /// `Kernel::ALL[i]`'s function.
    functions: Vec<D::Function>,
    /// The [`NUM_COUNTERS`] `u32` skip counters (slot, position, index).
    _counters: D::Memory,
    counters_ptr: u64,
    id: u64,
    sanitize_policy: SanitizePolicy,
    sanitize: bool,
    policy: LaunchPolicy,
    /// The safe API's launches not yet waited for.
    pending: std::sync::Mutex<PendingCalls>,
    drv: D,
}

impl<D: Driver> std::fmt::Debug for GpuBackend<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuBackend")
            .field("device", self.drv.facts())
            .field("sanitize", &self.sanitize)
            .field("launch_policy", &self.policy)
            .finish()
    }
}

impl<D: Driver> GpuBackend<D> {
    /// The backend over an opened driver, with the sanitize and launch
    /// policies of the environment (`DSV4_KVCACHE_SANITIZE`, see
    /// [`crate::detect`]; [`LaunchPolicy::from_env`]): the one place either
    /// GPU backend reads them. A bad value is an [`Error::Value`] naming
    /// the variable.
    pub fn from_driver(drv: D) -> Result<Self> {
        Self::with_policies(drv, SanitizePolicy::from_env()?, LaunchPolicy::from_env()?)
    }

    /// The backend over an opened driver with the policies given (the
    /// environment is not read): every kernel looked up, the skip counters
    /// allocated and zeroed.
    pub fn with_policies(drv: D, sanitize: SanitizePolicy, launch: LaunchPolicy) -> Result<Self> {
        let functions = Kernel::ALL
            .iter()
            .map(|&k| drv.function(k))
            .collect::<Result<Vec<_>>>()?;
        // A device that cannot hold the counters is not usable: report it as
        // unavailable, like every other setup failure.
        let setup = |e: Error| match e {
            Error::Driver {
                backend,
                call,
                message,
                ..
            } => Error::Unavailable {
                backend,
                reason: format!("{call} failed for the skip counters: {message}"),
            },
            other => other,
        };
        let (counters, counters_ptr) = drv.alloc(4 * NUM_COUNTERS, None).map_err(setup)?;
        // SAFETY: the allocation holds 4 * NUM_COUNTERS bytes.
        unsafe { drv.memset(counters_ptr, 0, 4 * NUM_COUNTERS, drv.stream()) }.map_err(setup)?;
        drv.synchronize(drv.stream()).map_err(setup)?;
        Ok(GpuBackend {
            functions,
            _counters: counters,
            counters_ptr,
            id: NEXT_BACKEND_ID.fetch_add(1, Ordering::Relaxed),
            sanitize_policy: sanitize,
            sanitize: drv.sanitize_for(sanitize),
            policy: launch,
            pending: touched::new_log(),
            drv,
        })
    }

    /// The driver (device, module and stream).
    pub fn driver(&self) -> &D {
        &self.drv
    }

    /// What the device says about itself.
    pub fn facts(&self) -> &DeviceFacts {
        self.drv.facts()
    }

    /// Free and total bytes of the device's memory (the whole device's, as
    /// its runtime reports them), where the runtime says.
    pub fn memory_info(&self) -> Option<(usize, usize)> {
        self.drv.memory_info()
    }

    /// The device's name, e.g. `NVIDIA H200`.
    pub fn device_name(&self) -> &str {
        &self.drv.facts().name
    }

    /// The device ordinal in its runtime.
    pub fn ordinal(&self) -> usize {
        self.drv.facts().ordinal
    }

    /// The backend's stream: every safe launch, copy, graph replay and
    /// timing event runs on it.
    pub fn stream(&self) -> RawStream {
        self.drv.stream()
    }

    /// Device address of the backend's 3 `u32` skip counters (slot,
    /// position, index).
    pub fn counters_ptr(&self) -> u64 {
        self.counters_ptr
    }

    /// The sanitize policy the backend was opened with (what
    /// [`Backend::sanitize`] started as on this device).
    pub fn sanitize_policy(&self) -> SanitizePolicy {
        self.sanitize_policy
    }

    /// The launch policy later launches use.
    pub fn launch_policy(&self) -> LaunchPolicy {
        self.policy
    }

    /// Sets the launch policy for later launches (captured graphs keep the
    /// kernels they captured).
    pub fn set_launch_policy(&mut self, policy: LaunchPolicy) {
        self.policy = policy;
    }

    /// A zeroed buffer of `len` bytes (waits for the memset).
    pub fn alloc_zeroed(&self, len: usize) -> Result<DeviceBuffer<D>> {
        let b = self.alloc(len, None)?;
        // SAFETY: `b` holds at least `len` bytes.
        unsafe { self.drv.memset(b.ptr, 0, len, self.stream())? };
        self.synchronize()?;
        Ok(b)
    }

    /// Copies `len` bytes from `src` to `dst` on the backend's stream
    /// (device to device; no wait). Capturable.
    pub fn copy(&self, src: &DeviceBuffer<D>, dst: &mut DeviceBuffer<D>, len: usize) -> Result<()> {
        self.own("src", src)?;
        self.own("dst", dst)?;
        for (arg, b) in [("src", src.len), ("dst", dst.len)] {
            if len > b {
                return Err(Error::OutOfBounds {
                    arg,
                    needed: len as u64,
                    available: b as u64,
                });
            }
        }
        if len == 0 {
            return Ok(());
        }
        // SAFETY: both buffers hold `len` bytes and are this device's.
        unsafe {
            self.drv
                .copy_on_device(dst.ptr, src.ptr, len, self.stream())
        }
    }

    fn alloc(&self, len: usize, stream: Option<&D::Stream>) -> Result<DeviceBuffer<D>> {
        let (mem, ptr) = self.drv.alloc(len, stream)?;
        Ok(DeviceBuffer {
            _mem: mem,
            ptr,
            len,
            owner: self.id,
        })
    }

    /// Checks that `b` was made by this backend (so it is ordered on its
    /// stream and lives on its device).
    fn own(&self, arg: &'static str, b: &DeviceBuffer<D>) -> Result<()> {
        if b.owner == self.id {
            Ok(())
        } else {
            Err(Error::Value {
                arg,
                problem: format!(
                    "buffer was made by another {} backend; use buffers with the backend that created them",
                    D::BACKEND
                ),
            })
        }
    }

    fn function(&self, kernel: Kernel) -> D::Function {
        // Every kernel was looked up when the backend was made.
        self.functions[kernel.index()]
    }

    /// Launches `l` (kernel and shape) with `params` by value on `stream`;
    /// `call` (what it writes) on success, else the error naming the rows
    /// it may have written.
    ///
    /// # Safety
    /// `params` is the parameter block `l.kernel` expects, and every address
    /// in it (and in `call`) is valid device memory of this device for the
    /// extents the plan it came from describes, until the kernel has run.
    unsafe fn launch<P: KernelParams>(
        &self,
        l: Launch,
        params: &P,
        stream: RawStream,
        call: CallRows,
    ) -> Result<CallRows> {
        let f = self.function(l.kernel);
        let g = l.geometry;
        let mut block = params.with_geometry(&g);
        match self
            .drv
            .launch(f, &g, stream, &mut block as *mut P as *mut c_void)
        {
            Ok(()) => Ok(call),
            Err(e) => Err(self.launch_failed(e, call, stream)),
        }
    }

    on_stream! {
        |g, p, t, c|
        compress_on(CompressPlan, CompressTensors) => (
            g.policy.compress_launch(p),
            kernel_abi::compress_params(p, &bind::compress_ptrs(t, c)),
            CallRows::compress(p, t),
        );
        insert_on(InsertPlan, InsertTensors, sanitize) => (
            g.policy.insert_launch(p),
            kernel_abi::insert_params(p, &bind::insert_ptrs(t, c), sanitize),
            CallRows::insert(p, t),
        );
        ring_on(RingRowsPlan, RingTensors) => {
            let (rows, slots, ring) = bind::ring_ptrs(t);
            (
                g.policy.ring_rows_launch(p),
                kernel_abi::ring_rows_params(p, rows, slots, ring, c),
                CallRows::ring(p, t),
            )
        };
        fused_on(FusedPlan, FusedTensors, sanitize) => (
            g.policy.fused_launch(p),
            kernel_abi::fused_params(
                p,
                &bind::compress_ptrs(&t.compress, c),
                &bind::fused_insert_ptrs(t, c),
                sanitize,
            ),
            CallRows::fused(p, t),
        );
        gather_on(GatherPlan, GatherTensors) => {
            let Some(l) = gather_launch(&g.policy, p.cache.layout, p.n, p.slot_kernels()) else {
                return Ok(CallRows::NONE);
            };
            let launch = Launch {
                kernel: gather_launch_kernel(p, &l),
                geometry: l.geometry,
            };
            (launch, gather_params(p, &bind::gather_ptrs(t, c), &l), CallRows::gather(p))
        };
        indexer_k_on(IndexerKPlan, IndexerKTensors) => (
            indexer_k_launch(&g.policy, p),
            indexer_k_params(p, &bind::indexer_k_ptrs(t, c)),
            CallRows::indexer_k(p, t),
        );
    }

    // ---- the raw API -------------------------------------------------------

    raw_op! {
        /// `rope_quant_insert` over caller-owned device memory on the caller's
        /// stream. Skipped tokens are counted at `raw_counters` (3 `u32`: slot,
        /// position, index) or, when `None`, in this backend's counters.
        /// `sanitize` (NaN sanitizing, `semantics.md`) is this call's own, as in
        /// [`crate::CpuBackend::rope_quant_insert_host`]: the backend's setting
        /// ([`Backend::sanitize`]) applies to the safe API only, so threads
        /// sharing a backend never see each other's choice.
        ///
        /// Checks, in this order on every backend: the arguments as in the safe
        /// API (dtypes, shapes, strides, offsets and, against each
        /// [`RawDevice::len`], extents); each address non-null and aligned as
        /// its view is read (16 bytes for rows and caches, the element size for
        /// index tensors and the cos/sin table, 4 for the FP8 scale), in the
        /// order the arguments are declared; then `raw_counters`. A call with no
        /// token (`N == 0`) returns after the first step, as the seed does: it
        /// touches no memory, and a framework's empty tensors may have null
        /// addresses. Nothing is allocated, copied or waited for, so the call
        /// can be captured. A launch that fails after the checks is an
        /// [`Error::Driver`] whose `touched` names the rows the call may have
        /// written, its index values read back where the device still answers.
        ///
        /// # Safety
        /// * every `ptr` is a device address of this backend's device (in its
        ///   context) of an allocation at least `len` bytes long (or long enough
        ///   for its view, when `len` is `usize::MAX`), that stays allocated
        ///   until the kernel has finished (or, when captured, for as long as
        ///   the graph may be replayed);
        /// * `stream` is a valid stream of that device (or
        ///   [`RawStream::DEFAULT`]), and the caller orders the kernel against
        ///   other work touching the same memory: the launch is ordered on
        ///   `stream` only;
        /// * written tensors (`kv_cache`) do not overlap any tensor the kernel reads;
        /// * `raw_counters`, when given, points to 3 writable `u32` of that
        ///   device; when `None`, the caller synchronizes `stream` before
        ///   [`Backend::take_skip_counts`] (which waits for the backend's stream
        ///   only) and does not launch concurrently with it.
        rope_quant_insert_raw(InsertArgs, plan_insert, insert_on, |p| p.n, sanitize);
    }

    raw_op! {
        /// `fused_save_compress_norm` over caller-owned device memory on the
        /// caller's stream; see [`GpuBackend::rope_quant_insert_raw`].
        ///
        /// # Safety
        /// As for [`GpuBackend::rope_quant_insert_raw`]; the written tensors are
        /// `latent_out` and (CR2) `state_cache`.
        fused_save_compress_norm_raw(CompressArgs, plan_compress, compress_on, |p| p.n);
    }

    raw_op! {
        /// `save_ring_rows` over caller-owned device memory on the caller's
        /// stream; see [`GpuBackend::rope_quant_insert_raw`].
        ///
        /// # Safety
        /// As for [`GpuBackend::rope_quant_insert_raw`]; the written tensor is
        /// `state_cache`.
        save_ring_rows_raw(RingArgs, plan_ring_rows, ring_on, |p| p.n);
    }

    raw_op! {
        /// The fused compress + insert over caller-owned device memory on the
        /// caller's stream; see [`GpuBackend::rope_quant_insert_raw`].
        ///
        /// # Safety
        /// As for [`GpuBackend::rope_quant_insert_raw`]; the written tensors are
        /// `latent_out` (unless skipped), (CR2) `state_cache` and `kv_cache`.
        fused_compress_insert_raw(FusedArgs, plan_fused, fused_on, |p| p.compress.n, sanitize);
    }

    raw_op! {
        /// `gather_dequant` over caller-owned device memory on the caller's
        /// stream; see [`GpuBackend::rope_quant_insert_raw`]. The checks come in
        /// the same order: the plan, then each address in argument order
        /// (`kv_cache` and `out` 16-byte aligned, the index tensors to their
        /// element size, `fp8_scale` to 4), then `raw_counters`.
        ///
        /// # Safety
        /// As for [`GpuBackend::rope_quant_insert_raw`]; the written tensor is
        /// `out`, which must not overlap the cache or the index tensors.
        gather_dequant_raw(GatherArgs, plan_gather, gather_on, |p| p.n);
    }

    raw_op! {
        /// `indexer_k_norm_rope_store` over caller-owned device memory on the
        /// caller's stream; see [`GpuBackend::rope_quant_insert_raw`]. The
        /// checks come in the same order: the plan, then each address in
        /// argument order (`k_cache` 16-byte aligned, every other tensor to
        /// its element size), then `raw_counters`.
        ///
        /// # Safety
        /// As for [`GpuBackend::rope_quant_insert_raw`]; the written tensor is
        /// `k_cache`.
        indexer_k_norm_rope_store_raw(IndexerKArgs, plan_indexer_k, indexer_k_on, |p| p.n);
    }

    /// The raw API after the plan, the same for every operation: nothing
    /// for a call with no token (nothing is read or written: a framework's
    /// empty tensors may have null addresses, and the seed returns there
    /// too); else each address non-null and aligned, in table order, then
    /// the counters, which `launch` gets.
    fn raw_go<'b>(
        &self,
        n: usize,
        each: impl FnOnce(&mut dyn FnMut(&Bound<'b, RawDevice>) -> Result<()>) -> Result<()>,
        raw_counters: Option<u64>,
        launch: impl FnOnce(u64) -> Result<CallRows>,
    ) -> Result<()> {
        if n == 0 {
            return Ok(());
        }
        each(&mut |b| bind::check_raw(b))?;
        let c = match raw_counters {
            None => self.counters_ptr,
            Some(p) => bind::aligned("raw_counters", p, 0, 4).map(|()| p)?,
        };
        launch(c).map(drop)
    }
}

impl<D: Driver> Drop for GpuBackend<D> {
    fn drop(&mut self) {
        // Work still queued may use the counters freed next; an error
        // cannot be reported from drop.
        let _ = self.drv.synchronize(self.drv.stream());
    }
}

impl<D: Driver> Backend for GpuBackend<D> {
    type Buffer = DeviceBuffer<D>;

    fn name(&self) -> String {
        let f = self.drv.facts();
        format!("{}:{} ({}, {})", D::BACKEND, f.ordinal, f.name, f.arch)
    }

    fn sanitize(&self) -> bool {
        self.sanitize
    }

    fn set_sanitize(&mut self, on: bool) {
        self.sanitize = on;
    }

    // The rest is the safe API on the backend's own stream.
    fn upload(&self, bytes: &[u8]) -> Result<DeviceBuffer<D>> {
        self.own_stream().upload(bytes)
    }

    fn write(&self, buf: &mut DeviceBuffer<D>, bytes: &[u8]) -> Result<()> {
        self.own_stream().write(buf, bytes)
    }

    fn read(&self, buf: &DeviceBuffer<D>) -> Result<Vec<u8>> {
        self.own_stream().read(buf)
    }

    fn fused_save_compress_norm(&self, a: CompressArgs<'_, DeviceBuffer<D>>) -> Result<()> {
        self.own_stream().fused_save_compress_norm(a)
    }

    fn rope_quant_insert(&self, a: InsertArgs<'_, DeviceBuffer<D>>) -> Result<()> {
        self.own_stream().rope_quant_insert(a)
    }

    fn save_ring_rows(&self, a: RingArgs<'_, DeviceBuffer<D>>) -> Result<()> {
        self.own_stream().save_ring_rows(a)
    }

    fn fused_compress_insert(&self, a: FusedArgs<'_, DeviceBuffer<D>>) -> Result<()> {
        self.own_stream().fused_compress_insert(a)
    }

    fn gather_dequant(&self, a: GatherArgs<'_, DeviceBuffer<D>>) -> Result<()> {
        self.own_stream().gather_dequant(a)
    }

    fn indexer_k_norm_rope_store(&self, a: IndexerKArgs<'_, DeviceBuffer<D>>) -> Result<()> {
        self.own_stream().indexer_k_norm_rope_store(a)
    }

    fn take_skip_counts(&self) -> Result<SkipCounts> {
        self.own_stream().take_skip_counts()
    }

    fn synchronize(&self) -> Result<()> {
        self.own_stream().synchronize()
    }
}
