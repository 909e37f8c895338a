//! The device kernels embedded in this build of the library.
//!
//! `build.rs` compiles the one kernel source set (`kernels-hip/kvcache.hip`
//! and the files it includes, included by `kernels-cuda/kvcache.cu` for nvcc)
//! into
//!
//! * one CUDA fatbin with SASS for every target of `DSV4_KVCACHE_CUDA_ARCHS`
//!   (default `sm_90,sm_100`), and
//! * one AMDGPU code object (an ELF shared object, loadable with
//!   `hipModuleLoadData`) per target of `DSV4_KVCACHE_HIP_ARCHS` (default
//!   `gfx942,gfx950`),
//!
//! and embeds them in the binary. A backend whose compiler was not found at
//! build time has no artifacts here; [`missing_reasons`] then says why and how
//! to fix it (run `scripts/install-toolchains.sh`, or point `NVCC`, `HIPCC` or
//! `HIP_CLANG` at a compiler, and rebuild). See `docs/backends.md`.

include!(concat!(env!("OUT_DIR"), "/kernels_embedded.rs"));

/// The CUDA fatbin (SASS for each of [`cuda_targets`]), or `None` if this build
/// had no nvcc. Load it with `cuModuleLoadData`.
pub fn cuda_fatbin() -> Option<&'static [u8]> {
    CUDA_FATBIN
}

/// The CUDA architectures in [`cuda_fatbin`], e.g. `["sm_90", "sm_100"]`; empty
/// when no fatbin was built.
pub fn cuda_targets() -> &'static [&'static str] {
    CUDA_TARGETS
}

/// The nvcc that built [`cuda_fatbin`]: its path and version line.
pub fn cuda_compiler() -> Option<&'static str> {
    CUDA_COMPILER
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

/// The AMDGPU processors that have a code object, e.g. `["gfx942", "gfx950"]`.
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
        assert_eq!(hip_targets().is_empty(), hip_compiler().is_none());
        let backends_missing =
            usize::from(cuda_fatbin().is_none()) + usize::from(hip_targets().is_empty());
        assert_eq!(missing_reasons().len(), backends_missing);
    }
}
