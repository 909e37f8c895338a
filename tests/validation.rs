//! Argument validation (`semantics.md`, "Validation", and `src/ops.rs`):
//! every broken precondition is an `Err` naming the argument, and nothing is
//! written; and for arbitrary shapes, strides, offsets, dtypes and index
//! values no launch panics, and an accepted launch writes nothing outside
//! its output views.

mod common;

use common::*;
use dsv4_kvcache::{Backend, CpuBackend, DType, RecordLayout, SkipCounts, TensorDesc};
use proptest::prelude::*;

fn cpu(sanitize: bool) -> CpuBackend {
    let mut b = CpuBackend::new();
    b.set_sanitize(sanitize);
    b
}

// ---- base cases -------------------------------------------------------------------

/// A valid case of `kind` with at least two tokens and two rows everywhere
/// (so that row strides matter), checked to pass.
fn base(kind: Kind) -> Case {
    for seed in 0..1000u64 {
        let c = random_case(seed, kind);
        // Every leading dim (rows, blocks, ring capacity, requests + 1) >= 2 or 3.
        let at_least = |b: &Option<Buf>, dim: usize, n: usize| match b {
            None => true,
            Some(b) => b.desc.shape()[dim] >= n,
        };
        if c.n() >= 2
            && at_least(&c.kv_score, 0, 2)
            && at_least(&c.latent, 0, 2)
            && at_least(&c.rows, 0, 2)
            && at_least(&c.prev_rows, 0, 2)
            && at_least(&c.state_cache, 0, 2)
            && at_least(&c.state_cache, 1, 2)
            && at_least(&c.query_start_loc, 0, 3)
            && at_least(&c.kv_cache, 0, 2)
            && at_least(&c.kv_cache, 1, 2)
        {
            let out = run_case(&cpu(c.kind.sanitize), &c);
            assert_eq!(out.result, Ok(()), "{}", c.name);
            return c;
        }
    }
    panic!("no base case for {kind:?}");
}

fn compress_base(cr: u32, prev: bool, i64: bool) -> Case {
    let mut k = Kind::new(Op::FusedSaveCompressNorm, cr, RecordLayout::V4);
    k.prev_rows = prev;
    k.index_i64 = i64;
    base(k)
}

fn insert_base(layout: RecordLayout, i64: bool) -> Case {
    let mut k = Kind::new(Op::RopeQuantInsert, 1 + i64 as u32, layout);
    k.index_i64 = i64;
    base(k)
}

fn fused_base(layout: RecordLayout, cr: u32) -> Case {
    base(Kind::new(Op::FusedCompressInsert, cr, layout))
}

fn ring_base(i64: bool) -> Case {
    let mut k = Kind::new(Op::SaveRingRows, 2, RecordLayout::V4);
    k.index_i64 = i64;
    base(k)
}

// ---- mutating one argument --------------------------------------------------------------

/// Points `b` at `desc`, growing the buffer (with canary bytes) so the view
/// fits: only the property under test is broken.
fn set_view(b: &mut Buf, desc: TensorDesc) {
    let need = desc.end_byte().expect("view size") as usize;
    if b.bytes.len() < need {
        let start = b.bytes.len();
        b.bytes.extend((start..need).map(canary_byte));
    }
    b.desc = desc;
}

fn strided(dt: DType, shape: &[usize], strides: &[usize], offset: usize) -> TensorDesc {
    TensorDesc::strided(dt, shape, strides)
        .expect("rank")
        .with_offset(offset)
}

fn with_dtype(b: &mut Buf, dt: DType) {
    let d = b.desc;
    set_view(b, strided(dt, d.shape(), d.strides(), d.offset));
}

fn with_shape(b: &mut Buf, shape: &[usize], strides: &[usize]) {
    let d = b.desc;
    set_view(b, strided(d.dtype, shape, strides, d.offset));
}

/// A rank-2 view of the same rows, `width` elements each, `row_stride` apart.
fn with_width(b: &mut Buf, width: usize, row_stride: usize) {
    let rows = b.desc.shape()[0];
    with_shape(b, &[rows, width], &[row_stride, 1]);
}

fn with_offset(b: &mut Buf, offset: usize) {
    let d = b.desc;
    set_view(b, d.with_offset(offset));
}

/// Cuts the buffer one byte short of the view's end.
fn past_end(b: &mut Buf) {
    let need = b.desc.end_byte().expect("view size") as usize;
    b.bytes.truncate(need - 1);
}

/// A 2-D view's rows at `stride` elements (the inner stride kept).
fn row_stride(b: &mut Buf, stride: usize) {
    let s = b.desc.shape().to_vec();
    let mut st = b.desc.strides().to_vec();
    st[0] = stride;
    with_shape(b, &s, &st);
}

/// The inner stride set to 2.
fn inner_stride_2(b: &mut Buf) {
    let s = b.desc.shape().to_vec();
    let mut st = b.desc.strides().to_vec();
    let r = st.len() - 1;
    for (i, x) in st.iter_mut().enumerate() {
        *x *= 2;
        if i == r {
            *x = 2;
        }
    }
    with_shape(b, &s, &st);
}

/// An index tensor with every other element (stride 2).
fn index_stride_2(b: &mut Buf) {
    let n = b.desc.shape()[0];
    with_shape(b, &[n], &[2]);
}

/// An index tensor one shorter than `n`.
fn index_len(b: &mut Buf, len: usize) {
    let vals = b.indices();
    let mut v = vals[..len.min(vals.len())].to_vec();
    v.resize(len, 0);
    *b = Buf::index(&v, b.desc.dtype == DType::I64, b.desc.offset, 0);
}

fn f32_scalar(shape: &[usize]) -> Buf {
    let n: usize = shape.iter().product();
    Buf::new(
        TensorDesc::contiguous(DType::F32, shape),
        0,
        &f32_bytes(&vec![1.0; n]),
    )
}

type Mutation = (String, &'static str, Box<dyn Fn(&mut Case)>);

fn m(what: impl Into<String>, arg: &'static str, f: impl Fn(&mut Case) + 'static) -> Mutation {
    (what.into(), arg, Box::new(f))
}

/// The views every F32 row tensor (`kv_score`, `prev_rows`, `rows`)
/// refuses: BF16 elements, rows `width` wide, inner stride 2, rows
/// `misaligned` elements apart (not 16-byte aligned), and a buffer one byte
/// short.
fn f32_rows_mutations(
    arg: &'static str,
    get: fn(&mut Case) -> &mut Buf,
    width: usize,
    misaligned: usize,
) -> Vec<Mutation> {
    vec![
        m(format!("{arg} BF16"), arg, move |c| {
            with_dtype(get(c), DType::BF16)
        }),
        m(format!("{arg} width {width}"), arg, move |c| {
            with_width(get(c), width, width)
        }),
        m(format!("{arg} inner stride 2"), arg, move |c| {
            inner_stride_2(get(c))
        }),
        m(format!("{arg} row stride {misaligned}"), arg, move |c| {
            row_stride(get(c), misaligned)
        }),
        m(format!("{arg} past the end"), arg, move |c| {
            past_end(get(c))
        }),
    ]
}

fn kv(c: &mut Case) -> &mut Buf {
    c.kv_score.as_mut().expect("kv_score")
}
fn pos(c: &mut Case) -> &mut Buf {
    c.positions.as_mut().expect("positions")
}
fn lat(c: &mut Case) -> &mut Buf {
    c.latent.as_mut().expect("latent")
}
fn ring(c: &mut Case) -> &mut Buf {
    c.state_cache.as_mut().expect("state_cache")
}
/// Views a rank-3 buffer `[blocks, rows, _]` as `[blocks, rows, width]`
/// with rows `row_stride` apart and blocks `rows * row_stride + block_delta`
/// apart.
fn reshape_blocks(b: &mut Buf, width: usize, row_stride: usize, block_delta: isize) {
    let (blocks, rows) = (b.desc.shape()[0], b.desc.shape()[1]);
    let block_stride = (rows * row_stride)
        .checked_add_signed(block_delta)
        .expect("stride");
    with_shape(b, &[blocks, rows, width], &[block_stride, row_stride, 1]);
}
fn cache(c: &mut Case) -> &mut Buf {
    c.kv_cache.as_mut().expect("kv_cache")
}
fn cos(c: &mut Case) -> &mut Buf {
    c.cos_sin_cache.as_mut().expect("cos_sin_cache")
}

/// Runs `c`, expects an error naming `arg`, and checks that nothing was
/// written and nothing was counted.
fn expect_err(c: &Case, what: &str, arg: &str) {
    let out = run_case(&cpu(c.kind.sanitize), c);
    match &out.result {
        Err(e) => assert_eq!(
            error_arg(e),
            arg,
            "{} / {what}: error {e} names the wrong argument",
            c.name
        ),
        Ok(()) => panic!(
            "{} / {what}: accepted; expected an error naming {arg}",
            c.name
        ),
    }
    let outputs = [
        ("latent_out", &out.latent, &c.latent),
        ("state_cache", &out.state_cache, &c.state_cache),
        ("kv_cache", &out.kv_cache, &c.kv_cache),
    ];
    for (name, after, before) in outputs {
        if let Some(after) = after {
            let before = &before.as_ref().expect(name).bytes;
            assert!(after == before, "{} / {what}: {name} written", c.name);
        }
    }
    assert_eq!(
        out.skips,
        SkipCounts::default(),
        "{} / {what}: skips counted",
        c.name
    );
}

fn apply_all(base: &Case, muts: &[Mutation]) {
    for (what, arg, f) in muts {
        let mut c = base.clone();
        f(&mut c);
        expect_err(&c, what, arg);
    }
}

/// Mutations shared by the compressor (and the fused op's compressor).
fn compress_mutations(cr: u32) -> Vec<Mutation> {
    let w = 512 * cr as usize;
    let other_w = if cr == 1 { 1024 } else { 512 };
    vec![
        m("compress_ratio 0", "compress_ratio", |c| {
            c.compress_ratio = 0
        }),
        m("compress_ratio 3", "compress_ratio", |c| {
            c.compress_ratio = 3
        }),
        m("kv_score I32", "kv_score", |c| {
            with_dtype(kv(c), DType::I32)
        }),
        m("kv_score width 600", "kv_score", |c| {
            with_width(kv(c), 600, 608)
        }),
        m(
            "kv_score row stride overlapping rows",
            "kv_score",
            move |c| row_stride(kv(c), w - 16),
        ),
        m("kv_score rank 3", "kv_score", move |c| {
            let r = kv(c).desc.shape()[0];
            with_shape(kv(c), &[r, 1, w], &[w, w, 1]);
        }),
        m("kv_score offset not 16-aligned", "kv_score", |c| {
            with_offset(kv(c), 8)
        }),
        m("N above kv_score rows", "kv_score", move |c| {
            let n = c.n();
            let s = kv(c).desc.strides()[0];
            with_shape(kv(c), &[n - 1, w], &[s, 1]);
            with_shape(lat(c), &[n - 1, 512], &[512, 1]);
        }),
        m("positions F32", "positions", |c| {
            with_dtype(pos(c), DType::F32)
        }),
        m("positions BF16", "positions", |c| {
            with_dtype(pos(c), DType::BF16)
        }),
        m("positions not contiguous", "positions", |c| {
            index_stride_2(pos(c))
        }),
        m("positions rank 2", "positions", |c| {
            let n = pos(c).desc.shape()[0];
            with_shape(pos(c), &[1, n], &[n, 1]);
        }),
        m("positions shorter than N", "positions", |c| {
            let n = c.n();
            index_len(pos(c), n - 1);
        }),
        m("positions misaligned", "positions", |c| {
            with_offset(pos(c), 2)
        }),
        m("positions past the end", "positions", |c| past_end(pos(c))),
        m("slot_mapping F32", "slot_mapping", |c| {
            with_dtype(&mut c.slot_mapping, DType::F32)
        }),
        m("slot_mapping U8", "slot_mapping", |c| {
            with_dtype(&mut c.slot_mapping, DType::U8)
        }),
        m("slot_mapping not contiguous", "slot_mapping", |c| {
            index_stride_2(&mut c.slot_mapping)
        }),
        m("slot_mapping past the end", "slot_mapping", |c| {
            past_end(&mut c.slot_mapping)
        }),
        m("rms_norm_weight I32", "rms_norm_weight", |c| {
            with_dtype(c.rms_norm_weight.as_mut().expect("w"), DType::I32)
        }),
        m("rms_norm_weight [256]", "rms_norm_weight", |c| {
            with_shape(c.rms_norm_weight.as_mut().expect("w"), &[256], &[1])
        }),
        m("rms_norm_weight [2, 256]", "rms_norm_weight", |c| {
            with_shape(c.rms_norm_weight.as_mut().expect("w"), &[2, 256], &[256, 1])
        }),
        m("rms_norm_weight strided", "rms_norm_weight", |c| {
            with_shape(c.rms_norm_weight.as_mut().expect("w"), &[512], &[2])
        }),
        m("rms_norm_weight offset 2", "rms_norm_weight", |c| {
            with_offset(c.rms_norm_weight.as_mut().expect("w"), 2)
        }),
        m("rms_norm_weight past the end", "rms_norm_weight", |c| {
            past_end(c.rms_norm_weight.as_mut().expect("w"))
        }),
        m("eps NaN", "rms_norm_eps", |c| c.eps = f32::NAN),
        m("eps inf", "rms_norm_eps", |c| c.eps = f32::INFINITY),
        m("eps negative", "rms_norm_eps", |c| c.eps = -1e-6),
        m("latent_out F32", "latent_out", |c| {
            with_dtype(lat(c), DType::F32)
        }),
        m("latent_out fewer rows than kv_score", "latent_out", |c| {
            let r = lat(c).desc.shape()[0];
            with_shape(lat(c), &[r - 1, 512], &[512, 1]);
        }),
        m("latent_out more rows than kv_score", "latent_out", |c| {
            let r = lat(c).desc.shape()[0];
            with_shape(lat(c), &[r + 1, 512], &[512, 1]);
        }),
        m("latent_out width 1024", "latent_out", |c| {
            with_width(lat(c), 1024, 1024)
        }),
        m("latent_out not contiguous", "latent_out", |c| {
            row_stride(lat(c), 520)
        }),
        m("latent_out offset 8", "latent_out", |c| {
            with_offset(lat(c), 8)
        }),
        m("latent_out past the end", "latent_out", |c| {
            past_end(lat(c))
        }),
    ]
    .into_iter()
    .chain(f32_rows_mutations("kv_score", kv, other_w, w + 8))
    .collect()
}

fn cr2_mutations() -> Vec<Mutation> {
    vec![
        m("state_cache missing", "state_cache", |c| {
            c.state_cache = None
        }),
        m("query_start_loc missing", "query_start_loc", |c| {
            c.query_start_loc = None
        }),
        m(
            "token_to_req_indices missing",
            "token_to_req_indices",
            |c| c.token_to_req_indices = None,
        ),
        m("query_start_loc empty", "query_start_loc", |c| {
            index_len(c.query_start_loc.as_mut().expect("q"), 0)
        }),
        m("query_start_loc F32", "query_start_loc", |c| {
            with_dtype(c.query_start_loc.as_mut().expect("q"), DType::F32)
        }),
        m("query_start_loc not contiguous", "query_start_loc", |c| {
            index_stride_2(c.query_start_loc.as_mut().expect("q"))
        }),
        m(
            "token_to_req_indices shorter than N",
            "token_to_req_indices",
            |c| {
                let n = c.n();
                index_len(c.token_to_req_indices.as_mut().expect("t"), n - 1)
            },
        ),
        m("token_to_req_indices BF16", "token_to_req_indices", |c| {
            with_dtype(c.token_to_req_indices.as_mut().expect("t"), DType::BF16)
        }),
        m(
            "token_to_req_indices not contiguous",
            "token_to_req_indices",
            |c| index_stride_2(c.token_to_req_indices.as_mut().expect("t")),
        ),
        m("state_cache inner stride 2", "state_cache", |c| {
            inner_stride_2(ring(c))
        }),
        m(
            "state_cache row stride not a multiple of 16",
            "state_cache",
            |c| reshape_blocks(ring(c), 1024, 1032, 0),
        ),
        m(
            "state_cache block stride not a multiple of 4",
            "state_cache",
            |c| reshape_blocks(ring(c), 1024, 1024, 2),
        ),
        m("state_cache rank 2", "state_cache", |c| {
            with_shape(ring(c), &[4, 1024], &[1024, 1])
        }),
        m("state_cache offset 8", "state_cache", |c| {
            with_offset(ring(c), 8)
        }),
        m(
            "prev_rows without prev_row_indices",
            "prev_row_indices",
            |c| {
                c.prev_rows = Some(Buf::f32_rows(&vec![0.0; 2048], 2, 1024, 1024, 0, 0));
                c.prev_row_indices = None;
            },
        ),
        m("prev_row_indices without prev_rows", "prev_rows", |c| {
            c.prev_rows = None;
            c.prev_row_indices = Some(Buf::index(&[0; 8], false, 0, 0));
        }),
    ]
    .into_iter()
    .chain(ring_cache_mutations())
    .collect()
}

fn prev_mutations() -> Vec<Mutation> {
    fn pr(c: &mut Case) -> &mut Buf {
        c.prev_rows.as_mut().expect("prev_rows")
    }
    fn pi(c: &mut Case) -> &mut Buf {
        c.prev_row_indices.as_mut().expect("prev_row_indices")
    }
    vec![
        m(
            "prev_row_indices shorter than num_reqs",
            "prev_row_indices",
            |c| {
                let reqs = c.query_start_loc.as_ref().expect("q").desc.shape()[0] - 1;
                index_len(pi(c), reqs - 1);
            },
        ),
        m("prev_row_indices F32", "prev_row_indices", |c| {
            with_dtype(pi(c), DType::F32)
        }),
        m("prev_row_indices not contiguous", "prev_row_indices", |c| {
            index_stride_2(pi(c))
        }),
    ]
    .into_iter()
    .chain(f32_rows_mutations("prev_rows", pr, 512, 1030))
    .collect()
}

/// Mutations of the insert's table and cache (shared with the fused op).
fn cache_mutations(layout: RecordLayout) -> Vec<Mutation> {
    let mut v = vec![
        m("cos_sin_cache I32", "cos_sin_cache", |c| {
            with_dtype(cos(c), DType::I32)
        }),
        m("cos_sin_cache U8", "cos_sin_cache", |c| {
            with_dtype(cos(c), DType::U8)
        }),
        m("cos_sin_cache width 32", "cos_sin_cache", |c| {
            with_width(cos(c), 32, 64)
        }),
        m("cos_sin_cache width 63", "cos_sin_cache", |c| {
            with_width(cos(c), 63, 64)
        }),
        m("cos_sin_cache inner stride 2", "cos_sin_cache", |c| {
            inner_stride_2(cos(c))
        }),
        m("cos_sin_cache rank 1", "cos_sin_cache", |c| {
            with_shape(cos(c), &[64], &[1])
        }),
        m("cos_sin_cache misaligned", "cos_sin_cache", |c| {
            with_offset(cos(c), 1)
        }),
        m("cos_sin_cache past the end", "cos_sin_cache", |c| {
            past_end(cos(c))
        }),
        m("kv_cache F32", "kv_cache", |c| {
            with_dtype(cache(c), DType::F32)
        }),
        m("kv_cache I64", "kv_cache", |c| {
            with_dtype(cache(c), DType::I64)
        }),
        m("kv_cache past the end", "kv_cache", |c| past_end(cache(c))),
        m("kv_cache offset 8", "kv_cache", |c| {
            with_offset(cache(c), 8)
        }),
        m("kv_cache block_size 0", "kv_cache", |c| {
            let d = cache(c).desc;
            let mut s = d.shape().to_vec();
            s[1] = 0;
            let st = d.strides().to_vec();
            with_shape(cache(c), &s, &st);
        }),
        m("kv_cache rank 2", "kv_cache", |c| {
            let d = cache(c).desc;
            let w = *d.shape().last().expect("rank");
            with_shape(cache(c), &[4, w], &[w, 1]);
        }),
    ];
    if layout.is_paged() {
        let w = layout.record_bytes();
        v.extend([
            m("paged width 600", "kv_cache", |c| {
                reshape_blocks(cache(c), 600, 608, 0)
            }),
            m("paged width 512 as U8", "kv_cache", |c| {
                reshape_blocks(cache(c), 512, 512, 0)
            }),
            m("paged record stride not the width", "kv_cache", move |c| {
                reshape_blocks(cache(c), w, w + 16, 0)
            }),
            m("paged inner stride 2", "kv_cache", |c| {
                inner_stride_2(cache(c))
            }),
            m("paged block stride below a page", "kv_cache", move |c| {
                reshape_blocks(cache(c), w, w, -16)
            }),
            m(
                "paged block stride not a multiple of 16",
                "kv_cache",
                move |c| reshape_blocks(cache(c), w, w, 8),
            ),
            m("fp8_scale given for a paged cache", "fp8_scale", |c| {
                c.fp8_scale = Some(f32_scalar(&[1]))
            }),
        ]);
    } else {
        let esz = if layout == RecordLayout::Bf16Rows {
            2
        } else {
            1
        };
        v.extend([
            m("rows width 1024", "kv_cache", |c| {
                reshape_blocks(cache(c), 1024, 1024, 0)
            }),
            m("rows width 576", "kv_cache", |c| {
                reshape_blocks(cache(c), 576, 576, 0)
            }),
            m("rows inner stride 2", "kv_cache", |c| {
                inner_stride_2(cache(c))
            }),
            m("rows rank 4 with a dim 2 of 2", "kv_cache", |c| {
                let d = cache(c).desc;
                let (b, bs) = (d.shape()[0], d.shape()[1]);
                with_shape(cache(c), &[b, bs, 2, 512], &[bs * 1024, 1024, 512, 1]);
            }),
            m("rows row stride overlapping", "kv_cache", move |c| {
                let d = cache(c).desc;
                let (b, bs) = (d.shape()[0], d.shape()[1]);
                let rs = 512 - 16 / esz;
                with_shape(cache(c), &[b, bs, 512], &[bs * 512, rs, 1]);
            }),
            m(
                "rows row stride not 16-byte aligned",
                "kv_cache",
                move |c| {
                    let d = cache(c).desc;
                    let (b, bs) = (d.shape()[0], d.shape()[1]);
                    let rs = 512 + 8 / esz;
                    with_shape(cache(c), &[b, bs, 512], &[bs * rs + 16, rs, 1]);
                },
            ),
        ]);
        if layout == RecordLayout::Fp8Rows {
            v.extend([
                m("fp8_scale missing", "fp8_scale", |c| c.fp8_scale = None),
                m("fp8_scale [2]", "fp8_scale", |c| {
                    c.fp8_scale = Some(f32_scalar(&[2]))
                }),
                m("fp8_scale [0]", "fp8_scale", |c| {
                    c.fp8_scale = Some(f32_scalar(&[0]))
                }),
                m("fp8_scale BF16", "fp8_scale", |c| {
                    with_dtype(c.fp8_scale.as_mut().expect("s"), DType::BF16)
                }),
                m("fp8_scale misaligned", "fp8_scale", |c| {
                    with_offset(c.fp8_scale.as_mut().expect("s"), 2)
                }),
                m("fp8_scale past the end", "fp8_scale", |c| {
                    past_end(c.fp8_scale.as_mut().expect("s"))
                }),
            ]);
        } else {
            v.push(m("fp8_scale given for BF16 rows", "fp8_scale", |c| {
                c.fp8_scale = Some(f32_scalar(&[1]))
            }));
        }
    }
    v
}

fn insert_mutations() -> Vec<Mutation> {
    vec![
        m("compress_ratio 0", "compress_ratio", |c| {
            c.compress_ratio = 0
        }),
        m("compress_ratio 3", "compress_ratio", |c| {
            c.compress_ratio = 3
        }),
        m("latent F32", "latent", |c| with_dtype(lat(c), DType::F32)),
        m("latent width 1024", "latent", |c| {
            with_width(lat(c), 1024, 1024)
        }),
        m("latent not contiguous", "latent", |c| {
            row_stride(lat(c), 520)
        }),
        m("latent inner stride 2", "latent", |c| {
            inner_stride_2(lat(c))
        }),
        m("latent rows below N", "latent", |c| {
            let n = c.n();
            with_shape(lat(c), &[n - 1, 512], &[512, 1]);
        }),
        m("latent offset 8", "latent", |c| with_offset(lat(c), 8)),
        m("latent past the end", "latent", |c| past_end(lat(c))),
        m("positions shorter than N", "positions", |c| {
            let n = c.n();
            index_len(pos(c), n - 1);
        }),
        m("positions F32", "positions", |c| {
            with_dtype(pos(c), DType::F32)
        }),
        m("positions not contiguous", "positions", |c| {
            index_stride_2(pos(c))
        }),
        m("slot_mapping BF16", "slot_mapping", |c| {
            with_dtype(&mut c.slot_mapping, DType::BF16)
        }),
        m("slot_mapping not contiguous", "slot_mapping", |c| {
            index_stride_2(&mut c.slot_mapping)
        }),
    ]
}

fn ring_mutations() -> Vec<Mutation> {
    fn rows(c: &mut Case) -> &mut Buf {
        c.rows.as_mut().expect("rows")
    }
    vec![
        m("rows row stride overlapping", "rows", |c| {
            row_stride(rows(c), 1020)
        }),
        m("rows offset 8", "rows", |c| with_offset(rows(c), 8)),
        m("slot_mapping shorter than rows", "slot_mapping", |c| {
            let n = c.n();
            index_len(&mut c.slot_mapping, n - 1);
        }),
        m("slot_mapping longer than rows", "slot_mapping", |c| {
            let n = c.n();
            index_len(&mut c.slot_mapping, n + 1);
        }),
        m("slot_mapping F32", "slot_mapping", |c| {
            with_dtype(&mut c.slot_mapping, DType::F32)
        }),
        m(
            "state_cache row stride not a multiple of 16",
            "state_cache",
            |c| reshape_blocks(ring(c), 1024, 1030, 2),
        ),
    ]
    .into_iter()
    .chain(f32_rows_mutations("rows", rows, 512, 1026))
    .chain(ring_cache_mutations())
    .collect()
}

/// The `state_cache` views the CR2 compressor and `save_ring_rows` both refuse.
fn ring_cache_mutations() -> Vec<Mutation> {
    vec![
        m("state_cache BF16", "state_cache", |c| {
            with_dtype(ring(c), DType::BF16)
        }),
        m("state_cache width 512", "state_cache", |c| {
            reshape_blocks(ring(c), 512, 512, 0)
        }),
        m("state_cache capacity 0", "state_cache", |c| {
            let b = ring(c).desc.shape()[0];
            with_shape(ring(c), &[b, 0, 1024], &[1024, 1024, 1]);
        }),
        m("state_cache past the end", "state_cache", |c| {
            past_end(ring(c))
        }),
    ]
}

// ---- the tests ---------------------------------------------------------------------------

#[test]
fn compress_preconditions_are_errors_naming_the_argument() {
    for i64 in [false, true] {
        apply_all(&compress_base(1, false, i64), &compress_mutations(1));
        let cr2 = compress_base(2, false, i64);
        apply_all(&cr2, &compress_mutations(2));
        apply_all(&cr2, &cr2_mutations());
        let prev = compress_base(2, true, i64);
        apply_all(&prev, &prev_mutations());
    }
}

#[test]
fn insert_preconditions_are_errors_naming_the_argument() {
    for layout in RecordLayout::ALL {
        for i64 in [false, true] {
            let b = insert_base(layout, i64);
            apply_all(&b, &insert_mutations());
            apply_all(&b, &cache_mutations(layout));
        }
    }
}

#[test]
fn save_ring_rows_preconditions_are_errors_naming_the_argument() {
    for i64 in [false, true] {
        apply_all(&ring_base(i64), &ring_mutations());
    }
}

#[test]
fn fused_preconditions_are_errors_naming_the_argument() {
    for layout in RecordLayout::ALL {
        for cr in [1, 2] {
            let b = fused_base(layout, cr);
            apply_all(&b, &compress_mutations(cr));
            apply_all(&b, &cache_mutations(layout));
            if cr == 2 {
                apply_all(&b, &cr2_mutations());
            }
            apply_all(
                &b,
                &[
                    m(
                        "cache_slot_mapping shorter than N",
                        "cache_slot_mapping",
                        |c| {
                            let n = c.n();
                            index_len(c.cache_slot_mapping.as_mut().expect("cs"), n - 1);
                        },
                    ),
                    m(
                        "cache_slot_mapping longer than N",
                        "cache_slot_mapping",
                        |c| {
                            let n = c.n();
                            index_len(c.cache_slot_mapping.as_mut().expect("cs"), n + 1);
                        },
                    ),
                    m("cache_slot_mapping F32", "cache_slot_mapping", |c| {
                        with_dtype(c.cache_slot_mapping.as_mut().expect("cs"), DType::F32)
                    }),
                    m(
                        "cache_slot_mapping not contiguous",
                        "cache_slot_mapping",
                        |c| index_stride_2(c.cache_slot_mapping.as_mut().expect("cs")),
                    ),
                ],
            );
        }
    }
}

/// The checks the seed does not make but that hold anyway: `N = 0` is fine
/// everywhere, and arguments CR1 ignores are not checked.
#[test]
fn accepted_edge_arguments() {
    let ok = |c: &Case| {
        let out = run_case(&cpu(c.kind.sanitize), c);
        assert_eq!(out.result, Ok(()), "{}", c.name);
        out
    };
    for layout in RecordLayout::ALL {
        let mut c = insert_base(layout, false);
        index_len(&mut c.slot_mapping, 0);
        let out = ok(&c);
        assert!(out.kv_cache.as_ref() == Some(&c.kv_cache.as_ref().expect("cache").bytes));
    }
    let mut c = compress_base(1, false, false);
    c.state_cache = Some(Buf::canary(TensorDesc::contiguous(DType::U8, &[3]), 0));
    c.query_start_loc = Some(Buf::canary(TensorDesc::contiguous(DType::F32, &[3]), 0));
    ok(&c);
}

// ---- arbitrary arguments: no panic, no stray write ------------------------------------------

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Field {
    KvScore,
    Positions,
    Slots,
    CacheSlots,
    Qsl,
    Ttr,
    Weight,
    State,
    Prev,
    PrevIdx,
    Latent,
    Rows,
    CosSin,
    KvCache,
    Fp8,
}

const FIELDS: [Field; 15] = [
    Field::KvScore,
    Field::Positions,
    Field::Slots,
    Field::CacheSlots,
    Field::Qsl,
    Field::Ttr,
    Field::Weight,
    Field::State,
    Field::Prev,
    Field::PrevIdx,
    Field::Latent,
    Field::Rows,
    Field::CosSin,
    Field::KvCache,
    Field::Fp8,
];

fn field(c: &mut Case, f: Field) -> Option<&mut Buf> {
    match f {
        Field::Slots => Some(&mut c.slot_mapping),
        Field::KvScore => c.kv_score.as_mut(),
        Field::Positions => c.positions.as_mut(),
        Field::CacheSlots => c.cache_slot_mapping.as_mut(),
        Field::Qsl => c.query_start_loc.as_mut(),
        Field::Ttr => c.token_to_req_indices.as_mut(),
        Field::Weight => c.rms_norm_weight.as_mut(),
        Field::State => c.state_cache.as_mut(),
        Field::Prev => c.prev_rows.as_mut(),
        Field::PrevIdx => c.prev_row_indices.as_mut(),
        Field::Latent => c.latent.as_mut(),
        Field::Rows => c.rows.as_mut(),
        Field::CosSin => c.cos_sin_cache.as_mut(),
        Field::KvCache => c.kv_cache.as_mut(),
        Field::Fp8 => c.fp8_scale.as_mut(),
    }
}

/// Optional arguments of the API (the others are required by the types).
fn optional(c: &mut Case, f: Field) -> Option<&mut Option<Buf>> {
    match f {
        Field::State if c.kind.op != Op::SaveRingRows => Some(&mut c.state_cache),
        Field::Qsl => Some(&mut c.query_start_loc),
        Field::Ttr => Some(&mut c.token_to_req_indices),
        Field::Prev => Some(&mut c.prev_rows),
        Field::PrevIdx => Some(&mut c.prev_row_indices),
        Field::Fp8 => Some(&mut c.fp8_scale),
        _ => None,
    }
}

const DTYPES: [DType; 6] = [
    DType::F32,
    DType::BF16,
    DType::U8,
    DType::F8E4M3,
    DType::I32,
    DType::I64,
];
const DIMS: [usize; 16] = [
    0, 1, 2, 3, 4, 5, 16, 32, 63, 64, 288, 512, 528, 584, 600, 1024,
];

/// Index values, extreme ones included (I32 tensors get them truncated).
/// Negative `query_start_loc` entries and a position of `i64::MAX` included
/// (both once made the reference panic).
fn index_value(rng: &mut Prng, f: Field) -> i64 {
    let v = rng.pick(&[
        -1,
        -2,
        0,
        1,
        2,
        3,
        5,
        7,
        8,
        15,
        100,
        1000,
        i32::MAX as i64,
        i32::MIN as i64,
        i64::MAX,
        i64::MIN,
        1 << 40,
    ]);
    let _ = f;
    v
}

/// Applies one random change to `c`.
fn perturb(rng: &mut Prng, c: &mut Case) {
    let f = rng.pick(&FIELDS);
    match rng.below(9) {
        0 => {
            if let Some(b) = field(c, f) {
                let d = b.desc;
                b.desc = strided(rng.pick(&DTYPES), d.shape(), d.strides(), d.offset);
                maybe_fit(rng, b);
            }
        }
        1 | 2 => {
            if let Some(b) = field(c, f) {
                let d = b.desc;
                let mut shape = d.shape().to_vec();
                let mut strides = d.strides().to_vec();
                if rng.chance(0.2) {
                    let rank = rng.below(5);
                    shape = (0..rank).map(|_| rng.pick(&DIMS)).collect();
                    strides = (0..rank).map(|_| rng.pick(&DIMS)).collect();
                } else if !shape.is_empty() {
                    let i = rng.below(shape.len());
                    if rng.chance(0.5) {
                        shape[i] = rng.pick(&DIMS);
                    } else {
                        let s =
                            strides[i] as i64 + rng.pick(&[-16i64, -8, -4, -2, -1, 1, 2, 4, 8, 16]);
                        strides[i] = if rng.chance(0.1) {
                            0
                        } else {
                            s.max(0) as usize
                        };
                    }
                }
                b.desc = strided(d.dtype, &shape, &strides, d.offset);
                maybe_fit(rng, b);
            }
        }
        3 => {
            if let Some(b) = field(c, f) {
                b.desc = b
                    .desc
                    .with_offset(rng.pick(&[0, 1, 2, 4, 8, 16, 32, 48, 64, 4096]));
                maybe_fit(rng, b);
            }
        }
        4 => {
            if let Some(b) = field(c, f) {
                let len = b.bytes.len();
                let new = (len as i64 + rng.range(-64, 64)).max(0) as usize;
                let start = b.bytes.len();
                b.bytes.resize(new, 0);
                for i in start..new {
                    b.bytes[i] = canary_byte(i);
                }
            }
        }
        5 | 6 => {
            if let Some(b) = field(c, f) {
                if matches!(b.desc.dtype, DType::I32 | DType::I64)
                    && b.desc.rank() == 1
                    && b.desc.numel() > 0
                {
                    let n = b.desc.numel();
                    let v = index_value(rng, f);
                    let i = rng.below(n);
                    let offs = element_offsets(&b.desc);
                    let o = offs[i];
                    if o + b.desc.dtype.size() <= b.bytes.len() {
                        if b.desc.dtype == DType::I64 {
                            b.bytes[o..o + 8].copy_from_slice(&v.to_le_bytes());
                        } else {
                            b.bytes[o..o + 4].copy_from_slice(&(v as i32).to_le_bytes());
                        }
                    }
                }
            }
        }
        7 => {
            if let Some(o) = optional(c, f) {
                if o.is_some() && rng.chance(0.5) {
                    *o = None;
                } else {
                    *o = Some(match f {
                        Field::State => RingSpec::random(rng, 2, 2, false).buf(Geo::PLAIN),
                        Field::Prev => Buf::f32_rows(&vec![0.5; 2048], 2, 1024, 1024, 0, 0),
                        Field::Fp8 => f32_scalar(&[1]),
                        _ => Buf::index(&[0, 1, 2, 3], rng.chance(0.5), 0, 0),
                    });
                }
            }
        }
        _ => {
            if rng.chance(0.5) {
                c.eps = rng.pick(&[f32::NAN, f32::INFINITY, -1.0, 0.0, 1e-6, f32::MAX]);
            } else {
                c.compress_ratio = rng.pick(&[0, 1, 2, 3, 4, u32::MAX]);
            }
        }
    }
}

/// Usually grows or shrinks the buffer to the view's extent (so the view
/// itself, not its size, is what is tested).
fn maybe_fit(rng: &mut Prng, b: &mut Buf) {
    if rng.chance(0.75) {
        if let Some(end) = b.desc.end_byte() {
            if end <= (1 << 22) {
                let new = end as usize + rng.pick(&[0, 0, 1, 16]);
                let start = b.bytes.len();
                b.bytes.resize(new, 0);
                for i in start..new {
                    b.bytes[i] = canary_byte(i);
                }
            }
        }
    }
}

fn check_no_panic_no_stray_write(c: &Case) {
    let b = cpu(c.kind.sanitize);
    let out = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run_case(&b, c)))
        .unwrap_or_else(|_| panic!("{}: the launch panicked", c.name));
    let outputs = [
        (&c.latent, &out.latent, "latent_out"),
        (&c.state_cache, &out.state_cache, "state_cache"),
        (&c.kv_cache, &out.kv_cache, "kv_cache"),
    ];
    for (before, after, what) in outputs {
        let (Some(before), Some(after)) = (before, after) else {
            continue;
        };
        if out.result.is_err() {
            assert!(
                before.bytes == *after,
                "{}: {what} written by a rejected launch",
                c.name
            );
            continue;
        }
        let fp = before.footprint();
        for i in 0..after.len() {
            if !fp[i] && before.bytes[i] != after[i] {
                panic!("{}: {what} byte {i} outside its view changed", c.name);
            }
        }
    }
    if out.result.is_err() {
        assert_eq!(
            out.skips,
            SkipCounts::default(),
            "{}: a rejected launch counted skips",
            c.name
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 5000, failure_persistence: None, ..ProptestConfig::default() })]

    /// Arbitrary dtypes, shapes, strides, offsets, buffer sizes, optional
    /// arguments, `eps`, `compress_ratio` and index values (extremes
    /// included): the launch never panics; a rejected launch writes and
    /// counts nothing; an accepted one writes no byte outside the views of
    /// `latent_out`, `state_cache` and `kv_cache`.
    #[test]
    fn arbitrary_arguments_never_panic_nor_write_outside_views(
        case in case_strategy(kind_strategy(
            vec![Op::FusedSaveCompressNorm, Op::RopeQuantInsert, Op::SaveRingRows, Op::FusedCompressInsert],
            true,
            true,
        )),
        seed in any::<u64>(),
        changes in 0usize..4,
    ) {
        let mut c = case;
        let mut rng = Prng::new(seed);
        for _ in 0..changes {
            perturb(&mut rng, &mut c);
        }
        check_no_panic_no_stray_write(&c);
    }
}

/// `semantics.md` (Validation): never a panic. A position of `i64::MAX`
/// (an I64 `positions` entry) makes the reference compute `(p + 1) % CR`,
/// which overflows: a panic ("attempt to add with overflow",
/// `src/backend/cpu.rs`) in debug builds. Release builds wrap to `i64::MIN`,
/// whose remainder is 0, so they happen to treat the token as the group
/// boundary it is and then skip it (its cos/sin row is beyond the table, or
/// its ring row is read at `(p - 1) % capacity`); this test passes there.
/// `(p % CR) == CR - 1` would avoid the overflow.
#[test]
fn position_i64_max_is_not_a_panic() {
    for op in [
        Op::RopeQuantInsert,
        Op::FusedSaveCompressNorm,
        Op::FusedCompressInsert,
    ] {
        let mut k = Kind::new(op, 2, RecordLayout::Mxfp8);
        k.index_i64 = true;
        let mut c = base(k);
        let p = c.positions.as_mut().expect("positions");
        let o = p.desc.offset;
        p.bytes[o..o + 8].copy_from_slice(&i64::MAX.to_le_bytes());
        let out =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run_case(&cpu(false), &c)));
        assert!(out.is_ok(), "{:?}: the launch panicked", op);
    }
}

/// `src/ops.rs` caps a call at `MAX_TOKENS` (2^24) tokens and requests:
/// more requests than that is an error naming `query_start_loc`.
#[test]
fn too_many_requests_is_an_error() {
    let mut c = compress_base(2, false, false);
    let n = dsv4_kvcache::ops::MAX_TOKENS + 2;
    let q = c.query_start_loc.as_mut().expect("qsl");
    *q = Buf::new(
        TensorDesc::contiguous(DType::I32, &[n]),
        0,
        &vec![0u8; 4 * n],
    );
    expect_err(
        &c,
        "query_start_loc with 2^24 + 1 requests",
        "query_start_loc",
    );
}
