//! Cases for `gather_dequant`, shared by `tests/gather.rs` (the reference
//! against the decoders and the definition in `docs/layouts.md`) and
//! `tests/gather_device.rs` (the device backends against the reference).
//!
//! A case is a cache (random bytes, adversarial bytes, or records written by
//! `rope_quant_insert`), an addressing form with its indices, and an output
//! tensor surrounded by canary bytes. [`Case::run`] runs it on any backend
//! and returns the whole output buffer and the skip counts.

#![allow(dead_code)]

use dsv4_kvcache::formats::bf16_from_f32;
use dsv4_kvcache::layout::DIM;
use dsv4_kvcache::ops::SkipCounts;
use dsv4_kvcache::testkit::rope_cos_sin;
use dsv4_kvcache::RecordOrder;
use dsv4_kvcache::{
    Backend, CpuBackend, DType, GatherArgs, GatherIndex, InsertArgs, RecordLayout, Result, Tensor,
    TensorDesc, TensorMut,
};

/// splitmix64: small, seedable, good enough for test data.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed ^ 0x9e37_79b9_7f4a_7c15)
    }
    pub fn u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in `0..n` (`n > 0`).
    pub fn below(&mut self, n: usize) -> usize {
        (self.u64() % n as u64) as usize
    }
    pub fn chance(&mut self, p: f64) -> bool {
        (self.u64() >> 11) as f64 / (1u64 << 53) as f64 > 1.0 - p
    }
    pub fn pick<T: Copy>(&mut self, xs: &[T]) -> T {
        xs[self.below(xs.len())]
    }
    pub fn byte(&mut self) -> u8 {
        self.u64() as u8
    }
}

/// The byte an untouched position of an output buffer holds.
pub fn canary_byte(i: usize) -> u8 {
    (i as u8).wrapping_mul(151).wrapping_add(0x5a)
}

/// BF16 values that stress the reader: NaNs of every sign and payload,
/// infinities, signed zeros, subnormals, extremes.
pub const BF16_SPECIALS: [u16; 16] = [
    0x7fc0, 0x7fff, 0xffc1, 0x7f81, 0xff80, 0x7f80, 0x8000, 0x0000, 0x0001, 0x8001, 0x007f, 0x807f,
    0x7f7f, 0xff7f, 0x0080, 0x3f80,
];

/// Per-tensor FP8 scales that stress the reader.
pub const FP8_SCALE_SPECIALS: [f32; 10] = [
    0.5,
    1.0,
    -3.0,
    0.0,
    -0.0,
    f32::INFINITY,
    f32::NAN,
    1.0e-40,
    3.0e38,
    0.1,
];

/// How the cache is filled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fill {
    /// Uniform random bytes (BF16 rows: random bits, specials mixed in).
    Random,
    /// Every byte value in every field, in turn; BF16 specials.
    Adversarial,
    /// Records written by `rope_quant_insert` (CPU) from random latents.
    Inserted,
}

/// Which record each output row reads.
#[derive(Debug, Clone)]
pub enum Form {
    /// `slot_mapping`.
    Slots { slots: Vec<i64>, i64: bool },
    /// `block_table [rows, cols]` (row stride `row_stride`), `cu_seq_lens`,
    /// `seq_starts`.
    Table {
        table: Vec<i64>,
        rows: usize,
        cols: usize,
        row_stride: usize,
        cu: Vec<i64>,
        starts: Option<Vec<i64>>,
        i64: bool,
    },
}

impl Form {
    /// The view of the block table (the table form only).
    fn block_table_desc(&self) -> TensorDesc {
        let Form::Table {
            rows,
            cols,
            row_stride,
            i64,
            ..
        } = self
        else {
            panic!("the slot form has no block table");
        };
        let dtype = if *i64 { DType::I64 } else { DType::I32 };
        TensorDesc::strided(dtype, &[*rows, *cols], &[*row_stride, 1]).expect("rank 2")
    }
}

/// One gather.
#[derive(Debug, Clone)]
pub struct Case {
    pub label: String,
    pub layout: RecordLayout,
    /// Where the paged records' scales are.
    pub order: RecordOrder,
    pub blocks: usize,
    pub block_size: usize,
    pub cache_desc: TensorDesc,
    pub cache: Vec<u8>,
    pub fp8_scale: Option<f32>,
    pub form: Form,
    pub out_f32: bool,
    pub out_rows: usize,
    /// Elements between output rows.
    pub out_row_stride: usize,
    /// Byte offset of the output view.
    pub out_offset: usize,
}

/// What a run leaves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// The whole output buffer.
    pub out: Vec<u8>,
    pub counts: SkipCounts,
}

fn index_bytes(v: &[i64], i64: bool) -> Vec<u8> {
    let mut b = Vec::new();
    for &x in v {
        if i64 {
            b.extend_from_slice(&x.to_le_bytes());
        } else {
            b.extend_from_slice(&(x as i32).to_le_bytes());
        }
    }
    b
}

fn index_desc(len: usize, i64: bool) -> TensorDesc {
    TensorDesc::contiguous(if i64 { DType::I64 } else { DType::I32 }, &[len])
}

impl Case {
    /// Bytes per output element.
    pub fn out_esz(&self) -> usize {
        if self.out_f32 {
            4
        } else {
            2
        }
    }

    pub fn out_desc(&self) -> TensorDesc {
        let dt = if self.out_f32 {
            DType::F32
        } else {
            DType::BF16
        };
        TensorDesc::strided(dt, &[self.out_rows, DIM], &[self.out_row_stride, 1])
            .expect("rank 2")
            .with_offset(self.out_offset)
    }

    /// The output buffer's size: the view and 64 bytes of tail.
    pub fn out_len(&self) -> usize {
        self.out_desc().end_byte().expect("small") as usize + 64
    }

    /// The output buffer before the run.
    pub fn canary_out(&self) -> Vec<u8> {
        (0..self.out_len()).map(canary_byte).collect()
    }

    /// Byte offset of output row `o`.
    pub fn out_row_at(&self, o: usize) -> usize {
        self.out_offset + o * self.out_row_stride * self.out_esz()
    }

    /// The value bytes and scale bytes of (block, row) in the cache.
    pub fn record(&self, block: usize, row: usize) -> (&[u8], &[u8]) {
        let l = self.layout;
        let d = &self.cache_desc;
        let esz = d.dtype.size();
        let page = d.offset + block * d.strides()[0] * esz;
        if l.is_paged() {
            let (v, s) = self.order.record_offsets(l, self.block_size, row);
            let (v, s) = (page + v, page + s);
            (
                &self.cache[v..v + l.value_bytes()],
                &self.cache[s..s + l.scale_bytes()],
            )
        } else {
            let v = page + row * d.strides()[1] * esz;
            (&self.cache[v..v + l.value_bytes()], &[])
        }
    }

    /// Uploads the case's tensors to `b` (the output holds canary bytes).
    pub fn upload<B: Backend>(&self, b: &B) -> Result<Uploaded<B>> {
        let cache = b.upload(&self.cache)?;
        let fp8 = match self.fp8_scale {
            Some(s) => Some(b.upload(&s.to_le_bytes())?),
            None => None,
        };
        let out = b.upload(&self.canary_out())?;
        let mut index = Vec::new();
        match &self.form {
            Form::Slots { slots, i64 } => index.push(b.upload(&index_bytes(slots, *i64))?),
            Form::Table {
                table,
                cu,
                starts,
                i64,
                ..
            } => {
                index.push(b.upload(&index_bytes(table, *i64))?);
                index.push(b.upload(&index_bytes(cu, *i64))?);
                if let Some(s) = starts {
                    index.push(b.upload(&index_bytes(s, *i64))?);
                }
            }
        }
        Ok(Uploaded {
            cache,
            fp8,
            out,
            index,
        })
    }

    /// The gather's arguments over buffers laid out as [`Case::upload`]
    /// makes them (any storage: a backend's buffers or raw pointers).
    pub fn args<'a, S>(
        &self,
        cache: &'a S,
        index: &'a [S],
        fp8: Option<&'a S>,
        out: &'a mut S,
    ) -> GatherArgs<'a, S> {
        let index = match &self.form {
            Form::Slots { slots, i64 } => GatherIndex::Slots {
                slot_mapping: Tensor::new(&index[0], index_desc(slots.len(), *i64)),
            },
            Form::Table {
                cu, starts, i64, ..
            } => GatherIndex::BlockTable {
                block_table: Tensor::new(&index[0], self.form.block_table_desc()),
                cu_seq_lens: Tensor::new(&index[1], index_desc(cu.len(), *i64)),
                seq_starts: starts
                    .as_ref()
                    .map(|s| Tensor::new(&index[2], index_desc(s.len(), *i64))),
            },
        };
        GatherArgs {
            kv_cache: Tensor::new(cache, self.cache_desc),
            index,
            fp8_scale: fp8.map(|f| Tensor::new(f, TensorDesc::contiguous(DType::F32, &[1]))),
            out: TensorMut::new(out, self.out_desc()),
            record_order: self.order,
        }
    }

    /// Runs the case on `b`: uploads everything, gathers into a canary
    /// buffer, reads it back with the skip counts.
    pub fn run<B: Backend>(&self, b: &B) -> Result<Outcome> {
        b.take_skip_counts()?;
        let mut u = self.upload(b)?;
        b.gather_dequant(self.args(&u.cache, &u.index, u.fp8.as_ref(), &mut u.out))?;
        let bytes = b.read(&u.out)?;
        Ok(Outcome {
            out: bytes,
            counts: b.take_skip_counts()?,
        })
    }
}

/// A case's tensors on a backend.
pub struct Uploaded<B: Backend> {
    pub cache: B::Buffer,
    pub fp8: Option<B::Buffer>,
    pub out: B::Buffer,
    /// `slot_mapping`, or `block_table`, `cu_seq_lens` (and `seq_starts`).
    pub index: Vec<B::Buffer>,
}

/// A cache description: `[blocks, block_size, W]` (paged, block stride
/// padded by `pad` 16-byte units) or rows (`[.., 512]` or `[.., 1, 512]`,
/// rows padded by `pad` 16-byte units).
pub fn cache_desc(
    layout: RecordLayout,
    blocks: usize,
    bs: usize,
    pad: usize,
    four_d: bool,
) -> TensorDesc {
    match layout {
        RecordLayout::Bf16Rows | RecordLayout::Fp8Rows => {
            let (dt, per16) = if layout == RecordLayout::Bf16Rows {
                (DType::BF16, 8)
            } else {
                (DType::F8E4M3, 16)
            };
            let row = DIM + pad * per16;
            let block = bs * row + pad * per16;
            if four_d {
                TensorDesc::strided(dt, &[blocks, bs, 1, DIM], &[block, row, DIM, 1])
            } else {
                TensorDesc::strided(dt, &[blocks, bs, DIM], &[block, row, 1])
            }
            .expect("rank")
        }
        l => {
            let w = l.record_bytes();
            // Pages start 16-byte aligned (V4 pages of an odd block size need padding).
            let page = (bs * w).next_multiple_of(16) + 16 * pad;
            TensorDesc::strided(DType::U8, &[blocks, bs, w], &[page, w, 1]).expect("rank 3")
        }
    }
}

/// Cache bytes for `desc` filled as `fill` says (padding random).
pub fn fill_cache(
    rng: &mut Rng,
    layout: RecordLayout,
    order: RecordOrder,
    desc: &TensorDesc,
    fill: Fill,
) -> Vec<u8> {
    let len = desc.end_byte().expect("small") as usize;
    let mut c: Vec<u8> = (0..len).map(|_| rng.byte()).collect();
    let (blocks, bs) = (desc.shape()[0], desc.shape()[1]);
    let esz = desc.dtype.size();
    match fill {
        Fill::Random => {
            if layout == RecordLayout::Bf16Rows {
                // Random bits are mostly huge or tiny numbers; mix in specials.
                for i in (0..len).step_by(2) {
                    if rng.chance(0.1) {
                        let h = rng.pick(&BF16_SPECIALS);
                        c[i..i + 2].copy_from_slice(&h.to_le_bytes());
                    }
                }
            }
        }
        Fill::Adversarial => {
            let (v, s) = (layout.value_bytes(), layout.scale_bytes());
            for blk in 0..blocks {
                let page = desc.offset + blk * desc.strides()[0] * esz;
                for r in 0..bs {
                    let rec = blk * bs + r;
                    let vals = if layout.is_paged() {
                        page + r * v
                    } else {
                        page + r * desc.strides()[1] * esz
                    };
                    for i in 0..v {
                        c[vals + i] = ((rec * 131 + i) % 256) as u8;
                    }
                    let bf16_from = match layout {
                        RecordLayout::V4 => Some(448),
                        RecordLayout::Bf16Rows => Some(0),
                        _ => None,
                    };
                    if let Some(from) = bf16_from {
                        for (k, i) in (from..v).step_by(2).enumerate() {
                            let h = if k % 3 == 0 {
                                BF16_SPECIALS[(rec + k) % BF16_SPECIALS.len()]
                            } else {
                                (((rec * 977 + k * 31) % 65536) as u16) ^ 0x3c00
                            };
                            c[vals + i..vals + i + 2].copy_from_slice(&h.to_le_bytes());
                        }
                    }
                    if s > 0 {
                        let sc = page + bs * v + r * s;
                        for k in 0..s {
                            c[sc + k] = ((rec * s + k) % 256) as u8;
                        }
                    }
                }
            }
        }
        Fill::Inserted => {
            let cpu = CpuBackend::new();
            let n = blocks * bs;
            let rows = 64;
            let cos: Vec<u8> = rope_cos_sin(rows)
                .iter()
                .flat_map(|x| x.to_le_bytes())
                .collect();
            let mut latent = Vec::with_capacity(n * DIM * 2);
            for _ in 0..n * DIM {
                let x = if rng.chance(0.01) {
                    f32::from_bits(u32::from(rng.pick(&BF16_SPECIALS)) << 16)
                } else {
                    let e = rng.below(24) as i32 - 12;
                    let m = (rng.u64() % 2000) as f32 / 1000.0 - 1.0;
                    m * 2f32.powi(e)
                };
                latent.extend_from_slice(&bf16_from_f32(x).to_le_bytes());
            }
            let positions: Vec<i64> = (0..n).map(|_| rng.below(rows) as i64).collect();
            let slots: Vec<i64> = (0..n as i64).collect();
            let pos_b = index_bytes(&positions, true);
            let slot_b = index_bytes(&slots, false);
            let scale = 0.75f32.to_le_bytes().to_vec();
            cpu.rope_quant_insert(InsertArgs {
                latent: Tensor::new(&latent, TensorDesc::contiguous(DType::BF16, &[n, DIM])),
                positions: Tensor::new(&pos_b, index_desc(n, true)),
                cos_sin_cache: Tensor::new(&cos, TensorDesc::contiguous(DType::F32, &[rows, 64])),
                kv_cache: TensorMut::new(&mut c, *desc),
                slot_mapping: Tensor::new(&slot_b, index_desc(n, false)),
                compress_ratio: 1,
                fp8_scale: (layout == RecordLayout::Fp8Rows)
                    .then(|| Tensor::new(&scale, TensorDesc::contiguous(DType::F32, &[1]))),
                record_order: order,
            })
            .expect("the insert's arguments are valid");
        }
    }
    c
}

/// A random case of `layout` with `n` gathered rows (slot form) or about `n`
/// (block-table form); `wild` mixes in out-of-range indices.
pub fn random_case(seed: u64, layout: RecordLayout, table: bool, n: usize, wild: bool) -> Case {
    let mut rng = Rng::new(seed);
    let fill = match rng.below(3) {
        0 => Fill::Random,
        1 => Fill::Adversarial,
        _ => Fill::Inserted,
    };
    let bs = rng.pick(&[1usize, 2, 3, 4, 16, 64]);
    // A one-block cache's page is its whole extent, which must be whole
    // 16-byte units: V4 records (584 B) of an odd block size need two blocks.
    let odd_v4 = layout == RecordLayout::V4 && bs % 2 == 1;
    let blocks = usize::from(odd_v4) + 1 + rng.below(24);
    let desc = cache_desc(layout, blocks, bs, rng.pick(&[0, 0, 1, 3]), rng.chance(0.3))
        .with_offset(16 * rng.below(3));
    // Odd seeds read paged records in the per-token order (the draws stay
    // as they were).
    let order = if seed & 1 == 1 && layout.has_record_orders() {
        RecordOrder::PerToken
    } else {
        RecordOrder::PagePlanar
    };
    let cache = fill_cache(&mut rng, layout, order, &desc, fill);
    let cap = (blocks * bs) as i64;
    let i64 = rng.chance(0.5);
    let form = if !table {
        let slots = (0..n)
            .map(|_| {
                if wild && rng.chance(0.15) {
                    let huge = if i64 { i64::MAX } else { i32::MAX as i64 };
                    rng.pick(&[
                        -1,
                        -7,
                        cap,
                        cap + 5,
                        huge,
                        if i64 { i64::MIN } else { i32::MIN as i64 },
                    ])
                } else {
                    rng.below(cap as usize) as i64
                }
            })
            .collect();
        Form::Slots { slots, i64 }
    } else {
        let reqs = 1 + rng.below(6);
        let mut cu = vec![0i64];
        let mut starts = Vec::new();
        let mut need_cols = 1;
        for _ in 0..reqs {
            let len = if rng.chance(0.15) {
                0
            } else {
                rng.below(n.div_ceil(reqs) * 2 + 1)
            };
            let start = if rng.chance(0.5) {
                rng.below(3 * bs)
            } else {
                0
            };
            need_cols = need_cols.max((start + len).div_ceil(bs));
            cu.push(cu.last().unwrap() + len as i64);
            starts.push(start as i64);
        }
        let cols = need_cols + rng.below(3);
        let rows = reqs + rng.below(2);
        let row_stride = cols + rng.below(3);
        let mut table = vec![0i64; rows * row_stride];
        for (i, t) in table.iter_mut().enumerate() {
            *t = if wild && rng.chance(0.1) {
                rng.pick(&[-1, blocks as i64, blocks as i64 + 9])
            } else if i % row_stride < cols {
                rng.below(blocks) as i64
            } else {
                // Beyond the columns: never read.
                -99
            };
        }
        let has_starts = rng.chance(0.6);
        let mut starts = has_starts.then_some(starts);
        if wild {
            if let Some(s) = starts.as_mut() {
                let r = rng.below(reqs);
                s[r] = rng.pick(&[-1, -(bs as i64), (cols * bs) as i64, i64::MAX / 2]);
                if !i64 {
                    s[r] = s[r].clamp(i32::MIN as i64, i32::MAX as i64);
                }
            }
        }
        Form::Table {
            table,
            rows,
            cols,
            row_stride,
            cu,
            starts,
            i64,
        }
    };
    let rows_needed = match &form {
        Form::Slots { slots, .. } => slots.len(),
        Form::Table { cu, .. } => *cu.last().unwrap() as usize,
    };
    // Block-table outputs are sometimes a row short (the total is then
    // counted once) or longer (extra rows untouched).
    let out_rows = if table && wild && rng.chance(0.3) {
        rows_needed.saturating_sub(1)
    } else {
        rows_needed + if table { rng.below(3) } else { rng.below(2) }
    };
    let out_f32 = rng.chance(0.5);
    let unit = if out_f32 { 4 } else { 8 };
    Case {
        label: format!(
            "seed {seed:#x}: {} {order} {fill:?}, {} blocks of {bs}, {}, {} out, wild {wild}",
            layout.name(),
            blocks,
            if table { "block table" } else { "slots" },
            if out_f32 { "F32" } else { "BF16" }
        ),
        layout,
        order,
        blocks,
        block_size: bs,
        cache_desc: desc,
        cache,
        fp8_scale: (layout == RecordLayout::Fp8Rows).then(|| rng.pick(&FP8_SCALE_SPECIALS)),
        form,
        out_f32,
        out_rows,
        out_row_stride: DIM + unit * rng.pick(&[0, 0, 1, 5]),
        out_offset: 16 * rng.below(4),
    }
}

/// 512 adversarial records (every scale byte meets every value byte) read
/// in reverse slot order, the slots I64 (the slot form's own kernels) or
/// I32 (the general ones); FP8 rows under `fp8_scale`.
pub fn every_code_case(layout: RecordLayout, out_f32: bool, fp8_scale: f32, i64: bool) -> Case {
    let mut rng = Rng::new(dsv4_kvcache::kernel_abi::layout_code(layout) as u64);
    let (blocks, bs) = (8, 64);
    let desc = cache_desc(layout, blocks, bs, 0, false);
    let cache = fill_cache(
        &mut rng,
        layout,
        RecordOrder::PagePlanar,
        &desc,
        Fill::Adversarial,
    );
    Case {
        label: format!(
            "{} every code, F32 {out_f32}, fp8_scale {fp8_scale}, I64 slots {i64}",
            layout.name()
        ),
        layout,
        order: RecordOrder::PagePlanar,
        blocks,
        block_size: bs,
        cache_desc: desc,
        cache,
        fp8_scale: (layout == RecordLayout::Fp8Rows).then_some(fp8_scale),
        form: Form::Slots {
            slots: (0..(blocks * bs) as i64).rev().collect(),
            i64,
        },
        out_f32,
        out_rows: blocks * bs,
        out_row_stride: DIM,
        out_offset: 0,
    }
}

/// The scales [`every_code_case`] runs under for `layout`.
pub fn every_code_scales(layout: RecordLayout) -> &'static [f32] {
    if layout == RecordLayout::Fp8Rows {
        &FP8_SCALE_SPECIALS
    } else {
        &[1.0]
    }
}

/// For `layout`: random cases with either index form, wild or not, at each
/// of `sizes` and both sides of the layout's split end (case `k` of the
/// sweep seeded `(*seed + k) << shift | n`), then every every-code case;
/// `*seed` moves past the seeds used.
pub fn layout_sweep(
    layout: RecordLayout,
    sizes: &[usize],
    shift: u32,
    seed: &mut u64,
) -> Vec<Case> {
    let split = dsv4_kvcache::gather::gather_split_max_rows(layout);
    let mut sizes = [sizes, &[split, split + 1]].concat();
    sizes.sort_unstable();
    sizes.dedup();
    let mut out = Vec::new();
    for table in [false, true] {
        for wild in [false, true] {
            for &n in &sizes {
                *seed += 1;
                out.push(random_case(
                    *seed << shift | n as u64,
                    layout,
                    table,
                    n,
                    wild,
                ));
            }
        }
    }
    for out_f32 in [false, true] {
        for &s in every_code_scales(layout) {
            for i64 in [false, true] {
                out.push(every_code_case(layout, out_f32, s, i64));
            }
        }
    }
    out
}
