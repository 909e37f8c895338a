//! Every insert kernel (V4, MXFP8, NVFP4, BF16 rows and FP8 rows, a token
//! per group and tile-major) compiled for the host from
//! `kernels-hip/kvcache.hip` and run against the CPU reference, byte for
//! byte, with their skip counts: the kernels' addressing (pages, rows, scale
//! placement, row strides), the tile-major mapping, the insert rule's checks,
//! the lanes' scale exchanges and the encoders' software paths, wherever no
//! GPU is at hand. The host runs the work-items one after the other, and
//! a V4 or MXFP8 group's lanes on threads of their own
//! (`tests/host_kernels/insert_host.cpp`), so that they exchange values as
//! on a device; the hardware conversion paths the device preludes add
//! (`KV_HW_*`) are left to the device parity tests.
//!
//! Needs a host C++17 compiler (`$CXX`, else `c++`); without one it prints
//! SKIPPED.

mod common;

use common::{
    adversarial_cases, all_kinds, insert_case, latent_row, random_case, run_case_mut, Buf,
    CacheSpec, Case, CosSinSpec, Geo, InsertSpec, Kind, Prng,
};
use dsv4_kvcache::kernel_abi::{insert_params, InsertParams, InsertPtrs, KernelParams};
use dsv4_kvcache::launch::Launch;
use dsv4_kvcache::ops::{plan_insert, InsertPlan};
use dsv4_kvcache::vectors::Op;
use dsv4_kvcache::TensorMut;
use dsv4_kvcache::{CpuBackend, InsertArgs, LaunchPolicy, SkipCounts, Tensor};
use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};

fn skipped(msg: &str) {
    let _ = writeln!(std::io::stderr(), "\n*** SKIPPED {msg} ***\n");
}

/// Builds the harness; `Err` says why it could not.
fn harness() -> Result<PathBuf, String> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let exe = std::env::temp_dir().join(format!("dsv4_insert_host_{}", std::process::id()));
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "c++".into());
    let out = Command::new(&cxx)
        .args([
            "-std=c++17",
            "-O1",
            "-ffp-contract=off",
            "-Wno-unknown-pragmas",
        ])
        .arg("-iquote")
        .arg(root.join("kernels-hip"))
        .arg("-iquote")
        .arg(root.join("tests/host_kernels"))
        .arg("-o")
        .arg(&exe)
        .arg(root.join("tests/host_kernels/insert_host.cpp"))
        .arg("-pthread")
        .output()
        .map_err(|e| format!("no host C++ compiler `{cxx}`: {e}"))?;
    if !out.status.success() {
        // A compiler that exists but fails on the kernel source is a test failure.
        panic!(
            "{cxx} failed on the kernel source:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(exe)
}

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
    let bufs: [&Vec<u8>; 6] = [
        &latent.bytes,
        &positions.bytes,
        &case.slot_mapping.bytes,
        &cos.bytes,
        &cache.bytes,
        fp8.map_or(&empty, |b| &b.bytes),
    ];
    if plan.n == 0 {
        return HostRun {
            cache: cache.bytes.clone(),
            counts: SkipCounts::default(),
            kernel: None,
        };
    }
    let id = |i: u64| (i + 1) << 48;
    let ptrs = InsertPtrs {
        latent: id(0),
        positions: id(1),
        slots: id(2),
        cos_sin: id(3),
        cache: id(4),
        fp8_scale: id(5),
        counters: 0,
    };
    let params = insert_params(plan, &ptrs, case.kind.sanitize).with_geometry(&launch.geometry);
    let mut input = Vec::new();
    input.extend_from_slice(&(bufs.len() as u32).to_le_bytes());
    for b in bufs {
        input.extend_from_slice(&(b.len() as u64).to_le_bytes());
        input.extend_from_slice(b);
    }
    // SAFETY: InsertParams is #[repr(C)] plain data (integers only).
    let raw = unsafe {
        std::slice::from_raw_parts(
            (&params as *const InsertParams).cast::<u8>(),
            std::mem::size_of::<InsertParams>(),
        )
    };
    input.extend_from_slice(raw);
    let name = launch.kernel.name();
    input.extend_from_slice(&(name.len() as u32).to_le_bytes());
    input.extend_from_slice(name.as_bytes());
    for v in [launch.geometry.grid, launch.geometry.block_threads] {
        input.extend_from_slice(&v.to_le_bytes());
    }
    let mut child = Command::new(exe)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("the harness runs");
    child.stdin.take().unwrap().write_all(&input).unwrap();
    let res = child.wait_with_output().unwrap();
    assert!(
        res.status.success(),
        "{}: harness failed on {name}",
        case.name
    );
    let o = &res.stdout;
    let before: usize = bufs[..4].iter().map(|b| b.len()).sum();
    let got = o[before..before + cache.bytes.len()].to_vec();
    let after: usize = bufs.iter().map(|b| b.len()).sum();
    let c = |i: usize| {
        let at = after + 4 * i;
        u64::from(u32::from_le_bytes(o[at..at + 4].try_into().unwrap()))
    };
    HostRun {
        cache: got,
        counts: SkipCounts {
            slot_out_of_range: c(0),
            position_out_of_range: c(1),
            index_out_of_range: c(2),
        },
        kernel: Some(name),
    }
}

/// An insert case of `n` tokens (the shared random cases have at most 8),
/// so that launches span many blocks of several tokens with a partial last
/// one.
fn long_case(seed: u64, kind: Kind, n: usize) -> Case {
    let mut rng = Prng::new(seed);
    let rng = &mut rng;
    let geo = Geo::random(rng);
    let max_pos = 4 * n + 8;
    let latent: Vec<u16> = (0..n)
        .flat_map(|_| latent_row(rng, kind.special_values))
        .collect();
    let positions: Vec<i64> = (0..n)
        .map(|_| {
            if kind.wild_indices && rng.chance(0.05) {
                -1
            } else {
                rng.range(0, max_pos as i64)
            }
        })
        .collect();
    let cache = CacheSpec::random(rng, kind.layout, n);
    let mut slots: Vec<i64> = rng
        .distinct(cache.capacity(), n)
        .into_iter()
        .map(|s| s as i64)
        .collect();
    for s in slots.iter_mut() {
        if rng.chance(0.1) {
            *s = -1;
        } else if kind.wild_indices && rng.chance(0.05) {
            *s = cache.capacity() as i64 + 1;
        }
    }
    let spec = InsertSpec {
        cr: kind.cr,
        latent,
        positions,
        slots,
        cos_sin: CosSinSpec::rotations(rng, max_pos + 1, kind.cos_bf16),
        cache,
        index_i64: kind.index_i64,
        geo,
    };
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

#[test]
fn host_built_insert_kernels_match_the_reference() {
    let exe = match harness() {
        Ok(e) => e,
        Err(why) => return skipped(&format!("insert host kernels: {why}")),
    };
    let mut cases = Vec::new();
    for (k, kind) in host_kinds().into_iter().enumerate() {
        for mix in 0..4u64 {
            let mut kind = kind;
            kind.special_values = mix & 1 == 1;
            kind.wild_indices = mix & 2 == 2;
            for i in 0..3u64 {
                cases.push(random_case((k as u64) << 32 | mix << 16 | i, kind));
            }
            let n = [37, 130, 301][(k + mix as usize) % 3];
            cases.push(long_case((k as u64) << 32 | mix << 16 | 0xff, kind, n));
        }
    }
    cases.extend(
        adversarial_cases()
            .into_iter()
            .filter(|c| c.kind.op == Op::RopeQuantInsert),
    );
    // The default policy, tile-major forced on and off, and each block size.
    let mut policies = vec![LaunchPolicy::default()];
    for tiles in [false, true] {
        for gpb in [2u32, 4, 8] {
            policies.push(LaunchPolicy {
                insert_tiles: Some(tiles),
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
    // Every insert kernel ran: a token per group for each layout, and the
    // tile-major kernels of the layouts that have one.
    assert_eq!(kernels.len(), 8, "kernels run: {kernels:?}");
    println!(
        "insert host kernels: {} cases, {runs} runs, 0 mismatching ({kernels:?})",
        cases.len()
    );
}
