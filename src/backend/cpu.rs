//! The CPU reference backend: the exact semantics of `semantics.md`,
//! multi-threaded over tokens.
//!
//! Every token's result is computed independently (in parallel), then all
//! writes are applied in token order on one thread, so the bytes do not
//! depend on the thread count (and two tokens writing one slot resolve to
//! the later token).

use super::Backend;
use crate::error::{Error, Result};
use crate::formats::{bf16_to_f32, f16_to_f32};
use crate::gather::{gather_reference, plan_gather, GatherArgs};
use crate::indexer_k::{indexer_k_reference, plan_indexer_k, IndexerKArgs};
use crate::layout::{RecordLayout, DIM};
use crate::ops::{
    plan_compress, plan_fused, plan_insert, plan_ring_rows, Bound, CachePlan, CompressArgs,
    CompressOp, CompressPlan, FusedArgs, FusedOp, GatherOp, IndexPlan, IndexerKOp, InsertArgs,
    InsertOp, InsertPlan, Operation, RingArgs, RingOp, RingPlan, Role, RowsPlan, SkipCounts,
};
use crate::reference::{encode_record, pool_rows, rms_norm, Record};
use crate::tensor::{DType, Storage, TensorDesc, TensorMut};
use rayon::prelude::*;
use std::sync::Mutex;

/// The CPU reference.
pub struct CpuBackend {
    sanitize: bool,
    pool: Option<rayon::ThreadPool>,
    skipped: Mutex<SkipCounts>,
}

impl Default for CpuBackend {
    fn default() -> Self {
        Self::new()
    }
}

impl CpuBackend {
    /// On rayon's global pool (all cores), sanitizing off.
    pub fn new() -> Self {
        CpuBackend {
            sanitize: false,
            pool: None,
            skipped: Mutex::new(SkipCounts::default()),
        }
    }

    /// On a private pool of `threads` threads.
    pub fn with_threads(threads: usize) -> Result<Self> {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads.max(1))
            .build()
            .map_err(|e| Error::Value {
                arg: "threads",
                problem: e.to_string(),
            })?;
        Ok(CpuBackend {
            pool: Some(pool),
            ..Self::new()
        })
    }

    fn run<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        match &self.pool {
            Some(p) => p.install(f),
            None => f(),
        }
    }

    fn count(&self, c: SkipCounts) {
        if c.total() > 0 {
            // A poisoned lock only means another thread panicked mid-add; the counts stay usable.
            let mut g = self.skipped.lock().unwrap_or_else(|e| e.into_inner());
            g.add(c);
        }
    }
}

// ---- reading inputs -------------------------------------------------------

#[inline]
fn rd_u32(b: &[u8], off: usize) -> u32 {
    u32::from_le_bytes([b[off], b[off + 1], b[off + 2], b[off + 3]])
}

#[inline]
fn rd_f32(b: &[u8], off: usize) -> f32 {
    f32::from_bits(rd_u32(b, off))
}

#[inline]
fn rd_u16(b: &[u8], off: usize) -> u16 {
    u16::from_le_bytes([b[off], b[off + 1]])
}

fn rd_f32_row(b: &[u8], p: &RowsPlan, row: usize, out: &mut [f32]) {
    let base = p.offset + 4 * row * p.row_stride;
    for (j, o) in out.iter_mut().enumerate() {
        *o = rd_f32(b, base + 4 * j);
    }
}

fn ring_row_offset(r: &RingPlan, block: usize, row: usize) -> usize {
    r.offset + 4 * (block * r.block_stride + row * r.row_stride)
}

/// Element `i` of an F32, BF16 or F16 tensor starting at byte `off`, as
/// its exact f32 value (the validated input floats).
fn rd_input_float(b: &[u8], dtype: DType, off: usize, i: usize) -> f32 {
    match dtype {
        DType::F32 => rd_f32(b, off + 4 * i),
        DType::F16 => f16_to_f32(rd_u16(b, off + 2 * i)),
        // BF16, the one other type validation lets through.
        _ => bf16_to_f32(rd_u16(b, off + 2 * i)),
    }
}

fn rd_weight(b: &[u8], p: &CompressPlan) -> [f32; DIM] {
    std::array::from_fn(|i| rd_input_float(b, p.weight_dtype, p.weight_offset, i))
}

// ---- fused_save_compress_norm --------------------------------------------

/// An index tensor bound to its bytes.
#[derive(Clone, Copy)]
struct Ix<'a> {
    b: &'a [u8],
    p: IndexPlan,
}

impl<'a> Ix<'a> {
    fn new(b: &'a [u8], p: IndexPlan) -> Self {
        Ix { b, p }
    }
    #[inline]
    fn at(&self, i: usize) -> i64 {
        self.p.read(self.b, i)
    }
    fn reqs(&self) -> usize {
        self.p.len - 1
    }
}

/// `fused_save_compress_norm`'s inputs bound to their bytes.
struct CompressIn<'a> {
    p: &'a CompressPlan,
    kv: &'a [u8],
    w: [f32; DIM],
    ring: &'a [u8],
    prev: Option<&'a [u8]>,
    positions: Ix<'a>,
    slots: Ix<'a>,
    qsl: Option<Ix<'a>>,
    ttr: Option<Ix<'a>>,
    pri: Option<Ix<'a>>,
}

/// What one token contributes to `fused_save_compress_norm`. Unboxed on
/// purpose: one per token, collected once, so boxing would only add an
/// allocation per token.
#[allow(clippy::large_enum_variant)]
enum Latent {
    None,
    Skip(SkipCounts),
    Row([u16; DIM]),
}

fn skip(slot: u64, pos: u64, idx: u64) -> Latent {
    Latent::Skip(SkipCounts {
        slot_out_of_range: slot,
        position_out_of_range: pos,
        index_out_of_range: idx,
    })
}

/// Token `t`'s latent under CR2. The ring is read as it was before this
/// call's ring stores, as on the device.
fn cr2_latent(c: &CompressIn<'_>, t: usize) -> Latent {
    let p = c.p;
    let slot = c.slots.at(t);
    if slot < 0 {
        return Latent::None;
    }
    let pos = c.positions.at(t);
    if pos < 0 {
        return skip(0, 1, 0);
    }
    // Written without `pos + 1`, which overflows at i64::MAX.
    if pos % 2 != 1 {
        return Latent::None;
    }
    let (qsl, ttr) = (
        c.qsl.expect("CR2 has query_start_loc"),
        c.ttr.expect("CR2 has token_to_req"),
    );
    let r = ttr.at(t);
    if r < 0 || r >= qsl.reqs() as i64 {
        return skip(0, 0, 1);
    }
    let start = qsl.at(r as usize);
    let end = qsl.at(r as usize + 1);
    let t64 = t as i64;
    // A chunk that starts before token 0 is malformed: its tokens are skipped
    // (reading `kv_score[t - 1]` at t = 0 would be out of bounds).
    if start < 0 || !(start <= t64 && t64 < end) {
        return skip(0, 0, 1);
    }
    let mut newer = [0.0f32; 1024];
    rd_f32_row(c.kv, &p.kv_score, t, &mut newer);
    let mut older = [0.0f32; 1024];
    if t64 != start {
        rd_f32_row(c.kv, &p.kv_score, t - 1, &mut older);
    } else {
        // The chunk's first token: its predecessor is in prev_rows or the ring.
        let j = c.pri.map_or(-1, |pi| pi.at(r as usize));
        if let (true, Some(pr), Some(pb)) = (j >= 0, p.prev_rows, c.prev) {
            if j as u64 >= pr.rows as u64 {
                return skip(0, 0, 1);
            }
            rd_f32_row(pb, &pr, j as usize, &mut older);
        } else {
            let ring = p.ring.expect("CR2 has a ring");
            let cap = ring.capacity as i64;
            let block = slot / cap;
            if block as u64 >= ring.blocks as u64 {
                return skip(1, 0, 0);
            }
            let off = ring_row_offset(&ring, block as usize, ((pos - 1) % cap) as usize);
            for (j, o) in older.iter_mut().enumerate() {
                *o = rd_f32(c.ring, off + 4 * j);
            }
        }
    }
    Latent::Row(rms_norm(&pool_rows(&older, &newer), &c.w, p.eps))
}

fn cr1_latent(c: &CompressIn<'_>, t: usize) -> Latent {
    if c.slots.at(t) < 0 {
        return Latent::None;
    }
    let mut v = [0.0f32; DIM];
    rd_f32_row(c.kv, &c.p.kv_score, t, &mut v);
    Latent::Row(rms_norm(&v, &c.w, c.p.eps))
}

/// Every token's latent (`None` where nothing is written), and the counts.
fn compute_latents(c: &CompressIn<'_>) -> (Vec<Option<[u16; DIM]>>, SkipCounts) {
    let res: Vec<Latent> = (0..c.p.n)
        .into_par_iter()
        .map(|t| {
            if c.p.compress_ratio == 1 {
                cr1_latent(c, t)
            } else {
                cr2_latent(c, t)
            }
        })
        .collect();
    let mut counts = SkipCounts::default();
    let rows = res
        .into_iter()
        .map(|l| match l {
            Latent::Row(r) => Some(r),
            Latent::Skip(k) => {
                counts.add(k);
                None
            }
            Latent::None => None,
        })
        .collect();
    (rows, counts)
}

/// The CR2 ring stores (only without `prev_rows`): for each request whose
/// chunk is non-empty and whose first token has a slot, those of the last
/// `min(len, capacity)` tokens that have a slot copy their rows.
/// Returns `(ring byte offset, kv_score byte offset)` of each 4096-byte copy.
fn ring_stores(c: &CompressIn<'_>, counts: &mut SkipCounts) -> Vec<(usize, usize)> {
    let p = c.p;
    let mut out = Vec::new();
    let (Some(ring), Some(qsl)) = (p.ring, c.qsl) else {
        return out;
    };
    if p.prev_rows.is_some() {
        return out;
    }
    let n = p.n as i64;
    let cap = ring.capacity as i64;
    for r in 0..qsl.reqs() {
        let start = qsl.at(r);
        let end = qsl.at(r + 1).min(n);
        if start < 0 || start >= end || c.slots.at(start as usize) < 0 {
            continue;
        }
        for u in start.max(end - cap)..end {
            let slot = c.slots.at(u as usize);
            if slot < 0 {
                continue;
            }
            let block = slot / cap;
            if block as u64 >= ring.blocks as u64 {
                counts.slot_out_of_range += 1;
                continue;
            }
            let dst = ring_row_offset(&ring, block as usize, (slot % cap) as usize);
            out.push((
                dst,
                p.kv_score.offset + 4 * (u as usize) * p.kv_score.row_stride,
            ));
        }
    }
    out
}

fn apply_ring_stores(ring: &mut [u8], kv: &[u8], copies: &[(usize, usize)]) {
    for &(dst, src) in copies {
        ring[dst..dst + 4096].copy_from_slice(&kv[src..src + 4096]);
    }
}

// ---- rope_quant_insert ----------------------------------------------------

/// Where a record goes: value bytes and scale bytes.
#[derive(Clone, Copy)]
struct Dest {
    values: usize,
    scales: usize,
}

enum Insert {
    None,
    Skip(SkipCounts),
    Write(Dest, Box<Record>),
}

fn cache_dest(c: &CachePlan, slot: i64) -> Dest {
    let bs = c.block_size as i64;
    let (values, scales) = c.record_offsets((slot / bs) as usize, (slot % bs) as usize);
    Dest { values, scales }
}

fn cos_sin_row(b: &[u8], p: &InsertPlan, row: usize) -> ([f32; 32], [f32; 32]) {
    let mut c = [0.0f32; 32];
    let mut s = [0.0f32; 32];
    let base = p.cos_sin.offset + p.cos_sin_dtype.size() * row * p.cos_sin.row_stride;
    let rd = |j: usize| rd_input_float(b, p.cos_sin_dtype, base, j);
    for k in 0..32 {
        c[k] = rd(k);
        s[k] = rd(32 + k);
    }
    (c, s)
}

/// `rope_quant_insert`'s inputs bound to their bytes.
struct InsertIn<'a> {
    p: &'a InsertPlan,
    positions: Ix<'a>,
    slots: Ix<'a>,
    cos: &'a [u8],
    latent: &'a [u8],
    sanitize: bool,
    inv_fp8: f32,
}

/// The insert rule for token `t`, with its latent given (fused path) or
/// read from the latent tensor.
fn insert_one(c: &InsertIn<'_>, latent: Option<&[u16; DIM]>, t: usize) -> Insert {
    let p = c.p;
    let slot = c.slots.at(t);
    if slot < 0 {
        return Insert::None;
    }
    let skip = |s, q| {
        Insert::Skip(SkipCounts {
            slot_out_of_range: s,
            position_out_of_range: q,
            index_out_of_range: 0,
        })
    };
    let pos = c.positions.at(t);
    if pos < 0 {
        return skip(0, 1);
    }
    let cr = p.compress_ratio as i64;
    if pos % cr != cr - 1 {
        return Insert::None;
    }
    let base = (pos / cr) * cr;
    if base as u64 >= p.cos_sin.rows as u64 {
        return skip(0, 1);
    }
    if slot as u64 >= p.cache.capacity() {
        return skip(1, 0);
    }
    let row = match latent {
        Some(l) => *l,
        None => {
            let mut l = [0u16; DIM];
            let off = p.latent.offset + 2 * t * p.latent.row_stride;
            for (i, x) in l.iter_mut().enumerate() {
                *x = rd_u16(c.latent, off + 2 * i);
            }
            l
        }
    };
    let (cs, sn) = cos_sin_row(c.cos, p, base as usize);
    let rec = encode_record(p.cache.layout, &row, &cs, &sn, c.sanitize, c.inv_fp8);
    Insert::Write(cache_dest(&p.cache, slot), Box::new(rec))
}

fn apply_inserts(
    layout: RecordLayout,
    cache: &mut [u8],
    results: Vec<Insert>,
    counts: &mut SkipCounts,
) {
    let (v, s) = (layout.value_bytes(), layout.scale_bytes());
    for r in results {
        match r {
            Insert::Write(d, rec) => {
                cache[d.values..d.values + v].copy_from_slice(&rec.values[..v]);
                if s > 0 {
                    cache[d.scales..d.scales + s].copy_from_slice(&rec.scales[..s]);
                }
            }
            Insert::Skip(c) => counts.add(c),
            Insert::None => {}
        }
    }
}

fn inv_fp8_scale(p: &InsertPlan, buf: Option<&[u8]>) -> f32 {
    match (p.fp8_scale_offset, buf) {
        (Some(o), Some(b)) => 1.0 / rd_f32(b, o),
        _ => 1.0,
    }
}

fn write_latents(p: &CompressPlan, out: &mut [u8], latents: &[Option<[u16; DIM]>]) {
    for (t, l) in latents.iter().enumerate() {
        if let Some(l) = l {
            let off = p.latent.offset + 2 * t * p.latent.row_stride;
            for (i, h) in l.iter().enumerate() {
                out[off + 2 * i..off + 2 * i + 2].copy_from_slice(&h.to_le_bytes());
            }
        }
    }
}

/// Binds `fused_save_compress_norm`'s inputs (everything but its outputs).
fn bind_compress<'a, S: Bytes + ?Sized>(
    p: &'a CompressPlan,
    a: &'a CompressArgs<'_, S>,
) -> CompressIn<'a> {
    CompressIn {
        p,
        kv: a.kv_score.buf.as_ref(),
        w: rd_weight(a.rms_norm_weight.buf.as_ref(), p),
        ring: a.state_cache.as_ref().map_or(&[], |s| s.buf.as_ref()),
        prev: a.prev_rows.as_ref().map(|t| t.buf.as_ref()),
        positions: Ix::new(a.positions.buf.as_ref(), p.positions),
        slots: Ix::new(a.slot_mapping.buf.as_ref(), p.slots),
        qsl: a
            .query_start_loc
            .as_ref()
            .zip(p.query_start_loc)
            .map(|(t, q)| Ix::new(t.buf.as_ref(), q)),
        ttr: a
            .token_to_req_indices
            .as_ref()
            .zip(p.token_to_req)
            .map(|(t, q)| Ix::new(t.buf.as_ref(), q)),
        pri: a
            .prev_row_indices
            .as_ref()
            .zip(p.prev_row_indices)
            .map(|(t, q)| Ix::new(t.buf.as_ref(), q)),
    }
}

/// Byte storage the CPU backend computes on: its own `Vec<u8>` buffers, or
/// caller memory bound span by span by the `*_host` entry points.
trait Bytes: Storage + AsRef<[u8]> + AsMut<[u8]> + Send + Sync {}
impl<S: Storage + AsRef<[u8]> + AsMut<[u8]> + Send + Sync + ?Sized> Bytes for S {}

// ---- the backend ------------------------------------------------------------

impl CpuBackend {
    fn compress_on<S: Bytes + ?Sized>(&self, mut a: CompressArgs<'_, S>) -> Result<()> {
        let p = plan_compress(&a)?;
        let (latents, counts, ring_writes) = {
            let c = bind_compress(&p, &a);
            let (latents, mut counts) = self.run(|| compute_latents(&c));
            // Ring stores happen after every ring read, as on the device.
            let copies = ring_stores(&c, &mut counts);
            (latents, counts, copies)
        };
        write_latents(&p, a.latent_out.buf.as_mut(), &latents);
        if let Some(st) = a.state_cache.as_mut() {
            apply_ring_stores(st.buf.as_mut(), a.kv_score.buf.as_ref(), &ring_writes);
        }
        self.count(counts);
        Ok(())
    }

    fn insert_on<S: Bytes + ?Sized>(&self, a: InsertArgs<'_, S>, sanitize: bool) -> Result<()> {
        let p = plan_insert(&a)?;
        let c = InsertIn {
            p: &p,
            positions: Ix::new(a.positions.buf.as_ref(), p.positions),
            slots: Ix::new(a.slot_mapping.buf.as_ref(), p.slots),
            cos: a.cos_sin_cache.buf.as_ref(),
            latent: a.latent.buf.as_ref(),
            sanitize,
            inv_fp8: inv_fp8_scale(&p, a.fp8_scale.as_ref().map(|t| t.buf.as_ref())),
        };
        let results: Vec<Insert> = self.run(|| {
            (0..p.n)
                .into_par_iter()
                .map(|t| insert_one(&c, None, t))
                .collect()
        });
        let mut counts = SkipCounts::default();
        apply_inserts(
            p.cache.layout,
            a.kv_cache.buf.as_mut(),
            results,
            &mut counts,
        );
        self.count(counts);
        Ok(())
    }

    fn ring_on<S: Bytes + ?Sized>(&self, a: RingArgs<'_, S>) -> Result<()> {
        let p = plan_ring_rows(&a)?;
        let mut counts = SkipCounts::default();
        let cap = p.ring.capacity as i64;
        let slots = Ix::new(a.slot_mapping.buf.as_ref(), p.slots);
        let (rows, ring) = (a.rows.buf.as_ref(), a.state_cache.buf.as_mut());
        for i in 0..p.n {
            let slot = slots.at(i);
            if slot < 0 {
                continue;
            }
            let block = slot / cap;
            if block as u64 >= p.ring.blocks as u64 {
                counts.slot_out_of_range += 1;
                continue;
            }
            let dst = ring_row_offset(&p.ring, block as usize, (slot % cap) as usize);
            let src = p.rows.offset + 4 * i * p.rows.row_stride;
            ring[dst..dst + 4096].copy_from_slice(&rows[src..src + 4096]);
        }
        self.count(counts);
        Ok(())
    }

    fn gather_on<S: Bytes + ?Sized>(&self, a: GatherArgs<'_, S>) -> Result<()> {
        let p = plan_gather(&a)?;
        let counts = self.run(|| gather_reference(&p, a));
        self.count(counts);
        Ok(())
    }

    fn indexer_k_on<S: Bytes + ?Sized>(&self, a: IndexerKArgs<'_, S>) -> Result<()> {
        let p = plan_indexer_k(&a)?;
        let counts = self.run(|| indexer_k_reference(&p, a));
        self.count(counts);
        Ok(())
    }

    fn fused_on<S: Bytes + ?Sized>(&self, mut a: FusedArgs<'_, S>, sanitize: bool) -> Result<()> {
        let fp = plan_fused(&a)?;
        let p = fp.compress;
        let (latents, mut counts, inserts, ring_writes) = {
            let c = bind_compress(&p, &a.compress);
            let ins = InsertIn {
                p: &fp.insert,
                positions: Ix::new(a.compress.positions.buf.as_ref(), fp.insert.positions),
                slots: Ix::new(a.cache_slot_mapping.buf.as_ref(), fp.insert.slots),
                cos: a.cos_sin_cache.buf.as_ref(),
                latent: &[],
                sanitize,
                inv_fp8: inv_fp8_scale(&fp.insert, a.fp8_scale.as_ref().map(|t| t.buf.as_ref())),
            };
            let (latents, mut counts, inserts) = self.run(|| {
                let (latents, counts) = compute_latents(&c);
                // A token the compressor produced no latent for is not inserted.
                let inserts: Vec<Insert> = latents
                    .par_iter()
                    .enumerate()
                    .map(|(t, l)| {
                        l.as_ref()
                            .map_or(Insert::None, |l| insert_one(&ins, Some(l), t))
                    })
                    .collect();
                (latents, counts, inserts)
            });
            let copies = ring_stores(&c, &mut counts);
            (latents, counts, inserts, copies)
        };
        if fp.write_latent {
            write_latents(&p, a.compress.latent_out.buf.as_mut(), &latents);
        }
        apply_inserts(
            fp.insert.cache.layout,
            a.kv_cache.buf.as_mut(),
            inserts,
            &mut counts,
        );
        if let Some(st) = a.compress.state_cache.as_mut() {
            apply_ring_stores(
                st.buf.as_mut(),
                a.compress.kv_score.buf.as_ref(),
                &ring_writes,
            );
        }
        self.count(counts);
        Ok(())
    }
}

impl Backend for CpuBackend {
    type Buffer = Vec<u8>;

    fn name(&self) -> String {
        let threads = self
            .pool
            .as_ref()
            .map_or_else(rayon::current_num_threads, |p| p.current_num_threads());
        format!("cpu ({threads} threads)")
    }

    fn sanitize(&self) -> bool {
        self.sanitize
    }

    fn set_sanitize(&mut self, on: bool) {
        self.sanitize = on;
    }

    fn upload(&self, bytes: &[u8]) -> Result<Vec<u8>> {
        Ok(bytes.to_vec())
    }

    fn write(&self, buf: &mut Vec<u8>, bytes: &[u8]) -> Result<()> {
        if bytes.len() > buf.len() {
            return Err(Error::OutOfBounds {
                arg: "write",
                needed: bytes.len() as u64,
                available: buf.len() as u64,
            });
        }
        buf[..bytes.len()].copy_from_slice(bytes);
        Ok(())
    }

    fn read(&self, buf: &Vec<u8>) -> Result<Vec<u8>> {
        Ok(buf.clone())
    }

    fn fused_save_compress_norm(&self, a: CompressArgs<'_, Vec<u8>>) -> Result<()> {
        self.compress_on(a)
    }

    fn rope_quant_insert(&self, a: InsertArgs<'_, Vec<u8>>) -> Result<()> {
        self.insert_on(a, self.sanitize)
    }

    fn save_ring_rows(&self, a: RingArgs<'_, Vec<u8>>) -> Result<()> {
        self.ring_on(a)
    }

    fn fused_compress_insert(&self, a: FusedArgs<'_, Vec<u8>>) -> Result<()> {
        self.fused_on(a, self.sanitize)
    }

    fn gather_dequant(&self, a: GatherArgs<'_, Vec<u8>>) -> Result<()> {
        self.gather_on(a)
    }

    fn indexer_k_norm_rope_store(&self, a: IndexerKArgs<'_, Vec<u8>>) -> Result<()> {
        self.indexer_k_on(a)
    }

    fn take_skip_counts(&self) -> Result<SkipCounts> {
        let mut g = self.skipped.lock().unwrap_or_else(|e| e.into_inner());
        Ok(std::mem::take(&mut *g))
    }

    fn synchronize(&self) -> Result<()> {
        Ok(())
    }
}

// ---- caller-owned host memory -----------------------------------------------

/// Caller-owned host memory (a framework's CPU tensor) for the CPU
/// backend's `unsafe` `*_host` entry points.
///
/// `ptr` is the address of byte 0 of the tensor's view; the descriptors give
/// dtype, shape, strides and a byte offset from `ptr`, and `len` is the
/// number of bytes from `ptr` the caller vouches for (views are checked
/// against it, as against a buffer's length).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawHost {
    /// Address of byte 0 (may be null only when every view of it is empty).
    pub ptr: *mut u8,
    /// Bytes from `ptr` that may be read or written.
    pub len: usize,
}

impl Storage for RawHost {
    fn len_bytes(&self) -> usize {
        self.len
    }
}

/// One view's bytes `[start, end)` in the address space, `None` when empty.
fn host_span(b: &Bound<'_, RawHost>) -> Option<(usize, usize)> {
    b.buf
        .filter(|_| b.end > b.offset)
        .map(|h| (h.ptr as usize + b.offset, h.ptr as usize + b.end))
}

/// Rejects a written view that shares bytes with any other view of the
/// operation's tensor table: the CPU backend reads and writes through
/// separate slices, which must not alias.
fn host_disjoint(table: &[Bound<'_, RawHost>]) -> Result<()> {
    for w in table.iter().filter(|b| b.role == Role::Written) {
        let Some((a0, a1)) = host_span(w) else {
            continue;
        };
        for o in table.iter().filter(|o| o.arg != w.arg) {
            if let Some((b0, b1)) = host_span(o) {
                if a0 < b1 && b0 < a1 {
                    return Err(Error::Value {
                        arg: w.arg,
                        problem: format!("shares memory with {}; a written tensor must not overlap another argument", o.arg),
                    });
                }
            }
        }
    }
    Ok(())
}

/// One view's bytes of caller memory, from its first byte: the storage the
/// `*_host` entry points compute on, one per tensor, so that each written
/// view is borrowed apart from the others (`host_disjoint` ruled out
/// overlaps).
struct HostSpan {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: a span stands for a `&mut [u8]` of caller memory that outlives
// it; shared, it hands out shared slices only.
unsafe impl Send for HostSpan {}
// SAFETY: as for `Send`.
unsafe impl Sync for HostSpan {}

impl HostSpan {
    /// Tensor `b`'s span and its view rebased to offset 0; an empty view
    /// keeps its shape, so a zero-row batch still passes the plans' shape
    /// checks (the seed returns early on no tokens).
    ///
    /// # Safety
    /// `b`'s buffer is valid for its view's bytes (checked by a plan) for
    /// as long as the span is used.
    unsafe fn bind(b: &Bound<'_, RawHost>) -> Option<(HostSpan, TensorDesc)> {
        let (ptr, len) =
            host_span(b).map_or((std::ptr::null_mut(), 0), |(s, e)| (s as *mut u8, e - s));
        Some((HostSpan { ptr, len }, b.desc?.with_offset(0)))
    }
}

impl Storage for HostSpan {
    fn len_bytes(&self) -> usize {
        self.len
    }
}

impl AsRef<[u8]> for HostSpan {
    fn as_ref(&self) -> &[u8] {
        if self.len == 0 {
            return &[];
        }
        // SAFETY: `HostSpan::bind`'s contract: `len` live bytes at `ptr`.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl AsMut<[u8]> for HostSpan {
    fn as_mut(&mut self) -> &mut [u8] {
        if self.len == 0 {
            return &mut [];
        }
        // SAFETY: as in `as_ref`; no other span covers these bytes.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

/// How the CPU runs each operation, on its own buffers or on caller memory.
trait Reference: Operation {
    /// Validates the arguments; the call's token count.
    fn tokens<S: Storage + ?Sized>(a: &Self::Args<'_, S>) -> Result<usize>;
    /// Runs the operation, with NaN sanitizing as given where it applies.
    fn run<S: Bytes + ?Sized>(cpu: &CpuBackend, a: Self::Args<'_, S>, sanitize: bool)
        -> Result<()>;
}

/// Implements [`Reference`] from each operation's plan and CPU code.
macro_rules! reference {
    ($($op:ty: $plan:ident |$p:ident| $n:expr, |$cpu:ident, $a:ident, $s:ident| $run:expr;)*) => {$(
        impl Reference for $op {
            fn tokens<S: Storage + ?Sized>(a: &Self::Args<'_, S>) -> Result<usize> {
                $plan(a).map(|$p| $n)
            }
            fn run<S: Bytes + ?Sized>($cpu: &CpuBackend, $a: Self::Args<'_, S>, $s: bool) -> Result<()> {
                $run
            }
        }
    )*};
}

reference! {
    InsertOp: plan_insert |p| p.n, |cpu, a, sanitize| cpu.insert_on(a, sanitize);
    CompressOp: plan_compress |p| p.n, |cpu, a, _sanitize| cpu.compress_on(a);
    RingOp: plan_ring_rows |p| p.n, |cpu, a, _sanitize| cpu.ring_on(a);
    FusedOp: plan_fused |p| p.compress.n, |cpu, a, sanitize| cpu.fused_on(a, sanitize);
    GatherOp: plan_gather |p| p.n, |cpu, a, _sanitize| cpu.gather_on(a);
    IndexerKOp: plan_indexer_k |p| p.n, |cpu, a, _sanitize| cpu.indexer_k_on(a);
}

/// One `unsafe` `*_host` entry point (its docs given): the operation `$op`
/// through [`CpuBackend::host`], with `$sanitize` where it applies.
macro_rules! host_op {
    ($($(#[$doc:meta])* $name:ident($op:ty, $args:ident $(, $s:ident: bool)?) => $sanitize:expr;)*) => {$(
        $(#[$doc])*
        ///
        /// # Safety
        /// See the `impl` block.
        pub unsafe fn $name(&self, a: &$args<'_, RawHost> $(, $s: bool)?) -> Result<()> {
            // SAFETY: the caller's contract, forwarded.
            unsafe { self.host::<$op>(a, $sanitize) }
        }
    )*};
}

/// The CPU backend over caller-owned host memory: the same validation (the
/// `plan_*` functions, against each [`RawHost::len`]) and the same code as
/// the safe API, writing straight into the caller's tensors. A written
/// tensor that overlaps another argument is an [`Error::Value`].
///
/// # Safety (every `*_host` function)
/// Every [`RawHost`] is valid for reads of its `len` bytes (and for writes
/// where it backs a written tensor), and nothing else reads or writes those
/// bytes during the call.
impl CpuBackend {
    host_op! {
        /// `rope_quant_insert` on caller memory, with NaN sanitizing as given.
        rope_quant_insert_host(InsertOp, InsertArgs, sanitize: bool) => sanitize;
        /// `fused_save_compress_norm` on caller memory.
        fused_save_compress_norm_host(CompressOp, CompressArgs) => false;
        /// `save_ring_rows` on caller memory.
        save_ring_rows_host(RingOp, RingArgs) => false;
        /// `gather_dequant` on caller memory.
        gather_dequant_host(GatherOp, GatherArgs) => false;
        /// `indexer_k_norm_rope_store` on caller memory.
        indexer_k_norm_rope_store_host(IndexerKOp, IndexerKArgs) => false;
        /// The fused compress + insert on caller memory, with NaN sanitizing as
        /// given.
        fused_compress_insert_host(FusedOp, FusedArgs, sanitize: bool) => sanitize;
    }

    /// The `*_host` entry points after their arguments: the plan over the
    /// caller's views, no written view overlapping another, and for a call
    /// with tokens, the operation's table bound span by span (the tensors
    /// the call uses only: CR1 ignores the ring-side arguments, as the seed
    /// does, so they are neither bound nor checked) and run as on the safe
    /// API.
    ///
    /// # Safety
    /// As for the `*_host` functions.
    unsafe fn host<O: Reference>(&self, a: &O::Args<'_, RawHost>, sanitize: bool) -> Result<()> {
        let n = O::tokens(a)?;
        let t = O::tensors(a);
        host_disjoint(&O::list(&t))?;
        if n == 0 {
            return Ok(());
        }
        // SAFETY: validated extents, written views disjoint; the spans
        // live until the run returns.
        let mut spans = O::map(t, |_, b| unsafe { HostSpan::bind(&b) });
        let table = O::map(O::as_mut(&mut spans), |_, s| {
            s.as_mut().map(|(h, d)| TensorMut::new(h, *d))
        });
        let args = O::from_table(table, O::scalars(a))?;
        O::run(self, args, sanitize)
    }
}
