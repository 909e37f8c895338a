//! `gather_dequant` on the CUDA and HIP backends against the CPU reference,
//! byte for byte: every layout, both addressing forms, BF16 and F32 output,
//! I32 and I64 indices, padded caches and outputs, random, adversarial
//! (every code under every scale, NaN codes, scale 0xFF, -0, subnormals)
//! and inserted records, wild indices; the whole output buffer (canaries
//! around and between the rows) and the skip counts are compared. Sizes run
//! from 1 row to past `gather::GATHER_TWO_ROWS_MIN`, so both launch shapes
//! (a row per group, two rows per group) are checked.
//!
//! A device backend runs these once it implements `GatherDequant` (the
//! device wiring); the build switch is the `dsv4_kvcache_gather_device`
//! cfg (`RUSTFLAGS="--cfg dsv4_kvcache_gather_device"`), which that wiring
//! removes. Without it, or without a GPU, each test prints SKIPPED with the
//! reason; with `DSV4_KVCACHE_REQUIRE_GPU=1` a missing CUDA GPU fails.

mod gather_cases;

use dsv4_kvcache::gather::{GatherDequant, GATHER_TWO_ROWS_MIN};
use dsv4_kvcache::{CpuBackend, RecordLayout};
use gather_cases::{every_code_case, every_code_scales, random_case, Case};
use std::io::Write;

/// Writes past the test harness's capture, so a skip shows in a plain
/// `cargo test`.
fn skipped(msg: &str) {
    let _ = writeln!(std::io::stderr(), "\n*** SKIPPED {msg} ***\n");
}

#[cfg_attr(
    not(all(feature = "cuda", dsv4_kvcache_gather_device)),
    allow(dead_code)
)]
fn require_gpu() -> bool {
    std::env::var("DSV4_KVCACHE_REQUIRE_GPU").is_ok_and(|v| v == "1")
}

/// Every case the device runs.
fn cases() -> Vec<Case> {
    let mut out = Vec::new();
    let mut seed = 0u64;
    for layout in RecordLayout::ALL {
        for table in [false, true] {
            for wild in [false, true] {
                for n in [1usize, 16, 128, 1024, GATHER_TWO_ROWS_MIN + 809] {
                    seed += 1;
                    out.push(random_case(seed << 20 | n as u64, layout, table, n, wild));
                }
            }
        }
        for out_f32 in [false, true] {
            for &s in every_code_scales(layout) {
                out.push(every_code_case(layout, out_f32, s));
            }
        }
    }
    out
}

/// The labels of the cases where `dev` differs from the reference (whole
/// output buffers and skip counts).
fn mismatches<B: GatherDequant>(dev: &B, all: &[Case]) -> Vec<String> {
    let cpu = CpuBackend::new();
    let mut bad = Vec::new();
    for case in all {
        let want = case.run(&cpu).expect("the reference runs every case");
        let got = match case.run(dev) {
            Ok(g) => g,
            Err(e) => {
                bad.push(format!("{}: {e}", case.label));
                continue;
            }
        };
        if want != got {
            let bytes = want
                .out
                .iter()
                .zip(&got.out)
                .filter(|(a, b)| a != b)
                .count();
            if bad.len() < 5 {
                eprintln!(
                    "MISMATCH {}: {bytes} bytes differ; counts want {:?} got {:?}",
                    case.label, want.counts, got.counts
                );
            }
            bad.push(case.label.clone());
        }
    }
    bad
}

#[cfg_attr(
    not(all(any(feature = "cuda", feature = "hip"), dsv4_kvcache_gather_device)),
    allow(dead_code)
)]
fn check_backend<B: GatherDequant>(dev: &B) {
    let all = cases();
    let bad = mismatches(dev, &all);
    println!(
        "GATHER PARITY {}: {} cases, {} mismatching",
        dev.name(),
        all.len(),
        bad.len()
    );
    assert!(
        bad.is_empty(),
        "device output differs from the reference in {} cases",
        bad.len()
    );
}

#[test]
fn cuda_matches_reference() {
    #[cfg(all(feature = "cuda", dsv4_kvcache_gather_device))]
    match dsv4_kvcache::CudaBackend::new(0) {
        Ok(b) => check_backend(&b),
        Err(e) => {
            skipped(&format!("gather cuda_matches_reference: {e}"));
            assert!(
                !require_gpu(),
                "DSV4_KVCACHE_REQUIRE_GPU=1 but no CUDA device: {e}"
            );
        }
    }
    #[cfg(not(all(feature = "cuda", dsv4_kvcache_gather_device)))]
    skipped(
        "gather cuda_matches_reference: this build's CUDA backend does not launch gather_dequant \
         (needs the `cuda` feature and the dsv4_kvcache_gather_device cfg of the device wiring)",
    );
}

#[test]
fn hip_matches_reference() {
    #[cfg(all(feature = "hip", dsv4_kvcache_gather_device))]
    match dsv4_kvcache::HipBackend::new(0) {
        Ok(b) => check_backend(&b),
        Err(e) => skipped(&format!("gather hip_matches_reference: {e}")),
    }
    #[cfg(not(all(feature = "hip", dsv4_kvcache_gather_device)))]
    skipped(
        "gather hip_matches_reference: this build's HIP backend does not launch gather_dequant \
         (needs the `hip` feature and the dsv4_kvcache_gather_device cfg of the device wiring)",
    );
}

/// The comparison itself can fail: a one-thread CPU backend agrees with the
/// reference, and a case whose cache was corrupted does not.
#[test]
fn harness_detects_differences() {
    let one = CpuBackend::with_threads(1).expect("pool");
    let all: Vec<Case> = cases().into_iter().step_by(7).collect();
    assert!(
        mismatches(&one, &all).is_empty(),
        "thread count changed the bytes"
    );
    let cpu = CpuBackend::new();
    let mut changed = 0;
    for case in &all {
        let a = case.run(&cpu).unwrap();
        let mut other = case.clone();
        for b in other.cache.iter_mut() {
            *b ^= 0x11;
        }
        changed += usize::from(other.run(&cpu).unwrap() != a);
    }
    assert!(
        changed > all.len() / 2,
        "corrupting caches must change outputs"
    );
}
