//! The CUDA backend inside a CUDA graph: a small CR2 `fused_save_compress_norm`
//! followed by an MXFP8 `rope_quant_insert`, on CPU-generated inputs, run
//!
//! * on the CPU reference,
//! * eagerly on the GPU,
//! * captured into a CUDA graph and replayed (twice, each time on fresh
//!   copies of the inputs written into the captured buffers),
//! * through the raw-pointer API on the backend's stream,
//!
//! and every output (latent, ring, cache) and the skip counts must be
//! byte-identical across all of them.
//!
//! Without a usable GPU this prints `SKIPPED: <reason>` and passes, unless
//! `DSV4_KVCACHE_REQUIRE_GPU` requires a CUDA device (`tests/gpu_required`).

#![cfg(feature = "cuda")]

use dsv4_kvcache::backend::cuda::{CudaBackend, RawDevice};
use dsv4_kvcache::formats::bf16_from_f32;
use dsv4_kvcache::RecordOrder;
use dsv4_kvcache::{
    Backend, CompressArgs, CpuBackend, DType, Error, InsertArgs, RecordLayout, Result, SkipCounts,
    Tensor, TensorDesc, TensorMut,
};

#[path = "gpu_required/mod.rs"]
mod gpu_required;

/// The GPU, or `None` after saying loudly why not.
fn gpu() -> Option<CudaBackend> {
    match CudaBackend::new(0) {
        Ok(b) => Some(b),
        Err(e) => {
            gpu_required::skip_or_fail(
                "cuda_graph",
                "cuda",
                dsv4_kvcache::backend::cuda::CudaDriver::library_present(),
                &e,
            );
            None
        }
    }
}

// ---- the case ---------------------------------------------------------------

const N: usize = 10;
const RING_BLOCKS: usize = 2;
const RING_CAP: usize = 4;
const CACHE_BLOCKS: usize = 4;
const CACHE_BLOCK_SIZE: usize = 4;
const MAX_POS: usize = 64;
const LAYOUT: RecordLayout = RecordLayout::Mxfp8;

/// Request 0: tokens 0..6 at positions 9..15 (its first token closes a group
/// whose older row is in the ring); request 1: tokens 6..10 at positions 0..4.
const POSITIONS: [i32; N] = [9, 10, 11, 12, 13, 14, 0, 1, 2, 3];
const QSL: [i32; 3] = [0, 6, 10];
const TTR: [i32; N] = [0, 0, 0, 0, 0, 0, 1, 1, 1, 1];

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        // xorshift64*
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// Uniform in [-1, 1).
    fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
}

fn f32_bytes(v: impl IntoIterator<Item = f32>) -> Vec<u8> {
    v.into_iter().flat_map(f32::to_le_bytes).collect()
}

fn i32_bytes(v: &[i32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// Host bytes of every tensor.
struct Host {
    kv_score: Vec<u8>,
    positions: Vec<u8>,
    ring_slots: Vec<u8>,
    qsl: Vec<u8>,
    ttr: Vec<u8>,
    weight: Vec<u8>,
    ring: Vec<u8>,
    latent: Vec<u8>,
    cos_sin: Vec<u8>,
    cache: Vec<u8>,
    cache_slots: Vec<u8>,
}

fn host_case() -> Host {
    let mut r = Rng(0x9E37_79B9_7F4A_7C15);
    let kv_score = f32_bytes((0..N * 1024).map(|_| 3.0 * r.unit()));
    let ring = f32_bytes((0..RING_BLOCKS * RING_CAP * 1024).map(|_| 2.0 * r.unit()));
    let weight: Vec<u8> = (0..512)
        .flat_map(|_| bf16_from_f32(1.0 + 0.5 * r.unit()).to_le_bytes())
        .collect();
    let ring_slots: Vec<i32> = POSITIONS
        .iter()
        .zip(TTR)
        .map(|(&p, req)| req * RING_CAP as i32 + p % RING_CAP as i32)
        .collect();
    // Group-closing tokens get a cache slot; the last one is out of range
    // (skipped and counted); the others are -1.
    let cache_slots: Vec<i32> = POSITIONS
        .iter()
        .zip(TTR)
        .enumerate()
        .map(|(t, (&p, req))| {
            if (p + 1) % 2 != 0 {
                -1
            } else if t == N - 1 {
                100
            } else {
                req * 8 + p / 2
            }
        })
        .collect();
    let cos_sin = f32_bytes((0..MAX_POS).flat_map(|p| {
        (0..64).map(move |c| {
            let i = (c % 32) as f32;
            let angle = p as f32 * 10000f32.powf(-i / 32.0);
            if c < 32 {
                angle.cos()
            } else {
                angle.sin()
            }
        })
    }));
    Host {
        kv_score,
        positions: i32_bytes(&POSITIONS),
        ring_slots: i32_bytes(&ring_slots),
        qsl: i32_bytes(&QSL),
        ttr: i32_bytes(&TTR),
        weight,
        ring,
        latent: vec![0u8; N * 512 * 2],
        cos_sin,
        cache: vec![0u8; CACHE_BLOCKS * CACHE_BLOCK_SIZE * LAYOUT.record_bytes()],
        cache_slots: i32_bytes(&cache_slots),
    }
}

/// The tensors of the case in one backend's storage.
struct Bufs<S> {
    kv_score: S,
    positions: S,
    ring_slots: S,
    qsl: S,
    ttr: S,
    weight: S,
    ring: S,
    latent: S,
    cos_sin: S,
    cache: S,
    cache_slots: S,
}

impl<S> Bufs<S> {
    fn new(h: &Host, mut up: impl FnMut(&[u8]) -> Result<S>) -> Result<Self> {
        Ok(Bufs {
            kv_score: up(&h.kv_score)?,
            positions: up(&h.positions)?,
            ring_slots: up(&h.ring_slots)?,
            qsl: up(&h.qsl)?,
            ttr: up(&h.ttr)?,
            weight: up(&h.weight)?,
            ring: up(&h.ring)?,
            latent: up(&h.latent)?,
            cos_sin: up(&h.cos_sin)?,
            cache: up(&h.cache)?,
            cache_slots: up(&h.cache_slots)?,
        })
    }
}

fn desc(dtype: DType, shape: &[usize]) -> TensorDesc {
    TensorDesc::contiguous(dtype, shape)
}

/// Runs the compressor, then the insert of its latent, through `compress`
/// and `insert`.
fn run_case<S>(
    x: &mut Bufs<S>,
    compress: impl FnOnce(CompressArgs<'_, S>) -> Result<()>,
    insert: impl FnOnce(InsertArgs<'_, S>) -> Result<()>,
) -> Result<()> {
    compress(CompressArgs {
        kv_score: Tensor::new(&x.kv_score, desc(DType::F32, &[N, 1024])),
        positions: Tensor::new(&x.positions, desc(DType::I32, &[N])),
        state_cache: Some(TensorMut::new(
            &mut x.ring,
            desc(DType::F32, &[RING_BLOCKS, RING_CAP, 1024]),
        )),
        slot_mapping: Tensor::new(&x.ring_slots, desc(DType::I32, &[N])),
        query_start_loc: Some(Tensor::new(&x.qsl, desc(DType::I32, &[QSL.len()]))),
        token_to_req_indices: Some(Tensor::new(&x.ttr, desc(DType::I32, &[N]))),
        rms_norm_weight: Tensor::new(&x.weight, desc(DType::BF16, &[512])),
        rms_norm_eps: 1e-6,
        compress_ratio: 2,
        latent_out: TensorMut::new(&mut x.latent, desc(DType::BF16, &[N, 512])),
        prev_rows: None,
        prev_row_indices: None,
    })?;
    insert(insert_args(x))
}

/// The insert of the compressor's latent.
fn insert_args<S>(x: &mut Bufs<S>) -> InsertArgs<'_, S> {
    InsertArgs {
        latent: Tensor::new(&x.latent, desc(DType::BF16, &[N, 512])),
        positions: Tensor::new(&x.positions, desc(DType::I32, &[N])),
        cos_sin_cache: Tensor::new(&x.cos_sin, desc(DType::F32, &[MAX_POS, 64])),
        kv_cache: TensorMut::new(
            &mut x.cache,
            desc(
                DType::U8,
                &[CACHE_BLOCKS, CACHE_BLOCK_SIZE, LAYOUT.record_bytes()],
            ),
        ),
        slot_mapping: Tensor::new(&x.cache_slots, desc(DType::I32, &[N])),
        compress_ratio: 2,
        fp8_scale: None,
        record_order: RecordOrder::PagePlanar,
    }
}

fn run_on<B: Backend>(b: &B, x: &mut Bufs<B::Buffer>) -> Result<()> {
    run_case(
        x,
        |a| b.fused_save_compress_norm(a),
        |a| b.rope_quant_insert(a),
    )
}

/// The written tensors' bytes: latent, ring, cache.
type Outputs = [Vec<u8>; 3];

fn outputs<B: Backend>(b: &B, x: &Bufs<B::Buffer>) -> Result<Outputs> {
    Ok([b.read(&x.latent)?, b.read(&x.ring)?, b.read(&x.cache)?])
}

/// Puts the inputs' initial bytes back into the written tensors.
fn reset<B: Backend>(b: &B, x: &mut Bufs<B::Buffer>, h: &Host) -> Result<()> {
    b.write(&mut x.latent, &h.latent)?;
    b.write(&mut x.ring, &h.ring)?;
    b.write(&mut x.cache, &h.cache)
}

fn assert_same(what: &str, got: &Outputs, want: &Outputs) {
    for (name, (g, w)) in ["latent_out", "state_cache", "kv_cache"]
        .iter()
        .zip(got.iter().zip(want))
    {
        assert_eq!(g.len(), w.len(), "{what}: {name} length");
        if let Some(i) = g.iter().zip(w).position(|(a, b)| a != b) {
            panic!(
                "{what}: {name} differs first at byte {i}: {:#04x} vs {:#04x} ({} bytes differ)",
                g[i],
                w[i],
                g.iter().zip(w).filter(|(a, b)| a != b).count()
            );
        }
    }
}

#[test]
fn graph_replay_matches_eager_and_cpu() -> Result<()> {
    let h = host_case();

    // The reference.
    let cpu = CpuBackend::new();
    let mut c = Bufs::new(&h, |b| cpu.upload(b))?;
    run_on(&cpu, &mut c)?;
    let want = outputs(&cpu, &c)?;
    let want_counts = cpu.take_skip_counts()?;
    assert_eq!(
        want_counts.slot_out_of_range, 1,
        "the case has one out-of-range cache slot"
    );
    assert_ne!(want[0], h.latent, "the compressor wrote latents");
    assert_ne!(want[2], h.cache, "the insert wrote records");

    let Some(gpu) = gpu() else { return Ok(()) };
    eprintln!("running on {}", gpu.name());

    // Eager launches.
    assert_eq!(gpu.take_skip_counts()?, SkipCounts::default());
    let mut g = Bufs::new(&h, |b| gpu.upload(b))?;
    run_on(&gpu, &mut g)?;
    let eager = outputs(&gpu, &g)?;
    assert_same("eager GPU vs CPU", &eager, &want);
    assert_eq!(gpu.take_skip_counts()?, want_counts, "eager skip counts");

    // The same launches captured into a graph, replayed on fresh inputs.
    let mut x = Bufs::new(&h, |b| gpu.upload(b))?;
    let graph = gpu.capture(1, || run_on(&gpu, &mut x))?;
    assert_eq!(graph.calls(), 1);
    for replay in 0..2 {
        reset(&gpu, &mut x, &h)?;
        // SAFETY: every buffer the graph uses (`x`) is alive.
        unsafe { graph.launch()? };
        let got = outputs(&gpu, &x)?;
        assert_same(&format!("graph replay {replay} vs eager"), &got, &eager);
        assert_eq!(
            gpu.take_skip_counts()?,
            want_counts,
            "graph replay {replay} skip counts"
        );
    }
    drop(graph);

    // The raw-pointer API on the backend's stream, over the same memory.
    reset(&gpu, &mut x, &h)?;
    let mut raw = Bufs {
        kv_score: raw_of(&x.kv_score),
        positions: raw_of(&x.positions),
        ring_slots: raw_of(&x.ring_slots),
        qsl: raw_of(&x.qsl),
        ttr: raw_of(&x.ttr),
        weight: raw_of(&x.weight),
        ring: raw_of(&x.ring),
        latent: raw_of(&x.latent),
        cos_sin: raw_of(&x.cos_sin),
        cache: raw_of(&x.cache),
        cache_slots: RawDevice::unbounded(x.cache_slots.device_ptr()),
    };
    let stream = gpu.stream();
    // SAFETY: the pointers are live buffers of this backend, used on its
    // stream; the skip counters are the backend's, read after a wait.
    run_case(
        &mut raw,
        |a| unsafe { gpu.fused_save_compress_norm_raw(&a, stream, None) },
        |a| unsafe { gpu.rope_quant_insert_raw(&a, stream, None, gpu.sanitize()) },
    )?;
    assert_same("raw API vs eager", &outputs(&gpu, &x)?, &eager);
    assert_eq!(gpu.take_skip_counts()?, want_counts, "raw API skip counts");

    // A raw pointer that is not aligned is refused before anything runs.
    raw.cache.ptr += 8;
    let err = unsafe { gpu.rope_quant_insert_raw(&insert_args(&mut raw), stream, None, false) }
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::Shape {
                arg: "kv_cache",
                ..
            }
        ),
        "{err}"
    );

    // The timing helpers run and give plausible numbers.
    let us = gpu.time_graph(4, 3, || run_on(&gpu, &mut x))?;
    assert_eq!(us.len(), 3);
    assert!(us.iter().all(|t| t.is_finite() && *t > 0.0), "{us:?}");
    let bw = gpu.time_copy(1 << 24, 3)?;
    assert!(bw.is_finite() && bw > 1e9, "copy bandwidth {bw} B/s");
    let host_us = gpu.host_launch_cost(8, || run_on(&gpu, &mut x))?;
    assert!(host_us.is_finite() && host_us > 0.0);
    gpu.take_skip_counts()?;
    eprintln!(
        "{}: {:.2} us/launch pair in a graph, copy {:.0} GB/s, host {:.2} us/launch pair",
        gpu.name(),
        us[us.len() / 2],
        bw / 1e9,
        host_us
    );
    Ok(())
}

fn raw_of(b: &dsv4_kvcache::backend::cuda::CudaBuffer) -> RawDevice {
    RawDevice::new(b.device_ptr(), b.len())
}

/// Without a GPU the backend reports why instead of panicking.
#[test]
fn unavailable_is_an_error_not_a_panic() {
    match CudaBackend::device_count() {
        Ok(n) => eprintln!("CUDA devices: {n}"),
        Err(e) => {
            assert!(
                matches!(
                    e,
                    Error::Unavailable {
                        backend: "cuda",
                        ..
                    }
                ),
                "{e}"
            );
            eprintln!("CUDA unavailable: {e}");
        }
    }
    if let Err(e) = CudaBackend::new(usize::MAX) {
        assert!(
            matches!(
                e,
                Error::Unavailable {
                    backend: "cuda",
                    ..
                } | Error::Driver {
                    backend: "cuda",
                    ..
                }
            ),
            "{e}"
        );
    }
}
