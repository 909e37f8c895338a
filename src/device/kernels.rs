//! The device kernels embedded in this build of the library.
//!
//! `build.rs` compiles the one kernel source set (`kernels-hip/kvcache.hip`
//! and the files it includes, included by `kernels-cuda/kvcache.cu` for nvcc)
//! into
//!
//! * one CUDA fatbin with SASS for every target of `DSV4_KVCACHE_CUDA_ARCHS`
//!   (default `sm_90,sm_100,sm_103,sm_120`) and the PTX of every target of
//!   `DSV4_KVCACHE_CUDA_PTX` (default `compute_90`, which newer GPUs
//!   JIT-compile), built by CUDA 12.9 by default, and
//! * one AMDGPU code object (an ELF shared object, loadable with
//!   `hipModuleLoadData`) per target of `DSV4_KVCACHE_HIP_ARCHS` (default
//!   `gfx90a,gfx942,gfx950`),
//!
//! and embeds them in the binary. A backend whose compiler was not found at
//! build time has no artifacts here; [`missing_reasons`] then says why and how
//! to fix it (run `scripts/install-toolchains.sh`, or point `NVCC`, `HIPCC` or
//! `HIP_CLANG` at a compiler, and rebuild). See `docs/backends.md`.

include!(concat!(env!("OUT_DIR"), "/kernels_embedded.rs"));

/// The CUDA fatbin (SASS for each of [`cuda_targets`], PTX for each of
/// [`cuda_ptx`]), or `None` if this build had no CUDA compiler. Load it
/// with `cuModuleLoadData`.
pub fn cuda_fatbin() -> Option<&'static [u8]> {
    CUDA_FATBIN
}

/// The CUDA SASS architectures in [`cuda_fatbin`], e.g. `["sm_90", "sm_100",
/// "sm_103", "sm_120"]`; empty when no fatbin was built.
pub fn cuda_targets() -> &'static [&'static str] {
    CUDA_TARGETS
}

/// The PTX targets in [`cuda_fatbin`], e.g. `["compute_90"]`: GPUs without
/// SASS of their own JIT-compile the newest one no newer than themselves.
pub fn cuda_ptx() -> &'static [&'static str] {
    CUDA_PTX
}

/// The CUDA release (`major.minor`, e.g. `12.9`) whose compiler built
/// [`cuda_fatbin`]; it decides the drivers that run it
/// ([`cuda_min_drivers`]).
pub fn cuda_toolkit() -> Option<&'static str> {
    CUDA_TOOLKIT
}

/// The CUDA compiler that built [`cuda_fatbin`]: its path and version line.
pub fn cuda_compiler() -> Option<&'static str> {
    CUDA_COMPILER
}

/// Each embedded CUDA image (SASS targets, then PTX targets) with the
/// oldest Linux NVIDIA driver that runs it (`None` where the table of
/// [`crate::targets`] does not know the toolkit or target).
pub fn cuda_min_drivers() -> Vec<(&'static str, Option<&'static str>)> {
    let toolkit = cuda_toolkit().unwrap_or_default();
    cuda_targets()
        .iter()
        .chain(cuda_ptx())
        .map(|t| (*t, crate::targets::cuda_min_driver(toolkit, t)))
        .collect()
}

/// The `ptxas -v` resource report of the CUDA build (registers, shared memory,
/// stack frame and spills per kernel and target); empty when no fatbin was built.
pub fn cuda_resource_report() -> &'static str {
    CUDA_RESOURCES
}

/// The AMDGPU code object for `arch`, or `None` if this build has none for it.
///
/// `arch` is matched on its processor name, before any `:` feature suffix, so
/// the full name a device reports (`gfx950:sramecc+:xnack-`) finds the `gfx950`
/// object. The objects are built for "xnack any, sramecc any" and so load in
/// either mode.
pub fn hip_code_object(arch: &str) -> Option<&'static [u8]> {
    let base = arch.split(':').next().unwrap_or(arch).trim();
    HIP_CODE_OBJECTS
        .iter()
        .find(|(a, _)| *a == base)
        .map(|(_, bytes)| *bytes)
}

/// The AMDGPU code object version of [`hip_code_object`]'s objects (build.rs
/// passes `-mcode-object-version=5`): ROCm 6.0 and later load it.
pub const HIP_CODE_OBJECT_VERSION: u32 = 5;

/// The AMDGPU processors that have a code object, e.g. `["gfx90a", "gfx942",
/// "gfx950"]`.
pub fn hip_targets() -> &'static [&'static str] {
    HIP_TARGETS
}

/// The HIP compiler (hipcc or a HIP-capable clang) that built the code objects:
/// its path and version line.
pub fn hip_compiler() -> Option<&'static str> {
    HIP_COMPILER
}

/// For each backend whose kernels were not embedded: why, and how to fix it.
/// Empty when every backend's kernels are present.
pub fn missing_reasons() -> &'static [&'static str] {
    MISSING_REASONS
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hip_lookup_ignores_feature_suffix() {
        if hip_targets().is_empty() {
            let why = missing_reasons().join("; ");
            assert!(
                std::env::var("DSV4_KVCACHE_REQUIRE_KERNELS").as_deref() != Ok("1"),
                "DSV4_KVCACHE_REQUIRE_KERNELS=1 but no HIP code object is embedded: {why}"
            );
            eprintln!("SKIPPED: no HIP code object in this build: {why}");
            return;
        }
        for &t in hip_targets() {
            let plain = hip_code_object(t).expect("listed target has an object");
            let full = hip_code_object(&format!("{t}:sramecc+:xnack-")).unwrap();
            assert_eq!(plain.as_ptr(), full.as_ptr());
        }
        assert!(hip_code_object("gfx000").is_none());
    }

    #[test]
    fn artifacts_agree_with_metadata() {
        assert_eq!(cuda_fatbin().is_some(), cuda_compiler().is_some());
        assert_eq!(cuda_fatbin().is_some(), !cuda_targets().is_empty());
        assert_eq!(cuda_fatbin().is_some(), cuda_toolkit().is_some());
        assert!(cuda_fatbin().is_some() || cuda_ptx().is_empty());
        assert_eq!(hip_targets().is_empty(), hip_compiler().is_none());
        let backends_missing =
            usize::from(cuda_fatbin().is_none()) + usize::from(hip_targets().is_empty());
        assert_eq!(missing_reasons().len(), backends_missing);
    }
}

#[cfg(test)]
mod driver_tests {
    use super::*;

    /// Every image of a default build has a known driver floor, and the
    /// CUDA 12.9 build's are the CUDA 12 era's.
    #[test]
    fn every_embedded_image_has_a_driver_floor() {
        if cuda_fatbin().is_none() {
            eprintln!("SKIPPED: no CUDA fatbin in this build");
            return;
        }
        for (t, d) in cuda_min_drivers() {
            if cuda_toolkit() == Some("12.9") {
                let d = d.unwrap_or_else(|| panic!("{t}: no driver floor"));
                assert!(d.starts_with('5'), "{t}: {d} is not a CUDA 12 era driver");
            }
        }
    }
}
