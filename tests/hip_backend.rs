//! The HIP backend: without a HIP runtime, `HipBackend::new` and `probe` say
//! clearly what they looked for; with an AMD GPU, a small MXFP8 insert and a
//! CR2 compress give the CPU reference's bytes.
//!
//! Without a device the parity part prints `SKIPPED ...` with the reason;
//! where `DSV4_KVCACHE_REQUIRE_GPU` requires a HIP device
//! (`tests/gpu_required`) that is a failure instead.

#![cfg(feature = "hip")]

use dsv4_kvcache::backend::hip::{probe, HipBackend, HipDriver};
use dsv4_kvcache::backend::Backend;
use dsv4_kvcache::formats::bf16_from_f32;
use dsv4_kvcache::tensor::{DType, Tensor, TensorDesc, TensorMut};
use dsv4_kvcache::RecordOrder;
use dsv4_kvcache::{CompressArgs, CpuBackend, Error, InsertArgs, SkipCounts};
use std::io::Write as _;

#[path = "gpu_required/mod.rs"]
mod gpu_required;

/// Opens device 0, or says why not (and fails if a GPU is required).
fn open() -> Option<HipBackend> {
    match HipBackend::new(0) {
        Ok(b) => Some(b),
        Err(Error::Unavailable { backend, reason }) => {
            assert_eq!(backend, "hip");
            gpu_required::skip_or_fail("hip_backend", "hip", HipDriver::library_present(), &reason);
            None
        }
        Err(e) => panic!("HipBackend::new(0) failed with an unexpected error kind: {e}"),
    }
}

#[test]
fn unavailable_names_what_it_looked_for() {
    match HipBackend::new(0) {
        Ok(b) => println!("HIP device present: {}", b.name()),
        Err(Error::Unavailable { backend, reason }) => {
            assert_eq!(backend, "hip");
            // Every setup failure names the runtime library: the paths tried
            // when it is missing, the path loaded otherwise.
            assert!(reason.contains("libamdhip64"), "{reason}");
            if reason.contains("not found") {
                for p in [
                    "libamdhip64.so",
                    "libamdhip64.so.6",
                    "libamdhip64.so.7",
                    "/opt/rocm/lib/libamdhip64.so",
                ] {
                    assert!(reason.contains(p), "{p} missing from: {reason}");
                }
                assert!(reason.contains("ROCM_PATH"), "{reason}");
            }
            let full = Error::Unavailable { backend, reason }.to_string();
            assert!(full.starts_with("hip backend unavailable: "), "{full}");
        }
        Err(e) => panic!("expected Unavailable, got {e}"),
    }
    match probe() {
        Ok(s) => println!("{s}"),
        Err(Error::Unavailable { backend, reason }) => {
            assert_eq!(backend, "hip");
            assert!(reason.contains("libamdhip64"), "{reason}");
        }
        Err(e) => panic!("probe: expected Unavailable, got {e}"),
    }
}

// ---- inputs -----------------------------------------------------------------

struct Lcg(u64);
impl Lcg {
    fn next(&mut self) -> u32 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) as u32
    }
    /// Roughly uniform in [-scale, scale).
    fn val(&mut self, scale: f32) -> f32 {
        (self.next() as f32 / (1u64 << 31) as f32 - 0.5) * 2.0 * scale
    }
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}
fn bf16_bytes(v: &[f32]) -> Vec<u8> {
    v.iter()
        .flat_map(|&x| bf16_from_f32(x).to_le_bytes())
        .collect()
}
fn i32_bytes(v: &[i32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}
fn i64_bytes(v: &[i64]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}
fn cos_sin_table(rows: usize) -> Vec<f32> {
    let mut t = vec![0f32; rows * 64];
    for p in 0..rows {
        for k in 0..32 {
            let a = p as f32 * 10000f32.powf(-(k as f32) / 32.0);
            t[p * 64 + k] = a.cos();
            t[p * 64 + 32 + k] = a.sin();
        }
    }
    t
}

const INSERT_N: usize = 24;
const BLOCKS: usize = 4;
const BLOCK_SIZE: usize = 8;
const MAX_POS: usize = 40;

/// A small MXFP8 (528-byte record) `rope_quant_insert`: a few NaN and
/// infinite values, a skipped slot, an out-of-range slot and position.
fn mxfp8_insert<B: Backend>(b: &B) -> (Vec<u8>, SkipCounts) {
    mxfp8_insert_with(b, |b, args| b.rope_quant_insert(args).unwrap())
}

type InsertInputs = (Vec<f32>, Vec<i64>, Vec<i32>, Vec<u8>);

fn mxfp8_inputs() -> InsertInputs {
    let mut r = Lcg(7);
    let mut latent: Vec<f32> = (0..INSERT_N * 512)
        .map(|i| r.val(if i % 97 == 0 { 300.0 } else { 2.0 }))
        .collect();
    latent[3 * 512 + 5] = f32::NAN;
    latent[4 * 512 + 500] = f32::NAN;
    latent[5 * 512 + 17] = f32::INFINITY;
    let positions: Vec<i64> = (0..INSERT_N as i64)
        .map(|t| if t == 9 { MAX_POS as i64 + 3 } else { t + 1 })
        .collect();
    let slots: Vec<i32> = (0..INSERT_N as i32)
        .map(|t| match t {
            2 => -1,
            11 => (BLOCKS * BLOCK_SIZE) as i32 + 1,
            _ => (t * 5 + 3) % (BLOCKS * BLOCK_SIZE) as i32,
        })
        .collect();
    let cache_init: Vec<u8> = (0..BLOCKS * BLOCK_SIZE * 528)
        .map(|i| (i * 31 % 251) as u8)
        .collect();
    (latent, positions, slots, cache_init)
}

/// The MXFP8 insert's inputs, uploaded; `launch` runs the insert on them.
fn mxfp8_insert_with<B: Backend>(
    b: &B,
    launch: impl FnOnce(&B, InsertArgs<'_, B::Buffer>),
) -> (Vec<u8>, SkipCounts) {
    let (latent, positions, slots, cache_init) = mxfp8_inputs();
    let latent_b = b.upload(&bf16_bytes(&latent)).unwrap();
    let pos_b = b.upload(&i64_bytes(&positions)).unwrap();
    let slots_b = b.upload(&i32_bytes(&slots)).unwrap();
    let cos_b = b.upload(&f32_bytes(&cos_sin_table(MAX_POS))).unwrap();
    let mut cache_b = b.upload(&cache_init).unwrap();
    b.take_skip_counts().unwrap();
    launch(
        b,
        InsertArgs {
            latent: Tensor::new(
                &latent_b,
                TensorDesc::contiguous(DType::BF16, &[INSERT_N, 512]),
            ),
            positions: Tensor::new(&pos_b, TensorDesc::contiguous(DType::I64, &[INSERT_N])),
            cos_sin_cache: Tensor::new(&cos_b, TensorDesc::contiguous(DType::F32, &[MAX_POS, 64])),
            kv_cache: TensorMut::new(
                &mut cache_b,
                TensorDesc::contiguous(DType::U8, &[BLOCKS, BLOCK_SIZE, 528]),
            ),
            slot_mapping: Tensor::new(&slots_b, TensorDesc::contiguous(DType::I32, &[INSERT_N])),
            compress_ratio: 1,
            fp8_scale: None,
            record_order: RecordOrder::PagePlanar,
        },
    );
    let out = b.read(&cache_b).unwrap();
    (out, b.take_skip_counts().unwrap())
}

/// A small CR2 `fused_save_compress_norm`: two requests, the first resuming
/// from the ring (its predecessor row is in the ring), the second new.
fn cr2_compress<B: Backend>(b: &B) -> (Vec<u8>, Vec<u8>, SkipCounts) {
    let mut r = Lcg(11);
    // Request 0: positions 3..8 (5 tokens), ring block 0; request 1:
    // positions 0..4 (4 tokens), ring block 1.
    let positions: Vec<i32> = vec![3, 4, 5, 6, 7, 0, 1, 2, 3];
    let n = positions.len();
    let cap = 4usize;
    let slots: Vec<i32> = positions
        .iter()
        .enumerate()
        .map(|(t, &p)| {
            if t < 5 {
                p % cap as i32
            } else {
                cap as i32 + p % cap as i32
            }
        })
        .collect();
    let qsl: Vec<i32> = vec![0, 5, 9];
    let ttr: Vec<i32> = vec![0, 0, 0, 0, 0, 1, 1, 1, 1];
    let kv: Vec<f32> = (0..n * 1024).map(|_| r.val(3.0)).collect();
    let ring: Vec<f32> = (0..2 * cap * 1024).map(|_| r.val(3.0)).collect();
    let weight: Vec<f32> = (0..512).map(|i| 0.5 + (i % 7) as f32 * 0.25).collect();

    let kv_b = b.upload(&f32_bytes(&kv)).unwrap();
    let pos_b = b.upload(&i32_bytes(&positions)).unwrap();
    let mut ring_b = b.upload(&f32_bytes(&ring)).unwrap();
    let slots_b = b.upload(&i32_bytes(&slots)).unwrap();
    let qsl_b = b.upload(&i32_bytes(&qsl)).unwrap();
    let ttr_b = b.upload(&i32_bytes(&ttr)).unwrap();
    let w_b = b.upload(&bf16_bytes(&weight)).unwrap();
    let mut lat_b = b.upload(&vec![0u8; n * 512 * 2]).unwrap();
    b.take_skip_counts().unwrap();
    b.fused_save_compress_norm(CompressArgs {
        kv_score: Tensor::new(&kv_b, TensorDesc::contiguous(DType::F32, &[n, 1024])),
        positions: Tensor::new(&pos_b, TensorDesc::contiguous(DType::I32, &[n])),
        state_cache: Some(TensorMut::new(
            &mut ring_b,
            TensorDesc::contiguous(DType::F32, &[2, cap, 1024]),
        )),
        slot_mapping: Tensor::new(&slots_b, TensorDesc::contiguous(DType::I32, &[n])),
        query_start_loc: Some(Tensor::new(
            &qsl_b,
            TensorDesc::contiguous(DType::I32, &[3]),
        )),
        token_to_req_indices: Some(Tensor::new(
            &ttr_b,
            TensorDesc::contiguous(DType::I32, &[n]),
        )),
        rms_norm_weight: Tensor::new(&w_b, TensorDesc::contiguous(DType::BF16, &[512])),
        rms_norm_eps: 1e-6,
        compress_ratio: 2,
        latent_out: TensorMut::new(&mut lat_b, TensorDesc::contiguous(DType::BF16, &[n, 512])),
        prev_rows: None,
        prev_row_indices: None,
    })
    .unwrap();
    let lat = b.read(&lat_b).unwrap();
    let ring_out = b.read(&ring_b).unwrap();
    (lat, ring_out, b.take_skip_counts().unwrap())
}

fn first_difference(a: &[u8], b: &[u8]) -> Option<(usize, u8, u8)> {
    a.iter()
        .zip(b)
        .enumerate()
        .find(|(_, (x, y))| x != y)
        .map(|(i, (x, y))| (i, *x, *y))
}

#[test]
fn device_matches_cpu_reference() {
    let Some(mut hip) = open() else {
        return;
    };
    println!("running on {}", hip.name());
    for sanitize in [hip.sanitize(), !hip.sanitize()] {
        hip.set_sanitize(sanitize);
        let mut cpu = CpuBackend::new();
        cpu.set_sanitize(sanitize);

        let (want, want_skips) = mxfp8_insert(&cpu);
        let (got, got_skips) = mxfp8_insert(&hip);
        assert_eq!(got.len(), want.len());
        assert_eq!(
            first_difference(&got, &want),
            None,
            "MXFP8 cache bytes differ (sanitize {sanitize})"
        );
        assert_eq!(
            got_skips, want_skips,
            "MXFP8 skip counts (sanitize {sanitize})"
        );
        assert!(
            want_skips.total() > 0,
            "the insert case exercises the skip counters"
        );

        let (want_lat, want_ring, want_skips) = cr2_compress(&cpu);
        let (got_lat, got_ring, got_skips) = cr2_compress(&hip);
        assert_eq!(
            first_difference(&got_lat, &want_lat),
            None,
            "CR2 latent_out differs"
        );
        assert_eq!(
            first_difference(&got_ring, &want_ring),
            None,
            "CR2 ring differs"
        );
        assert_eq!(got_skips, want_skips, "CR2 skip counts");
    }
    // The counters were read and zeroed.
    assert_eq!(hip.take_skip_counts().unwrap(), SkipCounts::default());
}

#[test]
fn graph_replay_and_event_timing() {
    let Some(hip) = open() else {
        return;
    };
    let mut cpu = CpuBackend::new();
    cpu.set_sanitize(hip.sanitize());
    let (want, want_skips) = mxfp8_insert(&cpu);
    let bw = hip.time_copy(1 << 20, 3).unwrap();
    assert!(bw.is_finite() && bw > 0.0, "copy rate {bw}");
    let captured = std::cell::Cell::new(false);
    let (got, got_skips) = mxfp8_insert_with(&hip, |h, args| {
        let mut args = Some(args);
        match h.capture(1, || h.rope_quant_insert(args.take().expect("one call"))) {
            Ok(graph) => {
                // SAFETY: the buffers the graph uses live until
                // mxfp8_insert_with reads them back.
                unsafe { graph.launch() }.unwrap();
                captured.set(true);
            }
            Err(Error::Unavailable { reason, .. }) => {
                let _ = writeln!(std::io::stderr(), "SKIPPED: graph replay ({reason})");
            }
            Err(e) => panic!("capture: {e}"),
        }
    });
    if captured.get() {
        assert_eq!(first_difference(&got, &want), None, "graph replay");
        assert_eq!(got_skips, want_skips);
    }
}

#[test]
fn cpu_side_of_the_parity_cases_is_valid() {
    // Runs everywhere: the inputs above are accepted and produce output.
    let cpu = CpuBackend::new();
    let (cache, skips) = mxfp8_insert(&cpu);
    assert_eq!(cache.len(), BLOCKS * BLOCK_SIZE * 528);
    assert!(
        skips.slot_out_of_range >= 1 && skips.position_out_of_range >= 1,
        "{skips:?}"
    );
    let (lat, _ring, _skips) = cr2_compress(&cpu);
    assert!(lat.iter().any(|&x| x != 0), "some CR2 latent was written");
}
