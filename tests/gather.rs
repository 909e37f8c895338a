//! `gather_dequant` on the CPU reference: every output row is the decoders'
//! record (`layout::decode_record`, rounded once to BF16 or written as F32
//! with the canonical NaN) at the place `docs/layouts.md` ("Reading records
//! back") defines; nothing else of the output changes; out-of-range indices
//! are counted; bad arguments are rejected naming the argument, before
//! anything is written.

mod common;
mod gather_cases;

use common::error_arg;
use dsv4_kvcache::formats::{bf16_from_f32, f32_canonical};
use dsv4_kvcache::layout::{decode_record, DIM};
use dsv4_kvcache::ops::SkipCounts;
use dsv4_kvcache::RecordOrder;
use dsv4_kvcache::{
    Backend, CpuBackend, DType, GatherArgs, GatherIndex, RecordLayout, Tensor, TensorDesc,
    TensorMut,
};
use gather_cases::{
    cache_desc, canary_byte, every_code_case, every_code_scales, fill_cache, random_case, Case,
    Fill, Form, Rng,
};

/// What the definition says output row `o` gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Want {
    Record(usize, usize),
    Untouched,
    Skip(SkipCounts),
}

/// `Want::Record` of each `(block, row)`, in order.
fn records(at: &[(usize, usize)]) -> Vec<Want> {
    at.iter().map(|&(b, r)| Want::Record(b, r)).collect()
}

fn skip(slot: u64, pos: u64, idx: u64) -> Want {
    Want::Skip(SkipCounts {
        slot_out_of_range: slot,
        position_out_of_range: pos,
        index_out_of_range: idx,
    })
}

/// The request search as `docs/layouts.md` writes it.
fn request_of(cu: &[i64], o: i64) -> usize {
    let (mut lo, mut hi) = (0, cu.len() - 1);
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if cu[mid] <= o {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    lo
}

/// The definition, row by row, and the once-per-call count.
fn model(case: &Case) -> (Vec<Want>, SkipCounts) {
    let cap = (case.blocks * case.block_size) as i64;
    let bs = case.block_size as i64;
    let mut once = SkipCounts::default();
    let rows = match &case.form {
        Form::Slots { slots, .. } => slots
            .iter()
            .map(|&s| {
                if s < 0 {
                    Want::Untouched
                } else if s >= cap {
                    skip(1, 0, 0)
                } else {
                    Want::Record((s / bs) as usize, (s % bs) as usize)
                }
            })
            .collect(),
        Form::Table {
            table,
            cols,
            row_stride,
            cu,
            starts,
            ..
        } => {
            let reqs = cu.len() - 1;
            let t = case.out_rows;
            if t > 0 && cu[reqs] > t as i64 {
                once.index_out_of_range = 1;
            }
            let sorted = cu.windows(2).all(|w| w[0] <= w[1]);
            (0..t as i64)
                .map(|o| {
                    if reqs == 0 {
                        return Want::Untouched;
                    }
                    let r = request_of(cu, o);
                    if sorted && cu[0] <= o && o < cu[reqs] {
                        // On a sorted cu_seq_lens the search is the plain rule.
                        let plain = (0..reqs).rev().find(|&k| cu[k] <= o).unwrap();
                        assert_eq!(r, plain);
                    }
                    if !(cu[r] <= o && o < cu[r + 1]) {
                        return Want::Untouched;
                    }
                    let start = starts.as_ref().map_or(0, |s| s[r]);
                    let pos = i128::from(start) + i128::from(o - cu[r]);
                    if start < 0 || pos > i128::from(i64::MAX) {
                        return skip(0, 1, 0);
                    }
                    let pos = pos as i64;
                    let j = pos / bs;
                    if j >= *cols as i64 {
                        return skip(0, 1, 0);
                    }
                    let b = table[r * row_stride + j as usize];
                    if b < 0 || b >= case.blocks as i64 {
                        return skip(1, 0, 0);
                    }
                    Want::Record(b as usize, (pos % bs) as usize)
                })
                .collect()
        }
    };
    (rows, once)
}

/// The bytes the decoders give for (block, row).
fn decoded_row(case: &Case, block: usize, row: usize) -> Vec<u8> {
    let (v, s) = case.record(block, row);
    let vals = decode_record(case.layout, v, s, case.fp8_scale.unwrap_or(1.0));
    let mut out = Vec::new();
    for x in vals {
        if case.out_f32 {
            out.extend_from_slice(&f32_canonical(x).to_le_bytes());
        } else {
            out.extend_from_slice(&bf16_from_f32(x).to_le_bytes());
        }
    }
    out
}

/// Checks an outcome against the model: rows, canaries, counts.
fn check(case: &Case, got: &gather_cases::Outcome) {
    let (rows, once) = model(case);
    let mut want = case.canary_out();
    let mut counts = once;
    for (o, w) in rows.iter().enumerate() {
        match *w {
            Want::Record(b, r) => {
                let at = case.out_row_at(o);
                want[at..at + DIM * case.out_esz()].copy_from_slice(&decoded_row(case, b, r));
            }
            Want::Skip(k) => counts.add(k),
            Want::Untouched => {}
        }
    }
    if got.out != want {
        let i = got.out.iter().zip(&want).position(|(a, b)| a != b).unwrap();
        let row = i.saturating_sub(case.out_offset) / (case.out_row_stride * case.out_esz());
        panic!(
            "{}: output byte {i} (about row {row}) is {:#04x}, expected {:#04x}",
            case.label, got.out[i], want[i]
        );
    }
    assert_eq!(got.counts, counts, "{}: skip counts", case.label);
}

#[test]
fn random_and_adversarial_cases_match_the_decoders() {
    let cpu = CpuBackend::with_threads(2).unwrap();
    let mut seed = 0u64;
    let (mut read, mut skipped) = ([0usize; 2], [0u64; 2]);
    for layout in RecordLayout::ALL {
        for table in [false, true] {
            for wild in [false, true] {
                for n in [1usize, 5, 40, 300] {
                    seed += 1;
                    let case = random_case(seed << 8 | n as u64, layout, table, n, wild);
                    let got = case.run(&cpu).unwrap();
                    check(&case, &got);
                    let (rows, _) = model(&case);
                    read[usize::from(table)] += rows
                        .iter()
                        .filter(|w| matches!(w, Want::Record(..)))
                        .count();
                    skipped[usize::from(table)] += got.counts.total();
                }
            }
        }
    }
    // The cases do gather, and do skip, in both forms.
    assert!(read.iter().all(|&r| r > 1000), "rows read {read:?}");
    assert!(skipped.iter().all(|&k| k > 20), "rows skipped {skipped:?}");
}

/// Every (value code, scale) pair of every paged layout, and the FP8 row
/// scales, decoded as the decoders say (`check` compares with them).
#[test]
fn every_code_with_every_scale() {
    let cpu = CpuBackend::new();
    for layout in RecordLayout::ALL {
        for out_f32 in [false, true] {
            for &s in every_code_scales(layout) {
                let case = every_code_case(layout, out_f32, s, true);
                check(&case, &case.run(&cpu).unwrap());
            }
        }
    }
}

/// decode(insert(x)) for every layout in both record orders, both outputs,
/// many latents.
#[test]
fn inserted_records_read_back_as_the_decoders_say() {
    let cpu = CpuBackend::new();
    for (k, layout) in RecordLayout::ALL.into_iter().enumerate() {
        for order in RecordOrder::ALL {
            if order == RecordOrder::PerToken && !layout.has_record_orders() {
                continue;
            }
            let mut rng = Rng::new(100 + k as u64);
            let desc = cache_desc(layout, 16, 16, 1, false);
            let cache = fill_cache(&mut rng, layout, order, &desc, Fill::Inserted);
            for out_f32 in [false, true] {
                let case = Case {
                    label: format!("{} {order} inserted, F32 {out_f32}", layout.name()),
                    layout,
                    order,
                    blocks: 16,
                    block_size: 16,
                    cache_desc: desc,
                    cache: cache.clone(),
                    fp8_scale: (layout == RecordLayout::Fp8Rows).then_some(0.75),
                    form: Form::Slots {
                        slots: (0..256).map(|i| (i * 37 % 256) as i64).collect(),
                        i64: true,
                    },
                    out_f32,
                    out_rows: 256,
                    out_row_stride: DIM + 8,
                    out_offset: 32,
                };
                check(&case, &case.run(&cpu).unwrap());
            }
        }
    }
}

/// Hand-checked values, independent of the decoders: NaN codes, scale
/// 0xFF, negative zero, subnormal results.
#[test]
fn special_codes_have_the_documented_values() {
    let cpu = CpuBackend::new();
    // One MXFP8 record in a 1 x 1 cache.
    let mut rec = vec![0u8; 528];
    rec[0] = 0x7f; // NaN code
    rec[1] = 0xff; // NaN code
    rec[2] = 0x80; // -0
    rec[3] = 0x01; // 2^-9
    rec[32] = 0x38; // 1.0 in block 1
    rec[64] = 0x01; // 2^-9 in block 2
    rec[96] = 0x7e; // 448 in block 3
    rec[512] = 127; // block 0: 2^0
    rec[513] = 255; // block 1: NaN scale
    rec[514] = 0; // block 2: 2^-127
    rec[515] = 254; // block 3: 2^127
    rec[516..528].fill(127);
    let read = |out_f32: bool| -> Vec<u8> {
        let desc = TensorDesc::contiguous(DType::U8, &[1, 1, 528]);
        let slots = 0i32.to_le_bytes().to_vec();
        let esz = if out_f32 { 4 } else { 2 };
        let mut out = vec![0xaau8; DIM * esz];
        let dt = if out_f32 { DType::F32 } else { DType::BF16 };
        cpu.gather_dequant(GatherArgs {
            kv_cache: Tensor::new(&rec, desc),
            index: GatherIndex::Slots {
                slot_mapping: Tensor::new(&slots, TensorDesc::contiguous(DType::I32, &[1])),
            },
            fp8_scale: None,
            out: TensorMut::new(&mut out, TensorDesc::contiguous(dt, &[1, DIM])),
            record_order: RecordOrder::PagePlanar,
        })
        .unwrap();
        out
    };
    let h = read(false);
    let bf = |d: usize| u16::from_le_bytes([h[2 * d], h[2 * d + 1]]);
    assert_eq!(bf(0), 0x7fff, "NaN code");
    assert_eq!(bf(1), 0x7fff, "negative NaN code");
    assert_eq!(bf(2), 0x8000, "-0");
    assert_eq!(bf(3), 0x3b00, "2^-9");
    assert_eq!(bf(32), 0x7fff, "1.0 under the NaN scale");
    assert_eq!(bf(33), 0x7fff, "0 under the NaN scale");
    assert_eq!(bf(64), 0x0000, "2^-136 rounds to +0 in BF16");
    assert_eq!(bf(65), 0x0000, "0 x 2^-127");
    assert_eq!(bf(96), 0x7f80, "448 x 2^127 overflows to +inf");
    let f = read(true);
    let fl = |d: usize| u32::from_le_bytes(f[4 * d..4 * d + 4].try_into().unwrap());
    assert_eq!(fl(0), 0x7fc0_0000);
    assert_eq!(fl(1), 0x7fc0_0000);
    assert_eq!(fl(2), 0x8000_0000);
    assert_eq!(fl(3), 0x3b00_0000);
    assert_eq!(fl(32), 0x7fc0_0000);
    assert_eq!(fl(64), 0x0000_2000, "2^-136 is an f32 subnormal");
    assert_eq!(fl(96), 0x7f80_0000);
}

/// A case over a random `blocks` x `block_size` cache in `layout` (the
/// generator seeded with `seed`, no FP8 scale), its index and output left for
/// the caller to set.
fn on_random_cache(
    label: &str,
    layout: RecordLayout,
    seed: u64,
    blocks: usize,
    block_size: usize,
) -> Case {
    let desc = cache_desc(layout, blocks, block_size, 0, false);
    let cache = fill_cache(
        &mut Rng::new(seed),
        layout,
        RecordOrder::PagePlanar,
        &desc,
        Fill::Random,
    );
    Case {
        label: label.into(),
        layout,
        order: RecordOrder::PagePlanar,
        blocks,
        block_size,
        cache_desc: desc,
        cache,
        fp8_scale: None,
        form: Form::Slots {
            slots: Vec::new(),
            i64: true,
        },
        out_f32: false,
        out_rows: 0,
        out_row_stride: DIM,
        out_offset: 0,
    }
}

/// A block table of 3 requests x 2 columns (rows 2 apart), its
/// `cu_seq_lens`, `seq_starts` and index type.
fn table_3x2(table: [i64; 6], cu: Vec<i64>, starts: Option<Vec<i64>>, i64: bool) -> Form {
    Form::Table {
        table: table.to_vec(),
        rows: 3,
        cols: 2,
        row_stride: 2,
        cu,
        starts,
        i64,
    }
}

/// A block table by hand: positions through `seq_starts`, a request past
/// its table, a bad block, an empty request, a total beyond `out`.
#[test]
fn block_table_rows_by_hand() {
    let case = Case {
        // Request 0: rows 0..3 from position 5 (block table[0][1] = 3, rows
        // 1, 2, 3). Request 1: empty. Request 2: rows 3..6 from position 6:
        // positions 6, 7 in table[2][1] = 9 (bad block), position 8 past
        // the two columns. The total 7 is beyond out's 6 rows.
        form: table_3x2(
            [0, 3, 1, 1, 2, 9],
            vec![0, 3, 3, 7],
            Some(vec![5, 0, 6]),
            false,
        ),
        out_f32: false,
        out_rows: 6,
        ..on_random_cache("by hand", RecordLayout::Mxfp8, 7, 4, 4)
    };
    let (rows, once) = model(&case);
    let mut want = records(&[(3, 1), (3, 2), (3, 3)]);
    want.extend([skip(1, 0, 0), skip(1, 0, 0), skip(0, 1, 0)]);
    assert_eq!(rows, want);
    assert_eq!(once.index_out_of_range, 1);
    let got = case.run(&CpuBackend::new()).unwrap();
    check(&case, &got);
    assert_eq!(
        got.counts,
        SkipCounts {
            slot_out_of_range: 2,
            position_out_of_range: 1,
            index_out_of_range: 1
        }
    );
}

/// A decreasing `cu_seq_lens`: the search decides which request a row
/// belongs to; every row from `cu[0]` up to `cu[R]` still belongs to one.
#[test]
fn decreasing_cu_seq_lens_follows_the_search() {
    let mut case = Case {
        form: table_3x2([0, 1, 1, 0, 0, 1], vec![0, 5, 2, 6], None, true),
        out_f32: true,
        out_rows: 7,
        ..on_random_cache("decreasing", RecordLayout::Bf16Rows, 8, 2, 4)
    };
    // Rows 0..5: the search stops at request 0 (cu[1] = 5 > o), which owns
    // them (block table[0][o / 4]). Row 5: request 2 (cu[2] = 2 <= 5), its
    // fourth token. Request 1 owns nothing; row 6 is past the total.
    let (rows, once) = model(&case);
    let mut want = records(&[(0, 0), (0, 1), (0, 2), (0, 3), (1, 0), (0, 3)]);
    want.push(Want::Untouched);
    assert_eq!(rows, want);
    assert_eq!(once, SkipCounts::default());
    check(&case, &case.run(&CpuBackend::new()).unwrap());
    // A first entry above the row: the rows before it are nobody's.
    case.form = table_3x2([0, 1, 1, 0, 0, 1], vec![10, 0, 5, 3], None, false);
    let (rows, _) = model(&case);
    // Rows 0..5 land on request 1 (cu[1] = 0 <= o, cu[2] = 5 > o), whose
    // table row is [1, 0]; rows 5 and 6 on request 2, which owns nothing.
    assert_eq!(rows[0], Want::Record(1, 0));
    assert_eq!(rows[4], Want::Record(0, 0));
    assert_eq!(rows[5], Want::Untouched);
    assert_eq!(rows[6], Want::Untouched);
    check(&case, &case.run(&CpuBackend::new()).unwrap());
}

/// The slot form's counts and untouched rows on a wild slot list.
#[test]
fn out_of_range_slots_write_nothing_and_are_counted() {
    let case = Case {
        form: Form::Slots {
            slots: vec![3, -1, 4, i64::MAX, 0, i64::MIN, 2],
            i64: true,
        },
        out_f32: false,
        out_rows: 8,
        out_row_stride: DIM + 16,
        out_offset: 48,
        ..on_random_cache("wild slots", RecordLayout::Nvfp4, 9, 2, 2)
    };
    let got = case.run(&CpuBackend::new()).unwrap();
    check(&case, &got);
    assert_eq!(got.counts.slot_out_of_range, 2);
    assert_eq!(got.counts.total(), 2);
    // Rows 1 (slot -1), 2 and 3 (out of range), 5 and 7 (past N) untouched.
    for o in [1usize, 2, 3, 5, 7] {
        let at = case.out_row_at(o);
        for i in at..at + DIM * 2 {
            assert_eq!(got.out[i], canary_byte(i), "row {o}");
        }
    }
}

/// A cache of no blocks: every slot is outside it, and the slot kernels,
/// which load a skipped row's record from block 0, do not serve it.
#[test]
fn an_empty_cache_skips_every_slot_and_keeps_the_checked_kernels() {
    use dsv4_kvcache::gather::plan_gather;
    let slots: Vec<u8> = [0i64, 3, -1].iter().flat_map(|x| x.to_le_bytes()).collect();
    for blocks in [0usize, 1] {
        let cache = vec![0u8; blocks * 4 * 528];
        let canary: Vec<u8> = (0..3 * DIM * 2).map(canary_byte).collect();
        let mut out = canary.clone();
        let args = GatherArgs {
            kv_cache: Tensor::new(&cache, TensorDesc::contiguous(DType::U8, &[blocks, 4, 528])),
            index: GatherIndex::Slots {
                slot_mapping: Tensor::new(&slots, TensorDesc::contiguous(DType::I64, &[3])),
            },
            fp8_scale: None,
            out: TensorMut::new(&mut out, TensorDesc::contiguous(DType::BF16, &[3, DIM])),
            record_order: RecordOrder::PagePlanar,
        };
        assert_eq!(
            plan_gather(&args).unwrap().slot_kernels(),
            blocks > 0,
            "{blocks} blocks"
        );
        let cpu = CpuBackend::new();
        cpu.gather_dequant(args).unwrap();
        let counts = cpu.take_skip_counts().unwrap();
        if blocks == 0 {
            assert_eq!(counts.slot_out_of_range, 2);
            assert_eq!(out, canary);
        } else {
            assert_eq!(counts.total(), 0);
        }
    }
}

// ---- validation -----------------------------------------------------------

/// Valid arguments' pieces: an MXFP8 cache of 4 x 4, three slots, a
/// two-request block table.
struct Parts {
    cache: Vec<u8>,
    slots: Vec<u8>,
    table: Vec<u8>,
    cu: Vec<u8>,
    starts: Vec<u8>,
    scale: Vec<u8>,
}

fn i32_bytes(v: &[i32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn parts() -> Parts {
    Parts {
        cache: vec![0u8; 4 * 4 * 528],
        slots: i32_bytes(&[0, 5, 9]),
        table: i32_bytes(&[0, 1, 2, 3]),
        cu: i32_bytes(&[0, 2, 3]),
        starts: i32_bytes(&[0, 1]),
        scale: 1.0f32.to_le_bytes().to_vec(),
    }
}

fn i32d(n: usize) -> TensorDesc {
    TensorDesc::contiguous(DType::I32, &[n])
}

/// The valid slot-form call over `p`, writing `out`.
fn base<'a>(p: &'a Parts, out: &'a mut Vec<u8>) -> GatherArgs<'a, Vec<u8>> {
    GatherArgs {
        kv_cache: Tensor::new(&p.cache, TensorDesc::contiguous(DType::U8, &[4, 4, 528])),
        index: GatherIndex::Slots {
            slot_mapping: Tensor::new(&p.slots, i32d(3)),
        },
        fp8_scale: None,
        out: TensorMut::new(out, TensorDesc::contiguous(DType::BF16, &[4, DIM])),
        record_order: RecordOrder::PagePlanar,
    }
}

/// The valid block-table index over `p`, with `table` and `cu` views.
fn table_index(p: &Parts, table: TensorDesc, cu: TensorDesc) -> GatherIndex<'_, Vec<u8>> {
    GatherIndex::BlockTable {
        block_table: Tensor::new(&p.table, table),
        cu_seq_lens: Tensor::new(&p.cu, cu),
        seq_starts: None,
    }
}

type Edit = for<'a> fn(&mut GatherArgs<'a, Vec<u8>>, &'a Parts);

#[test]
fn validation_errors_name_the_argument() {
    let cpu = CpuBackend::new();
    let p = parts();
    let t22 = TensorDesc::contiguous(DType::I32, &[2, 2]);
    let edits: Vec<(&str, Edit)> = vec![
        ("kv_cache", |a, _| {
            a.kv_cache.desc = TensorDesc::contiguous(DType::U8, &[4, 4, 500])
        }),
        ("kv_cache", |a, _| {
            a.kv_cache.desc = TensorDesc::contiguous(DType::F32, &[4, 4, 512])
        }),
        ("kv_cache", |a, _| {
            a.kv_cache.desc = TensorDesc::contiguous(DType::U8, &[5, 4, 528])
        }),
        ("out", |a, _| {
            a.out.desc = TensorDesc::contiguous(DType::I32, &[4, DIM])
        }),
        ("out", |a, _| {
            a.out.desc = TensorDesc::contiguous(DType::BF16, &[4, 256])
        }),
        ("out", |a, _| {
            a.out.desc = TensorDesc::contiguous(DType::BF16, &[2, DIM])
        }),
        ("out", |a, _| {
            a.out.desc = TensorDesc::strided(DType::BF16, &[4, DIM], &[DIM + 4, 1]).unwrap()
        }),
        ("out", |a, _| {
            a.out.desc = TensorDesc::contiguous(DType::BF16, &[4, DIM]).with_offset(8)
        }),
        ("out", |a, _| {
            a.out.desc = TensorDesc::contiguous(DType::F32, &[4, DIM])
        }),
        ("slot_mapping", |a, p| {
            a.index = GatherIndex::Slots {
                slot_mapping: Tensor::new(&p.slots, TensorDesc::contiguous(DType::F32, &[3])),
            }
        }),
        ("slot_mapping", |a, p| {
            a.index = GatherIndex::Slots {
                slot_mapping: Tensor::new(&p.slots, TensorDesc::contiguous(DType::I32, &[1, 3])),
            }
        }),
        ("slot_mapping", |a, p| {
            a.index = GatherIndex::Slots {
                slot_mapping: Tensor::new(&p.slots, i32d(30)),
            }
        }),
        ("fp8_scale", |a, p| {
            a.fp8_scale = Some(Tensor::new(
                &p.scale,
                TensorDesc::contiguous(DType::F32, &[1]),
            ))
        }),
        ("fp8_scale", |a, p| {
            a.kv_cache = Tensor::new(
                &p.cache,
                TensorDesc::contiguous(DType::F8E4M3, &[4, 4, 512]),
            )
        }),
        ("cu_seq_lens", |a, p| {
            a.index = table_index(p, TensorDesc::contiguous(DType::I32, &[2, 2]), i32d(0))
        }),
        ("cu_seq_lens", |a, p| {
            a.index = table_index(
                p,
                TensorDesc::contiguous(DType::I32, &[2, 2]),
                TensorDesc::contiguous(DType::I64, &[3]),
            )
        }),
        ("block_table", |a, p| {
            a.index = table_index(p, TensorDesc::contiguous(DType::I32, &[1, 2]), i32d(3))
        }),
        ("block_table", |a, p| {
            a.index = table_index(p, TensorDesc::contiguous(DType::I32, &[4]), i32d(3))
        }),
        ("block_table", |a, p| {
            a.index = table_index(p, TensorDesc::contiguous(DType::I32, &[2, 3]), i32d(3))
        }),
        ("block_table", |a, p| {
            a.index = table_index(
                p,
                TensorDesc::strided(DType::I32, &[2, 2], &[2, 2]).unwrap(),
                i32d(3),
            )
        }),
        ("seq_starts", |a, p| {
            a.index = GatherIndex::BlockTable {
                block_table: Tensor::new(&p.table, TensorDesc::contiguous(DType::I32, &[2, 2])),
                cu_seq_lens: Tensor::new(&p.cu, i32d(3)),
                seq_starts: Some(Tensor::new(&p.starts, i32d(1))),
            }
        }),
        ("seq_starts", |a, p| {
            a.index = GatherIndex::BlockTable {
                block_table: Tensor::new(&p.table, TensorDesc::contiguous(DType::I32, &[2, 2])),
                cu_seq_lens: Tensor::new(&p.cu, i32d(3)),
                seq_starts: Some(Tensor::new(
                    &p.starts,
                    TensorDesc::contiguous(DType::BF16, &[2]),
                )),
            }
        }),
    ];
    // The unedited calls are valid, in both forms.
    let mut out = vec![0x5au8; 4 * 1024];
    cpu.gather_dequant(base(&p, &mut out)).unwrap();
    let mut a = base(&p, &mut out);
    a.index = table_index(&p, t22, i32d(3));
    cpu.gather_dequant(a).unwrap();
    for (i, (arg, edit)) in edits.into_iter().enumerate() {
        let mut out = vec![0x5au8; 4 * 1024];
        let mut a = base(&p, &mut out);
        edit(&mut a, &p);
        let e = cpu.gather_dequant(a).expect_err("must be rejected");
        assert_eq!(error_arg(&e), arg, "case {i}: {e}");
        assert!(
            out.iter().all(|&b| b == 0x5a),
            "case {i}: nothing is written"
        );
    }
}

/// The bench's "written" caches (`testkit::make_written_gather_case`) hold
/// what the writer makes of normal latents, so every unit takes its
/// layout's short path in the kernels (the property the bench's written
/// rows rely on); everything but the cache is the random-bytes case's.
#[test]
fn written_caches_take_the_short_paths() {
    use dsv4_kvcache::formats::{bf16_nan_in_word, e4m3_nan_in_word};
    use dsv4_kvcache::testkit::{
        make_gather_case, make_written_gather_case, CaseSpec, GATHER_BLOCK_SIZE,
    };
    use dsv4_kvcache::vectors::Op;
    for layout in RecordLayout::ALL {
        let spec = CaseSpec {
            op: Op::GatherDequant,
            layout,
            tokens: 40,
            requests: 0,
            seed: 11,
            ..Default::default()
        };
        let written = make_written_gather_case(&spec, false);
        let random = make_gather_case(&spec, false);
        let cache = &written.input("kv_cache").expect("a cache").data;
        // Only the cache differs from the random-bytes case.
        assert_ne!(cache, &random.input("kv_cache").expect("a cache").data);
        for name in ["slot_mapping", "out"] {
            assert_eq!(written.input(name), random.input(name), "{name}");
        }
        let (v, s) = (layout.value_bytes(), layout.scale_bytes());
        let bs = GATHER_BLOCK_SIZE;
        let words = |b: &[u8]| -> Vec<u32> {
            b.chunks(4)
                .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
                .collect()
        };
        for (block, page) in cache.chunks(bs * (v + s)).enumerate() {
            for r in 0..bs {
                let values = &page[r * v..(r + 1) * v];
                let scales = &page[bs * v + r * s..bs * v + (r + 1) * s];
                let at = format!("{} block {block} row {r}", layout.name());
                match layout {
                    RecordLayout::V4 | RecordLayout::Mxfp8 => {
                        let codes = if layout == RecordLayout::V4 {
                            &values[..448]
                        } else {
                            values
                        };
                        assert!(!words(codes).into_iter().any(e4m3_nan_in_word), "{at}");
                        let used = if layout == RecordLayout::V4 {
                            &scales[..7]
                        } else {
                            scales
                        };
                        assert!(
                            used.iter().all(|&b| (3..=134).contains(&b)),
                            "{at}: {used:?}"
                        );
                        if layout == RecordLayout::V4 {
                            assert!(
                                !words(&values[448..]).into_iter().any(bf16_nan_in_word),
                                "{at}"
                            );
                        }
                    }
                    RecordLayout::Nvfp4 => {
                        assert!(scales.iter().all(|&b| b & 0x7f != 0x7f), "{at}")
                    }
                    RecordLayout::Bf16Rows => {
                        assert!(!words(values).into_iter().any(bf16_nan_in_word), "{at}")
                    }
                    RecordLayout::Fp8Rows => {
                        assert!(!words(values).into_iter().any(e4m3_nan_in_word), "{at}")
                    }
                }
            }
        }
    }
}
