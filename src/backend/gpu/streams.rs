//! Streams a [`GpuBackend`] makes, and the backend's safe API on one of
//! them ([`OnStream`]): threads that share a backend launch on streams of
//! their own, so that their work overlaps on the device.

use super::touched::CallRows;
use super::{DeviceBuffer, Driver, GpuBackend};
use crate::backend::raw::RawStream;
use crate::backend::Backend;
use crate::error::{Error, Result};
use crate::gather::{plan_gather, GatherArgs};
use crate::indexer_k::{plan_indexer_k, IndexerKArgs};
use crate::kernel_abi::{self, NUM_COUNTERS};
use crate::ops::{
    plan_compress, plan_fused, plan_insert, plan_ring_rows, Bound, CompressArgs, FusedArgs,
    InsertArgs, RingArgs, SkipCounts,
};

/// A stream of a [`GpuBackend`]'s device ([`GpuBackend::create_stream`]),
/// destroyed when dropped; work already queued on it still runs.
pub struct Stream<D: Driver> {
    inner: D::Stream,
    raw: RawStream,
    /// [`GpuBackend`]'s id of the backend that made it.
    owner: u64,
}

impl<D: Driver> Stream<D> {
    /// The native handle, for the `*_raw` entry points.
    pub fn raw(&self) -> RawStream {
        self.raw
    }
}

impl<D: Driver> std::fmt::Debug for Stream<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Stream {{ backend: {}, handle: {:#x} }}",
            D::BACKEND,
            self.raw.0
        )
    }
}

/// The safe API of a [`GpuBackend`] on one stream: launches, uploads,
/// writes and reads are ordered on it, and its buffers are allocated on it
/// (so a stream-ordered runtime frees them after the work queued there).
/// Buffers are the backend's, usable by its other views; work on different
/// streams is not ordered, so a buffer used on two streams is the caller's
/// to order. Sanitize starts as the backend's and is the view's own.
///
/// The skip counters are the backend's, shared by all its streams:
/// [`Backend::take_skip_counts`] on a view waits for its stream only.
pub struct OnStream<'a, D: Driver> {
    gpu: &'a GpuBackend<D>,
    stream: Option<&'a Stream<D>>,
    sanitize: bool,
}

impl<D: Driver> std::fmt::Debug for OnStream<'_, D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OnStream")
            .field("backend", &self.gpu.name())
            .field("stream", &self.raw())
            .field("sanitize", &self.sanitize)
            .finish()
    }
}

impl<D: Driver> GpuBackend<D> {
    /// A new stream of the backend's device, not ordered against the
    /// backend's own stream.
    pub fn create_stream(&self) -> Result<Stream<D>> {
        let (inner, raw) = self.drv.create_stream()?;
        Ok(Stream {
            inner,
            raw,
            owner: self.id,
        })
    }

    /// The safe API on `stream`, which this backend made (else an
    /// [`Error::Value`] naming `stream`).
    pub fn on_stream<'a>(&'a self, stream: &'a Stream<D>) -> Result<OnStream<'a, D>> {
        if stream.owner != self.id {
            return Err(Error::Value {
                arg: "stream",
                problem: format!(
                    "stream was made by another {} backend; use streams with the backend that created them",
                    D::BACKEND
                ),
            });
        }
        Ok(OnStream {
            gpu: self,
            stream: Some(stream),
            sanitize: self.sanitize,
        })
    }

    /// Waits for the work on `stream` (the safe API's or raw calls' on
    /// [`Stream::raw`]); a failure names the rows of the safe API's calls
    /// still pending there.
    pub fn synchronize_stream(&self, stream: &Stream<D>) -> Result<()> {
        self.on_stream(stream)?.synchronize()
    }

    /// The safe API on the backend's own stream, with its sanitize setting.
    pub(super) fn own_stream(&self) -> OnStream<'_, D> {
        OnStream {
            gpu: self,
            stream: None,
            sanitize: self.sanitize,
        }
    }
}

impl<D: Driver> OnStream<'_, D> {
    /// The stream's handle.
    pub fn raw(&self) -> RawStream {
        self.stream.map_or(self.gpu.stream(), Stream::raw)
    }

    /// The safe API after the plan, the same for every operation: each
    /// buffer of the tensor table (walked by `each`) must be the backend's;
    /// a call with no token (`n == 0`) launches nothing; `launch` gets the
    /// backend, the counters and the stream, and what it launched is kept
    /// until the stream is waited for.
    fn go<'b>(
        &self,
        n: usize,
        each: impl FnOnce(&mut dyn FnMut(&Bound<'b, DeviceBuffer<D>>) -> Result<()>) -> Result<()>,
        launch: impl FnOnce(&GpuBackend<D>, u64, RawStream) -> Result<CallRows>,
    ) -> Result<()> {
        each(&mut |b| b.buf.map_or(Ok(()), |buf| self.gpu.own(b.arg, buf)))?;
        if n == 0 {
            return Ok(());
        }
        let call = launch(self.gpu, self.gpu.counters_ptr, self.raw())?;
        self.gpu.launched(self.raw(), call);
        Ok(())
    }
}

/// One operation of the safe API: `$plan` validates the arguments, `go`
/// checks the buffers, and `$on` launches on the view's stream (with the
/// view's sanitize setting where the kernel takes one); `$n` reads the
/// plan's token count.
macro_rules! safe_op {
    ($name:ident, $args:ident, $plan:ident, $on:ident, |$p:ident| $n:expr $(, $sanitize:ident)?) => {
        fn $name(&self, a: $args<'_, DeviceBuffer<D>>) -> Result<()> {
            let ($p, t) = ($plan(&a)?, a.tensors());
            // SAFETY: the plan checked every view against its buffer's
            // length, `go` that the buffers are this backend's; they stay
            // borrowed for the call.
            self.go($n, |f| t.each(|_, b| f(b)), |g, c, s| unsafe {
                g.$on(&$p, &t, c, s $(, self.$sanitize)?)
            })
        }
    };
}

impl<D: Driver> Backend for OnStream<'_, D> {
    type Buffer = DeviceBuffer<D>;

    fn name(&self) -> String {
        self.gpu.name()
    }

    fn sanitize(&self) -> bool {
        self.sanitize
    }

    fn set_sanitize(&mut self, on: bool) {
        self.sanitize = on;
    }

    fn upload(&self, bytes: &[u8]) -> Result<DeviceBuffer<D>> {
        let mut b = self.gpu.alloc(bytes.len(), self.stream.map(|s| &s.inner))?;
        self.write(&mut b, bytes)?;
        Ok(b)
    }

    fn write(&self, buf: &mut DeviceBuffer<D>, bytes: &[u8]) -> Result<()> {
        self.gpu.own("write", buf)?;
        if bytes.len() > buf.len {
            return Err(Error::OutOfBounds {
                arg: "write",
                needed: bytes.len() as u64,
                available: buf.len as u64,
            });
        }
        if bytes.is_empty() {
            return Ok(());
        }
        // SAFETY: `buf` holds at least `bytes.len()` bytes; `bytes` stays
        // borrowed until the stream has been waited for.
        let r = unsafe { self.gpu.drv.copy_to_device(buf.ptr, bytes, self.raw()) };
        self.gpu.settle(self.raw(), r)?;
        self.synchronize()
    }

    fn read(&self, buf: &DeviceBuffer<D>) -> Result<Vec<u8>> {
        self.gpu.own("read", buf)?;
        let mut out = vec![0u8; buf.len];
        if !out.is_empty() {
            // SAFETY: `buf` holds `out.len()` bytes; the stream is waited for
            // before `out` is used.
            let r = unsafe { self.gpu.drv.copy_to_host(&mut out, buf.ptr, self.raw()) };
            self.gpu.settle(self.raw(), r)?;
        }
        self.synchronize()?;
        Ok(out)
    }

    safe_op!(
        fused_save_compress_norm,
        CompressArgs,
        plan_compress,
        compress_on,
        |p| p.n
    );
    safe_op!(
        rope_quant_insert,
        InsertArgs,
        plan_insert,
        insert_on,
        |p| p.n,
        sanitize
    );
    safe_op!(save_ring_rows, RingArgs, plan_ring_rows, ring_on, |p| p.n);
    safe_op!(
        fused_compress_insert,
        FusedArgs,
        plan_fused,
        fused_on,
        |p| p.compress.n,
        sanitize
    );
    safe_op!(gather_dequant, GatherArgs, plan_gather, gather_on, |p| p.n);
    safe_op!(
        indexer_k_norm_rope_store,
        IndexerKArgs,
        plan_indexer_k,
        indexer_k_on,
        |p| p.n
    );

    fn take_skip_counts(&self) -> Result<SkipCounts> {
        self.synchronize()?;
        let (drv, s, counters) = (&self.gpu.drv, self.raw(), self.gpu.counters_ptr);
        let mut c = [0u8; 4 * NUM_COUNTERS];
        // SAFETY: the counters hold 4 * NUM_COUNTERS bytes; the stream is
        // waited for before `c` is read, and the reset is ordered before any
        // later launch on the stream.
        unsafe {
            drv.copy_to_host(&mut c, counters, s)?;
            drv.synchronize(s)?;
            drv.memset(counters, 0, 4 * NUM_COUNTERS, s)?;
        }
        Ok(kernel_abi::skip_counts(&c))
    }

    fn synchronize(&self) -> Result<()> {
        let s = self.raw();
        self.gpu.settle(s, self.gpu.drv.synchronize(s))
    }
}
