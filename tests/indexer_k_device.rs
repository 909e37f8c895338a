//! `indexer_k_norm_rope_store` on the CUDA and HIP backends against the CPU
//! reference, byte for byte: both formats, every page order (row-major,
//! tiled, preshuffled with N = 16, 32, 64), both scale forms, CR 1 and 2,
//! I32 and I64 indices, F32/BF16/F16 tables and weights, `k_pre` rows of
//! any stride (8-byte and 2-byte aligned), random and adversarial keys
//! (zeros, infinities, NaNs, values near the BF16 maximum, scale
//! boundaries), wild indices, padded pages. The whole cache (canary bytes
//! included) and the skip counts are compared, under each of
//! `LaunchPolicy::MAPPINGS`, from 1 token to 5000.
//!
//! The same kernel source also runs built for the host (a group's 32 lanes
//! on threads of their own, `tests/host_kernels/indexer_k_host.cpp`), under
//! every mapping, against the same reference: the kernels' addressing,
//! lane mapping, shuffles and encoders checked wherever no GPU is at hand.
//!
//! Without a GPU each device test prints SKIPPED with the reason;
//! `DSV4_KVCACHE_REQUIRE_GPU` makes a missing device a failure.

#![cfg_attr(
    not(all(feature = "cuda", feature = "hip")),
    allow(dead_code, unused_imports)
)]

#[path = "gpu_required/mod.rs"]
#[macro_use]
mod gpu_required;
#[path = "gpu_pair/mod.rs"]
#[macro_use]
mod gpu_pair;
#[path = "host_kernels/mod.rs"]
mod host_kernels;

use dsv4_kvcache::backend::gpu::{Driver, GpuBackend};
use dsv4_kvcache::formats::bf16_from_f32;
use dsv4_kvcache::indexer_k::{indexer_k_launch, indexer_k_params, plan_indexer_k, IndexerKPtrs};
use dsv4_kvcache::kernel_abi::KernelParams;
use dsv4_kvcache::ops::SkipCounts;
use dsv4_kvcache::testkit::Rng;
use dsv4_kvcache::{
    Backend, CpuBackend, DType, IndexerKArgs, IndexerKFormat, IndexerKOrder, LaunchPolicy, Result,
    Tensor, TensorDesc, TensorMut,
};

/// One call's inputs as bytes.
#[derive(Clone)]
struct Case {
    label: String,
    n: usize,
    k_pre: Vec<u8>,
    k_stride: usize,
    positions: Vec<u8>,
    slots: Vec<u8>,
    idx: DType,
    cos: Vec<u8>,
    cos_dtype: DType,
    max_pos: usize,
    weight: Vec<u8>,
    w_dtype: DType,
    cache: Vec<u8>,
    blocks: usize,
    block_size: usize,
    block_stride: usize,
    cr: u32,
    format: IndexerKFormat,
    order: IndexerKOrder,
    mx_scale: bool,
}

fn put(dtype: DType, v: f32) -> Vec<u8> {
    match dtype {
        DType::BF16 => bf16_from_f32(v).to_le_bytes().to_vec(),
        DType::F16 => half::f16::from_f32(v).to_le_bytes().to_vec(),
        _ => v.to_le_bytes().to_vec(),
    }
}

fn index(dtype: DType, v: &[i64]) -> Vec<u8> {
    v.iter()
        .flat_map(|&x| match dtype {
            DType::I64 => x.to_le_bytes().to_vec(),
            _ => (x as i32).to_le_bytes().to_vec(),
        })
        .collect()
}

/// A key value: normal draws over a wide range of magnitudes, with the
/// special values adversarial cases add.
fn key_value(rng: &mut Rng, row_scale: f32, adversarial: bool) -> f32 {
    if adversarial {
        match rng.below(40) {
            0 => return f32::INFINITY,
            1 => return f32::NEG_INFINITY,
            2 => return f32::NAN,
            3 => return 0.0,
            4 => return -0.0,
            5 => return 3.3e38,
            6 => return 448.0 * 1e-4 * (1.0 + rng.uniform() as f32 * 1e-6),
            7 => return 6.0 * f32::MIN_POSITIVE,
            _ => {}
        }
    }
    rng.normal() * row_scale
}

#[allow(clippy::too_many_arguments)]
fn make_case(
    seed: u64,
    n: usize,
    format: IndexerKFormat,
    order: IndexerKOrder,
    mx_scale: bool,
    cr: u32,
    adversarial: bool,
    wild: bool,
) -> Case {
    let mut rng = Rng::new(seed);
    let pick = |rng: &mut Rng, xs: &[DType]| xs[rng.below(xs.len() as u64) as usize];
    let idx = pick(&mut rng, &[DType::I32, DType::I64]);
    let cos_dtype = pick(&mut rng, &[DType::F32, DType::BF16, DType::F16]);
    let w_dtype = pick(&mut rng, &[DType::F32, DType::BF16, DType::F16]);
    let k_stride = [128, 128, 131, 136, 256][rng.below(5) as usize];
    let block_size = match order {
        IndexerKOrder::Preshuffled { n_per_tile } => {
            n_per_tile as usize * (1 + rng.below(2) as usize)
        }
        IndexerKOrder::Tiled => 16 * (1 + rng.below(4) as usize),
        IndexerKOrder::RowMajor => [1, 16, 64, 48][rng.below(4) as usize],
    };
    let blocks = (n * 5 / 4).div_ceil(block_size).max(1) + 1;
    let rec = format.record_bytes();
    let block_stride = block_size * rec + if rng.below(3) == 0 { 16 } else { 0 };
    let max_pos = 512;
    let mut k_pre = Vec::with_capacity(2 * n * k_stride);
    for _ in 0..n {
        let row_scale = 2f32.powi(rng.below(40) as i32 - 20);
        for _ in 0..k_stride {
            k_pre.extend(bf16_from_f32(key_value(&mut rng, row_scale, adversarial)).to_le_bytes());
        }
    }
    let cap = (blocks * block_size) as i64;
    let perm = rng.permutation(cap as usize);
    let mut slots: Vec<i64> = (0..n).map(|t| perm[t % perm.len()] as i64).collect();
    let mut positions: Vec<i64> = (0..n)
        .map(|_| rng.below(max_pos as u64 - 8) as i64)
        .collect();
    for t in 0..n {
        if rng.below(10) == 0 {
            slots[t] = -1;
        }
        if wild {
            match rng.below(12) {
                0 => slots[t] = cap + rng.below(100) as i64,
                1 => positions[t] = -(1 + rng.below(5) as i64),
                2 => positions[t] = max_pos as i64 + rng.below(9) as i64,
                _ => {}
            }
        }
    }
    let mut cos = Vec::new();
    for p in 0..max_pos {
        for j in 0..32 {
            let a = (p as f32 + 1.0) * (j as f32 + 1.0) * 0.01;
            cos.extend(put(cos_dtype, a.cos()));
        }
        for j in 0..32 {
            let a = (p as f32 + 1.0) * (j as f32 + 1.0) * 0.01;
            cos.extend(put(cos_dtype, a.sin()));
        }
    }
    let mut weight = Vec::new();
    for _ in 0..128 {
        weight.extend(put(w_dtype, 1.0 + 0.2 * rng.normal()));
    }
    let cache = rng.bytes(blocks * block_stride);
    Case {
        label: format!(
            "{} {} mx {mx_scale} cr {cr} n {n} {idx} cos {cos_dtype} w {w_dtype} stride {k_stride} bs {block_size} adv {adversarial} wild {wild}",
            format.name(),
            match order {
                IndexerKOrder::Preshuffled { n_per_tile } => format!("preshuffled {n_per_tile}"),
                o => o.name().to_string(),
            }
        ),
        n,
        k_pre,
        k_stride,
        positions: index(idx, &positions),
        slots: index(idx, &slots),
        idx,
        cos,
        cos_dtype,
        max_pos,
        weight,
        w_dtype,
        cache,
        blocks,
        block_size,
        block_stride,
        cr,
        format,
        order,
        mx_scale,
    }
}

fn cases() -> Vec<Case> {
    use IndexerKFormat::*;
    let kinds = [
        (Fp8, IndexerKOrder::RowMajor, false),
        (Fp8, IndexerKOrder::RowMajor, true),
        (Fp8, IndexerKOrder::Tiled, false),
        (Mxfp4, IndexerKOrder::RowMajor, false),
        (Mxfp4, IndexerKOrder::Preshuffled { n_per_tile: 16 }, false),
        (Mxfp4, IndexerKOrder::Preshuffled { n_per_tile: 32 }, false),
        (Mxfp4, IndexerKOrder::Preshuffled { n_per_tile: 64 }, false),
    ];
    let mut out = Vec::new();
    let mut seed = 1;
    for (f, o, mx) in kinds {
        for n in [1, 7, 64, 1000, 5000] {
            for cr in [1, 2] {
                for (adv, wild) in [(false, false), (true, false), (true, true)] {
                    seed += 1;
                    if n == 5000 && (adv || cr == 2) {
                        continue;
                    }
                    out.push(make_case(seed, n, f, o, mx, cr, adv, wild));
                }
            }
        }
    }
    out
}

/// The cache after the call, and the skip counts.
type Outcome = (Vec<u8>, SkipCounts);

impl Case {
    /// The call's arguments over host buffers (`bufs`: k_pre, positions,
    /// slots, cos/sin, weight, cache).
    fn args<'a>(&self, bufs: &'a mut [Vec<u8>; 6]) -> IndexerKArgs<'a, Vec<u8>> {
        let rec = self.format.record_bytes();
        let [k, pos, slots, cos, w, cache] = bufs;
        IndexerKArgs {
            k_pre: Tensor::new(
                &*k,
                TensorDesc::strided(DType::BF16, &[self.n, 128], &[self.k_stride, 1])
                    .expect("view"),
            ),
            positions: Tensor::new(&*pos, TensorDesc::contiguous(self.idx, &[self.n])),
            cos_sin_cache: Tensor::new(
                &*cos,
                TensorDesc::contiguous(self.cos_dtype, &[self.max_pos, 64]),
            ),
            rms_norm_weight: Tensor::new(&*w, TensorDesc::contiguous(self.w_dtype, &[128])),
            rms_norm_eps: 1e-6,
            k_cache: TensorMut::new(
                cache,
                TensorDesc::strided(
                    DType::U8,
                    &[self.blocks, self.block_size, rec],
                    &[self.block_stride, rec, 1],
                )
                .expect("view"),
            ),
            kv_slot_mapping: Tensor::new(&*slots, TensorDesc::contiguous(self.idx, &[self.n])),
            compress_ratio: self.cr,
            format: self.format,
            order: self.order,
            mx_scale: self.mx_scale,
        }
    }

    /// The case through the host-built kernels with the launch a GPU
    /// backend with `policy` would pick.
    fn run_host(&self, exe: &std::path::PathBuf, policy: &LaunchPolicy) -> Outcome {
        let mut bufs = [
            self.k_pre.clone(),
            self.positions.clone(),
            self.slots.clone(),
            self.cos.clone(),
            self.weight.clone(),
            self.cache.clone(),
        ];
        let plan = plan_indexer_k(&self.args(&mut bufs)).expect("a valid case");
        let launch = indexer_k_launch(policy, &plan);
        let ptr = host_kernels::buffer_ptr;
        let params = indexer_k_params(
            &plan,
            &IndexerKPtrs {
                k_pre: ptr(0),
                positions: ptr(1),
                slots: ptr(2),
                cos_sin: ptr(3),
                weight: ptr(4),
                cache: ptr(5),
                counters: 0,
            },
        )
        .with_geometry(&launch.geometry);
        let views: Vec<&[u8]> = bufs.iter().map(|b| b.as_slice()).collect();
        let out = host_kernels::run(
            exe,
            &views,
            &params,
            launch.kernel.name(),
            &launch.geometry,
            &self.label,
        );
        (out.bufs[5].clone(), out.counts)
    }

    fn run<B: Backend>(&self, b: &B) -> Result<Outcome> {
        let k = b.upload(&self.k_pre)?;
        let pos = b.upload(&self.positions)?;
        let slots = b.upload(&self.slots)?;
        let cos = b.upload(&self.cos)?;
        let w = b.upload(&self.weight)?;
        let mut cache = b.upload(&self.cache)?;
        let rec = self.format.record_bytes();
        let args = IndexerKArgs {
            k_pre: Tensor::new(
                &k,
                TensorDesc::strided(DType::BF16, &[self.n, 128], &[self.k_stride, 1])
                    .expect("view"),
            ),
            positions: Tensor::new(&pos, TensorDesc::contiguous(self.idx, &[self.n])),
            cos_sin_cache: Tensor::new(
                &cos,
                TensorDesc::contiguous(self.cos_dtype, &[self.max_pos, 64]),
            ),
            rms_norm_weight: Tensor::new(&w, TensorDesc::contiguous(self.w_dtype, &[128])),
            rms_norm_eps: 1e-6,
            k_cache: TensorMut::new(
                &mut cache,
                TensorDesc::strided(
                    DType::U8,
                    &[self.blocks, self.block_size, rec],
                    &[self.block_stride, rec, 1],
                )
                .expect("view"),
            ),
            kv_slot_mapping: Tensor::new(&slots, TensorDesc::contiguous(self.idx, &[self.n])),
            compress_ratio: self.cr,
            format: self.format,
            order: self.order,
            mx_scale: self.mx_scale,
        };
        b.take_skip_counts()?;
        b.indexer_k_norm_rope_store(args)?;
        Ok((b.read(&cache)?, b.take_skip_counts()?))
    }
}

fn reference(all: &[Case]) -> Vec<Outcome> {
    let cpu = CpuBackend::new();
    all.iter()
        .map(|c| c.run(&cpu).expect("the reference runs every case"))
        .collect()
}

fn mismatches<B: Backend>(dev: &B, all: &[Case], want: &[Outcome]) -> Vec<String> {
    let mut bad = Vec::new();
    for (case, want) in all.iter().zip(want) {
        match case.run(dev) {
            Err(e) => bad.push(format!("{}: {e}", case.label)),
            Ok(got) if got != *want => {
                if bad.len() < 5 {
                    let bytes = want.0.iter().zip(&got.0).filter(|(a, b)| a != b).count();
                    eprintln!(
                        "MISMATCH {}: {bytes} bytes differ; counts want {:?} got {:?}",
                        case.label, want.1, got.1
                    );
                }
                bad.push(case.label.clone());
            }
            Ok(_) => {}
        }
    }
    bad
}

fn check_gpu<D: Driver>(dev: &mut GpuBackend<D>) {
    let all = cases();
    let want = reference(&all);
    let before = dev.launch_policy();
    let mut failed = 0;
    for (label, policy) in LaunchPolicy::MAPPINGS {
        dev.set_launch_policy(policy);
        let bad = mismatches(dev, &all, &want);
        println!(
            "INDEXER_K PARITY {} [{label}]: {} cases, {} mismatching",
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
}

gpu_tests!(
    cuda_matches_reference,
    hip_matches_reference,
    prefix = "indexer_k ",
    |b| check_gpu(b)
);

/// The kernel source built for the host, byte for byte against the
/// reference (the cache and the skip counts): the cases of up to 64 tokens
/// and the wild ones of 1000 under the measured mapping, those of up to 7
/// under the others.
#[test]
fn host_built_kernels_match_the_reference() {
    let exe = match host_kernels::build("indexer_k_host.cpp", &[]) {
        Ok(e) => e,
        Err(why) => return host_kernels::skipped(&format!("indexer_k host kernels: {why}")),
    };
    // Each host launch runs a group's lanes on threads, group by group, so
    // the long cases are few: of 1000 tokens, the wild ones (every skip
    // reason, both ratios); the rest up to 64 tokens.
    let all: Vec<Case> = cases()
        .into_iter()
        .filter(|c| c.n <= 64 || (c.n == 1000 && c.label.contains("wild true")))
        .collect();
    let want = reference(&all);
    let mut failed = Vec::new();
    // Every case under the measured mapping; the other mappings change
    // only the groups a block holds, so their cases stop at 7 tokens.
    for (i, (label, policy)) in LaunchPolicy::MAPPINGS.into_iter().enumerate() {
        let mut bad = 0;
        for (case, want) in all.iter().zip(&want).filter(|(c, _)| i == 0 || c.n <= 7) {
            let got = case.run_host(&exe, &policy);
            if got != *want {
                let diff: Vec<usize> = (0..want.0.len())
                    .filter(|&i| want.0[i] != got.0[i])
                    .collect();
                eprintln!(
                    "MISMATCH [{label}] {}: {} bytes differ (first at {:?}: want {:02x?} got {:02x?}); counts want {:?} got {:?}",
                    case.label,
                    diff.len(),
                    diff.first(),
                    diff.iter().take(8).map(|&i| want.0[i]).collect::<Vec<_>>(),
                    diff.iter().take(8).map(|&i| got.0[i]).collect::<Vec<_>>(),
                    want.1,
                    got.1
                );
                bad += 1;
            }
        }
        println!("INDEXER_K HOST [{label}]: {bad} mismatching cases");
        if bad > 0 {
            failed.push(label);
        }
    }
    let _ = std::fs::remove_file(&exe);
    assert!(
        failed.is_empty(),
        "host-built kernels differ under {failed:?}"
    );
}

/// The comparison can fail: a one-thread CPU backend agrees with the
/// reference, corrupted keys change the records, and the wild cases count
/// skips.
#[test]
fn harness_detects_differences() {
    let all: Vec<Case> = cases()
        .into_iter()
        .filter(|c| c.n <= 1000)
        .step_by(2)
        .collect();
    let want = reference(&all);
    let one = CpuBackend::with_threads(1).expect("pool");
    assert!(
        mismatches(&one, &all, &want).is_empty(),
        "thread count changed the bytes"
    );
    let cpu = CpuBackend::new();
    let mut changed = 0;
    for (case, w) in all.iter().zip(&want) {
        let mut other = case.clone();
        for b in other.k_pre.iter_mut().step_by(2) {
            *b ^= 0x40;
        }
        changed += usize::from(other.run(&cpu).unwrap().0 != w.0);
    }
    assert!(
        changed > all.len() / 2,
        "corrupting keys must change records"
    );
    assert!(
        all.iter()
            .zip(&want)
            .any(|(c, w)| c.label.contains("wild true") && w.1.total() > 0),
        "wild cases skip and count"
    );
}
