//! Device backends against the CPU reference, byte for byte: every op, layout,
//! compress ratio, sanitize setting and index dtype, on random inputs laced
//! with adversarial values. Without a GPU this says loudly that it skipped;
//! with `DSV4_KVCACHE_REQUIRE_GPU=1` a missing GPU is a failure.
//!
//! `DSV4_KVCACHE_PARITY_CASES` sets the cases per configuration (default
//! 300: 34 configurations, 10,200 cases).

use dsv4_kvcache::backend::Backend;
use dsv4_kvcache::formats::bf16_from_f32;
use dsv4_kvcache::layout::RecordLayout;
use dsv4_kvcache::tensor::{DType, Tensor, TensorDesc, TensorMut};
use dsv4_kvcache::{CompressArgs, CpuBackend, FusedArgs, InsertArgs, RingArgs, SkipCounts};

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32
    }
    fn normal(&mut self) -> f32 {
        let (u, v) = (self.unit().max(1e-7), self.unit());
        (-2.0 * u.ln()).sqrt() * (6.283_185_5 * v).cos()
    }
    /// A value: mostly normal, sometimes one of the adversarial classes.
    fn value(&mut self, scale: f32) -> f32 {
        match self.below(200) {
            0 => f32::NAN,
            1 => f32::INFINITY,
            2 => f32::NEG_INFINITY,
            3 => 0.0,
            4 => -0.0,
            5 => 3.0e38,
            6 => 1.0e-40,
            7 => f32::from_bits(0x4000_0000 + self.below(3) as u32 * 0x0001_0000), // 2 and bf16 ulps above
            8 => [0.25f32, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0][self.below(7) as usize] * 448.0 / 6.0,
            9 => -(self.normal() * 1.0e-3),
            _ => self.normal() * scale,
        }
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
fn idx_bytes(v: &[i64], i64s: bool) -> (Vec<u8>, DType) {
    if i64s {
        (v.iter().flat_map(|x| x.to_le_bytes()).collect(), DType::I64)
    } else {
        (
            v.iter().flat_map(|&x| (x as i32).to_le_bytes()).collect(),
            DType::I32,
        )
    }
}
fn canary(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) | 0x01)
        .collect()
}

/// A host tensor: bytes plus view.
#[derive(Clone)]
struct H {
    bytes: Vec<u8>,
    desc: TensorDesc,
}
impl H {
    fn new(bytes: Vec<u8>, dtype: DType, shape: &[usize]) -> Self {
        H {
            bytes,
            desc: TensorDesc::contiguous(dtype, shape),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Op {
    Compress { cr: u32, prev: bool },
    Insert { layout: RecordLayout, cr: u32 },
    Ring,
    Fused { layout: RecordLayout, cr: u32 },
}

/// Every tensor any op may take; unused ones are `None`.
#[derive(Clone)]
struct Case {
    op: Op,
    sanitize: bool,
    kv_score: Option<H>,
    positions: H,
    slots: H,
    cache_slots: Option<H>,
    qsl: Option<H>,
    ttr: Option<H>,
    weight: Option<H>,
    latent: Option<H>,
    ring: Option<H>,
    prev_rows: Option<H>,
    prev_idx: Option<H>,
    cos_sin: Option<H>,
    kv_cache: Option<H>,
    fp8_scale: Option<H>,
    rows: Option<H>,
}

fn cache_for(rng: &mut Rng, layout: RecordLayout, blocks: usize, bs: usize) -> (H, Option<H>) {
    match layout {
        RecordLayout::Bf16Rows => (
            H::new(
                canary(blocks * bs * 1024, 7),
                DType::BF16,
                &[blocks, bs, 512],
            ),
            None,
        ),
        RecordLayout::Fp8Rows => {
            let s = [0.5f32, 1.0, 0.037, 3.0][rng.below(4) as usize];
            (
                H::new(
                    canary(blocks * bs * 512, 9),
                    DType::F8E4M3,
                    &[blocks, bs, 512],
                ),
                Some(H::new(f32_bytes(&[s]), DType::F32, &[1])),
            )
        }
        l => {
            let w = l.record_bytes();
            (
                H::new(canary(blocks * bs * w, 11), DType::U8, &[blocks, bs, w]),
                None,
            )
        }
    }
}

fn make_case(rng: &mut Rng, op: Op, sanitize: bool) -> Case {
    let i64s = rng.below(2) == 0;
    let scale = [1.0f32, 0.01, 50.0][rng.below(3) as usize];
    // Requests with consecutive positions; ring capacity 2..4; cache blocks of 4..16 rows.
    let reqs = 1 + rng.below(4) as usize;
    let mut chunk_len = Vec::new();
    let mut start_pos = Vec::new();
    for _ in 0..reqs {
        chunk_len.push(rng.below(9) as usize); // may be empty
        start_pos.push(rng.below(40) as i64);
    }
    let n: usize = chunk_len.iter().sum();
    let n = n.max(1);
    let extra_rows = rng.below(3) as usize; // padding rows beyond N
    let rows = n + extra_rows;
    let cap = 2 + rng.below(3) as usize;
    let ring_blocks = reqs + 1;
    let mut positions = vec![0i64; rows];
    let mut ttr = vec![0i64; rows];
    let mut qsl = vec![0i64; reqs + 1];
    let mut t = 0usize;
    for r in 0..reqs {
        qsl[r] = t as i64;
        for j in 0..chunk_len[r] {
            positions[t] = start_pos[r] + j as i64;
            ttr[t] = r as i64;
            t += 1;
        }
    }
    qsl[reqs] = t as i64;
    // Ring slots: request r owns block r (sometimes an out-of-range block).
    let mut slots = vec![-1i64; n];
    for tok in 0..t {
        let r = ttr[tok] as usize;
        let block = if rng.below(40) == 0 {
            ring_blocks as i64 + 3
        } else {
            r as i64
        };
        slots[tok] = if rng.below(15) == 0 {
            -1
        } else {
            block * cap as i64 + positions[tok] % cap as i64
        };
    }
    // Occasional negative position.
    if t > 0 && rng.below(20) == 0 {
        positions[rng.below(t as u64) as usize] = -3;
    }
    let bs = [4usize, 8, 16][rng.below(3) as usize];
    let blocks = n.div_ceil(bs) + 1;
    // Distinct cache slots, some -1, some out of range.
    let mut perm: Vec<i64> = (0..(blocks * bs) as i64).collect();
    for i in (1..perm.len()).rev() {
        perm.swap(i, rng.below(i as u64 + 1) as usize);
    }
    let cache_slots: Vec<i64> = (0..n)
        .map(|i| match rng.below(25) {
            0 => -1,
            1 => (blocks * bs) as i64 + rng.below(5) as i64,
            _ => perm[i],
        })
        .collect();

    let (pos_b, pos_t) = idx_bytes(&positions, i64s);
    let positions_h = H::new(pos_b, pos_t, &[rows]);
    let mk_idx = |v: &[i64]| {
        let (b, d) = idx_bytes(v, i64s);
        H::new(b, d, &[v.len()])
    };
    let cr = match op {
        Op::Compress { cr, .. } | Op::Insert { cr, .. } | Op::Fused { cr, .. } => cr,
        Op::Ring => 2,
    };
    let width = 512 * cr as usize;
    let kv: Vec<f32> = (0..rows * width)
        .map(|i| {
            if i % width >= 512 && cr == 2 {
                rng.value(2.0)
            } else {
                rng.value(scale)
            }
        })
        .collect();
    let weight: Vec<f32> = (0..512).map(|_| 1.0 + 0.1 * rng.normal()).collect();
    let ring: Vec<f32> = (0..ring_blocks * cap * 1024)
        .map(|_| rng.value(scale))
        .collect();
    let max_pos = 64usize;
    let mut cs = vec![0f32; max_pos * 64];
    for p in 0..max_pos {
        for k in 0..32 {
            let th = p as f32 * 10000f32.powf(-(k as f32) / 32.0);
            cs[p * 64 + k] = th.cos();
            cs[p * 64 + 32 + k] = th.sin();
        }
    }
    let cos_bf16 = rng.below(3) == 0;
    let cos_sin = if cos_bf16 {
        H::new(bf16_bytes(&cs), DType::BF16, &[max_pos, 64])
    } else {
        H::new(f32_bytes(&cs), DType::F32, &[max_pos, 64])
    };
    let latent_vals: Vec<f32> = (0..rows * 512).map(|_| rng.value(scale)).collect();
    let layout = match op {
        Op::Insert { layout, .. } | Op::Fused { layout, .. } => Some(layout),
        _ => None,
    };
    let (kv_cache, fp8_scale) = match layout {
        Some(l) => {
            let (c, s) = cache_for(rng, l, blocks, bs);
            (Some(c), s)
        }
        None => (None, None),
    };
    let is_cr2 = cr == 2;
    let prev = matches!(op, Op::Compress { prev: true, .. });
    let mut case = Case {
        op,
        sanitize,
        kv_score: Some(H::new(f32_bytes(&kv), DType::F32, &[rows, width])),
        positions: positions_h,
        slots: mk_idx(if matches!(op, Op::Insert { .. }) {
            &cache_slots
        } else {
            &slots
        }),
        cache_slots: matches!(op, Op::Fused { .. }).then(|| mk_idx(&cache_slots)),
        qsl: is_cr2.then(|| mk_idx(&qsl)),
        ttr: is_cr2.then(|| mk_idx(&ttr[..n])),
        weight: Some(H::new(bf16_bytes(&weight), DType::BF16, &[512])),
        latent: Some(H::new(
            if matches!(op, Op::Insert { .. }) {
                bf16_bytes(&latent_vals)
            } else {
                canary(rows * 1024, 3)
            },
            DType::BF16,
            &[rows, 512],
        )),
        ring: is_cr2.then(|| H::new(f32_bytes(&ring), DType::F32, &[ring_blocks, cap, 1024])),
        prev_rows: None,
        prev_idx: None,
        cos_sin: layout.map(|_| cos_sin),
        kv_cache,
        fp8_scale,
        rows: None,
    };
    if prev {
        let pr: Vec<f32> = (0..3 * 1024).map(|_| rng.value(scale)).collect();
        let pi: Vec<i64> = (0..reqs).map(|_| rng.below(5) as i64 - 1).collect(); // -1..3 (3 is out of range)
        case.prev_rows = Some(H::new(f32_bytes(&pr), DType::F32, &[3, 1024]));
        case.prev_idx = Some(mk_idx(&pi));
    }
    if op == Op::Ring {
        // Two rows stored to one slot in one call leave either row on a device
        // (the CPU keeps the later): keep only each slot's last row.
        for i in 0..slots.len() {
            if slots[i] >= 0 && slots[i + 1..].contains(&slots[i]) {
                slots[i] = -1;
            }
        }
        case.slots = mk_idx(&slots);
        let rws: Vec<f32> = (0..n * 1024).map(|_| rng.value(scale)).collect();
        case.rows = Some(H::new(f32_bytes(&rws), DType::F32, &[n, 1024]));
    }
    if !matches!(op, Op::Compress { .. } | Op::Fused { .. }) {
        case.kv_score = None;
        case.weight = None;
    }
    case
}

/// Every output buffer's bytes after running the case, plus the skip counts.
type Outputs = (Vec<Vec<u8>>, SkipCounts);

fn run<B: Backend>(b: &mut B, c: &Case) -> dsv4_kvcache::Result<Outputs> {
    b.set_sanitize(c.sanitize);
    let up = |h: &Option<H>| -> dsv4_kvcache::Result<Option<B::Buffer>> {
        h.as_ref().map(|h| b.upload(&h.bytes)).transpose()
    };
    let kv = up(&c.kv_score)?;
    let pos = b.upload(&c.positions.bytes)?;
    let slots = b.upload(&c.slots.bytes)?;
    let cslots = up(&c.cache_slots)?;
    let qsl = up(&c.qsl)?;
    let ttr = up(&c.ttr)?;
    let w = up(&c.weight)?;
    let mut latent = up(&c.latent)?;
    let mut ring = up(&c.ring)?;
    let prev = up(&c.prev_rows)?;
    let pidx = up(&c.prev_idx)?;
    let cs = up(&c.cos_sin)?;
    let mut cache = up(&c.kv_cache)?;
    let fp8 = up(&c.fp8_scale)?;
    let rows = up(&c.rows)?;
    let d = |h: &Option<H>| h.as_ref().expect("tensor present").desc;
    fn t<'a, S>(buf: &'a Option<S>, h: &Option<H>) -> Option<Tensor<'a, S>> {
        buf.as_ref()
            .map(|x| Tensor::new(x, h.as_ref().expect("tensor present").desc))
    }
    macro_rules! compress_args {
        ($cr:expr) => {
            CompressArgs {
                kv_score: Tensor::new(kv.as_ref().expect("kv"), d(&c.kv_score)),
                positions: Tensor::new(&pos, c.positions.desc),
                state_cache: ring.as_mut().map(|x| TensorMut::new(x, d(&c.ring))),
                slot_mapping: Tensor::new(&slots, c.slots.desc),
                query_start_loc: t(&qsl, &c.qsl),
                token_to_req_indices: t(&ttr, &c.ttr),
                rms_norm_weight: Tensor::new(w.as_ref().expect("w"), d(&c.weight)),
                rms_norm_eps: 1e-6,
                compress_ratio: $cr,
                latent_out: TensorMut::new(latent.as_mut().expect("latent"), d(&c.latent)),
                prev_rows: t(&prev, &c.prev_rows),
                prev_row_indices: t(&pidx, &c.prev_idx),
            }
        };
    }
    match c.op {
        Op::Compress { cr, .. } => b.fused_save_compress_norm(compress_args!(cr))?,
        Op::Insert { cr, .. } => b.rope_quant_insert(InsertArgs {
            latent: Tensor::new(latent.as_ref().expect("latent"), d(&c.latent)),
            positions: Tensor::new(&pos, c.positions.desc),
            cos_sin_cache: Tensor::new(cs.as_ref().expect("cs"), d(&c.cos_sin)),
            kv_cache: TensorMut::new(cache.as_mut().expect("cache"), d(&c.kv_cache)),
            slot_mapping: Tensor::new(&slots, c.slots.desc),
            compress_ratio: cr,
            fp8_scale: t(&fp8, &c.fp8_scale),
        })?,
        Op::Ring => b.save_ring_rows(RingArgs {
            rows: Tensor::new(rows.as_ref().expect("rows"), d(&c.rows)),
            slot_mapping: Tensor::new(&slots, c.slots.desc),
            state_cache: TensorMut::new(ring.as_mut().expect("ring"), d(&c.ring)),
        })?,
        Op::Fused { cr, .. } => {
            let compress = compress_args!(cr);
            b.fused_compress_insert(FusedArgs {
                compress,
                skip_latent_out: false,
                cos_sin_cache: Tensor::new(cs.as_ref().expect("cs"), d(&c.cos_sin)),
                kv_cache: TensorMut::new(cache.as_mut().expect("cache"), d(&c.kv_cache)),
                cache_slot_mapping: Tensor::new(
                    cslots.as_ref().expect("cslots"),
                    d(&c.cache_slots),
                ),
                fp8_scale: t(&fp8, &c.fp8_scale),
            })?
        }
    }
    let mut outs = Vec::new();
    for x in [&latent, &ring, &cache].into_iter().flatten() {
        outs.push(b.read(x)?);
    }
    Ok((outs, b.take_skip_counts()?))
}

fn configs() -> Vec<(Op, bool)> {
    let mut v = Vec::new();
    for cr in [1, 2] {
        for layout in RecordLayout::ALL {
            for san in [false, true] {
                v.push((Op::Insert { layout, cr }, san));
            }
            v.push((
                Op::Fused { layout, cr },
                layout == RecordLayout::Mxfp8 || layout == RecordLayout::Nvfp4,
            ));
        }
    }
    v.push((Op::Compress { cr: 1, prev: false }, false));
    v.push((Op::Compress { cr: 2, prev: false }, false));
    v.push((Op::Compress { cr: 2, prev: true }, false));
    v.push((Op::Ring, false));
    v
}

/// Compares `dev` with the reference on every configuration.
fn check_backend<B: Backend>(dev: &mut B) {
    let per = std::env::var("DSV4_KVCACHE_PARITY_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(300usize);
    let mut cpu = CpuBackend::new();
    let mut rng = Rng(0x5eed_d5f4);
    let (mut cases, mut bad, mut bytes) = (0usize, 0usize, 0u64);
    for (op, san) in configs() {
        let mut bad_here = 0;
        for _ in 0..per {
            let case = make_case(&mut rng, op, san);
            let want = run(&mut cpu, &case).expect("reference runs");
            let got = run(dev, &case).expect("device runs");
            cases += 1;
            bytes += want.0.iter().map(|v| v.len() as u64).sum::<u64>();
            if want != got {
                bad += 1;
                bad_here += 1;
                if bad_here <= 3 {
                    for (i, (w, g)) in want.0.iter().zip(&got.0).enumerate() {
                        if let Some(p) = w.iter().zip(g).position(|(a, b)| a != b) {
                            let diff = w.iter().zip(g).filter(|(a, b)| a != b).count();
                            eprintln!("MISMATCH {op:?} sanitize={san} output {i}: {diff} bytes differ, first at {p}");
                        }
                    }
                    if want.1 != got.1 {
                        eprintln!(
                            "MISMATCH {op:?} skip counts: want {:?} got {:?}",
                            want.1, got.1
                        );
                    }
                }
            }
        }
        println!("parity {op:?} sanitize={san}: {per} cases, {bad_here} mismatching");
    }
    println!(
        "PARITY {}: {cases} cases, {bytes} output bytes compared, {bad} mismatching cases",
        dev.name()
    );
    assert_eq!(bad, 0, "device output differs from the reference");
}

/// Writes past the test harness's capture, so a skip shows in a plain
/// `cargo test`.
fn skipped(msg: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "{msg}");
}

fn require_gpu() -> bool {
    std::env::var("DSV4_KVCACHE_REQUIRE_GPU").is_ok_and(|v| v == "1")
}

#[test]
fn cuda_matches_reference() {
    #[cfg(feature = "cuda")]
    match dsv4_kvcache::CudaBackend::new(0) {
        Ok(mut b) => return check_backend(&mut b),
        Err(e) => {
            skipped(&format!("\n*** SKIPPED cuda_matches_reference: {e} ***\n"));
            assert!(
                !require_gpu(),
                "DSV4_KVCACHE_REQUIRE_GPU=1 but no CUDA device: {e}"
            );
        }
    }
    #[cfg(not(feature = "cuda"))]
    skipped(&format!(
        "\n*** SKIPPED cuda_matches_reference: built without the `cuda` feature ***\n"
    ));
}

#[test]
fn hip_matches_reference() {
    #[cfg(feature = "hip")]
    match dsv4_kvcache::HipBackend::new(0) {
        Ok(mut b) => return check_backend(&mut b),
        Err(e) => skipped(&format!("\n*** SKIPPED hip_matches_reference: {e} ***\n")),
    }
    #[cfg(not(feature = "hip"))]
    skipped(&format!(
        "\n*** SKIPPED hip_matches_reference: built without the `hip` feature ***\n"
    ));
}

/// The harness itself: the reference against itself on fresh buffers must
/// agree, and a corrupted output must be caught.
#[test]
fn harness_detects_differences() {
    let mut a = CpuBackend::new();
    let mut rng = Rng(42);
    for (op, san) in configs() {
        let case = make_case(&mut rng, op, san);
        let x = run(&mut a, &case).expect("runs");
        let y = run(&mut a, &case).expect("runs");
        assert!(x == y, "{op:?}: reference is not deterministic");
    }
    // Outputs differ when an input does (some of ten cases write a token).
    let mut differing = 0;
    for _ in 0..10 {
        let case = make_case(
            &mut rng,
            Op::Insert {
                layout: RecordLayout::Mxfp8,
                cr: 1,
            },
            false,
        );
        let mut other = case.clone();
        if let Some(l) = other.latent.as_mut() {
            for b in l.bytes.iter_mut() {
                *b ^= 0x10;
            }
        }
        let x = run(&mut a, &case).expect("runs");
        let y = run(&mut a, &other).expect("runs");
        differing += (x != y) as usize;
    }
    assert!(differing > 0, "a changed latent must change the cache");
}
