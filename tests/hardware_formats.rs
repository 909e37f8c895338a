//! The hardware conversions the kernels use in place of the software
//! definitions give the definitions' bits on every input they can receive:
//! `GpuBackend::check_hw_formats` runs each one on all 2^32 f32 bit
//! patterns (in both halves of a pair) on the device. The BF16 pair
//! conversion is used on every input, NaNs included (each becomes 0x7FFF),
//! so it is checked on every pattern; the e4m3 pair conversion only ever
//! sees non-NaN values. A device whose kernels convert in software only
//! says so (SKIPPED); without a device the test skips, loudly.

#[path = "gpu_required/mod.rs"]
#[macro_use]
mod gpu_required;
#[path = "gpu_pair/mod.rs"]
#[macro_use]
mod gpu_pair;

#[cfg(any(feature = "cuda", feature = "hip"))]
use dsv4_kvcache::backend::gpu::{Driver, GpuBackend};

#[cfg(any(feature = "cuda", feature = "hip"))]
fn check<D: Driver>(b: &mut GpuBackend<D>) {
    let r = b.check_hw_formats().expect("kv_check_hw_formats");
    println!("PARITY hardware formats: {r:?}");
    assert!(
        r.exact(),
        "a hardware conversion differs from the definition: {r:?} (bits of a mismatching input: {:#010x?})",
        r.example
    );
    if !r.bf16x2 && !r.e4m3x2 {
        eprintln!(
            "\n*** SKIPPED hardware_formats: this device's kernels convert in software only (nothing to check) ***\n"
        );
    }
}

gpu_tests!(
    cuda_hardware_formats_match_the_definitions,
    hip_hardware_formats_match_the_definitions,
    prefix = "hardware_formats::",
    |b| check(b)
);
