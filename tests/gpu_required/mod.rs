//! When a device test that cannot open its GPU skips and when it fails,
//! the same in every test file (`#[path]`-included, so it does not pull in
//! `tests/common`).
//!
//! `DSV4_KVCACHE_REQUIRE_GPU=1` requires a device on every GPU backend whose
//! runtime library loads on this machine (CUDA on an NVIDIA host, HIP where
//! a `libamdhip64` is found), so one setting serves the H200 and the ROCm
//! runners; a comma list (`cuda`, `hip`, `cuda,hip`) names the backends
//! required even when their library is missing.

#![allow(dead_code, unused_macros)]

use std::io::Write as _;

/// Where the committed vector files are: `DSV4_KVCACHE_VECTORS` when set;
/// else `vectors/` beside the test binary's `bin/` folder (a bundle of
/// `scripts/gpu-check.sh` or `scripts/hip-on-cuda.sh`, moved to another
/// machine); else the source tree's `tests/vectors`.
pub fn vectors_dir() -> std::path::PathBuf {
    if let Some(d) = std::env::var_os("DSV4_KVCACHE_VECTORS") {
        return d.into();
    }
    let bundled = std::env::current_exe()
        .ok()
        .and_then(|e| Some(e.parent()?.parent()?.join("vectors")));
    match bundled {
        Some(d) if d.is_dir() => d,
        _ => std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/vectors"),
    }
}

/// The committed vector files whose names start with `prefix`, sorted.
pub fn vector_files(prefix: &str) -> Vec<std::path::PathBuf> {
    let dir = vectors_dir();
    let mut v: Vec<std::path::PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("vector folder {}: {e}", dir.display()))
        .map(|e| e.expect("dir entry").path())
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with(prefix))
                && p.extension().is_some_and(|e| e == "safetensors")
        })
        .collect();
    v.sort();
    v
}

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

/// Runs `$body` with `$b` bound to `&mut` device 0 of `cuda` or `hip`, or
/// skips (fails, when the device is required) saying why; a build without
/// that backend's feature skips too.
macro_rules! on_gpu {
    (cuda, $test:expr, |$b:ident| $body:expr) => {
        on_gpu!("cuda", CudaBackend, cuda::CudaDriver, $test, |$b| $body)
    };
    (hip, $test:expr, |$b:ident| $body:expr) => {
        on_gpu!("hip", HipBackend, hip::HipDriver, $test, |$b| $body)
    };
    ($feature:literal, $backend:ident, $($driver:ident)::+, $test:expr, |$b:ident| $body:expr) => {{
        #[cfg(feature = $feature)]
        match dsv4_kvcache::$backend::new(0) {
            Ok(mut dev) => {
                let $b = &mut dev;
                $body
            }
            Err(e) => gpu_required::skip_or_fail(
                $test,
                $feature,
                dsv4_kvcache::backend::$($driver)::+::library_present(),
                &e,
            ),
        }
        #[cfg(not(feature = $feature))]
        gpu_required::skip_or_fail($test, $feature, false, &concat!("no `", $feature, "` feature"));
    }};
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
