//! `dsv4-kvcache`: the command-line tool.
//!
//! ```text
//! dsv4-kvcache info
//! dsv4-kvcache demo    [--backend auto|cpu|cuda|hip] [--requests R] [--prefill-tokens P] [--decode-steps D] [--seed S]
//!                      [--record-order planar|per_token]
//! dsv4-kvcache verify  FILE... [--backend auto|cpu|cuda|hip]
//! dsv4-kvcache bench   [--backend auto|cpu|cuda|hip] [--tokens 1,16,128] [--only insert,fused] [--out FILE.json]
//! dsv4-kvcache soak    [--backend auto|cpu|cuda|hip] [--steps N] [--duration SECONDS] [--seed S]
//!                      [--record-order planar|per_token]
//! dsv4-kvcache capture --op OP [--layout L] [--cr N] [--tokens T] [--requests R] [--seed S]
//!                      [--sanitize] [--adversarial] [--written] [--record-order planar|per_token]
//!                      --out FILE.safetensors
//! ```
//!
//! Exit status: 0 on success, 1 when a check failed (a byte differs from the
//! reference), 2 on a usage error, an unreadable file or an unavailable backend.
//!
//! The parts: [`args`] parses options, [`select`] picks and opens a backend
//! (with [`timing`], how each backend is timed), and each subcommand has its
//! module: [`info`], [`verify`], [`capture`], [`demo`], [`soak`] and [`bench`].

mod args;
mod bench;
mod capture;
mod demo;
mod info;
mod select;
mod soak;
mod timing;
mod verify;

use dsv4_kvcache::Error;
use std::process::ExitCode;

/// The help text (`dsv4-kvcache help`).
pub(crate) const USAGE: &str = "\
dsv4-kvcache: DeepSeek V4 KV-cache records, bit-identical on the CPU, CUDA and HIP

usage:
  dsv4-kvcache info
      version, embedded kernels, devices found (each CUDA device runs the self-check of its
      hardware conversions), sanitize policy
  dsv4-kvcache demo [--backend auto|cpu|cuda|hip] [--requests R] [--prefill-tokens P]
                    [--decode-steps D] [--seed S] [--record-order planar|per_token]
      chunked prefill and decode through the CR2 ring into all five cache layouts,
      checked byte for byte against the CPU reference
  dsv4-kvcache soak [--backend auto|cpu|cuda|hip] [--steps N] [--duration SECONDS] [--seed S]
                    [--slots R] [--max-prompt P] [--max-decode D] [--report-every SECONDS]
                    [--record-order planar|per_token]
      serving-shaped traffic (requests arriving and finishing, chunked prefill, decode with
      a draft token, ring and block reuse, all layouts, the reader) compared byte for byte
      with the CPU reference; memory sampled; exit 1 on any mismatch
  dsv4-kvcache verify FILE... [--backend auto|cpu|cuda|hip]
      replay test-vector files (safetensors) and compare every output byte
  dsv4-kvcache bench [--backend auto|cpu|cuda|hip] [--tokens 1,16,128,...] [--only NAME,...]
                    [--out FILE.json]
      time per launch, bandwidth and the seed's H200 anchors; --only keeps the rows whose
      label contains a NAME ('insert nvfp4', 'compress CR2', 'fused CR1 v4', 'host'); the
      paged inserts and gathers also run in the per-token order ('insert mxfp8 per_token')
  dsv4-kvcache capture --op OP [--layout v4|mxfp8|nvfp4|bf16|fp8] [--cr 1|2] [--tokens T]
                       [--requests R] [--ring-capacity C] [--seed S] [--sanitize] [--adversarial]
                       [--written] [--out-dtype bf16|f32] [--record-order planar|per_token]
                       --out FILE.safetensors
      write a test-vector file whose outputs come from the CPU reference
      (OP: rope_quant_insert, fused_save_compress_norm, save_ring_rows, fused_compress_insert,
      gather_dequant; --requests 0 gathers by slot, --written fills the gather's cache with
      records the writer made, as the bench's 'gather L' rows do, instead of random bytes)

record orders: the 528 and 288 B records in the seed's page-planar order (a page's values,
  then its scales; the default) or vLLM 0.34.0's per-token order (each record's scales after
  its values): --record-order, and the vector files' record_order metadata (584 B records are
  page-planar only)
environment: DSV4_KVCACHE_SANITIZE=auto|on|off (NaN sanitizing; auto = on for gfx950 only)
exit status: 0 ok, 1 a check failed, 2 usage error, unreadable file or unavailable backend";

// ---- errors and exit codes -----------------------------------------------------

/// Why a subcommand failed; it decides the exit status.
pub(crate) enum CliError {
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

/// A subcommand's result.
pub(crate) type CliResult<T> = std::result::Result<T, CliError>;

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
            args::Opts::parse(rest, &[], &[])?.no_positional()?;
            info::info()
        }
        "demo" => demo::demo_cmd(rest),
        "verify" => verify::verify_cmd(rest),
        "bench" => bench::bench_cmd(rest),
        "capture" => capture::capture_cmd(rest),
        "soak" => soak::soak_cmd(rest),
        other => Err(CliError::Usage(format!("unknown command {other:?}"))),
    }
}
