//! How a subcommand times launches on each backend: wall clock on the CPU,
//! graph replay timed by events on GPUs (those in [`crate::select`]).

use dsv4_kvcache::{Backend, CpuBackend, Result};
use std::time::Instant;

/// What a subcommand needs beyond [`Backend`]: timing, which each backend
/// does its own way (wall clock on the CPU, events and graphs on GPUs).
pub(crate) trait Timing<B: Backend> {
    /// How times are measured, for the report.
    fn method(&self) -> &'static str;
    /// Whether this is the CPU reference itself.
    fn is_reference(&self) -> bool;
    /// Time per launch in µs for each of `replays` replays of `launches`
    /// calls of `f`.
    fn per_launch_us(
        &self,
        b: &B,
        launches: usize,
        replays: usize,
        f: &mut dyn FnMut(&B) -> Result<()>,
    ) -> Result<Vec<f32>>;
    /// Copy rate in bytes (read + written) per second for `bytes`-byte
    /// copies by the runtime's copy call (on GPUs, the copy engine's).
    fn copy_rate(&self, b: &B, bytes: usize, replays: usize) -> Result<f64>;
    /// The roofline every row is divided by: bytes (read + written) per
    /// second of a `bytes`-byte copy run the way the kernels run (on GPUs,
    /// the `kv_copy` kernel on the SMs / CUs; on the CPU, `memcpy`), with a
    /// few words on how it was run.
    fn roofline(
        &self,
        b: &B,
        bytes: usize,
        launches: usize,
        replays: usize,
    ) -> Result<(f64, String)>;
    /// Host time of one eager launch in µs (mean of `calls`, no wait between).
    fn host_launch_us(
        &self,
        b: &B,
        calls: usize,
        f: &mut dyn FnMut(&B) -> Result<()>,
    ) -> Result<f64>;
    /// Device memory in use (the whole device's, as its driver reports),
    /// where the backend can say; `soak` samples it.
    fn device_memory_used(&self, _b: &B) -> Option<u64> {
        None
    }
}

/// Wall-clock timing, for the CPU; `WallClock(false)` treats the CPU backend
/// as a device to be checked against the reference (`--backend cpu1`).
pub(crate) struct WallClock(pub(crate) bool);

impl Timing<CpuBackend> for WallClock {
    fn method(&self) -> &'static str {
        "wall clock (median of replays, each several launches)"
    }
    fn is_reference(&self) -> bool {
        self.0
    }
    fn per_launch_us(
        &self,
        b: &CpuBackend,
        launches: usize,
        replays: usize,
        f: &mut dyn FnMut(&CpuBackend) -> Result<()>,
    ) -> Result<Vec<f32>> {
        // One warm-up launch; it also sizes the replays to about 20 ms each
        // so that the large sizes finish in reasonable time.
        let t0 = Instant::now();
        f(b)?;
        let one = t0.elapsed().as_secs_f64();
        let launches = launches
            .min(((0.02 / one.max(1e-9)) as usize).max(1))
            .max(1);
        let mut out = Vec::with_capacity(replays);
        for _ in 0..replays {
            let t = Instant::now();
            for _ in 0..launches {
                f(b)?;
            }
            b.synchronize()?;
            out.push((t.elapsed().as_secs_f64() * 1e6 / launches as f64) as f32);
        }
        Ok(out)
    }
    fn copy_rate(&self, _b: &CpuBackend, bytes: usize, replays: usize) -> Result<f64> {
        let src = vec![1u8; bytes];
        let mut dst = vec![0u8; bytes];
        dst.copy_from_slice(&src);
        let mut times = Vec::new();
        for _ in 0..replays.max(1) {
            let t = Instant::now();
            dst.copy_from_slice(std::hint::black_box(&src));
            std::hint::black_box(&dst);
            times.push(t.elapsed().as_secs_f64());
        }
        Ok(2.0 * bytes as f64 / median_f64(&mut times).max(1e-12))
    }
    fn roofline(
        &self,
        b: &CpuBackend,
        bytes: usize,
        _launches: usize,
        replays: usize,
    ) -> Result<(f64, String)> {
        // The reference's roofline is the host's own copy.
        Ok((
            self.copy_rate(b, bytes, replays)?,
            "memcpy on one thread".into(),
        ))
    }
    fn host_launch_us(
        &self,
        b: &CpuBackend,
        calls: usize,
        f: &mut dyn FnMut(&CpuBackend) -> Result<()>,
    ) -> Result<f64> {
        host_launch_wall_us(b, calls, f)
    }
}

/// Host time of one eager launch in µs by the wall clock: one warm-up call
/// waited for, then the mean of `calls` calls with no wait between them.
pub(crate) fn host_launch_wall_us<B: Backend>(
    b: &B,
    calls: usize,
    f: &mut dyn FnMut(&B) -> Result<()>,
) -> Result<f64> {
    f(b)?;
    b.synchronize()?;
    let t = Instant::now();
    for _ in 0..calls {
        f(b)?;
    }
    let us = t.elapsed().as_secs_f64() * 1e6 / calls.max(1) as f64;
    b.synchronize()?;
    Ok(us)
}

/// The median (the upper one of an even count); sorts `v`.
pub(crate) fn median_f64(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// The median (the upper one of an even count).
pub(crate) fn median_f32(v: &[f32]) -> f32 {
    let mut v = v.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}
