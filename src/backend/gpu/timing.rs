//! Graph capture and the bench's timing: graph replay times from events,
//! the copy rooflines (a driver copy and an SM copy kernel from the shared
//! kernel source), and the host cost of a launch. Nothing here runs in a
//! serving call; the bench and the graph tests use it.

use super::bind::DevAddr;
use super::{Driver, GpuBackend};
use crate::backend::Backend;
use crate::error::{Error, Result};
use crate::kernel_abi::{self, Geometry, Kernel};
use std::ffi::c_void;
use std::time::Instant;

impl<D: Driver> GpuBackend<D> {
    /// Captures `calls` calls of `f` (which launches on this backend's
    /// stream) into a graph, without running them. The capture is
    /// thread-local: anything `f` does that a capture forbids (an
    /// allocation, a copy from the host, a wait) fails, and the capture is
    /// ended on every exit, so the stream stays usable.
    pub fn capture<F: FnMut() -> Result<()>>(
        &self,
        calls: usize,
        mut f: F,
    ) -> Result<CapturedGraph<'_, D>> {
        self.drv.begin_capture()?;
        struct Guard<'a, D: Driver>(Option<&'a D>);
        impl<D: Driver> Drop for Guard<'_, D> {
            fn drop(&mut self) {
                if let Some(d) = self.0.take() {
                    // Drops (destroys) the partial graph, if any.
                    let _ = d.end_capture();
                }
            }
        }
        let mut guard = Guard(Some(&self.drv));
        for _ in 0..calls {
            f()?;
        }
        guard.0 = None;
        let graph = self.drv.end_capture()?.ok_or_else(|| {
            Error::driver(
                D::BACKEND,
                "end of stream capture",
                "the capture recorded no work",
            )
        })?;
        Ok(CapturedGraph {
            graph,
            calls,
            backend: self,
        })
    }

    /// Replays `graph` `replays` times back to back (after one warm-up
    /// replay), with an event between replays; the milliseconds of each.
    ///
    /// # Safety
    /// As for [`CapturedGraph::launch`].
    unsafe fn replay_ms(&self, graph: &CapturedGraph<'_, D>, replays: usize) -> Result<Vec<f32>> {
        let events = (0..=replays)
            .map(|_| self.drv.create_event())
            .collect::<Result<Vec<_>>>()?;
        graph.launch()?;
        for (i, e) in events.iter().enumerate() {
            self.drv.record_event(e)?;
            if i < replays {
                graph.launch()?;
            }
        }
        self.synchronize()?;
        events
            .windows(2)
            .map(|w| self.drv.elapsed_ms(&w[0], &w[1]))
            .collect()
    }

    /// GPU time per launch: captures `launches_per_graph` calls of `f` into
    /// a graph on the backend's stream, replays it `replays` times (after
    /// one warm-up replay) and returns, for each replay, its event-measured
    /// time divided by `launches_per_graph`, in microseconds.
    ///
    /// The launches rewrite the same outputs on every replay (and CR2 rings
    /// see the previous replay's stores), which does not change their cost.
    pub fn time_graph<F: FnMut() -> Result<()>>(
        &self,
        launches_per_graph: usize,
        replays: usize,
        f: F,
    ) -> Result<Vec<f32>> {
        if launches_per_graph == 0 {
            return Err(Error::Value {
                arg: "launches_per_graph",
                problem: "must be at least 1".into(),
            });
        }
        // `f` (and whatever it owns or borrows) stays alive until the replays
        // have been waited for.
        let mut f = f;
        let graph = self.capture(launches_per_graph, &mut f)?;
        // SAFETY: the buffers the captured launches use are owned or borrowed
        // by `f`, which outlives the replays (waited for in `replay_ms`).
        let ms = unsafe { self.replay_ms(&graph, replays)? };
        Ok(ms
            .into_iter()
            .map(|m| m * 1000.0 / launches_per_graph as f32)
            .collect())
    }

    /// Device-to-device copy bandwidth, the roofline of the kernels: one
    /// `bytes`-byte copy captured in a graph, replayed `replays` times (after
    /// a warm-up) with events; returns the bytes read plus written per
    /// second (`2 * bytes / t`) at the median replay time `t`.
    pub fn time_copy(&self, bytes: usize, replays: usize) -> Result<f64> {
        if bytes == 0 || replays == 0 {
            return Err(Error::Value {
                arg: if bytes == 0 { "bytes" } else { "replays" },
                problem: "must be at least 1".into(),
            });
        }
        let src = self.alloc_zeroed(bytes)?;
        let mut dst = self.alloc_zeroed(bytes)?;
        let graph = self.capture(1, || self.copy(&src, &mut dst, bytes))?;
        // SAFETY: `src` and `dst` outlive the replays, which are waited for.
        let mut ms = unsafe { self.replay_ms(&graph, replays)? };
        ms.sort_by(|a, b| a.total_cmp(b));
        let t = f64::from(ms[ms.len() / 2]) / 1000.0;
        Ok(2.0 * bytes as f64 / t.max(1e-9))
    }

    /// The SM copy roofline: what the kernels' own cores can move, timed
    /// like the kernels. `kv_copy` copies `bytes` (rounded down to 16-byte
    /// units, at least one) from one buffer to another, `launches` launches
    /// captured in a graph replayed `replays` times (after a warm-up); the
    /// result is the bytes read plus written per second (`2 * bytes / t`)
    /// at the median time per launch `t`, the best over a few grid shapes
    /// (persistent grids of 4, 8 and 16 blocks per multiprocessor where the
    /// device says how many it has, and one block per 1024 units), so that
    /// the figure is the copy's best, not one guess's.
    ///
    /// Use a buffer several times the L2 (1 GiB on an H200 or MI300X) so
    /// that the copy runs from memory. The copy engine's rate is
    /// [`GpuBackend::time_copy`]'s, which on an H200 is about two thirds of
    /// this.
    pub fn time_sm_copy(
        &self,
        bytes: usize,
        launches: usize,
        replays: usize,
    ) -> Result<SmCopyRate> {
        if bytes < 16 || launches == 0 || replays == 0 {
            return Err(Error::Value {
                arg: if bytes < 16 {
                    "bytes"
                } else if launches == 0 {
                    "launches"
                } else {
                    "replays"
                },
                problem: if bytes < 16 {
                    "must be at least 16".into()
                } else {
                    "must be at least 1".into()
                },
            });
        }
        let units = (bytes / 16) as u64;
        let bytes = units as usize * 16;
        let src = self.alloc_zeroed(bytes)?;
        let dst = self.alloc_zeroed(bytes)?;
        let block = kernel_abi::BLOCK_THREADS;
        // The kernel moves four units per thread per pass.
        let cover = units
            .div_ceil(4 * u64::from(block))
            .clamp(1, i32::MAX as u64) as u32;
        let mut grids = vec![cover];
        if let Some(sms) = self.facts().multiprocessors {
            grids.extend([4u32, 8, 16].map(|w| sms.saturating_mul(w)));
        }
        let f = self.function(Kernel::Copy);
        let mut best: Option<SmCopyRate> = None;
        for grid in grids {
            let params = kernel_abi::CopyParams {
                src: src.addr(),
                dst: dst.addr(),
                units,
            };
            let g = Geometry {
                grid,
                block_threads: block,
                groups_log2: 0,
                token_blocks: kernel_abi::TokenBlocks::Items,
                shared_bytes: 0,
            };
            let us = self.time_graph(launches, replays, || {
                let mut p = params;
                let p = &mut p as *mut kernel_abi::CopyParams as *mut c_void;
                // SAFETY: `kv_copy` takes a CopyParams; both buffers hold
                // `units` 16-byte units and outlive the replays, which
                // `time_graph` waits for.
                unsafe { self.drv.launch(f, &g, self.stream(), p) }
            })?;
            let mut us = us;
            us.sort_by(|a, b| a.total_cmp(b));
            let t = f64::from(us[us.len() / 2]) * 1e-6;
            let rate = 2.0 * bytes as f64 / t.max(1e-12);
            if best.as_ref().is_none_or(|b| rate > b.bytes_per_s) {
                best = Some(SmCopyRate {
                    bytes_per_s: rate,
                    bytes,
                    grid,
                    block,
                });
            }
        }
        // At least one grid was timed.
        best.ok_or_else(|| Error::Value {
            arg: "bytes",
            problem: "no grid to time".into(),
        })
    }

    /// Host cost of launching: calls `f` (eager launches on this backend)
    /// `calls` times after one warm-up call, and returns the mean host time
    /// per call in microseconds, not counting the final wait for the device.
    /// (GPU time is [`GpuBackend::time_graph`]'s.)
    pub fn host_launch_cost<F: FnMut() -> Result<()>>(
        &self,
        calls: usize,
        mut f: F,
    ) -> Result<f64> {
        if calls == 0 {
            return Err(Error::Value {
                arg: "calls",
                problem: "must be at least 1".into(),
            });
        }
        f()?;
        self.synchronize()?;
        let t0 = Instant::now();
        for _ in 0..calls {
            f()?;
        }
        let us = t0.elapsed().as_secs_f64() * 1e6 / calls as f64;
        self.synchronize()?;
        Ok(us)
    }
}

/// The SM copy roofline of [`GpuBackend::time_sm_copy`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SmCopyRate {
    /// Bytes read plus written per second.
    pub bytes_per_s: f64,
    /// Bytes copied per launch (each read once and written once).
    pub bytes: usize,
    /// The grid (blocks) of the fastest shape.
    pub grid: u32,
    /// Threads per block.
    pub block: u32,
}

/// A graph of launches captured on a [`GpuBackend`]'s stream.
pub struct CapturedGraph<'b, D: Driver> {
    graph: D::Graph,
    calls: usize,
    /// The graph's kernels live in the backend's module.
    backend: &'b GpuBackend<D>,
}

impl<D: Driver> CapturedGraph<'_, D> {
    /// How many calls of the capture closure it holds.
    pub fn calls(&self) -> usize {
        self.calls
    }

    /// Replays the graph on the backend's stream (no wait). It reads and
    /// writes the buffers' current contents.
    ///
    /// # Safety
    /// Every buffer (and raw device pointer) the captured launches used must
    /// still be allocated: a graph holds device addresses, not borrows.
    pub unsafe fn launch(&self) -> Result<()> {
        self.backend.drv.launch_graph(&self.graph)
    }
}
