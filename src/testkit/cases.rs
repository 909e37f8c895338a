//! Typical cases of each operation as vector files.

use super::{normals, Rng};
use crate::formats::bf16_from_f32;
use crate::layout::{RecordLayout, RecordOrder, DIM};
use crate::reference::encode_record;
use crate::tensor::DType;
use crate::vectors::{Op, VTensor, VectorFile};

/// The GPT-J RoPE table `[rows, 64]`: `cos(p θ_k)` in columns 0..32 and
/// `sin(p θ_k)` in 32..64, `θ_k = 10000^(-2k/64)`, computed in f64 and
/// rounded to f32 (as the seed harness does).
pub fn rope_cos_sin(rows: usize) -> Vec<f32> {
    use rayon::prelude::*;
    let theta: Vec<f64> = (0..32)
        .map(|k| 10000f64.powf(-2.0 * k as f64 / 64.0))
        .collect();
    let mut t = vec![0.0f32; rows * 64];
    t.par_chunks_mut(64).enumerate().for_each(|(p, row)| {
        for k in 0..32 {
            let a = p as f64 * theta[k];
            row[k] = a.cos() as f32;
            row[32 + k] = a.sin() as f32;
        }
    });
    t
}

/// Rows per cache block in every generated case.
pub const BLOCK_SIZE: usize = 64;
/// The per-tensor scale of generated FP8 row caches (not a power of two,
/// so its reciprocal rounds).
pub const FP8_SCALE: f32 = 0.0125;
/// The RMSNorm epsilon of generated compress cases.
pub const RMS_NORM_EPS: f32 = 1e-6;

/// What to generate.
#[derive(Debug, Clone)]
pub struct CaseSpec {
    /// The operation.
    pub op: Op,
    /// The cache layout (insert ops).
    pub layout: RecordLayout,
    /// Where a paged record's scales go (insert ops and the reader).
    pub record_order: RecordOrder,
    /// 1 or 2 (not used by `save_ring_rows`).
    pub compress_ratio: u32,
    /// Tokens `T` (positions `0..T`).
    pub tokens: usize,
    /// CR2: the tokens are split into this many requests of consecutive
    /// positions (sizes differ by at most one; some may be empty).
    pub requests: usize,
    /// Ring rows per request (CR2, ring rows).
    pub ring_capacity: usize,
    /// Seed of the inputs.
    pub seed: u64,
    /// Sanitize NaNs.
    pub sanitize: bool,
    /// Put special values (NaN, ±inf, ±0, huge, tiny, format edges) in
    /// some rows and negative slots on a few tokens.
    pub adversarial: bool,
}

impl Default for CaseSpec {
    fn default() -> Self {
        CaseSpec {
            op: Op::RopeQuantInsert,
            layout: RecordLayout::Mxfp8,
            record_order: RecordOrder::PagePlanar,
            compress_ratio: 1,
            tokens: 64,
            requests: 4,
            ring_capacity: 4,
            seed: 1,
            sanitize: false,
            adversarial: false,
        }
    }
}

/// Special f32 values for adversarial rows.
const SPECIALS: [f32; 14] = [
    f32::NAN,
    f32::INFINITY,
    f32::NEG_INFINITY,
    0.0,
    -0.0,
    1e30,
    -1e30,
    1e-30,
    448.0,
    464.0,
    6.0,
    f32::MIN_POSITIVE,
    1e-4,
    65504.0,
];

fn fill_adversarial(rng: &mut Rng, row: &mut [f32]) {
    match rng.below(4) {
        // A few special values among normal ones.
        0 => {
            for _ in 0..8 {
                let i = rng.below(row.len() as u64) as usize;
                row[i] = SPECIALS[rng.below(SPECIALS.len() as u64) as usize];
            }
        }
        // One special value everywhere.
        1 => {
            let v = SPECIALS[rng.below(SPECIALS.len() as u64) as usize];
            row.iter_mut().for_each(|x| *x = v);
        }
        // Huge dynamic range.
        2 => {
            for x in row.iter_mut() {
                *x *= 2f32.powi(rng.below(60) as i32 - 30);
            }
        }
        // Tiny values (subnormal territory of the formats).
        _ => {
            for x in row.iter_mut() {
                *x *= 1e-7;
            }
        }
    }
}

/// `rows` latent rows (BF16 bits), adversarial values in some rows.
fn bf16_rows(rng: &mut Rng, rows: usize, adversarial: bool) -> Vec<u16> {
    if !adversarial {
        // Without adversarial rows the draws are all normals.
        return normals(rng, rows * DIM)
            .into_iter()
            .map(bf16_from_f32)
            .collect();
    }
    (0..rows).flat_map(|_| bf16_row(rng, adversarial)).collect()
}

fn bf16_row(rng: &mut Rng, adversarial: bool) -> Vec<u16> {
    let mut v: Vec<f32> = (0..DIM).map(|_| rng.normal()).collect();
    if adversarial && rng.below(4) == 0 {
        fill_adversarial(rng, &mut v);
    }
    v.into_iter().map(bf16_from_f32).collect()
}

fn f32_rows(rng: &mut Rng, rows: usize, width: usize, adversarial: bool) -> Vec<f32> {
    if !adversarial {
        // Without adversarial rows the draws are all normals.
        return normals(rng, rows * width);
    }
    let mut out = Vec::with_capacity(rows * width);
    for _ in 0..rows {
        let mut v: Vec<f32> = (0..width).map(|_| rng.normal()).collect();
        if adversarial && rng.below(8) == 0 {
            fill_adversarial(rng, &mut v);
        }
        out.extend(v);
    }
    out
}

/// The cache tensor of `layout` for `tokens` slots (canary bytes).
fn cache_tensor(rng: &mut Rng, layout: RecordLayout, tokens: usize) -> VTensor {
    let blocks = tokens.div_ceil(BLOCK_SIZE).max(1);
    match layout {
        RecordLayout::Bf16Rows => {
            let n = blocks * BLOCK_SIZE * DIM;
            VTensor::bytes(DType::BF16, &[blocks, BLOCK_SIZE, DIM], rng.bytes(2 * n))
        }
        RecordLayout::Fp8Rows => {
            let n = blocks * BLOCK_SIZE * DIM;
            VTensor::bytes(DType::F8E4M3, &[blocks, BLOCK_SIZE, DIM], rng.bytes(n))
        }
        _ => {
            let w = layout.record_bytes();
            VTensor::bytes(
                DType::U8,
                &[blocks, BLOCK_SIZE, w],
                rng.bytes(blocks * BLOCK_SIZE * w),
            )
        }
    }
}

/// Cache slots: a random permutation of the cache's slots, one per
/// token (a few `-1` when adversarial).
fn cache_slots(rng: &mut Rng, tokens: usize, adversarial: bool) -> Vec<i64> {
    let blocks = tokens.div_ceil(BLOCK_SIZE).max(1);
    let perm = rng.permutation(blocks * BLOCK_SIZE);
    (0..tokens)
        .map(|t| {
            if adversarial && rng.below(20) == 0 {
                -1
            } else {
                perm[t] as i64
            }
        })
        .collect()
}

/// Request chunk sizes: `tokens` split into `requests` consecutive runs.
pub fn split(tokens: usize, requests: usize) -> Vec<usize> {
    let r = requests.max(1);
    (0..r)
        .map(|i| tokens / r + usize::from(i < tokens % r))
        .collect()
}

/// f32 values stored as `dtype` (F32, BF16 or F16; rounded to nearest even).
fn input_floats(dtype: DType, shape: &[usize], v: &[f32]) -> VTensor {
    match dtype {
        DType::BF16 => VTensor::bf16_bits(
            shape,
            &v.iter().map(|&x| bf16_from_f32(x)).collect::<Vec<_>>(),
        ),
        DType::F16 => VTensor::bytes(
            DType::F16,
            shape,
            v.iter()
                .flat_map(|&x| half::f16::from_f32(x).to_le_bytes())
                .collect(),
        ),
        _ => VTensor::f32(shape, v),
    }
}

fn insert_inputs(f: &mut VectorFile, rng: &mut Rng, s: &CaseSpec, floats: Floats, slots: Vec<i64>) {
    let t = s.tokens;
    f.set_input(
        "cos_sin",
        input_floats(floats.cos_sin, &[t.max(1), 64], &rope_cos_sin(t.max(1))),
    );
    f.set_input("kv_cache", cache_tensor(rng, s.layout, t));
    let key = if s.op == Op::FusedCompressInsert {
        "cache_slot_mapping"
    } else {
        "slot_mapping"
    };
    f.set_input(key, VTensor::i64(&[t], &slots));
    if s.layout == RecordLayout::Fp8Rows {
        f.set_input("fp8_scale", VTensor::f32(&[1], &[FP8_SCALE]));
    }
    set_layout(f, s);
}

/// The layout metadata, and the record order where it is not the default.
fn set_layout(f: &mut VectorFile, s: &CaseSpec) {
    f.set_meta("layout", s.layout.name());
    if s.record_order != RecordOrder::PagePlanar {
        f.set_meta("record_order", s.record_order.name());
    }
}

fn compress_inputs(f: &mut VectorFile, rng: &mut Rng, s: &CaseSpec, floats: Floats) {
    let t = s.tokens;
    let cr = s.compress_ratio as usize;
    f.set_input(
        "kv_score",
        VTensor::f32(&[t, DIM * cr], &f32_rows(rng, t, DIM * cr, s.adversarial)),
    );
    let w: Vec<f32> = (0..DIM).map(|_| 1.0 + 0.25 * rng.normal()).collect();
    f.set_input("rms_norm_weight", input_floats(floats.weight, &[DIM], &w));
    f.set_input(
        "latent_out",
        VTensor::bytes(DType::BF16, &[t, DIM], rng.bytes(2 * t * DIM)),
    );
    f.set_rms_norm_eps(RMS_NORM_EPS);
    if cr == 1 {
        // CR1: slot_mapping only marks tokens valid (< 0 skips).
        let marks: Vec<i64> = (0..t as i64)
            .map(|i| {
                if s.adversarial && rng.below(20) == 0 {
                    -1
                } else {
                    i
                }
            })
            .collect();
        f.set_input("slot_mapping", VTensor::i64(&[t], &marks));
        return;
    }
    let sizes = split(t, s.requests);
    let cap = s.ring_capacity.max(1);
    let reqs = sizes.len();
    let mut qsl = vec![0i64];
    let mut ttr = Vec::with_capacity(t);
    let mut slots = Vec::with_capacity(t);
    for (r, &n) in sizes.iter().enumerate() {
        let start = *qsl.last().expect("non-empty") as usize;
        for p in start..start + n {
            ttr.push(r as i64);
            let skip = s.adversarial && rng.below(20) == 0;
            slots.push(if skip { -1 } else { (r * cap + p % cap) as i64 });
        }
        qsl.push((start + n) as i64);
    }
    f.set_input("query_start_loc", VTensor::i64(&[reqs + 1], &qsl));
    f.set_input("token_to_req_indices", VTensor::i64(&[t], &ttr));
    f.set_input("slot_mapping", VTensor::i64(&[t], &slots));
    f.set_input(
        "state_cache",
        VTensor::f32(&[reqs, cap, 1024], &f32_rows(rng, reqs * cap, 1024, false)),
    );
}

/// Rows per cache block of generated `gather_dequant` cases (small, so that
/// their files stay small).
pub const GATHER_BLOCK_SIZE: usize = 16;

/// A `gather_dequant` case: `s.tokens` output rows of `out_f32` (else BF16)
/// from a cache of `s.layout` holding random bytes (every code, NaN codes
/// and scale 0xFF included); the slot form when `s.requests` is 0, else the
/// block-table form over that many requests with start offsets.
/// Adversarial cases add out-of-range and negative indices.
pub fn make_gather_case(s: &CaseSpec, out_f32: bool) -> VectorFile {
    let mut f = VectorFile::new(Op::GatherDequant);
    let mut rng = Rng::new(s.seed);
    gather_inputs(&mut f, &mut rng, s, out_f32);
    f.set_meta(
        "description",
        format!(
            "generated by dsv4-kvcache testkit: op gather_dequant, layout {}, rows {}, {}, out {}, seed {}, adversarial {}",
            s.layout.name(),
            s.tokens,
            if s.requests == 0 { "slot form".to_string() } else { format!("block table of {} requests", s.requests) },
            if out_f32 { "F32" } else { "BF16" },
            s.seed,
            s.adversarial
        ),
    );
    f
}

fn gather_inputs(f: &mut VectorFile, rng: &mut Rng, s: &CaseSpec, out_f32: bool) {
    let bs = GATHER_BLOCK_SIZE;
    let t = s.tokens;
    let blocks = (2 * t).div_ceil(bs).max(2);
    let cap = blocks * bs;
    let cache = match s.layout {
        RecordLayout::Bf16Rows => {
            VTensor::bytes(DType::BF16, &[blocks, bs, DIM], rng.bytes(2 * cap * DIM))
        }
        RecordLayout::Fp8Rows => {
            VTensor::bytes(DType::F8E4M3, &[blocks, bs, DIM], rng.bytes(cap * DIM))
        }
        l => VTensor::bytes(
            DType::U8,
            &[blocks, bs, l.record_bytes()],
            rng.bytes(cap * l.record_bytes()),
        ),
    };
    f.set_input("kv_cache", cache);
    if s.layout == RecordLayout::Fp8Rows {
        f.set_input("fp8_scale", VTensor::f32(&[1], &[FP8_SCALE]));
    }
    let wild = |rng: &mut Rng| s.adversarial && rng.below(6) == 0;
    let out_rows = if s.requests == 0 {
        let perm = rng.permutation(cap);
        let slots: Vec<i64> = (0..t)
            .map(|i| {
                if wild(rng) {
                    [-1, cap as i64, cap as i64 + 7][rng.below(3) as usize]
                } else {
                    perm[i % cap] as i64
                }
            })
            .collect();
        f.set_input("slot_mapping", VTensor::i64(&[t], &slots));
        t
    } else {
        let sizes = split(t, s.requests);
        let reqs = sizes.len();
        let mut cu = vec![0i64];
        let mut starts = Vec::with_capacity(reqs);
        let mut cols = 1;
        for &n in &sizes {
            let start = rng.below(2 * bs as u64) as usize;
            cols = cols.max((start + n).div_ceil(bs));
            starts.push(start as i64);
            cu.push(cu.last().expect("non-empty") + n as i64);
        }
        let mut table: Vec<i64> = (0..reqs * cols)
            .map(|_| rng.below(blocks as u64) as i64)
            .collect();
        if s.adversarial {
            for e in table.iter_mut() {
                if wild(rng) {
                    *e = [-1, blocks as i64][rng.below(2) as usize];
                }
            }
            starts[0] = -1;
        }
        f.set_input("block_table", VTensor::i64(&[reqs, cols], &table));
        f.set_input("cu_seq_lens", VTensor::i64(&[reqs + 1], &cu));
        f.set_input("seq_starts", VTensor::i64(&[reqs], &starts));
        // One row no request owns: it keeps its bytes.
        t + 1
    };
    let (dt, esz) = if out_f32 {
        (DType::F32, 4)
    } else {
        (DType::BF16, 2)
    };
    f.set_input(
        "out",
        VTensor::bytes(dt, &[out_rows, DIM], rng.bytes(esz * out_rows * DIM)),
    );
    set_layout(f, s);
}

/// [`make_gather_case`] over a cache that the writer filled, as a serving
/// cache is: every row holds the record of a normally distributed latent
/// at its own position (the library's encoder, so the decoders' common
/// paths), where [`make_gather_case`]'s random bytes reach every path.
pub fn make_written_gather_case(s: &CaseSpec, out_f32: bool) -> VectorFile {
    use rayon::prelude::*;
    let mut f = make_gather_case(s, out_f32);
    let layout = s.layout;
    let mut cache = f
        .input("kv_cache")
        .expect("gather cases have a cache")
        .clone();
    let bs = GATHER_BLOCK_SIZE;
    let rows = cache.shape[0] * bs;
    let (v, sb) = (layout.value_bytes(), layout.scale_bytes());
    let mut rng = Rng::new(s.seed ^ 0x5772_6974);
    let latents: Vec<u16> = normals(&mut rng, rows * DIM)
        .into_iter()
        .map(bf16_from_f32)
        .collect();
    let table = rope_cos_sin(rows);
    let inv_fp8 = 1.0f32 / FP8_SCALE;
    cache
        .data
        .par_chunks_mut(bs * (v + sb))
        .enumerate()
        .for_each(|(block, page)| {
            for r in 0..bs {
                let row = block * bs + r;
                let latent: &[u16; DIM] = latents[row * DIM..(row + 1) * DIM]
                    .try_into()
                    .expect("DIM values");
                let cs = &table[row * 64..row * 64 + 64];
                let rec = encode_record(
                    layout,
                    latent,
                    cs[..32].try_into().expect("32 cos"),
                    cs[32..].try_into().expect("32 sin"),
                    false,
                    inv_fp8,
                );
                let (vo, so) = s.record_order.record_offsets(layout, bs, r);
                page[vo..vo + v].copy_from_slice(&rec.values[..v]);
                page[so..so + sb].copy_from_slice(&rec.scales[..sb]);
            }
        });
    f.set_input("kv_cache", cache);
    f
}

/// A vector file with the inputs of `s` (no outputs; see
/// [`VectorFile::capture_reference`]). Positions are `0..T`; caches have
/// blocks of [`BLOCK_SIZE`] rows and canary bytes; cache slots are a
/// random permutation (as in the performance anchors).
pub fn make_case(s: &CaseSpec) -> VectorFile {
    make_case_with(s, Floats::TUNED)
}

/// The element types of `rms_norm_weight` and `cos_sin_cache` in a
/// generated case (F32, BF16 or F16).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Floats {
    /// `rms_norm_weight`'s.
    pub weight: DType,
    /// `cos_sin_cache`'s.
    pub cos_sin: DType,
}

impl Floats {
    /// What [`make_case`] generates: a BF16 weight, an F32 table (the
    /// tuned kernels' types, as in the performance anchors).
    pub const TUNED: Floats = Floats {
        weight: DType::BF16,
        cos_sin: DType::F32,
    };
}

/// [`make_case`] with the weight and the table of the given types (the
/// same values, rounded to the type).
pub fn make_case_with(s: &CaseSpec, floats: Floats) -> VectorFile {
    let mut f = VectorFile::new(s.op);
    let mut rng = Rng::new(s.seed);
    let t = s.tokens;
    f.set_meta("sanitize", if s.sanitize { "true" } else { "false" });
    let positions: Vec<i64> = (0..t as i64).collect();
    match s.op {
        Op::RopeQuantInsert => {
            let latent = bf16_rows(&mut rng, t, s.adversarial);
            f.set_input("latent", VTensor::bf16_bits(&[t, DIM], &latent));
            f.set_input("positions", VTensor::i64(&[t], &positions));
            let slots = cache_slots(&mut rng, t, s.adversarial);
            insert_inputs(&mut f, &mut rng, s, floats, slots);
            f.set_meta("compress_ratio", s.compress_ratio.to_string());
        }
        Op::FusedSaveCompressNorm | Op::FusedCompressInsert => {
            f.set_input("positions", VTensor::i64(&[t], &positions));
            compress_inputs(&mut f, &mut rng, s, floats);
            if s.op == Op::FusedCompressInsert {
                let slots = cache_slots(&mut rng, t, s.adversarial);
                insert_inputs(&mut f, &mut rng, s, floats, slots);
            }
            f.set_meta("compress_ratio", s.compress_ratio.to_string());
        }
        Op::GatherDequant => gather_inputs(&mut f, &mut rng, s, false),
        Op::SaveRingRows => {
            let cap = s.ring_capacity.max(1);
            let blocks = t.div_ceil(cap).max(1);
            let perm = rng.permutation(blocks * cap);
            let slots: Vec<i64> = (0..t)
                .map(|i| {
                    if s.adversarial && rng.below(20) == 0 {
                        -1
                    } else {
                        perm[i] as i64
                    }
                })
                .collect();
            f.set_input(
                "rows",
                VTensor::f32(&[t, 1024], &f32_rows(&mut rng, t, 1024, s.adversarial)),
            );
            f.set_input("slot_mapping", VTensor::i64(&[t], &slots));
            f.set_input(
                "state_cache",
                VTensor::f32(
                    &[blocks, cap, 1024],
                    &f32_rows(&mut rng, blocks * cap, 1024, false),
                ),
            );
        }
    }
    f.set_meta(
        "description",
        format!(
            "generated by dsv4-kvcache testkit: op {}, layout {} ({} order), CR{}, T {}, requests {}, ring capacity {}, seed {}, adversarial {}",
            s.op,
            s.layout.name(),
            s.record_order,
            s.compress_ratio,
            s.tokens,
            s.requests,
            s.ring_capacity,
            s.seed,
            s.adversarial
        ),
    );
    f
}
