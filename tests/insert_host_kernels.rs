//! Every insert kernel (V4, MXFP8, NVFP4, BF16 rows and FP8 rows, a token per
//! group, tile-major and generic: `kernels-hip/kv_insert.hip`) compiled for
//! the host from `kernels-hip/kvcache.hip` and run against the CPU reference,
//! byte for byte, with their skip counts: the kernels' addressing (pages,
//! rows, scale placement, row strides), the tile-major mapping, the insert
//! rule's checks, the lanes' scale exchanges and the encoders' software
//! paths, wherever no GPU is at hand. The host runs the work-items one after
//! the other, and a V4 or MXFP8 group's lanes on threads of their own
//! (`tests/host_kernels/insert_host.cpp`), so that they exchange values as on
//! a device; the hardware conversion paths the device preludes add
//! (`KV_HW_*`) are left to the device parity tests.
//!
//! Needs a host C++17 compiler (`$CXX`, else `c++`); without one it prints
//! SKIPPED.

mod common;
#[path = "host_kernels/mod.rs"]
mod host_kernels;

use common::{
    adversarial_cases, all_kinds, insert_case, mixed_kinds, random_case, random_insert_spec,
    run_case_mut, Buf, Case, Geo, Kind, Prng,
};
use dsv4_kvcache::kernel_abi::{insert_params, InsertPtrs, KernelParams};
use dsv4_kvcache::launch::Launch;
use dsv4_kvcache::ops::{plan_insert, InsertPlan};
use dsv4_kvcache::vectors::Op;
use dsv4_kvcache::TensorMut;
use dsv4_kvcache::{CpuBackend, InsertArgs, LaunchPolicy, SkipCounts, Tensor};
use std::path::PathBuf;

fn need<'a>(b: &'a Option<Buf>, what: &str, case: &Case) -> &'a Buf {
    b.as_ref()
        .unwrap_or_else(|| panic!("{}: insert case has no {what}", case.name))
}

/// What one host run gave: the cache after the launch, the skip counts and
/// the kernel that ran (`None` when there was nothing to launch).
struct HostRun {
    cache: Vec<u8>,
    counts: SkipCounts,
    kernel: Option<&'static str>,
}

/// The plan of an insert case (the reference validates the same arguments).
fn plan_of(case: &Case) -> InsertPlan {
    let cache = need(&case.kv_cache, "kv_cache", case);
    let mut cache_bytes = cache.bytes.clone();
    plan_insert(&InsertArgs {
        latent: need(&case.latent, "latent", case).t(),
        positions: need(&case.positions, "positions", case).t(),
        cos_sin_cache: need(&case.cos_sin_cache, "cos_sin_cache", case).t(),
        kv_cache: TensorMut::new(&mut cache_bytes, cache.desc),
        slot_mapping: case.slot_mapping.t(),
        compress_ratio: case.compress_ratio,
        fp8_scale: case
            .fp8_scale
            .as_ref()
            .map(|b| Tensor::new(&b.bytes, b.desc)),
        record_order: case.kind.record_order,
    })
    .unwrap_or_else(|e| panic!("{}: the case is valid: {e}", case.name))
}

/// Runs `case` (planned as `plan`) through `launch` on the host-built kernels.
fn run_host(exe: &PathBuf, case: &Case, plan: &InsertPlan, launch: &Launch) -> HostRun {
    let latent = need(&case.latent, "latent", case);
    let positions = need(&case.positions, "positions", case);
    let cos = need(&case.cos_sin_cache, "cos_sin_cache", case);
    let cache = need(&case.kv_cache, "kv_cache", case);
    let fp8 = case.fp8_scale.as_ref();
    let empty = Vec::new();
    if plan.n == 0 {
        return HostRun {
            cache: cache.bytes.clone(),
            counts: SkipCounts::default(),
            kernel: None,
        };
    }
    let (bufs, ptrs) = host_kernels::bind!(InsertPtrs {
        latent: &latent.bytes,
        positions: &positions.bytes,
        slots: &case.slot_mapping.bytes,
        cos_sin: &cos.bytes,
        cache: &cache.bytes,
        fp8_scale: fp8.map_or(&empty, |b| &b.bytes),
    });
    let params = insert_params(plan, &ptrs, case.kind.sanitize).with_geometry(&launch.geometry);
    let name = launch.kernel.name();
    let mut run = host_kernels::run(exe, &bufs, &params, name, &launch.geometry, &case.name);
    HostRun {
        cache: run.bufs.swap_remove(4),
        counts: run.counts,
        kernel: Some(name),
    }
}

/// An insert case of `n` tokens (the shared random cases have at most 8),
/// so that launches span many blocks of several tokens with a partial last
/// one.
fn long_case(seed: u64, kind: Kind, n: usize) -> Case {
    let mut rng = Prng::new(seed);
    let geo = Geo::random(&mut rng);
    let spec = random_insert_spec(&mut rng, &kind, geo, n, n, 4 * n + 8);
    insert_case(
        &format!("long {kind:?} n {n} seed {seed:#x}"),
        &spec,
        kind.sanitize,
    )
}

fn host_kinds() -> Vec<Kind> {
    all_kinds()
        .into_iter()
        .filter(|k| k.op == Op::RopeQuantInsert)
        .collect()
}

/// Builds the insert harness with `defines`, runs every insert case
/// through it under each distinct launch the policies make, and compares the
/// cache bytes and skip counts with the CPU reference.
fn check_against_reference(defines: &[&str]) {
    let exe = match host_kernels::build("insert_host.cpp", defines) {
        Ok(e) => e,
        Err(why) => return host_kernels::skipped(&format!("insert host kernels: {why}")),
    };
    let mut cases = Vec::new();
    for m in mixed_kinds(host_kinds()) {
        for i in 0..3u64 {
            cases.push(random_case(m.seed(i), m.kind));
        }
        let n = [37, 130, 301][(m.index + m.mix as usize) % 3];
        cases.push(long_case(m.seed(0xff), m.kind, n));
    }
    cases.extend(
        adversarial_cases()
            .into_iter()
            .filter(|c| c.kind.op == Op::RopeQuantInsert),
    );
    // The default policy, tile-major forced on and off, and each block size;
    // the large-launch kernels (V4, MXFP8) forced on with the token-per-group ones.
    let mut policies = vec![LaunchPolicy::default()];
    for tiles in [false, true] {
        for gpb in [2u32, 4, 8] {
            policies.push(LaunchPolicy {
                insert_tiles: Some(tiles),
                insert_large: Some(!tiles),
                groups_per_block: Some(gpb),
                ..LaunchPolicy::default()
            });
        }
    }
    let mut cpu = CpuBackend::new();
    let (mut runs, mut bad) = (0usize, 0usize);
    let mut kernels = std::collections::BTreeSet::new();
    for case in &cases {
        let want = run_case_mut(&mut cpu, case);
        want.result
            .as_ref()
            .unwrap_or_else(|e| panic!("{}: the reference fails: {e}", case.name));
        let want_cache = want.kv_cache.as_ref().expect("an insert writes a cache");
        // Each distinct launch the policies make, once.
        let plan = plan_of(case);
        let mut launches: Vec<Launch> = Vec::new();
        for pol in &policies {
            let l = pol.insert_launch(&plan);
            if !launches.contains(&l) {
                launches.push(l);
            }
        }
        for launch in &launches {
            let run = run_host(&exe, case, &plan, launch);
            kernels.extend(run.kernel);
            runs += 1;
            if &run.cache != want_cache || run.counts != want.skips {
                let i = run.cache.iter().zip(want_cache).position(|(a, b)| a != b);
                eprintln!(
                    "MISMATCH {} ({launch:?}): first byte {i:?}, counts {:?} want {:?}",
                    case.name, run.counts, want.skips
                );
                bad += 1;
            }
        }
    }
    let _ = std::fs::remove_file(&exe);
    assert_eq!(bad, 0, "{bad} of {runs} runs differ");
    // Every insert kernel ran: a token per group for each layout, the
    // tile-major and large-launch kernels of the layouts that have one, and
    // each layout's generic kernel (F16 tables).
    assert_eq!(kernels.len(), 15, "kernels run: {kernels:?}");
    println!(
        "insert host kernels: {} cases, {runs} runs, 0 mismatching ({kernels:?})",
        cases.len()
    );
}

#[test]
fn host_built_insert_kernels_match_the_reference() {
    check_against_reference(&[]);
}

/// The inserts as sm_90 builds them: the NVFP4 encoder on BF16 pairs
/// (`kv_e2m1x2_of_quotient_bf16x2`), the BF16 and e4m3 pair conversions and
/// byte permutes, built on the host from their Rust twins' definitions
/// (`KV_HOST_BF16X2_ARITH`, tests/host_kernels/prelude_host.h).
#[test]
fn host_built_inserts_on_bf16_pairs_match_the_reference() {
    check_against_reference(&["KV_HOST_BF16X2_ARITH"]);
}
