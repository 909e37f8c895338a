//! Backend selection: `--backend`, opening CUDA, HIP or the CPU with the
//! sanitize policy of the environment, and the GPU backends' timing.
//!
//! Everything that differs between the backends is here (and in
//! [`crate::timing`]), so that the subcommands are written once over
//! [`Backend`] and [`Timing`].

use crate::timing::{Timing, WallClock};
#[cfg(any(feature = "cuda", feature = "hip"))]
use dsv4_kvcache::backend::gpu::{Driver, GpuBackend};
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

/// GPU time from graph replay (CUDA and HIP alike: one GPU backend type).
#[cfg(any(feature = "cuda", feature = "hip"))]
struct GraphTiming;

#[cfg(any(feature = "cuda", feature = "hip"))]
impl<D: Driver> Timing<GpuBackend<D>> for GraphTiming {
    fn method(&self) -> &'static str {
        if D::BACKEND == "cuda" {
            "CUDA graph replay, GPU time from events (median of replays)"
        } else {
            "HIP graph replay, GPU time from events (median of replays)"
        }
    }
    fn is_reference(&self) -> bool {
        false
    }
    fn per_launch_us(
        &self,
        b: &GpuBackend<D>,
        launches: usize,
        replays: usize,
        f: &mut dyn FnMut(&GpuBackend<D>) -> Result<()>,
    ) -> Result<Vec<f32>> {
        b.time_graph(launches, replays, || f(b))
    }
    fn copy_rate(&self, b: &GpuBackend<D>, bytes: usize, replays: usize) -> Result<f64> {
        b.time_copy(bytes, replays)
    }
    fn roofline(
        &self,
        b: &GpuBackend<D>,
        bytes: usize,
        launches: usize,
        replays: usize,
    ) -> Result<(f64, String)> {
        let r = b.time_sm_copy(bytes, launches, replays)?;
        let sms = b
            .facts()
            .multiprocessors
            .map_or("unknown".to_string(), |n| n.to_string());
        Ok((
            r.bytes_per_s,
            format!(
                "kv_copy kernel, best grid {} x {} threads ({sms} multiprocessors)",
                r.grid, r.block
            ),
        ))
    }
    fn host_launch_us(
        &self,
        b: &GpuBackend<D>,
        calls: usize,
        f: &mut dyn FnMut(&GpuBackend<D>) -> Result<()>,
    ) -> Result<f64> {
        b.host_launch_cost(calls, || f(b))
    }
    fn device_memory_used(&self, b: &GpuBackend<D>) -> Option<u64> {
        b.synchronize().ok()?;
        let (free, total) = b.memory_info()?;
        Some(total.saturating_sub(free) as u64)
    }
}

#[cfg(feature = "cuda")]
mod cuda_wiring {
    use dsv4_kvcache::{Backend, CudaBackend, Result};

    /// CUDA device 0 (the backend applies the environment's policies).
    pub fn open() -> Result<CudaBackend> {
        CudaBackend::new(0)
    }

    /// One line per device, or why there is none.
    pub fn facts() -> std::result::Result<Vec<String>, String> {
        let n = CudaBackend::device_count().map_err(|e| crate::select::reason(&e))?;
        if n == 0 {
            return Err("the CUDA driver is present but finds no device".into());
        }
        Ok((0..n)
            .map(|d| match CudaBackend::new(d) {
                Ok(b) => format!(
                    "{} — kernels loaded ({}); {}",
                    b.name(),
                    b.facts().kernels,
                    hw_formats(&b)
                ),
                Err(e) => format!("cuda:{d}: {}", crate::select::reason(&e)),
            })
            .collect())
    }

    /// What the device's self-check says about the hardware conversions
    /// its kernels use in place of the software definitions.
    fn hw_formats(b: &CudaBackend) -> String {
        match b.check_hw_formats() {
            Ok(r) if r.exact() => format!(
                "hardware conversions exact (BF16 pairs {}, e4m3 pairs {})",
                if r.bf16x2 {
                    "on all 2^32 inputs"
                } else {
                    "not used"
                },
                if r.e4m3x2 {
                    "on every non-NaN input"
                } else {
                    "not used"
                }
            ),
            Ok(r) => format!("HARDWARE CONVERSIONS DIFFER FROM THE DEFINITIONS: {r:?}"),
            Err(e) => format!(
                "hardware conversions not checked: {}",
                crate::select::reason(&e)
            ),
        }
    }
}

#[cfg(feature = "hip")]
mod hip_wiring {
    use dsv4_kvcache::{HipBackend, Result};

    /// HIP device 0 (the backend applies the environment's policies).
    pub fn open() -> Result<HipBackend> {
        HipBackend::new(0)
    }

    /// The runtime and its devices, or why there are none.
    pub fn facts() -> std::result::Result<Vec<String>, String> {
        dsv4_kvcache::backend::hip::probe()
            .map(|s| s.lines().map(str::to_string).collect())
            .map_err(|e| crate::select::reason(&e))
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

/// A job's result on an opened backend, or the job back with why the backend
/// did not open.
type Tried<J> = std::result::Result<Result<<J as Job>::Out>, (J, Error)>;

/// Defines `$name`, which runs a job on the backend `$wiring` opens, or hands
/// the job back where the backend is absent or this binary lacks `$feature`.
macro_rules! try_backend {
    ($name:ident, $feature:literal, $wiring:ident) => {
        #[cfg(feature = $feature)]
        fn $name<J: Job>(job: J, notes: &[String]) -> Tried<J> {
            match $wiring::open() {
                Ok(mut b) => Ok(job.run(&mut b, &GraphTiming, notes)),
                Err(e) => Err((job, e)),
            }
        }

        #[cfg(not(feature = $feature))]
        fn $name<J: Job>(job: J, _notes: &[String]) -> Tried<J> {
            let why = concat!("this binary was built without the `", $feature, "` feature");
            Err((job, unavailable($feature, why)))
        }
    };
}

try_backend!(try_cuda, "cuda", cuda_wiring);
try_backend!(try_hip, "hip", hip_wiring);

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
