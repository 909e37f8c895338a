//! When a device test that cannot open its GPU skips and when it fails,
//! the same in every test file (`#[path]`-included, so it does not pull in
//! `tests/common`).
//!
//! `DSV4_KVCACHE_REQUIRE_GPU=1` requires a device on every GPU backend whose
//! runtime library loads on this machine (CUDA on an NVIDIA host, HIP where
//! a `libamdhip64` is found), so one setting serves the H200 and the ROCm
//! runners; a comma list (`cuda`, `hip`, `cuda,hip`) names the backends
//! required even when their library is missing.

#![allow(dead_code)]

use std::io::Write as _;

/// Whether `backend` (`cuda` or `hip`) must have a device here.
pub fn required(backend: &str, library_present: bool) -> bool {
    required_by(
        std::env::var("DSV4_KVCACHE_REQUIRE_GPU").ok().as_deref(),
        backend,
        library_present,
    )
}

/// [`required`] for a given value of the variable.
pub fn required_by(value: Option<&str>, backend: &str, library_present: bool) -> bool {
    match value.map(str::trim) {
        None | Some("") | Some("0") => false,
        Some("1") => library_present,
        Some(list) => list.split(',').any(|b| b.trim() == backend),
    }
}

/// Says loudly, past the test harness's capture, that `test` skipped on
/// `backend` and why; panics instead when the device is required.
pub fn skip_or_fail(
    test: &str,
    backend: &str,
    library_present: bool,
    reason: &dyn std::fmt::Display,
) {
    assert!(
        !required(backend, library_present),
        "{test}: DSV4_KVCACHE_REQUIRE_GPU requires a {backend} device, but: {reason}"
    );
    let _ = writeln!(
        std::io::stderr(),
        "\n*** SKIPPED {test} on {backend}: {reason} ***\n"
    );
}

#[test]
fn require_gpu_values() {
    assert!(!required_by(None, "cuda", true));
    assert!(!required_by(Some("0"), "hip", true));
    assert!(required_by(Some("1"), "cuda", true));
    assert!(!required_by(Some("1"), "hip", false));
    assert!(required_by(Some("hip"), "hip", false));
    assert!(required_by(Some("cuda, hip"), "hip", false));
    assert!(!required_by(Some("cuda"), "hip", true));
}
