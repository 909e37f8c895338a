//! The worked examples of `docs/layouts.md`, recomputed by the CPU reference.
//!
//! The document holds, per layout, a hex dump of one record (in a code block
//! after `<!-- example:LAYOUT -->`), a table of selected bytes with their
//! meaning (after `<!-- bytes:LAYOUT -->`: `| offset | hex bytes | meaning |`)
//! and where that record lands in a paged cache (after `<!-- page:LAYOUT -->`:
//! `| what | byte offset |`). This test inserts the example latent with
//! `rope_quant_insert` and fails if any byte or offset the document shows is
//! not what the library writes.
//!
//! To print the blocks as they should read:
//! `LAYOUT_EXAMPLES_PRINT=1 cargo test --release --test layout_examples -- --nocapture`.

use dsv4_kvcache::formats::bf16_from_f32;
use dsv4_kvcache::layout::decode_record;
use dsv4_kvcache::reference::encode_record;
use dsv4_kvcache::testkit::rope_cos_sin;
use dsv4_kvcache::RecordOrder;
use dsv4_kvcache::{
    Backend, CpuBackend, DType, InsertArgs, RecordLayout, Tensor, TensorDesc, TensorMut,
};
use std::collections::BTreeMap;

/// The example: position 3 (CR1), slot 6 of a cache of 2 blocks of 4 rows.
const POSITION: usize = 3;
const SLOT: usize = 6;
const BLOCKS: usize = 2;
const BLOCK_SIZE: usize = 4;
const FP8_SCALE: f32 = 0.5;

/// The example latent: zero except for a few chosen dims.
fn latent() -> [u16; 512] {
    let mut x = [0.0f32; 512];
    x[0] = 1.0;
    x[1] = -0.5;
    x[2] = 3.0;
    x[3] = 0.1;
    x[40] = -7.0;
    x[128] = 1000.0;
    x[129] = -0.0;
    x[448] = 1.0;
    x[449] = 0.0;
    x[510] = 0.5;
    x[511] = -0.25;
    x.map(bf16_from_f32)
}

fn cache_desc(layout: RecordLayout) -> TensorDesc {
    match layout {
        RecordLayout::Bf16Rows => TensorDesc::contiguous(DType::BF16, &[BLOCKS, BLOCK_SIZE, 512]),
        RecordLayout::Fp8Rows => TensorDesc::contiguous(DType::F8E4M3, &[BLOCKS, BLOCK_SIZE, 512]),
        l => TensorDesc::contiguous(DType::U8, &[BLOCKS, BLOCK_SIZE, l.record_bytes()]),
    }
}

/// What the example writes: the cache after the insert, and where the
/// record's values and scales start.
struct Written {
    cache: Vec<u8>,
    values_at: usize,
    scales_at: Option<usize>,
}

fn insert(layout: RecordLayout) -> Written {
    let b = CpuBackend::new();
    let lat: Vec<u8> = latent().iter().flat_map(|h| h.to_le_bytes()).collect();
    let cos: Vec<u8> = rope_cos_sin(POSITION + 1)
        .iter()
        .flat_map(|f| f.to_le_bytes())
        .collect();
    let pos = (POSITION as i64).to_le_bytes().to_vec();
    let slot = (SLOT as i64).to_le_bytes().to_vec();
    let scale = FP8_SCALE.to_le_bytes().to_vec();
    let desc = cache_desc(layout);
    // A cache of 0xEE bytes, so that untouched bytes are visible.
    let mut cache = vec![0xEEu8; desc.end_byte().unwrap() as usize];
    b.rope_quant_insert(InsertArgs {
        latent: Tensor::new(&lat, TensorDesc::contiguous(DType::BF16, &[1, 512])),
        positions: Tensor::new(&pos, TensorDesc::contiguous(DType::I64, &[1])),
        cos_sin_cache: Tensor::new(
            &cos,
            TensorDesc::contiguous(DType::F32, &[POSITION + 1, 64]),
        ),
        kv_cache: TensorMut::new(&mut cache, desc),
        slot_mapping: Tensor::new(&slot, TensorDesc::contiguous(DType::I64, &[1])),
        compress_ratio: 1,
        fp8_scale: (layout == RecordLayout::Fp8Rows)
            .then(|| Tensor::new(&scale, TensorDesc::contiguous(DType::F32, &[1]))),
        record_order: RecordOrder::PagePlanar,
    })
    .unwrap();
    let (block, row) = (SLOT / BLOCK_SIZE, SLOT % BLOCK_SIZE);
    let (v, s) = (layout.value_bytes(), layout.scale_bytes());
    let page = block * BLOCK_SIZE * (v + s);
    Written {
        cache,
        values_at: page + row * v,
        scales_at: (s > 0).then_some(page + BLOCK_SIZE * v + row * s),
    }
}

/// The record's bytes: values then scales (the order of the hex dump).
fn record(layout: RecordLayout, w: &Written) -> Vec<u8> {
    let mut r = w.cache[w.values_at..w.values_at + layout.value_bytes()].to_vec();
    if let Some(s) = w.scales_at {
        r.extend_from_slice(&w.cache[s..s + layout.scale_bytes()]);
    }
    r
}

/// `hexdump`-style: decimal offset, 16 bytes a line, and `*` for lines that
/// repeat the line above.
fn hex_dump(bytes: &[u8]) -> String {
    let mut s = String::new();
    let mut prev: Option<&[u8]> = None;
    let mut starred = false;
    for (i, line) in bytes.chunks(16).enumerate() {
        if prev == Some(line) {
            if !starred {
                s.push_str("   *\n");
                starred = true;
            }
            continue;
        }
        starred = false;
        prev = Some(line);
        let hex: Vec<String> = line.iter().map(|b| format!("{b:02x}")).collect();
        s.push_str(&format!("{:4}: {}\n", i * 16, hex.join(" ")));
    }
    s
}

/// Text after `<!-- {marker} -->` up to the next blank line that follows content,
/// or the fenced block right after it.
fn section<'a>(doc: &'a str, marker: &str) -> &'a str {
    let tag = format!("<!-- {marker} -->");
    let start = doc
        .find(&tag)
        .unwrap_or_else(|| panic!("docs/layouts.md has no {tag}"))
        + tag.len();
    let rest = doc[start..].trim_start_matches(['\n', ' ']);
    if let Some(body) = rest.strip_prefix("```text\n") {
        return &body[..body.find("```").expect("closing fence")];
    }
    let end = rest.find("\n\n").unwrap_or(rest.len());
    &rest[..end]
}

fn parse_hex(s: &str) -> Vec<u8> {
    s.split_whitespace()
        .map(|h| {
            u8::from_str_radix(h.trim_start_matches("0x"), 16)
                .unwrap_or_else(|_| panic!("bad hex {h:?}"))
        })
        .collect()
}

fn layouts() -> BTreeMap<&'static str, RecordLayout> {
    RecordLayout::ALL.iter().map(|l| (l.name(), *l)).collect()
}

#[test]
fn device_path_and_reference_agree() {
    // The insert wrote exactly the record encode_record computes, and nothing else.
    let lat = latent();
    let table = rope_cos_sin(POSITION + 1);
    let cos: [f32; 32] = table[POSITION * 64..POSITION * 64 + 32].try_into().unwrap();
    let sin: [f32; 32] = table[POSITION * 64 + 32..POSITION * 64 + 64]
        .try_into()
        .unwrap();
    for layout in RecordLayout::ALL {
        let w = insert(layout);
        let rec = encode_record(layout, &lat, &cos, &sin, false, 1.0 / FP8_SCALE);
        let mut want = rec.values[..layout.value_bytes()].to_vec();
        want.extend_from_slice(&rec.scales[..layout.scale_bytes()]);
        assert_eq!(record(layout, &w), want, "{}", layout.name());
        let touched = w.cache.iter().filter(|&&b| b != 0xEE).count();
        assert!(
            touched <= layout.record_bytes(),
            "{} wrote outside its record",
            layout.name()
        );
    }
}

#[test]
fn docs_show_the_bytes_the_reference_writes() {
    let print = std::env::var_os("LAYOUT_EXAMPLES_PRINT").is_some();
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/layouts.md");
    let doc = std::fs::read_to_string(path).expect("docs/layouts.md");
    let mut problems = Vec::new();
    for (name, layout) in layouts() {
        let w = insert(layout);
        let rec = record(layout, &w);
        let dump = hex_dump(&rec);
        if print {
            println!("<!-- example:{name} -->\n```text\n{dump}```\n");
            println!(
                "page: values at {}, scales at {:?}, record {} bytes\n",
                w.values_at,
                w.scales_at,
                rec.len()
            );
        }
        if print {
            continue;
        }
        // 1. The full hex dump.
        let shown = section(&doc, &format!("example:{name}"));
        if shown.trim_end() != dump.trim_end() {
            problems.push(format!(
                "{name}: the hex dump differs; it should read\n```text\n{dump}```"
            ));
        }
        // 2. The annotated bytes: | offset | hex bytes | meaning |.
        let table = section(&doc, &format!("bytes:{name}"));
        let mut rows = 0;
        for line in table.lines().filter(|l| l.starts_with('|')) {
            let cells: Vec<&str> = line.trim_matches('|').split('|').map(str::trim).collect();
            let Ok(off) = cells[0].parse::<usize>() else {
                continue;
            };
            let want = parse_hex(cells[1].trim_matches('`'));
            let got = rec.get(off..off + want.len()).map(<[u8]>::to_vec);
            if got.as_deref() != Some(&want[..]) {
                problems.push(format!(
                    "{name}: bytes at record offset {off}: the doc shows {:02x?}, the reference writes {:02x?}",
                    want, got
                ));
            }
            rows += 1;
        }
        if rows == 0 {
            problems.push(format!(
                "{name}: no annotated byte rows after <!-- bytes:{name} -->"
            ));
        }
        // 3. Where the record lands: | what | byte offset |.
        let table = section(&doc, &format!("page:{name}"));
        for line in table.lines().filter(|l| l.starts_with('|')) {
            let cells: Vec<&str> = line.trim_matches('|').split('|').map(str::trim).collect();
            let Ok(off) = cells[1].trim_matches('`').parse::<usize>() else {
                continue;
            };
            let want = if cells[0].contains("scale") {
                w.scales_at
            } else {
                Some(w.values_at)
            };
            if Some(off) != want {
                problems.push(format!(
                    "{name}: the doc puts {:?} at byte {off}, the reference at {want:?}",
                    cells[0]
                ));
            }
        }
    }
    assert!(
        problems.is_empty(),
        "docs/layouts.md is out of date:\n{}",
        problems.join("\n")
    );
}

#[test]
fn docs_show_the_non_finite_bytes() {
    // The pairs (1, +inf), (NaN, 2), (-inf, 1) in dims 0..5, the rest zero,
    // unsanitized, NoPE (cos 1, sin 0).
    let mut x = [0u16; 512];
    for (i, v) in [1.0, f32::INFINITY, f32::NAN, 2.0, f32::NEG_INFINITY, 1.0]
        .into_iter()
        .enumerate()
    {
        x[i] = bf16_from_f32(v);
    }
    let enc = |l: RecordLayout| encode_record(l, &x, &[1.0; 32], &[0.0; 32], false, 1.0);
    let hex = |b: &[u8]| {
        b.iter()
            .map(|b| format!("{b:02x}"))
            .collect::<Vec<_>>()
            .join(" ")
    };
    let v4 = enc(RecordLayout::V4);
    let mx = enc(RecordLayout::Mxfp8);
    let nv = enc(RecordLayout::Nvfp4);
    let bf = enc(RecordLayout::Bf16Rows);
    let f8 = enc(RecordLayout::Fp8Rows);
    let fragments = [
        format!(
            "V4 NoPE bytes `{}` with scale `{:02x}`",
            hex(&v4.values[..6]),
            v4.scales[0]
        ),
        format!(
            "MXFP8 `{}` with scale `{:02x}`",
            hex(&mx.values[..6]),
            mx.scales[0]
        ),
        format!(
            "NVFP4 bytes `{}` with tile scale `{:02x}`",
            hex(&nv.values[..3]),
            nv.scales[0]
        ),
        format!("BF16 rows `{}`", hex(&bf.values[..12])),
        format!("FP8 rows `{}`", hex(&f8.values[..6])),
    ];
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/layouts.md");
    let doc = std::fs::read_to_string(path).expect("docs/layouts.md");
    // Line breaks in the document do not matter.
    let flat = doc.split_whitespace().collect::<Vec<_>>().join(" ");
    for f in fragments {
        assert!(flat.contains(&f), "docs/layouts.md should say: {f}");
    }
}

/// The library example of README.md, verbatim (keep the two in step).
#[test]
fn readme_library_example() -> dsv4_kvcache::Result<()> {
    let backend = CpuBackend::new(); // or CudaBackend::new(0)?, HipBackend::new(0)?
                                     // One token: a BF16 latent [1, 512] at position 0, going to slot 5.
    let latent: Vec<u8> = (0..512)
        .flat_map(|i| bf16_from_f32((i as f32 * 0.1).sin()).to_le_bytes())
        .collect();
    let positions = 0i64.to_le_bytes().to_vec();
    let slots = 5i64.to_le_bytes().to_vec();
    // The RoPE table [max_pos, 64]: cos in columns 0..32, sin in 32..64.
    let cos_sin: Vec<u8> = rope_cos_sin(16)
        .iter()
        .flat_map(|f| f.to_le_bytes())
        .collect();
    // An MXFP8 cache: 2 blocks of 64 records of 528 bytes.
    let mut cache = vec![0u8; 2 * 64 * 528];

    // Device backends take their own buffers: backend.upload(&bytes)?.
    backend.rope_quant_insert(InsertArgs {
        latent: Tensor::new(&latent, TensorDesc::contiguous(DType::BF16, &[1, 512])),
        positions: Tensor::new(&positions, TensorDesc::contiguous(DType::I64, &[1])),
        cos_sin_cache: Tensor::new(&cos_sin, TensorDesc::contiguous(DType::F32, &[16, 64])),
        kv_cache: TensorMut::new(&mut cache, TensorDesc::contiguous(DType::U8, &[2, 64, 528])),
        slot_mapping: Tensor::new(&slots, TensorDesc::contiguous(DType::I64, &[1])),
        compress_ratio: 1,
        fp8_scale: None,
        // The seed's order; RecordOrder::PerToken is vLLM 0.34.0's.
        record_order: RecordOrder::PagePlanar,
    })?;

    // A page-planar page holds all 64 records' values, then all their scales.
    let (values, scales) = (
        &cache[5 * 512..6 * 512],
        &cache[64 * 512 + 5 * 16..64 * 512 + 6 * 16],
    );
    let decoded = decode_record(RecordLayout::Mxfp8, values, scales, 1.0);
    println!("{:?}", &decoded[..4]);
    assert!(decoded
        .iter()
        .zip(0..)
        .all(|(d, i)| (d - (i as f32 * 0.1).sin()).abs() < 0.1));
    Ok(())
}
