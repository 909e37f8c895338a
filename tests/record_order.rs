//! The two record orders of the V4.1 records (528 and 288 B): the seed's
//! page-planar order and vLLM 0.34.0's per-token order hold the same record
//! bytes at other places in the page (the 584 B V4 record is page-planar
//! only). Checked on the CPU reference
//! for every writer and the reader: a call in the per-token order over the
//! page-planar cache with its bytes moved (canaries included) leaves exactly
//! the page-planar result with its bytes moved.

use dsv4_kvcache::layout::{RecordLayout, RecordOrder};
use dsv4_kvcache::testkit::{make_case, make_gather_case, make_written_gather_case, CaseSpec};
use dsv4_kvcache::vectors::{Op, VTensor, VectorFile};

const PAGED: [RecordLayout; 2] = [RecordLayout::Mxfp8, RecordLayout::Nvfp4];

/// Where each byte of a page-planar page goes in the per-token page:
/// `map[i]` is the per-token offset of planar offset `i`.
fn planar_to_per_token(layout: RecordLayout, block_size: usize) -> Vec<usize> {
    let (v, s) = (layout.value_bytes(), layout.scale_bytes());
    let mut map = vec![usize::MAX; block_size * (v + s)];
    for row in 0..block_size {
        let (pv, ps) = RecordOrder::PagePlanar.record_offsets(layout, block_size, row);
        let (tv, ts) = RecordOrder::PerToken.record_offsets(layout, block_size, row);
        for k in 0..v {
            map[pv + k] = tv + k;
        }
        for k in 0..s {
            map[ps + k] = ts + k;
        }
    }
    map
}

/// A cache tensor `[blocks, block_size, W]` with every page's bytes moved
/// from the page-planar to the per-token order.
fn moved(t: &VTensor, layout: RecordLayout) -> VTensor {
    let (bs, w) = (t.shape[1], t.shape[2]);
    assert_eq!(w, layout.record_bytes());
    let map = planar_to_per_token(layout, bs);
    let mut data = vec![0u8; t.data.len()];
    for (page_in, page_out) in t.data.chunks(bs * w).zip(data.chunks_mut(bs * w)) {
        for (i, &b) in page_in.iter().enumerate() {
            page_out[map[i]] = b;
        }
    }
    VTensor::bytes(t.dtype, &t.shape, data)
}

#[test]
fn both_orders_partition_every_page() {
    for layout in PAGED {
        let (v, s) = (layout.value_bytes(), layout.scale_bytes());
        for bs in [1usize, 3, 16, 64] {
            for order in RecordOrder::ALL {
                let mut seen = vec![0u8; bs * (v + s)];
                for row in 0..bs {
                    let (vo, so) = order.record_offsets(layout, bs, row);
                    seen[vo..vo + v].iter_mut().for_each(|b| *b += 1);
                    seen[so..so + s].iter_mut().for_each(|b| *b += 1);
                    match order {
                        // The seed: `page + row * V`, then `page + bs * V + row * S`.
                        RecordOrder::PagePlanar => {
                            assert_eq!((vo, so), (row * v, bs * v + row * s))
                        }
                        // vLLM 0.34.0: `values = page + row * W; scales = values + V`.
                        RecordOrder::PerToken => {
                            assert_eq!((vo, so), (row * (v + s), row * (v + s) + v))
                        }
                    }
                }
                assert!(
                    seen.iter().all(|&c| c == 1),
                    "{} {order} bs {bs}: every byte of a page belongs to one record",
                    layout.name()
                );
            }
        }
    }
    // Names round-trip; anything else is refused.
    for order in RecordOrder::ALL {
        assert_eq!(RecordOrder::from_name(order.name()), Some(order));
    }
    assert_eq!(
        RecordOrder::from_name("per-token"),
        Some(RecordOrder::PerToken)
    );
    assert_eq!(RecordOrder::from_name("interleaved"), None);
    assert_eq!(RecordOrder::default(), RecordOrder::PagePlanar);
}

/// Runs `planar` and its per-token twin on the reference and checks that the
/// twin's outputs are the planar ones with the cache's bytes moved.
fn check_twin(planar: &VectorFile, what: &str) {
    let layout = planar.layout().expect("a layout");
    let mut a = planar.clone();
    let mut b = planar.clone();
    b.set_meta("record_order", "per_token");
    let cache = a.input("kv_cache").expect("a cache").clone();
    b.set_input("kv_cache", moved(&cache, layout));
    a.capture_reference().expect("planar runs");
    b.capture_reference().expect("per-token runs");
    let op = a.op().expect("op");
    let mut compared = 0;
    for name in ["latent_out", "state_cache", "out"] {
        if let (Some(x), Some(y)) = (a.expected(name), b.expected(name)) {
            assert_eq!(x.data, y.data, "{what}: {name} differs between the orders");
            compared += 1;
        }
    }
    if op != Op::GatherDequant {
        let want = moved(a.expected("kv_cache").expect("written"), layout);
        let got = b.expected("kv_cache").expect("written");
        if let Some(i) = want.data.iter().zip(&got.data).position(|(x, y)| x != y) {
            panic!(
                "{what}: kv_cache byte {i} is {} per token, {} moved",
                got.data[i], want.data[i]
            );
        }
        // The call wrote records (not only canaries).
        assert_ne!(
            got.data,
            moved(&cache, layout).data,
            "{what}: nothing written"
        );
        compared += 1;
    }
    assert!(compared >= 1, "{what}: no output compared");
}

#[test]
fn writers_write_the_same_records_in_both_orders() {
    let mut n = 0;
    for layout in PAGED {
        for (op, cr, requests) in [
            (Op::RopeQuantInsert, 1, 1),
            (Op::RopeQuantInsert, 2, 3),
            (Op::FusedCompressInsert, 1, 1),
            (Op::FusedCompressInsert, 2, 1),
            (Op::FusedCompressInsert, 2, 5),
        ] {
            for (sanitize, adversarial) in [(false, false), (true, true), (false, true)] {
                let spec = CaseSpec {
                    op,
                    layout,
                    compress_ratio: cr,
                    tokens: 150,
                    requests,
                    seed: 0x0de5 + n,
                    sanitize,
                    adversarial,
                    ..Default::default()
                };
                check_twin(&make_case(&spec), &format!("{spec:?}"));
                n += 1;
            }
        }
    }
}

#[test]
fn the_reader_reads_both_orders_alike() {
    for (k, layout) in PAGED.into_iter().enumerate() {
        for requests in [0, 3] {
            for out_f32 in [false, true] {
                let spec = CaseSpec {
                    op: Op::GatherDequant,
                    layout,
                    tokens: 97,
                    requests,
                    seed: 0x9a7 + k as u64,
                    adversarial: true,
                    ..Default::default()
                };
                let what = format!("{spec:?} F32 {out_f32}");
                check_twin(&make_written_gather_case(&spec, out_f32), &what);
                check_twin(&make_gather_case(&spec, out_f32), &what);
            }
        }
    }
}

#[test]
fn row_layouts_are_the_same_in_both_orders() {
    // Rows have no scales: the order changes nothing, bytes or validation.
    for layout in [RecordLayout::Bf16Rows, RecordLayout::Fp8Rows] {
        let spec = CaseSpec {
            op: Op::RopeQuantInsert,
            layout,
            compress_ratio: 2,
            tokens: 40,
            ..Default::default()
        };
        let mut a = make_case(&spec);
        let mut b = a.clone();
        b.set_meta("record_order", "per_token");
        a.capture_reference().expect("runs");
        b.capture_reference().expect("runs");
        assert_eq!(
            a.expected("kv_cache").expect("written").data,
            b.expected("kv_cache").expect("written").data
        );
    }
}

#[test]
fn a_file_with_an_unknown_order_is_refused() {
    let mut f = make_case(&CaseSpec::default());
    f.set_meta("record_order", "interleaved");
    let e = f.check().expect_err("an unknown order").to_string();
    assert!(e.contains("record_order \"interleaved\""), "{e}");
    assert!(f.capture_reference().is_err());
}

#[test]
fn v4_records_are_page_planar_only() {
    // Asking for the 584 B record per token is an error naming the
    // argument, for every op that takes a cache, and nothing is written.
    for op in [
        Op::RopeQuantInsert,
        Op::FusedCompressInsert,
        Op::GatherDequant,
    ] {
        let spec = CaseSpec {
            op,
            layout: RecordLayout::V4,
            tokens: 8,
            requests: 0,
            record_order: RecordOrder::PerToken,
            ..Default::default()
        };
        let f = if op == Op::GatherDequant {
            make_gather_case(&spec, false)
        } else {
            make_case(&spec)
        };
        let mut cpu = dsv4_kvcache::CpuBackend::new();
        let text = match f.execute(&mut cpu) {
            Ok(_) => panic!("{op}: a per-token V4 cache was accepted"),
            Err(e) => e.to_string(),
        };
        assert!(
            text.contains("record_order") && text.contains("584"),
            "{op}: {text}"
        );
    }
}
