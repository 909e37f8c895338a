//! Backend selection: `--backend`, opening CUDA, HIP or the CPU with the
//! sanitize policy of the environment, and the GPU backends' timing.
//!
//! Everything that differs between the backends is here (and in
//! [`crate::timing`]), so that the subcommands are written once over
//! [`Backend`] and [`Timing`].

use crate::timing::{Timing, WallClock};
use dsv4_kvcache::detect::SanitizePolicy;
use dsv4_kvcache::{Backend, CpuBackend, Error, Result};

/// The backend `--backend` asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Choice {
    /// CUDA, else HIP, else the CPU reference.
    Auto,
    /// The CPU reference.
    Cpu,
    /// The CPU reference on one thread, checked like a device (`cpu1`).
    Cpu1,
    /// CUDA device 0.
    Cuda,
    /// HIP device 0.
    Hip,
}

#[cfg(feature = "cuda")]
mod cuda_wiring {
    use crate::timing::Timing;
    use dsv4_kvcache::detect::{self, SanitizePolicy};
    use dsv4_kvcache::{Backend, CudaBackend, Result};

    /// CUDA device 0, sanitizing as the policy of the environment says.
    pub fn open() -> Result<CudaBackend> {
        let mut b = CudaBackend::new(0)?;
        b.set_sanitize(detect::sanitize_for_cuda(SanitizePolicy::from_env()?));
        Ok(b)
    }

    /// One line per device, or why there is none.
    pub fn facts() -> std::result::Result<Vec<String>, String> {
        let n = CudaBackend::device_count().map_err(|e| crate::select::reason(&e))?;
        if n == 0 {
            return Err("the CUDA driver is present but finds no device".into());
        }
        Ok((0..n)
            .map(|d| match CudaBackend::new(d) {
                Ok(b) => format!("{} — kernels loaded", b.name()),
                Err(e) => format!("cuda:{d}: {}", crate::select::reason(&e)),
            })
            .collect())
    }

    /// GPU time from CUDA-graph replay, as the anchors were measured.
    pub struct GraphTiming;

    impl Timing<CudaBackend> for GraphTiming {
        fn method(&self) -> &'static str {
            "CUDA graph replay, GPU time from events (median of replays)"
        }
        fn is_reference(&self) -> bool {
            false
        }
        fn per_launch_us(
            &self,
            b: &CudaBackend,
            launches: usize,
            replays: usize,
            f: &mut dyn FnMut(&CudaBackend) -> Result<()>,
        ) -> Result<Vec<f32>> {
            b.time_graph(launches, replays, || f(b))
        }
        fn copy_rate(&self, b: &CudaBackend, bytes: usize, replays: usize) -> Result<f64> {
            b.time_copy(bytes, replays)
        }
        fn host_launch_us(
            &self,
            b: &CudaBackend,
            calls: usize,
            f: &mut dyn FnMut(&CudaBackend) -> Result<()>,
        ) -> Result<f64> {
            b.host_launch_cost(calls, || f(b))
        }
    }
}

#[cfg(feature = "hip")]
mod hip_wiring {
    use crate::timing::Timing;
    use dsv4_kvcache::{Backend, HipBackend, Result};

    /// HIP device 0 (the backend applies the environment's sanitize policy).
    pub fn open() -> Result<HipBackend> {
        HipBackend::new(0)
    }

    /// The runtime and its devices, or why there are none.
    pub fn facts() -> std::result::Result<Vec<String>, String> {
        dsv4_kvcache::backend::hip::probe()
            .map(|s| s.lines().map(str::to_string).collect())
            .map_err(|e| crate::select::reason(&e))
    }

    /// GPU time from HIP-graph replay.
    pub struct GraphTiming;

    impl Timing<HipBackend> for GraphTiming {
        fn method(&self) -> &'static str {
            "HIP graph replay, GPU time from events (median of replays)"
        }
        fn is_reference(&self) -> bool {
            false
        }
        fn per_launch_us(
            &self,
            b: &HipBackend,
            launches: usize,
            replays: usize,
            f: &mut dyn FnMut(&HipBackend) -> Result<()>,
        ) -> Result<Vec<f32>> {
            let graph = b.capture(|b| {
                for _ in 0..launches {
                    f(b)?;
                }
                Ok(())
            })?;
            graph.launch()?;
            b.synchronize()?;
            let mut out = Vec::with_capacity(replays);
            for _ in 0..replays {
                let ms = b.time_ms(|_| graph.launch())?;
                out.push(ms * 1000.0 / launches as f32);
            }
            Ok(out)
        }
        fn copy_rate(&self, b: &HipBackend, bytes: usize, replays: usize) -> Result<f64> {
            b.time_copy(bytes, replays)
        }
        fn host_launch_us(
            &self,
            b: &HipBackend,
            calls: usize,
            f: &mut dyn FnMut(&HipBackend) -> Result<()>,
        ) -> Result<f64> {
            crate::timing::host_launch_wall_us(b, calls, f)
        }
    }
}

/// One line per CUDA device, or why there is none.
#[cfg(feature = "cuda")]
pub(crate) fn cuda_facts() -> std::result::Result<Vec<String>, String> {
    cuda_wiring::facts()
}

#[cfg(not(feature = "cuda"))]
pub(crate) fn cuda_facts() -> std::result::Result<Vec<String>, String> {
    Err("this binary was built without the `cuda` feature".into())
}

/// The HIP runtime and its devices, or why there are none.
#[cfg(feature = "hip")]
pub(crate) fn hip_facts() -> std::result::Result<Vec<String>, String> {
    hip_wiring::facts()
}

#[cfg(not(feature = "hip"))]
pub(crate) fn hip_facts() -> std::result::Result<Vec<String>, String> {
    Err("this binary was built without the `hip` feature".into())
}

/// A subcommand's work, generic over the backend it runs on.
pub(crate) trait Job {
    /// What the subcommand returns to its command.
    type Out;
    /// Runs on `b`, timed by `timing`; `notes` say how the backend was chosen.
    fn run<B: Backend, T: Timing<B>>(
        self,
        b: &mut B,
        timing: &T,
        notes: &[String],
    ) -> Result<Self::Out>;
}

#[cfg(any(not(feature = "cuda"), not(feature = "hip")))]
fn unavailable(backend: &'static str, reason: &str) -> Error {
    Error::Unavailable {
        backend,
        reason: reason.into(),
    }
}

#[cfg(feature = "cuda")]
fn try_cuda<J: Job>(job: J, notes: &[String]) -> std::result::Result<Result<J::Out>, (J, Error)> {
    match cuda_wiring::open() {
        Ok(mut b) => Ok(job.run(&mut b, &cuda_wiring::GraphTiming, notes)),
        Err(e) => Err((job, e)),
    }
}

#[cfg(not(feature = "cuda"))]
fn try_cuda<J: Job>(job: J, _notes: &[String]) -> std::result::Result<Result<J::Out>, (J, Error)> {
    Err((
        job,
        unavailable("cuda", "this binary was built without the `cuda` feature"),
    ))
}

#[cfg(feature = "hip")]
fn try_hip<J: Job>(job: J, notes: &[String]) -> std::result::Result<Result<J::Out>, (J, Error)> {
    match hip_wiring::open() {
        Ok(mut b) => Ok(job.run(&mut b, &hip_wiring::GraphTiming, notes)),
        Err(e) => Err((job, e)),
    }
}

#[cfg(not(feature = "hip"))]
fn try_hip<J: Job>(job: J, _notes: &[String]) -> std::result::Result<Result<J::Out>, (J, Error)> {
    Err((
        job,
        unavailable("hip", "this binary was built without the `hip` feature"),
    ))
}

fn cpu_backend() -> Result<CpuBackend> {
    let mut b = CpuBackend::new();
    b.set_sanitize(SanitizePolicy::from_env()? == SanitizePolicy::On);
    Ok(b)
}

/// Runs `job` on the chosen backend; `auto` tries CUDA, then HIP, then the CPU.
pub(crate) fn with_backend<J: Job>(choice: Choice, job: J) -> Result<J::Out> {
    let mut notes = Vec::new();
    let job = match choice {
        Choice::Cpu => job,
        Choice::Cpu1 => {
            let mut b = CpuBackend::with_threads(1)?;
            b.set_sanitize(SanitizePolicy::from_env()? == SanitizePolicy::On);
            return job.run(&mut b, &WallClock(false), &notes);
        }
        Choice::Cuda => match try_cuda(job, &notes) {
            Ok(r) => return r,
            Err((_, e)) => return Err(e),
        },
        Choice::Hip => match try_hip(job, &notes) {
            Ok(r) => return r,
            Err((_, e)) => return Err(e),
        },
        Choice::Auto => {
            let job = match try_cuda(job, &notes) {
                Ok(r) => return r,
                Err((job, e)) => {
                    notes.push(format!("auto: CUDA unavailable ({})", short_reason(&e)));
                    job
                }
            };
            match try_hip(job, &notes) {
                Ok(r) => return r,
                Err((job, e)) => {
                    notes.push(format!(
                        "auto: HIP unavailable ({}); using the CPU (details: dsv4-kvcache info)",
                        short_reason(&e)
                    ));
                    job
                }
            }
        }
    };
    job.run(&mut cpu_backend()?, &WallClock(true), &notes)
}

// ---- small helpers ----------------------------------------------------------------

/// Why a backend is unavailable (without the "X backend unavailable" prefix).
pub(crate) fn reason(e: &Error) -> String {
    match e {
        Error::Unavailable { reason, .. } => reason.clone(),
        other => other.to_string(),
    }
}

/// The first clause of a backend's reason, for one-line notes.
fn short_reason(e: &Error) -> String {
    let full = reason(e);
    let cut = full.find([':', ';', '(']).unwrap_or(full.len());
    full[..cut].trim().to_string()
}
