//! Device backends against the CPU reference, byte for byte: every op, layout,
//! compress ratio, `prev_rows` path, sanitize setting, index dtype and cos/sin
//! dtype (`common::all_kinds`), each with plain values, special values (NaN,
//! ±inf, ±0, extremes, e2m1 ties, power-of-two edges) and wild indices
//! (out-of-range slots, negative positions, tokens outside their chunk), on
//! random strides and offsets; plus the adversarial cases. Outputs compared:
//! the launch's result, latents, ring, cache and skip counts.
//!
//! Without a GPU this says loudly that it skipped; with
//! `DSV4_KVCACHE_REQUIRE_GPU=1` a missing CUDA GPU is a failure.
//! `DSV4_KVCACHE_PARITY_CASES` sets the cases per kind and value mix
//! (default 8: 336 kinds x 4 mixes x 8 = 10,752 random cases).
//!
//! The cases are decode-sized, so CR2 runs on the team kernels
//! (`kernel_abi::cr2_shape`) and CR1 inserts a token per group
//! (`kernel_abi::insert_uses_tiles`); run again with
//! `DSV4_KVCACHE_CR2_TEAMS=0` (lone groups), `DSV4_KVCACHE_CR2_TEAMS=2`
//! (pairs), `DSV4_KVCACHE_CR2_TEAMS=3` (lone groups by halves, the
//! long-chunk kernels), with `DSV4_KVCACHE_CR2_SCREEN=1` (teams or pairs
//! whose token blocks screen a token per group, as large decode batches
//! run them; the cases' multi-token chunks then pool several tokens per
//! block, and their compresses run the multi-token kernels, plain and
//! fused in teams, plain in pairs, `kernel_abi::Cr2Shape::multi_token`) and
//! with `DSV4_KVCACHE_INSERT_TILES=1` to check the kernels that larger
//! launches use (the line printed says which ran).

// Built without both GPU features, the device paths below are compiled out.
#![cfg_attr(
    not(all(feature = "cuda", feature = "hip")),
    allow(dead_code, unused_imports)
)]

mod common;

use common::{adversarial_cases, all_kinds, random_case, run_case_mut, Case};
use dsv4_kvcache::backend::Backend;
use dsv4_kvcache::CpuBackend;
use std::io::Write;

/// Writes past the test harness's capture, so a skip shows in a plain
/// `cargo test`.
fn skipped(msg: &str) {
    let _ = writeln!(std::io::stderr(), "\n*** SKIPPED {msg} ***\n");
}

fn require_gpu() -> bool {
    std::env::var("DSV4_KVCACHE_REQUIRE_GPU").is_ok_and(|v| v == "1")
}

/// Every case the parity run uses, labelled.
fn cases() -> Vec<(String, Case)> {
    let per: u64 = std::env::var("DSV4_KVCACHE_PARITY_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(8);
    let mut out = Vec::new();
    for (k, kind) in all_kinds().into_iter().enumerate() {
        for mix in 0..4u64 {
            let mut kind = kind;
            kind.special_values = mix & 1 == 1;
            kind.wild_indices = mix & 2 == 2;
            for i in 0..per {
                let seed = (k as u64) << 32 | mix << 16 | i;
                out.push((format!("{kind:?} seed {seed:#x}"), random_case(seed, kind)));
            }
        }
    }
    for (i, c) in adversarial_cases().into_iter().enumerate() {
        out.push((format!("adversarial #{i}"), c));
    }
    out
}

/// Runs every case on the reference and on `dev`; panics listing the first
/// mismatches.
fn check_backend<B: Backend>(dev: &mut B) {
    let mut cpu = CpuBackend::new();
    let all = cases();
    let (mut bad, mut bytes) = (Vec::new(), 0u64);
    for (label, case) in &all {
        let want = run_case_mut(&mut cpu, case);
        let got = run_case_mut(dev, case);
        for o in [&want.latent, &want.state_cache, &want.kv_cache]
            .into_iter()
            .flatten()
        {
            bytes += o.len() as u64;
        }
        if want != got {
            if bad.len() < 5 {
                eprintln!(
                    "MISMATCH {label}: want {:?} got {:?}",
                    want.skips, got.skips
                );
                for (name, w, g) in [
                    ("latent", &want.latent, &got.latent),
                    ("ring", &want.state_cache, &got.state_cache),
                    ("cache", &want.kv_cache, &got.kv_cache),
                ] {
                    if let (Some(w), Some(g)) = (w, g) {
                        let diff = w.iter().zip(g).filter(|(a, b)| a != b).count();
                        if diff > 0 {
                            eprintln!("  {name}: {diff} bytes differ");
                        }
                    }
                }
                if want.result != got.result {
                    eprintln!("  result: want {:?} got {:?}", want.result, got.result);
                }
            }
            bad.push(label.clone());
        }
    }
    println!(
        "PARITY {}: {} cases, {bytes} output bytes compared, {} mismatching cases (CR2 kernels: {}; CR1 inserts: {})",
        dev.name(),
        all.len(),
        bad.len(),
        {
            use dsv4_kvcache::kernel_abi::{cr2_shape, Cr2Items};
            // A one-token decode step, and whatever the environment forces.
            let s = cr2_shape(1, 1, false);
            match (s.items, s.screen_tokens) {
                (Cr2Items::Teams, false) => "teams",
                (Cr2Items::Teams, true) => "teams, tokens screened",
                (Cr2Items::Pairs, false) => "pairs",
                (Cr2Items::Pairs, true) => "pairs, tokens screened",
                (Cr2Items::Lone, _) => "one group per item",
                (Cr2Items::LoneHalves, _) => "one group per item, by halves",
            }
        },
        if dsv4_kvcache::kernel_abi::insert_uses_tiles(1, 1) {
            "tile-major where the layout has it"
        } else {
            "a token per group"
        }
    );
    assert!(
        bad.is_empty(),
        "device output differs from the reference in {} cases",
        bad.len()
    );
}

#[test]
fn cuda_matches_reference() {
    #[cfg(feature = "cuda")]
    match dsv4_kvcache::CudaBackend::new(0) {
        Ok(mut b) => check_backend(&mut b),
        Err(e) => {
            skipped(&format!("cuda_matches_reference: {e}"));
            assert!(
                !require_gpu(),
                "DSV4_KVCACHE_REQUIRE_GPU=1 but no CUDA device: {e}"
            );
        }
    }
    #[cfg(not(feature = "cuda"))]
    skipped("cuda_matches_reference: built without the `cuda` feature");
}

#[test]
fn hip_matches_reference() {
    #[cfg(feature = "hip")]
    match dsv4_kvcache::HipBackend::new(0) {
        Ok(mut b) => check_backend(&mut b),
        Err(e) => skipped(&format!("hip_matches_reference: {e}")),
    }
    #[cfg(not(feature = "hip"))]
    skipped("hip_matches_reference: built without the `hip` feature");
}

/// The comparison itself can fail: a second CPU backend on one thread agrees
/// with the reference, and a case whose cache was corrupted does not.
#[test]
fn harness_detects_differences() {
    let mut one = CpuBackend::with_threads(1).expect("pool");
    let mut cpu = CpuBackend::new();
    let all = cases();
    let mut changed = 0;
    for (label, case) in all.iter().step_by(97) {
        let a = run_case_mut(&mut cpu, case);
        assert!(
            a == run_case_mut(&mut one, case),
            "{label}: thread count changed the bytes"
        );
        if case.kv_cache.is_some() {
            let mut other = case.clone();
            let b = other.kv_cache.as_mut().expect("cache");
            let last = b.bytes.len() - 1;
            b.bytes[last] ^= 0xff;
            changed += (run_case_mut(&mut cpu, &other) != a) as usize;
        }
    }
    assert!(
        changed > 0,
        "corrupting an input cache must change the outputs"
    );
}
