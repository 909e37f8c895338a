//! Property tests of the CPU reference (`CpuBackend`) against `semantics.md`.
//!
//! 1. canary: only the tokens the rules select write, and only their bytes;
//! 2. CR2 chunked prefill through the ring equals one chunk;
//! 3. the `prev_rows` path followed by `save_ring_rows` equals the ring path;
//! 4. decode(insert(x)) is within each layout's error bound;
//! 5. NaN/inf handling with and without sanitizing;
//! 6. RoPE leaves the NoPE dims of BF16 rows bit-identical, but for the sign
//!    of zero (the exact rule is derived below);
//! 7. the bytes do not depend on the thread count;
//! 8. the fused op equals compress then insert.
//!
//! Tests named `spec_..._` are ignored: they show where the reference and
//! `semantics.md` disagree, and were reported.

// Element loops index several arrays by the same dim (latent, rotation,
// decoded record), as the layouts are defined.
#![allow(clippy::needless_range_loop)]

mod common;

use common::*;
use dsv4_kvcache::formats::{bf16_to_f32, e4m3_to_f32};
use dsv4_kvcache::layout::decode_record;
use dsv4_kvcache::{Backend, CpuBackend, DType, RecordLayout, RecordOrder, SkipCounts};
use proptest::prelude::*;
use std::ops::Range;

fn cpu(sanitize: bool) -> CpuBackend {
    let mut b = CpuBackend::new();
    b.set_sanitize(sanitize);
    b
}

fn run(case: &Case) -> Outputs {
    let out = run_case(&cpu(case.kind.sanitize), case);
    assert_eq!(out.result, Ok(()), "{}", case.name);
    out
}

// ---- a model of which tokens write what ------------------------------------------

/// What a launch must write, by the rules of `semantics.md` plus the CPU
/// reference's documented skip rules (tokens outside their request's chunk,
/// negative positions, slots beyond capacity are skipped and counted).
#[derive(Debug, Default)]
struct Effects {
    /// Tokens whose `latent_out` row is written.
    latents: Vec<usize>,
    /// `(token, cache slot)` of each record written.
    records: Vec<(usize, i64)>,
    /// `(block, row, source row)` of each ring row copied (source: a
    /// `kv_score` row, or a `rows` row for `save_ring_rows`).
    ring: Vec<(usize, usize, usize)>,
    /// Expected skip counts.
    skips: SkipCounts,
}

/// The compressor's part: which tokens get a latent (and ring stores).
fn compress_model(c: &Case, fx: &mut Effects) -> Vec<bool> {
    let n = c.n();
    let slots = c.slot_mapping.indices();
    let pos = c.positions.as_ref().expect("positions").indices();
    let mut produced = vec![false; n];
    if c.compress_ratio == 1 {
        for t in 0..n {
            produced[t] = slots[t] >= 0;
        }
        return produced;
    }
    let qsl = c.query_start_loc.as_ref().expect("qsl").indices();
    let ttr = c.token_to_req_indices.as_ref().expect("ttr").indices();
    let nreq = qsl.len() as i64 - 1;
    let ring = c.state_cache.as_ref().expect("ring").desc;
    let (blocks, cap) = (ring.shape()[0] as i64, ring.shape()[1] as i64);
    let prev = c.prev_rows.as_ref().map(|p| {
        (
            p.desc.shape()[0] as i64,
            c.prev_row_indices.as_ref().expect("prev idx").indices(),
        )
    });
    for t in 0..n {
        let s = slots[t];
        if s < 0 {
            continue;
        }
        let p = pos[t];
        if p < 0 {
            fx.skips.position_out_of_range += 1;
            continue;
        }
        if (p + 1) % 2 != 0 {
            continue;
        }
        let r = ttr[t];
        if r < 0 || r >= nreq {
            fx.skips.index_out_of_range += 1;
            continue;
        }
        let (start, end) = (qsl[r as usize], qsl[r as usize + 1]);
        let ti = t as i64;
        if !(start <= ti && ti < end) {
            fx.skips.index_out_of_range += 1;
            continue;
        }
        if ti == start {
            let j = prev.as_ref().map_or(-1, |(_, idx)| idx[r as usize]);
            if j >= 0 {
                if j >= prev.as_ref().expect("prev").0 {
                    fx.skips.index_out_of_range += 1;
                    continue;
                }
            } else if s / cap >= blocks {
                fx.skips.slot_out_of_range += 1;
                continue;
            }
        }
        produced[t] = true;
    }
    if prev.is_none() {
        for r in 0..nreq as usize {
            let start = qsl[r];
            let end = qsl[r + 1].min(n as i64);
            if start < 0 || start >= end || slots[start as usize] < 0 {
                continue;
            }
            for u in start.max(end - cap)..end {
                let s = slots[u as usize];
                if s < 0 {
                    continue;
                }
                if s / cap >= blocks {
                    fx.skips.slot_out_of_range += 1;
                    continue;
                }
                fx.ring
                    .push(((s / cap) as usize, (s % cap) as usize, u as usize));
            }
        }
    }
    produced
}

/// The insert rule for one token.
fn insert_rule(c: &Case, slot: i64, pos: i64, skips: &mut SkipCounts) -> bool {
    let cr = c.compress_ratio as i64;
    let cos_rows = c.cos_sin_cache.as_ref().expect("cos").desc.shape()[0] as i64;
    let cache = c.kv_cache.as_ref().expect("cache").desc;
    let capacity = (cache.shape()[0] * cache.shape()[1]) as i64;
    if slot < 0 {
        return false;
    }
    if pos < 0 {
        skips.position_out_of_range += 1;
        return false;
    }
    if (pos + 1) % cr != 0 {
        return false;
    }
    if (pos / cr) * cr >= cos_rows {
        skips.position_out_of_range += 1;
        return false;
    }
    if slot >= capacity {
        skips.slot_out_of_range += 1;
        return false;
    }
    true
}

fn model(c: &Case) -> Effects {
    let mut fx = Effects::default();
    match c.kind.op {
        Op::FusedSaveCompressNorm => {
            let p = compress_model(c, &mut fx);
            fx.latents = (0..c.n()).filter(|&t| p[t]).collect();
        }
        Op::FusedCompressInsert => {
            let skip_latent_out = c.kind.skip_latent_out;
            let p = compress_model(c, &mut fx);
            let pos = c.positions.as_ref().expect("positions").indices();
            let cslots = c
                .cache_slot_mapping
                .as_ref()
                .expect("cache slots")
                .indices();
            for t in 0..c.n() {
                if !p[t] {
                    continue;
                }
                if !skip_latent_out {
                    fx.latents.push(t);
                }
                let mut sk = fx.skips;
                if insert_rule(c, cslots[t], pos[t], &mut sk) {
                    fx.records.push((t, cslots[t]));
                }
                fx.skips = sk;
            }
        }
        Op::RopeQuantInsert => {
            let pos = c.positions.as_ref().expect("positions").indices();
            let slots = c.slot_mapping.indices();
            let mut sk = SkipCounts::default();
            for t in 0..c.n() {
                if insert_rule(c, slots[t], pos[t], &mut sk) {
                    fx.records.push((t, slots[t]));
                }
            }
            fx.skips = sk;
        }
        // The reader's model is tests/gather.rs's.
        Op::GatherDequant => panic!("{}: gather_dequant is modelled in tests/gather.rs", c.name),
        Op::SaveRingRows => {
            let ring = c.state_cache.as_ref().expect("ring").desc;
            let (blocks, cap) = (ring.shape()[0] as i64, ring.shape()[1] as i64);
            for (i, &s) in c.slot_mapping.indices().iter().enumerate() {
                if s < 0 {
                    continue;
                }
                if s / cap >= blocks {
                    fx.skips.slot_out_of_range += 1;
                    continue;
                }
                fx.ring.push(((s / cap) as usize, (s % cap) as usize, i));
            }
        }
    }
    fx
}

// ---- where things live --------------------------------------------------------------

/// Byte ranges of the record of `slot` (values, then scales if any).
#[allow(clippy::single_range_in_vec_init)]
fn record_ranges(cache: &Buf, order: RecordOrder, slot: i64) -> Vec<Range<usize>> {
    let d = cache.desc;
    let bs = d.shape()[1];
    let (block, row) = (slot as usize / bs, slot as usize % bs);
    match d.dtype {
        DType::U8 => {
            let l = RecordLayout::from_record_width(d.shape()[2]).expect("paged width");
            let (v, s) = (l.value_bytes(), l.scale_bytes());
            let page = d.offset + block * d.strides()[0];
            let (vo, so) = order.record_offsets(l, bs, row);
            vec![page + vo..page + vo + v, page + so..page + so + s]
        }
        dt => {
            let o = cache.offset_of(&[block, row]);
            vec![o..o + 512 * dt.size()]
        }
    }
}

fn layout_of(cache: &Buf) -> RecordLayout {
    match cache.desc.dtype {
        DType::U8 => RecordLayout::from_record_width(cache.desc.shape()[2]).expect("paged width"),
        DType::BF16 => RecordLayout::Bf16Rows,
        _ => RecordLayout::Fp8Rows,
    }
}

/// The record of `slot` read from cache bytes: (values, scales).
fn record_of(cache: &Buf, order: RecordOrder, bytes: &[u8], slot: i64) -> (Vec<u8>, Vec<u8>) {
    let r = record_ranges(cache, order, slot);
    let v = bytes[r[0].clone()].to_vec();
    let s = r.get(1).map_or(vec![], |s| bytes[s.clone()].to_vec());
    (v, s)
}

/// `n` different slots of `cache`, at random.
fn distinct_slots(rng: &mut Prng, cache: &CacheSpec, n: usize) -> Vec<i64> {
    let slots = rng.distinct(cache.capacity(), n);
    slots.into_iter().map(|s| s as i64).collect()
}

impl Effects {
    /// The bytes of `latent_out` the launch writes.
    fn latent_bytes(&self, latent: &Buf) -> Vec<Range<usize>> {
        self.latents
            .iter()
            .map(|&t| latent_range(latent, t))
            .collect()
    }

    /// The bytes of `kv_cache` the launch writes.
    fn record_bytes(&self, cache: &Buf, order: RecordOrder) -> Vec<Range<usize>> {
        let slots = self.records.iter().map(|&(_, s)| s);
        slots.flat_map(|s| record_ranges(cache, order, s)).collect()
    }

    /// The bytes of `state_cache` the launch writes.
    fn ring_bytes(&self, ring: &Buf) -> Vec<Range<usize>> {
        let rows = self.ring.iter().map(|&(b, r, _)| (b, r));
        rows.map(|(b, r)| ring_range(ring, b, r)).collect()
    }
}

fn latent_range(latent: &Buf, t: usize) -> Range<usize> {
    let o = latent.offset_of(&[t, 0]);
    o..o + 1024
}

fn ring_range(ring: &Buf, block: usize, row: usize) -> Range<usize> {
    let o = ring.offset_of(&[block, row, 0]);
    o..o + 4096
}

/// The bytes of source row `i` of a ring copy (`kv_score` or `rows`).
fn source_row(c: &Case, i: usize) -> Vec<u8> {
    let src = if c.kind.op == Op::SaveRingRows {
        &c.rows
    } else {
        &c.kv_score
    };
    let src = src.as_ref().expect("source");
    let o = src.offset_of(&[i, 0]);
    src.bytes[o..o + 4096].to_vec()
}

/// Asserts that `after` equals `before` outside `allowed`.
fn unchanged_outside(
    what: &str,
    name: &str,
    before: &[u8],
    after: &[u8],
    allowed: &[Range<usize>],
) {
    assert_eq!(before.len(), after.len());
    let mut mask = vec![false; before.len()];
    for r in allowed {
        mask[r.clone()].iter_mut().for_each(|m| *m = true);
    }
    for i in 0..before.len() {
        if !mask[i] && before[i] != after[i] {
            panic!(
                "{name}: {what} byte {i} changed ({:#04x} -> {:#04x}) outside every expected write",
                before[i], after[i]
            );
        }
    }
}

// ---- the reference's input to the rotation -------------------------------------------

/// The cos/sin row the insert of a token at `pos` uses, as f32.
fn cos_sin_of(c: &Case, pos: i64) -> ([f32; 32], [f32; 32]) {
    let t = c.cos_sin_cache.as_ref().expect("cos");
    let cr = c.compress_ratio as i64;
    let base = ((pos / cr) * cr) as usize;
    let row: Vec<f32> = match t.desc.dtype {
        DType::BF16 => t.u16_row(base).into_iter().map(bf16_to_f32).collect(),
        // `half` decodes F16 independently of the crate's twin.
        DType::F16 => t
            .u16_row(base)
            .into_iter()
            .map(|b| half::f16::from_bits(b).to_f32())
            .collect(),
        _ => t.f32_row(base),
    };
    let mut cs = [0.0; 32];
    let mut sn = [0.0; 32];
    cs.copy_from_slice(&row[..32]);
    sn.copy_from_slice(&row[32..64]);
    (cs, sn)
}

/// GPT-J RoPE as `semantics.md` writes it: `r[2k] = fma(e, c, -f32(o s))`,
/// `r[2k+1] = fma(o, c, f32(e s))`, with `(c, s) = (1, 0)` for `k < 224`.
fn rotate_spec(x: &[f32], cos: &[f32; 32], sin: &[f32; 32]) -> Vec<f32> {
    let mut r = vec![0.0f32; 512];
    for k in 0..256 {
        let (c, s) = if k >= 224 {
            (cos[k - 224], sin[k - 224])
        } else {
            (1.0, 0.0)
        };
        let (e, o) = (x[2 * k], x[2 * k + 1]);
        r[2 * k] = e.mul_add(c, -(o * s));
        r[2 * k + 1] = o.mul_add(c, e * s);
    }
    r
}

/// The insert's input latent of token `t`, as f32.
fn latent_of(c: &Case, t: usize) -> Vec<f32> {
    c.latent
        .as_ref()
        .expect("latent")
        .u16_row(t)
        .into_iter()
        .map(bf16_to_f32)
        .collect()
}

// ---- 1. canary -------------------------------------------------------------------------

fn check_canary(c: &Case) {
    let out = run(c);
    let fx = model(c);
    assert_eq!(out.skips, fx.skips, "{}: skip counts", c.name);
    if let (Some(l), Some(after)) = (&c.latent, &out.latent) {
        let allowed = fx.latent_bytes(l);
        unchanged_outside("latent_out", &c.name, &l.bytes, after, &allowed);
        for r in allowed {
            assert_ne!(
                after[r.clone()],
                l.bytes[r.clone()],
                "{}: latent row at {r:?} not written",
                c.name
            );
        }
    }
    if let (Some(k), Some(after)) = (&c.kv_cache, &out.kv_cache) {
        let allowed = fx.record_bytes(k, c.kind.record_order);
        unchanged_outside("kv_cache", &c.name, &k.bytes, after, &allowed);
        for &(t, s) in &fx.records {
            let (v0, s0) = record_of(k, c.kind.record_order, &k.bytes, s);
            let (v1, s1) = record_of(k, c.kind.record_order, after, s);
            assert!(
                v0 != v1 || s0 != s1,
                "{}: record of token {t} (slot {s}) not written",
                c.name
            );
        }
    }
    if let (Some(ring), Some(after)) = (&c.state_cache, &out.state_cache) {
        let allowed = fx.ring_bytes(ring);
        unchanged_outside("state_cache", &c.name, &ring.bytes, after, &allowed);
        // Each copied row holds the bytes of its last writer.
        for (i, &(b, r, src)) in fx.ring.iter().enumerate() {
            if fx.ring[i + 1..]
                .iter()
                .any(|&(b2, r2, _)| (b2, r2) == (b, r))
            {
                continue;
            }
            assert_eq!(
                after[ring_range(ring, b, r)],
                source_row(c, src)[..],
                "{}: ring row ({b}, {r})",
                c.name
            );
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, failure_persistence: None, ..ProptestConfig::default() })]

    /// Property 1: every byte that no selected token owns keeps its canary
    /// (or, for the ring, its previous value), for every op, layout, ratio,
    /// with adversarial values and out-of-range indices; the selected tokens
    /// do write, and the skip counts match the rules.
    #[test]
    fn canary_only_selected_tokens_write(case in case_strategy(kind_strategy(
        vec![Op::FusedSaveCompressNorm, Op::RopeQuantInsert, Op::SaveRingRows, Op::FusedCompressInsert],
        true,
        true,
    ))) {
        check_canary(&case);
    }
}

#[test]
fn canary_holds_for_every_kind_and_adversarial_case() {
    for (i, k) in all_kinds().into_iter().enumerate() {
        for w in [false, true] {
            let mut k = k;
            k.wild_indices = w;
            k.special_values = w;
            check_canary(&random_case(0xC0FFEE + i as u64, k));
        }
    }
    for c in adversarial_cases() {
        check_canary(&c);
    }
}

// ---- 2. chunked prefill ----------------------------------------------------------------

/// One request of a chunked-prefill scenario and how its tokens are split.
#[derive(Clone, Debug)]
struct Req {
    block: usize,
    start_pos: i64,
    /// Lengths of consecutive chunks (some may be 0), summing to the tokens.
    splits: Vec<usize>,
}

#[derive(Clone, Debug)]
struct Prefill {
    reqs: Vec<Req>,
    cap: usize,
    blocks: usize,
    seed: u64,
    index_i64: bool,
}

fn prefill_strategy() -> impl Strategy<Value = Prefill> {
    (1usize..=3, 1usize..=4, any::<u64>(), any::<bool>())
        .prop_flat_map(|(nreq, cap, seed, index_i64)| {
            let req = (0i64..9, proptest::collection::vec(0usize..5, 1..5));
            (
                proptest::collection::vec(req, nreq),
                Just(cap),
                Just(seed),
                Just(index_i64),
                0usize..2,
            )
        })
        .prop_map(|(reqs, cap, seed, index_i64, extra_blocks)| {
            let n = reqs.len();
            let mut rng = Prng::new(seed);
            let blocks = rng.distinct(n + extra_blocks, n);
            Prefill {
                reqs: reqs
                    .into_iter()
                    .zip(blocks)
                    .map(|((start_pos, splits), block)| Req {
                        block,
                        start_pos,
                        splits,
                    })
                    .collect(),
                cap,
                blocks: n + extra_blocks,
                seed,
                index_i64,
            }
        })
}

/// The compressor spec packing, for each request, tokens `lo..hi` of it.
fn prefill_spec(
    p: &Prefill,
    rows: &[Vec<Vec<f32>>],
    ranges: &[Range<usize>],
    weight: &[u16],
    ring: &RingSpec,
    geo: Geo,
) -> CompressSpec {
    let chunks: Vec<Chunk> = p
        .reqs
        .iter()
        .zip(ranges)
        .map(|(r, rg)| Chunk {
            block: r.block,
            start_pos: r.start_pos + rg.start as i64,
            len: rg.len(),
        })
        .collect();
    let (positions, slots, qsl, ttr) = pack_chunks(&chunks, p.cap);
    let kv: Vec<f32> = rows
        .iter()
        .zip(ranges)
        .flat_map(|(rr, rg)| rr[rg.clone()].iter().flatten().copied())
        .collect();
    CompressSpec {
        cr: 2,
        eps: 1e-6,
        kv,
        kv_row_pad: 16,
        positions,
        slots,
        qsl,
        ttr,
        weight: weight.to_vec(),
        weight_dtype: DType::BF16,
        ring: Some(ring.clone()),
        prev: None,
        index_i64: p.index_i64,
        geo,
    }
}

/// Latent bytes per (request, token) of a compress output.
fn latents_by_token(
    c: &Case,
    out: &Outputs,
    ranges: &[Range<usize>],
) -> Vec<(usize, usize, Vec<u8>)> {
    let l = c.latent.as_ref().expect("latent");
    let bytes = out.latent.as_ref().expect("latent out");
    let mut t = 0;
    let mut v = Vec::new();
    for (r, rg) in ranges.iter().enumerate() {
        for i in rg.clone() {
            v.push((r, i, bytes[latent_range(l, t)].to_vec()));
            t += 1;
        }
    }
    v
}

fn check_prefill(p: &Prefill) {
    let mut rng = Prng::new(p.seed);
    let rows: Vec<Vec<Vec<f32>>> = p
        .reqs
        .iter()
        .map(|r| {
            let total: usize = r.splits.iter().sum();
            (0..total)
                .map(|_| {
                    let mut v = vec![0.0f32; 1024];
                    fill_kv_rows(&mut rng, &mut v, false);
                    v
                })
                .collect()
        })
        .collect();
    let w = weight(&mut rng);
    let ring0 = RingSpec::random(&mut rng, p.blocks, p.cap, false);
    let geo = Geo {
        offset: 64,
        tail: 16,
    };

    // One call with every request's whole chunk.
    let whole: Vec<Range<usize>> = rows.iter().map(|r| 0..r.len()).collect();
    let one = compress_case(
        "prefill whole",
        &prefill_spec(p, &rows, &whole, &w, &ring0, geo),
        false,
    );
    let one_out = run(&one);
    let mut want = latents_by_token(&one, &one_out, &whole);

    // One call per split index, the ring carried from call to call.
    let calls = p.reqs.iter().map(|r| r.splits.len()).max().unwrap_or(0);
    let mut ring_bytes = one.state_cache.as_ref().expect("ring").bytes.clone();
    let mut got = Vec::new();
    let mut done = vec![0usize; p.reqs.len()];
    for k in 0..calls {
        let ranges: Vec<Range<usize>> = p
            .reqs
            .iter()
            .zip(done.iter_mut())
            .map(|(r, d)| {
                let len = r.splits.get(k).copied().unwrap_or(0);
                let rg = *d..*d + len;
                *d += len;
                rg
            })
            .collect();
        let mut c = compress_case(
            &format!("prefill call {k}"),
            &prefill_spec(p, &rows, &ranges, &w, &ring0, geo),
            false,
        );
        c.state_cache
            .as_mut()
            .expect("ring")
            .bytes
            .clone_from(&ring_bytes);
        let out = run(&c);
        got.extend(latents_by_token(&c, &out, &ranges));
        ring_bytes = out.state_cache.expect("ring out");
    }
    want.sort();
    got.sort();
    assert_eq!(want.len(), got.len());
    for (a, b) in want.iter().zip(&got) {
        assert_eq!((a.0, a.1), (b.0, b.1));
        assert!(
            a.2 == b.2,
            "{p:?}: latent of request {} token {} differs",
            a.0,
            a.1
        );
    }
    assert!(
        ring_bytes == one_out.state_cache.expect("ring"),
        "{p:?}: final ring differs"
    );
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1000, failure_persistence: None, ..ProptestConfig::default() })]

    /// Property 2: for any requests packed together and any split of each
    /// request's tokens into consecutive chunks (one call per chunk, empty
    /// chunks included, the ring carrying state), the latents and the final
    /// ring equal those of one call with every whole chunk.
    #[test]
    fn cr2_chunked_prefill_equals_one_chunk(p in prefill_strategy()) {
        check_prefill(&p);
    }
}

// ---- 3. prev_rows + save_ring_rows == ring path ----------------------------------------

fn check_prev_rows_path(seed: u64, index_i64: bool) {
    let mut kind = Kind::new(Op::FusedSaveCompressNorm, 2, RecordLayout::V4);
    kind.index_i64 = index_i64;
    let ring_case0 = random_case(seed, kind);
    let ring_out = run(&ring_case0);

    // The same launch, each chunk's predecessor handed in through prev_rows
    // (a copy of the ring row it would read), or -1 to read the ring.
    let mut rng = Prng::new(seed ^ 0xFEED);
    let c = &ring_case0;
    let ring = c.state_cache.as_ref().expect("ring");
    let (cap, qsl, pos, slots) = (
        ring.desc.shape()[1] as i64,
        c.query_start_loc.as_ref().expect("qsl").indices(),
        c.positions.as_ref().expect("pos").indices(),
        c.slot_mapping.indices(),
    );
    let n = c.n();
    let nreq = qsl.len() - 1;
    let mut prev_rows: Vec<f32> = Vec::new();
    let mut idx = vec![-1i64; nreq];
    let mut order: Vec<usize> = (0..nreq).collect();
    rng.shuffle(&mut order);
    for r in order {
        let start = qsl[r] as usize;
        if start >= qsl[r + 1] as usize || slots[start] < 0 || pos[start] < 1 || rng.chance(0.25) {
            continue;
        }
        let block = (slots[start] / cap) as usize;
        let row = ((pos[start] - 1) % cap) as usize;
        let o = ring.offset_of(&[block, row, 0]);
        let bytes = &ring.bytes[o..o + 4096];
        // A decoy row first, so indices are not simply 0..
        let mut decoy = vec![0.0f32; 1024];
        fill_kv_rows(&mut rng, &mut decoy, false);
        prev_rows.extend(decoy);
        idx[r] = (prev_rows.len() / 1024) as i64;
        prev_rows.extend(
            bytes
                .chunks(4)
                .map(|b| f32::from_le_bytes(b.try_into().expect("4"))),
        );
    }
    if prev_rows.is_empty() {
        prev_rows = vec![1.0; 1024];
    }
    let mut pc = c.clone();
    pc.kind.prev_rows = true;
    let pr = prev_rows.len() / 1024;
    pc.prev_rows = Some(Buf::f32_rows(&prev_rows, pr, 1024, 1024 + 16, 0, 0));
    pc.prev_row_indices = Some(Buf::index(&idx, index_i64, 0, 8));
    let prev_out = run(&pc);
    assert_eq!(
        prev_out.latent, ring_out.latent,
        "seed {seed:#x}: latents of the prev_rows path"
    );
    assert_eq!(
        prev_out.state_cache.as_ref(),
        Some(&ring.bytes),
        "seed {seed:#x}: prev_rows path must leave the ring"
    );

    // save_ring_rows with the rows the ring path stores: the last
    // min(len, capacity) tokens of each chunk whose first slot is valid.
    let mut ring_slots = vec![-1i64; n];
    for r in 0..nreq {
        let (start, end) = (qsl[r], qsl[r + 1].min(n as i64));
        if start >= end || slots[start as usize] < 0 {
            continue;
        }
        for u in start.max(end - cap)..end {
            ring_slots[u as usize] = slots[u as usize];
        }
    }
    let kv = c.kv_score.as_ref().expect("kv");
    let rows: Vec<f32> = (0..n).flat_map(|t| kv.f32_row(t)).collect();
    let dummy = RingSpec {
        blocks: 1,
        cap: 1,
        data: vec![0.0; 1024],
        row_pad: 0,
        block_pad: 0,
    };
    let mut sc = ring_case(
        "save_ring_rows",
        &rows,
        0,
        &ring_slots,
        &dummy,
        index_i64,
        Geo::PLAIN,
        false,
    );
    sc.state_cache = Some(ring.clone());
    let save_out = run(&sc);
    assert_eq!(
        save_out.state_cache, ring_out.state_cache,
        "seed {seed:#x}: ring after save_ring_rows"
    );
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1000, failure_persistence: None, ..ProptestConfig::default() })]

    /// Property 3: `fused_save_compress_norm` with `prev_rows` (each chunk's
    /// predecessor given, or -1 to read the ring) followed by
    /// `save_ring_rows` of the rows the ring path stores gives the same
    /// latents and the same ring as the ring path.
    #[test]
    fn prev_rows_then_save_ring_rows_equals_ring_path(seed in any::<u64>(), i64 in any::<bool>()) {
        check_prev_rows_path(seed, i64);
    }
}

// ---- 4. decode(insert(x)) error bounds ---------------------------------------------------

/// Finite latents over a wide dynamic range: each 32-dim block has its own
/// magnitude (2^-40 .. 2^40) and spread (up to 2^±12), with zeros, signed
/// zeros and BF16 subnormals mixed in, so that FP8 elements land in the
/// e4m3 subnormal range too. Magnitudes stay far from the BF16 maximum: the
/// decoded f32 of a block near it overflows (256 * 2^120 = 2^128), see the
/// report in `decode_near_bf16_max_overflows_f32`.
fn wide_latent(rng: &mut Prng) -> Vec<u16> {
    let mut v = Vec::with_capacity(512);
    for _ in 0..16 {
        let center = rng.range(-40, 40) as i32;
        let spread = rng.range(0, 12) as i32;
        for _ in 0..32 {
            let x = match rng.below(40) {
                0 => 0x0000,
                1 => 0x8000,
                2 => 0x0001 + rng.below(0x7f) as u16,
                _ => dsv4_kvcache::formats::bf16_from_f32(
                    rng.f32_exp(center - spread, center + spread),
                ),
            };
            v.push(x);
        }
    }
    v
}

fn wide_insert_case(seed: u64, layout: RecordLayout, cr: u32, cos_dtype: DType) -> Case {
    let mut rng = Prng::new(seed);
    let n = 1 + rng.below(4);
    let latent: Vec<u16> = (0..n).flat_map(|_| wide_latent(&mut rng)).collect();
    let positions: Vec<i64> = (0..n).map(|_| rng.range(0, 15) | (cr as i64 - 1)).collect();
    let mut cache = CacheSpec::random(&mut rng, layout, n);
    cache.fp8_scale = rng.pick(&[
        1.0,
        2f32.powi(-20),
        2f32.powi(20),
        0.37,
        13.0,
        2f32.powi(-8),
    ]);
    let slots = distinct_slots(&mut rng, &cache, n);
    let spec = InsertSpec {
        cr,
        latent,
        positions,
        slots,
        cos_sin: CosSinSpec::rotations(&mut rng, 16, cos_dtype),
        cache,
        index_i64: false,
        geo: Geo::PLAIN,
    };
    insert_case(
        &format!("wide {} seed {seed:#x}", layout.name()),
        &spec,
        false,
    )
}

/// Half the spacing of the e2m1 grid around `a >= 0` (the largest rounding
/// error of a magnitude `a` within the grid), or the excess over 6 when `a`
/// saturates.
fn e2m1_err(a: f64) -> f64 {
    if a <= 2.0 {
        0.25
    } else if a <= 4.0 {
        0.5
    } else if a <= 6.0 {
        1.0
    } else {
        a - 6.0
    }
}

/// Checks one decoded record against the rotation `r` (and, for V4's NoPE
/// part, the unrotated latent `x`). The bounds, per element:
///
/// - FP8 blocks (V4 NoPE with `x`, MXFP8 with `r`), block scale `2^e` read
///   from the record's UE8M0 byte: `v = r 2^-e` is exact (power of two),
///   `|v| <= 448` up to the clamp, and e4m3 rounds with a relative error of
///   at most `2^-4` (3 mantissa bits) in its normal range and an absolute
///   error of at most `2^-10` (half of the subnormal step `2^-9`) below
///   `2^-6`. So `|d - r| <= max(|r| 2^-4, 2^(e-10))`. The clamp only removes
///   what `log2f` rounding leaves above 448 (a few f32 ulps), far inside the
///   bound. We also check the scale is the smallest power of two that keeps
///   the block within 448 (up to that rounding).
/// - NVFP4 tile scale `S` (the record's e4m3 byte), `q = f32(r / S)`: the
///   e2m1 grid has spacing 0.5 up to 2, 1 up to 4, 2 up to 6, and saturates
///   at 6, so `|d - r| <= S * e2m1_err(|q|) + |r| 2^-22` (the last term for
///   the division's rounding). Record-independent: `S` is `t = amax / 6`
///   rounded to e4m3 and clamped to `[2^-9, 448]`, so `|S - t|` is at most
///   `t 2^-4` (normal e4m3) or `2^-10` (subnormal e4m3, `t < 2^-6`). An
///   element saturates (`|q| > 6`) only when `S < t`, and then errs by at
///   most `amax - 6 S = 6 (t - S)`: under `S` in the normal range
///   (`6 t 2^-4 < S`), but up to `6 * 2^-10 = 3 * 2^-9` in the subnormal
///   range (`t` just under `1.5 * 2^-9` rounds down to `S = 2^-9`, so
///   `q` reaches 9). Unsaturated elements err by at most `S` (half the
///   widest e2m1 spacing, 2, times `S`). So whenever `amax / 6 <= 448`:
///   `|d - r| <= max(S, 6 * 2^-10)`, roughly `max(amax / 6, 2^-7.4)`.
/// - BF16 (V4 RoPE part, BF16 rows): round to nearest with an 8-bit
///   significand: `|d - r| <= max(|r| 2^-8, 2^-134)`. (Not `2^-9`: the tie
///   `1 + 2^-8` rounds to 1, an error of `2^-8 / (1 + 2^-8)` relative; see
///   `bf16_relative_error_reaches_2_pow_minus_8`.)
/// - FP8 rows with scale `fs`: `b = bf16(r)`, `v = b / fs`; if `|v| >= 448`
///   the byte saturates and `d = ±448 fs` exactly; otherwise
///   `|d - r| <= |r| 2^-8 + fs max(|v| 2^-4, 2^-10) + |r| 2^-20 + 2^-140`
///   (bf16 rounding, e4m3 rounding, then the reciprocal's, the product's and
///   the decode's roundings).
fn check_bounds(
    name: &str,
    layout: RecordLayout,
    x: &[f32],
    r: &[f32],
    values: &[u8],
    scales: &[u8],
    fs: f32,
) {
    let d = decode_record(layout, values, scales, fs);
    let fail = |i: usize, bound: f64, extra: &str| {
        panic!(
            "{name}: {} dim {i}: r = {:e} (x = {:e}) decoded {:e}, error {:e} above bound {:e} {extra}",
            layout.name(),
            r[i],
            x[i],
            d[i],
            (d[i] as f64 - r[i] as f64).abs(),
            bound
        )
    };
    let fp8_block = |i0: usize, len: usize, src: &[f32], sbyte: u8| {
        let e = sbyte as i32 - 127;
        let amax = src[i0..i0 + len]
            .iter()
            .fold(0.0f64, |m, &v| m.max((v as f64).abs()));
        let floor = (dsv4_kvcache::math::AMAX_FLOOR as f64).max(amax) / 448.0;
        // Smallest power of two covering the block (up to log2f rounding).
        assert!(
            2f64.powi(e) * (1.0 + 1e-6) >= floor,
            "{name}: scale 2^{e} below amax {amax:e} / 448"
        );
        assert!(
            2f64.powi(e - 1) < floor * (1.0 + 1e-6),
            "{name}: scale 2^{e} not the smallest for amax {amax:e}"
        );
        for i in i0..i0 + len {
            let bound = ((src[i] as f64).abs() * 2f64.powi(-4)).max(2f64.powi(e - 10));
            if (d[i] as f64 - src[i] as f64).abs() > bound {
                fail(i, bound, &format!("(block scale 2^{e})"));
            }
        }
    };
    let bf16_bound = |i: usize, v: f32| {
        let bound = ((v as f64).abs() * 2f64.powi(-8)).max(2f64.powi(-134));
        if (d[i] as f64 - v as f64).abs() > bound {
            fail(i, bound, "(bf16)");
        }
    };
    match layout {
        RecordLayout::V4 => {
            for b in 0..7 {
                fp8_block(64 * b, 64, x, scales[b]);
            }
            assert_eq!(scales[7], 0, "{name}: V4 padding scale byte");
            for i in 448..512 {
                bf16_bound(i, r[i]);
            }
        }
        RecordLayout::Mxfp8 => {
            for b in 0..16 {
                fp8_block(32 * b, 32, r, scales[b]);
            }
        }
        RecordLayout::Nvfp4 => {
            for t in 0..32 {
                let s = e4m3_to_f32(scales[t]);
                let amax = r[16 * t..16 * t + 16]
                    .iter()
                    .fold(0.0f64, |m, &v| m.max((v as f64).abs()));
                let want = (amax / 6.0).clamp(2f64.powi(-9), 448.0);
                let tol = (want * 2f64.powi(-4)).max(2f64.powi(-10)) * (1.0 + 1e-6);
                assert!(
                    (s as f64 - want).abs() <= tol,
                    "{name}: tile {t} scale {s:e} for amax {amax:e}"
                );
                for i in 16 * t..16 * t + 16 {
                    let q = r[i] / s;
                    let bound = s as f64 * e2m1_err((q as f64).abs())
                        + (r[i] as f64).abs() * 2f64.powi(-22);
                    if (d[i] as f64 - r[i] as f64).abs() > bound {
                        fail(i, bound, &format!("(tile scale {s:e})"));
                    }
                    if amax / 6.0 <= 448.0 {
                        let coarse = (s as f64).max(6.0 * 2f64.powi(-10)) * (1.0 + 2f64.powi(-20));
                        assert!(
                            (d[i] as f64 - r[i] as f64).abs() <= coarse,
                            "{name}: dim {i} beyond max(tile scale, 6 * 2^-10)"
                        );
                    }
                }
            }
        }
        RecordLayout::Bf16Rows => {
            for i in 0..512 {
                bf16_bound(i, r[i]);
            }
        }
        RecordLayout::Fp8Rows => {
            let fs64 = fs as f64;
            for i in 0..512 {
                let b = half::bf16::from_f32(r[i]).to_f64();
                let v = b / fs64;
                let err = (d[i] as f64 - r[i] as f64).abs();
                if v.abs() >= 448.0 * (1.0 + 2f64.powi(-20)) {
                    assert_eq!(
                        d[i],
                        (448.0f32 * fs).copysign(r[i]),
                        "{name}: dim {i} saturates"
                    );
                    continue;
                }
                let ra = (r[i] as f64).abs();
                let bound = ra * 2f64.powi(-8)
                    + fs64 * (v.abs() * 2f64.powi(-4)).max(2f64.powi(-10)) * (1.0 + 2f64.powi(-20))
                    + ra * 2f64.powi(-20)
                    + 2f64.powi(-140);
                if err > bound {
                    fail(i, bound, &format!("(fp8_scale {fs:e})"));
                }
            }
        }
    }
}

fn check_decode(c: &Case) {
    let out = run(c);
    let cache = c.kv_cache.as_ref().expect("cache");
    let layout = layout_of(cache);
    let fs = c.fp8_scale.as_ref().map_or(1.0, scalar_f32);
    let pos = c.positions.as_ref().expect("pos").indices();
    for (t, &slot) in c.slot_mapping.indices().iter().enumerate() {
        let x = latent_of(c, t);
        let (cs, sn) = cos_sin_of(c, pos[t]);
        let r = rotate_spec(&x, &cs, &sn);
        assert!(
            r.iter().all(|v| v.is_finite()),
            "{}: finite rotation expected",
            c.name
        );
        let (v, s) = record_of(
            cache,
            c.kind.record_order,
            out.kv_cache.as_ref().expect("cache out"),
            slot,
        );
        check_bounds(&c.name, layout, &x, &r, &v, &s, fs);
    }
}

/// The single F32 of `fp8_scale`.
fn scalar_f32(b: &Buf) -> f32 {
    let o = b.desc.offset;
    f32::from_le_bytes(b.bytes[o..o + 4].try_into().expect("4"))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1500, failure_persistence: None, ..ProptestConfig::default() })]

    /// Property 4: decoding an inserted record gives back the rotated latent
    /// within the layout's bound (see `check_bounds`), per element, for
    /// finite latents over a wide dynamic range.
    #[test]
    fn decode_of_insert_is_within_the_layout_bound(
        seed in any::<u64>(),
        layout in proptest::sample::select(RecordLayout::ALL.to_vec()),
        cr in 1u32..=2,
        cos_dtype in proptest::sample::select(INPUT_FLOATS.to_vec()),
    ) {
        check_decode(&wide_insert_case(seed, layout, cr, cos_dtype));
    }
}

#[test]
fn decode_bounds_hold_on_adversarial_finite_latents() {
    // The adversarial rows that are finite and stay far from the BF16 max.
    for (name, row) in adversarial_latents() {
        let fin = row
            .iter()
            .all(|&h| (h & 0x7f80) != 0x7f80 && (h & 0x7fff) < 0x7f00);
        if !fin {
            continue;
        }
        for layout in RecordLayout::ALL {
            for cos_dtype in INPUT_FLOATS {
                let mut rng = Prng::new(7);
                let spec = InsertSpec {
                    cr: 1,
                    latent: row.clone(),
                    positions: vec![3],
                    slots: vec![1],
                    cos_sin: adversarial_cos_sin(cos_dtype),
                    cache: CacheSpec::random(&mut rng, layout, 2),
                    index_i64: false,
                    geo: Geo::PLAIN,
                };
                check_decode(&insert_case(
                    &format!("{name} {}", layout.name()),
                    &spec,
                    false,
                ));
            }
        }
    }
}

/// The BF16 bound of the brief (`2^-9` relative) is too tight: a BF16 value
/// has 8 significant bits, so round to nearest errs by up to half an ulp,
/// `2^-8` relative to the binade's bottom; `1 + 2^-8` (a tie, rounded to the
/// even 1) errs by `2^-8 / (1 + 2^-8) > 2^-9` relative.
#[test]
fn bf16_relative_error_reaches_2_pow_minus_8() {
    let x = 1.0f32 + 2f32.powi(-8);
    let d = bf16_to_f32(dsv4_kvcache::formats::bf16_from_f32(x));
    let rel = (d as f64 - x as f64).abs() / x as f64;
    assert!(
        rel > 2f64.powi(-9) && rel <= 2f64.powi(-8),
        "relative error {rel:e}"
    );
}

/// Not a defect of the encoder: a block whose largest value is near the
/// BF16 maximum gets scale `2^120` and element `256` (255 rounds up), and
/// `256 * 2^120 = 2^128` is not an f32, so `decode_record` returns `inf`.
/// Property 4 keeps its latents far from there.
#[test]
fn decode_near_bf16_max_overflows_f32() {
    let mut lat = [0u16; 512];
    lat[0] = 0x7f7f;
    let rec = dsv4_kvcache::reference::encode_record(
        RecordLayout::Mxfp8,
        &lat,
        &[1.0; 32],
        &[0.0; 32],
        false,
        1.0,
    );
    assert_eq!((rec.values[0], rec.scales[0]), (0x78, 247));
    let d = decode_record(
        RecordLayout::Mxfp8,
        &rec.values[..512],
        &rec.scales[..16],
        1.0,
    );
    assert_eq!(d[0], f32::INFINITY);
}

// ---- 5. NaN and infinity ------------------------------------------------------------------

const NAN_E4M3: [u8; 2] = [0x7f, 0xff];

fn is_bf16_nan(h: u16) -> bool {
    (h & 0x7fff) > 0x7f80
}

fn is_bf16_inf(h: u16) -> bool {
    (h & 0x7fff) == 0x7f80
}

/// [`check_fp8_block_specials`] on every `width`-element block of `src`
/// and `bytes`, block `b` with scale byte `scales[b]`.
fn check_fp8_blocks(
    name: &str,
    src: &[f32],
    bytes: &[u8],
    scales: &[u8],
    width: usize,
    nan_to_zero: bool,
    sanitize: bool,
) {
    assert_eq!(src.len(), bytes.len(), "{name}: elements and codes");
    assert!(
        scales.len() >= src.len().div_ceil(width),
        "{name}: scale count"
    );
    let blocks = src.chunks(width).zip(bytes.chunks(width));
    for ((src, bytes), &scale) in blocks.zip(scales) {
        check_fp8_block_specials(name, src, bytes, scale, nan_to_zero, sanitize);
    }
}

/// No e4m3 NaN byte among `codes`; under sanitizing no UE8M0 255 scale.
fn assert_no_fp8_nan(name: &str, codes: &[u8], scales: &[u8], sanitize: bool) {
    assert!(
        !codes.iter().any(|b| NAN_E4M3.contains(b)),
        "{name}: e4m3 NaN byte"
    );
    if sanitize {
        assert!(!scales.contains(&255), "{name}: UE8M0 255 under sanitizing");
    }
}

/// Expected bytes of an FP8 block (`src` = the quantized vector) for its
/// special elements, per `semantics.md`: with an infinity in the block the
/// scale byte is 255 (254 sanitized), infinite and NaN elements give `0x7E`
/// (NaN sanitized to 0 gives `0x00`), finite ones `±0`; without an infinity a
/// NaN element gives `0x7E` (`0x00` when sanitized).
fn check_fp8_block_specials(
    name: &str,
    src: &[f32],
    bytes: &[u8],
    scale: u8,
    nan_to_zero: bool,
    sanitize: bool,
) {
    let has_inf = src.iter().any(|v| v.is_infinite());
    if has_inf {
        assert_eq!(
            scale,
            if sanitize { 254 } else { 255 },
            "{name}: scale of a block with inf"
        );
    } else {
        assert!(scale < 254, "{name}: scale {scale} of a finite block");
    }
    for (i, (&v, &b)) in src.iter().zip(bytes).enumerate() {
        let want = if v.is_nan() {
            Some(if nan_to_zero { 0x00 } else { 0x7e })
        } else if v.is_infinite() {
            Some(0x7e)
        } else if has_inf {
            Some(if v.is_sign_negative() { 0x80 } else { 0x00 })
        } else {
            None
        };
        if let Some(w) = want {
            assert_eq!(b, w, "{name}: element {i} ({v:e}) of a block with specials");
        }
    }
}

fn check_specials(c: &Case) {
    let out = run(c);
    let san = c.kind.sanitize;
    let cache = c.kv_cache.as_ref().expect("cache");
    let layout = layout_of(cache);
    let after = out.kv_cache.as_ref().expect("cache out");
    if layout == RecordLayout::Nvfp4 {
        // Sanitizing cannot change an NVFP4 byte (NaN and +0 both give code
        // 0 and leave the NaN-ignoring amax alone), which is why the kernels
        // skip that pass.
        let mut flipped = c.clone();
        flipped.kind.sanitize = !san;
        assert_eq!(
            run(&flipped).kv_cache.as_deref(),
            Some(after.as_slice()),
            "{}: NVFP4 bytes depend on sanitizing",
            c.name
        );
    }
    let pos = c.positions.as_ref().expect("pos").indices();
    let mut sk = SkipCounts::default();
    for (t, &slot) in c.slot_mapping.indices().iter().enumerate() {
        if !insert_rule(c, slot, pos[t], &mut sk) {
            continue;
        }
        let x = latent_of(c, t);
        let (cs, sn) = cos_sin_of(c, pos[t]);
        let r = rotate_spec(&x, &cs, &sn);
        // The paged layouts sanitize the rotated vector (V4: its RoPE part).
        let rs: Vec<f32> = r
            .iter()
            .map(|&v| if san && v.is_nan() { 0.0 } else { v })
            .collect();
        let (v, s) = record_of(cache, c.kind.record_order, after, slot);
        let name = format!("{} token {t}", c.name);
        // Finite latents small enough that RoPE cannot overflow (see
        // `spec_finite_latent_never_encodes_infinity_` for why the bound).
        let moderate = x.iter().all(|v| v.abs() <= 2f32.powi(126));
        match layout {
            RecordLayout::V4 => {
                // NoPE: quantized from the unrotated latent, never sanitized.
                check_fp8_blocks(&name, &x[..448], &v[..448], &s, 64, false, san);
                assert_eq!(s[7], 0);
                for i in 448..512 {
                    let h = u16::from_le_bytes([v[448 + 2 * (i - 448)], v[449 + 2 * (i - 448)]]);
                    if rs[i].is_nan() {
                        assert_eq!(h, 0x7fff, "{name}: NaN in the RoPE part");
                    } else {
                        assert!(!is_bf16_nan(h), "{name}: NaN encoding from a non-NaN");
                    }
                    if moderate {
                        assert!(!is_bf16_inf(h), "{name}: infinity from a finite latent");
                    }
                }
                assert_no_fp8_nan(&name, &v[..448], &s, san);
            }
            RecordLayout::Mxfp8 => {
                check_fp8_blocks(&name, &rs, &v, &s, 32, san, san);
                assert_no_fp8_nan(&name, &v, &s, san);
            }
            RecordLayout::Nvfp4 => {
                assert!(
                    !s.iter().any(|b| NAN_E4M3.contains(b)),
                    "{name}: e4m3 NaN scale"
                );
                for t in 0..32 {
                    if r[16 * t..16 * t + 16].iter().all(|v| v.is_nan()) {
                        assert_eq!(s[t], 0x01, "{name}: an all-NaN tile gets the 2^-9 scale");
                    }
                }
                for i in 0..512 {
                    let code = if i % 2 == 0 {
                        v[i / 2] & 0xf
                    } else {
                        v[i / 2] >> 4
                    };
                    if rs[i].is_nan() {
                        assert_eq!(code, 0, "{name}: NaN element {i} gives code 0");
                    } else if rs[i].is_infinite() {
                        assert_eq!(
                            code,
                            if rs[i] > 0.0 { 7 } else { 15 },
                            "{name}: inf element {i} saturates"
                        );
                    }
                }
            }
            RecordLayout::Bf16Rows => {
                for i in 0..512 {
                    let h = u16::from_le_bytes([v[2 * i], v[2 * i + 1]]);
                    if r[i].is_nan() {
                        assert_eq!(h, 0x7fff, "{name}: NaN element {i}");
                    }
                }
            }
            RecordLayout::Fp8Rows => {
                for i in 0..512 {
                    if r[i].is_nan() {
                        assert_eq!(v[i], 0x7e, "{name}: NaN element {i}");
                    } else if r[i].is_infinite() {
                        let fs = scalar_f32(c.fp8_scale.as_ref().expect("scale"));
                        let pos_out = (r[i] > 0.0) == (fs > 0.0);
                        assert_eq!(
                            v[i],
                            if pos_out { 0x7e } else { 0xfe },
                            "{name}: inf element {i}"
                        );
                    }
                }
                assert!(
                    !v.iter().any(|b| NAN_E4M3.contains(b)),
                    "{name}: e4m3 NaN byte"
                );
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1500, failure_persistence: None, ..ProptestConfig::default() })]

    /// Property 5: for any latent (NaN `0x7FC0`/`0xFFC0`, ±inf, extremes,
    /// signed zeros sprinkled in), sanitize on or off: no e4m3 NaN byte in
    /// an FP8 part, NaN and inf elements and blocks encode as `semantics.md`
    /// says; with sanitizing no BF16 NaN in V4's RoPE part and no UE8M0 255;
    /// with finite latents (below 2^126 in magnitude, so that RoPE cannot
    /// overflow) no infinity encoding in V4's RoPE part.
    #[test]
    fn nan_and_inf_handling(case in case_strategy(kind_strategy(vec![Op::RopeQuantInsert], true, false))) {
        check_specials(&case);
    }
}

#[test]
fn nan_and_inf_handling_on_adversarial_cases() {
    for c in adversarial_cases() {
        if c.kind.op == Op::RopeQuantInsert {
            check_specials(&c);
        }
    }
}

/// `semantics.md` says that under sanitizing "no infinity encoding" holds
/// for finite latents. It does not (a correction to the spec, reported in
/// the issue notes): RoPE can overflow. A latent pair of BF16
/// values near the maximum (`e = o = 0x7F7F`, 3.39e38) rotated by 45 degrees
/// gives `o c + e s = 4.8e38`, an f32 infinity, which V4's RoPE part
/// encodes as `0x7F80` (the arithmetic the spec prescribes does exactly
/// this, and sanitizing removes only NaN). Likewise a finite rotation at or
/// above `0x7F7F8000` rounds to the BF16 infinity. The claim needs a bound,
/// such as `|latent| < 2^127 / sqrt(2)`.
#[test]
fn finite_latent_near_bf16_max_can_encode_infinity() {
    let mut lat = vec![0x3f80u16; 512];
    lat[510] = 0x7f7f;
    lat[511] = 0x7f7f;
    let mut cs = CosSinSpec::rotations(&mut Prng::new(1), 4, DType::F32);
    for k in 0..32 {
        cs.data[cs.width + k] = std::f32::consts::FRAC_1_SQRT_2;
        cs.data[cs.width + 32 + k] = std::f32::consts::FRAC_1_SQRT_2;
    }
    let spec = InsertSpec {
        cr: 1,
        latent: lat,
        positions: vec![1],
        slots: vec![0],
        cos_sin: cs,
        cache: CacheSpec {
            layout: RecordLayout::V4,
            blocks: 1,
            block_size: 2,
            block_pad_bytes: 0,
            row_pad_bytes: 0,
            rank4: false,
            fp8_scale: 1.0,
        },
        index_i64: false,
        geo: Geo::PLAIN,
    };
    let c = insert_case("finite latent near max", &spec, true);
    let out = run(&c);
    let (v, _) = record_of(
        c.kv_cache.as_ref().expect("cache"),
        c.kind.record_order,
        out.kv_cache.as_ref().expect("out"),
        0,
    );
    let infinite: Vec<usize> = (448..512)
        .filter(|&i| {
            is_bf16_inf(u16::from_le_bytes([
                v[448 + 2 * (i - 448)],
                v[449 + 2 * (i - 448)],
            ]))
        })
        .collect();
    // Exactly the overflowing pair's odd element (o c + e s = 4.8e38).
    assert_eq!(
        infinite,
        vec![511],
        "RoPE overflow of the finite pair (dims 510, 511)"
    );
}

// ---- 6. NoPE identity up to the sign of zero ------------------------------------------------

/// The NoPE dims of a BF16 row, from the latent pair `(e, o)`.
///
/// The NoPE pairs run `r[2k] = fma(e, 1, -(o * 0))` and
/// `r[2k+1] = fma(o, 1, e * 0)`. For finite `o`, `o * 0` is a zero with
/// `o`'s sign bit, so `-(o * 0)` is `-0` when `o`'s sign bit is clear and
/// `+0` when it is set (`o < 0` or `o = -0`). `fma(e, 1, z) = e + z` exactly
/// rounded: for `e != 0` that is `e`; for zeros, IEEE round-to-nearest gives
/// `-0` only for `-0 + -0`, and `+0` otherwise. Hence:
///
/// - even element: changes only when `e = -0` and `o`'s sign bit is set
///   (`o < 0` or `o = -0`): `-0 + +0 = +0`. (`e = +0` stays `+0` for any `o`.)
/// - odd element: `e * 0` is a zero with `e`'s sign bit; changes only when
///   `o = -0` and `e`'s sign bit is clear (`e > 0` or `e = +0`):
///   `-0 + +0 = +0`. With `e = -0` (which compares `>= 0`!) it stays `-0`:
///   the rule is about the sign bit, not about `e >= 0`.
///
/// Every other element is bit-identical to the latent.
fn nope_expected(e: u16, o: u16) -> (u16, u16) {
    let even = if e == 0x8000 && (o & 0x8000) != 0 {
        0x0000
    } else {
        e
    };
    let odd = if o == 0x8000 && (e & 0x8000) == 0 {
        0x0000
    } else {
        o
    };
    (even, odd)
}

fn check_nope_identity(c: &Case) {
    let out = run(c);
    let cache = c.kv_cache.as_ref().expect("cache");
    let after = out.kv_cache.as_ref().expect("cache out");
    let pos = c.positions.as_ref().expect("pos").indices();
    let mut sk = SkipCounts::default();
    let lat = c.latent.as_ref().expect("latent");
    for (t, &slot) in c.slot_mapping.indices().iter().enumerate() {
        if !insert_rule(c, slot, pos[t], &mut sk) {
            continue;
        }
        let x = lat.u16_row(t);
        if x[..448].iter().any(|&h| (h & 0x7f80) == 0x7f80) {
            continue; // finite inputs only (inf * 0 is NaN)
        }
        let (v, _) = record_of(cache, c.kind.record_order, after, slot);
        for k in 0..224 {
            let got = (
                u16::from_le_bytes([v[4 * k], v[4 * k + 1]]),
                u16::from_le_bytes([v[4 * k + 2], v[4 * k + 3]]),
            );
            assert_eq!(
                got,
                nope_expected(x[2 * k], x[2 * k + 1]),
                "{}: token {t} pair {k} from ({:#06x}, {:#06x})",
                c.name,
                x[2 * k],
                x[2 * k + 1]
            );
        }
    }
}

/// Latents rich in signed zeros: every sign-of-zero combination in pairs.
fn zero_rich_case(seed: u64) -> Case {
    let mut rng = Prng::new(seed);
    let n = 1 + rng.below(4);
    let pool = [
        0x0000u16, 0x8000, 0x3f80, 0xbf80, 0x0001, 0x8001, 0x7f7f, 0xff7f, 0x4100, 0xc100,
    ];
    let latent: Vec<u16> = (0..n * 512)
        .map(|_| {
            if rng.chance(0.7) {
                rng.pick(&pool)
            } else {
                dsv4_kvcache::formats::bf16_from_f32(rng.f32_exp(-130, 127))
            }
        })
        .collect();
    let cache = CacheSpec::random(&mut rng, RecordLayout::Bf16Rows, n);
    let slots = distinct_slots(&mut rng, &cache, n);
    let spec = InsertSpec {
        cr: 1,
        latent,
        positions: (0..n).map(|_| rng.range(0, 15)).collect(),
        slots,
        cos_sin: {
            let dtype = if rng.chance(0.5) {
                DType::BF16
            } else {
                DType::F32
            };
            CosSinSpec::rotations(&mut rng, 16, dtype)
        },
        cache,
        index_i64: false,
        geo: Geo::PLAIN,
    };
    insert_case(&format!("zero-rich seed {seed:#x}"), &spec, rng.chance(0.5))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1000, failure_persistence: None, ..ProptestConfig::default() })]

    /// Property 6: the 448 NoPE dims of a BF16 row are the latent's bits,
    /// except the two sign-of-zero changes derived in `nope_expected`.
    #[test]
    fn nope_dims_of_bf16_rows_are_the_latent(seed in any::<u64>(), ordinary in any::<bool>()) {
        if ordinary {
            let mut k = Kind::new(Op::RopeQuantInsert, 1 + (seed % 2) as u32, RecordLayout::Bf16Rows);
            k.special_values = true;
            check_nope_identity(&random_case(seed, k));
        } else {
            check_nope_identity(&zero_rich_case(seed));
        }
    }
}

#[test]
fn nope_sign_of_zero_rule_exhaustive() {
    // Every zero-sign combination against every kind of partner, directly.
    let vals = [0x0000u16, 0x8000, 0x3f80, 0xbf80, 0x0001, 0x8001];
    for &e in &vals {
        for &o in &vals {
            let (a, b) = dsv4_kvcache::math::rope_pair(bf16_to_f32(e), bf16_to_f32(o), 1.0, 0.0);
            let got = (
                dsv4_kvcache::formats::bf16_from_f32(a),
                dsv4_kvcache::formats::bf16_from_f32(b),
            );
            assert_eq!(got, nope_expected(e, o), "pair ({e:#06x}, {o:#06x})");
        }
    }
    // The two changes do happen.
    assert_eq!(nope_expected(0x8000, 0xbf80), (0x0000, 0xbf80));
    assert_eq!(nope_expected(0x8000, 0x8000), (0x0000, 0x8000));
    assert_eq!(nope_expected(0x3f80, 0x8000), (0x3f80, 0x0000));
    assert_eq!(nope_expected(0x0000, 0x8000), (0x0000, 0x0000));
}

// ---- 7. thread count ----------------------------------------------------------------------

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, failure_persistence: None, ..ProptestConfig::default() })]

    /// Property 7: one thread, four threads and the global pool give the
    /// same bytes and the same skip counts, for every op.
    #[test]
    fn results_do_not_depend_on_thread_count(cases in proptest::collection::vec(case_strategy(kind_strategy(
        vec![Op::FusedSaveCompressNorm, Op::RopeQuantInsert, Op::SaveRingRows, Op::FusedCompressInsert],
        true,
        true,
    )), 4)) {
        let mut one = CpuBackend::with_threads(1).expect("pool");
        let mut four = CpuBackend::with_threads(4).expect("pool");
        let mut global = CpuBackend::new();
        for c in &cases {
            let a = run_case_mut(&mut one, c);
            let b = run_case_mut(&mut four, c);
            let g = run_case_mut(&mut global, c);
            prop_assert_eq!(&a, &b, "{}", c.name);
            prop_assert_eq!(&a, &g, "{}", c.name);
        }
    }
}

// ---- 8. fused == compress then insert ----------------------------------------------------

fn check_fused(c: &Case) {
    let fused = run(c);
    let skip = c.kind.skip_latent_out;

    let mut comp = c.clone();
    comp.kind.op = Op::FusedSaveCompressNorm;
    comp.cos_sin_cache = None;
    comp.kv_cache = None;
    comp.fp8_scale = None;
    comp.cache_slot_mapping = None;
    let co = run(&comp);

    let mut ins = c.clone();
    ins.kind.op = Op::RopeQuantInsert;
    let mut latent = c.latent.clone().expect("latent");
    latent.bytes = co.latent.clone().expect("latent out");
    ins.latent = Some(latent);
    ins.slot_mapping = c.cache_slot_mapping.clone().expect("cache slots");
    ins.kv_score = None;
    ins.state_cache = None;
    ins.query_start_loc = None;
    ins.token_to_req_indices = None;
    ins.prev_rows = None;
    ins.prev_row_indices = None;
    ins.rms_norm_weight = None;
    let io = run(&ins);

    assert!(
        fused.kv_cache == io.kv_cache,
        "{}: cache differs from compress then insert",
        c.name
    );
    assert_eq!(fused.state_cache, co.state_cache, "{}: ring", c.name);
    if skip {
        assert_eq!(
            fused.latent.as_ref(),
            Some(&c.latent.as_ref().expect("latent").bytes),
            "{}: latent_out written",
            c.name
        );
    } else {
        assert_eq!(fused.latent, co.latent, "{}: latent_out", c.name);
    }
    let mut sum = co.skips;
    sum.add(io.skips);
    assert_eq!(fused.skips, sum, "{}: skip counts", c.name);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1500, failure_persistence: None, ..ProptestConfig::default() })]

    /// Property 8: with cache and ring slots both valid or both -1, the
    /// fused op writes the same cache, ring and latent bytes (and counts the
    /// same skips) as compress followed by insert; with `skip_latent_out` it
    /// leaves `latent_out` alone.
    #[test]
    fn fused_equals_compress_then_insert(case in case_strategy(kind_strategy(
        vec![Op::FusedCompressInsert],
        true,
        false,
    ))) {
        check_fused(&case);
    }
}

// ---- reported: panics ------------------------------------------------------------------------

/// `semantics.md` (Validation): never a panic. A `query_start_loc` entry
/// below 0 puts token 0 inside a chunk that "starts" before it; reading its
/// older row `kv_score[t - 1]` would be out of bounds (this once panicked in
/// the reference and read out of bounds on the device). Such tokens are
/// skipped and counted like any other out-of-range chunk offset.
#[test]
fn negative_query_start_loc_is_skipped_not_a_panic() {
    let mut rng = Prng::new(3);
    let mut kv = vec![0.0f32; 4 * 1024];
    fill_kv_rows(&mut rng, &mut kv, false);
    let spec = CompressSpec {
        cr: 2,
        eps: 1e-6,
        kv,
        kv_row_pad: 0,
        positions: vec![1, 2, 3, 4],
        slots: vec![1, 0, 1, 0],
        qsl: vec![-4, 4],
        ttr: vec![0, 0, 0, 0],
        weight: weight(&mut rng),
        weight_dtype: DType::BF16,
        ring: Some(RingSpec::random(&mut rng, 1, 2, false)),
        prev: None,
        index_i64: false,
        geo: Geo::PLAIN,
    };
    let c = compress_case("negative query_start_loc", &spec, false);
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        run_case(&CpuBackend::new(), &c)
    }));
    let out = r.expect("the launch panicked");
    assert_eq!(out.result, Ok(()));
    assert!(out.skips.index_out_of_range >= 1);
}
