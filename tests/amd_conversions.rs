//! What AMD's FP8/FP4 conversion instructions could replace, checked on the
//! host against the reference (`src/formats.rs`) for every code, from the
//! formats' definitions (docs/backends.md, "AMD instruction budget", says
//! which instructions these models stand for and why none is used yet).
//!
//! * gfx942's native FP8 is E4M3 FNUZ (bias 8, no infinities, no negative
//!   zero, `0x80` the only NaN), not the OCP E4M3FN the records hold. Every
//!   OCP code but three decodes to exactly twice the FNUZ value of the same
//!   byte, so an FNUZ decode, an exact doubling and three fix-ups would
//!   give the reference's value.
//! * gfx950's FP4 (E2M1) decode table is the OCP one the records hold.

use dsv4_kvcache::formats::{e2m1_to_f32, e4m3_to_f32};

/// E4M3 FNUZ → f32, from the format's definition: bias 8, subnormals
/// `m 2^-10`, `0x80` NaN.
fn fnuz_e4m3_to_f32(c: u8) -> f32 {
    if c == 0x80 {
        return f32::NAN;
    }
    let sign = if c & 0x80 != 0 { -1.0f32 } else { 1.0 };
    let e = ((c >> 3) & 0xf) as i32;
    let m = (c & 7) as f32;
    let mag = if e == 0 {
        m * 2f32.powi(-10)
    } else {
        (1.0 + m / 8.0) * 2f32.powi(e - 8)
    };
    sign * mag
}

/// The OCP E2M1 values of codes 0..=7 (the sign is bit 3).
const E2M1: [f32; 8] = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];

#[test]
fn ocp_e4m3_is_twice_fnuz_but_three_codes() {
    let mut differ = Vec::new();
    for c in 0..=255u8 {
        let want = e4m3_to_f32(c);
        let got = 2.0 * fnuz_e4m3_to_f32(c);
        let same = want.to_bits() == got.to_bits() || (want.is_nan() && got.is_nan());
        if !same {
            differ.push(c);
        }
    }
    // 0x80: OCP -0, FNUZ NaN; 0x7F / 0xFF: OCP NaN, FNUZ +-240.
    assert_eq!(differ, vec![0x7f, 0x80, 0xff]);
}

#[test]
fn e2m1_decode_is_the_ocp_table() {
    for c in 0..16u8 {
        let v = E2M1[(c & 7) as usize];
        let want = if c & 8 != 0 { -v } else { v };
        assert_eq!(e2m1_to_f32(c).to_bits(), want.to_bits(), "code {c}");
    }
}
