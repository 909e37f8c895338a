//! `dsv4-kvcache`: the command-line tool.
//!
//! ```text
//! dsv4-kvcache info
//! dsv4-kvcache demo    [--backend auto|cpu|cuda|hip] [--requests R] [--prefill-tokens P] [--decode-steps D] [--seed S]
//! dsv4-kvcache verify  FILE... [--backend auto|cpu|cuda|hip]
//! dsv4-kvcache bench   [--backend auto|cpu|cuda|hip] [--tokens 1,16,128] [--only insert,fused] [--out FILE.json]
//! dsv4-kvcache capture --op OP [--layout L] [--cr N] [--tokens T] [--requests R] [--seed S]
//!                      [--sanitize] [--adversarial] --out FILE.safetensors
//! ```
//!
//! Exit status: 0 on success, 1 when a check failed (a byte differs from the
//! reference), 2 on a usage error, an unreadable file or an unavailable backend.

use dsv4_kvcache::detect::{self, SanitizePolicy};
use dsv4_kvcache::formats::bf16_from_f32;
use dsv4_kvcache::layout::{decode_record, RecordLayout, DIM};
use dsv4_kvcache::reference::rotate;
use dsv4_kvcache::testkit::{make_case, rope_cos_sin, CaseSpec, Rng};
use dsv4_kvcache::vectors::{Op, VectorFile};
use dsv4_kvcache::{
    Backend, CompressArgs, CpuBackend, DType, Error, InsertArgs, Result, Tensor, TensorDesc,
    TensorMut,
};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::process::ExitCode;
use std::time::Instant;

const USAGE: &str = "\
dsv4-kvcache: DeepSeek V4 KV-cache records, bit-identical on the CPU, CUDA and HIP

usage:
  dsv4-kvcache info
      version, embedded kernels, devices found, sanitize policy
  dsv4-kvcache demo [--backend auto|cpu|cuda|hip] [--requests R] [--prefill-tokens P]
                    [--decode-steps D] [--seed S]
      chunked prefill and decode through the CR2 ring into all five cache layouts,
      checked byte for byte against the CPU reference
  dsv4-kvcache verify FILE... [--backend auto|cpu|cuda|hip]
      replay test-vector files (safetensors) and compare every output byte
  dsv4-kvcache bench [--backend auto|cpu|cuda|hip] [--tokens 1,16,128,...] [--only NAME,...]
                    [--out FILE.json]
      time per launch, bandwidth and the seed's H200 anchors; --only keeps the rows whose
      label contains a NAME ('insert nvfp4', 'compress CR2', 'fused CR1 v4', 'host')
  dsv4-kvcache capture --op OP [--layout v4|mxfp8|nvfp4|bf16|fp8] [--cr 1|2] [--tokens T]
                       [--requests R] [--ring-capacity C] [--seed S] [--sanitize] [--adversarial]
                       --out FILE.safetensors
      write a test-vector file whose outputs come from the CPU reference
      (OP: rope_quant_insert, fused_save_compress_norm, save_ring_rows, fused_compress_insert)

environment: DSV4_KVCACHE_SANITIZE=auto|on|off (NaN sanitizing; auto = on for gfx950 only)
exit status: 0 ok, 1 a check failed, 2 usage error, unreadable file or unavailable backend";

// ---- errors and exit codes -----------------------------------------------------

enum CliError {
    /// Bad command line: exit 2 with the usage hint.
    Usage(String),
    /// The library failed (load error, unavailable backend): exit 2.
    Lib(Error),
    /// A check failed (mismatch): exit 1; the details were printed.
    Check(String),
}

impl From<Error> for CliError {
    fn from(e: Error) -> Self {
        CliError::Lib(e)
    }
}

type CliResult<T> = std::result::Result<T, CliError>;

/// Restores the default action of SIGPIPE, so that `dsv4-kvcache bench | head`
/// ends quietly instead of panicking on a closed stdout (Rust ignores SIGPIPE).
#[cfg(unix)]
fn default_sigpipe() {
    extern "C" {
        fn signal(signum: i32, handler: usize) -> usize;
    }
    const SIGPIPE: i32 = 13; // Linux and macOS
    const SIG_DFL: usize = 0;
    // SAFETY: `signal` from the C library, called before any other thread
    // exists, with a valid signal number and the default handler.
    unsafe {
        signal(SIGPIPE, SIG_DFL);
    }
}

#[cfg(not(unix))]
fn default_sigpipe() {}

fn main() -> ExitCode {
    default_sigpipe();
    let args: Vec<String> = std::env::args().skip(1).collect();
    match run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(CliError::Usage(m)) => {
            eprintln!("error: {m}\n\nrun `dsv4-kvcache help` for usage");
            ExitCode::from(2)
        }
        Err(CliError::Lib(e)) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
        Err(CliError::Check(m)) => {
            eprintln!("FAIL: {m}");
            ExitCode::from(1)
        }
    }
}

fn run(args: Vec<String>) -> CliResult<()> {
    let Some((cmd, rest)) = args.split_first() else {
        println!("{USAGE}");
        return Ok(());
    };
    match cmd.as_str() {
        "help" | "-h" | "--help" => {
            println!("{USAGE}");
            Ok(())
        }
        "-V" | "--version" | "version" => {
            println!("dsv4-kvcache {}", env!("CARGO_PKG_VERSION"));
            Ok(())
        }
        "info" => {
            Opts::parse(rest, &[], &[])?.no_positional()?;
            info()
        }
        "demo" => demo_cmd(rest),
        "verify" => verify_cmd(rest),
        "bench" => bench_cmd(rest),
        "capture" => capture_cmd(rest),
        other => Err(CliError::Usage(format!("unknown command {other:?}"))),
    }
}

// ---- argument parsing ------------------------------------------------------------

/// Parsed options: `--name value`, `--name=value` and `--flag`.
struct Opts {
    values: BTreeMap<String, String>,
    flags: Vec<String>,
    positional: Vec<String>,
}

impl Opts {
    fn parse(args: &[String], value_opts: &[&str], flag_opts: &[&str]) -> CliResult<Opts> {
        let mut o = Opts {
            values: BTreeMap::new(),
            flags: Vec::new(),
            positional: Vec::new(),
        };
        let mut it = args.iter();
        while let Some(a) = it.next() {
            if a == "-h" || a == "--help" {
                println!("{USAGE}");
                std::process::exit(0);
            }
            let Some(body) = a.strip_prefix("--") else {
                o.positional.push(a.clone());
                continue;
            };
            let (name, inline) = match body.split_once('=') {
                Some((n, v)) => (n, Some(v.to_string())),
                None => (body, None),
            };
            if value_opts.contains(&name) {
                let v = match inline {
                    Some(v) => v,
                    None => it
                        .next()
                        .cloned()
                        .ok_or_else(|| CliError::Usage(format!("--{name} needs a value")))?,
                };
                o.values.insert(name.to_string(), v);
            } else if flag_opts.contains(&name) && inline.is_none() {
                o.flags.push(name.to_string());
            } else {
                return Err(CliError::Usage(format!("unknown option --{name}")));
            }
        }
        Ok(o)
    }

    fn no_positional(&self) -> CliResult<()> {
        match self.positional.first() {
            Some(p) => Err(CliError::Usage(format!("unexpected argument {p:?}"))),
            None => Ok(()),
        }
    }

    fn get(&self, name: &str) -> Option<&str> {
        self.values.get(name).map(String::as_str)
    }

    fn flag(&self, name: &str) -> bool {
        self.flags.iter().any(|f| f == name)
    }

    fn num<T: std::str::FromStr>(&self, name: &str, default: T) -> CliResult<T> {
        match self.get(name) {
            None => Ok(default),
            Some(v) => v
                .parse()
                .map_err(|_| CliError::Usage(format!("--{name} {v:?} is not a valid number"))),
        }
    }

    fn backend(&self) -> CliResult<Choice> {
        match self.get("backend").unwrap_or("auto") {
            "auto" => Ok(Choice::Auto),
            "cpu" => Ok(Choice::Cpu),
            // Undocumented self-check: the CPU reference on one thread,
            // treated as a device and compared with the multi-threaded one.
            "cpu1" => Ok(Choice::Cpu1),
            "cuda" => Ok(Choice::Cuda),
            "hip" => Ok(Choice::Hip),
            other => Err(CliError::Usage(format!(
                "--backend {other:?}, expected auto, cpu, cuda or hip"
            ))),
        }
    }
}

// ---- backends ---------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Choice {
    Auto,
    Cpu,
    Cpu1,
    Cuda,
    Hip,
}

/// What a subcommand needs beyond [`Backend`]: timing, which each backend
/// does its own way (wall clock on the CPU, events and graphs on GPUs).
trait Timing<B: Backend> {
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
    /// Copy rate in bytes (read + written) per second for `bytes`-byte copies.
    fn copy_rate(&self, b: &B, bytes: usize, replays: usize) -> Result<f64>;
    /// Host time of one eager launch in µs (mean of `calls`, no wait between).
    fn host_launch_us(
        &self,
        b: &B,
        calls: usize,
        f: &mut dyn FnMut(&B) -> Result<()>,
    ) -> Result<f64>;
}

/// Wall-clock timing, for the CPU; `WallClock(false)` treats the CPU backend
/// as a device to be checked against the reference (`--backend cpu1`).
struct WallClock(bool);

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
    fn host_launch_us(
        &self,
        b: &CpuBackend,
        calls: usize,
        f: &mut dyn FnMut(&CpuBackend) -> Result<()>,
    ) -> Result<f64> {
        f(b)?;
        let t = Instant::now();
        for _ in 0..calls {
            f(b)?;
        }
        let us = t.elapsed().as_secs_f64() * 1e6 / calls.max(1) as f64;
        b.synchronize()?;
        Ok(us)
    }
}

#[cfg(feature = "cuda")]
mod cuda_wiring {
    use super::Timing;
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
        let n = CudaBackend::device_count().map_err(|e| super::reason(&e))?;
        if n == 0 {
            return Err("the CUDA driver is present but finds no device".into());
        }
        Ok((0..n)
            .map(|d| match CudaBackend::new(d) {
                Ok(b) => format!("{} — kernels loaded", b.name()),
                Err(e) => format!("cuda:{d}: {}", super::reason(&e)),
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
    use super::Timing;
    use dsv4_kvcache::{Backend, HipBackend, Result};
    use std::time::Instant;

    /// HIP device 0 (the backend applies the environment's sanitize policy).
    pub fn open() -> Result<HipBackend> {
        HipBackend::new(0)
    }

    /// The runtime and its devices, or why there are none.
    pub fn facts() -> std::result::Result<Vec<String>, String> {
        dsv4_kvcache::backend::hip::probe()
            .map(|s| s.lines().map(str::to_string).collect())
            .map_err(|e| super::reason(&e))
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
    }
}

/// A subcommand's work, generic over the backend it runs on.
trait Job {
    type Out;
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
fn with_backend<J: Job>(choice: Choice, job: J) -> Result<J::Out> {
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
fn reason(e: &Error) -> String {
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

fn median_f64(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn median_f32(v: &[f32]) -> f32 {
    let mut v = v.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn i64_bytes(v: &[i64]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn u16_bytes(v: &[u16]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn tok_rate(r: f64) -> String {
    if r >= 1e9 {
        format!("{:.2} G", r / 1e9)
    } else if r >= 1e6 {
        format!("{:.2} M", r / 1e6)
    } else if r >= 1e3 {
        format!("{:.1} k", r / 1e3)
    } else {
        format!("{r:.0} ")
    }
}

// ---- info ---------------------------------------------------------------------------

fn info() -> CliResult<()> {
    use dsv4_kvcache::kernels;
    println!("dsv4-kvcache {}", env!("CARGO_PKG_VERSION"));
    println!();
    println!("build");
    println!(
        "  features: cuda {}, hip {}",
        if cfg!(feature = "cuda") { "on" } else { "off" },
        if cfg!(feature = "hip") { "on" } else { "off" }
    );
    match kernels::cuda_compiler() {
        Some(c) => println!(
            "  CUDA kernels: {} (built by {c})",
            kernels::cuda_targets().join(", ")
        ),
        None => println!("  CUDA kernels: none embedded"),
    }
    match kernels::hip_compiler() {
        Some(c) => println!(
            "  HIP kernels:  {} (built by {c})",
            kernels::hip_targets().join(", ")
        ),
        None => println!("  HIP kernels:  none embedded"),
    }
    for r in kernels::missing_reasons() {
        println!("  missing: {r}");
    }
    println!();
    println!("runtime");
    println!(
        "  CPU: {} threads (rayon), {} hardware threads",
        rayon::current_num_threads(),
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    match cuda_facts() {
        Ok(lines) => lines.iter().for_each(|l| println!("  CUDA: {l}")),
        Err(why) => println!("  CUDA: unavailable: {why}"),
    }
    match hip_facts() {
        Ok(lines) => lines.iter().for_each(|l| println!("  HIP: {l}")),
        Err(why) => println!("  HIP: unavailable: {why}"),
    }
    println!();
    println!("sanitize (NaN → 0 before quantization, UE8M0 scale capped at 254)");
    let raw = std::env::var(detect::SANITIZE_ENV).ok();
    println!(
        "  {}={}",
        detect::SANITIZE_ENV,
        raw.as_deref()
            .map_or("(unset)".to_string(), |v| format!("{v:?}"))
    );
    match SanitizePolicy::from_env() {
        Ok(p) => {
            let on = |b: bool| if b { "on" } else { "off" };
            println!("  policy: {p}");
            println!("  cpu: {}", on(p == SanitizePolicy::On));
            println!("  cuda: {}", on(detect::sanitize_for_cuda(p)));
            for arch in ["gfx942", "gfx950"] {
                let a = detect::AmdArch::parse(arch)?;
                println!("  hip {arch}: {}", on(detect::sanitize_for(&a, p)));
            }
        }
        Err(e) => println!("  policy: invalid: {e}"),
    }
    Ok(())
}

#[cfg(feature = "cuda")]
fn cuda_facts() -> std::result::Result<Vec<String>, String> {
    cuda_wiring::facts()
}

#[cfg(not(feature = "cuda"))]
fn cuda_facts() -> std::result::Result<Vec<String>, String> {
    Err("this binary was built without the `cuda` feature".into())
}

#[cfg(feature = "hip")]
fn hip_facts() -> std::result::Result<Vec<String>, String> {
    hip_wiring::facts()
}

#[cfg(not(feature = "hip"))]
fn hip_facts() -> std::result::Result<Vec<String>, String> {
    Err("this binary was built without the `hip` feature".into())
}

// ---- verify ---------------------------------------------------------------------------

fn verify_cmd(args: &[String]) -> CliResult<()> {
    let o = Opts::parse(args, &["backend"], &[])?;
    if o.positional.is_empty() {
        return Err(CliError::Usage("verify needs at least one FILE".into()));
    }
    let choice = o.backend()?;
    let (mismatched, errors) = with_backend(
        choice,
        VerifyJob {
            files: o.positional,
        },
    )?;
    if errors > 0 {
        return Err(CliError::Lib(Error::Vectors(format!(
            "{errors} file(s) could not be replayed"
        ))));
    }
    if mismatched > 0 {
        return Err(CliError::Check(format!(
            "{mismatched} file(s) differ from their expected outputs"
        )));
    }
    Ok(())
}

struct VerifyJob {
    files: Vec<String>,
}

impl Job for VerifyJob {
    type Out = (usize, usize);
    fn run<B: Backend, T: Timing<B>>(
        self,
        b: &mut B,
        _: &T,
        notes: &[String],
    ) -> Result<(usize, usize)> {
        notes.iter().for_each(|n| println!("{n}"));
        println!("backend: {}", b.name());
        let (mut mismatched, mut errors) = (0, 0);
        for path in &self.files {
            let f = match VectorFile::load(path) {
                Ok(f) => f,
                Err(e) => {
                    println!("{path}: ERROR {e}");
                    errors += 1;
                    continue;
                }
            };
            let what = describe_file(&f);
            match f.replay(b) {
                Ok(r) => {
                    let verdict = if r.passed() { "PASS" } else { "FAIL" };
                    print!("{path}: {verdict} ({what})\n  {r}");
                    if !r.passed() {
                        mismatched += 1;
                    }
                }
                Err(e) => {
                    println!("{path}: ERROR ({what}) {e}");
                    errors += 1;
                }
            }
        }
        let ok = self.files.len() - mismatched - errors;
        println!(
            "{} file(s): {ok} pass, {mismatched} differ, {errors} could not be replayed",
            self.files.len()
        );
        Ok((mismatched, errors))
    }
}

fn describe_file(f: &VectorFile) -> String {
    let mut s = f.meta.get("op").cloned().unwrap_or_default();
    for k in ["layout", "compress_ratio", "sanitize"] {
        if let Some(v) = f.meta.get(k) {
            let _ = write!(s, ", {k} {v}");
        }
    }
    if let Some(v) = f.meta.get("source") {
        let _ = write!(s, ", source: {v}");
    }
    s
}

// ---- capture ----------------------------------------------------------------------------

fn capture_cmd(args: &[String]) -> CliResult<()> {
    let o = Opts::parse(
        args,
        &[
            "op",
            "layout",
            "cr",
            "tokens",
            "requests",
            "ring-capacity",
            "seed",
            "out",
        ],
        &["sanitize", "adversarial"],
    )?;
    o.no_positional()?;
    let op_name = o
        .get("op")
        .ok_or_else(|| CliError::Usage("capture needs --op".into()))?;
    let op = Op::from_name(op_name).ok_or_else(|| {
        CliError::Usage(format!(
            "--op {op_name:?}, expected rope_quant_insert, fused_save_compress_norm, save_ring_rows or fused_compress_insert"
        ))
    })?;
    let layout_name = o.get("layout").unwrap_or("mxfp8");
    let layout = RecordLayout::from_name(layout_name).ok_or_else(|| {
        CliError::Usage(format!(
            "--layout {layout_name:?}, expected v4, mxfp8, nvfp4, bf16 or fp8"
        ))
    })?;
    let out = o
        .get("out")
        .ok_or_else(|| CliError::Usage("capture needs --out FILE".into()))?;
    let cr: u32 = o.num("cr", 1)?;
    if cr != 1 && cr != 2 {
        return Err(CliError::Usage(format!("--cr {cr}, expected 1 or 2")));
    }
    let spec = CaseSpec {
        op,
        layout,
        compress_ratio: cr,
        tokens: o.num("tokens", 256)?,
        requests: o.num("requests", 4)?,
        ring_capacity: o.num("ring-capacity", 4)?,
        seed: o.num("seed", 1)?,
        sanitize: o.flag("sanitize"),
        adversarial: o.flag("adversarial"),
    };
    if spec.tokens == 0 {
        return Err(CliError::Usage("--tokens must be at least 1".into()));
    }
    let mut f = make_case(&spec);
    f.capture_reference()?;
    f.save(out)?;
    println!(
        "wrote {out}: {}, {} tensors",
        describe_file(&f),
        f.tensors.len()
    );
    Ok(())
}

// ---- demo --------------------------------------------------------------------------------

fn demo_cmd(args: &[String]) -> CliResult<()> {
    let o = Opts::parse(
        args,
        &[
            "backend",
            "requests",
            "prefill-tokens",
            "decode-steps",
            "seed",
        ],
        &[],
    )?;
    o.no_positional()?;
    let cfg = DemoConfig {
        requests: o.num("requests", 4)?,
        prefill: o.num("prefill-tokens", 1024)?,
        decode: o.num("decode-steps", 64)?,
        seed: o.num("seed", 1)?,
    };
    if cfg.requests == 0 || cfg.requests > 4096 {
        return Err(CliError::Usage(
            "--requests must be between 1 and 4096".into(),
        ));
    }
    if cfg.prefill < 4 || cfg.prefill > 1 << 20 {
        return Err(CliError::Usage(
            "--prefill-tokens must be between 4 and 1048576".into(),
        ));
    }
    if cfg.decode > 1 << 16 {
        return Err(CliError::Usage(
            "--decode-steps must be at most 65536".into(),
        ));
    }
    let failures = with_backend(o.backend()?, DemoJob { cfg })?;
    if failures.is_empty() {
        Ok(())
    } else {
        Err(CliError::Check(failures.join("; ")))
    }
}

#[derive(Debug, Clone, Copy)]
struct DemoConfig {
    requests: usize,
    prefill: usize,
    decode: usize,
    seed: u64,
}

/// Ring rows per request.
const RING_CAPACITY: usize = 4;
/// Rows per cache block.
const BLOCK: usize = 64;
/// Timed insert calls per layout in the demo (after one warm-up call).
const DEMO_TIMED_CALLS: usize = 5;
/// The FP8 rows' per-tensor scale in the demo.
const DEMO_FP8_SCALE: f32 = 0.02;

/// Everything the demo feeds the operations, on the host.
struct Scenario {
    requests: usize,
    /// Prompt length per request.
    prompt: Vec<usize>,
    /// Prefill chunk sizes per request (2 or 3, all different).
    chunks: Vec<Vec<usize>>,
    decode: usize,
    /// `[kv 512 | score 512]` rows per request, prompt then decode tokens.
    rows: Vec<Vec<f32>>,
    weight: Vec<u16>,
    eps: f32,
    /// `[max_pos, 64]`.
    cos_sin: Vec<f32>,
    cos_rows: usize,
    /// Cache blocks of each request (a random permutation of all blocks).
    block_table: Vec<Vec<usize>>,
    blocks: usize,
}

impl Scenario {
    fn new(cfg: &DemoConfig) -> Scenario {
        let mut rng = Rng::new(cfg.seed);
        let r = cfg.requests;
        let mut prompt = Vec::new();
        let mut chunks = Vec::new();
        for i in 0..r {
            let p = cfg.prefill;
            // Prompts of different lengths, about P ± 25 %.
            let len = (p * 3 / 4 + rng.below(p as u64 / 2 + 1) as usize).max(4);
            // 2 or 3 chunks; 3 distinct sizes need at least 1 + 2 + 3 tokens.
            let n = if len >= 6 { 2 + i % 2 } else { 2 };
            let mut sizes = Vec::new();
            for _ in 0..1000 {
                // Cut points at random; sizes all different and non-zero.
                let mut cuts: Vec<usize> = (0..n - 1)
                    .map(|_| 1 + rng.below(len as u64 - 1) as usize)
                    .collect();
                cuts.sort_unstable();
                let mut s = Vec::new();
                let mut prev = 0;
                for c in cuts.iter().copied().chain([len]) {
                    s.push(c - prev);
                    prev = c;
                }
                let mut d = s.clone();
                d.sort_unstable();
                d.dedup();
                if d.len() == s.len() && s.iter().all(|&x| x > 0) {
                    sizes = s;
                    break;
                }
            }
            if sizes.is_empty() {
                // Unlucky draws: 1, 2, ..., and the rest (distinct since len >= 4).
                sizes = (1..n).collect();
                sizes.push(len - sizes.iter().sum::<usize>());
            }
            prompt.push(len);
            chunks.push(sizes);
        }
        let total: Vec<usize> = prompt.iter().map(|p| p + cfg.decode).collect();
        let rows = total
            .iter()
            .map(|&n| {
                (0..n * 1024)
                    .map(|j| {
                        let v = rng.normal();
                        // Scores (second half) spread a little wider.
                        if j % 1024 >= 512 {
                            2.0 * v
                        } else {
                            v
                        }
                    })
                    .collect()
            })
            .collect();
        let weight = (0..DIM)
            .map(|_| bf16_from_f32(1.0 + 0.2 * rng.normal()))
            .collect();
        let max_pos = total.iter().copied().max().unwrap_or(1);
        let per_req_blocks: Vec<usize> = total
            .iter()
            .map(|n| (n / 2).div_ceil(BLOCK).max(1))
            .collect();
        let blocks: usize = per_req_blocks.iter().sum::<usize>() + 1;
        let perm = rng.permutation(blocks);
        let mut next = 0;
        let block_table = per_req_blocks
            .iter()
            .map(|&n| {
                let t = perm[next..next + n].to_vec();
                next += n;
                t
            })
            .collect();
        Scenario {
            requests: r,
            prompt,
            chunks,
            decode: cfg.decode,
            rows,
            weight,
            eps: 1e-6,
            cos_sin: rope_cos_sin(max_pos),
            cos_rows: max_pos,
            block_table,
            blocks,
        }
    }

    /// The calls: per call, each request's `(first position, tokens)`.
    fn rounds(&self, chunked: bool) -> Vec<(String, Vec<(usize, usize)>)> {
        let mut out = Vec::new();
        if chunked {
            let n = self.chunks.iter().map(Vec::len).max().unwrap_or(0);
            for k in 0..n {
                let c = (0..self.requests)
                    .map(|r| {
                        let start: usize = self.chunks[r].iter().take(k).sum();
                        (start, self.chunks[r].get(k).copied().unwrap_or(0))
                    })
                    .collect();
                out.push((format!("prefill chunk {}", k + 1), c));
            }
        } else {
            out.push((
                "prefill (one chunk)".into(),
                self.prompt.iter().map(|&p| (0, p)).collect(),
            ));
        }
        for d in 0..self.decode {
            out.push((
                format!("decode step {}", d + 1),
                self.prompt.iter().map(|&p| (p + d, 1)).collect(),
            ));
        }
        out
    }

    fn cache_slot(&self, r: usize, pos: usize) -> i64 {
        let c = pos / 2;
        (self.block_table[r][c / BLOCK] * BLOCK + c % BLOCK) as i64
    }

    fn cache_desc(&self, layout: RecordLayout) -> TensorDesc {
        match layout {
            RecordLayout::Bf16Rows => {
                TensorDesc::contiguous(DType::BF16, &[self.blocks, BLOCK, DIM])
            }
            RecordLayout::Fp8Rows => {
                TensorDesc::contiguous(DType::F8E4M3, &[self.blocks, BLOCK, DIM])
            }
            l => TensorDesc::contiguous(DType::U8, &[self.blocks, BLOCK, l.record_bytes()]),
        }
    }

    fn cache_bytes(&self, layout: RecordLayout) -> usize {
        self.blocks * BLOCK * layout.record_bytes()
    }
}

/// A boundary token's latent: `(request, position) → BF16 bits`.
type Latents = BTreeMap<(usize, usize), Vec<u16>>;

/// What a run of the scenario produced.
struct RunOut {
    /// Each call's `latent_out`, by call name.
    calls: Vec<(String, Vec<u8>)>,
    ring: Vec<u8>,
    caches: Vec<Vec<u8>>,
    latents: Latents,
    tokens: usize,
}

fn desc(dtype: DType, shape: &[usize]) -> TensorDesc {
    TensorDesc::contiguous(dtype, shape)
}

/// Runs the scenario on `b`: one CR2 compress call per round, each followed
/// by one insert per layout of the latents it produced.
fn run_scenario<B: Backend>(b: &B, sc: &Scenario, chunked: bool, inserts: bool) -> Result<RunOut> {
    let cap = RING_CAPACITY;
    let r = sc.requests;
    let ring_desc = desc(DType::F32, &[r, cap, 1024]);
    let mut ring = b.upload(&vec![0u8; r * cap * 4096])?;
    let weight = b.upload(&u16_bytes(&sc.weight))?;
    let cos = b.upload(&f32_bytes(&sc.cos_sin))?;
    let cos_desc = desc(DType::F32, &[sc.cos_rows, 64]);
    let fp8 = b.upload(&DEMO_FP8_SCALE.to_le_bytes())?;
    let mut caches = Vec::new();
    if inserts {
        for l in RecordLayout::ALL {
            caches.push(b.upload(&vec![0u8; sc.cache_bytes(l)])?);
        }
    }
    let mut out = RunOut {
        calls: Vec::new(),
        ring: Vec::new(),
        caches: Vec::new(),
        latents: BTreeMap::new(),
        tokens: 0,
    };
    for (name, chunk) in sc.rounds(chunked) {
        let n: usize = chunk.iter().map(|c| c.1).sum();
        if n == 0 {
            continue;
        }
        out.tokens += n;
        let mut kv = Vec::with_capacity(n * 1024);
        let (mut pos, mut slots, mut ttr, mut cslots, mut who) =
            (vec![], vec![], vec![], vec![], vec![]);
        let mut qsl = vec![0i64];
        for (req, &(start, len)) in chunk.iter().enumerate() {
            for p in start..start + len {
                kv.extend_from_slice(&sc.rows[req][p * 1024..(p + 1) * 1024]);
                pos.push(p as i64);
                slots.push((req * cap + p % cap) as i64);
                ttr.push(req as i64);
                cslots.push(if p % 2 == 1 {
                    sc.cache_slot(req, p)
                } else {
                    -1
                });
                who.push((req, p));
            }
            qsl.push(qsl.last().copied().unwrap_or(0) + len as i64);
        }
        let kv_b = b.upload(&f32_bytes(&kv))?;
        let pos_b = b.upload(&i64_bytes(&pos))?;
        let slots_b = b.upload(&i64_bytes(&slots))?;
        let qsl_b = b.upload(&i64_bytes(&qsl))?;
        let ttr_b = b.upload(&i64_bytes(&ttr))?;
        let cslots_b = b.upload(&i64_bytes(&cslots))?;
        let mut latent = b.upload(&vec![0u8; n * DIM * 2])?;
        let lat_desc = desc(DType::BF16, &[n, DIM]);
        let idx = |len: usize| desc(DType::I64, &[len]);
        b.fused_save_compress_norm(CompressArgs {
            kv_score: Tensor::new(&kv_b, desc(DType::F32, &[n, 1024])),
            positions: Tensor::new(&pos_b, idx(n)),
            state_cache: Some(TensorMut::new(&mut ring, ring_desc)),
            slot_mapping: Tensor::new(&slots_b, idx(n)),
            query_start_loc: Some(Tensor::new(&qsl_b, idx(r + 1))),
            token_to_req_indices: Some(Tensor::new(&ttr_b, idx(n))),
            rms_norm_weight: Tensor::new(&weight, desc(DType::BF16, &[DIM])),
            rms_norm_eps: sc.eps,
            compress_ratio: 2,
            latent_out: TensorMut::new(&mut latent, lat_desc),
            prev_rows: None,
            prev_row_indices: None,
        })?;
        for (l, cache) in RecordLayout::ALL.into_iter().zip(caches.iter_mut()) {
            b.rope_quant_insert(InsertArgs {
                latent: Tensor::new(&latent, lat_desc),
                positions: Tensor::new(&pos_b, idx(n)),
                cos_sin_cache: Tensor::new(&cos, cos_desc),
                kv_cache: TensorMut::new(cache, sc.cache_desc(l)),
                slot_mapping: Tensor::new(&cslots_b, idx(n)),
                compress_ratio: 2,
                fp8_scale: (l == RecordLayout::Fp8Rows)
                    .then(|| Tensor::new(&fp8, desc(DType::F32, &[1]))),
            })?;
        }
        let bytes = b.read(&latent)?;
        for (t, &(req, p)) in who.iter().enumerate() {
            if p % 2 == 1 {
                let row = bytes[t * 1024..(t + 1) * 1024]
                    .chunks_exact(2)
                    .map(|c| u16::from_le_bytes([c[0], c[1]]))
                    .collect();
                out.latents.insert((req, p), row);
            }
        }
        out.calls.push((name, bytes));
    }
    let skipped = b.take_skip_counts()?;
    if skipped.total() > 0 {
        return Err(Error::Value {
            arg: "demo",
            problem: format!("the backend skipped tokens it should not have: {skipped:?}"),
        });
    }
    out.ring = b.read(&ring)?;
    for c in &caches {
        out.caches.push(b.read(c)?);
    }
    Ok(out)
}

/// The records' values and scales of `slot` in a cache of `layout`.
fn record_at(layout: RecordLayout, cache: &[u8], slot: usize) -> (&[u8], &[u8]) {
    let (block, row) = (slot / BLOCK, slot % BLOCK);
    let (v, s) = (layout.value_bytes(), layout.scale_bytes());
    let page = block * BLOCK * (v + s);
    let values = &cache[page + row * v..page + (row + 1) * v];
    let scales = &cache[page + BLOCK * v + row * s..page + BLOCK * v + (row + 1) * s];
    (values, scales)
}

/// Max abs and RMS relative error of the decoded records vs the f32 rotated latents.
fn reconstruction(
    sc: &Scenario,
    layout: RecordLayout,
    cache: &[u8],
    latents: &Latents,
) -> (f64, f64) {
    let (mut max_abs, mut err2, mut ref2) = (0f64, 0f64, 0f64);
    for (&(req, p), lat) in latents {
        let lat: [u16; DIM] = lat.as_slice().try_into().expect("512 dims");
        let base = (p / 2) * 2;
        let row = &sc.cos_sin[base * 64..base * 64 + 64];
        let cos: [f32; 32] = row[..32].try_into().expect("32");
        let sin: [f32; 32] = row[32..].try_into().expect("32");
        let want = rotate(&lat, &cos, &sin);
        let (values, scales) = record_at(layout, cache, sc.cache_slot(req, p) as usize);
        let got = decode_record(layout, values, scales, DEMO_FP8_SCALE);
        for (g, w) in got.iter().zip(want.iter()) {
            let d = (*g as f64) - (*w as f64);
            max_abs = max_abs.max(d.abs());
            err2 += d * d;
            ref2 += (*w as f64) * (*w as f64);
        }
    }
    (max_abs, (err2 / ref2.max(1e-300)).sqrt())
}

/// Inserts every latent of the run in one call per layout (after a warm-up)
/// and returns the tokens per second and the cache it wrote.
fn time_insert<B: Backend>(
    b: &B,
    sc: &Scenario,
    latents: &Latents,
    layout: RecordLayout,
) -> Result<(f64, Vec<u8>)> {
    let n = latents.len();
    let mut lat = Vec::with_capacity(n * DIM);
    let (mut pos, mut slots) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for (&(req, p), l) in latents {
        lat.extend_from_slice(l);
        pos.push(p as i64);
        slots.push(sc.cache_slot(req, p));
    }
    let lat_b = b.upload(&u16_bytes(&lat))?;
    let pos_b = b.upload(&i64_bytes(&pos))?;
    let slots_b = b.upload(&i64_bytes(&slots))?;
    let cos = b.upload(&f32_bytes(&sc.cos_sin))?;
    let fp8 = b.upload(&DEMO_FP8_SCALE.to_le_bytes())?;
    let mut cache = b.upload(&vec![0u8; sc.cache_bytes(layout)])?;
    let once = |cache: &mut B::Buffer| {
        b.rope_quant_insert(InsertArgs {
            latent: Tensor::new(&lat_b, desc(DType::BF16, &[n, DIM])),
            positions: Tensor::new(&pos_b, desc(DType::I64, &[n])),
            cos_sin_cache: Tensor::new(&cos, desc(DType::F32, &[sc.cos_rows, 64])),
            kv_cache: TensorMut::new(cache, sc.cache_desc(layout)),
            slot_mapping: Tensor::new(&slots_b, desc(DType::I64, &[n])),
            compress_ratio: 2,
            fp8_scale: (layout == RecordLayout::Fp8Rows)
                .then(|| Tensor::new(&fp8, desc(DType::F32, &[1]))),
        })
    };
    once(&mut cache)?;
    b.synchronize()?;
    let mut times = Vec::new();
    for _ in 0..DEMO_TIMED_CALLS {
        let t = Instant::now();
        once(&mut cache)?;
        b.synchronize()?;
        times.push(t.elapsed().as_secs_f64());
    }
    let rate = n as f64 / median_f64(&mut times).max(1e-12);
    Ok((rate, b.read(&cache)?))
}

/// The first differing byte of two blobs, or a length difference.
fn first_difference(a: &[u8], b: &[u8]) -> Option<String> {
    if a.len() != b.len() {
        return Some(format!("{} bytes vs {} bytes", a.len(), b.len()));
    }
    let n = a.iter().zip(b).filter(|(x, y)| x != y).count();
    a.iter().zip(b).position(|(x, y)| x != y).map(|i| {
        format!(
            "{n} bytes differ, first at byte {i}: 0x{:02x} vs reference 0x{:02x}",
            a[i], b[i]
        )
    })
}

struct DemoJob {
    cfg: DemoConfig,
}

impl Job for DemoJob {
    /// The failures (empty: PASS).
    type Out = Vec<String>;

    fn run<B: Backend, T: Timing<B>>(
        self,
        b: &mut B,
        timing: &T,
        notes: &[String],
    ) -> Result<Vec<String>> {
        let t_start = Instant::now();
        let sc = Scenario::new(&self.cfg);
        let mut failures = Vec::new();
        println!(
            "dsv4-kvcache demo: {} requests, prompts of {} tokens in 2-3 chunks each, {} decode steps, seed {}",
            sc.requests,
            sc.prompt.iter().map(|p| p.to_string()).collect::<Vec<_>>().join("/"),
            sc.decode,
            self.cfg.seed
        );
        for (r, c) in sc.chunks.iter().enumerate() {
            println!(
                "  request {r}: chunks of {} tokens",
                c.iter()
                    .map(|x| x.to_string())
                    .collect::<Vec<_>>()
                    .join(" + ")
            );
        }
        notes.iter().for_each(|n| println!("{n}"));
        println!(
            "backend: {} (sanitize {})",
            b.name(),
            if b.sanitize() { "on" } else { "off" }
        );

        let run = run_scenario(b, &sc, true, true)?;
        println!(
            "ran {} fused_save_compress_norm calls (CR2, ring of {RING_CAPACITY} rows per request) over {} tokens, \
             each followed by 5 rope_quant_insert calls: {} latents",
            run.calls.len(),
            run.tokens,
            run.latents.len()
        );

        // The ring's promise: chunking does not change the latents.
        let mut cpu = CpuBackend::new();
        cpu.set_sanitize(b.sanitize());
        let whole = run_scenario(&cpu, &sc, false, false)?;
        if whole.latents == run.latents {
            println!(
                "chunked prefill == one chunk per request: all {} latents identical",
                run.latents.len()
            );
        } else {
            let n = run
                .latents
                .iter()
                .filter(|(k, v)| whole.latents.get(k) != Some(v))
                .count();
            failures.push(format!(
                "{n} latents differ between chunked and one-chunk prefill"
            ));
            println!("chunked prefill vs one chunk per request: {n} latents DIFFER");
        }

        // Every output against the reference.
        let verdict: Vec<String> = if timing.is_reference() {
            println!("the backend is the CPU reference itself: nothing else to compare against");
            vec!["reference".into(); RecordLayout::ALL.len()]
        } else {
            let reference = run_scenario(&cpu, &sc, true, true)?;
            for ((name, got), (_, want)) in run.calls.iter().zip(&reference.calls) {
                if let Some(d) = first_difference(got, want) {
                    failures.push(format!("{name} latent_out: {d}"));
                }
            }
            if let Some(d) = first_difference(&run.ring, &reference.ring) {
                failures.push(format!("ring state: {d}"));
            }
            let ok = run.calls.len() == reference.calls.len();
            println!(
                "latent_out of {} calls and the final ring vs the CPU reference: {}",
                run.calls.len(),
                if failures.is_empty() && ok {
                    "identical"
                } else {
                    "DIFFERENT"
                }
            );
            RecordLayout::ALL
                .iter()
                .zip(run.caches.iter().zip(&reference.caches))
                .map(|(l, (got, want))| match first_difference(got, want) {
                    None => "identical".to_string(),
                    Some(d) => {
                        failures.push(format!("{} cache: {d}", l.name()));
                        "DIFFERENT".to_string()
                    }
                })
                .collect()
        };

        println!();
        println!(
            "| layout | bytes/token | records | max abs err | RMS rel err | insert tok/s (T = {}) | vs CPU reference |",
            run.latents.len()
        );
        println!("| --- | ---: | ---: | ---: | ---: | ---: | --- |");
        for (i, l) in RecordLayout::ALL.into_iter().enumerate() {
            let (max_abs, rms) = reconstruction(&sc, l, &run.caches[i], &run.latents);
            let (rate, batch_cache) = time_insert(b, &sc, &run.latents, l)?;
            if batch_cache != run.caches[i] {
                failures.push(format!(
                    "{}: one insert of all latents wrote different bytes than the per-step inserts",
                    l.name()
                ));
            }
            println!(
                "| {} | {} | {} | {:.3e} | {:.3e} | {}tok/s | {} |",
                l.name(),
                l.record_bytes(),
                run.latents.len(),
                max_abs,
                rms,
                tok_rate(rate),
                verdict[i]
            );
        }
        println!();
        println!(
            "errors: decoded records vs the f32 rotated latent; throughput: wall clock of one rope_quant_insert \
             call of all {} latents, waited for, median of {DEMO_TIMED_CALLS} after a warm-up",
            run.latents.len()
        );
        println!("demo took {:.2} s", t_start.elapsed().as_secs_f64());
        if failures.is_empty() {
            println!(
                "PASS: {} latents and {} records per layout, {}",
                run.latents.len(),
                run.latents.len(),
                if timing.is_reference() {
                    "on the CPU reference (chunking, ring and batch consistency checked)"
                } else {
                    "byte-identical to the CPU reference"
                }
            );
        } else {
            for f in &failures {
                println!("mismatch: {f}");
            }
        }
        Ok(failures)
    }
}

// ---- bench ---------------------------------------------------------------------------------

/// The seed's Triton kernels on an H200 (`shared/spec/anchors.md`): µs per launch.
const ANCHOR_T: [usize; 6] = [1, 16, 128, 1024, 8192, 65536];
const ANCHORS: [(&str, [f64; 6]); 8] = [
    ("insert mxfp8", [1.79, 1.91, 2.03, 2.80, 9.76, 72.6]),
    ("insert nvfp4", [1.92, 1.98, 2.04, 2.93, 10.81, 76.2]),
    ("insert v4", [1.92, 2.04, 2.09, 2.64, 8.20, 67.3]),
    ("insert bf16", [1.55, 1.68, 1.77, 2.23, 6.61, 62.1]),
    ("insert fp8", [1.87, 1.83, 1.96, 2.39, 6.80, 58.2]),
    ("compress CR1", [1.72, 1.72, 1.88, 2.39, 6.70, 59.4]),
    (
        "compress CR2, T one-token requests",
        [2.29, 2.38, 2.51, 3.84, 26.9, 202.6],
    ),
    (
        "compress CR2, 4 requests of T/4",
        [2.20, 3.62, 5.96, 6.08, 9.35, 75.0],
    ),
];

fn anchor(op: &str, t: usize) -> Option<f64> {
    let i = ANCHOR_T.iter().position(|&x| x == t)?;
    ANCHORS
        .iter()
        .find(|(name, _)| *name == op)
        .map(|(_, v)| v[i])
}

fn bench_cmd(args: &[String]) -> CliResult<()> {
    let o = Opts::parse(
        args,
        &["backend", "tokens", "out", "launches", "replays", "only"],
        &[],
    )?;
    o.no_positional()?;
    let tokens = match o.get("tokens") {
        None => None,
        Some(s) => Some(
            s.split(',')
                .map(|x| x.trim().parse::<usize>())
                .collect::<std::result::Result<Vec<_>, _>>()
                .ok()
                .filter(|v| !v.is_empty() && v.iter().all(|&t| t >= 1))
                .ok_or_else(|| {
                    CliError::Usage(format!("--tokens {s:?}, expected a list like 1,16,128"))
                })?,
        ),
    };
    let only = o.get("only").map(|s| {
        s.split(',')
            .map(|x| x.trim().to_string())
            .filter(|x| !x.is_empty())
            .collect::<Vec<_>>()
    });
    if only.as_ref().is_some_and(|v| v.is_empty()) {
        return Err(CliError::Usage(
            "--only needs at least one name, like insert,fused".into(),
        ));
    }
    let job = BenchJob {
        tokens,
        only,
        out: o.get("out").map(str::to_string),
        launches: o.num("launches", 20)?,
        replays: o.num("replays", 7)?,
    };
    if job.launches == 0 || job.replays == 0 {
        return Err(CliError::Usage(
            "--launches and --replays must be at least 1".into(),
        ));
    }
    with_backend(o.backend()?, job)?;
    Ok(())
}

struct BenchJob {
    tokens: Option<Vec<usize>>,
    /// Run only the rows whose label contains one of these.
    only: Option<Vec<String>>,
    out: Option<String>,
    launches: usize,
    replays: usize,
}

impl BenchJob {
    /// Whether the row labelled `label` runs (`--only`).
    fn wants(&self, label: &str) -> bool {
        self.only
            .as_ref()
            .is_none_or(|v| v.iter().any(|x| label.contains(x.as_str())))
    }
}

/// One case of the table.
struct BenchCase {
    name: String,
    layout: Option<RecordLayout>,
    spec: CaseSpec,
}

fn bench_cases(t: usize) -> Vec<BenchCase> {
    let mut v = Vec::new();
    let base = CaseSpec {
        tokens: t,
        seed: 0xbe4c + t as u64,
        ring_capacity: 2,
        ..Default::default()
    };
    for l in [
        RecordLayout::Mxfp8,
        RecordLayout::Nvfp4,
        RecordLayout::V4,
        RecordLayout::Bf16Rows,
        RecordLayout::Fp8Rows,
    ] {
        v.push(BenchCase {
            name: format!("insert {}", l.name()),
            layout: Some(l),
            spec: CaseSpec {
                op: Op::RopeQuantInsert,
                layout: l,
                ..base.clone()
            },
        });
    }
    v.push(BenchCase {
        name: "compress CR1".into(),
        layout: None,
        spec: CaseSpec {
            op: Op::FusedSaveCompressNorm,
            ..base.clone()
        },
    });
    v.push(BenchCase {
        name: "compress CR2, T one-token requests".into(),
        layout: None,
        spec: CaseSpec {
            op: Op::FusedSaveCompressNorm,
            compress_ratio: 2,
            requests: t,
            ..base.clone()
        },
    });
    // Decode with one speculative (MTP) token: the second token of each
    // request closes the group (pooled by its request item in the
    // multi-token kernels, kernel_abi::Cr2Shape::multi_token).
    v.push(BenchCase {
        name: "compress CR2, T/2 two-token requests".into(),
        layout: None,
        spec: CaseSpec {
            op: Op::FusedSaveCompressNorm,
            compress_ratio: 2,
            requests: (t / 2).max(1),
            ..base.clone()
        },
    });
    v.push(BenchCase {
        name: "compress CR2, 4 requests of T/4".into(),
        layout: None,
        spec: CaseSpec {
            op: Op::FusedSaveCompressNorm,
            compress_ratio: 2,
            requests: 4,
            ..base.clone()
        },
    });
    v.push(BenchCase {
        name: "save_ring_rows".into(),
        layout: None,
        spec: CaseSpec {
            op: Op::SaveRingRows,
            ..base
        },
    });
    v
}

/// Bytes a launch reads plus writes, counted as `anchors.md` does: an insert
/// reads the BF16 latent (1024 B) and writes the record per written token;
/// CR1 reads 2048 B and writes 1024 B per token; CR2 reads each token's
/// 4096 B row, a ring row for each chunk-first boundary token, and writes
/// 1024 B per latent and 4096 B per ring store; ring rows copy 4096 B.
fn traffic(f: &VectorFile, layout: Option<RecordLayout>) -> Result<u64> {
    let op = f.op()?;
    let slots = f
        .input("slot_mapping")
        .map(|t| t.to_i64())
        .transpose()?
        .unwrap_or_default();
    let pos = f
        .input("positions")
        .map(|t| t.to_i64())
        .transpose()?
        .unwrap_or_default();
    Ok(match op {
        Op::RopeQuantInsert => {
            let cr = f.compress_ratio()? as i64;
            let w = layout.map_or(0, |l| l.record_bytes()) as u64;
            let written = slots
                .iter()
                .zip(&pos)
                .filter(|(s, p)| **s >= 0 && (**p + 1) % cr == 0)
                .count() as u64;
            written * (1024 + w)
        }
        Op::SaveRingRows => slots.iter().filter(|s| **s >= 0).count() as u64 * 8192,
        Op::FusedSaveCompressNorm | Op::FusedCompressInsert => {
            if f.compress_ratio()? == 1 {
                slots.iter().filter(|s| **s >= 0).count() as u64 * 3072
            } else {
                let qsl = f
                    .input("query_start_loc")
                    .map(|t| t.to_i64())
                    .transpose()?
                    .unwrap_or_default();
                let cap = f.input("state_cache").map_or(1, |t| t.shape[1]) as i64;
                let mut bytes = 0u64;
                for w in qsl.windows(2) {
                    let (s, e) = (w[0], w[1]);
                    if s >= e {
                        continue;
                    }
                    for t in s..e {
                        let (t, p) = (t as usize, pos[t as usize]);
                        bytes += 4096;
                        if slots[t] >= 0 && (p + 1) % 2 == 0 {
                            bytes += 1024;
                            if t as i64 == s {
                                bytes += 4096;
                            }
                        }
                        if slots[s as usize] >= 0 && slots[t] >= 0 && t as i64 >= e - cap {
                            bytes += 4096;
                        }
                    }
                }
                bytes
            }
        }
    })
}

impl Job for BenchJob {
    type Out = ();

    fn run<B: Backend, T: Timing<B>>(self, b: &mut B, timing: &T, notes: &[String]) -> Result<()> {
        let cpu = timing.is_reference();
        let tokens = self.tokens.clone().unwrap_or_else(|| {
            if cpu {
                vec![1, 16, 128, 1024, 8192]
            } else {
                ANCHOR_T.to_vec()
            }
        });
        b.set_sanitize(false);
        notes.iter().for_each(|n| println!("{n}"));
        println!(
            "dsv4-kvcache {} bench on {}",
            env!("CARGO_PKG_VERSION"),
            b.name()
        );
        println!(
            "timing: {}; {} launches per replay, {} replays",
            timing.method(),
            self.launches,
            self.replays
        );
        let copy_bytes = if cpu { 256 << 20 } else { 1 << 30 };
        let copy = timing.copy_rate(b, copy_bytes, self.replays)?;
        println!(
            "copy rate ({} MiB, bytes read + written): {:.1} GB/s",
            copy_bytes >> 20,
            copy / 1e9
        );
        println!();
        println!("| op | T | µs/launch | GB/s | % of copy | seed on H200, µs | speedup vs seed |");
        println!("| --- | ---: | ---: | ---: | ---: | ---: | ---: |");
        let mut rows = Vec::new();
        for &t in &tokens {
            for c in bench_cases(t) {
                if !self.wants(&c.name) {
                    continue;
                }
                let f = make_case(&c.spec);
                let bytes = traffic(&f, c.layout)?;
                let mut p = f.prepare(b)?;
                let us =
                    median_f32(
                        &timing
                            .per_launch_us(b, self.launches, self.replays, &mut |b| p.launch(b))?,
                    ) as f64;
                drop(p);
                let gbps = bytes as f64 / (us * 1e-6) / 1e9;
                let anchor = anchor(&c.name, t);
                println!(
                    "| {} | {} | {:.2} | {:.1} | {:.1} % | {} | {} |",
                    c.name,
                    t,
                    us,
                    gbps,
                    100.0 * gbps * 1e9 / copy,
                    anchor.map_or("—".into(), |a| format!("{a:.2}")),
                    anchor.map_or("—".into(), |a| format!("{:.2}×", a / us))
                );
                rows.push(serde_json::json!({
                    "op": c.name, "tokens": t, "us_per_launch": us, "bytes": bytes, "gb_per_s": gbps,
                    "fraction_of_copy": gbps * 1e9 / copy, "anchor_us": anchor,
                    "speedup_vs_anchor": anchor.map(|a| a / us),
                }));
            }
        }

        // Fused compress + insert vs the two calls: at decode sizes (CR2 as
        // one-token requests, and from 16 tokens as two-token requests, i.e.
        // speculative decode), then at the prefill sizes asked for (1024
        // tokens and up), where CR2 also runs as a few long requests, on the
        // fused lone-group kernels above 2560 items.
        println!();
        println!("fused compress + insert vs the two separate calls:");
        println!("| case | layout | T | fused µs | compress + insert µs | fused saves |");
        println!("| --- | --- | ---: | ---: | ---: | ---: |");
        let mut fused_rows = Vec::new();
        let fused_sizes: Vec<usize> = [1usize, 16, 128]
            .into_iter()
            .chain(tokens.iter().copied().filter(|&t| t >= 1024))
            .collect();
        for t in fused_sizes {
            let mut cases = vec![("CR1", 1u32, 1usize), ("CR2, T one-token requests", 2, t)];
            if t >= 16 {
                cases.push(("CR2, T/2 two-token requests", 2, t / 2));
            }
            if t >= 1024 {
                cases.push(("CR2, 4 requests of T/4", 2, 4));
            }
            for (case, cr, requests) in cases {
                for l in RecordLayout::ALL {
                    if !self.wants(&format!("fused {case} {}", l.name())) {
                        continue;
                    }
                    let spec = CaseSpec {
                        op: Op::FusedCompressInsert,
                        layout: l,
                        compress_ratio: cr,
                        tokens: t,
                        requests,
                        ring_capacity: 2,
                        seed: 0xf05e + t as u64,
                        ..Default::default()
                    };
                    let f = make_case(&spec);
                    let mut p = f.prepare(b)?;
                    let fused = median_f32(&timing.per_launch_us(
                        b,
                        self.launches,
                        self.replays,
                        &mut |b| p.launch(b),
                    )?) as f64;
                    drop(p);
                    let sep = separate_us(b, timing, &f, self.launches, self.replays)?;
                    println!(
                        "| {case} | {} | {t} | {fused:.2} | {sep:.2} | {:.1} % |",
                        l.name(),
                        100.0 * (1.0 - fused / sep)
                    );
                    fused_rows.push(serde_json::json!({
                        "case": case, "layout": l.name(), "tokens": t, "fused_us": fused, "separate_us": sep,
                    }));
                }
            }
        }

        // Host cost of a launch from Rust.
        println!();
        println!("host cost of one eager launch (wall time of N launches / N, no wait between):");
        let mut host_rows = Vec::new();
        for (name, spec) in [
            (
                "insert mxfp8, T = 1",
                CaseSpec {
                    op: Op::RopeQuantInsert,
                    tokens: 1,
                    ..Default::default()
                },
            ),
            (
                "compress CR1, T = 1",
                CaseSpec {
                    op: Op::FusedSaveCompressNorm,
                    tokens: 1,
                    ..Default::default()
                },
            ),
            (
                "fused CR1 mxfp8, T = 1",
                CaseSpec {
                    op: Op::FusedCompressInsert,
                    tokens: 1,
                    ..Default::default()
                },
            ),
        ] {
            if !self.wants(&format!("host {name}")) {
                continue;
            }
            let f = make_case(&spec);
            let mut p = f.prepare(b)?;
            let calls = 2000;
            let us = timing.host_launch_us(b, calls, &mut |b| p.launch(b))?;
            println!("  {name}: {us:.2} µs (N = {calls})");
            host_rows.push(serde_json::json!({"op": name, "us": us, "calls": calls}));
        }

        if let Some(path) = &self.out {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs());
            let doc = serde_json::json!({
                "crate_version": env!("CARGO_PKG_VERSION"),
                "backend": b.name(),
                "timing": timing.method(),
                "launches_per_replay": self.launches,
                "replays": self.replays,
                "unix_time": now,
                "copy_bytes": copy_bytes,
                "copy_bytes_per_s": copy,
                "anchors": "shared/spec/anchors.md: the seed's Triton kernels on an H200, CUDA-graph replay",
                "rows": rows,
                "fused": fused_rows,
                "host_launch": host_rows,
            });
            let text =
                serde_json::to_string_pretty(&doc).map_err(|e| Error::Vectors(e.to_string()))?;
            std::fs::write(path, text).map_err(|e| Error::Vectors(format!("{path}: {e}")))?;
            println!("\nwrote {path}");
        }
        Ok(())
    }
}

/// Time of `fused_save_compress_norm` then `rope_quant_insert` as two
/// launches, on the inputs of a fused case.
fn separate_us<B: Backend, T: Timing<B>>(
    b: &B,
    timing: &T,
    f: &VectorFile,
    launches: usize,
    replays: usize,
) -> Result<f64> {
    let up = |name: &str| -> Result<Option<(B::Buffer, TensorDesc)>> {
        match f.input(name) {
            None => Ok(None),
            Some(t) => Ok(Some((b.upload(&t.data)?, t.desc()?))),
        }
    };
    let need = |x: Option<(B::Buffer, TensorDesc)>, name: &str| {
        x.ok_or_else(|| Error::Vectors(format!("fused case without in.{name}")))
    };
    let kv = need(up("kv_score")?, "kv_score")?;
    let pos = need(up("positions")?, "positions")?;
    let slots = need(up("slot_mapping")?, "slot_mapping")?;
    let weight = need(up("rms_norm_weight")?, "rms_norm_weight")?;
    let mut latent = need(up("latent_out")?, "latent_out")?;
    let cos = need(up("cos_sin")?, "cos_sin")?;
    let mut cache = need(up("kv_cache")?, "kv_cache")?;
    let cslots = need(up("cache_slot_mapping")?, "cache_slot_mapping")?;
    let mut ring = up("state_cache")?;
    let qsl = up("query_start_loc")?;
    let ttr = up("token_to_req_indices")?;
    let fp8 = up("fp8_scale")?;
    let eps = f.rms_norm_eps()?;
    let cr = f.compress_ratio()?;
    fn t<S>(x: &(S, TensorDesc)) -> Tensor<'_, S> {
        Tensor::new(&x.0, x.1)
    }
    let mut both = |b: &B| -> Result<()> {
        b.fused_save_compress_norm(CompressArgs {
            kv_score: t(&kv),
            positions: t(&pos),
            state_cache: ring.as_mut().map(|x| TensorMut::new(&mut x.0, x.1)),
            slot_mapping: t(&slots),
            query_start_loc: qsl.as_ref().map(t),
            token_to_req_indices: ttr.as_ref().map(t),
            rms_norm_weight: t(&weight),
            rms_norm_eps: eps,
            compress_ratio: cr,
            latent_out: TensorMut::new(&mut latent.0, latent.1),
            prev_rows: None,
            prev_row_indices: None,
        })?;
        b.rope_quant_insert(InsertArgs {
            latent: Tensor::new(&latent.0, latent.1),
            positions: t(&pos),
            cos_sin_cache: t(&cos),
            kv_cache: TensorMut::new(&mut cache.0, cache.1),
            slot_mapping: t(&cslots),
            compress_ratio: cr,
            fp8_scale: fp8.as_ref().map(t),
        })
    };
    Ok(median_f32(&timing.per_launch_us(b, launches, replays, &mut both)?) as f64)
}
