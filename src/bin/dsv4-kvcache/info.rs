//! `info`: version, embedded kernels (per backend the SASS targets, the PTX
//! targets and the code objects, and the oldest NVIDIA driver each CUDA
//! image runs on), the devices found (a CUDA device with the image it runs
//! and the self-check of its hardware conversions) and the sanitize policy.

use crate::select::{cuda_facts, hip_facts};
use crate::CliResult;
use dsv4_kvcache::detect::{self, SanitizePolicy};
use dsv4_kvcache::kernels;

/// Prints what this build holds and what it finds at run time.
pub(crate) fn info() -> CliResult<()> {
    println!("dsv4-kvcache {}", env!("CARGO_PKG_VERSION"));
    println!();
    println!("build");
    println!(
        "  features: cuda {}, hip {}",
        if cfg!(feature = "cuda") { "on" } else { "off" },
        if cfg!(feature = "hip") { "on" } else { "off" }
    );
    match kernels::cuda_compiler() {
        Some(c) => {
            println!(
                "  CUDA kernels: {} (built by {c})",
                kernels::cuda_targets().join(", ")
            );
            println!(
                "    SASS {}; PTX {} (JIT-compiled by GPUs without SASS of their own); CUDA {}",
                kernels::cuda_targets().join(", "),
                if kernels::cuda_ptx().is_empty() {
                    "none".to_string()
                } else {
                    kernels::cuda_ptx().join(", ")
                },
                kernels::cuda_toolkit().unwrap_or("?")
            );
            let drivers: Vec<String> = kernels::cuda_min_drivers()
                .iter()
                .map(|(t, d)| format!("{t} {}", d.unwrap_or("unknown")))
                .collect();
            println!("    minimum NVIDIA driver (Linux): {}", drivers.join(", "));
        }
        None => println!("  CUDA kernels: none embedded"),
    }
    match kernels::hip_compiler() {
        Some(c) => {
            println!(
                "  HIP kernels:  {} (built by {c})",
                kernels::hip_targets().join(", ")
            );
            println!(
                "    code objects {} (code object v{}: ROCm 6.0 or later)",
                kernels::hip_targets().join(", "),
                kernels::HIP_CODE_OBJECT_VERSION
            );
        }
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
            for arch in ["gfx90a", "gfx942", "gfx950"] {
                let a = detect::AmdArch::parse(arch)?;
                println!("  hip {arch}: {}", on(detect::sanitize_for(&a, p)));
            }
        }
        Err(e) => println!("  policy: invalid: {e}"),
    }
    Ok(())
}
