//! `rms_norm_weight` and `cos_sin_cache` in F32, BF16 or F16, every
//! combination, on the CPU reference: each result equals the result of the
//! same call with both tensors given as F32 holding their exact values
//! (decoded here by `half` and bit shifts, not by the crate), and the type
//! matters: an F32 or F16 weight whose values BF16 cannot hold, or an F16
//! table, gives other bytes than the BF16-rounded weight or the F32 table.
//! Other element types fail validation naming the argument, on every op.
//! The device backends run the same kinds in tests/device_parity.rs.

mod common;

use common::*;
use dsv4_kvcache::vectors::Op;
use dsv4_kvcache::{CpuBackend, DType, Error, RecordLayout, TensorDesc};

/// `b`'s view rewritten as F32 holding the exact values of its elements.
fn as_f32(b: &Buf) -> Buf {
    let d = b.desc;
    let values: Vec<f32> = element_offsets(&d)
        .into_iter()
        .map(|o| match d.dtype {
            DType::F32 => f32::from_le_bytes(b.bytes[o..o + 4].try_into().unwrap()),
            DType::BF16 => {
                f32::from_bits(u32::from(u16::from_le_bytes([b.bytes[o], b.bytes[o + 1]])) << 16)
            }
            DType::F16 => half::f16::from_le_bytes([b.bytes[o], b.bytes[o + 1]]).to_f32(),
            t => panic!("{t} is not an input float type"),
        })
        .collect();
    let f = TensorDesc::strided(DType::F32, d.shape(), d.strides())
        .expect("same rank")
        .with_offset(d.offset);
    Buf::new(f, 16, &f32_bytes(&values))
}

/// `case` with its weight and table (where it has them) as F32.
fn with_f32_inputs(case: &Case) -> Case {
    let mut c = case.clone();
    c.rms_norm_weight = case.rms_norm_weight.as_ref().map(as_f32);
    c.cos_sin_cache = case.cos_sin_cache.as_ref().map(as_f32);
    c.kind.weight_dtype = DType::F32;
    c.kind.cos_dtype = DType::F32;
    c
}

/// Runs `case` on the reference.
fn reference(case: &Case) -> Outputs {
    run_case_mut(&mut CpuBackend::new(), case)
}

/// The kinds of `op` at `cr` and `layout`, one per (weight, table) pair of
/// the op's inputs, with special values or not.
fn kinds(op: Op, cr: u32, layout: RecordLayout, special: bool) -> Vec<Kind> {
    let mut out = Vec::new();
    for w in INPUT_FLOATS {
        for cs in INPUT_FLOATS {
            let mut k = Kind::new(op, cr, layout);
            k.weight_dtype = w;
            k.cos_dtype = cs;
            k.special_values = special;
            k.sanitize = special && cr == 1;
            k.prev_rows = cr == 2 && op != Op::RopeQuantInsert && layout == RecordLayout::Nvfp4;
            out.push(k);
        }
    }
    out
}

/// Whether `a` and `b` returned and wrote the same everywhere.
fn same_outputs(a: &Outputs, b: &Outputs) -> bool {
    a == b
}

#[test]
fn every_weight_and_table_type_gives_the_f32_values_result() {
    let mut checked = 0usize;
    for op in [
        Op::FusedSaveCompressNorm,
        Op::RopeQuantInsert,
        Op::FusedCompressInsert,
    ] {
        for layout in RecordLayout::ALL {
            for cr in [1, 2] {
                for special in [false, true] {
                    for kind in kinds(op, cr, layout, special) {
                        for seed in 0..6u64 {
                            let case = random_case(seed << 8 | cr as u64, kind);
                            let got = reference(&case);
                            assert!(got.result.is_ok(), "{}: {:?}", case.name, got.result);
                            let want = reference(&with_f32_inputs(&case));
                            assert!(
                                same_outputs(&got, &want),
                                "{}: differs from the call with F32 copies",
                                case.name
                            );
                            checked += 1;
                        }
                    }
                }
            }
            if op == Op::FusedSaveCompressNorm {
                break; // the compressor has no layout
            }
        }
    }
    assert!(checked > 1000, "{checked} cases");
}

#[test]
fn adversarial_generic_cases_give_the_f32_values_result() {
    let mut n = 0;
    for case in adversarial_cases() {
        if case.kind.weight_dtype == DType::BF16 && case.kind.cos_dtype != DType::F16 {
            continue;
        }
        let got = reference(&case);
        assert!(got.result.is_ok(), "{}", case.name);
        assert!(
            same_outputs(&got, &reference(&with_f32_inputs(&case))),
            "{}: differs from the call with F32 copies",
            case.name
        );
        n += 1;
    }
    assert!(n >= 30, "{n} adversarial cases with other input types");
}

/// Over seeds, some written case of `kind` must differ from the same case
/// with the weight of type `base_w` and the table of type `base_cs`.
fn type_changes_bytes(kind: Kind, base_w: DType, base_cs: DType) {
    let mut base_kind = kind;
    base_kind.weight_dtype = base_w;
    base_kind.cos_dtype = base_cs;
    for seed in 0..32u64 {
        let a = reference(&random_case(seed, kind));
        let b = reference(&random_case(seed, base_kind));
        assert!(a.result.is_ok() && b.result.is_ok());
        if !same_outputs(&a, &b) {
            return;
        }
    }
    panic!("{kind:?}: the same bytes as with weight {base_w}, table {base_cs} on every seed");
}

#[test]
fn the_input_type_is_not_ignored() {
    for cr in [1, 2] {
        for w in [DType::F32, DType::F16] {
            let mut k = Kind::new(Op::FusedSaveCompressNorm, cr, RecordLayout::V4);
            k.weight_dtype = w;
            type_changes_bytes(k, DType::BF16, DType::F32);
        }
        for layout in RecordLayout::ALL {
            let mut k = Kind::new(Op::RopeQuantInsert, cr, layout);
            k.cos_dtype = DType::F16;
            type_changes_bytes(k, DType::BF16, DType::F32);
            for (w, cs) in [(DType::F32, DType::BF16), (DType::F16, DType::F32)] {
                let mut k = Kind::new(Op::FusedCompressInsert, cr, layout);
                k.weight_dtype = w;
                k.cos_dtype = cs;
                type_changes_bytes(k, DType::BF16, cs);
            }
        }
    }
}

#[test]
fn other_types_fail_naming_the_argument_and_write_nothing() {
    for (op, arg) in [
        (Op::FusedSaveCompressNorm, "rms_norm_weight"),
        (Op::FusedCompressInsert, "rms_norm_weight"),
        (Op::RopeQuantInsert, "cos_sin_cache"),
        (Op::FusedCompressInsert, "cos_sin_cache"),
    ] {
        for bad in [DType::I32, DType::U8, DType::I64, DType::F8E4M3] {
            let mut case = random_case(3, Kind::new(op, 1, RecordLayout::Mxfp8));
            let buf = if arg == "rms_norm_weight" {
                case.rms_norm_weight.as_mut()
            } else {
                case.cos_sin_cache.as_mut()
            }
            .expect("the op takes it");
            let d = buf.desc;
            buf.desc = TensorDesc::strided(bad, d.shape(), d.strides())
                .unwrap()
                .with_offset(d.offset);
            let out = reference(&case);
            match &out.result {
                Err(Error::DType { arg: a, got, .. }) => {
                    assert_eq!(*a, arg, "{op:?} {bad}");
                    assert_eq!(got, bad.name());
                }
                other => panic!("{op:?} with {arg} {bad}: {other:?}"),
            }
            let given = |b: &Option<Buf>| b.as_ref().map(|b| b.bytes.clone());
            if op != Op::RopeQuantInsert {
                assert_eq!(out.latent, given(&case.latent), "{op:?}: latent written");
            }
            assert_eq!(out.kv_cache, given(&case.kv_cache), "{op:?}: cache written");
        }
    }
}
