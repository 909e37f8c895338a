//! `demo`: chunked prefill and decode through the CR2 ring into all five
//! cache layouts, checked byte for byte against the CPU reference.

use crate::args::{record_order_opt, Opts};
use crate::select::{with_backend, Job};
use crate::timing::{median_f64, Timing};
use crate::{CliError, CliResult};
use dsv4_kvcache::formats::bf16_from_f32;
use dsv4_kvcache::layout::{decode_record, RecordLayout, RecordOrder, DIM};
use dsv4_kvcache::reference::rotate;
use dsv4_kvcache::testkit::{f32_bytes, i64_bytes, rope_cos_sin, u16_bytes, Rng};
use dsv4_kvcache::{
    Backend, CompressArgs, CpuBackend, DType, Error, InsertArgs, Result, Tensor, TensorDesc,
    TensorMut,
};
use std::collections::BTreeMap;
use std::time::Instant;

/// `dsv4-kvcache demo [--backend B] [--requests R] ...`.
pub(crate) fn demo_cmd(args: &[String]) -> CliResult<()> {
    let o = Opts::parse(
        args,
        &[
            "backend",
            "requests",
            "prefill-tokens",
            "decode-steps",
            "seed",
            "record-order",
        ],
        &[],
    )?;
    o.no_positional()?;
    let cfg = DemoConfig {
        requests: o.num("requests", 4)?,
        prefill: o.num("prefill-tokens", 1024)?,
        decode: o.num("decode-steps", 64)?,
        seed: o.num("seed", 1)?,
        record_order: record_order_opt(&o)?,
    };
    if cfg.requests == 0 || cfg.requests > 4096 {
        return Err(CliError::Usage(
            "--requests must be between 1 and 4096".into(),
        ));
    }
    if cfg.prefill < 4 || cfg.prefill > 1 << 20 {
        return Err(CliError::Usage(
            "--prefill-tokens must be between 4 and 1048576".into(),
        ));
    }
    if cfg.decode > 1 << 16 {
        return Err(CliError::Usage(
            "--decode-steps must be at most 65536".into(),
        ));
    }
    let failures = with_backend(o.backend()?, DemoJob { cfg })?;
    if failures.is_empty() {
        Ok(())
    } else {
        Err(CliError::Check(failures.join("; ")))
    }
}

#[derive(Debug, Clone, Copy)]
struct DemoConfig {
    requests: usize,
    prefill: usize,
    decode: usize,
    seed: u64,
    /// Where the paged records' scales go.
    record_order: RecordOrder,
}

/// Ring rows per request (the demo's and the soak's).
pub(crate) const RING_CAPACITY: usize = 4;
/// Rows per cache block (the demo's and the soak's).
pub(crate) const BLOCK: usize = 64;
/// Timed insert calls per layout in the demo (after one warm-up call).
const DEMO_TIMED_CALLS: usize = 5;
/// The FP8 rows' per-tensor scale (the demo's and the soak's).
pub(crate) const FP8_SCALE: f32 = 0.02;

/// Uploads each I64 index list to `b`, in order.
pub(crate) fn upload_indices<B: Backend, const K: usize>(
    b: &B,
    lists: [&[i64]; K],
) -> Result<[B::Buffer; K]> {
    let bufs = lists
        .iter()
        .map(|l| b.upload(&i64_bytes(l)))
        .collect::<Result<Vec<_>>>()?;
    match bufs.try_into() {
        Ok(all) => Ok(all),
        Err(_) => unreachable!("one buffer per list"),
    }
}

/// The descriptor of a cache of `blocks` blocks of [`BLOCK`] rows in `layout`.
pub(crate) fn cache_desc(blocks: usize, layout: RecordLayout) -> TensorDesc {
    match layout {
        RecordLayout::Bf16Rows => TensorDesc::contiguous(DType::BF16, &[blocks, BLOCK, DIM]),
        RecordLayout::Fp8Rows => TensorDesc::contiguous(DType::F8E4M3, &[blocks, BLOCK, DIM]),
        l => TensorDesc::contiguous(DType::U8, &[blocks, BLOCK, l.record_bytes()]),
    }
}

/// Everything the demo feeds the operations, on the host.
struct Scenario {
    requests: usize,
    /// Prompt length per request.
    prompt: Vec<usize>,
    /// Prefill chunk sizes per request (2 or 3, all different).
    chunks: Vec<Vec<usize>>,
    decode: usize,
    /// `[kv 512 | score 512]` rows per request, prompt then decode tokens.
    rows: Vec<Vec<f32>>,
    weight: Vec<u16>,
    eps: f32,
    /// Where the paged records' scales go.
    record_order: RecordOrder,
    /// `[max_pos, 64]`.
    cos_sin: Vec<f32>,
    cos_rows: usize,
    /// Cache blocks of each request (a random permutation of all blocks).
    block_table: Vec<Vec<usize>>,
    blocks: usize,
}

impl Scenario {
    fn new(cfg: &DemoConfig) -> Scenario {
        let mut rng = Rng::new(cfg.seed);
        let r = cfg.requests;
        let mut prompt = Vec::new();
        let mut chunks = Vec::new();
        for i in 0..r {
            let p = cfg.prefill;
            // Prompts of different lengths, about P ± 25 %.
            let len = (p * 3 / 4 + rng.below(p as u64 / 2 + 1) as usize).max(4);
            // 2 or 3 chunks; 3 distinct sizes need at least 1 + 2 + 3 tokens.
            let n = if len >= 6 { 2 + i % 2 } else { 2 };
            let mut sizes = Vec::new();
            for _ in 0..1000 {
                // Cut points at random; sizes all different and non-zero.
                let mut cuts: Vec<usize> = (0..n - 1)
                    .map(|_| 1 + rng.below(len as u64 - 1) as usize)
                    .collect();
                cuts.sort_unstable();
                let mut s = Vec::new();
                let mut prev = 0;
                for c in cuts.iter().copied().chain([len]) {
                    s.push(c - prev);
                    prev = c;
                }
                let mut d = s.clone();
                d.sort_unstable();
                d.dedup();
                if d.len() == s.len() && s.iter().all(|&x| x > 0) {
                    sizes = s;
                    break;
                }
            }
            if sizes.is_empty() {
                // Unlucky draws: 1, 2, ..., and the rest (distinct since len >= 4).
                sizes = (1..n).collect();
                sizes.push(len - sizes.iter().sum::<usize>());
            }
            prompt.push(len);
            chunks.push(sizes);
        }
        let total: Vec<usize> = prompt.iter().map(|p| p + cfg.decode).collect();
        let rows = total
            .iter()
            .map(|&n| {
                (0..n * 1024)
                    .map(|j| {
                        let v = rng.normal();
                        // Scores (second half) spread a little wider.
                        if j % 1024 >= 512 {
                            2.0 * v
                        } else {
                            v
                        }
                    })
                    .collect()
            })
            .collect();
        let weight = (0..DIM)
            .map(|_| bf16_from_f32(1.0 + 0.2 * rng.normal()))
            .collect();
        let max_pos = total.iter().copied().max().unwrap_or(1);
        let per_req_blocks: Vec<usize> = total
            .iter()
            .map(|n| (n / 2).div_ceil(BLOCK).max(1))
            .collect();
        let blocks: usize = per_req_blocks.iter().sum::<usize>() + 1;
        let perm = rng.permutation(blocks);
        let mut next = 0;
        let block_table = per_req_blocks
            .iter()
            .map(|&n| {
                let t = perm[next..next + n].to_vec();
                next += n;
                t
            })
            .collect();
        Scenario {
            requests: r,
            prompt,
            chunks,
            decode: cfg.decode,
            record_order: cfg.record_order,
            rows,
            weight,
            eps: 1e-6,
            cos_sin: rope_cos_sin(max_pos),
            cos_rows: max_pos,
            block_table,
            blocks,
        }
    }

    /// The calls: per call, each request's `(first position, tokens)`.
    fn rounds(&self, chunked: bool) -> Vec<(String, Vec<(usize, usize)>)> {
        let mut out = Vec::new();
        if chunked {
            let n = self.chunks.iter().map(Vec::len).max().unwrap_or(0);
            for k in 0..n {
                let c = (0..self.requests)
                    .map(|r| {
                        let start: usize = self.chunks[r].iter().take(k).sum();
                        (start, self.chunks[r].get(k).copied().unwrap_or(0))
                    })
                    .collect();
                out.push((format!("prefill chunk {}", k + 1), c));
            }
        } else {
            out.push((
                "prefill (one chunk)".into(),
                self.prompt.iter().map(|&p| (0, p)).collect(),
            ));
        }
        for d in 0..self.decode {
            out.push((
                format!("decode step {}", d + 1),
                self.prompt.iter().map(|&p| (p + d, 1)).collect(),
            ));
        }
        out
    }

    fn cache_slot(&self, r: usize, pos: usize) -> i64 {
        let c = pos / 2;
        (self.block_table[r][c / BLOCK] * BLOCK + c % BLOCK) as i64
    }

    fn cache_desc(&self, layout: RecordLayout) -> TensorDesc {
        cache_desc(self.blocks, layout)
    }

    fn cache_bytes(&self, layout: RecordLayout) -> usize {
        self.blocks * BLOCK * layout.record_bytes()
    }
}

/// A boundary token's latent: `(request, position) → BF16 bits`.
type Latents = BTreeMap<(usize, usize), Vec<u16>>;

/// What a run of the scenario produced.
struct RunOut {
    /// Each call's `latent_out`, by call name.
    calls: Vec<(String, Vec<u8>)>,
    ring: Vec<u8>,
    caches: Vec<Vec<u8>>,
    latents: Latents,
    tokens: usize,
}

fn desc(dtype: DType, shape: &[usize]) -> TensorDesc {
    TensorDesc::contiguous(dtype, shape)
}

/// Runs the scenario on `b`: one CR2 compress call per round, each followed
/// by one insert per layout of the latents it produced.
fn run_scenario<B: Backend>(b: &B, sc: &Scenario, chunked: bool, inserts: bool) -> Result<RunOut> {
    let cap = RING_CAPACITY;
    let r = sc.requests;
    let ring_desc = desc(DType::F32, &[r, cap, 1024]);
    let mut ring = b.upload(&vec![0u8; r * cap * 4096])?;
    let weight = b.upload(&u16_bytes(&sc.weight))?;
    let cos = b.upload(&f32_bytes(&sc.cos_sin))?;
    let cos_desc = desc(DType::F32, &[sc.cos_rows, 64]);
    let fp8 = b.upload(&FP8_SCALE.to_le_bytes())?;
    let mut caches = Vec::new();
    if inserts {
        for l in RecordLayout::ALL {
            caches.push(b.upload(&vec![0u8; sc.cache_bytes(l)])?);
        }
    }
    let mut out = RunOut {
        calls: Vec::new(),
        ring: Vec::new(),
        caches: Vec::new(),
        latents: BTreeMap::new(),
        tokens: 0,
    };
    for (name, chunk) in sc.rounds(chunked) {
        let n: usize = chunk.iter().map(|c| c.1).sum();
        if n == 0 {
            continue;
        }
        out.tokens += n;
        let mut kv = Vec::with_capacity(n * 1024);
        let (mut pos, mut slots, mut ttr, mut cslots, mut who) =
            (vec![], vec![], vec![], vec![], vec![]);
        let mut qsl = vec![0i64];
        for (req, &(start, len)) in chunk.iter().enumerate() {
            for p in start..start + len {
                kv.extend_from_slice(&sc.rows[req][p * 1024..(p + 1) * 1024]);
                pos.push(p as i64);
                slots.push((req * cap + p % cap) as i64);
                ttr.push(req as i64);
                cslots.push(if p % 2 == 1 {
                    sc.cache_slot(req, p)
                } else {
                    -1
                });
                who.push((req, p));
            }
            qsl.push(qsl.last().copied().unwrap_or(0) + len as i64);
        }
        let kv_b = b.upload(&f32_bytes(&kv))?;
        let [pos_b, slots_b, qsl_b, ttr_b, cslots_b] =
            upload_indices(b, [&pos, &slots, &qsl, &ttr, &cslots])?;
        let mut latent = b.upload(&vec![0u8; n * DIM * 2])?;
        let lat_desc = desc(DType::BF16, &[n, DIM]);
        let idx = |len: usize| desc(DType::I64, &[len]);
        b.fused_save_compress_norm(CompressArgs {
            kv_score: Tensor::new(&kv_b, desc(DType::F32, &[n, 1024])),
            positions: Tensor::new(&pos_b, idx(n)),
            state_cache: Some(TensorMut::new(&mut ring, ring_desc)),
            slot_mapping: Tensor::new(&slots_b, idx(n)),
            query_start_loc: Some(Tensor::new(&qsl_b, idx(r + 1))),
            token_to_req_indices: Some(Tensor::new(&ttr_b, idx(n))),
            rms_norm_weight: Tensor::new(&weight, desc(DType::BF16, &[DIM])),
            rms_norm_eps: sc.eps,
            compress_ratio: 2,
            latent_out: TensorMut::new(&mut latent, lat_desc),
            prev_rows: None,
            prev_row_indices: None,
        })?;
        for (l, cache) in RecordLayout::ALL.into_iter().zip(caches.iter_mut()) {
            b.rope_quant_insert(InsertArgs {
                latent: Tensor::new(&latent, lat_desc),
                positions: Tensor::new(&pos_b, idx(n)),
                cos_sin_cache: Tensor::new(&cos, cos_desc),
                kv_cache: TensorMut::new(cache, sc.cache_desc(l)),
                slot_mapping: Tensor::new(&cslots_b, idx(n)),
                compress_ratio: 2,
                fp8_scale: (l == RecordLayout::Fp8Rows)
                    .then(|| Tensor::new(&fp8, desc(DType::F32, &[1]))),
                record_order: sc.record_order.for_layout(l),
            })?;
        }
        let bytes = b.read(&latent)?;
        for (t, &(req, p)) in who.iter().enumerate() {
            if p % 2 == 1 {
                let row = bytes[t * 1024..(t + 1) * 1024]
                    .chunks_exact(2)
                    .map(|c| u16::from_le_bytes([c[0], c[1]]))
                    .collect();
                out.latents.insert((req, p), row);
            }
        }
        out.calls.push((name, bytes));
    }
    let skipped = b.take_skip_counts()?;
    if skipped.total() > 0 {
        return Err(Error::Value {
            arg: "demo",
            problem: format!("the backend skipped tokens it should not have: {skipped:?}"),
        });
    }
    out.ring = b.read(&ring)?;
    for c in &caches {
        out.caches.push(b.read(c)?);
    }
    Ok(out)
}

/// The records' values and scales of `slot` in a cache of `layout`
/// written in `order`.
fn record_at(
    layout: RecordLayout,
    order: RecordOrder,
    cache: &[u8],
    slot: usize,
) -> (&[u8], &[u8]) {
    let (block, row) = (slot / BLOCK, slot % BLOCK);
    let (v, s) = (layout.value_bytes(), layout.scale_bytes());
    let page = block * BLOCK * (v + s);
    let (vo, so) = order.record_offsets(layout, BLOCK, row);
    (
        &cache[page + vo..page + vo + v],
        &cache[page + so..page + so + s],
    )
}

/// Max abs and RMS relative error of the decoded records vs the f32 rotated latents.
fn reconstruction(
    sc: &Scenario,
    layout: RecordLayout,
    cache: &[u8],
    latents: &Latents,
) -> (f64, f64) {
    let (mut max_abs, mut err2, mut ref2) = (0f64, 0f64, 0f64);
    for (&(req, p), lat) in latents {
        let lat: [u16; DIM] = lat.as_slice().try_into().expect("512 dims");
        let base = (p / 2) * 2;
        let row = &sc.cos_sin[base * 64..base * 64 + 64];
        let cos: [f32; 32] = row[..32].try_into().expect("32");
        let sin: [f32; 32] = row[32..].try_into().expect("32");
        let want = rotate(&lat, &cos, &sin);
        let (values, scales) = record_at(
            layout,
            sc.record_order.for_layout(layout),
            cache,
            sc.cache_slot(req, p) as usize,
        );
        let got = decode_record(layout, values, scales, FP8_SCALE);
        for (g, w) in got.iter().zip(want.iter()) {
            let d = (*g as f64) - (*w as f64);
            max_abs = max_abs.max(d.abs());
            err2 += d * d;
            ref2 += (*w as f64) * (*w as f64);
        }
    }
    (max_abs, (err2 / ref2.max(1e-300)).sqrt())
}

/// Inserts every latent of the run in one call per layout (after a warm-up)
/// and returns the tokens per second and the cache it wrote.
fn time_insert<B: Backend>(
    b: &B,
    sc: &Scenario,
    latents: &Latents,
    layout: RecordLayout,
) -> Result<(f64, Vec<u8>)> {
    let n = latents.len();
    let mut lat = Vec::with_capacity(n * DIM);
    let (mut pos, mut slots) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for (&(req, p), l) in latents {
        lat.extend_from_slice(l);
        pos.push(p as i64);
        slots.push(sc.cache_slot(req, p));
    }
    let lat_b = b.upload(&u16_bytes(&lat))?;
    let pos_b = b.upload(&i64_bytes(&pos))?;
    let slots_b = b.upload(&i64_bytes(&slots))?;
    let cos = b.upload(&f32_bytes(&sc.cos_sin))?;
    let fp8 = b.upload(&FP8_SCALE.to_le_bytes())?;
    let mut cache = b.upload(&vec![0u8; sc.cache_bytes(layout)])?;
    let once = |cache: &mut B::Buffer| {
        b.rope_quant_insert(InsertArgs {
            latent: Tensor::new(&lat_b, desc(DType::BF16, &[n, DIM])),
            positions: Tensor::new(&pos_b, desc(DType::I64, &[n])),
            cos_sin_cache: Tensor::new(&cos, desc(DType::F32, &[sc.cos_rows, 64])),
            kv_cache: TensorMut::new(cache, sc.cache_desc(layout)),
            slot_mapping: Tensor::new(&slots_b, desc(DType::I64, &[n])),
            compress_ratio: 2,
            fp8_scale: (layout == RecordLayout::Fp8Rows)
                .then(|| Tensor::new(&fp8, desc(DType::F32, &[1]))),
            record_order: sc.record_order.for_layout(layout),
        })
    };
    once(&mut cache)?;
    b.synchronize()?;
    let mut times = Vec::new();
    for _ in 0..DEMO_TIMED_CALLS {
        let t = Instant::now();
        once(&mut cache)?;
        b.synchronize()?;
        times.push(t.elapsed().as_secs_f64());
    }
    let rate = n as f64 / median_f64(&mut times).max(1e-12);
    Ok((rate, b.read(&cache)?))
}

/// The first differing byte of two blobs, or a length difference.
fn first_difference(a: &[u8], b: &[u8]) -> Option<String> {
    if a.len() != b.len() {
        return Some(format!("{} bytes vs {} bytes", a.len(), b.len()));
    }
    let n = a.iter().zip(b).filter(|(x, y)| x != y).count();
    a.iter().zip(b).position(|(x, y)| x != y).map(|i| {
        format!(
            "{n} bytes differ, first at byte {i}: 0x{:02x} vs reference 0x{:02x}",
            a[i], b[i]
        )
    })
}

struct DemoJob {
    cfg: DemoConfig,
}

impl Job for DemoJob {
    /// The failures (empty: PASS).
    type Out = Vec<String>;

    fn run<B: Backend, T: Timing<B>>(
        self,
        b: &mut B,
        timing: &T,
        notes: &[String],
    ) -> Result<Vec<String>> {
        let t_start = Instant::now();
        let sc = Scenario::new(&self.cfg);
        let mut failures = Vec::new();
        println!(
            "dsv4-kvcache demo: {} requests, prompts of {} tokens in 2-3 chunks each, {} decode steps, seed {}",
            sc.requests,
            sc.prompt.iter().map(|p| p.to_string()).collect::<Vec<_>>().join("/"),
            sc.decode,
            self.cfg.seed
        );
        for (r, c) in sc.chunks.iter().enumerate() {
            println!(
                "  request {r}: chunks of {} tokens",
                c.iter()
                    .map(|x| x.to_string())
                    .collect::<Vec<_>>()
                    .join(" + ")
            );
        }
        notes.iter().for_each(|n| println!("{n}"));
        println!(
            "backend: {} (sanitize {})",
            b.name(),
            if b.sanitize() { "on" } else { "off" }
        );

        let run = run_scenario(b, &sc, true, true)?;
        println!(
            "ran {} fused_save_compress_norm calls (CR2, ring of {RING_CAPACITY} rows per request) over {} tokens, \
             each followed by 5 rope_quant_insert calls: {} latents",
            run.calls.len(),
            run.tokens,
            run.latents.len()
        );

        // The ring's promise: chunking does not change the latents.
        let mut cpu = CpuBackend::new();
        cpu.set_sanitize(b.sanitize());
        let whole = run_scenario(&cpu, &sc, false, false)?;
        if whole.latents == run.latents {
            println!(
                "chunked prefill == one chunk per request: all {} latents identical",
                run.latents.len()
            );
        } else {
            let n = run
                .latents
                .iter()
                .filter(|(k, v)| whole.latents.get(k) != Some(v))
                .count();
            failures.push(format!(
                "{n} latents differ between chunked and one-chunk prefill"
            ));
            println!("chunked prefill vs one chunk per request: {n} latents DIFFER");
        }

        // Every output against the reference.
        let verdict: Vec<String> = if timing.is_reference() {
            println!("the backend is the CPU reference itself: nothing else to compare against");
            vec!["reference".into(); RecordLayout::ALL.len()]
        } else {
            let reference = run_scenario(&cpu, &sc, true, true)?;
            for ((name, got), (_, want)) in run.calls.iter().zip(&reference.calls) {
                if let Some(d) = first_difference(got, want) {
                    failures.push(format!("{name} latent_out: {d}"));
                }
            }
            if let Some(d) = first_difference(&run.ring, &reference.ring) {
                failures.push(format!("ring state: {d}"));
            }
            let ok = run.calls.len() == reference.calls.len();
            println!(
                "latent_out of {} calls and the final ring vs the CPU reference: {}",
                run.calls.len(),
                if failures.is_empty() && ok {
                    "identical"
                } else {
                    "DIFFERENT"
                }
            );
            RecordLayout::ALL
                .iter()
                .zip(run.caches.iter().zip(&reference.caches))
                .map(|(l, (got, want))| match first_difference(got, want) {
                    None => "identical".to_string(),
                    Some(d) => {
                        failures.push(format!("{} cache: {d}", l.name()));
                        "DIFFERENT".to_string()
                    }
                })
                .collect()
        };

        println!();
        println!(
            "| layout | bytes/token | records | max abs err | RMS rel err | insert tok/s (T = {}) | vs CPU reference |",
            run.latents.len()
        );
        println!("| --- | ---: | ---: | ---: | ---: | ---: | --- |");
        for (i, l) in RecordLayout::ALL.into_iter().enumerate() {
            let (max_abs, rms) = reconstruction(&sc, l, &run.caches[i], &run.latents);
            let (rate, batch_cache) = time_insert(b, &sc, &run.latents, l)?;
            if batch_cache != run.caches[i] {
                failures.push(format!(
                    "{}: one insert of all latents wrote different bytes than the per-step inserts",
                    l.name()
                ));
            }
            println!(
                "| {} | {} | {} | {:.3e} | {:.3e} | {}tok/s | {} |",
                l.name(),
                l.record_bytes(),
                run.latents.len(),
                max_abs,
                rms,
                tok_rate(rate),
                verdict[i]
            );
        }
        println!();
        println!(
            "errors: decoded records vs the f32 rotated latent; throughput: wall clock of one rope_quant_insert \
             call of all {} latents, waited for, median of {DEMO_TIMED_CALLS} after a warm-up",
            run.latents.len()
        );
        println!("demo took {:.2} s", t_start.elapsed().as_secs_f64());
        if failures.is_empty() {
            println!(
                "PASS: {} latents and {} records per layout, {}",
                run.latents.len(),
                run.latents.len(),
                if timing.is_reference() {
                    "on the CPU reference (chunking, ring and batch consistency checked)"
                } else {
                    "byte-identical to the CPU reference"
                }
            );
        } else {
            for f in &failures {
                println!("mismatch: {f}");
            }
        }
        Ok(failures)
    }
}

/// A rate with an SI prefix, e.g. `1.25 M` (the unit follows).
fn tok_rate(r: f64) -> String {
    if r >= 1e9 {
        format!("{:.2} G", r / 1e9)
    } else if r >= 1e6 {
        format!("{:.2} M", r / 1e6)
    } else if r >= 1e3 {
        format!("{:.1} k", r / 1e3)
    } else {
        format!("{r:.0} ")
    }
}
