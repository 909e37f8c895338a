//! The HIP device compile flags, shared by build.rs and tests/amd_budget.rs
//! so that the instruction budget is measured on the code build.rs embeds.

/// Flags shared by every HIP device compile (hipcc and plain clang).
pub const HIP_FLAGS: &[&str] = &[
    "-x",
    "hip",
    "--cuda-device-only",
    "--no-gpu-bundle-output",
    // clang 22 defaults to v6, which only recent ROCm runtimes load; v5 loads on ROCm 6 and 7.
    "-mcode-object-version=5",
    "-O3",
    "-std=c++17",
    "-ffp-contract=off",
    "-fno-gpu-flush-denormals-to-zero",
    "-fhip-fp32-correctly-rounded-divide-sqrt",
    "-fno-fast-math",
    // A fixed compilation-unit id: clang otherwise hashes the input and the
    // command line (the output folder, so the checkout and the cargo target)
    // into a `__hip_cuid_<hash>` symbol, and two builds of the same source,
    // an x86_64 and an aarch64 wheel's, would embed different bytes.
    "-cuid=dsv4_kvcache",
];

/// The extra flags of a plain clang (no ROCm device library or headers).
pub const HIP_FREESTANDING: &[&str] = &["-nogpulib", "-nogpuinc", "-DKV_FREESTANDING=1"];
