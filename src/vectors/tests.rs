//! Round trips of the file format, replay on the CPU and the diff report.

use super::*;
use crate::layout::RecordLayout;
use crate::tensor::DType;
use crate::testkit::{make_case, CaseSpec};
use crate::CpuBackend;

fn all_specs() -> Vec<CaseSpec> {
    let mut v = Vec::new();
    for layout in RecordLayout::ALL {
        for cr in [1, 2] {
            for op in [Op::RopeQuantInsert, Op::FusedCompressInsert] {
                v.push(CaseSpec {
                    op,
                    layout,
                    compress_ratio: cr,
                    tokens: 37,
                    requests: 3,
                    seed: 7 + cr as u64,
                    sanitize: cr == 2,
                    adversarial: true,
                    ..Default::default()
                });
            }
        }
    }
    for cr in [1, 2] {
        v.push(CaseSpec {
            op: Op::FusedSaveCompressNorm,
            compress_ratio: cr,
            tokens: 29,
            requests: 4,
            adversarial: true,
            ..Default::default()
        });
    }
    v.push(CaseSpec {
        op: Op::SaveRingRows,
        tokens: 9,
        ring_capacity: 4,
        adversarial: true,
        ..Default::default()
    });
    v
}

#[test]
fn exact_decimal_roundtrips() {
    assert_eq!(
        f32_exact_decimal(1e-6),
        "0.0000009999999974752427078783512115478515625"
    );
    assert_eq!(f32_exact_decimal(0.5), "0.5");
    assert_eq!(f32_exact_decimal(3.0), "3");
    assert_eq!(f32_exact_decimal(-0.0), "-0");
    for x in [
        1e-6f32,
        1e-5,
        0.1,
        f32::MIN_POSITIVE,
        f32::from_bits(1),
        f32::MAX,
        123.456,
    ] {
        assert_eq!(
            f32_exact_decimal(x).parse::<f32>().unwrap().to_bits(),
            x.to_bits()
        );
    }
}

#[test]
fn save_load_roundtrip() {
    let dir = std::env::temp_dir().join(format!("dsv4-vectors-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for (i, spec) in all_specs().iter().enumerate() {
        let mut f = make_case(spec);
        f.capture_reference().unwrap();
        let path = dir.join(format!("case{i}.safetensors"));
        f.save(&path).unwrap();
        let g = VectorFile::load(&path).unwrap();
        assert_eq!(f, g, "case {i}");
        if g.op().unwrap() != Op::SaveRingRows {
            assert_eq!(g.compress_ratio().unwrap(), spec.compress_ratio);
        }
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn eps_metadata() {
    let mut f = make_case(&CaseSpec {
        op: Op::FusedSaveCompressNorm,
        ..Default::default()
    });
    f.set_rms_norm_eps(1e-5);
    assert_eq!(f.meta["rms_norm_eps_bits"], "0x3727c5ac");
    assert_eq!(f.rms_norm_eps().unwrap(), 1e-5);
    f.meta.remove("rms_norm_eps_bits");
    assert_eq!(f.rms_norm_eps().unwrap(), 1e-5);
}

#[test]
fn cpu_replay_of_cpu_file_matches() {
    let mut cpu = CpuBackend::new();
    for spec in all_specs() {
        let mut f = make_case(&spec);
        f.capture_reference().unwrap();
        // The op wrote something: the outputs differ from the inputs.
        let changed = OUTPUT_NAMES
            .iter()
            .any(|n| match (f.input(n), f.expected(n)) {
                (Some(a), Some(b)) => a.data != b.data,
                _ => false,
            });
        assert!(changed, "{spec:?} wrote nothing");
        let bytes = f.to_bytes().unwrap();
        let g = VectorFile::from_bytes(&bytes).unwrap();
        let r = g.replay(&mut cpu).unwrap();
        assert!(r.passed(), "{spec:?}\n{r}");
        assert!(r.bytes_compared > 0);
        assert!(r.mismatches.is_empty());
    }
    // A single thread gives the same bytes.
    let mut one = CpuBackend::with_threads(1).unwrap();
    let mut f = make_case(&all_specs()[0]);
    f.capture_reference().unwrap();
    assert!(f.replay(&mut one).unwrap().passed());
}

#[test]
fn flipped_byte_is_reported() {
    let mut cpu = CpuBackend::new();
    let mut f = make_case(&CaseSpec {
        op: Op::RopeQuantInsert,
        layout: RecordLayout::Mxfp8,
        tokens: 10,
        ..Default::default()
    });
    f.capture_reference().unwrap();
    let slots = f.input("slot_mapping").unwrap().to_i64().unwrap();
    // Scale byte 5 of token 3's record.
    let slot = slots[3] as usize;
    let (block, row) = (slot / 64, slot % 64);
    let off = block * 64 * 528 + 64 * 512 + row * 16 + 5;
    let out = f.tensors.get_mut("out.kv_cache").unwrap();
    let before = out.data[off];
    out.data[off] ^= 0x10;
    let r = f.replay(&mut cpu).unwrap();
    assert_eq!(r.mismatch_count(), 1);
    let m = &r.mismatches[0];
    assert_eq!(m.tensor, "out.kv_cache");
    assert_eq!(m.byte_offset, off);
    assert_eq!(m.expected, before ^ 0x10);
    assert_eq!(m.got, before);
    assert_eq!(m.slot, Some(slot as u64));
    assert_eq!(m.token, Some(3));
    assert!(m.field.as_deref().unwrap().contains("scale byte 5"), "{m}");
    let text = r.to_string();
    assert!(text.contains(&format!("byte {off}")), "{text}");
    assert!(text.contains("1 of"), "{text}");
}

#[test]
fn bad_files_are_clear_errors() {
    let mut f = make_case(&CaseSpec::default());
    f.meta.insert("format".into(), "other/1".into());
    let e = VectorFile::from_bytes(&f.to_bytes().unwrap()).unwrap_err();
    assert!(e.to_string().contains("format"), "{e}");
    let mut f = make_case(&CaseSpec::default());
    f.tensors.remove("in.latent");
    let e = VectorFile::from_bytes(&f.to_bytes().unwrap()).unwrap_err();
    assert!(e.to_string().contains("in.latent"), "{e}");
    let e = VectorFile::from_bytes(b"not a file").unwrap_err();
    assert!(e.to_string().contains("safetensors"), "{e}");
    let mut f = make_case(&CaseSpec::default());
    f.meta.insert("layout".into(), "fp16".into());
    assert!(f.check().is_err());
}

#[test]
fn fp8_rows_stored_as_u8_replay() {
    let mut f = make_case(&CaseSpec {
        layout: RecordLayout::Fp8Rows,
        tokens: 12,
        ..Default::default()
    });
    f.capture_reference().unwrap();
    for n in ["in.kv_cache", "out.kv_cache"] {
        f.tensors.get_mut(n).unwrap().dtype = DType::U8;
    }
    assert!(f.replay(&mut CpuBackend::new()).unwrap().passed());
}

/// Regressions from `tests/vector_fuzz.rs`: a name given twice (the JSON
/// parser kept the last) and an expected output whose dtype or shape is not
/// its input's were accepted.
#[test]
fn ambiguous_files_are_rejected() {
    let mut f = make_case(&CaseSpec::default());
    f.capture_reference().unwrap();
    let bytes = f.to_bytes().unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header = std::str::from_utf8(&bytes[8..8 + n]).unwrap().trim_end();
    let start = header.find("\"in.latent\"").unwrap();
    let end = start + header[start..].find('}').unwrap() + 1;
    // The same entry again, its name spelled with an escape.
    let dup = header[start..end].replacen("in.latent", "in.l\\u0061tent", 1);
    let mut h = format!("{},{dup}}}", &header[..header.len() - 1]);
    while h.len() % 8 != 0 {
        h.push(' ');
    }
    let mut b = (h.len() as u64).to_le_bytes().to_vec();
    b.extend_from_slice(h.as_bytes());
    b.extend_from_slice(&bytes[8 + n..]);
    let e = VectorFile::from_bytes(&b).unwrap_err().to_string();
    assert!(e.contains("in.latent") && e.contains("twice"), "{e}");
    assert_eq!(
        super::format::duplicate_key(br#"{"a":{"a":1},"b":[{"c":1,"c":2}]}"#).as_deref(),
        Some("c")
    );
    assert_eq!(
        super::format::duplicate_key(br#"{"a":{"a":"b:"},"b":["a","a"]}"#),
        None
    );

    let mut g = f.clone();
    let t = g.tensors.get_mut("out.kv_cache").unwrap();
    let len = t.data.len();
    t.shape = vec![len];
    let e = VectorFile::from_bytes(&g.to_bytes().unwrap())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("out.kv_cache") && e.contains("in.kv_cache"),
        "{e}"
    );
}
