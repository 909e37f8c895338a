//! Shared test helpers: typed data to byte buffers, tensor views over them,
//! builders of random valid cases and of adversarial cases, and a runner that
//! executes a case on any [`Backend`] and reads every output back.
//!
//! Everything here is generic over the backend so that the device parity
//! tests can run the very same cases on CUDA and HIP and compare the bytes
//! with the CPU reference.
//!
//! Conventions:
//! - Every buffer starts out filled with the canary pattern (`0xA5`, `0x5A`
//!   alternating by byte index); a view's elements are then written into it.
//!   So any byte outside a view, in padding or past a row, is a canary byte.
//! - Caches (`kv_cache`) and `latent_out` are canary-filled everywhere; the
//!   ring (`state_cache`) holds random rows (it is an input too).
//! - A case is a single launch ([`Op`]); sequences (chunked prefill, the
//!   `prev_rows` path followed by `save_ring_rows`) are built by the tests
//!   from several cases, threading the outputs through.

#![allow(dead_code)]

use dsv4_kvcache::formats::{bf16_from_f32, bf16_to_f32};
use dsv4_kvcache::testkit::{i64_bytes, Rng};
use dsv4_kvcache::RecordOrder;
use dsv4_kvcache::{
    Backend, CompressArgs, DType, Error, FusedArgs, InsertArgs, RecordLayout, RingArgs, SkipCounts,
    Tensor, TensorDesc, TensorMut,
};
use proptest::prelude::*;

// ---- canary ------------------------------------------------------------------

/// The canary byte at buffer index `i`: `0xA5`, `0x5A`, alternating.
#[inline]
pub fn canary_byte(i: usize) -> u8 {
    if i % 2 == 0 {
        0xA5
    } else {
        0x5A
    }
}

/// `len` canary bytes.
pub fn canary(len: usize) -> Vec<u8> {
    (0..len).map(canary_byte).collect()
}

// ---- the tests' draws ----------------------------------------------------------

/// The tests' draws over the crate's generator ([`Rng`], SplitMix64), with
/// their own seeding and modulo range reduction: kept so that every seed a
/// test names (and every case it found) still gives the same data.
#[derive(Clone, Debug)]
pub struct Prng(Rng);

impl Prng {
    /// A generator for `seed`.
    pub fn new(seed: u64) -> Self {
        Prng(Rng::from_state(seed ^ 0x5DEE_CE66_D1CE_4E5B))
    }

    /// The next 64 random bits.
    pub fn u64(&mut self) -> u64 {
        self.0.next_u64()
    }

    /// Uniform in `0..n` (0 when `n == 0`).
    pub fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.u64() % n as u64) as usize
        }
    }

    /// Uniform in `lo..=hi`.
    pub fn range(&mut self, lo: i64, hi: i64) -> i64 {
        debug_assert!(lo <= hi);
        lo + (self.u64() % ((hi - lo + 1) as u64)) as i64
    }

    /// Uniform in `[0, 1)`.
    pub fn unit(&mut self) -> f64 {
        self.0.uniform()
    }

    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        self.unit() < p
    }

    /// One element of `xs`.
    pub fn pick<T: Copy>(&mut self, xs: &[T]) -> T {
        xs[self.below(xs.len())]
    }

    /// Fisher–Yates shuffle.
    pub fn shuffle<T>(&mut self, xs: &mut [T]) {
        for i in (1..xs.len()).rev() {
            let j = self.below(i + 1);
            xs.swap(i, j);
        }
    }

    /// `k` distinct values of `0..n` in random order (`k <= n`).
    pub fn distinct(&mut self, n: usize, k: usize) -> Vec<usize> {
        assert!(k <= n, "{k} distinct values of 0..{n}");
        let mut all: Vec<usize> = (0..n).collect();
        self.shuffle(&mut all);
        all.truncate(k);
        all
    }

    /// A random finite f32 `±(1 + u) 2^k` with `k` in `lo..=hi`.
    pub fn f32_exp(&mut self, lo: i32, hi: i32) -> f32 {
        let m = 1.0 + self.unit();
        let k = self.range(lo as i64, hi as i64) as i32;
        let v = (m * 2f64.powi(k)) as f32;
        if self.chance(0.5) {
            -v
        } else {
            v
        }
    }
}

// ---- special values -------------------------------------------------------------

/// f32 specials: signed zeros, NaNs (quiet both signs, a payload, a signaling
/// one), infinities, extremes, subnormals, values one ulp around 1 and 2.
pub const SPECIAL_F32: [u32; 20] = [
    0x0000_0000,
    0x8000_0000,
    0x7fc0_0000,
    0xffc0_0000,
    0x7fa0_0001,
    0xff80_0001,
    0x7f80_0000,
    0xff80_0000,
    0x7f7f_ffff,
    0xff7f_ffff,
    0x0000_0001,
    0x8000_0001,
    0x0080_0000,
    0x3f80_0001,
    0x3f7f_ffff,
    0x4000_0001,
    0x3fff_ffff,
    0x5f00_0000,
    0x2000_0000,
    0x43e0_0000,
];

/// BF16 specials: signed zeros, the two NaNs `0x7FC0`/`0xFFC0`, infinities,
/// the largest finite, subnormals, the smallest normal, one ulp around 1,
/// 448 and its neighbours, e2m1 ties (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5).
pub const SPECIAL_BF16: [u16; 28] = [
    0x0000, 0x8000, 0x7fc0, 0xffc0, 0x7f80, 0xff80, 0x7f7f, 0xff7f, 0x0001, 0x8001, 0x0080, 0x8080,
    0x3f80, 0x3f81, 0x3f7f, 0x43e0, 0x43e1, 0x43df, 0x3e80, 0x3f40, 0x3fa0, 0x3fe0, 0x4020, 0x4060,
    0x40a0, 0xc0a0, 0x38d1, 0x7f00,
];

// ---- typed data to bytes --------------------------------------------------------

pub use dsv4_kvcache::testkit::{f32_bytes, u16_bytes};

/// Little-endian bytes of indices as I32 (`i64 == false`) or I64.
pub fn index_bytes(v: &[i64], i64: bool) -> Vec<u8> {
    if i64 {
        i64_bytes(v)
    } else {
        v.iter().flat_map(|&x| (x as i32).to_le_bytes()).collect()
    }
}

/// BF16 bits of f32 values (round to nearest even).
pub fn to_bf16(v: &[f32]) -> Vec<u16> {
    v.iter().map(|&x| bf16_from_f32(x)).collect()
}

/// The element types `rms_norm_weight` and `cos_sin_cache` take.
pub const INPUT_FLOATS: [DType; 3] = [DType::F32, DType::BF16, DType::F16];

/// f32 values stored as `dtype` (F32, BF16 or F16, rounded to nearest even;
/// F16 by `half`, independently of the crate's decoders).
pub fn input_float_bytes(v: &[f32], dtype: DType) -> Vec<u8> {
    match dtype {
        DType::F32 => f32_bytes(v),
        DType::BF16 => u16_bytes(&to_bf16(v)),
        DType::F16 => u16_bytes(
            &v.iter()
                .map(|&x| half::f16::from_f32(x).to_bits())
                .collect::<Vec<_>>(),
        ),
        d => panic!("{d} is not an input float type"),
    }
}

/// A BF16 weight (bits) as values of `dtype`: itself for BF16; for F32 and
/// F16 the same values with low significand bits set that BF16 lacks, so
/// that a kernel reading the weight as BF16 gives other bytes. Infinities,
/// NaNs and zeros stay as they are.
pub fn weight_values(bf16_bits: &[u16], dtype: DType) -> Vec<f32> {
    bf16_bits
        .iter()
        .enumerate()
        .map(|(i, &h)| {
            let v = bf16_to_f32(h);
            let plain = !v.is_finite() || v == 0.0;
            match dtype {
                DType::F32 if !plain => {
                    f32::from_bits(v.to_bits() | ((i as u32 * 0x9e37 + 0x1357) & 0xffff) | 1)
                }
                DType::F16 => {
                    let c = half::f16::from_f32(v);
                    let special = c.is_infinite() || c.is_nan() || c.to_bits() & 0x7fff == 0;
                    let bits = if special {
                        c.to_bits()
                    } else {
                        c.to_bits() ^ (1 + (i as u16 * 5) % 7)
                    };
                    half::f16::from_bits(bits).to_f32()
                }
                _ => v,
            }
        })
        .collect()
}

// ---- buffers holding one view -----------------------------------------------------

/// A host buffer holding one tensor view (`desc`); bytes outside the view are
/// canary bytes unless a test changed them.
#[derive(Clone, Debug, PartialEq)]
pub struct Buf {
    /// The whole buffer.
    pub bytes: Vec<u8>,
    /// The view.
    pub desc: TensorDesc,
}

/// Byte offsets of every element of `desc`, in row-major order.
pub fn element_offsets(desc: &TensorDesc) -> Vec<usize> {
    let shape = desc.shape();
    let strides = desc.strides();
    let esz = desc.dtype.size();
    let n = desc.numel();
    let mut out = Vec::with_capacity(n);
    let mut idx = vec![0usize; shape.len()];
    for _ in 0..n {
        let mut e = 0usize;
        for (i, &s) in idx.iter().zip(strides) {
            e += i * s;
        }
        out.push(desc.offset + e * esz);
        for d in (0..shape.len()).rev() {
            idx[d] += 1;
            if idx[d] < shape[d] {
                break;
            }
            idx[d] = 0;
        }
    }
    out
}

/// A mask over `len` bytes: which bytes some element of `desc` covers.
pub fn footprint(desc: &TensorDesc, len: usize) -> Vec<bool> {
    let mut m = vec![false; len];
    let esz = desc.dtype.size();
    for o in element_offsets(desc) {
        let end = (o + esz).min(len);
        if o < end {
            m[o..end].fill(true);
        }
    }
    m
}

impl Buf {
    /// A canary buffer just large enough for `desc`, plus `tail` bytes, with
    /// the view's elements taken from `elems` (`numel * dtype.size()` bytes,
    /// row-major).
    pub fn new(desc: TensorDesc, tail: usize, elems: &[u8]) -> Self {
        let esz = desc.dtype.size();
        assert_eq!(
            elems.len(),
            desc.numel() * esz,
            "element bytes for {desc:?}"
        );
        let len = desc.end_byte().expect("view size") as usize + tail;
        let mut bytes = canary(len);
        for (k, o) in element_offsets(&desc).into_iter().enumerate() {
            bytes[o..o + esz].copy_from_slice(&elems[k * esz..(k + 1) * esz]);
        }
        Buf { bytes, desc }
    }

    /// A canary-filled buffer for `desc` (an output).
    pub fn canary(desc: TensorDesc, tail: usize) -> Self {
        let len = desc.end_byte().expect("view size") as usize + tail;
        Buf {
            bytes: canary(len),
            desc,
        }
    }

    /// A contiguous 1-D index tensor (I32 or I64) at byte `offset`.
    pub fn index(v: &[i64], i64: bool, offset: usize, tail: usize) -> Self {
        let dt = if i64 { DType::I64 } else { DType::I32 };
        Self::new(
            TensorDesc::contiguous(dt, &[v.len()]).with_offset(offset),
            tail,
            &index_bytes(v, i64),
        )
    }

    /// An F32 `[rows, width]` tensor with row stride `stride` elements.
    pub fn f32_rows(
        v: &[f32],
        rows: usize,
        width: usize,
        stride: usize,
        offset: usize,
        tail: usize,
    ) -> Self {
        let d = TensorDesc::strided(DType::F32, &[rows, width], &[stride, 1])
            .expect("rank 2")
            .with_offset(offset);
        Self::new(d, tail, &f32_bytes(v))
    }

    /// A read-only view over the bytes.
    pub fn t(&self) -> Tensor<'_, Vec<u8>> {
        Tensor::new(&self.bytes, self.desc)
    }

    /// A writable view over the bytes.
    pub fn t_mut(&mut self) -> TensorMut<'_, Vec<u8>> {
        TensorMut::new(&mut self.bytes, self.desc)
    }

    /// Which bytes of the buffer the view covers.
    pub fn footprint(&self) -> Vec<bool> {
        footprint(&self.desc, self.bytes.len())
    }

    /// Elements of a 1-D I32/I64 view.
    pub fn indices(&self) -> Vec<i64> {
        let esz = self.desc.dtype.size();
        element_offsets(&self.desc)
            .into_iter()
            .map(|o| match self.desc.dtype {
                DType::I64 => i64::from_le_bytes(self.bytes[o..o + 8].try_into().expect("8 bytes")),
                DType::I32 => {
                    i32::from_le_bytes(self.bytes[o..o + 4].try_into().expect("4 bytes")) as i64
                }
                d => panic!("indices() of a {d} tensor ({esz} bytes)"),
            })
            .collect()
    }

    /// Byte offset of the element at `idx` (any rank).
    pub fn offset_of(&self, idx: &[usize]) -> usize {
        let e: usize = idx
            .iter()
            .zip(self.desc.strides())
            .map(|(i, s)| i * s)
            .sum();
        self.desc.offset + e * self.desc.dtype.size()
    }

    /// Row `r` of a 2-D F32 view.
    pub fn f32_row(&self, r: usize) -> Vec<f32> {
        let w = self.desc.shape()[1];
        (0..w)
            .map(|j| {
                let o = self.offset_of(&[r, j]);
                f32::from_le_bytes(self.bytes[o..o + 4].try_into().expect("4 bytes"))
            })
            .collect()
    }

    /// Row `r` of a 2-D BF16 view, as bits.
    pub fn u16_row(&self, r: usize) -> Vec<u16> {
        let w = self.desc.shape()[1];
        (0..w)
            .map(|j| {
                let o = self.offset_of(&[r, j]);
                u16::from_le_bytes([self.bytes[o], self.bytes[o + 1]])
            })
            .collect()
    }
}

// ---- cases --------------------------------------------------------------------------

/// The launch a case makes (the operation of the vector files).
pub use dsv4_kvcache::vectors::Op;

/// What a random case looks like.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Kind {
    /// The launch.
    pub op: Op,
    /// `FusedCompressInsert`: leave `latent_out` alone.
    pub skip_latent_out: bool,
    /// Compress ratio, 1 or 2 (ignored by `SaveRingRows`).
    pub cr: u32,
    /// Cache layout (insert and fused).
    pub layout: RecordLayout,
    /// Where a paged record's scales go (insert and fused).
    pub record_order: RecordOrder,
    /// CR2: give `prev_rows` and `prev_row_indices`.
    pub prev_rows: bool,
    /// NaN sanitizing on the backend.
    pub sanitize: bool,
    /// I64 index tensors (else I32).
    pub index_i64: bool,
    /// The cos/sin table's element type (F32, BF16 or F16).
    pub cos_dtype: DType,
    /// The norm weight's element type (F32, BF16 or F16).
    pub weight_dtype: DType,
    /// Sprinkle special values (NaN, inf, signed zeros, extremes) into the data.
    pub special_values: bool,
    /// Sprinkle invalid indices (slots and request indices out of range,
    /// negative positions, positions beyond the cos/sin table, tokens
    /// outside their chunk).
    pub wild_indices: bool,
}

impl Kind {
    /// A plain kind: valid indices, ordinary values, I32 indices, F32 cos/sin,
    /// BF16 weight.
    pub fn new(op: Op, cr: u32, layout: RecordLayout) -> Self {
        Kind {
            op,
            skip_latent_out: false,
            cr,
            layout,
            record_order: RecordOrder::PagePlanar,
            prev_rows: false,
            sanitize: false,
            index_i64: false,
            cos_dtype: DType::F32,
            weight_dtype: DType::BF16,
            special_values: false,
            wild_indices: false,
        }
    }
}

/// The (weight, cos/sin) element types the fused kinds run: the tuned
/// kernels' two, then three that together give the generic kernels every
/// weight type and every table type.
pub const FUSED_INPUT_FLOATS: [(DType, DType); 5] = [
    (DType::BF16, DType::F32),
    (DType::BF16, DType::BF16),
    (DType::F32, DType::F16),
    (DType::F16, DType::F32),
    (DType::F32, DType::BF16),
];

/// A kind with one mix of special values and wild indices, and its place
/// in the list it came from, which its cases' seeds name ([`Mixed::seed`]).
#[derive(Clone, Copy, Debug)]
pub struct Mixed {
    pub kind: Kind,
    pub index: usize,
    pub mix: u64,
}

impl Mixed {
    /// The seed of case `i` of this kind and mix.
    pub fn seed(&self, i: u64) -> u64 {
        (self.index as u64) << 32 | self.mix << 16 | i
    }
}

/// Each of `kinds` four times: plain or special values, plain or wild
/// indices.
pub fn mixed_kinds(kinds: Vec<Kind>) -> Vec<Mixed> {
    let mut out = Vec::new();
    for (index, kind) in kinds.into_iter().enumerate() {
        for mix in 0..4u64 {
            let mut kind = kind;
            kind.special_values = mix & 1 == 1;
            kind.wild_indices = mix & 2 == 2;
            out.push(Mixed { kind, index, mix });
        }
    }
    out
}

/// Every combination of op, ratio, layout, `prev_rows`, sanitize, index
/// types, weight types (compress) and cos/sin types (insert) that makes
/// sense, with the fused ops' weight and table types from
/// [`FUSED_INPUT_FLOATS`] (values and indices plain).
pub fn all_kinds() -> Vec<Kind> {
    let mut out = Vec::new();
    for sanitize in [false, true] {
        for index_i64 in [false, true] {
            for cr in [1, 2] {
                for prev in [false, true] {
                    if prev && cr == 1 {
                        continue;
                    }
                    for weight_dtype in [DType::BF16, DType::F32, DType::F16] {
                        let mut k = Kind::new(Op::FusedSaveCompressNorm, cr, RecordLayout::V4);
                        k.prev_rows = prev;
                        k.sanitize = sanitize;
                        k.index_i64 = index_i64;
                        k.weight_dtype = weight_dtype;
                        out.push(k);
                    }
                    for layout in RecordLayout::ALL {
                        let inserts = [DType::F32, DType::BF16, DType::F16]
                            .map(|cs| (Op::RopeQuantInsert, false, DType::BF16, cs));
                        let fused = FUSED_INPUT_FLOATS.map(|(w, cs)| {
                            [false, true].map(|skip| (Op::FusedCompressInsert, skip, w, cs))
                        });
                        for (op, skip_latent_out, weight_dtype, cos_dtype) in
                            inserts.into_iter().chain(fused.into_iter().flatten())
                        {
                            if op == Op::RopeQuantInsert && prev {
                                continue;
                            }
                            let mut k = Kind::new(op, cr, layout);
                            // The I64-index kinds write vLLM 0.34.0's
                            // per-token order, so both orders meet every
                            // other combination.
                            k.record_order = order_of(layout, index_i64);
                            k.skip_latent_out = skip_latent_out;
                            k.prev_rows = prev;
                            k.sanitize = sanitize;
                            k.index_i64 = index_i64;
                            k.cos_dtype = cos_dtype;
                            k.weight_dtype = weight_dtype;
                            out.push(k);
                        }
                    }
                }
            }
            let mut k = Kind::new(Op::SaveRingRows, 2, RecordLayout::V4);
            k.sanitize = sanitize;
            k.index_i64 = index_i64;
            out.push(k);
        }
    }
    out
}

/// The record order of the kinds: per token for the V4.1 records with I64
/// indices, else page-planar; see [`all_kinds`].
pub fn order_of(layout: RecordLayout, index_i64: bool) -> RecordOrder {
    if index_i64 && layout.has_record_orders() {
        RecordOrder::PerToken
    } else {
        RecordOrder::PagePlanar
    }
}

/// A proptest strategy over kinds restricted to the given ops (fused kinds
/// with and without `skip_latent_out`).
pub fn kind_strategy(
    ops: Vec<Op>,
    special_values: bool,
    wild_indices: bool,
) -> impl Strategy<Value = Kind> {
    (
        proptest::sample::select(ops),
        proptest::sample::select(vec![1u32, 2]),
        proptest::sample::select(RecordLayout::ALL.to_vec()),
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
        proptest::sample::select(INPUT_FLOATS.to_vec()),
        any::<bool>(),
        proptest::sample::select(INPUT_FLOATS.to_vec()),
    )
        .prop_map(
            move |(op, cr, layout, prev, sanitize, i64, cos_dtype, skip, weight_dtype)| Kind {
                op,
                skip_latent_out: skip && op == Op::FusedCompressInsert,
                cr,
                layout,
                record_order: order_of(layout, i64),
                prev_rows: prev && cr == 2 && op != Op::RopeQuantInsert,
                sanitize,
                index_i64: i64,
                cos_dtype,
                weight_dtype,
                special_values,
                wild_indices,
            },
        )
}

/// One launch with all its buffers. Optional arguments are `None` when not
/// given; `latent` is `latent_out` for the compressing ops and the input
/// latent for `RopeQuantInsert`; `slot_mapping` holds ring slots (CR2),
/// validity marks or cache slots (CR1), cache slots (`RopeQuantInsert`) or
/// ring slots (`SaveRingRows`).
#[derive(Clone, Debug)]
pub struct Case {
    /// For messages.
    pub name: String,
    /// The launch and how the case was made.
    pub kind: Kind,
    /// `rms_norm_eps`.
    pub eps: f32,
    /// `compress_ratio` as passed (validation tests set 0 or 3).
    pub compress_ratio: u32,
    /// `kv_score`.
    pub kv_score: Option<Buf>,
    /// `positions`.
    pub positions: Option<Buf>,
    /// `slot_mapping`.
    pub slot_mapping: Buf,
    /// `cache_slot_mapping` (fused).
    pub cache_slot_mapping: Option<Buf>,
    /// `query_start_loc`.
    pub query_start_loc: Option<Buf>,
    /// `token_to_req_indices`.
    pub token_to_req_indices: Option<Buf>,
    /// `rms_norm_weight`.
    pub rms_norm_weight: Option<Buf>,
    /// `state_cache` (the ring).
    pub state_cache: Option<Buf>,
    /// `prev_rows`.
    pub prev_rows: Option<Buf>,
    /// `prev_row_indices`.
    pub prev_row_indices: Option<Buf>,
    /// `latent_out` or the insert's `latent`.
    pub latent: Option<Buf>,
    /// `save_ring_rows`' `rows`.
    pub rows: Option<Buf>,
    /// `cos_sin_cache`.
    pub cos_sin_cache: Option<Buf>,
    /// `kv_cache`.
    pub kv_cache: Option<Buf>,
    /// `fp8_scale`.
    pub fp8_scale: Option<Buf>,
}

impl Case {
    /// `N`, the tokens (or rows) processed.
    pub fn n(&self) -> usize {
        self.slot_mapping.desc.numel()
    }

    /// The first `N` entries of `slot_mapping`.
    pub fn slots(&self) -> Vec<i64> {
        let s = &self.slot_mapping;
        let w = s.desc.dtype.size();
        (0..self.n())
            .map(|i| {
                let b = &s.bytes[s.desc.offset + i * w..][..w];
                if w == 8 {
                    i64::from_le_bytes(b.try_into().expect("8 bytes"))
                } else {
                    i64::from(i32::from_le_bytes(b.try_into().expect("4 bytes")))
                }
            })
            .collect()
    }

    /// The same case with another sanitize setting.
    pub fn with_sanitize(mut self, on: bool) -> Self {
        self.kind.sanitize = on;
        self
    }
}

/// Everything a launch can write, read back, plus the skip counts of this
/// launch alone.
#[derive(Clone, Debug, PartialEq)]
pub struct Outputs {
    /// What the launch returned.
    pub result: Result<(), Error>,
    /// `latent_out` (the compressing ops); `None` for the other ops.
    pub latent: Option<Vec<u8>>,
    /// The ring, when the case has one.
    pub state_cache: Option<Vec<u8>>,
    /// The cache, when the case has one.
    pub kv_cache: Option<Vec<u8>>,
    /// `take_skip_counts` after the launch.
    pub skips: SkipCounts,
}

fn upload<B: Backend>(b: &B, x: &Option<Buf>) -> Option<B::Buffer> {
    x.as_ref().map(|x| b.upload(&x.bytes).expect("upload"))
}

fn view<'a, S>(u: &'a Option<S>, c: &Option<Buf>) -> Option<Tensor<'a, S>> {
    u.as_ref()
        .zip(c.as_ref())
        .map(|(u, c)| Tensor::new(u, c.desc))
}

fn view_mut<'a, S>(u: &'a mut Option<S>, c: &Option<Buf>) -> Option<TensorMut<'a, S>> {
    u.as_mut()
        .zip(c.as_ref())
        .map(|(u, c)| TensorMut::new(u, c.desc))
}

fn missing(case: &str, what: &str) -> ! {
    panic!("{case}: case has no {what}")
}

fn read<B: Backend>(b: &B, u: &Option<B::Buffer>) -> Option<Vec<u8>> {
    u.as_ref().map(|u| b.read(u).expect("read"))
}

/// Uploads `case`, runs its launch on `b` (with `b`'s sanitize setting, which
/// must be the case's: see [`run_case_mut`]) and reads back every buffer the
/// launch may write, with the skip counts of this launch.
pub fn run_case<B: Backend>(b: &B, case: &Case) -> Outputs {
    assert_eq!(
        b.sanitize(),
        case.kind.sanitize,
        "{}: backend sanitize setting differs from the case's; call set_sanitize or run_case_mut",
        case.name
    );
    b.take_skip_counts().expect("drain skip counts");
    let kv = upload(b, &case.kv_score);
    let pos = upload(b, &case.positions);
    let slots = b.upload(&case.slot_mapping.bytes).expect("upload");
    let cslots = upload(b, &case.cache_slot_mapping);
    let qsl = upload(b, &case.query_start_loc);
    let ttr = upload(b, &case.token_to_req_indices);
    let w = upload(b, &case.rms_norm_weight);
    let mut state = upload(b, &case.state_cache);
    let prev = upload(b, &case.prev_rows);
    let prev_idx = upload(b, &case.prev_row_indices);
    let mut latent = upload(b, &case.latent);
    let rows = upload(b, &case.rows);
    let cos = upload(b, &case.cos_sin_cache);
    let mut cache = upload(b, &case.kv_cache);
    let fp8 = upload(b, &case.fp8_scale);
    let slot_t = Tensor::new(&slots, case.slot_mapping.desc);
    let name = case.name.as_str();

    let result = match case.kind.op {
        Op::FusedSaveCompressNorm | Op::FusedCompressInsert => {
            let compress = CompressArgs {
                kv_score: view(&kv, &case.kv_score).unwrap_or_else(|| missing(name, "kv_score")),
                positions: view(&pos, &case.positions)
                    .unwrap_or_else(|| missing(name, "positions")),
                state_cache: view_mut(&mut state, &case.state_cache),
                slot_mapping: slot_t,
                query_start_loc: view(&qsl, &case.query_start_loc),
                token_to_req_indices: view(&ttr, &case.token_to_req_indices),
                rms_norm_weight: view(&w, &case.rms_norm_weight)
                    .unwrap_or_else(|| missing(name, "rms_norm_weight")),
                rms_norm_eps: case.eps,
                compress_ratio: case.compress_ratio,
                latent_out: view_mut(&mut latent, &case.latent)
                    .unwrap_or_else(|| missing(name, "latent_out")),
                prev_rows: view(&prev, &case.prev_rows),
                prev_row_indices: view(&prev_idx, &case.prev_row_indices),
            };
            match case.kind.op {
                Op::FusedCompressInsert => b.fused_compress_insert(FusedArgs {
                    compress,
                    skip_latent_out: case.kind.skip_latent_out,
                    cos_sin_cache: view(&cos, &case.cos_sin_cache)
                        .unwrap_or_else(|| missing(name, "cos_sin_cache")),
                    kv_cache: view_mut(&mut cache, &case.kv_cache)
                        .unwrap_or_else(|| missing(name, "kv_cache")),
                    cache_slot_mapping: view(&cslots, &case.cache_slot_mapping)
                        .unwrap_or_else(|| missing(name, "cache_slot_mapping")),
                    fp8_scale: view(&fp8, &case.fp8_scale),
                    record_order: case.kind.record_order,
                }),
                _ => b.fused_save_compress_norm(compress),
            }
        }
        Op::RopeQuantInsert => b.rope_quant_insert(InsertArgs {
            latent: view(&latent, &case.latent).unwrap_or_else(|| missing(name, "latent")),
            positions: view(&pos, &case.positions).unwrap_or_else(|| missing(name, "positions")),
            cos_sin_cache: view(&cos, &case.cos_sin_cache)
                .unwrap_or_else(|| missing(name, "cos_sin_cache")),
            kv_cache: view_mut(&mut cache, &case.kv_cache)
                .unwrap_or_else(|| missing(name, "kv_cache")),
            slot_mapping: slot_t,
            compress_ratio: case.compress_ratio,
            fp8_scale: view(&fp8, &case.fp8_scale),
            record_order: case.kind.record_order,
        }),
        Op::SaveRingRows => b.save_ring_rows(RingArgs {
            rows: view(&rows, &case.rows).unwrap_or_else(|| missing(name, "rows")),
            slot_mapping: slot_t,
            state_cache: view_mut(&mut state, &case.state_cache)
                .unwrap_or_else(|| missing(name, "state_cache")),
        }),
        // The reader's cases are tests/gather_cases (its own Case type).
        Op::GatherDequant => panic!("{name}: gather_dequant cases are in tests/gather_cases"),
    };
    let skips = b.take_skip_counts().expect("skip counts");
    Outputs {
        result,
        latent: match case.kind.op {
            Op::FusedSaveCompressNorm | Op::FusedCompressInsert => read(b, &latent),
            _ => None,
        },
        state_cache: read(b, &state),
        kv_cache: read(b, &cache),
        skips,
    }
}

/// [`run_case`] after switching `b`'s sanitizing to the case's.
pub fn run_case_mut<B: Backend>(b: &mut B, case: &Case) -> Outputs {
    b.set_sanitize(case.kind.sanitize);
    run_case(b, case)
}

// ---- typed specifications, turned into cases ---------------------------------------

/// Where every buffer of a case starts and how much slack follows it.
#[derive(Clone, Copy, Debug)]
pub struct Geo {
    /// Byte offset of every view in its buffer (a multiple of 64).
    pub offset: usize,
    /// Canary bytes after every view.
    pub tail: usize,
}

impl Geo {
    /// Offset 0, no tail.
    pub const PLAIN: Geo = Geo { offset: 0, tail: 0 };

    /// A random geometry.
    pub fn random(rng: &mut Prng) -> Self {
        Geo {
            offset: 64 * rng.below(3),
            tail: rng.pick(&[0, 16, 64, 100]),
        }
    }
}

/// The CR2 ring: `[blocks, capacity, 1024]` F32.
#[derive(Clone, Debug)]
pub struct RingSpec {
    /// Blocks.
    pub blocks: usize,
    /// Rows per block.
    pub cap: usize,
    /// `blocks * cap * 1024` values.
    pub data: Vec<f32>,
    /// Extra elements per row (a multiple of 16).
    pub row_pad: usize,
    /// Extra elements per block (a multiple of 4).
    pub block_pad: usize,
}

impl RingSpec {
    /// Builds the ring buffer.
    pub fn buf(&self, geo: Geo) -> Buf {
        let rs = 1024 + self.row_pad;
        let bs = self.cap * rs + self.block_pad;
        let d = TensorDesc::strided(DType::F32, &[self.blocks, self.cap, 1024], &[bs, rs, 1])
            .expect("rank 3")
            .with_offset(geo.offset);
        Buf::new(d, geo.tail, &f32_bytes(&self.data))
    }

    /// A ring of random finite rows.
    pub fn random(rng: &mut Prng, blocks: usize, cap: usize, special: bool) -> Self {
        let mut data = vec![0.0f32; blocks * cap * 1024];
        fill_kv_rows(rng, &mut data, special);
        RingSpec {
            blocks,
            cap,
            data,
            row_pad: 16 * rng.below(2),
            block_pad: 4 * rng.below(3),
        }
    }
}

/// Inputs of `fused_save_compress_norm`, as plain data.
#[derive(Clone, Debug)]
pub struct CompressSpec {
    /// 1 or 2.
    pub cr: u32,
    /// Epsilon.
    pub eps: f32,
    /// `kv_score` rows, `rows * 512 * cr` values (`rows >= n`).
    pub kv: Vec<f32>,
    /// Extra elements per `kv_score` row (a multiple of 16).
    pub kv_row_pad: usize,
    /// Positions (`len >= n`).
    pub positions: Vec<i64>,
    /// `slot_mapping` (`len == n`).
    pub slots: Vec<i64>,
    /// CR2: `query_start_loc`.
    pub qsl: Vec<i64>,
    /// CR2: `token_to_req_indices` (`len >= n`).
    pub ttr: Vec<i64>,
    /// BF16 weight bits, 512 (as [`weight_values`] of `weight_dtype`).
    pub weight: Vec<u16>,
    /// The weight's element type.
    pub weight_dtype: DType,
    /// CR2: the ring.
    pub ring: Option<RingSpec>,
    /// CR2: `prev_rows` (`rows * 1024` values) and `prev_row_indices`.
    pub prev: Option<(Vec<f32>, Vec<i64>)>,
    /// I64 index tensors.
    pub index_i64: bool,
    /// Buffer geometry.
    pub geo: Geo,
}

impl CompressSpec {
    /// Rows of `kv_score`.
    pub fn kv_rows(&self) -> usize {
        self.kv.len() / (512 * self.cr as usize)
    }

    fn fill(&self, case: &mut Case) {
        let w = 512 * self.cr as usize;
        let rows = self.kv_rows();
        let g = self.geo;
        case.eps = self.eps;
        case.compress_ratio = self.cr;
        case.kv_score = Some(Buf::f32_rows(
            &self.kv,
            rows,
            w,
            w + self.kv_row_pad,
            g.offset,
            g.tail,
        ));
        case.positions = Some(Buf::index(
            &self.positions,
            self.index_i64,
            g.offset,
            g.tail,
        ));
        case.slot_mapping = Buf::index(&self.slots, self.index_i64, g.offset, g.tail);
        let wd = self.weight_dtype;
        case.rms_norm_weight = Some(Buf::new(
            TensorDesc::contiguous(wd, &[512]).with_offset(g.offset),
            g.tail,
            &input_float_bytes(&weight_values(&self.weight, wd), wd),
        ));
        case.latent = Some(Buf::canary(
            TensorDesc::contiguous(DType::BF16, &[rows, 512]).with_offset(g.offset),
            g.tail,
        ));
        if self.cr == 2 {
            case.query_start_loc = Some(Buf::index(&self.qsl, self.index_i64, g.offset, g.tail));
            case.token_to_req_indices =
                Some(Buf::index(&self.ttr, self.index_i64, g.offset, g.tail));
            case.state_cache = self.ring.as_ref().map(|r| r.buf(g));
            if let Some((rows_v, idx)) = &self.prev {
                let pr = rows_v.len() / 1024;
                case.prev_rows = Some(Buf::f32_rows(rows_v, pr, 1024, 1024, g.offset, g.tail));
                case.prev_row_indices = Some(Buf::index(idx, self.index_i64, g.offset, g.tail));
            }
        }
    }
}

/// A cos/sin table: `[rows, width]` (`width >= 64`), F32, BF16 or F16.
#[derive(Clone, Debug)]
pub struct CosSinSpec {
    /// `rows * width` values (cos in columns 0..32, sin in 32..64).
    pub data: Vec<f32>,
    /// Rows (max position + 1).
    pub rows: usize,
    /// Columns, at least 64.
    pub width: usize,
    /// Row stride in elements (`>= width`).
    pub stride: usize,
    /// The element type (BF16 and F16 round the values).
    pub dtype: DType,
}

impl CosSinSpec {
    /// A table of true rotations: row `p`, pair `k` is `(cos, sin)` of
    /// `p * 10000^(-k/32)`, and some extra columns of noise.
    pub fn rotations(rng: &mut Prng, rows: usize, dtype: DType) -> Self {
        let width = 64 + 8 * rng.below(2);
        let stride = width + rng.below(3);
        let mut data = vec![0.0f32; rows * width];
        for p in 0..rows {
            for k in 0..32 {
                let theta = p as f64 * 10000f64.powf(-(k as f64) / 32.0);
                data[p * width + k] = theta.cos() as f32;
                data[p * width + 32 + k] = theta.sin() as f32;
            }
            for j in 64..width {
                data[p * width + j] = rng.f32_exp(-3, 3);
            }
        }
        CosSinSpec {
            data,
            rows,
            width,
            stride,
            dtype,
        }
    }

    /// The table's buffer.
    pub fn buf(&self, geo: Geo) -> Buf {
        let d = TensorDesc::strided(self.dtype, &[self.rows, self.width], &[self.stride, 1])
            .expect("rank 2")
            .with_offset(geo.offset);
        Buf::new(d, geo.tail, &input_float_bytes(&self.data, self.dtype))
    }
}

/// A cache of `layout`, canary-filled.
#[derive(Clone, Copy, Debug)]
pub struct CacheSpec {
    /// The layout.
    pub layout: RecordLayout,
    /// Blocks.
    pub blocks: usize,
    /// Rows per block.
    pub block_size: usize,
    /// Extra bytes per block (a multiple of 16).
    pub block_pad_bytes: usize,
    /// Rows layouts: extra bytes per row (a multiple of 16).
    pub row_pad_bytes: usize,
    /// Rows layouts: shape `[blocks, block_size, 1, 512]`.
    pub rank4: bool,
    /// FP8 rows: the per-tensor scale.
    pub fp8_scale: f32,
}

impl CacheSpec {
    /// Slots the cache holds.
    pub fn capacity(&self) -> usize {
        self.blocks * self.block_size
    }

    /// A random cache of `layout` with at least `min_slots` slots.
    pub fn random(rng: &mut Prng, layout: RecordLayout, min_slots: usize) -> Self {
        let block_size = v4_even(layout, 1 + rng.below(4));
        let blocks = min_slots.div_ceil(block_size).max(1) + rng.below(2);
        CacheSpec {
            layout,
            blocks,
            block_size,
            block_pad_bytes: 16 * rng.below(3),
            row_pad_bytes: 16 * rng.below(2),
            rank4: rng.chance(0.3),
            fp8_scale: rng.pick(&[1.0, 0.5, 2.0, 0.0625, 3.7, 1.0 / 3.0, 0.0137, 11.0]),
        }
    }

    /// The cache's descriptor.
    pub fn desc(&self) -> TensorDesc {
        let (b, bs) = (self.blocks, self.block_size);
        match self.layout {
            RecordLayout::Bf16Rows | RecordLayout::Fp8Rows => {
                let (dt, esz) = if self.layout == RecordLayout::Bf16Rows {
                    (DType::BF16, 2)
                } else {
                    (DType::F8E4M3, 1)
                };
                let rs = (512 * esz + self.row_pad_bytes) / esz;
                let bst = (bs * rs * esz + self.block_pad_bytes) / esz;
                if self.rank4 {
                    TensorDesc::strided(dt, &[b, bs, 1, 512], &[bst, rs, 512, 1]).expect("rank 4")
                } else {
                    TensorDesc::strided(dt, &[b, bs, 512], &[bst, rs, 1]).expect("rank 3")
                }
            }
            l => {
                let w = l.record_bytes();
                TensorDesc::strided(
                    DType::U8,
                    &[b, bs, w],
                    &[bs * w + self.block_pad_bytes, w, 1],
                )
                .expect("rank 3")
            }
        }
    }

    /// The canary-filled cache and, for FP8 rows, the scale tensor.
    pub fn bufs(&self, geo: Geo) -> (Buf, Option<Buf>) {
        let cache = Buf::canary(self.desc().with_offset(geo.offset), geo.tail);
        let scale = (self.layout == RecordLayout::Fp8Rows).then(|| {
            Buf::new(
                TensorDesc::contiguous(DType::F32, &[1]).with_offset(geo.offset),
                geo.tail,
                &f32_bytes(&[self.fp8_scale]),
            )
        });
        (cache, scale)
    }
}

/// A V4 page (`block_size * 584` bytes) is a multiple of 16 bytes only for
/// an even block size, which validation requires: round odd sizes up.
pub fn v4_even(layout: RecordLayout, block_size: usize) -> usize {
    if layout == RecordLayout::V4 && block_size % 2 == 1 {
        block_size + 1
    } else {
        block_size
    }
}

/// Inputs of `rope_quant_insert`, as plain data.
#[derive(Clone, Debug)]
pub struct InsertSpec {
    /// 1 or 2.
    pub cr: u32,
    /// BF16 latent rows, `rows * 512` (`rows >= n`).
    pub latent: Vec<u16>,
    /// Positions (`len >= n`).
    pub positions: Vec<i64>,
    /// Cache slots (`len == n`).
    pub slots: Vec<i64>,
    /// The table.
    pub cos_sin: CosSinSpec,
    /// The cache.
    pub cache: CacheSpec,
    /// I64 index tensors.
    pub index_i64: bool,
    /// Buffer geometry.
    pub geo: Geo,
}

fn empty_case(name: &str, kind: Kind) -> Case {
    Case {
        name: name.to_string(),
        kind,
        eps: 1e-6,
        compress_ratio: kind.cr,
        kv_score: None,
        positions: None,
        slot_mapping: Buf::index(&[], false, 0, 0),
        cache_slot_mapping: None,
        query_start_loc: None,
        token_to_req_indices: None,
        rms_norm_weight: None,
        state_cache: None,
        prev_rows: None,
        prev_row_indices: None,
        latent: None,
        rows: None,
        cos_sin_cache: None,
        kv_cache: None,
        fp8_scale: None,
    }
}

/// A `FusedSaveCompressNorm` case.
pub fn compress_case(name: &str, s: &CompressSpec, sanitize: bool) -> Case {
    let mut k = Kind::new(Op::FusedSaveCompressNorm, s.cr, RecordLayout::V4);
    k.sanitize = sanitize;
    k.index_i64 = s.index_i64;
    k.prev_rows = s.prev.is_some();
    k.weight_dtype = s.weight_dtype;
    let mut c = empty_case(name, k);
    s.fill(&mut c);
    c
}

/// A `RopeQuantInsert` case.
pub fn insert_case(name: &str, s: &InsertSpec, sanitize: bool) -> Case {
    let mut k = Kind::new(Op::RopeQuantInsert, s.cr, s.cache.layout);
    k.sanitize = sanitize;
    k.index_i64 = s.index_i64;
    k.cos_dtype = s.cos_sin.dtype;
    let mut c = empty_case(name, k);
    let g = s.geo;
    let rows = s.latent.len() / 512;
    c.latent = Some(Buf::new(
        TensorDesc::contiguous(DType::BF16, &[rows, 512]).with_offset(g.offset),
        g.tail,
        &u16_bytes(&s.latent),
    ));
    c.positions = Some(Buf::index(&s.positions, s.index_i64, g.offset, g.tail));
    c.slot_mapping = Buf::index(&s.slots, s.index_i64, g.offset, g.tail);
    c.cos_sin_cache = Some(s.cos_sin.buf(g));
    let (cache, scale) = s.cache.bufs(g);
    c.kv_cache = Some(cache);
    c.fp8_scale = scale;
    c
}

/// A `FusedCompressInsert` case: the compressor's inputs plus the insert's table, cache
/// and cache slots (`len == n`).
pub fn fused_case(
    name: &str,
    s: &CompressSpec,
    cache_slots: &[i64],
    cos_sin: &CosSinSpec,
    cache: &CacheSpec,
    skip_latent_out: bool,
    sanitize: bool,
) -> Case {
    let mut c = compress_case(name, s, sanitize);
    c.kind.op = Op::FusedCompressInsert;
    c.kind.skip_latent_out = skip_latent_out;
    c.kind.layout = cache.layout;
    c.kind.cos_dtype = cos_sin.dtype;
    c.cache_slot_mapping = Some(Buf::index(
        cache_slots,
        s.index_i64,
        s.geo.offset,
        s.geo.tail,
    ));
    c.cos_sin_cache = Some(cos_sin.buf(s.geo));
    let (kc, scale) = cache.bufs(s.geo);
    c.kv_cache = Some(kc);
    c.fp8_scale = scale;
    c
}

#[allow(clippy::too_many_arguments)]
/// A `SaveRingRows` case: `rows` is `n * 1024` values with row stride
/// `1024 + row_pad`.
pub fn ring_case(
    name: &str,
    rows: &[f32],
    row_pad: usize,
    slots: &[i64],
    ring: &RingSpec,
    index_i64: bool,
    geo: Geo,
    sanitize: bool,
) -> Case {
    let mut k = Kind::new(Op::SaveRingRows, 2, RecordLayout::V4);
    k.sanitize = sanitize;
    k.index_i64 = index_i64;
    let mut c = empty_case(name, k);
    let n = rows.len() / 1024;
    c.rows = Some(Buf::f32_rows(
        rows,
        n,
        1024,
        1024 + row_pad,
        geo.offset,
        geo.tail,
    ));
    c.slot_mapping = Buf::index(slots, index_i64, geo.offset, geo.tail);
    c.state_cache = Some(ring.buf(geo));
    c
}

// ---- random data ---------------------------------------------------------------------

/// Fills rows of 512 values (each half of a `[kv 512 | score 512]` row on
/// its own): a row is either `±[2^-4, 2^5)` or `±[2^-8, 2^5)` throughout;
/// with `special`, about 2% of the values are [`SPECIAL_F32`] and about 5%
/// of the rows are zero.
pub fn fill_kv_rows(rng: &mut Prng, v: &mut [f32], special: bool) {
    for row in v.chunks_mut(512) {
        let zero_row = special && rng.chance(0.05);
        let score_like = rng.chance(0.5);
        for x in row.iter_mut() {
            *x = if zero_row {
                0.0
            } else if special && rng.chance(0.02) {
                f32::from_bits(rng.pick(&SPECIAL_F32))
            } else if score_like {
                rng.f32_exp(-8, 4)
            } else {
                rng.f32_exp(-4, 4)
            };
        }
    }
}

/// A BF16 latent row: ordinary values `±[2^-8, 2^6)`, or with `special`
/// also specials, wide exponents and zero rows.
pub fn latent_row(rng: &mut Prng, special: bool) -> Vec<u16> {
    if special && rng.chance(0.05) {
        let z = if rng.chance(0.5) { 0x0000 } else { 0x8000 };
        return vec![z; 512];
    }
    let wide = special && rng.chance(0.3);
    (0..512)
        .map(|_| {
            if special && rng.chance(0.03) {
                rng.pick(&SPECIAL_BF16)
            } else if wide {
                bf16_from_f32(rng.f32_exp(-100, 100))
            } else {
                bf16_from_f32(rng.f32_exp(-8, 5))
            }
        })
        .collect()
}

/// A BF16 weight near 1.
pub fn weight(rng: &mut Prng) -> Vec<u16> {
    (0..512)
        .map(|_| bf16_from_f32(0.5 + rng.unit() as f32))
        .collect()
}

/// A random CR1 compressor spec for `n` tokens: `slots[t]` are the given
/// marks.
fn cr1_spec(
    rng: &mut Prng,
    k: &Kind,
    slots: Vec<i64>,
    positions: Vec<i64>,
    geo: Geo,
) -> CompressSpec {
    let n = slots.len();
    let rows = n + rng.below(3);
    let mut kv = vec![0.0f32; rows * 512];
    fill_kv_rows(rng, &mut kv, k.special_values);
    let mut positions = positions;
    while positions.len() < rows {
        positions.push(rng.range(0, 30));
    }
    CompressSpec {
        cr: 1,
        eps: 1e-6,
        kv,
        kv_row_pad: 16 * rng.below(2),
        positions,
        slots,
        qsl: vec![],
        ttr: vec![],
        weight: weight(rng),
        weight_dtype: k.weight_dtype,
        ring: None,
        prev: None,
        index_i64: k.index_i64,
        geo,
    }
}

/// One request of a CR2 batch.
#[derive(Clone, Debug)]
pub struct Chunk {
    /// Ring block of the request.
    pub block: usize,
    /// Position of the chunk's first token.
    pub start_pos: i64,
    /// Tokens in the chunk.
    pub len: usize,
}

/// Packs chunks into CR2 positions, ring slots, `query_start_loc` and
/// `token_to_req_indices`: slot `block * cap + p % cap`.
pub fn pack_chunks(chunks: &[Chunk], cap: usize) -> (Vec<i64>, Vec<i64>, Vec<i64>, Vec<i64>) {
    let (mut pos, mut slots, mut qsl, mut ttr) = (vec![], vec![], vec![0i64], vec![]);
    for (r, c) in chunks.iter().enumerate() {
        for i in 0..c.len {
            let p = c.start_pos + i as i64;
            pos.push(p);
            slots.push((c.block * cap) as i64 + p.rem_euclid(cap as i64));
            ttr.push(r as i64);
        }
        qsl.push(pos.len() as i64);
    }
    (pos, slots, qsl, ttr)
}

/// A random CR2 compressor spec. Returns the spec and the chunks.
fn cr2_spec(rng: &mut Prng, k: &Kind, geo: Geo) -> (CompressSpec, Vec<Chunk>) {
    let reqs = 1 + rng.below(4);
    let cap = 1 + rng.below(4);
    let blocks = reqs + rng.below(2);
    let order = rng.distinct(blocks, reqs);
    let chunks: Vec<Chunk> = order
        .iter()
        .map(|&block| Chunk {
            block,
            start_pos: rng.range(0, 12),
            len: rng.below(6),
        })
        .collect();
    let (mut positions, mut slots, mut qsl, mut ttr) = pack_chunks(&chunks, cap);
    let n = slots.len();
    for s in slots.iter_mut() {
        if rng.chance(0.08) {
            *s = -1;
        }
    }
    if k.wild_indices {
        for t in 0..n {
            match rng.below(12) {
                0 => slots[t] = (blocks * cap + rng.below(3)) as i64,
                1 => positions[t] = -rng.range(1, 4),
                2 => ttr[t] = rng.range(-2, reqs as i64 + 1),
                _ => {}
            }
        }
        if rng.chance(0.2) {
            // The last chunk claims tokens beyond N (only the first N count).
            *qsl.last_mut().expect("non-empty") += rng.range(1, 3);
        }
    }
    let pad = rng.below(3);
    let rows = n + pad;
    while positions.len() < rows {
        positions.push(rng.range(0, 30));
    }
    while ttr.len() < rows {
        ttr.push(0);
    }
    let mut kv = vec![0.0f32; rows * 1024];
    fill_kv_rows(rng, &mut kv, k.special_values);
    let prev = k.prev_rows.then(|| {
        let pr = reqs + rng.below(3);
        let mut rows_v = vec![0.0f32; pr * 1024];
        fill_kv_rows(rng, &mut rows_v, k.special_values);
        let picks = rng.distinct(pr, reqs);
        let mut idx: Vec<i64> = picks
            .into_iter()
            .map(|j| if rng.chance(0.3) { -1 } else { j as i64 })
            .collect();
        if k.wild_indices && rng.chance(0.3) {
            let r = rng.below(reqs);
            idx[r] = (pr + rng.below(2)) as i64;
        }
        for _ in 0..rng.below(2) {
            idx.push(rng.range(-1, pr as i64 - 1));
        }
        (rows_v, idx)
    });
    let spec = CompressSpec {
        cr: 2,
        eps: 1e-6,
        kv,
        kv_row_pad: 16 * rng.below(2),
        positions,
        slots,
        qsl,
        ttr,
        weight: weight(rng),
        weight_dtype: k.weight_dtype,
        ring: Some(RingSpec::random(rng, blocks, cap, k.special_values)),
        prev,
        index_i64: k.index_i64,
        geo,
    };
    (spec, chunks)
}

/// A random `rope_quant_insert` of `n` tokens over `rows >= n` latent rows,
/// positions below `max_pos` (CR2: mostly odd, closing a group) and a cos/sin
/// table of `max_pos + 1` rows; `kind.wild_indices` adds slots past the cache
/// and positions below 0 or past the table.
pub fn random_insert_spec(
    rng: &mut Prng,
    kind: &Kind,
    geo: Geo,
    n: usize,
    rows: usize,
    max_pos: usize,
) -> InsertSpec {
    let latent: Vec<u16> = (0..rows)
        .flat_map(|_| latent_row(rng, kind.special_values))
        .collect();
    let mut positions: Vec<i64> = (0..rows)
        .map(|_| {
            let p = rng.range(0, max_pos as i64);
            if kind.cr == 2 && rng.chance(0.6) {
                p | 1
            } else {
                p
            }
        })
        .collect();
    let cache = CacheSpec::random(rng, kind.layout, n);
    let mut slots: Vec<i64> = rng
        .distinct(cache.capacity(), n)
        .into_iter()
        .map(|s| s as i64)
        .collect();
    for s in slots.iter_mut() {
        if rng.chance(0.15) {
            *s = -1;
        }
    }
    if kind.wild_indices {
        for t in 0..n {
            match rng.below(10) {
                0 => slots[t] = (cache.capacity() + rng.below(3)) as i64,
                1 => positions[t] = -rng.range(1, 3),
                2 => positions[t] = max_pos as i64 + 1 + rng.range(0, 4),
                _ => {}
            }
        }
    }
    InsertSpec {
        cr: kind.cr,
        latent,
        positions,
        slots,
        cos_sin: CosSinSpec::rotations(rng, max_pos + 1, kind.cos_dtype),
        cache,
        index_i64: kind.index_i64,
        geo,
    }
}

/// A random valid case of `kind` from `seed` (with `kind.wild_indices`,
/// some indices point outside their tensors; with `kind.special_values`,
/// some values are special). Slots of different tokens are distinct, so
/// the result does not depend on the order of writes.
pub fn random_case(seed: u64, kind: Kind) -> Case {
    let mut rng = Prng::new(seed);
    let rng = &mut rng;
    let geo = Geo::random(rng);
    let name = format!("random {kind:?} seed {seed:#x}");
    let mut case = match kind.op {
        Op::RopeQuantInsert => {
            let n = rng.below(9);
            let rows = n + rng.below(3);
            let spec = random_insert_spec(rng, &kind, geo, n, rows, 24);
            insert_case(&name, &spec, kind.sanitize)
        }
        Op::FusedSaveCompressNorm | Op::FusedCompressInsert => {
            let spec = if kind.cr == 1 {
                let n = rng.below(9);
                let marks: Vec<i64> = (0..n)
                    .map(|_| {
                        if rng.chance(0.15) {
                            -1
                        } else {
                            rng.range(0, 1000)
                        }
                    })
                    .collect();
                let positions: Vec<i64> = (0..n)
                    .map(|_| {
                        if kind.wild_indices && rng.chance(0.1) {
                            -1
                        } else {
                            rng.range(0, 24)
                        }
                    })
                    .collect();
                cr1_spec(rng, &kind, marks, positions, geo)
            } else {
                cr2_spec(rng, &kind, geo).0
            };
            match kind.op {
                Op::FusedCompressInsert => {
                    let n = spec.slots.len();
                    let cache = CacheSpec::random(rng, kind.layout, n);
                    let picks = rng.distinct(cache.capacity(), n);
                    let mut cslots: Vec<i64> = spec
                        .slots
                        .iter()
                        .zip(picks)
                        .map(|(&s, p)| if s < 0 { -1 } else { p as i64 })
                        .collect();
                    if kind.wild_indices {
                        for s in cslots.iter_mut() {
                            if rng.chance(0.1) {
                                *s = (cache.capacity() + rng.below(3)) as i64;
                            }
                        }
                    }
                    let mut spec = spec;
                    if kind.cr == 1 {
                        // CR1's slot_mapping holds the main-cache slots.
                        spec.slots.clone_from(&cslots);
                    }
                    let cs = CosSinSpec::rotations(rng, 32, kind.cos_dtype);
                    fused_case(
                        &name,
                        &spec,
                        &cslots,
                        &cs,
                        &cache,
                        kind.skip_latent_out,
                        kind.sanitize,
                    )
                }
                _ => compress_case(&name, &spec, kind.sanitize),
            }
        }
        Op::GatherDequant => panic!("the reader's cases are in tests/gather_cases"),
        Op::SaveRingRows => {
            let blocks = 1 + rng.below(3);
            let cap = 1 + rng.below(4);
            let ring = RingSpec::random(rng, blocks, cap, kind.special_values);
            let n = rng.below(blocks * cap + 1);
            let mut slots: Vec<i64> = rng
                .distinct(blocks * cap, n)
                .into_iter()
                .map(|s| s as i64)
                .collect();
            for s in slots.iter_mut() {
                if rng.chance(0.15) {
                    *s = -1;
                } else if kind.wild_indices && rng.chance(0.15) {
                    *s = (blocks * cap + rng.below(3)) as i64;
                }
            }
            let mut rows = vec![0.0f32; n * 1024];
            fill_kv_rows(rng, &mut rows, kind.special_values);
            ring_case(
                &name,
                &rows,
                4 * rng.below(3),
                &slots,
                &ring,
                kind.index_i64,
                geo,
                kind.sanitize,
            )
        }
    };
    case.kind = kind;
    case
}

/// A proptest strategy of random cases of the given kinds.
pub fn case_strategy(kinds: impl Strategy<Value = Kind>) -> impl Strategy<Value = Case> {
    (any::<u64>(), kinds).prop_map(|(seed, kind)| random_case(seed, kind))
}

// ---- adversarial cases ------------------------------------------------------------------

fn bf16_of(x: f32) -> u16 {
    bf16_from_f32(x)
}

/// Latent rows that stress the formats (each row 512 BF16 values).
pub fn adversarial_latents() -> Vec<(&'static str, Vec<u16>)> {
    let mut out: Vec<(&'static str, Vec<u16>)> = Vec::new();
    out.push(("zeros", vec![0x0000; 512]));
    out.push(("negative zeros", vec![0x8000; 512]));
    // Every sign combination of a zero next to a zero, a positive and a
    // negative value, in NoPE pairs and RoPE pairs alike.
    let vals = [0x0000u16, 0x8000, 0x3f80, 0xbf80];
    let mut mixed = Vec::with_capacity(512);
    while mixed.len() < 512 {
        for &e in &vals {
            for &o in &vals {
                mixed.push(e);
                mixed.push(o);
            }
        }
    }
    mixed.truncate(512);
    out.push(("signed zero pairs", mixed));
    // NaNs of both signs among ordinary values, in NoPE and RoPE dims.
    let mut nan = vec![bf16_of(0.75); 512];
    for (i, x) in nan.iter_mut().enumerate() {
        if i % 37 == 3 {
            *x = 0x7fc0;
        } else if i % 37 == 20 {
            *x = 0xffc0;
        } else if i % 5 == 0 {
            *x = bf16_of(-1.5);
        }
    }
    nan[449] = 0x7fc0;
    nan[500] = 0xffc0;
    out.push(("nans", nan));
    // Whole NaN tiles/blocks: the NVFP4 scale of an all-NaN tile is the
    // 2^-9 floor; an all-NaN FP8 block gets the scale of the amax floor.
    let mut nan_tiles = vec![bf16_of(-3.0); 512];
    nan_tiles[..32].fill(0x7fc0);
    nan_tiles[64..128].fill(0xffc0);
    nan_tiles[448..480].fill(0x7fc0);
    out.push(("all-NaN tiles", nan_tiles));
    // Infinities among ordinary values (a block with ±inf gets the top scale).
    let mut inf = vec![bf16_of(2.0); 512];
    for (i, x) in inf.iter_mut().enumerate() {
        if i % 41 == 7 {
            *x = 0x7f80;
        } else if i % 41 == 30 {
            *x = 0xff80;
        } else if i % 3 == 0 {
            *x = bf16_of(-0.5);
        }
    }
    inf[460] = 0xff80;
    out.push(("infinities", inf));
    // Huge and tiny magnitudes.
    let mut ext = vec![0u16; 512];
    for (i, x) in ext.iter_mut().enumerate() {
        *x = [
            0x7f7f, 0xff7f, 0x7f00, 0x0001, 0x8001, 0x0080, 0x38d1, 0x0000,
        ][i % 8];
    }
    out.push(("extremes", ext));
    // Huge values one block, tiny the next (scale bytes at both ends).
    let mut split = vec![0u16; 512];
    for (i, x) in split.iter_mut().enumerate() {
        let huge = (i / 32) % 2 == 0;
        let v = if huge {
            0x7e00 | (i as u16 & 0x7f)
        } else {
            0x0100 | (i as u16 & 0x7f)
        };
        *x = if i % 2 == 0 { v } else { v | 0x8000 };
    }
    out.push(("huge and tiny blocks", split));
    // e2m1 ties: tiles whose amax is 6 (so the NVFP4 scale is exactly 1 and
    // q = r), holding every tie exactly and one bf16 ulp above or below it.
    let ties = [0.25f32, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0];
    let mut t = Vec::with_capacity(512);
    for tile in 0..32 {
        let mut v = vec![bf16_of(6.0)];
        for (j, &x) in ties.iter().enumerate() {
            v.push(bf16_of(x));
            let b = bf16_of(x);
            v.push(if (tile + j) % 2 == 0 { b + 1 } else { b - 1 });
        }
        v.push(0x8000);
        if tile % 2 == 1 {
            v.iter_mut().for_each(|h| *h ^= 0x8000);
        }
        t.extend(v);
    }
    out.push(("e2m1 ties", t));
    // Block maxima at 448 * 2^k and one bf16 ulp around (FP8 scale edges),
    // for k across the range.
    let mut pw = vec![0u16; 512];
    for (i, x) in pw.iter_mut().enumerate() {
        let block = i / 32;
        let k = block as i32 * 3 - 24;
        let amax = bf16_of(448.0 * 2f32.powi(k));
        let lead = [amax, amax + 1, amax - 1][block % 3];
        *x = if i % 32 == 5 {
            lead
        } else {
            bf16_of(2f32.powi(k) * ((i % 7) as f32 + 0.5))
        };
    }
    out.push(("powers of two", pw));
    // Values one ulp around powers of two everywhere.
    let mut ulp = vec![0u16; 512];
    for (i, x) in ulp.iter_mut().enumerate() {
        let p = bf16_of(2f32.powi((i % 40) as i32 - 20));
        *x = [p, p + 1, p - 1, p | 0x8000][i % 4];
    }
    out.push(("ulp around powers of two", ulp));
    // All below the FP8 amax floor 1e-4.
    out.push((
        "below amax floor",
        (0..512)
            .map(|i| bf16_of(1e-6 * ((i % 9) as f32 - 4.0)))
            .collect(),
    ));
    out
}

/// BF16 weight values the adversarial cases of the generic kernels start
/// their weights with: zeros, infinities, a NaN, values that are F16
/// subnormals or overflow F16, the largest finite BF16.
pub const ADVERSARIAL_WEIGHT: [u16; 10] = [
    0x0000, 0x8000, 0x7f80, 0xff80, 0x7fc1, 0x3580, 0xb4c0, 0x4780, 0x7f7f, 0x3f81,
];

/// A cos/sin table with the rows that matter for signed zeros and special
/// values: identity, quarter turns, half turns, 45 degrees, `-0`, and a row
/// holding the neighbours of 1.
pub fn adversarial_cos_sin(dtype: DType) -> CosSinSpec {
    let rows_cs: [(f32, f32); 8] = [
        (1.0, 0.0),
        (0.0, 1.0),
        (-1.0, -0.0),
        (
            std::f32::consts::FRAC_1_SQRT_2,
            std::f32::consts::FRAC_1_SQRT_2,
        ),
        (-0.0, -1.0),
        (0.6, -0.8),
        (f32::from_bits(0x3f7f_ffff), f32::from_bits(0x3980_0000)),
        (-0.0, 0.0),
    ];
    let width = 64;
    let mut data = vec![0.0f32; 16 * width];
    for p in 0..16 {
        let (c, s) = rows_cs[p % rows_cs.len()];
        for k in 0..32 {
            // Vary the pairs within a row a little too.
            let (c, s) = if k % 5 == 4 { (s, c) } else { (c, s) };
            data[p * width + k] = c;
            data[p * width + 32 + k] = s;
        }
    }
    CosSinSpec {
        data,
        rows: 16,
        width,
        stride: width,
        dtype,
    }
}

/// Hand-made cases of every op: adversarial values (±0, NaN `0x7FC0` and
/// `0xFFC0`, ±inf, huge and tiny, e2m1 ties, one ulp around powers of two,
/// zero rows) and adversarial indices (slot -1, slots out of range, negative
/// positions, positions beyond the table, tokens outside their chunk,
/// request and `prev_rows` indices out of range, empty chunks), for every
/// layout, CR1 and CR2, sanitize on and off, I32 and I64 indices, F32 and
/// BF16 cos/sin. Every case passes validation; different tokens never
/// write one slot, so the bytes do not depend on the order of writes.
pub fn adversarial_cases() -> Vec<Case> {
    let mut out = Vec::new();
    let lat = adversarial_latents();
    let mut rng = Prng::new(0xAD7E);
    let mut variant = 0usize;
    for layout in RecordLayout::ALL {
        for sanitize in [false, true] {
            for cr in [1u32, 2] {
                variant += 1;
                let index_i64 = variant % 2 == 0;
                let cos_dtype = if variant % 3 == 0 {
                    DType::BF16
                } else {
                    DType::F32
                };
                let geo = Geo {
                    offset: 64 * (variant % 2),
                    tail: 16,
                };
                // Each latent at a group boundary with a valid slot, under
                // several cos/sin rows; then the index edge cases.
                let mut latent: Vec<u16> = Vec::new();
                let mut positions = Vec::new();
                let mut slots = Vec::new();
                let table = adversarial_cos_sin(cos_dtype);
                for (i, (_, row)) in lat.iter().enumerate() {
                    latent.extend(row);
                    let base = (2 * i + variant) % table.rows;
                    let base = base - base % cr as usize;
                    positions.push((base + cr as usize - 1) as i64);
                    slots.push(i as i64);
                }
                let n_ok = slots.len();
                let cache = CacheSpec {
                    layout,
                    blocks: 4,
                    block_size: v4_even(layout, n_ok.div_ceil(4) + 1),
                    block_pad_bytes: 16,
                    row_pad_bytes: 16 * (variant % 2),
                    rank4: variant % 4 == 1,
                    fp8_scale: [1.0, 0.0137, 3.7][variant % 3],
                };
                let cap = cache.capacity() as i64;
                // (slot, position) edge cases on an ordinary latent row.
                let edges: [(i64, i64); 6] = [
                    (-1, cr as i64 - 1),
                    (cap, cr as i64 - 1),
                    (cap + 1000, cr as i64 - 1),
                    (n_ok as i64, -1),
                    (n_ok as i64 + 1, table.rows as i64 + cr as i64 - 1),
                    (n_ok as i64 + 2, if cr == 2 { 2 } else { -5 }),
                ];
                for (s, p) in edges {
                    latent.extend(rng_row(&mut rng));
                    slots.push(s);
                    positions.push(p);
                }
                // One padding row beyond N.
                latent.extend(rng_row(&mut rng));
                positions.push(0);
                let spec = InsertSpec {
                    cr,
                    latent,
                    positions,
                    slots,
                    cos_sin: table,
                    cache,
                    index_i64,
                    geo,
                };
                let name = format!(
                    "adversarial insert {} cr{cr} sanitize={sanitize}",
                    layout.name()
                );
                out.push(insert_case(&name, &spec, sanitize));
                if !sanitize {
                    // The same records from an F16 table (the generic kernels).
                    let mut spec = spec;
                    spec.cos_sin = adversarial_cos_sin(DType::F16);
                    out.push(insert_case(&format!("{name} cos_sin F16"), &spec, sanitize));
                }
            }
        }
    }

    // Compressor: adversarial rows, CR1 and CR2, with and without prev_rows.
    for sanitize in [false, true] {
        for index_i64 in [false, true] {
            out.push(adversarial_cr1(&mut rng, 1e-6, index_i64, sanitize));
            for prev in [false, true] {
                out.push(adversarial_cr2(&mut rng, prev, index_i64, sanitize));
            }
        }
        let prev = sanitize;
        let s = swept_cr2_spec(&mut rng, prev, !sanitize);
        out.push(compress_case(
            &format!("swept cr2 prev_rows={prev}"),
            &s,
            sanitize,
        ));
    }
    // eps = 0 with zero rows: 1/sqrt(0) = inf, 0 * inf = NaN.
    out.push(adversarial_cr1(&mut rng, 0.0, false, false));

    // Fused: the compressor's edge cases into every layout, with cache slots
    // that disagree with the compressor's (-1 against valid, out of range).
    for (i, layout) in RecordLayout::ALL.into_iter().enumerate() {
        for cr in [1u32, 2] {
            let sanitize = i % 2 == 1;
            let base = if cr == 1 {
                adversarial_cr1_spec(&mut rng, 1e-6, i % 2 == 0)
            } else {
                adversarial_cr2_spec(&mut rng, cr == 2 && i % 2 == 0, i % 2 == 0)
            };
            let n = base.slots.len();
            let cache = CacheSpec {
                layout,
                blocks: 3,
                block_size: v4_even(layout, n.div_ceil(3) + 1),
                block_pad_bytes: 0,
                row_pad_bytes: 16,
                rank4: false,
                fp8_scale: 0.25,
            };
            let cap = cache.capacity() as i64;
            let cslots: Vec<i64> = (0..n)
                .map(|t| match t % 9 {
                    3 => -1,
                    7 => cap + t as i64,
                    _ => t as i64,
                })
                .collect();
            let mut spec = base;
            if cr == 1 {
                // Some tokens valid for the compressor but not the cache, and
                // the other way round.
                for (t, s) in spec.slots.iter_mut().enumerate() {
                    *s = if t % 9 == 5 { -1 } else { t as i64 };
                }
            }
            let table = adversarial_cos_sin(if i % 2 == 0 { DType::BF16 } else { DType::F32 });
            for skip in [false, true] {
                let name = format!(
                    "adversarial fused {} cr{cr} skip_latent_out={skip}",
                    layout.name()
                );
                out.push(fused_case(
                    &name, &spec, &cslots, &table, &cache, skip, sanitize,
                ));
            }
            // The generic kernels: F32 and F16 weights holding special
            // values (F16 subnormals and overflow among them), F16 tables.
            for (w, cs) in [(DType::F32, DType::F16), (DType::F16, DType::BF16)] {
                let mut spec = spec.clone();
                spec.weight_dtype = w;
                spec.weight[..ADVERSARIAL_WEIGHT.len()].copy_from_slice(&ADVERSARIAL_WEIGHT);
                let name = format!(
                    "adversarial fused {} cr{cr} weight {w} cos_sin {cs}",
                    layout.name()
                );
                let table = adversarial_cos_sin(cs);
                out.push(fused_case(
                    &name, &spec, &cslots, &table, &cache, false, sanitize,
                ));
            }
        }
    }
    // The swept compressor batches fused into every layout (screened
    // there), cache slots -1 on every seventh token.
    for (i, layout) in RecordLayout::ALL.into_iter().enumerate() {
        let spec = swept_cr2_spec(&mut rng, i % 2 == 1, i % 2 == 0);
        let n = spec.slots.len();
        let cache = CacheSpec {
            layout,
            blocks: 5,
            block_size: v4_even(layout, n.div_ceil(5) + 1),
            block_pad_bytes: 16,
            row_pad_bytes: 0,
            rank4: i % 2 == 0,
            fp8_scale: 0.5,
        };
        let cslots: Vec<i64> = (0..n as i64)
            .map(|t| if t % 7 == 3 { -1 } else { t })
            .collect();
        let table = adversarial_cos_sin(DType::F32);
        let name = format!("empty requests fused {} cr2", layout.name());
        out.push(fused_case(
            &name,
            &spec,
            &cslots,
            &table,
            &cache,
            i % 2 == 1,
            i % 3 == 0,
        ));
    }

    // save_ring_rows: NaN payloads are copied bit for bit; -1 and out of range skip.
    for index_i64 in [false, true] {
        let ring = RingSpec::random(&mut rng, 2, 3, false);
        let n = 7;
        let mut rows = vec![0.0f32; n * 1024];
        fill_kv_rows(&mut rng, &mut rows, true);
        for (j, x) in rows.iter_mut().enumerate() {
            if j % 97 == 0 {
                *x = f32::from_bits(SPECIAL_F32[(j / 97) % SPECIAL_F32.len()]);
            }
        }
        let slots = [5, -1, 0, 6, 3, 1000, 2];
        out.push(ring_case(
            "adversarial save_ring_rows",
            &rows,
            4,
            &slots,
            &ring,
            index_i64,
            Geo {
                offset: 64,
                tail: 16,
            },
            index_i64,
        ));
    }
    out
}

fn rng_row(rng: &mut Prng) -> Vec<u16> {
    latent_row(rng, false)
}

/// Rows that stress the norm: zero, tiny (squares underflow), huge (squares
/// overflow), NaN, ±inf, one huge element, ordinary.
fn adversarial_kv_rows(rng: &mut Prng, rows: usize, width: usize) -> Vec<f32> {
    let mut v = vec![0.0f32; rows * width];
    for (r, row) in v.chunks_mut(width).enumerate() {
        for (j, x) in row.iter_mut().enumerate() {
            *x = match r % 9 {
                0 => 0.0,
                1 => f32::from_bits(0x0000_0100 + j as u32) * if j % 2 == 0 { 1.0 } else { -1.0 },
                2 => 3e38 * if j % 3 == 0 { -1.0 } else { 1.0 },
                3 => {
                    if j == 17 || j == 600 {
                        f32::NAN
                    } else {
                        rng.f32_exp(-3, 3)
                    }
                }
                4 => {
                    if j == 3 {
                        f32::INFINITY
                    } else if j == 700 {
                        f32::NEG_INFINITY
                    } else {
                        rng.f32_exp(-3, 3)
                    }
                }
                5 => {
                    if j == 0 {
                        1e30
                    } else {
                        rng.f32_exp(-3, 3)
                    }
                }
                6 => -0.0,
                // Scores far apart: one weight underflows to 0.
                7 => {
                    if j >= 512 {
                        if j % 2 == 0 {
                            90.0
                        } else {
                            -90.0
                        }
                    } else {
                        rng.f32_exp(-3, 3)
                    }
                }
                _ => rng.f32_exp(-3, 3),
            };
        }
    }
    v
}

fn adversarial_cr1_spec(rng: &mut Prng, eps: f32, index_i64: bool) -> CompressSpec {
    let n = 11;
    let kv = adversarial_kv_rows(rng, n + 1, 512);
    let slots: Vec<i64> = (0..n as i64).map(|t| if t == 4 { -1 } else { t }).collect();
    let mut positions: Vec<i64> = (0..n as i64 + 1).collect();
    positions[2] = -3;
    CompressSpec {
        cr: 1,
        eps,
        kv,
        kv_row_pad: 16,
        positions,
        slots,
        qsl: vec![],
        ttr: vec![],
        weight: weight(rng),
        weight_dtype: DType::BF16,
        ring: None,
        prev: None,
        index_i64,
        geo: Geo {
            offset: 64,
            tail: 16,
        },
    }
}

fn adversarial_cr1(rng: &mut Prng, eps: f32, index_i64: bool, sanitize: bool) -> Case {
    let s = adversarial_cr1_spec(rng, eps, index_i64);
    compress_case(&format!("adversarial cr1 eps={eps}"), &s, sanitize)
}

/// CR2 edge cases: an empty chunk, a chunk whose first slot is -1, a chunk
/// longer than the ring, a chunk starting at an odd position (reads the ring
/// or `prev_rows`), a token outside its chunk, a request index out of range,
/// a negative position, a ring slot out of range on a chunk's first token,
/// a `prev_row_indices` entry out of range.
fn adversarial_cr2_spec(rng: &mut Prng, prev: bool, index_i64: bool) -> CompressSpec {
    let cap = 3usize;
    let blocks = 7usize;
    let chunks = [
        Chunk {
            block: 0,
            start_pos: 5,
            len: 4,
        }, // odd start: reads predecessor
        Chunk {
            block: 1,
            start_pos: 0,
            len: 0,
        }, // empty
        Chunk {
            block: 2,
            start_pos: 3,
            len: 3,
        }, // first slot -1 below
        Chunk {
            block: 3,
            start_pos: 10,
            len: 7,
        }, // longer than the ring
        Chunk {
            block: 4,
            start_pos: 7,
            len: 2,
        }, // first token's ring slot out of range below
        Chunk {
            block: 5,
            start_pos: 1,
            len: 3,
        }, // token outside chunk / bad request below
        Chunk {
            block: 6,
            start_pos: 9,
            len: 1,
        }, // prev index out of range (with prev)
    ];
    let (mut positions, mut slots, qsl, mut ttr) = pack_chunks(&chunks, cap);
    let start = |r: usize| qsl[r] as usize;
    slots[start(2)] = -1;
    slots[start(4)] = (blocks * cap + 2) as i64;
    ttr[start(5) + 2] = 0; // position 3 claims request 0, whose chunk does not hold it
    ttr[start(0) + 2] = 9; // position 7 of request 0 names no request
    positions[start(3) + 3] = -1;
    let n = slots.len();
    let rows = n + 2;
    while positions.len() < rows {
        positions.push(1);
    }
    while ttr.len() < rows {
        ttr.push(0);
    }
    let kv = adversarial_kv_rows(rng, rows, 1024);
    let ring = RingSpec::random(rng, blocks, cap, true);
    let prev = prev.then(|| {
        let pr = 4;
        let mut rows_v = vec![0.0f32; pr * 1024];
        fill_kv_rows(rng, &mut rows_v, true);
        (rows_v, vec![2, -1, 0, 1, -1, 3, 4])
    });
    CompressSpec {
        cr: 2,
        eps: 1e-6,
        kv,
        kv_row_pad: 0,
        positions,
        slots,
        qsl,
        ttr,
        weight: weight(rng),
        weight_dtype: DType::BF16,
        ring: Some(ring),
        prev,
        index_i64,
        geo: Geo {
            offset: 0,
            tail: 64,
        },
    }
}

/// A CR2 decode batch with no more tokens than requests, so that the plain
/// compressor's team kernels sweep their token blocks (a token per lane; the
/// fused ones screen them), whose tokens then pool groups only because a
/// third of the requests are empty: long chunks
/// across sweep blocks (64 and 128 tokens), one-token chunks at odd and even
/// positions, a slot -1, a negative position and a token outside its chunk.
fn swept_cr2_spec(rng: &mut Prng, prev: bool, index_i64: bool) -> CompressSpec {
    let cap = 3usize;
    let mut chunks = Vec::new();
    let mut push = |len: usize, start_pos: i64| {
        let block = chunks.len();
        chunks.push(Chunk {
            block,
            start_pos,
            len,
        })
    };
    for r in 0..100 {
        push(1, (r * 7 % 31) as i64);
    }
    push(70, 5);
    (0..99).for_each(|_| push(0, 0));
    push(40, 2);
    for r in 0..60 {
        push(1, (r * 5 % 23) as i64);
    }
    (0..39).for_each(|_| push(0, 0));
    push(3, 7);
    for r in 0..19 {
        push(1, (r * 3 % 11) as i64);
    }
    let reqs = chunks.len();
    let (mut positions, mut slots, qsl, mut ttr) = pack_chunks(&chunks, cap);
    let n = slots.len();
    assert!(
        n <= reqs && n + reqs >= 512,
        "a swept launch under the measured policy"
    );
    let start = |r: usize| qsl[r] as usize;
    slots[start(100) + 12] = -1;
    positions[start(200) + 5] = -1;
    ttr[start(100) + 9] = 0; // claims request 0, whose chunk does not hold it
    positions.push(3);
    ttr.push(0);
    let kv = adversarial_kv_rows(rng, n + 1, 1024);
    let ring = RingSpec::random(rng, reqs, cap, true);
    let prev = prev.then(|| {
        let pr = 8;
        let mut rows_v = vec![0.0f32; pr * 1024];
        fill_kv_rows(rng, &mut rows_v, true);
        let idx = (0..reqs as i64).map(|r| (r % 11) - 1).collect();
        (rows_v, idx)
    });
    CompressSpec {
        cr: 2,
        eps: 1e-6,
        kv,
        kv_row_pad: 16,
        positions,
        slots,
        qsl,
        ttr,
        weight: weight(rng),
        weight_dtype: DType::BF16,
        ring: Some(ring),
        prev,
        index_i64,
        geo: Geo {
            offset: 64,
            tail: 16,
        },
    }
}

fn adversarial_cr2(rng: &mut Prng, prev: bool, index_i64: bool, sanitize: bool) -> Case {
    let s = adversarial_cr2_spec(rng, prev, index_i64);
    compress_case(&format!("adversarial cr2 prev_rows={prev}"), &s, sanitize)
}

// ---- misc -------------------------------------------------------------------------------

/// The argument an error names.
pub fn error_arg(e: &Error) -> &'static str {
    match e {
        Error::DType { arg, .. }
        | Error::Shape { arg, .. }
        | Error::OutOfBounds { arg, .. }
        | Error::Value { arg, .. }
        | Error::Missing { arg, .. } => arg,
        other => panic!("not an argument error: {other}"),
    }
}

/// f32 of a BF16 bit pattern.
pub fn bf(h: u16) -> f32 {
    bf16_to_f32(h)
}
