//! The one-group-per-item compress and fused kernels, the tuned ones and the
//! generic (`_wide`) ones that read F32 or F16 weights and F16 cos/sin
//! tables, compiled for the host from `kernels-hip/kvcache.hip`
//! (`kv_compress.hip`, `kv_fused.hip`) and run against the CPU reference byte
//! for byte (latents, ring, cache, skip counts): every compress and fused
//! kind of `common::all_kinds` (with each weight and table type), with
//! special values and wild indices, and the adversarial cases, under each
//! block size. A group's 32 lanes run on threads of their own
//! (`tests/host_kernels/compressor_host.h`), so the norm's butterfly and the
//! records' exchanges run as on a device; the team kernels (block barriers,
//! shared memory) and the preludes' hardware paths are left to the device
//! parity tests.
//!
//! Needs a host C++17 compiler (`$CXX`, else `c++`); without one it prints
//! SKIPPED.

mod common;
#[path = "host_kernels/mod.rs"]
mod host_kernels;

use common::{adversarial_cases, all_kinds, mixed_kinds, random_case, run_case_mut, Buf, Case};
use dsv4_kvcache::kernel_abi::{
    compress_params, fused_params, CompressPtrs, InsertPtrs, KernelParams,
};
use dsv4_kvcache::launch::{Cr2Items, Launch};
use dsv4_kvcache::layout::RecordLayout;
use dsv4_kvcache::ops::{plan_compress, plan_fused, CompressPlan, FusedPlan};
use dsv4_kvcache::vectors::Op;
use dsv4_kvcache::{CompressArgs, CpuBackend, FusedArgs, LaunchPolicy, Tensor, TensorMut};
use std::collections::BTreeSet;
use std::path::PathBuf;

/// The buffers of a compress or fused case, in the order the pointers
/// below name them (absent ones empty).
fn buffers(case: &Case) -> Vec<Vec<u8>> {
    let b = |x: &Option<Buf>| x.as_ref().map_or(Vec::new(), |b| b.bytes.clone());
    vec![
        b(&case.kv_score),
        b(&case.positions),
        case.slot_mapping.bytes.clone(),
        b(&case.query_start_loc),
        b(&case.token_to_req_indices),
        b(&case.rms_norm_weight),
        b(&case.latent),
        b(&case.state_cache),
        b(&case.prev_rows),
        b(&case.prev_row_indices),
        b(&case.cache_slot_mapping),
        b(&case.cos_sin_cache),
        b(&case.kv_cache),
        b(&case.fp8_scale),
    ]
}

const LATENT: usize = 6;
const RING: usize = 7;
const CACHE: usize = 12;

fn ptrs() -> (CompressPtrs, InsertPtrs) {
    let id = host_kernels::buffer_ptr;
    (
        CompressPtrs {
            kv_score: id(0),
            positions: id(1),
            slots: id(2),
            qsl: id(3),
            ttr: id(4),
            weight: id(5),
            latent: id(6),
            ring: id(7),
            prev_rows: id(8),
            prev_idx: id(9),
            counters: 0,
        },
        InsertPtrs {
            latent: id(6),
            positions: id(1),
            slots: id(10),
            cos_sin: id(11),
            cache: id(12),
            fp8_scale: id(13),
            counters: 0,
        },
    )
}

/// A case's plan: the compressor's, with the insert's for fused cases.
enum Plan {
    Compress(CompressPlan),
    Fused(FusedPlan),
}

fn need<S: ?Sized>(x: Option<Tensor<'_, S>>) -> Tensor<'_, S> {
    x.expect("a compressor case has it")
}

fn plan_of(case: &Case) -> Plan {
    let bufs = buffers(case);
    let (mut latent, mut ring, mut cache) = (
        bufs[LATENT].clone(),
        bufs[RING].clone(),
        bufs[CACHE].clone(),
    );
    let view = |i: usize, b: &Option<Buf>| b.as_ref().map(|b| Tensor::new(&bufs[i], b.desc));
    let desc = |b: &Option<Buf>| b.as_ref().expect("a compressor case has it").desc;
    let compress = CompressArgs {
        kv_score: need(view(0, &case.kv_score)),
        positions: need(view(1, &case.positions)),
        state_cache: case
            .state_cache
            .as_ref()
            .map(|b| TensorMut::new(&mut ring, b.desc)),
        slot_mapping: Tensor::new(&bufs[2], case.slot_mapping.desc),
        query_start_loc: view(3, &case.query_start_loc),
        token_to_req_indices: view(4, &case.token_to_req_indices),
        rms_norm_weight: need(view(5, &case.rms_norm_weight)),
        rms_norm_eps: case.eps,
        compress_ratio: case.compress_ratio,
        latent_out: TensorMut::new(&mut latent, desc(&case.latent)),
        prev_rows: view(8, &case.prev_rows),
        prev_row_indices: view(9, &case.prev_row_indices),
    };
    let valid = |e: dsv4_kvcache::Error| -> ! { panic!("{}: the case is valid: {e}", case.name) };
    match case.kind.op {
        Op::FusedCompressInsert => Plan::Fused(
            plan_fused(&FusedArgs {
                compress,
                skip_latent_out: case.kind.skip_latent_out,
                cos_sin_cache: need(view(11, &case.cos_sin_cache)),
                kv_cache: TensorMut::new(&mut cache, desc(&case.kv_cache)),
                cache_slot_mapping: need(view(10, &case.cache_slot_mapping)),
                fp8_scale: view(13, &case.fp8_scale),
                record_order: case.kind.record_order,
            })
            .unwrap_or_else(|e| valid(e)),
        ),
        _ => Plan::Compress(plan_compress(&compress).unwrap_or_else(|e| valid(e))),
    }
}

/// Whether a kernel runs one group per item (what the host can run).
fn one_group_per_item(name: &str) -> bool {
    let lone = [
        "kv_compress_cr1",
        "kv_compress_cr2",
        "kv_fused_cr1_",
        "kv_fused_cr2_",
    ];
    !["_team", "_pair", "_long"].iter().any(|s| name.contains(s))
        && lone.iter().any(|p| name.starts_with(p))
}

/// What one host run wrote: latent, ring and cache buffers, and the counts.
type Written = (Vec<u8>, Vec<u8>, Vec<u8>, dsv4_kvcache::SkipCounts);

fn run_host(exes: &(PathBuf, PathBuf), case: &Case, plan: &Plan, launch: &Launch) -> Written {
    let bufs = buffers(case);
    let slices: Vec<&[u8]> = bufs.iter().map(|b| b.as_slice()).collect();
    let (c, i) = ptrs();
    let name = launch.kernel.name();
    let mut out = match plan {
        Plan::Compress(p) => {
            let params = compress_params(p, &c).with_geometry(&launch.geometry);
            host_kernels::run(
                &exes.0,
                &slices,
                &params,
                name,
                &launch.geometry,
                &case.name,
            )
        }
        Plan::Fused(p) => {
            let params =
                fused_params(p, &c, &i, case.kind.sanitize).with_geometry(&launch.geometry);
            host_kernels::run(
                &exes.1,
                &slices,
                &params,
                name,
                &launch.geometry,
                &case.name,
            )
        }
    };
    (
        std::mem::take(&mut out.bufs[LATENT]),
        std::mem::take(&mut out.bufs[RING]),
        std::mem::take(&mut out.bufs[CACHE]),
        out.counts,
    )
}

/// The compress and fused harnesses built with `defines`, or why not.
fn build_both(defines: &[&str]) -> Result<(PathBuf, PathBuf), String> {
    let build = |s| host_kernels::build(s, defines);
    Ok((build("compress_host.cpp")?, build("fused_host.cpp")?))
}

/// Runs every compressor case that `keep` accepts through the host-built
/// kernels `exes` under each distinct one-group launch the policies make,
/// compares the outputs and skip counts with the CPU reference, removes the
/// executables, and returns the kernels that ran.
fn check_against_reference(
    exes: (PathBuf, PathBuf),
    keep: impl Fn(&Case) -> bool,
) -> BTreeSet<&'static str> {
    let mut cases = Vec::new();
    let kinds: Vec<_> = all_kinds()
        .into_iter()
        .filter(|k| matches!(k.op, Op::FusedSaveCompressNorm | Op::FusedCompressInsert))
        .filter(|k| k.sanitize == k.index_i64)
        .collect();
    for m in mixed_kinds(kinds) {
        cases.push(random_case(m.seed(0xc0), m.kind));
    }
    cases.extend(adversarial_cases().into_iter().filter(|c| {
        matches!(
            c.kind.op,
            Op::FusedSaveCompressNorm | Op::FusedCompressInsert
        )
    }));
    cases.retain(|c| keep(c));
    // The default policy (the generic kernels for their types) and lone CR2
    // groups (the tuned kernels' one-group form) at each block size.
    let mut policies = vec![LaunchPolicy::default()];
    for gpb in [2u32, 4, 8] {
        policies.push(LaunchPolicy {
            cr2_items: Some(Cr2Items::Lone),
            groups_per_block: Some(gpb),
            ..LaunchPolicy::default()
        });
    }
    let mut cpu = CpuBackend::new();
    let (mut runs, mut bad) = (0usize, 0usize);
    let mut kernels = BTreeSet::new();
    for case in &cases {
        let want = run_case_mut(&mut cpu, case);
        want.result
            .as_ref()
            .unwrap_or_else(|e| panic!("{}: the reference fails: {e}", case.name));
        let plan = plan_of(case);
        let mut launches: Vec<Launch> = Vec::new();
        for pol in &policies {
            let l = match &plan {
                Plan::Compress(p) => pol.compress_launch(p),
                Plan::Fused(p) => pol.fused_launch(p),
            };
            if one_group_per_item(l.kernel.name()) && !launches.contains(&l) {
                launches.push(l);
            }
        }
        for launch in &launches {
            let (latent, ring, cache, counts) = run_host(&exes, case, &plan, launch);
            kernels.insert(launch.kernel.name());
            runs += 1;
            let same = Some(&latent) == want.latent.as_ref()
                && want.state_cache.as_ref().is_none_or(|r| *r == ring)
                && want.kv_cache.as_ref().is_none_or(|c| *c == cache)
                && counts == want.skips;
            if !same {
                eprintln!(
                    "MISMATCH {} ({launch:?}): counts {counts:?} want {:?}",
                    case.name, want.skips
                );
                bad += 1;
            }
        }
    }
    let _ = std::fs::remove_file(&exes.0);
    let _ = std::fs::remove_file(&exes.1);
    assert_eq!(bad, 0, "{bad} of {runs} runs differ");
    println!(
        "compressor host kernels: {} cases, {runs} runs, 0 mismatching ({kernels:?})",
        cases.len()
    );
    kernels
}

#[test]
fn host_built_compressor_kernels_match_the_reference() {
    let exes = match build_both(&[]) {
        Ok(e) => e,
        Err(why) => return host_kernels::skipped(&format!("compressor host kernels: {why}")),
    };
    let kernels = check_against_reference(exes, |_| true);
    // Every one-group kernel ran: two compress and ten fused ones, tuned
    // and generic.
    assert_eq!(kernels.len(), 24, "kernels run: {kernels:?}");
}

/// The compressors and the fused NVFP4 writers as sm_90 builds them: the
/// prelude's BF16 pair conversion for the latent and the NVFP4 encoder on
/// BF16 pairs, the packed arithmetic built on the host from its Rust twins'
/// definitions (`KV_HOST_BF16X2_ARITH`, tests/host_kernels/prelude_host.h).
#[test]
fn host_built_compressors_on_bf16_pairs_match_the_reference() {
    let exes = match build_both(&["KV_HOST_BF16X2_ARITH"]) {
        Ok(e) => e,
        Err(why) => return host_kernels::skipped(&format!("compressor host kernels: {why}")),
    };
    let kernels = check_against_reference(exes, |c| {
        c.kind.op == Op::FusedSaveCompressNorm || c.kind.layout == RecordLayout::Nvfp4
    });
    // The compressors (CR1, CR2, tuned and generic) and the fused NVFP4
    // kernels (CR1 and CR2, tuned and generic).
    assert!(
        kernels.iter().any(|k| k.contains("nvfp4")),
        "kernels run: {kernels:?}"
    );
    assert!(
        kernels.iter().any(|k| k.starts_with("kv_compress")),
        "kernels run: {kernels:?}"
    );
}

/// The kernels' F16 decode (`kv_f16_to_f32`, host-built) equals the
/// reference's (`formats::f16_to_f32`, itself checked against `half` and
/// the fields in tests/formats_exhaustive.rs) on every one of the 65,536
/// codes, NaN payloads included.
#[test]
fn host_built_f16_decode_is_the_reference_on_every_code() {
    let exe = match host_kernels::build("formats_host.cpp", &[]) {
        Ok(e) => e,
        Err(why) => return host_kernels::skipped(&format!("F16 decode on the host: {why}")),
    };
    let out = std::process::Command::new(&exe)
        .output()
        .expect("the decode runs");
    let _ = std::fs::remove_file(&exe);
    assert!(out.status.success());
    assert_eq!(out.stdout.len(), 4 << 16);
    for (h, w) in out.stdout.chunks_exact(4).enumerate() {
        let got = u32::from_le_bytes(w.try_into().unwrap());
        let want = dsv4_kvcache::formats::f16_to_f32(h as u16).to_bits();
        assert_eq!(got, want, "code {h:#06x}");
    }
}

/// The block order of `kv_compress_cr2_pair_mtp_spread` (`kv_spread_item`,
/// host-built), over the grid the launch gives a screened launch of pairs
/// (and of teams, which the layout serves alike):
/// every item (the requests, then the token blocks) gets exactly one block;
/// the requests and the token blocks each keep their order; and the grid is
/// frames, one per run of `KV_CR2_SPREAD_RUN` token blocks (the last one
/// shorter), each its share of the request blocks and then its run, the
/// shares differing by at most one, the larger first, nothing after the last
/// run.
#[test]
fn spread_launches_give_every_item_one_block_and_the_token_blocks_runs_among_the_requests() {
    use dsv4_kvcache::kernel_abi::{TokenBlocks, CR2_PAIR_GROUPS, CR2_TEAM_GROUPS};
    use dsv4_kvcache::launch::screened_team_geometry;
    let exe = match host_kernels::build("spread_host.cpp", &[]) {
        Ok(e) => e,
        Err(why) => {
            return host_kernels::skipped(&format!("spread block order on the host: {why}"))
        }
    };
    let src = std::fs::read_to_string(
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("kernels-hip/kv_compress.h"),
    )
    .expect("kernel source");
    let run: u64 = src
        .lines()
        .find_map(|l| l.strip_prefix("#define KV_CR2_SPREAD_RUN "))
        .and_then(|v| v.trim().trim_end_matches('u').parse().ok())
        .expect("KV_CR2_SPREAD_RUN");
    let shapes: [(u64, u64); 11] = [
        (65536, 32768), // two-token decode, the bench's largest
        (24576, 12288),
        (1024, 512),
        (16, 8),
        (6, 2),
        (0, 5),
        (0, 0),
        (1, 1),
        (1000, 1),    // fewer requests than runs
        (2048, 2048), // more requests than token blocks' frames
        (4 * 257 + 3, 7),
    ];
    let cases = [CR2_PAIR_GROUPS, CR2_TEAM_GROUPS]
        .into_iter()
        .flat_map(|g| shapes.map(|(n, reqs)| (g, n, reqs)));
    for (groups, n, reqs) in cases {
        let grid = screened_team_geometry(n, reqs, groups, TokenBlocks::Screened).grid as u64;
        let b = n.div_ceil(groups as u64);
        assert_eq!(grid, (reqs + b).max(1), "n {n}, {reqs} requests");
        let out = std::process::Command::new(&exe)
            .args([
                groups.to_string(),
                n.to_string(),
                reqs.to_string(),
                grid.to_string(),
            ])
            .output()
            .expect("the host program runs");
        assert!(
            out.status.success(),
            "{groups} groups, n {n}, {reqs} requests"
        );
        let items: Vec<u64> = out
            .stdout
            .chunks_exact(4)
            .map(|w| u32::from_le_bytes(w.try_into().unwrap()) as u64)
            .collect();
        assert_eq!(items.len() as u64, grid);
        let ctx = format!("{groups} groups, n {n}, {reqs} requests, blocks {items:?}");
        let mut sorted = items.clone();
        sorted.sort_unstable();
        assert!(
            sorted.iter().copied().eq(0..grid),
            "one block per item: {ctx}"
        );
        let reqs_in_order: Vec<u64> = items.iter().copied().filter(|&i| i < reqs).collect();
        assert!(reqs_in_order.windows(2).all(|w| w[0] < w[1]), "{ctx}");
        let tokens: Vec<u64> = items.iter().copied().filter(|&i| i >= reqs).collect();
        assert!(tokens.windows(2).all(|w| w[0] < w[1]), "{ctx}");
        if b == 0 {
            continue;
        }
        // Frames: the request blocks before each run of `run` token blocks.
        let mut shares = Vec::new();
        let (mut share, mut in_run) = (0u64, 0u64);
        for &i in &items {
            if i < reqs {
                assert_eq!(in_run, 0, "a run is not interrupted: {ctx}");
                share += 1;
            } else {
                in_run += 1;
                if in_run == run || i == reqs + b - 1 {
                    shares.push(share);
                    (share, in_run) = (0, 0);
                }
            }
        }
        assert_eq!(shares.len() as u64, b.div_ceil(run), "{ctx}");
        assert_eq!(share, 0, "no request block after the last run: {ctx}");
        assert_eq!(items.last(), Some(&(reqs + b - 1)), "{ctx}");
        let (lo, hi) = (*shares.iter().min().unwrap(), *shares.iter().max().unwrap());
        assert!(hi - lo <= 1, "shares {shares:?}: {ctx}");
        assert!(
            shares.windows(2).all(|w| w[0] >= w[1]),
            "shares {shares:?}: {ctx}"
        );
    }
    let _ = std::fs::remove_file(&exe);
}
