//! `gather_dequant` on the CUDA and HIP backends against the CPU reference,
//! byte for byte: every layout, both addressing forms, BF16 and F32 output,
//! I32 and I64 indices, padded caches and outputs, random, adversarial
//! (every code under every scale, NaN codes, scale 0xFF, -0, subnormals)
//! and inserted records, wild indices; the whole output buffer (canaries
//! around and between the rows) and the skip counts are compared. Sizes run
//! from 1 row to 9001, across `gather::gather_split_max_rows`, and every
//! case runs under each of `LaunchPolicy::MAPPINGS` (two of which force a
//! row a group and two rows a group), so every launch shape is checked at
//! every size. A few cases also run captured in a graph and replayed, and
//! through the raw entry point on the backend's stream, against the eager
//! launch.
//!
//! Without a GPU each test prints SKIPPED with the reason;
//! `DSV4_KVCACHE_REQUIRE_GPU` makes a missing device a failure
//! (`tests/gpu_required`).

// Built without both GPU features, the device paths below are compiled out.
#![cfg_attr(
    not(all(feature = "cuda", feature = "hip")),
    allow(dead_code, unused_imports)
)]

mod gather_cases;
#[path = "gpu_required/mod.rs"]
#[macro_use]
mod gpu_required;
#[path = "gpu_pair/mod.rs"]
#[macro_use]
mod gpu_pair;

use dsv4_kvcache::backend::gpu::{Driver, GpuBackend};
use dsv4_kvcache::{Backend, CpuBackend, LaunchPolicy, RecordLayout};
use gather_cases::{layout_sweep, Case};

/// Every case the device runs.
fn cases() -> Vec<Case> {
    let mut seed = 0u64;
    let sizes = [1, 16, 64, 128, 1024, 9001];
    RecordLayout::ALL
        .into_iter()
        .flat_map(|layout| layout_sweep(layout, &sizes, 20, &mut seed))
        .collect()
}

/// The labels of the cases where `dev` differs from the reference (whole
/// output buffers and skip counts); `want` holds the reference's outcomes.
fn mismatches<B: Backend>(dev: &B, all: &[Case], want: &[gather_cases::Outcome]) -> Vec<String> {
    let mut bad = Vec::new();
    for (case, want) in all.iter().zip(want) {
        let got = match case.run(dev) {
            Ok(g) => g,
            Err(e) => {
                bad.push(format!("{}: {e}", case.label));
                continue;
            }
        };
        if *want != got {
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

fn reference(all: &[Case]) -> Vec<gather_cases::Outcome> {
    let cpu = CpuBackend::new();
    all.iter()
        .map(|c| c.run(&cpu).expect("the reference runs every case"))
        .collect()
}

/// Every case under every launch mapping on `dev`; then graph and raw
/// launches against eager ones.
fn check_gpu<D: Driver>(dev: &mut GpuBackend<D>) {
    let all = cases();
    let want = reference(&all);
    let before = dev.launch_policy();
    let mut failed = 0;
    for (label, policy) in LaunchPolicy::MAPPINGS {
        dev.set_launch_policy(policy);
        let bad = mismatches(dev, &all, &want);
        println!(
            "GATHER PARITY {} [{label}]: {} cases, {} mismatching",
            dev.name(),
            all.len(),
            bad.len()
        );
        failed += bad.len();
    }
    dev.set_launch_policy(before);
    assert_eq!(
        failed, 0,
        "device output differs from the reference in {failed} case runs"
    );
    graph_and_raw_match_eager(dev, &all);
}

/// A few cases (both forms, every layout, both shapes) captured into a graph
/// and replayed, and launched through `gather_dequant_raw` on the backend's
/// stream with caller-held counters: the same bytes and counts as eager.
fn graph_and_raw_match_eager<D: Driver>(dev: &GpuBackend<D>, all: &[Case]) {
    let picked: Vec<&Case> = all
        .iter()
        .filter(|c| c.label.contains("wild true") || c.label.contains("every code"))
        .step_by(5)
        .collect();
    assert!(picked.len() >= 8);
    let mut counters = dev.alloc_zeroed(12).expect("counters");
    for case in picked {
        dev.write(&mut counters, &[0; 12]).unwrap();
        let eager = case.run(dev).expect("eager");
        // Graph: captured once, replayed twice on a fresh canary output;
        // replays overwrite the same rows with the same bytes.
        dev.take_skip_counts().unwrap();
        let mut u = case.upload(dev).expect("upload");
        let graph = {
            let (cache, index, fp8) = (&u.cache, &u.index, u.fp8.as_ref());
            let out = &mut u.out;
            dev.capture(1, || {
                dev.gather_dequant(case.args(cache, index, fp8, &mut *out))
            })
            .expect("the reader can be captured")
        };
        let fresh = dev.read(&u.out).unwrap();
        assert_eq!(
            fresh,
            case.canary_out(),
            "{}: capture ran the launch",
            case.label
        );
        // SAFETY: every buffer the graph uses lives until after the reads.
        unsafe {
            graph.launch().unwrap();
            graph.launch().unwrap();
        }
        let got = dev.read(&u.out).unwrap();
        let counts = dev.take_skip_counts().unwrap();
        assert_eq!(
            got, eager.out,
            "{}: graph replay differs from eager",
            case.label
        );
        let doubled = {
            let mut c = eager.counts;
            c.add(eager.counts);
            c
        };
        assert_eq!(counts, doubled, "{}: two replays count twice", case.label);
        drop(graph);
        // Raw: the same memory through RawDevice pointers, counted at
        // caller-held counters.
        let raw = case.upload(dev).expect("upload");
        let index: Vec<_> = raw.index.iter().map(|b| b.as_raw()).collect();
        let (cache, fp8) = (raw.cache.as_raw(), raw.fp8.as_ref().map(|f| f.as_raw()));
        let mut out = raw.out.as_raw();
        let args = case.args(&cache, &index, fp8.as_ref(), &mut out);
        // SAFETY: the buffers are this backend's and outlive the launch,
        // which is waited for by the read below.
        unsafe {
            dev.gather_dequant_raw(&args, dev.stream(), Some(counters.device_ptr()))
                .expect("raw launch");
        }
        let got = dev.read(&raw.out).unwrap();
        assert_eq!(
            got, eager.out,
            "{}: raw launch differs from eager",
            case.label
        );
        let c = dev.read(&counters).unwrap();
        let total: u64 = c
            .chunks_exact(4)
            .map(|w| u64::from(u32::from_le_bytes(w.try_into().unwrap())))
            .sum();
        assert_eq!(total, eager.counts.total(), "{}: raw counters", case.label);
        assert_eq!(
            dev.take_skip_counts().unwrap().total(),
            0,
            "{}: the raw launch counted in the caller's counters only",
            case.label
        );
    }
    println!(
        "GATHER GRAPH/RAW {}: replays and raw launches match eager",
        dev.name()
    );
}

gpu_tests!(
    cuda_matches_reference,
    hip_matches_reference,
    prefix = "gather ",
    |b| check_gpu(b)
);

/// The comparison itself can fail: a one-thread CPU backend agrees with the
/// reference, and a case whose cache was corrupted does not.
#[test]
fn harness_detects_differences() {
    let one = CpuBackend::with_threads(1).expect("pool");
    let all: Vec<Case> = cases().into_iter().step_by(7).collect();
    assert!(
        mismatches(&one, &all, &reference(&all)).is_empty(),
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
