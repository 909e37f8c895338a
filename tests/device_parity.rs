//! Device backends against the CPU reference, byte for byte: every op, layout,
//! compress ratio, `prev_rows` path, sanitize setting, index dtype and cos/sin
//! dtype (`common::all_kinds`), each with plain values, special values (NaN,
//! ±inf, ±0, extremes, e2m1 ties, power-of-two edges) and wild indices
//! (out-of-range slots, negative positions, tokens outside their chunk), on
//! random strides and offsets; plus the adversarial cases. Outputs compared:
//! the launch's result, latents, ring, cache and skip counts.
//!
//! Every case runs under each of the eight launch policies of
//! `LaunchPolicy::MAPPINGS` (the measured heuristics, lone CR2 groups, pairs,
//! lone groups by halves, screened teams, screened pairs, tile-major CR1
//! inserts, and blocks of 8 groups), which together launch every kernel
//! (`launch::tests::the_mappings_reach_every_kernel`), in one process.
//!
//! Without a GPU this says loudly that it skipped; `DSV4_KVCACHE_REQUIRE_GPU`
//! makes a missing device a failure (`tests/gpu_required`).
//! `DSV4_KVCACHE_PARITY_CASES` sets the cases per kind and value mix
//! (default 8: 336 kinds x 4 mixes x 8 = 10,752 random cases, each run
//! under the eight policies).

// Built without both GPU features, the device paths below are compiled out.
#![cfg_attr(
    not(all(feature = "cuda", feature = "hip")),
    allow(dead_code, unused_imports)
)]

mod common;
#[path = "gpu_required/mod.rs"]
#[macro_use]
mod gpu_required;

#[path = "flips_a_byte/mod.rs"]
mod flips_a_byte;
use flips_a_byte::{Flip, FlipsAByte};

use common::{adversarial_cases, all_kinds, mixed_kinds, random_case, run_case_mut, Case, Outputs};
use dsv4_kvcache::backend::gpu::{Driver, GpuBackend};
use dsv4_kvcache::backend::Backend;
use dsv4_kvcache::{CpuBackend, LaunchPolicy};

/// Every case the parity run uses, labelled.
fn cases() -> Vec<(String, Case)> {
    let per: u64 = std::env::var("DSV4_KVCACHE_PARITY_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(8);
    let mut out = Vec::new();
    for m in mixed_kinds(all_kinds()) {
        for i in 0..per {
            let seed = m.seed(i);
            out.push((
                format!("{:?} seed {seed:#x}", m.kind),
                random_case(seed, m.kind),
            ));
        }
    }
    for (i, c) in adversarial_cases().into_iter().enumerate() {
        out.push((format!("adversarial #{i}"), c));
    }
    out
}

/// What a parity run found under one launch mapping.
#[derive(Default)]
struct Tally {
    /// Labels of the cases whose outputs differ.
    bad: Vec<String>,
    /// Output bytes compared.
    bytes: u64,
}

/// Compares one case's device outputs with the reference's, printing the
/// first few differences.
fn compare(tally: &mut Tally, mapping: &str, label: &str, want: &Outputs, got: &Outputs) {
    for o in [&want.latent, &want.state_cache, &want.kv_cache]
        .into_iter()
        .flatten()
    {
        tally.bytes += o.len() as u64;
    }
    if want == got {
        return;
    }
    if tally.bad.len() < 5 {
        eprintln!(
            "MISMATCH [{mapping}] {label}: want {:?} got {:?}",
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
    tally.bad.push(label.to_string());
}

/// Runs `all` on the reference and on `dev` once per entry of `mappings`
/// (`set` switches `dev` to it); one tally per mapping.
fn parity<B: Backend>(
    dev: &mut B,
    all: &[(String, Case)],
    mappings: &[&str],
    mut set: impl FnMut(&mut B, usize),
) -> Vec<Tally> {
    let mut cpu = CpuBackend::new();
    let mut tallies: Vec<Tally> = mappings.iter().map(|_| Tally::default()).collect();
    for (label, case) in all {
        let want = run_case_mut(&mut cpu, case);
        for (m, tally) in tallies.iter_mut().enumerate() {
            set(dev, m);
            let got = run_case_mut(dev, case);
            compare(tally, mappings[m], label, &want, &got);
        }
    }
    tallies
}

/// Every case under every launch mapping on `dev`; panics listing the
/// mismatches.
fn check_gpu<D: Driver>(dev: &mut GpuBackend<D>) {
    let all = cases();
    let before = dev.launch_policy();
    let labels: Vec<&str> = LaunchPolicy::MAPPINGS.iter().map(|(l, _)| *l).collect();
    let tallies = parity(dev, &all, &labels, |d, m| {
        d.set_launch_policy(LaunchPolicy::MAPPINGS[m].1)
    });
    dev.set_launch_policy(before);
    let mut failed = 0;
    for ((label, policy), t) in LaunchPolicy::MAPPINGS.iter().zip(&tallies) {
        println!(
            "PARITY {} [{label}]: {} cases, {} output bytes compared, {} mismatching cases ({})",
            dev.name(),
            all.len(),
            t.bytes,
            t.bad.len(),
            policy.describe()
        );
        failed += t.bad.len();
    }
    assert_eq!(
        failed, 0,
        "device output differs from the reference in {failed} case runs"
    );
}

#[test]
fn cuda_matches_reference() {
    on_gpu!(cuda, "cuda_matches_reference", |b| check_gpu(b));
}

#[test]
fn hip_matches_reference() {
    on_gpu!(hip, "hip_matches_reference", |b| check_gpu(b));
}

/// Whether a case wrote (or kept) any output bytes.
fn has_output(o: &Outputs) -> bool {
    [&o.latent, &o.state_cache, &o.kv_cache]
        .into_iter()
        .flatten()
        .any(|v| !v.is_empty())
}

/// The harness itself can fail: a second CPU backend on one thread passes
/// it, and a backend that flips a byte of every read fails it on every case
/// that has an output (under each mapping it is run with).
#[test]
fn harness_detects_differences() {
    let all: Vec<(String, Case)> = cases().into_iter().step_by(97).collect();
    let mut one = CpuBackend::with_threads(1).expect("pool");
    let t = parity(&mut one, &all, &["cpu, one thread"], |_, _| {});
    assert!(
        t[0].bad.is_empty(),
        "thread count changed the bytes: {:?}",
        t[0].bad
    );
    assert!(t[0].bytes > 0);
    let mut cpu = CpuBackend::new();
    let with_output = all
        .iter()
        .filter(|(_, c)| has_output(&run_case_mut(&mut cpu, c)))
        .count();
    assert!(with_output > 0);
    let mut wrong = FlipsAByte::new(Flip::First(1));
    let t = parity(&mut wrong, &all, &["a", "b"], |_, _| {});
    for tally in &t {
        assert_eq!(
            tally.bad.len(),
            with_output,
            "the harness must report every case the stand-in corrupted"
        );
    }
}
