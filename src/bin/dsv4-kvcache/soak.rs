//! `soak`: serving-shaped traffic on one backend for a number of steps or a
//! duration, every output compared with the CPU reference byte for byte.
//!
//! A pool of request slots; requests arrive into free slots and finish
//! after their prompt (chunked prefill, chunks of random size) and their
//! decode steps (each a token and one draft token; the draft is accepted
//! or rejected at random, a rejected one rewritten next step). Slots reuse
//! their CR2 ring rows and cache blocks go back to a free list, so later
//! requests overwrite earlier ones' rows. Each step runs the compressor on
//! every slot (empty ones included), inserts the latents into all five
//! layouts (on odd steps through the fused compress + insert for one
//! layout), reads one request's records back through `gather_dequant`, and
//! makes one call that must be rejected; sanitize changes between steps and
//! some tokens hold NaN, ±inf or huge values. After each step the latents,
//! the ring, the five caches and the reader's output are compared with the
//! same calls on the CPU reference, and memory is sampled.

use crate::args::{record_order_opt, Opts};
use crate::demo::{cache_desc, upload_indices, BLOCK, FP8_SCALE, RING_CAPACITY as RING};
use crate::select::{with_backend, Job};
use crate::timing::Timing;
use crate::{CliError, CliResult};
use dsv4_kvcache::formats::bf16_from_f32;
use dsv4_kvcache::layout::{RecordLayout, RecordOrder, DIM};
use dsv4_kvcache::testkit::{f32_bytes, i64_bytes, rope_cos_sin, u16_bytes, Rng};
use dsv4_kvcache::{
    Backend, CompressArgs, CpuBackend, DType, FusedArgs, GatherArgs, GatherIndex, InsertArgs,
    Result, Tensor, TensorDesc, TensorMut,
};
use std::time::{Duration, Instant};

/// `dsv4-kvcache soak [--backend B] [--steps N] [--duration S] ...`.
pub(crate) fn soak_cmd(args: &[String]) -> CliResult<()> {
    let o = Opts::parse(
        args,
        &[
            "backend",
            "steps",
            "duration",
            "seed",
            "slots",
            "max-prompt",
            "max-decode",
            "report-every",
            "record-order",
        ],
        &[],
    )?;
    o.no_positional()?;
    let duration: f64 = o.num("duration", 0.0)?;
    let cfg = SoakConfig {
        // With a duration and no --steps, the duration alone ends the run.
        steps: match (o.get("steps"), duration > 0.0) {
            (None, true) => u64::MAX,
            _ => o.num("steps", 200)?,
        },
        duration: (duration > 0.0).then(|| Duration::from_secs_f64(duration)),
        seed: o.num("seed", 1)?,
        slots: o.num("slots", 8)?,
        max_prompt: o.num("max-prompt", 300)?,
        max_decode: o.num("max-decode", 40)?,
        report_every: Duration::from_secs_f64(o.num::<f64>("report-every", 30.0)?.max(0.1)),
        record_order: record_order_opt(&o)?,
    };
    if !(duration >= 0.0 && duration.is_finite()) {
        return Err(CliError::Usage(
            "--duration must be a number of seconds >= 0".into(),
        ));
    }
    if cfg.slots == 0 || cfg.slots > 256 {
        return Err(CliError::Usage("--slots must be between 1 and 256".into()));
    }
    if cfg.max_prompt < 2 || cfg.max_prompt > 1 << 16 || cfg.max_decode > 1 << 16 {
        return Err(CliError::Usage(
            "--max-prompt must be between 2 and 65536, --max-decode at most 65536".into(),
        ));
    }
    let s = with_backend(o.backend()?, SoakJob { cfg })?;
    if s.mismatches == 0 {
        Ok(())
    } else {
        Err(CliError::Check(format!(
            "{} mismatch(es) with the CPU reference in {} steps",
            s.mismatches, s.steps
        )))
    }
}

#[derive(Debug, Clone, Copy)]
struct SoakConfig {
    steps: u64,
    duration: Option<Duration>,
    seed: u64,
    slots: usize,
    max_prompt: usize,
    max_decode: usize,
    report_every: Duration,
    /// Where the paged records' scales go, in every cache of the run.
    record_order: RecordOrder,
}

/// Largest prefill chunk.
const MAX_CHUNK: usize = 64;

/// A request in a slot.
struct Request {
    id: u64,
    prompt: usize,
    total: usize,
    /// Next position to write.
    pos: usize,
    /// Bumped on each rejected draft, so that a rewritten position gets new values.
    version: u64,
    blocks: Vec<usize>,
}

/// One step's batch: per slot, its first position and token count.
struct Batch {
    chunks: Vec<(usize, usize)>,
    /// Per token: `[kv 512 | score 512]`.
    rows: Vec<f32>,
    fused_layout: Option<RecordLayout>,
    /// Reader: the request's blocks, its written compressed rows, F32 out, layout.
    read: Option<(Vec<usize>, usize, bool, RecordLayout)>,
}

/// What one backend holds: the ring and the five caches, and the fixed inputs.
struct Side<B: Backend> {
    ring: B::Buffer,
    caches: Vec<B::Buffer>,
    weight: B::Buffer,
    cos: B::Buffer,
    fp8: B::Buffer,
}

/// Sizes shared by both sides.
struct Shape {
    slots: usize,
    blocks: usize,
    cos_rows: usize,
    max_blocks: usize,
    record_order: RecordOrder,
}

impl Shape {
    fn cache_desc(&self, l: RecordLayout) -> TensorDesc {
        cache_desc(self.blocks, l)
    }
}

fn d(dtype: DType, shape: &[usize]) -> TensorDesc {
    TensorDesc::contiguous(dtype, shape)
}

impl<B: Backend> Side<B> {
    fn new(b: &B, sh: &Shape, weight: &[u16], cos: &[f32]) -> Result<Self> {
        let mut caches = Vec::new();
        for l in RecordLayout::ALL {
            caches.push(b.upload(&vec![0u8; sh.blocks * BLOCK * l.record_bytes()])?);
        }
        Ok(Side {
            ring: b.upload(&vec![0u8; sh.slots * RING * 4096])?,
            caches,
            weight: b.upload(&u16_bytes(weight))?,
            cos: b.upload(&f32_bytes(cos))?,
            fp8: b.upload(&FP8_SCALE.to_le_bytes())?,
        })
    }

    /// Runs one step; returns every written tensor's bytes (latents, ring,
    /// five caches, reader output) in a fixed order.
    fn step(
        &mut self,
        step_no: u64,
        b: &B,
        sh: &Shape,
        reqs: &[Option<Request>],
        bt: &Batch,
    ) -> Result<Vec<Vec<u8>>> {
        let n: usize = bt.chunks.iter().map(|c| c.1).sum();
        let (mut pos, mut slots, mut ttr, mut cslots) = (vec![], vec![], vec![], vec![]);
        let mut qsl = vec![0i64];
        for (r, &(start, len)) in bt.chunks.iter().enumerate() {
            for p in start..start + len {
                pos.push(p as i64);
                slots.push((r * RING + p % RING) as i64);
                ttr.push(r as i64);
                let c = p / 2;
                cslots.push(match (&reqs[r], p % 2) {
                    (Some(q), 1) => (q.blocks[c / BLOCK] * BLOCK + c % BLOCK) as i64,
                    _ => -1,
                });
            }
            qsl.push(qsl[qsl.len() - 1] + len as i64);
        }
        let kv = b.upload(&f32_bytes(&bt.rows))?;
        let [pos_b, slots_b, qsl_b, ttr_b, cslots_b] =
            upload_indices(b, [&pos, &slots, &qsl, &ttr, &cslots])?;
        let mut latent = b.upload(&vec![0u8; n * DIM * 2])?;
        let idx = |len: usize| d(DType::I64, &[len]);
        let lat_desc = d(DType::BF16, &[n, DIM]);
        let ring_desc = d(DType::F32, &[sh.slots, RING, 1024]);
        let cos_desc = d(DType::F32, &[sh.cos_rows, 64]);
        let Side {
            ring,
            caches,
            weight,
            cos,
            fp8,
        } = self;
        // The compressor's arguments over the ring and latents given.
        macro_rules! compress {
            ($ring:expr, $latent:expr) => {
                CompressArgs {
                    kv_score: Tensor::new(&kv, d(DType::F32, &[n, 1024])),
                    positions: Tensor::new(&pos_b, idx(n)),
                    state_cache: Some(TensorMut::new($ring, ring_desc)),
                    slot_mapping: Tensor::new(&slots_b, idx(n)),
                    query_start_loc: Some(Tensor::new(&qsl_b, idx(sh.slots + 1))),
                    token_to_req_indices: Some(Tensor::new(&ttr_b, idx(n))),
                    rms_norm_weight: Tensor::new(&*weight, d(DType::BF16, &[DIM])),
                    rms_norm_eps: 1e-6,
                    compress_ratio: 2,
                    latent_out: TensorMut::new($latent, lat_desc),
                    prev_rows: None,
                    prev_row_indices: None,
                }
            };
        }
        let scale = |l: RecordLayout| {
            (l == RecordLayout::Fp8Rows).then(|| Tensor::new(&*fp8, d(DType::F32, &[1])))
        };
        match bt.fused_layout {
            Some(l) => {
                let i = RecordLayout::ALL.iter().position(|&x| x == l).unwrap_or(0);
                b.fused_compress_insert(FusedArgs {
                    compress: compress!(ring, &mut latent),
                    skip_latent_out: false,
                    cos_sin_cache: Tensor::new(cos, cos_desc),
                    kv_cache: TensorMut::new(&mut caches[i], sh.cache_desc(l)),
                    cache_slot_mapping: Tensor::new(&cslots_b, idx(n)),
                    fp8_scale: scale(l),
                    record_order: sh.record_order.for_layout(l),
                })?;
            }
            None => b.fused_save_compress_norm(compress!(ring, &mut latent))?,
        }
        for (l, cache) in RecordLayout::ALL.into_iter().zip(caches.iter_mut()) {
            if bt.fused_layout == Some(l) {
                continue;
            }
            b.rope_quant_insert(InsertArgs {
                latent: Tensor::new(&latent, lat_desc),
                positions: Tensor::new(&pos_b, idx(n)),
                cos_sin_cache: Tensor::new(cos, cos_desc),
                kv_cache: TensorMut::new(cache, sh.cache_desc(l)),
                slot_mapping: Tensor::new(&cslots_b, idx(n)),
                compress_ratio: 2,
                fp8_scale: scale(l),
                record_order: sh.record_order.for_layout(l),
            })?;
        }
        // A call that must be rejected (slot_mapping longer than the
        // latents): it must fail and leave the cache as it was.
        let k = step_no as usize % caches.len();
        let before = b.read(&caches[k])?;
        let bad = b.upload(&i64_bytes(&vec![0; n + 1]))?;
        let rejected = b.rope_quant_insert(InsertArgs {
            latent: Tensor::new(&latent, lat_desc),
            positions: Tensor::new(&pos_b, idx(n)),
            cos_sin_cache: Tensor::new(cos, cos_desc),
            kv_cache: TensorMut::new(&mut caches[k], sh.cache_desc(RecordLayout::ALL[k])),
            slot_mapping: Tensor::new(&bad, idx(n + 1)),
            compress_ratio: 2,
            fp8_scale: scale(RecordLayout::ALL[k]),
            record_order: sh.record_order.for_layout(RecordLayout::ALL[k]),
        });
        if rejected.is_ok() || b.read(&caches[k])? != before {
            return Err(dsv4_kvcache::Error::Value {
                arg: "soak",
                problem: format!(
                    "a call with too many slots was {} (cache {})",
                    if rejected.is_ok() {
                        "accepted"
                    } else {
                        "rejected but wrote"
                    },
                    RecordLayout::ALL[k].name()
                ),
            });
        }
        let mut out = vec![b.read(&latent)?, b.read(ring)?];
        for c in caches.iter() {
            out.push(b.read(c)?);
        }
        if let Some((blocks, rows, f32_out, l)) = &bt.read {
            let i = RecordLayout::ALL.iter().position(|x| x == l).unwrap_or(0);
            let mut table = blocks.clone();
            table.resize(sh.max_blocks, 0);
            let table: Vec<i64> = table.iter().map(|&x| x as i64).collect();
            let table_b = b.upload(&i64_bytes(&table))?;
            let cu_b = b.upload(&i64_bytes(&[0, *rows as i64]))?;
            let (dt, esz) = if *f32_out {
                (DType::F32, 4)
            } else {
                (DType::BF16, 2)
            };
            // One spare row stays untouched (canary).
            let mut o = b.upload(&vec![0xA5u8; (rows + 1) * DIM * esz])?;
            b.gather_dequant(GatherArgs {
                kv_cache: Tensor::new(&caches[i], sh.cache_desc(*l)),
                index: GatherIndex::BlockTable {
                    block_table: Tensor::new(&table_b, d(DType::I64, &[1, sh.max_blocks])),
                    cu_seq_lens: Tensor::new(&cu_b, idx(2)),
                    seq_starts: None,
                },
                fp8_scale: scale(*l),
                out: TensorMut::new(&mut o, d(dt, &[rows + 1, DIM])),
                record_order: sh.record_order.for_layout(*l),
            })?;
            out.push(b.read(&o)?);
        }
        let skipped = b.take_skip_counts()?;
        if skipped.total() > 0 {
            return Err(dsv4_kvcache::Error::Value {
                arg: "soak",
                problem: format!("tokens skipped that should not be: {skipped:?}"),
            });
        }
        Ok(out)
    }
}

/// The run's totals.
pub(crate) struct Summary {
    steps: u64,
    mismatches: u64,
}

struct SoakJob {
    cfg: SoakConfig,
}

/// Resident memory of this process in bytes (Linux), else `None`.
fn rss() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = s.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4096)
}

fn mib(x: Option<u64>) -> String {
    x.map_or("n/a".into(), |v| {
        format!("{:.1} MiB", v as f64 / (1 << 20) as f64)
    })
}

/// A token's `[kv | score]` row (a few tokens hold special values).
fn token_row(seed: u64, id: u64, p: usize, version: u64, out: &mut Vec<f32>) {
    let mut rng = Rng::new(
        seed ^ id.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ ((p as u64) << 20) ^ (version << 52),
    );
    let start = out.len();
    for j in 0..1024 {
        let v = rng.normal();
        out.push(if j >= 512 { 2.0 * v } else { v });
    }
    if rng.below(16) == 0 {
        const SPECIAL: [f32; 6] = [
            f32::NAN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            1e30,
            -0.0,
            1e-30,
        ];
        for _ in 0..4 {
            let j = rng.below(1024) as usize;
            out[start + j] = SPECIAL[rng.below(SPECIAL.len() as u64) as usize];
        }
    }
}

impl Job for SoakJob {
    type Out = Summary;
    fn run<B: Backend, T: Timing<B>>(
        self,
        b: &mut B,
        timing: &T,
        notes: &[String],
    ) -> Result<Summary> {
        let cfg = self.cfg;
        notes.iter().for_each(|n| println!("{n}"));
        let mut cpu = CpuBackend::new();
        println!("soak: {} against the CPU reference", b.name());
        let max_total = cfg.max_prompt + cfg.max_decode + 2;
        let max_blocks = (max_total.div_ceil(2) + 1).div_ceil(BLOCK);
        let sh = Shape {
            slots: cfg.slots,
            blocks: cfg.slots * max_blocks + 1,
            cos_rows: max_total,
            max_blocks,
            record_order: cfg.record_order,
        };
        let mut rng = Rng::new(cfg.seed);
        let weight: Vec<u16> = (0..DIM)
            .map(|_| bf16_from_f32(1.0 + 0.2 * rng.normal()))
            .collect();
        let cos = rope_cos_sin(sh.cos_rows);
        let mut dev = Side::new(&*b, &sh, &weight, &cos)?;
        let mut reference = Side::new(&cpu, &sh, &weight, &cos)?;
        let mut free: Vec<usize> = rng.permutation(sh.blocks);
        let mut reqs: Vec<Option<Request>> = (0..cfg.slots).map(|_| None).collect();
        let (mut next_id, mut finished) = (0u64, 0u64);
        let (mut tokens, mut compared, mut mismatches) = (0u64, 0u64, 0u64);
        let mem = |b: &B| (timing.device_memory_used(b), rss());
        let (dev0, rss0) = mem(b);
        println!(
            "memory at start: device {}, host RSS {}",
            mib(dev0),
            mib(rss0)
        );
        let t0 = Instant::now();
        let mut last_report = t0;
        let mut step = 0u64;
        while step < cfg.steps && cfg.duration.is_none_or(|d| t0.elapsed() < d) {
            // Arrivals into free slots.
            for slot in reqs.iter_mut().filter(|r| r.is_none()) {
                if rng.below(2) == 0 {
                    let prompt = 2 + rng.below(cfg.max_prompt as u64 - 1) as usize;
                    let total = prompt + rng.below(cfg.max_decode as u64 + 1) as usize;
                    let need = (total.div_ceil(2) + 1).div_ceil(BLOCK);
                    let blocks = free.split_off(free.len() - need);
                    *slot = Some(Request {
                        id: next_id,
                        prompt,
                        total,
                        pos: 0,
                        version: 0,
                        blocks,
                    });
                    next_id += 1;
                }
            }
            // The batch: a prefill chunk or a decode step with one draft token per request.
            let mut chunks = Vec::new();
            let mut rows = Vec::new();
            for r in &reqs {
                let (start, len) = match r {
                    None => (0, 0),
                    Some(q) if q.pos < q.prompt => (
                        q.pos,
                        (1 + rng.below(MAX_CHUNK as u64) as usize).min(q.prompt - q.pos),
                    ),
                    Some(q) => (q.pos, 2.min(q.total + 1 - q.pos)),
                };
                if let Some(q) = r {
                    for p in start..start + len {
                        let v = if p >= q.prompt { q.version } else { 0 };
                        token_row(cfg.seed, q.id, p, v, &mut rows);
                    }
                }
                chunks.push((start, len));
            }
            let sanitize = step % 3 == 1;
            let fused_layout = (step % 2 == 1).then(|| RecordLayout::ALL[(step / 2) as usize % 5]);
            // The reader: one request's complete compressed rows, as written after this step.
            let read = {
                let live: Vec<usize> = (0..cfg.slots).filter(|&i| reqs[i].is_some()).collect();
                (!live.is_empty()).then(|| {
                    let i = live[rng.below(live.len() as u64) as usize];
                    let q = reqs[i].as_ref().expect("live");
                    let written = (chunks[i].0 + chunks[i].1) / 2;
                    let l = RecordLayout::ALL[rng.below(5) as usize];
                    (q.blocks.clone(), written, rng.below(2) == 1, l)
                })
            }
            .filter(|r| r.1 > 0);
            let batch = Batch {
                chunks,
                rows,
                fused_layout,
                read,
            };
            let n: usize = batch.chunks.iter().map(|c| c.1).sum();
            if n > 0 {
                b.set_sanitize(sanitize);
                cpu.set_sanitize(sanitize);
                let got = dev.step(step, &*b, &sh, &reqs, &batch)?;
                let want = reference.step(step, &cpu, &sh, &reqs, &batch)?;
                const NAMES: [&str; 8] = [
                    "latent_out",
                    "ring",
                    "v4",
                    "mxfp8",
                    "nvfp4",
                    "bf16",
                    "fp8",
                    "gather out",
                ];
                for (k, (g, w)) in got.iter().zip(&want).enumerate() {
                    compared += w.len() as u64;
                    if g != w {
                        mismatches += 1;
                        if mismatches <= 10 {
                            let at = g.iter().zip(w).position(|(x, y)| x != y).unwrap_or(0);
                            println!(
                                "MISMATCH step {step}: {} differs from the reference at byte {at} of {} (sanitize {sanitize}, fused {fused_layout:?})",
                                NAMES.get(k).unwrap_or(&"output"),
                                w.len()
                            );
                        }
                    }
                }
                if got.len() != want.len() {
                    mismatches += 1;
                }
                tokens += n as u64;
            }
            // Acceptance of the draft tokens, finishing requests.
            for (r, &(_, len)) in reqs.iter_mut().zip(&batch.chunks) {
                let Some(q) = r else { continue };
                if q.pos < q.prompt || len < 2 {
                    q.pos += len;
                } else if rng.below(3) == 0 {
                    q.pos += 1; // draft rejected: rewritten next step
                    q.version += 1;
                } else {
                    q.pos += 2;
                }
                if q.pos > q.total {
                    free.append(&mut q.blocks);
                    *r = None;
                    finished += 1;
                }
            }
            step += 1;
            if last_report.elapsed() >= cfg.report_every {
                last_report = Instant::now();
                let (dm, hm) = mem(b);
                println!(
                    "  {:.0} s: {step} steps, {tokens} tokens, {finished} requests finished, {compared} bytes compared, {mismatches} mismatches; device {}, host RSS {}",
                    t0.elapsed().as_secs_f64(),
                    mib(dm),
                    mib(hm)
                );
            }
        }
        b.synchronize()?;
        let (dev1, rss1) = mem(b);
        println!(
            "soak summary: {step} steps in {:.1} s, {tokens} tokens, {} requests ({finished} finished), {compared} bytes compared, {mismatches} mismatches",
            t0.elapsed().as_secs_f64(),
            next_id
        );
        println!(
            "memory: device {} at start, {} at end; host RSS {} at start, {} at end",
            mib(dev0),
            mib(dev1),
            mib(rss0),
            mib(rss1)
        );
        println!("{}", if mismatches == 0 { "PASS" } else { "FAIL" });
        Ok(Summary {
            steps: step,
            mismatches,
        })
    }
}
